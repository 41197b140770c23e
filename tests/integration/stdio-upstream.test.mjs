// The stdio upstream: `upstream: {command: [...]}` makes the gateway spawn the MCP server
// itself. Each failure the stdio bridges are known for has a test here: a child per session
// that is never reaped, a GET stream that kills the child or keeps it forever, a failed spawn
// that takes the gateway down, shared children mixing sessions' ids, the gateway's own
// environment reaching a third-party server.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import path from 'node:path';
import { Client as V2Client, StreamableHTTPClientTransport as V2Transport } from '@modelcontextprotocol/client';
import {
  IDEMGW_BIN, NODE, TESTS, createDatabase, mcpClient, rawSession, readLedger, replayMarker, startGateway, tempDir,
  run, toolText, waitFor, waitForLedger, waitForLog,
} from './lib/harness.mjs';

const LEDGER_SERVER = path.join(TESTS, 'fixtures/ledger-stdio.mjs');
const TINY_SERVER = path.join(TESTS, 'fixtures/tiny-stdio.sh');
const BIN = path.join(TESTS, 'node_modules/.bin');
const ACCEPT = 'application/json, text/event-stream';

/** A gateway in front of the ledger fixture; {gw, ledger}. */
async function ledgerGateway(t, { sessions = 'per_session', upstream = {}, config = {}, env = {} } = {}) {
  const dir = await tempDir(t, 'idemgw-stdio-');
  const ledger = path.join(dir, 'ledger.jsonl');
  const gw = await startGateway(t, {
    upstream: { command: [NODE, LEDGER_SERVER], env: { LEDGER: ledger }, sessions, ...upstream },
    databaseUrl: await createDatabase(),
    config,
    env,
  });
  return { gw, ledger };
}

const alive = (pid) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

/** The gateway's children that are zombies (exited, not reaped). */
async function zombies(pid) {
  const out = [];
  for (const d of await fs.readdir('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    const stat = await fs.readFile(`/proc/${d}/stat`, 'utf8').catch(() => '');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (Number(f[1]) === pid && f[0] === 'Z') out.push(Number(d));
  }
  return out;
}

/** Children of pid (any state). */
async function children(pid) {
  const out = [];
  for (const d of await fs.readdir('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    const stat = await fs.readFile(`/proc/${d}/stat`, 'utf8').catch(() => '');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (Number(f[1]) === pid) out.push(Number(d));
  }
  return out;
}

const rssKiB = async (pid) => Number(/VmRSS:\s+(\d+)/.exec(await fs.readFile(`/proc/${pid}/status`, 'utf8'))[1]);

async function post(url, body, headers = {}) {
  const res = await fetch(url, {
    method: 'POST',
    headers: { Accept: ACCEPT, 'Content-Type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

const initBody = (id = 1) => ({
  jsonrpc: '2.0', id, method: 'initialize',
  params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
});

for (const sessions of ['per_session', 'shared']) {
  test(`${sessions}: a protected call runs once across sessions and clients of both SDK eras`, async (t) => {
    const { gw, ledger } = await ledgerGateway(t, { sessions });
    await waitForLog(gw, /tool catalogue: \d+ tools listed by the upstream/);
    const v1 = await mcpClient(t, gw.url);
    const v2 = new V2Client({ name: 'v2', version: '1.0.0' });
    await v2.connect(new V2Transport(new URL(gw.url)));
    t.after(() => v2.close().catch(() => {}));

    const args = { order_id: `ord-${sessions}`, amount_cents: 700 };
    const first = await v1.callTool({ name: 'issue_refund', arguments: args });
    assert.match(toolText(first), /Refunded 700 on ord-/);
    assert.equal(replayMarker(first), undefined);
    const again = await v2.callTool({ name: 'issue_refund', arguments: args });
    assert.ok(replayMarker(again), 'the other session, other SDK, gets the replay');
    assert.equal(toolText(again), toolText(first));
    assert.equal((await readLedger(ledger)).length, 1, 'executed once');

    const pid1 = toolText(await v1.callTool({ name: 'whoami', arguments: {} }));
    const pid2 = toolText(await v2.callTool({ name: 'whoami', arguments: {} }));
    if (sessions === 'shared') assert.equal(pid1, pid2, 'one child serves both sessions');
    else assert.notEqual(pid1, pid2, 'each session has its own child');
  });
}

test('shared: eight sessions with colliding request ids each get their own answers', async (t) => {
  const { gw } = await ledgerGateway(t, { sessions: 'shared' });
  const clients = await Promise.all(Array.from({ length: 8 }, () => rawSession(t, gw.url)));
  // every session uses the same ids, concurrently, with answers that arrive out of order
  for (const round of [1, 2, 3]) {
    const answers = await Promise.all(clients.map((s, i) =>
      s.call('echo', { text: `session ${i} round ${round}`, delay_ms: (8 - i) * 15 }, { id: round })));
    answers.forEach((a, i) => {
      assert.equal(a.status, 200);
      assert.equal(a.message.id, round);
      assert.equal(toolText(a.message.result), `session ${i} round ${round}`);
    });
  }
  const pids = new Set(await Promise.all(clients.map(async (s) => toolText((await s.call('whoami', {})).message.result))));
  assert.equal(pids.size, 1, 'all eight share one child');
});

test('progress notifications reach the call that asked for them, with its own token', async (t) => {
  const { gw } = await ledgerGateway(t, { sessions: 'shared' });
  const a = await mcpClient(t, gw.url);
  const b = await mcpClient(t, gw.url);
  const seen = { a: [], b: [] };
  const [ra, rb] = await Promise.all([
    a.callTool({ name: 'progress', arguments: { steps: 3 } }, undefined, { onprogress: (p) => seen.a.push(p.progress) }),
    b.callTool({ name: 'progress', arguments: { steps: 4 } }, undefined, { onprogress: (p) => seen.b.push(p.progress) }),
  ]);
  assert.equal(toolText(ra), 'done');
  assert.equal(toolText(rb), 'done');
  assert.deepEqual(seen.a, [1, 2, 3]);
  assert.deepEqual(seen.b, [1, 2, 3, 4]);
});

// shared: stdio-tenants.test.mjs (a question reaches a caller only when no other can be meant)
for (const sessions of ['per_session']) {
  test(`${sessions}: elicitation inside a protected call reaches the client that made it`, async (t) => {
    const { gw, ledger } = await ledgerGateway(t, { sessions });
    const asked = [];
    const { Client } = await import('@modelcontextprotocol/sdk/client/index.js');
    const { StreamableHTTPClientTransport } = await import('@modelcontextprotocol/sdk/client/streamableHttp.js');
    const { ElicitRequestSchema } = await import('@modelcontextprotocol/sdk/types.js');
    const bystander = await mcpClient(t, gw.url);
    const client = new Client({ name: 'eliciting', version: '1.0.0' }, { capabilities: { elicitation: {} } });
    client.setRequestHandler(ElicitRequestSchema, async (req) => {
      asked.push(req.params.message);
      return { action: 'accept', content: { ok: true } };
    });
    await client.connect(new StreamableHTTPClientTransport(new URL(gw.url)));
    t.after(() => client.close().catch(() => {}));
    // the call that asks is older than the bystander's, which is newest when the server
    // asks: the request goes to the client that declared elicitation
    const go = path.join(path.dirname(ledger), 'go');
    const asking = client.callTool({ name: 'confirm_refund', arguments: { order_id: 'ord-ask', amount_cents: 42, wait_for: go } });
    await waitForLedger(ledger, 1);
    const slow = bystander.callTool({ name: 'slow_refund', arguments: { order_id: 'ord-bystander', amount_cents: 1, delay_ms: 1500 } });
    await waitForLedger(ledger, 2);
    await fs.writeFile(go, '');
    const r = await asking;
    assert.match(toolText(r), /Refunded 42 on ord-ask/);
    assert.deepEqual(asked, ['Refund 42 on ord-ask?']);
    assert.match(toolText(await slow), /Refunded 1 on ord-bystander/);
    assert.deepEqual((await readLedger(ledger)).map((e) => e.tool).sort(), ['confirm_refund', 'confirm_waiting', 'slow_refund']);
  });
}

test('a child killed mid-call: the call is recorded unknown and never run again; its session is gone', async (t) => {
  const { gw, ledger } = await ledgerGateway(t, { config: { subject: { header: 'X-Subject' } } });
  const s = await rawSession(t, gw.url, { headers: { 'X-Subject': 'alice' } });
  const args = { order_id: 'ord-killed', amount_cents: 900, delay_ms: 60000 };
  const pending = s.call('slow_refund', args);
  const read = s.call('echo', { text: 'never', delay_ms: 60000 });
  const [entry] = await waitForLedger(ledger, 1);
  process.kill(entry.pid, 'SIGKILL');
  // every call in flight is answered at once: the protected one as outcome unknown (it may
  // have run), the read with an error for its id; neither waits for a client's timeout
  const first = await pending;
  assert.equal(first.message?.result?._meta?.['idemgw/status']?.code, 'outcome_unknown', first.body);
  const lost = await read;
  assert.equal(lost.message?.error?.code, -32603, lost.body);
  await waitForLog(gw, /stdio upstream .* ended by signal 9/);

  const gone = await s.request('tools/list', {});
  assert.equal(gone.status, 404, 'the dead child\'s session answers 404, so clients re-initialize');

  const again = await rawSession(t, gw.url, { headers: { 'X-Subject': 'alice' } });
  const retry = await again.call('slow_refund', { ...args, delay_ms: 10 });
  // delay_ms is an argument: the retry with the same arguments is what counts
  const sameRetry = await again.call('slow_refund', args);
  assert.equal(sameRetry.status, 200);
  assert.match(toolText(sameRetry.message.result), /NOT executed again/);
  assert.equal(retry.status, 200);
  const ran = (await readLedger(ledger)).filter((e) => e.order_id === 'ord-killed' && e.tool === 'slow_refund');
  assert.equal(ran.length, 2, 'the killed call ran once, the call with other arguments once; the retry never');
});

test('a child that never answers initialize: 503 with why once start_timeout is out, and the child is stopped', async (t) => {
  const gw = await startGateway(t, {
    // what it says on stderr is the likeliest why; the call deadline is not the start's
    upstream: { command: [NODE, '-e', 'console.error("fetching the package..."); process.stdin.resume()'], grace: '1s', start_timeout: '1s' },
    databaseUrl: await createDatabase(),
    config: { timeouts: { upstream: '60s' } },
  });
  const r = await post(gw.url, initBody());
  assert.equal(r.status, 503, r.text);
  assert.match(JSON.parse(r.text).error.message, /no answer to initialize within 1s of its start; its stderr ended: fetching the package\.\.\./);
  await waitForLog(gw, /stopping pid \d+: no answer to initialize within 1s/);
  await waitFor(async () => (await children(gw.proc.pid)).length === 0, { what: 'the silent child to be gone' });
});

test('children waiting behind one that never answers initialize hear its why at once, without starting', async (t) => {
  const gw = await startGateway(t, {
    upstream: { command: [NODE, '-e', 'console.error("fetching the package..."); process.stdin.resume()'], grace: '1s', start_timeout: '1s' },
    databaseUrl: await createDatabase(),
  });
  // the gateway's own catalogue child starts first; these two sessions' children wait for the
  // command to prove it answers, and once that start times out they end with it
  const [a, b] = await Promise.all([post(gw.url, initBody()), post(gw.url, initBody())]);
  for (const r of [a, b]) {
    assert.equal(r.status, 503, r.text);
    assert.match(JSON.parse(r.text).error.message, /no answer to initialize within 1s of its start/);
  }
  assert.equal((gw.logs().match(/started pid \d+/g) ?? []).length, 1, 'only the first child was started');
});

test('a server that writes its answers without the newline: each is taken as a line after a pause', async (t) => {
  // every answer written with no newline after it, as some servers write their last line
  const server = `
    let buf = '';
    process.stdin.on('data', (d) => {
      buf += d;
      for (let i; (i = buf.indexOf('\\n')) >= 0;) {
        const m = JSON.parse(buf.slice(0, i)); buf = buf.slice(i + 1);
        if (m.id === undefined) continue;
        const result = m.method === 'initialize'
          ? { protocolVersion: '2025-11-25', capabilities: { tools: {} }, serverInfo: { name: 'unended', version: '1' } }
          : m.method === 'tools/list' ? { tools: [] } : { content: [{ type: 'text', text: 'ok ' + m.method }] };
        process.stdout.write(JSON.stringify({ jsonrpc: '2.0', id: m.id, result }));
      }
    });`;
  const gw = await startGateway(t, {
    upstream: { command: [NODE, '-e', server], start_timeout: '20s' },
    databaseUrl: await createDatabase(),
    config: { defaults: { class: 'read' } },
  });
  const s = await rawSession(t, gw.url);
  const r = await s.call('anything', {});
  assert.equal(r.status, 200, r.body);
  assert.equal(toolText(r.message.result), 'ok tools/call');
  await waitForLog(gw, /wrote a message without its newline: taken as a line/);
});

test('a server flooding stderr: a burst and a steady rate reach the log, with the count of what did not', async (t) => {
  const gw = await startGateway(t, {
    upstream: { command: [NODE, '-e', 'for (let i = 0; i < 50000; i++) console.error("noise " + i); process.stdin.resume()'], grace: '1s', start_timeout: '2s' },
    databaseUrl: await createDatabase(),
  });
  const r = await post(gw.url, initBody());
  assert.equal(r.status, 503, r.text);
  assert.match(JSON.parse(r.text).error.message, /its stderr ended: .*noise 49999$/, 'the end of stderr is kept whole for why');
  await waitForLog(gw, /stdio upstream .*: \d+ stderr lines not logged/);
  // per child (the catalogue's own child floods too): what was logged and what was counted
  const per = new Map();
  for (const line of gw.logs().split('\n')) {
    const pid = /"server_pid":(\d+)/.exec(line)?.[1] ?? /pid (\d+): \d+ stderr lines not logged/.exec(line)?.[1];
    if (!pid) continue;
    const p = per.get(pid) ?? { logged: 0, skipped: 0 };
    if (/stderr: noise/.test(line)) p.logged++;
    const n = /(\d+) stderr lines not logged/.exec(line);
    if (n) p.skipped += Number(n[1]);
    per.set(pid, p);
  }
  for (const [pid, p] of per) assert.ok(p.logged < 2000, `pid ${pid}: ${p.logged} lines logged`);
  assert.ok([...per.values()].some((p) => p.logged >= 200 && p.logged + p.skipped === 50000),
    `every line of a child that wrote all of them is logged or counted: ${JSON.stringify([...per])}`);
});

test('a child that dies before it answers initialize: 503 with its exit and its stderr', async (t) => {
  const gw = await startGateway(t, {
    upstream: { command: [NODE, '-e', 'console.error("Error: Cannot find module server.js"); process.exit(3)'] },
    databaseUrl: await createDatabase(),
  });
  const r = await post(gw.url, initBody());
  assert.equal(r.status, 503, r.text);
  assert.match(JSON.parse(r.text).error.message, /the server (exited with status 3|closed its output); its stderr ended: Error: Cannot find module server\.js/);
});

test('stdout lines that are not JSON-RPC, and over-long ones, are logged and dropped', async (t) => {
  const { gw } = await ledgerGateway(t, { config: { limits: { max_body: '64KiB' } } });
  const c = await mcpClient(t, gw.url);
  assert.equal(toolText(await c.callTool({ name: 'garbage', arguments: { bytes: 200000 } })), 'ok');
  assert.equal(toolText(await c.callTool({ name: 'echo', arguments: { text: 'still here' } })), 'still here');
  await waitForLog(gw, /wrote a line that is not JSON/);
  await waitForLog(gw, /wrote a line over 65536 bytes, dropped/);
  await waitForLog(gw, /wrote a message whose method is not a string, dropped/);
});

test('a missing program: 503 for that session with why, the gateway serves on', async (t) => {
  const gw = await startGateway(t, {
    upstream: { command: ['/nonexistent/mcp-server'] },
    databaseUrl: await createDatabase(),
  });
  const r = await post(gw.url, initBody());
  assert.equal(r.status, 503);
  assert.match(JSON.parse(r.text).error.message, /cannot start \/nonexistent\/mcp-server: No such file or directory/);
  await waitForLog(gw, /cannot start \/nonexistent\/mcp-server/);
  assert.equal((await fetch(`${gw.adminUrl}/healthz`)).status, 200);
  assert.equal(gw.proc.exitCode, null, 'the gateway is still running');
});

test('max_children: at the limit the least recently used idle session ends; with every child busy, 503 with Retry-After', async (t) => {
  const { gw, ledger } = await ledgerGateway(t, { upstream: { max_children: 2 } });
  await waitForLog(gw, /tool catalogue: \d+ tools listed by the upstream/);
  await waitFor(async () => (await children(gw.proc.pid)).length === 0, { what: 'the catalogue\'s child to go' });
  const go = path.join(path.dirname(ledger), 'go');
  const a = await rawSession(t, gw.url);
  const b = await rawSession(t, gw.url);
  // both children busy: a third session cannot take one
  const busyA = a.call('slow_refund', { order_id: 'ord-a', amount_cents: 1, wait_for: go });
  const busyB = b.call('slow_refund', { order_id: 'ord-b', amount_cents: 1, wait_for: go });
  await waitForLedger(ledger, 2);
  const third = await post(gw.url, initBody());
  assert.equal(third.status, 503);
  assert.ok(Number(third.headers.get('retry-after')) > 0);
  assert.match(third.text, /max_children \(2\) servers are running, each with a call in flight/);
  await fs.writeFile(go, '');
  await Promise.all([busyA, busyB]);
  // b was used last: a, idle, is ended for the newcomer (agents that never DELETE)
  await b.call('whoami', {});
  const fourth = await post(gw.url, initBody());
  assert.equal(fourth.status, 200, fourth.text);
  await waitForLog(gw, new RegExp(`max_children \\(2\\) reached: ending session ${a.sessionId.slice(0, 8)}`));
  assert.equal((await a.call('whoami', {})).status, 404, 'the ended session is gone');
  assert.equal((await b.call('whoami', {})).status, 200, 'the other is kept');
});

test('500 sessions opened and closed: children back to none, no zombies, memory bounded', async (t) => {
  const gw = await startGateway(t, {
    upstream: { command: ['/bin/sh', TINY_SERVER], max_children: 8 },
    databaseUrl: await createDatabase(),
    // under the sanitizer build, freed memory would otherwise sit in its quarantine
    env: { ASAN_OPTIONS: [process.env.ASAN_OPTIONS, 'quarantine_size_mb=0'].filter(Boolean).join(':') },
  });
  const warm = await post(gw.url, initBody());
  await fetch(gw.url, { method: 'DELETE', headers: { 'Mcp-Session-Id': warm.headers.get('mcp-session-id') } });
  await waitFor(async () => (await children(gw.proc.pid)).length === 0, { what: 'the first child to go' });
  const before = await rssKiB(gw.proc.pid);
  for (let i = 0; i < 500; i++) {
    const r = await post(gw.url, initBody());
    if (r.status === 503) { // max_children: the last ones are still being reaped
      await waitFor(async () => (await children(gw.proc.pid)).length < 8, { what: 'a child slot' });
      i--;
      continue;
    }
    assert.equal(r.status, 200, r.text);
    const del = await fetch(gw.url, { method: 'DELETE', headers: { 'Mcp-Session-Id': r.headers.get('mcp-session-id') } });
    assert.equal(del.status, 200);
  }
  await waitFor(async () => (await children(gw.proc.pid)).length === 0, { timeoutMs: 20000, what: 'every child to be reaped' });
  assert.deepEqual(await zombies(gw.proc.pid), []);
  const metrics = await (await fetch(`${gw.adminUrl}/metrics`)).text();
  assert.match(metrics, /^idemgw_upstream_children 0$/m);
  const after = await rssKiB(gw.proc.pid);
  assert.ok(after - before < 8 * 1024, `RSS grew by ${after - before} KiB over 500 sessions`);
});

/** A session on gw with its GET stream open: {sid, h (its headers), pid (its child), ac, get}. */
async function sessionWithGet(gw) {
  const init = await post(gw.url, initBody());
  const sid = init.headers.get('mcp-session-id');
  const h = { Accept: ACCEPT, 'Content-Type': 'application/json', 'Mcp-Session-Id': sid };
  await post(gw.url, { jsonrpc: '2.0', method: 'notifications/initialized' }, h);
  const who = await post(gw.url, { jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'whoami', arguments: {} } }, h);
  const pid = Number(/pid (\d+)/.exec(who.text)[1]);
  const ac = new AbortController();
  const get = await fetch(gw.url, { headers: { Accept: 'text/event-stream', 'Mcp-Session-Id': sid }, signal: ac.signal });
  assert.equal(get.status, 200);
  return { sid, h, pid, ac, get };
}

test('a client that vanishes with its GET stream open: the session and its child are reaped after idle_timeout', async (t) => {
  const { gw } = await ledgerGateway(t, { upstream: { idle_timeout: '1s', grace: '1s' } });
  const { h, pid, ac, get } = await sessionWithGet(gw);
  const ended = get.text().then(() => 'ended', () => 'aborted');
  await waitForLog(gw, /session [0-9a-f]{8}… idle for 1s, ended/, { timeoutMs: 15000 });
  await waitFor(() => !alive(pid), { what: `child ${pid} to exit` });
  assert.equal(await ended, 'ended', 'the GET stream ends with its session');
  const after = await post(gw.url, { jsonrpc: '2.0', id: 3, method: 'tools/list' }, h);
  assert.equal(after.status, 404);
  ac.abort();
});

test('an agent that drops its GET stream and never comes back: its session ends 30 s later, not after idle_timeout', { timeout: 60000 }, async (t) => {
  // the SDK clients close without DELETE; their GET stream going is the sign they left
  const { gw } = await ledgerGateway(t, { upstream: { idle_timeout: '10m', grace: '1s' } });
  const { sid, h, pid, ac } = await sessionWithGet(gw);
  ac.abort();
  await waitForLog(gw, new RegExp(`session ${sid.slice(0, 8)}… idle for 3\\ds, ended`), { timeoutMs: 45000 });
  await waitFor(() => !alive(pid), { what: `child ${pid} to exit` });
  const after = await post(gw.url, { jsonrpc: '2.0', id: 3, method: 'tools/list' }, h);
  assert.equal(after.status, 404);
});

test('DELETE ends the child\'s whole process group', async (t) => {
  const { gw } = await ledgerGateway(t, { upstream: { grace: '2s' } });
  const s = await rawSession(t, gw.url);
  const sleeper = Number(toolText((await s.call('spawn_sleeper', {})).message.result));
  assert.ok(alive(sleeper));
  await s.close();
  await waitFor(() => !alive(sleeper), { what: `the server's own child ${sleeper} to end` });
});

/** Whether pid has ended (a zombie nobody reaps has ended too). */
async function ended(pid) {
  const stat = await fs.readFile(`/proc/${pid}/stat`, 'utf8').catch(() => null);
  return !stat || stat.slice(stat.lastIndexOf(')') + 2).startsWith('Z');
}

test('a server that crashes leaves no helper behind: its process group, and one that left the group, end with it', async (t) => {
  const { gw } = await ledgerGateway(t, { upstream: { grace: '1s' } });
  const s = await rawSession(t, gw.url);
  const inGroup = Number(toolText((await s.call('spawn_sleeper', {})).message.result));
  const escaped = Number(toolText((await s.call('spawn_sleeper', { escape: true })).message.result));
  const server = Number(/pid (\d+)/.exec(toolText((await s.call('whoami', {})).message.result))[1]);
  assert.ok(!(await ended(inGroup)) && !(await ended(escaped)));
  process.kill(server, 'SIGKILL'); // it dies on its own: nobody stopped it
  await waitFor(() => ended(inGroup), { what: `the helper ${inGroup} in the server's group to end` });
  await waitFor(() => ended(escaped), { what: `the helper ${escaped} that left the group to end` });
  await waitForLog(gw, new RegExp(`pid ${escaped}, started by pid ${server}, left its process group: ending it`));
});

test('until the command has started once, its children start one at a time (npx -y on an empty cache)', async (t) => {
  const dir = await tempDir(t, 'idemgw-stdio-');
  // a slow first start, as an npx that fetches its package
  const gw = await startGateway(t, {
    upstream: { command: ['/bin/sh', '-c', `sleep 1; exec "${NODE}" "${LEDGER_SERVER}"`], env: { LEDGER: path.join(dir, 'l.jsonl') } },
    databaseUrl: await createDatabase(),
  });
  // the catalogue's child is starting: a session now waits for it
  const v = await mcpClient(t, gw.url);
  assert.match(toolText(await v.callTool({ name: 'whoami', arguments: {} })), /pid \d+/);
  await waitForLog(gw, /waiting for pid \d+, the first of this command, to start/);
  const started = [...gw.logs().matchAll(/"time":"([^"]+)","level":"info","msg":"stdio upstream [^"]*: started pid (\d+)/g)];
  assert.ok(started.length >= 2, gw.logs());
  assert.ok(Date.parse(started[1][1]) - Date.parse(started[0][1]) >= 900, 'the second started once the first had');
});

test('the child gets env, the variables pass_env names, PATH and HOME, not the gateway\'s environment', async (t) => {
  const { gw } = await ledgerGateway(t, {
    upstream: { env: { LEDGER: '/dev/null', GREETING: 'hello', OVERRIDDEN: 'from-env' }, pass_env: ['HTTPS_PROXY', 'OVERRIDDEN', 'NOT_SET_ANYWHERE'] },
    env: { PGPASSWORD: 'secret-of-the-gateway', IDEMGW_DATABASE_SECRET: 'x', HTTPS_PROXY: 'http://proxy.test:3128', OVERRIDDEN: 'gateway', NOT_SET_ANYWHERE: undefined },
  });
  const c = await mcpClient(t, gw.url);
  const names = ['GREETING', 'PGPASSWORD', 'IDEMGW_DATABASE_SECRET', 'HOME', 'HTTPS_PROXY', 'OVERRIDDEN', 'NOT_SET_ANYWHERE'];
  const who = toolText(await c.callTool({ name: 'whoami', arguments: { names } }));
  assert.match(who, /GREETING=hello/);
  assert.match(who, /PGPASSWORD=-/);
  assert.match(who, /IDEMGW_DATABASE_SECRET=-/);
  assert.doesNotMatch(who, /HOME=-/);
  assert.match(who, /HTTPS_PROXY=http:\/\/proxy\.test:3128/, 'a variable pass_env names comes from the gateway');
  assert.match(who, /OVERRIDDEN=from-env/, 'env wins over the gateway\'s value');
  assert.match(who, /NOT_SET_ANYWHERE=-/);
});

test('pass_env must be a list of variable names: file:line', async (t) => {
  for (const [passEnv, want] of [['HTTPS_PROXY', /pass_env: expected a list of variable names/], [['OK_NAME', 'bad-name'], /'bad-name' is not a variable name/]]) {
    const dir = await tempDir(t, 'idemgw-passenv-');
    const file = path.join(dir, 'idemgw.yaml');
    await fs.writeFile(file, `upstream:\n  command: [${NODE}, ${LEDGER_SERVER}]\n  pass_env: ${JSON.stringify(passEnv)}\n`);
    const r = await run(IDEMGW_BIN, ['--check-config', '-c', file]);
    assert.notEqual(r.code, 0);
    assert.match(r.stderr, want);
    assert.match(r.stderr, new RegExp(`${file.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}:3:`), r.stderr);
  }
});

test('2026-07-28 requests without a session use a child of their caller\'s', async (t) => {
  const { gw, ledger } = await ledgerGateway(t);
  const args = { order_id: 'ord-2026', amount_cents: 300 };
  const call = (id) => post(gw.url, { jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'issue_refund', arguments: args } },
    { 'MCP-Protocol-Version': '2026-07-28', 'Mcp-Method': 'tools/call', 'Mcp-Name': 'issue_refund' });
  const first = await call(1);
  assert.equal(first.status, 200, first.text);
  assert.match(first.text, /Refunded 300 on ord-2026/);
  const again = await call(2);
  assert.match(again.text, /idemgw\/replay/);
  assert.equal((await readLedger(ledger)).length, 1);
});

test('third-party stdio servers from npm: server-memory, server-filesystem, server-everything', async (t) => {
  const dir = await tempDir(t, 'idemgw-stdio-npm-');
  const servers = [
    { name: 'memory', command: [path.join(BIN, 'mcp-server-memory')], env: { MEMORY_FILE_PATH: path.join(dir, 'memory.jsonl') },
      tool: 'create_entities', args: { entities: [{ name: 'gateway', entityType: 'thing', observations: ['protects'] }] } },
    { name: 'filesystem', command: [path.join(BIN, 'mcp-server-filesystem'), dir],
      tool: 'create_directory', args: { path: path.join(dir, 'made-by-agent') } },
    { name: 'everything', command: [path.join(BIN, 'mcp-server-everything'), 'stdio'],
      tool: 'echo', args: { message: 'hi' } },
  ];
  for (const s of servers) {
    await t.test(s.name, async (t) => {
      const gw = await startGateway(t, {
        upstream: { command: s.command, ...(s.env ? { env: s.env } : {}) },
        databaseUrl: await createDatabase(),
        config: { tools: { [s.tool]: { class: 'non_idempotent' } } },
      });
      const c = await mcpClient(t, gw.url);
      const tools = (await c.listTools()).tools.map((x) => x.name);
      assert.ok(tools.includes(s.tool), `${s.tool} in ${tools}`);
      const first = await c.callTool({ name: s.tool, arguments: s.args });
      assert.ok(!first.isError, JSON.stringify(first));
      assert.equal(replayMarker(first), undefined);
      const again = await c.callTool({ name: s.tool, arguments: s.args });
      assert.ok(replayMarker(again), 'the repeat is replayed');
    });
  }
});

test('idemgw policy init and tools on a server that fails: its stderr\'s last lines, and what its environment holds', async (t) => {
  const dir = await tempDir(t, 'idemgw-stdio-fails-');
  // a server missing its configuration says so on stderr, then refuses initialize
  const server = path.join(dir, 'unconfigured.sh');
  await fs.writeFile(server, [
    '#!/bin/sh',
    'read -r line',
    'i=0',
    'while [ $i -lt 12 ]; do echo "starting, step $i" >&2; i=$((i + 1)); done',
    'echo "Error: FOO_API_KEY is not set" >&2',
    'printf \'%s\\n\' \'{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"not configured"}}\'',
    'read -r line',
    '',
  ].join('\n'), { mode: 0o755 });
  const init = await run(IDEMGW_BIN, ['policy', 'init', '--', server]);
  assert.equal(init.code, 1);
  assert.equal(init.stdout, '');
  assert.match(init.stderr, /initialize: the server answered with an error: .*not configured/);
  // the last lines, in order, the newest last; not the first ones of a long stderr
  assert.match(init.stderr, /\n {2}the server's stderr, its last lines:\n(?: {4}starting, step \d+\n)+ {4}Error: FOO_API_KEY is not set\n/);
  assert.match(init.stderr, / {4}starting, step 11\n/);
  assert.doesNotMatch(init.stderr, /step 0\n/);
  assert.match(init.stderr, /the server gets PATH, HOME, its upstream's env and the variables its pass_env names: no other variable of this environment reaches it/);
  // idemgw tools reads a catalogue the same way
  const file = path.join(dir, 'idemgw.yaml');
  await fs.writeFile(file, `upstream:\n  command: [${JSON.stringify(server)}]\n`);
  const tools = await run(IDEMGW_BIN, ['tools', '-c', file]);
  assert.equal(tools.code, 1);
  assert.match(tools.stderr, / {4}Error: FOO_API_KEY is not set\n/);
});

test('idemgw policy init lists the tools a server offers only to clients that can answer its questions', async (t) => {
  const dir = await tempDir(t, 'idemgw-stdio-caps-');
  // a server that offers confirm_payment (which asks the user through elicitation) only to a
  // client that declared it can answer, as servers built on that do
  const server = path.join(dir, 'asks.mjs');
  await fs.writeFile(server, `
import readline from 'node:readline';
let caps = {};
const send = (m) => process.stdout.write(JSON.stringify({ jsonrpc: '2.0', ...m }) + '\\n');
readline.createInterface({ input: process.stdin }).on('line', (line) => {
  const m = JSON.parse(line);
  if (m.method === 'initialize') {
    caps = m.params.capabilities || {};
    send({ id: m.id, result: { protocolVersion: m.params.protocolVersion, capabilities: { tools: {} }, serverInfo: { name: 'asks', version: '1' } } });
  } else if (m.method === 'tools/list') {
    const tools = [{ name: 'list_payments', inputSchema: { type: 'object' }, annotations: { readOnlyHint: true } }];
    if (caps.elicitation) tools.push({ name: 'confirm_payment', inputSchema: { type: 'object' }, annotations: { destructiveHint: true } });
    if (caps.sampling) tools.push({ name: 'summarise_payments', inputSchema: { type: 'object' }, annotations: { readOnlyHint: true } });
    if (caps.roots) tools.push({ name: 'export_payments', inputSchema: { type: 'object' }, annotations: { readOnlyHint: false } });
    send({ id: m.id, result: { tools } });
  } else if (m.id !== undefined && m.method) {
    send({ id: m.id, result: {} });
  }
});
`);
  const init = await run(IDEMGW_BIN, ['policy', 'init', '--', NODE, server]);
  assert.equal(init.code, 0, init.stderr);
  assert.match(init.stdout, /\n  list_payments:\n    class: read\n/);
  assert.match(init.stdout, /\n  confirm_payment:\n    class: non_idempotent\n/, 'elicitation declared');
  assert.match(init.stdout, /\n  summarise_payments:\n/, 'sampling declared');
  assert.match(init.stdout, /\n  export_payments:\n/, 'roots declared');
  // policy diff reads the same tools: a fresh policy has no drift
  const file = path.join(dir, 'idemgw.yaml');
  await fs.writeFile(file, init.stdout);
  const diff = await run(IDEMGW_BIN, ['policy', 'diff', '-c', file]);
  assert.equal(diff.code, 0, diff.stdout + diff.stderr);
  assert.equal(diff.stdout, '');
});

test('idemgw policy init -- CMD: a starter config for a stdio server, which loads and shows no drift', async (t) => {
  const dir = await tempDir(t, 'idemgw-stdio-policy-');
  // a registry reached through a proxy or a private CA: the variables' names become pass_env
  // (npx -y would otherwise wait for a registry it cannot reach), never their values
  const reach = /^(https?_proxy|no_proxy|all_proxy|node_extra_ca_certs|ssl_cert_(file|dir)|requests_ca_bundle|npm_config_registry|pip_index_url|uv_index_url)$/i;
  const bare = Object.fromEntries(Object.entries(process.env).filter(([k]) => !reach.test(k)));
  const init = await run(IDEMGW_BIN, ['policy', 'init', '--', path.join(BIN, 'mcp-server-memory')], { env: bare });
  assert.equal(init.code, 0, init.stderr);
  assert.doesNotMatch(init.stdout, /pass_env/, 'nothing to pass');
  const behind = await run(IDEMGW_BIN, ['policy', 'init', '--', path.join(BIN, 'mcp-server-memory')],
    { env: { ...bare, HTTPS_PROXY: 'http://proxy.invalid:3128', NODE_EXTRA_CA_CERTS: '/etc/secret-ca.pem' } });
  assert.equal(behind.code, 0, behind.stderr);
  assert.match(behind.stdout, /\n  pass_env: \[HTTPS_PROXY, NODE_EXTRA_CA_CERTS\]\n/);
  assert.doesNotMatch(behind.stdout, /proxy\.invalid|secret-ca/, 'names only');
  assert.match(init.stdout, new RegExp(`^upstream:\\n  command: \\["${path.join(BIN, 'mcp-server-memory').replace(/[.\\/]/g, '\\$&')}"\\]\\n`, 'm'));
  assert.match(init.stdout, /\n  create_entities:\n    class: non_idempotent\n/);
  assert.match(init.stdout, /\n  read_graph:\n    class: read\n/, 'readOnlyHint gives read');
  const file = path.join(dir, 'idemgw.yaml');
  await fs.writeFile(file, init.stdout);
  const check = await run(IDEMGW_BIN, ['--check-config', '-c', file]);
  assert.equal(check.code, 0, check.stderr);
  const diff = await run(IDEMGW_BIN, ['policy', 'diff', '-c', file]);
  assert.equal(diff.code, 0, diff.stdout + diff.stderr);
  assert.equal(diff.stdout, '', 'a fresh policy has no drift');

  const missing = await run(IDEMGW_BIN, ['policy', 'init', '--', path.join(dir, 'no-such-server')]);
  assert.equal(missing.code, 1);
  assert.match(missing.stderr, /initialize: HTTP 503: cannot start .*no-such-server: No such file or directory/);
  const headers = await run(IDEMGW_BIN, ['policy', 'init', '-H', 'Authorization: Bearer x', '--', path.join(BIN, 'mcp-server-memory')]);
  assert.equal(headers.code, 2);
  assert.match(headers.stderr, /-H is for an HTTP upstream, not a command/);
  // a server that never answers initialize: what may be holding it up is said
  const silent = path.join(dir, 'silent.yaml');
  await fs.writeFile(silent, 'upstream:\n  command: [sleep, "100"]\n  start_timeout: 1s\n');
  const waited = await run(IDEMGW_BIN, ['tools', '-c', silent]);
  assert.equal(waited.code, 1);
  assert.match(waited.stderr, /initialize: HTTP 503: no answer to initialize within 1s of its start \(a command that fetches its package first, as npx -y and uvx do, waits for a registry it cannot reach when the proxy or CA variables it needs are not in pass_env\)/);
  const both = await run(IDEMGW_BIN, ['policy', 'init', '--upstream', 'http://127.0.0.1:1/mcp', '--', 'x']);
  assert.equal(both.code, 2);
  assert.match(both.stderr, /needs --upstream URL or -- CMD ARGS/);
});

test('a cancelled read the server never answers ends its stream after a grace, so it holds neither the agent nor a drain', { timeout: 30000 }, async (t) => {
  const { gw, ledger } = await ledgerGateway(t, { upstream: { pass_env: ['LOG_WIRE'] }, env: { LOG_WIRE: '1' } });
  const s = await rawSession(t, gw.url);
  const never = path.join(await tempDir(t, 'idemgw-never-'), 'never');
  const pending = s.call('echo', { text: 'waits', wait_for: never }, { id: 'c-1' });
  await waitFor(async () => (await readLedger(ledger)).some((l) => l.tool === 'echo_waiting'), { what: 'the echo to run' });
  const cancel = await fetch(gw.url, {
    method: 'POST',
    headers: { Accept: ACCEPT, 'Content-Type': 'application/json', 'MCP-Protocol-Version': '2025-11-25', 'Mcp-Session-Id': s.sessionId },
    body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 'c-1', reason: 'the user gave up' } }),
  });
  assert.equal(cancel.status, 202);
  await waitFor(async () => (await readLedger(ledger)).some((l) => l.tool === 'cancel_received'), { what: 'the cancel to reach the server' });
  // the SDK server drops a cancelled request's answer: without the grace the stream waited
  // for upstream_idle (5 minutes), and a drain for its whole timeout
  const ended = await pending;
  assert.equal(ended.status, 200);
  assert.ok(!ended.message?.result, `no result for a cancelled request: ${ended.body}`);
  await waitForLog(gw, /a cancelled request was not answered: it ends unanswered/);
  assert.ok(!(await readLedger(ledger)).some((l) => l.tool === 'echo' && l.text === 'waits'), 'nothing more ran');
});
