// `idemgw key` against a gateway's real rows: --show, --forget, key_hash as the logs show it,
// and attempts as the replay marker counts them. Executions are counted in the refund
// fixture's ledger.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  createDatabase, idemgwKey, rawSession, readLedger, replayMarker, startGateway, startRefundServer, toolText,
  waitFor,
} from './lib/harness.mjs';

const REFUND = /^Refunded (\d+) cents on order (\S+) \(refund r-(\d+)\)$/;
const SUBJECT = 'ops@example.com';

// The replay cache is off so that a forgotten success is not replayed from this gateway's
// memory (docs/store.md: a gateway that cached a success replays it until its window ends).
async function setup(t, { cacheEntries = 0 } = {}) {
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: {
      subject: { header: 'X-Subject' },
      store: { cache_entries: cacheEntries },
      tools: { issue_refund: { class: 'non_idempotent' } },
    },
  });
  const s = await rawSession(t, gw.url, { headers: { 'X-Subject': SUBJECT } });
  return { upstream, gw, s };
}

function keyCmd(gw, args, ...extra) {
  return idemgwKey(['-c', gw.configPath, '--subject', SUBJECT, '--tool', 'issue_refund', '--args', JSON.stringify(args), ...extra]);
}

/** The JSON line after the key, of a key command that succeeded. */
function rowOf(r) {
  assert.equal(r.code, 0, r.stderr);
  const lines = r.stdout.trim().split('\n');
  assert.equal(lines.length, 2, `the key, then one JSON line: ${r.stdout}`);
  return { key: lines[0], row: JSON.parse(lines[1]) };
}

test('idemgw key --show and --forget: the row is printed, then gone; the same call runs again', async (t) => {
  const { upstream, gw, s } = await setup(t);
  const args = { order_id: 'ord-forget', amount_cents: 700 };

  const first = await s.call('issue_refund', args, { id: 'first-forget' });
  assert.match(toolText(first.message.result), REFUND);
  const replay = await s.call('issue_refund', args, { id: 'replayed-forget' });
  assert.ok(replayMarker(replay.message.result), 'the repeat is replayed');
  assert.equal((await readLedger(upstream.ledger)).length, 1);

  const { key, row } = rowOf(await keyCmd(gw, args, '--show'));
  assert.match(key, /^ops@example\.com:issue_refund:h:[0-9a-f]{32}$/);
  assert.equal(row.key, key);
  assert.equal(row.state, 'succeeded');
  assert.equal(row.fence, 1);
  assert.match(row.first_jsonrpc_id, /first-forget/);
  assert.equal(row.first_session_id, s.sessionId);
  assert.ok(row.result_bytes > 0);
  assert.equal(row.result_too_large, false);
  assert.ok(Date.parse(row.finished_at) >= Date.parse(row.created_at));
  assert.ok(Date.parse(row.expires_at) > Date.now());

  // the replay's count is written within half a second: wait for it, or it could land on the
  // row the call below makes after the forget
  await waitFor(async () => rowOf(await keyCmd(gw, args, '--show')).row.attempts === 2 || null, { what: 'the replay counted' });
  // --text: the same row for people, the replay listed with its source
  const text = await keyCmd(gw, args, '--show', '--text');
  assert.equal(text.code, 0, text.stderr);
  assert.match(text.stdout, new RegExp(`^${key}\nkey_hash {4}${row.key_hash}\nstate {7}succeeded\n`));
  assert.match(text.stdout, /^duplicates {2}1 \(replay 1; by source: harness 1\)$/m);
  assert.match(text.stdout, /^\S+Z\s+harness\s+replay\s+\d+\s+"replayed-forget"\s+\S+$/m);
  const forgot = rowOf(await keyCmd(gw, args, '--forget'));
  assert.equal(forgot.key, key);
  const { forgotten, ...was } = forgot.row;
  assert.equal(forgotten, true);
  // what --show printed, save the replay recorded since
  const counted = ['attempts', 'duplicates', 'duplicates_by_answer', 'duplicates_by_source', 'history'];
  const without = (r) => Object.fromEntries(Object.entries(r).filter(([k]) => !counted.includes(k)));
  assert.deepEqual(without(was), without(row));
  assert.equal(was.duplicates, 1);
  assert.deepEqual(was.duplicates_by_answer, { replay: 1, in_progress: 0, unknown: 0 });
  assert.deepEqual(was.history.map((h) => [h.source, h.answered, h.jsonrpc_id, h.session_id]),
    [['harness', 'replay', '"replayed-forget"', s.sessionId]]);

  const none = await keyCmd(gw, args, '--show');
  assert.equal(none.code, 1);
  assert.match(none.stderr, /no row for this key/);
  const again = await keyCmd(gw, args, '--forget');
  assert.equal(again.code, 1, 'forgetting a missing row exits 1');
  assert.equal(again.stdout, `${key}\n`, 'only the key on stdout');
  assert.match(again.stderr, /nothing to forget: no row for this key/);

  const rerun = await s.call('issue_refund', args, { id: 'after-forget' });
  assert.equal(replayMarker(rerun.message.result), undefined, 'not a replay');
  assert.match(toolText(rerun.message.result), REFUND);
  assert.equal((await readLedger(upstream.ledger)).length, 2, 'after --forget the same call executed again');
  const fresh = rowOf(await keyCmd(gw, args, '--show')).row;
  assert.equal(fresh.attempts, 1);
  assert.match(fresh.first_jsonrpc_id, /after-forget/);
  assert.equal(fresh.duplicates, 0, 'a new row: none of the old duplicates');
  assert.deepEqual(fresh.history, []);
});

test('idemgw key prints the key_hash of the gateway\'s log line for that call', async (t) => {
  const { gw, s } = await setup(t);
  const args = { order_id: 'ord-hash', amount_cents: 12 };
  await s.call('issue_refund', args);
  const line = await waitFor(() => gw.logs().split('\n').find((l) => l.includes('"outcome":"executed"') && l.includes('"key_hash"')),
    { what: 'the access log line of the call' });
  const logged = JSON.parse(line).key_hash;
  assert.match(logged, /^[0-9a-f]{16}$/);

  const plain = await keyCmd(gw, args, '--hash');
  assert.equal(plain.code, 0, plain.stderr);
  const [key, hash] = plain.stdout.trim().split('\n');
  assert.equal(hash, logged, '--hash prints the key_hash of the log line');
  assert.equal((await keyCmd(gw, args)).stdout, `${key}\n`, 'without --hash the output is the key alone');
  assert.equal(rowOf(await keyCmd(gw, args, '--show')).row.key_hash, logged, '--show carries it too');
});

for (const cacheEntries of [0, 1000]) {
  test(`replay marker attempts equal --show attempts (replay cache ${cacheEntries ? 'on' : 'off'})`, async (t) => {
    const { upstream, gw, s } = await setup(t, { cacheEntries });
    const args = { order_id: `ord-attempts-${cacheEntries}`, amount_cents: 3 };
    await s.call('issue_refund', args);
    let marker;
    for (let i = 0; i < 3; i++) {
      marker = replayMarker((await s.call('issue_refund', args)).message.result);
      assert.equal(marker?.attempts, i + 2, `replay ${i + 1} counts itself`);
    }
    assert.equal((await readLedger(upstream.ledger)).length, 1);
    // Replays are written in batches (within half a second): wait for the count, then make
    // sure it settles on the marker's number, not above it.
    await waitFor(async () => rowOf(await keyCmd(gw, args, '--show')).row.attempts === marker.attempts,
      { what: `--show attempts = ${marker.attempts}` });
    await new Promise((r) => setTimeout(r, 700));
    const row = rowOf(await keyCmd(gw, args, '--show')).row;
    assert.equal(row.attempts, marker.attempts);
    // every replay is in the history, from the cache too
    assert.equal(row.duplicates, 3);
    assert.deepEqual(row.history.map((h) => h.answered), ['replay', 'replay', 'replay']);
  });
}
