// The operator's commands in front of several servers: `idemgw key`, `report`, `tools` and
// `policy` take --server NAME and read that server's keys, rows, catalogue and policy; the same
// call on two servers is two rows, each found through its own server only.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import path from 'node:path';
import {
  IDEMGW_BIN, NODE, TESTS, createDatabase, idemgwKey, rawSession, replayMarker, run, startGateway,
  startRefundServer, tempDir, toYaml, waitFor,
} from './lib/harness.mjs';

const LEDGER_SERVER = path.join(TESTS, 'fixtures/ledger-stdio.mjs');
const SUBJECT = 'team';

/**
 * billing and payments (the refund fixture, the same tools on each, send_receipt classed
 * differently by each server's policy) and ledger (a stdio server with tools of its own).
 */
async function servers(t) {
  const billing = await startRefundServer(t);
  const payments = await startRefundServer(t);
  const dir = await tempDir(t, 'idemgw-servers-cli-');
  const gw = await startGateway(t, {
    databaseUrl: await createDatabase(),
    config: {
      subject: { static: SUBJECT },
      // a forgotten success must not come back from the replay cache
      store: { cache_entries: 0 },
      tools: { issue_refund: { class: 'non_idempotent' } },
      servers: {
        billing: {
          path: '/billing/mcp', upstream: billing.url,
          tools: { send_receipt: { class: 'non_idempotent', window: '1h' } },
        },
        payments: {
          path: '/payments/mcp', upstream: payments.url,
          tools: { send_receipt: { class: 'idempotent' } },
        },
        ledger: {
          path: '/ledger/mcp',
          upstream: { command: [NODE, LEDGER_SERVER], env: { LEDGER: path.join(dir, 'ledger.jsonl') } },
        },
      },
    },
  });
  const url = (name) => `http://127.0.0.1:${gw.port}/${name}/mcp`;
  return { gw, billing, payments, url };
}

/** `idemgw CMD [SUB] -c CONFIG ARGS...` with the gateway's config (SUB: policy's init or diff). */
const cli = (gw, cmd, ...args) => {
  const sub = cmd === 'policy' ? [args.shift()] : [];
  return run(IDEMGW_BIN, [cmd, ...sub, '-c', gw.configPath, ...args]);
};

function keyOf(gw, server, args, ...extra) {
  return idemgwKey(['-c', gw.configPath, '--server', server, '--subject', SUBJECT, '--tool', 'issue_refund',
    '--args', JSON.stringify(args), ...extra]);
}

/** The JSON line after the key, of a key command that succeeded. */
function rowOf(r) {
  assert.equal(r.code, 0, r.stderr);
  const lines = r.stdout.trim().split('\n');
  assert.equal(lines.length, 2, `the key, then one JSON line: ${r.stdout}`);
  return { key: lines[0], row: JSON.parse(lines[1]) };
}

test('servers: key --server finds the row of a call on that server only, and prints its logged key_hash', async (t) => {
  const { gw, url } = await servers(t);
  const both = { order_id: 'ord-both', amount_cents: 5 };
  const billingOnly = { order_id: 'ord-billing', amount_cents: 6 };
  const b = await rawSession(t, url('billing'));
  const p = await rawSession(t, url('payments'));
  await b.call('issue_refund', billingOnly, { id: 'billing-only' });
  await b.call('issue_refund', both, { id: 'both-on-billing' });
  await p.call('issue_refund', both, { id: 'both-on-payments' });

  // the key names the server; the call made on billing alone has a row through billing only
  const onBilling = rowOf(await keyOf(gw, 'billing', billingOnly, '--show'));
  assert.match(onBilling.key, /^team:billing\/issue_refund:h:[0-9a-f]{32}$/);
  assert.equal(onBilling.row.state, 'succeeded');
  assert.match(onBilling.row.first_jsonrpc_id, /billing-only/);
  const onPayments = await keyOf(gw, 'payments', billingOnly, '--show');
  assert.equal(onPayments.code, 1, 'no such call on payments');
  assert.match(onPayments.stdout, /^team:payments\/issue_refund:h:/);
  assert.match(onPayments.stderr, /no row for this key/);
  // the same call on both: a row each, each with its own first call
  assert.match(rowOf(await keyOf(gw, 'billing', both, '--show')).row.first_jsonrpc_id, /both-on-billing/);
  assert.match(rowOf(await keyOf(gw, 'payments', both, '--show')).row.first_jsonrpc_id, /both-on-payments/);

  // --hash is the key_hash of the gateway's log line for the call on that server
  const logged = (id) => JSON.parse(gw.logs().split('\n').find((l) => l.includes(`"rpc_id":"${id}"`) && l.includes('"key_hash"'))).key_hash;
  await waitFor(() => gw.logs().includes('"rpc_id":"both-on-payments"') || null, { what: 'the log line of the call on payments' });
  for (const [server, id] of [['billing', 'both-on-billing'], ['payments', 'both-on-payments']]) {
    const h = await keyOf(gw, server, both, '--hash');
    assert.equal(h.code, 0, h.stderr);
    assert.equal(h.stdout.trim().split('\n')[1], logged(id), `${server}: --hash is the logged key_hash`);
  }
  assert.notEqual(logged('both-on-billing'), logged('both-on-payments'));

  // --forget on billing leaves the same call's row on payments; the call runs again on billing
  const forgot = rowOf(await keyOf(gw, 'billing', both, '--forget'));
  assert.equal(forgot.row.forgotten, true);
  assert.equal((await keyOf(gw, 'billing', both, '--show')).code, 1);
  assert.equal(rowOf(await keyOf(gw, 'payments', both, '--show')).row.state, 'succeeded');
  const again = await b.call('issue_refund', both, { id: 'after-forget' });
  assert.equal(replayMarker(again.message.result), undefined, 'forgotten on billing: it runs again there');
  const replayed = await p.call('issue_refund', both, { id: 'payments-again' });
  assert.ok(replayMarker(replayed.message.result), 'payments still replays its own');

  // a missing or unknown --server: exit 2, naming the servers
  const bare = await idemgwKey(['-c', gw.configPath, '--subject', SUBJECT, '--tool', 'issue_refund', '--args', '{}']);
  assert.equal(bare.code, 2);
  assert.equal(bare.stdout, '');
  assert.match(bare.stderr, /idemgw key: .*idemgw\.yaml has servers:, name one with --server NAME: billing, payments, ledger/);
  const unknown = await keyOf(gw, 'shipping', both);
  assert.equal(unknown.code, 2);
  assert.match(unknown.stderr, /--server shipping: .* has no server of that name; its servers: billing, payments, ledger/);
});

test('servers: report groups by server; report --server shows that server\'s rows only', async (t) => {
  const { gw, url } = await servers(t);
  const b = await rawSession(t, url('billing'));
  const p = await rawSession(t, url('payments'));
  const args = { order_id: 'ord-report', amount_cents: 7 };
  await b.call('issue_refund', args, { id: 'b-1' });
  assert.ok(replayMarker((await b.call('issue_refund', args, { id: 'b-2' })).message.result));
  await b.call('send_receipt', { order_id: 'ord-report', to: 'a@example.com' }, { id: 'b-receipt' });
  await p.call('issue_refund', args, { id: 'p-1' });
  // replays are counted within half a second
  const billingRow = async () => rowOf(await keyOf(gw, 'billing', args, '--show')).row;
  await waitFor(async () => (await billingRow()).attempts === 2 || null, { what: 'the replay counted' });

  const all = await cli(gw, 'report', '--since', '1h', '--json');
  assert.equal(all.code, 0, all.stderr);
  const rep = JSON.parse(all.stdout);
  assert.deepEqual(rep.tools.map((x) => [x.server, x.tool, x.keys, x.calls, x.runs, x.replay]), [
    ['billing', 'issue_refund', 1, 2, 1, 1],
    ['billing', 'send_receipt', 1, 1, 1, 0],
    ['payments', 'issue_refund', 1, 1, 1, 0],
  ]);
  assert.deepEqual(rep.servers.map((x) => [x.server, x.keys, x.calls, x.runs, x.replay]), [
    ['billing', 2, 3, 2, 1],
    ['payments', 1, 1, 1, 0],
  ]);
  assert.equal(rep.server, undefined, 'every server');
  // most calls first, then by key (team:billing/... before team:payments/...)
  assert.deepEqual(rep.top_keys.map((k) => [k.server, k.tool, k.calls]), [
    ['billing', 'issue_refund', 2], ['billing', 'send_receipt', 1], ['payments', 'issue_refund', 1],
  ]);
  assert.equal(rep.top_keys[0].key_hash, (await keyOf(gw, 'billing', args, '--hash')).stdout.trim().split('\n')[1]);
  assert.deepEqual(Object.keys(rep.top_keys[0]).slice(0, 3), ['key_hash', 'server', 'tool']);

  const one = await cli(gw, 'report', '--since', '1h', '--json', '--server', 'billing');
  assert.equal(one.code, 0, one.stderr);
  const billing = JSON.parse(one.stdout);
  assert.equal(billing.server, 'billing');
  assert.deepEqual(billing.tools.map((x) => [x.server, x.tool, x.calls]), [['billing', 'issue_refund', 2], ['billing', 'send_receipt', 1]]);
  assert.deepEqual(billing.top_keys.map((k) => k.server), ['billing', 'billing'], 'the top keys are billing\'s too');
  assert.deepEqual(billing.servers.map((x) => x.server), ['billing']);

  // the tables: a SERVER column, each server's tools together
  const table = await cli(gw, 'report', '--since', '1h');
  assert.equal(table.code, 0, table.stderr);
  assert.match(table.stdout, /^SERVER\s+TOOL\s+KEYS\s+CALLS\s+RUNS\s+REPLAYS\s/m);
  assert.match(table.stdout, /^billing\s+issue_refund\s+1\s+2\s+1\s+1\s/m);
  assert.match(table.stdout, /^billing\s+send_receipt\s+1\s+1\s+1\s+0\s/m);
  assert.match(table.stdout, /^billing\s+\(all\)\s+2\s+3\s+2\s+1\s/m);
  assert.match(table.stdout, /^payments\s+issue_refund\s+1\s+1\s+1\s+0\s/m);
  assert.match(table.stdout, /^total\s+3\s+4\s+3\s+1\s/m);
  assert.match(table.stdout, /^KEY_HASH\s+SERVER\s+TOOL\s+CALLS/m);
  const onlyPayments = await cli(gw, 'report', '--since', '1h', '--server', 'payments');
  assert.equal(onlyPayments.code, 0, onlyPayments.stderr);
  assert.match(onlyPayments.stdout, /^idemgw report: server payments: rows updated in the last 1h/);
  assert.match(onlyPayments.stdout, /^payments\s+issue_refund\s+1\s+1\s+1\s+0\s/m);
  assert.doesNotMatch(onlyPayments.stdout, /billing|send_receipt/);
  assert.doesNotMatch(onlyPayments.stdout, /^total/m, 'one tool: no total');
  const none = await cli(gw, 'report', '--server', 'ledger');
  assert.equal(none.code, 0, none.stderr);
  assert.match(none.stdout, /no protected calls on server ledger/);

  const unknown = await cli(gw, 'report', '--server', 'shipping');
  assert.equal(unknown.code, 2);
  assert.match(unknown.stderr, /idemgw report: --server shipping: .* has no server of that name; its servers: billing, payments, ledger/);
});

test('servers: tools and policy read the server --server names, against its own policy', async (t) => {
  const { gw } = await servers(t);
  const rows = (r) => Object.fromEntries(r.stdout.trim().split('\n').slice(1).map((l) => { const f = l.split(/\s+/); return [f[0], f]; }));
  const billing = await cli(gw, 'tools', '--server', 'billing');
  assert.equal(billing.code, 0, billing.stderr);
  const b = rows(billing);
  assert.deepEqual(b.send_receipt.slice(1, 4), ['non_idempotent', 'policy', '1h']);
  assert.deepEqual(b.issue_refund.slice(1, 3), ['non_idempotent', 'policy'], 'the top level\'s tools are the server\'s too');
  assert.ok(b.get_ledger && !b.whoami, 'the refund fixture\'s tools');
  const payments = rows(await cli(gw, 'tools', '--server', 'payments'));
  assert.deepEqual(payments.send_receipt.slice(1, 3), ['idempotent', 'policy'], 'payments\' own policy');
  // a stdio server: the command the config gives, spawned for the look
  const ledger = await cli(gw, 'tools', '--server', 'ledger');
  assert.equal(ledger.code, 0, ledger.stderr);
  const l = rows(ledger);
  assert.deepEqual(l.whoami.slice(1, 3), ['read', 'annotation']);
  assert.ok(!l.get_ledger, 'not the refund fixture\'s tools');
  assert.doesNotMatch(ledger.stdout, /send_receipt/, 'a tool of billing\'s and payments\' policies, not of ledger\'s');

  for (const cmd of [['tools'], ['policy', 'diff']]) {
    const bare = await run(IDEMGW_BIN, [...cmd, '-c', gw.configPath]);
    assert.equal(bare.code, 2, `${cmd}: ${bare.stdout}`);
    assert.match(bare.stderr, new RegExp(`idemgw ${cmd.join(' ')}: .* has servers:, name one with --server NAME: billing, payments, ledger`));
    const unknown = await run(IDEMGW_BIN, [...cmd, '-c', gw.configPath, '--server', 'shipping']);
    assert.equal(unknown.code, 2);
    assert.match(unknown.stderr, /--server shipping: .* has no server of that name; its servers: billing, payments, ledger/);
  }

  // policy init --server: the tools: of that server's entry, which fits under it
  const init = await cli(gw, 'policy', 'init', '--server', 'billing');
  assert.equal(init.code, 0, init.stderr);
  assert.match(init.stdout, /^# idemgw policy for server billing \(http:\/\/127\.0\.0\.1:\d+\/mcp\)/);
  assert.match(init.stdout, /These lines go under servers: billing: in\n# {3}\S+idemgw\.yaml\n# in place of the entry's tools:/);
  assert.match(init.stdout, /^ {4}tools:\n/m);
  assert.match(init.stdout, /^ {6}# annotations: readOnlyHint: true\n {6}get_ledger:\n {8}class: read\n/m);
  assert.match(init.stdout, /^ {6}issue_refund:\n {8}class: non_idempotent\n/m);
  assert.doesNotMatch(init.stdout, /^upstream:/m, 'the entry has its upstream already');
  const cfg = await fs.readFile(gw.configPath, 'utf8');
  const billingUrl = cfg.match(/billing:\n\s+path: \/billing\/mcp\n\s+upstream: "?([^"\n]+)"?/)[1];
  const dir = await tempDir(t, 'idemgw-servers-init-');
  const file = path.join(dir, 'idemgw.yaml');
  await fs.writeFile(file, `${toYaml({ database_url: 'none' })}servers:\n  billing:\n    path: /billing/mcp\n    upstream: ${JSON.stringify(billingUrl)}\n${init.stdout}`);
  const check = await run(IDEMGW_BIN, ['--check-config', '-c', file]);
  assert.equal(check.code, 0, check.stderr + init.stdout);
  const same = await run(IDEMGW_BIN, ['policy', 'diff', '-c', file, '--server', 'billing']);
  assert.equal(same.code, 0, `a fresh policy has no drift: ${same.stdout}`);
  assert.equal(same.stdout, '');
  // policy diff --server compares with that server's policy: payments' send_receipt is
  // idempotent, which the fixture's annotations (none: not idempotent) contradict
  const drift = await cli(gw, 'policy', 'diff', '--server', 'payments');
  assert.equal(drift.code, 1);
  assert.match(drift.stdout, /warning: send_receipt is idempotent in the policy, but the server says it is not/);
  assert.doesNotMatch(drift.stdout, /whoami/, 'the ledger server\'s tools are not payments\'');

  // init needs --upstream, or -c with --server
  const noServer = await cli(gw, 'policy', 'init');
  assert.equal(noServer.code, 2);
  assert.match(noServer.stderr, /has servers:, name one with --server NAME/);
});

test('one upstream: --server is refused, and the commands print what they always did', async (t) => {
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: { subject: { static: SUBJECT }, tools: { issue_refund: { class: 'non_idempotent' } } },
  });
  const s = await rawSession(t, gw.url);
  await s.call('issue_refund', { order_id: 'ord-one', amount_cents: 1 });
  for (const cmd of [['report'], ['tools'], ['policy', 'diff'], ['key', '--subject', SUBJECT, '--tool', 'issue_refund', '--args', '{}']]) {
    const r = await run(IDEMGW_BIN, [...cmd, '-c', gw.configPath, '--server', 'billing']);
    assert.equal(r.code, 2, `${cmd[0]}: ${r.stdout}`);
    assert.equal(r.stdout, '');
    assert.match(r.stderr, /--server billing: .*idemgw\.yaml has no servers: \(one upstream, whose keys and tools name no server\); leave --server out/);
  }
  const rep = JSON.parse((await cli(gw, 'report', '--json')).stdout);
  assert.deepEqual(rep.tools.map((x) => Object.keys(x)[0]), ['tool'], 'no server field');
  assert.equal(rep.servers, undefined);
  assert.ok(!('server' in rep.top_keys[0]));
  const table = await cli(gw, 'report');
  assert.match(table.stdout, /^TOOL\s+KEYS\s+CALLS/m);
  assert.match(table.stdout, /^KEY_HASH\s+TOOL\s+CALLS/m);
  assert.match(table.stdout, /^issue_refund\s+1\s+1\s+1\s+0\s/m);
});

test('--check-config with servers: the tools of each server\'s policy, its own and the top level\'s', async (t) => {
  const dir = await tempDir(t, 'idemgw-servers-check-');
  const file = path.join(dir, 'idemgw.yaml');
  await fs.writeFile(file, toYaml({
    database_url: 'none',
    tools: { get_ledger: { class: 'read' } },
    servers: {
      billing: {
        path: '/billing/mcp', upstream: 'http://127.0.0.1:9/mcp',
        tools: { issue_refund: { class: 'non_idempotent' }, get_ledger: { class: 'read' } },
      },
      memory: { path: '/memory/mcp', upstream: { command: [NODE, LEDGER_SERVER] } },
    },
  }));
  const check = await run(IDEMGW_BIN, ['--check-config', '-c', file]);
  assert.equal(check.code, 0, check.stderr);
  // the top level names one tool of its own and no server's: "(1 tools)" would say nothing
  assert.equal(check.stdout, `${file}: configuration ok (2 servers; tools in each server's policy, its own and the top level's: billing 2, memory 1)\n`);
});

test('policy init --server of a stdio server: the proxy and CA variables set here that its pass_env lacks are named', async (t) => {
  const dir = await tempDir(t, 'idemgw-servers-passenv-');
  const file = path.join(dir, 'idemgw.yaml');
  const entry = `servers:\n  ledger:\n    path: /ledger/mcp\n    upstream:\n      command: [${JSON.stringify(NODE)}, ${JSON.stringify(LEDGER_SERVER)}]\n      env: {LEDGER: ${JSON.stringify(path.join(dir, 'ledger.jsonl'))}}\n      pass_env: [NO_PROXY]\n`;
  await fs.writeFile(file, `database_url: none\n${entry}`);
  const reach = /^(https?_proxy|no_proxy|all_proxy|node_extra_ca_certs|ssl_cert_(file|dir)|requests_ca_bundle|npm_config_registry|pip_index_url|uv_index_url)$/i;
  const bare = Object.fromEntries(Object.entries(process.env).filter(([k]) => !reach.test(k)));

  const plain = await run(IDEMGW_BIN, ['policy', 'init', '-c', file, '--server', 'ledger'], { env: bare });
  assert.equal(plain.code, 0, plain.stderr);
  assert.doesNotMatch(plain.stdout + plain.stderr, /pass_env/, 'nothing set here to pass');

  const behind = await run(IDEMGW_BIN, ['policy', 'init', '-c', file, '--server', 'ledger'],
    { env: { ...bare, HTTPS_PROXY: 'http://proxy.invalid:3128', NO_PROXY: 'localhost', NODE_EXTRA_CA_CERTS: '/etc/secret-ca.pem' } });
  assert.equal(behind.code, 0, behind.stderr);
  // NO_PROXY is in its pass_env already; the others are named, never their values
  assert.match(behind.stdout, /\n {4}# {3}pass_env: \[HTTPS_PROXY, NODE_EXTRA_CA_CERTS\]\n {4}tools:\n/);
  assert.match(behind.stderr, /server ledger: its upstream's pass_env lacks HTTPS_PROXY, NODE_EXTRA_CA_CERTS/);
  assert.doesNotMatch(behind.stdout + behind.stderr, /proxy\.invalid|secret-ca/, 'names only');
  // the snippet still goes under the entry as it is
  await fs.writeFile(file, `database_url: none\n${entry}${behind.stdout}`);
  const check = await run(IDEMGW_BIN, ['--check-config', '-c', file]);
  assert.equal(check.code, 0, check.stderr + behind.stdout);
});
