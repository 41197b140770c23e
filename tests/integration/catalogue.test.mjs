// The upstream's own catalogue: a tool the policy does not name is classified from the
// server's annotations (readOnlyHint → read), so a read is never replayed stale; the class of
// every tool and its source are logged; `idemgw tools` prints them; `idemgw policy` writes a
// starter policy from the catalogue and reports a policy's drift from it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import path from 'node:path';
import {
  IDEMGW_BIN, createDatabase, mcpClient, readLedger, replayMarker, run, startGateway, startRefundServer,
  tempDir, toolText, waitForLog,
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

test('idemgw tools prints every tool with its class, source and window', async (t) => {
  const upstream = await startRefundServer(t);
  const { gw } = { gw: await startGateway(t, { upstream: upstream.url, config: { tools: { issue_refund: { class: 'non_idempotent', window: '1h' }, retired_tool: { class: 'read' } } } }) };
  const r = await run(IDEMGW_BIN, ['tools', '-c', gw.configPath]);
  assert.equal(r.code, 0, r.stderr);
  const rows = Object.fromEntries(r.stdout.trim().split('\n').slice(1).map((l) => { const f = l.split(/\s+/); return [f[0], f]; }));
  assert.deepEqual(rows.issue_refund.slice(1, 4), ['non_idempotent', 'policy', '1h']);
  assert.deepEqual(rows.get_ledger.slice(1, 5), ['read', 'annotation', '-', 'true']);
  assert.deepEqual(rows.failing_refund.slice(1, 4), ['non_idempotent', 'default', '10m']);
  assert.match(r.stdout, /retired_tool\s+read\s+policy\s+-\s+\(in the policy, not listed by the server\)/);

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
  const usage = await run(IDEMGW_BIN, ['policy', 'init']);
  assert.equal(usage.code, 2);
});
