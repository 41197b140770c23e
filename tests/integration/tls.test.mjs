// listen_tls: agents reach the gateway over HTTPS, and with client_ca_file over mutual TLS,
// where subject: {client_cert: spiffe} names each caller by the SPIFFE id of its verified
// certificate. Certificates come from a private CA made here with the openssl CLI; the SDK
// client talks through undici with that CA (and a client certificate). A SIGHUP loads a new
// server certificate for new connections while an open connection keeps its own.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs/promises';
import net from 'node:net';
import { once } from 'node:events';
import tls from 'node:tls';
import { fetch as undiciFetch } from 'undici';
import {
  createDatabase, idemStatus, makeCertificates, makeClientCertificate, mcpClient, readLedger,
  replayMarker, startGateway, startRefundServer, tlsAgent, toYaml, toolText, waitFor, waitForLog,
} from './lib/harness.mjs';

const REFUND = /^Refunded (\d+) cents on order (\S+)/;

const dispatcher = tlsAgent;

/** An SDK client over HTTPS through agent (tlsAgent). */
const httpsClient = (t, url, agent, headers = {}) => mcpClient(t, url, { dispatcher: agent, headers, name: 'idemgw-tls-test' });

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

// san_uri, san_dns and cn: one case each. same and alsoSame are two certificates (two keys)
// carrying the same name, other another name, missing a certificate without the name.
const NAME_CASES = [
  {
    source: 'san_uri',
    same: { san: ['URI:https://agents.example/billing', 'URI:urn:ignored:second'] },
    alsoSame: { san: ['URI:https://agents.example/billing', 'DNS:billing.example'] },
    other: { san: ['URI:https://agents.example/support'] },
    missing: { san: ['DNS:billing.example'] },
    why: /client certificate has no URI subject alternative name/,
  },
  {
    source: 'san_dns',
    same: { san: ['DNS:billing.agents.example', 'DNS:second.example'] },
    alsoSame: { san: ['DNS:billing.agents.example', 'URI:https://agents.example/x'] },
    other: { san: ['DNS:support.agents.example'] },
    missing: { san: ['URI:https://agents.example/billing'] },
    why: /client certificate has no DNS subject alternative name/,
  },
  {
    source: 'cn',
    same: { cn: 'billing-agent' },
    alsoSame: { cn: 'billing-agent', san: ['DNS:other.example'] },
    other: { cn: 'support-agent' },
    missing: { cn: null, san: ['DNS:billing.agents.example'] },
    why: /client certificate's subject has no common name/,
  },
];

for (const c of NAME_CASES) {
  test(`mTLS with subject client_cert ${c.source}: one key per name, the same name from another certificate replays, no such name is refused`, async (t) => {
    const certs = await makeCertificates(t);
    const { upstream, gw, url } = await gateway(t, certs, {
      listenTls: { client_ca_file: certs.ca },
      subject: { client_cert: c.source },
    });
    const cert = {};
    for (const k of ['same', 'alsoSame', 'other', 'missing']) cert[k] = await makeClientCertificate(certs, `${c.source}-${k}`, c[k]);
    const client = {};
    for (const k of Object.keys(cert)) client[k] = await httpsClient(t, url, await dispatcher(t, certs.ca, cert[k]));
    const args = { order_id: `ord-${c.source}`, amount_cents: 410 };

    const first = await client.same.callTool({ name: 'issue_refund', arguments: args });
    assert.match(toolText(first), REFUND);
    assert.equal(replayMarker(first), undefined);
    const again = await client.alsoSame.callTool({ name: 'issue_refund', arguments: args });
    assert.ok(replayMarker(again), `the same name through another certificate is the same caller: ${JSON.stringify(again)}`);
    assert.equal(toolText(again), toolText(first));
    const other = await client.other.callTool({ name: 'issue_refund', arguments: args });
    assert.match(toolText(other), REFUND);
    assert.equal(replayMarker(other), undefined, 'another name is another caller');
    assert.equal((await readLedger(upstream.ledger)).length, 2, 'each name executed once');

    const refused = await client.missing.callTool({ name: 'issue_refund', arguments: { order_id: `ord-${c.source}-x`, amount_cents: 1 } });
    assert.equal(refused.isError, true, JSON.stringify(refused));
    assert.equal(idemStatus(refused)?.code, 'no_subject', JSON.stringify(refused));
    assert.equal(idemStatus(refused)?.executed, false);
    assert.match(toolText(refused), c.why);
    assert.equal((await readLedger(upstream.ledger)).length, 2, 'nothing executed for the refused');
    await waitForLog(gw, /"outcome":"refused".*"code":"no_subject"/);
  });
}

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

test('a stalled TLS handshake is closed by the header timeout, which runs from accept', { timeout: 30000 }, async (t) => {
  // client_idle is far beyond the test's own timeout: a close now comes from client_header.
  const certs = await makeCertificates(t);
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    config: {
      listen_tls: { cert_file: certs.cert, key_file: certs.key },
      subject: { static: 'tenant-tls' },
      timeouts: { client_header: '1s', client_idle: '10m' },
    },
  });
  const stalled = [];
  for (let i = 0; i < 6; i++) {
    const s = net.connect(gw.port, '127.0.0.1');
    await once(s, 'connect');
    // half of them send the start of a ClientHello record and then nothing more
    if (i % 2) s.write(Buffer.from([0x16, 0x03, 0x01, 0x02, 0x00, 0x01]));
    s.on('error', () => {});
    t.after(() => s.destroy());
    stalled.push(once(s, 'close'));
  }
  await Promise.all(stalled);
  // the listener still serves a complete handshake and request
  const ok = await connectTls(gw.port, [await fs.readFile(certs.ca)]);
  t.after(() => ok.destroy());
  assert.match(await statusLine(ok), /^HTTP\/1\.1 \d{3} /);
});
