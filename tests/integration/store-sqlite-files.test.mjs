// The embedded store's files deleted or replaced under a running gateway. Its claims would
// then live in files nobody else can open, while a second gateway started on the same path
// makes new ones: the same call would run once on each. The gateway notices (the files at the
// path are compared with the ones it opened before a write when their inotify events say
// something happened to them, and every second) and stops
// serving protected calls until it is restarted: /readyz says not ready, calls are refused
// store_error with nothing executed. The files at the path, and whoever locks them, are the
// store from then on.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import {
  idemStatus, rawSession, readLedger, run, startGateway, startRefundServer, tempDir, toolText, waitFor,
} from './lib/harness.mjs';

const SUBJECT = { 'X-Subject': 'agent-files' };
const CONFIG = { subject: { header: 'X-Subject' }, store: { cache_entries: 0 }, tools: { issue_refund: { class: 'non_idempotent' } } };

async function readyz(gw) {
  const r = await fetch(`${gw.adminUrl}/readyz`, { signal: AbortSignal.timeout(15000) });
  return { status: r.status, body: await r.json() };
}

async function assertLost(gw, s, order) {
  await waitFor(async () => (await readyz(gw)).status === 503, { timeoutMs: 15000, what: '/readyz to say not ready' });
  const lost = await readyz(gw);
  assert.equal(lost.body.store, 'down');
  assert.match(lost.body.store_reason, /^the embedded store is lost until a restart: .*keys\.db/);
  const a = await s.call('issue_refund', { order_id: order, amount_cents: 3 });
  const result = a.message?.result;
  assert.equal(result?.isError, true, JSON.stringify(result));
  assert.equal(idemStatus(result)?.code, 'store_error', JSON.stringify(result));
  assert.equal(idemStatus(result).executed, false);
  assert.match(gw.logs(), /the embedded store is lost: .*keys\.db.* was (deleted|replaced)/);
}

async function setup(t) {
  const dir = await tempDir(t, 'idemgw-sqlite-files-');
  const file = path.join(dir, 'keys.db');
  const upstream = await startRefundServer(t, { jsonResponse: true });
  const gw = await startGateway(t, { upstream: upstream.url, databaseUrl: `sqlite:${file}`, config: CONFIG });
  const s = await rawSession(t, gw.url, { headers: SUBJECT });
  const first = await s.call('issue_refund', { order_id: 'files-1', amount_cents: 3 });
  assert.match(toolText(first.message?.result), /^Refunded 3 cents/);
  return { file, upstream, gw, s };
}

test('key file, -wal, -shm and lock deleted: the gateway stops serving protected calls; a second gateway on the path is the only one that does', async (t) => {
  const { file, upstream, gw, s } = await setup(t);
  for (const suffix of ['', '-wal', '-shm', '.lock']) await fs.rm(`${file}${suffix}`);

  await assertLost(gw, s, 'files-2');
  // A second gateway on the same path starts on new files and serves; the first still refuses.
  const gw2 = await startGateway(t, { upstream: upstream.url, databaseUrl: `sqlite:${file}`, config: CONFIG });
  const s2 = await rawSession(t, gw2.url, { headers: SUBJECT });
  const ran = await s2.call('issue_refund', { order_id: 'files-2', amount_cents: 3 });
  assert.match(toolText(ran.message?.result), /^Refunded 3 cents/);
  const again = await s.call('issue_refund', { order_id: 'files-2', amount_cents: 3 });
  assert.equal(idemStatus(again.message?.result)?.code, 'store_error');
  assert.equal((await readyz(gw)).status, 503);
  const ledger = (await readLedger(upstream.ledger)).map((e) => e.order_id);
  assert.deepEqual(ledger, ['files-1', 'files-2'], 'each call ran once, on one gateway');
});

test('only the key file deleted: the next claim is refused, not executed', async (t) => {
  const { file, upstream, gw, s } = await setup(t);
  await fs.rm(file);
  const a = await s.call('issue_refund', { order_id: 'files-3', amount_cents: 3 });
  assert.equal(idemStatus(a.message?.result)?.code, 'store_error', JSON.stringify(a.message));
  await assertLost(gw, s, 'files-3');
  assert.deepEqual((await readLedger(upstream.ledger)).map((e) => e.order_id), ['files-1']);
});

test('key file replaced by a copy: the gateway notices and refuses', async (t) => {
  const { file, upstream, gw, s } = await setup(t);
  await fs.copyFile(file, `${file}.copy`);
  await fs.rename(`${file}.copy`, file);
  await assertLost(gw, s, 'files-4');
  assert.match(gw.logs(), /keys\.db was replaced by another file/);
  assert.deepEqual((await readLedger(upstream.ledger)).map((e) => e.order_id), ['files-1']);
});

// The writer reads the files' inotify events before each batch instead of comparing them; an
// event that changes nothing that matters (a chmod, a touch) is compared and let pass, and the
// next deletion is still caught before the next claim.
test('files chmodded and touched: calls go on; a deletion after that is still caught at the next claim', async (t) => {
  const { file, upstream, gw, s } = await setup(t);
  for (const suffix of ['', '-wal', '-shm', '.lock']) {
    await fs.chmod(`${file}${suffix}`, 0o600);
    await fs.utimes(`${file}${suffix}`, new Date(), new Date());
  }
  const a = await s.call('issue_refund', { order_id: 'files-5', amount_cents: 3 });
  assert.match(toolText(a.message?.result), /^Refunded 3 cents/);
  assert.equal((await readyz(gw)).status, 200);
  await fs.rm(`${file}-wal`);
  const b = await s.call('issue_refund', { order_id: 'files-6', amount_cents: 3 });
  assert.equal(idemStatus(b.message?.result)?.code, 'store_error', JSON.stringify(b.message));
  await assertLost(gw, s, 'files-6');
  assert.deepEqual((await readLedger(upstream.ledger)).map((e) => e.order_id), ['files-1', 'files-5']);
});

/** Fills the file system holding dir until a write fails with ENOSPC; returns the filler's path. */
async function fillDisk(dir) {
  const filler = path.join(dir, 'filler');
  const fh = await fs.open(filler, 'w');
  const chunk = Buffer.alloc(16384, 1);
  try {
    for (;;) await fh.write(chunk);
  } catch (err) {
    if (err.code !== 'ENOSPC') throw err;
  } finally {
    await fh.close();
  }
  return filler;
}

// A full disk: the tmpfs of the test's own is filled by a file the test writes once the gateway
// has its store open; protected calls with large results (each a new row's worth of pages) then
// fail to commit, three in a row make /readyz say not ready, and each refused call is refused as
// not executed. Freed space is found by the store's probe write, without a call or a restart.
test('disk full: repeated failed writes make /readyz not ready until a write succeeds again', async (t) => {
  // a small file system of the test's own: filling it harms nothing else. Its folder is not a
  // tempDir: the unmount must come before the folder is removed
  const mnt = await fs.mkdtemp(path.join(os.tmpdir(), 'idemgw-sqlite-full-'));
  const m = await run('mount', ['-t', 'tmpfs', '-o', 'size=1m,mode=0700', 'tmpfs', mnt]);
  t.after(async () => {
    if (m.code === 0) await run('umount', ['-l', mnt]);
    await fs.rmdir(mnt);
  });
  if (m.code !== 0) {
    t.skip(`cannot mount a tmpfs here (${m.stderr.trim()})`);
    return;
  }
  const file = path.join(mnt, 'keys.db');
  const upstream = await startRefundServer(t, { jsonResponse: true });
  const gw = await startGateway(t, { upstream: upstream.url, databaseUrl: `sqlite:${file}`, config: CONFIG });
  const sessions = await Promise.all([1, 2, 3, 4].map(() => rawSession(t, gw.url, { headers: SUBJECT })));
  const ok = await sessions[0].call('issue_refund', { order_id: 'full-0', amount_cents: 5 });
  assert.match(toolText(ok.message?.result), /^Refunded 5 cents/);

  const filler = await fillDisk(mnt);
  const executed = new Set(['full-0']);
  let refused = 0;
  let i = 1;
  // a long order id: the stored result names it, so each call needs pages of its own
  const order = () => `full-${i++}-${'x'.repeat(16000)}`;
  const call = async (s, id) => {
    const a = await s.call('issue_refund', { order_id: id, amount_cents: 5 });
    const result = a.message?.result;
    if (idemStatus(result)) {
      assert.equal(idemStatus(result).code, 'store_unavailable', JSON.stringify(result).slice(0, 500));
      assert.equal(idemStatus(result).executed, false);
      refused++;
    } else {
      assert.match(toolText(result), /^Refunded 5 cents/);
      executed.add(id);
    }
  };
  await waitFor(async () => {
    await Promise.all(sessions.map((s) => call(s, order())));
    return (await readyz(gw)).status === 503;
  }, { timeoutMs: 30000, intervalMs: 0, what: '/readyz to say not ready on a full disk' });
  const down = await readyz(gw);
  assert.equal(down.body.store, 'down');
  assert.ok(down.body.store_reason.startsWith(`the disk of ${file} fails writes (full, or I/O errors)`), JSON.stringify(down.body));
  assert.ok(refused >= 1, `${refused} claims refused`);
  assert.match(gw.logs(), /write transactions in a row failed for the disk \(full, or I\/O errors\) on .*keys\.db/);
  // still down while the disk is full: the probe write, once it has run, does not fit either
  // (the space the write-ahead log already holds must not pass for a disk that takes writes)
  await waitFor(async () => /store: sqlite: (the disk probe's 64 KiB write failed|probe of key - failed): database or disk is full/.test(gw.logs()), { timeoutMs: 10000, what: 'a probe write on the full disk' });
  const still = await sessions[0].call('issue_refund', { order_id: 'full-while-down', amount_cents: 5 });
  assert.equal(idemStatus(still.message?.result)?.code, 'store_unavailable');
  assert.equal((await readyz(gw)).status, 503);
  assert.doesNotMatch(gw.logs(), /takes writes again/);
  const ledger = (await readLedger(upstream.ledger)).map((e) => e.order_id);
  assert.equal(ledger.length, executed.size, 'only the calls answered as run ran');
  assert.deepEqual(new Set(ledger), executed, 'each ran once');

  // space again: the store's probe write succeeds and it is ready, with no call needed
  await fs.rm(filler);
  await waitFor(async () => (await readyz(gw)).status === 200, { timeoutMs: 15000, what: '/readyz to recover' });
  assert.equal((await readyz(gw)).body.store_reason, undefined);
  assert.match(gw.logs(), /keys\.db takes writes again/);
  const after = await sessions[0].call('issue_refund', { order_id: 'full-after', amount_cents: 5 });
  assert.match(toolText(after.message?.result), /^Refunded 5 cents/);
  assert.equal((await readLedger(upstream.ledger)).length, executed.size + 1);
});
