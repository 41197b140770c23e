// Backpressure: an agent that stops reading a long response must not make the gateway buffer
// it. The gateway stops reading the upstream once a bounded amount waits for the agent, so
// the upstream's own writes stall, the gateway's memory stays flat, and when the agent reads
// again every byte arrives, in order.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import http from 'node:http';
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { startGateway, waitFor } from './lib/harness.mjs';

const TOTAL = 64 * 1024 * 1024; // far more than every socket buffer on the path together
const EVENT = 64 * 1024;

/** An upstream answering any POST with TOTAL bytes of SSE events, honouring its socket's
 * backpressure; written counts what its socket has accepted so far. */
async function bigStreamUpstream(t) {
  const state = { written: 0, done: false, digest: null };
  const server = http.createServer(async (req, res) => {
    for await (const _ of req); // the request body
    res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
    const hash = createHash('sha256');
    for (let i = 0; state.written < TOTAL; i++) {
      const head = `id: ${i}\ndata: `;
      const fill = String.fromCharCode(97 + (i % 26)).repeat(EVENT - head.length - 2);
      const chunk = Buffer.from(`${head}${fill}\n\n`);
      hash.update(chunk);
      state.written += chunk.length;
      if (!res.write(chunk)) await once(res, 'drain');
    }
    state.digest = hash.digest('hex');
    state.done = true;
    res.end();
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  return { state, url: `http://127.0.0.1:${server.address().port}/mcp` };
}

async function rssKiB(pid) {
  const status = await fs.readFile(`/proc/${pid}/status`, 'utf8');
  return Number(/^VmRSS:\s+(\d+)/m.exec(status)[1]);
}

test('an agent that stops reading stalls the upstream, not the gateway\'s memory; resuming delivers every byte', async (t) => {
  const upstream = await bigStreamUpstream(t);
  // Under AddressSanitizer freed memory waits in a quarantine, which would make RSS follow
  // what passed through rather than what is held; without one it measures what is held.
  const gw = await startGateway(t, {
    upstream: upstream.url,
    config: { defaults: { class: 'read' } },
    env: { ASAN_OPTIONS: [process.env.ASAN_OPTIONS, 'quarantine_size_mb=0'].filter(Boolean).join(':') },
  });
  const baseline = await rssKiB(gw.proc.pid);

  const body = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'dump', arguments: {} } });
  const req = http.request(gw.url, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
  });
  req.end(body);
  const [res] = await once(req, 'response');
  assert.equal(res.status ?? res.statusCode, 200);
  res.pause(); // the agent stops reading

  // Wait for the upstream's writes to stall: no progress over five checks in a row.
  let last = -1;
  let still = 0;
  await waitFor(() => {
    still = upstream.state.written === last ? still + 1 : 0;
    last = upstream.state.written;
    return still >= 5;
  }, { timeoutMs: 20000, intervalMs: 100, what: 'the upstream to stall' });
  assert.equal(upstream.state.done, false, 'the upstream could not write everything into a paused agent');
  const grown = (await rssKiB(gw.proc.pid)) - baseline;
  t.diagnostic(`while stalled: ${last} bytes written upstream, gateway RSS +${grown} KiB`);
  assert.ok(grown < 16 * 1024, `the gateway did not buffer the stream: RSS grew ${grown} KiB while ${last} bytes were written upstream`);

  const hash = createHash('sha256');
  let received = 0;
  res.on('data', (chunk) => {
    hash.update(chunk);
    received += chunk.length;
  });
  res.resume();
  await once(res, 'end');
  assert.equal(received, TOTAL, 'every byte arrived');
  assert.equal(hash.digest('hex'), upstream.state.digest, 'in order, unchanged');
});
