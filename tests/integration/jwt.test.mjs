// subject: {jwt: ...}: callers named by the claims of a verified JWT, so a retry that carries
// a refreshed access token (the SDK client's OAuth refresh) is still the same caller and is
// replayed, not executed again. The keys come from a JWK Set the gateway fetches over HTTPS
// (a server in this file, certificate from a private CA given as subject.jwt.ca_file); tokens
// are signed here with Node's crypto (RS256, ES256, EdDSA). Every refusal is bad_token with a
// reason, in the answer and in the request's log line, and nothing is executed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs/promises';
import https from 'node:https';
import {
  createDatabase, idemStatus, makeCertificates, rawSession, readLedger, replayMarker, startGateway,
  startRefundServer, toolText, waitFor, waitForLog,
} from './lib/harness.mjs';
import { AUDIENCE, ISSUER, b64url, bearer, claimsFor, makeKey, now, sign } from './lib/tokens.mjs';

const REFUND = /^Refunded (\d+) cents on order (\S+)/;

/**
 * The identity provider's JWK Set over HTTPS. keys: what it serves now (change it freely);
 * requests: how many fetches it answered; delayMs: how long each answer waits; stop().
 */
async function startJwksServer(t, certs, keys) {
  const cert = await fs.readFile(certs.cert);
  const key = await fs.readFile(certs.key);
  const state = { keys, requests: 0, delayMs: 0 };
  const server = https.createServer({ cert, key }, (req, res) => {
    state.requests++;
    setTimeout(() => {
      res.writeHead(200, { 'Content-Type': 'application/jwk-set+json' });
      res.end(JSON.stringify({ keys: state.keys.map((k) => k.jwk) }));
    }, state.delayMs);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  state.url = `https://127.0.0.1:${server.address().port}/.well-known/jwks.json`;
  state.stop = () => new Promise((resolve) => {
    server.closeAllConnections();
    server.close(resolve);
  });
  t.after(() => state.stop().catch(() => {}));
  return state;
}

async function setup(t, { keys, jwt = {} } = {}) {
  const certs = await makeCertificates(t);
  const jwks = await startJwksServer(t, certs, keys);
  const upstream = await startRefundServer(t);
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl: await createDatabase(),
    config: {
      subject: { jwt: { jwks_url: jwks.url, ca_file: certs.ca, issuer: ISSUER, audience: [AUDIENCE, 'other-api'], ...jwt } },
      tools: { get_ledger: { class: 'read' } },
    },
  });
  await waitForLog(gw, /jwks: \d+ keys from https:/);
  const raw = await rawSession(t, gw.url);
  return { certs, jwks, upstream, gw, raw };
}

/** A protected call with token: the tool result (or error) the agent got. */
async function refund(raw, token, args) {
  const r = await raw.call('issue_refund', args, { headers: token ? bearer(token) : {} });
  assert.equal(r.status, 200, r.body);
  assert.ok(r.message?.result, `a result: ${r.body}`);
  return r.message.result;
}

function assertRefused(result) {
  assert.equal(result.isError, true, JSON.stringify(result));
  assert.equal(idemStatus(result)?.code, 'bad_token', JSON.stringify(result));
  assert.equal(idemStatus(result)?.executed, false);
  assert.match(toolText(result), /access token was not accepted \(.+\)/);
  assert.match(toolText(result), /Nothing was executed/);
}

test('a refreshed token is the same caller: the retry is replayed; another sub executes on its own', async (t) => {
  const rsa = makeKey('RS256', 'rsa-1');
  const ec = makeKey('ES256', 'ec-1');
  const ed = makeKey('EdDSA', 'ed-1');
  const { upstream, gw, raw } = await setup(t, { keys: [rsa, ec, ed], jwt: { leeway: '0s' } });
  const args = { order_id: 'ord-jwt-1', amount_cents: 1200 };

  // Token A expires in two seconds; the retry comes after that with token B (same sub,
  // another key and algorithm even), as a client that refreshed its token would send it.
  const tokenA = sign(rsa, claimsFor('alice', { exp: now() + 2 }));
  const first = await refund(raw, tokenA, args);
  assert.match(toolText(first), REFUND);
  assert.equal(replayMarker(first), undefined);
  const expA = JSON.parse(Buffer.from(tokenA.split('.')[1], 'base64url')).exp;
  await waitFor(() => Date.now() >= expA * 1000 + 100, { timeoutMs: 5000, what: 'token A to expire' });

  const stale = await refund(raw, tokenA, args);
  assertRefused(stale);
  assert.match(toolText(stale), /expired/);

  const tokenB = sign(ec, claimsFor('alice'));
  const retry = await refund(raw, tokenB, args);
  assert.ok(replayMarker(retry), `the retry under a new token is a replay: ${JSON.stringify(retry)}`);
  assert.equal(toolText(retry), toolText(first));
  const tokenC = sign(ed, claimsFor('alice', { aud: ['x', 'other-api'] }));
  assert.ok(replayMarker(await refund(raw, tokenC, args)), 'EdDSA, aud as a list: the same caller');
  assert.equal((await readLedger(upstream.ledger)).length, 1, 'executed once');

  // another sub is another caller: its identical call executes
  const bob = await refund(raw, sign(ed, claimsFor('bob')), args);
  assert.match(toolText(bob), REFUND);
  assert.equal(replayMarker(bob), undefined);
  assert.equal((await readLedger(upstream.ledger)).length, 2);

  // the log line says why, never the token
  await waitForLog(gw, /"code":"bad_token","why":"expired"/);
  for (const tok of [tokenA, tokenB, tokenC])
    assert.ok(!gw.logs().includes(tok.split('.')[2]), 'no token (signature) in the logs');
});

test('tokens that do not verify are refused bad_token with their reason; nothing executes', async (t) => {
  const rsa = makeKey('RS256', 'rsa-1');
  const ec = makeKey('ES256', 'ec-1');
  const stranger = makeKey('RS256', 'rsa-1'); // the same kid, another key
  const { upstream, gw, raw } = await setup(t, { keys: [rsa, ec] });
  const args = { order_id: 'ord-jwt-bad', amount_cents: 700 };

  const pubPem = rsa.publicKey.export({ type: 'spki', format: 'pem' });
  const hsInput = `${b64url(JSON.stringify({ alg: 'HS256', typ: 'JWT', kid: 'rsa-1' }))}.${b64url(JSON.stringify(claimsFor('alice')))}`;
  const hs256 = `${hsInput}.${b64url(crypto.createHmac('sha256', pubPem).update(hsInput).digest())}`;
  const noneToken = `${b64url(JSON.stringify({ alg: 'none', typ: 'JWT' }))}.${b64url(JSON.stringify(claimsFor('alice')))}.`;
  const good = sign(rsa, claimsFor('alice'));
  const tampered = good.split('.');
  tampered[1] = b64url(JSON.stringify(claimsFor('mallory')));

  const cases = [
    ['expired', sign(rsa, claimsFor('alice', { exp: now() - 120 }))],
    ['not_yet_valid', sign(rsa, claimsFor('alice', { nbf: now() + 600 }))],
    ['wrong_issuer', sign(rsa, claimsFor('alice', { iss: 'https://evil.test' }))],
    ['wrong_audience', sign(rsa, claimsFor('alice', { aud: 'another-service' }))],
    ['bad_signature', sign(stranger, claimsFor('alice'))],
    ['bad_signature', tampered.join('.')],
    ['alg_not_allowed', noneToken],
    ['alg_not_allowed', hs256],
    ['unknown_key', sign(makeKey('ES256', 'ec-unknown'), claimsFor('alice'))],
    ['missing_claim', sign(ec, { iss: ISSUER, aud: AUDIENCE, exp: now() + 600 })],
    ['malformed', 'not-a-jwt'],
  ];
  for (const [why, token] of cases) {
    const r = await refund(raw, token, args);
    assertRefused(r);
    await waitForLog(gw, new RegExp(`"outcome":"refused".*"code":"bad_token","why":"${why}"`));
  }
  // no token at all: no caller, as with every bearer-based subject
  const none = await refund(raw, null, args);
  assert.equal(idemStatus(none)?.code, 'no_subject');
  assert.equal((await readLedger(upstream.ledger)).length, 0, 'nothing executed');

  // reads and other requests pass untouched whatever the token
  const read = await raw.call('get_ledger', {}, { headers: bearer('not-a-jwt') });
  assert.equal(read.status, 200);
  assert.notEqual(read.message?.result?.isError, true, read.body);

  // and the valid token goes through
  assert.match(toolText(await refund(raw, good, args)), REFUND);
  assert.equal((await readLedger(upstream.ledger)).length, 1);
});

test('a kid the set gains later: fetched again, the waiting call completes when the fetch ends', async (t) => {
  const k1 = makeKey('RS256', 'k1');
  const k2 = makeKey('ES256', 'k2');
  const { upstream, jwks, raw, gw } = await setup(t, { keys: [k1] });
  assert.equal(jwks.requests, 1, 'fetched once at start');
  // the identity provider rotates: k2 is published, and its first tokens arrive
  jwks.keys = [k1, k2];
  jwks.delayMs = 400;
  const started = Date.now();
  const r = await refund(raw, sign(k2, claimsFor('carol')), { order_id: 'ord-rot', amount_cents: 5 });
  assert.match(toolText(r), REFUND, JSON.stringify(r));
  assert.ok(Date.now() - started >= 350, 'the call waited for the fetch');
  assert.equal(jwks.requests, 2, 'one more fetch');
  await waitForLog(gw, /a token names a key not in the set/);
  assert.equal((await readLedger(upstream.ledger)).length, 1);
});

test('a burst of unknown kids makes one fetch; within 10 s no more', async (t) => {
  const k1 = makeKey('EdDSA', 'k1');
  const { upstream, jwks, raw } = await setup(t, { keys: [k1] });
  assert.equal(jwks.requests, 1);
  jwks.delayMs = 200;
  const forged = Array.from({ length: 8 }, (_, i) => sign(makeKey('EdDSA', `forged-${i}`), claimsFor('eve')));
  const results = await Promise.all(forged.map((tok, i) => refund(raw, tok, { order_id: `ord-burst-${i}`, amount_cents: 1 })));
  for (const r of results) {
    assertRefused(r);
    assert.match(toolText(r), /key the gateway does not know/);
  }
  assert.equal(jwks.requests, 2, 'the whole burst: one fetch');
  assertRefused(await refund(raw, forged[0], { order_id: 'ord-burst-x', amount_cents: 1 }));
  assert.equal(jwks.requests, 2, 'debounced: no fetch within 10 s');
  assert.equal((await readLedger(upstream.ledger)).length, 0);
});

test('the JWKS server down after a good fetch: the last good set keeps verifying', async (t) => {
  const k1 = makeKey('ES256', 'k1');
  const { upstream, jwks, raw, gw } = await setup(t, { keys: [k1] });
  await jwks.stop();
  // an unknown kid makes the gateway fetch, which fails; the set it had stays
  assertRefused(await refund(raw, sign(makeKey('ES256', 'k9'), claimsFor('dave')), { order_id: 'ord-down-0', amount_cents: 1 }));
  await waitForLog(gw, /jwks: fetching https:\S+ failed \(.*\); keeping the last good key set/);
  const r = await refund(raw, sign(k1, claimsFor('dave')), { order_id: 'ord-down-1', amount_cents: 3 });
  assert.match(toolText(r), REFUND, JSON.stringify(r));
  assert.equal((await readLedger(upstream.ledger)).length, 1);
});

test('a stream with a protected result is resumed by its caller\'s refreshed token only, whoever serves it', async (t) => {
  const rsa = makeKey('RS256', 'rsa-1');
  const other = makeKey('RS256', 'rsa-unknown'); // not in the JWK Set: does not verify
  const { upstream, gw, raw } = await setup(t, { keys: [rsa] });
  // SSE polling: the upstream ends the POST stream after its priming event; the result comes
  // on the resumed GET stream, which the upstream's event store serves
  const polled = await raw.call('polling_refund', { order_id: 'ord-jwt-poll', amount_cents: 5, delay_ms: 300 },
    { id: 'poll-jwt', headers: bearer(sign(rsa, claimsFor('alice'))) });
  assert.equal(polled.message, null, 'no result on the POST stream');
  const primingId = [...polled.body.matchAll(/^id: ?(.+)$/gm)].map((m) => m[1].trim()).pop();
  const resume = (headers, signal) => fetch(gw.url, {
    method: 'GET',
    signal,
    headers: { ...headers, Accept: 'text/event-stream', 'Mcp-Session-Id': raw.sessionId, 'MCP-Protocol-Version': '2025-11-25', 'Last-Event-ID': primingId },
  });
  for (const [what, headers, why] of [
    ['another sub', bearer(sign(rsa, claimsFor('bob'))), /comes from another caller/],
    ['a token that does not verify', bearer(sign(other, claimsFor('alice'))), /names no caller/],
    ['no token', {}, /names no caller/],
  ]) {
    const ac = new AbortController();
    const res = await resume(headers, ac.signal);
    if (res.status !== 403) {
      ac.abort();
      assert.fail(`${what}: resumed with HTTP ${res.status}`);
    }
    assert.match((await res.json()).error.message, why, what);
  }
  // alice again, with a token issued later (another token, the same caller)
  const own = await resume(bearer(sign(rsa, claimsFor('alice', { iat: now() + 1, jti: 'refreshed' }))));
  assert.equal(own.status, 200);
  const text = await own.text().catch(() => '');
  assert.match(text, /Refunded 5 cents on order ord-jwt-poll/);
  assert.equal((await readLedger(upstream.ledger)).length, 1, 'executed once');
});
