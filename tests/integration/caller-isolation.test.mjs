// Callers sharing one gateway and one HTTP upstream never reach each other's calls
// (tests/fixtures/bad-upstream.mjs), without sessions (2026-07-28), where a JSON-RPC id says
// nothing of whose request it is: another caller's notifications/cancelled never reaches the
// upstream naming your call, and a surplus answer the upstream leaves on a kept-alive
// connection never becomes another caller's answer, read or protected call alike.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { NODE, TESTS, createDatabase, startGateway, startProcess, toolText, waitFor } from './lib/harness.mjs';

const VERSION = '2026-07-28';
const META_VERSION = 'io.modelcontextprotocol/protocolVersion';

async function startBadUpstream(t, mode) {
  const h = await startProcess(t, NODE, [path.join(TESTS, 'fixtures/bad-upstream.mjs'), '0', mode], {
    readyLine: /listening on port (\d+)/,
    name: `bad-upstream(${mode})`,
  });
  const base = `http://127.0.0.1:${Number(h.match[1])}`;
  const count = async () => (await fetch(`${base}/count`)).json();
  const release = async () => (await fetch(`${base}/release`)).json();
  return { ...h, url: `${base}/mcp`, count, release };
}

async function setup(t, mode) {
  const upstream = await startBadUpstream(t, mode);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: {
      subject: { header: 'X-Subject' },
      tools: { lookup: { class: 'read' }, charge: { class: 'non_idempotent' } },
    },
  });
  return { upstream, gw };
}

/** One sessionless 2026-07-28 POST by a caller, as client 2.4.0 sends it: status and message. */
async function post(gw, subject, message) {
  const modern = { ...message };
  const name = message.params?.name;
  if (message.id !== undefined) {
    modern.params = { ...message.params, _meta: { [META_VERSION]: VERSION } };
  }
  const res = await fetch(gw.url, {
    method: 'POST',
    headers: {
      Accept: 'application/json, text/event-stream', 'Content-Type': 'application/json', 'MCP-Protocol-Version': VERSION,
      'Mcp-Method': message.method, ...(name !== undefined ? { 'Mcp-Name': name } : {}), 'X-Subject': subject,
    },
    body: JSON.stringify(modern),
  });
  const body = await res.text();
  let parsed = null;
  try {
    parsed = JSON.parse(body);
  } catch {
    const data = body.match(/^data: ?(.*)$/gm)?.map((l) => l.replace(/^data: ?/, '')).pop();
    parsed = data ? JSON.parse(data) : null;
  }
  return { status: res.status, body, message: parsed };
}

const call = (gw, subject, tool, args, id) => post(gw, subject, { jsonrpc: '2.0', id, method: 'tools/call', params: { name: tool, arguments: args } });
const cancel = (gw, subject, requestId) => post(gw, subject, { jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId } });
const ranText = (tool, args) => `${tool}:${JSON.stringify(args)}`;

test('another caller\'s cancel of the same id never reaches the upstream; a caller\'s own cancel names its call', async (t) => {
  const { upstream, gw } = await setup(t, 'held');
  const order = { order: 'alice-1' };
  // Alice's protected call, id 1, runs at the upstream (held there until released)
  const alice = call(gw, 'alice', 'charge', order, 1);
  await waitFor(async () => (await upstream.count()).callIds.length === 1, { what: 'the call at the upstream' });

  // Mallory names the same id: a gateway that forwards it answers with the upstream's 202 only
  // once the upstream has it, so the count below already includes it if it went up
  const mallory = await cancel(gw, 'mallory', 1);
  assert.equal(mallory.status, 202);
  assert.deepEqual((await upstream.count()).cancels, [], 'another caller\'s cancel reached the upstream');

  // a read of Alice's goes up with an id of the gateway's own too: her cancel of it names that
  // id, and Mallory's of the same id reaches nothing
  const read = call(gw, 'alice', 'lookup', { who: 'alice' }, 2);
  await waitFor(async () => (await upstream.count()).callIds.length === 2, { what: 'the read at the upstream' });
  const sentAs = (await upstream.count()).callIds[1];
  assert.match(String(sentAs), /^idemgw-/);
  assert.equal((await cancel(gw, 'mallory', 2)).status, 202);
  assert.deepEqual((await upstream.count()).cancels, []);
  assert.equal((await cancel(gw, 'alice', 2)).status, 202);
  assert.deepEqual((await upstream.count()).cancels, [sentAs]);

  await upstream.release();
  const r = await alice;
  assert.equal(r.status, 200, r.body);
  assert.equal(r.message?.id, 1, r.body);
  assert.equal(toolText(r.message?.result), ranText('charge', order), r.body);
  const rr = await read;
  assert.equal(rr.message?.id, 2, rr.body);
  assert.equal((await upstream.count()).executions.charge, 1);
});

/** Whether a read's answer is its own: its id, and its own text or an error. */
function judge(r, args, id, tally) {
  assert.notEqual(r.message, null, `an answer that is not JSON-RPC: ${r.status} ${r.body}`);
  if (r.message.id !== id) {
    tally.wrong.push(r.body);
    return;
  }
  if (r.message.error) {
    tally.errors++;
    return;
  }
  if (toolText(r.message.result) === ranText('lookup', args)) tally.own++;
  else tally.wrong.push(r.body);
}

test('a surplus answer left on a kept-alive upstream connection never reaches another caller\'s read', async (t) => {
  const { gw } = await setup(t, 'stray');
  const callers = ['alice', 'bob'];
  const concurrent = { own: 0, errors: 0, wrong: [] };
  // concurrent: both callers number their reads alike, as separate clients do
  const LANES = 6;
  const ROUNDS = 8;
  await Promise.all(callers.flatMap((who) => Array.from({ length: LANES }, async (_, lane) => {
    for (let i = 0; i < ROUNDS; i++) {
      const args = { who, lane, i };
      const id = lane * 100 + i;
      judge(await call(gw, who, 'lookup', args, id), args, id, concurrent);
    }
  })));
  // sequential: each read is sent the moment the other caller's is answered, onto the
  // connection that answer came on, where the surplus follows it
  const sequential = { own: 0, errors: 0, wrong: [] };
  for (let i = 0; i < 40; i++) {
    const who = callers[i % 2];
    const args = { who, i };
    judge(await call(gw, who, 'lookup', args, 1), args, 1, sequential);
  }
  t.diagnostic(`concurrent: ${concurrent.own} own, ${concurrent.errors} errors, ${concurrent.wrong.length} wrong; `
    + `sequential: ${sequential.own} own, ${sequential.errors} errors, ${sequential.wrong.length} wrong`);
  assert.deepEqual(concurrent.wrong, [], 'a concurrent read got an answer that was not its own');
  assert.deepEqual(sequential.wrong, [], 'a sequential read got an answer that was not its own');
  assert.ok(concurrent.own > 0 && sequential.own > 0, 'reads get their own answers');
});
