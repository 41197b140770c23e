// Clients and servers this repository did not write, in front of and behind the gateway:
// a fastmcp server (its annotations classify its tools) and mcp-remote signing in to an
// OAuth-protected server through the gateway (discovery, registration, authorization, token),
// then calling a protected tool twice over its stdio.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import path from 'node:path';
import { once } from 'node:events';
import { spawn } from 'node:child_process';
import readline from 'node:readline';
import {
  NODE, TESTS, createDatabase, freePort, mcpClient, readLedger, replayMarker, startGateway, startProcess,
  startRefundServer, tempDir, toolText, waitForLog,
} from './lib/harness.mjs';

test('fastmcp: an unlisted read-only tool reads fresh, an unlisted write is protected', async (t) => {
  const h = await startProcess(t, NODE, [path.join(TESTS, 'fixtures/tickets-fastmcp.mjs'), '0'], {
    readyLine: /listening on port (\d+)/,
    name: 'fastmcp-tickets',
  });
  const gw = await startGateway(t, { upstream: `http://127.0.0.1:${h.match[1]}/mcp`, databaseUrl: await createDatabase() });
  await waitForLog(gw, /tool catalogue: 2 tools listed by the upstream/);
  const client = await mcpClient(t, gw.url);
  assert.equal(toolText(await client.callTool({ name: 'list_tickets', arguments: {} })), '0 tickets');
  const created = await client.callTool({ name: 'create_ticket', arguments: { title: 'printer on fire' } });
  assert.match(toolText(created), /Created ticket #1/);
  const listed = await client.callTool({ name: 'list_tickets', arguments: {} });
  assert.equal(replayMarker(listed), undefined);
  assert.equal(toolText(listed), '1 tickets: printer on fire', 'not the stale "0 tickets"');
  const again = await client.callTool({ name: 'create_ticket', arguments: { title: 'printer on fire' } });
  assert.ok(replayMarker(again), 'the repeated create is replayed');
  assert.equal(toolText(await client.callTool({ name: 'list_tickets', arguments: {} })), '1 tickets: printer on fire');
});

// A minimal OAuth 2.1 authorization server: metadata, dynamic registration, an authorization
// endpoint that approves at once (redirecting with a code), a token endpoint.
async function authorizationServer(t, token) {
  const server = http.createServer(async (req, res) => {
    const base = `http://127.0.0.1:${server.address().port}`;
    const url = new URL(req.url, base);
    const json = (code, body) => { res.writeHead(code, { 'Content-Type': 'application/json' }); res.end(JSON.stringify(body)); };
    let body = '';
    for await (const c of req) body += c;
    if (url.pathname === '/.well-known/oauth-authorization-server') {
      return json(200, {
        issuer: base, authorization_endpoint: `${base}/authorize`, token_endpoint: `${base}/token`,
        registration_endpoint: `${base}/register`, response_types_supported: ['code'],
        grant_types_supported: ['authorization_code', 'refresh_token'], code_challenge_methods_supported: ['S256'],
        token_endpoint_auth_methods_supported: ['none', 'client_secret_post'],
      });
    }
    if (url.pathname === '/register') return json(201, { ...JSON.parse(body), client_id: 'mcp-remote-client' });
    if (url.pathname === '/authorize') {
      const to = new URL(url.searchParams.get('redirect_uri'));
      to.searchParams.set('code', 'code-1');
      to.searchParams.set('state', url.searchParams.get('state'));
      res.writeHead(302, { Location: to.href }).end();
      return;
    }
    if (url.pathname === '/token') return json(200, { access_token: token, token_type: 'Bearer', expires_in: 3600 });
    res.writeHead(404).end();
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.after(() => { server.closeAllConnections(); server.close(); });
  return `http://127.0.0.1:${server.address().port}`;
}

test('mcp-remote signs in to an OAuth-protected server through the gateway and is protected', async (t) => {
  const token = 'access-token-1';
  const as = await authorizationServer(t, token);
  const gwPort = await freePort();
  const resource = `http://127.0.0.1:${gwPort}/mcp`;
  const upstream = await startRefundServer(t, { requireBearer: token, oauth: { resource, authorizationServer: as } });
  const gw = await startGateway(t, { upstream: upstream.url, databaseUrl: await createDatabase(), port: gwPort });

  const config = await tempDir(t, 'idemgw-mcp-remote-');
  const callbackPort = await freePort();
  const remote = spawn(NODE, [path.join(TESTS, 'node_modules/mcp-remote/dist/proxy.js'), gw.url, String(callbackPort)], {
    env: { ...process.env, MCP_REMOTE_CONFIG_DIR: config, BROWSER: 'true' },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  t.after(() => remote.kill('SIGKILL'));
  let err = '';
  const authUrl = new Promise((resolve, reject) => {
    remote.stderr.on('data', (d) => {
      err += d;
      const m = /Please authorize this client by visiting:\s*(\S+)/.exec(err);
      if (m) resolve(m[1]);
    });
    remote.on('exit', (code) => reject(new Error(`mcp-remote exited ${code}: ${err}`)));
  });
  // The sign-in needed the server's metadata through the gateway: discovery worked.
  const url = new URL(await authUrl);
  assert.equal(url.searchParams.get('resource'), resource, 'the resource is the gateway\'s URL');
  // Play the browser: approve, follow the redirect to mcp-remote's callback.
  const approved = await fetch(url, { redirect: 'manual' });
  assert.equal(approved.status, 302);
  await (await fetch(approved.headers.get('location'))).text();

  // Now speak MCP over mcp-remote's stdio.
  const lines = readline.createInterface({ input: remote.stdout });
  const waiting = new Map();
  lines.on('line', (l) => {
    const msg = JSON.parse(l);
    waiting.get(msg.id)?.(msg);
  });
  const rpc = (id, method, params) => new Promise((resolve) => {
    waiting.set(id, resolve);
    remote.stdin.write(JSON.stringify({ jsonrpc: '2.0', id, method, params }) + '\n');
  });
  const init = await rpc(1, 'initialize', { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'stdio-agent', version: '1' } });
  assert.ok(init.result?.serverInfo, JSON.stringify(init));
  remote.stdin.write(JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }) + '\n');
  const args = { order_id: 'ord-oauth', amount_cents: 42 };
  const first = await rpc(2, 'tools/call', { name: 'issue_refund', arguments: args });
  assert.match(toolText(first.result), /^Refunded 42 cents/);
  const second = await rpc(3, 'tools/call', { name: 'issue_refund', arguments: args });
  assert.ok(replayMarker(second.result), JSON.stringify(second));
  assert.equal((await readLedger(upstream.ledger)).length, 1);
  assert.match(gw.logs(), /"path":"\/.well-known\/oauth-protected-resource\/mcp".*"status":200/);
});
