// The tenant suite of the fault suite (`make faults FAULTS="tenant:..."`): two or three callers
// (alice, bob, mallory; the subject from the X-Subject header) on every resource the gateway
// shares between them (a spawned child's descriptors, a shared stdio child, the sessionless
// path, the HTTP upstream's kept-alive connections, a session's streams, the store), one of
// them trying to read, answer or cancel another's call. Each scenario counts its breaches
// (a caller given, or able to decide, what belongs to another) and fails on one; run.mjs
// prints `tenant: breaches=N` after them.
import fs from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ElicitRequestSchema, LoggingMessageNotificationSchema } from '@modelcontextprotocol/sdk/types.js';
import { Agent, fetch as undiciFetch } from 'undici';
import {
  NODE, TESTS, createDatabase, findResponse, rawSession, readLedger, sseReader, startEverything, startGateway,
  startProcess, startRefundServer, tempDir, toolText, waitFor, waitForLog,
} from '../integration/lib/harness.mjs';
import { report, tally } from './lib.mjs';

const SUBJECT = { header: 'X-Subject' };
const LEDGER_SERVER = path.join(TESTS, 'fixtures/ledger-stdio.mjs');
const ACCEPT = 'application/json, text/event-stream';
const V2026 = '2026-07-28';
const META_VERSION = 'io.modelcontextprotocol/protocolVersion';

let breachesTotal = 0;
let scenariosRun = 0;

/** The suite's last line, once any of its scenarios ran: `tenant: breaches=N`. */
export function tenantSummary() {
  if (scenariosRun) console.log(`tenant: breaches=${breachesTotal}`);
}

/** A scenario counted for the summary even when it ends in an error. */
const counted = (fn) => (s) => {
  scenariosRun++;
  return fn(s);
};

/**
 * The end of a scenario: its line (report's counts, then breaches=N and what they were), the
 * total for the summary; fails when a breach was seen.
 */
function finish(name, tl, breaches, extra = '') {
  breachesTotal += breaches.length;
  const distinct = [...new Set(breaches)];
  const more = distinct.length > 6 ? `; (+${distinct.length - 6} more)` : '';
  const what = breaches.length ? ` breach: ${distinct.slice(0, 6).join('; ')}${more}` : '';
  return report(name, tl, { extra: `breaches=${breaches.length}${extra ? ` ${extra}` : ''}${what}`, failIf: breaches.length > 0 });
}

/** Files one answer into the tally: answered with a result, or not. */
function count(tl, ok, code) {
  tl.calls++;
  if (ok) tl.executed++;
  else {
    tl.http_errors++;
    if (code) tl.codes[code] = (tl.codes[code] ?? 0) + 1;
  }
}

/** A gateway in front of the ledger fixture (LOG_WIRE: it logs the cancels and answers it gets). */
async function stdioGateway(s, { sessions = 'per_session', config = {}, upstream = {} } = {}) {
  const dir = await tempDir(s, 'idemgw-tenant-');
  const ledger = path.join(dir, 'ledger.jsonl');
  const gw = await startGateway(s, {
    upstream: { command: [NODE, LEDGER_SERVER], env: { LEDGER: ledger, LOG_WIRE: '1' }, sessions, ...upstream },
    databaseUrl: await createDatabase(),
    config: { subject: SUBJECT, ...config },
  });
  return { gw, ledger, dir };
}

const ledgerWith = async (file, pred) => (await readLedger(file)).filter(pred);
const waitForEntry = (file, pred, what) => waitFor(async () => (await ledgerWith(file, pred)).length > 0, { timeoutMs: 15000, what });

/** An SDK 1.x client for subject, on a dispatcher of its own (so hanging up closes its sockets). */
async function sdkClient(s, url, subject, { capabilities = {}, onElicit, onLog } = {}) {
  const agent = new Agent();
  const client = new Client({ name: `tenant-${subject}`, version: '1.0.0' }, { capabilities });
  if (onElicit) client.setRequestHandler(ElicitRequestSchema, onElicit);
  if (onLog) client.setNotificationHandler(LoggingMessageNotificationSchema, onLog);
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { 'X-Subject': subject } },
    fetch: (u, init) => undiciFetch(u, { ...init, dispatcher: agent }),
  });
  await client.connect(transport);
  const hangUp = async () => {
    await client.close().catch(() => {});
    await agent.destroy().catch(() => {});
  };
  s.after(hangUp);
  return { client, transport, hangUp };
}

/**
 * One 2026-07-28 request as the v2 client sends it: no session, the mirrored headers, the
 * version, clientInfo and capabilities in _meta; given up after timeoutMs. Returns {status, text, message}.
 */
async function post2026(url, method, params, { id, subject, caps = {}, timeoutMs = 15000 } = {}) {
  const name = params?.name;
  const headers = {
    Accept: ACCEPT, 'Content-Type': 'application/json', 'MCP-Protocol-Version': V2026, 'Mcp-Method': method,
    ...(name !== undefined ? { 'Mcp-Name': name } : {}), 'X-Subject': subject,
  };
  const meta = { [META_VERSION]: V2026, 'io.modelcontextprotocol/clientInfo': { name: `tenant-${subject}`, version: '1' }, 'io.modelcontextprotocol/clientCapabilities': caps };
  const body = id === undefined ? { jsonrpc: '2.0', method, params: { ...params, _meta: meta } } : { jsonrpc: '2.0', id, method, params: { ...params, _meta: meta } };
  try {
    const res = await fetch(url, { method: 'POST', headers, body: JSON.stringify(body), signal: AbortSignal.timeout(timeoutMs) });
    const text = await res.text();
    let message = null;
    try {
      message = id === undefined ? null : findResponse(res.headers.get('content-type'), text, id);
    } catch {
      // not JSON-RPC: message stays null
    }
    return { status: res.status, text, message };
  } catch (err) {
    return { status: 0, text: err.message, message: null };
  }
}

const pidOf = (text) => Number(/pid (\d+)/.exec(text ?? '')?.[1] ?? 0);

// --- 1. a spawned child holds none of the gateway's descriptors; an idle gateway idles -------
async function fdLinks(pid) {
  const out = new Map();
  for (const fd of await fs.readdir(`/proc/${pid}/fd`).catch(() => [])) {
    const target = await fs.readlink(`/proc/${pid}/fd/${fd}`).catch(() => null);
    if (target) out.set(Number(fd), target);
  }
  return out;
}

async function cpuTicks(pid) {
  const stat = await fs.readFile(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return Number(f[11]) + Number(f[12]); // utime + stime, in clock ticks
}

/** A descriptor two processes can only share by inheritance: a socket, a pipe or a file. */
const comparable = (target) => /^(socket|pipe):\[\d+\]$/.test(target) || (target.startsWith('/') && !target.startsWith('/dev/'));

const spawnedFds = async (s) => {
  const name = 'tenant:spawned-fds';
  const tl = tally();
  const breaches = [];
  const { gw } = await stdioGateway(s);
  // alice: a real client with its GET stream open, and a kept-alive connection of her own
  const alice = await sdkClient(s, gw.url, 'alice');
  const aliceWho = await alice.client.callTool({ name: 'whoami', arguments: {} });
  count(tl, pidOf(toolText(aliceWho)) > 0);
  const kept = net.connect(gw.port, '127.0.0.1');
  kept.on('error', () => {});
  await new Promise((r) => kept.once('connect', r));
  kept.write(`GET /healthz-not-here HTTP/1.1\r\nHost: 127.0.0.1:${gw.port}\r\n\r\n`);
  await new Promise((r) => kept.once('data', r));

  // bob's session starts a child while alice's connections are open
  const bob = await rawSession(s, gw.url, { headers: { 'X-Subject': 'bob' } });
  const who = await bob.call('whoami', {});
  const bobPid = pidOf(toolText(who.message?.result));
  count(tl, bobPid > 0);
  if (!bobPid) throw new Error(`bob's whoami: ${who.status} ${who.body}`);
  const gwFds = await fdLinks(gw.proc.pid);
  const gwTargets = new Set([...gwFds.values()].filter(comparable));
  const childFds = await fdLinks(bobPid);
  let sockets = 0;
  let others = 0;
  for (const [fd, target] of childFds) {
    if (fd <= 2) {
      if (!target.startsWith('pipe:')) breaches.push(`child fd ${fd} is ${target}, not a pipe`);
      continue;
    }
    if (!comparable(target) || !gwTargets.has(target)) continue;
    if (target.startsWith('socket:')) sockets++;
    else others++;
    breaches.push(`child fd ${fd} is the gateway's ${target.replace(/:\[\d+\]$/, '')}`);
  }

  // alice hangs up; once the gateway has let her connections go it must sit idle
  const socketsOf = async () => [...(await fdLinks(gw.proc.pid)).values()].filter((t) => t.startsWith('socket:')).length;
  const before = await socketsOf();
  await alice.hangUp();
  kept.destroy();
  const closed = await waitFor(async () => (await socketsOf()) <= before - 2, { timeoutMs: 10000, what: 'the gateway to close alice\'s connections' })
    .then(() => true, () => false);
  const t0 = await cpuTicks(gw.proc.pid);
  await new Promise((r) => setTimeout(r, 2000)); // the measurement window, not a wait for an event
  const idleTicks = (await cpuTicks(gw.proc.pid)) - t0;
  if (idleTicks > 5) breaches.push(`the idle gateway used ${idleTicks} ticks in 2 s`);
  const alive = await bob.call('whoami', {});
  count(tl, pidOf(toolText(alive.message?.result)) === bobPid);
  return finish(name, tl, breaches,
    `child_fds=${childFds.size} shared_sockets=${sockets} shared_other=${others} alice_closed=${closed ? 'yes' : 'no'} idle_ticks_2s=${idleTicks}`);
};

// --- 2. a sessionless cancel naming another caller's request id ------------------------------
async function cancelAttack(url, ledger, tl, breaches, { go, readTool }) {
  // alice: a protected call id 1 (and, on stdio, a read id 2), both held until `go` exists
  const protectedCall = post2026(url, 'tools/call', { name: 'slow_refund', arguments: { order_id: 'alice-1', amount_cents: 7, wait_for: go } }, { id: 1, subject: 'alice', timeoutMs: 10000 });
  await waitForEntry(ledger, (e) => e.tool === 'slow_refund' && e.order_id === 'alice-1', 'alice\'s slow_refund to run');
  let readCall = null;
  if (readTool) {
    readCall = post2026(url, 'tools/call', { name: 'echo', arguments: { text: 'alice-read-2', wait_for: go } }, { id: 2, subject: 'alice', timeoutMs: 10000 });
    await waitForEntry(ledger, (e) => e.tool === 'echo_waiting' && e.text === 'alice-read-2', 'alice\'s read to run');
  }
  const statuses = [];
  for (const requestId of readTool ? [1, '1', 2] : [1, '1']) {
    const r = await post2026(url, 'notifications/cancelled', { requestId, reason: 'mallory' }, { subject: 'mallory' });
    statuses.push(r.status);
  }
  // the gateway has seen mallory's cancels (each answered) before alice's calls are released
  await fs.writeFile(go, '');
  const p = await protectedCall;
  const ok = /Refunded 7 cents on order alice-1|Refunded 7 on alice-1/.test(toolText(p.message?.result)) && !p.message?.result?.isError;
  count(tl, ok, ok ? null : 'alice_protected_not_answered');
  if (!ok) breaches.push(`alice's protected call was not answered (${p.status} ${p.text.slice(0, 120)})`);
  if (readCall) {
    const r = await readCall;
    const rok = toolText(r.message?.result) === 'alice-read-2';
    count(tl, rok, rok ? null : 'alice_read_not_answered');
    if (!rok) breaches.push(`alice's read was cancelled by mallory (${r.status} ${r.text.slice(0, 120)})`);
  }
  const reached = await ledgerWith(ledger, (e) => e.tool === 'cancel_received' || e.tool === 'aborted');
  if (reached.length) breaches.push(`the upstream got mallory's cancel (${reached.map((e) => `${e.tool} ${e.request_id ?? e.order_id}`).join(', ')})`);
  return statuses;
}

const sessionlessCancel = async (s) => {
  const name = 'tenant:sessionless-cancel';
  const tl = tally();
  const breaches = [];
  const tools = { slow_refund: { on_cancel: 'forward' }, get_ledger: { class: 'read' } };
  // an HTTP upstream that speaks 2026-07-28 (the v2 fixture), logging the cancels it receives
  const dir = await tempDir(s, 'idemgw-tenant-v2-');
  const ledger = path.join(dir, 'ledger.jsonl');
  const v2 = await startProcess(s, NODE, [path.join(TESTS, 'fixtures/v2-server.mjs'), '0'], {
    env: { LEDGER: ledger, LOG_WIRE: '1' }, readyLine: /listening on port (\d+)/, name: 'v2-fixture',
  });
  const gwHttp = await startGateway(s, {
    upstream: `http://127.0.0.1:${v2.match[1]}/mcp`, databaseUrl: await createDatabase(), config: { subject: SUBJECT, tools },
  });
  const httpStatuses = await cancelAttack(gwHttp.url, ledger, tl, breaches, { go: path.join(dir, 'go'), readTool: false });
  // a stdio upstream: sessionless callers share its child
  const st = await stdioGateway(s, { config: { tools } });
  const stdioStatuses = await cancelAttack(st.gw.url, st.ledger, tl, breaches, { go: path.join(st.dir, 'go'), readTool: true });
  return finish(name, tl, breaches, `cancel_status_http=${httpStatuses.join('/')} cancel_status_stdio=${stdioStatuses.join('/')}`);
};

// --- 3. an elicitation of bob's call: only bob sees it, only bob's answer decides -------------
/** Alice posts answers to the elicitation: the id bob saw, then guesses 0..20. */
async function foreignAnswers(post, bobId) {
  const ids = [bobId, ...Array.from({ length: 21 }, (_, i) => i)].filter((v, i, a) => a.indexOf(v) === i);
  const statuses = {};
  for (const id of ids) {
    const st = await post({ jsonrpc: '2.0', id, result: { action: 'decline', _meta: { from: 'alice' } } });
    statuses[st] = (statuses[st] ?? 0) + 1;
  }
  return Object.entries(statuses).map(([k, v]) => `${k}x${v}`).join(',');
}

/** A round's promises: who was asked first, and when bob may answer. */
function newRound() {
  const r = {};
  r.bob = new Promise((res) => { r.onBob = res; });
  r.alice = new Promise((res) => { r.onAlice = res; });
  r.may = new Promise((res) => { r.allow = res; });
  return r;
}

const within = (p, ms, value) => Promise.race([p, new Promise((r) => setTimeout(() => r(value), ms))]);

/**
 * Sessions on a shared child, two rounds: alice with a call in flight newer than bob's when
 * the server asks (where does the question go?), then alice idle (the question goes to bob:
 * can alice's answers decide it?).
 */
async function elicitationSessions(s, tl, breaches) {
  const { gw, ledger, dir } = await stdioGateway(s, { sessions: 'shared' });
  let round = null;
  let aliceSaw = 0;
  const bob = await sdkClient(s, gw.url, 'bob', {
    capabilities: { elicitation: {} },
    onElicit: async (req, extra) => {
      const r = round;
      r.onBob(extra.requestId);
      await r.may;
      return { action: 'accept', content: { ok: true } };
    },
  });
  const alice = await sdkClient(s, gw.url, 'alice', {
    capabilities: { elicitation: {} },
    onElicit: async () => {
      aliceSaw++;
      round.onAlice();
      return { action: 'decline' };
    },
  });
  const postAsAlice = async (msg) => {
    const r = await fetch(gw.url, {
      method: 'POST',
      headers: { Accept: ACCEPT, 'Content-Type': 'application/json', 'MCP-Protocol-Version': '2025-11-25', 'Mcp-Session-Id': alice.transport.sessionId, 'X-Subject': 'alice' },
      body: JSON.stringify(msg),
    });
    await r.arrayBuffer();
    return r.status;
  };
  const out = [];
  for (const busy of [true, false]) {
    round = newRound();
    const order = `bob-${busy ? 'busy' : 'idle'}`;
    const go = path.join(dir, `go-${order}`);
    const goAlice = path.join(dir, `go-alice-${order}`);
    const bobCall = bob.client.callTool({ name: 'confirm_refund', arguments: { order_id: order, amount_cents: 5, wait_for: go } }, undefined, { timeout: 20000 })
      .catch((err) => ({ content: [{ type: 'text', text: `error: ${err.message}` }] }));
    await waitForEntry(ledger, (e) => e.tool === 'confirm_waiting' && e.order_id === order, `bob's confirm_refund ${order} to wait`);
    let aliceCall = null;
    if (busy) {
      aliceCall = alice.client.callTool({ name: 'echo', arguments: { text: 'alice-busy', wait_for: goAlice } }, undefined, { timeout: 20000 }).catch(() => null);
      await waitForEntry(ledger, (e) => e.tool === 'echo_waiting' && e.text === 'alice-busy', 'alice\'s echo to wait');
    }
    await fs.writeFile(go, '');
    // the gateway says when the question reached no one: no need to wait out the window
    const nobody = waitForLog(gw, new RegExp(`'elicitation/create' reaches no client`), { timeoutMs: 15000 }).then(() => ({ who: 'nobody' }), () => ({ who: 'nobody' }));
    const first = await within(Promise.race([round.bob.then((id) => ({ who: 'bob', id })), round.alice.then(() => ({ who: 'alice' })), ...(busy ? [nobody] : [])]), 15000, { who: 'nobody' });
    let posts = '-';
    if (first.who === 'bob') posts = await foreignAnswers(postAsAlice, first.id);
    round.allow();
    const bobResult = await bobCall;
    // with calls of both in flight on one shared child, the server's question cannot be told
    // to be bob's: it reaches no one and bob's call fails with why (not a breach: nobody else
    // decided it); asked alone, bob's answer decides his call
    const refused = busy && first.who === 'nobody' && /cannot tell which of its clients/.test(toolText(bobResult));
    const bobOk = refused || new RegExp(`Refunded 5 on ${order}`).test(toolText(bobResult));
    count(tl, bobOk, bobOk ? null : 'bob_not_refunded');
    if (!bobOk) breaches.push(`sessions, alice ${busy ? 'busy' : 'idle'}: bob's answer did not decide his call (${toolText(bobResult).slice(0, 60)})`);
    if (aliceCall) {
      await fs.writeFile(goAlice, '');
      count(tl, toolText(await aliceCall) === 'alice-busy');
    }
    out.push(`${busy ? 'busy' : 'idle'}:asked=${first.who},alice_posts=${posts}`);
  }
  if (aliceSaw) breaches.push(`sessions: alice was asked bob's question (${aliceSaw}x)`);
  const declines = await ledgerWith(ledger, (e) => e.tool === 'response_received' && e.answer?.action === 'decline');
  if (declines.length) breaches.push(`sessions: the child got alice's answers (${declines.length})`);
  return `sessions[${out.join(' ')}]`;
}

/** The same two rounds with sessionless 2026-07-28 callers of a per_session 2025 server: there
 * the server cannot ask (that era has none of its requests), and nobody is asked. */
async function elicitationSessionless(s, tl, breaches) {
  const { gw, ledger, dir } = await stdioGateway(s, { sessions: 'per_session' });
  const caps = { elicitation: { form: {} } };
  const open = (subject, id, params) => fetch(gw.url, {
    method: 'POST',
    headers: {
      Accept: ACCEPT, 'Content-Type': 'application/json', 'MCP-Protocol-Version': V2026, 'Mcp-Method': 'tools/call', 'Mcp-Name': params.name,
      'X-Subject': subject,
    },
    body: JSON.stringify({
      jsonrpc: '2.0', id, method: 'tools/call',
      params: { ...params, _meta: { [META_VERSION]: V2026, 'io.modelcontextprotocol/clientInfo': { name: subject, version: '1' }, 'io.modelcontextprotocol/clientCapabilities': caps } },
    }),
    signal: AbortSignal.timeout(20000),
  });
  /** Reads a call's stream: the elicitation requests it carries, and its result. */
  const watch = (resPromise, id) => {
    const seen = [];
    let onAsk;
    const asked = new Promise((r) => { onAsk = r; });
    const done = (async () => {
      const res = await resPromise;
      if (!(res.headers.get('content-type') ?? '').startsWith('text/event-stream')) return { text: await res.text() };
      const reader = sseReader(res);
      for (let ev = await reader.next(); ev; ev = await reader.next()) {
        let m;
        try {
          m = JSON.parse(ev.data);
        } catch {
          continue;
        }
        if (m.method === 'elicitation/create') {
          seen.push(m);
          onAsk(m);
        } else if (m.id === id && ('result' in m || 'error' in m)) {
          return { message: m };
        }
      }
      return { message: null };
    })().catch((err) => ({ message: null, text: err.message }));
    return { seen, asked, done };
  };
  const out = [];
  let aliceSaw = 0;
  for (const busy of [true, false]) {
    const order = `bob-2026-${busy ? 'busy' : 'idle'}`;
    const go = path.join(dir, `go-${order}`);
    const goAlice = path.join(dir, `go-alice-${order}`);
    const bob = watch(open('bob', `b-${order}`, { name: 'confirm_refund', arguments: { order_id: order, amount_cents: 6, wait_for: go } }), `b-${order}`);
    await waitForEntry(ledger, (e) => e.tool === 'confirm_waiting' && e.order_id === order, `bob's sessionless confirm_refund ${order} to wait`);
    let alice = null;
    if (busy) {
      alice = watch(open('alice', 'a-1', { name: 'echo', arguments: { text: 'alice-busy-2026', wait_for: goAlice } }), 'a-1');
      await waitForEntry(ledger, (e) => e.tool === 'echo_waiting' && e.text === 'alice-busy-2026', 'alice\'s sessionless echo to wait');
    }
    await fs.writeFile(go, '');
    // The 2026 era has no requests from the server (a question comes back as input_required,
    // and a client of that era drops a request on its stream unanswered), so a 2025 server's
    // child for 2026 callers is opened without elicitation: the server cannot ask, and ends the
    // call itself. Nobody may be asked, and bob's call must end, not wait for an answer.
    const bobDone = await within(bob.done, 20000, { message: null, text: 'no answer' });
    const asked = bob.seen.length + (alice ? alice.seen.length : 0);
    const answered = !!bobDone.message;
    count(tl, answered && asked === 0, answered ? 'asked_a_2026_caller' : 'bob_not_answered');
    if (!answered) breaches.push(`sessionless, alice ${busy ? 'busy' : 'idle'}: bob's call got no answer (${(bobDone.text || '').slice(0, 60)})`);
    if (asked) breaches.push(`sessionless, alice ${busy ? 'busy' : 'idle'}: a 2026 caller was sent the server's question (${asked}x)`);
    if (alice) {
      await fs.writeFile(goAlice, '');
      const aliceDone = await within(alice.done, 20000, { message: null });
      count(tl, toolText(aliceDone.message?.result) === 'alice-busy-2026');
      aliceSaw += alice.seen.length;
    }
    const why = toolText(bobDone.message?.result).replace(/\s+/g, '_').slice(0, 40);
    out.push(`${busy ? 'busy' : 'idle'}:asked=${asked ? 'someone' : 'nobody'},bob=${why}`);
  }
  if (aliceSaw) breaches.push(`sessionless: bob's question reached alice's stream (${aliceSaw}x)`);
  const declines = await ledgerWith(ledger, (e) => e.tool === 'response_received' && e.answer?.action === 'decline');
  if (declines.length) breaches.push(`sessionless: the child got alice's answers (${declines.length})`);
  return `sessionless[${out.join(' ')}]`;
}

const sharedElicitation = async (s) => {
  const tl = tally();
  const breaches = [];
  const a = await elicitationSessions(s, tl, breaches);
  const b = await elicitationSessionless(s, tl, breaches);
  return finish('tenant:shared-elicitation', tl, breaches, `${a} ${b}`);
};

// --- 4. bob's log lines stay on bob's streams -----------------------------------------------
const sharedNotifications = async (s) => {
  const tl = tally();
  const breaches = [];
  const { gw, ledger, dir } = await stdioGateway(s, { sessions: 'shared' });
  const heard = { alice: 0, bob: 0 };
  const alice = await sdkClient(s, gw.url, 'alice', {
    onLog: (n) => {
      if (String(n.params.data).startsWith('bob-secret')) heard.alice++;
    },
  });
  const bob = await sdkClient(s, gw.url, 'bob', {
    onLog: (n) => {
      if (String(n.params.data).startsWith('bob-secret')) heard.bob++;
    },
  });
  // alice's own GET stream, read raw, besides the one her client keeps
  const ac = new AbortController();
  s.after(() => ac.abort());
  const get = await fetch(gw.url, {
    headers: { Accept: 'text/event-stream', 'Mcp-Session-Id': alice.transport.sessionId, 'MCP-Protocol-Version': '2025-11-25', 'X-Subject': 'alice' },
    signal: ac.signal,
  });
  let rawGet = '';
  const getDone = get.status === 200
    ? (async () => {
      try {
        for await (const chunk of get.body) rawGet += Buffer.from(chunk).toString('utf8');
      } catch {
        // aborted at the end
      }
    })()
    : get.text().then(() => {});
  // alice has a POST stream open while bob's call talks: first opened before bob's call,
  // then after it (the newest call in flight when bob's lines come)
  const LINES = 20;
  const rounds = [];
  for (const aliceNewer of [false, true]) {
    const tag = `bob-secret-${aliceNewer ? 'b' : 'a'}`;
    const goBob = path.join(dir, `go-${tag}`);
    const goAlice = path.join(dir, `go-alice-${tag}`);
    const before = heard.alice;
    let bobCall;
    const startBob = async () => {
      bobCall = bob.client.callTool({ name: 'chatty', arguments: { tag, lines: LINES, wait_for: goBob } }, undefined, { timeout: 30000 }).catch(() => null);
      await waitForEntry(ledger, (e) => e.tool === 'chatty_waiting' && e.tag === tag, `bob's chatty ${tag} to wait`);
    };
    if (aliceNewer) await startBob();
    const aliceCall = alice.client.callTool({ name: 'echo', arguments: { text: `alice-${tag}`, wait_for: goAlice } }, undefined, { timeout: 30000 }).catch(() => null);
    await waitForEntry(ledger, (e) => e.tool === 'echo_waiting' && e.text === `alice-${tag}`, 'alice\'s echo to wait');
    if (!aliceNewer) await startBob();
    await fs.writeFile(goBob, '');
    count(tl, toolText(await bobCall) === `chatty ${tag} done after ${LINES} lines`);
    // alice's answer comes through the child's output after bob's lines: what was sent her is in
    await fs.writeFile(goAlice, '');
    count(tl, toolText(await aliceCall) === `alice-${tag}`);
    count(tl, toolText(await alice.client.callTool({ name: 'echo', arguments: { text: 'barrier' } })) === 'barrier');
    rounds.push(`${aliceNewer ? 'alice_newer' : 'alice_older'}:${heard.alice - before}`);
  }
  ac.abort();
  await getDone;
  const onRawGet = (rawGet.match(/bob-secret line/g) ?? []).length;
  if (heard.alice) breaches.push(`alice's client got ${heard.alice} of bob's log lines`);
  if (onRawGet) breaches.push(`alice's GET stream carried ${onRawGet} of bob's log lines`);
  return finish('tenant:shared-notifications', tl, breaches,
    `bob_heard=${heard.bob}/${2 * LINES} alice_heard=${heard.alice} (${rounds.join(' ')}) alice_get=${onRawGet} get_status=${get.status}`);
};

// --- 5. sessionless callers of a per_session server get children of their own ---------------
const perCallerChildren = async (s) => {
  const tl = tally();
  const breaches = [];
  const { gw } = await stdioGateway(s, { sessions: 'per_session' });
  const pids = {};
  // each caller twice, as @modelcontextprotocol/client 2.x sends a 2026-07-28 request (the
  // client itself cannot be pinned here: the stdio server offers no server/discover)
  for (const subject of ['alice', 'bob', 'alice', 'bob']) {
    const r = await post2026(gw.url, 'tools/call', { name: 'whoami', arguments: {} }, { id: 1, subject });
    const pid = pidOf(toolText(r.message?.result));
    count(tl, pid > 0, pid > 0 ? null : `http_${r.status}`);
    (pids[subject] ??= new Set()).add(pid);
  }
  const shared = [...pids.alice].filter((p) => p && pids.bob.has(p));
  if (shared.length) breaches.push(`alice and bob were served by the same child (pid ${shared.join(',')})`);
  return finish('tenant:per-caller-children', tl, breaches, `alice_pids=${[...pids.alice].join(',')} bob_pids=${[...pids.bob].join(',')}`);
};

// --- 6. a surplus response on a kept-alive upstream connection reaches nobody -----------------
const strayResponse = async (s) => {
  const tl = tally();
  const breaches = [];
  const up = await startProcess(s, NODE, [path.join(TESTS, 'fixtures/bad-upstream.mjs'), '0', 'stray'], {
    readyLine: /listening on port (\d+)/, name: 'bad-upstream(stray)',
  });
  const gw = await startGateway(s, {
    upstream: `http://127.0.0.1:${up.match[1]}/mcp`,
    databaseUrl: await createDatabase(),
    config: { subject: SUBJECT, tools: { lookup: { class: 'read' } } },
  });
  let foreign = 0;
  let strays = 0;
  const read = async (subject, n) => {
    const args = { caller: subject, n };
    const res = await fetch(gw.url, {
      method: 'POST',
      headers: { Accept: ACCEPT, 'Content-Type': 'application/json', 'MCP-Protocol-Version': '2025-11-25', 'X-Subject': subject },
      body: JSON.stringify({ jsonrpc: '2.0', id: n % 4, method: 'tools/call', params: { name: 'lookup', arguments: args } }),
      signal: AbortSignal.timeout(10000),
    }).catch((err) => ({ status: 0, text: async () => err.message, headers: new Headers() }));
    const text = await res.text();
    let got = '';
    try {
      got = toolText(findResponse(res.headers.get('content-type'), text, n % 4)?.result);
    } catch {
      // not JSON
    }
    const want = `lookup:${JSON.stringify(args)}`;
    count(tl, res.status === 200 && got === want, res.status !== 200 ? `http_${res.status}` : got ? 'not_its_own' : 'no_answer_with_its_id');
    // every tool text in the body, whatever its id: each must be this read's
    const texts = [...text.matchAll(/"text":"((?:[^"\\]|\\.)*)"/g)].map((m) => JSON.parse(`"${m[1]}"`));
    const wrong = texts.filter((t) => t !== want);
    if (wrong.length) {
      if (wrong.some((t) => t.startsWith('STRAY'))) strays++;
      if (wrong.some((t) => /"caller":"(\w+)"/.exec(t)?.[1] !== subject)) foreign++;
      breaches.push(`${subject}'s read ${n} got "${wrong[0]}"`);
    }
  };
  // concurrently: both callers, the same ids
  for (let round = 0; round < 10; round++) {
    await Promise.all([0, 1, 2, 3].flatMap((k) => [read('alice', round * 4 + k), read('bob', round * 4 + k)]));
  }
  // sequentially, alternating
  for (let n = 0; n < 40; n++) await read(n % 2 ? 'bob' : 'alice', n);
  tl.wrong_caller = foreign;
  return finish('tenant:stray-response', tl, breaches, `stray_answers=${strays} other_callers_answers=${foreign}`);
};

// --- 7. a caller that stops reading does not stop the others on a shared child ----------------
const slowConsumer = async (s) => {
  const tl = tally();
  const breaches = [];
  const { gw, ledger } = await stdioGateway(s, { sessions: 'shared', config: { timeouts: { upstream: '5s' } } });
  const alice = await sdkClient(s, gw.url, 'alice');
  count(tl, toolText(await alice.client.callTool({ name: 'echo', arguments: { text: 'warm' } })) === 'warm');
  // mallory: her own session, a call whose stream is 32 MiB of log lines, and a socket she
  // stops reading once the call is sent
  const mallorySession = await rawSession(s, gw.url, { headers: { 'X-Subject': 'mallory' } });
  const LINES = 2048;
  const body = Buffer.from(JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'chatty', arguments: { tag: 'mallory', lines: LINES, bytes: 16384 } } }));
  const sock = net.connect(gw.port, '127.0.0.1');
  sock.on('error', () => {});
  s.after(() => sock.destroy());
  await new Promise((r) => sock.once('connect', r));
  sock.write(`POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:${gw.port}\r\nAccept: ${ACCEPT}\r\nContent-Type: application/json\r\n` +
    `MCP-Protocol-Version: 2025-11-25\r\nMcp-Session-Id: ${mallorySession.sessionId}\r\nX-Subject: mallory\r\nContent-Length: ${body.length}\r\n\r\n`);
  sock.write(body);
  sock.pause();
  // the child has written the first 4 MiB of her stream (more than the sockets hold)
  await waitForEntry(ledger, (e) => e.tool === 'chatty' && e.tag === 'mallory' && e.sent >= 256, 'mallory\'s chatty call to be under way');
  // alice calls on until one of hers goes unanswered, or the child has stalled on mallory's
  // stream (her count stands still across three of alice's answers), or mallory's stream is all out
  const mallorySent = async () => Math.max(0, ...(await ledgerWith(ledger, (e) => e.tool === 'chatty' && e.tag === 'mallory')).map((e) => e.sent));
  let answered = 0;
  let missed = 0;
  let still = 0;
  let last = -1;
  for (let i = 0; i < 60 && !missed && still < 3; i++) {
    const tool = i % 2 ? { name: 'issue_refund', arguments: { order_id: `alice-${i}`, amount_cents: i } } : { name: 'echo', arguments: { text: `alice-${i}` } };
    const r = await alice.client.callTool(tool, undefined, { timeout: 8000 }).then((x) => x, (err) => ({ error: err.message }));
    const ok = !r.error && (i % 2 ? /Refunded \d+ on alice-/.test(toolText(r)) : toolText(r) === `alice-${i}`);
    count(tl, ok, ok ? null : 'alice_not_answered');
    if (ok) answered++;
    else missed++;
    const sent = await mallorySent();
    if (sent >= LINES) break;
    still = sent === last ? still + 1 : 0;
    last = sent;
  }
  if (missed) breaches.push(`alice was not answered within 8 s (after ${answered} answers) while mallory did not read`);
  const sent = await mallorySent();
  sock.destroy();
  return finish('tenant:slow-consumer', tl, breaches,
    `alice_answered=${answered} alice_missed=${missed} mallory_lines_written=${sent}/${LINES} child_stalled_alice_served=${still >= 3 && !missed ? 'yes' : 'no'}`);
};

// --- 8. a session's stream, the status tool and tasks are their caller's only ----------------
const resumeStatusTasks = async (s) => {
  const tl = tally();
  const breaches = [];
  const up = await startRefundServer(s);
  const gw = await startGateway(s, {
    upstream: up.url,
    databaseUrl: await createDatabase(),
    config: { subject: SUBJECT, status_tool: true, tools: { get_ledger: { class: 'read' } } },
  });
  const dir = await tempDir(s, 'idemgw-tenant-resume-');
  const go = path.join(dir, 'go');
  const alice = await rawSession(s, gw.url, { headers: { 'X-Subject': 'alice' } });
  // SSE polling: alice's POST stream ends after its priming event; her result waits for `go`
  const args = { order_id: 'alice-secret', amount_cents: 77, wait_for: go };
  const first = await alice.call('polling_refund', args, { id: 'alice-1' });
  const primingId = [...first.body.matchAll(/^id: ?(.+)$/gm)].map((m) => m[1].trim()).pop();
  if (!primingId) throw new Error(`no priming event on alice's stream: ${first.body}`);
  const attempts = { resume: [], status: [], task: [] };
  const bobGet = async (extra) => {
    const ac = new AbortController();
    const res = await fetch(gw.url, {
      headers: { Accept: 'text/event-stream', 'Mcp-Session-Id': alice.sessionId, 'MCP-Protocol-Version': '2025-11-25', 'X-Subject': 'bob', ...extra },
      signal: ac.signal,
    });
    attempts.resume.push(res.status);
    if (res.status === 200) {
      // a stream handed to bob: whatever it carries of alice's call is the breach
      breaches.push(`bob opened alice's session stream (${extra['Last-Event-ID'] ? 'resume' : 'GET'})`);
      const reader = sseReader(res);
      const ev = await Promise.race([reader.next(), new Promise((r) => setTimeout(() => r(null), 1000))]);
      if (ev && /alice-secret/.test(ev.data)) breaches.push('bob read alice\'s result');
      ac.abort();
    } else {
      await res.arrayBuffer();
    }
    count(tl, res.status === 403, res.status === 403 ? null : `resume_${res.status}`);
  };
  await bobGet({ 'Last-Event-ID': primingId });
  await bobGet({});
  // bob asks the status tool about alice's call, while it runs and once it is done
  const bob = await rawSession(s, gw.url, { headers: { 'X-Subject': 'bob' } });
  const askStatus = async () => {
    const r = await bob.call('idemgw_call_status', { tool: 'polling_refund', arguments: args });
    const code = r.message?.result?._meta?.['idemgw/status']?.code ?? `http_${r.status}`;
    attempts.status.push(code);
    count(tl, code === 'not_found', code);
    if (code !== 'not_found' || /alice-secret/.test(toolText(r.message?.result))) breaches.push(`the status tool told bob of alice's call (${code})`);
  };
  await askStatus();
  await fs.writeFile(go, '');
  const resumed = await fetch(gw.url, {
    headers: { Accept: 'text/event-stream', 'Mcp-Session-Id': alice.sessionId, 'MCP-Protocol-Version': '2025-11-25', 'X-Subject': 'alice', 'Last-Event-ID': primingId },
  });
  const reader = sseReader(resumed);
  let result = null;
  for (let ev = await reader.next(); ev && !result; ev = await reader.next()) {
    if (ev.data && JSON.parse(ev.data).id === 'alice-1') result = JSON.parse(ev.data).result;
  }
  await reader.cancel();
  count(tl, /alice-secret/.test(toolText(result)));
  await waitForLog(gw, /recorded as succeeded from a resumed stream/);
  await askStatus();
  await bobGet({ 'Last-Event-ID': primingId });

  // tasks: alice starts a task on server-everything; bob polls it from his own session
  const ev = await startEverything(s);
  const gwt = await startGateway(s, {
    upstream: ev.url,
    databaseUrl: await createDatabase(),
    config: { subject: SUBJECT, tools: { 'simulate-research-query': { class: 'non_idempotent', window: '1h' } } },
  });
  const aliceT = await rawSession(s, gwt.url, { headers: { 'X-Subject': 'alice' } });
  const bobT = await rawSession(s, gwt.url, { headers: { 'X-Subject': 'bob' } });
  const started = await aliceT.request('tools/call', { name: 'simulate-research-query', arguments: { topic: 'alice private topic' }, task: { ttl: 60000 } });
  const taskId = started.message?.result?.task?.taskId;
  count(tl, Boolean(taskId));
  if (!taskId) throw new Error(`alice's task did not start: ${started.body}`);
  await waitFor(async () => (await aliceT.request('tasks/get', { taskId })).message?.result?.status === 'completed',
    { timeoutMs: 30000, what: 'alice\'s task to complete' });
  for (const method of ['tasks/get', 'tasks/result']) {
    const r = await bobT.request(method, { taskId });
    attempts.task.push(r.message?.error ? 'error' : `ok_${r.status}`);
    count(tl, Boolean(r.message?.error), r.message?.error ? null : 'task_served_to_bob');
    if (!r.message?.error || /alice private topic/.test(r.body)) breaches.push(`bob's ${method} of alice's task was answered`);
  }
  // bob asking the same task with the same arguments runs his own, never gets hers
  const mine = await bobT.request('tools/call', { name: 'simulate-research-query', arguments: { topic: 'alice private topic' }, task: { ttl: 60000 } });
  const bobTask = mine.message?.result?.task?.taskId;
  count(tl, Boolean(bobTask));
  if (bobTask === taskId) breaches.push('bob\'s same call was given alice\'s task');
  const cancel = await bobT.request('tasks/cancel', { taskId });
  attempts.task.push(cancel.message?.error ? 'error' : `ok_${cancel.status}`);
  if (!cancel.message?.error) breaches.push('bob cancelled alice\'s task');
  return finish('tenant:resume-status-tasks', tl, breaches,
    `bob_resume=${attempts.resume.join('/')} bob_status=${attempts.status.join('/')} bob_task=${attempts.task.join('/')}`);
};

export const tenantScenarios = Object.fromEntries(Object.entries({
  'tenant:spawned-fds': spawnedFds,
  'tenant:sessionless-cancel': sessionlessCancel,
  'tenant:shared-elicitation': sharedElicitation,
  'tenant:shared-notifications': sharedNotifications,
  'tenant:per-caller-children': perCallerChildren,
  'tenant:stray-response': strayResponse,
  'tenant:slow-consumer': slowConsumer,
  'tenant:resume-status-tasks': resumeStatusTasks,
}).map(([k, fn]) => [k, counted(fn)]));
