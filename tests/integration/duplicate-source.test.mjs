// Which layer retried: every duplicate's log line names its most likely source
// (duplicate_source, attempt, first_seen, gap_ms), /metrics counts them by source, the key's
// row keeps the last ones (`idemgw key --show`), and `idemgw report` adds them up per tool.
// Runs against both stores.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { once } from 'node:events';
import {
  createDatabase, freePort, IDEMGW_BIN, idemgwKey, idemStatus, rawSession, readLedger, replayMarker, run,
  startGateway, startRefundServer, toolText, waitFor, waitForLedger, waitForLog,
} from './lib/harness.mjs';

async function setup(t, config = {}) {
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { subject: { static: 'tenant' }, ...config },
  });
  return { upstream, gw };
}

// Duplicates by source, added up over tools (a source with none has no series).
async function counts(gw) {
  const text = await (await fetch(`${gw.adminUrl}/metrics`)).text();
  const out = { reconnect: 0, transport: 0, harness: 0, model: 0, late: 0 };
  for (const m of text.matchAll(/^idemgw_duplicates_total\{tool="[^"]*",source="(\w+)"\} (\d+)$/gm)) out[m[1]] += Number(m[2]);
  return out;
}

/** `idemgw key --show` of a call by the static subject: the row's JSON line. */
async function show(gw, tool, args, ...extra) {
  const r = await idemgwKey(['-c', gw.configPath, '--subject', 'tenant', '--tool', tool, '--args', JSON.stringify(args), '--show', ...extra]);
  assert.equal(r.code, 0, r.stderr);
  return extra.includes('--text') ? r.stdout : JSON.parse(r.stdout.trim().split('\n')[1]);
}

/** The row once its duplicates are written (within half a second of the last one). */
function rowWith(gw, tool, args, duplicates) {
  return waitFor(async () => {
    const row = await show(gw, tool, args);
    return row.duplicates === duplicates ? row : null;
  }, { what: `${duplicates} duplicates on the row of ${tool}` });
}

const lineOf = (gw, id) => gw.logs().split('\n').filter((l) => l.includes('"rpc_method":"tools/call"') && l.includes(`"rpc_id":${JSON.stringify(id)}`)).map((l) => JSON.parse(l)).pop();

test('a re-POST with the same id is transport, a new id at once is harness, a new session is reconnect', async (t) => {
  const { gw } = await setup(t);
  const s = await rawSession(t, gw.url);
  const args = { order_id: 'ord-src', amount_cents: 3 };
  const first = await s.call('issue_refund', args, { id: 'req-1' });
  assert.equal(replayMarker(first.message.result), undefined);
  const again = await s.call('issue_refund', args, { id: 'req-1' }); // the same request, re-sent
  assert.ok(replayMarker(again.message.result));
  const retry = await s.call('issue_refund', args, { id: 'req-2' }); // a new request at once
  assert.ok(replayMarker(retry.message.result));
  const other = await rawSession(t, gw.url);
  await other.call('issue_refund', args, { id: 'req-3' }); // after reconnecting

  await waitForLog(gw, /"rpc_id":"req-3".*"duplicate_source"/);
  const l1 = lineOf(gw, 'req-2');
  assert.equal(l1.duplicate_source, 'harness');
  assert.equal(l1.attempt, 3);
  assert.ok(l1.gap_ms >= 0 && l1.gap_ms < 2000);
  assert.ok(!Number.isNaN(Date.parse(l1.first_seen)));
  assert.equal(lineOf(gw, 'req-3').duplicate_source, 'reconnect');
  assert.equal(l1.first_state, 'succeeded');
  const transport = gw.logs().split('\n').filter((l) => l.includes('"rpc_id":"req-1"') && l.includes('"duplicate_source"'));
  assert.equal(transport.length, 1);
  assert.match(transport[0], /"duplicate_source":"transport"/);
  assert.deepEqual(await counts(gw), { reconnect: 1, transport: 1, harness: 1, model: 0, late: 0 });
  const text = await (await fetch(`${gw.adminUrl}/metrics`)).text();
  assert.match(text, /^idemgw_duplicates_total\{tool="issue_refund",source="harness"\} 1$/m);
  assert.match(text, /^idemgw_tool_calls_total\{tool="issue_refund",class="non_idempotent",outcome="executed"\} 1$/m);
  assert.match(text, /^idemgw_tool_calls_total\{tool="issue_refund",class="non_idempotent",outcome="replay"\} 3$/m);

  // the key's row keeps each duplicate, oldest first, with the facts that classified it
  const row = await rowWith(gw, 'issue_refund', args, 3);
  assert.equal(row.attempts, 4, 'the first call and three replays');
  assert.deepEqual(row.duplicates_by_answer, { replay: 3, in_progress: 0, unknown: 0 });
  assert.deepEqual(row.duplicates_by_source, { reconnect: 1, transport: 1, harness: 1, model: 0, late: 0 });
  assert.deepEqual(row.history.map((h) => [h.source, h.answered, h.jsonrpc_id]),
    [['transport', 'replay', '"req-1"'], ['harness', 'replay', '"req-2"'], ['reconnect', 'replay', '"req-3"']]);
  assert.deepEqual(row.history.map((h) => h.session_id), [s.sessionId, s.sessionId, other.sessionId]);
  for (const h of row.history) {
    assert.ok(Number.isInteger(h.gap_ms) && h.gap_ms >= 0);
    assert.ok(Date.parse(h.at) >= Date.parse(row.created_at));
  }
  assert.equal(row.history[1].gap_ms, l1.gap_ms, 'the gap the log line gave');
  // --text: the same, for people
  const text2 = await show(gw, 'issue_refund', args, '--text');
  assert.match(text2, /^duplicates {2}3 \(replay 3; by source: reconnect 1, transport 1, harness 1\)$/m);
  const lines = text2.split('\n').filter((l) => /^\d{4}-\d\d-\d\dT/.test(l));
  assert.equal(lines.length, 3);
  assert.match(lines[0], /\s+transport\s+replay\s+\d+\s+"req-1"\s+/);
  assert.match(lines[2], new RegExp(`\\s+reconnect\\s+replay\\s+\\d+\\s+"req-3"\\s+${other.sessionId ?? '-'}$`));
});

test('a new id after harness_within is the model re-issuing the call', async (t) => {
  const { gw } = await setup(t, { duplicates: { harness_within: '1ms', model_within: '1h' } });
  const s = await rawSession(t, gw.url);
  const args = { order_id: 'ord-model', amount_cents: 4 };
  await s.call('issue_refund', args, { id: 1 });
  await s.call('issue_refund', args, { id: 2 });
  await waitForLog(gw, /"rpc_id":2.*"duplicate_source":"model"/);
  assert.equal((await counts(gw)).model, 1);
});

test('a new id while the first call still runs is the harness, whatever the gap; another clientInfo is a reconnect', async (t) => {
  // no gap counts as a harness's: only the facts the rules add decide
  const { upstream, gw } = await setup(t, { duplicates: { harness_within: '1ms', model_within: '1h' } });
  const s = await rawSession(t, gw.url);
  const args = { order_id: 'ord-running', amount_cents: 2, delay_ms: 3000 };
  const first = s.call('slow_refund', args, { id: 'run-1' });
  await waitForLedger(upstream.ledger, 1);
  const dup = await s.call('slow_refund', args, { id: 'run-2' });
  assert.equal(idemStatus(dup.message?.result)?.code, 'in_progress', dup.body);
  await waitForLog(gw, /"rpc_id":"run-2".*"duplicate_source"/);
  assert.equal(lineOf(gw, 'run-2').duplicate_source, 'harness', 'no answer yet that a model could have read');
  assert.equal(lineOf(gw, 'run-2').first_state, 'in_progress');
  await first;

  // 2026-07-28 requests name their client in params._meta
  const meta = (name) => ({ 'io.modelcontextprotocol/clientInfo': { name, version: '1.0.0' } });
  const refund = { order_id: 'ord-client', amount_cents: 3 };
  const a = await s.request('tools/call', { name: 'issue_refund', arguments: refund, _meta: meta('agent-a') }, { id: 'ci-1' });
  assert.match(toolText(a.message?.result), /ord-client/, a.body);
  const b = await s.request('tools/call', { name: 'issue_refund', arguments: refund, _meta: meta('agent-b') }, { id: 'ci-2' });
  assert.ok(replayMarker(b.message?.result), b.body);
  await waitForLog(gw, /"rpc_id":"ci-2".*"duplicate_source"/);
  assert.equal(lineOf(gw, 'ci-2').duplicate_source, 'reconnect', 'another client re-sent it');
  assert.equal((await readLedger(upstream.ledger)).length, 2, 'each call ran once');
});

// A proxy between the agent and the gateway that loses the first answer to a tools/call (its
// connection to the gateway breaks as the answer begins) and sends the same request again on
// a new connection, as proxies and HTTP libraries do on a reset: the agent sees one answer.
async function retryingProxy(t, target) {
  const to = new URL(target);
  let retried = 0;
  const send = (req, body) => new Promise((resolve, reject) => {
    const out = http.request({
      host: to.hostname, port: to.port, path: req.url, method: req.method, agent: false,
      headers: { ...req.headers, host: to.host, 'x-forwarded-for': req.socket.remoteAddress },
    }, resolve);
    out.on('error', reject);
    out.end(body);
  });
  const server = http.createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = Buffer.concat(chunks);
    let up = await send(req, body);
    if (retried === 0 && /"method":"tools\/call"/.test(body.toString())) {
      retried++;
      // the answer is lost on its way back (read whole first: a stream's head comes before the
      // result, and a re-send while the call still runs is rightly told "in progress")
      for await (const chunk of up) void chunk;
      up.socket?.destroy();
      up = await send(req, body); // and the proxy tries again
    }
    res.writeHead(up.statusCode, up.headers);
    up.pipe(res);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.after(() => { server.closeAllConnections(); server.close(); });
  return { url: `http://127.0.0.1:${server.address().port}${to.pathname}`, retried: () => retried };
}

test('a proxy hop that re-sends a request after losing its answer: transport, one execution', async (t) => {
  const { upstream, gw } = await setup(t);
  const proxy = await retryingProxy(t, gw.url);
  const s = await rawSession(t, proxy.url);
  const args = { order_id: 'ord-hop', amount_cents: 6 };
  const r = await s.call('issue_refund', args, { id: 'hop-1' });
  assert.equal(proxy.retried(), 1, 'the proxy re-sent the call');
  assert.ok(replayMarker(r.message.result), `the agent got the first call's answer, replayed: ${r.body}`);
  assert.match(toolText(r.message.result), /^Refunded 6 cents on order ord-hop/);
  assert.equal((await readLedger(upstream.ledger)).length, 1, 'one refund');
  await waitForLog(gw, /"rpc_id":"hop-1".*"duplicate_source"/);
  assert.equal(lineOf(gw, 'hop-1').duplicate_source, 'transport');
  const row = await rowWith(gw, 'issue_refund', args, 1);
  assert.deepEqual(row.history.map((h) => [h.source, h.answered, h.jsonrpc_id]), [['transport', 'replay', '"hop-1"']]);
  assert.deepEqual(await counts(gw), { reconnect: 0, transport: 1, harness: 0, model: 0, late: 0 });
});

test('/metrics: request and upstream duration histograms, by outcome', async (t) => {
  const { gw } = await setup(t);
  const s = await rawSession(t, gw.url);
  const args = { order_id: 'ord-hist', amount_cents: 5 };
  await s.call('issue_refund', args, { id: 'h1' });
  await s.call('issue_refund', args, { id: 'h2' });
  await waitForLog(gw, /"rpc_id":"h2".*"outcome":"replay"/);
  const text = await (await fetch(`${gw.adminUrl}/metrics`)).text();
  const value = (series) => {
    const line = text.split('\n').find((l) => l.startsWith(`${series} `));
    assert.ok(line, `${series} in /metrics`);
    return Number(line.split(' ')[1]);
  };
  assert.match(text, /# TYPE idemgw_request_duration_seconds histogram/);
  assert.equal(value('idemgw_request_duration_seconds_count{outcome="executed"}'), 1);
  assert.equal(value('idemgw_request_duration_seconds_count{outcome="replay"}'), 1);
  assert.equal(value('idemgw_request_duration_seconds_bucket{outcome="replay",le="+Inf"}'), 1);
  // buckets are cumulative
  const buckets = [...text.matchAll(/^idemgw_request_duration_seconds_bucket\{outcome="forwarded",le="[^"]+"\} (\d+)$/gm)].map((m) => Number(m[1]));
  assert.equal(buckets.length, 12);
  for (let i = 1; i < buckets.length; i++) assert.ok(buckets[i] >= buckets[i - 1]);
  assert.ok(value('idemgw_upstream_duration_seconds_count') >= 3, 'initialize, initialized and the executed call went up');
  assert.ok(value('idemgw_upstream_duration_seconds_sum') >= 0);
});

/** `idemgw report ARGS...` with the gateway's config: {code, stdout, stderr}. */
function report(gw, ...args) {
  return run(IDEMGW_BIN, ['report', '-c', gw.configPath, ...args]);
}

test('in-progress and unknown answers are kept too; idemgw report adds every answer up per tool', async (t) => {
  // a stream silent for 1 s is cut: the call's outcome is unknown
  // every new id within the hour is the harness's: the sources do not depend on the machine's speed
  const { upstream, gw } = await setup(t, {
    duplicates: { harness_within: '1h', model_within: '2h' },
    timeouts: { upstream_idle: '1s' },
    tools: { slow_refund: { class: 'non_idempotent' }, issue_refund: { class: 'non_idempotent' } },
  });
  const s = await rawSession(t, gw.url);

  // in progress: a duplicate while the first call runs (in_progress: reject, the default)
  const slow = { order_id: 'ord-running', amount_cents: 6, delay_ms: 600 };
  const first = s.call('slow_refund', slow, { id: 'run-1' });
  await waitForLedger(upstream.ledger, 1);
  const running = await s.call('slow_refund', slow, { id: 'run-2' });
  assert.equal(idemStatus(running.message.result).code, 'in_progress');
  await waitForLog(gw, /"rpc_id":"run-2".*"duplicate_source"/);
  assert.equal(lineOf(gw, 'run-2').first_state, 'in_progress', 'the first call was still running');
  assert.equal(replayMarker((await first).message.result), undefined);

  // unknown: the first call's stream is cut; the retry is told, and not run
  const cut = { order_id: 'ord-cut', amount_cents: 7, delay_ms: 4000 };
  const cutAnswer = (await s.call('slow_refund', cut, { id: 'cut-1' })).message;
  assert.equal(idemStatus(cutAnswer?.result)?.code, 'outcome_unknown', 'the cut call is told its outcome is unknown');
  const held = await s.call('slow_refund', cut, { id: 'cut-2' });
  assert.equal(idemStatus(held.message.result).code, 'outcome_unknown');

  // replays: three of one call, none of another
  const refund = { order_id: 'ord-report', amount_cents: 8 };
  await s.call('issue_refund', refund, { id: 'ref-1' });
  for (const id of ['ref-1', 'ref-2', 'ref-3']) assert.ok(replayMarker((await s.call('issue_refund', refund, { id })).message.result));
  await s.call('issue_refund', { order_id: 'ord-once', amount_cents: 9 }, { id: 'once' });
  assert.equal((await readLedger(upstream.ledger)).length, 4);

  const running2 = await rowWith(gw, 'slow_refund', slow, 1);
  assert.deepEqual(running2.history.map((h) => [h.answered, h.source, h.jsonrpc_id]), [['in_progress', 'harness', '"run-2"']]);
  assert.equal(running2.attempts, 1, 'an in-progress answer is not an attempt');
  const cut2 = await rowWith(gw, 'slow_refund', cut, 1);
  assert.equal(cut2.state, 'unknown');
  assert.deepEqual(cut2.history.map((h) => [h.answered, h.jsonrpc_id]), [['unknown', '"cut-2"']]);
  const refund2 = await rowWith(gw, 'issue_refund', refund, 3);
  assert.deepEqual(refund2.history.map((h) => h.source), ['transport', 'harness', 'harness']);

  // --json: per tool, and the keys with the most calls as `idemgw key --hash` prints them
  const r = await report(gw, '--since', '1h', '--json');
  assert.equal(r.code, 0, r.stderr);
  const rep = JSON.parse(r.stdout);
  assert.equal(rep.since, '1h');
  assert.equal(rep.since_ms, 3600000);
  assert.ok(!Number.isNaN(Date.parse(rep.now)));
  const byTool = Object.fromEntries(rep.tools.map((x) => [x.tool, x]));
  assert.deepEqual(Object.keys(byTool), ['issue_refund', 'slow_refund']);
  assert.deepEqual(byTool.issue_refund, {
    tool: 'issue_refund', keys: 2, calls: 5, runs: 2, replay: 3, in_progress: 0, unknown: 0, duplicates: 3,
    duplicates_by_source: { reconnect: 0, transport: 1, harness: 2, model: 0, late: 0 },
    states: { in_progress: 0, succeeded: 2, failed: 0, unknown: 0 },
  });
  assert.deepEqual(byTool.slow_refund, {
    tool: 'slow_refund', keys: 2, calls: 4, runs: 2, replay: 0, in_progress: 1, unknown: 1, duplicates: 2,
    duplicates_by_source: { reconnect: 0, transport: 0, harness: 2, model: 0, late: 0 },
    states: { in_progress: 0, succeeded: 1, failed: 0, unknown: 1 },
  });
  const hashOf = async (tool, args) => {
    const k = await idemgwKey(['-c', gw.configPath, '--subject', 'tenant', '--tool', tool, '--args', JSON.stringify(args), '--hash']);
    return k.stdout.trim().split('\n')[1];
  };
  assert.deepEqual(rep.top_keys[0], {
    key_hash: await hashOf('issue_refund', refund), tool: 'issue_refund', calls: 4, attempts: 4, duplicates: 3,
    state: 'succeeded', first_seen: refund2.created_at,
  });
  assert.equal(rep.top_keys.length, 4);
  assert.deepEqual(rep.top_keys.map((k) => k.calls), [4, 2, 2, 1]);
  assert.ok(!rep.top_keys.some((k) => 'key' in k), 'keys carry the subject: only their hashes are printed');

  // the table: one line per tool, the keys by hash
  const table = await report(gw, '--top', '2');
  assert.equal(table.code, 0, table.stderr);
  assert.match(table.stdout, /rows updated in the last 24h/);
  assert.match(table.stdout, /^TOOL\s+KEYS\s+CALLS\s+RUNS\s+REPLAYS\s+IN_PROGRESS\s+UNKNOWN\s+RECONNECT\s+TRANSPORT\s+HARNESS\s+MODEL\s+LATE$/m);
  assert.match(table.stdout, /^issue_refund\s+2\s+5\s+2\s+3\s+0\s+0\s+0\s+1\s+2\s+0\s+0$/m);
  assert.match(table.stdout, /^slow_refund\s+2\s+4\s+2\s+0\s+1\s+1\s+0\s+0\s+2\s+0\s+0$/m);
  assert.match(table.stdout, /^total\s+4\s+9\s+4\s+3\s+1\s+1\s+0\s+1\s+4\s+0\s+0$/m);
  assert.match(table.stdout, /the 2 keys with the most calls/);
  assert.match(table.stdout, new RegExp(`^${await hashOf('issue_refund', refund)}\\s+issue_refund\\s+4\\s+4\\s+3\\s+succeeded\\s`, 'm'));
});

test('idemgw report refuses bad input and an unreachable store with exit 2', async (t) => {
  const { gw } = await setup(t);
  for (const [args, why] of [
    [['--since', 'yesterday'], /--since 'yesterday' is not a duration/],
    [['--since', '0'], /--since must be more than zero/],
    [['--bogus'], /unexpected argument '--bogus'/],
  ]) {
    const r = await report(gw, ...args);
    assert.equal(r.code, 2, `${args}: ${r.stdout}`);
    assert.equal(r.stdout, '');
    assert.match(r.stderr, why);
  }
  const none = await run(IDEMGW_BIN, ['report'], { env: { ...process.env, IDEMGW_DATABASE_URL: 'none' } });
  assert.equal(none.code, 2);
  assert.match(none.stderr, /idemgw report: no database: database_url is none/);
  // a Postgres that does not answer: refused after store.timeout, not hung
  const port = await freePort();
  const down = await run(IDEMGW_BIN, ['report'], {
    env: { ...process.env, IDEMGW_DATABASE_URL: `postgresql://postgres@127.0.0.1:${port}/none?connect_timeout=1` },
  });
  assert.equal(down.code, 2);
  assert.equal(down.stdout, '');
  assert.match(down.stderr, /idemgw report: Postgres is not reachable/);
  // an empty window is a report, not an error
  const empty = await report(gw, '--since', '1h', '--json');
  assert.equal(empty.code, 0, empty.stderr);
  assert.deepEqual(JSON.parse(empty.stdout).tools, []);
});
