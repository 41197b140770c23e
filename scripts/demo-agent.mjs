// The "retrying agent" of scripts/demo.sh: it wants one refund, but its retry logic sends the
// same issue_refund call N times through the gateway, each on a new MCP session (as an agent
// does after a timeout or a restart), two of them at the same moment. It prints what each call
// received, what the refund server really executed (its ledger file), and the gateway's log
// lines for those calls.
//
//   node scripts/demo-agent.mjs --url GATEWAY_MCP_URL --ledger FILE --gateway-log FILE [--calls N]
//
// Exits 0 when exactly one refund was executed and every other call was answered without
// executing it again; 1 otherwise. The last line is a summary the smoke test reads:
//   "Summary: N calls, 1 executed, N-1 replayed, 0 in progress, 0 other; ledger: 1 refund"
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
// The SDK is installed under tests/ (scripts/install-deps.sh), not next to this script.
const requireFromTests = createRequire(path.join(root, 'tests', 'package.json'));
const { Client } = requireFromTests('@modelcontextprotocol/sdk/client/index.js');
const { StreamableHTTPClientTransport } = requireFromTests('@modelcontextprotocol/sdk/client/streamableHttp.js');

const { values: opt } = parseArgs({
  options: {
    url: { type: 'string' },
    ledger: { type: 'string' },
    'gateway-log': { type: 'string' },
    calls: { type: 'string', default: '5' },
  },
});
const calls = Number(opt.calls);
if (!opt.url || !opt.ledger || !opt['gateway-log'] || !Number.isInteger(calls) || calls < 1) {
  console.error('usage: demo-agent.mjs --url URL --ledger FILE --gateway-log FILE [--calls N>=1]');
  process.exit(2);
}

// Colours only on a terminal, and never when NO_COLOR is set.
const color = process.stdout.isTTY && !process.env.NO_COLOR && process.env.TERM !== 'dumb';
const paint = (code) => (s) => (color ? `\x1b[${code}m${s}\x1b[0m` : String(s));
const bold = paint('1');
const dim = paint('2');
const green = paint('32');
const cyan = paint('36');
const yellow = paint('33');
const red = paint('31');

const TOOL = 'issue_refund';
const ARGS = { order_id: 'ORD-1042', amount_cents: 2500 };

/** One attempt, on its own MCP session: connect, call, close. */
async function attempt(n) {
  const client = new Client({ name: 'demo-agent', version: '1.0.0' });
  const transport = new StreamableHTTPClientTransport(new URL(opt.url));
  let started = performance.now();
  try {
    await client.connect(transport);
    started = performance.now(); // the time shown is the tool call's, not the session setup's
    const result = await client.callTool({ name: TOOL, arguments: ARGS });
    return { n, result, ms: performance.now() - started };
  } catch (err) {
    return { n, error: err, ms: performance.now() - started };
  } finally {
    await client.close().catch(() => {});
  }
}

function textOf(result) {
  return (result.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join(' ');
}

/** executed | replayed | in_progress | other, from what the agent received. */
function classify(a) {
  if (a.error) return 'other';
  const meta = a.result._meta ?? {};
  if (meta['idemgw/replay']) return 'replayed';
  if (a.result.isError) return meta['idemgw/status']?.code === 'in_progress' ? 'in_progress' : 'other';
  return 'executed';
}

const LABEL = {
  executed: green('executed   '),
  replayed: cyan('replayed   '),
  in_progress: yellow('in progress'),
  other: red('error      '),
};

function clip(s, n) {
  return s.length > n ? `${s.slice(0, n - 1)}…` : s;
}

function describe(a, kind) {
  if (a.error) return a.error.message;
  const text = textOf(a.result);
  if (kind === 'replayed') {
    const m = a.result._meta['idemgw/replay'];
    const first = m.first_seen ? new Date(m.first_seen).toISOString().slice(11, 23) : '?';
    return `"${text}" ${dim(`(stored answer from ${first}, attempt ${m.attempts})`)}`;
  }
  if (kind === 'executed') return `"${text}"`;
  return clip(text, 110);
}

// --- the calls ------------------------------------------------------------------------------
// call 1 alone; calls 2 and 3 together (two retry layers firing at once); the rest one by one.
const plan = [];
for (let n = 1; n <= calls; n++) {
  if (n === 1) plan.push({ ns: [1], why: ['first attempt'] });
  else if (n === 2 && calls >= 3) {
    plan.push({ ns: [2, 3], why: ['retry, at the same moment as 3', 'retry, at the same moment as 2'] });
    n = 3;
  } else plan.push({ ns: [n], why: ['retry'] });
}

console.log(`The agent wants one refund: ${bold(`${TOOL} ${JSON.stringify(ARGS)}`)}`);
console.log(`Its retries (after timeouts, restarts, broken streams) send that call ${calls} time${calls === 1 ? '' : 's'},`);
console.log('each on a new MCP session, so the JSON-RPC id cannot tell them apart; the gateway keys');
console.log('each call on who calls, the tool and its arguments.' + (calls >= 3 ? ' Calls 2 and 3 go out at the same moment.' : ''));
console.log('');

const answers = [];
for (const step of plan) {
  const got = await Promise.all(step.ns.map((n) => attempt(n)));
  got.forEach((a, i) => {
    const kind = classify(a);
    answers.push({ ...a, kind });
    const label = `call ${a.n}`.padEnd(8);
    const why = step.why[i].padEnd(31);
    const ms = dim(`${a.ms.toFixed(0).padStart(4)} ms`);
    console.log(`  ${label}${why}${LABEL[kind]}  ${ms}  ${describe(a, kind)}`);
  });
}

// --- the ledger -----------------------------------------------------------------------------
const ledgerLines = fs.existsSync(opt.ledger)
  ? fs.readFileSync(opt.ledger, 'utf8').split('\n').filter((l) => l.trim())
  : [];
const refunds = ledgerLines.filter((l) => {
  try {
    return JSON.parse(l).order_id === ARGS.order_id;
  } catch {
    return false;
  }
});
console.log('');
console.log(bold('What the refund server really executed') + dim(` (its ledger, ${path.relative(process.cwd(), opt.ledger) || opt.ledger}):`));
if (ledgerLines.length === 0) console.log('  (empty: nothing was executed)');
ledgerLines.forEach((l, i) => {
  let e;
  try {
    e = JSON.parse(l);
  } catch {
    console.log(`  ${i + 1}. ${l}`);
    return;
  }
  const at = e.at ? ` at ${String(e.at).slice(11, 23)}` : '';
  console.log(`  ${i + 1}. ${e.tool ?? '?'}: ${e.amount_cents} cents on order ${e.order_id}${at}`);
});
const ledgerOk = refunds.length === 1;
console.log(ledgerOk
  ? green(`  => ${calls} call${calls === 1 ? '' : 's'}, 1 refund executed.`)
  : red(`  => ${calls} calls, ${refunds.length} refunds executed (expected exactly 1)`));

// --- the gateway's log lines for these calls ------------------------------------------------
// A request line is written once the answer has been sent, so it can trail the answer by a
// moment: wait (briefly) until all of them are there.
function gatewayLines() {
  let text = '';
  try {
    text = fs.readFileSync(opt['gateway-log'], 'utf8');
  } catch {
    return [];
  }
  const out = [];
  for (const line of text.split('\n')) {
    let j;
    try {
      j = JSON.parse(line);
    } catch {
      continue;
    }
    if ((j.msg === 'request' && j.tool === TOOL) || /^key [0-9a-f]+ recorded as /.test(j.msg ?? '')) out.push(j);
  }
  return out;
}
let logs = gatewayLines();
for (const deadline = Date.now() + 3000; logs.filter((j) => j.msg === 'request').length < calls && Date.now() < deadline;) {
  await new Promise((r) => setTimeout(r, 50));
  logs = gatewayLines();
}
console.log('');
console.log(bold('The gateway\'s log lines for these calls') + dim(` (JSON on stdout, here from ${path.relative(process.cwd(), opt['gateway-log']) || opt['gateway-log']}):`));
for (const j of logs) {
  const head = `${(j.time ?? '').slice(11, 23)} ${j.level}${j.conn !== undefined ? ` conn=${j.conn}` : ''}`;
  if (j.msg === 'request') {
    const o = j.outcome === 'executed' ? green(j.outcome) : j.outcome === 'replay' ? cyan(j.outcome) : yellow(j.outcome);
    console.log(`  ${dim(head)}  ${j.rpc_method} ${bold(j.tool)}  outcome=${o}  rpc_id=${j.rpc_id}  status=${j.status}  ${j.duration_ms} ms`);
  } else {
    console.log(`  ${dim(head)}  ${j.msg}`);
  }
}
const raw = logs.find((j) => j.msg === 'request' && j.outcome === 'replay') ?? logs[0];
if (raw) {
  console.log(dim('  Each is one JSON object per line, for example:'));
  console.log(dim(`  ${JSON.stringify(raw)}`));
}
if (logs.length === 0) console.log('  (none found)');

// --- summary --------------------------------------------------------------------------------
const count = (k) => answers.filter((a) => a.kind === k).length;
const summary = `Summary: ${calls} calls, ${count('executed')} executed, ${count('replayed')} replayed, ` +
  `${count('in_progress')} in progress, ${count('other')} other; ledger: ${refunds.length} refund${refunds.length === 1 ? '' : 's'}`;
const ok = ledgerOk && count('executed') === 1 && count('other') === 0;
console.log('');
console.log(ok ? bold(summary) : red(summary));
process.exit(ok ? 0 : 1);
