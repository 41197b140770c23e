// The container image, run for real with podman (scripts/image-test.sh builds it and runs
// this): in front of the refund fixture on the host, as the image's own non-root user, with a
// read-only root filesystem; keys in the embedded store on its volume, or in a Postgres the
// test starts.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import {
  freePort, mcpClient, readLedger, replayMarker, run, startPgCluster, startRefundServer, tempDir, toolText, waitFor,
  waitForLedger,
} from '../integration/lib/harness.mjs';

const IMAGE = process.env.IDEMGW_IMAGE ?? 'localhost/idemgw:test';
const EXTRA = (process.env.IDEMGW_PODMAN_ARGS ?? '').split(' ').filter(Boolean);

async function podman(...args) {
  const r = await run('podman', args, { timeout: 120000 });
  if (r.code !== 0) throw new Error(`podman ${args.join(' ')}: ${r.stderr}`);
  return r.stdout.trim();
}

test('the image holds no compiler', async () => {
  const r = await run('podman', ['run', '--rm', ...EXTRA, '--entrypoint', '/bin/sh', IMAGE, '-c',
    'for c in cc gcc clang make; do command -v $c && exit 1; done; exit 0']);
  assert.equal(r.code, 0, `found: ${r.stdout}`);
});

for (const store of ['embedded', 'postgres']) {
  test(`the image protects a call (${store} store), non-root on a read-only root, and drains on stop`, async (t) => {
    const upstream = await startRefundServer(t);
    const port = await freePort();
    const adminPort = await freePort();
    const state = await tempDir(t, 'idemgw-image-state-');
    await fs.chown(state, 65532, 65532);
    const env = [`IDEMGW_UPSTREAM=${upstream.url}`, `IDEMGW_LISTEN=127.0.0.1:${port}`,
      `IDEMGW_ADMIN_LISTEN=127.0.0.1:${adminPort}`];
    if (store === 'postgres') env.push(`IDEMGW_DATABASE_URL=${(await startPgCluster(t)).url}`);
    const name = `idemgw-image-test-${process.pid}-${store}`;
    await podman('run', '-d', '--name', name, ...EXTRA, '--network', 'host', '--read-only',
      '-v', `${state}:/var/lib/idemgw`, ...env.flatMap((e) => ['-e', e]), IMAGE);
    t.after(async () => {
      if (process.env.IDEMGW_IMAGE_LOGS) console.log((await run('podman', ['logs', name])).stdout);
      await run('podman', ['rm', '-f', name]);
    });

    const admin = `http://127.0.0.1:${adminPort}`;
    await waitFor(async () => (await fetch(`${admin}/readyz`).catch(() => null))?.status === 200 || null,
      { timeoutMs: 30000, what: 'the container to be ready' });
    assert.equal((await fetch(`${admin}/healthz`)).status, 200);
    assert.equal(await podman('inspect', '--format', '{{.Config.User}}', name), '65532:65532');
    const health = await run('podman', ['healthcheck', 'run', name]);
    assert.equal(health.code, 0, `HEALTHCHECK: ${health.stdout} ${health.stderr}`);

    const client = await mcpClient(t, `http://127.0.0.1:${port}/mcp`);
    const args = { order_id: `ord-image-${store}`, amount_cents: 9 };
    const first = await client.callTool({ name: 'issue_refund', arguments: args });
    assert.match(toolText(first), /^Refunded 9 cents/);
    const again = await client.callTool({ name: 'issue_refund', arguments: args });
    assert.ok(replayMarker(again), 'the repeat is replayed');
    assert.equal((await readLedger(upstream.ledger)).length, 1);
    if (store === 'embedded') assert.ok((await fs.readdir(state)).length > 0, 'the keys are in the volume');

    // A call in flight when the container is stopped finishes; the gateway exits 0.
    const slow = client.request({ method: 'tools/call', params: { name: 'slow_refund', arguments: { order_id: 'ord-drain', amount_cents: 1, delay_ms: 1500 } } },
      CallToolResultSchema, { timeout: 30000 });
    await waitForLedger(upstream.ledger, 2);
    const stopped = podman('stop', '-t', '20', name);
    assert.match(toolText(await slow), /^Refunded 1 cents/, 'the in-flight call got its answer');
    await stopped;
    assert.equal(await podman('inspect', '--format', '{{.State.ExitCode}}', name), '0', 'drained and exited 0');
    await client.close().catch(() => {});
  });
}
