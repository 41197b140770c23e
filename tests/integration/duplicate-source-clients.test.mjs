// Which layer retried, measured with real retrying clients through the gateway (no network:
// the refund fixture, SDK 1.32.2 with sessions, and the v2 fixture for 2026-07-28):
//   LangChain (@langchain/mcp-adapters 1.1.4): a tool in .withRetry() with a short
//     defaultToolTimeout; the call times out, its cancel is kept, p-retry tries again 1 to 2 s
//     later (times 2 each attempt), and the retry is a replay;
//   the AI SDK (@ai-sdk/mcp 2.0.99): createMCPClient's own maxRetries (retryWithExponentialBackoff
//     from @ai-sdk/provider-utils, 2 s then times 2, on HTTP 408/409/429/5xx and connection
//     errors) behind a load balancer that answers 504 when the tool is slow;
//   a client restarted (a new instance repeats the call), and a model re-issuing a call whose
//     answer it has read.
// Each label is read from the key's row (`idemgw key --show`) and /metrics.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { once } from 'node:events';
import { MultiServerMCPClient } from '@langchain/mcp-adapters';
import { createMCPClient } from '@ai-sdk/mcp';
import { Client as ClientV2, StreamableHTTPClientTransport as TransportV2 } from '@modelcontextprotocol/client';
import {
  createDatabase, idemgwKey, readLedger, replayMarker, startGateway, startRefundServer, startV2Server, toolText, waitFor,
} from './lib/harness.mjs';

async function setup(t, { v2 = false, duplicates } = {}) {
  const upstream = v2 ? await startV2Server(t) : await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: {
      subject: { static: 'tenant' },
      tools: { get_ledger: { class: 'read' }, slow_refund: { class: 'non_idempotent' } },
      ...(duplicates ? { duplicates } : {}),
    },
  });
  return { upstream, gw };
}

/** The key's row once it holds `duplicates` duplicates: their sources and answers, oldest first. */
async function history(gw, tool, args, duplicates) {
  const row = await waitFor(async () => {
    const r = await idemgwKey(['-c', gw.configPath, '--subject', 'tenant', '--tool', tool, '--args', JSON.stringify(args), '--show']);
    assert.equal(r.code, 0, r.stderr);
    const line = JSON.parse(r.stdout.trim().split('\n')[1]);
    return line.duplicates === duplicates ? line : null;
  }, { what: `${duplicates} duplicates on the row` });
  return row.history.map((h) => [h.source, h.answered]);
}

async function metricSources(gw) {
  const text = await (await fetch(`${gw.adminUrl}/metrics`)).text();
  const out = {};
  for (const m of text.matchAll(/^idemgw_duplicates_total\{tool="[^"]*",source="(\w+)"\} (\d+)$/gm)) out[m[1]] = (out[m[1]] ?? 0) + Number(m[2]);
  return out;
}

const executions = async (ledger, order) => (await readLedger(ledger)).filter((l) => l.order_id === order).length;

function langchain(t, url, { defaultToolTimeout } = {}) {
  const client = new MultiServerMCPClient({
    mcpServers: { shop: { transport: 'http', url } },
    ...(defaultToolTimeout ? { defaultToolTimeout } : {}),
  });
  t.after(() => client.close().catch(() => {}));
  return client;
}

const toolNamed = async (client, name) => (await client.getTools()).find((x) => x.name.endsWith(name));

test('LangChain withRetry after its defaultToolTimeout: the retry is the harness, and gets the one execution', { timeout: 60000 }, async (t) => {
  const { upstream, gw } = await setup(t);
  const client = langchain(t, gw.url, { defaultToolTimeout: 1000 });
  const refund = (await toolNamed(client, 'slow_refund')).withRetry({ stopAfterAttempt: 3 });
  // the tool takes 1.5 s: the first attempt times out at 1 s and is cancelled (kept by the
  // gateway); p-retry waits 1 to 2 s, so the second attempt comes 2 to 3 s after the first,
  // after the first has finished: past harness_within, with no answer a model could have read
  const args = { order_id: 'lc-retry', amount_cents: 11, delay_ms: 1500 };
  const out = await refund.invoke(args);
  assert.match(typeof out === 'string' ? out : JSON.stringify(out), /Refunded 11 cents on order lc-retry/);
  assert.equal(await executions(upstream.ledger, 'lc-retry'), 1, 'executed once');
  assert.deepEqual(await history(gw, 'slow_refund', args, 1), [['harness', 'replay']]);
  assert.deepEqual(await metricSources(gw), { harness: 1 });
});

// A load balancer in front of the gateway that answers 504 to a tools/call not answered within
// limitMs and drops its connection to the gateway, as an idle timeout does; everything else
// passes through.
async function impatientBalancer(t, target, limitMs) {
  const to = new URL(target);
  let timeouts = 0;
  const server = http.createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = Buffer.concat(chunks);
    const out = http.request({ host: to.hostname, port: to.port, path: req.url, method: req.method, headers: { ...req.headers, host: to.host } });
    out.on('error', () => {});
    if (!/"method":"tools\/call"/.test(body.toString())) {
      out.on('response', (up) => { res.writeHead(up.statusCode, up.headers); up.pipe(res); });
      out.end(body);
      return;
    }
    const timer = setTimeout(() => {
      timeouts++;
      out.destroy();
      res.writeHead(504, { 'Content-Type': 'text/plain' }).end('gateway timeout');
    }, limitMs);
    out.on('response', async (up) => {
      const got = [];
      try {
        for await (const c of up) got.push(c);
      } catch {
        return; // cut at the 504
      }
      clearTimeout(timer);
      if (res.headersSent) return;
      res.writeHead(up.statusCode, up.headers);
      res.end(Buffer.concat(got));
    });
    out.end(body);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.after(() => { server.closeAllConnections(); server.close(); });
  return { url: `http://127.0.0.1:${server.address().port}${to.pathname}`, timeouts: () => timeouts };
}

test('the AI SDK\'s maxRetries after a load balancer\'s 504: the harness, one execution', { timeout: 60000 }, async (t) => {
  const { upstream, gw } = await setup(t);
  const lb = await impatientBalancer(t, gw.url, 300);
  const client = await createMCPClient({ transport: { type: 'http', url: lb.url }, maxRetries: 2 });
  t.after(() => client.close().catch(() => {}));
  // the 504 comes at 300 ms, the tool ends at 600 ms, the retry 2 s after the 504
  const args = { order_id: 'ai-retry', amount_cents: 12, delay_ms: 600 };
  const r = await client.callTool({ name: 'slow_refund', arguments: args });
  assert.equal(lb.timeouts(), 1, 'the first attempt got a 504');
  assert.match(toolText(r), /^Refunded 12 cents on order ai-retry/);
  assert.ok(replayMarker(r), 'the retry is the first call\'s result, replayed');
  assert.equal(await executions(upstream.ledger, 'ai-retry'), 1);
  assert.deepEqual(await history(gw, 'slow_refund', args, 1), [['harness', 'replay']]);
  assert.deepEqual(await metricSources(gw), { harness: 1 });
});

test('a restarted client repeats a call: a new session is a reconnect (LangChain, 2025)', { timeout: 60000 }, async (t) => {
  const { upstream, gw } = await setup(t);
  const args = { order_id: 'lc-restart', amount_cents: 13 };
  for (let run = 0; run < 2; run++) {
    const client = langchain(t, gw.url);
    const out = await (await toolNamed(client, 'issue_refund')).invoke(args);
    assert.match(typeof out === 'string' ? out : JSON.stringify(out), /Refunded 13 cents on order lc-restart/);
    await client.close();
  }
  assert.equal(await executions(upstream.ledger, 'lc-restart'), 1);
  assert.deepEqual(await history(gw, 'issue_refund', args, 1), [['reconnect', 'replay']]);
});

test('a restarted 2026-07-28 client (no sessions): its ids begin again; within harness_within it reads as transport', { timeout: 60000 }, async (t) => {
  const { upstream, gw } = await setup(t, { v2: true });
  const args = { order_id: 'v2-restart', amount_cents: 14 };
  const texts = [];
  for (let run = 0; run < 2; run++) {
    const client = new ClientV2({ name: 'shop-agent', version: '1.0.0' }, { versionNegotiation: { mode: { pin: '2026-07-28' } } });
    await client.connect(new TransportV2(new URL(gw.url)));
    texts.push(toolText(await client.callTool({ name: 'issue_refund', arguments: args })));
    await client.close();
  }
  assert.equal(texts[1], texts[0]);
  assert.equal(await executions(upstream.ledger, 'v2-restart'), 1);
  // nothing tells a restart at once from an HTTP library's re-send: the same id, the same
  // clientInfo, no session; only a gap of harness_within or more says "restarted"
  assert.deepEqual(await history(gw, 'issue_refund', args, 1), [['transport', 'replay']]);
});

test('a model re-issuing a call whose answer it read: model', { timeout: 60000 }, async (t) => {
  // a model's turn takes longer than harness_within; here it is made short instead of waited for
  const { upstream, gw } = await setup(t, { duplicates: { harness_within: '1ms', model_within: '1h' } });
  const client = langchain(t, gw.url);
  const refund = await toolNamed(client, 'issue_refund');
  const args = { order_id: 'lc-model', amount_cents: 15 };
  const first = await refund.invoke(args);
  const again = await refund.invoke(args);
  assert.equal(first, 'Refunded 15 cents on order lc-model (refund r-1)');
  assert.equal(again.text, first, 'the replay, the gateway\'s marker kept beside the text');
  assert.equal(await executions(upstream.ledger, 'lc-model'), 1);
  assert.deepEqual(await history(gw, 'issue_refund', args, 1), [['model', 'replay']]);
  assert.deepEqual(await metricSources(gw), { model: 1 });
});
