// Which layer retried: every duplicate's log line names its most likely source
// (duplicate_source, attempt, first_seen, gap_ms) and /metrics counts them by source.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createDatabase, rawSession, replayMarker, startGateway, startRefundServer, waitForLog } from './lib/harness.mjs';

async function setup(t, config = {}) {
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { subject: { static: 'tenant' }, ...config },
  });
  return { upstream, gw };
}

// Duplicates by source, added up over tools (a source with none has no series).
async function counts(gw) {
  const text = await (await fetch(`${gw.adminUrl}/metrics`)).text();
  const out = { reconnect: 0, transport: 0, harness: 0, model: 0, late: 0 };
  for (const m of text.matchAll(/^idemgw_duplicates_total\{tool="[^"]*",source="(\w+)"\} (\d+)$/gm)) out[m[1]] += Number(m[2]);
  return out;
}

const lineOf = (gw, id) => gw.logs().split('\n').filter((l) => l.includes('"rpc_method":"tools/call"') && l.includes(`"rpc_id":${JSON.stringify(id)}`)).map((l) => JSON.parse(l)).pop();

test('a re-POST with the same id is transport, a new id at once is harness, a new session is reconnect', async (t) => {
  const { gw } = await setup(t);
  const s = await rawSession(t, gw.url);
  const args = { order_id: 'ord-src', amount_cents: 3 };
  const first = await s.call('issue_refund', args, { id: 'req-1' });
  assert.equal(replayMarker(first.message.result), undefined);
  const again = await s.call('issue_refund', args, { id: 'req-1' }); // the same request, re-sent
  assert.ok(replayMarker(again.message.result));
  const retry = await s.call('issue_refund', args, { id: 'req-2' }); // a new request at once
  assert.ok(replayMarker(retry.message.result));
  const other = await rawSession(t, gw.url);
  await other.call('issue_refund', args, { id: 'req-3' }); // after reconnecting

  await waitForLog(gw, /"rpc_id":"req-3".*"duplicate_source"/);
  const l1 = lineOf(gw, 'req-2');
  assert.equal(l1.duplicate_source, 'harness');
  assert.equal(l1.attempt, 3);
  assert.ok(l1.gap_ms >= 0 && l1.gap_ms < 2000);
  assert.ok(!Number.isNaN(Date.parse(l1.first_seen)));
  assert.equal(lineOf(gw, 'req-3').duplicate_source, 'reconnect');
  const transport = gw.logs().split('\n').filter((l) => l.includes('"rpc_id":"req-1"') && l.includes('"duplicate_source"'));
  assert.equal(transport.length, 1);
  assert.match(transport[0], /"duplicate_source":"transport"/);
  assert.deepEqual(await counts(gw), { reconnect: 1, transport: 1, harness: 1, model: 0, late: 0 });
  const text = await (await fetch(`${gw.adminUrl}/metrics`)).text();
  assert.match(text, /^idemgw_duplicates_total\{tool="issue_refund",source="harness"\} 1$/m);
  assert.match(text, /^idemgw_tool_calls_total\{tool="issue_refund",class="non_idempotent",outcome="executed"\} 1$/m);
  assert.match(text, /^idemgw_tool_calls_total\{tool="issue_refund",class="non_idempotent",outcome="replay"\} 3$/m);
});

test('a new id after harness_within is the model re-issuing the call', async (t) => {
  const { gw } = await setup(t, { duplicates: { harness_within: '1ms', model_within: '1h' } });
  const s = await rawSession(t, gw.url);
  const args = { order_id: 'ord-model', amount_cents: 4 };
  await s.call('issue_refund', args, { id: 1 });
  await s.call('issue_refund', args, { id: 2 });
  await waitForLog(gw, /"rpc_id":2.*"duplicate_source":"model"/);
  assert.equal((await counts(gw)).model, 1);
});

test('/metrics: request and upstream duration histograms, by outcome', async (t) => {
  const { gw } = await setup(t);
  const s = await rawSession(t, gw.url);
  const args = { order_id: 'ord-hist', amount_cents: 5 };
  await s.call('issue_refund', args, { id: 'h1' });
  await s.call('issue_refund', args, { id: 'h2' });
  await waitForLog(gw, /"rpc_id":"h2".*"outcome":"replay"/);
  const text = await (await fetch(`${gw.adminUrl}/metrics`)).text();
  const value = (series) => {
    const line = text.split('\n').find((l) => l.startsWith(`${series} `));
    assert.ok(line, `${series} in /metrics`);
    return Number(line.split(' ')[1]);
  };
  assert.match(text, /# TYPE idemgw_request_duration_seconds histogram/);
  assert.equal(value('idemgw_request_duration_seconds_count{outcome="executed"}'), 1);
  assert.equal(value('idemgw_request_duration_seconds_count{outcome="replay"}'), 1);
  assert.equal(value('idemgw_request_duration_seconds_bucket{outcome="replay",le="+Inf"}'), 1);
  // buckets are cumulative
  const buckets = [...text.matchAll(/^idemgw_request_duration_seconds_bucket\{outcome="forwarded",le="[^"]+"\} (\d+)$/gm)].map((m) => Number(m[1]));
  assert.equal(buckets.length, 12);
  for (let i = 1; i < buckets.length; i++) assert.ok(buckets[i] >= buckets[i - 1]);
  assert.ok(value('idemgw_upstream_duration_seconds_count') >= 3, 'initialize, initialized and the executed call went up');
  assert.ok(value('idemgw_upstream_duration_seconds_sum') >= 0);
});
