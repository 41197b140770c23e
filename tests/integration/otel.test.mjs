// OpenTelemetry traces: a SERVER span per agent request and a CLIENT span per call to the
// upstream, in the MCP semantic conventions, sent as OTLP/HTTP JSON to a receiver fixture; the
// agent's traceparent (header or params._meta) is continued and passed on; a replay has no
// CLIENT span. Under servers: both spans name the server the request was for.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { once } from 'node:events';
import { createDatabase, rawSession, readLedger, startGateway, startRefundServer, waitFor } from './lib/harness.mjs';

async function receiver(t) {
  const spans = [];
  let posts = 0;
  const server = http.createServer(async (req, res) => {
    let body = '';
    for await (const c of req) body += c;
    posts++;
    assert.equal(req.url, '/v1/traces');
    assert.match(req.headers['content-type'], /application\/json/);
    const doc = JSON.parse(body);
    for (const rs of doc.resourceSpans) {
      assert.equal(rs.resource.attributes.find((a) => a.key === 'service.name').value.stringValue, 'idemgw');
      for (const ss of rs.scopeSpans) spans.push(...ss.spans);
    }
    res.writeHead(200, { 'Content-Type': 'application/json' }).end('{}');
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.after(() => { server.closeAllConnections(); server.close(); });
  return { url: `http://127.0.0.1:${server.address().port}`, spans, posts: () => posts };
}

const attr = (span, key) => span.attributes.find((a) => a.key === key)?.value.stringValue;

test('spans for a protected call and its replay, continuing the agent\'s trace', async (t) => {
  const otlp = await receiver(t);
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { subject: { static: 's' }, otlp_endpoint: otlp.url },
  });
  const s = await rawSession(t, gw.url);
  const trace = '4bf92f3577b34da6a3ce929d0e0e4736';
  const parent = '00f067aa0ba902b7';
  const args = { order_id: 'ord-trace', amount_cents: 8 };
  await s.call('issue_refund', args, { id: 't1', headers: { traceparent: `00-${trace}-${parent}-01` } });
  await s.call('issue_refund', args, { id: 't2', headers: { traceparent: `00-${trace}-${parent}-01` } });
  // the trace context in params._meta, as MCP clients may send it, and no header
  const metaTrace = '0af7651916cd43dd8448eb211c80319c';
  const res = await fetch(gw.url, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream', 'Mcp-Session-Id': s.sessionId, 'MCP-Protocol-Version': '2025-11-25' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 't3', method: 'tools/call', params: { name: 'get_ledger', arguments: {}, _meta: { traceparent: `00-${metaTrace}-b7ad6b7169203331-01` } } }),
  });
  await res.text();

  const byId = (id) => otlp.spans.find((x) => x.kind === 2 && attr(x, 'jsonrpc.request.id') === id);
  await waitFor(() => byId('t1') && byId('t2') && byId('t3'), { what: 'the spans to reach the receiver' });
  const first = byId('t1');
  assert.equal(first.name, 'tools/call issue_refund');
  assert.equal(first.traceId, trace, 'the agent\'s trace is continued');
  assert.equal(first.parentSpanId, parent);
  assert.equal(attr(first, 'mcp.method.name'), 'tools/call');
  assert.equal(attr(first, 'gen_ai.tool.name'), 'issue_refund');
  assert.equal(attr(first, 'mcp.session.id'), s.sessionId);
  assert.equal(attr(first, 'idemgw.outcome'), 'executed');
  assert.equal(attr(first, 'idemgw.class'), 'non_idempotent');
  assert.match(attr(first, 'idemgw.key_hash'), /^[0-9a-f]{16}$/);
  assert.equal(attr(first, 'idemgw.server'), undefined, 'one upstream: no server named');
  assert.ok(BigInt(first.endTimeUnixNano) >= BigInt(first.startTimeUnixNano));

  const client = otlp.spans.find((x) => x.kind === 3 && x.parentSpanId === first.spanId);
  assert.ok(client, 'a CLIENT span under the SERVER span');
  assert.equal(client.traceId, trace);
  const ledger = await readLedger(upstream.ledger);
  assert.equal(ledger[0].traceparent, `00-${trace}-${client.spanId}-01`, 'the upstream continues from the CLIENT span');

  const replay = byId('t2');
  assert.equal(attr(replay, 'idemgw.outcome'), 'replay');
  assert.equal(attr(replay, 'idemgw.duplicate_source'), 'harness');
  assert.equal(otlp.spans.filter((x) => x.kind === 3 && x.parentSpanId === replay.spanId).length, 0, 'a replay has no CLIENT span');

  assert.equal(byId('t3').traceId, metaTrace, 'params._meta.traceparent is continued too');
  const metrics = await (await fetch(`${gw.adminUrl}/metrics`)).text();
  assert.match(metrics, /^idemgw_spans_exported_total [1-9]/m);
  assert.match(metrics, /^idemgw_spans_dropped_total 0$/m);
});

test('SIGTERM: the spans still held are sent before the gateway exits', async (t) => {
  const otlp = await receiver(t);
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { subject: { static: 's' }, otlp_endpoint: otlp.url },
  });
  const s = await rawSession(t, gw.url);
  await s.call('issue_refund', { order_id: 'ord-exit', amount_cents: 5 }, { id: 'x1' });
  // at once: the batch would otherwise leave on the exporter's next tick, after the exit
  gw.proc.kill('SIGTERM');
  const exit = await gw.exited;
  assert.equal(exit.code, 0, gw.logs());
  // the gateway exits once the receiver has answered, so the spans are there already
  const server = otlp.spans.find((x) => x.kind === 2 && attr(x, 'jsonrpc.request.id') === 'x1');
  assert.ok(server, `the last request's span was sent before the exit: ${gw.logs()}`);
  assert.ok(otlp.spans.some((x) => x.kind === 3 && x.parentSpanId === server.spanId), 'and its CLIENT span');
  assert.match(gw.logs(), /every span sent before exit/);
});

test('otlp_sample_ratio: traces the gateway starts are sampled by ratio; an agent\'s flag is kept', async (t) => {
  const otlp = await receiver(t);
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { subject: { static: 's' }, otlp_endpoint: otlp.url, otlp_sample_ratio: 0 },
  });
  const s = await rawSession(t, gw.url);
  const trace = 'aaf92f3577b34da6a3ce929d0e0e4736';
  await s.call('issue_refund', { order_id: 'ord-s1', amount_cents: 1 }, { id: 'u1' });
  await s.call('issue_refund', { order_id: 'ord-s2', amount_cents: 1 }, { id: 'u2', headers: { traceparent: `00-${trace}-00f067aa0ba902b7-00` } });
  await s.call('issue_refund', { order_id: 'ord-s3', amount_cents: 1 }, { id: 's3', headers: { traceparent: `00-${trace}-00f067aa0ba902b7-01` } });
  await waitFor(() => otlp.spans.some((x) => attr(x, 'jsonrpc.request.id') === 's3'), { what: 'the sampled span' });
  gw.proc.kill('SIGTERM');
  await gw.exited; // everything held is sent by now
  const ids = otlp.spans.filter((x) => x.kind === 2).map((x) => attr(x, 'jsonrpc.request.id'));
  assert.ok(!ids.includes('u1'), 'ratio 0: a trace the gateway starts is not sampled');
  assert.ok(!ids.includes('u2'), 'the agent\'s unsampled flag is kept');
  const ledger = await readLedger(upstream.ledger);
  assert.match(ledger[0].traceparent, /^00-[0-9a-f]{32}-[0-9a-f]{16}-00$/, 'the upstream is told it is not sampled');
  assert.match(ledger[1].traceparent, new RegExp(`^00-${trace}-[0-9a-f]{16}-00$`));
  assert.match(ledger[2].traceparent, new RegExp(`^00-${trace}-[0-9a-f]{16}-01$`));
});

test('servers: each span names the server its request was for', async (t) => {
  const otlp = await receiver(t);
  const billing = await startRefundServer(t);
  const payments = await startRefundServer(t);
  const gw = await startGateway(t, {
    databaseUrl: await createDatabase(),
    config: {
      subject: { static: 's' }, otlp_endpoint: otlp.url, tools: { issue_refund: { class: 'non_idempotent' } },
      servers: { billing: { path: '/billing/mcp', upstream: billing.url }, payments: { path: '/payments/mcp', upstream: payments.url } },
    },
  });
  const args = { order_id: 'ord-span', amount_cents: 3 };
  for (const name of ['billing', 'payments']) {
    const s = await rawSession(t, `http://127.0.0.1:${gw.port}/${name}/mcp`);
    await s.call('issue_refund', args, { id: `${name}-1` });
  }
  const server = (id) => otlp.spans.find((x) => x.kind === 2 && attr(x, 'jsonrpc.request.id') === id);
  await waitFor(() => server('billing-1') && server('payments-1'), { what: 'the spans to reach the receiver' });
  for (const name of ['billing', 'payments']) {
    const span = server(`${name}-1`);
    assert.equal(attr(span, 'idemgw.server'), name);
    assert.equal(attr(span, 'idemgw.outcome'), 'executed', `${name} ran its own call`);
    const client = otlp.spans.find((x) => x.kind === 3 && x.parentSpanId === span.spanId);
    assert.ok(client, `${name}: a CLIENT span`);
    assert.equal(attr(client, 'idemgw.server'), name, 'the upstream call names its server too');
  }
});
