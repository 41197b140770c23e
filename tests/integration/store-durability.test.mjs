// A claim acknowledged is a claim kept. Postgres is killed with kill -9 (every process of the
// cluster at once, so what sat in its WAL buffers is gone) while agents run protected calls;
// after the restart no call whose agent was told it executed runs again. By default a finish
// commits without waiting for the WAL flush: a finish lost in the kill leaves the claim, and
// the retry is told the outcome is unknown (not executed). With store.durable_finish every
// call recorded before its agent was answered is replayed. The cluster's own default is
// synchronous_commit=off here, on purpose: the gateway's sessions must ask for synchronous
// commits themselves.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import {
  idemStatus, pgClusterPids, rawSession, readLedger, replayMarker, run, startGateway, startPgCluster, startRefundServer, toolText,
  waitFor, waitForLog,
} from './lib/harness.mjs';

const SUBJECT = 'agent-durable';
const WORKERS = 4;
const BEFORE_KILL = 150; // executions acknowledged before the kill
const AFTER_RESTART = 30; // and after the restart

const keyHash = (k) => createHash('sha256').update(`${SUBJECT}:issue_refund:x:${k}`).digest('hex');

async function psql(url, sql) {
  const r = await run('psql', [url, '-v', 'ON_ERROR_STOP=1', '-qAtc', sql]);
  assert.equal(r.code, 0, `${sql}: ${r.stderr}`);
  return r.stdout.trim();
}

const VARIANTS = [
  { name: 'finishes not waiting for the flush (default): replayed or held as unknown, never run again', durable: false },
  { name: 'store.durable_finish: every recorded call is replayed after the restart', store: { durable_finish: true }, durable: true },
];

for (const v of VARIANTS) test(`Postgres killed with kill -9 under load, ${v.name}`, async (t) => {
  const pg = await startPgCluster(t);
  await psql(pg.baseUrl, 'ALTER SYSTEM SET synchronous_commit = off');
  await psql(pg.baseUrl, 'SELECT pg_reload_conf()');

  const upstream = await startRefundServer(t, { jsonResponse: true });
  const config = { subject: { header: 'X-Subject' }, ...(v.store ? { store: v.store } : {}), tools: { issue_refund: { class: 'non_idempotent' } } };
  const gw = await startGateway(t, { upstream: upstream.url, databaseUrl: pg.url, config });
  assert.doesNotMatch(gw.logs(), /fsync=off/, 'the cluster runs with fsync on');

  // Protected calls in a loop, each with its own key, from a few concurrent agents.
  const acked = []; // keys whose agent was answered "executed"
  let stop = false;
  t.after(() => { stop = true; }); // a failed wait must not leave the loop running
  const worker = async (w) => {
    const s = await rawSession(t, gw.url, { headers: { 'X-Subject': SUBJECT } });
    for (let i = 0; !stop; i++) {
      const key = `w${w}-${i}`;
      let r;
      try {
        r = await s.call('issue_refund', { order_id: key, amount_cents: 1 }, { headers: { 'Idempotency-Key': key } });
      } catch {
        continue; // no answer: not acknowledged
      }
      const result = r.message?.result;
      if (/^Refunded 1 cents/.test(toolText(result)) && !replayMarker(result)) acked.push(key);
    }
  };
  const load = Promise.all(Array.from({ length: WORKERS }, (_, w) => worker(w)));

  await waitFor(() => acked.length >= BEFORE_KILL, { timeoutMs: 60000, what: `${BEFORE_KILL} executions` });
  const pids = await pgClusterPids(pg.dir);
  for (const pid of pids) process.kill(pid, 'SIGKILL');
  const atKill = acked.length;
  await waitForLog(gw, /store conn \d+: connection lost/);
  // a new postmaster refuses to start while the killed one still exists (even unreaped)
  await waitFor(async () => !(await fs.stat(`/proc/${pids[0]}`).catch(() => null)), { timeoutMs: 30000, what: 'the killed postmaster to be reaped' });
  await pg.start(); // crash recovery
  await waitFor(() => acked.length >= atKill + AFTER_RESTART, { timeoutMs: 60000, what: 'executions after the restart' });
  stop = true;
  await load;

  // A fresh gateway (no replay cache): the answers come from what Postgres kept.
  const gw2 = await startGateway(t, { upstream: upstream.url, databaseUrl: pg.url, config });
  const s2 = await rawSession(t, gw2.url, { headers: { 'X-Subject': SUBJECT } });
  const recorded = new Set([...gw.logs().matchAll(/key ([0-9a-f]{16}) recorded as succeeded/g)].map((m) => m[1]));
  let replays = 0;
  let held = 0;
  for (let i = 0; i < acked.length; i += WORKERS) {
    await Promise.all(acked.slice(i, i + WORKERS).map(async (key) => {
      const r = await s2.call('issue_refund', { order_id: key, amount_cents: 1 }, { headers: { 'Idempotency-Key': key } });
      const result = r.message?.result;
      if (v.durable && recorded.has(keyHash(key).slice(0, 16))) {
        // its outcome was committed before the agent was answered: it must be there
        assert.ok(replayMarker(result), `${key}: recorded before the kill, replayed after: ${r.body}`);
        replays++;
      } else if (replayMarker(result)) {
        replays++;
      } else {
        // in flight at the kill, or its finish lost with the WAL buffers: held, never run again
        assert.equal(idemStatus(result)?.executed, false, `${key}: ${r.body}`);
        held++;
      }
    }));
  }
  const counts = new Map();
  for (const e of await readLedger(upstream.ledger)) counts.set(e.order_id, (counts.get(e.order_id) ?? 0) + 1);
  const twice = [...counts].filter(([, n]) => n > 1);
  assert.deepEqual(twice, [], 'no call was executed twice');
  for (const key of acked) assert.equal(counts.get(key), 1, `${key} ran once`);
  assert.equal(replays + held, acked.length);
  if (v.durable) assert.ok(held <= WORKERS, `replays ${replays}, held ${held} of ${acked.length}`);
  t.diagnostic(`${acked.length} executions acknowledged (${atKill} before the kill), ${replays} replayed, ${held} held`);
});

test('a server running fsync=off is named in a warning at start', async (t) => {
  const pg = await startPgCluster(t);
  await psql(pg.baseUrl, 'ALTER SYSTEM SET fsync = off');
  await psql(pg.baseUrl, 'SELECT pg_reload_conf()');
  const upstream = await startRefundServer(t, { jsonResponse: true });
  const gw = await startGateway(t, { upstream: upstream.url, databaseUrl: pg.url, config: { subject: { header: 'X-Subject' } } });
  await waitForLog(gw, /"level":"warn".*fsync=off/);
});
