// The upstream's own catalogue: a tool the policy does not name is classified from the
// server's annotations (readOnlyHint → read), so a read is never replayed stale; the class of
// every tool and its source are logged; `idemgw tools` prints them; `idemgw policy` writes a
// starter policy from the catalogue and reports a policy's drift from it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import path from 'node:path';
import {
  IDEMGW_BIN, createDatabase, findResponse, mcpClient, rawSession, readLedger, replayMarker, run, startGateway, startRefundServer,
  tempDir, toolText, waitFor, waitForLog,
} from './lib/harness.mjs';

const REFUND = { order_id: 'ord-7', amount_cents: 700 };

async function setup(t, config = {}, upstreamOpts = {}) {
  const upstream = await startRefundServer(t, upstreamOpts);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { subject: { static: 'tenant' }, ...config },
  });
  return { upstream, gw };
}

test('an unlisted read-only tool is read: it sees the refund that ran, not a stale replay', async (t) => {
  const { upstream, gw } = await setup(t);
  // The gateway's own tools/list at start: every tool's class, logged once.
  await waitForLog(gw, /tool catalogue: \d+ tools listed by the upstream/);
  const line = (tool) => gw.logs().split('\n').filter((l) => l.includes('"tool class"')).map((l) => JSON.parse(l)).find((l) => l.tool === tool);
  assert.equal(line('get_ledger').class, 'read');
  assert.equal(line('get_ledger').class_source, 'annotation');
  assert.equal(line('issue_refund').class, 'non_idempotent');
  assert.equal(line('issue_refund').class_source, 'default');

  const client = await mcpClient(t, gw.url);
  const before = await client.callTool({ name: 'get_ledger', arguments: {} });
  assert.equal(toolText(before), '');
  const refund = await client.callTool({ name: 'issue_refund', arguments: REFUND });
  assert.notEqual(refund.isError, true);
  const after = await client.callTool({ name: 'get_ledger', arguments: {} });
  assert.equal(replayMarker(after), undefined, 'a read is never replayed');
  assert.match(toolText(after), /ord-7/, 'the read sees the refund');
  // The unlisted write is still protected.
  const again = await client.callTool({ name: 'issue_refund', arguments: REFUND });
  assert.ok(replayMarker(again), 'the repeated refund is replayed');
  assert.equal((await readLedger(upstream.ledger)).length, 1);

  // A tool nobody lists is logged once as such, and protected.
  const unknown = await client.callTool({ name: 'no_such_tool', arguments: {} });
  assert.equal(unknown.isError, true);
  await client.callTool({ name: 'no_such_tool', arguments: {} });
  const unlisted = gw.logs().split('\n').filter((l) => l.includes('"tool":"no_such_tool"') && l.includes('"tool class'));
  assert.equal(unlisted.length, 1, 'logged once');
  assert.match(unlisted[0], /"listed":false/);
});

test('trust_annotations: false keeps every unlisted tool at defaults.class', async (t) => {
  const { gw } = await setup(t, { defaults: { trust_annotations: false } });
  const client = await mcpClient(t, gw.url);
  await client.callTool({ name: 'get_ledger', arguments: {} });
  await client.callTool({ name: 'issue_refund', arguments: REFUND });
  const after = await client.callTool({ name: 'get_ledger', arguments: {} });
  assert.ok(replayMarker(after), 'without trusted annotations the read is protected, and replayed');
});

test('a tools/list passing through teaches the catalogue when the gateway cannot ask itself', async (t) => {
  // A server behind OAuth: the gateway holds no token, so its own tools/list is refused.
  const { upstream, gw } = await setup(t, {}, { requireBearer: 'agent-token' });
  await waitForLog(gw, /tool catalogue: the upstream's tools\/list could not be read \(initialize: HTTP 401\)/);
  const client = await mcpClient(t, gw.url, { headers: { Authorization: 'Bearer agent-token' } });
  // Before any tools/list, an unlisted tool has the default class: protected.
  await client.callTool({ name: 'get_ledger', arguments: {} });
  await client.callTool({ name: 'issue_refund', arguments: REFUND });
  assert.ok(replayMarker(await client.callTool({ name: 'get_ledger', arguments: {} })), 'unknown: protected');
  const listed = await client.listTools();
  // the agent's tools/list was watched, not changed
  assert.equal(listed.tools.find((x) => x.name === 'get_ledger').annotations.readOnlyHint, true);
  await waitForLog(gw, /"tool":"get_ledger","class":"read","class_source":"annotation"/);
  const fresh = await client.callTool({ name: 'get_ledger', arguments: {} });
  assert.equal(replayMarker(fresh), undefined, 'learned from the agent\'s tools/list: a read');
  assert.match(toolText(fresh), /ord-7/);
  assert.equal((await readLedger(upstream.ledger)).length, 1);
});

test('idemgw tools prints every tool with its class, source, window and on_cancel', async (t) => {
  const upstream = await startRefundServer(t);
  const { gw } = { gw: await startGateway(t, { upstream: upstream.url, config: { tools: { issue_refund: { class: 'non_idempotent', window: '1h', on_cancel: 'forward' }, retired_tool: { class: 'read' } } } }) };
  const r = await run(IDEMGW_BIN, ['tools', '-c', gw.configPath]);
  assert.equal(r.code, 0, r.stderr);
  const rows = Object.fromEntries(r.stdout.trim().split('\n').slice(1).map((l) => { const f = l.split(/\s+/); return [f[0], f]; }));
  assert.deepEqual(rows.issue_refund.slice(1, 5), ['non_idempotent', 'policy', '1h', 'forward']);
  assert.deepEqual(rows.get_ledger.slice(1, 6), ['read', 'annotation', '-', '-', 'true']);
  assert.deepEqual(rows.failing_refund.slice(1, 5), ['non_idempotent', 'default', '10m', 'finish']);
  assert.match(r.stdout, /retired_tool\s+read\s+policy\s+-\s+-\s+\(in the policy, not listed by the server\)/);

  const down = await run(IDEMGW_BIN, ['tools', '-c', gw.configPath], { env: { ...process.env, IDEMGW_UPSTREAM: 'http://127.0.0.1:1/mcp' } });
  assert.equal(down.code, 1);
  assert.match(down.stderr, /connect failed/);
  const bad = await run(IDEMGW_BIN, ['tools', '-H', 'no colon here']);
  assert.equal(bad.code, 2);
});

test('idemgw policy init writes a config that loads; policy diff reports drift', async (t) => {
  const upstream = await startRefundServer(t, { requireBearer: 'op-token' });
  const refused = await run(IDEMGW_BIN, ['policy', 'init', '--upstream', upstream.url]);
  assert.equal(refused.code, 1, 'without the token the server refuses');
  assert.match(refused.stderr, /HTTP 401/);

  const init = await run(IDEMGW_BIN, ['policy', 'init', '--upstream', upstream.url, '-H', 'Authorization: Bearer op-token']);
  assert.equal(init.code, 0, init.stderr);
  assert.match(init.stdout, /# Lists every execution recorded so far/);
  assert.match(init.stdout, /# annotations: readOnlyHint: true\n  get_ledger:\n    class: read\n/);
  assert.match(init.stdout, /issue_refund:\n    class: non_idempotent\n/);
  const dir = await tempDir(t, 'idemgw-policy-');
  const file = path.join(dir, 'idemgw.yaml');
  await fs.writeFile(file, init.stdout);
  const check = await run(IDEMGW_BIN, ['--check-config', '-c', file]);
  assert.equal(check.code, 0, check.stderr);
  const same = await run(IDEMGW_BIN, ['policy', 'diff', '-c', file, '-H', 'Authorization: Bearer op-token']);
  assert.equal(same.code, 0, `a fresh policy has no drift: ${same.stdout}`);
  assert.equal(same.stdout, '');

  await fs.writeFile(file, init.stdout
    .replace('issue_refund:\n    class: non_idempotent', 'issue_refund:\n    class: read')
    .replace('  get_ledger:\n', '  retired_tool:\n    class: read\n  get_ledger:\n')
    .replace(/  slow_refund:\n    class: non_idempotent\n/, ''));
  const drift = await run(IDEMGW_BIN, ['policy', 'diff', '-c', file, '-H', 'Authorization: Bearer op-token']);
  assert.equal(drift.code, 1);
  assert.match(drift.stdout, /warning: issue_refund is read in the policy, but the server says it is destructive/);
  assert.match(drift.stdout, /not on the server: retired_tool/);
  assert.match(drift.stdout, /not in the policy: slow_refund \(gets non_idempotent, from default\)/);

  // Stricter than the server's annotations: said, one line, and no drift (exit 0).
  await fs.writeFile(file, init.stdout
    .replace('get_ledger:\n    class: read', 'get_ledger:\n    class: non_idempotent'));
  const strict = await run(IDEMGW_BIN, ['policy', 'diff', '-c', file, '-H', 'Authorization: Bearer op-token']);
  assert.equal(strict.code, 0, strict.stdout + strict.stderr);
  assert.equal(strict.stdout, 'stricter: get_ledger is non_idempotent in the policy, but the server says it is read-only (readOnlyHint: true): its repeats get the first answer replayed, not a fresh one\n');
  const usage = await run(IDEMGW_BIN, ['policy', 'init']);
  assert.equal(usage.code, 2);
});

test('advertise_key: tools/list offers the key to non_idempotent tools; a strict server never sees it', async (t) => {
  const { upstream, gw } = await setup(t, { defaults: { advertise_key: true } });
  const client = await mcpClient(t, gw.url);
  const { tools } = await client.listTools();
  const receipt = tools.find((x) => x.name === 'send_receipt');
  assert.equal(receipt.inputSchema.properties.idempotency_key.type, 'string');
  assert.match(receipt.description, /^Emails the receipt of an order Pass an idempotency_key/);
  const ledgerTool = tools.find((x) => x.name === 'get_ledger');
  assert.equal(ledgerTool.inputSchema.properties?.idempotency_key, undefined, 'a read gets no key');
  const refund = tools.find((x) => x.name === 'issue_refund');
  assert.equal(refund.description, 'Refunds an order (not idempotent: every call pays out)', 'the server\'s own key argument is left alone');

  const args = { order_id: 'ord-9', to: 'a@example.com', idempotency_key: 'receipt-9' };
  const first = await client.callTool({ name: 'send_receipt', arguments: args });
  assert.notEqual(first.isError, true, `the strict server accepted the call: ${toolText(first)}`);
  const ledger = await readLedger(upstream.ledger);
  assert.deepEqual(ledger[0].arguments.sort(), ['order_id', 'to'], 'the key never reached the server');
  // The same key with other words: the key decides, and a reuse with other arguments is refused.
  const again = await client.callTool({ name: 'send_receipt', arguments: args });
  assert.ok(replayMarker(again));
  const reused = await client.callTool({ name: 'send_receipt', arguments: { ...args, to: 'b@example.com' } });
  assert.equal(reused._meta['idemgw/status'].code, 'key_reused');
  // The name spelled with an escape is the same argument: used as the key, and stripped too.
  const sid = client.transport.sessionId;
  const escaped = '{"jsonrpc":"2.0","id":"esc-1","method":"tools/call","params":{"name":"send_receipt",' +
    '"arguments":{"order_id":"ord-10","to":"c@example.com","idempotency_k\\u0065y":"receipt-10"}}}';
  const raw = await fetch(gw.url, {
    method: 'POST',
    body: escaped,
    headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream', 'Mcp-Session-Id': sid, 'Mcp-Protocol-Version': '2025-06-18' },
  });
  const rawRes = findResponse(raw.headers.get('content-type'), await raw.text(), 'esc-1');
  assert.notEqual(rawRes.result.isError, true, `the strict server accepted the call: ${toolText(rawRes.result)}`);
  assert.deepEqual((await readLedger(upstream.ledger)).at(-1).arguments.sort(), ['order_id', 'to'], 'the escaped key never reached the server');
  const plain = await client.callTool({ name: 'send_receipt', arguments: { order_id: 'ord-10', to: 'c@example.com', idempotency_key: 'receipt-10' } });
  assert.ok(replayMarker(plain), 'the same key, spelled plainly, is a replay');
  // The server's own idempotency_key argument still reaches it.
  await client.callTool({ name: 'issue_refund', arguments: { ...REFUND, idempotency_key: 'r-1' } });
  assert.equal((await readLedger(upstream.ledger)).at(-1).idempotency_key, 'r-1');
});

test('without advertise_key or status_tool a tools/list answer passes byte for byte', async (t) => {
  const { upstream, gw } = await setup(t);
  const body = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list', params: {} });
  const read = async (url) => {
    const c = await mcpClient(t, url);
    const sid = c.transport.sessionId;
    const res = await fetch(url, { method: 'POST', body, headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream', 'Mcp-Session-Id': sid, 'Mcp-Protocol-Version': '2025-06-18' } });
    return (await res.text()).replace(/^id: .*$/m, '');
  };
  assert.equal(await read(gw.url), await read(upstream.url));
});

test('status_tool: the gateway answers what became of an earlier call, for its caller only', async (t) => {
  const { upstream, gw } = await setup(t, { status_tool: true, subject: { header: 'X-Caller' } });
  const client = await mcpClient(t, gw.url, { headers: { 'X-Caller': 'alice' } });
  const { tools } = await client.listTools();
  const st = tools.find((x) => x.name === 'idemgw_call_status');
  assert.ok(st, 'offered in tools/list');
  assert.equal(st.annotations.readOnlyHint, true);
  const status = (args) => client.callTool({ name: 'idemgw_call_status', arguments: args });

  const none = await status({ tool: 'issue_refund', arguments: REFUND });
  assert.equal(none._meta['idemgw/status'].code, 'not_found');
  assert.notEqual(none.isError, true);
  const done = await client.callTool({ name: 'issue_refund', arguments: REFUND });
  const ok = await status({ tool: 'issue_refund', arguments: REFUND });
  assert.equal(toolText(ok), toolText(done), 'the stored result');
  assert.equal(replayMarker(ok).status_query, true);

  const slowArgs = { order_id: 'ord-slow', amount_cents: 1, delay_ms: 3000 };
  const slow = client.callTool({ name: 'slow_refund', arguments: slowArgs });
  await waitForLedgerTool(upstream.ledger, 'slow_refund');
  const running = await status({ tool: 'slow_refund', arguments: slowArgs });
  assert.equal(running._meta['idemgw/status'].code, 'running');
  const dup = await client.callTool({ name: 'slow_refund', arguments: slowArgs });
  assert.equal(dup._meta['idemgw/status'].code, 'in_progress');
  assert.match(toolText(dup), /call the tool idemgw_call_status/, 'the in-progress answer names it');
  await slow;

  // another caller asks about the same call: it is not theirs
  const other = await mcpClient(t, gw.url, { headers: { 'X-Caller': 'bob' } });
  const theirs = await other.callTool({ name: 'idemgw_call_status', arguments: { tool: 'issue_refund', arguments: REFUND } });
  assert.equal(theirs._meta['idemgw/status'].code, 'not_found', 'another caller learns nothing of it');
  const bad = await status({ arguments: {} });
  assert.equal(bad.isError, true);
  assert.equal(bad._meta['idemgw/status'].code, 'bad_request');
  assert.equal((await readLedger(upstream.ledger)).length, 2, 'the status tool never ran anything');
});

function waitForLedgerTool(file, tool) {
  return waitFor(async () => (await readLedger(file)).some((e) => e.tool === tool) || null, { what: `${tool} in the ledger` });
}

for (const progress of [false, true]) {
  test(`answer_after: a long call is answered still_running${progress ? ' after its progress events' : ''}, its result kept for the repeat`, async (t) => {
    const { upstream, gw } = await setup(t, { status_tool: true, tools: { slow_refund: { class: 'non_idempotent', answer_after: '400ms' } } });
    const client = await mcpClient(t, gw.url);
    const args = { order_id: `ord-long-${progress}`, amount_cents: 5, delay_ms: 2500 };
    let events = 0;
    const early = await client.callTool({ name: 'slow_refund', arguments: args }, undefined,
      progress ? { onprogress: () => { events++; }, timeout: 60000 } : { timeout: 60000 });
    assert.equal(early.isError, true);
    assert.equal(early._meta['idemgw/status'].code, 'still_running');
    assert.match(toolText(early), /do NOT repeat it now/);
    assert.match(toolText(early), /idemgw_call_status/);
    if (progress) assert.ok(events >= 1, 'the progress event before it was relayed');
    // the gateway keeps reading: the result is recorded when the server finishes
    await waitForLog(gw, /recorded as succeeded/, { timeoutMs: 15000 });
    const later = await client.callTool({ name: 'slow_refund', arguments: args });
    assert.ok(replayMarker(later), 'the repeat gets the stored result');
    assert.match(toolText(later), /^Refunded 5 cents on order ord-long/);
    assert.equal((await readLedger(upstream.ledger)).length, 1, 'executed once');
    assert.match(gw.logs(), /"answered":"still_running"/);
  });
}

test('notifications/tools/list_changed on a GET stream: the gateway reads the tools again', async (t) => {
  const { gw } = await setup(t);
  await waitForLog(gw, /tool catalogue: \d+ tools listed by the upstream/);
  const raw = await rawSession(t, gw.url);
  // the session's GET stream, where the server's own notifications go; open once its head is in
  const controller = new AbortController();
  t.after(() => controller.abort());
  const stream = await fetch(gw.url, {
    headers: { Accept: 'text/event-stream', 'Mcp-Session-Id': raw.sessionId, 'MCP-Protocol-Version': '2025-11-25' },
    signal: controller.signal,
  });
  assert.equal(stream.status, 200);
  const enabled = await raw.call('enable_audit', {});
  assert.equal(enabled.status, 200, enabled.body);
  await waitForLog(gw, /the upstream says its tools changed/);
  await waitForLog(gw, /"tool":"audit_log","class":"read","class_source":"annotation"/);
  // the fetch logs its end after the tools it learned (it closes its session first)
  await waitFor(() => gw.logs().match(/tool catalogue: \d+ tools listed by the upstream/g).length === 2 || null,
    { what: 'the second reading of the catalogue to end' });
});
