// Protected (non_idempotent) tool calls through the gateway against a real Postgres: a
// repeat is replayed from the store, not executed. Every case counts the upstream's real
// executions in the refund fixture's ledger as well as checking what the agent was told.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import {
  createDatabase, findResponse, idemStatus, idemgwKey, mcpClient, rawSession, readLedger, replayMarker, startEverything,
  startGateway, startRefundServer, toolText, waitFor,
} from './lib/harness.mjs';

const REFUND = /^Refunded (\d+) cents on order (\S+) \(refund r-(\d+)\)$/;

async function setup(t, { config = {}, jsonResponse = false } = {}) {
  const upstream = await startRefundServer(t, { jsonResponse });
  const databaseUrl = await createDatabase();
  const cfg = { subject: { static: 'tenant-a' }, tools: { get_ledger: { class: 'read' } }, ...config };
  for (const k of Object.keys(cfg)) if (cfg[k] === undefined) delete cfg[k];
  const gw = await startGateway(t, { upstream: upstream.url, databaseUrl, config: cfg });
  return { upstream, gw, databaseUrl };
}

for (const mode of ['sse', 'json']) {
  test(`replay after success (${mode} responses): stored result, marker, new id, executed once`, async (t) => {
    const { upstream, gw } = await setup(t, { jsonResponse: mode === 'json' });
    const client = await mcpClient(t, gw.url);
    const args = { order_id: 'ord-1001', amount_cents: 2500 };

    const first = await client.callTool({ name: 'issue_refund', arguments: args });
    assert.notEqual(first.isError, true);
    assert.match(toolText(first), REFUND);
    assert.equal(replayMarker(first), undefined, 'the first execution carries no replay marker');
    assert.equal((await readLedger(upstream.ledger)).length, 1);

    const second = await client.callTool({ name: 'issue_refund', arguments: args });
    assert.notEqual(second.isError, true, 'a replay is never an error');
    assert.equal(toolText(second), toolText(first), 'the stored result, verbatim');
    const marker = replayMarker(second);
    assert.ok(marker, `replay marker present: ${JSON.stringify(second)}`);
    assert.equal(marker.replayed, true);
    assert.equal(marker.attempts, 2);
    assert.ok(!Number.isNaN(Date.parse(marker.first_seen)), `first_seen is a time: ${marker.first_seen}`);
    assert.match(marker.key_hash, /^[0-9a-f]{64}$/);

    // Raw requests: the replay answers the new request's own id, with the header.
    const raw = await rawSession(t, gw.url);
    for (const id of [4242, 'retry-after-timeout']) {
      const r = await raw.call('issue_refund', args, { id });
      assert.equal(r.status, 200);
      assert.equal(r.headers.get('idempotent-replayed'), 'true');
      assert.equal(r.message?.id, id, `the replay answers id ${JSON.stringify(id)}: ${r.body}`);
      assert.equal(toolText(r.message.result), toolText(first));
      assert.ok(replayMarker(r.message.result).attempts >= 3);
    }
    const ledger = await readLedger(upstream.ledger);
    assert.equal(ledger.length, 1, 'the upstream executed the refund exactly once');
    assert.deepEqual([ledger[0].tool, ledger[0].order_id, ledger[0].amount_cents], ['issue_refund', 'ord-1001', 2500]);

    // A different call is not a repeat.
    const other = await client.callTool({ name: 'issue_refund', arguments: { ...args, amount_cents: 2501 } });
    assert.equal(replayMarker(other), undefined);
    assert.equal((await readLedger(upstream.ledger)).length, 2);

    // Read-class tools are forwarded untouched every time.
    await client.callTool({ name: 'get_ledger', arguments: {} });
    const again = await client.callTool({ name: 'get_ledger', arguments: {} });
    assert.equal(replayMarker(again), undefined, 'a read tool is never replayed');
  });
}

test('different subjects do not share results', async (t) => {
  const { upstream, gw } = await setup(t, { config: { subject: { header: 'X-Subject' } } });
  const alice = await rawSession(t, gw.url, { headers: { 'X-Subject': 'alice' } });
  const bob = await rawSession(t, gw.url, { headers: { 'X-Subject': 'bob' } });
  const args = { order_id: 'ord-shared', amount_cents: 990 };

  const a1 = await alice.call('issue_refund', args);
  const b1 = await bob.call('issue_refund', args);
  assert.equal(replayMarker(a1.message.result), undefined);
  assert.equal(replayMarker(b1.message.result), undefined, 'bob is not given alice\'s result');
  assert.notEqual(toolText(b1.message.result), toolText(a1.message.result), 'two refunds, two refund ids');
  assert.equal((await readLedger(upstream.ledger)).length, 2);

  const a2 = await alice.call('issue_refund', args);
  const b2 = await bob.call('issue_refund', args);
  assert.equal(toolText(a2.message.result), toolText(a1.message.result));
  assert.equal(toolText(b2.message.result), toolText(b1.message.result));
  assert.ok(replayMarker(a2.message.result) && replayMarker(b2.message.result));
  assert.notEqual(replayMarker(a2.message.result).key_hash, replayMarker(b2.message.result).key_hash);

  // The subject header may arrive per request too, on the same session.
  const a3 = await bob.call('issue_refund', args, { headers: { 'X-Subject': 'alice' } });
  assert.equal(toolText(a3.message.result), toolText(a1.message.result), 'the subject, not the session, decides');
  assert.equal((await readLedger(upstream.ledger)).length, 2, 'each subject executed once');
});

test('no subject: protected calls are refused and nothing is executed', async (t) => {
  await t.test('subject header missing from the request', async (t) => {
    const { upstream, gw } = await setup(t, { config: { subject: { header: 'X-Subject' } } });
    const s = await rawSession(t, gw.url);
    for (let i = 0; i < 2; i++) {
      const r = await s.call('issue_refund', { order_id: 'ord-anon', amount_cents: 1 });
      assert.equal(r.status, 200);
      assert.equal(r.message.result.isError, true);
      assert.equal(idemStatus(r.message.result)?.code, 'no_subject');
      assert.equal(idemStatus(r.message.result)?.executed, false);
      assert.match(toolText(r.message.result), /Nothing was executed/);
      assert.match(toolText(r.message.result), /identity header/);
    }
    // An empty header is no identity either.
    const e = await s.call('issue_refund', { order_id: 'ord-anon', amount_cents: 1 }, { headers: { 'X-Subject': '' } });
    assert.equal(idemStatus(e.message.result)?.code, 'no_subject');
    // A read tool needs no subject.
    const read = await s.call('get_ledger', {});
    assert.notEqual(read.message.result.isError, true);
    assert.deepEqual(await readLedger(upstream.ledger), [], 'nothing reached the upstream');
  });
  await t.test('no subject source configured: the bearer token\'s hash, else one shared subject', async (t) => {
    const { upstream, gw } = await setup(t, { config: { subject: undefined } });
    assert.match(gw.logs(), /subject not configured/, 'said at start');
    const args = { order_id: 'ord-anon', amount_cents: 1 };
    const anon = await mcpClient(t, gw.url);
    assert.match(toolText(await anon.callTool({ name: 'issue_refund', arguments: args })), REFUND);
    const other = await mcpClient(t, gw.url); // another caller without a token: the same subject
    assert.ok(replayMarker(await other.callTool({ name: 'issue_refund', arguments: args })));
    const alice = await mcpClient(t, gw.url, { headers: { Authorization: 'Bearer alice-token' } });
    const a1 = await alice.callTool({ name: 'issue_refund', arguments: args });
    assert.equal(replayMarker(a1), undefined, 'a bearer token is another caller');
    assert.ok(replayMarker(await alice.callTool({ name: 'issue_refund', arguments: args })));
    assert.equal((await readLedger(upstream.ledger)).length, 2);
  });
});

test('explicit key in the argument: replays, and other arguments under the same key are refused', async (t) => {
  const { upstream, gw } = await setup(t);
  const client = await mcpClient(t, gw.url);
  const args = { order_id: 'ord-2001', amount_cents: 700, idempotency_key: 'refund-2001-a' };

  const first = await client.callTool({ name: 'issue_refund', arguments: args });
  assert.match(toolText(first), REFUND);
  const again = await client.callTool({ name: 'issue_refund', arguments: args });
  assert.equal(toolText(again), toolText(first));
  assert.ok(replayMarker(again));
  assert.equal((await readLedger(upstream.ledger)).length, 1);

  const reused = await client.callTool({ name: 'issue_refund', arguments: { ...args, amount_cents: 701 } });
  assert.equal(reused.isError, true);
  assert.equal(idemStatus(reused)?.code, 'key_reused');
  assert.equal(idemStatus(reused)?.executed, false);
  assert.match(toolText(reused), /different arguments/);
  assert.match(toolText(reused), /Nothing was executed/);
  assert.equal((await readLedger(upstream.ledger)).length, 1, 'the refused call did not run');

  // The same arguments under a new key are a new call.
  const fresh = await client.callTool({ name: 'issue_refund', arguments: { ...args, idempotency_key: 'refund-2001-b' } });
  assert.equal(replayMarker(fresh), undefined);
  assert.notEqual(toolText(fresh), toolText(first));
  const ledger = await readLedger(upstream.ledger);
  assert.equal(ledger.length, 2);
  assert.deepEqual(ledger.map((e) => e.idempotency_key), ['refund-2001-a', 'refund-2001-b'],
    'the key argument is still passed to the upstream');
});

test('explicit key in the Idempotency-Key header', async (t) => {
  const { upstream, gw } = await setup(t);
  const s = await rawSession(t, gw.url);
  const args = { order_id: 'ord-3001', amount_cents: 1200 };
  const key = { 'Idempotency-Key': 'hdr-3001' };

  const first = await s.call('issue_refund', args, { headers: key });
  assert.match(toolText(first.message.result), REFUND);
  const again = await s.call('issue_refund', args, { headers: key });
  assert.equal(again.headers.get('idempotent-replayed'), 'true');
  assert.equal(toolText(again.message.result), toolText(first.message.result));

  const reused = await s.call('issue_refund', { ...args, order_id: 'ord-3002' }, { headers: key });
  assert.equal(reused.message.result.isError, true);
  assert.equal(idemStatus(reused.message.result)?.code, 'key_reused');
  assert.equal((await readLedger(upstream.ledger)).length, 1);

  // Without the header, the same arguments hash to a different key: a new call.
  const hashed = await s.call('issue_refund', args);
  assert.equal(replayMarker(hashed.message.result), undefined);
  assert.equal((await readLedger(upstream.ledger)).length, 2);
});

test('exclude_args: calls that differ only in excluded arguments are repeats', async (t) => {
  const { upstream, gw } = await setup(t, {
    config: { subject: { static: 'tenant-a' }, tools: { issue_refund: { class: 'non_idempotent', exclude_args: ['note'] } } },
  });
  const client = await mcpClient(t, gw.url);
  const base = { order_id: 'ord-4001', amount_cents: 300 };

  const first = await client.callTool({ name: 'issue_refund', arguments: { ...base, note: 'customer called at 10:02' } });
  const second = await client.callTool({ name: 'issue_refund', arguments: { ...base, note: 'retry, customer called at 10:03' } });
  const third = await client.callTool({ name: 'issue_refund', arguments: base });
  assert.ok(replayMarker(second) && replayMarker(third), 'note is left out of the key');
  assert.equal(toolText(second), toolText(first));
  assert.equal(toolText(third), toolText(first));
  assert.equal((await readLedger(upstream.ledger)).length, 1);

  const other = await client.callTool({ name: 'issue_refund', arguments: { ...base, amount_cents: 301, note: 'customer called at 10:02' } });
  assert.equal(replayMarker(other), undefined, 'amount_cents is still part of the key');
  const ledger = await readLedger(upstream.ledger);
  assert.equal(ledger.length, 2);
  assert.equal(ledger[0].note, 'customer called at 10:02', 'the excluded argument still reaches the upstream');
});

test('window expiry: after the window an identical call runs again', async (t) => {
  const { upstream, gw } = await setup(t, {
    config: { subject: { static: 'tenant-a' }, tools: { issue_refund: { class: 'non_idempotent', window: '1s' } } },
  });
  const client = await mcpClient(t, gw.url);
  const args = { order_id: 'ord-5001', amount_cents: 50 };
  const t0 = Date.now();
  const first = await client.callTool({ name: 'issue_refund', arguments: args });
  const firstDone = Date.now();
  assert.equal(replayMarker(first), undefined);

  // Repeat until a call is executed instead of replayed; every repeat before that is a replay.
  let replays = 0;
  const fresh = await waitFor(async () => {
    const r = await client.callTool({ name: 'issue_refund', arguments: args });
    if (replayMarker(r)) {
      replays++;
      assert.equal(toolText(r), toolText(first));
      return null;
    }
    return r;
  }, { timeoutMs: 15000, intervalMs: 100, what: 'the window to end' });
  const elapsed = Date.now() - t0;
  assert.ok(elapsed >= 1000, `ran again ${elapsed} ms after the first call began, inside its 1 s window`);
  assert.ok(replays >= 1 || firstDone - t0 >= 1000, 'at least one repeat inside the window was replayed');
  assert.match(toolText(fresh), REFUND);
  assert.notEqual(toolText(fresh), toolText(first), 'a new refund');
  assert.equal((await readLedger(upstream.ledger)).length, 2);
});

test('on_tool_error: release lets a retry run, store replays the error', async (t) => {
  await t.test('release (default)', async (t) => {
    const { upstream, gw } = await setup(t);
    const client = await mcpClient(t, gw.url);
    const args = { order_id: 'ord-6001', amount_cents: 10 };
    const a = await client.callTool({ name: 'failing_refund', arguments: args });
    const b = await client.callTool({ name: 'failing_refund', arguments: args });
    assert.equal(a.isError, true);
    assert.equal(b.isError, true);
    assert.match(toolText(a), /declined by the bank \(attempt r-1\)/);
    assert.match(toolText(b), /declined by the bank \(attempt r-2\)/, 'the retry really ran');
    assert.equal(replayMarker(b), undefined);
    assert.equal((await readLedger(upstream.ledger)).length, 2);
  });
  await t.test('store', async (t) => {
    const { upstream, gw } = await setup(t, {
      config: { subject: { static: 'tenant-a' }, tools: { failing_refund: { class: 'non_idempotent', on_tool_error: 'store' } } },
    });
    const client = await mcpClient(t, gw.url);
    const args = { order_id: 'ord-6002', amount_cents: 10 };
    const a = await client.callTool({ name: 'failing_refund', arguments: args });
    const b = await client.callTool({ name: 'failing_refund', arguments: args });
    assert.equal(a.isError, true);
    assert.equal(b.isError, true, 'the stored error is replayed as it was');
    assert.equal(toolText(b), toolText(a));
    assert.ok(replayMarker(b), 'the replay is marked');
    assert.equal((await readLedger(upstream.ledger)).length, 1);
  });
});

test('server-everything: toggle-simulated-logging as non_idempotent toggles once', async (t) => {
  const upstream = await startEverything(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: {
      subject: { static: 'tenant-a' },
      defaults: { class: 'read' },
      tools: { 'toggle-simulated-logging': { class: 'non_idempotent' } },
    },
  });
  const client = await mcpClient(t, gw.url);
  const first = await client.callTool({ name: 'toggle-simulated-logging', arguments: {} });
  const second = await client.callTool({ name: 'toggle-simulated-logging', arguments: {} });
  assert.match(toolText(first), /^Started simulated/);
  assert.match(toolText(second), /^Started simulated/, 'a second execution would have answered "Stopped…"');
  assert.equal(toolText(second), toolText(first));
  assert.equal(replayMarker(first), undefined);
  assert.ok(replayMarker(second), 'the second answer is a replay');
  // Ask the upstream itself, on the same session, bypassing the gateway: the toggle state is
  // on after one execution, so a direct call stops it (after two it would start it again).
  const sessionId = client.transport.sessionId;
  assert.ok(sessionId, 'the upstream gave the client a session');
  const direct = await fetch(upstream.url, {
    method: 'POST',
    headers: {
      Accept: 'application/json, text/event-stream', 'Content-Type': 'application/json',
      'Mcp-Session-Id': sessionId, 'MCP-Protocol-Version': client.transport.protocolVersion ?? '2025-11-25',
    },
    body: JSON.stringify({ jsonrpc: '2.0', id: 'direct', method: 'tools/call', params: { name: 'toggle-simulated-logging', arguments: {} } }),
  });
  const msg = findResponse(direct.headers.get('content-type'), await direct.text(), 'direct');
  assert.match(toolText(msg?.result), /^Stopped simulated logging/, `direct call: ${JSON.stringify(msg)}`);
  const metrics = await (await fetch(`${gw.adminUrl}/metrics`)).text();
  assert.match(metrics, /^idemgw_executions_total 1$/m);
  assert.match(metrics, /^idemgw_replays_total 1$/m);
});

test('with the replay cache off (store.cache_entries: 0) repeats are replayed from Postgres', async (t) => {
  const { upstream, gw } = await setup(t, { config: { store: { cache_entries: 0 } } });
  const client = await mcpClient(t, gw.url);
  const args = { order_id: 'ord-nocache', amount_cents: 31 };
  const first = await client.callTool({ name: 'issue_refund', arguments: args });
  const marks = [];
  for (let i = 0; i < 3; i++) {
    const again = await client.callTool({ name: 'issue_refund', arguments: args });
    assert.equal(toolText(again), toolText(first));
    marks.push(replayMarker(again));
  }
  assert.deepEqual(marks.map((m) => m?.attempts), [2, 3, 4], 'each replay read the row and counted itself');
  assert.equal((await readLedger(upstream.ledger)).length, 1, 'executed once');
  const metrics = await (await fetch(`${gw.adminUrl}/metrics`)).text();
  assert.match(metrics, /^idemgw_replays_total 3$/m);
  assert.match(metrics, /^idemgw_cache_replays_total 0$/m);
});

test('idemgw key prints the key the gateway used; -c applies exclude_args; bad JSON exits 2', async (t) => {
  const { upstream, gw } = await setup(t, {
    config: {
      subject: { header: 'X-Subject' },
      tools: { issue_refund: { class: 'non_idempotent', exclude_args: ['note', 'meta.client_ts'] } },
    },
  });
  const s = await rawSession(t, gw.url, { headers: { 'X-Subject': 'ops@example.com' } });
  const args = { order_id: 'ord-7001', amount_cents: 12345, note: 'n1', meta: { client_ts: 1717171717, channel: 'web' } };
  await s.call('issue_refund', args);
  const replay = await s.call('issue_refund', args);
  const marker = replayMarker(replay.message.result);
  assert.ok(marker, `replayed: ${replay.body}`);
  assert.equal((await readLedger(upstream.ledger)).length, 1);

  const sha = (k) => createHash('sha256').update(k).digest('hex');
  const withConfig = await idemgwKey(['--subject', 'ops@example.com', '--tool', 'issue_refund', '--args', JSON.stringify(args), '-c', gw.configPath]);
  assert.equal(withConfig.code, 0, withConfig.stderr);
  assert.match(withConfig.stdout, /^ops@example\.com:issue_refund:h:[0-9a-f]{32}\n$/);
  const key = withConfig.stdout.slice(0, -1);
  assert.equal(sha(key), marker.key_hash, 'sha256 of the printed key is the key_hash of the replay marker');

  // The excluded paths do not change the key; anything else does.
  const reordered = { meta: { channel: 'web' }, amount_cents: 12345, order_id: 'ord-7001' };
  const same = await idemgwKey(['--subject', 'ops@example.com', '--tool', 'issue_refund', '--args', JSON.stringify(reordered), '-c', gw.configPath]);
  assert.equal(same.stdout, withConfig.stdout);
  // Without -c nothing is excluded: a different key.
  const noConfig = await idemgwKey(['--subject', 'ops@example.com', '--tool', 'issue_refund', '--args', JSON.stringify(args)]);
  assert.equal(noConfig.code, 0, noConfig.stderr);
  assert.notEqual(noConfig.stdout, withConfig.stdout);
  // An explicit key argument gives the x: form, as in the gateway.
  const explicit = await idemgwKey(['--subject', 'S', '--tool', 'issue_refund', '--args', JSON.stringify({ order_id: 'o', idempotency_key: 'abc-1' })]);
  assert.equal(explicit.stdout, 'S:issue_refund:x:abc-1\n');

  for (const bad of ['{"order_id":', '{order_id: 1}', '']) {
    const r = await idemgwKey(['--subject', 'S', '--tool', 'issue_refund', '--args', bad]);
    assert.equal(r.code, 2, `--args ${JSON.stringify(bad)} exits 2 (got ${r.code})`);
    assert.equal(r.stdout, '');
    assert.ok(r.stderr.trim().length > 0, 'with a message');
  }
});
