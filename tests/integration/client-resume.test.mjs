// A stream the gateway still reads is resumed from its buffer only for the caller of the call
// that opened it: same subject, same Authorization. A GET from anyone else with the same
// Mcp-Session-Id and Last-Event-ID goes to the upstream, which judges it -- unless the session
// carries a protected call: then the gateway refuses a resume from any caller but the one whose
// subject it derived for that call, whoever would serve it (the upstream's event store too).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { once } from 'node:events';
import {
  createDatabase, postgresOnly, rawSession, readLedger, sseReader, startGateway, startRefundServer, toolText,
  waitForLog,
} from './lib/harness.mjs';

// POST: an SSE stream with event e1 at once, then e2 and the result (e3) when release() is
// called. GET: 409, counted (this upstream serves no resumes of its own).
async function streamingUpstream(t) {
  const state = { gets: 0, release: null };
  const released = new Promise((r) => { state.release = r; });
  const server = http.createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    if (req.method === 'GET') {
      state.gets++;
      res.writeHead(409, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32000, message: 'upstream: no resume here' } }));
      return;
    }
    const msg = JSON.parse(Buffer.concat(chunks).toString('utf8'));
    const ev = (id, m) => `id: ${id}\nevent: message\ndata: ${JSON.stringify(m)}\n\n`;
    const progress = (n) => ({ jsonrpc: '2.0', method: 'notifications/progress', params: { progressToken: 1, progress: n, total: 2 } });
    res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
    res.write(ev('e1', progress(1)));
    await released;
    res.write(ev('e2', progress(2)));
    res.end(ev('e3', { jsonrpc: '2.0', id: msg.id, result: { content: [{ type: 'text', text: 'alice secret result' }] } }));
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

test('a stream resume from another subject or Authorization is not served from the gateway', async (t) => {
  const up = await streamingUpstream(t);
  const gw = await startGateway(t, {
    upstream: up.url,
    config: { defaults: { class: 'read' }, subject: { header: 'X-Subject' } },
  });
  const session = 'sess-alice';
  const alice = { 'X-Subject': 'alice', Authorization: 'Bearer alice-token', 'Mcp-Session-Id': session };
  const abort = new AbortController();
  const post = await fetch(gw.url, {
    method: 'POST',
    headers: { ...alice, 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 41, method: 'tools/call', params: { name: 'slow', arguments: {}, _meta: { progressToken: 1 } } }),
    signal: abort.signal,
  });
  assert.equal(post.status, 200);
  const first = await sseReader(post).next();
  assert.equal(first.id, 'e1');
  abort.abort();

  const resume = (headers, signal) => fetch(gw.url, {
    method: 'GET',
    signal,
    headers: { ...headers, Accept: 'text/event-stream', 'Mcp-Session-Id': session, 'Last-Event-ID': 'e1' },
  });
  const others = [
    ['another subject', { 'X-Subject': 'mallory', Authorization: 'Bearer alice-token' }],
    ['another Authorization', { 'X-Subject': 'alice', Authorization: 'Bearer mallory-token' }],
    ['no Authorization', { 'X-Subject': 'alice' }],
  ];
  for (const [what, headers] of others) {
    const ac = new AbortController();
    const res = await resume(headers, ac.signal);
    if (res.status !== 409) {
      ac.abort(); // a stream taken over stays open
      assert.fail(`${what}: served from the gateway's buffer (HTTP ${res.status} ${res.headers.get('content-type')})`);
    }
    assert.match(await res.text(), /upstream: no resume here/, what);
  }
  assert.equal(up.state.gets, others.length, 'each foreign resume went to the upstream');

  const own = await resume({ 'X-Subject': 'alice', Authorization: 'Bearer alice-token' });
  assert.equal(own.status, 200, 'the caller itself resumes from the gateway');
  up.state.release();
  const reader = sseReader(own);
  const ids = [];
  for (let ev = await reader.next(); ev; ev = await reader.next()) ids.push(ev.id);
  assert.deepEqual(ids, ['e2', 'e3']);
  assert.equal(up.state.gets, others.length, 'the own resume was served by the gateway');
  assert.match(gw.logs(), /stream resumed from the gateway after event e1/);
});

test('a session with a protected call is resumed only by its caller, when the upstream serves the resume too', async (t) => {
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { subject: { header: 'X-Subject' }, tools: { get_ledger: { class: 'read' } } },
  });
  const s = await rawSession(t, gw.url, { headers: { 'X-Subject': 'alice' } });
  // SSE polling: the POST stream ends after its priming event; the result comes on a resume
  const first = await s.call('polling_refund', { order_id: 'ord-alice', amount_cents: 33, delay_ms: 300 }, { id: 'alice-1' });
  assert.equal(first.message, null, 'no result on the POST stream');
  const primingId = [...first.body.matchAll(/^id: ?(.+)$/gm)].map((m) => m[1].trim()).pop();
  assert.ok(primingId, `the priming event carries an id: ${first.body}`);

  const resume = (headers, signal) => fetch(gw.url, {
    method: 'GET',
    signal,
    headers: { ...headers, Accept: 'text/event-stream', 'Mcp-Session-Id': s.sessionId, 'MCP-Protocol-Version': '2025-11-25', 'Last-Event-ID': primingId },
  });
  const refused = async (what, headers, why) => {
    const ac = new AbortController();
    const res = await resume(headers, ac.signal);
    if (res.status !== 403) {
      ac.abort(); // a resumed stream stays open
      assert.fail(`${what}: resumed with HTTP ${res.status} ${res.headers.get('content-type')}`);
    }
    const body = await res.json();
    assert.equal(body.error.code, -32000, what);
    assert.match(body.error.message, why, what);
    assert.match(body.error.message, /not resumed/, what);
  };
  await refused('another subject', { 'X-Subject': 'bob' }, /another caller/);
  await refused('no subject', {}, /names no caller/);

  const own = await resume({ 'X-Subject': 'alice' });
  assert.equal(own.status, 200, 'the caller itself resumes');
  const reader = sseReader(own);
  let result = null;
  while (!result) {
    const ev = await reader.next();
    assert.ok(ev, 'the resumed stream ended before the result');
    if (ev.data && JSON.parse(ev.data).id === 'alice-1') result = JSON.parse(ev.data).result;
  }
  await reader.cancel();
  assert.match(toolText(result), /^Refunded 33 cents on order ord-alice/);
  await waitForLog(gw, /recorded as succeeded from a resumed stream/);

  // the key is finished, the upstream still keeps the stream's events: still only hers
  await refused('another subject, after the call finished', { 'X-Subject': 'bob' }, /another caller/);
  assert.equal((await readLedger(upstream.ledger)).length, 1, 'executed once');
  assert.match(gw.logs(), /stream of session refused: another caller/);
});

// A GET on a connection of its own (the kernel picks the worker per connection): status and body.
function getOnNewConnection(url, headers) {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method: 'GET', headers, agent: false }, (res) => {
      if (res.statusCode !== 403) {
        req.destroy(); // a resumed stream stays open
        resolve({ status: res.statusCode, body: '' });
        return;
      }
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString('utf8') }));
    });
    req.on('error', reject);
    req.end();
  });
}

test('with two workers a finished call\'s session is still resumed by its caller only, whichever worker gets the GET', postgresOnly('two workers are two processes on one store'), async (t) => {
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { workers: 2, subject: { header: 'X-Subject' }, tools: { get_ledger: { class: 'read' } } },
  });
  const s = await rawSession(t, gw.url, { headers: { 'X-Subject': 'alice' } });
  const first = await s.call('polling_refund', { order_id: 'ord-w2', amount_cents: 9, delay_ms: 200 }, { id: 'w2-1' });
  const primingId = [...first.body.matchAll(/^id: ?(.+)$/gm)].map((m) => m[1].trim()).pop();
  assert.ok(primingId, first.body);
  const headers = (who) => ({ 'X-Subject': who, Accept: 'text/event-stream', 'Mcp-Session-Id': s.sessionId, 'MCP-Protocol-Version': '2025-11-25', 'Last-Event-ID': primingId });
  const own = await fetch(gw.url, { headers: headers('alice') });
  assert.equal(own.status, 200);
  assert.match(await own.text(), /Refunded 9 cents on order ord-w2/);
  await waitForLog(gw, /recorded as succeeded from a resumed stream/);

  // every GET on a new connection: either worker may accept it
  for (let i = 0; i < 8; i++) {
    const r = await getOnNewConnection(gw.url, headers('bob'));
    assert.equal(r.status, 403, `resume ${i + 1}: served to another caller`);
    assert.match(JSON.parse(r.body).error.message, /another caller/);
  }
  assert.equal((await readLedger(upstream.ledger)).length, 1);
});
