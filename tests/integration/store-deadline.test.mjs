// A stalled store must not hang protected calls: every store operation has a deadline
// (store.timeout). A call whose claim misses it is refused store_unavailable, not executed,
// and never executed later; /readyz reports a store that does not answer.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import {
  createDatabase, idemStatus, rawSession, readLedger, replayMarker, run, startGateway, startRefundServer, toolText,
  waitFor,
} from './lib/harness.mjs';

const SUBJECT = { 'X-Subject': 'agent-deadline' };
const N = 8;
// Generous: "answered, not hung". The deadline itself is 1 s (1.5 s on the gateway's side).
const OUTER_MS = 20000;

function answeredWithin(p, ms) {
  let timer;
  return Promise.race([
    p.finally(() => clearTimeout(timer)),
    new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms); }),
  ]);
}

async function readyz(gw) {
  const r = await fetch(`${gw.adminUrl}/readyz`, { signal: AbortSignal.timeout(OUTER_MS) });
  return { status: r.status, body: await r.json() };
}

/** psql holding `sql` in an open transaction until release() commits it. */
async function holdInTransaction(t, databaseUrl, sql) {
  const p = spawn('psql', [databaseUrl, '-qAt', '-v', 'ON_ERROR_STOP=1'], { stdio: ['pipe', 'pipe', 'inherit'] });
  let out = '';
  p.stdout.setEncoding('utf8').on('data', (d) => { out += d; });
  const exited = new Promise((r) => p.on('exit', r));
  t.after(() => { p.kill(); return exited; });
  p.stdin.write(`BEGIN; ${sql}; SELECT 'held';\n`);
  await waitFor(() => out.includes('held'), { what: 'the lock to be held' });
  return async () => { p.stdin.end('COMMIT;\n'); await exited; };
}

async function setup(t) {
  const upstream = await startRefundServer(t, { jsonResponse: true });
  const databaseUrl = await createDatabase();
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl,
    config: { subject: { header: 'X-Subject' }, store: { timeout: '1s' }, tools: { issue_refund: { class: 'non_idempotent' } } },
  });
  const s = await rawSession(t, gw.url, { headers: SUBJECT });
  return { upstream, databaseUrl, gw, s };
}

async function assertRefusedWhileStalled(s, tag) {
  const calls = [];
  for (let i = 0; i < N; i++) calls.push(s.call('issue_refund', { order_id: `${tag}-${i}`, amount_cents: 100 + i }));
  const answers = await answeredWithin(Promise.all(calls), OUTER_MS);
  for (const a of answers) {
    assert.equal(a.status, 200, a.body);
    const result = a.message?.result;
    assert.equal(result?.isError, true, JSON.stringify(result));
    assert.equal(idemStatus(result)?.code, 'store_unavailable');
    assert.equal(idemStatus(result).executed, false);
  }
}

/** After the stall: nothing ran late, no claim was left held, and the same calls run once now. */
async function assertNothingRanLate(upstream, databaseUrl, s, tag) {
  assert.equal((await readLedger(upstream.ledger)).length, 0, 'the upstream ran nothing');
  // A claim is refused by the database once its deadline has passed. One that ran in the last
  // milliseconds before it (the clocks agree to within half a round trip) commits, though its
  // answer comes too late: the gateway releases it by its token once the deadline has passed
  // (state failed, fence moved on), so no refused call's key stays held.
  const states = async () => (await run('psql', [databaseUrl, '-qAtc', 'SELECT state FROM idem_keys'])).stdout.split('\n').filter(Boolean);
  await waitFor(async () => !(await states()).includes('in_progress'), { timeoutMs: OUTER_MS, what: 'no claim to be left in progress' });
  for (const st of await states()) assert.equal(st, 'failed', 'a claim committed at its deadline was released');
  // A new call goes through the same queue and connections: once it is answered, anything
  // the stall held back has had its chance to run.
  const probe = await s.call('issue_refund', { order_id: `${tag}-after`, amount_cents: 1 });
  assert.match(toolText(probe.message?.result), /^Refunded 1 cents/);
  for (let i = 0; i < N; i++) {
    const r = await s.call('issue_refund', { order_id: `${tag}-${i}`, amount_cents: 100 + i });
    assert.match(toolText(r.message?.result), /^Refunded/, `the retry of ${tag}-${i} runs now`);
    assert.equal(replayMarker(r.message.result), undefined);
  }
  const ledger = await readLedger(upstream.ledger);
  assert.equal(ledger.length, N + 1, 'each refused call ran exactly once, on its retry');
}

test('key table locked: protected calls are refused store_unavailable within the deadline, /readyz says not ready', async (t) => {
  const { upstream, databaseUrl, gw, s } = await setup(t);
  assert.equal((await readyz(gw)).status, 200);

  const release = await holdInTransaction(t, databaseUrl, 'LOCK TABLE idem_keys IN ACCESS EXCLUSIVE MODE');
  await assertRefusedWhileStalled(s, 'ord-lock');
  const r = await readyz(gw);
  assert.equal(r.status, 503, JSON.stringify(r.body));
  assert.equal(r.body.store, 'down');
  await release();

  await waitFor(async () => (await readyz(gw)).status === 200, { timeoutMs: OUTER_MS, what: '/readyz to recover' });
  await assertNothingRanLate(upstream, databaseUrl, s, 'ord-lock');
  assert.match(gw.logs(), /missed its deadline/);
});

test('store backends stopped (SIGSTOP): calls are refused within the deadline, connections are replaced', async (t) => {
  const { upstream, databaseUrl, gw, s } = await setup(t);
  const q = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'idemgw'";
  const pids = (await run('psql', [databaseUrl, '-qAtc', q])).stdout.trim().split('\n').filter(Boolean).map(Number);
  assert.ok(pids.length > 0, 'the gateway has connections');
  const cont = () => { for (const pid of pids) { try { process.kill(pid, 'SIGCONT'); } catch { /* gone */ } } };
  t.after(cont);
  for (const pid of pids) process.kill(pid, 'SIGSTOP');

  await assertRefusedWhileStalled(s, 'ord-stop');
  const r = await readyz(gw);
  assert.equal(r.status, 503, JSON.stringify(r.body));
  cont();

  await waitFor(async () => (await readyz(gw)).status === 200, { timeoutMs: OUTER_MS, what: '/readyz to recover' });
  await assertNothingRanLate(upstream, databaseUrl, s, 'ord-stop');
  assert.match(gw.logs(), /got no answer within/);
});
