// The failure classes of `make bench-stdio` (scripts/bench/stdio.sh): what an agent sees when a
// stdio server misbehaves behind idemgw (`sessions: per_session`) and behind the bridges
// supergateway (--stateful, a child per session) and mcp-proxy (one child for every session).
// Each class starts its own copy of every target, the targets of one class side by side, and
// drives it with a bare Streamable HTTP client (fetch), so that what came back (a JSON-RPC
// answer, an HTTP status, a stream that ended, nothing) is seen as it is, not through an SDK's
// retries and timeouts. Times are taken with timestamps and reported; nothing here is asserted.
//
//   node stdio-failures.mjs --dir TMPDIR [--targets "idemgw supergateway mcp_proxy"]
//                           [--call-cap 15] [--init-cap 45] [--helper-cap 8] [--max-children 4]
//
// Classes (the server is tests/fixtures/ledger-stdio.mjs unless named):
//   a   the child dies (SIGKILL) while a protected call (slow_refund) runs: is the call
//       answered, how, and how long after the death
//   b   the server never answers initialize (tests/bench/silent-stdio.mjs): how long until the
//       agent's initialize is answered, and does the answer say why
//   c   agents that never send DELETE: --max-children sessions (idemgw's max_children), each
//       initialized and having made a call, then one more: is its call answered; what the
//       first session sees then; how many servers run
//   d   SIGTERM to the gateway or bridge while a call (slow_refund, 1.5 s) is in flight: is
//       the call answered
//   e   helpers a server starts (spawn_sleeper), one in its process group and one that left it
//       (setsid): are they gone after the session's DELETE, after the server crashes
//       (SIGKILL), and after the gateway or bridge exits (SIGTERM)
//   f   a protected write (issue_refund) sent twice with the same arguments in one session, the
//       retry after the answer and (f2, slow_refund) while the first is still running: how
//       many times it ran (the server's ledger)
// One JSON line per class and target on stdout:
//   {kind: "failure", class, target, pass: true|false|null, saw, ms}
// pass is null where the class does not apply as such (mcp-proxy's one child outlives a
// DELETE by design). A readable line per result on stderr.
import fs from 'node:fs';
import path from 'node:path';
import { spawn, execFileSync } from 'node:child_process';
import net from 'node:net';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';
import { descendants, running, treeRunning } from './proctree.mjs';

const { values: opt } = parseArgs({
  options: {
    dir: { type: 'string' },
    targets: { type: 'string', default: 'idemgw supergateway mcp_proxy' },
    classes: { type: 'string', default: 'a b c d e f' },
    'call-cap': { type: 'string', default: '15' },
    'init-cap': { type: 'string', default: '45' },
    'helper-cap': { type: 'string', default: '8' },
    'max-children': { type: 'string', default: '4' },
  },
});
if (!opt.dir) {
  console.error('usage: stdio-failures.mjs --dir TMPDIR [--targets LIST] [--classes "a b c d e f"] [--call-cap S] [--init-cap S] [--helper-cap S] [--max-children N]');
  process.exit(2);
}
const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const NODE = process.execPath;
const IDEMGW = process.env.IDEMGW_BIN ?? path.join(ROOT, 'build/idemgw');
const BIN = path.join(ROOT, 'tests/node_modules/.bin');
const LEDGER_SERVER = path.join(ROOT, 'tests/fixtures/ledger-stdio.mjs');
const SILENT_SERVER = path.join(ROOT, 'tests/bench/silent-stdio.mjs');
const SILENT_MARK = 'silent-stdio';
const targets = opt.targets.split(/\s+/).filter(Boolean);
const classes = new Set(opt.classes.split(/\s+/).filter(Boolean));
const callCap = Number(opt['call-cap']) * 1000;
const initCap = Number(opt['init-cap']) * 1000;
const helperCap = Number(opt['helper-cap']) * 1000;
const maxChildren = Number(opt['max-children']);
const PROTOCOL = '2025-06-18';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const secs = (ms) => (ms >= 1000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms)} ms`);
const clip = (s, n = 90) => {
  const one = String(s).replace(/\s+/g, ' ').trim();
  return one.length > n ? `${one.slice(0, n - 1)}…` : one;
};

// ---- the targets -----------------------------------------------------------------------------
const started = []; // every process this driver started, stopped at the end
const strays = new Set(); // helper pids the servers reported, killed at the end if still there
let seqNo = 0;

const freePort = () => Number(execFileSync('python3', [path.join(ROOT, 'scripts/free-port.py')], { encoding: 'utf8' }).trim());

function portOpen(port) {
  return new Promise((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port }, () => {
      s.destroy();
      resolve(true);
    });
    s.on('error', () => resolve(false));
  });
}

/**
 * Starts one target in front of `server` (a script run with node). Answers {name, pid, url,
 * ledger, exited (a promise of the exit time), up (false if it never listened)}.
 */
async function startTarget(name, server, tag, listenCap) {
  const id = `${tag}-${name}-${seqNo++}`;
  const dir = path.join(opt.dir, id);
  fs.mkdirSync(dir, { recursive: true });
  const ledger = path.join(dir, 'ledger.jsonl');
  fs.writeFileSync(ledger, '');
  const port = freePort();
  let argv;
  let env = { ...process.env, LEDGER: ledger };
  if (name === 'idemgw') {
    const admin = freePort();
    const q = JSON.stringify;
    fs.writeFileSync(path.join(dir, 'idemgw.yaml'), [
      `listen: 127.0.0.1:${port}`,
      `admin_listen: 127.0.0.1:${admin}`,
      'workers: 1',
      'upstream:',
      `  command: [${q(NODE)}, ${q(server)}]`,
      `  env: {LEDGER: ${q(ledger)}}`,
      '  sessions: per_session',
      `  max_children: ${maxChildren}`,
      `database_url: ${q(`sqlite:${dir}/keys.db`)}`,
      'log:',
      '  level: warn',
      'subject:',
      '  static: bench',
      'tools:',
      '  issue_refund: {class: non_idempotent}',
      '  slow_refund: {class: non_idempotent}',
      '  whoami: {class: read}',
      '  spawn_sleeper: {class: read}',
      '',
    ].join('\n'));
    argv = [IDEMGW, '-c', path.join(dir, 'idemgw.yaml')];
    env = process.env;
  } else if (name === 'supergateway') {
    argv = [path.join(BIN, 'supergateway'), '--stdio', `${NODE} ${server}`, '--outputTransport', 'streamableHttp',
      '--stateful', '--port', String(port), '--logLevel', 'none'];
  } else if (name === 'mcp_proxy') {
    argv = [path.join(BIN, 'mcp-proxy'), '--host', '127.0.0.1', '--port', String(port), '--server', 'stream', '--',
      NODE, server];
  } else {
    throw new Error(`unknown target ${name}`);
  }
  const logFd = fs.openSync(path.join(dir, 'out.log'), 'a');
  const proc = spawn(argv[0], argv.slice(1), { env, stdio: ['ignore', logFd, logFd] });
  fs.closeSync(logFd);
  started.push(proc);
  const startedAt = performance.now();
  const exited = new Promise((resolve) => proc.on('exit', () => resolve(performance.now())));
  let up = false;
  for (const t0 = performance.now(); performance.now() - t0 < listenCap;) {
    if (await portOpen(port)) {
      up = true;
      break;
    }
    if (proc.exitCode !== null || proc.signalCode !== null) break;
    await sleep(50);
  }
  const t = { name, pid: proc.pid, proc, url: `http://127.0.0.1:${port}/mcp`, ledger, exited, up, dir, startedAt };
  exited.then((at) => (t.exitedAt = at));
  await sleep(0); // an exit seen above has set exitedAt
  return t;
}

function stopTarget(t) {
  for (const d of descendants(t.pid).slice(1)) strays.add(d);
  if (t.proc.exitCode === null && t.proc.signalCode === null) t.proc.kill('SIGKILL');
}

function ledgerLines(t) {
  return fs.readFileSync(t.ledger, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
}

async function until(pred, capMs, stepMs = 20) {
  const t0 = performance.now();
  for (;;) {
    const v = pred();
    if (v) return v;
    if (performance.now() - t0 >= capMs) return null;
    await sleep(stepMs);
  }
}

// ---- a bare Streamable HTTP client ------------------------------------------------------------
class Agent {
  constructor(url) {
    this.url = url;
    this.session = null;
    this.nextId = 1;
  }

  headers() {
    const h = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };
    if (this.session) {
      h['mcp-session-id'] = this.session;
      h['mcp-protocol-version'] = PROTOCOL;
    }
    return h;
  }

  /**
   * POSTs one message and waits, at most capMs, for the JSON-RPC answer to it. Answers
   * {ms, status?, answer?, body?, ended?, capped?, neterr?}: answer is the response message;
   * ended: the response (a stream) closed without it; capped: nothing came within capMs.
   */
  async post(msg, capMs) {
    const t0 = performance.now();
    const ac = new AbortController();
    const timer = setTimeout(() => ac.abort(), capMs);
    const out = {};
    try {
      const res = await fetch(this.url, { method: 'POST', headers: this.headers(), body: JSON.stringify(msg), signal: ac.signal });
      out.status = res.status;
      out.sessionHeader = res.headers.get('mcp-session-id');
      const type = res.headers.get('content-type') ?? '';
      if (type.includes('text/event-stream')) {
        const reader = res.body.getReader();
        const dec = new TextDecoder();
        let buf = '';
        for (;;) {
          const { done, value } = await reader.read();
          if (done) break;
          buf += dec.decode(value, { stream: true }).replace(/\r\n/g, '\n');
          let cut;
          while ((cut = buf.indexOf('\n\n')) >= 0) {
            const event = buf.slice(0, cut);
            buf = buf.slice(cut + 2);
            const data = event.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trim()).join('\n');
            if (!data) continue;
            let m;
            try {
              m = JSON.parse(data);
            } catch {
              continue;
            }
            if (m.id === msg.id && ('result' in m || 'error' in m)) out.answer = m;
          }
          if (out.answer) {
            reader.cancel().catch(() => {});
            break;
          }
        }
        if (!out.answer) out.ended = true;
      } else {
        out.body = await res.text();
        try {
          const m = JSON.parse(out.body);
          if (m && ('result' in m || 'error' in m)) out.answer = m;
        } catch {
          // not JSON: kept as the body
        }
      }
    } catch (err) {
      if (ac.signal.aborted) out.capped = true;
      else out.neterr = err.cause?.code ?? err.cause?.message ?? err.message;
    } finally {
      clearTimeout(timer);
    }
    out.ms = performance.now() - t0;
    return out;
  }

  async initialize(capMs = callCap) {
    const r = await this.post({
      jsonrpc: '2.0', id: this.nextId++, method: 'initialize',
      params: { protocolVersion: PROTOCOL, capabilities: {}, clientInfo: { name: 'idemgw-stdio-failures', version: '1.0.0' } },
    }, capMs);
    if (r.answer?.result && r.sessionHeader) {
      this.session = r.sessionHeader;
      await this.post({ jsonrpc: '2.0', method: 'notifications/initialized' }, 5000);
    }
    return r;
  }

  call(name, args, capMs = callCap) {
    return this.post({ jsonrpc: '2.0', id: this.nextId++, method: 'tools/call', params: { name, arguments: args } }, capMs);
  }

  async remove() {
    const r = await fetch(this.url, { method: 'DELETE', headers: this.headers() }).catch((err) => ({ status: err.message }));
    return r.status;
  }
}

/** What the agent saw, in a few words. */
function seen(r, capMs) {
  if (r.answer?.error) {
    const e = r.answer.error;
    return `${r.status && r.status !== 200 ? `HTTP ${r.status}, ` : ''}error ${e.code}: "${clip(e.message, 70)}"`;
  }
  if (r.answer?.result) {
    const res = r.answer.result;
    const text = res.content?.find((c) => c.type === 'text')?.text ?? (res.protocolVersion ? `initialized (${res.protocolVersion})` : JSON.stringify(res));
    // idemgw's word on the call: its status code, or that the answer is a replay
    const m = res._meta ?? {};
    const meta = [];
    if (m['idemgw/status']?.code) meta.push(`[idemgw/status ${m['idemgw/status'].code}]`);
    if (m['idemgw/replay']?.replayed) meta.push('[idemgw/replay]');
    return `result${res.isError ? ' (isError)' : ''}: "${clip(text, 80)}"${meta.length ? ` ${meta.join(' ')}` : ''}`;
  }
  if (r.capped) return `no answer within ${secs(capMs)}`;
  if (r.neterr) return `connection failed (${clip(r.neterr, 40)})`;
  if (r.ended) return `HTTP ${r.status}, event stream ended with no answer`;
  return `HTTP ${r.status}${r.body ? `: "${clip(r.body, 70)}"` : ', empty body'}`;
}

const answered = (r) => Boolean(r.answer);
const resultText = (r) => r.answer?.result?.content?.find((c) => c.type === 'text')?.text ?? '';

function report(cls, target, pass, saw, ms = null) {
  const rec = { kind: 'failure', class: cls, target, pass, saw, ms: ms == null ? null : Math.round(ms) };
  process.stdout.write(JSON.stringify(rec) + '\n');
  const mark = pass === null ? 'n/a ' : pass ? 'pass' : 'FAIL';
  process.stderr.write(`  (${cls}) ${target.padEnd(13)} ${mark}  ${saw}\n`);
}

async function perTarget(cls, server, fn, listenCap = 20_000) {
  await Promise.all(targets.map(async (name) => {
    const t = await startTarget(name, server, cls, listenCap);
    try {
      if (!t.up) {
        // the line of its log that says what went wrong, else its last
        const lines = fs.readFileSync(path.join(t.dir, 'out.log'), 'utf8').split('\n').filter((l) => l.trim());
        const tail = clip(lines.find((l) => /error|fail|could not|cannot/i.test(l)) ?? lines.at(-1) ?? '', 80);
        const how = t.proc.exitCode !== null || t.proc.signalCode !== null
          ? `exited after ${secs(t.exitedAt - t.startedAt)} without listening` : `did not listen within ${secs(listenCap)}`;
        report(cls, name, false, `${how}: an agent's connection is refused (its log: ${tail})`);
        return;
      }
      await fn(t);
    } catch (err) {
      report(cls, name, false, `driver error: ${clip(err.message)}`);
    } finally {
      stopTarget(t);
    }
  }));
}

async function session(t) {
  const a = new Agent(t.url);
  const r = await a.initialize();
  if (!a.session) throw new Error(`initialize: ${seen(r, callCap)}`);
  return a;
}

// ---- the classes ------------------------------------------------------------------------------
async function classA() {
  await perTarget('a', LEDGER_SERVER, async (t) => {
    const a = await session(t);
    const go = path.join(t.dir, 'never');
    const call = a.call('slow_refund', { order_id: 'a-1', amount_cents: 100, wait_for: go }, callCap + 10_000);
    const line = await until(() => ledgerLines(t).find((l) => l.tool === 'slow_refund'), 10_000);
    if (!line) {
      report('a', t.name, false, `the call never reached the server: ${seen(await call, callCap)}`);
      return;
    }
    const killedAt = performance.now();
    process.kill(line.pid, 'SIGKILL');
    const r = await Promise.race([call, sleep(callCap).then(() => ({ capped: true }))]);
    const ms = r.capped ? null : performance.now() - killedAt;
    // and whether the target still serves: a new session's first call
    const b = new Agent(t.url);
    const init = await b.initialize();
    const next = b.session ? await b.call('whoami', {}) : init;
    report('a', t.name, answered(r),
      `${seen(r, callCap)}${ms == null ? '' : ` ${secs(ms)} after the child died`}; a new session then: ${seen(next, callCap)}`, ms);
  });
}

async function classB() {
  await perTarget('b', SILENT_SERVER, async (t) => {
    const a = new Agent(t.url);
    const r = await a.initialize(initCap);
    const text = JSON.stringify(r.answer ?? '') + (r.body ?? '');
    const why = text.includes(SILENT_MARK) || /initiali[sz]e/i.test(text);
    const pass = (answered(r) && r.answer.error !== undefined) || (r.status >= 400 && !r.capped);
    report('b', t.name, pass && why,
      `${seen(r, initCap)}${r.capped ? '' : ` after ${secs(r.ms)}`}${pass ? (why ? '; says why' : '; does not say why') : ''}`,
      r.capped ? null : r.ms);
  }, initCap);
}

async function classC() {
  await perTarget('c', LEDGER_SERVER, async (t) => {
    const agents = [];
    for (let i = 0; i < maxChildren; i++) {
      const a = await session(t);
      await a.call('whoami', {});
      agents.push(a); // and never DELETEd
    }
    const last = new Agent(t.url);
    const init = await last.initialize();
    let r = init;
    if (last.session) r = await last.call('whoami', {});
    const first = await agents[0].call('whoami', {});
    const servers = treeRunning(t.pid, 'ledger-stdio').length;
    report('c', t.name, answered(r) && Boolean(r.answer.result) && !r.answer.result.isError,
      `session ${maxChildren + 1}: ${seen(r, callCap)}; session 1 then: ${seen(first, callCap)}; ${servers} server${servers === 1 ? '' : 's'} running`,
      null);
  });
}

async function classD() {
  await perTarget('d', LEDGER_SERVER, async (t) => {
    const a = await session(t);
    const call = a.call('slow_refund', { order_id: 'd-1', amount_cents: 100, delay_ms: 1500 }, callCap);
    const line = await until(() => ledgerLines(t).find((l) => l.tool === 'slow_refund'), 10_000);
    if (!line) {
      report('d', t.name, false, `the call never reached the server: ${seen(await call, callCap)}`);
      return;
    }
    const sigAt = performance.now();
    t.proc.kill('SIGTERM');
    const r = await call;
    const ms = r.capped ? null : performance.now() - sigAt;
    const exitMs = await Promise.race([t.exited, sleep(callCap)]).then((v) => (typeof v === 'number' ? v - sigAt : null));
    const ok = answered(r) && Boolean(r.answer.result) && resultText(r).startsWith('Refunded');
    report('d', t.name, ok,
      `${seen(r, callCap)}${ms == null ? '' : ` ${secs(ms)} after SIGTERM`}; exited ${exitMs == null ? `not within ${secs(callCap)}` : `after ${secs(exitMs)}`}`,
      ms);
  });
}

/** Starts two helpers in a's server: [in its process group, escaped with setsid]. */
async function helpers(a) {
  const inGroup = Number(resultText(await a.call('spawn_sleeper', {})));
  const escaped = Number(resultText(await a.call('spawn_sleeper', { escape: true })));
  for (const p of [inGroup, escaped]) if (p > 0) strays.add(p);
  if (!(inGroup > 0 && escaped > 0)) throw new Error('spawn_sleeper did not answer a pid');
  return [inGroup, escaped];
}

/** How long each helper lived past `from`, at most helperCap: [ms|null, ms|null]. */
async function outlive(pids, from) {
  const gone = pids.map(() => null);
  await until(() => {
    pids.forEach((p, i) => {
      if (gone[i] === null && !running(p)) gone[i] = performance.now() - from;
    });
    return gone.every((g) => g !== null);
  }, helperCap);
  return gone;
}

const helperWords = (gone) => `group helper ${gone[0] == null ? `alive after ${secs(helperCap)}` : `gone in ${secs(gone[0])}`}, ` +
  `setsid helper ${gone[1] == null ? `alive after ${secs(helperCap)}` : `gone in ${secs(gone[1])}`}`;

async function classE() {
  // e1: the session's DELETE, then e3: SIGTERM to the gateway or bridge, on one copy
  const exitPath = perTarget('e', LEDGER_SERVER, async (t) => {
    const a = await session(t);
    const serverPid = Number(/pid (\d+)/.exec(resultText(await a.call('whoami', {})))?.[1]);
    const pids = await helpers(a);
    const delAt = performance.now();
    const status = await a.remove();
    const gone = await outlive(pids, delAt);
    const serverLeft = running(serverPid);
    report('e1', t.name, serverLeft ? null : gone.every((g) => g !== null),
      `DELETE ${status}; ${serverLeft ? 'its server still runs (one for every session); ' : ''}${helperWords(gone)}`);

    const b = await session(t);
    const serverPid2 = Number(/pid (\d+)/.exec(resultText(await b.call('whoami', {})))?.[1]);
    const pids2 = await helpers(b);
    const sigAt = performance.now();
    t.proc.kill('SIGTERM');
    await Promise.race([t.exited, sleep(callCap)]);
    const gone2 = await outlive([...pids2, serverPid2], sigAt);
    const server = gone2.pop();
    report('e3', t.name, gone2.every((g) => g !== null) && server !== null,
      `after SIGTERM: ${helperWords(gone2)}${server === null ? `; the server itself alive after ${secs(helperCap)}` : ''}`);
  });
  // e2: the server crashes (SIGKILL) after starting its helpers, on another copy
  const crashPath = perTarget('e', LEDGER_SERVER, async (t) => {
    const a = await session(t);
    const serverPid = Number(/pid (\d+)/.exec(resultText(await a.call('whoami', {})))?.[1]);
    const pids = await helpers(a);
    const killAt = performance.now();
    process.kill(serverPid, 'SIGKILL');
    const gone = await outlive(pids, killAt);
    report('e2', t.name, gone.every((g) => g !== null), `server killed: ${helperWords(gone)}`);
  });
  await Promise.all([exitPath, crashPath]);
}

async function classF() {
  await perTarget('f', LEDGER_SERVER, async (t) => {
    const a = await session(t);
    const args = { order_id: 'f-1', amount_cents: 100 };
    await a.call('issue_refund', args);
    const again = await a.call('issue_refund', args);
    const runs = ledgerLines(t).filter((l) => l.tool === 'issue_refund' && l.order_id === 'f-1').length;
    report('f1', t.name, runs === 1, `ran ${runs} time${runs === 1 ? '' : 's'}; the retry saw ${seen(again, callCap)}`);

    const slow = { order_id: 'f-2', amount_cents: 100, delay_ms: 1000 };
    const first = a.call('slow_refund', slow);
    await until(() => ledgerLines(t).some((l) => l.tool === 'slow_refund'), 5000);
    const retry = await a.call('slow_refund', slow);
    await first;
    const runs2 = ledgerLines(t).filter((l) => l.tool === 'slow_refund' && l.order_id === 'f-2').length;
    report('f2', t.name, runs2 === 1, `ran ${runs2} time${runs2 === 1 ? '' : 's'}; the retry saw ${seen(retry, callCap)}`);
  });
}

try {
  // (b) mostly waits: it runs beside the others
  const b = classes.has('b') ? classB() : Promise.resolve();
  if (classes.has('a')) await classA();
  if (classes.has('c')) await classC();
  if (classes.has('d')) await classD();
  if (classes.has('e')) await classE();
  if (classes.has('f')) await classF();
  await b;
} catch (err) {
  process.stderr.write(`stdio-failures: ${err.stack ?? err}\n`);
  process.exitCode = 1;
} finally {
  for (const p of started) {
    for (const d of descendants(p.pid).slice(1)) if (running(d)) strays.add(d);
    if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
  }
  for (const p of strays) {
    try {
      if (running(p)) process.kill(p, 'SIGKILL');
    } catch {
      // gone already
    }
  }
}
process.exit(process.exitCode ?? 0);
