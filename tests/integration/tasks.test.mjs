// MCP Tasks through the gateway (server-everything's simulate-research-query, a task-only
// tool): the CreateTaskResult of a task-augmented tools/call is stored and replayed, so a retry
// polls the same task; the replay never outlives the task's ttl; the retry's tasks/get,
// tasks/result and tasks/cancel for that task reach the session that created it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  createDatabase, idemgwKey, rawSession, replayMarker, startEverything, startGateway, waitFor, waitForLog,
} from './lib/harness.mjs';

const ARGS = { topic: 'idempotency in agent systems' };

async function setup(t) {
  const upstream = await startEverything(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { subject: { static: 'researcher' }, tools: { 'simulate-research-query': { class: 'non_idempotent', window: '1h' } } },
  });
  return { upstream, gw };
}

const startTask = (s) => s.request('tools/call', { name: 'simulate-research-query', arguments: ARGS, task: { ttl: 60000 } });

test('a retried task-augmented call gets the same task, and its polls reach the session that owns it', async (t) => {
  const { upstream, gw } = await setup(t);
  const first = await rawSession(t, gw.url);
  const r1 = await startTask(first);
  const task = r1.message?.result?.task;
  assert.ok(task?.taskId, `a CreateTaskResult: ${r1.body}`);

  // The retry comes from a new session (the client reconnected).
  const retry = await rawSession(t, gw.url);
  const r2 = await startTask(retry);
  assert.equal(r2.message.result.task.taskId, task.taskId, 'the same task, not a second one');
  assert.ok(replayMarker(r2.message.result));

  // Straight to the server, the new session does not know the task...
  const direct = await rawSession(t, upstream.url);
  const lost = await direct.request('tasks/get', { taskId: task.taskId });
  assert.ok(lost.message?.error, `the server binds a task to its session: ${lost.body}`);
  // ...through the gateway it does.
  const got = await retry.request('tasks/get', { taskId: task.taskId });
  assert.equal(got.message?.error, undefined, got.body);
  assert.equal(got.message.result.taskId, task.taskId);
  const done = await waitFor(async () => {
    const g = await retry.request('tasks/get', { taskId: task.taskId });
    return g.message?.result?.status === 'completed' ? g : null;
  }, { timeoutMs: 30000, what: 'the task to complete' });
  assert.equal(done.message.result.status, 'completed');
  const result = await retry.request('tasks/result', { taskId: task.taskId });
  assert.equal(result.message?.error, undefined, result.body);
  assert.match(JSON.stringify(result.message.result), /idempotency in agent systems/);

  // The stored replay lives no longer than the task (ttl 300 s by the server, window 1 h).
  const shown = await idemgwKey(['--subject', 'researcher', '--tool', 'simulate-research-query', '--args', JSON.stringify(ARGS), '--show', '-c', gw.configPath]);
  assert.equal(shown.code, 0, shown.stderr);
  const row = JSON.parse(shown.stdout.trim().split('\n').pop());
  const life = Date.parse(row.expires_at) - Date.parse(row.finished_at);
  assert.ok(life <= 300000 + 1000, `kept ${life} ms, the task's ttl is 300000`);
});

test('a task whose session has ended: the retry is told so, nothing runs again', async (t) => {
  const { gw } = await setup(t);
  const first = await rawSession(t, gw.url);
  const task = (await startTask(first)).message.result.task;
  const retry = await rawSession(t, gw.url);
  assert.equal((await startTask(retry)).message.result.task.taskId, task.taskId);
  await first.close(); // DELETE: the session that owns the task ends
  const got = await retry.request('tasks/get', { taskId: task.taskId });
  assert.equal(got.message?.error?.code, -32602, got.body);
  assert.match(got.message.error.message, /created in an earlier session of yours .* which has ended/);
  await waitForLog(gw, /"rpc_method":"tasks\/get".*"task_session":"routed"/);
});
