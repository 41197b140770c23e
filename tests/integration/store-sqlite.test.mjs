// The embedded store (database_url: sqlite:PATH): a claim acknowledged survives kill -9 of the
// gateway that holds the file, the file takes one gateway process, and several workers are
// refused at start. The idempotency suite itself also runs against this store (run-all.sh,
// IDEMGW_TEST_STORE=sqlite); these are the cases only it has.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import path from 'node:path';
import {
  IDEMGW_BIN, freePort, idemStatus, rawSession, readLedger, replayMarker, run, startGateway, startRefundServer, tempDir,
  toYaml, toolText, waitFor,
} from './lib/harness.mjs';

const SUBJECT = 'agent-embedded';
const WORKERS = 4;
const BEFORE_KILL = 120; // executions acknowledged before the kill

const keyHash = (k) => createHash('sha256').update(`${SUBJECT}:issue_refund:x:${k}`).digest('hex');

test('the gateway killed with kill -9 under load: every acknowledged call is replayed after the restart, none runs twice', async (t) => {
  const dir = await tempDir(t, 'idemgw-sqlite-');
  const databaseUrl = `sqlite:${path.join(dir, 'keys.db')}`;
  const upstream = await startRefundServer(t, { jsonResponse: true });
  const config = { subject: { header: 'X-Subject' }, store: { cache_entries: 0 }, tools: { issue_refund: { class: 'non_idempotent' } } };
  const gw = await startGateway(t, { upstream: upstream.url, databaseUrl, config });
  assert.match(gw.logs(), /store: embedded SQLite at .*keys\.db/);

  // Protected calls in a loop, each with its own key, from a few concurrent agents, until the
  // gateway dies under them.
  const acked = []; // keys whose agent was answered "executed"
  const sent = []; // every key sent, answered or not
  let stop = false;
  t.after(() => { stop = true; });
  const worker = async (w) => {
    const s = await rawSession(t, gw.url, { headers: { 'X-Subject': SUBJECT } });
    for (let i = 0; !stop; i++) {
      const key = `w${w}-${i}`;
      sent.push(key);
      let r;
      try {
        r = await s.call('issue_refund', { order_id: key, amount_cents: 1 }, { headers: { 'Idempotency-Key': key } });
      } catch {
        return; // the gateway is gone
      }
      const result = r.message?.result;
      if (/^Refunded 1 cents/.test(toolText(result)) && !replayMarker(result)) acked.push(key);
    }
  };
  const load = Promise.all(Array.from({ length: WORKERS }, (_, w) => worker(w).catch(() => {})));
  await waitFor(() => acked.length >= BEFORE_KILL, { timeoutMs: 60000, what: `${BEFORE_KILL} executions` });
  gw.proc.kill('SIGKILL');
  assert.equal((await gw.exited).signal, 'SIGKILL');
  stop = true;
  await load;

  // The same file: the dead process's lock went with it.
  const gw2 = await startGateway(t, { upstream: upstream.url, databaseUrl, config });
  const s2 = await rawSession(t, gw2.url, { headers: { 'X-Subject': SUBJECT } });
  const recorded = new Set([...gw.logs().matchAll(/key ([0-9a-f]{16}) recorded as succeeded/g)].map((m) => m[1]));
  let replays = 0;
  let held = 0;
  for (let i = 0; i < sent.length; i += WORKERS) {
    await Promise.all(sent.slice(i, i + WORKERS).map(async (key) => {
      const r = await s2.call('issue_refund', { order_id: key, amount_cents: 1 }, { headers: { 'Idempotency-Key': key } });
      const result = r.message?.result;
      if (recorded.has(keyHash(key).slice(0, 16))) {
        assert.ok(replayMarker(result), `${key}: recorded before the kill, replayed after: ${r.body}`);
      }
      if (replayMarker(result)) {
        replays++;
      } else if (acked.includes(key) || idemStatus(result)) {
        // in flight at the kill: its claim was kept, so it is held, never run again
        assert.equal(idemStatus(result)?.executed, false, `${key}: ${r.body}`);
        held++;
      }
    }));
  }
  const counts = new Map();
  for (const e of await readLedger(upstream.ledger)) counts.set(e.order_id, (counts.get(e.order_id) ?? 0) + 1);
  assert.deepEqual([...counts].filter(([, n]) => n > 1), [], 'no call was executed twice');
  for (const key of acked) assert.equal(counts.get(key), 1, `${key} ran once`);
  assert.ok(held <= WORKERS, `at most one call per agent was in flight at the kill (held ${held})`);
  t.diagnostic(`${acked.length} executions acknowledged before the kill, ${sent.length} sent; after the restart ${replays} replayed, ${held} held`);
});

test('a second gateway on the same file refuses to start: it names the file, the holder and Postgres', async (t) => {
  const dir = await tempDir(t, 'idemgw-sqlite-');
  const file = path.join(dir, 'keys.db');
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, { upstream: upstream.url, databaseUrl: `sqlite:${file}` });

  const configPath = path.join(dir, 'second.yaml');
  await fs.writeFile(configPath, toYaml({
    listen: `127.0.0.1:${await freePort()}`,
    admin_listen: `127.0.0.1:${await freePort()}`,
    upstream: upstream.url,
    database_url: `sqlite:${file}`,
  }));
  const r = await run(IDEMGW_BIN, ['-c', configPath], { timeout: 10000 });
  assert.equal(r.code, 1, `exit status: ${r.stderr}`);
  assert.ok(r.stderr.includes(`the embedded store ${file} is in use by another process (pid ${gw.proc.pid})`), r.stderr);
  assert.match(r.stderr, /several replicas or workers need Postgres/);
  // the first one still serves
  assert.equal((await fetch(`${gw.adminUrl}/readyz`)).status, 200);
});

test('workers: 2 with the embedded store is a config error that says what to do', async (t) => {
  const dir = await tempDir(t, 'idemgw-sqlite-');
  const configPath = path.join(dir, 'workers.yaml');
  await fs.writeFile(configPath, toYaml({ upstream: 'http://127.0.0.1:1/mcp', workers: 2 }));
  const r = await run(IDEMGW_BIN, ['--check-config', '-c', configPath], { env: { ...process.env, STATE_DIRECTORY: dir } });
  assert.equal(r.code, 1);
  assert.match(r.stderr, /workers: 2 with the embedded store \(.*idemgw-keys\.db\): each worker is a process/);
  assert.match(r.stderr, /set workers: 1, or database_url to a Postgres database \(or none\)/);
});

// With no database_url the embedded store's file is never in the working directory: systemd's
// STATE_DIRECTORY, else XDG_STATE_HOME/idemgw, else ~/.local/state/idemgw, its folders made at
// start. idemgw report chooses the same file in the same environment, and never makes one.
test('no database_url: the default file under XDG_STATE_HOME, else HOME; report reads it there', async (t) => {
  const dir = await tempDir(t, 'idemgw-sqlite-default-');
  const xdg = path.join(dir, 'xdg');
  const home = path.join(dir, 'home');
  const upstream = await startRefundServer(t, { jsonResponse: true });
  const cases = [
    { env: { STATE_DIRECTORY: '', XDG_STATE_HOME: xdg, HOME: home }, folder: path.join(xdg, 'idemgw') },
    { env: { STATE_DIRECTORY: '', XDG_STATE_HOME: '', HOME: home }, folder: path.join(home, '.local', 'state', 'idemgw') },
  ];
  for (const [i, c] of cases.entries()) {
    const file = path.join(c.folder, 'idemgw-keys.db');
    const config = { subject: { header: 'X-Subject' }, tools: { issue_refund: { class: 'non_idempotent' } } };
    const gw = await startGateway(t, { upstream: upstream.url, config, env: c.env });
    await waitFor(async () => (await fetch(`${gw.adminUrl}/readyz`)).status === 200, { timeoutMs: 10000, what: '/readyz' });
    assert.ok(gw.logs().includes(`store: embedded SQLite at ${file} (the default)`), gw.logs());
    assert.equal((await fs.stat(c.folder)).mode & 0o777, 0o700);
    const s = await rawSession(t, gw.url, { headers: { 'X-Subject': SUBJECT } });
    const a = await s.call('issue_refund', { order_id: `default-${i}`, amount_cents: 1 });
    assert.match(toolText(a.message?.result), /^Refunded 1 cents/);
    await fs.access(file);
    await assert.rejects(fs.access(path.join(gw.dir, 'idemgw-keys.db')), { code: 'ENOENT' });

    const r = await run(IDEMGW_BIN, ['report', '--since', 'all', '--json'], { env: { ...process.env, ...c.env, IDEMGW_DATABASE_URL: '' } });
    assert.equal(r.code, 0, r.stderr);
    const report = JSON.parse(r.stdout);
    assert.deepEqual(report.tools.map((x) => x.tool), ['issue_refund'], r.stdout);
  }
});

test('idemgw report with no store named and no default file says how to name one, and makes nothing', async (t) => {
  const dir = await tempDir(t, 'idemgw-sqlite-nostore-');
  const env = { ...process.env, STATE_DIRECTORY: '', XDG_STATE_HOME: '', HOME: dir, IDEMGW_DATABASE_URL: '', PGHOST: '', PGDATABASE: '', PGSERVICE: '' };
  const r = await run(IDEMGW_BIN, ['report'], { env });
  assert.equal(r.code, 2);
  const file = path.join(dir, '.local', 'state', 'idemgw', 'idemgw-keys.db');
  assert.ok(r.stderr.includes(`idemgw report: no database: the embedded store's default file ${file} does not exist`), r.stderr);
  assert.match(r.stderr, /--database-url sqlite:PATH .*database_url in -c FILE/);
  assert.deepEqual(await fs.readdir(dir), [], 'no folder made');
  // a bad --database-url is named as such
  const bad = await run(IDEMGW_BIN, ['report', '--database-url', 'sqlite:'], { env });
  assert.equal(bad.code, 2);
  assert.match(bad.stderr, /idemgw report: database_url: sqlite: needs a file \(sqlite:PATH\)/);
});

test('a default folder that cannot be made stops the start, naming it and how to choose a file', async (t) => {
  const dir = await tempDir(t, 'idemgw-sqlite-nofolder-');
  const blocker = path.join(dir, 'home');
  await fs.writeFile(blocker, 'a file where HOME should be a folder\n');
  const configPath = path.join(dir, 'idemgw.yaml');
  const [port, adminPort] = [await freePort(), await freePort()];
  await fs.writeFile(configPath, toYaml({ upstream: 'http://127.0.0.1:1/mcp', listen: `127.0.0.1:${port}`, admin_listen: `127.0.0.1:${adminPort}` }));
  const r = await run(IDEMGW_BIN, ['-c', configPath], { env: { ...process.env, STATE_DIRECTORY: '', XDG_STATE_HOME: '', HOME: blocker, IDEMGW_DATABASE_URL: '', PGHOST: '', PGDATABASE: '', PGSERVICE: '' }, timeout: 10000 });
  assert.equal(r.code, 1, r.stderr);
  assert.ok(r.stderr.includes(`cannot create the folder ${blocker}: it exists and is not a folder`), r.stderr);
  assert.match(r.stderr, /name another file with database_url: sqlite:PATH/);
});
