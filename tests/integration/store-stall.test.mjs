// A Postgres that accepts connections and never answers must not wedge the store: every store
// connection has a deadline from its start to ready (twice store.timeout, at least 5 s), after
// which it is dropped and retried with a capped backoff. The database sits behind a TCP proxy
// (lib/stall-proxy.mjs) switched between stalling and passing: while it stalls, /readyz is down
// and protected calls are refused store_unavailable with nothing executed; once it passes, the
// store comes back by itself, with no restart.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  createDatabase, idemStatus, postgresOnly, rawSession, readLedger, startGateway, startRefundServer, toolText,
  waitFor,
} from './lib/harness.mjs';
import { startStallProxy } from './lib/stall-proxy.mjs';

const SUBJECT = { 'X-Subject': 'agent-stall' };
const POOL = 2;
const CONFIG = {
  subject: { header: 'X-Subject' },
  store: { timeout: '1s', pool: POOL },
  tools: { issue_refund: { class: 'non_idempotent' } },
};

async function readyz(gw) {
  const r = await fetch(`${gw.adminUrl}/readyz`, { signal: AbortSignal.timeout(15000) });
  return { status: r.status, body: await r.json() };
}

async function assertRefused(s, order) {
  const a = await s.call('issue_refund', { order_id: order, amount_cents: 7 });
  assert.equal(a.status, 200, a.body);
  const result = a.message?.result;
  assert.equal(result?.isError, true, JSON.stringify(result));
  assert.equal(idemStatus(result)?.code, 'store_unavailable', JSON.stringify(result));
  assert.equal(idemStatus(result).executed, false);
}

/** Stalled from the start (mode), then passing: the store recovers without a restart. */
async function stallThenPass(t, mode) {
  const upstream = await startRefundServer(t, { jsonResponse: true });
  const proxy = await startStallProxy(t, await createDatabase(), { mode });
  const gw = await startGateway(t, { upstream: upstream.url, databaseUrl: proxy.url, config: CONFIG, waitStore: false });
  const s = await rawSession(t, gw.url, { headers: SUBJECT });

  // Not wedged: connections that never became ready are dropped and tried again, so the proxy
  // sees more connections than the pool holds (the start's migration attempt is one more).
  await proxy.waitAccepted(POOL + 3, { timeoutMs: 60000 });
  assert.match(gw.logs(), /not ready within \d+ ms/);
  const r = await readyz(gw);
  assert.equal(r.status, 503, JSON.stringify(r.body));
  assert.equal(r.body.store, 'down');
  await assertRefused(s, `${mode}-1`);
  assert.equal((await readLedger(upstream.ledger)).length, 0, 'nothing ran while the store stalled');

  proxy.setMode('pass');
  await waitFor(async () => (await readyz(gw)).status === 200, { timeoutMs: 60000, what: '/readyz to recover' });
  const ok = await s.call('issue_refund', { order_id: `${mode}-1`, amount_cents: 7 });
  assert.match(toolText(ok.message?.result), /^Refunded 7 cents/, JSON.stringify(ok.message));
  const ledger = await readLedger(upstream.ledger);
  assert.equal(ledger.length, 1, 'the refused call ran once, on its retry');
  return { gw, proxy, s, upstream };
}

test('black-hole database (accepts, never answers): /readyz down, calls refused, recovers by itself', postgresOnly('a TCP proxy in front of Postgres'), async (t) => {
  const { gw, proxy, s, upstream } = await stallThenPass(t, 'stall');

  // A store that was up stalls again (its connections cut, the new ones never answered):
  // the same cycle, still without a restart.
  proxy.setMode('stall', { cut: true });
  await waitFor(async () => (await readyz(gw)).status === 503, { timeoutMs: 60000, what: '/readyz to go down' });
  const seen = proxy.accepted();
  await proxy.waitAccepted(seen + POOL + 1, { timeoutMs: 60000 });
  await assertRefused(s, 'stall-2');
  proxy.setMode('pass');
  await waitFor(async () => (await readyz(gw)).status === 200, { timeoutMs: 60000, what: '/readyz to recover again' });
  const ok = await s.call('issue_refund', { order_id: 'stall-2', amount_cents: 7 });
  assert.match(toolText(ok.message?.result), /^Refunded 7 cents/);
  assert.equal((await readLedger(upstream.ledger)).length, 2);
});

test('database that stops mid-handshake: /readyz down, calls refused, recovers by itself', postgresOnly('a TCP proxy in front of Postgres'), async (t) => {
  const { gw } = await stallThenPass(t, 'handshake');
  assert.match(gw.logs(), /while connecting/);
});
