// The load driver of `make bench-stdio` (scripts/bench/stdio.sh): one round against one target,
// a Streamable HTTP endpoint (idemgw, or a bridge) in front of one of two stdio servers:
//   bench   tests/bench/stdio-server.mjs (the SDK's McpServer): write `append`, read `get`
//   memory  @modelcontextprotocol/server-memory from npm, a knowledge graph kept in a JSONL
//           file: write `create_entities` (one new entity a call), read `open_nodes` (the
//           session's last entity)
// Clients are the official SDK's (1.x) Client over StreamableHTTPClientTransport, one per
// session, all in this process.
//
//   node stdio-bench.mjs --url URL --pid PID --target NAME --round N [--server bench|memory]
//                        [--sessions "1 16"] [--secs 3] [--new 10] [--run ID]
//
// In order:
//   first_answer  --new sessions one after another: connect (initialize, the initialized
//                 notification) and a first tools/call (the read), timed from before connect to the
//                 answer; each session is then ended (DELETE) and closed
//   for each session count C of --sessions:
//     memory      C sessions open, each having answered one call: RSS (and PSS) summed over
//                 PID and all its descendants, from /proc
//     load        each session calls the write in a loop for --secs (every call a new item, so
//                 each is a first execution), then the read the same way: every call's
//                 latency, calls per second over the phase
// One JSON line per figure on stdout; a readable line per figure on stderr. Calls that fail,
// and write answers that are replays (idemgw's result._meta["idemgw/replay"]), are counted.
// Figures name the server (`server`), the tool (`tool`) and whether it is the write (`op`).
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { treeMemory } from './proctree.mjs';

// The SDK's client adds an abort listener to one signal per request; past 1500 requests in a
// session Node warns of a leak once per request, which would bury the figures. Other warnings
// are printed as Node would.
process.removeAllListeners('warning');
process.on('warning', (w) => {
  if (w.name !== 'MaxListenersExceededWarning') process.stderr.write(`${w.name}: ${w.message}\n`);
});

const { values: opt } = parseArgs({
  options: {
    url: { type: 'string' },
    pid: { type: 'string' },
    target: { type: 'string' },
    server: { type: 'string', default: 'bench' },
    round: { type: 'string', default: '1' },
    sessions: { type: 'string', default: '1 16' },
    secs: { type: 'string', default: '3' },
    new: { type: 'string', default: '10' },
    run: { type: 'string', default: `${process.pid}-${Date.now().toString(36)}` },
  },
});
if (!opt.url || !opt.pid || !opt.target) {
  console.error('usage: stdio-bench.mjs --url URL --pid PID --target NAME [--round N] [--sessions "1 16"] [--secs S] [--new N]');
  process.exit(2);
}
const url = new URL(opt.url);
const rootPid = Number(opt.pid);
const round = Number(opt.round);
const sessionCounts = opt.sessions.split(/[\s,]+/).filter(Boolean).map(Number);
const phaseMs = Number(opt.secs) * 1000;
const newSessions = Number(opt.new);

const emit = (fig, human) => {
  process.stdout.write(JSON.stringify({ server: opt.server, target: opt.target, round, ...fig }) + '\n');
  process.stderr.write(`  ${opt.server.padEnd(6)} ${opt.target.padEnd(20)} round ${round}  ${human}\n`);
};

// ---- sessions -------------------------------------------------------------------------------
async function openSession() {
  const client = new Client({ name: 'idemgw-stdio-bench', version: '1.0.0' }, { capabilities: {} });
  const transport = new StreamableHTTPClientTransport(url);
  await client.connect(transport);
  return { client, transport };
}

async function closeSession(s) {
  try {
    await s.transport.terminateSession();
  } catch {
    // a bridge that does not take DELETE: closing the transport still drops the session here
  }
  await s.client.close().catch(() => {});
}

const isReplay = (res) => Boolean(res?._meta?.['idemgw/replay']);

function percentile(sorted, p) {
  if (!sorted.length) return null;
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];
}
const round3 = (x) => (x == null ? null : Math.round(x * 1000) / 1000);

let seq = 0;
const nextItem = (s) => `${opt.run}-${opt.target}-r${round}-s${s}-${seq++}`;

// each server's write (a new item every call) and read; the read's argument is the session's
// last item
const SERVERS = {
  bench: {
    write: { name: 'append', args: (item) => ({ item }) },
    read: { name: 'get', args: () => ({}) },
  },
  memory: {
    write: {
      name: 'create_entities',
      args: (item) => ({ entities: [{ name: item, entityType: 'bench', observations: ['written by the benchmark'] }] }),
    },
    read: { name: 'open_nodes', args: (last) => ({ names: [last ?? 'none'] }) },
  },
};
const server = SERVERS[opt.server];
if (!server) {
  console.error(`stdio-bench: unknown --server ${opt.server}`);
  process.exit(2);
}

async function callTool(s, op, sIndex) {
  if (op === server.write) s.last = nextItem(sIndex);
  return s.client.callTool({ name: op.name, arguments: op.args(s.last) });
}

// ---- first answer of a new session -----------------------------------------------------------
async function firstAnswers() {
  const total = [];
  const connect = [];
  let errors = 0;
  for (let i = 0; i < newSessions; i++) {
    const t0 = performance.now();
    let s;
    try {
      s = await openSession();
      const t1 = performance.now();
      const res = await callTool(s, server.read, 0);
      const t2 = performance.now();
      if (res.isError) errors++;
      else {
        connect.push(t1 - t0);
        total.push(t2 - t0);
      }
    } catch (err) {
      errors++;
      process.stderr.write(`  ${opt.target}: new session ${i}: ${err.message}\n`);
    }
    if (s) await closeSession(s);
  }
  const mean = (a) => (a.length ? a.reduce((x, y) => x + y, 0) / a.length : null);
  const sorted = [...total].sort((a, b) => a - b);
  const fig = {
    kind: 'first_answer',
    sessions: total.length,
    mean_ms: round3(mean(total)),
    p50_ms: round3(percentile(sorted, 50)),
    max_ms: round3(sorted.at(-1)),
    connect_mean_ms: round3(mean(connect)),
    errors,
  };
  emit(fig, `first answer of a new session: mean ${fig.mean_ms} ms (connect ${fig.connect_mean_ms}), ` +
    `p50 ${fig.p50_ms}, max ${fig.max_ms}, ${total.length} sessions, ${errors} errors`);
}

// ---- load ------------------------------------------------------------------------------------
async function load(sessions, op) {
  const tool = op.name;
  const lat = [];
  let errors = 0;
  let replays = 0;
  const t0 = performance.now();
  const end = t0 + phaseMs;
  await Promise.all(sessions.map(async (s, i) => {
    while (performance.now() < end) {
      const a = performance.now();
      try {
        const res = await callTool(s, op, i);
        const b = performance.now();
        if (res.isError) errors++;
        else {
          lat.push(b - a);
          if (isReplay(res)) replays++;
        }
      } catch (err) {
        errors++;
        if (errors <= 3) process.stderr.write(`  ${opt.target}: ${tool}: ${err.message}\n`);
        if (errors > 1000) break;
      }
    }
  }));
  const secs = (performance.now() - t0) / 1000;
  lat.sort((a, b) => a - b);
  const fig = {
    kind: 'load',
    sessions: sessions.length,
    tool,
    op: op === server.write ? 'write' : 'read',
    calls: lat.length,
    secs: round3(secs),
    calls_per_s: round3(lat.length / secs),
    p50_ms: round3(percentile(lat, 50)),
    p99_ms: round3(percentile(lat, 99)),
    errors,
    replays,
  };
  emit(fig, `${String(sessions.length).padStart(2)} sessions  ${tool.padEnd(15)}  ${fig.calls_per_s} calls/s  ` +
    `p50 ${fig.p50_ms} ms  p99 ${fig.p99_ms} ms  (${fig.calls} calls, ${errors} errors, ${replays} replays)`);
}

async function withSessions(n) {
  const sessions = await Promise.all(Array.from({ length: n }, () => openSession()));
  try {
    // one answer each: a child spawned lazily, or a session's first-call state, is in the figure
    await Promise.all(sessions.map((s) => callTool(s, server.read, 0)));
    await new Promise((r) => setTimeout(r, 300));
    const mem = treeMemory(rootPid);
    emit({ kind: 'memory', sessions: n, ...mem },
      `${String(n).padStart(2)} sessions open: RSS ${mem.rss_kib} KiB, PSS ${mem.pss_kib} KiB, ${mem.procs} processes`);
    await load(sessions, server.write);
    await load(sessions, server.read);
  } finally {
    await Promise.all(sessions.map(closeSession));
  }
}

try {
  await firstAnswers();
  for (const n of sessionCounts) await withSessions(n);
} catch (err) {
  process.stderr.write(`stdio-bench: ${opt.target}: ${err.stack ?? err}\n`);
  process.exit(1);
}
process.exit(0);
