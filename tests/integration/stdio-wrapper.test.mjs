// `idemgw stdio -- CMD ARGS`: the gateway as a desktop agent's stdio server. The official SDKs'
// stdio clients (1.x and 2.x) start it as they would start the server itself; a repeated
// non_idempotent call is replayed within a run and across runs (a restarted agent), read
// tools run each time, progress reaches the client, stdout carries JSON-RPC lines only, and
// the end of stdin lets what is in flight finish, then exits 0 with the server stopped. Two
// copies of one command (two agent windows) share its store file: a call runs once in all.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import path from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport, getDefaultEnvironment } from '@modelcontextprotocol/sdk/client/stdio.js';
import { Client as V2Client } from '@modelcontextprotocol/client';
import { StdioClientTransport as V2StdioTransport } from '@modelcontextprotocol/client/stdio';
import {
  IDEMGW_BIN, NODE, TESTS, idemStatus, readLedger, replayMarker, startRefundServer, tempDir, toolText, toYaml, waitFor,
} from './lib/harness.mjs';

const LEDGER_SERVER = path.join(TESTS, 'fixtures/ledger-stdio.mjs');
const MEMORY_SERVER = path.join(TESTS, 'node_modules/@modelcontextprotocol/server-memory/dist/index.js');

const alive = (pid) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

/** Processes whose parent is pid. */
async function children(pid) {
  const out = [];
  for (const d of await fs.readdir('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    const stat = await fs.readFile(`/proc/${d}/stat`, 'utf8').catch(() => '');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (Number(f[1]) === pid && f[0] !== 'Z') out.push(Number(d));
  }
  return out;
}

/** A folder for one test: the state home (the stores), the ledger, config files. */
async function place(t) {
  const dir = await tempDir(t, 'idemgw-wrap-');
  return { dir, state: path.join(dir, 'state'), ledger: path.join(dir, 'ledger.jsonl') };
}

/** The environment an agent gives its server: the SDK's default one, plus the test's. */
const agentEnv = (p, extra = {}) => ({ ...getDefaultEnvironment(), XDG_STATE_HOME: p.state, LEDGER: p.ledger, ...extra });

/** What failed tests print: each wrapper's stderr. */
function keepLogs(t, name, logs) {
  t.after(() => {
    if (!t.passed) process.stderr.write(`\n----- ${name} stderr -----\n${logs()}\n----- end -----\n`);
  });
}

/**
 * An SDK client (v1 or v2) that starts `idemgw stdio [opts] -- command` as its server.
 * Returns {client, transport, pid, logs()}.
 */
async function agent(t, p, { command = [NODE, LEDGER_SERVER], opts = [], env = {}, v2 = false, name = 'agent' } = {}) {
  const params = {
    command: IDEMGW_BIN,
    args: ['stdio', ...opts, '--', ...command],
    env: agentEnv(p, env),
    stderr: 'pipe',
  };
  const transport = v2 ? new V2StdioTransport(params) : new StdioClientTransport(params);
  let logs = '';
  transport.stderr?.on('data', (chunk) => { logs += chunk; });
  keepLogs(t, name, () => logs);
  const client = v2 ? new V2Client({ name, version: '1.0.0' }) : new Client({ name, version: '1.0.0' });
  await client.connect(transport);
  t.after(() => client.close().catch(() => {}));
  return { client, transport, pid: transport.pid, logs: () => logs };
}

/** The wrapper started by hand: lines written to its stdin, its stdout kept line by line. */
function rawWrapper(t, p, { command = [NODE, LEDGER_SERVER], opts = [], env = {} } = {}) {
  const proc = spawn(IDEMGW_BIN, ['stdio', ...opts, ...(command ? ['--', ...command] : [])], {
    env: agentEnv(p, env),
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  proc.stdout.setEncoding('utf8').on('data', (c) => { out += c; });
  proc.stderr.setEncoding('utf8').on('data', (c) => { err += c; });
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  keepLogs(t, 'idemgw stdio', () => err);
  t.after(() => {
    if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
  });
  const lines = () => out.split('\n').filter((l) => l !== '');
  return {
    proc,
    exited,
    stderr: () => err,
    stdout: () => out,
    send: (msg) => proc.stdin.write(`${typeof msg === 'string' ? msg : JSON.stringify(msg)}\n`),
    /** The message answering id, once it arrives. */
    answer: (id) => waitFor(() => lines().map((l) => JSON.parse(l)).find((m) => m.id === id && !m.method),
      { what: `the answer to ${id}`, timeoutMs: 15000 }),
    lines,
  };
}

const initialize = (id = 1) => ({
  jsonrpc: '2.0', id, method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
});
const call = (id, name, args) => ({ jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: args } });

async function rawSession(w) {
  w.send(initialize());
  const init = await w.answer(1);
  assert.ok(init.result, `initialize answered: ${JSON.stringify(init)}`);
  w.send({ jsonrpc: '2.0', method: 'notifications/initialized' });
  w.send({ jsonrpc: '2.0', id: 2, method: 'tools/list' });
  await w.answer(2);
}

test('a repeated refund is replayed, read tools run each time, progress reaches the client', async (t) => {
  const p = await place(t);
  const { client, transport, logs } = await agent(t, p);
  await client.listTools();
  const args = { order_id: 'ord-1', amount_cents: 1250 };
  const first = await client.callTool({ name: 'issue_refund', arguments: args });
  assert.match(toolText(first), /Refunded 1250 on ord-1/);
  assert.equal(replayMarker(first), undefined);
  const again = await client.callTool({ name: 'issue_refund', arguments: args });
  assert.ok(replayMarker(again), 'the model re-issuing the refund gets the replay');
  assert.equal(toolText(again), toolText(first));
  assert.equal((await readLedger(p.ledger)).length, 1, 'executed once');

  for (let i = 0; i < 2; i++) {
    const echo = await client.callTool({ name: 'echo', arguments: { text: 'same words' } });
    assert.equal(toolText(echo), 'same words');
    assert.equal(replayMarker(echo), undefined, 'a read tool runs each time');
  }
  const forwarded = () => logs().split('\n').filter((l) => l.includes('"tool":"echo"') && l.includes('"outcome":"forwarded"'));
  await waitFor(() => forwarded().length === 2, { what: 'both echo calls logged as forwarded to the server' });

  // Read where the client's transport hands messages over: the 1.x SDK runs notification
  // handlers a microtask later than it settles a response, so when a busy machine delivers the
  // last notifications and the response in one read, onprogress misses those (as it would
  // from the server itself). What matters here is that every one reached the client, in order.
  const arrived = [];
  const deliver = transport.onmessage;
  transport.onmessage = (m, extra) => {
    if (m.method === 'notifications/progress') arrived.push(m.params.progress);
    else if (m.id !== undefined && m.result?.content) arrived.push('response');
    deliver(m, extra);
  };
  // onprogress makes the SDK send a progress token, without which the server sends nothing
  const done = await client.callTool({ name: 'progress', arguments: { steps: 4 } }, undefined, { onprogress: () => {} });
  assert.equal(toolText(done), 'done');
  assert.deepEqual(arrived, [1, 2, 3, 4, 'response'], 'every progress notification arrived, in order, before the answer');
});

test('across agent runs (closed, then killed) the repeat is replayed, not run again', async (t) => {
  const p = await place(t);
  const args = { order_id: 'ord-restart', amount_cents: 990 };

  const run1 = await agent(t, p, { name: 'run 1' });
  await run1.client.listTools();
  const first = await run1.client.callTool({ name: 'issue_refund', arguments: args });
  assert.match(toolText(first), /Refunded 990/);
  await run1.client.close();
  await waitFor(() => !alive(run1.pid), { what: 'the first wrapper to exit' });

  // the agent restarted mid-task, with the 2.x SDK this time
  const run2 = await agent(t, p, { name: 'run 2', v2: true });
  await run2.client.listTools();
  const second = await run2.client.callTool({ name: 'issue_refund', arguments: args });
  assert.ok(replayMarker(second), 'a new wrapper process replays the first run\'s call');
  assert.equal(toolText(second), toolText(first));

  // an agent that dies without closing anything
  process.kill(run2.pid, 'SIGKILL');
  await waitFor(() => !alive(run2.pid), { what: 'the killed wrapper to go' });
  const run3 = await agent(t, p, { name: 'run 3' });
  await run3.client.listTools();
  const third = await run3.client.callTool({ name: 'issue_refund', arguments: args });
  assert.ok(replayMarker(third), 'replayed after a kill too');
  assert.equal((await readLedger(p.ledger)).length, 1, 'one refund in three runs');

  const files = (await fs.readdir(path.join(p.state, 'idemgw'))).filter((f) => f.endsWith('.db'));
  assert.equal(files.length, 1, `one store file for one command: ${files}`);
  assert.match(files[0], /^stdio-ledger-stdio-[0-9a-f]{16}\.db$/);
});

test('a different command gets a store file of its own', async (t) => {
  const p = await place(t);
  const args = { order_id: 'ord-cmd', amount_cents: 5 };
  const a = await agent(t, p, { name: 'command A' });
  await a.client.listTools();
  await a.client.callTool({ name: 'issue_refund', arguments: args });
  await a.client.close();
  const b = await agent(t, p, { name: 'command B', command: [NODE, LEDGER_SERVER, '--other'] });
  await b.client.listTools();
  const other = await b.client.callTool({ name: 'issue_refund', arguments: args });
  assert.equal(replayMarker(other), undefined, 'another server is not answered from the first one\'s keys');
  assert.equal((await readLedger(p.ledger)).length, 2);
  const files = (await fs.readdir(path.join(p.state, 'idemgw'))).filter((f) => f.endsWith('.db'));
  assert.equal(files.length, 2, `two commands, two files: ${files}`);
});

test('stdout carries JSON-RPC lines only: bad lines get errors and the wrapper goes on', async (t) => {
  const p = await place(t);
  const cfg = path.join(p.dir, 'small.yaml');
  await fs.writeFile(cfg, toYaml({ limits: { max_body: '2KiB' } }));
  const w = rawWrapper(t, p, { opts: ['-c', cfg] });
  await rawSession(w);

  w.send('this is not JSON');
  w.send('42');
  w.send(`{"jsonrpc":"2.0","id":"big","method":"tools/call","params":{"name":"echo","arguments":{"text":"${'x'.repeat(4000)}"}}}`);
  // a server that writes garbage on its own stdout: the gateway drops it
  w.send(call(3, 'garbage', { bytes: 10 }));
  const ok = await w.answer(3);
  assert.equal(toolText(ok.result), 'ok');
  // SIGHUP is ignored (a reload of the file alone would lose the command line's part)
  w.proc.kill('SIGHUP');
  w.send(call(4, 'echo', { text: 'still here' }));
  const echo = await w.answer(4);
  assert.equal(toolText(echo.result), 'still here');

  const messages = w.lines().map((l) => JSON.parse(l));
  for (const m of messages) assert.equal(m.jsonrpc, '2.0', `a JSON-RPC message: ${JSON.stringify(m)}`);
  const errors = messages.filter((m) => m.error && m.id === null).map((m) => m.error);
  assert.equal(errors.filter((e) => e.code === -32700).length, 1, 'the line that is not JSON: parse error');
  assert.equal(errors.filter((e) => e.code === -32600).length, 2, 'a bare number and an over-long line: invalid request');
  assert.ok(errors.some((e) => /longer than 2048 bytes/.test(e.message)));
  assert.ok(!w.stdout().includes('this is not JSON-RPC'), 'the server\'s garbage never reaches stdout');
  w.proc.stdin.end();
  assert.deepEqual(await w.exited, { code: 0, signal: null });
});

test('messages that are no JSON-RPC request, notification or answer: -32600 with id null, never sent on', async (t) => {
  // behind an HTTP server, whose own checks may differ from the stdio upstream's: the wrapper
  // itself answers what JSON-RPC calls an invalid request
  const p = await place(t);
  const http = await startRefundServer(t);
  const urlCfg = path.join(p.dir, 'url.yaml');
  await fs.writeFile(urlCfg, toYaml({ upstream: http.url }));
  const w = rawWrapper(t, p, { command: null, opts: ['-c', urlCfg] });
  await rawSession(w);
  const before = w.lines().length;
  const invalid = [
    '{}',
    '{"jsonrpc":"2.0"}',
    '{"jsonrpc":"2.0","id":{"a":1},"method":"tools/list"}',
    '{"jsonrpc":"2.0","id":[1],"method":"tools/list"}',
    '{"jsonrpc":"2.0","id":true,"method":"tools/list"}',
    '{"jsonrpc":"2.0","id":9,"method":42}',
    '{"jsonrpc":"2.0","id":{"x":1},"result":{}}',
    '[]',
  ];
  for (const line of invalid) w.send(line);
  // a batch with one invalid member: the valid request in it is told it was not run
  w.send('[{"jsonrpc":"2.0","id":"in-batch","method":"tools/list"},{}]');
  w.send({ jsonrpc: '2.0', id: 10, method: 'tools/list' });
  assert.ok((await w.answer(10)).result, 'the wrapper goes on');
  const answers = w.lines().slice(before).map((l) => JSON.parse(l)).filter((m) => m.id !== 10);
  const nulls = answers.filter((m) => m.id === null);
  assert.equal(nulls.length, invalid.length + 1, JSON.stringify(answers));
  for (const m of nulls) assert.equal(m.error.code, -32600, JSON.stringify(m));
  const batch = answers.find((m) => m.id === 'in-batch');
  assert.equal(batch?.error?.code, -32600, 'the batch\'s valid request is answered, not run');
  assert.equal(answers.length, nulls.length + 1, `no other answer: ${JSON.stringify(answers)}`);
  assert.ok(!w.stdout().includes('"a":1') && !w.stdout().includes('"x":1'), 'an invalid id is never echoed');
  w.proc.stdin.end();
  assert.equal((await w.exited).code, 0);
});

test('the end of stdin lets a call in flight finish and be recorded, then exits 0 with the server gone', async (t) => {
  const p = await place(t);
  const w = rawWrapper(t, p);
  await rawSession(w);
  w.send(call(3, 'whoami', {}));
  const child = Number(/pid (\d+)/.exec(toolText((await w.answer(3)).result))[1]);
  assert.ok(alive(child));
  assert.deepEqual(await children(w.proc.pid), [child], 'one copy of the server: the session\'s');
  const args = { order_id: 'ord-eof', amount_cents: 77, delay_ms: 700 };
  w.send(call(4, 'slow_refund', args));
  await waitFor(async () => (await readLedger(p.ledger)).length === 1, { what: 'the refund to start' });
  w.proc.stdin.end();
  assert.deepEqual(await w.exited, { code: 0, signal: null });
  const answer = w.lines().map((l) => JSON.parse(l)).find((m) => m.id === 4);
  assert.match(toolText(answer?.result), /Refunded 77 on ord-eof/, 'the call in flight was answered before the exit');
  assert.ok(!alive(child), 'the server is stopped');

  // recorded: the next run replays it
  const again = rawWrapper(t, p);
  await rawSession(again);
  again.send(call(3, 'slow_refund', args));
  const replay = await again.answer(3);
  assert.ok(replayMarker(replay.result), `replayed: ${JSON.stringify(replay)}`);
  assert.equal((await readLedger(p.ledger)).length, 1);
  again.proc.stdin.end();
  assert.equal((await again.exited).code, 0);
});

test('a command that cannot start: a clear error on stderr and a non-zero exit', async (t) => {
  const p = await place(t);
  for (const command of [['no-such-mcp-server-xyz', '--flag'], [path.join(p.dir, 'missing', 'server')]]) {
    const w = rawWrapper(t, p, { command });
    const { code } = await w.exited;
    assert.notEqual(code, 0);
    assert.match(w.stderr(), /idemgw stdio: cannot start .*(no-such-mcp-server-xyz|server): (command not found on PATH|no such executable file)/);
    assert.equal(w.stdout(), '', 'nothing on stdout');
  }
  const usage = rawWrapper(t, p, { command: [] });
  assert.equal((await usage.exited).code, 2);
  assert.match(usage.stderr(), /no command after '--'/);
  // a gateway's config with several servers is not the wrapper's
  const many = path.join(p.dir, 'servers.yaml');
  await fs.writeFile(many, `servers:\n  a: {path: /a/mcp, upstream: {command: [${NODE}, ${LEDGER_SERVER}]}}\n`);
  const several = rawWrapper(t, p, { command: null, opts: ['-c', many] });
  assert.equal((await several.exited).code, 1);
  assert.match(several.stderr(), /has servers:, and the wrapper serves one agent one server/);
  assert.equal(several.stdout(), '', 'nothing on stdout');
});

test('server-memory wrapped: create_entities, marked non_idempotent, is replayed', async (t) => {
  const p = await place(t);
  const cfg = path.join(p.dir, 'memory.yaml');
  await fs.writeFile(cfg, toYaml({ tools: { create_entities: { class: 'non_idempotent' } } }));
  const memoryFile = path.join(p.dir, 'memory.jsonl');
  const { client } = await agent(t, p, {
    command: [NODE, MEMORY_SERVER],
    opts: ['-c', cfg],
    env: { MEMORY_FILE_PATH: memoryFile },
    name: 'server-memory',
  });
  await client.listTools();
  const entities = [{ name: 'wrapped', entityType: 'test', observations: ['first'] }];
  const first = await client.callTool({ name: 'create_entities', arguments: { entities } });
  assert.equal(replayMarker(first), undefined);
  assert.match(toolText(first), /wrapped/, 'the first call created the entity');
  const again = await client.callTool({ name: 'create_entities', arguments: { entities } });
  assert.ok(replayMarker(again), 'the second identical call is replayed');
  assert.equal(toolText(again), toolText(first), 'with the first answer, not the server\'s "already exists" one');
  const graph = await client.callTool({ name: 'read_graph', arguments: {} });
  assert.equal(replayMarker(graph), undefined);
  assert.equal((toolText(graph).match(/"name":\s*"wrapped"/g) ?? []).length, 1);
});

test('elicitation inside a protected call: the server asks the client, the answer goes back', async (t) => {
  const p = await place(t);
  const { ElicitRequestSchema } = await import('@modelcontextprotocol/sdk/types.js');
  const transport = new StdioClientTransport({
    command: IDEMGW_BIN,
    args: ['stdio', '--', NODE, LEDGER_SERVER],
    env: agentEnv(p),
    stderr: 'pipe',
  });
  let logs = '';
  transport.stderr?.on('data', (c) => { logs += c; });
  keepLogs(t, 'eliciting agent', () => logs);
  const client = new Client({ name: 'eliciting', version: '1.0.0' }, { capabilities: { elicitation: {} } });
  const asked = [];
  client.setRequestHandler(ElicitRequestSchema, async (req) => {
    asked.push(req.params.message);
    return { action: 'accept', content: { ok: true } };
  });
  await client.connect(transport);
  t.after(() => client.close().catch(() => {}));
  await client.listTools();
  const args = { order_id: 'ord-ask', amount_cents: 300 };
  const first = await client.callTool({ name: 'confirm_refund', arguments: args });
  assert.match(toolText(first), /Refunded 300 on ord-ask/);
  assert.deepEqual(asked, ['Refund 300 on ord-ask?']);
  const again = await client.callTool({ name: 'confirm_refund', arguments: args });
  assert.ok(replayMarker(again));
  assert.equal(asked.length, 1, 'the replay asks nothing');
  assert.equal((await readLedger(p.ledger)).filter((e) => e.tool === 'confirm_refund').length, 1);
});

test('a server that exits under the wrapper ends it with status 1', async (t) => {
  const p = await place(t);
  // answers initialize, then dies at the first tool call
  const script = path.join(p.dir, 'dies.sh');
  await fs.writeFile(script, `#!/bin/sh
while IFS= read -r line; do
  case "$line" in
  *'"method":"initialize"'*)
    id=$(printf '%s' "$line" | sed 's/.*"id":\\([0-9]*\\).*/\\1/')
    printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"dies","version":"1"}}}\\n' "$id"
    ;;
  *'"method":"tools/call"'*) exit 3 ;;
  esac
done
`, { mode: 0o755 });
  const w = rawWrapper(t, p, { command: [script] });
  w.send(initialize());
  assert.ok((await w.answer(1)).result);
  w.send({ jsonrpc: '2.0', method: 'notifications/initialized' });
  w.send(call(2, 'anything', {}));
  const failed = await w.answer(2);
  assert.ok(failed.error || failed.result?.isError, `the call in flight is answered: ${JSON.stringify(failed)}`);
  const { code } = await w.exited;
  assert.equal(code, 1);
  assert.match(w.stderr(), /session ended/);
});

test('without --, the config\'s upstream: a command with its env, or an HTTP server (polling too)', async (t) => {
  const p = await place(t);
  const cmdCfg = path.join(p.dir, 'command.yaml');
  const ledger = path.join(p.dir, 'config-ledger.jsonl');
  await fs.writeFile(cmdCfg, toYaml({ upstream: { command: [NODE, LEDGER_SERVER], env: { LEDGER: ledger } } }));
  const w = rawWrapper(t, p, { command: null, opts: ['-c', cmdCfg] });
  await rawSession(w);
  const args = { order_id: 'ord-config', amount_cents: 12 };
  w.send(call(3, 'issue_refund', args));
  assert.match(toolText((await w.answer(3)).result), /Refunded 12/);
  w.send(call(4, 'issue_refund', args));
  assert.ok(replayMarker((await w.answer(4)).result));
  assert.equal((await readLedger(ledger)).length, 1, 'upstream.env set the server\'s ledger');
  w.proc.stdin.end();
  assert.equal((await w.exited).code, 0);

  // a remote Streamable HTTP server, for an agent that speaks stdio only
  const http = await startRefundServer(t);
  const urlCfg = path.join(p.dir, 'url.yaml');
  await fs.writeFile(urlCfg, toYaml({ upstream: http.url }));
  const u = rawWrapper(t, p, { command: null, opts: ['-c', urlCfg] });
  await rawSession(u);
  u.send(call(3, 'issue_refund', args));
  assert.match(toolText((await u.answer(3)).result), /Refunded 12 cents/);
  u.send(call(4, 'issue_refund', args));
  assert.ok(replayMarker((await u.answer(4)).result));
  assert.equal((await readLedger(http.ledger)).length, 1);
  // a server that polls (its stream ends after the priming event): the wrapper resumes it
  const polled = { order_id: 'ord-poll', amount_cents: 13 };
  u.send(call(5, 'polling_refund', polled));
  assert.match(toolText((await u.answer(5)).result), /Refunded 13 cents/);
  u.send(call(6, 'polling_refund', polled));
  assert.ok(replayMarker((await u.answer(6)).result));
  assert.equal((await readLedger(http.ledger)).length, 2);
  u.proc.stdin.end();
  assert.equal((await u.exited).code, 0);
});

test('the caller is the local user, or what -H gives a configured subject header; idemgw key finds the row', async (t) => {
  const p = await place(t);
  const os = await import('node:os');
  const args = { order_id: 'ord-key', amount_cents: 44 };
  const keyShow = async (subject, file) => {
    const out = await new Promise((resolve) => {
      const k = spawn(IDEMGW_BIN, ['key', '--subject', subject, '--tool', 'issue_refund', '--args', JSON.stringify(args),
        '--database-url', `sqlite:${file}`, '--show'], { env: { ...process.env } });
      let text = '';
      k.stdout.on('data', (c) => { text += c; });
      k.on('exit', (code) => resolve({ code, text }));
    });
    return out;
  };
  const storeFiles = async () => (await fs.readdir(path.join(p.state, 'idemgw'))).filter((f) => f.endsWith('.db'));

  const w = rawWrapper(t, p);
  await rawSession(w);
  w.send(call(3, 'issue_refund', args));
  await w.answer(3);
  w.proc.stdin.end();
  assert.equal((await w.exited).code, 0);
  const [file] = await storeFiles();
  const mine = await keyShow(`local:${os.userInfo().username}`, path.join(p.state, 'idemgw', file));
  assert.equal(mine.code, 0, 'the row is under local:USER');
  assert.match(mine.text, /"state":"succeeded"/);

  const cfg = path.join(p.dir, 'subject.yaml');
  await fs.writeFile(cfg, toYaml({ subject: { header: 'X-Subject' } }));
  const h = rawWrapper(t, p, { opts: ['-c', cfg, '-H', 'X-Subject: alice'] });
  await rawSession(h);
  h.send(call(3, 'issue_refund', args));
  const answer = await h.answer(3);
  assert.equal(replayMarker(answer.result), undefined, 'another caller: its own key');
  h.proc.stdin.end();
  assert.equal((await h.exited).code, 0);
  const alice = await keyShow('alice', path.join(p.state, 'idemgw', file));
  assert.equal(alice.code, 0, 'the row is under the header\'s subject');
  assert.equal((await readLedger(p.ledger)).length, 2);
});

test('a burst of 150 calls written at once, then the end of stdin: every one is answered', async (t) => {
  const p = await place(t);
  const w = rawWrapper(t, p);
  // no waiting for initialize's answer either: the wrapper holds them until the session exists
  const lines = [JSON.stringify(initialize()), JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' })];
  for (let i = 0; i < 150; i++) lines.push(JSON.stringify(call(100 + i, 'echo', { text: `n${i}`, delay_ms: 30 })));
  w.proc.stdin.end(`${lines.join('\n')}\n`);
  assert.deepEqual(await w.exited, { code: 0, signal: null });
  const answers = new Map(w.lines().map((l) => JSON.parse(l)).filter((m) => m.id >= 100).map((m) => [m.id, m]));
  assert.equal(answers.size, 150);
  for (let i = 0; i < 150; i++) assert.equal(toolText(answers.get(100 + i).result), `n${i}`);
});

/** The one store file of the state home: copies of one command share it. */
async function storeFiles(p) {
  return (await fs.readdir(path.join(p.state, 'idemgw'))).filter((f) => f.endsWith('.db'));
}

/** Ledger lines of one order. */
const executions = async (p, order) => (await readLedger(p.ledger)).filter((e) => e.order_id === order);

test('two copies of one command (two agent windows) share its file: the same call from both runs once', async (t) => {
  const p = await place(t);
  // started together on a file that does not exist yet: both make and open it
  const [one, two] = await Promise.all([agent(t, p, { name: 'window 1' }), agent(t, p, { name: 'window 2', v2: true })]);
  await Promise.all([one.client.listTools(), two.client.listTools()]);

  // one after the other: the second window gets the first one's answer
  const args = { order_id: 'ord-windows', amount_cents: 8 };
  const first = await one.client.callTool({ name: 'issue_refund', arguments: args });
  assert.equal(replayMarker(first), undefined);
  const other = await two.client.callTool({ name: 'issue_refund', arguments: args });
  assert.ok(replayMarker(other), `the other window replays it: ${JSON.stringify(other)}`);
  assert.equal(toolText(other), toolText(first));
  assert.equal((await executions(p, 'ord-windows')).length, 1);

  // while it runs in one window, the other is told it is in progress; then it is replayed there
  const gate = path.join(p.dir, 'gate');
  const slow = { order_id: 'ord-slow', amount_cents: 9, wait_for: gate };
  const running = one.client.callTool({ name: 'slow_refund', arguments: slow });
  await waitFor(async () => (await executions(p, 'ord-slow')).length === 1, { what: 'the slow refund to start' });
  const meanwhile = await two.client.callTool({ name: 'slow_refund', arguments: slow });
  assert.equal(idemStatus(meanwhile)?.code, 'in_progress', JSON.stringify(meanwhile));
  await fs.writeFile(gate, '');
  assert.match(toolText(await running), /Refunded 9 on ord-slow/);
  assert.ok(replayMarker(await two.client.callTool({ name: 'slow_refund', arguments: slow })));
  assert.equal((await executions(p, 'ord-slow')).length, 1);

  // sent from both at the same moment: each order runs once, the other copy gets the replay or
  // the in-progress answer
  const orders = Array.from({ length: 12 }, (_, i) => ({ order_id: `ord-race-${i}`, amount_cents: 100 + i }));
  const answers = await Promise.all(orders.map((a) => Promise.all([one, two].map((w) => w.client.callTool({ name: 'issue_refund', arguments: a })))));
  for (const [i, pair] of answers.entries()) {
    const ran = pair.filter((r) => replayMarker(r) === undefined && idemStatus(r) === undefined);
    assert.equal(ran.length, 1, `order ${i}: one copy ran it: ${JSON.stringify(pair)}`);
    const held = pair.find((r) => r !== ran[0]);
    assert.ok(replayMarker(held) || idemStatus(held)?.code === 'in_progress', `order ${i}: ${JSON.stringify(held)}`);
    assert.equal((await executions(p, orders[i].order_id)).length, 1, `order ${i} executed once`);
  }
  assert.equal((await storeFiles(p)).length, 1, 'one file for both copies');

  // one window closes, the other goes on; a third one opened then shares what it wrote
  await one.client.close();
  await waitFor(() => !alive(one.pid), { what: 'the first wrapper to exit' });
  const late = { order_id: 'ord-after', amount_cents: 11 };
  assert.equal(replayMarker(await two.client.callTool({ name: 'issue_refund', arguments: late })), undefined);
  const three = await agent(t, p, { name: 'window 3' });
  assert.ok(replayMarker(await three.client.callTool({ name: 'issue_refund', arguments: late })));
  assert.ok(replayMarker(await three.client.callTool({ name: 'issue_refund', arguments: args })));
  assert.equal((await executions(p, 'ord-after')).length, 1);
  assert.match(two.logs(), /shared by its peers on this machine/);
});

test('a copy killed mid-call: the other copies are told it is in progress, and never run it again', async (t) => {
  const p = await place(t);
  const one = await agent(t, p, { name: 'window 1' });
  const two = await agent(t, p, { name: 'window 2' });
  await Promise.all([one.client.listTools(), two.client.listTools()]);
  const gate = path.join(p.dir, 'gate');
  const args = { order_id: 'ord-killed', amount_cents: 5, wait_for: gate };
  const lost = one.client.callTool({ name: 'slow_refund', arguments: args }).catch((e) => e);
  await waitFor(async () => (await executions(p, 'ord-killed')).length === 1, { what: 'the refund to start' });
  const [started] = await executions(p, 'ord-killed');
  // the killed wrapper's server is an orphan still running the call
  t.after(() => {
    try { process.kill(started.pid, 'SIGKILL'); } catch { /* gone already */ }
  });
  process.kill(one.pid, 'SIGKILL');
  await waitFor(() => !alive(one.pid), { what: 'the killed wrapper to go' });
  await lost;

  const retry = await two.client.callTool({ name: 'slow_refund', arguments: args });
  assert.equal(replayMarker(retry), undefined);
  assert.ok(['in_progress', 'outcome_unknown'].includes(idemStatus(retry)?.code), `held: ${JSON.stringify(retry)}`);
  // the orphan finishes, its answer reaching no one; a window opened afterwards holds it too
  await fs.writeFile(gate, '');
  const three = await agent(t, p, { name: 'window 3' });
  const again = await three.client.callTool({ name: 'slow_refund', arguments: args });
  assert.ok(['in_progress', 'outcome_unknown'].includes(idemStatus(again)?.code), `held: ${JSON.stringify(again)}`);
  assert.equal((await executions(p, 'ord-killed')).length, 1, 'executed once, by the killed copy');
});

test('stdin from a file or /dev/null, stdout to a file: read to the end, answered, exit 0', async (t) => {
  const p = await place(t);
  const { openSync, closeSync, readFileSync } = await import('node:fs');
  const input = path.join(p.dir, 'in.jsonl');
  const output = path.join(p.dir, 'out.jsonl');
  await fs.writeFile(input, [initialize(), { jsonrpc: '2.0', method: 'notifications/initialized' },
    call(2, 'issue_refund', { order_id: 'ord-file', amount_cents: 3 })].map((m) => JSON.stringify(m)).join('\n'));
  const runWith = async (stdin, stdout) => {
    const inFd = openSync(stdin, 'r');
    const outFd = openSync(stdout, 'w');
    const proc = spawn(IDEMGW_BIN, ['stdio', '--', NODE, LEDGER_SERVER], { env: agentEnv(p), stdio: [inFd, outFd, 'pipe'] });
    let err = '';
    proc.stderr.setEncoding('utf8').on('data', (c) => { err += c; });
    keepLogs(t, 'idemgw stdio (files)', () => err);
    const code = await new Promise((resolve) => proc.on('exit', (c) => resolve(c)));
    closeSync(inFd);
    closeSync(outFd);
    return code;
  };
  assert.equal(await runWith(input, output), 0);
  const answers = readFileSync(output, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
  assert.match(toolText(answers.find((m) => m.id === 2).result), /Refunded 3 on ord-file/);
  assert.equal(await runWith('/dev/null', output), 0, '/dev/null: the end at once');
  assert.equal(readFileSync(output, 'utf8'), '');
});
