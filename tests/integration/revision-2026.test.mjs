// The 2026-07-28 revision end to end, with real peers on both sides: the v2 fixture
// (tests/fixtures/v2-server.mjs: @modelcontextprotocol/server 2.4.0 behind createMcpHandler)
// upstream, and @modelcontextprotocol/client 2.4.0 clients negotiating on their own (auto) or
// pinned to 2026-07-28, next to the SDK 1.32.2 client for the 2025 era. Every answer the
// gateway writes itself is produced for real and must be accepted by the v2 client (which
// refuses a result without resultType); stored results cross eras both ways; the mirrored
// headers are relayed and checked; multi-round-trip input_required runs once.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import path from 'node:path';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import {
  createDatabase, freePort, idemStatus, mcpClient, readLedger, replayMarker, startGateway, startV2Server,
  tempDir, toolText, waitForLedger,
} from './lib/harness.mjs';
import { AUDIENCE, ISSUER, makeKey } from './lib/tokens.mjs';

const MODES = [
  { name: 'auto', versionNegotiation: { mode: 'auto' } },
  { name: 'pinned', versionNegotiation: { mode: { pin: '2026-07-28' } } },
];
const ACCEPT = 'application/json, text/event-stream';
const META_VERSION = 'io.modelcontextprotocol/protocolVersion';

/** A v2 client (2.4.0) connected to url; closed when the test ends. */
async function v2Client(t, url, mode, { headers = {}, onElicit } = {}) {
  const client = new Client({ name: `idemgw-v2-${mode.name}`, version: '1.0.0' }, {
    versionNegotiation: mode.versionNegotiation,
    capabilities: onElicit ? { elicitation: { form: {} } } : {},
  });
  if (onElicit) client.setRequestHandler('elicitation/create', onElicit);
  await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } }));
  t.after(() => client.close().catch(() => {}));
  return client;
}

/** One raw 2026-07-28 request: the headers client 2.4.0 sends, the version in _meta. */
async function raw2026(url, method, params, { id = `r-${Math.random()}`, headers = {}, version = '2026-07-28' } = {}) {
  // a 2025 version: the same request as a 2025 client sends it, without the mirrored headers
  const modern = version >= '2026-07-28';
  const name = params?.name ?? params?.uri;
  const mirrored = modern ? { 'Mcp-Method': method, ...(name !== undefined ? { 'Mcp-Name': name } : {}) } : {};
  const meta = modern ? { _meta: { [META_VERSION]: version, 'io.modelcontextprotocol/clientInfo': { name: 'raw', version: '1' }, 'io.modelcontextprotocol/clientCapabilities': { elicitation: { form: {} } } } } : {};
  const res = await fetch(url, {
    method: 'POST',
    headers: { Accept: ACCEPT, 'Content-Type': 'application/json', 'MCP-Protocol-Version': version, ...mirrored, ...headers },
    body: JSON.stringify({ jsonrpc: '2.0', id, method, params: { ...params, ...meta } }),
  });
  const text = await res.text();
  let message = null;
  if ((res.headers.get('content-type') ?? '').startsWith('text/event-stream')) {
    for (const m of text.matchAll(/^data: ?(.*)$/gm)) {
      const msg = JSON.parse(m[1]);
      if (msg.id === id) message = msg;
    }
  } else if (text) {
    message = JSON.parse(text);
  }
  return { status: res.status, text, message };
}

const ledgerOf = async (file, order) => (await readLedger(file)).filter((l) => l.order_id === order);

async function setup(t, config = {}, { databaseUrl } = {}) {
  const upstream = await startV2Server(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: databaseUrl === undefined ? await createDatabase() : databaseUrl,
    config: {
      subject: { static: 'era' },
      tools: { get_ledger: { class: 'read' } },
      ...config,
    },
    waitStore: databaseUrl === undefined,
  });
  return { upstream, gw };
}

test('v2 clients negotiate 2026-07-28 through the gateway; server/discover and the mirrored headers are relayed', async (t) => {
  const { upstream, gw } = await setup(t);
  const discover = await raw2026(gw.url, 'server/discover', {});
  assert.equal(discover.status, 200, discover.text);
  assert.ok(discover.message.result.supportedVersions.includes('2026-07-28'), discover.text);
  for (const mode of MODES) {
    const c = await v2Client(t, gw.url, mode);
    assert.equal(c.getNegotiatedProtocolVersion(), '2026-07-28', `${mode.name} negotiates the new revision`);
    const r = await c.callTool({ name: 'issue_refund', arguments: { order_id: `hdr-${mode.name}`, amount_cents: 3 } });
    assert.match(toolText(r), /^Refunded 3 cents/);
    const [line] = await ledgerOf(upstream.ledger, `hdr-${mode.name}`);
    assert.equal(line.mcp_method, 'tools/call');
    assert.equal(line.mcp_name, 'issue_refund');
    assert.equal(line.protocol_version, '2026-07-28');
  }
});

test('every answer the gateway writes for a protected call is accepted by v2 clients', async (t) => {
  // the upstream timeout is short for the lost call below, yet well above a loaded machine's
  // cold start of the fixture (its first answer once took over a second under CI load)
  const { upstream, gw } = await setup(t, {
    timeouts: { upstream: '3s' },
    tools: { get_ledger: { class: 'read' }, slow_refund: { in_progress: 'reject' } },
  });
  for (const mode of MODES) {
    const m = mode.name;
    const a = await v2Client(t, gw.url, mode);
    const b = await v2Client(t, gw.url, mode);

    // two identical slow calls at once from two clients: one execution, neither throws
    const slow = { order_id: `slow-${m}`, amount_cents: 5, delay_ms: 600 };
    const before = (await readLedger(upstream.ledger)).length;
    const first = a.callTool({ name: 'slow_refund', arguments: slow });
    await waitForLedger(upstream.ledger, before + 1);
    const second = await b.callTool({ name: 'slow_refund', arguments: slow });
    assert.equal(idemStatus(second)?.code, 'in_progress', JSON.stringify(second));
    assert.equal(second.isError, true);
    assert.match(toolText(await first), /^Refunded 5 cents/);
    const replay = await b.callTool({ name: 'slow_refund', arguments: slow });
    assert.ok(replayMarker(replay), `${m}: the repeat is a replay`);
    assert.equal((await ledgerOf(upstream.ledger, slow.order_id)).length, 1, `${m}: executed once`);

    // the same explicit key with other arguments
    const keyed = { order_id: `key-${m}`, amount_cents: 1, idempotency_key: `k-${m}` };
    assert.match(toolText(await a.callTool({ name: 'issue_refund', arguments: keyed })), /^Refunded/);
    const reused = await a.callTool({ name: 'issue_refund', arguments: { ...keyed, amount_cents: 2 } });
    assert.equal(idemStatus(reused)?.code, 'key_reused', JSON.stringify(reused));

    // arguments nested too deep to be put in canonical form
    let deep = 'x';
    for (let i = 0; i < 200; i++) deep = { d: deep };
    const bad = await a.callTool({ name: 'issue_refund', arguments: { order_id: `deep-${m}`, amount_cents: 1, note: deep } });
    assert.equal(idemStatus(bad)?.code, 'bad_arguments', JSON.stringify(bad));

    // the upstream times out after taking the call: the retry is told the outcome is unknown
    const lost = { order_id: `lost-${m}`, amount_cents: 9, delay_ms: 9000 };
    await assert.rejects(a.callTool({ name: 'slow_refund', arguments: lost }), (e) => !/resultType/.test(e.message));
    const unknown = await b.callTool({ name: 'slow_refund', arguments: lost });
    assert.equal(idemStatus(unknown)?.code, 'outcome_unknown', JSON.stringify(unknown));
    assert.equal((await ledgerOf(upstream.ledger, lost.order_id)).length, 1, `${m}: not executed again`);
  }

  // the same answers on the wire: resultType for 2026-07-28 only
  const keyed = { order_id: 'key-raw', amount_cents: 1, idempotency_key: 'k-raw' };
  await raw2026(gw.url, 'tools/call', { name: 'issue_refund', arguments: keyed });
  const modern = await raw2026(gw.url, 'tools/call', { name: 'issue_refund', arguments: { ...keyed, amount_cents: 4 } });
  assert.equal(modern.message.result.resultType, 'complete', modern.text);
  assert.equal(idemStatus(modern.message.result).code, 'key_reused');
  const legacy = await raw2026(gw.url, 'tools/call', { name: 'issue_refund', arguments: { ...keyed, amount_cents: 4 } }, { version: '2025-11-25' });
  assert.equal(idemStatus(legacy.message.result).code, 'key_reused', legacy.text);
  assert.equal('resultType' in legacy.message.result, false, 'a 2025 caller gets the 2025 form');
});

test('refusals before the key (no subject, bad token, store unavailable or not configured) are accepted by v2 clients', async (t) => {
  const dir = await tempDir(t, 'idemgw-v2-jwks-');
  const jwksFile = path.join(dir, 'jwks.json');
  await fs.writeFile(jwksFile, JSON.stringify({ keys: [makeKey('ES256', 'k1').jwk] }));
  const cases = [
    { code: 'no_subject', config: { subject: { header: 'X-User' } } },
    { code: 'bad_token', config: { subject: { jwt: { jwks_file: jwksFile, issuer: ISSUER, audience: AUDIENCE } } }, headers: { Authorization: 'Bearer not.a.jwt' } },
    { code: 'store_unavailable', databaseUrl: `postgresql://127.0.0.1:${await freePort()}/none?connect_timeout=1` },
    { code: 'store_not_configured', databaseUrl: 'none' },
  ];
  for (const c of cases) {
    const { upstream, gw } = await setup(t, c.config ?? {}, { databaseUrl: c.databaseUrl });
    for (const mode of MODES) {
      const client = await v2Client(t, gw.url, mode, { headers: c.headers ?? {} });
      const r = await client.callTool({ name: 'issue_refund', arguments: { order_id: `${c.code}-${mode.name}`, amount_cents: 1 } });
      assert.equal(idemStatus(r)?.code, c.code, `${mode.name}: ${JSON.stringify(r)}`);
      assert.equal(r.isError, true);
    }
    assert.equal((await readLedger(upstream.ledger)).length, 0, `${c.code}: nothing ran`);
  }
});

test('input_required (multi-round-trip) runs once, is never stored, and its final result replays complete', async (t) => {
  const { upstream, gw } = await setup(t);
  for (const mode of MODES) {
    let asked = 0;
    const onElicit = async () => {
      asked++;
      return { action: 'accept', content: { confirm: true } };
    };
    const c = await v2Client(t, gw.url, mode, { onElicit });
    const args = { order_id: `mrtr-${mode.name}`, amount_cents: 12 };
    const r = await c.callTool({ name: 'confirm_refund', arguments: args });
    assert.match(toolText(r), /^Refunded 12 cents/);
    assert.equal(asked, 1, 'the user was asked once');
    const again = await c.callTool({ name: 'confirm_refund', arguments: args });
    assert.ok(replayMarker(again), `${mode.name}: the repeat is a replay, not another round`);
    assert.equal(toolText(again), toolText(r));
    assert.equal(asked, 1, 'a replay asks nothing');
    assert.equal((await ledgerOf(upstream.ledger, args.order_id)).length, 1, 'executed once');
  }
  // the first round on the wire: input_required passes through, and a repeat is not a replay of it
  const args = { order_id: 'mrtr-raw', amount_cents: 1 };
  for (let i = 0; i < 2; i++) {
    const round = await raw2026(gw.url, 'tools/call', { name: 'confirm_refund', arguments: args });
    assert.equal(round.message.result.resultType, 'input_required', round.text);
    assert.equal(replayMarker(round.message.result), undefined);
  }
  assert.equal((await ledgerOf(upstream.ledger, 'mrtr-raw')).length, 0);
});

test('stored results cross eras: 2025 (SDK 1.32.2) to 2026 (client 2.4.0) and back', async (t) => {
  const { upstream, gw } = await setup(t);
  const old = await mcpClient(t, gw.url);
  for (const mode of MODES) {
    const modern = await v2Client(t, gw.url, mode);
    // stored from a 2025 session, repeated by a 2026 client
    const a = { order_id: `old-first-${mode.name}`, amount_cents: 21 };
    const r1 = await old.callTool({ name: 'issue_refund', arguments: a });
    const r2 = await modern.callTool({ name: 'issue_refund', arguments: a });
    assert.ok(replayMarker(r2), `${mode.name}: replayed to the 2026 client`);
    assert.equal(toolText(r2), toolText(r1));
    // stored from a 2026 client, repeated by a 2025 session
    const b = { order_id: `new-first-${mode.name}`, amount_cents: 22 };
    const r3 = await modern.callTool({ name: 'issue_refund', arguments: b });
    const r4 = await old.callTool({ name: 'issue_refund', arguments: b });
    assert.ok(replayMarker(r4), `${mode.name}: replayed to the 2025 client`);
    assert.equal(toolText(r4), toolText(r3));
    for (const o of [a.order_id, b.order_id]) assert.equal((await ledgerOf(upstream.ledger, o)).length, 1, `${o} executed once`);
  }
  // on the wire: a 2025-stored result gains resultType for 2026 and nothing else
  const c = { order_id: 'wire', amount_cents: 23 };
  await old.callTool({ name: 'issue_refund', arguments: c });
  const wire = await raw2026(gw.url, 'tools/call', { name: 'issue_refund', arguments: c });
  assert.equal(wire.message.result.resultType, 'complete', wire.text);
  assert.ok(replayMarker(wire.message.result));
});

test('SEP-2243: Mcp-Name in base64 is decoded and compared; a mismatch is refused 400 before anything runs', async (t) => {
  const { upstream, gw } = await setup(t);
  const b64 = (s) => `=?base64?${Buffer.from(s, 'utf8').toString('base64')}?=`;
  const call = (order, headers) => raw2026(gw.url, 'tools/call', { name: 'issue_refund', arguments: { order_id: order, amount_cents: 1 } }, { headers });

  const ok = await call('b64-ok', { 'Mcp-Name': b64('issue_refund') });
  assert.equal(ok.status, 200, ok.text);
  assert.match(toolText(ok.message.result), /^Refunded/);
  for (const [order, headers, why] of [
    ['b64-other', { 'Mcp-Name': b64('get_ledger') }, /Mcp-Name/],
    ['b64-bad', { 'Mcp-Name': '=?base64?!!!?=' }, /base64/],
    ['plain-other', { 'Mcp-Name': 'issue_refunds' }, /Mcp-Name/],
    ['method-other', { 'Mcp-Method': 'tools/list' }, /Mcp-Method/],
    ['version-other', { 'MCP-Protocol-Version': '2025-11-25' }, /MCP-Protocol-Version/],
  ]) {
    const r = await call(order, headers);
    assert.equal(r.status, 400, `${order}: ${r.text}`);
    assert.equal(r.message.error.code, -32020);
    assert.match(r.message.error.message, why);
  }
  // the same for resources/read and prompts/get
  const read = await raw2026(gw.url, 'resources/read', { uri: 'ledger://count' }, { headers: { 'Mcp-Name': b64('ledger://count') } });
  assert.equal(read.status, 200, read.text);
  const wrong = await raw2026(gw.url, 'prompts/get', { name: 'greet', arguments: { who: 'a' } }, { headers: { 'Mcp-Name': 'other' } });
  assert.equal(wrong.status, 400, wrong.text);
  // the real client behind a proxy that rewrites its Mcp-Name: the 400 reaches it as the
  // JSON-RPC error -32020, a protocol error it understands, not a result it cannot parse
  for (const mode of MODES) {
    const client = new Client({ name: 'idemgw-v2-mangled', version: '1.0.0' }, { versionNegotiation: mode.versionNegotiation });
    const mangle = (u, init) => {
      const headers = new Headers(init?.headers);
      if (headers.get('mcp-name') === 'issue_refund') headers.set('mcp-name', 'get_ledger');
      return fetch(u, { ...init, headers });
    };
    await client.connect(new StreamableHTTPClientTransport(new URL(gw.url), { fetch: mangle }));
    t.after(() => client.close().catch(() => {}));
    await assert.rejects(client.callTool({ name: 'issue_refund', arguments: { order_id: `mangled-${mode.name}`, amount_cents: 1 } }),
      (e) => e.code === -32020 && /Mcp-Name/.test(e.message), `${mode.name}: a -32020 protocol error`);
  }
  const ledger = await readLedger(upstream.ledger);
  assert.deepEqual(ledger.map((l) => l.order_id), ['b64-ok'], 'only the matching call ran');
});

test('params.idempotencyKey (SEP-3182) is an explicit key: replayed for the same call, key_reused for other arguments', async (t) => {
  const { upstream, gw } = await setup(t);
  const call = (args, idempotencyKey, opts) => raw2026(gw.url, 'tools/call', { name: 'issue_refund', arguments: args, idempotencyKey }, opts);
  const args = { order_id: 'sep-1', amount_cents: 30 };
  const first = await call(args, 'order-sep-1');
  assert.match(toolText(first.message.result), /^Refunded 30 cents/, first.text);
  // the key, not the arguments, names the call: a note that would change the hash does not
  const again = await call({ ...args, note: 'retry' }, 'order-sep-1');
  assert.equal(idemStatus(again.message.result)?.code, 'key_reused', again.text);
  const same = await call(args, 'order-sep-1');
  assert.ok(replayMarker(same.message.result), same.text);
  assert.equal(same.message.result.resultType, 'complete');
  // from a 2025 caller too (the key is in params, whatever the era)
  const legacy = await call(args, 'order-sep-1', { version: '2025-11-25' });
  assert.ok(replayMarker(legacy.message.result), legacy.text);
  // another key is another call; a key that is not a string or number is refused, not ignored
  const other = await call(args, 'order-sep-2');
  assert.match(toolText(other.message.result), /^Refunded 30 cents/);
  const bad = await call(args, { k: 1 });
  assert.equal(idemStatus(bad.message.result)?.code, 'bad_key', bad.text);
  assert.match(toolText(bad.message.result), /params\.idempotencyKey/);
  assert.equal((await ledgerOf(upstream.ledger, 'sep-1')).length, 2, 'once per key');
});

// A client that times out a slow protected call cancels it, then retries. Client 2.4.0 cancels
// a 2026-07-28 request by aborting its POST stream (no notifications/cancelled is sent), a
// 2025-era one (mode 'legacy') by POSTing notifications/cancelled. The gateway keeps reading
// the upstream's answer when the agent's stream closes, so on 2026-07-28 the call runs to its
// end and is stored whatever on_cancel says: there is no cancel to pass on. Only the 2025
// notification is something on_cancel: forward can send upstream.
const CANCELLING = [...MODES, { name: 'legacy', versionNegotiation: { mode: 'legacy' } }];

for (const onCancel of ['finish', 'forward']) {
  test(`on_cancel ${onCancel}: a v2 client times out a slow protected call and retries it`, { timeout: 60000 }, async (t) => {
    const { upstream, gw } = await setup(t, {
      tools: { get_ledger: { class: 'read' }, slow_refund: { on_cancel: onCancel, in_progress: { wait: '30s' } } },
    });
    for (const mode of CANCELLING) {
      const m = mode.name;
      const c = await v2Client(t, gw.url, mode);
      assert.equal(c.getNegotiatedProtocolVersion() >= '2026-07-28', m !== 'legacy', `${m}: ${c.getNegotiatedProtocolVersion()}`);
      const args = { order_id: `cancel-${onCancel}-${m}`, amount_cents: 17, delay_ms: 1500 };
      await assert.rejects(c.callTool({ name: 'slow_refund', arguments: args }, { timeout: 300 }), /timed out|timeout/i);
      const retry = await c.callTool({ name: 'slow_refund', arguments: args });
      assert.equal((await ledgerOf(upstream.ledger, args.order_id)).length, 1, `${m}: executed once`);
      if (m === 'legacy' && onCancel === 'forward') {
        // the cancel went upstream: the call may have stopped halfway, and the retry says so
        assert.equal(idemStatus(retry)?.code, 'cancelled', JSON.stringify(retry));
        assert.equal(idemStatus(retry).executed, 'unknown');
        assert.equal(retry.isError, true);
        continue;
      }
      assert.equal(retry.isError, undefined, `${m}: ${JSON.stringify(retry)}`);
      assert.match(toolText(retry), new RegExp(`^Refunded 17 cents on order ${args.order_id} `));
      assert.ok(replayMarker(retry), `${m}: the retry is the one execution's result, replayed`);
    }
    const logs = gw.logs();
    const cancels = logs.split('\n').filter((l) => l.includes('"rpc_method":"notifications/cancelled"'));
    assert.equal(cancels.length, 1, 'only the 2025 client sent a cancel');
    assert.match(cancels[0], onCancel === 'finish' ? /"outcome":"cancel_kept"/ : /"outcome":"forwarded"/);
    // the 2026-07-28 calls whose streams were closed ran to their end and were stored
    const executed = logs.split('\n').filter((l) => /"tool":"slow_refund".*"outcome":"executed".*"recorded":"succeeded"/.test(l));
    assert.equal(executed.length, onCancel === 'finish' ? 3 : 2, logs);
  });
}
