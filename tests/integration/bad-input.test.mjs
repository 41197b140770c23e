// Bad input on either side gets a clear error and loses nothing: malformed and oversized
// requests, unknown methods, a slow client, an upstream that refuses, hangs or drops a
// stream, DNS-rebinding attempts, and the command line. Gateway-generated errors are JSON:
// {"jsonrpc":"2.0","id":null,"error":{"code":<int>,"message":"..."}}.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { once } from 'node:events';
import { IDEMGW_BIN, freePort, run, sseReader, startGateway, tempDir, toYaml } from './lib/harness.mjs';

const CONFIG = {
  defaults: { class: 'read' },
  limits: { max_body: '64KiB', max_header: '8KiB' },
  timeouts: { client_header: '1s', client_body: '1s', upstream: '2s', upstream_connect: '1s' },
};

// A minimal MCP-shaped upstream that records every request it receives. JSON responses,
// except tools/call "drop_mid_stream", which starts an SSE stream and then drops the
// connection.
async function countingUpstream(t) {
  const seen = [];
  const server = http.createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = Buffer.concat(chunks).toString('utf8');
    seen.push({ method: req.method, url: req.url, headers: req.headers, body });
    let msg = null;
    try {
      msg = JSON.parse(body);
    } catch {
      res.writeHead(400, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32700, message: 'upstream saw a parse error' } }));
      return;
    }
    if (msg.method === 'tools/call' && msg.params?.name === 'drop_mid_stream') {
      res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
      res.write(`event: message\nid: e1\ndata: ${JSON.stringify({ jsonrpc: '2.0', method: 'notifications/progress', params: { progressToken: 1, progress: 1, total: 2 } })}\n\n`);
      setImmediate(() => req.socket.destroy());
      return;
    }
    if (msg.id === undefined) {
      res.writeHead(202).end();
      return;
    }
    res.writeHead(200, { 'Content-Type': 'application/json', 'Mcp-Session-Id': 'counting-session' });
    res.end(JSON.stringify({ jsonrpc: '2.0', id: msg.id, result: msg.method === 'initialize'
      ? { protocolVersion: '2025-06-18', capabilities: { tools: {} }, serverInfo: { name: 'counting', version: '1' } }
      : {} }));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  return { url: `http://127.0.0.1:${server.address().port}/mcp`, seen };
}

// An upstream that accepts connections and never answers.
async function silentUpstream(t) {
  const sockets = new Set();
  const server = net.createServer((s) => {
    sockets.add(s);
    s.on('error', () => {});
    s.resume();
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.after(() => {
    for (const s of sockets) s.destroy();
    server.close();
  });
  return { url: `http://127.0.0.1:${server.address().port}/mcp`, sockets };
}

// One HTTP request with full control of the headers (Host included), on a fresh connection.
function request(port, { method = 'POST', path: p = '/mcp', headers = {}, body } = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, method, path: p, headers, agent: false }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.setTimeout(15000, () => req.destroy(new Error('no answer within 15 s')));
    req.end(body);
  });
}

// Writes raw bytes on a fresh TCP connection; resolves with everything read until the
// gateway closes the connection, and when that happened (ms after the last write).
function rawExchange(port, parts, { timeoutMs = 15000 } = {}) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1');
    let data = '';
    let lastWrite = Date.now();
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new Error(`connection still open after ${timeoutMs} ms; read so far: ${JSON.stringify(data)}`));
    }, timeoutMs);
    sock.setEncoding('latin1');
    sock.on('data', (d) => { data += d; });
    sock.on('error', () => {}); // a reset after the answer is fine; what was read counts
    sock.on('close', () => {
      clearTimeout(timer);
      resolve({ data, closedAfterMs: Date.now() - lastWrite });
    });
    // Writes in 16 KiB pieces and stops as soon as the gateway has answered: writing into a
    // connection it already closed would make the kernel reset it and drop the answer.
    sock.on('connect', async () => {
      for (const p of parts) {
        for (let i = 0; i < p.length; i += 16384) {
          if (sock.destroyed || data.length > 0) return;
          await new Promise((r) => sock.write(p.slice(i, i + 16384), () => r()));
          lastWrite = Date.now();
        }
      }
    });
  });
}

function parseRawResponse(raw) {
  const end = raw.indexOf('\r\n\r\n');
  assert.ok(end > 0, `no complete HTTP response head in ${JSON.stringify(raw.slice(0, 300))}`);
  const [statusLine, ...lines] = raw.slice(0, end).split('\r\n');
  const status = Number(statusLine.split(' ')[1]);
  const headers = {};
  for (const l of lines) {
    const i = l.indexOf(':');
    headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim();
  }
  let body = raw.slice(end + 4);
  if (/chunked/i.test(headers['transfer-encoding'] ?? '')) {
    let out = '';
    let rest = body;
    for (;;) {
      const nl = rest.indexOf('\r\n');
      if (nl < 0) break;
      const n = parseInt(rest.slice(0, nl), 16);
      if (!n) break;
      out += rest.slice(nl + 2, nl + 2 + n);
      rest = rest.slice(nl + 2 + n + 2);
    }
    body = out;
  } else if (headers['content-length'] !== undefined) {
    body = body.slice(0, Number(headers['content-length']));
  }
  return { status, headers, body: Buffer.from(body, 'latin1').toString('utf8') };
}

function assertJsonRpcError(res, status, { code, id = null } = {}) {
  assert.equal(res.status, status, `HTTP ${res.status}, body ${res.body}`);
  assert.match(res.headers['content-type'] ?? '', /^application\/json/, 'gateway errors are JSON');
  const body = JSON.parse(res.body);
  assert.equal(body.jsonrpc, '2.0');
  assert.deepEqual(body.id, id);
  assert.equal(typeof body.error?.code, 'number', `error.code in ${res.body}`);
  assert.ok(Number.isInteger(body.error.code));
  assert.equal(typeof body.error.message, 'string');
  assert.ok(body.error.message.length > 0);
  if (code !== undefined) assert.equal(body.error.code, code);
  return body;
}

const MCP_HEADERS = { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' };
const ping = (id = 1) => JSON.stringify({ jsonrpc: '2.0', id, method: 'ping' });

test('a body over max_body is refused with 413 and not forwarded', async (t) => {
  const up = await countingUpstream(t);
  const gw = await startGateway(t, { upstream: up.url, config: CONFIG });
  const big = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'x', arguments: { blob: 'a'.repeat(100 * 1024) } } });
  const head = `POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:${gw.port}\r\nContent-Type: application/json\r\n` +
    `Accept: application/json, text/event-stream\r\nContent-Length: ${Buffer.byteLength(big)}\r\nConnection: close\r\n\r\n`;
  // Only the head is sent: Content-Length alone tells the gateway the body is too large, and
  // a body written into a connection the gateway has already closed would make the kernel
  // reset it and discard the 413.
  const { data } = await rawExchange(gw.port, [head]);
  assertJsonRpcError(parseRawResponse(data), 413);
  assert.equal(up.seen.length, 0, 'the upstream saw nothing');
});

test('a body just under max_body is forwarded', async (t) => {
  const up = await countingUpstream(t);
  const gw = await startGateway(t, { upstream: up.url, config: CONFIG });
  const body = JSON.stringify({ jsonrpc: '2.0', id: 3, method: 'ping', params: { _meta: { pad: 'a'.repeat(60 * 1024) } } });
  const res = await request(gw.port, { headers: { ...MCP_HEADERS, Host: `127.0.0.1:${gw.port}` }, body });
  assert.equal(res.status, 200, res.body);
  assert.equal(up.seen.length, 1);
  // byte for byte but for its id, which goes up as one of the gateway's (so a stray answer on
  // a kept-alive connection is never taken for this request's)
  assert.equal(up.seen[0].body.replace(/^\{"jsonrpc":"2\.0","id":"idemgw-[0-9a-f]+-\d+"/, '{"jsonrpc":"2.0","id":3'), body);
  assert.equal(up.seen[0].body.length - body.length, up.seen[0].body.match(/"id":("[^"]+")/)[1].length - 1);
});

test('request headers over max_header are refused with 431', async (t) => {
  const up = await countingUpstream(t);
  const gw = await startGateway(t, { upstream: up.url, config: CONFIG });
  // Just over the limit and in one write, so the gateway has read all of it when it answers:
  // unread bytes left in a connection it closes would make the kernel reset it and discard
  // the 431.
  const head = `POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:${gw.port}\r\nContent-Type: application/json\r\n` +
    `X-Filler: ${'b'.repeat(9 * 1024)}\r\nContent-Length: ${ping().length}\r\nConnection: close\r\n\r\n`;
  const { data } = await rawExchange(gw.port, [head + ping()]);
  assertJsonRpcError(parseRawResponse(data), 431);
  assert.equal(up.seen.length, 0);
});

test('a client that stalls halfway through the body gets 408 and the connection is closed', async (t) => {
  const up = await countingUpstream(t);
  const gw = await startGateway(t, { upstream: up.url, config: CONFIG });
  const head = `POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:${gw.port}\r\nContent-Type: application/json\r\n` +
    `Accept: application/json, text/event-stream\r\nContent-Length: 200\r\n\r\n`;
  const { data, closedAfterMs } = await rawExchange(gw.port, [head, '{"jsonrpc":"2.0",']);
  assertJsonRpcError(parseRawResponse(data), 408);
  assert.ok(closedAfterMs < 10000, `closed ${closedAfterMs} ms after the stall`);
  assert.equal(up.seen.length, 0);
});

test('a client that stalls halfway through the headers gets 408 and the connection is closed', async (t) => {
  const up = await countingUpstream(t);
  const gw = await startGateway(t, { upstream: up.url, config: CONFIG });
  const { data } = await rawExchange(gw.port, [`POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:${gw.port}\r\nContent-Ty`]);
  assertJsonRpcError(parseRawResponse(data), 408);
  assert.equal(up.seen.length, 0);
});

test('a non-JSON body gets 400 with -32700 and is not forwarded', async (t) => {
  const up = await countingUpstream(t);
  const gw = await startGateway(t, { upstream: up.url, config: CONFIG });
  const res = await request(gw.port, { headers: MCP_HEADERS, body: '{"jsonrpc":"2.0","id":1,"method":' });
  assertJsonRpcError(res, 400, { code: -32700 });
  const res2 = await request(gw.port, { headers: MCP_HEADERS, body: 'not json at all' });
  assertJsonRpcError(res2, 400, { code: -32700 });
  assert.equal(up.seen.length, 0, `the upstream saw: ${JSON.stringify(up.seen.map((s) => s.body))}`);

  // And the gateway still forwards a good request afterwards.
  const ok = await request(gw.port, { headers: MCP_HEADERS, body: ping(5) });
  assert.equal(ok.status, 200, ok.body);
  assert.equal(JSON.parse(ok.body).id, 5);
  assert.equal(up.seen.length, 1);
});

test('a body on GET or DELETE, a tools/call notification, a body off the endpoint that is not UTF-8: refused, not forwarded; uploads and text relayed', async (t) => {
  const up = await countingUpstream(t);
  const gw = await startGateway(t, { upstream: up.url, config: CONFIG });
  const lookup = { jsonrpc: '2.0', method: 'tools/call', params: { name: 'lookup', arguments: {} } };
  const refusals = [
    // node:http frames no body of a GET unless told its length
    [{ method: 'GET', headers: { ...MCP_HEADERS, 'Content-Length': String(ping(1).length) }, body: ping(1) }, 400, /GET, HEAD, DELETE or TRACE request carries no body/],
    [{ method: 'DELETE', headers: { ...MCP_HEADERS, 'Transfer-Encoding': 'chunked' }, body: ping(2) }, 400, /carries no body/],
    [{ method: 'GET', path: '/health', headers: { ...MCP_HEADERS, 'Content-Length': '1' }, body: 'x' }, 400, /carries no body/],
    [{ headers: MCP_HEADERS, body: JSON.stringify(lookup) }, 400, /a tools\/call needs an id/],
    [{ path: '/other', headers: MCP_HEADERS, body: JSON.stringify(lookup) }, 400, /a tools\/call needs an id/],
    [{ path: '/other', headers: { 'Content-Type': 'text/plain; charset=iso-8859-1' }, body: Buffer.from('caf\xe9', 'latin1') }, 415, /names another charset/],
    [{ path: '/other', headers: { 'Content-Type': 'text/plain' }, body: Buffer.from('caf\xe9', 'latin1') }, 415, /not valid UTF-8/],
    [{ path: '/other', headers: { 'Content-Type': 'text/plain' }, body: Buffer.from('a\0b') }, 415, /holds a NUL byte/],
    [{ path: '/other', headers: { 'Content-Type': 'text/plain' }, body: Buffer.from('\ufeffhello', 'utf16le') }, 415, /UTF-16 or UTF-32/],
  ];
  for (const [req, status, says] of refusals) {
    const res = await request(gw.port, req);
    const what = `${req.method ?? 'POST'} ${req.path ?? '/mcp'}: ${res.status} ${res.body}`;
    assert.equal(res.status, status, what);
    const body = assertJsonRpcError(res, status, { code: -32600 });
    assert.match(body.error.message, says, what);
    assert.match(body.error.message, /nothing was (forwarded|executed)/);
  }
  assert.equal(up.seen.length, 0, `the upstream saw: ${JSON.stringify(up.seen.map((s) => `${s.method} ${s.url}`))}`);

  // What clients send there still goes up whole: UTF-8 text, an upload, a GET and a DELETE
  // without a body.
  const png = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 0x0d, 0xff, 0xfe]);
  for (const req of [
    { path: '/notes', headers: { 'Content-Type': 'text/plain; charset=utf-8' }, body: 'caf\u00e9' },
    { path: '/upload', headers: { 'Content-Type': 'image/png' }, body: png },
    { method: 'GET', path: '/health' },
    { method: 'DELETE', path: '/mcp', headers: { 'Content-Length': '0' } },
  ]) {
    const res = await request(gw.port, req);
    // the upstream's own answer: it takes only JSON, and says so
    if (res.status !== 200) assert.match(res.body, /upstream saw a parse error/, `${req.method ?? 'POST'} ${req.path}: ${res.status} ${res.body}`);
  }
  assert.deepEqual(up.seen.map((s) => `${s.method} ${s.url}`), ['POST /notes', 'POST /upload', 'GET /health', 'DELETE /mcp']);
  assert.equal(Number(up.seen[1].headers['content-length']), png.length, 'the upload went up whole');
});

for (const method of ['PUT', 'PATCH']) {
  test(`method ${method} is the upstream's to judge, but a protected call in it is refused`, async (t) => {
    const up = await countingUpstream(t);
    const gw = await startGateway(t, { upstream: up.url, config: { ...CONFIG, subject: { static: 'a' }, tools: { refund: { class: 'non_idempotent' } } } });
    const res = await request(gw.port, { method, headers: MCP_HEADERS, body: ping(3) });
    assert.equal(res.status, 200, res.body);
    assert.equal(up.seen.length, 1);
    assert.equal(up.seen[0].method, method);
    const call = JSON.stringify({ jsonrpc: '2.0', id: 4, method: 'tools/call', params: { name: 'refund', arguments: {} } });
    const refused = await request(gw.port, { method, headers: MCP_HEADERS, body: call });
    assertJsonRpcError(refused, 400, { id: 4 });
    assert.match(refused.body, /only accepted as a POST to the MCP endpoint/);
    assert.equal(up.seen.length, 1, 'the protected call never reached the upstream');
  });
}

test('an upstream refusing connections gives 502 with a JSON-RPC error', async (t) => {
  const port = await freePort(); // nothing listens there
  const gw = await startGateway(t, { upstream: `http://127.0.0.1:${port}/mcp`, config: CONFIG });
  const res = await request(gw.port, { headers: MCP_HEADERS, body: ping(11) });
  assertJsonRpcError(res, 502, { id: 11 });
});

test('an upstream that never answers gives 504 after the upstream timeout', async (t) => {
  const up = await silentUpstream(t);
  const gw = await startGateway(t, { upstream: up.url, config: CONFIG });
  const started = Date.now();
  const res = await request(gw.port, { headers: MCP_HEADERS, body: ping(12) });
  assertJsonRpcError(res, 504, { id: 12 });
  assert.ok(Date.now() - started >= 1500, 'not before the 2 s upstream timeout');
});

test('an upstream closing mid SSE stream ends the agent stream and the gateway keeps serving', async (t) => {
  const up = await countingUpstream(t);
  const gw = await startGateway(t, { upstream: up.url, config: CONFIG });
  const res = await fetch(gw.url, {
    method: 'POST',
    headers: MCP_HEADERS,
    body: JSON.stringify({ jsonrpc: '2.0', id: 21, method: 'tools/call', params: { name: 'drop_mid_stream', arguments: {} } }),
  });
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type'), /text\/event-stream/);
  const reader = sseReader(res);
  const first = await reader.next();
  assert.ok(first, 'the first event arrives');
  assert.equal(JSON.parse(first.data).method, 'notifications/progress');
  // The stream must end, not hang: the agent sees end-of-stream (or its connection closed).
  const end = await Promise.race([
    reader.next().then((ev) => ({ ev }), (err) => ({ err })),
    new Promise((r) => setTimeout(() => r({ hung: true }), 10000)),
  ]);
  assert.ok(!end.hung, 'the agent stream was left open after the upstream dropped it');
  assert.equal(end.err, undefined, `the stream ended with an error: ${end.err}`);
  // the request's answer never came: the gateway's error for its id ends the stream whole
  const last = JSON.parse(end.ev.data);
  assert.equal(last.id, 21);
  assert.equal(last.error.code, -32603);
  assert.match(last.error.message, /cut off/);
  assert.equal(await reader.next(), null, 'no further events');

  const ok = await request(gw.port, { headers: MCP_HEADERS, body: ping(22) });
  assert.equal(ok.status, 200, ok.body);
  assert.equal(JSON.parse(ok.body).id, 22);
});

test('Host and Origin from another site are refused with 403 (DNS rebinding)', async (t) => {
  const up = await countingUpstream(t);
  const gw = await startGateway(t, { upstream: up.url, config: CONFIG });
  const evilHost = await request(gw.port, { headers: { ...MCP_HEADERS, Host: 'evil.example.com' }, body: ping(31) });
  assert.equal(evilHost.status, 403, evilHost.body);
  assert.match(evilHost.headers['content-type'] ?? '', /^application\/json/);
  const evilOrigin = await request(gw.port, {
    headers: { ...MCP_HEADERS, Host: `127.0.0.1:${gw.port}`, Origin: 'http://evil.example.com' },
    body: ping(32),
  });
  assert.equal(evilOrigin.status, 403, evilOrigin.body);
  assert.equal(up.seen.length, 0, 'refused requests are not forwarded');

  const good = await request(gw.port, {
    headers: { ...MCP_HEADERS, Host: `localhost:${gw.port}`, Origin: `http://localhost:${gw.port}` },
    body: ping(33),
  });
  assert.equal(good.status, 200, good.body);
});

test('--check-config reports file:line for a bad file and exits non-zero', async (t) => {
  const dir = await tempDir(t);
  const bad = path.join(dir, 'bad.yaml');
  await fs.writeFile(bad, 'listen: 127.0.0.1:18080\nupstream: http://127.0.0.1:18081/mcp\nno_such_setting: 1\n');
  const r = await run(IDEMGW_BIN, ['--check-config', '-c', bad]);
  assert.notEqual(r.code, 0, 'exit status');
  assert.match(r.stdout + r.stderr, new RegExp(`${bad.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}:3`), r.stdout + r.stderr);

  const good = path.join(dir, 'good.yaml');
  await fs.writeFile(good, toYaml({ listen: '127.0.0.1:18080', upstream: 'http://127.0.0.1:18081/mcp', ...CONFIG }));
  const g = await run(IDEMGW_BIN, ['--check-config', '-c', good]);
  assert.equal(g.code, 0, `a good file passes: ${g.stdout}${g.stderr}`);
});

test('--version and --help', async () => {
  const v = await run(IDEMGW_BIN, ['--version']);
  assert.equal(v.code, 0);
  assert.match(v.stdout, /idemgw\b.*\d+\.\d+/);
  const h = await run(IDEMGW_BIN, ['--help']);
  assert.equal(h.code, 0);
  assert.match(h.stdout, /--check-config/);
  assert.match(h.stdout, /-c\b/);
});
