// The campaign (`make faults` runs it short as the scenario "campaign"; `make faults-campaign`
// runs it long): protected calls through two gateways on one Postgres, gateway A in front of an
// HTTP server (the v2 SDK's, stateless) and gateway B in front of a stdio server (a child per caller), both naming the
// same tool, so one key is claimed through either. While agents call, a chaos loop injects, one
// at a time and at random points: kill -9 of a gateway (then started again on its port), kill -9
// of a stdio child, kill -9 of Postgres (then restarted), and once a failover to a synchronous
// standby behind the multi-host database_url. Agents call as agents do: the same call sent again
// 0–10 ms apart to either gateway, a call abandoned mid-flight and re-sent, some with an explicit
// Idempotency-Key. When the chaos stops, every order is asked once more.
//
// It passes when no order ran twice (the two servers' ledgers together), no answer named
// another call's order, and every order's last answer is its result replayed, a refusal that
// holds it (outcome unknown, or still in progress), or its one execution now.
//
//   CAMPAIGN_CALLS   orders (distinct protected calls) to make, default 3000; each is sent
//                    1–3 times, so the gateways see more
//   CAMPAIGN_SEED    the PRNG's seed (printed), for the choices of calls and faults
import { spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import path from 'node:path';
import {
  NODE, TESTS, pgClusterPids, readLedger, run, startGateway, startPgCluster, startPgStandby, startV2Server,
  tempDir, waitFor,
} from '../integration/lib/harness.mjs';
import { report, tally } from './lib.mjs';

const LEDGER_SERVER = path.join(TESTS, 'fixtures/ledger-stdio.mjs');
const WORKERS = 12;
const CONFIG = {
  subject: { header: 'X-Subject' },
  tools: { issue_refund: { class: 'non_idempotent' } },
  defaults: { on_store_down: 'reject' },
  // a gateway killed mid-call leaves its claim in progress until the lease ends: short, so the
  // last pass sees most of them settled (those still in progress are held, which also passes)
  timeouts: { upstream: '5s' },
};

/** mulberry32: a small seeded PRNG, so a campaign's choices can be replayed. */
function prng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function psql(url, sql) {
  const r = await run('psql', [url, '-v', 'ON_ERROR_STOP=1', '-qAtc', sql]);
  if (r.code !== 0) throw new Error(`psql: ${r.stderr}`);
  return r.stdout.trim();
}

/** Every order an answer's text names: the HTTP server says "order X", the stdio one "on X (". */
function ordersNamed(text) {
  return [...text.matchAll(/order (\S+?)[ )]|Refunded \d+ on (\S+) \(/g)].map((m) => m[1] ?? m[2]);
}

/**
 * One protected call, which may be abandoned after abortMs. Returns the kind of answer:
 * executed, replay, held (a refusal that keeps the order: outcome unknown or in progress),
 * refused (a refusal that says nothing ran), error (no usable answer), and whether it named
 * another order.
 */
async function call(url, { subject, order, key, abortMs }) {
  const headers = {
    Accept: 'application/json, text/event-stream',
    'Content-Type': 'application/json',
    'MCP-Protocol-Version': '2025-11-25',
    'X-Subject': subject,
    ...(key ? { 'Idempotency-Key': key } : {}),
  };
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), abortMs ?? 20000);
  try {
    const res = await fetch(url, {
      method: 'POST',
      headers,
      body: JSON.stringify({
        jsonrpc: '2.0', id: 1, method: 'tools/call',
        params: { name: 'issue_refund', arguments: { order_id: order, amount_cents: 100 } },
      }),
      signal: ctl.signal,
    });
    const text = await res.text();
    if (res.status !== 200) return { kind: 'error', code: `http_${res.status}` };
    let msg = null;
    for (const m of text.matchAll(/^data: ?(.*)$/gm)) msg = JSON.parse(m[1]);
    if (!msg && text.startsWith('{')) msg = JSON.parse(text);
    const result = msg?.result;
    if (!result) return { kind: 'error', code: msg?.error ? `rpc_${msg.error.code}` : 'no_answer' };
    const body = (result.content ?? []).map((c) => c.text ?? '').join('\n');
    const wrong = ordersNamed(body).some((o) => o !== order);
    const status = result._meta?.['idemgw/status'];
    if (status) {
      const held = status.code === 'outcome_unknown' || status.code === 'in_progress';
      return { kind: held ? 'held' : 'refused', code: status.code, wrong };
    }
    if (result._meta?.['idemgw/replay']) return { kind: 'replay', wrong };
    if (result.isError) return { kind: 'error', code: 'tool_error', wrong };
    return { kind: 'executed', wrong };
  } catch (err) {
    return { kind: 'error', code: ctl.signal.aborted ? 'abandoned' : 'connection' };
  } finally {
    clearTimeout(timer);
  }
}

/** The counts of answers, for the report line. */
function file(tl, a) {
  tl.calls++;
  if (a.wrong) tl.wrong_caller++;
  if (a.kind === 'executed') tl.executed++;
  else if (a.kind === 'replay') tl.replays++;
  else if (a.kind === 'held' || a.kind === 'refused') tl.refusals++;
  else tl.http_errors++;
  if (a.code) tl.codes[a.code] = (tl.codes[a.code] ?? 0) + 1;
}

export async function campaign(s) {
  const orders = Number(process.env.CAMPAIGN_CALLS ?? 3000);
  const seed = Number(process.env.CAMPAIGN_SEED ?? (Date.now() % 1000000));
  const rand = prng(seed);
  const pick = (n) => Math.floor(rand() * n);

  // Postgres with a synchronous standby: a claim the primary acknowledged survives the failover
  const primary = await startPgCluster(s);
  const standby = await startPgStandby(s, primary);
  await psql(primary.baseUrl, "ALTER SYSTEM SET synchronous_standby_names = '*'");
  await psql(primary.baseUrl, 'SELECT pg_reload_conf()');
  await waitFor(async () => (await psql(primary.baseUrl, 'SELECT sync_state FROM pg_stat_replication')) === 'sync',
    { timeoutMs: 30000, what: 'the standby to be synchronous' });
  const primaryPort = new URL(primary.baseUrl).port;
  const databaseUrl = `postgresql://postgres@127.0.0.1:${primaryPort},127.0.0.1:${standby.port}/idem`;

  const dir = await tempDir(s, 'idemgw-campaign-');
  const stdioLedger = path.join(dir, 'stdio-ledger.jsonl');
  const http = await startV2Server(s); // stateless: a call needs no session, as after a restart
  const specs = {
    A: { upstream: http.url },
    B: { upstream: { command: [NODE, LEDGER_SERVER], env: { LEDGER: stdioLedger }, max_children: 64 } },
  };
  const gws = {};
  const open = async (name, ports = {}) => {
    gws[name] = await startGateway(s, { ...specs[name], databaseUrl, config: CONFIG, ...ports });
  };
  await open('A');
  await open('B');
  const urls = { A: gws.A.url, B: gws.B.url };

  const tl = tally();
  const faults = { gateway_kill9: 0, child_kill9: 0, postgres_kill9: 0, failover: 0 };
  const executedAnswers = new Map(); // order -> answers that said it executed
  const asked = new Map(); // order -> {subject, key}: the last pass asks as it was asked
  let done = 0;
  let chaosOn = true;

  // --- the chaos loop ---
  let pgDir = primary.dir; // the cluster that is the primary now
  let failedOver = false;
  const restartGateway = async (name) => {
    const old = gws[name];
    old.proc.kill('SIGKILL');
    await new Promise((r) => (old.proc.exitCode !== null || old.proc.signalCode ? r() : old.proc.once('exit', r)));
    faults.gateway_kill9++;
    await open(name, { port: old.port, adminPort: old.adminPort });
  };
  const killChild = async () => {
    const pid = gws.B.proc.pid;
    const kids = (await run('ps', ['-o', 'pid=', '--ppid', String(pid)])).stdout.split('\n').map((x) => Number(x.trim())).filter(Boolean);
    if (!kids.length) return;
    try {
      process.kill(kids[pick(kids.length)], 'SIGKILL');
      faults.child_kill9++;
    } catch {
      // gone already
    }
  };
  const killPostgres = async (promote) => {
    const pids = await pgClusterPids(pgDir);
    for (const pid of pids) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone already
      }
    }
    await waitFor(async () => !(await fs.stat(`/proc/${pids[0]}`).catch(() => null)), { timeoutMs: 30000, what: 'the killed postmaster to be reaped' });
    if (promote) {
      await standby.promote();
      pgDir = standby.dir;
      failedOver = true;
      faults.failover++;
    } else {
      const r = await run('bash', [path.join(TESTS, '..', 'scripts/pg-cluster.sh'), 'start', pgDir], { timeout: 90000 });
      if (r.code !== 0) throw new Error(`restarting Postgres: ${r.stderr}`);
      faults.postgres_kill9++;
    }
  };
  const chaos = (async () => {
    while (chaosOn) {
      await sleep(200 + pick(800));
      if (!chaosOn) break;
      const r = rand();
      // the failover once, a third of the way in; the promoted primary is then killed and
      // restarted in its turn
      if (!failedOver && done > orders * 0.3) await killPostgres(true);
      else if (r < 0.4) await restartGateway(rand() < 0.5 ? 'A' : 'B');
      else if (r < 0.9) await killChild();
      else if (failedOver) await killPostgres(false);
    }
  })();

  // --- the agents ---
  let next = 0;
  const agent = async (w) => {
    const subject = `camp-${w}`;
    for (let i = next++; i < orders; i = next++) {
      const order = `c${seed}-${i}`;
      const key = rand() < 0.2 ? `k-${order}` : undefined;
      asked.set(order, { subject, key });
      const target = () => urls[rand() < 0.5 ? 'A' : 'B'];
      const answers = [];
      const r = rand();
      if (r < 0.55) {
        answers.push(await call(target(), { subject, order, key }));
        if (rand() < 0.3) {
          await sleep(pick(11));
          answers.push(await call(target(), { subject, order, key }));
        }
      } else if (r < 0.8) {
        // a burst: the same call 2–3 times, 0–10 ms apart, to either gateway
        const n = 2 + pick(2);
        const sends = [];
        for (let k = 0; k < n; k++) {
          sends.push(call(target(), { subject, order, key }));
          await sleep(pick(11));
        }
        answers.push(...(await Promise.all(sends)));
      } else {
        // the agent gives up on the call 0–10 ms in and sends it again
        answers.push(await call(target(), { subject, order, key, abortMs: pick(11) }));
        await sleep(pick(11));
        answers.push(await call(target(), { subject, order, key }));
      }
      for (const a of answers) {
        file(tl, a);
        if (a.kind === 'executed') executedAnswers.set(order, (executedAnswers.get(order) ?? 0) + 1);
      }
      done++;
    }
  };
  const t0 = Date.now();
  await Promise.all(Array.from({ length: WORKERS }, (_, w) => agent(w)));
  chaosOn = false;
  await chaos;

  // --- settle, then the last pass: every order asked once more ---
  for (const name of ['A', 'B']) {
    await waitFor(async () => (await fetch(`${gws[name].adminUrl}/readyz`).catch(() => ({ status: 0 }))).status === 200,
      { timeoutMs: 60000, what: `gateway ${name} ready after the chaos` });
  }
  const last = tally();
  const lastKinds = new Map();
  let at = 0;
  await Promise.all(Array.from({ length: WORKERS }, async (_, w) => {
    for (let i = at++; i < orders; i = at++) {
      const order = `c${seed}-${i}`;
      // the caller and the explicit key, when it had one, make the key: asked as before
      const a = await call(urls[(i + w) % 2 ? 'A' : 'B'], { ...asked.get(order), order });
      lastKinds.set(order, a);
      file(last, a);
    }
  }));

  // --- the verdict ---
  const counts = new Map();
  for (const e of [...(await readLedger(http.ledger)), ...(await readLedger(stdioLedger))]) {
    counts.set(e.order_id, (counts.get(e.order_id) ?? 0) + 1);
  }
  const doubles = [...counts.values()].filter((n) => n > 1).length;
  let acknowledgedTwice = 0;
  for (const n of executedAnswers.values()) if (n > 1) acknowledgedTwice++;
  // an order whose last answer is a replay ran; one that ran is never run again
  let badEnds = 0;
  for (const [order, a] of lastKinds) {
    const ran = counts.get(order) ?? 0;
    if (a.kind === 'replay' && ran !== 1) badEnds++;
    if (a.kind === 'executed' && ran !== 1) badEnds++;
    if (a.kind === 'error' || a.kind === 'refused') badEnds++;
  }
  tl.wrong_caller += last.wrong_caller;
  const secs = ((Date.now() - t0) / 1000).toFixed(0);
  const endKinds = ['replay', 'held', 'executed', 'refused', 'error']
    .map((k) => `${k}=${[...lastKinds.values()].filter((a) => a.kind === k).length}`).join('/');
  const faultText = Object.entries(faults).map(([k, v]) => `${k}=${v}`).join(',');
  return report('campaign', tl, {
    executions: [...counts.values()].reduce((x, y) => x + y, 0),
    doubles: doubles + acknowledgedTwice,
    extra: `seed=${seed} orders=${orders} faults:${faultText} last_pass:${endKinds} bad_ends=${badEnds} seconds=${secs}`,
    failIf: badEnds > 0 || faults.failover !== 1,
  });
}

export const campaignScenarios = { campaign };
