// A protected call cannot reach the server unprotected by another spelling of the MCP endpoint
// or by a body the gateway cannot read. Three real server frameworks, each routing differently:
//   - the SDK's own server behind node:http with WHATWG URL routing (refund-server.mjs):
//     resolves dot segments, reads '\' as '/', takes the absolute form's path;
//   - Express 5 with express.json() (express-shop.mjs): routes without case, with or without a
//     trailing '/', inflates gzip bodies and skips a byte order mark;
//   - the SDK's stateless transport answering on every path (a server that mounts its handler
//     at the root), where any path with a tools/call body is the endpoint.
// Every spelling is sent three times with the same arguments: at most one execution each, and
// each refusal is a 400/403 that says why. Bodies the gateway cannot parse are refused on the
// endpoint and off it, and nothing runs.
// A lenient Express app (express-shop.mjs with LENIENT=1) runs a call from any method's body,
// from UTF-16 and UTF-32 bodies, from a notification, and from a path whose %2F it decodes:
// each of those routes is refused, with a message that says why, and nothing runs.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import path from 'node:path';
import { once } from 'node:events';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { z } from 'zod';
import { answerOf, callBody, rawRequest, spellings, unclassifiedRoutes, unreadableBodies } from './lib/bypass.mjs';
import {
  NODE, TESTS, createDatabase, rawSession, readLedger, replayMarker, startGateway,
  startProcess, startRefundServer, tempDir, waitForLog,
} from './lib/harness.mjs';

/** Sends each spelling three times with its own arguments; asserts the outcome. */
async function checkSpellings(port, session, tool, argsFor, executions) {
  let n = 0;
  for (const sp of spellings(port)) {
    const args = argsFor(++n);
    const before = await executions();
    const seen = [];
    for (let i = 0; i < 3; i++) {
      const id = `sp-${n}-${i}`;
      const res = await rawRequest(port, { target: sp.target, headers: session, body: Buffer.from(callBody(id, tool, args)) });
      seen.push(res);
      if (sp.expect === 'protected') {
        assert.equal(res.status, 200, `${sp.target} #${i}: ${res.body.slice(0, 300)}`);
        const msg = answerOf(res, id);
        assert.ok(msg?.result, `${sp.target} #${i}: a result (${res.body.slice(0, 300)})`);
        if (i > 0) assert.ok(replayMarker(msg.result), `${sp.target} #${i} is a replay: ${res.body.slice(0, 300)}`);
      } else {
        assert.equal(res.status, sp.expect, `${sp.target} #${i}: ${res.body.slice(0, 300)}`);
        assert.match(res.body, /"error"/, `${sp.target}: a JSON-RPC error says why`);
        if (sp.says) assert.match(JSON.parse(res.body).error.message, sp.says, sp.target);
      }
    }
    const ran = (await executions()) - before;
    assert.equal(ran, sp.expect === 'protected' ? 1 : 0, `${sp.target}: executions`);
  }
}

async function checkBodies(port, session, tool, args, targets, executions) {
  const before = await executions();
  for (const target of targets) {
    for (const b of unreadableBodies(tool, args)) {
      for (let i = 0; i < 3; i++) {
        const res = await rawRequest(port, { target, headers: { ...session, ...(b.headers ?? {}) }, body: b.body });
        assert.equal(res.status, 400, `${b.name} to ${target}: ${res.body.slice(0, 300)}`);
        const msg = JSON.parse(res.body);
        assert.ok(msg.error?.message, `${b.name} to ${target}: says why`);
        if (b.headers?.['Content-Encoding']) assert.match(msg.error.message, /Content-Encoding/);
      }
    }
  }
  assert.equal((await executions()) - before, 0, 'no unreadable body was executed');
}

function sessionHeaders(s) {
  return s.sessionId ? { 'Mcp-Session-Id': s.sessionId } : {};
}

test('the SDK server (WHATWG URL routing): every spelling of /mcp is protected, unreadable bodies refused', async (t) => {
  const up = await startRefundServer(t, { jsonResponse: true });
  const gw = await startGateway(t, { upstream: up.url, databaseUrl: await createDatabase() });
  await waitForLog(gw, /tool catalogue: \d+ tools listed by the upstream/);
  const s = await rawSession(t, gw.url);
  const executions = async () => (await readLedger(up.ledger)).length;
  await checkSpellings(gw.port, sessionHeaders(s), 'issue_refund', (n) => ({ order_id: `sp-${n}`, amount_cents: 100 + n }), executions);
  await checkBodies(gw.port, sessionHeaders(s), 'issue_refund', { order_id: 'body-1', amount_cents: 1 },
    ['/mcp', '/./mcp', '/x/../mcp', '/other', '/messages?sessionId=abc'], executions);
});

test('Express 5 (case-insensitive routes, gzip and BOM bodies read): every spelling is protected, unreadable bodies refused', async (t) => {
  const ledger = path.join(await tempDir(t, 'idemgw-express-'), 'ledger.jsonl');
  const shop = await startProcess(t, NODE, [path.join(TESTS, 'fixtures/express-shop.mjs'), '0'], {
    env: { LEDGER: ledger, JSON_RESPONSE: '1' },
    readyLine: /listening on port (\d+)/,
    name: 'express-shop',
  });
  const gw = await startGateway(t, { upstream: `http://127.0.0.1:${shop.match[1]}/mcp`, databaseUrl: await createDatabase() });
  await waitForLog(gw, /tool catalogue: 2 tools listed by the upstream/);
  const s = await rawSession(t, gw.url);
  const executions = async () => (await readLedger(ledger)).length;
  await checkSpellings(gw.port, sessionHeaders(s), 'place_order', (n) => ({ item: `lamp ${n}`, quantity: n }), executions);
  await checkBodies(gw.port, sessionHeaders(s), 'place_order', { item: 'chair', quantity: 1 },
    ['/mcp', '/MCP', '/mcp/', '/other'], executions);
});

test('a server that answers MCP on every path: a protected call off the endpoint is refused, a read relayed', async (t) => {
  let charges = 0;
  const server = http.createServer(async (req, res) => {
    const mcp = new McpServer({ name: 'any-path', version: '1.0.0' });
    mcp.registerTool('charge', {
      description: 'Charges a card (every call charges again)',
      inputSchema: { n: z.number().int() },
      annotations: { readOnlyHint: false, idempotentHint: false },
    }, async ({ n }) => {
      charges++;
      return { content: [{ type: 'text', text: `charged ${n}` }] };
    });
    mcp.registerTool('balance', { description: 'Reads the balance', inputSchema: {}, annotations: { readOnlyHint: true } },
      async () => ({ content: [{ type: 'text', text: `${charges} charges` }] }));
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
    res.on('close', () => transport.close());
    await mcp.connect(transport);
    await transport.handleRequest(req, res);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  const upPort = server.address().port;
  const gw = await startGateway(t, { upstream: `http://127.0.0.1:${upPort}/mcp`, databaseUrl: await createDatabase() });
  await waitForLog(gw, /tool catalogue: 2 tools listed by the upstream/);
  const executions = async () => charges;

  // Directly, the server runs a call posted to any path: the hole the gateway must close.
  const direct = await rawRequest(upPort, { target: '/anything', body: Buffer.from(callBody('d', 'charge', { n: 0 })) });
  assert.equal(direct.status, 200, direct.body);
  assert.equal(charges, 1, 'the server executes a tools/call on any path');

  for (const target of ['/anything', '/messages?sessionId=s1', '/mcp/extra', '/.well-known/x']) {
    for (const body of [
      callBody('c', 'charge', { n: 1 }),
      JSON.stringify([{ jsonrpc: '2.0', id: 'c', method: 'tools/call', params: { name: 'charge', arguments: { n: 1 } } }]),
      // a notification: some servers run it all the same
      JSON.stringify({ jsonrpc: '2.0', method: 'tools/call', params: { name: 'charge', arguments: { n: 1 } } }),
      // a name that is not a string cannot be classified
      JSON.stringify({ jsonrpc: '2.0', id: 'c', method: 'tools/call', params: { name: ['charge'], arguments: { n: 1 } } }),
    ]) {
      for (const ct of ['application/json', 'text/plain']) {
        const res = await rawRequest(gw.port, { target, headers: { 'Content-Type': ct }, body: Buffer.from(body) });
        assert.equal(res.status, 400, `${target} ${ct} ${body}: ${res.body}`);
        assert.match(JSON.parse(res.body).error.message, /only accepted as a POST to the MCP endpoint \/mcp/);
      }
    }
  }
  await checkBodies(gw.port, {}, 'charge', { n: 2 }, ['/anything', '/mcp'], executions);
  assert.equal(charges, 1, 'nothing off the endpoint ran');

  // A read off the endpoint is still relayed, and a body that is not JSON at all passes.
  const read = await rawRequest(gw.port, { target: '/anything', body: Buffer.from(callBody('r', 'balance', {})) });
  assert.equal(read.status, 200, read.body);
  assert.match(read.body, /1 charges/);
  const form = await rawRequest(gw.port, { target: '/form', headers: { 'Content-Type': 'application/x-www-form-urlencoded' }, body: Buffer.from('a=1&b=2') });
  assert.notEqual(form.status, 400, `a form body is relayed: ${form.body}`);

  // The endpoint in another spelling is the endpoint: protected, run once.
  for (let i = 0; i < 3; i++) {
    const id = `e-${i}`;
    const res = await rawRequest(gw.port, { target: '/./MCP/', body: Buffer.from(callBody(id, 'charge', { n: 7 })) });
    assert.equal(res.status, 200, res.body);
    if (i > 0) assert.ok(replayMarker(answerOf(res, id)?.result), res.body);
  }
  assert.equal(charges, 2, 'the endpoint spelled /./MCP/ ran once');
});

/** express-shop.mjs with LENIENT=1: {port, executions()}. */
async function startLenientShop(t) {
  const ledger = path.join(await tempDir(t, 'idemgw-lenient-'), 'ledger.jsonl');
  const shop = await startProcess(t, NODE, [path.join(TESTS, 'fixtures/express-shop.mjs'), '0'], {
    env: { LEDGER: ledger, JSON_RESPONSE: '1', LENIENT: '1' },
    readyLine: /listening on port (\d+)/,
    name: 'express-shop',
  });
  return { port: Number(shop.match[1]), executions: async () => (await readLedger(ledger)).length };
}

const send = (port, r, headers = {}) =>
  rawRequest(port, { method: r.method, target: r.target, headers: { ...headers, ...(r.headers ?? {}) }, body: r.body, chunked: r.chunked });

test('a lenient Express app: a body on GET/HEAD/DELETE, UTF-16/32 off the endpoint, a tools/call notification are refused, nothing runs', async (t) => {
  const shop = await startLenientShop(t);
  const routes = unclassifiedRoutes('place_order', { item: 'lamp', quantity: 1 });

  // Directly, the app runs the call by every one of these routes: the holes the gateway closes.
  for (const r of routes) {
    const res = await send(shop.port, r);
    assert.equal(res.status, 200, `${r.name}, directly: ${res.body.slice(0, 200)}`);
  }
  assert.equal(await shop.executions(), routes.length, 'the lenient app runs a call by each route');

  const gw = await startGateway(t, { upstream: `http://127.0.0.1:${shop.port}/mcp`, databaseUrl: await createDatabase() });
  await waitForLog(gw, /tool catalogue: 2 tools listed by the upstream/);
  const s = await rawSession(t, gw.url);
  const before = await shop.executions();
  for (const r of routes) {
    for (let i = 0; i < 3; i++) {
      const res = await send(gw.port, r, sessionHeaders(s));
      assert.equal(res.status, r.status, `${r.name} #${i}: ${res.body.slice(0, 300)}`);
      if (r.method !== 'HEAD') {
        const msg = JSON.parse(res.body);
        assert.equal(msg.error?.code, -32600, `${r.name}: ${res.body}`);
        assert.match(msg.error.message, r.says, r.name);
        assert.match(msg.error.message, /nothing was (forwarded|executed)/, r.name);
      }
    }
    assert.equal((await shop.executions()) - before, 0, `${r.name}: nothing ran`);
  }

  // What a client sends still goes through: a protected call runs once and is replayed, a GET
  // stream and a DELETE without a body reach the app, an upload relays as bytes.
  for (let i = 0; i < 2; i++) {
    const id = `ok-${i}`;
    const res = await rawRequest(gw.port, { target: '/mcp', headers: sessionHeaders(s), body: Buffer.from(callBody(id, 'place_order', { item: 'desk', quantity: 2 })) });
    assert.equal(res.status, 200, res.body);
    if (i > 0) assert.ok(replayMarker(answerOf(res, id)?.result), res.body);
  }
  assert.equal((await shop.executions()) - before, 1, 'the protected call ran once');
  const upload = await rawRequest(gw.port, { target: '/upload', headers: { 'Content-Type': 'image/png' }, body: Buffer.from([0x89, 0x50, 0x4e, 0x47, 0, 0, 0xff, 0xfe]) });
  assert.equal(upload.status, 404, `an upload is relayed (the app has no /upload): ${upload.body}`);
  const del = await rawRequest(gw.port, { method: 'DELETE', target: '/mcp', headers: sessionHeaders(s) });
  assert.ok(del.status === 200 || del.status === 204, `DELETE without a body: ${del.status} ${del.body}`);
});

test('servers: an escaped / in the path cannot carry a call from one server\'s folder to another\'s endpoint', async (t) => {
  const shop = await startLenientShop(t);
  const up = `http://127.0.0.1:${shop.port}`;
  const call = (id) => Buffer.from(callBody(id, 'place_order', { item: 'sofa', quantity: 1 }));

  // Directly, the app decodes %2F and routes /ab/..%2Fa/mcp to /a/mcp, server a's endpoint.
  const direct = await rawRequest(shop.port, { target: '/ab/..%2Fa/mcp', body: call('d') });
  assert.equal(direct.status, 200, direct.body);
  assert.equal(await shop.executions(), 1);

  // ab's policy lets place_order through unprotected; a's protects it.
  const gw = await startGateway(t, {
    databaseUrl: await createDatabase(),
    config: {
      servers: {
        a: { path: '/a/mcp', upstream: `${up}/a/mcp` },
        ab: { path: '/ab/mcp', upstream: `${up}/ab/mcp`, tools: { place_order: { class: 'idempotent' } } },
      },
    },
  });
  for (const target of ['/ab/..%2Fa/mcp', '/ab/..%2fa/mcp', '/ab/..%5Ca/mcp', '/ab/x%2F..%2F..%2Fa/mcp']) {
    for (let i = 0; i < 3; i++) {
      const res = await rawRequest(gw.port, { target, body: call(`e-${i}`) });
      assert.equal(res.status, 400, `${target} #${i}: ${res.body}`);
      assert.match(JSON.parse(res.body).error.message, /escaped '\/' or '\\' \(%2F or %5C\)/, target);
    }
  }
  assert.equal(await shop.executions(), 1, 'nothing ran through the gateway');
});
