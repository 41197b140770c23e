// The container image, run for real with podman (scripts/image-test.sh builds it and runs
// this): in front of the refund fixture on the host, as the image's own non-root user, with
// a read-only root filesystem and its state in its one volume.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import { freePort, mcpClient, readLedger, replayMarker, run, startRefundServer, tempDir, toolText, waitFor } from '../integration/lib/harness.mjs';

const IMAGE = process.env.IDEMGW_IMAGE ?? 'localhost/idemgw:test';
const EXTRA = (process.env.IDEMGW_PODMAN_ARGS ?? '').split(' ').filter(Boolean);

async function podman(...args) {
  const r = await run('podman', args, { timeout: 120000 });
  if (r.code !== 0) throw new Error(`podman ${args.join(' ')}: ${r.stderr}`);
  return r.stdout.trim();
}

test('the image protects a call, as a non-root user on a read-only root, and stops on SIGTERM', async (t) => {
  const upstream = await startRefundServer(t);
  const port = await freePort();
  const adminPort = await freePort();
  const state = await tempDir(t, 'idemgw-image-state-');
  await fs.chown(state, 65532, 65532);
  const name = `idemgw-image-test-${process.pid}`;
  await podman('run', '-d', '--name', name, ...EXTRA, '--network', 'host', '--read-only',
    '-v', `${state}:/var/lib/idemgw`,
    '-e', `IDEMGW_UPSTREAM=${upstream.url}`, '-e', `IDEMGW_LISTEN=127.0.0.1:${port}`,
    '-e', `IDEMGW_ADMIN_LISTEN=127.0.0.1:${adminPort}`, IMAGE);
  t.after(async () => {
    const logs = await run('podman', ['logs', name]);
    if (process.env.IDEMGW_IMAGE_LOGS) console.log(logs.stdout, logs.stderr);
    await run('podman', ['rm', '-f', name]);
  });

  const url = `http://127.0.0.1:${port}/mcp`;
  await waitFor(async () => (await fetch(`http://127.0.0.1:${adminPort}/readyz`).catch(() => null))?.status === 200 || null,
    { timeoutMs: 30000, what: 'the container to be ready' });
  assert.equal(await podman('inspect', '--format', '{{.Config.User}}', name), '65532:65532');
  const health = await run('podman', ['healthcheck', 'run', name]);
  assert.equal(health.code, 0, `HEALTHCHECK: ${health.stdout} ${health.stderr}`);

  const client = await mcpClient(t, url);
  const args = { order_id: 'ord-image', amount_cents: 9 };
  const first = await client.callTool({ name: 'issue_refund', arguments: args });
  assert.match(toolText(first), /^Refunded 9 cents/);
  const again = await client.callTool({ name: 'issue_refund', arguments: args });
  assert.ok(replayMarker(again), 'replayed from the embedded store in the volume');
  assert.equal((await readLedger(upstream.ledger)).length, 1);
  assert.ok((await fs.readdir(state)).length > 0, 'the state is in the volume');
  await client.close();

  await podman('stop', '-t', '20', name);
  assert.equal(await podman('inspect', '--format', '{{.State.ExitCode}}', name), '0', 'drained and exited 0');
});
