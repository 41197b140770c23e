// Latency a protected (non_idempotent) tool call adds, measured end to end from an HTTP client:
//   direct        issue_refund straight to the refund fixture (no gateway)
//   read class    the same work (slow_refund, delay_ms 0, classified read) through the gateway
//   protected     issue_refund through the gateway, first execution (claim + forward + finish)
//   replay        the same issue_refund again (claim finds the stored result; no upstream)
// Each call has unique arguments except the replays. Calls are sequential on one keep-alive
// session, so the numbers are per-call latency, not throughput. Not part of `make check`.
//
//   tools/node/bin/node tests/bench/protected-latency.mjs [--calls N] [--warmup N] [--json]
// --json makes the fixture answer with JSON bodies instead of SSE streams. Postgres: a private
// cluster in a temp folder (scripts/pg-cluster.sh), or IDEMGW_BENCH_PG_URL (a database the
// gateway may migrate). IDEMGW_BIN picks the binary (default build/idemgw).
import { parseArgs } from 'node:util';
import { rawSession, startGateway, startPgCluster, startRefundServer } from '../integration/lib/harness.mjs';

const { values: opts } = parseArgs({
  options: {
    calls: { type: 'string', default: '1000' },
    warmup: { type: 'string', default: '100' },
    json: { type: 'boolean', default: false },
  },
});
const CALLS = Number(opts.calls);
const WARMUP = Number(opts.warmup);

// The harness helpers take a test context for cleanup; this stands in for one.
const cleanups = [];
const ctx = { passed: true, after: (fn) => cleanups.push(fn) };
async function cleanup() {
  for (const fn of cleanups.reverse()) await Promise.resolve().then(fn).catch(() => {});
}
process.on('SIGINT', () => cleanup().then(() => process.exit(130)));

function stats(samples) {
  const s = [...samples].sort((a, b) => a - b);
  const q = (p) => s[Math.min(s.length - 1, Math.ceil(p * s.length) - 1)];
  return { n: s.length, p50: q(0.5), p90: q(0.9), p99: q(0.99), mean: s.reduce((a, b) => a + b, 0) / s.length };
}

async function measure(label, n, fn) {
  const out = [];
  for (let i = 0; i < n; i++) {
    const t0 = process.hrtime.bigint();
    const r = await fn(i);
    const ms = Number(process.hrtime.bigint() - t0) / 1e6;
    if (r.status !== 200 || !r.message?.result || r.message.result.isError) {
      throw new Error(`${label}: call ${i} failed: HTTP ${r.status} ${r.body.slice(0, 300)}`);
    }
    out.push(ms);
  }
  return out;
}

try {
  const pgUrl = process.env.IDEMGW_BENCH_PG_URL ?? (await startPgCluster(ctx)).url;
  const upstream = await startRefundServer(ctx, { jsonResponse: opts.json });
  const gw = await startGateway(ctx, {
    upstream: upstream.url,
    databaseUrl: pgUrl,
    config: {
      subject: { static: 'bench' },
      log: { level: 'warn' },
      tools: { issue_refund: { class: 'non_idempotent' }, slow_refund: { class: 'read' } },
    },
  });
  const direct = await rawSession(ctx, upstream.url);
  const viaGw = await rawSession(ctx, gw.url);
  const run = `${Date.now().toString(36)}`;
  const refund = (tag, i) => ({ order_id: `bench-${run}-${tag}-${i}`, amount_cents: 100 + (i % 900) });

  // Warm-up: connections, JIT, prepared statements, Postgres caches.
  await measure('warmup direct', WARMUP, (i) => direct.call('issue_refund', refund('wd', i)));
  await measure('warmup read', WARMUP, (i) => viaGw.call('slow_refund', { ...refund('wr', i), delay_ms: 0 }));
  await measure('warmup protected', WARMUP, (i) => viaGw.call('issue_refund', refund('wp', i)));
  await measure('warmup replay', WARMUP, (i) => viaGw.call('issue_refund', refund('wp', i)));

  // Interleaved in rounds, so drift (ledger growth, table growth) hits every row alike.
  const rows = { direct: [], read: [], protected: [], replay: [] };
  const ROUND = 50;
  for (let base = 0; base < CALLS; base += ROUND) {
    const n = Math.min(ROUND, CALLS - base);
    rows.direct.push(...await measure('direct', n, (i) => direct.call('issue_refund', refund('d', base + i))));
    rows.read.push(...await measure('read', n, (i) => viaGw.call('slow_refund', { ...refund('r', base + i), delay_ms: 0 })));
    rows.protected.push(...await measure('protected', n, (i) => viaGw.call('issue_refund', refund('p', base + i))));
    rows.replay.push(...await measure('replay', n, async (i) => {
      const r = await viaGw.call('issue_refund', refund('p', base + i));
      if (r.headers.get('idempotent-replayed') !== 'true') throw new Error(`replay ${base + i} was not replayed: ${r.body}`);
      return r;
    }));
  }

  const s = Object.fromEntries(Object.entries(rows).map(([k, v]) => [k, stats(v)]));
  const f = (x) => x.toFixed(2).padStart(8);
  const d = (x) => (x >= 0 ? '+' : '') + x.toFixed(2);
  console.log(`\nprotected-call latency, ${CALLS} sequential calls per row, ${opts.json ? 'JSON' : 'SSE'} responses, ms`);
  console.log(`${'row'.padEnd(30)} ${'p50'.padStart(8)} ${'p90'.padStart(8)} ${'p99'.padStart(8)} ${'mean'.padStart(8)}   p50 vs direct / vs read   p99 vs direct / vs read`);
  const names = {
    direct: 'direct to upstream',
    read: 'gateway, read class',
    protected: 'gateway, protected 1st exec',
    replay: 'gateway, protected replay',
  };
  for (const k of Object.keys(rows)) {
    const x = s[k];
    const vs = k === 'direct' ? ''
      : `   ${d(x.p50 - s.direct.p50).padStart(8)} / ${d(x.p50 - s.read.p50).padStart(7)}   ${d(x.p99 - s.direct.p99).padStart(8)} / ${d(x.p99 - s.read.p99).padStart(7)}`;
    console.log(`${names[k].padEnd(30)} ${f(x.p50)} ${f(x.p90)} ${f(x.p99)} ${f(x.mean)}${vs}`);
  }
} catch (err) {
  console.error(err.stack ?? err);
  process.exitCode = 1;
} finally {
  await cleanup();
}
