// Keeps `make bench` from rotting: runs scripts/bench.sh with BENCH_SMOKE=1 (tiny durations and
// sizes) and checks that the JSON it writes has every section, and that section (10) wrote its
// own document. No timing value is asserted.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const NEEDED = ['wrk', 'nginx', 'pgbench', 'psql', 'python3', 'cc', 'curl', 'redis-server'];

function missingTools() {
  const env = { ...process.env, PATH: `${process.env.PATH}:/usr/sbin:/sbin` };
  return NEEDED.filter((t) => spawnSync('sh', ['-c', `command -v ${t}`], { env }).status !== 0);
}

test('BENCH_SMOKE=1 scripts/bench.sh writes every section', { timeout: 600_000 }, async (t) => {
  const missing = missingTools();
  if (missing.length) {
    t.skip(`benchmark tools missing: ${missing.join(', ')}`);
    return;
  }
  const out = await fs.mkdtemp(path.join(os.tmpdir(), 'idemgw-bench-smoke-'));
  t.after(() => fs.rm(out, { recursive: true, force: true }));

  const proc = spawn('scripts/bench.sh', [], {
    cwd: REPO,
    env: { ...process.env, BENCH_SMOKE: '1', BENCH_OUT: out, PATH: `${process.env.PATH}:/usr/sbin` },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let log = '';
  proc.stdout.on('data', (d) => (log += d));
  proc.stderr.on('data', (d) => (log += d));
  const code = await new Promise((resolve) => proc.on('exit', resolve));
  assert.equal(code, 0, `bench.sh failed:\n${log}`);

  const doc = JSON.parse(await fs.readFile(path.join(out, 'latest.json'), 'utf8'));
  for (const s of ['meta', 'passthrough', 'protected', 'replay', 'sse', 'memory', 'growth', 'jwt', 'powertools', 'observability', 'cost', 'https']) {
    assert.ok(doc[s], `section ${s} missing:\n${log}`);
  }
  assert.equal(doc.meta.smoke, true);

  assert.ok(doc.passthrough.length >= 1);
  for (const row of doc.passthrough) {
    for (const target of ['direct', 'nginx', 'idemgw']) {
      assert.ok(row[target] && 'rps' in row[target] && 'p99_us' in row[target], `pass-through ${target}`);
      assert.equal(row[target].non2xx, 0, `pass-through ${target} at ${row.conns} got non-2xx answers`);
    }
    assert.ok('ratio_idemgw_nginx' in row && 'added_p99_us_vs_direct' in row);
  }

  assert.ok(doc.protected.idemgw && doc.protected.pgbench && 'ratio_idemgw_pgbench' in doc.protected);
  assert.equal(doc.protected.idemgw.non2xx, 0);
  assert.equal(doc.protected.sql_matches_store, true, 'scripts/bench/claim-finish.sql drifted from src/store/store_pg.c');
  assert.ok(doc.protected_sqlite?.idemgw && 'rps' in doc.protected_sqlite.idemgw, `embedded store section:\n${log}`);
  assert.equal(doc.protected_sqlite.idemgw.non2xx, 0);

  assert.ok(doc.replay.idemgw && doc.replay.passthrough && 'ratio_replay_passthrough' in doc.replay);
  assert.equal(doc.replay.idemgw.non2xx, 0);

  for (const target of ['direct', 'nginx', 'idemgw', 'idemgw_protected']) {
    assert.ok(doc.sse[target] && 'p99_us' in doc.sse[target], `sse ${target}`);
  }

  for (const kind of ['idle_connections', 'sse_streams']) {
    assert.ok(doc.memory[kind], `memory ${kind}`);
    assert.equal(doc.memory[kind].opened, true, `memory ${kind}: the client could not open its connections`);
    assert.ok('kib_each' in doc.memory[kind]);
  }

  assert.equal(doc.growth.runs.length, 2);
  assert.ok('ratio_protected_large_small' in doc.growth && 'ratio_replay_large_small' in doc.growth);

  // (8) every target, both modes, both connection counts, all answered 2xx
  const targets = ['plain', 'powertools', 'idemgw_pg', 'idemgw_pg_gc', 'idemgw_pg_cd', 'idemgw_sqlite', 'idemgw_sqlite_cd'];
  assert.equal(doc.powertools.runs.length, 2 * 2 * targets.length, `powertools runs:\n${log}`);
  for (const run of doc.powertools.runs) {
    assert.ok(targets.includes(run.target) && 'ratio_to_plain' in run, `powertools ${run.target}`);
    assert.equal(run.non2xx, 0, `powertools ${run.mode} ${run.target} at ${run.conns} got non-2xx answers`);
    assert.equal(run.errors, 0, `powertools ${run.mode} ${run.target} at ${run.conns} had socket errors`);
  }
  assert.ok(doc.powertools.pgbench && 'tps' in doc.powertools.pgbench);
  assert.ok(doc.powertools.group_commit && 'claim_batches' in doc.powertools.group_commit);

  // (11) CPU and upstream connections per call: read and protected, both stores, 1 and 16
  assert.equal(doc.cost.length, 2 * 2 * 2, `cost section:\n${log}`);
  for (const e of doc.cost) {
    assert.ok(e.cpu_us_per_call !== undefined && 'cpu_x_read' in e && 'upstream_connections_per_1000' in e, `cost ${e.store} ${e.mode}`);
    // measured (the thread's and the process's ticks are each rounded to 10 ms, so in a smoke
    // run of one second the loop's figure may pass the whole's by a tick or two)
    assert.ok(typeof e.loop_cpu_us_per_call === 'number' && e.loop_cpu_us_per_call >= 0, `cost ${e.store} ${e.mode}: the loop thread's CPU per call`);
    if (e.store === 'postgres') assert.ok(e.postgres_cpu_us_per_call >= 0, `cost postgres ${e.mode}: Postgres's own CPU per call is measured`);
    else assert.equal(e.postgres_cpu_us_per_call, null, 'the embedded store runs in the gateway: no Postgres figure');
    for (const r of e.rounds) assert.equal(r.non2xx, 0, `cost ${e.store} ${e.mode} at ${e.conns} got non-2xx answers`);
  }
  // (12) the https upstream answered every call, and its handshakes were counted
  assert.equal(doc.https.length, 2 * 2 * 2, `https section:\n${log}`);
  for (const e of doc.https) {
    assert.equal(e.idemgw.non2xx, 0, `https ${e.scheme} ${e.mode} at ${e.conns} got non-2xx answers`);
    assert.ok('handshakes_full_per_1000' in e && 'handshakes_resumed_per_1000' in e);
  }
  const tls = doc.https.filter((e) => e.scheme === 'https');
  assert.ok(tls.some((e) => e.handshakes_full_per_1000 + e.handshakes_resumed_per_1000 > 0), 'an https upstream shakes hands');
  assert.ok(doc.https.filter((e) => e.scheme === 'http').every((e) => e.handshakes_full_per_1000 === 0));

  // (10) stdio servers writes its own document (tests/integration/bench-stdio-smoke.test.mjs
  // checks its figures)
  const stdio = JSON.parse(await fs.readFile(path.join(out, 'stdio-latest.json'), 'utf8'));
  assert.equal(stdio.summary.length, 4, `stdio section:\n${log}`);
});
