// Keys and tokens for the JWT verification benchmark (scripts/bench.sh, section jwt): writes
// DIR/jwks.json (an RSA-2048 and a P-256 public key) and DIR/tokens.txt ("ALG TOKEN" lines, one
// token per algorithm, valid for an hour), signed with Node's crypto.
//   node jwt-tokens.mjs DIR
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';

const dir = process.argv[2];
const b64 = (b) => Buffer.from(b).toString('base64url');
const rsa = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
const ec = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' });
const jwk = (k, kid) => ({ ...k.publicKey.export({ format: 'jwk' }), kid });
fs.writeFileSync(path.join(dir, 'jwks.json'), JSON.stringify({ keys: [jwk(rsa, 'rsa'), jwk(ec, 'ec')] }));

const now = Math.floor(Date.now() / 1000);
const claims = b64(JSON.stringify({ iss: 'https://idp.bench', sub: 'agent-1', aud: 'mcp-bench', exp: now + 3600 }));
function token(alg, kid, key, opts) {
  const input = `${b64(JSON.stringify({ alg, kid, typ: 'JWT' }))}.${claims}`;
  return `${input}.${b64(crypto.sign('sha256', Buffer.from(input), { key, ...opts }))}`;
}
const lines = [
  `RS256 ${token('RS256', 'rsa', rsa.privateKey)}`,
  `ES256 ${token('ES256', 'ec', ec.privateKey, { dsaEncoding: 'ieee-p1363' })}`,
];
fs.writeFileSync(path.join(dir, 'tokens.txt'), lines.join('\n') + '\n');
