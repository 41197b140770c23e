// The log line of each request and the executions counter say what happened: a call never
// sent or refused by the upstream is not an execution; an agent ending a GET stream, or
// leaving after its answer, is not "gone"; leaving before the answer is.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { once } from 'node:events';
import {
  createDatabase, freePort, mcpClient, rawSession, startGateway, startRefundServer, waitFor, waitForLog,
} from './lib/harness.mjs';

// tools/call "refund": a result; "gone_session": 404 as for a session the server forgot;
// "slow": answers after release(). Everything else: an empty result.
async function scriptedUpstream(t) {
  const state = { release: null, arrived: null };
  const released = new Promise((r) => { state.release = r; });
  let arrived;
  state.arrived = new Promise((r) => { arrived = r; });
  const server = http.createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const msg = JSON.parse(Buffer.concat(chunks).toString('utf8') || '{}');
    const json = (status, body) => {
      res.writeHead(status, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify(body));
    };
    const name = msg.params?.name;
    if (name === 'gone_session') return json(404, { jsonrpc: '2.0', id: null, error: { code: -32001, message: 'Session not found' } });
    if (name === 'slow') {
      arrived();
      await released;
    }
    json(200, { jsonrpc: '2.0', id: msg.id, result: { content: [{ type: 'text', text: `done ${name}` }] } });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.after(() => {
    state.release();
    server.closeAllConnections();
    server.close();
  });
  return { url: `http://127.0.0.1:${server.address().port}/mcp`, state };
}

const TOOLS = { refund: { class: 'non_idempotent' }, gone_session: { class: 'non_idempotent' } };

function call(gw, name, id, extra = {}) {
  return fetch(gw.url, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
    body: JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: {} } }),
    ...extra,
  });
}

async function executions(gw) {
  const text = await (await fetch(`${gw.adminUrl}/metrics`)).text();
  return Number(/^idemgw_executions_total (\d+)$/m.exec(text)[1]);
}

const requestLine = (gw, id) => waitForLog(gw, new RegExp(`"msg":"request".*"rpc_id":${id},.*`));

test('a call the upstream refused (404) is logged rejected_by_upstream and not counted as an execution', async (t) => {
  const up = await scriptedUpstream(t);
  const gw = await startGateway(t, { upstream: up.url, databaseUrl: await createDatabase(), config: { subject: { static: 's' }, tools: TOOLS } });
  const gone = await call(gw, 'gone_session', 1);
  assert.equal(gone.status, 404, await gone.text());
  const [line] = await requestLine(gw, 1);
  assert.match(line, /"outcome":"rejected_by_upstream"/);
  assert.equal(await executions(gw), 0);

  const ok = await call(gw, 'refund', 2);
  assert.match(await ok.text(), /done refund/);
  const [okLine] = await requestLine(gw, 2);
  assert.match(okLine, /"outcome":"executed"/);
  assert.equal(await executions(gw), 1, 'a result counts');
});

test('a call that could not reach the upstream (502) is logged not_sent and not counted', async (t) => {
  const deadPort = await freePort();
  const gw = await startGateway(t, {
    upstream: `http://127.0.0.1:${deadPort}/mcp`,
    databaseUrl: await createDatabase(),
    waitStore: false, // /readyz also wants the upstream
    config: { subject: { static: 's' }, tools: TOOLS, timeouts: { upstream_connect: '1s' } },
  });
  await waitFor(async () => /^idemgw_store_up 1$/m.test(await (await fetch(`${gw.adminUrl}/metrics`)).text()), { what: 'the store' });
  const res = await call(gw, 'refund', 3);
  assert.equal(res.status, 502, await res.text());
  const [line] = await requestLine(gw, 3);
  assert.match(line, /"outcome":"not_sent"/);
  assert.match(line, /"why":"never sent"/);
  assert.equal(await executions(gw), 0);
});

test('an agent closing its GET stream or leaving after its answer is not "gone"; leaving mid-call is', async (t) => {
  const refund = await startRefundServer(t);
  const gw = await startGateway(t, { upstream: refund.url, config: { defaults: { class: 'read' } } });
  const client = await mcpClient(t, gw.url);
  await client.callTool({ name: 'issue_refund', arguments: { order_id: 'o1', amount_cents: 1 } });
  await client.close();
  await waitForLog(gw, /"http_method":"GET".*"outcome":"closed_by_agent"/);
  // between requests: a keep-alive connection closed while idle
  const s = await rawSession(t, gw.url);
  await s.call('get_ledger', {});
  assert.doesNotMatch(gw.logs(), /agent disconnected|agent_gone/);

  const up = await scriptedUpstream(t);
  const gw2 = await startGateway(t, { upstream: up.url, config: { defaults: { class: 'read' } } });
  const abort = new AbortController();
  const pending = call(gw2, 'slow', 4, { signal: abort.signal }).catch(() => null);
  await up.state.arrived; // the call is in flight
  abort.abort();
  await pending;
  await waitForLog(gw2, /agent disconnected before its answer was complete/);
  up.state.release();
  const [line] = await requestLine(gw2, 4);
  assert.match(line, /"outcome":"agent_gone"/);
});
