// Operating the gateway: several workers behind one port, SIGHUP reload, SIGTERM drain.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import {
  IDEMGW_BIN, createDatabase, mcpClient, rawSession, run, startEverything, startGateway, startRefundServer, toYaml,
  waitForLedger, waitForLog,
} from './lib/harness.mjs';

const PASSTHROUGH = { defaults: { class: 'read' } };

async function metric(adminUrl, name) {
  const text = await (await fetch(`${adminUrl}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${name} `));
  assert.ok(line, `/metrics has ${name}`);
  return Number(line.split(' ')[1]);
}

test('two workers share the port; /metrics sums both; SIGTERM stops them all with status 0', async (t) => {
  const upstream = await startEverything(t);
  // several workers: the embedded store takes one process, and none is needed here
  const gw = await startGateway(t, { upstream: upstream.url, config: { ...PASSTHROUGH, workers: 2, database_url: 'none' } });
  const before = await metric(gw.adminUrl, 'idemgw_requests_total');
  // Separate connections, so the kernel spreads them over the workers.
  const n = 24;
  await Promise.all(Array.from({ length: n }, async () => {
    const c = await mcpClient(t, gw.url);
    await c.callTool({ name: 'echo', arguments: { message: 'w' } });
    await c.close();
  }));
  const after = await metric(gw.adminUrl, 'idemgw_requests_total');
  assert.ok(after - before >= n * 3, `every request is counted across workers (${after - before})`);
  const workers = new Set([...gw.logs().matchAll(/"worker":(\d+)/g)].map((m) => m[1]));
  assert.deepEqual([...workers].sort(), ['1', '2'], 'both workers log, each with its number');

  gw.proc.kill('SIGTERM');
  const { code, signal } = await gw.exited;
  assert.equal(signal, null);
  assert.equal(code, 0, 'the supervisor exits 0 once every worker has drained');
  assert.match(gw.logs(), /supervisor: all workers stopped/);
});

test('SIGHUP reloads the policy; a bad file keeps the running one', async (t) => {
  const upstream = await startEverything(t);
  const gw = await startGateway(t, { upstream: upstream.url, config: { ...PASSTHROUGH, database_url: 'none' } });
  const client = await mcpClient(t, gw.url);
  const echo = () => client.callTool({ name: 'echo', arguments: { message: 'r' } });
  assert.equal((await echo()).isError, undefined, 'echo is forwarded while it is class read');

  const base = toYaml({ listen: `127.0.0.1:${gw.port}`, admin_listen: `127.0.0.1:${gw.adminPort}`, upstream: upstream.url, database_url: 'none' });
  // Without a store (database_url: none), a non_idempotent tool is refused as "store not
  // configured": a visible switch.
  // (echo is annotated readOnlyHint: the annotations must not count for this switch.)
  await fs.writeFile(gw.configPath, base + toYaml({ subject: { static: 'ops' }, defaults: { class: 'non_idempotent', trust_annotations: false } }));
  const reloaded = gw.logs().length;
  gw.proc.kill('SIGHUP');
  await waitFor(() => gw.logs().slice(reloaded).includes('configuration reloaded'));
  const refused = await echo();
  assert.equal(refused.isError, true);
  assert.equal(refused._meta['idemgw/status'].code, 'store_not_configured');

  await fs.writeFile(gw.configPath, base + 'defaults: {class: sometimes}\n');
  const bad = gw.logs().length;
  gw.proc.kill('SIGHUP');
  await waitFor(() => gw.logs().slice(bad).includes('keeping the running configuration'));
  assert.match(gw.logs().slice(bad), /idemgw\.yaml:\d+: /, 'the reload error names file and line');
  assert.equal((await echo()).isError, true, 'the previous (valid) policy is still in force');
});

async function waitFor(cond, ms = 10000) {
  const end = Date.now() + ms;
  while (!cond()) {
    assert.ok(Date.now() < end, 'timed out waiting for the gateway');
    await new Promise((r) => setTimeout(r, 20));
  }
}

test('SIGTERM drains: an in-flight call finishes, new connections are refused, exit 0', async (t) => {
  const upstream = await startEverything(t);
  const gw = await startGateway(t, { upstream: upstream.url, config: PASSTHROUGH });
  const client = await mcpClient(t, gw.url);
  let progressed;
  const firstProgress = new Promise((resolve) => { progressed = resolve; });
  const call = client.request(
    { method: 'tools/call', params: { name: 'trigger-long-running-operation', arguments: { duration: 2, steps: 4 } } },
    CallToolResultSchema,
    { onprogress: () => progressed() },
  );
  await firstProgress; // the call is running upstream
  gw.proc.kill('SIGTERM');
  await waitFor(() => gw.logs().includes('draining'));
  await assert.rejects(fetch(gw.url, { method: 'POST', body: '{}' }), 'the listener no longer accepts');
  const result = await call;
  assert.match(result.content[0].text, /Long running operation completed/, 'the in-flight call got its result');
  await client.close().catch(() => {});
  const { code } = await gw.exited;
  assert.equal(code, 0);
  assert.match(gw.logs(), /drained: exiting/);
});

// A drain that times out leaves calls in flight, one whose agent still waits and one whose agent
// has gone: the process still exits 0, and frees what they held (under `make check-asan`,
// LeakSanitizer reports whatever it did not and fails the exit).
test('a drain that times out with protected calls in flight exits 0 and leaks nothing', async (t) => {
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { subject: { header: 'X-Subject' }, timeouts: { drain: '1s' } },
  });
  const s = await rawSession(t, gw.url, { headers: { 'X-Subject': 'agent-1' } });
  const waiting = s.call('slow_refund', { order_id: 'ord-drain-1', amount_cents: 1, delay_ms: 60000 }).catch((e) => e);
  const agent = new AbortController();
  const left = s.call('slow_refund', { order_id: 'ord-drain-2', amount_cents: 1, delay_ms: 60000 }, { signal: agent.signal });
  await waitForLedger(upstream.ledger, 2); // both claimed and running upstream
  agent.abort();
  await assert.rejects(left);
  await waitForLog(gw, /agent disconnected before its answer/);
  gw.proc.kill('SIGTERM');
  const { code } = await gw.exited;
  assert.match(gw.logs(), /drain timeout: 2 requests still in flight/);
  assert.doesNotMatch(gw.logs(), /LeakSanitizer|AddressSanitizer/);
  assert.equal(code, 0);
  await waiting;
});

test('a replacement binds both ports while the old process drains; the old one is no longer ready', async (t) => {
  const upstream = await startEverything(t);
  const old = await startGateway(t, { upstream: upstream.url, config: PASSTHROUGH });
  const client = await mcpClient(t, old.url);
  let progressed;
  const firstProgress = new Promise((resolve) => { progressed = resolve; });
  const call = client.request(
    { method: 'tools/call', params: { name: 'trigger-long-running-operation', arguments: { duration: 3, steps: 6 } } },
    CallToolResultSchema,
    { onprogress: () => progressed() },
  );
  await firstProgress;
  old.proc.kill('SIGTERM');
  await waitFor(() => old.logs().includes('stopped listening'));
  await assert.rejects(fetch(`${old.adminUrl}/readyz`), 'a draining gateway is not ready: its ports are closed');
  await assert.rejects(fetch(old.url, { method: 'POST', body: '{}' }), 'the agent port is closed at once');

  // The same ports, while the old process still runs its call.
  const next = await startGateway(t, {
    upstream: upstream.url,
    config: PASSTHROUGH,
    port: old.port,
    adminPort: old.adminPort,
  });
  assert.equal(old.proc.exitCode, null, 'the old process is still draining');
  const fresh = await mcpClient(t, next.url);
  const echoed = await fresh.callTool({ name: 'echo', arguments: { message: 'after restart' } });
  assert.match(echoed.content[0].text, /after restart/, 'the replacement serves agents on the same port');
  const result = await call;
  assert.match(result.content[0].text, /Long running operation completed/, 'the old process finished its call');
  await client.close().catch(() => {});
  const { code } = await old.exited;
  assert.equal(code, 0);
});

test('idemgw health asks a running gateway for /healthz (the image\'s HEALTHCHECK)', async (t) => {
  const upstream = await startEverything(t);
  const gw = await startGateway(t, { upstream: upstream.url, config: PASSTHROUGH });
  const ok = await run(IDEMGW_BIN, ['health', `127.0.0.1:${gw.adminPort}`]);
  assert.equal(ok.code, 0, ok.stderr);
  const viaEnv = await run(IDEMGW_BIN, ['health'], { env: { ...process.env, IDEMGW_ADMIN_LISTEN: `0.0.0.0:${gw.adminPort}` } });
  assert.equal(viaEnv.code, 0, `0.0.0.0 is asked on loopback: ${viaEnv.stderr}`);
  gw.proc.kill('SIGTERM');
  await gw.exited;
  const down = await run(IDEMGW_BIN, ['health', `127.0.0.1:${gw.adminPort}`]);
  assert.equal(down.code, 1);
  assert.match(down.stderr, /cannot connect/);
  assert.equal((await run(IDEMGW_BIN, ['health', 'nonsense'])).code, 2);
});

test('a configuration warning is logged once per change, not on every SIGHUP', async (t) => {
  const upstream = await startEverything(t);
  const cfg = (over) => ({ ...PASSTHROUGH, database_url: 'none', limits: { max_connections: 1000000 }, ...over });
  const gw = await startGateway(t, { upstream: upstream.url, config: cfg() });
  const base = { listen: `127.0.0.1:${gw.port}`, admin_listen: `127.0.0.1:${gw.adminPort}`, upstream: upstream.url };
  const count = (re) => (gw.logs().match(new RegExp(re.source, 'g')) ?? []).length;
  const lowered = /max_connections lowered from 1000000/;
  const restart = /reload: store\.cache_entries needs a restart/;
  let reloads = 0;
  const reload = async (over) => {
    await fs.writeFile(gw.configPath, toYaml({ ...base, ...cfg(over) }));
    gw.proc.kill('SIGHUP');
    reloads++;
    await waitFor(() => count(/configuration reloaded/) === reloads);
  };
  // far above any open file limit: lowered, with a warning, at the start
  await waitForLog(gw, lowered);
  assert.equal(count(lowered), 1);

  await reload({});
  await reload({});
  assert.equal(count(lowered), 1, 'nothing changed: not said again');

  await reload({ store: { cache_entries: 7 } });
  await reload({ store: { cache_entries: 7 } });
  assert.equal(count(restart), 1, 'a restart-only change is named once');
  assert.equal(count(lowered), 1);

  await reload({ store: { cache_entries: 7 }, limits: { max_connections: 900000 } });
  assert.equal(count(/max_connections lowered from 900000/), 1, 'a changed warning is said');
  await reload({});
  await reload({ store: { cache_entries: 7 } });
  assert.equal(count(restart), 2, 'gone and back: said again');
});
