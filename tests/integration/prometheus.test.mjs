// /metrics as Prometheus sees it: promtool lints it and the alert rules, a real Prometheus
// (Debian's) scrapes a gateway and a PromQL query over its HTTP API returns the duplicates by
// source, and every query of the Grafana dashboard names a series the gateway exports.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import path from 'node:path';
import {
  REPO, createDatabase, freePort, mcpClient, postgresOnly, rawSession, replayMarker, run, startGateway, startProcess, startRefundServer, tempDir,
  waitFor, waitForLedger, waitForLog,
} from './lib/harness.mjs';

/** /metrics as a map: 'name{labels}' (or 'name') to its value. */
async function scrape(gw) {
  const text = await (await fetch(`${gw.adminUrl}/metrics`)).text();
  const out = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    out.set(line.slice(0, i), Number(line.slice(i + 1)));
  }
  return out;
}

async function gateway(t) {
  const upstream = await startRefundServer(t);
  return startGateway(t, { upstream: upstream.url, databaseUrl: await createDatabase(), config: { subject: { static: 'p' } } });
}

test('promtool passes /metrics and the alert rules', async (t) => {
  const gw = await gateway(t);
  const metrics = await (await fetch(`${gw.adminUrl}/metrics`)).text();
  const dir = await tempDir(t, 'idemgw-prom-');
  await fs.writeFile(path.join(dir, 'metrics.txt'), metrics);
  const lint = await run('sh', ['-c', `promtool check metrics < ${path.join(dir, 'metrics.txt')}`]);
  assert.equal(lint.code, 0, `${lint.stdout}${lint.stderr}`);
  const rules = await run('promtool', ['check', 'rules', path.join(REPO, 'conf/prometheus-alerts.yml')]);
  assert.equal(rules.code, 0, rules.stdout + rules.stderr);
  assert.match(rules.stdout, /SUCCESS: 8 rules found/);

  // The dashboard's queries use series the gateway exports.
  const dash = JSON.parse(await fs.readFile(path.join(REPO, 'conf/grafana-dashboard.json'), 'utf8'));
  const exprs = dash.panels.flatMap((p) => p.targets.map((x) => x.expr));
  assert.ok(exprs.length >= 6);
  for (const e of exprs) {
    for (const name of e.match(/idemgw_[a-z_]+/g)) {
      const base = name.replace(/_(bucket|count|sum)$/, '');
      assert.match(metrics, new RegExp(`^# TYPE ${base} `, 'm'), `${name} (in "${e}") is exported`);
    }
  }
});

test('a real Prometheus scrapes the gateway: PromQL counts the duplicates by source', async (t) => {
  const gw = await gateway(t);
  // A tool is counted under its own name once the policy or the server's tools/list names it.
  // The gateway reads the tools/list itself at start, and /readyz does not wait for it: calls
  // made before it came back would be counted under tool="_other".
  await waitForLog(gw, /tool catalogue: \d+ tools listed by the upstream/);
  const dir = await tempDir(t, 'idemgw-prom-');
  const port = await freePort();
  await fs.writeFile(path.join(dir, 'prometheus.yml'),
    `global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: idemgw\n    static_configs:\n      - targets: ["127.0.0.1:${gw.adminPort}"]\n`);
  await startProcess(t, 'prometheus', [`--config.file=${path.join(dir, 'prometheus.yml')}`, `--storage.tsdb.path=${path.join(dir, 'data')}`,
    `--web.listen-address=127.0.0.1:${port}`], { readyUrl: `http://127.0.0.1:${port}/-/ready`, name: 'prometheus' });

  const s = await rawSession(t, gw.url);
  const args = { order_id: 'ord-prom', amount_cents: 2 };
  await s.call('issue_refund', args, { id: 'p1' });
  await s.call('issue_refund', args, { id: 'p1' }); // transport
  await s.call('issue_refund', args, { id: 'p2' }); // harness
  await waitForLog(gw, /"rpc_id":"p2".*"duplicate_source":"harness"/);

  // An instant query evaluated at `time` (default: now), as a map from source to value.
  const query = async (q, time) => {
    const params = new URLSearchParams({ query: q, ...(time ? { time } : {}) });
    const res = await fetch(`http://127.0.0.1:${port}/api/v1/query?${params}`);
    const body = await res.json();
    assert.equal(body.status, 'success', JSON.stringify(body));
    return Object.fromEntries(body.data.result.map((r) => [r.metric.source ?? '', Number(r.value[1])]));
  };
  // Every query is evaluated at the time of one scrape, the latest when asked (`up` is written
  // by every scrape, failed ones too): all three then read that one scrape. At "now" each would
  // read whatever scrape was latest when it ran; a scrape that failed in between (its timeout
  // is the 1 s interval, which a slow sanitizer build under load can miss) marks every series
  // stale, and a query after it finds none. The first scrape comes some 5 s after Prometheus
  // starts (it applies its targets on a 5 s tick); the bound is generous.
  const latestScrape = async () => Object.values(await query('timestamp(up{job="idemgw"})'))[0];
  let last;
  const { at, got } = await waitFor(async () => {
    const at = await latestScrape();
    if (at === undefined) return null; // not scraped yet
    last = await query('sum by (source) (idemgw_duplicates_total{job="idemgw"})', String(at));
    return last.transport === 1 && last.harness === 1 ? { at, got: last } : null;
  }, { timeoutMs: 60000, what: () => `a scrape with both duplicates (the last read: ${JSON.stringify(last)})` });
  assert.deepEqual(got, { transport: 1, harness: 1 }, 'no other source had any');
  const byTool = await query('sum by (source) (idemgw_duplicates_total{tool="issue_refund"})', String(at));
  assert.deepEqual(byTool, { transport: 1, harness: 1 }, 'counted under the tool\'s name');
  // counted in the same callback as the duplicate, so in the same scrape
  const replays = await query('idemgw_request_duration_seconds_count{outcome="replay"}', String(at));
  assert.deepEqual(replays, { '': 2 });
});

test('upstream connections: relayed reads and protected calls reuse kept-alive ones, answers keep the caller\'s ids', async (t) => {
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { subject: { static: 'p' }, tools: { get_ledger: { class: 'read' }, issue_refund: { class: 'non_idempotent' } } },
  });
  const client = await mcpClient(t, gw.url);
  const opened = async () => (await scrape(gw)).get('idemgw_upstream_connections_total');
  const start = await opened();
  for (let i = 0; i < 40; i++) await client.callTool({ name: 'get_ledger', arguments: {} });
  const afterReads = await opened();
  assert.ok(afterReads - start <= 2, `40 reads opened ${afterReads - start} upstream connections`);
  for (let i = 0; i < 5; i++) await client.callTool({ name: 'issue_refund', arguments: { order_id: `conn-${i}`, amount_cents: 1 } });
  // a protected call goes up with an id of the gateway's own, so it may ride a kept-alive
  // connection: an answer left there by an earlier request would carry another id
  const afterCalls = await opened();
  assert.ok(afterCalls - afterReads <= 2, `5 protected calls opened ${afterCalls - afterReads} upstream connections`);
  assert.equal((await waitForLedger(upstream.ledger, 5)).length, 5, 'each ran once');
  const s = await rawSession(t, gw.url);
  for (const id of [1, 'one', 7.5, 'idemgw-x']) {
    const r = await s.call('issue_refund', { order_id: `conn-id-${id}`, amount_cents: 1 }, { id });
    assert.deepEqual(r.message.id, id, 'the answer carries the caller\'s id');
    assert.ok(r.message.result, JSON.stringify(r.message));
  }
  assert.ok((await opened()) - afterCalls <= 2);
});

test('the store, cache and in-flight series move with the calls', async (t) => {
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { subject: { static: 'p' }, store: { sweep_interval: '1s' }, tools: { slow_refund: { class: 'non_idempotent' } } },
  });
  const op = (m, name) => m.get(`idemgw_store_operation_duration_seconds_count{op="${name}"}`);
  const before = await waitFor(async () => {
    const m = await scrape(gw);
    return m.get('idemgw_store_connections') > 0 ? m : null;
  }, { what: 'the store pool gauges to be published' });
  assert.equal(before.get('idemgw_store_up'), 1);
  assert.ok(before.get('idemgw_store_connections_wanted') >= before.get('idemgw_store_connections'));
  assert.equal(before.get('idemgw_unknown_keys'), 0, 'counted in the store at the scrape');
  assert.ok(op(before, 'count_unknown') >= 1, 'the count is a timed store operation too');

  const s = await rawSession(t, gw.url);
  const args = { order_id: 'ord-metrics', amount_cents: 3 };
  await s.call('issue_refund', args, { id: 'm1' });
  const afterFirst = await scrape(gw);
  assert.equal(op(afterFirst, 'claim'), op(before, 'claim') + 1, 'one claim per protected call');
  assert.equal(op(afterFirst, 'finish'), op(before, 'finish') + 1);
  assert.equal(afterFirst.get('idemgw_replay_cache_lookups_total{result="miss"}'),
    before.get('idemgw_replay_cache_lookups_total{result="miss"}') + 1);
  const hits = afterFirst.get('idemgw_replay_cache_lookups_total{result="hit"}');
  const r = await s.call('issue_refund', args, { id: 'm2' });
  assert.ok(replayMarker(r.message.result), 'a replay');
  const afterReplay = await scrape(gw);
  assert.equal(afterReplay.get('idemgw_replay_cache_lookups_total{result="hit"}'), hits + 1, 'answered from the cache');
  assert.equal(op(afterReplay, 'claim'), op(afterFirst, 'claim'), 'a cached replay claims nothing');
  assert.equal(afterReplay.get('idemgw_protected_calls_in_flight'), 0);
  // the statements the store sends on its own are timed too: the replay's duplicate, written
  // in the next batch, and the sweeper's runs
  await waitFor(async () => {
    const m = await scrape(gw);
    return op(m, 'dup') > op(afterFirst, 'dup') && op(m, 'sweep') > 0;
  }, { what: 'the duplicates\' write and a sweep to be timed' });

  // A call the upstream holds: in flight until the upstream dies mid-answer, then held unknown.
  const stuck = s.call('slow_refund', { order_id: 'ord-stuck', amount_cents: 4, delay_ms: 600000 }, { id: 'm3' }).catch(() => null);
  await waitFor(async () => (await scrape(gw)).get('idemgw_protected_calls_in_flight') === 1, { what: 'the stuck call to be in flight' });
  await waitForLedger(upstream.ledger, 2);
  upstream.proc.kill('SIGKILL');
  await stuck;
  const end = await waitFor(async () => {
    const m = await scrape(gw);
    return m.get('idemgw_unknown_keys') === 1 ? m : null;
  }, { what: 'the unknown outcome to be counted' });
  assert.equal(end.get('idemgw_protected_calls_in_flight'), 0, 'no longer in flight');
  assert.equal(op(end, 'finish'), op(afterReplay, 'finish') + 1, 'the unknown outcome was a finish');
});

test('two workers: one endpoint adds up both pools and both workers\' calls', postgresOnly('the embedded store takes one process'), async (t) => {
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { workers: 2, store: { pool: 3 }, subject: { static: 'p' } },
  });
  const m = await waitFor(async () => {
    const x = await scrape(gw);
    return x.get('idemgw_store_connections') === 6 ? x : null;
  }, { what: 'both workers\' pools to be up and published' });
  assert.equal(m.get('idemgw_store_connections_wanted'), 6, 'store.pool connections per worker, added up');
  assert.equal(m.get('idemgw_store_batch_slots'), 2, 'group commit: one statement of each kind in flight per worker, Postgres beside it');
  assert.equal(m.get('idemgw_store_up'), 1);
  assert.equal(m.get('idemgw_unknown_keys'), 0, 'the whole store, counted once');
});
