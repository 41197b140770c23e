// Clients and servers this repository did not write, in front of and behind the gateway:
// a fastmcp server (its annotations classify its tools) and mcp-remote signing in to an
// OAuth-protected server through the gateway (discovery, registration, authorization, token),
// then calling a protected tool twice over its stdio; the MCP Inspector's CLI calling a
// protected tool twice; an Express server with the compression and cors middleware behind
// the gateway.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import path from 'node:path';
import { once } from 'node:events';
import { spawn } from 'node:child_process';
import readline from 'node:readline';
import {
  NODE, TESTS, createDatabase, freePort, idemStatus, mcpClient, rawSession, readLedger, replayMarker, run,
  startGateway, startProcess, startRefundServer, tempDir, toolText, waitForLog,
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

// The Inspector's CLI mode: a new session for every command, no Authorization (the default
// subject is the shared "anonymous"), arguments typed from key=value pairs.
test('the MCP Inspector CLI calls a protected tool twice: it runs once, the second is replayed', async (t) => {
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, { upstream: upstream.url, databaseUrl: await createDatabase() });
  await waitForLog(gw, /tool catalogue: \d+ tools listed by the upstream/);
  const cli = path.join(TESTS, 'node_modules/@modelcontextprotocol/inspector/cli/build/index.js');
  const inspect = async (...args) => {
    const r = await run(NODE, [cli, gw.url, '--transport', 'http', ...args], { timeout: 60000 });
    assert.equal(r.code, 0, `inspector: ${r.stdout}\n${r.stderr}`);
    return JSON.parse(r.stdout);
  };
  const listed = await inspect('--method', 'tools/list');
  assert.ok(listed.tools.some((tool) => tool.name === 'issue_refund'));
  const call = ['--method', 'tools/call', '--tool-name', 'issue_refund', '--tool-arg', 'order_id=ord-inspector', 'amount_cents=700'];
  const first = await inspect(...call);
  assert.match(toolText(first), /^Refunded 700 cents on order ord-inspector/);
  assert.equal(replayMarker(first), undefined, 'the first call ran');
  const second = await inspect(...call);
  assert.ok(replayMarker(second), `the repeat from a new session is replayed: ${JSON.stringify(second)}`);
  assert.equal(toolText(second), toolText(first));
  assert.equal((await readLedger(upstream.ledger)).length, 1, 'one refund');
  assert.match(gw.logs(), /"duplicate_source":"reconnect"/);
});

// Express with compression({threshold: 0}) and cors({origin: true}): the server compresses
// every answer (a protected call asks for identity; a read's JSON answer is decoded to check
// its id), and the CORS headers come from the cors package.
for (const jsonResponse of [false, true]) {
  test(`Express with compression and cors (${jsonResponse ? 'JSON' : 'SSE'} answers): replayed through the middleware, CORS from the cors package`, async (t) => {
    const ledger = path.join(await tempDir(t, 'idemgw-express-'), 'ledger.jsonl');
    const shop = await startProcess(t, NODE, [path.join(TESTS, 'fixtures/express-shop.mjs'), '0'], {
      env: { LEDGER: ledger, JSON_RESPONSE: jsonResponse ? '1' : '' },
      readyLine: /listening on port (\d+)/,
      name: 'express-shop',
    });
    const gw = await startGateway(t, { upstream: `http://127.0.0.1:${shop.match[1]}/mcp`, databaseUrl: await createDatabase() });
    await waitForLog(gw, /tool catalogue: 2 tools listed by the upstream/);

    const origin = 'http://localhost:5173';
    const s = await rawSession(t, gw.url, { headers: { Origin: origin, 'Accept-Encoding': 'gzip, br' } });
    const read = await s.call('list_orders', {});
    assert.equal(read.status, 200, read.body);
    // The SDK marks its SSE streams Cache-Control: no-transform, which compression() honours.
    // A read's answer is read for its id (the gateway's, so a stray answer on a kept-alive
    // connection is never taken for it): it comes decoded, whole.
    if (jsonResponse) assert.equal(read.headers.get('content-encoding'), null, 'a read is relayed decoded');
    assert.equal(toolText(read.message.result), '0 orders');
    const args = { item: 'desk lamp', quantity: 2 };
    const first = await s.call('place_order', args);
    assert.equal(first.status, 200, first.body);
    assert.match(toolText(first.message.result), /^Order o-1: 2 x desk lamp\nThank you/);
    assert.equal(replayMarker(first.message.result), undefined);
    assert.equal(first.headers.get('access-control-allow-origin'), origin);

    const second = await s.call('place_order', args);
    assert.equal(second.status, 200, second.body);
    assert.ok(replayMarker(second.message.result), `replayed: ${second.body.slice(0, 300)}`);
    assert.equal(toolText(second.message.result), toolText(first.message.result), 'the replay is the first result');
    assert.equal(second.headers.get('idempotent-replayed'), 'true');
    assert.equal(second.headers.get('access-control-allow-origin'), origin, 'the replay carries the upstream\'s CORS');
    assert.match(second.headers.get('access-control-expose-headers') ?? '', /idempotent-replayed/i);
    assert.match(second.headers.get('access-control-expose-headers') ?? '', /mcp-session-id/i);

    // A browser's preflight for a call with an Idempotency-Key: answered by cors() through the gateway.
    const pre = await fetch(gw.url, {
      method: 'OPTIONS',
      headers: { Origin: origin, 'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'content-type,mcp-session-id,idempotency-key' },
    });
    await pre.arrayBuffer();
    assert.ok(pre.status === 204 || pre.status === 200, `preflight: ${pre.status}`);
    assert.equal(pre.headers.get('access-control-allow-origin'), origin);
    assert.match(pre.headers.get('access-control-allow-headers') ?? '', /idempotency-key/i);

    // The SDK client in another session: the same order is replayed, a read runs.
    const client = await mcpClient(t, gw.url);
    const third = await client.callTool({ name: 'place_order', arguments: args });
    assert.ok(replayMarker(third));
    assert.equal(toolText(await client.callTool({ name: 'list_orders', arguments: {} })), '1 orders');
    const other = await client.callTool({ name: 'place_order', arguments: { item: 'desk lamp', quantity: 3 } });
    assert.match(toolText(other), /^Order o-2: 3 x desk lamp/);
    assert.equal((await readLedger(ledger)).length, 2, 'two orders placed, none twice');
    assert.equal(idemStatus(other), undefined);
  });
}
