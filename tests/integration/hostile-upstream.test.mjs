// An upstream that misbehaves at the HTTP level (tests/fixtures/bad-upstream.mjs): whatever it
// does, a protected call never gets, stores or replays another call's answer, and an answer
// that did arrive whole is recorded as what it is, never as "unknown" for lack of reading it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import {
  NODE, TESTS, createDatabase, findResponse, idemStatus, rawSession, replayMarker, startGateway, startProcess,
  toolText, waitFor, waitForLog,
} from './lib/harness.mjs';

/** The misbehaving upstream in one mode. count() answers its per-tool execution counts. */
async function startBadUpstream(t, mode) {
  const h = await startProcess(t, NODE, [path.join(TESTS, 'fixtures/bad-upstream.mjs'), '0', mode], {
    readyLine: /listening on port (\d+)/,
    name: `bad-upstream(${mode})`,
  });
  const port = Number(h.match[1]);
  const count = async () => (await fetch(`http://127.0.0.1:${port}/count`)).json();
  return { ...h, port, url: `http://127.0.0.1:${port}/mcp`, count };
}

async function setup(t, mode, charge = {}) {
  const upstream = await startBadUpstream(t, mode);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: {
      subject: { header: 'X-Subject' },
      tools: { lookup: { class: 'read' }, charge: { class: 'non_idempotent', ...charge } },
    },
  });
  return { upstream, gw };
}

/** One tools/call by hand, for answers the SDK-like helpers would follow or parse: the Response. */
async function postCall(gw, name, args, { id = 'by-hand', subject = 'payer' } = {}) {
  const res = await fetch(gw.url, {
    method: 'POST',
    redirect: 'manual',
    headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream', 'X-Subject': subject },
    body: JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: args } }),
  });
  return { res, bytes: Buffer.from(await res.arrayBuffer()) };
}

// What the fixture answers for a tool that ran with these arguments.
const ranText = (tool, args) => `${tool}:${JSON.stringify(args)}`;

// Unprotected requests ride pooled upstream connections, so on this upstream a session's
// initialize may be answered by the stray that followed an earlier response (a 202, a stray
// 200): nothing stops that for reads, and this test is about protected calls. Opening a session
// is retried until its initialize gets its own answer.
async function straySession(t, url, subject) {
  for (let attempt = 1; ; attempt++) {
    try {
      return await rawSession(t, url, { headers: { 'X-Subject': subject } });
    } catch (e) {
      if (attempt >= 5 || !/^initialize: HTTP /.test(e.message)) throw e;
    }
  }
}

test('a stray second response on a pooled connection never reaches a protected call', async (t) => {
  const { upstream, gw } = await setup(t, 'stray');
  const reader = await straySession(t, gw.url, 'reader');
  const payer = await straySession(t, gw.url, 'payer');
  const LANES = 8;
  const ROUNDS = 15;
  // Both callers use the same JSON-RPC ids, as separate SDK clients do: the id cannot tell
  // their answers apart, only reading each response on the connection it was asked on can.
  let reading = true;
  const readLanes = Array.from({ length: LANES }, async (_, lane) => {
    for (let i = 0; reading; i++) {
      await reader.call('lookup', { who: 'reader', lane, i }, { id: `${lane}-${i % ROUNDS}` });
    }
  });
  const firsts = [];
  const payLanes = Array.from({ length: LANES }, async (_, lane) => {
    for (let i = 0; i < ROUNDS; i++) {
      const args = { who: 'payer', lane, i };
      firsts.push({ args, r: await payer.call('charge', args, { id: `${lane}-${i}` }) });
    }
  });
  await Promise.all(payLanes);
  reading = false;
  await Promise.all(readLanes);

  // A protected call rides kept-alive connections too: a stray that arrives on one after the
  // call was sent there is read as the call's answer, found to carry another id, and the call
  // is recorded unknown (it was sent, it may have run). Never another call's answer.
  const foreign = (body) => body.includes('reader') || body.includes('STRAY');
  const unknown = (r) => idemStatus(r.message?.result)?.code === 'outcome_unknown';
  let own = 0;
  for (const { args, r } of firsts) {
    assert.equal(r.status, 200, r.body);
    assert.ok(!foreign(r.body), `a protected call got another call's answer: ${r.body}`);
    if (unknown(r)) continue;
    assert.equal(toolText(r.message?.result), ranText('charge', args), r.body);
    own++;
  }
  assert.ok(own > 0, 'some protected calls got their own answer');
  // Each retry replays exactly the call's own answer (or says unknown), without running it again.
  const retries = await Promise.all(firsts.map(({ args }) => payer.call('charge', args)));
  retries.forEach((r, i) => {
    assert.ok(!foreign(r.body), `a replay carried another call's answer: ${r.body}`);
    if (unknown(firsts[i].r)) {
      assert.ok(unknown(r), r.body);
      return;
    }
    assert.equal(replayMarker(r.message?.result)?.replayed, true, r.body);
    assert.equal(toolText(r.message.result), ranText('charge', firsts[i].args));
  });
  assert.equal((await upstream.count()).executions.charge, LANES * ROUNDS);
});

for (const mode of ['wrong-id', 'wrong-id-sse']) {
  test(`a final response with another id is never stored or given as the answer (${mode})`, async (t) => {
    const { upstream, gw } = await setup(t, mode);
    const s = await rawSession(t, gw.url, { headers: { 'X-Subject': 'payer' } });
    const args = { order: 'o-1' };
    const first = await s.call('charge', args);
    const result = first.message?.result;
    assert.equal(result?.isError, true, first.body);
    assert.equal(idemStatus(result)?.code, 'outcome_unknown', first.body);
    assert.ok(!first.body.includes(ranText('charge', args)), `the foreign answer reached the caller: ${first.body}`);
    await waitForLog(gw, /recorded as unknown \(response id mismatch\)/);

    const retry = await s.call('charge', args);
    assert.equal(idemStatus(retry.message?.result)?.code, 'outcome_unknown', retry.body);
    assert.equal(replayMarker(retry.message?.result), undefined);
    assert.equal((await upstream.count()).executions.charge, 1);
  });
}

test('an answer in a coding the gateway cannot read: its id cannot be checked, so it is recorded unknown', async (t) => {
  // the call went up with an id of the gateway's own on a connection that may be a kept-alive
  // one: an answer whose id cannot be read cannot be told from one left there by another request
  const { upstream, gw } = await setup(t, 'unknown-coding');
  const s = await rawSession(t, gw.url, { headers: { 'X-Subject': 'payer' } });
  const args = { order: 'o-x' };
  const first = await postCall(gw, 'charge', args);
  assert.equal(first.res.status, 200);
  assert.equal(first.res.headers.get('content-encoding'), null);
  const message = JSON.parse(first.bytes.toString());
  assert.equal(message.id, 'by-hand');
  assert.equal(idemStatus(message.result)?.code, 'outcome_unknown', first.bytes.toString());
  await waitForLog(gw, /recorded as unknown \(response id mismatch\)/);

  const retry = await s.call('charge', args);
  assert.equal(idemStatus(retry.message?.result)?.code, 'outcome_unknown', retry.body);
  assert.equal((await upstream.count()).executions.charge, 1);
});

for (const mode of ['gzip', 'deflate', 'br']) {
  test(`an answer compressed with ${mode} is stored decoded and replayed, executed once`, async (t) => {
    const { upstream, gw } = await setup(t, mode);
    const s = await rawSession(t, gw.url, { headers: { 'X-Subject': 'payer', 'Accept-Encoding': 'gzip, deflate, br' } });
    const args = { order: `o-${mode}` };
    const first = await s.call('charge', args);
    // decoded to map the gateway's id back to the caller's
    assert.equal(first.headers.get('content-encoding'), null, 'the caller gets the answer decoded');
    assert.equal(toolText(first.message?.result), ranText('charge', args), first.body);

    const retry = await s.call('charge', args);
    assert.equal(retry.headers.get('content-encoding'), null, 'a replay is written uncompressed');
    assert.equal(replayMarker(retry.message?.result)?.replayed, true, retry.body);
    assert.equal(toolText(retry.message.result), ranText('charge', args));
    const { executions, acceptEncoding } = await upstream.count();
    assert.equal(executions.charge, 1);
    assert.equal(acceptEncoding.charge, 'identity', 'a protected call asks for an uncompressed answer');
  });
}

test('a kept-alive connection closed before any answer: a relayed request goes again on a new one', async (t) => {
  const { upstream, gw } = await setup(t, 'close-reused');
  const s = await rawSession(t, gw.url, { headers: { 'X-Subject': 'payer' } });
  // every request after the first on a pooled connection meets a close; each read still gets
  // its answer, sent once more on a connection of its own
  for (let i = 0; i < 5; i++) {
    const r = await s.call('lookup', { q: i });
    assert.equal(toolText(r.message?.result), ranText('lookup', { q: i }), r.body);
  }
  assert.equal((await upstream.count()).executions.lookup, 5);
  await waitForLog(gw, /closed a kept-alive connection before answering: the request goes again/);
  // a protected call rides the kept-alive connection too, but is never sent twice: the server
  // took it and closed, so whether it ran is unknown, and it is not sent again
  const before = gw.logs().match(/the request goes again/g).length;
  const args = { order: 'o-close' };
  const first = await s.call('charge', args);
  assert.equal(first.status, 502, first.body);
  assert.equal(first.message?.result, undefined, first.body);
  await waitForLog(gw, /recorded as unknown/);
  assert.equal(gw.logs().match(/the request goes again/g).length, before, 'not sent again');
  assert.equal((await upstream.count()).calls.charge, undefined, 'the server dropped it unread');
  const retry = await s.call('charge', args);
  assert.equal(idemStatus(retry.message?.result)?.code, 'outcome_unknown', retry.body);
  assert.equal((await upstream.count()).calls.charge, undefined);
});

test('a late answer with another id on a kept-alive connection never reaches a protected call', async (t) => {
  const { upstream, gw } = await setup(t, 'wrong-id-reused');
  const s = await rawSession(t, gw.url, { headers: { 'X-Subject': 'payer' } });
  // the session's initialize left a kept-alive connection: the call rides it and is answered
  // with the id of the request answered before it there
  const args = { order: 'o-late' };
  const first = await s.call('charge', args, { id: 0 });
  assert.equal(first.status, 200, first.body);
  assert.equal(first.message?.id, 0);
  assert.equal(idemStatus(first.message?.result)?.code, 'outcome_unknown', first.body);
  assert.ok(!first.body.includes(ranText('charge', args)), `another request's answer reached the caller: ${first.body}`);
  await waitForLog(gw, /out of step with the request it was sent with/);
  await waitForLog(gw, /recorded as unknown \(response id mismatch\)/);
  const retry = await s.call('charge', args);
  assert.equal(idemStatus(retry.message?.result)?.code, 'outcome_unknown', retry.body);
  assert.equal(replayMarker(retry.message?.result), undefined);
  const { executions, calls } = await upstream.count();
  assert.equal(calls.charge, 1, 'sent once');
  assert.equal(executions.charge, 1);
  // an upstream known to answer out of step: later protected calls take connections of their
  // own, so the next strays cost no call its answer
  await waitForLog(gw, /answered a request with another's answer: protected calls go up on connections of their own/);
  for (const order of ['o-next-1', 'o-next-2']) {
    const next = await s.call('charge', { order });
    assert.equal(idemStatus(next.message?.result), undefined, `answered, not refused: ${next.body}`);
    assert.equal(toolText(next.message?.result), ranText('charge', { order }), `its own answer: ${next.body}`);
  }
});

test('a cancel of a protected call reaches the server with the id the call went up with', async (t) => {
  const { upstream, gw } = await setup(t, 'slow', { on_cancel: 'forward' });
  const s = await rawSession(t, gw.url, { headers: { 'X-Subject': 'payer' } });
  const first = s.call('charge', { order: 'o-cancel' }, { id: 'call-1' });
  await waitFor(async () => (await upstream.count()).calls.charge === 1, { what: 'the call to reach the server' });
  const cancel = await fetch(gw.url, {
    method: 'POST',
    headers: {
      'Content-Type': 'application/json', Accept: 'application/json, text/event-stream', 'X-Subject': 'payer',
      'MCP-Protocol-Version': '2025-11-25', ...(s.sessionId ? { 'Mcp-Session-Id': s.sessionId } : {}),
    },
    body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 'call-1', reason: 'client timeout' } }),
  });
  assert.equal(cancel.status, 202);
  await cancel.arrayBuffer();
  await first;
  const { callIds, cancels } = await upstream.count();
  assert.equal(callIds.length, 1);
  assert.match(String(callIds[0]), /^idemgw-[0-9a-f]{16}-\d+$/, 'the call went up with an id of the gateway\'s');
  assert.deepEqual(cancels, callIds, 'the cancel names the id the server knows the call by');
});

test('an HTTP/1.0 answer delimited by the close is recorded and replayed', async (t) => {
  const { upstream, gw } = await setup(t, 'http10');
  const s = await rawSession(t, gw.url, { headers: { 'X-Subject': 'payer' } });
  const args = { order: 'o-10' };
  const first = await s.call('charge', args);
  assert.equal(toolText(first.message?.result), ranText('charge', args), first.body);
  const retry = await s.call('charge', args);
  assert.equal(replayMarker(retry.message?.result)?.replayed, true, retry.body);
  assert.equal(toolText(retry.message.result), ranText('charge', args));
  assert.equal((await upstream.count()).executions.charge, 1);
});

test('an SSE answer that starts with a byte order mark is found and recorded', async (t) => {
  const { upstream, gw } = await setup(t, 'sse-bom');
  const s = await rawSession(t, gw.url, { headers: { 'X-Subject': 'payer' } });
  const args = { order: 'o-bom' };
  const first = await s.call('charge', args);
  assert.equal(toolText(first.message?.result), ranText('charge', args), first.body);
  const retry = await s.call('charge', args);
  assert.equal(replayMarker(retry.message?.result)?.replayed, true, retry.body);
  assert.equal(toolText(retry.message.result), ranText('charge', args));
  assert.equal((await upstream.count()).executions.charge, 1);
});

test('a redirect ran nothing: the claim is released and a retry executes', async (t) => {
  const { upstream, gw } = await setup(t, 'redirect');
  const s = await rawSession(t, gw.url, { headers: { 'X-Subject': 'payer' } });
  const args = { order: 'o-302' };
  const { res: first } = await postCall(gw, 'charge', args); // the redirect seen, not followed
  assert.equal(first.status, 302);
  assert.equal(first.statusText, 'Found');
  assert.equal(first.headers.get('location'), '/elsewhere');
  await waitForLog(gw, /recorded as failed \(redirected by upstream\)/);
  assert.doesNotMatch(gw.logs(), /302 Status/);

  const retry = await s.call('charge', args);
  assert.equal(toolText(retry.message?.result), ranText('charge', args), retry.body);
  assert.equal(replayMarker(retry.message.result), undefined, 'the retry ran, it was not replayed');
  const { executions, calls } = await upstream.count();
  assert.equal(calls.charge, 2);
  assert.equal(executions.charge, 1);
});

/** postCall for an answer that may break off: {res, bytes} or {res, error} when its body did. */
async function tryCall(gw, name, args) {
  const res = await fetch(gw.url, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream', 'X-Subject': 'payer' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 'by-hand', method: 'tools/call', params: { name, arguments: args } }),
  });
  try {
    return { res, bytes: Buffer.from(await res.arrayBuffer()) };
  } catch (error) {
    return { res, error };
  }
}

// The server closes after the head and part of the body: what reached the gateway is no answer.
// A protected call gets the outcome_unknown result (recorded unknown, never run again); a
// relayed call gets a JSON-RPC error when none of the body reached the agent, else a
// connection that breaks: never an empty or partial body that reads as a whole answer.
test('an answer cut off mid-body is never given as a whole one', async (t) => {
  const { upstream, gw } = await setup(t, 'cut');

  await t.test('protected call: outcome_unknown, recorded so, a retry not executed', async () => {
    const shapes = [
      { name: 'JSON, half the body', args: {} },
      { name: 'JSON, chunked, none of the body', args: { chunked: true, keep: 0 } },
      { name: 'SSE, its progress relayed, the final event cut', args: { sse: true, chunked: true } },
      { name: 'SSE, none of the body', args: { sse: true, keep: 0 } },
    ];
    for (const [i, shape] of shapes.entries()) {
      const args = { order: `o-cut-${i}`, ...shape.args };
      const first = await tryCall(gw, 'charge', args);
      assert.equal(first.error, undefined, `${shape.name}: the answer ends whole (${first.error})`);
      assert.equal(first.res.status, 200, shape.name);
      const text = first.bytes.toString();
      const message = findResponse(first.res.headers.get('content-type'), text, 'by-hand');
      assert.equal(message?.result?.isError, true, `${shape.name}: ${text}`);
      assert.equal(idemStatus(message.result)?.code, 'outcome_unknown', text);
      assert.equal(idemStatus(message.result)?.executed, 'unknown', text);
      assert.match(toolText(message.result), /cut off/);
      assert.match(toolText(message.result), /Do NOT retry/);
      assert.ok(!text.includes('"idemgw-'), `${shape.name}: a part of the cut answer reached the agent: ${text}`);
      if (shape.args.sse && shape.args.keep === undefined) {
        assert.match(text, /notifications\/progress/, 'the progress before the cut went out live');
      }

      const retry = await tryCall(gw, 'charge', args);
      const again = findResponse(retry.res.headers.get('content-type'), retry.bytes?.toString(), 'by-hand');
      assert.equal(idemStatus(again?.result)?.code, 'outcome_unknown', `${shape.name}: ${retry.bytes}`);
      assert.equal(idemStatus(again.result).executed, false);
      assert.match(toolText(again.result), /may have executed/);
    }
    await waitForLog(gw, /recorded as unknown \(outcome unknown\)/);
    assert.equal((await upstream.count()).executions.charge, shapes.length, 'no retry was executed');
  });

  await t.test('relayed call, none of the body sent: a JSON-RPC error for its id', async () => {
    for (const args of [{ keep: 0 }, { chunked: true, keep: 0 }, { sse: true, keep: 0 }, { sse: true, chunked: true, keep: 0 }]) {
      const r = await tryCall(gw, 'lookup', args);
      const what = JSON.stringify(args);
      assert.equal(r.error, undefined, `${what}: ${r.error}`);
      // a JSON answer's head is kept back, so the error is the whole answer; an event stream's
      // head went out at once (a call may run long without an event), so the error is its last
      // event and the stream ends whole
      assert.equal(r.res.status, args.sse ? 200 : 502, `${what}: ${r.bytes}`);
      const text = r.bytes.toString();
      const message = JSON.parse(args.sse ? text.split('\n\n').filter((b) => b.includes('data:')).at(-1).replace(/^[^]*?data: ?/, '') : text);
      assert.equal(message.id, 'by-hand');
      assert.equal(message.error?.code, -32603, r.bytes.toString());
      assert.match(message.error.message, /cut off/);
    }
  });

  await t.test('relayed call, part of the body sent upstream: a JSON answer (read whole for its id) is an error for its id', async () => {
    for (const args of [{}, { chunked: true }]) {
      const r = await tryCall(gw, 'lookup', args);
      const what = JSON.stringify(args);
      assert.equal(r.error, undefined, `${what}: ${r.error}`);
      assert.equal(r.res.status, 502, `${what}: ${r.bytes}`);
      const message = JSON.parse(r.bytes.toString());
      assert.equal(message.id, 'by-hand');
      assert.match(message.error.message, /cut off/);
    }
  });

  await t.test('relayed call, part of an event stream relayed: an error event for its id ends it', async () => {
    for (const args of [{ sse: true, chunked: true }, { sse: true }]) {
      const r = await tryCall(gw, 'lookup', args);
      const what = JSON.stringify(args);
      assert.equal(r.res.status, 200, what);
      assert.equal(r.error, undefined, `${what}: ${r.error}`);
      const events = r.bytes.toString().split('\n\n').filter((b) => b.includes('data:'));
      const last = JSON.parse(events.at(-1).replace(/^[^]*?data: ?/, ''));
      assert.equal(last.id, 'by-hand', `${what}: ${r.bytes}`);
      assert.match(last.error.message, /cut off/);
    }
  });
});
