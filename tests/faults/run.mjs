// The fault suite (`make faults`): the gateway under the failures it must survive, each a
// bounded scenario on loopback that prints one line with its counts and whether any answer
// reached the wrong caller or any order was paid out twice (both must be 0). Exits non-zero
// when a scenario fails.
//
//   node tests/faults/run.mjs [scenario...]     (all when none is named)
//
// Needs IDEMGW_TEST_PG_URL (a cluster for the scenarios that do not kill theirs) and
// IDEMGW_BIN; scripts/faults.sh sets both.
import { spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import {
  IDEMGW_BIN, NODE, TESTS, createDatabase, freePort, readLedger, startGateway, startPgCluster, startProcess,
  startRefundServer, tempDir, toYaml, waitFor, waitForLog,
} from '../integration/lib/harness.mjs';
import { callBody, rawRequest, spellings, unclassifiedRoutes, unreadableBodies } from '../integration/lib/bypass.mjs';
import { startStallProxy } from '../integration/lib/stall-proxy.mjs';
import { classify, doubleExecutions, load, openSession, protectedCall, psql, report, scope, tally } from './lib.mjs';
import { tenantScenarios, tenantSummary } from './tenant.mjs';
import { campaignScenarios } from './campaign.mjs';

const SUBJECT = { header: 'X-Subject' };

/** Every tool of the refund fixture is protected by default; reads are named. */
const POLICY = { tools: { get_ledger: { class: 'read' } } };

const scenarios = {};

// --- Postgres killed with SIGKILL under load, then restarted ---------------------------------
scenarios['postgres-kill9'] = async (s) => {
  const pg = await startPgCluster(s);
  const up = await startRefundServer(s, { jsonResponse: true });
  const gw = await startGateway(s, {
    upstream: up.url,
    databaseUrl: pg.url,
    config: { subject: SUBJECT, ...POLICY, defaults: { on_store_down: 'reject' } },
  });
  let killed = false;
  const kill9 = async () => {
    // as root the cluster lives in a folder of its own, named in pg.dir/cluster
    const home = (await fs.readFile(path.join(pg.dir, 'cluster'), 'utf8').catch(() => pg.dir)).trim();
    const pm = Number((await fs.readFile(path.join(home, 'data/postmaster.pid'), 'utf8')).split('\n')[0]);
    const kids = (await new Promise((resolve) => {
      const p = spawn('pgrep', ['-P', String(pm)]);
      let out = '';
      p.stdout.on('data', (d) => (out += d));
      p.on('exit', () => resolve(out));
    })).split('\n').filter(Boolean).map(Number);
    for (const pid of [pm, ...kids]) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
    killed = true;
    // the killed postmaster must be reaped before a new one may take its lock file
    await waitFor(async () => !(await fs.stat(`/proc/${pm}`).catch(() => null)), { timeoutMs: 30000, what: 'the killed postmaster to be reaped' });
    await pg.start();
  };
  const { tl, firstKinds } = await load(gw.url, {
    workers: 8,
    perWorker: 120,
    tag: 'kill9',
    onCall: async (i) => {
      if (i === 60 && !killed) await kill9();
    },
  });
  // Everything acknowledged as executed must now replay, never run again.
  await waitFor(async () => (await fetch(`${gw.adminUrl}/readyz`)).status === 200, { timeoutMs: 30000, what: 'readyz after restart' });
  const after = tally();
  for (const [order, kind] of firstKinds) {
    if (kind !== 'executed') continue;
    const w = order.split('-')[1].slice(1);
    const answer = await protectedCall(gw.url, { subject: `kill9-caller-${w}`, args: { order_id: order, amount_cents: 100 + Number(w) } });
    classify(after, answer, order);
  }
  const ledger = await readLedger(up.ledger);
  tl.wrong_caller += after.wrong_caller;
  const lost = after.executed; // acknowledged, then executed again: the claim was lost
  tl.codes.rerun_after_restart = lost;
  return report('postgres-kill9', tl, {
    executions: ledger.length,
    doubles: doubleExecutions(ledger) + lost,
    extra: `acknowledged_then_replayed=${after.replays}`,
  });
};

// --- the key table locked: claims must end at the store deadline, and never run later -------
scenarios['locked-key-table'] = async (s) => {
  const db = await createDatabase();
  const up = await startRefundServer(s, { jsonResponse: true });
  const gw = await startGateway(s, {
    upstream: up.url,
    databaseUrl: db,
    config: { subject: SUBJECT, ...POLICY, defaults: { on_store_down: 'reject' } },
  });
  // one warm-up call creates nothing the lock needs; the table exists after migrations
  const locker = spawn('psql', [db, '-v', 'ON_ERROR_STOP=1', '-qc',
    'BEGIN; LOCK TABLE idem_keys IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(12); COMMIT;']);
  const lockerDone = new Promise((r) => locker.on('exit', r));
  await waitFor(async () => (await psql(db, "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE c.relname = 'idem_keys' AND l.mode = 'AccessExclusiveLock' AND l.granted")) === '1',
    { what: 'the lock on idem_keys' });
  const readyWhileLocked = (await fetch(`${gw.adminUrl}/readyz`, { signal: AbortSignal.timeout(15000) }).catch(() => ({ status: 'none' }))).status;
  // the callers give up after 8 s, as agents do; the lock is held for 12 s
  const { tl, firstKinds } = await load(gw.url, { workers: 8, perWorker: 1, tag: 'locked', timeoutMs: 8000, repeat: false });
  const refused = [...firstKinds].filter(([, k]) => k !== 'executed').map(([o]) => o);
  await lockerDone;
  // a barrier: calls after the release go through the same store connections
  await load(gw.url, { workers: 8, perWorker: 1, tag: 'barrier' });
  const ledger = await readLedger(up.ledger);
  const late = ledger.filter((e) => refused.includes(e.order_id)).length;
  tl.codes.executed_after_refusal = late;
  return report('locked-key-table', tl, {
    executions: ledger.filter((e) => e.order_id.startsWith('locked')).length,
    doubles: doubleExecutions(ledger) + late,
    extra: `readyz_while_locked=${readyWhileLocked}`,
    failIf: readyWhileLocked === 200, // a store that does not answer is not ready
  });
};

// --- the database path stalls (accepts, never answers; or stops mid-handshake) --------------
// The store's connections are cut and every new one stalls: /readyz must go down, protected
// calls be refused with nothing executed, and the store must come back by itself (no restart)
// once the path passes bytes again; each connection has a deadline from its start to ready.
async function stalledStoreScenario(s, name, mode) {
  const POOL = 2;
  const proxy = await startStallProxy(s, await createDatabase());
  const up = await startRefundServer(s, { jsonResponse: true });
  const gw = await startGateway(s, {
    upstream: up.url,
    databaseUrl: proxy.url,
    config: { subject: SUBJECT, ...POLICY, store: { timeout: '1s', pool: POOL }, defaults: { on_store_down: 'reject' } },
  });
  const readyz = async () => (await fetch(`${gw.adminUrl}/readyz`, { signal: AbortSignal.timeout(15000) }).catch(() => ({ status: 'none' }))).status;
  const before = await load(gw.url, { workers: 4, perWorker: 5, tag: `${name}-before` });
  proxy.setMode(mode, { cut: true });
  await waitFor(async () => (await readyz()) !== 200, { timeoutMs: 30000, what: '/readyz to go down' });
  // not wedged: connections that never became ready are dropped and tried again
  const seen = proxy.accepted();
  await proxy.waitAccepted(seen + POOL + 1, { timeoutMs: 60000 });
  const readyWhileStalled = await readyz();
  const during = await load(gw.url, { workers: 4, perWorker: 3, tag: `${name}-stalled`, repeat: false, timeoutMs: 15000 });
  const ranWhileStalled = (await readLedger(up.ledger)).filter((e) => e.order_id.startsWith(`${name}-stalled`)).length;
  proxy.setMode('pass');
  const recovered = await waitFor(async () => (await readyz()) === 200, { timeoutMs: 60000, what: '/readyz to recover' })
    .then(() => true, () => false);
  const after = await load(gw.url, { workers: 4, perWorker: 5, tag: `${name}-after` });
  const tl = tally();
  for (const part of [before.tl, during.tl, after.tl]) {
    for (const k of ['calls', 'executed', 'replays', 'refusals', 'http_errors', 'wrong_caller']) tl[k] += part[k];
    for (const [k, v] of Object.entries(part.codes)) tl.codes[k] = (tl.codes[k] ?? 0) + v;
  }
  const refusedStalled = during.tl.codes.store_unavailable ?? 0;
  const ledger = await readLedger(up.ledger);
  return report(name, tl, {
    executions: ledger.length,
    doubles: doubleExecutions(ledger),
    extra: `readyz_while_stalled=${readyWhileStalled} refused_while_stalled=${refusedStalled}/${during.tl.calls} ` +
      `ran_while_stalled=${ranWhileStalled} recovered=${recovered ? 'yes' : 'no'} after_executed=${after.tl.executed}`,
    failIf: readyWhileStalled === 200 || ranWhileStalled > 0 || refusedStalled !== during.tl.calls || !recovered ||
      after.tl.executed !== 20,
  });
}

scenarios['store-blackhole'] = (s) => stalledStoreScenario(s, 'store-blackhole', 'stall');
scenarios['store-handshake-stall'] = (s) => stalledStoreScenario(s, 'store-handshake-stall', 'handshake');

// --- callers on each other's calls (tests/faults/tenant.mjs) ---------------------------------
Object.assign(scenarios, tenantScenarios);
Object.assign(scenarios, campaignScenarios);

// --- the embedded store's files deleted under a running gateway -----------------------------
// It must stop serving protected calls (its keys are in files nobody else can open), and a
// second gateway on the same path must be the only one that runs a call.
scenarios['sqlite-deleted'] = async (s) => {
  const dir = await tempDir(s, 'idemgw-faults-sqlite-');
  const file = path.join(dir, 'keys.db');
  const up = await startRefundServer(s, { jsonResponse: true });
  const config = { subject: SUBJECT, ...POLICY, store: { cache_entries: 0 } };
  const gw = await startGateway(s, { upstream: up.url, databaseUrl: `sqlite:${file}`, config });
  const before = await load(gw.url, { workers: 4, perWorker: 5, tag: 'sqlite-before' });
  for (const suffix of ['', '-wal', '-shm', '.lock']) await fs.rm(`${file}${suffix}`, { force: true });
  const readyz = async (g) => (await fetch(`${g.adminUrl}/readyz`).catch(() => ({ status: 'none' }))).status;
  const down = await waitFor(async () => (await readyz(gw)) === 503, { timeoutMs: 15000, what: '/readyz down' }).then(() => true, () => false);
  const gw2 = await startGateway(s, { upstream: up.url, databaseUrl: `sqlite:${file}`, config });
  // the same orders through both gateways: each may run once, on the second only
  const first = await load(gw.url, { workers: 4, perWorker: 3, tag: 'sqlite-both', repeat: false });
  const second = await load(gw2.url, { workers: 4, perWorker: 3, tag: 'sqlite-both', repeat: false });
  const tl = tally();
  for (const part of [before.tl, first.tl, second.tl]) {
    for (const k of ['calls', 'executed', 'replays', 'refusals', 'http_errors', 'wrong_caller']) tl[k] += part[k];
    for (const [k, v] of Object.entries(part.codes)) tl.codes[k] = (tl.codes[k] ?? 0) + v;
  }
  const ledger = await readLedger(up.ledger);
  return report('sqlite-deleted', tl, {
    executions: ledger.length,
    doubles: doubleExecutions(ledger),
    extra: `readyz_down=${down ? 'yes' : 'no'} first_executed_after_delete=${first.tl.executed} second_executed=${second.tl.executed}`,
    failIf: !down || first.tl.executed > 0 || second.tl.executed !== 12,
  });
};

/** Opens n TCP connections to port and keeps them; returns them. */
async function openIdle(port, n) {
  const socks = [];
  for (let i = 0; i < n; i++) {
    const sock = net.connect(port, '127.0.0.1');
    sock.on('error', () => {});
    socks.push(sock);
  }
  await Promise.all(socks.map((sk) => new Promise((r) => {
    sk.once('connect', r);
    sk.once('error', r);
    sk.once('close', r);
  })));
  return socks;
}

// --- descriptors run out: the gateway must not spin, must keep serving what it can -----------
scenarios.emfile = async (s) => {
  const db = await createDatabase();
  const up = await startRefundServer(s, { jsonResponse: true });
  const dir = await tempDir(s, 'idemgw-emfile-');
  const port = await freePort();
  const adminPort = await freePort();
  const cfg = path.join(dir, 'idemgw.yaml');
  await fs.writeFile(cfg, toYaml({
    listen: `127.0.0.1:${port}`, admin_listen: `127.0.0.1:${adminPort}`, upstream: up.url, database_url: db,
    subject: SUBJECT, ...POLICY,
  }));
  const gw = await startProcess(s, 'sh', ['-c', `ulimit -n 400; exec "$0" -c "$1"`, IDEMGW_BIN, cfg], {
    readyUrl: `http://127.0.0.1:${adminPort}/readyz`, name: 'idemgw',
  });
  const url = `http://127.0.0.1:${port}/mcp`;
  let lines = 0; // counted as they come: a flood may outgrow what the harness keeps
  const count = (chunk) => (lines += (String(chunk).match(/too many open files|descriptors|max_connections/gi) ?? []).length);
  gw.proc.stdout.on('data', count);
  gw.proc.stderr.on('data', count);
  const cpu = async () => {
    const f = (await fs.readFile(`/proc/${gw.proc.pid}/stat`, 'utf8')).split(') ')[1].split(' ');
    return (Number(f[11]) + Number(f[12])) * 10; // utime + stime, clock ticks of 10 ms
  };
  const idle = await openIdle(port, 600);
  const cpu0 = await cpu();
  // calls while the descriptors are gone: each may be refused or fail, none may run twice
  const during = await load(url, { workers: 4, perWorker: 5, tag: 'emfile', timeoutMs: 5000 });
  const cpuSpent = (await cpu()) - cpu0;
  for (const sk of idle) sk.destroy();
  // once they are back, new connections are served again
  const after = await waitFor(async () => {
    const session = await openSession(url, 'emfile-after').catch(() => null);
    if (!session) return null;
    const a = await protectedCall(url, { subject: 'emfile-after', session, args: { order_id: `emfile-after-${Date.now()}`, amount_cents: 1 } });
    return a.status === 200 && a.message ? a : null;
  }, { timeoutMs: 20000, what: 'a call served after the idle connections closed' });
  const tl = during.tl;
  classify(tl, after, after.message.result.content[0].text.match(/order (\S+)/)[1]);
  const ledger = await readLedger(up.ledger);
  return report('emfile', tl, {
    executions: ledger.length,
    doubles: doubleExecutions(ledger),
    extra: `log_lines=${lines} cpu_ms=${cpuSpent} recovered=yes`,
  });
};

// --- 1,500 slowloris connections: normal calls must still be served -------------------------
scenarios.slowloris = async (s) => {
  const db = await createDatabase();
  const up = await startRefundServer(s, { jsonResponse: true });
  const gw = await startGateway(s, {
    upstream: up.url,
    databaseUrl: db,
    config: { subject: SUBJECT, ...POLICY, timeouts: { client_header: '3s' }, limits: { max_connections: 4000 } },
  });
  const socks = await openIdle(gw.port, 1500);
  let open = true;
  const drip = setInterval(() => {
    for (const sk of socks) if (!sk.destroyed) sk.write('X-Slow: a\r\n');
  }, 500);
  for (const sk of socks) sk.write('POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n');
  const closed = Promise.all(socks.map((sk) => new Promise((r) => (sk.destroyed ? r() : sk.once('close', r)))));
  const { tl } = await load(gw.url, { workers: 8, perWorker: 20, tag: 'slowloris', stop: () => !open });
  const cut = await Promise.race([closed.then(() => true), new Promise((r) => setTimeout(() => r(false), 20000))]);
  open = false;
  clearInterval(drip);
  for (const sk of socks) sk.destroy();
  const ledger = await readLedger(up.ledger);
  return report('slowloris', tl, {
    executions: ledger.length,
    doubles: doubleExecutions(ledger),
    extra: `slow_connections_closed_by_gateway=${cut ? 'all' : 'not all'}`,
    maxErrors: 0,
  });
};

// --- misbehaving upstreams (tests/fixtures/bad-upstream.mjs), one scenario per mode ----------
// The fixture's modes (its MODES table) that a load of protected calls meets.
const UPSTREAM_MODES = ['normal', 'stray', 'wrong-id', 'wrong-id-sse', 'gzip', 'deflate', 'br', 'unknown-coding',
  'http10', 'sse-bom', 'redirect', 'wrong-id-reused'];

async function upstreamScenario(s, mode) {
  const db = await createDatabase();
  const up = await startProcess(s, NODE, [path.join(TESTS, 'fixtures/bad-upstream.mjs'), '0', mode], {
    readyLine: /listening on port (\d+)/, name: `bad-upstream(${mode})`,
  });
  const upUrl = `http://127.0.0.1:${up.match[1]}/mcp`;
  const gw = await startGateway(s, {
    upstream: upUrl,
    databaseUrl: db,
    config: { subject: SUBJECT, tools: { read_notes: { class: 'read' } } },
  });
  const session = await openSession(gw.url, 'faults');
  // reads as another caller keep the connections busy, as in the report that found the desync
  let reading = true;
  const readers = [];
  for (let r = 0; r < 4; r++) {
    readers.push((async () => {
      while (reading) await protectedCall(gw.url, { subject: 'reader', tool: 'read_notes', args: { order_id: 'reader-notes' }, session, timeoutMs: 5000 });
    })());
  }
  const workers = 8;
  const perWorker = 15;
  const { tl } = await load(gw.url, { workers, perWorker, tag: `up-${mode}`, timeoutMs: 10000 });
  reading = false;
  await Promise.all(readers);
  const count = await (await fetch(`${upUrl.replace(/\/mcp$/, '')}/count`)).json();
  const executions = count.executions?.issue_refund ?? 0;
  // every order is new: more executions than orders means one of them ran twice
  return report(`upstream:${mode}`, tl, { executions, doubles: Math.max(0, executions - workers * perWorker) });
}

// --- other spellings of the endpoint and unreadable bodies, against two real frameworks -------
// Each spelling of /mcp, each body the gateway cannot read and each route it never classifies
// (a body on GET/HEAD/DELETE, UTF-16/32 off the endpoint, a tools/call notification) is sent as
// 3 concurrent copies with the same arguments: a spelling runs exactly once, the others never.
// The Express app is the lenient one (LENIENT=1), which runs a call by each of those routes.
async function bypassScenario(s, framework) {
  let upUrl, ledger;
  if (framework === 'sdk') {
    const up = await startRefundServer(s, { jsonResponse: true });
    [upUrl, ledger] = [up.url, up.ledger];
  } else {
    ledger = path.join(await tempDir(s, 'idemgw-express-'), 'ledger.jsonl');
    const shop = await startProcess(s, NODE, [path.join(TESTS, 'fixtures/express-shop.mjs'), '0'], {
      env: { LEDGER: ledger, JSON_RESPONSE: '1', LENIENT: '1' }, readyLine: /listening on port (\d+)/, name: 'express-shop',
    });
    upUrl = `http://127.0.0.1:${shop.match[1]}/mcp`;
  }
  const gw = await startGateway(s, { upstream: upUrl, databaseUrl: await createDatabase() });
  await waitForLog(gw, /tool catalogue: \d+ tools listed by the upstream/);
  const init = await rawRequest(gw.port, {
    target: '/mcp',
    body: Buffer.from(JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'faults', version: '1' } } })),
  });
  const session = init.headers['mcp-session-id'] ? { 'Mcp-Session-Id': init.headers['mcp-session-id'] } : {};
  const tool = framework === 'sdk' ? 'issue_refund' : 'place_order';
  const argsFor = (tag) => (framework === 'sdk' ? { order_id: tag, amount_cents: 5 } : { item: tag, quantity: 1 });
  const executionsOf = async (tag) => (await readLedger(ledger)).filter((e) => (e.order_id ?? e.item) === tag).length;
  const tl = { sent: 0, executions: 0, doubles: 0, refused: 0, wrong: 0 };
  let n = 0;
  const variants = [];
  for (const sp of spellings(gw.port)) {
    const tag = `sp-${++n}`;
    variants.push({ tag, target: sp.target, body: Buffer.from(callBody(tag, tool, argsFor(tag))), want: sp.expect === 'protected' ? 1 : 0 });
  }
  // spellings each framework routes to its endpoint (and one it does not), with each body
  const bodyTargets = framework === 'sdk' ? ['/mcp', '/./mcp', '/x/../mcp', '/other'] : ['/mcp', '/MCP', '/mcp/', '/other'];
  for (const target of bodyTargets) {
    for (const b of unreadableBodies(tool, argsFor(`body-${++n}`))) {
      variants.push({ tag: `body-${n}`, target, body: b.body, headers: b.headers, want: 0 });
    }
  }
  // each route with arguments of its own, so the ledger tells its executions apart
  for (let i = 0; i < unclassifiedRoutes(tool, {}).length; i++) {
    const tag = `route-${++n}`;
    variants.push({ ...unclassifiedRoutes(tool, argsFor(tag))[i], tag, want: 0 });
  }
  for (const v of variants) {
    const answers = await Promise.all([0, 1, 2].map(() => rawRequest(gw.port, {
      method: v.method, target: v.target, headers: { ...session, ...(v.headers ?? {}) }, body: v.body, chunked: v.chunked,
    })));
    tl.sent += answers.length;
    tl.refused += answers.filter((a) => a.status >= 400).length;
    const ran = await executionsOf(v.tag);
    tl.executions += ran;
    if (ran > v.want) tl.doubles += ran - v.want;
    if (ran < v.want) tl.wrong++;
  }
  const line = `sent ${tl.sent}, executions ${tl.executions}, refused ${tl.refused}, ran more than allowed ${tl.doubles}, protected spelling never ran ${tl.wrong}`;
  const ok = tl.doubles === 0 && tl.wrong === 0;
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${`bypass:${framework}`.padEnd(24)} ${line}`);
  return ok;
}

// ---------------------------------------------------------------------------------------------

const wanted = process.argv.slice(2);
const all = [...Object.keys(scenarios), ...UPSTREAM_MODES.map((m) => `upstream:${m}`), 'bypass:sdk', 'bypass:express'];
const names = wanted.length ? wanted : all;
let failed = 0;
for (const name of names) {
  const s = scope(name);
  let ok = false;
  try {
    if (name.startsWith('upstream:')) ok = await upstreamScenario(s, name.slice(9));
    else if (name.startsWith('bypass:')) ok = await bypassScenario(s, name.slice(7));
    else ok = await scenarios[name](s);
  } catch (err) {
    console.log(`FAIL ${name.padEnd(24)} error: ${err.message.split('\n')[0]}`);
    process.stderr.write(`${err.stack}\n`);
  }
  if (!ok) failed++;
  s.passed = ok; // the harness prints what a failed scenario started
  await s.close();
}
tenantSummary();
console.log(`faults: ${names.length - failed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
