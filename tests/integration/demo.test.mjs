// Smoke test of the README's run command: scripts/demo.sh --once must bring everything up,
// show one refund executed and every other call replayed, stop everything and exit 0.
// It runs in its own temporary folder (IDEMGW_DEMO_DIR) with its own key store and free
// ports, so it never meets the other tests or a demo a developer has running.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { IDEMGW_BIN, REPO, tempDir } from './lib/harness.mjs';

const CALLS = 4;
const TIMEOUT_MS = 240_000; // initdb and a first start

function runDemo(env, args) {
  return new Promise((resolve) => {
    // Its own process group, so a timeout stops the script and everything it started.
    const proc = spawn(path.join(REPO, 'scripts/demo.sh'), args, {
      cwd: REPO,
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: true,
    });
    let out = '';
    proc.stdout.setEncoding('utf8').on('data', (c) => { out += c; });
    proc.stderr.setEncoding('utf8').on('data', (c) => { out += c; });
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      try { process.kill(-proc.pid, 'SIGTERM'); } catch {}
      setTimeout(() => { try { process.kill(-proc.pid, 'SIGKILL'); } catch {} }, 10_000).unref();
    }, TIMEOUT_MS);
    // 'close': the script has exited and its output has been read to the end.
    proc.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, out, timedOut });
    });
  });
}

test(`scripts/demo.sh --once --calls ${CALLS}: one refund executed, ${CALLS - 1} replayed`, { timeout: TIMEOUT_MS + 20_000 }, async (t) => {
  const dir = await tempDir(t, 'idemgw-demo-');
  const env = {
    ...process.env,
    IDEMGW_DEMO_DIR: dir,
    IDEMGW_BIN, // the binary under test (the ASan build under make check-asan); skips make
    CI: 'true',
  };
  delete env.NO_COLOR;
  // --no-install: a test never installs anything while other tests run
  const r = await runDemo(env, ['--once', '--no-install', '--calls', String(CALLS)]);
  const show = `\n----- demo.sh output -----\n${r.out}\n-----`;

  assert.equal(r.timedOut, false, `demo.sh did not finish within ${TIMEOUT_MS} ms${show}`);
  assert.equal(r.code, 0, `demo.sh exited with ${r.code} (signal ${r.signal})${show}`);

  const callLines = r.out.split('\n').filter((l) => /^\s+call \d+\s/.test(l));
  assert.equal(callLines.length, CALLS, `one line per call${show}`);
  assert.equal(callLines.filter((l) => /\bexecuted\b/.test(l)).length, 1, `exactly one call executed${show}`);
  assert.equal(callLines.filter((l) => /\breplayed\b/.test(l)).length, CALLS - 1, `the others replayed${show}`);
  assert.match(r.out, new RegExp(`Summary: ${CALLS} calls, 1 executed, ${CALLS - 1} replayed, 0 in progress, 0 other; ledger: 1 refund`), show);
  assert.match(r.out, /=> \d+ calls, 1 refund executed\./, show);

  // The gateway's own log lines for those calls: one execution and the replays.
  assert.equal((r.out.match(/tools\/call issue_refund\s+outcome=executed/g) ?? []).length, 1, show);
  assert.equal((r.out.match(/tools\/call issue_refund\s+outcome=replay\b/g) ?? []).length, CALLS - 1, show);

  // How to connect a real client, and the key command.
  assert.match(r.out, /http:\/\/127\.0\.0\.1:\d+\/mcp/, show);
  assert.match(r.out, /idemgw key -c conf\/demo\.yaml --subject demo-agent --tool issue_refund/, show);
  assert.match(r.out, /demo-agent:issue_refund:h:[0-9a-f]{32}/, show);

  // No terminal: no colour codes; and everything was stopped.
  assert.doesNotMatch(r.out, /\x1b\[/, `escape codes in non-terminal output${show}`);
  assert.match(r.out, /Stopping the demo: .* stopped\./, show);
});
