// Callers of one stdio server keep to their own calls: a spawned server holds none of the
// gateway's descriptors; a request the server sends goes to the caller whose call caused it,
// under an id of the gateway's, and only that caller's answer reaches the server; sessionless
// callers of a per_session server each get a child of their own; a caller's cancel names only
// its own calls; a caller that stops reading is cut off, never the shared child.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import {
  NODE, TESTS, createDatabase, findResponse, readLedger, sseReader, startGateway, tempDir, toolText, waitFor,
  waitForLedger, waitForLog,
} from './lib/harness.mjs';

const LEDGER_SERVER = path.join(TESTS, 'fixtures/ledger-stdio.mjs');
const ACCEPT = 'application/json, text/event-stream';
const SUBJECT = { header: 'X-Subject' };

async function ledgerGateway(t, { sessions = 'per_session' } = {}) {
  const dir = await tempDir(t, 'idemgw-tenants-');
  const ledger = path.join(dir, 'ledger.jsonl');
  const gw = await startGateway(t, {
    upstream: { command: [NODE, LEDGER_SERVER], env: { LEDGER: ledger }, sessions },
    databaseUrl: await createDatabase(),
    config: { subject: SUBJECT },
  });
  return { gw, ledger, dir };
}

/** A 2025 session of caller `who` that declares elicitation; post() sends any message on it. */
async function session(url, who) {
  const base = { Accept: ACCEPT, 'Content-Type': 'application/json', 'X-Subject': who };
  const init = await fetch(url, {
    method: 'POST',
    headers: base,
    body: JSON.stringify({
      jsonrpc: '2.0', id: 0, method: 'initialize',
      params: { protocolVersion: '2025-11-25', capabilities: { elicitation: {} }, clientInfo: { name: who, version: '1' } },
    }),
  });
  assert.equal(init.status, 200, await init.text());
  const headers = { ...base, 'Mcp-Session-Id': init.headers.get('mcp-session-id'), 'MCP-Protocol-Version': '2025-11-25' };
  const post = (msg) => fetch(url, { method: 'POST', headers, body: JSON.stringify(msg) });
  await (await post({ jsonrpc: '2.0', method: 'notifications/initialized' })).arrayBuffer();
  return { headers, post };
}

const callMsg = (id, name, args) => ({ jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: args } });

/** The events of an SSE answer until the response with id; {asked: [requests], final}. */
async function readCall(res, id, { onRequest } = {}) {
  const r = sseReader(res);
  const asked = [];
  for (let ev; (ev = await r.next());) {
    if (!ev.data) continue;
    const m = JSON.parse(ev.data);
    if (m.method && m.id !== undefined) {
      asked.push(m);
      if (onRequest) await onRequest(m);
    } else if (!m.method && m.id === id) {
      return { asked, final: m };
    }
  }
  return { asked, final: null };
}

/** The inodes of the sockets among pid's descriptors, and its descriptor count. */
async function descriptors(pid) {
  const fds = await fs.readdir(`/proc/${pid}/fd`);
  const sockets = new Set();
  const links = new Map();
  for (const fd of fds) {
    const link = await fs.readlink(`/proc/${pid}/fd/${fd}`).catch(() => '');
    links.set(Number(fd), link);
    const m = /^socket:\[(\d+)\]$/.exec(link);
    if (m) sockets.add(m[1]);
  }
  return { sockets, links };
}

test('a spawned server holds none of the gateway\'s sockets, its store or other children\'s pipes', async (t) => {
  const { gw } = await ledgerGateway(t);
  // another agent's kept-alive connection is open while the new session's child starts
  const idle = net.connect(gw.port, '127.0.0.1');
  await new Promise((resolve) => idle.on('connect', resolve));
  idle.write(`GET /elsewhere HTTP/1.1\r\nHost: 127.0.0.1:${gw.port}\r\n\r\n`);
  const answer = await new Promise((resolve) => idle.once('data', resolve));
  assert.match(answer.toString(), /^HTTP\/1.1 404/);
  assert.doesNotMatch(answer.toString(), /connection: close/i, 'the connection stays open');
  const alice = await session(gw.url, 'alice');
  const bob = await session(gw.url, 'bob');
  const pidOf = async (s) => {
    const res = await s.post(callMsg(1, 'whoami', {}));
    return Number(/pid (\d+)/.exec(toolText(findResponse(res.headers.get('content-type'), await res.text(), 1).result))[1]);
  };
  const [pa, pb] = [await pidOf(alice), await pidOf(bob)];
  assert.notEqual(pa, pb);
  const mine = await descriptors(gw.proc.pid);
  assert.ok(mine.sockets.size >= 3, 'the gateway holds listeners and agent connections');
  for (const pid of [pa, pb]) {
    const child = await descriptors(pid);
    const shared = [...child.sockets].filter((s) => mine.sockets.has(s));
    assert.deepEqual(shared, [], `child ${pid} holds none of the gateway's sockets`);
    // 0, 1, 2 are its own pipes; nothing else it holds is a file the gateway has open
    const gwLinks = new Set([...mine.links.values()].filter((l) => !/^(pipe|anon_inode|socket):/.test(l) && l !== '/dev/null'));
    for (const [fd, link] of child.links) {
      if (fd > 2) assert.ok(!gwLinks.has(link), `child ${pid} fd ${fd} (${link}) is not the gateway's`);
    }
    assert.match(child.links.get(0), /^pipe:/);
    assert.match(child.links.get(1), /^pipe:/);
  }
  // the other agent hangs up: the gateway's descriptor closes, no child keeps the socket alive
  // and the gateway does not spin on it
  idle.destroy();
  await waitFor(async () => (await descriptors(gw.proc.pid)).sockets.size < mine.sockets.size, { what: 'the hung-up connection to close' });
  const ticks = async () => {
    const f = (await fs.readFile(`/proc/${gw.proc.pid}/stat`, 'utf8')).split(') ')[1].split(' ');
    return Number(f[11]) + Number(f[12]);
  };
  const before = await ticks();
  await new Promise((resolve) => setTimeout(resolve, 1000)); // a window of idleness to measure
  assert.ok((await ticks()) - before <= 5, 'an idle gateway uses (almost) no CPU');
});

test('shared: a question of the server goes to the only caller with a call in flight; another caller cannot answer it', async (t) => {
  const { gw, ledger } = await ledgerGateway(t, { sessions: 'shared' });
  const alice = await session(gw.url, 'alice');
  const bob = await session(gw.url, 'bob');
  const refused = [];
  const res = await bob.post(callMsg(7, 'confirm_refund', { order_id: 'ord-bob', amount_cents: 42 }));
  assert.equal(res.status, 200);
  const { asked, final } = await readCall(res, 7, {
    onRequest: async (q) => {
      // alice answers with the id bob saw, and with every id she might guess
      for (const id of [q.id, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 20, '1', q.id + 1]) {
        const r = await alice.post({ jsonrpc: '2.0', id, result: { action: 'accept', content: { ok: true } } });
        refused.push(r.status);
        await r.arrayBuffer();
      }
      const mine = await bob.post({ jsonrpc: '2.0', id: q.id, result: { action: 'decline' } });
      assert.equal(mine.status, 202, 'the caller it was asked of answers it');
      await mine.arrayBuffer();
    },
  });
  assert.equal(asked.length, 1);
  assert.equal(asked[0].method, 'elicitation/create');
  assert.deepEqual(refused, refused.map(() => 400), 'every answer of another caller is refused');
  assert.equal(toolText(final.result), 'Cancelled', 'bob\'s own answer (decline) decided his call');
  assert.equal((await readLedger(ledger)).length, 0);
});

test('shared: with calls of two callers in flight a question of the server reaches neither', async (t) => {
  const { gw, ledger, dir } = await ledgerGateway(t, { sessions: 'shared' });
  const alice = await session(gw.url, 'alice');
  const bob = await session(gw.url, 'bob');
  const go = path.join(dir, 'go');
  const bobRes = await bob.post(callMsg(1, 'confirm_refund', { order_id: 'ord-bob', amount_cents: 5, wait_for: go }));
  await waitForLedger(ledger, 1);
  // alice's answer begins once her request is written to the server
  const aliceRes = await alice.post(callMsg(1, 'echo', { text: 'alice', delay_ms: 1500 }));
  assert.equal(aliceRes.status, 200);
  await fs.writeFile(go, '');
  const b = await readCall(bobRes, 1);
  assert.equal(b.asked.length, 0, 'bob was not asked: the gateway cannot tell whose question it is');
  assert.match(JSON.stringify(b.final), /cannot tell which of its clients/);
  await waitForLog(gw, /'elicitation\/create' reaches no client: calls of several clients/);
  const a = await readCall(aliceRes, 1);
  assert.equal(a.asked.length, 0, 'alice was not asked either');
  assert.equal(toolText(a.final.result), 'alice');
});

test('shared: what the server says during a call reaches that call\'s caller alone', async (t) => {
  const { gw } = await ledgerGateway(t, { sessions: 'shared' });
  const alice = await session(gw.url, 'alice');
  const bob = await session(gw.url, 'bob');
  const get = await fetch(gw.url, { headers: { ...alice.headers, Accept: 'text/event-stream' } });
  assert.equal(get.status, 200);
  const aliceStream = sseReader(get);
  const heard = [];
  const listening = (async () => {
    for (let ev; (ev = await aliceStream.next());) if (ev.data) heard.push(JSON.parse(ev.data));
  })();
  for (let round = 0; round < 3; round++) {
    const res = await bob.post(callMsg(round, 'chatty', { lines: 3, bytes: 0, tag: 'bob' }));
    const events = [];
    const r = sseReader(res);
    for (let ev; (ev = await r.next());) if (ev.data) events.push(JSON.parse(ev.data));
    assert.deepEqual(events.filter((m) => m.method === 'notifications/message').map((m) => m.params.data.trim()), ['bob line 1', 'bob line 2', 'bob line 3']);
  }
  // a call of alice's own, after bob's: whatever was misrouted to her stream is there by now
  const res = await alice.post(callMsg(9, 'whoami', {}));
  await res.arrayBuffer();
  aliceStream.cancel();
  await listening.catch(() => {});
  assert.deepEqual(heard.filter((m) => m.method === 'notifications/message'), [], 'alice heard none of bob\'s messages');
});

test('sessionless callers of a per_session server each have a child of their own, reused across their calls', async (t) => {
  const { gw } = await ledgerGateway(t);
  const call = async (who, id) => {
    const res = await fetch(gw.url, {
      method: 'POST',
      headers: { Accept: ACCEPT, 'Content-Type': 'application/json', 'X-Subject': who, 'MCP-Protocol-Version': '2026-07-28', 'Mcp-Method': 'tools/call', 'Mcp-Name': 'whoami' },
      body: JSON.stringify(callMsg(id, 'whoami', {})),
    });
    assert.equal(res.headers.get('mcp-session-id'), null, 'a sessionless caller is given no session');
    return toolText(findResponse(res.headers.get('content-type'), await res.text(), id).result);
  };
  const a1 = await call('alice', 1);
  const b1 = await call('bob', 1);
  const a2 = await call('alice', 2);
  assert.notEqual(a1, b1, 'alice and bob are served by different children');
  assert.equal(a1, a2, 'alice keeps her child');
});

test('a sessionless caller\'s cancel reaches only its own call, not another\'s with the same id', async (t) => {
  const { gw, ledger, dir } = await ledgerGateway(t, { sessions: 'shared' });
  const h = (who, method, name) => ({
    Accept: ACCEPT, 'Content-Type': 'application/json', 'X-Subject': who, 'MCP-Protocol-Version': '2026-07-28',
    'Mcp-Method': method, ...(name ? { 'Mcp-Name': name } : {}),
  });
  const go = path.join(dir, 'go');
  const alice = fetch(gw.url, {
    method: 'POST', headers: h('alice', 'tools/call', 'slow_refund'),
    body: JSON.stringify(callMsg(1, 'slow_refund', { order_id: 'ord-alice', amount_cents: 9, wait_for: go })),
  });
  await waitForLedger(ledger, 1);
  const mallory = await fetch(gw.url, {
    method: 'POST', headers: h('mallory', 'notifications/cancelled'),
    body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 1 } }),
  });
  await mallory.arrayBuffer();
  await fs.writeFile(go, '');
  const res = await alice;
  const m = findResponse(res.headers.get('content-type'), await res.text(), 1);
  assert.match(toolText(m.result), /Refunded 9 on ord-alice/, 'alice\'s call ran to its end with its answer');
});

test('shared: a caller that stops reading is cut off; the others of the child are answered', async (t) => {
  const { gw } = await ledgerGateway(t, { sessions: 'shared' });
  const mallory = await session(gw.url, 'mallory');
  const alice = await session(gw.url, 'alice');
  // mallory asks for a lot of progress and never reads her stream
  const sock = net.connect(gw.port, '127.0.0.1');
  await new Promise((resolve) => sock.on('connect', resolve));
  const body = JSON.stringify(callMsg(1, 'chatty', { lines: 5000, bytes: 4000, tag: 'mallory' }));
  const head = Object.entries({ ...mallory.headers, Host: `127.0.0.1:${gw.port}`, 'Content-Length': Buffer.byteLength(body) }).map(([k, v]) => `${k}: ${v}`).join('\r\n');
  sock.write(`POST /mcp HTTP/1.1\r\n${head}\r\n\r\n${body}`);
  sock.pause();
  t.after(() => sock.destroy());
  await waitForLog(gw, /a client is not reading its answer .*: its call is cut off/, { timeoutMs: 30000 });
  for (let i = 1; i <= 3; i++) {
    const res = await alice.post(callMsg(i, 'echo', { text: `alice ${i}` }));
    assert.equal(toolText(findResponse(res.headers.get('content-type'), await res.text(), i).result), `alice ${i}`);
  }
});
