// Exactly once when things go wrong: the upstream times out, the gateway is killed mid-call,
// Postgres goes away and comes back. What matters in each case is that a retry is never
// executed a second time when the first may have run (the ledger says how often it ran),
// and that a call the gateway could not protect is refused with "not executed".
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import {
  IDEMGW_BIN, createDatabase, freePort, idemStatus, postgresOnly, run, rawSession, readLedger, replayMarker, startGateway,
  startPgCluster, startRefundServer, toolText, waitFor, waitForLedger, waitForLog,
} from './lib/harness.mjs';

const REFUND = /^Refunded (\d+) cents on order (\S+) \(refund r-(\d+)\)$/;
const SUBJECT = { 'X-Subject': 'agent-9' };

function assertNotExecuted(result, codes) {
  assert.equal(result?.isError, true, `a refusal is a tool error: ${JSON.stringify(result)}`);
  const st = idemStatus(result);
  assert.ok(codes.includes(st?.code), `status ${st?.code} is one of ${codes.join(', ')}`);
  assert.equal(st.executed, false);
  assert.equal(replayMarker(result), undefined);
}

test('upstream timeout after the request was sent: outcome unknown, retry not executed', async (t) => {
  const cases = [
    // SSE: the head arrives at once, then the stream stays silent past upstream_idle.
    { name: 'silent SSE stream (timeouts.upstream_idle)', json: false, timeouts: { upstream_idle: '1s' } },
    // JSON: no response head before timeouts.upstream (2 s: initialize must fit in it too).
    { name: 'no JSON response head (timeouts.upstream)', json: true, timeouts: { upstream: '2s' } },
  ];
  for (const c of cases) {
    await t.test(c.name, async (t) => {
      const upstream = await startRefundServer(t, { jsonResponse: c.json });
      const gw = await startGateway(t, {
        upstream: upstream.url,
        databaseUrl: await createDatabase(),
        config: { subject: { header: 'X-Subject' }, timeouts: c.timeouts, tools: { slow_refund: { class: 'non_idempotent' } } },
      });
      const s = await rawSession(t, gw.url, { headers: SUBJECT });
      const args = { order_id: 'ord-timeout', amount_cents: 1500, delay_ms: 4000 };

      const first = await s.call('slow_refund', args);
      if (c.json) {
        assert.equal(first.status, 504, `the agent is told the upstream did not answer in time: ${first.body}`);
      } else {
        // the stream went silent past upstream_idle and was cut: no result came, so the agent
        // is told the outcome is unknown, never given the stream's end as an empty answer
        assert.equal(first.status, 200);
        assert.equal(idemStatus(first.message?.result)?.code, 'outcome_unknown', `the cut stream ends with its outcome: ${first.body}`);
        assert.match(toolText(first.message.result), /cut off/);
      }
      assert.equal((await readLedger(upstream.ledger)).length, 1, 'the upstream did start the refund');

      // The first answer came only after the unknown outcome was committed (see the test
      // below); retries are not executed either way.
      await waitFor(async () => {
        const r = await s.call('slow_refund', args);
        assertNotExecuted(r.message?.result, ['in_progress', 'outcome_unknown']);
        return idemStatus(r.message.result).code === 'outcome_unknown';
      }, { timeoutMs: 5000, intervalMs: 20, what: 'the unknown outcome to be recorded' });
      for (let i = 0; i < 2; i++) {
        const retry = await s.call('slow_refund', args);
        assert.equal(retry.status, 200);
        assertNotExecuted(retry.message.result, ['outcome_unknown']);
        assert.match(toolText(retry.message.result), /may have executed/);
        assert.match(toolText(retry.message.result), /NOT executed again/);
      }
      assert.equal((await readLedger(upstream.ledger)).length, 1, 'the retry was not executed');
    });
  }
  await t.test('on_ambiguous: release lets the retry run', async (t) => {
    const upstream = await startRefundServer(t, { jsonResponse: true });
    const gw = await startGateway(t, {
      upstream: upstream.url,
      databaseUrl: await createDatabase(),
      config: { subject: { header: 'X-Subject' }, timeouts: { upstream: '2s' }, tools: { slow_refund: { class: 'non_idempotent', on_ambiguous: 'release', exclude_args: ['delay_ms'] } } },
    });
    const s = await rawSession(t, gw.url, { headers: SUBJECT });
    const first = await s.call('slow_refund', { order_id: 'ord-release', amount_cents: 1, delay_ms: 5000 });
    assert.equal(first.status, 504);
    // delay_ms is left out of the key: the retry is the same call, answered at once.
    const retry = await s.call('slow_refund', { order_id: 'ord-release', amount_cents: 1, delay_ms: 0 });
    assert.equal(replayMarker(retry.message.result), undefined);
    assert.match(toolText(retry.message?.result), REFUND);
    assert.equal((await readLedger(upstream.ledger)).length, 2);
  });
});

test('idemgw key --show and --release: an operator checks a held outcome and lets the retry run', async (t) => {
  const upstream = await startRefundServer(t, { jsonResponse: true });
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { subject: { header: 'X-Subject' }, timeouts: { upstream: '2s' }, tools: { slow_refund: { class: 'non_idempotent', exclude_args: ['delay_ms'] } } },
  });
  const s = await rawSession(t, gw.url, { headers: SUBJECT });
  const args = { order_id: 'ord-held', amount_cents: 4200 };
  const keyCmd = (...extra) => run(IDEMGW_BIN, ['key', '-c', gw.configPath, '--subject', 'agent-9', '--tool', 'slow_refund',
    '--args', JSON.stringify({ ...args, delay_ms: 0 }), ...extra]);

  const none = await keyCmd('--show');
  assert.equal(none.code, 1, `no row yet: ${none.stderr}`);
  assert.match(none.stderr, /no row for this key/);
  assert.equal((await keyCmd('--release')).code, 1, 'nothing to release before the first call');

  const first = await s.call('slow_refund', { ...args, delay_ms: 4000 }, { id: 'first-held' });
  assert.equal(first.status, 504);
  const held = await s.call('slow_refund', { ...args, delay_ms: 0 });
  assertNotExecuted(held.message.result, ['outcome_unknown']);

  const show = await keyCmd('--show');
  assert.equal(show.code, 0, show.stderr);
  const [keyLine, rowLine] = show.stdout.trim().split('\n');
  assert.match(keyLine, /^agent-9:slow_refund:h:[0-9a-f]{32}$/);
  const row = JSON.parse(rowLine);
  assert.equal(row.key, keyLine);
  assert.equal(row.state, 'unknown');
  assert.equal(row.attempts, 1);
  assert.equal(row.result_bytes, null);
  assert.match(row.first_jsonrpc_id, /first-held/);
  assert.equal(row.first_session_id, s.sessionId);
  assert.ok(Date.parse(row.expires_at) > Date.now(), 'held until the window ends');

  const rel = await keyCmd('--release');
  assert.equal(rel.code, 0, rel.stderr);
  assert.deepEqual(JSON.parse(rel.stdout.trim().split('\n')[1]), { key: keyLine, key_hash: row.key_hash, released: true, was: 'unknown' });
  const again = await keyCmd('--release');
  assert.equal(again.code, 1);
  assert.match(again.stderr, /the next identical call runs already/);

  const retry = await s.call('slow_refund', { ...args, delay_ms: 0 });
  assert.match(toolText(retry.message?.result), REFUND, 'after the release the retry runs');
  assert.equal((await readLedger(upstream.ledger)).length, 2);
  const done = await keyCmd('--release');
  assert.equal(done.code, 1, 'a success is never released');
  assert.match(done.stderr, /succeeded/);
  assert.equal(JSON.parse((await keyCmd('--show')).stdout.trim().split('\n')[1]).state, 'succeeded');
});

// The gateway holds the end of a response until the outcome is stored, "so a retry right after
// sees it" — for a timed-out call too: the 504 (JSON) or the end of the cut SSE stream waits
// for the `unknown` outcome to be written, so a retry sent at once is told "outcome unknown",
// never "already running, do not retry now". Made deterministic by locking the row, so the
// gateway's write of the outcome has to wait.
test('a timed-out call is answered only once its unknown outcome is recorded', postgresOnly('locks the key table with psql'), async (t) => {
  for (const json of [false, true]) {
    await t.test(json ? 'JSON response head timeout (504)' : 'silent SSE stream cut', async (t) => {
      const upstream = await startRefundServer(t, { jsonResponse: json });
      const databaseUrl = await createDatabase();
      const gw = await startGateway(t, {
        upstream: upstream.url,
        databaseUrl,
        // The lock must be taken before the upstream timeout (3 s) ends the call: psql starts
        // slowly on a loaded machine. The store's deadline (30 s) is far beyond the wait
        // below, so only the COMMIT can let the outcome's write through.
        config: {
          subject: { header: 'X-Subject' },
          store: { timeout: '30s' },
          timeouts: json ? { upstream: '3s' } : { upstream_idle: '3s' },
        },
      });
      const s = await rawSession(t, gw.url, { headers: SUBJECT });
      const pending = s.call('slow_refund', { order_id: 'ord-timeout-now', amount_cents: 1, delay_ms: 20000 });
      await waitForLedger(upstream.ledger, 1); // claimed and forwarded

      const locker = spawn('psql', [databaseUrl, '-qAt', '-v', 'ON_ERROR_STOP=1'], { stdio: ['pipe', 'pipe', 'inherit'] });
      t.after(() => locker.kill());
      let out = '';
      locker.stdout.setEncoding('utf8').on('data', (d) => { out += d; });
      locker.stdin.write("BEGIN; SELECT state FROM idem_keys FOR UPDATE;\n");
      await waitFor(() => out.includes('in_progress'), { what: 'the row lock' });
      // Unlocked, the answer comes 3 s after the call went up; held for the outcome, it waits
      // for the COMMIT.
      const first = await Promise.race([pending.then(() => 'answered'), new Promise((r) => setTimeout(r, 8000, 'held'))]);
      locker.stdin.end('COMMIT;\n');
      await pending;
      assert.equal(first, 'held', 'the agent was answered while its outcome could not be recorded yet');
    });
  }
});

test('kill -9 of the gateway mid-call, restart on the same database: the retry is not executed', async (t) => {
  const cases = [
    // Restarted long before the 60 s + 30 s lease ends: the claim is still in progress.
    { name: 'lease still valid', policy: {}, timeouts: {}, codes: ['in_progress', 'outcome_unknown'] },
    // A 2 s lease ends soon after the restart: then the claim counts as an unknown outcome.
    { name: 'lease expired', policy: { lease: '2s' }, timeouts: { upstream: '2s' }, codes: ['outcome_unknown'] },
  ];
  for (const c of cases) {
    await t.test(c.name, async (t) => {
      const upstream = await startRefundServer(t);
      const databaseUrl = await createDatabase();
      const config = { subject: { header: 'X-Subject' }, timeouts: c.timeouts, tools: { slow_refund: { class: 'non_idempotent', ...c.policy } } };
      const gw1 = await startGateway(t, { upstream: upstream.url, databaseUrl, config });
      const s1 = await rawSession(t, gw1.url, { headers: SUBJECT });
      const args = { order_id: 'ord-crash', amount_cents: 8800, delay_ms: 5000 };

      const pending = s1.call('slow_refund', args).then(
        (r) => ({ answered: r }),
        (err) => ({ error: err }),
      );
      await waitForLedger(upstream.ledger, 1); // forwarded: the refund is under way upstream
      gw1.proc.kill('SIGKILL');
      const exit = await gw1.exited;
      assert.equal(exit.signal, 'SIGKILL');
      const lost = await pending;
      assert.ok(lost.error || lost.answered.message === null, `the first caller got no result: ${JSON.stringify(lost.answered?.body)}`);

      const gw2 = await startGateway(t, { upstream: upstream.url, databaseUrl, config });
      const s2 = await rawSession(t, gw2.url, { headers: SUBJECT });
      const retry = await s2.call('slow_refund', args);
      assertNotExecuted(retry.message?.result, ['in_progress', 'outcome_unknown']);
      if (c.codes.length === 1) {
        // Retry until the lease has run out; none of the retries may run it.
        const after = await waitFor(async () => {
          const r = await s2.call('slow_refund', args);
          assertNotExecuted(r.message?.result, ['in_progress', 'outcome_unknown']);
          return idemStatus(r.message.result).code === 'outcome_unknown' ? r : null;
        }, { timeoutMs: 15000, intervalMs: 200, what: 'the lease to expire' });
        assert.match(toolText(after.message.result), /NOT executed again/);
      }
      const ledger = await readLedger(upstream.ledger);
      assert.equal(ledger.length, 1, `the ledger holds one refund: ${JSON.stringify(ledger)}`);
    });
  }
});

test('Postgres stopped: refused as not executed; Postgres back: protected calls work without a restart', postgresOnly('stops and starts a Postgres cluster'), async (t) => {
  const pg = await startPgCluster(t);
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: pg.url,
    config: { subject: { header: 'X-Subject' }, store: { pool: 2 }, tools: { get_ledger: { class: 'read' } } },
  });
  const s = await rawSession(t, gw.url, { headers: SUBJECT });
  const a = { order_id: 'ord-pg-a', amount_cents: 100 };
  const b = { order_id: 'ord-pg-b', amount_cents: 200 };

  const a1 = await s.call('issue_refund', a);
  assert.match(toolText(a1.message.result), REFUND);
  assert.equal((await readLedger(upstream.ledger)).length, 1);

  await pg.stop();
  const bDown = await s.call('issue_refund', b);
  assert.equal(bDown.status, 200);
  assertNotExecuted(bDown.message?.result, ['store_unavailable']);
  assert.match(toolText(bDown.message.result), /Nothing was executed/);
  assert.match(toolText(bDown.message.result), /safe to retry/);
  // A call already finished may still be replayed from the gateway's own cache of results;
  // otherwise it is refused the same way. It is never executed.
  const aDown = await s.call('issue_refund', a);
  if (replayMarker(aDown.message?.result)) {
    assert.equal(toolText(aDown.message.result), toolText(a1.message.result));
  } else {
    assertNotExecuted(aDown.message?.result, ['store_unavailable']);
  }
  // Unprotected traffic is not affected by the store.
  const read = await s.call('get_ledger', {});
  assert.notEqual(read.message?.result?.isError, true);
  assert.equal((await readLedger(upstream.ledger)).length, 1, 'nothing was forwarded while the store was down');

  await pg.start();
  const b1 = await waitFor(async () => {
    const r = await s.call('issue_refund', b);
    if (idemStatus(r.message?.result)?.code === 'store_unavailable') return null;
    return r;
  }, { timeoutMs: 30000, intervalMs: 200, what: 'the gateway to reach Postgres again' });
  assert.match(toolText(b1.message.result), REFUND);
  assert.equal(replayMarker(b1.message.result), undefined);
  assert.equal((await readLedger(upstream.ledger)).length, 2, 'the refused attempts never ran; the first accepted one ran once');

  const b2 = await s.call('issue_refund', b);
  const a2 = await s.call('issue_refund', a);
  assert.equal(toolText(b2.message.result), toolText(b1.message.result));
  assert.ok(replayMarker(b2.message.result));
  assert.equal(toolText(a2.message.result), toolText(a1.message.result), 'what was stored before the outage is still replayed');
  assert.ok(replayMarker(a2.message.result));
  assert.equal((await readLedger(upstream.ledger)).length, 2);
});

test('on_store_down: passthrough forwards unprotected, reject refuses', postgresOnly('an unreachable Postgres; the same in both runs'), async (t) => {
  const upstream = await startRefundServer(t);
  const deadPort = await freePort(); // nothing listens there: the store is down from the start
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: `postgresql://postgres@127.0.0.1:${deadPort}/idem?connect_timeout=2`,
    waitStore: false,
    config: {
      subject: { header: 'X-Subject' },
      migrate: false,
      tools: {
        issue_refund: { class: 'non_idempotent', on_store_down: 'passthrough' },
        slow_refund: { class: 'non_idempotent', on_store_down: 'reject' },
      },
    },
  });
  const s = await rawSession(t, gw.url, { headers: SUBJECT });
  const args = { order_id: 'ord-pass', amount_cents: 77 };

  const p1 = await s.call('issue_refund', args);
  const p2 = await s.call('issue_refund', args);
  for (const r of [p1, p2]) {
    assert.match(toolText(r.message?.result), REFUND);
    assert.equal(replayMarker(r.message.result), undefined);
  }
  assert.equal((await readLedger(upstream.ledger)).length, 2, 'passthrough forwards every call: no protection');
  await waitForLog(gw, /without protection/);

  const rj = await s.call('slow_refund', { ...args, delay_ms: 0 });
  assertNotExecuted(rj.message?.result, ['store_unavailable']);
  assert.equal((await readLedger(upstream.ledger)).length, 2);
});
