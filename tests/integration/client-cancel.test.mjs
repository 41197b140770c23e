// An agent that cancels a protected call in flight (notifications/cancelled, as SDK clients do
// when their own timeout fires): the server has run the tool and, per the protocol, sends no
// answer. The gateway ends the call once the cancel is relayed and records it as cancelled;
// a duplicate hears that the first call was cancelled and may have run, not "wait".
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  createDatabase, idemStatus, rawSession, readLedger, startGateway, startRefundServer, waitForLedger, waitForLog,
} from './lib/harness.mjs';

test('a protected call cancelled by its caller is recorded as cancelled; a duplicate is told so', { timeout: 30000 }, async (t) => {
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { subject: { static: 'edge' }, tools: { get_ledger: { class: 'read' } } },
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

test('a cancel from another caller does not end a protected call as cancelled', { timeout: 30000 }, async (t) => {
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { subject: { header: 'X-Subject' }, tools: { get_ledger: { class: 'read' } } },
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
  await waitForLog(gw, /"rpc_method":"notifications\/cancelled"/);
  assert.doesNotMatch(gw.logs(), /cancelled the call/, 'another caller cannot mark the call cancelled');

  const own = await cancel('alice');
  await own.arrayBuffer();
  await first;
  await waitForLog(gw, /recorded as unknown \(cancelled by its caller\)/);
});
