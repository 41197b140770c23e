// Out of file descriptors: the gateway lowers max_connections to what its open file limit
// allows (with a reserve for the upstream and the store), refuses the surplus with one log
// line for the episode, keeps answering the connections it has, and serves new ones once
// the idle ones are gone.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { once } from 'node:events';
import { IDEMGW_BIN, freePort, startProcess, tempDir, toYaml, waitFor, waitForLog } from './lib/harness.mjs';

async function pingUpstream(t) {
  const server = http.createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const msg = JSON.parse(Buffer.concat(chunks).toString('utf8') || '{}');
    const body = JSON.stringify({ jsonrpc: '2.0', id: msg.id ?? null, result: { pong: true } });
    res.writeHead(200, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) });
    res.end(body);
  });
  server.keepAliveTimeout = 600000; // the pool's idle connection stays usable for the whole test
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  return `http://127.0.0.1:${server.address().port}/mcp`;
}

// A keep-alive connection that sends pings one at a time and returns each answer's status and
// body (Content-Length framed).
async function keepAlive(port) {
  const sock = net.connect(port, '127.0.0.1');
  await once(sock, 'connect');
  // a connection the gateway refuses may be reset: that ends it ('close'), it is no crash
  sock.on('error', () => {});
  sock.setEncoding('utf8');
  let buf = '';
  let waiter = null;
  sock.on('data', (d) => {
    buf += d;
    if (waiter) waiter();
  });
  sock.on('close', () => waiter && waiter());
  return {
    sock,
    async ping(id) {
      const body = JSON.stringify({ jsonrpc: '2.0', id, method: 'ping' });
      sock.write(`POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nContent-Type: application/json\r\n`
        + `Accept: application/json, text/event-stream\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
      for (;;) {
        const end = buf.indexOf('\r\n\r\n');
        const len = end < 0 ? -1 : Number(/content-length: *(\d+)/i.exec(buf.slice(0, end))?.[1] ?? 0);
        if (end >= 0 && buf.length >= end + 4 + len) {
          const status = Number(buf.split(' ')[1]);
          const text = buf.slice(end + 4, end + 4 + len);
          buf = buf.slice(end + 4 + len);
          return { status, text };
        }
        if (sock.destroyed) return { status: 0, text: 'connection closed' };
        await new Promise((r) => { waiter = r; });
        waiter = null;
      }
    },
  };
}

test('under a low open file limit: clamped, one log line per episode, open connections still served', async (t) => {
  const upstream = await pingUpstream(t);
  const dir = await tempDir(t);
  const port = await freePort();
  const adminPort = await freePort();
  const configPath = path.join(dir, 'idemgw.yaml');
  await fs.writeFile(configPath, toYaml({
    listen: `127.0.0.1:${port}`,
    admin_listen: `127.0.0.1:${adminPort}`,
    upstream,
    defaults: { class: 'read' },
    limits: { upstream_pool: 4 },
  }));
  const gw = await startProcess(t, 'sh', ['-c', 'ulimit -n 64; exec "$0" -c "$1"', IDEMGW_BIN, configPath], {
    env: { STATE_DIRECTORY: dir }, // the default embedded store in the test's own folder
    readyUrl: `http://127.0.0.1:${adminPort}/healthz`,
    name: 'idemgw',
  });
  const [clampLine] = await waitForLog(gw, /max_connections lowered from 10000 to (\d+)/);
  const max = Number(/to (\d+)/.exec(clampLine)[1]);
  assert.ok(max > 2 && max < 32, `clamped to ${max}`);

  const first = await keepAlive(port);
  assert.equal((await first.ping(1)).status, 200);

  // many more idle connections than allowed
  const idle = [];
  let closed = 0;
  for (let i = 0; i < 3 * max; i++) {
    const s = net.connect(port, '127.0.0.1');
    s.on('error', () => {});
    s.on('close', () => { closed++; });
    s.resume();
    idle.push(s);
  }
  t.after(() => idle.forEach((s) => s.destroy()));
  // a refused one may be reset before its connect is seen: wait for either
  await Promise.all(idle.map((s) => new Promise((r) => {
    s.once('connect', r);
    s.once('close', r);
  })));
  // the surplus is refused: closed by the gateway (one slot is the first connection's)
  await waitFor(() => closed >= 2 * max + 1, { what: 'the surplus to be closed' });
  await waitForLog(gw, /refusing new connections: max_connections reached/);

  const answer = await first.ping(2);
  assert.equal(answer.status, 200, `a request on an open connection is answered: ${answer.text}`);
  assert.match(answer.text, /"pong":true/);

  const episodeLines = gw.logs().split('\n').filter((l) => /refusing new connections|file descriptors|Too many open files/.test(l));
  assert.equal(episodeLines.length, 1, episodeLines.join('\n'));

  for (const s of idle) s.destroy();
  // new connections are served once the gateway has seen the idle ones go
  const fresh = await waitFor(async () => {
    const c = await keepAlive(port).catch(() => null);
    const r = c && await c.ping(3);
    c?.sock.destroy();
    return r?.status === 200 ? r : null;
  }, { what: 'a new connection to be served' });
  assert.match(fresh.text, /"pong":true/);
  first.sock.destroy();
});

test('out of descriptors despite the clamp: accepting pauses, one log line, then recovers', async (t) => {
  // POST exchanges outlive their agents (a protected result must still be stored), so agents
  // that send a call the upstream holds and then leave pile up upstream connections past
  // what the clamp counted.
  const held = [];
  const server = http.createServer((req, res) => {
    req.resume();
    held.push(res);
  });
  server.keepAliveTimeout = 600000;
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  const dir = await tempDir(t);
  const port = await freePort();
  const adminPort = await freePort();
  const configPath = path.join(dir, 'idemgw.yaml');
  await fs.writeFile(configPath, toYaml({
    listen: `127.0.0.1:${port}`,
    admin_listen: `127.0.0.1:${adminPort}`,
    upstream: `http://127.0.0.1:${server.address().port}/mcp`,
    defaults: { class: 'read' },
    limits: { upstream_pool: 4 },
    timeouts: { upstream: '60s' },
  }));
  const gw = await startProcess(t, 'sh', ['-c', 'ulimit -n 64; exec "$0" -c "$1"', IDEMGW_BIN, configPath], {
    env: { STATE_DIRECTORY: dir }, // the default embedded store in the test's own folder
    readyUrl: `http://127.0.0.1:${adminPort}/healthz`,
    name: 'idemgw',
  });
  const body = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'hang', arguments: {} } });
  const request = `POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nContent-Type: application/json\r\n`
    + `Accept: application/json, text/event-stream\r\nContent-Length: ${body.length}\r\n\r\n${body}`;
  // rounds of agents that send the call and leave, until the gateway runs out
  for (let round = 0; round < 20 && !/out of file descriptors/.test(gw.logs()); round++) {
    const before = held.length;
    const socks = [];
    for (let i = 0; i < 10; i++) {
      const s = net.connect(port, '127.0.0.1');
      s.on('error', () => {});
      s.on('connect', () => s.write(request));
      socks.push(s);
    }
    await waitFor(() => held.length >= before + 10 || /out of file descriptors/.test(gw.logs()), { what: 'the calls to reach the upstream', timeoutMs: 3000 })
      .catch(() => {});
    socks.forEach((s) => s.destroy());
  }
  await waitForLog(gw, /out of file descriptors \(Too many open files\): pausing new connections/);
  const lines = gw.logs().split('\n').filter((l) => /out of file descriptors|Too many open files|Error from accept/.test(l));
  assert.equal(lines.length, 1, lines.join('\n'));

  for (const res of held) res.end();
  const fresh = await waitFor(async () => {
    const r = await fetch(`http://127.0.0.1:${adminPort}/healthz`).catch(() => null);
    return r?.status === 200 ? r : null;
  }, { what: 'the gateway to accept again' });
  assert.equal(fresh.status, 200);
});
