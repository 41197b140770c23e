// Protected calls at the edges of the protocol: the derived key forwarded upstream, batches,
// the 2026 draft's mirrored headers, an agent that leaves mid-call, and a result that arrives
// only on the agent's resumed GET stream (SSE polling). Each case counts real executions on
// the refund fixture's ledger.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import http from 'node:http';
import path from 'node:path';
import {
  createDatabase, findResponse, idemStatus, pollingCall, postgresOnly, rawSession, readLedger, replayMarker, sseReader,
  startGateway, startRefundServer, tempDir, toolText, waitFor, waitForLedger, waitForLog,
} from './lib/harness.mjs';

const ACCEPT = 'application/json, text/event-stream';

async function setup(t, tools = {}, config = {}) {
  const upstream = await startRefundServer(t);
  const databaseUrl = await createDatabase();
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl,
    config: { subject: { static: 'edge' }, tools: { get_ledger: { class: 'read' }, ...tools }, ...config },
  });
  return { upstream, gw };
}

test('forward_key: the upstream receives Idempotency-Key = sha256 of the key, never the key', async (t) => {
  const { upstream, gw } = await setup(t, { issue_refund: { forward_key: true } });
  const s = await rawSession(t, gw.url);
  const args = { order_id: 'ord-fk', amount_cents: 10 };
  const first = await s.call('issue_refund', args);
  assert.match(toolText(first.message.result), /^Refunded 10 cents/);
  const second = await s.call('issue_refund', args);
  const marker = replayMarker(second.message.result);
  assert.ok(marker, 'the repeat is a replay');
  const [line] = await readLedger(upstream.ledger);
  assert.equal(line.header_idempotency_key, marker.key_hash, 'the forwarded key is the key hash');
  assert.match(line.header_idempotency_key, /^[0-9a-f]{64}$/);
  assert.ok(!line.header_idempotency_key.includes('edge'), 'the subject never leaves the gateway');
});

test('a batch holding a protected tools/call is refused whole; nothing is executed', async (t) => {
  const { upstream, gw } = await setup(t);
  const s = await rawSession(t, gw.url);
  const headers = { Accept: ACCEPT, 'Content-Type': 'application/json', 'Mcp-Session-Id': s.sessionId, 'MCP-Protocol-Version': '2025-03-26' };
  const batch = [
    { jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'get_ledger', arguments: {} } },
    { jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'issue_refund', arguments: { order_id: 'b', amount_cents: 1 } } },
  ];
  const res = await fetch(gw.url, { method: 'POST', headers, body: JSON.stringify(batch) });
  const body = await res.json();
  assert.equal(res.status, 400);
  assert.equal(body.error.code, -32600);
  assert.match(body.error.message, /nothing was executed/);
  assert.equal((await readLedger(upstream.ledger)).length, 0, 'no refund ran');

  // A batch of read-class calls only is passed through untouched.
  const reads = await fetch(gw.url, { method: 'POST', headers, body: JSON.stringify([batch[0]]) });
  assert.equal(reads.status, 200);
  assert.match(await reads.text(), /"id":1/);
});

test('Mcp-Name disagreeing with the body is refused with -32020 and not executed', async (t) => {
  const { upstream, gw } = await setup(t);
  const s = await rawSession(t, gw.url);
  const r = await s.call('issue_refund', { order_id: 'mm', amount_cents: 5 }, { headers: { 'Mcp-Name': 'get_ledger', 'Mcp-Method': 'tools/call' } });
  assert.equal(r.status, 400);
  assert.equal(JSON.parse(r.body).error.code, -32020);
  assert.equal((await readLedger(upstream.ledger)).length, 0);
  const ok = await s.call('issue_refund', { order_id: 'mm', amount_cents: 5 }, { headers: { 'Mcp-Name': 'issue_refund' } });
  assert.equal(ok.status, 200, 'a matching Mcp-Name passes');
  assert.equal((await readLedger(upstream.ledger)).length, 1);
});

test('the agent leaves mid-call: the gateway reads on, stores the result, and the retry is a replay', async (t) => {
  const { upstream, gw } = await setup(t);
  const s = await rawSession(t, gw.url);
  const args = { order_id: 'ord-gone', amount_cents: 77, delay_ms: 1500 };
  const abort = new AbortController();
  const pending = s.call('slow_refund', args, { signal: abort.signal }).catch((e) => e);
  await waitForLedger(upstream.ledger, 1);
  abort.abort();
  assert.equal((await pending).name, 'AbortError');
  await waitForLog(gw, /recorded as succeeded/);
  const retry = await s.call('slow_refund', args);
  assert.ok(replayMarker(retry.message.result), 'the retry gets the stored result');
  assert.match(toolText(retry.message.result), /^Refunded 77 cents on order ord-gone/);
  assert.equal((await readLedger(upstream.ledger)).length, 1, 'executed once');
});

test('SSE polling: a result delivered on the resumed GET stream finishes the key', async (t) => {
  const { upstream, gw } = await setup(t);
  const s = await rawSession(t, gw.url);
  const args = { order_id: 'ord-poll', amount_cents: 42, delay_ms: 300 };
  const result = await pollingCall(gw, s, args, 'poll-1');
  assert.match(toolText(result), /^Refunded 42 cents on order ord-poll/);

  await waitForLog(gw, /recorded as succeeded from a resumed stream/);
  const retry = await s.call('polling_refund', args);
  const replay = retry.message?.result;
  assert.ok(replayMarker(replay), `the retry is a replay, not ${JSON.stringify(idemStatus(replay))}`);
  assert.equal(toolText(replay), toolText(result));
  assert.equal((await readLedger(upstream.ledger)).length, 1, 'executed once');
});

test('SSE polling with two workers: the resuming GET reaches the worker waiting for the result', postgresOnly('two workers are two processes on one store'), async (t) => {
  // The GET may be accepted by either worker; the other one hands it to the worker that holds
  // the claim, which reads the result on it and finishes the key. Eight sessions at once.
  const { upstream, gw } = await setup(t, {}, { workers: 2 });
  await Promise.all([...Array(8).keys()].map(async (i) => {
    const s = await rawSession(t, gw.url);
    const args = { order_id: `ord-poll-${i}`, amount_cents: 10 + i, delay_ms: 300 };
    const result = await pollingCall(gw, s, args, `poll-w-${i}`);
    assert.match(toolText(result), new RegExp(`^Refunded ${10 + i} cents on order ord-poll-${i} `));
    await waitFor(async () => {
      const retry = await s.call('polling_refund', args);
      return replayMarker(retry.message?.result) ? retry : null;
    }, { what: `call ${i}: the retry to be a replay (the key finished from the resumed stream)` });
  }));
  assert.equal((await readLedger(upstream.ledger)).length, 8, 'each call executed once');
  t.diagnostic(`GETs handed between workers: ${(gw.logs().match(/stream resume handed to worker/g) ?? []).length} of 8`);
});

/** One request on agent (false: a connection of its own): {status, body, localPort}. */
function onSocket(agent, url, { method = 'GET', headers, body } = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method, agent, headers }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { body += d; });
      res.on('end', () => resolve({ status: res.statusCode, body, localPort: req.socket.localPort }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

test('SSE polling with two workers: one kept-alive agent connection resumes sessions held by each worker in turn', postgresOnly('two workers are two processes on one store'), async (t) => {
  // The connection goes to the worker of the first session, then is handed to the other for the
  // second, and must be handed back for the third: a connection handed over once is handed on
  // again for a later request, or that resume reaches the upstream from a worker that cannot
  // map its answer back (the agent would get the gateway's id, the key would stay in progress)
  const { upstream, gw } = await setup(t, {}, { workers: 2 });
  const gates = await tempDir(t, 'idemgw-gates-');
  const held = { 1: [], 2: [] };
  for (let i = 0; (held[1].length < 2 || held[2].length < 1) && i < 40; i++) {
    const s = await rawSession(t, gw.url);
    const id = `keep-${i}`;
    const args = { order_id: `ord-keep-${i}`, amount_cents: 30 + i, wait_for: path.join(gates, id) };
    // each call on a connection of its own, so the workers share them
    const first = await onSocket(false, gw.url, {
      method: 'POST',
      headers: { Accept: ACCEPT, 'Content-Type': 'application/json', 'Mcp-Session-Id': s.sessionId, 'MCP-Protocol-Version': '2025-11-25' },
      body: JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'polling_refund', arguments: args } }),
    });
    assert.equal(first.status, 200);
    assert.doesNotMatch(first.body, /"result"/, 'no result on the POST stream');
    const primingId = [...first.body.matchAll(/^id: ?(.+)$/gm)].map((m) => m[1].trim()).pop();
    const line = await waitForLog(gw, new RegExp(`"worker":(\\d),[^\\n]*"rpc_id":"${id}"[^\\n]*"outcome":"pending"`));
    held[line[1]].push({ s, id, args, primingId });
  }
  assert.ok(held[1].length >= 2 && held[2].length >= 1, 'calls held by each worker');
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  t.after(() => agent.destroy());
  const ports = new Set();
  for (const c of [held[1][0], held[2][0], held[1][1]]) {
    const get = onSocket(agent, gw.url, {
      headers: { Accept: 'text/event-stream', 'Mcp-Session-Id': c.s.sessionId, 'MCP-Protocol-Version': '2025-11-25', 'Last-Event-ID': c.primingId },
    });
    // answered once the GET waits upstream, so the answer goes out on it and ends it
    await waitForLog(upstream, new RegExp(`GET resumes session ${c.s.sessionId} `));
    await fs.writeFile(c.args.wait_for, '');
    const r = await get;
    assert.equal(r.status, 200);
    ports.add(r.localPort);
    const answers = [...r.body.matchAll(/^data: ?(.+)$/gm)].map((m) => JSON.parse(m[1])).filter((m) => 'result' in m || 'error' in m);
    assert.deepEqual(answers.map((m) => m.id), [c.id], `the answer carries the agent's id: ${r.body}`);
    assert.match(toolText(answers[0].result), new RegExp(`^Refunded ${c.args.amount_cents} cents`));
    // a stream's answer passes on while its key's finish is written (the sibling test waits
    // the same way): a retry in that moment hears in_progress, a later one the replay
    await waitFor(async () => {
      const retry = await c.s.call('polling_refund', c.args);
      return replayMarker(retry.message?.result) ? retry : null;
    }, { what: `${c.id}: the retry to be a replay (the key finished from the resumed stream)` });
  }
  assert.equal(ports.size, 1, 'the three resumes came on one connection');
  assert.equal((gw.logs().match(/stream resume handed to worker/g) ?? []).length >= 2, true, 'handed over, then back');
  assert.equal((await readLedger(upstream.ledger)).length, held[1].length + held[2].length, 'each call executed once');
});

test('a replay to a browser page carries no CORS headers the upstream never sent', async (t) => {
  const { upstream, gw } = await setup(t);
  const origin = 'http://localhost:5173';
  const s = await rawSession(t, gw.url, { headers: { Origin: origin } });
  const args = { order_id: 'ord-cors', amount_cents: 12 };
  const first = await s.call('issue_refund', args);
  assert.equal(first.headers.get('access-control-allow-origin'), null, 'the upstream sends no CORS');
  const second = await s.call('issue_refund', args);
  assert.ok(replayMarker(second.message.result), 'the repeat is a replay');
  assert.equal(second.headers.get('idempotent-replayed'), 'true');
  const cors = [...second.headers.keys()].filter((k) => k.startsWith('access-control-'));
  assert.deepEqual(cors, [], 'the replay invents no CORS');
  assert.equal((await readLedger(upstream.ledger)).length, 1);
});

test('forward_key off: the agent\'s own Idempotency-Key header never reaches the upstream', async (t) => {
  const { upstream, gw } = await setup(t);
  const s = await rawSession(t, gw.url);
  const args = { order_id: 'ord-nofk', amount_cents: 11 };
  const headers = { 'Idempotency-Key': 'agent-secret-key-1' };
  const first = await s.call('issue_refund', args, { headers });
  assert.match(toolText(first.message.result), /^Refunded 11 cents/);
  const second = await s.call('issue_refund', { ...args, note: 'other words' }, { headers });
  assert.equal(second.message.result._meta['idemgw/status']?.code, 'key_reused', 'the header is the key');
  const again = await s.call('issue_refund', args, { headers });
  assert.ok(replayMarker(again.message.result), 'the same key and arguments: a replay');
  const ledger = await readLedger(upstream.ledger);
  assert.equal(ledger.length, 1);
  assert.equal(ledger[0].header_idempotency_key, null, 'the upstream saw no Idempotency-Key');
});
