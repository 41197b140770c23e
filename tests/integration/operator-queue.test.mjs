// The operator's queue (docs/operator-queue.md): keys whose outcome is unknown, listed on the
// admin API, resolved by a person (succeeded with their result, failed, forgotten), and what
// retries then get, on Postgres and on the embedded store, through one upstream and through
// servers:. A key becomes unknown the way it does in production: the upstream takes the call
// and does not answer within timeouts.upstream.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import path from 'node:path';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import {
  IDEMGW_BIN, REPO, TEST_STORE, createDatabase, idemStatus, mcpClient, readLedger, replayMarker, run, startGateway,
  startRefundServer, startV2Server, tempDir, toolText, waitFor, waitForLedger,
} from './lib/harness.mjs';
import { headlessPage } from './lib/cdp.mjs';

const TOKEN = 'q-secret-4711';

async function tokenFile(t) {
  const dir = await tempDir(t, 'idemgw-tokens-');
  const file = path.join(dir, 'admin-tokens');
  await fs.writeFile(file, `# operators\nalice:${TOKEN}\n`);
  return file;
}

/** An admin API call: {status, body}. token: the bearer (null: none). */
async function admin(gw, method, p, { token = TOKEN, body } = {}) {
  const res = await fetch(`${gw.adminUrl}${p}`, {
    method,
    headers: { ...(token ? { Authorization: `Bearer ${token}` } : {}), ...(body ? { 'Content-Type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* the page */ }
  return { status: res.status, body: json, text, headers: res.headers };
}

const ledgerOf = async (file, order) => (await readLedger(file)).filter((l) => l.order_id === order);

/** The upstream takes the call and does not answer in time: the key becomes unknown. */
async function loseCall(client, order) {
  await assert.rejects(client.callTool({ name: 'slow_refund', arguments: { order_id: order, amount_cents: 7, delay_ms: 9000 } }));
}

// tests/run-all.sh runs this file on Postgres, then again on the embedded store
test(`${TEST_STORE}: the queue lists unknown keys; operators resolve them; retries follow in both eras`, async (t) => {
  const databaseUrl = await createDatabase();
  const upstream = await startV2Server(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl,
    config: {
      subject: { static: 'ops' },
      admin_token_file: await tokenFile(t),
      timeouts: { upstream: '3s' },
      // delay_ms is left out of the key: a retry is the same call, answered at once
      tools: { get_ledger: { class: 'read' }, slow_refund: { in_progress: 'reject', exclude_args: ['delay_ms'] } },
    },
  });

  // every endpoint wants the token
  for (const [method, p] of [['GET', '/admin/v1/keys'], ['GET', '/admin/v1/keys/abcdef12'], ['POST', '/admin/v1/keys/abcdef12/resolve']]) {
    assert.equal((await admin(gw, method, p, { token: null })).status, 401, `${method} ${p} without a token`);
    const wrong = await admin(gw, method, p, { token: 'q-secret-4712' });
    assert.equal(wrong.status, 401, `${method} ${p} with a wrong token`);
    assert.match(wrong.headers.get('www-authenticate') ?? '', /^Bearer/);
  }
  // the agent listener never serves them
  const agentSide = await fetch(`http://127.0.0.1:${gw.port}/admin/v1/keys`, { headers: { Authorization: `Bearer ${TOKEN}` } });
  const agentBody = await agentSide.text();
  assert.notEqual(agentSide.status, 200, agentBody);
  assert.doesNotMatch(agentBody, /"keys"/);

  const sdk1 = await mcpClient(t, gw.url);
  const v2 = new Client({ name: 'idemgw-v2-pinned', version: '1.0.0' }, { versionNegotiation: { mode: { pin: '2026-07-28' } } });
  await v2.connect(new StreamableHTTPClientTransport(new URL(gw.url)));
  t.after(() => v2.close().catch(() => {}));

  // a succeeded key cannot be resolved: 409 with its state
  assert.match(toolText(await sdk1.callTool({ name: 'issue_refund', arguments: { order_id: 'ok-1', amount_cents: 1 } })), /^Refunded/);
  const done = await waitFor(async () => (await admin(gw, 'GET', '/admin/v1/keys?state=succeeded')).body.keys[0] ?? null, { what: 'the succeeded key' });
  const conflict = await admin(gw, 'POST', `/admin/v1/keys/${done.key_hash}/resolve`, { body: { outcome: 'failed', note: 'no' } });
  assert.equal(conflict.status, 409, conflict.text);
  assert.equal(conflict.body.state, 'succeeded');

  // three calls lost: each key shows up in the list as unknown, and in the gauge
  const orders = ['lost-a', 'lost-b', 'lost-c'];
  const hashes = {};
  for (const order of orders) {
    await loseCall(sdk1, order);
    const before = new Set(Object.values(hashes));
    const k = await waitFor(async () => {
      const r = await admin(gw, 'GET', '/admin/v1/keys?state=unknown&tool=slow_refund');
      return r.body.keys.find((e) => !before.has(e.key_hash)) ?? null;
    }, { timeoutMs: 1000, what: `${order} listed within a second` });
    assert.equal(k.tool, 'slow_refund');
    assert.equal(k.server, null);
    assert.equal(k.subject, 'ops');
    assert.match(k.key_hash, /^[0-9a-f]{64}$/);
    hashes[order] = k.key_hash;
  }
  const metrics = await (await fetch(`${gw.adminUrl}/metrics`)).text();
  assert.match(metrics, /^idemgw_operator_queue_keys\{server="",tool="slow_refund"\} 3$/m);
  assert.match(metrics, /^idemgw_operator_queue_oldest_seconds \d/m);

  // newest first, a page at a time
  const page1 = await admin(gw, 'GET', '/admin/v1/keys?state=unknown&limit=2');
  assert.deepEqual(page1.body.keys.map((k) => k.key_hash), [hashes['lost-c'], hashes['lost-b']]);
  const page2 = await admin(gw, 'GET', `/admin/v1/keys?state=unknown&limit=2&cursor=${encodeURIComponent(page1.body.next)}`);
  assert.deepEqual(page2.body.keys.map((k) => k.key_hash), [hashes['lost-a']]);
  assert.equal(page2.body.next, null);
  assert.equal((await admin(gw, 'GET', '/admin/v1/keys?state=bogus')).status, 400);

  // one key's record, by a unique prefix
  const shown = await admin(gw, 'GET', `/admin/v1/keys/${hashes['lost-a'].slice(0, 12)}`);
  assert.equal(shown.status, 200, shown.text);
  assert.equal(shown.body.key_hash, hashes['lost-a']);
  assert.equal(shown.body.state, 'unknown');
  assert.deepEqual(shown.body.actions, []);
  assert.equal((await admin(gw, 'GET', '/admin/v1/keys/0000000000000000')).status, 404);

  // lost-a ran downstream: the operator supplies its result; retries replay it, marked, in both eras
  const result = { content: [{ type: 'text', text: 'Refunded 7 cents on order lost-a (confirmed by hand)' }] };
  const resolved = await admin(gw, 'POST', `/admin/v1/keys/${hashes['lost-a'].slice(0, 10)}/resolve`, { body: { outcome: 'succeeded', result, note: 'ledger checked' } });
  assert.equal(resolved.status, 200, resolved.text);
  assert.equal(resolved.body.by, 'alice');
  assert.equal(resolved.body.previous_state, 'unknown');
  const again = await admin(gw, 'POST', `/admin/v1/keys/${hashes['lost-a']}/resolve`, { body: { outcome: 'failed' } });
  assert.equal(again.status, 409, 'a resolved key is not resolved twice');
  const lostA = { order_id: 'lost-a', amount_cents: 7, delay_ms: 0 };
  for (const client of [sdk1, v2]) {
    const r = await client.callTool({ name: 'slow_refund', arguments: lostA });
    assert.equal(toolText(r), result.content[0].text, JSON.stringify(r));
    assert.ok(replayMarker(r), 'a replay');
    assert.equal(r._meta['idemgw/operator'].by, 'alice');
    assert.equal(r._meta['idemgw/operator'].note, 'ledger checked');
  }
  assert.equal((await ledgerOf(upstream.ledger, 'lost-a')).length, 1, 'lost-a never ran again');

  // lost-b never ran: resolved as failed, the next retry runs exactly once
  assert.equal((await admin(gw, 'POST', `/admin/v1/keys/${hashes['lost-b']}/resolve`, { body: { outcome: 'failed', note: 'not in the ledger' } })).status, 200);
  const lostB = { order_id: 'lost-b', amount_cents: 7, delay_ms: 0 };
  const retry = await sdk1.callTool({ name: 'slow_refund', arguments: lostB });
  assert.match(toolText(retry), /^Refunded 7 cents on order lost-b/, JSON.stringify(retry));
  assert.equal(replayMarker(retry), undefined, 'the retry ran');
  const twice = await v2.callTool({ name: 'slow_refund', arguments: lostB });
  assert.ok(replayMarker(twice), 'the next retry replays the run');
  assert.equal(twice._meta['idemgw/operator'], undefined, 'a result the upstream gave is not marked as an operator\'s');
  assert.equal((await ledgerOf(upstream.ledger, 'lost-b')).length, 2, 'the first call, then the retry: once more, not twice');

  // lost-c through the command line: forget
  const cli = await run(IDEMGW_BIN, ['keys', 'list', '--state', 'unknown', '--json', '--database-url', databaseUrl]);
  assert.equal(cli.code, 0, cli.stderr);
  assert.ok(JSON.parse(cli.stdout).keys.some((k) => k.key_hash === hashes['lost-c']), cli.stdout);
  const forget = await run(IDEMGW_BIN, ['keys', 'resolve', hashes['lost-c'].slice(0, 8), '--forget', '--note', 'duplicate order', '--by', 'bob', '--database-url', databaseUrl]);
  assert.equal(forget.code, 0, forget.stderr);
  assert.equal(JSON.parse(forget.stdout).outcome, 'forget');
  assert.equal((await admin(gw, 'GET', `/admin/v1/keys/${hashes['lost-c']}`)).status, 404, 'a forgotten key is gone');

  // the actions are kept with who, when and the note
  const a = await admin(gw, 'GET', `/admin/v1/keys/${hashes['lost-a']}`);
  assert.equal(a.body.state, 'succeeded');
  assert.equal(a.body.actions.length, 1);
  assert.equal(a.body.actions[0].by, 'alice');
  assert.equal(a.body.actions[0].note, 'ledger checked');
  assert.equal(a.body.actions[0].outcome, 'succeeded');
  assert.ok(Date.parse(a.body.actions[0].at) > 0);
  const m2 = await (await fetch(`${gw.adminUrl}/metrics`)).text();
  assert.match(m2, /^idemgw_operator_resolutions_total\{outcome="succeeded"\} 1$/m);
  assert.match(m2, /^idemgw_operator_resolutions_total\{outcome="failed"\} 1$/m);
  assert.match(m2, /^idemgw_operator_resolutions_total\{outcome="forget"\} 1$/m);
  assert.match(m2, /^idemgw_operator_resolution_seconds_count 3$/m);
  assert.doesNotMatch(m2, /^idemgw_operator_queue_keys\{/m, 'no key waits any more');

  // the page is served, with no outside assets
  const pageRes = await admin(gw, 'GET', '/admin/', { token: null });
  assert.equal(pageRes.status, 200);
  assert.match(pageRes.headers.get('content-type'), /^text\/html/);
  assert.doesNotMatch(pageRes.text, /<script[^>]+src=|<link[^>]+href=/);
});

test('without admin_token_file the operator API answers 403 and names the setting', async (t) => {
  const upstream = await startRefundServer(t, { jsonResponse: true });
  const gw = await startGateway(t, { upstream: upstream.url, databaseUrl: await createDatabase(), config: { subject: { static: 'ops' } } });
  for (const [method, p] of [['GET', '/admin/v1/keys'], ['GET', '/admin/v1/keys/abcdef12'], ['POST', '/admin/v1/keys/abcdef12/resolve']]) {
    const r = await admin(gw, method, p);
    assert.equal(r.status, 403, `${method} ${p}`);
    assert.match(r.body.message, /admin_token_file/);
  }
});

test('servers: keys per server; the list filters by server', async (t) => {
  const billing = await startRefundServer(t, { jsonResponse: true });
  const payments = await startRefundServer(t, { jsonResponse: true });
  const gw = await startGateway(t, {
    databaseUrl: await createDatabase(),
    config: {
      subject: { static: 'ops' },
      admin_token_file: await tokenFile(t),
      timeouts: { upstream: '2s' },
      tools: { slow_refund: { class: 'non_idempotent' } },
      servers: {
        billing: { path: '/billing/mcp', upstream: billing.url },
        payments: { path: '/payments/mcp', upstream: payments.url },
      },
    },
  });
  for (const name of ['billing', 'payments']) {
    const c = await mcpClient(t, `http://127.0.0.1:${gw.port}/${name}/mcp`);
    await loseCall(c, `srv-${name}`);
  }
  const both = await waitFor(async () => {
    const r = await admin(gw, 'GET', '/admin/v1/keys?state=unknown');
    return r.body.keys.length === 2 ? r.body.keys : null;
  }, { timeoutMs: 5000, what: 'both servers\' keys' });
  assert.deepEqual(both.map((k) => k.server).sort(), ['billing', 'payments']);
  const one = await admin(gw, 'GET', '/admin/v1/keys?state=unknown&server=billing');
  assert.deepEqual(one.body.keys.map((k) => [k.server, k.tool]), [['billing', 'slow_refund']]);
  const metrics = await (await fetch(`${gw.adminUrl}/metrics`)).text();
  assert.match(metrics, /^idemgw_operator_queue_keys\{server="billing",tool="slow_refund"\} 1$/m);
  assert.match(metrics, /^idemgw_operator_queue_keys\{server="payments",tool="slow_refund"\} 1$/m);
  // resolved as failed on billing: billing's retry runs once, payments' stays held
  const b = one.body.keys[0];
  assert.equal((await admin(gw, 'POST', `/admin/v1/keys/${b.key_hash}/resolve`, { body: { outcome: 'failed' } })).status, 200);
  const c = await mcpClient(t, `http://127.0.0.1:${gw.port}/billing/mcp`);
  await loseCall(c, 'srv-billing');
  assert.equal((await readLedger(billing.ledger)).filter((l) => l.order_id === 'srv-billing').length, 2);
  assert.equal((await readLedger(payments.ledger)).filter((l) => l.order_id === 'srv-payments').length, 1);
});

/** A webhook receiver: fails its first `failFirst` requests with 500, keeps the others' bodies. */
async function receiver(t, { failFirst = 0 } = {}) {
  const http = await import('node:http');
  const got = [];
  let seen = 0;
  const waiters = [];
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c) => { body += c; });
    req.on('end', () => {
      seen++;
      if (seen <= failFirst) {
        res.writeHead(500).end();
        return;
      }
      got.push({ headers: req.headers, body: JSON.parse(body) });
      res.writeHead(204).end();
      for (const w of waiters.splice(0)) w();
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  t.after(() => new Promise((r) => server.close(r)));
  return {
    url: `http://127.0.0.1:${server.address().port}/hooks/idemgw`,
    got,
    attempts: () => seen,
    next: (n) => waitFor(() => got.length >= n ? got : null, { timeoutMs: 8000, what: `${n} webhook posts` }),
  };
}

for (const format of ['json', 'slack']) {
  test(`alerts.webhook_url (${format}): a key that becomes unknown is posted, retried after a failure`, async (t) => {
    const hook = await receiver(t, { failFirst: 1 });
    const upstream = await startRefundServer(t, { jsonResponse: true });
    const gw = await startGateway(t, {
      upstream: upstream.url,
      databaseUrl: await createDatabase(),
      config: {
        subject: { static: 'ops' },
        timeouts: { upstream: '2s' },
        tools: { slow_refund: { class: 'non_idempotent' } },
        alerts: { webhook_url: hook.url, webhook_format: format, webhook_timeout: '2s' },
      },
    });
    const c = await mcpClient(t, gw.url);
    // a call that runs is not announced
    assert.match(toolText(await c.callTool({ name: 'issue_refund', arguments: { order_id: 'fine', amount_cents: 1 } })), /^Refunded/);
    await loseCall(c, 'hooked');
    const [post] = await hook.next(1);
    assert.equal(hook.attempts(), 2, 'the first attempt failed and was retried');
    assert.match(post.headers['content-type'], /^application\/json/);
    assert.match(post.body.text, /slow_refund is unknown/);
    if (format === 'json') {
      assert.equal(post.body.event, 'key_unknown');
      assert.equal(post.body.key.tool, 'slow_refund');
      assert.equal(post.body.key.state, 'unknown');
      assert.match(post.body.key.key_hash, /^[0-9a-f]{64}$/);
    } else {
      assert.deepEqual(Object.keys(post.body), ['text']);
    }
    // the call that runs afterwards is answered as usual while the alert was on its way
    assert.match(toolText(await c.callTool({ name: 'issue_refund', arguments: { order_id: 'fine-2', amount_cents: 1 } })), /^Refunded/);
    assert.equal(hook.got.length, 1, 'one post per key');
  });
}

test('the page at /admin/ in headless Chromium: the unknown keys listed, a resolve clicked through', async (t) => {
  const upstream = await startRefundServer(t, { jsonResponse: true });
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: {
      subject: { static: 'ops' },
      admin_token_file: await tokenFile(t),
      timeouts: { upstream: '2s' },
      tools: { slow_refund: { class: 'non_idempotent', exclude_args: ['delay_ms'] } },
    },
  });
  const c = await mcpClient(t, gw.url);
  await loseCall(c, 'page-1');
  await loseCall(c, 'page-2');
  await waitFor(async () => (await admin(gw, 'GET', '/admin/v1/keys?state=unknown')).body.keys.length === 2, { what: 'two unknown keys' });

  const page = await headlessPage(t);
  await page.navigate(`${gw.adminUrl}/admin/`);
  await page.evaluate(`document.getElementById('token').value = ${JSON.stringify(TOKEN)}; document.getElementById('load').click(); true`);
  await page.waitFor(`document.querySelectorAll('#keys tr').length === 2`, 'the two keys listed');
  const states = await page.evaluate(`[...document.querySelectorAll('#keys tr td:nth-child(2)')].map((td) => td.textContent)`);
  assert.deepEqual(states, ['unknown', 'unknown']);
  const out = process.env.IDEMGW_TEST_OUTPUT ?? path.join(REPO, 'build', 'test-output', 'operator-queue');
  await fs.mkdir(out, { recursive: true });
  const shot = path.join(out, 'admin-page.png');
  await fs.writeFile(shot, await page.screenshot());
  t.diagnostic(`screenshot: ${shot}`);

  // the newest key (page-2) first: open it, say why, resolve it as failed
  const hash = await page.evaluate(`document.querySelector('#keys tr').dataset.hash`);
  await page.evaluate(`document.querySelector('#keys tr button.open').click(); true`);
  await page.waitFor(`!!document.querySelector('button.resolve-failed')`, 'the resolve buttons');
  await page.evaluate(`document.querySelector('input.note').value = 'not in the ledger'; document.querySelector('button.resolve-failed').click(); true`);
  await page.waitFor(`/^Resolved/.test(document.getElementById('status').textContent)`, 'the resolution');
  await page.waitFor(`document.querySelectorAll('#keys tr').length === 1`, 'the list without the resolved key');
  await fs.writeFile(path.join(out, 'admin-page-resolved.png'), await page.screenshot());

  const rec = await admin(gw, 'GET', `/admin/v1/keys/${hash}`);
  assert.equal(rec.body.state, 'failed');
  assert.deepEqual(rec.body.actions.map((a) => [a.outcome, a.by, a.note]), [['failed', 'alice', 'not in the ledger']]);
  const retry = await c.callTool({ name: 'slow_refund', arguments: { order_id: 'page-2', amount_cents: 7, delay_ms: 0 } });
  assert.match(toolText(retry), /^Refunded 7 cents on order page-2/, JSON.stringify(retry));
  assert.equal((await readLedger(upstream.ledger)).filter((l) => l.order_id === 'page-2').length, 2);
});

test('resolve by state: in progress is 409, in progress past its lease (the gateway died) is resolvable, failed is 409', async (t) => {
  const upstream = await startRefundServer(t, { jsonResponse: true });
  const databaseUrl = await createDatabase();
  const config = {
    subject: { static: 'ops' },
    admin_token_file: await tokenFile(t),
    timeouts: { upstream: '2s' },
    tools: { slow_refund: { class: 'non_idempotent', lease: '2s', exclude_args: ['delay_ms'] } },
  };
  const gw = await startGateway(t, { upstream: upstream.url, databaseUrl, config });
  const c = await mcpClient(t, gw.url);
  const pending = c.callTool({ name: 'slow_refund', arguments: { order_id: 'stuck', amount_cents: 3, delay_ms: 9000 } }).catch((e) => e);
  await waitForLedger(upstream.ledger, 1);
  const live = await waitFor(async () => (await admin(gw, 'GET', '/admin/v1/keys?state=in_progress')).body.keys[0] ?? null, { what: 'the call in progress' });
  const busy = await admin(gw, 'POST', `/admin/v1/keys/${live.key_hash}/resolve`, { body: { outcome: 'failed' } });
  assert.equal(busy.status, 409, busy.text);
  assert.equal(busy.body.state, 'in_progress');

  // the gateway dies holding the claim: once its lease is over the key is stuck, and listed so
  gw.proc.kill('SIGKILL');
  await gw.exited;
  await pending;
  const stuck = await waitFor(async () => {
    const r = await run(IDEMGW_BIN, ['keys', 'list', '--state', 'stuck', '--json', '--database-url', databaseUrl]);
    assert.equal(r.code, 0, r.stderr);
    return JSON.parse(r.stdout).keys[0] ?? null;
  }, { timeoutMs: 10000, intervalMs: 200, what: 'the lease to run out' });
  assert.equal(stuck.key_hash, live.key_hash);
  assert.equal(stuck.lease_expired, true);
  const open = await run(IDEMGW_BIN, ['keys', 'list', '--state', 'open', '--database-url', databaseUrl]);
  assert.match(open.stdout, new RegExp(`^${live.key_hash}\\s+in_progress\\s+slow_refund\\s+ops`, 'm'));

  const res = await run(IDEMGW_BIN, ['keys', 'resolve', live.key_hash, '--failed', '--note', 'the refund never landed', '--by', 'carol', '--database-url', databaseUrl]);
  assert.equal(res.code, 0, res.stderr);
  assert.equal(JSON.parse(res.stdout).previous_state, 'in_progress');
  const twice = await run(IDEMGW_BIN, ['keys', 'resolve', live.key_hash, '--failed', '--database-url', databaseUrl]);
  assert.equal(twice.code, 1, 'a failed key is not resolved again');
  assert.match(twice.stderr, /its state is failed/);
  const shown = await run(IDEMGW_BIN, ['keys', 'show', live.key_hash.slice(0, 12), '--database-url', databaseUrl]);
  assert.deepEqual(JSON.parse(shown.stdout).actions.map((a) => [a.outcome, a.by, a.previous_state, a.note]),
    [['failed', 'carol', 'in_progress', 'the refund never landed']]);

  // a new gateway on the same store runs the retry once
  const gw2 = await startGateway(t, { upstream: upstream.url, databaseUrl, config });
  const c2 = await mcpClient(t, gw2.url);
  const retry = await c2.callTool({ name: 'slow_refund', arguments: { order_id: 'stuck', amount_cents: 3, delay_ms: 0 } });
  assert.match(toolText(retry), /^Refunded 3 cents on order stuck/, JSON.stringify(retry));
  assert.equal((await readLedger(upstream.ledger)).filter((l) => l.order_id === 'stuck').length, 2);
  const usage = await run(IDEMGW_BIN, ['keys', 'resolve', live.key_hash, '--succeeded', '--database-url', databaseUrl]);
  assert.equal(usage.code, 2, 'succeeded needs its result file');
});
