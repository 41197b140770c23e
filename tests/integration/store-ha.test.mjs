// Postgres with a synchronous standby behind a multi-host database_url. The primary is killed
// with kill -9 while agents make protected calls; until the standby is promoted the gateway has
// no server that takes writes and refuses protected calls as not executed; after the promotion it
// reconnects by itself, and every call an agent was told had executed is replayed from the new
// primary, never executed again. fsync and synchronous_commit stay on; the standby is
// synchronous, so a claim the primary acknowledged is on the standby too.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  IDEMGW_BIN, idemStatus, pgClusterPids, rawSession, readLedger, replayMarker, run, startGateway, startPgCluster,
  startPgStandby, startRefundServer, toolText, waitFor, waitForLog,
} from './lib/harness.mjs';

const SUBJECT = 'agent-ha';
const WORKERS = 4;
const BEFORE_KILL = 60; // executions acknowledged before the kill
const AFTER_PROMOTE = 30; // and after the promotion
const GAP_REFUSALS = 4; // new calls refused while there is no primary
const CONFIG = { subject: { header: 'X-Subject' }, tools: { issue_refund: { class: 'non_idempotent' } } };

async function psql(url, sql) {
  const r = await run('psql', [url, '-v', 'ON_ERROR_STOP=1', '-qAtc', sql]);
  assert.equal(r.code, 0, `${sql}: ${r.stderr}`);
  return r.stdout.trim();
}

async function readyStatus(gw) {
  const res = await fetch(`${gw.adminUrl}/readyz`).catch(() => null);
  await res?.arrayBuffer();
  return res?.status;
}

/** Executions per order_id in the fixture's ledger. */
async function executions(ledger) {
  const counts = new Map();
  for (const e of await readLedger(ledger)) counts.set(e.order_id, (counts.get(e.order_id) ?? 0) + 1);
  return counts;
}

const refund = (s, key) => s.call('issue_refund', { order_id: key, amount_cents: 1 }, { headers: { 'Idempotency-Key': key } });
const executed = (result) => /^Refunded 1 cents/.test(toolText(result)) && !replayMarker(result);
const refusedUnavailable = (result) => idemStatus(result)?.code === 'store_unavailable' && idemStatus(result)?.executed === false;

test('primary killed, standby promoted: calls in the gap refused, recovery without a restart, nothing executed twice', async (t) => {
  const primary = await startPgCluster(t);
  const standby = await startPgStandby(t, primary);
  // Synchronous only now: the standby's copy of the primary's settings (pg_basebackup) must not
  // make it wait, once promoted, for a standby of its own.
  await psql(primary.baseUrl, "ALTER SYSTEM SET synchronous_standby_names = '*'");
  await psql(primary.baseUrl, 'SELECT pg_reload_conf()');
  await waitFor(async () => (await psql(primary.baseUrl, 'SELECT sync_state FROM pg_stat_replication')) === 'sync',
    { timeoutMs: 30000, what: 'the standby to be synchronous' });
  assert.equal(await psql(primary.baseUrl, "SELECT current_setting('fsync') || current_setting('synchronous_commit')"), 'onon');

  const upstream = await startRefundServer(t, { jsonResponse: true });
  // The standby first: only target_session_attrs=read-write, which the gateway adds, makes
  // libpq pass it by while it is a standby, and pick it once it is promoted.
  const primaryPort = new URL(primary.baseUrl).port;
  const databaseUrl = `postgresql://postgres@127.0.0.1:${standby.port},127.0.0.1:${primaryPort}/idem`;
  // The gateway's own session options must survive the multi-host URL: with the database's
  // default at remote_apply (stricter still), only its synchronous_commit=on makes the
  // sessions say "on"; any other value is logged as an error.
  await psql(primary.baseUrl, 'ALTER DATABASE idem SET synchronous_commit = remote_apply');
  const gw = await startGateway(t, { upstream: upstream.url, databaseUrl, config: CONFIG });

  const acked = []; // keys whose agent was answered "executed"
  const refused = []; // new keys refused as not executed (store_unavailable)
  const wrong = []; // any other answer
  let retryReplayed = 0;
  let retryRefused = 0;
  let retryHeld = 0;
  let stop = false;
  t.after(() => { stop = true; }); // a failed wait must not leave the loop running
  const worker = async (w) => {
    const s = await rawSession(t, gw.url, { headers: { 'X-Subject': SUBJECT } });
    for (let i = 0; !stop; i++) {
      // every third call retries one already acknowledged: replayed, or refused in the gap
      const retry = i % 3 === 2 && acked.length > 0;
      const key = retry ? acked[(i * 7 + w) % acked.length] : `w${w}-${i}`;
      let r;
      try {
        r = await refund(s, key);
      } catch (e) {
        wrong.push(`${key}: no answer: ${e.message}`);
        continue;
      }
      const result = r.message?.result;
      if (retry && replayMarker(result)) {
        retryReplayed++;
      } else if (retry && refusedUnavailable(result)) {
        retryRefused++;
      } else if (retry && ['in_progress', 'outcome_unknown'].includes(idemStatus(result)?.code)) {
        retryHeld++; // acknowledged, but its outcome was lost with the primary: never run again
      } else if (!retry && executed(result)) {
        acked.push(key);
      } else if (!retry && refusedUnavailable(result)) {
        refused.push(key);
      } else {
        wrong.push(`${key}: ${r.body}`);
      }
      // pacing while the store is down, so the refusals do not spin the two cores
      if (refusedUnavailable(result)) await new Promise((res) => setTimeout(res, 20));
    }
  };
  const load = Promise.all(Array.from({ length: WORKERS }, (_, w) => worker(w)));

  await waitFor(() => acked.length >= BEFORE_KILL, { timeoutMs: 30000, what: `${BEFORE_KILL} executions` });
  assert.doesNotMatch(gw.logs(), /no synchronous standby/, 'the primary has a synchronous standby');
  const pids = await pgClusterPids(primary.dir);
  const tKill = Date.now();
  for (const pid of pids) process.kill(pid, 'SIGKILL');
  const atKill = acked.length;
  await waitForLog(gw, /store conn \d+: connection lost/);
  // the gap: no server takes writes (the standby is still one)
  await waitFor(async () => (await readyStatus(gw)) === 503, { what: '/readyz to say the store is down' });
  await waitFor(() => refused.length >= GAP_REFUSALS, { what: `${GAP_REFUSALS} calls refused in the gap` });

  await standby.promote();
  const tPromote = Date.now();
  const atPromote = acked.length;
  await waitFor(async () => (await readyStatus(gw)) === 200, { timeoutMs: 20000, what: '/readyz after the promotion' });
  const tReady = Date.now();
  // the promoted standby runs alone: the gateway says so, once
  await waitForLog(gw, /database_url lists 2 hosts but the primary has no synchronous standby/);
  await waitFor(() => acked.length >= atPromote + AFTER_PROMOTE, { timeoutMs: 20000, what: 'executions after the promotion' });
  stop = true;
  await load;
  assert.deepEqual(wrong, [], 'every answer was an execution, a replay or a refusal as not executed');
  assert.doesNotMatch(gw.logs(), /synchronous_commit is/, 'the sessions run synchronous_commit=on');

  // Calls refused in the gap never ran; acknowledged calls ran once; nothing else ran.
  const counts = await executions(upstream.ledger);
  assert.deepEqual([...counts].filter(([, n]) => n > 1), [], 'no call was executed twice');
  for (const key of acked) assert.equal(counts.get(key), 1, `${key} ran once`);
  for (const key of refused) assert.equal(counts.get(key), undefined, `${key}: refused, never executed upstream`);
  assert.equal(counts.size, acked.length, 'every execution was acknowledged to its agent');

  // A fresh gateway (no replay cache), in the keyword form with the dead host first: every
  // acknowledged call is answered from the promoted standby, replayed, or held when its outcome
  // did not make it.
  const keywords = `host=127.0.0.1,127.0.0.1 port=${primaryPort},${standby.port} dbname=idem user=postgres ` +
    'target_session_attrs=read-write';
  const gw2 = await startGateway(t, { upstream: upstream.url, databaseUrl: keywords, config: CONFIG });
  const s2 = await rawSession(t, gw2.url, { headers: { 'X-Subject': SUBJECT } });
  let replays = 0;
  let held = 0;
  for (let i = 0; i < acked.length; i += WORKERS) {
    await Promise.all(acked.slice(i, i + WORKERS).map(async (key) => {
      const r = await refund(s2, key);
      const result = r.message?.result;
      if (replayMarker(result)) {
        replays++;
      } else {
        // claimed before the kill, outcome lost with the primary: held, never run again
        assert.equal(idemStatus(result)?.executed, false, `${key}: ${r.body}`);
        held++;
      }
    }));
  }
  assert.ok(held <= WORKERS, `at most the calls in flight at the kill are held: ${held}`);
  assert.deepEqual(await executions(upstream.ledger), counts, 'the retries executed nothing');
  assert.doesNotMatch(gw2.logs(), /synchronous_commit is/, 'the sessions run synchronous_commit=on');

  // A call refused in the gap was "safe to retry": it runs now, once. A claim that reached the
  // primary (and the standby) just before the kill, its answer lost, is released by the first
  // gateway once it has a server again and the claim's deadline has passed (by its token, so
  // only that claim): wait until every claim it lost that way went through a release statement.
  const lostClaims = () => (gw.logs().match(/the answer to the claim of key \S+ was lost/g) ?? []).length;
  const releaseRuns = () => [...gw.logs().matchAll(/released (\d+) of (\d+) claims whose answer was lost/g)];
  await waitFor(() => releaseRuns().reduce((n, m) => n + Number(m[2]), 0) >= lostClaims(),
    { timeoutMs: 20000, what: 'the claims whose answer was lost to be released' });
  const released = releaseRuns().reduce((n, m) => n + Number(m[1]), 0);
  // the same counts on /metrics (copied there every second)
  const metric = async (name) => Number((await (await fetch(`${gw.adminUrl}/metrics`)).text())
    .match(new RegExp(`^${name} (\\d+)$`, 'm'))?.[1]);
  await waitFor(async () => (await metric('idemgw_store_claims_in_doubt_total')) === lostClaims() &&
    (await metric('idemgw_store_claims_in_doubt_released_total')) === released,
  { what: '/metrics to count the claims whose answer was lost, and those released' });
  let ranLater = 0;
  for (const key of refused) {
    const r = await refund(s2, key);
    assert.ok(executed(r.message?.result), `${key}: refused in the gap, runs when retried: ${r.body}`);
    ranLater++;
  }
  const after = await executions(upstream.ledger);
  assert.deepEqual([...after].filter(([, n]) => n > 1), [], 'no call was executed twice');
  assert.equal(after.size, counts.size + ranLater);
  for (const key of refused) assert.equal(after.get(key), 1, `${key} ran once`);

  // `idemgw key` finds the rows through the same multi-host URL
  const key = acked[0];
  const r = await run(IDEMGW_BIN, ['key', '--subject', SUBJECT, '--tool', 'issue_refund', '--args',
    JSON.stringify({ order_id: key, amount_cents: 1 }), '--header-key', key, '--show'],
  { env: { ...process.env, IDEMGW_DATABASE_URL: databaseUrl } });
  assert.equal(r.code, 0, r.stderr);
  assert.ok(['succeeded', 'in_progress', 'unknown'].includes(JSON.parse(r.stdout.trim().split('\n')[1]).state), r.stdout);
  t.diagnostic(`${acked.length} executions acknowledged (${atKill} before the kill), ${refused.length} new calls ` +
    `and ${retryRefused} retries refused in the gap, ${retryReplayed} retries replayed and ${retryHeld} held during the run; ` +
    `kill to promotion ${tPromote - tKill} ms, promotion to ready ${tReady - tPromote} ms; ` +
    `after recovery ${replays} replayed, ${held} held; ${lostClaims()} claims lost their answer, ${released} released; ` +
    `of the refused, ${ranLater} ran when retried`);
});

test('a server that turns read-only: claims refused as not executed, the connection dropped, recovery when it takes writes again', async (t) => {
  const pg = await startPgCluster(t);
  const upstream = await startRefundServer(t, { jsonResponse: true });
  const gw = await startGateway(t, { upstream: upstream.url, databaseUrl: pg.url, config: { ...CONFIG, store: { pool: 1 } } });
  const s = await rawSession(t, gw.url, { headers: { 'X-Subject': SUBJECT } });
  assert.ok(executed((await refund(s, 'before')).message?.result));

  await psql(pg.baseUrl, 'ALTER SYSTEM SET default_transaction_read_only = on');
  await psql(pg.baseUrl, 'SELECT pg_reload_conf()');
  // a new session sees it once the postmaster has reloaded, which signals every backend first
  await waitFor(async () => (await psql(pg.baseUrl, 'SHOW default_transaction_read_only')) === 'on', { what: 'the reload' });
  // the session already open learns it at its next statement: that claim fails, and is refused
  const r = await refund(s, 'read-only');
  assert.ok(refusedUnavailable(r.message?.result), r.body);
  await waitForLog(gw, /store conn 1: connection lost: the server takes no writes/);
  // the reconnect passes the read-only server by
  await waitForLog(gw, /store conn 1: cannot connect: .*read-only/);
  assert.equal(await readyStatus(gw), 503);

  await psql(pg.baseUrl, 'ALTER SYSTEM RESET default_transaction_read_only');
  await psql(pg.baseUrl, 'SELECT pg_reload_conf()');
  await waitFor(async () => (await readyStatus(gw)) === 200, { timeoutMs: 20000, what: '/readyz once the server takes writes' });
  assert.ok(executed((await refund(s, 'after')).message?.result));
  const counts = await executions(upstream.ledger);
  assert.deepEqual([...counts].sort(), [['after', 1], ['before', 1]], 'the refused call never ran');
  // refused as "safe to retry": it runs now, once
  assert.ok(executed((await refund(s, 'read-only')).message?.result));
});
