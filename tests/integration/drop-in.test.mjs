// Dropping the gateway in front of real servers: what else a server serves (OAuth discovery,
// health), browsers on another origin (CORS, in a real headless Chromium).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { once } from 'node:events';
import { spawn } from 'node:child_process';
import { discoverOAuthProtectedResourceMetadata } from '@modelcontextprotocol/sdk/client/auth.js';
import fs from 'node:fs/promises';
import path from 'node:path';
import {
  createDatabase, idemStatus, mcpClient, readLedger, replayMarker, startEverything, startGateway, startRefundServer, tempDir,
  toolText, waitFor, waitForLog,
} from './lib/harness.mjs';

// An OAuth-protected MCP server as the authorization spec shapes it: /mcp answers 401 with
// WWW-Authenticate pointing at its protected-resource metadata; it also has a health check.
async function protectedServer(t) {
  const seen = [];
  const server = http.createServer((req, res) => {
    seen.push(`${req.method} ${req.url}`);
    const base = `http://${req.headers.host}`;
    if (req.url === '/.well-known/oauth-protected-resource/mcp') {
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ resource: `${base}/mcp`, authorization_servers: ['https://auth.example.com'] }));
    } else if (req.url === '/health') {
      res.writeHead(200, { 'Content-Type': 'text/plain' });
      res.end('healthy');
    } else if (req.url === '/mcp') {
      res.writeHead(401, {
        'WWW-Authenticate': `Bearer resource_metadata="${base}/.well-known/oauth-protected-resource/mcp"`,
        'Content-Type': 'application/json',
      });
      res.end(JSON.stringify({ error: 'invalid_token' }));
    } else {
      res.writeHead(404).end();
    }
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.after(() => { server.closeAllConnections(); server.close(); });
  return { url: `http://127.0.0.1:${server.address().port}/mcp`, seen };
}

test('OAuth discovery and a server\'s other paths work through the gateway', async (t) => {
  const up = await protectedServer(t);
  const gw = await startGateway(t, { upstream: up.url, config: { subject: { static: 'a' } } });

  const unauth = await fetch(gw.url, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{"jsonrpc":"2.0","id":1,"method":"ping"}' });
  assert.equal(unauth.status, 401, 'the upstream\'s 401 reaches the client');
  assert.match(unauth.headers.get('www-authenticate'), /resource_metadata=/);

  // What the SDK client does on a 401: discover the protected-resource metadata.
  const meta = await discoverOAuthProtectedResourceMetadata(gw.url);
  assert.deepEqual(meta.authorization_servers, ['https://auth.example.com']);
  const health = await fetch(`http://127.0.0.1:${gw.port}/health`);
  assert.equal(health.status, 200);
  assert.equal(await health.text(), 'healthy');
  assert.ok(up.seen.includes('GET /.well-known/oauth-protected-resource/mcp'));
  assert.ok(up.seen.includes('GET /health'));
});

test('forward_other_paths: false answers other paths 404 itself', async (t) => {
  const up = await protectedServer(t);
  const gw = await startGateway(t, { upstream: up.url, config: { forward_other_paths: false } });
  const res = await fetch(`http://127.0.0.1:${gw.port}/health`);
  assert.equal(res.status, 404);
  assert.match(await res.text(), /forward_other_paths/);
  assert.ok(!up.seen.includes('GET /health'), 'the upstream never saw it');
});

// The page a browser loads from another origin: initialize, then the same tools/call twice,
// reading the session header, the replay header and the results; posts what it read back.
const PAGE = (gwUrl) => `<!doctype html><script>
const gw = ${JSON.stringify(gwUrl)};
const headers = { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' };
function parse(text) {
  if (text.trimStart().startsWith('{')) return JSON.parse(text);
  const data = text.split('\\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6));
  return data.map((d) => JSON.parse(d)).find((m) => m.id !== undefined);
}
async function post(body, extra = {}) {
  const res = await fetch(gw, { method: 'POST', headers: { ...headers, ...extra }, body: JSON.stringify(body) });
  return { status: res.status, session: res.headers.get('mcp-session-id'), replayed: res.headers.get('idempotent-replayed'), msg: res.status === 202 ? null : parse(await res.text()) };
}
(async () => {
  const out = {};
  try {
    const init = await post({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'page', version: '1' } } });
    out.session = init.session;
    const s = { 'Mcp-Session-Id': init.session, 'Mcp-Protocol-Version': '2025-06-18' };
    await post({ jsonrpc: '2.0', method: 'notifications/initialized' }, s);
    const call = (id) => post({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'echo', arguments: { message: 'from a page' } } }, s);
    const first = await call(2);
    const second = await call(3);
    out.first = { status: first.status, replayed: first.replayed, text: first.msg.result.content[0].text };
    out.second = { status: second.status, replayed: second.replayed, text: second.msg.result.content[0].text, marker: second.msg.result._meta?.['idemgw/replay'] ?? null };
  } catch (e) {
    out.error = String(e);
  }
  await fetch('/result', { method: 'POST', body: JSON.stringify(out) });
})();
</script>`;

test('a page on another origin in headless Chromium calls a tool twice and reads the replay', async (t) => {
  const upstream = await startEverything(t); // Express with cors(): origin *, exposes mcp-session-id
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { subject: { static: 'page' }, tools: { echo: { class: 'non_idempotent' } } },
  });
  let gotResult;
  const result = new Promise((resolve) => { gotResult = resolve; });
  const page = http.createServer((req, res) => {
    if (req.url === '/result') {
      let body = '';
      req.on('data', (c) => { body += c; });
      req.on('end', () => { res.end(); gotResult(JSON.parse(body)); });
      return;
    }
    res.writeHead(200, { 'Content-Type': 'text/html' });
    res.end(PAGE(gw.url));
  });
  page.listen(0, '127.0.0.1');
  await once(page, 'listening');
  t.after(() => { page.closeAllConnections(); page.close(); });
  // localhost and 127.0.0.1 are different origins; the page is on localhost
  const pageUrl = `http://localhost:${page.address().port}/`;

  const profile = await tempDir(t, 'idemgw-chromium-');
  // its own process group, ended whole before the profile folder is removed (the folder's
  // clean-up ran first once and failed on files Chromium was still writing, and the browser
  // left behind kept the test file from ending)
  const browser = spawn('chromium', ['--headless=new', '--no-sandbox', '--disable-gpu', `--user-data-dir=${profile}`, pageUrl], { stdio: 'ignore', detached: true });
  const exited = once(browser, 'exit');
  let out;
  try {
    out = await result;
  } finally {
    try { process.kill(-browser.pid, 'SIGKILL'); } catch { /* already gone */ }
    await exited;
  }
  assert.equal(out.error, undefined, `the page failed: ${out.error}`);
  assert.ok(out.session, 'the page can read Mcp-Session-Id');
  assert.equal(out.first.replayed, null, 'the first call ran');
  assert.match(out.first.text, /from a page/);
  assert.equal(out.second.replayed, 'true', 'the page reads Idempotent-Replayed on the replay');
  assert.equal(out.second.text, out.first.text, 'the replay is the first result');
  assert.ok(out.second.marker, 'the replay marker is in the result');
});

test('only the upstream configured: the embedded store protects calls; the first runs, the repeat is replayed', async (t) => {
  const upstream = await startRefundServer(t);
  // no subject, no database, no policy: what a new user starts with. startGateway sets
  // STATE_DIRECTORY to the gateway's folder, as systemd's StateDirectory= would.
  const gw = await startGateway(t, { upstream: upstream.url });
  assert.match(gw.logs(), /subject not configured/);
  const file = path.join(gw.dir, 'idemgw-keys.db');
  assert.ok(gw.logs().includes(`store: embedded SQLite at ${file} (the default)`), 'says which store and where');
  await fs.access(file);
  await waitFor(async () => (await fetch(`${gw.adminUrl}/readyz`)).status === 200, { what: '/readyz 200 once the store is open' });
  const ready = await fetch(`${gw.adminUrl}/readyz`);
  assert.match(await ready.text(), /"store":"up"/);

  const c = await mcpClient(t, gw.url);
  await c.listTools();
  const args = { order_id: 'o-default', amount_cents: 5 };
  const first = await c.callTool({ name: 'issue_refund', arguments: args });
  assert.notEqual(first.isError, true, toolText(first));
  assert.equal(replayMarker(first), undefined);
  const again = await c.callTool({ name: 'issue_refund', arguments: args });
  assert.ok(replayMarker(again), 'the repeat is replayed');
  assert.equal(toolText(again), toolText(first));
  assert.equal((await readLedger(upstream.ledger)).length, 1, 'executed once');
});

test('database_url: none: reads work, protected calls are refused store_not_configured, /readyz says why', async (t) => {
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, { upstream: upstream.url, config: { database_url: 'none' } });
  assert.match(gw.logs(), /subject not configured/);
  assert.match(gw.logs(), /no database configured \(database_url: none\): calls to non_idempotent tools are refused/);
  const ready = await fetch(`${gw.adminUrl}/readyz`);
  assert.equal(ready.status, 503);
  assert.match(await ready.text(), /"store":"not configured, but the policy needs one"/);

  const c = await mcpClient(t, gw.url);
  await c.listTools();
  const read = await c.callTool({ name: 'get_ledger', arguments: {} });
  assert.notEqual(read.isError, true, 'a read-only tool (by its annotation) runs');
  const r = await c.callTool({ name: 'issue_refund', arguments: { order_id: 'o', amount_cents: 1 } });
  assert.equal(r.isError, true);
  assert.equal(idemStatus(r).code, 'store_not_configured');
  assert.match(toolText(r), /Retrying will be refused the same way/);
  assert.doesNotMatch(toolText(r), /safe to retry/);
  await waitForLog(gw, /"outcome":"refused".*"code":"store_not_configured"/);
});
