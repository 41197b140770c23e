// A stream the gateway still reads is resumed from its buffer only for the caller of the call
// that opened it: same subject, same Authorization. A GET from anyone else with the same
// Mcp-Session-Id and Last-Event-ID goes to the upstream, which judges it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { once } from 'node:events';
import { sseReader, startGateway } from './lib/harness.mjs';

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
