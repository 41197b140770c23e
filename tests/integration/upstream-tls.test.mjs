// An https upstream: the gateway verifies the upstream's certificate (against upstream_ca_file
// here, the system store by default) and names the address it dialled, and a certificate it
// cannot verify means nothing is sent: the agent gets 502 and the tool never runs.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import path from 'node:path';
import https from 'node:https';
import { readFileSync } from 'node:fs';
import {
  IDEMGW_BIN, createDatabase, makeCertificates, mcpClient, readLedger, replayMarker, run,
  startGateway, startRefundServer, tempDir, toolText, waitForLog,
} from './lib/harness.mjs';

const REFUND = /^Refunded 900 cents on order ord-tls /;

test('an https upstream verified with upstream_ca_file: calls stream through and repeats replay', async (t) => {
  const certs = await makeCertificates(t);
  const upstream = await startRefundServer(t, { tls: certs });
  assert.match(upstream.url, /^https:\/\/127\.0\.0\.1:/);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { upstream_ca_file: certs.ca, subject: { static: 'tenant-tls' } },
  });
  const client = await mcpClient(t, gw.url);
  const progress = [];
  const args = { order_id: 'ord-tls', amount_cents: 900, delay_ms: 300 };
  const first = await client.callTool({ name: 'slow_refund', arguments: args }, undefined, {
    onprogress: (p) => progress.push(p),
  });
  assert.match(toolText(first), REFUND);
  assert.ok(progress.length > 0, 'progress notifications came through the TLS stream');
  const again = await client.callTool({ name: 'slow_refund', arguments: args });
  assert.ok(replayMarker(again), 'the repeat is a replay');
  assert.equal((await readLedger(upstream.ledger)).length, 1, 'executed once');
  const ready = await fetch(`${gw.adminUrl}/readyz`);
  assert.equal(ready.status, 200, 'readyz reaches the https upstream');
});

test('an https upstream: protected calls reuse kept-alive connections; a new one resumes the TLS session an earlier one got', async (t) => {
  const certs = await makeCertificates(t);
  const upstream = await startRefundServer(t, { tls: certs });
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { upstream_ca_file: certs.ca, subject: { static: 'tenant-tls' } },
  });
  // the gateway lists the upstream's tools on its own at start: that handshake is over (and
  // its tickets kept) before the agent's first one, which could otherwise run beside it and be
  // a second full handshake, as no ticket exists yet
  await waitForLog(gw, /tool catalogue: \d+ tools listed by the upstream/);
  const client = await mcpClient(t, gw.url);
  const calls = 6;
  for (let i = 0; i < calls; i++) {
    const r = await client.callTool({ name: 'issue_refund', arguments: { order_id: `ord-resume-${i}`, amount_cents: 100 + i } });
    assert.ok(!replayMarker(r), 'each call is a first execution');
  }
  assert.equal((await readLedger(upstream.ledger)).length, calls);
  // a protected call goes up with an id of the gateway's own, so it rides a kept-alive
  // connection: far fewer handshakes than calls (the agent's GET stream and the gateway's own
  // tools/list hold connections of their own); the handshakes after the first resume a session
  // (a TLS 1.3 ticket once each: this server gives two per full handshake and none on a resumed
  // one, so at most a third are full)
  const metrics = await (await fetch(`${gw.adminUrl}/metrics`)).text();
  const count = (resumed) => Number(metrics.match(
    new RegExp(`^idemgw_upstream_tls_handshakes_total\\{resumed="${resumed}"\\} (\\d+)$`, 'm'))?.[1]);
  const [resumed, full] = [count('true'), count('false')];
  assert.ok(full >= 1 && full + resumed <= calls - 2, `resumed handshakes: ${resumed}, full: ${full} (metrics)`);
  assert.ok(resumed >= 2 * (full - 1) && (full + resumed === 1 || resumed >= 1), `resumed handshakes: ${resumed}, full: ${full} (metrics)`);
  // and the server saw the same: resumptions, not a certificate exchange per call
  const seen = await new Promise((resolve, reject) => {
    https.get(new URL('/tls-handshakes', upstream.url), { ca: readFileSync(certs.ca) }, (res) => {
      let body = '';
      res.on('data', (d) => { body += d; });
      res.on('end', () => resolve(JSON.parse(body)));
    }).on('error', reject);
  });
  assert.ok(seen.resumed >= resumed, `the upstream saw ${JSON.stringify(seen)}`);
});

test('an upstream certificate from an unknown CA: 502, nothing executed, the log says why', async (t) => {
  const certs = await makeCertificates(t);
  const upstream = await startRefundServer(t, { tls: certs });
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { upstream_ca_file: certs.otherCa, subject: { static: 'tenant-tls' } },
    waitStore: false,
  });
  const r = await fetch(gw.url, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
    body: JSON.stringify({
      jsonrpc: '2.0', id: 1, method: 'initialize',
      params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 't', version: '1' } },
    }),
  });
  assert.equal(r.status, 502);
  const body = await r.json();
  assert.equal(body.id, 1);
  assert.ok(body.error, `a JSON-RPC error: ${JSON.stringify(body)}`);
  await waitForLog(gw, /upstream TLS handshake failed: .*certificate/);
  assert.equal((await fetch(`${gw.adminUrl}/readyz`)).status, 503, 'not ready: the upstream cannot be verified');
  assert.equal((await fetch(`${gw.adminUrl}/healthz`)).status, 200, 'the gateway itself is fine');
  assert.equal((await readLedger(upstream.ledger)).length, 0);
});

test('an https upstream that is not https: the handshake fails cleanly with 502', async (t) => {
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url.replace('http:', 'https:'),
    config: { tools: { get_ledger: { class: 'read' } } },
  });
  const s = await fetch(gw.url, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
    body: '{"jsonrpc":"2.0","id":"x","method":"ping"}',
  });
  assert.equal(s.status, 502);
  assert.equal((await s.json()).id, 'x');
  await waitForLog(gw, /upstream TLS handshake failed/);
});

test('upstream_ca_file that cannot be read is a config error with file:line', async (t) => {
  const dir = await tempDir(t);
  const file = path.join(dir, 'bad.yaml');
  await fs.writeFile(file, 'upstream: https://127.0.0.1:1/mcp\nupstream_ca_file: /nonexistent/ca.pem\n');
  const r = await run(IDEMGW_BIN, ['--check-config', '-c', file]);
  assert.notEqual(r.code, 0);
  assert.match(r.stderr, new RegExp(`${file.replace(/[.]/g, '\\.')}:2: upstream_ca_file: cannot read '/nonexistent/ca.pem'`));
  await fs.writeFile(file, 'upstream: https://127.0.0.1:1/mcp\nupstream_ca_file: ' + file + '\n');
  const started = await run(IDEMGW_BIN, ['-c', file], { timeout: 5000 });
  assert.notEqual(started.code, 0, 'a file without certificates stops the start');
  assert.match(started.stderr, /upstream_ca_file .* no usable certificate/);
});
