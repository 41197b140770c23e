// stdio servers in both protocol eras. A stdio connection speaks the era its first message
// chose, so the gateway opens a 2026-07-28 caller's child with server/discover: a server that
// speaks 2026 (the v2 SDK's serveStdio, tests/fixtures/v2-stdio.mjs) gets the caller's
// requests as they are; a 2025 server (the SDK 1.x ledger fixture, and a hand-written one that
// drops requests before initialize) is opened with initialize and bridged. Each combination is
// driven by @modelcontextprotocol/client 2.4.0 pinned to 2026-07-28 and, on the same gateway,
// by the SDK 1.x client in the 2025 era, through `upstream: {command}` (per_session and
// shared) and through `idemgw stdio`. A retried refund runs once in every case.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { Client as V2Client, StreamableHTTPClientTransport as V2Transport } from '@modelcontextprotocol/client';
import { StdioClientTransport as V2StdioTransport } from '@modelcontextprotocol/client/stdio';
import { getDefaultEnvironment } from '@modelcontextprotocol/sdk/client/stdio.js';
import {
  IDEMGW_BIN, NODE, TESTS, mcpClient, readLedger, replayMarker, startGateway, tempDir, toolText, waitForLog,
} from './lib/harness.mjs';

const SERVERS = {
  'v2-stdio (2026 and 2025)': { file: path.join(TESTS, 'fixtures/v2-stdio.mjs'), modern: true },
  'ledger-stdio (SDK 1.x, 2025 only)': { file: path.join(TESTS, 'fixtures/ledger-stdio.mjs'), modern: false },
};
const LATE_INIT = path.join(TESTS, 'fixtures/late-init-stdio.mjs');
const PIN = { versionNegotiation: { mode: { pin: '2026-07-28' } } };

/** A v2 client pinned to 2026-07-28 on transport; closed when the test ends. */
async function pinned(t, transport, name = 'pinned-agent') {
  const client = new V2Client({ name, version: '1.0.0' }, PIN);
  await client.connect(transport);
  t.after(() => client.close().catch(() => {}));
  assert.equal(client.getNegotiatedProtocolVersion(), '2026-07-28', 'the 2026 era is negotiated');
  return client;
}

const ordersOf = async (ledger, order) => (await readLedger(ledger)).filter((l) => l.order_id === order);

for (const [label, server] of Object.entries(SERVERS)) {
  for (const sessions of ['per_session', 'shared']) {
    test(`upstream {command} ${label}, ${sessions}: a client pinned to 2026-07-28 and a 2025 client side by side`, async (t) => {
      const dir = await tempDir(t, 'idemgw-era-');
      const ledger = path.join(dir, 'ledger.jsonl');
      const gw = await startGateway(t, {
        upstream: { command: [NODE, server.file], env: { LEDGER: ledger }, sessions },
        config: { subject: { static: 'era-agent' } },
      });

      const modern = await pinned(t, new V2Transport(new URL(gw.url)));
      const tools = await modern.listTools();
      assert.ok(tools.tools.some((x) => x.name === 'issue_refund'), 'tools/list reaches the 2026 client');
      const args = { order_id: `ord-26-${sessions}`, amount_cents: 2600 };
      const first = await modern.callTool({ name: 'issue_refund', arguments: args });
      assert.match(toolText(first), new RegExp(`Refunded 2600 on ${args.order_id}`));
      assert.equal(replayMarker(first), undefined);
      if (server.modern) assert.match(toolText(first), /\(modern\)/, 'the server served the call in its 2026 era');

      // the 2025 era on the same gateway at the same time
      const old = await mcpClient(t, gw.url);
      const oldArgs = { order_id: `ord-25-${sessions}`, amount_cents: 2500 };
      const oldFirst = await old.callTool({ name: 'issue_refund', arguments: oldArgs });
      assert.match(toolText(oldFirst), new RegExp(`Refunded 2500 on ${oldArgs.order_id}`));
      if (server.modern) assert.match(toolText(oldFirst), /\(legacy\)/, 'a 2025 client is served in the 2025 era');

      // the model re-issues the refund from a new 2026 connection: replayed, not run
      const again = await pinned(t, new V2Transport(new URL(gw.url)), 'pinned-agent-2');
      const retry = await again.callTool({ name: 'issue_refund', arguments: args });
      assert.ok(replayMarker(retry), `the retry is a replay: ${JSON.stringify(retry)}`);
      assert.equal(toolText(retry), toolText(first));
      const oldRetry = await old.callTool({ name: 'issue_refund', arguments: oldArgs });
      assert.ok(replayMarker(oldRetry), 'the 2025 retry is a replay');
      assert.equal((await ordersOf(ledger, args.order_id)).length, 1, 'the 2026 refund ran once');
      assert.equal((await ordersOf(ledger, oldArgs.order_id)).length, 1, 'the 2025 refund ran once');
      if (server.modern) {
        const lines = await readLedger(ledger);
        assert.deepEqual(lines.map((l) => l.era).sort(), ['legacy', 'modern']);
        assert.notEqual(lines[0].pid, lines[1].pid, 'each era has a child of its own');
      }
    });
  }
}

for (const [label, server] of Object.entries(SERVERS)) {
  test(`idemgw stdio -- ${label}: a client pinned to 2026-07-28 connects, a repeated refund runs once`, async (t) => {
    const dir = await tempDir(t, 'idemgw-era-wrap-');
    const ledger = path.join(dir, 'ledger.jsonl');
    let logs = '';
    const transport = new V2StdioTransport({
      command: IDEMGW_BIN,
      args: ['stdio', '--', NODE, server.file],
      env: { ...getDefaultEnvironment(), XDG_STATE_HOME: path.join(dir, 'state'), LEDGER: ledger },
      stderr: 'pipe',
    });
    transport.stderr?.on('data', (c) => { logs += c; });
    t.after(() => { if (!t.passed) process.stderr.write(`\n----- idemgw stdio -----\n${logs}\n`); });
    const client = await pinned(t, transport);
    const tools = await client.listTools();
    assert.ok(tools.tools.some((x) => x.name === 'issue_refund'));
    const args = { order_id: 'ord-wrap-26', amount_cents: 700 };
    const first = await client.callTool({ name: 'issue_refund', arguments: args });
    assert.match(toolText(first), /Refunded 700 on ord-wrap-26/);
    if (server.modern) assert.match(toolText(first), /\(modern\)/);
    const again = await client.callTool({ name: 'issue_refund', arguments: args });
    assert.ok(replayMarker(again), `the repeat is a replay: ${JSON.stringify(again)}`);
    assert.equal((await ordersOf(ledger, 'ord-wrap-26')).length, 1, 'executed once');
  });
}

test('a 2025 server that drops requests before initialize still serves a 2026 caller (initialize follows an unanswered server/discover)', async (t) => {
  const dir = await tempDir(t, 'idemgw-era-late-');
  const ledger = path.join(dir, 'ledger.jsonl');
  const gw = await startGateway(t, {
    upstream: { command: [NODE, LATE_INIT], env: { LEDGER: ledger } },
    config: { subject: { static: 'era-agent' } },
  });
  // the command proven first (the catalogue's child answered): the caller's child then starts
  // at once, and its server/discover's deadline must run from there too
  await waitForLog(gw, /tool catalogue: 1 tools/);
  const client = await pinned(t, new V2Transport(new URL(gw.url)));
  const args = { order_id: 'ord-late', amount_cents: 10 };
  const first = await client.callTool({ name: 'issue_refund', arguments: args });
  assert.match(toolText(first), /Refunded 10 on ord-late/);
  const again = await client.callTool({ name: 'issue_refund', arguments: args });
  assert.ok(replayMarker(again));
  assert.equal((await ordersOf(ledger, 'ord-late')).length, 1);
  // the command is known to speak 2025 only: the next 2026 caller's child is not probed again
  const other = await pinned(t, new V2Transport(new URL(gw.url), { requestInit: { headers: { 'X-Agent': 'b' } } }), 'other');
  assert.ok((await other.listTools()).tools.length === 1);
});
