// An agent that cancels a protected call in flight (notifications/cancelled, as SDK clients do
// when their own timeout fires).
// on_cancel: finish (the default): the cancel stays at the gateway (202, not forwarded), the
// call runs to its end and is recorded, and the caller's retry gets the one execution's result.
// on_cancel: forward: the server has run the tool and, per the protocol, sends no answer. The
// gateway ends the call once the cancel is relayed and records it as cancelled; a duplicate
// hears that the first call was cancelled and may have run, not "wait". A call cancelled
// before it went up is never sent and its key is released.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { Client as ClientV2, StreamableHTTPClientTransport as TransportV2 } from '@modelcontextprotocol/client';
import {
  createDatabase, idemStatus, mcpClient, postgresOnly, rawSession, readLedger, replayMarker, startGateway,
  startRefundServer, toolText, waitFor, waitForLedger, waitForLog,
} from './lib/harness.mjs';

const FORWARD = { get_ledger: { class: 'read' }, slow_refund: { on_cancel: 'forward' } };
// the retry is held while the first call runs, then replayed
const FINISH = { get_ledger: { class: 'read' }, slow_refund: { in_progress: { wait: '30s' } } };

const cancelNote = (gwUrl, sessionId, requestId, headers = {}) => fetch(gwUrl, {
  method: 'POST',
  headers: {
    'Content-Type': 'application/json', Accept: 'application/json, text/event-stream', 'MCP-Protocol-Version': '2025-11-25',
    ...(sessionId ? { 'Mcp-Session-Id': sessionId } : {}), ...headers,
  },
  body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId, reason: 'client timeout' } }),
});

async function v2Client(t, url) {
  const client = new ClientV2({ name: 'idemgw-test-v2', version: '1.0.0' }, { capabilities: {} });
  await client.connect(new TransportV2(new URL(url)));
  t.after(() => client.close().catch(() => {}));
  return client;
}

// Both SDK generations time out a slow protected call, cancel it, and retry it at once.
const clients = [
  { name: '@modelcontextprotocol/sdk 1.32.2', connect: (t, url) => mcpClient(t, url), call: (c, params, timeout) => c.callTool(params, undefined, timeout ? { timeout } : undefined) },
  { name: '@modelcontextprotocol/client 2.4.0', connect: v2Client, call: (c, params, timeout) => c.callTool(params, timeout ? { timeout } : undefined) },
];

for (const sdk of clients) {
  test(`on_cancel finish: ${sdk.name} times out, cancels and retries; the retry gets the one execution's result`, { timeout: 60000 }, async (t) => {
    const upstream = await startRefundServer(t);
    const gw = await startGateway(t, {
      upstream: upstream.url,
      databaseUrl: await createDatabase(),
      config: { subject: { static: 'edge' }, tools: FINISH },
    });
    const client = await sdk.connect(t, gw.url);
    const params = { name: 'slow_refund', arguments: { order_id: 'ord-timeout', amount_cents: 42, delay_ms: 1500 } };
    await assert.rejects(sdk.call(client, params, 300), /timed out|timeout/i);
    await waitForLog(gw, /"rpc_method":"notifications\/cancelled".*"outcome":"cancel_kept"/);

    const retry = await sdk.call(client, params);
    assert.equal(retry.isError, undefined, JSON.stringify(retry));
    assert.match(toolText(retry), /ord-timeout/);
    assert.ok(replayMarker(retry), 'the retry is the first call\'s result, replayed');
    await waitForLog(gw, /recorded as succeeded/);
    assert.match(gw.logs(), /"cancel":"kept"/);
    assert.doesNotMatch(gw.logs(), /cancelled by its caller/);
    assert.equal((await readLedger(upstream.ledger)).length, 1, 'executed once');
  });
}

test('on_cancel finish: a raw cancel is answered 202 and not forwarded; the call is answered and stored', { timeout: 30000 }, async (t) => {
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { subject: { static: 'edge' }, tools: FINISH },
  });
  const s = await rawSession(t, gw.url);
  const args = { order_id: 'ord-raw-finish', amount_cents: 5, delay_ms: 1500 };
  const first = s.call('slow_refund', args, { id: 'call-1' });
  await waitForLedger(upstream.ledger, 1);
  const cancel = await cancelNote(gw.url, s.sessionId, 'call-1');
  assert.equal(cancel.status, 202);
  assert.equal(await cancel.text(), '');
  // the server never saw the cancel, so it answers the call
  const answered = await first;
  assert.match(toolText(answered.message?.result), /ord-raw-finish/, answered.body);
  const retry = await s.call('slow_refund', args);
  assert.ok(replayMarker(retry.message?.result), retry.body);
  assert.equal((await readLedger(upstream.ledger)).length, 1);
});

test('on_cancel forward: a duplicate waiting for the first call is cancelled: it is never sent', { timeout: 30000 }, async (t) => {
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { subject: { static: 'edge' }, log: { level: 'debug' }, tools: { slow_refund: { on_cancel: 'forward', in_progress: { wait: '30s' } } } },
  });
  const s = await rawSession(t, gw.url);
  const args = { order_id: 'ord-wait-cancel', amount_cents: 6, delay_ms: 3000 };
  const first = s.call('slow_refund', args, { id: 'first' });
  await waitForLedger(upstream.ledger, 1);
  const waiting = s.call('slow_refund', args, { id: 'waiter' });
  await waitForLog(gw, /an identical call runs; waiting for its outcome/);
  const cancel = await cancelNote(gw.url, s.sessionId, 'waiter');
  assert.equal(cancel.status, 202);
  await cancel.arrayBuffer();
  const dropped = await waiting;
  assert.equal(dropped.message?.error?.code, -32800, dropped.body);
  assert.match(dropped.message.error.message, /nothing was executed/);
  const answered = await first;
  assert.match(toolText(answered.message?.result), /ord-wait-cancel/, answered.body);
  assert.equal((await readLedger(upstream.ledger)).length, 1);
});

test('on_cancel forward: a call cancelled while its key is being claimed is not sent and its key is released', postgresOnly('holds the claim with a lock taken by psql'), async (t) => {
  const upstream = await startRefundServer(t);
  const databaseUrl = await createDatabase();
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl,
    config: { subject: { static: 'edge' }, tools: FORWARD },
  });
  const s = await rawSession(t, gw.url);
  const locker = spawn('psql', [databaseUrl, '-qAt', '-v', 'ON_ERROR_STOP=1'], { stdio: ['pipe', 'pipe', 'inherit'] });
  t.after(() => locker.kill());
  let out = '';
  locker.stdout.setEncoding('utf8').on('data', (d) => { out += d; });
  locker.stdin.write("BEGIN; LOCK TABLE idem_keys IN ACCESS EXCLUSIVE MODE; SELECT 'locked';\n");
  await waitFor(() => out.includes('locked'), { what: 'the table lock' });

  const args = { order_id: 'ord-claiming', amount_cents: 7, delay_ms: 0 };
  const call = s.call('slow_refund', args, { id: 'claiming' });
  // the claim waits for the lock: the call is claiming, nothing went up
  const blocked = () => new Promise((resolve) => {
    const q = spawn('psql', [databaseUrl, '-qAt', '-c', "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"]);
    let n = '';
    q.stdout.on('data', (d) => { n += d; });
    q.on('close', () => resolve(Number(n.trim()) > 0));
  });
  await waitFor(blocked, { what: 'the claim waiting for the lock' });
  const cancel = await cancelNote(gw.url, s.sessionId, 'claiming');
  assert.equal(cancel.status, 202);
  await cancel.arrayBuffer();
  await waitForLog(gw, /"outcome":"cancel_dropped"/);
  locker.stdin.end('COMMIT;\n');

  const dropped = await call;
  assert.equal(dropped.message?.error?.code, -32800, dropped.body);
  await waitForLog(gw, /cancelled by its caller before it was sent; released/);
  assert.equal((await readLedger(upstream.ledger)).length, 0, 'never sent');
  // released: the next identical call runs
  const again = await s.call('slow_refund', args);
  assert.match(toolText(again.message?.result), /ord-claiming/, again.body);
  assert.equal(replayMarker(again.message?.result), undefined);
  assert.equal((await readLedger(upstream.ledger)).length, 1);
});

test('on_cancel forward: a protected call cancelled by its caller is recorded as cancelled; a duplicate is told so', { timeout: 30000 }, async (t) => {
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { subject: { static: 'edge' }, tools: FORWARD },
  });
  const s = await rawSession(t, gw.url);
  // the refund fixture records the payout at once and would answer a minute later; cancelled,
  // the SDK server never answers
  const args = { order_id: 'ord-cancel', amount_cents: 9, delay_ms: 60000 };
  const first = s.call('slow_refund', args, { id: 'call-1' });
  await waitForLedger(upstream.ledger, 1);

  const other = await fetch(gw.url, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream', 'Mcp-Session-Id': s.sessionId, 'MCP-Protocol-Version': '2025-11-25' },
    body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 'call-2', reason: 'not this one' } }),
  });
  assert.equal(other.status, 202);
  const cancel = await fetch(gw.url, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream', 'Mcp-Session-Id': s.sessionId, 'MCP-Protocol-Version': '2025-11-25' },
    body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 'call-1', reason: 'client timeout' } }),
  });
  assert.equal(cancel.status, 202);
  await cancel.arrayBuffer();

  const ended = await first;
  assert.equal(ended.message, null, 'no answer for a cancelled call');
  await waitForLog(gw, /recorded as unknown \(cancelled by its caller\)/);
  assert.match(gw.logs(), /"rpc_id":"call-1",.*"outcome":"cancelled"/);

  const retry = await s.call('slow_refund', args);
  const st = idemStatus(retry.message?.result);
  assert.equal(st?.code, 'cancelled', retry.body);
  assert.equal(st.executed, 'unknown');
  assert.match(retry.message.result.content[0].text, /cancelled by its caller/);
  assert.doesNotMatch(retry.message.result.content[0].text, /Wait for the first call/);
  assert.equal((await readLedger(upstream.ledger)).length, 1, 'not executed again');
});

test('a cancel from another caller does not end a protected call, nor reach the server', { timeout: 30000 }, async (t) => {
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { subject: { header: 'X-Subject' }, tools: FORWARD },
  });
  const s = await rawSession(t, gw.url, { headers: { 'X-Subject': 'alice' } });
  const first = s.call('slow_refund', { order_id: 'ord-foreign', amount_cents: 3, delay_ms: 60000 }, { id: 'call-a' });
  await waitForLedger(upstream.ledger, 1);
  const cancel = (subject) => fetch(gw.url, {
    method: 'POST',
    headers: {
      'Content-Type': 'application/json', Accept: 'application/json, text/event-stream', 'X-Subject': subject,
      'Mcp-Session-Id': s.sessionId, 'MCP-Protocol-Version': '2025-11-25',
    },
    body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 'call-a' } }),
  });
  const foreign = await cancel('mallory');
  await foreign.arrayBuffer();
  assert.equal(foreign.status, 202);
  await waitForLog(gw, /"rpc_method":"notifications\/cancelled".*"outcome":"cancel_ignored"/);
  assert.match(gw.logs(), /comes from another caller: not passed on/);
  assert.doesNotMatch(gw.logs(), /cancelled the call/, 'another caller cannot mark the call cancelled');

  const own = await cancel('alice');
  await own.arrayBuffer();
  await first;
  await waitForLog(gw, /recorded as unknown \(cancelled by its caller\)/);
});
