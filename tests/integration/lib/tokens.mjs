// JWTs for the tests of jwt subjects: signing keys made with Node's crypto, compact JWS
// tokens signed with them, and claims for the test issuer and audience. The gateway verifies
// with OpenSSL, so these are an independent signer.
import crypto from 'node:crypto';

export const ISSUER = 'https://idp.test';
export const AUDIENCE = 'mcp-refunds';

export const b64url = (buf) => Buffer.from(buf).toString('base64url');

/** A signing key: {kid, alg, privateKey, publicKey, jwk (public, with kid)}. */
export function makeKey(kind, kid) {
  const opts = {
    RS256: ['rsa', { modulusLength: 2048 }],
    ES256: ['ec', { namedCurve: 'P-256' }],
    EdDSA: ['ed25519', {}],
  }[kind];
  const { privateKey, publicKey } = crypto.generateKeyPairSync(...opts);
  return { kid, alg: kind, privateKey, publicKey, jwk: { ...publicKey.export({ format: 'jwk' }), kid, use: 'sig' } };
}

/** A compact JWS of claims signed with key (header overrides merged in). */
export function sign(key, claims, header = {}) {
  const h = { alg: key.alg, typ: 'JWT', kid: key.kid, ...header };
  const input = `${b64url(JSON.stringify(h))}.${b64url(JSON.stringify(claims))}`;
  let sig;
  if (h.alg === 'RS256') sig = crypto.sign('sha256', Buffer.from(input), key.privateKey);
  else if (h.alg === 'ES256') sig = crypto.sign('sha256', Buffer.from(input), { key: key.privateKey, dsaEncoding: 'ieee-p1363' });
  else if (h.alg === 'EdDSA') sig = crypto.sign(null, Buffer.from(input), key.privateKey);
  else throw new Error(`cannot sign ${h.alg}`);
  return `${input}.${b64url(sig)}`;
}

export const now = () => Math.floor(Date.now() / 1000);
export const claimsFor = (sub, extra = {}) => ({ iss: ISSUER, sub, aud: AUDIENCE, iat: now(), exp: now() + 600, ...extra });
export const bearer = (token) => ({ Authorization: `Bearer ${token}` });
