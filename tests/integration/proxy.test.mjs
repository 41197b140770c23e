// The transparent proxy: the official SDK client talks to server-everything
// (streamableHttp) through the gateway. Every tool is class `read` here, so nothing is
// claimed or replayed; what is measured is that requests, SSE streams, server-to-client
// requests, resumption and session teardown pass through intact.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  CallToolResultSchema,
  CreateMessageRequestSchema,
  ElicitRequestSchema,
} from '@modelcontextprotocol/sdk/types.js';
import { mcpClient, sseReader, startEverything, startGateway } from './lib/harness.mjs';

const PASSTHROUGH = { defaults: { class: 'read' } };
const PROTOCOL = '2025-11-25';

async function setup(t) {
  const upstream = await startEverything(t);
  const gw = await startGateway(t, { upstream: upstream.url, config: PASSTHROUGH });
  return { upstream, gw };
}

const textOf = (result) => result.content.filter((c) => c.type === 'text').map((c) => c.text).join('\n');

test('initialize, tools/list and plain tool calls through the gateway', async (t) => {
  const { gw } = await setup(t);
  const client = await mcpClient(t, gw.url);

  assert.match(client.getServerVersion().name, /everything/i);
  assert.ok(client.getServerCapabilities().tools, 'the server advertises tools');

  const { tools } = await client.listTools();
  const names = tools.map((x) => x.name);
  for (const n of ['echo', 'get-structured-content', 'trigger-long-running-operation', 'get-sum']) {
    assert.ok(names.includes(n), `tools/list has ${n} (got ${names.join(', ')})`);
  }

  const echo = await client.callTool({ name: 'echo', arguments: { message: 'hello through idemgw ✓' } });
  assert.equal(textOf(echo), 'Echo: hello through idemgw ✓');
  assert.notEqual(echo.isError, true);

  const sc = await client.callTool({ name: 'get-structured-content', arguments: { location: 'Chicago' } });
  assert.deepEqual(sc.structuredContent, { temperature: 36, conditions: 'Light rain / drizzle', humidity: 82 });
  assert.deepEqual(JSON.parse(textOf(sc)), sc.structuredContent, 'the text block mirrors structuredContent');

  // A protocol error passes through as a result the SDK reports, not a transport failure.
  const unknown = await client.callTool({ name: 'no-such-tool', arguments: {} });
  assert.equal(unknown.isError, true);
});

test('progress notifications arrive while a long-running call is still running', async (t) => {
  const { gw } = await setup(t);
  const client = await mcpClient(t, gw.url);

  const events = [];
  const started = Date.now();
  const result = await client.request(
    { method: 'tools/call', params: { name: 'trigger-long-running-operation', arguments: { duration: 2, steps: 4 } } },
    CallToolResultSchema,
    { onprogress: (p) => events.push({ at: Date.now() - started, progress: p.progress, total: p.total }) },
  );
  const resolvedAt = Date.now() - started;

  assert.match(textOf(result), /Long running operation completed/);
  assert.deepEqual(events.map((e) => e.progress), [1, 2, 3, 4], `progress events: ${JSON.stringify(events)}`);
  assert.ok(events.every((e) => e.total === 4));
  // The first step ends after 0.5 s and the call after 2 s: buffering the stream until the
  // end would deliver all four together with the result.
  assert.ok(events[0].at < resolvedAt - 1000,
    `first progress at ${events[0].at} ms, result at ${resolvedAt} ms: progress was held back`);
  assert.ok(events[2].at < resolvedAt - 200, `third progress at ${events[2].at} ms, result at ${resolvedAt} ms`);
});

test('sampling and elicitation requests from the server are answered by the client through the gateway', async (t) => {
  const { gw } = await setup(t);
  const client = await mcpClient(t, gw.url, { capabilities: { sampling: {}, elicitation: {} } });

  const samplingRequests = [];
  client.setRequestHandler(CreateMessageRequestSchema, async (req) => {
    samplingRequests.push(req.params);
    return { role: 'assistant', content: { type: 'text', text: 'sampled-answer-42' }, model: 'test-model', stopReason: 'endTurn' };
  });
  const elicitations = [];
  client.setRequestHandler(ElicitRequestSchema, async (req) => {
    elicitations.push(req.params);
    return { action: 'accept', content: { name: 'Ada Lovelace', check: true } };
  });

  const { tools } = await client.listTools();
  const names = tools.map((x) => x.name);
  assert.ok(names.includes('trigger-sampling-request'), 'registered because the client declared sampling');
  assert.ok(names.includes('trigger-elicitation-request'), 'registered because the client declared elicitation');

  const s = await client.callTool({ name: 'trigger-sampling-request', arguments: { prompt: 'say 42', maxTokens: 10 } });
  assert.equal(samplingRequests.length, 1);
  assert.match(samplingRequests[0].messages[0].content.text, /say 42/);
  assert.match(textOf(s), /sampled-answer-42/, 'the client answer reached the server and came back in the result');

  const e = await client.callTool({ name: 'trigger-elicitation-request', arguments: {} });
  assert.equal(elicitations.length, 1);
  assert.ok(elicitations[0].requestedSchema?.properties?.name, 'the elicitation schema arrived intact');
  assert.match(textOf(e), /Ada Lovelace/);
});

// Raw HTTP, so the test controls exactly when the stream is dropped and resumed.
async function rawSession(url) {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
    body: JSON.stringify({
      jsonrpc: '2.0', id: 1, method: 'initialize',
      params: { protocolVersion: PROTOCOL, capabilities: {}, clientInfo: { name: 'raw-resume-test', version: '1.0.0' } },
    }),
  });
  assert.equal(res.status, 200, `initialize: HTTP ${res.status}`);
  const sessionId = res.headers.get('mcp-session-id');
  assert.ok(sessionId, 'the gateway passes Mcp-Session-Id through');
  const body = await res.text();
  assert.match(body, /"protocolVersion"/);
  const headers = { 'Mcp-Session-Id': sessionId, 'MCP-Protocol-Version': PROTOCOL };
  const n = await fetch(url, {
    method: 'POST',
    headers: { ...headers, 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
    body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }),
  });
  await n.arrayBuffer();
  assert.equal(n.status, 202, 'a notification is answered 202');
  return { sessionId, headers };
}

// Starts a long-running call, reads up to its first progress notification, then drops the
// connection. Returns the last SSE event id seen and that progress value.
async function startAndDrop(gw, headers, id, args) {
  const abort = new AbortController();
  const res = await fetch(gw.url, {
    method: 'POST',
    signal: abort.signal,
    headers: { ...headers, 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
    body: JSON.stringify({
      jsonrpc: '2.0', id, method: 'tools/call',
      params: { name: 'trigger-long-running-operation', arguments: args, _meta: { progressToken: `resume-${id}` } },
    }),
  });
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type'), /text\/event-stream/);
  const first = sseReader(res);
  let lastEventId = null;
  let seenProgress = null;
  for (;;) {
    const ev = await first.next();
    assert.ok(ev, 'the stream ended before any progress notification');
    if (ev.id) lastEventId = ev.id;
    if (!ev.data) continue;
    const msg = JSON.parse(ev.data);
    assert.notEqual(msg.id, id, 'the result arrived before the stream was dropped; the call is too short');
    if (msg.method === 'notifications/progress') {
      seenProgress = msg.params.progress;
      break;
    }
  }
  assert.ok(lastEventId, 'events carry SSE ids through the gateway');
  await first.cancel();
  abort.abort();
  return { lastEventId, seenProgress };
}

// GET with Last-Event-ID; collects progress values and the final result for id.
async function resume(gw, headers, lastEventId, id) {
  const resumed = await fetch(gw.url, {
    method: 'GET',
    headers: { ...headers, Accept: 'text/event-stream', 'Last-Event-ID': lastEventId },
  });
  assert.equal(resumed.status, 200, `GET with Last-Event-ID: HTTP ${resumed.status}`);
  const again = sseReader(resumed);
  const progress = [];
  let result = null;
  const deadline = AbortSignal.timeout(15000);
  while (!result && !deadline.aborted) {
    const ev = await again.next();
    if (!ev) break;
    if (!ev.data) continue;
    const msg = JSON.parse(ev.data);
    if (msg.method === 'notifications/progress') progress.push(msg.params.progress);
    if (msg.id === id) result = msg;
  }
  await again.cancel();
  return { progress, result };
}

test('a dropped SSE stream is resumed with Last-Event-ID and delivers the final result', async (t) => {
  const { gw } = await setup(t);
  const { headers } = await rawSession(gw.url);
  const { lastEventId, seenProgress } = await startAndDrop(gw, headers, 7, { duration: 2, steps: 4 });

  // Resume after the call has finished upstream: a second call started now and lasting 2 s
  // ends after the first (which ends 2 s after it began); the resume then replays what the
  // upstream stored.
  const barrier = await fetch(gw.url, {
    method: 'POST',
    headers: { ...headers, 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
    body: JSON.stringify({
      jsonrpc: '2.0', id: 8, method: 'tools/call',
      params: { name: 'trigger-long-running-operation', arguments: { duration: 2, steps: 1 } },
    }),
  });
  assert.match(await barrier.text(), /Long running operation completed/);

  const { progress, result } = await resume(gw, headers, lastEventId, 7);
  assert.ok(result, 'the final result arrived on the resumed stream');
  assert.match(result.result.content[0].text, /Long running operation completed/);
  assert.ok(!progress.includes(seenProgress), `events up to Last-Event-ID are not repeated (${progress})`);
  assert.deepEqual(progress, [1, 2, 3, 4].filter((p) => p > seenProgress), 'every later progress event is replayed in order');
});

test('a stream dropped while the call runs is resumed live from the gateway', async (t) => {
  // The gateway keeps reading the upstream stream after the agent drops it (a disconnect is not
  // a cancellation), so the upstream still has a reader; the gateway serves the resume itself:
  // the events after Last-Event-ID it kept, then the rest live as they arrive.
  const { gw } = await setup(t);
  const { headers } = await rawSession(gw.url);
  const { lastEventId, seenProgress } = await startAndDrop(gw, headers, 9, { duration: 3, steps: 6 });
  const { progress, result } = await resume(gw, headers, lastEventId, 9);
  assert.ok(result, 'the final result arrived on the resumed stream');
  assert.match(result.result.content[0].text, /Long running operation completed/);
  assert.deepEqual(progress, [1, 2, 3, 4, 5, 6].filter((p) => p > seenProgress),
    'every progress event after Last-Event-ID arrives once, in order');
  assert.ok(gw.logs().includes('stream resumed from the gateway'), 'the gateway served the resume');
});

test('with two workers, a resume that lands on the other worker is handed to the one reading the stream', async (t) => {
  // The workers share the port, so a GET with Last-Event-ID reaches either. The one that does
  // not read the stream hands the socket to the one that does (the upstream would refuse a
  // second reader). Eight calls on eight sessions, resumed on fresh connections: each resume
  // must be served live, whichever worker accepted it.
  const upstream = await startEverything(t);
  // several workers: the embedded store takes one process, and none is needed here
  const gw = await startGateway(t, { upstream: upstream.url, config: { ...PASSTHROUGH, workers: 2, database_url: 'none' } });
  const runs = await Promise.all([...Array(8).keys()].map(async (i) => {
    const { headers } = await rawSession(gw.url);
    const id = 100 + i;
    const { lastEventId, seenProgress } = await startAndDrop(gw, headers, id, { duration: 3, steps: 6 });
    const { progress, result } = await resume(gw, headers, lastEventId, id);
    return { i, seenProgress, progress, result };
  }));
  for (const r of runs) {
    assert.ok(r.result, `call ${r.i}: the final result arrived on the resumed stream`);
    assert.deepEqual(r.progress, [1, 2, 3, 4, 5, 6].filter((p) => p > r.seenProgress),
      `call ${r.i}: every progress event after Last-Event-ID arrives once, in order`);
  }
  const logs = gw.logs();
  const served = (logs.match(/stream resumed from the gateway/g) ?? []).length;
  assert.equal(served, 8, 'every resume was served by the worker reading its stream');
  t.diagnostic(`resumes handed between workers: ${(logs.match(/stream resume handed to worker/g) ?? []).length} of 8`);
});

test('DELETE ends the session through the gateway', async (t) => {
  const { gw } = await setup(t);
  const { headers } = await rawSession(gw.url);

  const ping = async () => {
    const r = await fetch(gw.url, {
      method: 'POST',
      headers: { ...headers, 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'ping' }),
    });
    return { status: r.status, body: await r.text() };
  };
  const before = await ping();
  assert.equal(before.status, 200);
  assert.match(before.body, /"result":\{\}/);

  const del = await fetch(gw.url, { method: 'DELETE', headers });
  await del.arrayBuffer();
  assert.equal(del.status, 200, `DELETE: HTTP ${del.status}`);

  const after = await ping();
  // server-everything answers an unknown session 400 (the SDK transport alone says 404).
  assert.ok(after.status === 400 || after.status === 404, `request on the deleted session: HTTP ${after.status}`);
});

test('the SDK client terminates its session through the gateway', async (t) => {
  const { gw } = await setup(t);
  const client = await mcpClient(t, gw.url);
  await client.ping();
  const transport = client.transport;
  assert.ok(transport.sessionId);
  await transport.terminateSession();
  assert.equal(transport.sessionId, undefined);
});
