// A protected call whose answer arrives on the session's GET stream (the POST stream ended after
// its priming event) is recorded as one whose answer came on the POST: the size limit holds, a
// compressed stream is read, the replay cache has the result, and a task handle routes the task.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import {
  NODE, TESTS, createDatabase, rawSession, replayMarker, sseReader, startGateway, startProcess, toolText, waitForLog,
} from './lib/harness.mjs';

async function startPolling(t, encoding = '') {
  const h = await startProcess(t, NODE, [path.join(TESTS, 'fixtures/polling-upstream.mjs'), '0'], {
    env: { ENCODING: encoding },
    readyLine: /listening on port (\d+)/,
    name: `polling-upstream${encoding ? `(${encoding})` : ''}`,
  });
  const base = `http://127.0.0.1:${Number(h.match[1])}`;
  const executions = async () => (await (await fetch(`${base}/count`)).json()).executions;
  return { ...h, url: `${base}/mcp`, executions };
}

async function setup(t, { encoding, tools = {} } = {}) {
  const upstream = await startPolling(t, encoding);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: {
      subject: { header: 'X-Subject' },
      tools: {
        charge: { class: 'non_idempotent' },
        big_charge: { class: 'non_idempotent', max_stored_bytes: 1024 },
        task_charge: { class: 'non_idempotent' },
        ...tools,
      },
    },
  });
  const s = await rawSession(t, gw.url, { headers: { 'X-Subject': 'alice' } });
  return { upstream, gw, s };
}

// Calls tool with the POST stream ending early, then resumes the session's stream for the answer.
async function pollingCall(gw, s, tool, args, id) {
  const first = await s.call(tool, args, { id });
  assert.equal(first.message, null, `no answer on the POST stream: ${first.body}`);
  const primingId = [...first.body.matchAll(/^id: ?(.+)$/gm)].map((m) => m[1].trim()).pop();
  assert.ok(primingId, `the priming event carries an id: ${first.body}`);
  const res = await fetch(gw.url, {
    headers: {
      'X-Subject': 'alice', Accept: 'text/event-stream', 'Mcp-Session-Id': s.sessionId, 'MCP-Protocol-Version': '2025-11-25', 'Last-Event-ID': primingId,
    },
  });
  assert.equal(res.status, 200);
  const reader = sseReader(res);
  for (;;) {
    const ev = await reader.next();
    assert.ok(ev, 'the resumed stream ended before the answer');
    const msg = ev.data ? JSON.parse(ev.data) : null;
    if (msg?.id === id) {
      await reader.cancel();
      return msg;
    }
  }
}

async function metric(gw, re) {
  const text = await (await fetch(`${gw.adminUrl}/metrics`)).text();
  const m = re.exec(text);
  assert.ok(m, `${re} in /metrics`);
  return Number(m[1]);
}

test('a result over max_stored_bytes from the GET stream is recorded as ran, its text not kept', async (t) => {
  const { upstream, gw, s } = await setup(t);
  const args = { order: 'o-big', size: 4096 };
  const msg = await pollingCall(gw, s, 'big_charge', args, 'big-1');
  assert.match(toolText(msg.result), /^charged o-big x{4096}$/, 'the caller gets the whole answer');
  await waitForLog(gw, /recorded as succeeded from a resumed stream/);
  const retry = await s.call('big_charge', args, { id: 'big-2' });
  assert.ok(replayMarker(retry.message.result), retry.body);
  assert.match(toolText(retry.message.result), /too large for the gateway to keep/);
  assert.doesNotMatch(retry.body, /xxxx/, 'the oversized result was not stored');
  assert.deepEqual(await upstream.executions(), { big_charge: 1 });
});

for (const encoding of ['gzip', 'deflate', 'br']) {
  test(`a GET stream in ${encoding} finishes the pending call`, async (t) => {
    const { upstream, gw, s } = await setup(t, { encoding });
    const msg = await pollingCall(gw, s, 'charge', { order: `o-${encoding}` }, `${encoding}-1`);
    assert.match(toolText(msg.result), new RegExp(`^charged o-${encoding} \\(execution 1\\)$`));
    await waitForLog(gw, /recorded as succeeded from a resumed stream/);
    const retry = await s.call('charge', { order: `o-${encoding}` }, { id: `${encoding}-2` });
    assert.ok(replayMarker(retry.message?.result), `a replay, not in progress: ${retry.body}`);
    assert.equal(toolText(retry.message.result), toolText(msg.result));
    assert.deepEqual(await upstream.executions(), { charge: 1 });
  });
}

test('a result finished from the GET stream is in the replay cache', async (t) => {
  const { gw, s } = await setup(t);
  const msg = await pollingCall(gw, s, 'charge', { order: 'o-cache' }, 'cache-1');
  await waitForLog(gw, /recorded as succeeded from a resumed stream/);
  const hits = /idemgw_replay_cache_lookups_total\{result="hit"\} (\d+)/;
  const before = await metric(gw, hits);
  const retry = await s.call('charge', { order: 'o-cache' }, { id: 'cache-2' });
  assert.ok(replayMarker(retry.message.result), retry.body);
  assert.equal(toolText(retry.message.result), toolText(msg.result));
  assert.equal(await metric(gw, hits), before + 1, 'replayed from the cache, not the store');
});

test('a task handle from the GET stream routes the task to the session that created it', async (t) => {
  const { gw, s } = await setup(t);
  const msg = await pollingCall(gw, s, 'task_charge', { order: 'o-task' }, 'task-1');
  const taskId = msg.result?.task?.taskId;
  assert.ok(taskId, JSON.stringify(msg));
  await waitForLog(gw, /recorded as succeeded from a resumed stream/);
  // the caller reconnected: its new session polls the task without calling again
  const other = await rawSession(t, gw.url, { headers: { 'X-Subject': 'alice' } });
  const got = await other.request('tasks/get', { taskId });
  assert.equal(got.message?.error, undefined, got.body);
  assert.equal(got.message.result.taskId, taskId);
});
