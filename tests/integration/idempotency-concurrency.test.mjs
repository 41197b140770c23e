// Exactly once under concurrency: many identical protected calls in flight at once, through
// one gateway and through two gateway processes sharing one Postgres database. The refund
// fixture's ledger counts the real executions.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  createDatabase, idemStatus, postgresOnly, rawSession, readLedger, replayMarker, startGateway,
  startRefundServer, toolText,
} from './lib/harness.mjs';

const N = 50;
const REFUND = /^Refunded (\d+) cents on order (\S+) \(refund r-(\d+)\)$/;

async function gateways(t, count, toolPolicy, { jsonResponse = false } = {}) {
  const upstream = await startRefundServer(t, { jsonResponse });
  const databaseUrl = await createDatabase();
  const config = {
    subject: { header: 'X-Subject' },
    store: { pool: 8 },
    tools: { slow_refund: { class: 'non_idempotent', ...toolPolicy }, issue_refund: { class: 'non_idempotent', ...toolPolicy } },
  };
  const gws = [];
  for (let i = 0; i < count; i++) gws.push(await startGateway(t, { upstream: upstream.url, databaseUrl, config }));
  return { upstream, gws };
}

/**
 * Sends N identical calls at once, spread round-robin over the gateways and over a few
 * sessions on each; resolves to the N JSON-RPC responses.
 */
async function fanOut(t, gws, name, args, { sessionsPerGateway = 5 } = {}) {
  const sessions = [];
  for (const gw of gws) {
    for (let i = 0; i < sessionsPerGateway; i++) sessions.push(await rawSession(t, gw.url, { headers: { 'X-Subject': 'agent-7' } }));
  }
  // Every session is set up before the first call leaves, so the calls really overlap.
  const calls = Array.from({ length: N }, (_, i) => sessions[i % sessions.length].call(name, args, { id: 1000 + i }));
  const answers = await Promise.all(calls);
  for (const a of answers) {
    assert.equal(a.status, 200, `HTTP ${a.status}: ${a.body}`);
    assert.ok(a.message?.result, `a tool result for id ${a.id}: ${a.body}`);
    assert.equal(a.message.id, a.id, 'each answer carries its own request id');
  }
  return answers.map((a) => ({ result: a.message.result, replayed: a.headers.get('idempotent-replayed') === 'true' }));
}

/** Sorts answers into executed (the one real run), replayed, in_progress; fails on anything else. */
function classify(answers) {
  const out = { executed: [], replayed: [], in_progress: [] };
  for (const { result, replayed } of answers) {
    if (result.isError) {
      const st = idemStatus(result);
      assert.equal(st?.code, 'in_progress', `an error answer must be in_progress: ${JSON.stringify(result)}`);
      assert.equal(st.executed, false);
      assert.match(toolText(result), /already running/);
      assert.match(toolText(result), /NOT executed again/);
      assert.match(toolText(result), /Do not retry it right now/);
      out.in_progress.push(result);
    } else {
      assert.match(toolText(result), REFUND);
      if (replayMarker(result)) {
        assert.equal(replayed, true, 'a replay has the Idempotent-Replayed header');
        out.replayed.push(result);
      } else {
        out.executed.push(result);
      }
    }
  }
  return out;
}

test(`${N} concurrent identical calls through one gateway execute once`, async (t) => {
  for (const [tool, extra] of [['issue_refund', {}], ['slow_refund', { delay_ms: 300 }]]) {
    await t.test(tool, async (t) => {
      const { upstream, gws } = await gateways(t, 1, {});
      const args = { order_id: `ord-burst-${tool}`, amount_cents: 4200, ...extra };
      const c = classify(await fanOut(t, gws, tool, args));
      const ledger = await readLedger(upstream.ledger);
      assert.equal(ledger.length, 1, `executions: ${ledger.length}`);
      assert.equal(c.executed.length, 1, 'exactly one answer is the first execution');
      assert.equal(c.executed.length + c.replayed.length + c.in_progress.length, N);
      for (const r of c.replayed) assert.equal(toolText(r), toolText(c.executed[0]));
      t.diagnostic(`${tool}: executed 1, replayed ${c.replayed.length}, in progress ${c.in_progress.length}`);
    });
  }
});

test(`${N} concurrent identical calls split across two gateways on one database execute once`, postgresOnly('two gateway processes on one store'), async (t) => {
  for (const [tool, extra] of [['issue_refund', {}], ['slow_refund', { delay_ms: 300 }]]) {
    await t.test(tool, async (t) => {
      const { upstream, gws } = await gateways(t, 2, {});
      const args = { order_id: `ord-2gw-${tool}`, amount_cents: 4300, ...extra };
      const c = classify(await fanOut(t, gws, tool, args));
      const ledger = await readLedger(upstream.ledger);
      assert.equal(ledger.length, 1, `executions: ${ledger.length}`);
      assert.equal(c.executed.length, 1);
      for (const r of c.replayed) assert.equal(toolText(r), toolText(c.executed[0]));
      t.diagnostic(`${tool}: executed 1, replayed ${c.replayed.length}, in progress ${c.in_progress.length}`);
    });
  }
});

test(`in_progress {wait: 10s}: all ${N} calls across two gateways get the result`, postgresOnly('two gateway processes on one store'), async (t) => {
  for (const mode of ['sse', 'json']) {
    await t.test(`${mode} responses`, async (t) => {
      const { upstream, gws } = await gateways(t, 2, { in_progress: { wait: '10s' } }, { jsonResponse: mode === 'json' });
      const args = { order_id: `ord-wait-${mode}`, amount_cents: 4400, delay_ms: 1000 };
      const c = classify(await fanOut(t, gws, 'slow_refund', args));
      assert.equal(c.in_progress.length, 0, 'nobody is told to come back later');
      assert.equal(c.executed.length, 1);
      assert.equal(c.replayed.length, N - 1);
      for (const r of c.replayed) assert.equal(toolText(r), toolText(c.executed[0]));
      assert.equal((await readLedger(upstream.ledger)).length, 1);
    });
  }
});
