// Keeps `make bench-stdio` from rotting: runs scripts/bench/stdio.sh with BENCH_SMOKE=1 (one
// round, half-second phases, 1 and 4 sessions) and checks that the report has a row for every
// target with figures in it, and that every append through idemgw was a first execution. No
// timing value is asserted.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const TARGETS = ['idemgw_per_session', 'idemgw_shared', 'supergateway', 'mcp_proxy'];
const isNum = (v) => typeof v === 'number' && Number.isFinite(v);

test('BENCH_SMOKE=1 scripts/bench/stdio.sh reports every target', { timeout: 180_000 }, async (t) => {
  const missing = ['python3', 'curl'].filter((c) => spawnSync('sh', ['-c', `command -v ${c}`]).status !== 0);
  if (missing.length) {
    t.skip(`benchmark tools missing: ${missing.join(', ')}`);
    return;
  }
  const out = await fs.mkdtemp(path.join(os.tmpdir(), 'idemgw-bench-stdio-smoke-'));
  t.after(() => fs.rm(out, { recursive: true, force: true }));

  const proc = spawn('scripts/bench/stdio.sh', [], {
    cwd: REPO,
    env: { ...process.env, BENCH_SMOKE: '1', BENCH_OUT: out },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let log = '';
  proc.stdout.on('data', (d) => {
    stdout += d;
    log += d;
  });
  proc.stderr.on('data', (d) => (log += d));
  const code = await new Promise((resolve) => proc.on('exit', resolve));
  assert.equal(code, 0, `stdio.sh failed:\n${log}`);

  // the Markdown tables: a row per target in the calls table (both session counts) and in the
  // sessions table
  for (const target of TARGETS) {
    const rows = stdout.split('\n').filter((l) => l.startsWith(`| ${target} |`));
    assert.ok(rows.length >= 3, `${target}: rows missing from the report:\n${stdout}`);
    for (const row of rows) {
      const cells = row.split('|').slice(2, -1).map((c) => c.trim());
      // a per-session memory figure is a difference, negative when the collector shrank the
      // front between the two readings (a shared child costs a session about nothing)
      assert.ok(cells.every((c) => /^-?[\d,.]+$/.test(c)), `${target}: a figure is missing: ${row}`);
    }
  }

  const doc = JSON.parse(await fs.readFile(path.join(out, 'stdio-latest.json'), 'utf8'));
  assert.equal(doc.meta.smoke, true);
  assert.deepEqual(doc.summary.map((e) => e.target), TARGETS);
  for (const e of doc.summary) {
    assert.ok(isNum(e.first_answer_mean_ms) && e.first_answer_errors === 0, `${e.target}: first answer:\n${log}`);
    assert.equal(e.load.length, 4, `${e.target}: append and get at 1 and 4 sessions`);
    for (const l of e.load) {
      assert.ok(l.calls > 0 && isNum(l.calls_per_s) && isNum(l.p50_ms) && isNum(l.p99_ms), `${e.target} ${l.tool} x${l.sessions}`);
      assert.equal(l.errors, 0, `${e.target}: ${l.tool} at ${l.sessions} sessions failed:\n${log}`);
      assert.equal(l.replays, 0, `${e.target}: an append was answered as a replay`);
    }
    assert.ok(isNum(e.rss_per_session_kib) && isNum(e.pss_per_session_kib), `${e.target}: memory per session`);
  }
  // each append through a gateway claimed a key and ran once
  for (const gw of ['idemgw_per_session', 'idemgw_shared']) {
    const sent = doc.summary.find((e) => e.target === gw).load.filter((l) => l.tool === 'append')
      .reduce((n, l) => n + l.calls, 0);
    assert.equal(doc.meta[`${gw}_executions`], sent, `${gw}: executions recorded vs append calls answered`);
  }
});
