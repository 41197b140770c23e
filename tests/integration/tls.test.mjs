// listen_tls: agents reach the gateway over HTTPS, and with client_ca_file over mutual TLS,
// where subject: {client_cert: spiffe} names each caller by the SPIFFE id of its verified
// certificate. Certificates come from a private CA made here with the openssl CLI; the SDK
// client talks through undici with that CA (and a client certificate). A SIGHUP loads a new
// server certificate for new connections while an open connection keeps its own.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs/promises';
import tls from 'node:tls';
import { Agent, fetch as undiciFetch } from 'undici';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import {
  createDatabase, idemStatus, makeCertificates, makeClientCertificate, readLedger, replayMarker,
  startGateway, startRefundServer, toYaml, toolText, waitFor,
} from './lib/harness.mjs';

const REFUND = /^Refunded (\d+) cents on order (\S+)/;

/** An undici dispatcher trusting ca (paths), presenting client ({cert, key}) when given. */
async function dispatcher(t, ca, client) {
  const connect = { ca: await Promise.all([].concat(ca).map((f) => fs.readFile(f))) };
  if (client) Object.assign(connect, { cert: await fs.readFile(client.cert), key: await fs.readFile(client.key) });
  const agent = new Agent({ connect });
  t.after(() => agent.close().catch(() => {}));
  return agent;
}

/** An SDK client over HTTPS through agent. */
async function httpsClient(t, url, agent) {
  const client = new Client({ name: 'idemgw-tls-test', version: '1.0.0' }, { capabilities: {} });
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    fetch: (u, init) => undiciFetch(u, { ...init, dispatcher: agent }),
  });
  await client.connect(transport);
  t.after(() => client.close().catch(() => {}));
  return client;
}

async function gateway(t, certs, { listenTls = {}, subject } = {}) {
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: {
      listen_tls: { cert_file: certs.cert, key_file: certs.key, ...listenTls },
      subject: subject ?? { static: 'tenant-tls' },
    },
  });
  return { upstream, gw, url: gw.url.replace(/^http:/, 'https:') };
}

test('HTTPS towards agents: a protected call executes once, its repeat is a replay', async (t) => {
  const certs = await makeCertificates(t);
  const { upstream, gw, url } = await gateway(t, certs);
  const client = await httpsClient(t, url, await dispatcher(t, certs.ca));
  const args = { order_id: 'ord-https', amount_cents: 700 };
  const first = await client.callTool({ name: 'issue_refund', arguments: args });
  assert.match(toolText(first), REFUND);
  assert.equal(replayMarker(first), undefined);
  const again = await client.callTool({ name: 'issue_refund', arguments: args });
  assert.ok(replayMarker(again), `the repeat is a replay: ${JSON.stringify(again)}`);
  assert.equal((await readLedger(upstream.ledger)).length, 1, 'executed once');
  // plain HTTP on the TLS port gets no HTTP answer
  await assert.rejects(fetch(gw.url, { method: 'POST', body: '{}' }));
  // a client that does not trust the CA does not connect
  await assert.rejects(undiciFetch(url, { method: 'POST', body: '{}', dispatcher: await dispatcher(t, certs.otherCa) }));
});

test('mTLS with subject client_cert spiffe: one key per SPIFFE id; two URI SANs refused; no certificate fails the handshake', async (t) => {
  const certs = await makeCertificates(t);
  const { upstream, url } = await gateway(t, certs, {
    listenTls: { client_ca_file: certs.ca },
    subject: { client_cert: 'spiffe' },
  });
  const a = await makeClientCertificate(certs, 'a', { san: ['URI:spiffe://example.org/ns/a/sa/agent'] });
  const b = await makeClientCertificate(certs, 'b', { san: ['URI:spiffe://example.org/ns/b/sa/agent'] });
  const two = await makeClientCertificate(certs, 'two', {
    san: ['URI:spiffe://example.org/ns/a/sa/agent', 'URI:spiffe://example.org/ns/b/sa/agent'],
  });
  const notSpiffe = await makeClientCertificate(certs, 'web', { san: ['URI:https://example.org/agent'] });
  const stranger = await makeClientCertificate(certs, 'stranger', {
    san: ['URI:spiffe://example.org/ns/a/sa/agent'], otherCa: true,
  });
  const args = { order_id: 'ord-mtls', amount_cents: 300 };

  const ca = await httpsClient(t, url, await dispatcher(t, certs.ca, a));
  const cb = await httpsClient(t, url, await dispatcher(t, certs.ca, b));
  const ra = await ca.callTool({ name: 'issue_refund', arguments: args });
  const rb = await cb.callTool({ name: 'issue_refund', arguments: args });
  assert.match(toolText(ra), REFUND);
  assert.match(toolText(rb), REFUND);
  assert.equal(replayMarker(rb), undefined, 'another SPIFFE id is another caller');
  assert.ok(replayMarker(await ca.callTool({ name: 'issue_refund', arguments: args })), 'a repeat of a is a replay');
  assert.equal((await readLedger(upstream.ledger)).length, 2, 'each caller executed once');

  for (const [cert, why] of [[two, /more than one URI/], [notSpiffe, /not a SPIFFE id/]]) {
    const c = await httpsClient(t, url, await dispatcher(t, certs.ca, cert));
    const r = await c.callTool({ name: 'issue_refund', arguments: { order_id: 'ord-bad', amount_cents: 1 } });
    assert.equal(r.isError, true, JSON.stringify(r));
    assert.equal(idemStatus(r)?.code, 'bad_subject', JSON.stringify(r));
    assert.equal(idemStatus(r)?.executed, false);
    assert.match(toolText(r), why);
  }
  assert.equal((await readLedger(upstream.ledger)).length, 2, 'nothing executed for the refused');

  const init = { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{}' };
  await assert.rejects(undiciFetch(url, { ...init, dispatcher: await dispatcher(t, certs.ca) }),
    'no client certificate: the handshake fails');
  await assert.rejects(undiciFetch(url, { ...init, dispatcher: await dispatcher(t, certs.ca, stranger) }),
    'a certificate from another CA: the handshake fails');
});

/** Connects with TLS trusting cas; resolves with the socket once secure. */
function connectTls(port, cas) {
  return new Promise((resolve, reject) => {
    const s = tls.connect({ host: '127.0.0.1', port, ca: cas, ALPNProtocols: ['http/1.1'] }, () => resolve(s));
    s.once('error', reject);
  });
}

/** One HTTP/1.1 request on socket s; resolves with the status line. */
function statusLine(s) {
  return new Promise((resolve, reject) => {
    let text = '';
    const onData = (d) => {
      text += d;
      const end = text.indexOf('\r\n');
      if (end >= 0) {
        s.off('data', onData);
        resolve(text.slice(0, end));
      }
    };
    s.on('data', onData);
    s.once('error', reject);
    s.write('GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n');
  });
}

const fingerprint = async (file) => new crypto.X509Certificate(await fs.readFile(file)).fingerprint256;

test('SIGHUP loads a new certificate for new connections; an open connection keeps working; a bad one keeps the running one', async (t) => {
  const certs = await makeCertificates(t);
  const next = await makeCertificates(t);
  const { gw } = await gateway(t, certs);
  const cas = await Promise.all([certs.ca, next.ca].map((f) => fs.readFile(f)));
  const old = await connectTls(gw.port, cas);
  t.after(() => old.destroy());
  assert.equal(old.getPeerCertificate().fingerprint256, await fingerprint(certs.cert));
  assert.equal(old.alpnProtocol, 'http/1.1');

  const base = { listen: `127.0.0.1:${gw.port}`, admin_listen: `127.0.0.1:${gw.adminPort}`, upstream: (await fs.readFile(gw.configPath, 'utf8')).match(/upstream: (\S+)/)[1], database_url: (await fs.readFile(gw.configPath, 'utf8')).match(/database_url: (\S+)/)[1], subject: { static: 'tenant-tls' } };
  await fs.writeFile(gw.configPath, toYaml({ ...base, listen_tls: { cert_file: next.cert, key_file: next.key } }));
  let mark = gw.logs().length;
  gw.proc.kill('SIGHUP');
  await waitFor(() => gw.logs().slice(mark).includes('configuration reloaded'));
  const fresh = await connectTls(gw.port, cas);
  t.after(() => fresh.destroy());
  assert.equal(fresh.getPeerCertificate().fingerprint256, await fingerprint(next.cert), 'a new connection: the new certificate');
  assert.match(await statusLine(fresh), /^HTTP\/1\.1 \d{3} /);
  assert.match(await statusLine(old), /^HTTP\/1\.1 \d{3} /, 'the open connection still answers');

  // a key that does not match its certificate: logged, the running certificate stays
  await fs.writeFile(gw.configPath, toYaml({ ...base, listen_tls: { cert_file: certs.cert, key_file: next.key } }));
  mark = gw.logs().length;
  gw.proc.kill('SIGHUP');
  await waitFor(() => gw.logs().slice(mark).includes('configuration reloaded'));
  assert.match(gw.logs().slice(mark), /listen_tls\.key_file .*keeping the running certificate/);
  const third = await connectTls(gw.port, cas);
  t.after(() => third.destroy());
  assert.equal(third.getPeerCertificate().fingerprint256, await fingerprint(next.cert));
});

test('a bad certificate at start is a configuration error', async (t) => {
  const certs = await makeCertificates(t);
  const upstream = await startRefundServer(t);
  await assert.rejects(startGateway(t, {
    upstream: upstream.url,
    config: { listen_tls: { cert_file: certs.key, key_file: certs.key } },
  }), /listen_tls\.cert_file/);
});
