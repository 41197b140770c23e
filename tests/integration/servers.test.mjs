// servers: one gateway in front of several MCP servers, each at a path of its own, with the
// same tool name on each. Three servers (two Streamable HTTP, one stdio) must behave as three
// gateways would: a call runs once per server and replays its own server's answer, one
// server down leaves the others serving, a reload adds and removes servers while calls run.
// Their figures are apart too: /metrics labels each server's series, /readyz names the
// servers that are down.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import path from 'node:path';
import { Client as V2Client, StreamableHTTPClientTransport as V2Transport } from '@modelcontextprotocol/client';
import {
  IDEMGW_BIN, NODE, TESTS, createDatabase, mcpClient, pollingCall, postgresOnly, rawSession, readLedger, replayMarker, run, startGateway,
  startRefundServer, startV2Server, tempDir, toYaml, toolText, waitFor, waitForLedger, waitForLog,
} from './lib/harness.mjs';

/** /metrics: its text, and a map of 'name{labels}' (or 'name') to its value. */
async function scrape(gw) {
  const text = await (await fetch(`${gw.adminUrl}/metrics`)).text();
  const series = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    series.set(line.slice(0, i), Number(line.slice(i + 1)));
  }
  return { text, series };
}

/** GET /readyz: {status, body}. */
async function readyz(gw) {
  const res = await fetch(`${gw.adminUrl}/readyz`);
  return { status: res.status, body: await res.json() };
}

const LEDGER_SERVER = path.join(TESTS, 'fixtures/ledger-stdio.mjs');
const TOOLS = { issue_refund: { class: 'non_idempotent' }, slow_refund: { class: 'non_idempotent' } };

/** Three servers behind one gateway: {gw, billing, payments, ledgerFile, url(name), cfg}. */
async function threeServers(t, { config = {}, databaseUrl } = {}) {
  const billing = await startRefundServer(t);
  const payments = await startRefundServer(t);
  const dir = await tempDir(t, 'idemgw-servers-');
  const ledgerFile = path.join(dir, 'ledger.jsonl');
  const servers = {
    billing: { path: '/billing/mcp', upstream: billing.url },
    payments: { path: '/payments/mcp', upstream: payments.url },
    ledger: { path: '/ledger/mcp', upstream: { command: [NODE, LEDGER_SERVER], env: { LEDGER: ledgerFile } } },
  };
  const cfg = { subject: { static: 'team' }, tools: TOOLS, servers, ...config };
  const db = databaseUrl ?? await createDatabase();
  const gw = await startGateway(t, { databaseUrl: db, config: cfg });
  const url = (name) => `http://127.0.0.1:${gw.port}/${name}/mcp`;
  return { gw, billing, payments, ledgerFile, url, cfg, db };
}

const refunds = (ledger, order) => ledger.filter((e) => e.tool === 'issue_refund' && e.order_id === order);

test('three servers, the same tool on each: every call runs once per server and replays its own answer', async (t) => {
  const { gw, billing, payments, ledgerFile, url } = await threeServers(t);
  const args = { order_id: 'ord-many', amount_cents: 700 };
  // payments runs one call first, so its answer to the same call (refund r-2) differs from
  // billing's (r-1) and the stdio server's (its pid): a replay from the wrong server shows
  const warm = await mcpClient(t, url('payments'));
  await warm.callTool({ name: 'issue_refund', arguments: { order_id: 'warm-up', amount_cents: 1 } });
  const first = {};
  for (const name of ['billing', 'payments', 'ledger']) {
    const c = await mcpClient(t, url(name));
    const r = await c.callTool({ name: 'issue_refund', arguments: args });
    assert.ok(!replayMarker(r), `${name}: the first call runs`);
    first[name] = toolText(r);
  }
  assert.equal(new Set(Object.values(first)).size, 3, `three different answers: ${JSON.stringify(first)}`);
  // the same call again on each: each server's own answer, never another's
  for (const name of ['billing', 'payments', 'ledger']) {
    const c = await mcpClient(t, url(name));
    const r = await c.callTool({ name: 'issue_refund', arguments: args });
    assert.ok(replayMarker(r), `${name}: a replay`);
    assert.equal(toolText(r), first[name], `${name}: its own first answer`);
  }
  assert.equal(refunds(await readLedger(billing.ledger), 'ord-many').length, 1, 'billing ran it once');
  assert.equal(refunds(await readLedger(payments.ledger), 'ord-many').length, 1, 'payments ran it once');
  assert.equal((await waitForLedger(ledgerFile, 1)).length, 1, 'the stdio server ran it once');
  // the log lines say which server each call was on
  for (const name of ['billing', 'payments', 'ledger']) {
    assert.match(gw.logs(), new RegExp(`"server":"${name}".*"outcome":"replay"`));
    // each server's catalogue is its own, and says whose it is
    assert.match(gw.logs(), new RegExp(`"server":"${name}","tool":"get_ledger|"server":"${name}","tool":"echo`));
  }
});

test('servers: a path no server has is 404; other paths of a server are relayed under its prefix', async (t) => {
  const { gw } = await threeServers(t);
  const miss = await fetch(`http://127.0.0.1:${gw.port}/mcp`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
  });
  assert.equal(miss.status, 404);
  assert.match((await miss.json()).error.message, /no MCP server of this gateway is at \/mcp/);
  // /billing/other reaches the billing server as /other (the fixture answers 404 there itself)
  const other = await fetch(`http://127.0.0.1:${gw.port}/billing/other`);
  await other.arrayBuffer();
  assert.equal(other.status, 404);
  await waitForLog(gw, /"path":"\/other".*"status":404/);
});

test('servers: one server\'s upstream down fails its calls only', async (t) => {
  const { billing, url } = await threeServers(t);
  billing.proc.kill('SIGKILL');
  await billing.exited;
  const down = await rawSession(t, url('billing')).catch((e) => e);
  assert.ok(down instanceof Error && /HTTP 50[24]/.test(down.message), `billing is down: ${down}`);
  for (const name of ['payments', 'ledger']) {
    const c = await mcpClient(t, url(name));
    const r = await c.callTool({ name: 'issue_refund', arguments: { order_id: `up-${name}`, amount_cents: 1 } });
    assert.ok(!r.isError, `${name} serves: ${toolText(r)}`);
  }
});

test('servers: /metrics labels each server\'s series, the same tool on two servers apart', async (t) => {
  const { gw, url } = await threeServers(t);
  const args = { order_id: 'ord-figures', amount_cents: 9 };
  const billing = await rawSession(t, url('billing'));
  await billing.call('issue_refund', args, { id: 'b1' });
  await billing.call('issue_refund', args, { id: 'b2' }); // a duplicate: replayed
  const payments = await rawSession(t, url('payments'));
  await payments.call('issue_refund', args, { id: 'p1' });
  const ledger = await mcpClient(t, url('ledger'));
  await ledger.callTool({ name: 'issue_refund', arguments: args });
  const calls = (server, outcome) =>
    `idemgw_tool_calls_total{server="${server}",tool="issue_refund",class="non_idempotent",outcome="${outcome}"}`;
  // counted as each exchange ends, which may come just after its answer
  const { text, series } = await waitFor(async () => {
    const m = await scrape(gw);
    return m.series.get(calls('ledger', 'executed')) === 1 && m.series.get(calls('billing', 'replay')) === 1 ? m : null;
  }, { what: 'the calls to be counted' });
  assert.equal(series.get(calls('billing', 'executed')), 1);
  assert.equal(series.get(calls('payments', 'executed')), 1);
  assert.equal(series.get(calls('payments', 'replay')), undefined, 'the replay was billing\'s alone');
  const dups = [...series].filter(([k]) => k.startsWith('idemgw_duplicates_total{'));
  assert.equal(dups.length, 1, `one duplicate series: ${JSON.stringify(dups)}`);
  assert.match(dups[0][0], /^idemgw_duplicates_total\{server="billing",tool="issue_refund",source="[a-z_]+"\}$/);
  assert.equal(dups[0][1], 1);
  // the request histogram per server (a server with no request yet among them), never the
  // unlabelled totals beside them: a sum over the label would count them twice
  assert.equal(series.get('idemgw_request_duration_seconds_count{server="billing",outcome="replay"}'), 1);
  assert.equal(series.get('idemgw_request_duration_seconds_count{server="payments",outcome="replay"}'), 0);
  assert.ok(series.get('idemgw_request_duration_seconds_count{server="payments",outcome="executed"}') >= 1);
  assert.doesNotMatch(text, /^idemgw_request_duration_seconds_\w+\{(outcome|le)=/m);
  assert.doesNotMatch(text, /^idemgw_(tool_calls|duplicates)_total\{tool=/m);
  // the stdio server's children, by server
  assert.ok(series.get('idemgw_upstream_children{server="ledger"}') >= 1, 'the ledger session\'s child');
  assert.doesNotMatch(text, /^idemgw_upstream_children /m);
  // and Prometheus reads it
  const dir = await tempDir(t, 'idemgw-servers-prom-');
  await fs.writeFile(path.join(dir, 'metrics.txt'), text);
  const lint = await run('sh', ['-c', `promtool check metrics < ${path.join(dir, 'metrics.txt')}`]);
  assert.equal(lint.code, 0, `${lint.stdout}${lint.stderr}`);
});

test('servers: /readyz names the servers whose upstream is down and stays ready for the others', async (t) => {
  const { gw, billing, payments, url } = await threeServers(t);
  const before = await readyz(gw);
  assert.equal(before.status, 200);
  assert.deepEqual(before.body, {
    ready: true, upstream: true, store: 'up',
    servers: { billing: 'up', payments: 'up', ledger: 'up' }, servers_down: [], draining: false,
  });
  billing.proc.kill('SIGKILL');
  await billing.exited;
  const one = await readyz(gw);
  assert.equal(one.status, 200, 'the other servers still serve: ready');
  assert.deepEqual(one.body, {
    ready: true, upstream: false, store: 'up',
    servers: { billing: 'down', payments: 'up', ledger: 'up' }, servers_down: ['billing'], draining: false,
  });
  // its calls fail, counted as its upstream's errors alone
  const failed = await rawSession(t, url('billing')).catch((e) => e);
  assert.ok(failed instanceof Error && /HTTP 50[24]/.test(failed.message), `billing is down: ${failed}`);
  const { series } = await waitFor(async () => {
    const m = await scrape(gw);
    return m.series.get('idemgw_upstream_errors_total{server="billing"}') >= 1 ? m : null;
  }, { what: 'billing\'s upstream error to be counted' });
  assert.equal(series.get('idemgw_upstream_errors_total{server="payments"}'), 0);
  assert.equal(series.get('idemgw_upstream_errors_total'), undefined, 'no unlabelled total beside them');
  payments.proc.kill('SIGKILL');
  await payments.exited;
  const two = await readyz(gw);
  assert.equal(two.status, 200, 'the stdio server has nothing to connect to: it serves');
  assert.deepEqual(two.body.servers_down, ['billing', 'payments']);
  assert.equal(two.body.ready, true);
});

test('servers: the OAuth metadata of a server is reached through its path', async (t) => {
  const port0 = await import('./lib/harness.mjs').then((h) => h.freePort());
  const resource = `http://127.0.0.1:${port0}/billing/mcp`;
  const billing = await startRefundServer(t, { oauth: { resource, authorizationServer: 'https://as.test' } });
  const payments = await startRefundServer(t);
  const gw = await startGateway(t, {
    port: port0,
    databaseUrl: await createDatabase(),
    config: {
      subject: { static: 'team' }, tools: TOOLS,
      servers: { billing: { path: '/billing/mcp', upstream: billing.url }, payments: { path: '/payments/mcp', upstream: payments.url } },
    },
  });
  const res = await fetch(`http://127.0.0.1:${gw.port}/.well-known/oauth-protected-resource/billing/mcp`);
  assert.equal(res.status, 200);
  assert.deepEqual(await res.json(), { resource, authorization_servers: ['https://as.test'] });
  const none = await fetch(`http://127.0.0.1:${gw.port}/.well-known/oauth-protected-resource/payments/mcp`);
  await none.arrayBuffer();
  assert.equal(none.status, 404, 'the payments server has no metadata: its own 404');
});

test('servers: a reload that removes a server lets its call in flight finish, then its path is 404', async (t) => {
  const { gw, billing, url, cfg, db } = await threeServers(t);
  const s = await rawSession(t, url('billing'));
  const inflight = s.call('slow_refund', { order_id: 'ord-reload', amount_cents: 5, delay_ms: 1500 }, { id: 'r1' });
  // the fixture appends when the call starts, and answers delay_ms later
  await waitFor(async () => (await readLedger(billing.ledger)).some((e) => e.tool === 'slow_refund') || null,
    { what: 'the slow call to reach the billing server' });
  const { billing: _gone, ...rest } = cfg.servers;
  await fs.writeFile(gw.configPath, toYaml({
    listen: `127.0.0.1:${gw.port}`, admin_listen: `127.0.0.1:${gw.adminPort}`,
    database_url: db,
    ...cfg, servers: rest,
  }));
  gw.proc.kill('SIGHUP');
  await waitForLog(gw, /configuration reloaded/);
  const r = await inflight;
  assert.equal(r.status, 200);
  assert.ok(r.message?.result && !r.message.result.isError, `the call in flight finished: ${r.body}`);
  assert.equal((await readLedger(billing.ledger)).filter((e) => e.tool === 'slow_refund').length, 1, 'run once');
  await waitForLog(gw, /server billing removed by a reload: its last request has ended/);
  const after = await fetch(url('billing'), { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{}' });
  await after.arrayBuffer();
  assert.equal(after.status, 404);
  // the other servers kept serving through the reload
  const c = await mcpClient(t, url('payments'));
  assert.ok(!(await c.callTool({ name: 'issue_refund', arguments: { order_id: 'after-reload', amount_cents: 1 } })).isError);
  // /readyz probes the servers of the new configuration
  assert.deepEqual((await readyz(gw)).body.servers, { payments: 'up', ledger: 'up' });
});

test('servers: a stdio server removed by a reload: its child counts in /metrics until its last call ends, then stops', async (t) => {
  const { gw, ledgerFile, url, cfg, db } = await threeServers(t);
  const s = await rawSession(t, url('ledger'));
  // the call answers when the test says so, not after a delay a slow run could outlast
  const release = path.join(path.dirname(ledgerFile), 'release');
  const inflight = s.call('slow_refund', { order_id: 'ord-stdio-gone', amount_cents: 4, wait_for: release }, { id: 'g1' });
  t.after(() => fs.writeFile(release, '').catch(() => {}));
  const [{ pid }] = await waitForLedger(ledgerFile, 1);
  // the gateway's own catalogue fetch runs in a child of its own until the tool list is in
  const children = async () => (await scrape(gw)).series.get('idemgw_upstream_children{server="ledger"}');
  await waitFor(async () => (await children()) === 1 || null, { what: 'the catalogue\'s child to end, the call\'s alone' });
  const { ledger: _gone, ...rest } = cfg.servers;
  await fs.writeFile(gw.configPath, toYaml({
    listen: `127.0.0.1:${gw.port}`, admin_listen: `127.0.0.1:${gw.adminPort}`, database_url: db, ...cfg, servers: rest,
  }));
  gw.proc.kill('SIGHUP');
  await waitForLog(gw, /configuration reloaded/);
  assert.equal(await children(), 1, 'the removed server\'s child, still serving its call');
  await fs.writeFile(release, '');
  const r = await inflight;
  assert.equal(r.status, 200, r.body);
  await waitForLog(gw, /server ledger removed by a reload: its last request has ended/);
  assert.equal(await children(), undefined, 'gone with its backend');
  await waitFor(() => { try { process.kill(pid, 0); return null; } catch { return true; } }, { what: `child ${pid} to exit` });
});

test('servers: a reload adds a server and moves one to a new upstream; the others keep their sessions and children', async (t) => {
  const { gw, billing, payments, ledgerFile, url, cfg, db } = await threeServers(t);
  const moved = await startRefundServer(t);
  const ledger = await rawSession(t, url('ledger'));
  await ledger.call('issue_refund', { order_id: 'before', amount_cents: 1 });
  const [{ pid }] = await waitForLedger(ledgerFile, 1);
  await fs.writeFile(gw.configPath, toYaml({
    listen: `127.0.0.1:${gw.port}`, admin_listen: `127.0.0.1:${gw.adminPort}`, database_url: db, ...cfg,
    servers: { ...cfg.servers, payments: { path: '/payments/mcp', upstream: moved.url }, refunds: { path: '/refunds/mcp', upstream: billing.url } },
  }));
  gw.proc.kill('SIGHUP');
  await waitForLog(gw, /configuration reloaded/);
  assert.match(gw.logs(), /reload: server refunds: added, with upstream/);
  assert.match(gw.logs(), /reload: server payments: new upstream/);
  // the stdio server's session and child went on through the reload
  const r = await ledger.call('issue_refund', { order_id: 'after', amount_cents: 1 });
  assert.equal(r.status, 200, r.body);
  const entries = await waitForLedger(ledgerFile, 2);
  assert.equal(entries[1].pid, pid, 'the same child');
  // payments now runs on the new upstream; the added server answers at its path
  const p = await mcpClient(t, url('payments'));
  await p.callTool({ name: 'issue_refund', arguments: { order_id: 'moved', amount_cents: 2 } });
  assert.equal(refunds(await readLedger(moved.ledger), 'moved').length, 1);
  assert.equal(refunds(await readLedger(payments.ledger), 'moved').length, 0);
  const added = await mcpClient(t, url('refunds'));
  await added.callTool({ name: 'issue_refund', arguments: { order_id: 'added', amount_cents: 3 } });
  assert.equal(refunds(await readLedger(billing.ledger), 'added').length, 1);
});

test('servers: a reload that cannot open a new server changes nothing', async (t) => {
  const { gw, url, cfg, db } = await threeServers(t);
  await fs.writeFile(gw.configPath, toYaml({
    listen: `127.0.0.1:${gw.port}`, admin_listen: `127.0.0.1:${gw.adminPort}`, database_url: db, ...cfg,
    servers: { ...cfg.servers, broken: { path: '/broken/mcp', upstream: 'http://no-such-host.invalid/mcp' } },
  }));
  gw.proc.kill('SIGHUP');
  await waitForLog(gw, /reload failed: keeping the running configuration/);
  assert.match(gw.logs(), /reload: server broken: cannot resolve upstream host no-such-host.invalid/);
  const none = await fetch(url('broken'), { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{}' });
  await none.arrayBuffer();
  assert.equal(none.status, 404);
  const c = await mcpClient(t, url('billing'));
  assert.ok(!(await c.callTool({ name: 'issue_refund', arguments: { order_id: 'still', amount_cents: 1 } })).isError);
});

test('servers with two workers: a resuming GET handed to the other worker reaches its server there', postgresOnly('two workers are two processes on one store'), async (t) => {
  // the hand-off sends the request as the agent sent it (/billing/mcp), not as the router
  // rewrote it for the upstream (/mcp), so the worker that takes it routes it to billing again
  const billing = await startRefundServer(t);
  const payments = await startRefundServer(t);
  const gw = await startGateway(t, {
    databaseUrl: await createDatabase(),
    config: {
      workers: 2, subject: { static: 'team' }, tools: { polling_refund: { class: 'non_idempotent' } },
      servers: { payments: { path: '/payments/mcp', upstream: payments.url }, billing: { path: '/billing/mcp', upstream: billing.url } },
    },
  });
  const at = { url: `http://127.0.0.1:${gw.port}/billing/mcp` };
  await Promise.all([...Array(8).keys()].map(async (i) => {
    const s = await rawSession(t, at.url);
    const args = { order_id: `ord-hand-${i}`, amount_cents: 20 + i, delay_ms: 300 };
    const result = await pollingCall(at, s, args, `hand-${i}`);
    assert.match(toolText(result), new RegExp(`^Refunded ${20 + i} cents on order ord-hand-${i} `));
  }));
  assert.equal((await readLedger(billing.ledger)).length, 8, 'each call ran once, on billing');
  assert.equal((await readLedger(payments.ledger)).length, 0);
  t.diagnostic(`GETs handed between workers: ${(gw.logs().match(/stream resume handed to worker/g) ?? []).length} of 8`);
});

test('servers of both eras: v2 clients (auto, pinned to 2026-07-28) and a 1.x client, each call once per server', async (t) => {
  // a @modelcontextprotocol/server 2.x server and an SDK 1.x server behind one gateway, as a
  // new user would put them; the v2 client negotiates 2026-07-28 with the v2 server through
  // its path and 2025-11-25 with the 1.x server through the other
  const modern = await startV2Server(t);
  const classic = await startRefundServer(t);
  const gw = await startGateway(t, {
    databaseUrl: await createDatabase(),
    config: {
      subject: { static: 'team' }, tools: TOOLS,
      servers: { modern: { path: '/modern/mcp', upstream: modern.url }, classic: { path: '/classic/mcp', upstream: classic.url } },
    },
  });
  const url = (name) => `http://127.0.0.1:${gw.port}/${name}/mcp`;
  const v2 = async (name, versionNegotiation) => {
    const c = new V2Client({ name: `v2-${name}`, version: '1.0.0' }, { versionNegotiation });
    await c.connect(new V2Transport(new URL(url(name))));
    t.after(() => c.close().catch(() => {}));
    return c;
  };
  const args = { order_id: 'ord-eras', amount_cents: 42 };
  const answers = {};
  for (const name of ['modern', 'classic']) {
    const auto = await v2(name, { mode: 'auto' });
    assert.equal(auto.getNegotiatedProtocolVersion(), name === 'modern' ? '2026-07-28' : '2025-11-25', `${name}: what the v2 client negotiates`);
    const first = await auto.callTool({ name: 'issue_refund', arguments: args });
    assert.equal(replayMarker(first), undefined, `${name}: the first call runs`);
    const pinned = name === 'modern' ? await v2(name, { mode: { pin: '2026-07-28' } }) : null;
    const again = await (pinned ?? auto).callTool({ name: 'issue_refund', arguments: args });
    assert.ok(replayMarker(again), `${name}: the repeat from a v2 client is replayed: ${JSON.stringify(again)}`);
    assert.equal(toolText(again), toolText(first));
    const old = await mcpClient(t, url(name));
    const third = await old.callTool({ name: 'issue_refund', arguments: args });
    assert.ok(replayMarker(third), `${name}: the repeat from a 1.x client is replayed`);
    assert.equal(toolText(third), toolText(first));
    answers[name] = toolText(first);
  }
  const ran = async (ledger) => (await readLedger(ledger)).filter((e) => e.tool === 'issue_refund' && e.order_id === 'ord-eras').length;
  assert.equal(await ran(modern.ledger), 1, 'once on the v2 server');
  assert.equal(await ran(classic.ledger), 1, 'once on the 1.x server');
  assert.match(answers.classic, /^Refunded 42 cents on order ord-eras/);
  assert.notEqual(answers.modern, '', 'the v2 server answered');
});

test('servers: check-config names duplicate paths and bad entries with file:line', async (t) => {
  const dir = await tempDir(t, 'idemgw-servers-cfg-');
  const file = path.join(dir, 'bad.yaml');
  await fs.writeFile(file, [
    'database_url: none',
    'servers:',
    '  billing:',
    '    path: /billing/mcp',
    '    upstream: http://127.0.0.1:1/mcp',
    '  payments:',
    '    path: /Billing/mcp',
    '    upstream: http://127.0.0.1:2/mcp',
    '  "two words":',
    '    path: /x/mcp',
    '    upstream: http://127.0.0.1:3/mcp',
    '  nopath:',
    '    upstream: http://127.0.0.1:4/mcp',
    '',
  ].join('\n'));
  const r = await run(IDEMGW_BIN, ['--check-config', '-c', file]);
  assert.notEqual(r.code, 0);
  assert.match(r.stderr, new RegExp(`${file}:6: servers.payments.path: /Billing/mcp is already server billing's path \\(line 3\\)`));
  assert.match(r.stderr, new RegExp(`${file}:9: servers: 'two words' is not a server name`));
  assert.match(r.stderr, new RegExp(`${file}:12: servers.nopath: path is required`));
  const twice = path.join(dir, 'twice.yaml');
  await fs.writeFile(twice, 'servers:\n  a: {path: /a/mcp, upstream: "http://127.0.0.1:2/mcp"}\n  a: {path: /b/mcp, upstream: "http://127.0.0.1:3/mcp"}\n');
  const r1 = await run(IDEMGW_BIN, ['--check-config', '-c', twice]);
  assert.notEqual(r1.code, 0);
  assert.match(r1.stderr, new RegExp(`${twice}:3: duplicate key`), 'a name given twice');
  const both = path.join(dir, 'both.yaml');
  await fs.writeFile(both, `upstream: http://127.0.0.1:1/mcp\nservers:\n  a: {path: /a/mcp, upstream: "http://127.0.0.1:2/mcp"}\n`);
  const r2 = await run(IDEMGW_BIN, ['--check-config', '-c', both]);
  assert.notEqual(r2.code, 0);
  assert.match(r2.stderr, /upstream and servers are both given/);
});
