// Combined subjects: a workload acting for a user. With subject: {client_cert: spiffe, jwt: ...}
// the caller is the SPIFFE id of the workload's verified client certificate together with the
// user the bearer token names, so the same user through two workloads is two callers, and two
// users through one workload are two callers; a new certificate or a refreshed token for the
// same pair is the same caller. A call missing either part is refused as that source alone
// refuses it, and nothing executes. Certificates from the openssl CLI (makeCertificates),
// tokens signed with Node's crypto (lib/tokens.mjs), the SDK client over mutual TLS.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import path from 'node:path';
import {
  createDatabase, idemStatus, makeCertificates, makeClientCertificate, mcpClient, readLedger,
  replayMarker, startGateway, startRefundServer, tlsAgent, toolText, waitForLog,
} from './lib/harness.mjs';
import { AUDIENCE, ISSUER, bearer, claimsFor, makeKey, now, sign } from './lib/tokens.mjs';

const REFUND = /^Refunded (\d+) cents on order (\S+)/;

async function gateway(t, certs, subject) {
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: {
      listen_tls: { cert_file: certs.cert, key_file: certs.key, client_ca_file: certs.ca },
      subject,
    },
  });
  return { upstream, gw, url: gw.url.replace(/^http:/, 'https:') };
}

/** A protected call from the workload holding cert, with headers: the tool result. */
async function refund(t, certs, url, cert, headers, args) {
  const client = await mcpClient(t, url, { dispatcher: await tlsAgent(t, certs.ca, cert), headers, name: 'idemgw-combined-test' });
  const r = await client.callTool({ name: 'issue_refund', arguments: args });
  await client.close();
  return r;
}

function assertRefused(r, code, why) {
  assert.equal(r.isError, true, JSON.stringify(r));
  assert.equal(idemStatus(r)?.code, code, JSON.stringify(r));
  assert.equal(idemStatus(r)?.executed, false);
  assert.match(toolText(r), why);
}

test('client_cert spiffe with jwt: one key per (workload, user); a new certificate or token for the pair replays; a missing part is refused', async (t) => {
  const certs = await makeCertificates(t);
  const k1 = makeKey('ES256', 'k1');
  const k2 = makeKey('EdDSA', 'k2');
  const jwksFile = path.join(certs.dir, 'jwks.json');
  await fs.writeFile(jwksFile, JSON.stringify({ keys: [k1.jwk, k2.jwk] }));
  const { upstream, gw, url } = await gateway(t, certs, {
    client_cert: 'spiffe',
    jwt: { jwks_file: jwksFile, issuer: ISSUER, audience: AUDIENCE, leeway: '0s' },
  });
  const billing = await makeClientCertificate(certs, 'billing', { san: ['URI:spiffe://example.org/ns/a/sa/billing'] });
  const billingRenewed = await makeClientCertificate(certs, 'billing-2', { san: ['URI:spiffe://example.org/ns/a/sa/billing'] });
  const support = await makeClientCertificate(certs, 'support', { san: ['URI:spiffe://example.org/ns/a/sa/support'] });
  const noId = await makeClientCertificate(certs, 'no-id', { san: ['DNS:billing.example'] });
  const call = (cert, token, args) => refund(t, certs, url, cert, token ? bearer(token) : {}, args);
  const args = { order_id: 'ord-combined', amount_cents: 900 };

  const first = await call(billing, sign(k1, claimsFor('alice')), args);
  assert.match(toolText(first), REFUND);
  assert.equal(replayMarker(first), undefined);
  // the workload renewed its certificate and the user's token was refreshed (another key even)
  const retry = await call(billingRenewed, sign(k2, claimsFor('alice')), args);
  assert.ok(replayMarker(retry), `the same workload and user: a replay: ${JSON.stringify(retry)}`);
  assert.equal(toolText(retry), toolText(first));
  // the same user through another workload, another user through the same workload
  const viaSupport = await call(support, sign(k1, claimsFor('alice')), args);
  assert.match(toolText(viaSupport), REFUND);
  assert.equal(replayMarker(viaSupport), undefined, 'the same user through another workload is another caller');
  const bob = await call(billing, sign(k1, claimsFor('bob')), args);
  assert.match(toolText(bob), REFUND);
  assert.equal(replayMarker(bob), undefined, 'another user through the same workload is another caller');
  assert.equal((await readLedger(upstream.ledger)).length, 3, 'each pair executed once');

  // either part missing or not accepted: refused as that source alone refuses it
  const other = { order_id: 'ord-combined-refused', amount_cents: 1 };
  assertRefused(await call(billing, null, other), 'no_subject', /no bearer token/);
  assertRefused(await call(billing, sign(k1, claimsFor('alice', { exp: now() - 60 })), other), 'bad_token', /expired/);
  await waitForLog(gw, /"outcome":"refused".*"code":"bad_token","why":"expired"/);
  assertRefused(await call(noId, sign(k1, claimsFor('alice')), other), 'no_subject', /no URI subject alternative name/);
  assertRefused(await call(billing, sign(makeKey('ES256', 'k1'), claimsFor('alice')), other), 'bad_token', /signature/);
  assert.equal((await readLedger(upstream.ledger)).length, 3, 'nothing executed for the refused');
  assert.ok(replayMarker(await call(billing, sign(k2, claimsFor('alice')), args)), 'the first pair still replays');
});

test('client_cert cn with header: the name the workload vouches for, per workload', async (t) => {
  const certs = await makeCertificates(t);
  const { upstream, url } = await gateway(t, certs, { client_cert: 'cn', header: 'X-User' });
  const agentA = await makeClientCertificate(certs, 'agent-a');
  const agentA2 = await makeClientCertificate(certs, 'agent-a2', { cn: 'agent-a' });
  const agentB = await makeClientCertificate(certs, 'agent-b');
  const call = (cert, user, args) => refund(t, certs, url, cert, user ? { 'X-User': user } : {}, args);
  const args = { order_id: 'ord-header', amount_cents: 250 };

  assert.match(toolText(await call(agentA, 'alice', args)), REFUND);
  assert.ok(replayMarker(await call(agentA2, 'alice', args)), 'agent-a again (another certificate): a replay');
  assert.equal(replayMarker(await call(agentB, 'alice', args)), undefined, 'alice through agent-b: executes');
  assert.equal(replayMarker(await call(agentA, 'bob', args)), undefined, 'bob through agent-a: executes');
  assert.equal((await readLedger(upstream.ledger)).length, 3);
  assertRefused(await call(agentA, null, { order_id: 'ord-header-x', amount_cents: 1 }), 'no_subject', /caller identity header \(X-User\)/);
  assert.equal((await readLedger(upstream.ledger)).length, 3, 'nothing executed for the refused');
});

test('a combination that makes no sense is a configuration error at start', async (t) => {
  const certs = await makeCertificates(t);
  const upstream = await startRefundServer(t);
  const listenTls = { cert_file: certs.cert, key_file: certs.key, client_ca_file: certs.ca };
  await assert.rejects(startGateway(t, {
    upstream: upstream.url,
    config: { listen_tls: listenTls, subject: { client_cert: 'spiffe', static: 'tenant-a' } },
  }), /subject: static cannot be combined with client_cert/);
  await assert.rejects(startGateway(t, {
    upstream: upstream.url,
    config: { subject: { client_cert: 'spiffe', header: 'X-User' } },
  }), /idemgw\.yaml:\d+: subject\.client_cert: needs listen_tls with client_ca_file/);
});
