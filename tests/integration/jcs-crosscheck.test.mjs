// Cross-checks our canonical JSON against an independent RFC 8785 implementation: for random
// argument objects, the h: part of `idemgw key` must be the first 32 hex characters of
// sha256(canonicalize(args)).
//
// IDEMGW_BIN selects the binary (default build/idemgw, relative to the repo root).
// IDEMGW_SEED makes a run reproducible (the seed used is printed on failure);
// IDEMGW_CROSSCHECK_N sets how many objects are tried (default 300).
//
// Numbers come from JavaScript, so every literal we receive is already the shortest form; the
// deliberate departure for integer literals beyond 2^53 therefore never shows up here.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { promisify } from 'node:util';
import canonicalize from 'canonicalize';

const run = promisify(execFile);
const BIN = process.env.IDEMGW_BIN || 'build/idemgw';
const SEED = Number(process.env.IDEMGW_SEED || Date.now() % 0x7fffffff);
const N = Number(process.env.IDEMGW_CROSSCHECK_N || 300);

// mulberry32: small, seedable, good enough to pick shapes
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const rand = rng(SEED);
const int = (n) => Math.floor(rand() * n);
const pick = (arr) => arr[int(arr.length)];

// Code points that exercise escaping and UTF-16 ordering: controls, quote, backslash, DEL,
// U+2028/2029, Latin, BMP above the surrogates, and supplementary characters.
const SPECIAL = [
  0x00, 0x01, 0x08, 0x09, 0x0a, 0x0c, 0x0d, 0x1f, 0x22, 0x2f, 0x5c, 0x7f, 0x80, 0xe9, 0xf6,
  0x2028, 0x2029, 0x20ac, 0xd7ff, 0xe000, 0xfb33, 0xfeff, 0xfffd, 0xffff, 0x10000, 0x1f600,
  0x1f602, 0x10ffff,
];

function randCodePoint() {
  const r = rand();
  if (r < 0.5) return 0x20 + int(0x5f); // printable ASCII
  if (r < 0.75) return pick(SPECIAL);
  if (r < 0.9) {
    const cp = 0x80 + int(0xff80);
    return cp >= 0xd800 && cp <= 0xdfff ? 0xe000 + (cp & 0xff) : cp; // no lone surrogates
  }
  return 0x10000 + int(0x100000);
}

function randString(maxLen) {
  let s = '';
  const len = int(maxLen + 1);
  for (let i = 0; i < len; i++) s += String.fromCodePoint(randCodePoint());
  return s;
}

// Names are short so that shared prefixes and near-collisions in sort order are common.
function randName() {
  const r = rand();
  if (r < 0.4) return pick(['a', 'b', 'aa', 'ab', 'B', '1', '10', '2', '', 'é', '€', '😀', '\ue000']);
  for (;;) {
    const s = randString(4);
    if (s !== '__proto__' && s !== 'idempotency_key') return s;
  }
}

function randDouble() {
  const r = rand();
  if (r < 0.1) return pick([0, -0, 1, -1, 0.1, 0.5, 1e21, 1e-6, 1e-7, 5e-324, Number.MAX_VALUE,
    Number.MIN_VALUE, 2 ** 53, -(2 ** 53), 1e20, 123456789012345680000]);
  // powers of two have lopsided rounding intervals, a classic shortest-digits trap
  if (r < 0.15) return (rand() < 0.5 ? -1 : 1) * 2 ** (int(2098) - 1074);
  if (r < 0.3) return int(2 ** 31) * (rand() < 0.5 ? -1 : 1);
  if (r < 0.5) return int(2 ** 53) - 2 ** 52; // integers up to 2^53 in magnitude
  if (r < 0.8) {
    // a few digits at any magnitude
    const digits = 1 + int(17);
    const m = Math.floor(rand() * 10 ** digits);
    const d = Number(`${rand() < 0.5 ? '-' : ''}${m}e${int(640) - 330}`);
    return Number.isFinite(d) ? d : m;
  }
  // raw IEEE-754 bit patterns, finite ones only
  const buf = new DataView(new ArrayBuffer(8));
  for (;;) {
    buf.setUint32(0, int(2 ** 32));
    buf.setUint32(4, int(2 ** 32));
    const d = buf.getFloat64(0);
    if (Number.isFinite(d)) return d;
  }
}

function randValue(depth) {
  const r = rand();
  if (depth > 0 && r < 0.15) return randObject(depth - 1);
  if (depth > 0 && r < 0.25) {
    const n = int(5);
    return Array.from({ length: n }, () => randValue(depth - 1));
  }
  if (r < 0.55) return randDouble();
  if (r < 0.85) return randString(12);
  return pick([true, false, null]);
}

function randObject(depth) {
  const o = {};
  const n = int(7);
  for (let i = 0; i < n; i++) o[randName()] = randValue(depth);
  return o;
}

test(`idemgw key agrees with canonicalize (seed ${SEED}, ${N} objects)`, async () => {
  const jobs = [];
  for (let i = 0; i < N; i++) jobs.push(randObject(int(5)));
  const failures = [];
  // a few processes at a time keeps the run short without swamping the machine
  const width = 8;
  for (let i = 0; i < jobs.length; i += width) {
    await Promise.all(jobs.slice(i, i + width).map(async (args) => {
      const json = JSON.stringify(args);
      const want = createHash('sha256').update(canonicalize(args), 'utf8').digest('hex').slice(0, 32);
      const { stdout } = await run(BIN, ['key', '--subject', 's', '--tool', 't', '--args', json]);
      const got = stdout.replace(/\n$/, '');
      if (got !== `s:t:h:${want}`) failures.push({ json, canonical: canonicalize(args), got });
    }));
  }
  assert.deepEqual(failures.slice(0, 3), [], `seed ${SEED}: ${failures.length} of ${N} differ`);
});

test('numbers in isolation agree with canonicalize', async () => {
  const nums = Array.from({ length: 200 }, randDouble);
  const args = Object.fromEntries(nums.map((d, i) => [`n${i}`, d]));
  const want = createHash('sha256').update(canonicalize(args), 'utf8').digest('hex').slice(0, 32);
  const { stdout } = await run(BIN, ['key', '--subject', 's', '--tool', 't', '--args',
    JSON.stringify(args)]);
  assert.equal(stdout, `s:t:h:${want}\n`, `seed ${SEED}`);
});
