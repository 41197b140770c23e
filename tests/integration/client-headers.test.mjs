// What the gateway accepts from an agent's request head: one copy of the headers it acts on,
// header names that are tokens, values without their optional whitespace, and a refused Host
// or Origin explained. Every case checks what the upstream saw.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import { once } from 'node:events';
import {
  createDatabase, idemStatus, rawSession, readLedger, startGateway, startRefundServer, waitForLog,
} from './lib/harness.mjs';

// An upstream that answers every JSON-RPC request with an empty result and keeps each
// request's raw header lines.
async function echoUpstream(t) {
  const seen = [];
  const server = http.createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    seen.push({ rawHeaders: req.rawHeaders, headers: req.headers });
    let id = null;
    try {
      id = JSON.parse(Buffer.concat(chunks).toString('utf8')).id ?? null;
    } catch {
      // not JSON: answered with id null
    }
    res.writeHead(200, { 'Content-Type': 'application/json' });
    res.end(JSON.stringify({ jsonrpc: '2.0', id, result: {} }));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  return { url: `http://127.0.0.1:${server.address().port}/mcp`, seen };
}

// Sends a request head written by hand (lines without CRLF) and a body on a fresh connection;
// resolves with the status and the parsed JSON body once the gateway closes the connection.
function rawRequest(port, lines, body = '') {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1');
    let data = '';
    sock.setEncoding('utf8');
    sock.on('data', (d) => { data += d; });
    sock.on('error', reject);
    sock.on('close', () => {
      const end = data.indexOf('\r\n\r\n');
      if (end < 0) return reject(new Error(`no response head in ${JSON.stringify(data)}`));
      const status = Number(data.slice(0, end).split(' ')[1]);
      const text = data.slice(end + 4);
      let json = null;
      try {
        json = JSON.parse(text);
      } catch {
        // left null
      }
      resolve({ status, text, json });
    });
    const head = [...lines, `Content-Length: ${Buffer.byteLength(body)}`, 'Connection: close'];
    sock.write(`${head.join('\r\n')}\r\n\r\n${body}`);
  });
}

const ping = (id) => JSON.stringify({ jsonrpc: '2.0', id, method: 'ping' });
const JSON_HEADERS = ['Content-Type: application/json', 'Accept: application/json, text/event-stream'];

test('a header name with whitespace before the colon is refused with 400, not forwarded', async (t) => {
  const up = await echoUpstream(t);
  const gw = await startGateway(t, { upstream: up.url, config: { defaults: { class: 'read' } } });
  const res = await rawRequest(gw.port, ['POST /mcp HTTP/1.1', `Host: 127.0.0.1:${gw.port}`, ...JSON_HEADERS, 'X-Foo : bar'], ping(1));
  assert.equal(res.status, 400, res.text);
  assert.equal(res.json?.error?.code, -32600);
  assert.match(res.json.error.message, /header name/);
  assert.equal(up.seen.length, 0, 'nothing was forwarded');

  const ok = await rawRequest(gw.port, ['POST /mcp HTTP/1.1', `Host: 127.0.0.1:${gw.port}`, ...JSON_HEADERS, 'X-Foo: bar'], ping(2));
  assert.equal(ok.status, 200, ok.text);
});

test('a duplicated Host, Origin, Authorization, Idempotency-Key or Mcp-Session-Id is refused with 400', async (t) => {
  const up = await echoUpstream(t);
  const gw = await startGateway(t, { upstream: up.url, config: { defaults: { class: 'read' } } });
  const host = `Host: 127.0.0.1:${gw.port}`;
  const cases = [
    ['Host', [host, host]],
    ['Origin', [host, `Origin: http://127.0.0.1:${gw.port}`, 'Origin: http://evil.example']],
    ['Authorization', [host, 'Authorization: Bearer a', 'Authorization: Bearer b']],
    ['Idempotency-Key', [host, 'Idempotency-Key: k1', 'idempotency-key: k2']],
    ['Mcp-Session-Id', [host, 'Mcp-Session-Id: s1', 'MCP-SESSION-ID: s2']],
  ];
  for (const [name, lines] of cases) {
    const res = await rawRequest(gw.port, ['POST /mcp HTTP/1.1', ...JSON_HEADERS, ...lines], ping(3));
    assert.equal(res.status, 400, `${name}: ${res.text}`);
    assert.equal(res.json?.jsonrpc, '2.0', res.text);
    assert.equal(res.json?.error?.code, -32600);
    assert.ok(res.json.error.message.includes(`the ${name} header appears more than once`), res.json.error.message);
  }
  assert.equal(up.seen.length, 0, 'nothing was forwarded');
  await waitForLog(gw, /"duplicate_header":"Mcp-Session-Id"/);
});

test('a refused Host or Origin is explained: header, value and the setting that allows it', async (t) => {
  const up = await echoUpstream(t);
  const gw = await startGateway(t, { upstream: up.url, config: { defaults: { class: 'read' } } });
  const badHost = await rawRequest(gw.port, ['POST /mcp HTTP/1.1', 'Host: evil.example:80', ...JSON_HEADERS], ping(4));
  assert.equal(badHost.status, 403, badHost.text);
  assert.match(badHost.json.error.message, /Host "evil\.example:80" .*allowed_hosts/);
  await waitForLog(gw, /"status":403,.*"forbidden_header":"Host","value":"evil\.example:80","setting":"allowed_hosts"/);

  const badOrigin = await rawRequest(gw.port, ['POST /mcp HTTP/1.1', `Host: 127.0.0.1:${gw.port}`, 'Origin: http://evil.example', ...JSON_HEADERS], ping(5));
  assert.equal(badOrigin.status, 403, badOrigin.text);
  assert.match(badOrigin.json.error.message, /Origin "http:\/\/evil\.example" .*allowed_origins/);
  await waitForLog(gw, /"forbidden_header":"Origin","value":"http:\/\/evil\.example","setting":"allowed_origins"/);
  assert.equal(up.seen.length, 0);
});

test('header values lose their optional whitespace before they are used or forwarded', async (t) => {
  const up = await echoUpstream(t);
  const gw = await startGateway(t, { upstream: up.url, config: { defaults: { class: 'read' } } });
  const res = await rawRequest(gw.port, ['POST /mcp HTTP/1.1', `Host: 127.0.0.1:${gw.port} \t`, ...JSON_HEADERS, 'X-Trail: value \t '], ping(6));
  assert.equal(res.status, 200, res.text);
  assert.equal(up.seen.length, 1);
  const i = up.seen[0].rawHeaders.findIndex((h) => h.toLowerCase() === 'x-trail');
  assert.ok(i >= 0, 'X-Trail forwarded');
  // node trims what it receives too, so the raw value is what the gateway wrote
  assert.equal(up.seen[0].headers['x-trail'], 'value');
});

async function protectedSetup(t, subject) {
  const upstream = await startRefundServer(t, { jsonResponse: true });
  const databaseUrl = await createDatabase();
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl,
    config: { subject, tools: { get_ledger: { class: 'read' }, issue_refund: { forward_key: true } } },
  });
  return { upstream, gw };
}

test('forward_key: the agent\'s own Idempotency-Key is not forwarded, only its hash', async (t) => {
  const { upstream, gw } = await protectedSetup(t, { static: 'edge' });
  const s = await rawSession(t, gw.url);
  const r = await s.call('issue_refund', { order_id: 'fk-raw', amount_cents: 5 }, { headers: { 'Idempotency-Key': 'RAWKEYSECRET' } });
  assert.match(JSON.stringify(r.message?.result), /Refunded 5 cents/, r.body);
  const [line] = await readLedger(upstream.ledger);
  assert.match(line.header_idempotency_key, /^[0-9a-f]{64}$/, `the upstream saw ${line.header_idempotency_key}`);
  assert.ok(!line.header_idempotency_key.includes('RAWKEYSECRET'));
});

test('a protected call carrying the subject header twice is refused; trailing spaces do not make a new subject', async (t) => {
  const { upstream, gw } = await protectedSetup(t, { header: 'X-Subject' });
  const s = await rawSession(t, gw.url, { headers: { 'X-Subject': 'alice' } });
  const args = { order_id: 'dup-subj', amount_cents: 7 };
  // fetch joins repeated values into one line; two lines need a raw request
  const body = JSON.stringify({ jsonrpc: '2.0', id: 'two', method: 'tools/call', params: { name: 'issue_refund', arguments: args } });
  const two = await rawRequest(gw.port, ['POST /mcp HTTP/1.1', `Host: 127.0.0.1:${gw.port}`, ...JSON_HEADERS,
    `Mcp-Session-Id: ${s.sessionId}`, 'MCP-Protocol-Version: 2025-11-25', 'X-Subject: mallory', 'X-Subject: alice'], body);
  assert.equal(two.status, 200, two.text);
  const st = idemStatus(two.json?.result);
  assert.equal(st?.code, 'no_subject', two.text);
  assert.equal(st.executed, false);
  assert.match(two.json.result.content[0].text, /more than once/);
  assert.equal((await readLedger(upstream.ledger)).length, 0, 'nothing ran');

  const first = await s.call('issue_refund', args);
  assert.match(JSON.stringify(first.message?.result), /Refunded 7 cents/, first.body);
  // fetch trims header values itself: the trailing whitespace goes out raw
  const again = JSON.stringify({ jsonrpc: '2.0', id: 'spaced', method: 'tools/call', params: { name: 'issue_refund', arguments: args } });
  const spaced = await rawRequest(gw.port, ['POST /mcp HTTP/1.1', `Host: 127.0.0.1:${gw.port}`, ...JSON_HEADERS,
    `Mcp-Session-Id: ${s.sessionId}`, 'MCP-Protocol-Version: 2025-11-25', 'X-Subject: alice \t '], again);
  assert.ok(spaced.json?.result?._meta?.['idemgw/replay'], `a replay for the same subject: ${spaced.text}`);
  assert.equal((await readLedger(upstream.ledger)).length, 1, 'one execution');
});
