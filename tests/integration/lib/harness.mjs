// Helpers for the node:test integration tests. Every helper takes the test context `t`
// first: what it starts is stopped, and what it writes is removed, when that test ends
// (t.after). When the test failed, the output of every process it started is printed.
import assert from 'node:assert/strict';
import { spawn, execFile } from 'node:child_process';
import { once } from 'node:events';
import fs from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { Agent, fetch as undiciFetch } from 'undici';

const here = path.dirname(fileURLToPath(import.meta.url));
export const REPO = path.resolve(here, '../../..');
export const TESTS = path.join(REPO, 'tests');
export const IDEMGW_BIN = path.resolve(REPO, process.env.IDEMGW_BIN ?? 'build/idemgw');
export const NODE = process.execPath;
const execFileP = promisify(execFile);

// Ports handed out lately, one file each, shared with scripts/free-port.py: test files run
// side by side in separate processes, and two of them picking at once would otherwise be handed
// the same free port (the second server to bind it then fails).
const PORT_RESERVATIONS = '/tmp/idemgw-ports';
const PORT_HOLD_MS = 600_000;

async function reservePort(port) {
  const file = path.join(PORT_RESERVATIONS, String(port));
  try {
    await (await fs.open(file, 'wx')).close();
    return true;
  } catch (e) {
    if (e.code !== 'EEXIST') throw e;
  }
  try {
    if (Date.now() - (await fs.stat(file)).mtimeMs < PORT_HOLD_MS) return false;
    const now = new Date();
    await fs.utimes(file, now, now); // an old reservation: taken over
    return true;
  } catch (e) {
    if (e.code === 'ENOENT') return false;
    throw e;
  }
}

/**
 * A TCP port on 127.0.0.1 nothing is bound to now and no other test process was handed in the
 * last 10 minutes. Taken below Linux's ephemeral range (32768 up): a port handed out for port 0
 * comes from the range outgoing connections' local ports come from, and one of them can take it
 * before the server binds it.
 */
export async function freePort() {
  await fs.mkdir(PORT_RESERVATIONS, { recursive: true });
  await fs.chmod(PORT_RESERVATIONS, 0o1777).catch(() => {});
  for (let tries = 0; tries < 200; tries++) {
    const port = 20000 + Math.floor(Math.random() * 12000);
    if (!(await reservePort(port))) continue;
    const srv = net.createServer();
    const bound = await new Promise((resolve) => {
      srv.once('error', () => resolve(false));
      srv.listen(port, '127.0.0.1', () => resolve(true));
    });
    if (!bound) continue;
    srv.close();
    await once(srv, 'close');
    return port;
  }
  throw new Error('no free TCP port between 20000 and 32000');
}

/** A fresh temporary folder, removed when the test ends. */
export async function tempDir(t, prefix = 'idemgw-test-') {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), prefix));
  // retried: a process the test started may still be closing files in it
  t.after(() => fs.rm(dir, { recursive: true, force: true, maxRetries: 5 }));
  return dir;
}

/** Output kept per started process; beyond it the oldest half is dropped. */
const MAX_LOG_CHARS = 32 * 1024 * 1024;

// Processes started by each test, so their output can be printed when it fails.
const started = new WeakMap();

function printLogsOnFailure(t) {
  if (started.has(t)) return;
  started.set(t, []);
  t.after(() => {
    if (t.passed) return;
    for (const p of started.get(t)) {
      process.stderr.write(`\n----- ${p.name} (pid ${p.proc.pid}) output -----\n${p.logs()}\n----- end of ${p.name} -----\n`);
    }
  });
}

/**
 * Starts cmd with args and waits until it is ready: a line of its stdout/stderr matches
 * opts.readyLine (string or RegExp), or GET opts.readyUrl answers opts.readyStatus (200).
 * Rejects, with its output, if it exits first or is not ready within opts.timeoutMs.
 * Returns {proc, name, logs(), exited (promise of {code, signal}), match}. The process is
 * sent SIGTERM at test end, then SIGKILL if it has not exited 3 s later.
 */
export async function startProcess(t, cmd, args = [], opts = {}) {
  const { env = {}, cwd = REPO, readyLine, readyUrl, readyStatus = 200, timeoutMs = 20000 } = opts;
  const name = opts.name ?? path.basename(cmd);
  const proc = spawn(cmd, args, { cwd, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  const handle = { proc, name, logs: () => out, match: null };
  printLogsOnFailure(t);
  started.get(t).push(handle);

  let exitInfo = null;
  handle.exited = new Promise((resolve) => {
    proc.on('exit', (code, signal) => {
      exitInfo = { code, signal };
      resolve(exitInfo);
    });
    proc.on('error', (err) => {
      out += `\n[spawn error] ${err.message}\n`;
      exitInfo = { code: null, signal: null, error: err };
      resolve(exitInfo);
    });
  });
  t.after(async () => {
    if (exitInfo) return;
    proc.kill('SIGTERM');
    const timer = setTimeout(() => proc.kill('SIGKILL'), 3000);
    await handle.exited;
    clearTimeout(timer);
  });

  let lineWaiter = null;
  const onData = (chunk) => {
    out += chunk;
    // a process that floods its log must not take the test runner down with it
    if (out.length > MAX_LOG_CHARS) out = `[earlier output dropped]\n${out.slice(-MAX_LOG_CHARS / 2)}`;
    if (lineWaiter) lineWaiter();
  };
  proc.stdout.setEncoding('utf8').on('data', onData);
  proc.stderr.setEncoding('utf8').on('data', onData);

  const deadline = Date.now() + timeoutMs;
  const fail = (why) => new Error(`${name} ${why}\n----- ${name} output -----\n${out}\n-----`);

  if (readyLine) {
    const re = readyLine instanceof RegExp ? readyLine : new RegExp(readyLine.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'));
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(fail(`printed no line matching ${re} within ${timeoutMs} ms`)), timeoutMs);
      const check = () => {
        const m = re.exec(out);
        if (m) {
          handle.match = m;
          clearTimeout(timer);
          lineWaiter = null;
          resolve();
        }
      };
      lineWaiter = check;
      check();
      handle.exited.then((e) => {
        clearTimeout(timer);
        reject(fail(`exited (code ${e.code}, signal ${e.signal}) before it was ready`));
      });
    });
  }
  if (readyUrl) {
    // Probe until it answers; each failed probe is a refused connection, so this waits on
    // the process becoming ready, not on a fixed delay.
    for (;;) {
      if (exitInfo) throw fail(`exited (code ${exitInfo.code}, signal ${exitInfo.signal}) before ${readyUrl} answered`);
      if (Date.now() > deadline) throw fail(`did not answer ${readyUrl} with ${readyStatus} within ${timeoutMs} ms`);
      try {
        const res = await fetch(readyUrl, { signal: AbortSignal.timeout(1000) });
        await res.arrayBuffer();
        if (res.status === readyStatus) break;
      } catch {
        // not listening yet
      }
      await Promise.race([new Promise((r) => setTimeout(r, 25)), handle.exited]);
    }
  }
  return handle;
}

/** @modelcontextprotocol/server-everything in streamableHttp mode. Returns {url, port, proc, logs}. */
export async function startEverything(t) {
  const port = await freePort();
  const bin = path.join(TESTS, 'node_modules/@modelcontextprotocol/server-everything/dist/index.js');
  const h = await startProcess(t, NODE, [bin, 'streamableHttp'], {
    env: { PORT: String(port) },
    readyLine: `listening on port ${port}`,
    name: 'server-everything',
  });
  return { ...h, port, url: `http://127.0.0.1:${port}/mcp` };
}

/** tests/fixtures/conformance-server.mjs. Returns {url, port, proc, logs}. */
export async function startFixture(t) {
  const h = await startProcess(t, NODE, [path.join(TESTS, 'fixtures/conformance-server.mjs'), '0'], {
    readyLine: /listening on port (\d+)/,
    name: 'conformance-fixture',
  });
  const port = Number(h.match[1]);
  return { ...h, port, url: `http://127.0.0.1:${port}/mcp` };
}

/**
 * tests/fixtures/v2-server.mjs (@modelcontextprotocol/server 2.4.0: 2026-07-28, and 2025-era
 * requests served statelessly) with its ledger in a fresh temp folder.
 * Returns {url, port, ledger, proc, logs, exited}.
 */
export async function startV2Server(t) {
  const ledger = path.join(await tempDir(t, 'idemgw-v2-ledger-'), 'ledger.jsonl');
  const h = await startProcess(t, NODE, [path.join(TESTS, 'fixtures/v2-server.mjs'), '0'], {
    env: { LEDGER: ledger },
    readyLine: /listening on port (\d+)/,
    name: 'v2-fixture',
  });
  const port = Number(h.match[1]);
  return { ...h, port, ledger, url: `http://127.0.0.1:${port}/mcp` };
}

// A small YAML writer for the gateway config: nested maps, lists and scalars.
function yamlScalar(v) {
  if (v === null || v === undefined) return 'null';
  if (typeof v === 'number' || typeof v === 'boolean') return String(v);
  const s = String(v);
  const plain = /^[A-Za-z0-9_./@+-][A-Za-z0-9_./@+:=-]*$/.test(s) && !/^(true|false|null|yes|no|on|off|~)$/i.test(s);
  return plain ? s : JSON.stringify(s);
}
export function toYaml(value, indent = '') {
  if (Array.isArray(value)) {
    if (value.length === 0) return ' []\n';
    return '\n' + value.map((v) => (typeof v === 'object' && v !== null
      ? `${indent}- ${toYaml(v, indent + '  ').trimStart()}`
      : `${indent}- ${yamlScalar(v)}\n`)).join('');
  }
  if (typeof value === 'object' && value !== null) {
    const keys = Object.keys(value);
    if (keys.length === 0) return ' {}\n';
    return (indent ? '\n' : '') + keys.map((k) => {
      const v = value[k];
      return typeof v === 'object' && v !== null
        ? `${indent}${k}:${toYaml(v, indent + '  ')}`
        : `${indent}${k}: ${yamlScalar(v)}\n`;
    }).join('');
  }
  return ` ${yamlScalar(value)}\n`;
}

/**
 * Starts the gateway in front of `upstream` (a URL) with a config file written to a temp
 * folder: listen and admin_listen on free loopback ports, upstream, database_url (when
 * given), then every field of `config` (top-level keys override the defaults). Waits until
 * GET /healthz on the admin listener answers 200; with a databaseUrl, until GET /readyz does
 * (store connected: before that, protected calls are refused as store_unavailable), unless
 * waitStore is false (a test of a store that is down). port and adminPort choose the ports
 * (default: free ones).
 * Returns {url, adminUrl, port, adminPort, configPath, dir, proc, logs(), exited}.
 */
export async function startGateway(t, { upstream, databaseUrl, config = {}, env = {}, args = [], waitStore = true, port, adminPort } = {}) {
  const dir = await tempDir(t, 'idemgw-gw-');
  port ??= await freePort();
  adminPort ??= await freePort();
  const cfg = {
    listen: `127.0.0.1:${port}`,
    admin_listen: `127.0.0.1:${adminPort}`,
    ...(upstream ? { upstream } : {}),
    ...(databaseUrl ? { database_url: databaseUrl } : {}),
    ...config,
  };
  const configPath = path.join(dir, 'idemgw.yaml');
  await fs.writeFile(configPath, toYaml(cfg));
  const adminUrl = `http://127.0.0.1:${adminPort}`;
  const h = await startProcess(t, IDEMGW_BIN, ['-c', configPath, ...args], {
    // as systemd's StateDirectory= would: a gateway with no database_url keeps its default
    // embedded store (idemgw-keys.db) in its own folder, not in the shared working directory
    env: { STATE_DIRECTORY: dir, ...env },
    readyUrl: `${adminUrl}/${databaseUrl && waitStore ? 'readyz' : 'healthz'}`,
    name: 'idemgw',
  });
  return { ...h, port, adminPort, adminUrl, configPath, dir, url: `http://127.0.0.1:${port}/mcp` };
}

/** Runs a program to completion: {code, signal, stdout, stderr}. Never rejects on exit status. */
export async function run(cmd, args, opts = {}) {
  try {
    const { stdout, stderr } = await execFileP(cmd, args, { timeout: 30000, ...opts });
    return { code: 0, signal: null, stdout, stderr };
  } catch (err) {
    if (err.code === 'ENOENT') throw err;
    return { code: err.code, signal: err.signal, stdout: err.stdout ?? '', stderr: err.stderr ?? '' };
  }
}

/**
 * The store createDatabase() makes: 'postgres', or 'sqlite' when IDEMGW_TEST_STORE=sqlite
 * (tests/run-all.sh runs the idempotency suite a second time that way).
 */
export const TEST_STORE = process.env.IDEMGW_TEST_STORE === 'sqlite' ? 'sqlite' : 'postgres';

/**
 * A test option that skips a Postgres-only test under the embedded store, with why:
 * test('...', postgresOnly('two gateways on one database'), async (t) => ...).
 */
export function postgresOnly(why) {
  return { skip: TEST_STORE === 'sqlite' ? `Postgres only: ${why}` : false };
}

let dbCounter = 0;
/**
 * Creates a fresh database on the cluster at IDEMGW_TEST_PG_URL and returns its URL; under
 * IDEMGW_TEST_STORE=sqlite, a fresh folder and returns sqlite:FOLDER/keys.db (the file is made
 * by the gateway; the folder is in TMPDIR, which run-all.sh removes).
 */
export async function createDatabase() {
  if (TEST_STORE === 'sqlite') {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'idemgw-sqlite-'));
    return `sqlite:${path.join(dir, 'keys.db')}`;
  }
  const base = process.env.IDEMGW_TEST_PG_URL;
  if (!base) throw new Error('IDEMGW_TEST_PG_URL is not set (tests/run-all.sh starts a cluster and sets it)');
  const name = `t_${process.pid}_${Date.now().toString(36)}_${dbCounter++}`;
  const r = await run('psql', [base, '-v', 'ON_ERROR_STOP=1', '-qc', `CREATE DATABASE ${name}`]);
  if (r.code !== 0) throw new Error(`CREATE DATABASE failed: ${r.stderr}`);
  const u = new URL(base);
  u.pathname = `/${name}`;
  return u.toString();
}

/**
 * An SDK client connected to url. opts.capabilities are declared at initialize;
 * opts.headers go on every request; opts.dispatcher (tlsAgent) carries them over HTTPS.
 * Closed when the test ends.
 */
export async function mcpClient(t, url, { capabilities = {}, headers = {}, name = 'idemgw-test-client', dispatcher } = {}) {
  const client = new Client({ name, version: '1.0.0' }, { capabilities });
  const opts = { requestInit: { headers } };
  if (dispatcher) opts.fetch = (u, init) => undiciFetch(u, { ...init, dispatcher });
  const transport = new StreamableHTTPClientTransport(new URL(url), opts);
  await client.connect(transport);
  t.after(() => client.close().catch(() => {}));
  return client;
}

/** Parses an SSE body (text) into events [{id, event, data, retry}]. */
export function parseSse(textBody) {
  const events = [];
  for (const block of textBody.split(/\r?\n\r?\n/)) {
    if (!block.trim()) continue;
    const ev = { data: '' };
    const data = [];
    for (const line of block.split(/\r?\n/)) {
      if (line.startsWith(':')) continue;
      const i = line.indexOf(':');
      const field = i < 0 ? line : line.slice(0, i);
      const value = i < 0 ? '' : line.slice(i + 1).replace(/^ /, '');
      if (field === 'data') data.push(value);
      else if (field === 'id' || field === 'event' || field === 'retry') ev[field] = value;
    }
    ev.data = data.join('\n');
    events.push(ev);
  }
  return events;
}

/**
 * Reads an SSE response body incrementally. next() resolves to the next event, or null at
 * the end of the stream. cancel() drops the connection.
 */
export function sseReader(res) {
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  const queue = [];
  let done = false;
  return {
    async next() {
      for (;;) {
        if (queue.length) return queue.shift();
        if (done) return null;
        const { value, done: d } = await reader.read();
        if (d) {
          done = true;
          if (buf.trim()) queue.push(...parseSse(buf));
          buf = '';
          continue;
        }
        buf += value;
        const parts = buf.split(/\r?\n\r?\n/);
        buf = parts.pop();
        for (const p of parts) queue.push(...parseSse(p + '\n\n'));
      }
    },
    cancel: () => reader.cancel().catch(() => {}),
  };
}

// --- idempotency tests: the refund fixture, its ledger, raw MCP calls, private clusters ------

/**
 * Polls fn() until it returns a truthy value (which is returned); rejects after timeoutMs,
 * saying what it waited for (`what`, or what() when a function: what was last seen).
 */
export async function waitFor(fn, { timeoutMs = 10000, intervalMs = 20, what = 'condition' } = {}) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${typeof what === 'function' ? what() : what}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

/** Waits until a process started by startProcess has printed a line matching re; returns the match. */
export function waitForLog(handle, re, { timeoutMs = 10000 } = {}) {
  return waitFor(() => re.exec(handle.logs()), { timeoutMs, what: `${handle.name} to print ${re}` });
}

/**
 * tests/fixtures/refund-server.mjs with its ledger in a fresh temp folder (or opts.ledger).
 * opts.jsonResponse answers with single JSON bodies instead of SSE streams; opts.requireBearer
 * answers 401 to requests without that bearer token; opts.oauth {resource, authorizationServer}
 * adds the protected-resource metadata (RFC 9728) for that resource URL.
 * Returns {url, port, ledger, proc, logs, exited}.
 */
export async function startRefundServer(t, { jsonResponse = false, ledger, tls, requireBearer, oauth } = {}) {
  const ledgerPath = ledger ?? path.join(await tempDir(t, 'idemgw-ledger-'), 'ledger.jsonl');
  const env = {
    LEDGER: ledgerPath, JSON_RESPONSE: jsonResponse ? '1' : '', REQUIRE_BEARER: requireBearer ?? '',
    OAUTH_RESOURCE: oauth?.resource ?? '', OAUTH_AS: oauth?.authorizationServer ?? '',
  };
  if (tls) Object.assign(env, { TLS_CERT: tls.cert, TLS_KEY: tls.key });
  const h = await startProcess(t, NODE, [path.join(TESTS, 'fixtures/refund-server.mjs'), '0'], {
    env,
    readyLine: /listening on port (\d+)/,
    name: jsonResponse ? 'refund-fixture(json)' : 'refund-fixture(sse)',
  });
  const port = Number(h.match[1]);
  const url = `${tls ? 'https' : 'http'}://127.0.0.1:${port}/mcp`;
  return { ...h, port, ledger: ledgerPath, url };
}

/**
 * A private CA and a certificate it signed for localhost and 127.0.0.1 (and dnsNames) with the
 * openssl CLI, as PEM files: { ca, cert, key }, plus otherCa, a CA that signed nothing here.
 */
export async function makeCertificates(t, { dnsNames = [] } = {}) {
  const dir = await tempDir(t, 'idemgw-tls-');
  const f = (name) => path.join(dir, name);
  const ossl = async (...args) => {
    const r = await run('openssl', args);
    if (r.code !== 0) throw new Error(`openssl ${args[0]} failed: ${r.stderr}`);
  };
  for (const ca of ['ca', 'other-ca']) {
    await ossl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2', '-subj', `/CN=idemgw test ${ca}`,
      '-keyout', f(`${ca}.key`), '-out', f(`${ca}.pem`));
  }
  await ossl('req', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=localhost',
    '-keyout', f('server.key'), '-out', f('server.csr'));
  const sans = ['DNS:localhost', 'IP:127.0.0.1', ...dnsNames.map((n) => `DNS:${n}`)];
  await fs.writeFile(f('ext.cnf'), `subjectAltName=${sans.join(',')}\n`);
  await ossl('x509', '-req', '-in', f('server.csr'), '-CA', f('ca.pem'), '-CAkey', f('ca.key'),
    '-CAcreateserial', '-days', '2', '-extfile', f('ext.cnf'), '-out', f('server.pem'));
  return {
    dir, ca: f('ca.pem'), caKey: f('ca.key'), otherCa: f('other-ca.pem'), otherCaKey: f('other-ca.key'),
    cert: f('server.pem'), key: f('server.key'),
  };
}

/**
 * A certificate signed by the CA of certs (makeCertificates), or by its other CA with
 * { otherCa: true }: subject CN cn (null: no CN), with subject alternative names san (e.g.
 * ['URI:spiffe://example.org/ns/a/sa/b', 'DNS:agent.example']). Returns {cert, key} paths.
 */
export async function makeClientCertificate(certs, name, { cn = name, san = [], otherCa = false } = {}) {
  const f = (ext) => path.join(certs.dir, `client-${name}.${ext}`);
  const ossl = async (...args) => {
    const r = await run('openssl', args);
    if (r.code !== 0) throw new Error(`openssl ${args[0]} failed: ${r.stderr}`);
  };
  const subj = cn === null ? '/O=idemgw test agents' : `/CN=${cn}`;
  await ossl('req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-subj', subj,
    '-keyout', f('key'), '-out', f('csr'));
  const ext = ['extendedKeyUsage=clientAuth', ...(san.length ? [`subjectAltName=${san.join(',')}`] : [])];
  await fs.writeFile(f('cnf'), ext.join('\n') + '\n');
  const [ca, caKey] = otherCa ? [certs.otherCa, certs.otherCaKey] : [certs.ca, certs.caKey];
  await ossl('x509', '-req', '-in', f('csr'), '-CA', ca, '-CAkey', caKey, '-CAcreateserial',
    '-days', '2', '-extfile', f('cnf'), '-out', f('pem'));
  return { cert: f('pem'), key: f('key') };
}

/**
 * An undici dispatcher for HTTPS trusting ca (a path or paths), presenting client ({cert, key},
 * from makeClientCertificate) when given. Closed when the test ends.
 */
export async function tlsAgent(t, ca, client) {
  const connect = { ca: await Promise.all([].concat(ca).map((f) => fs.readFile(f))) };
  if (client) Object.assign(connect, { cert: await fs.readFile(client.cert), key: await fs.readFile(client.key) });
  const agent = new Agent({ connect });
  t.after(() => agent.close().catch(() => {}));
  return agent;
}

/** The ledger's entries (one per real execution), parsed; [] when the file is missing. */
export async function readLedger(file) {
  let text = '';
  try {
    text = await fs.readFile(file, 'utf8');
  } catch (err) {
    if (err.code !== 'ENOENT') throw err;
  }
  return text.split('\n').filter(Boolean).map((l) => JSON.parse(l));
}

/** Waits until the ledger holds at least n entries; returns them. */
export async function waitForLedger(file, n, { timeoutMs = 10000 } = {}) {
  return waitFor(async () => {
    const l = await readLedger(file);
    return l.length >= n ? l : null;
  }, { timeoutMs, what: `${n} ledger entries in ${file}` });
}

const PROTOCOL_VERSION = '2025-11-25';
const ACCEPT = 'application/json, text/event-stream';

/** The JSON-RPC message answering request `id` in a response body (JSON or SSE); null if none. */
export function findResponse(contentType, text, id) {
  const candidates = [];
  if ((contentType ?? '').startsWith('text/event-stream')) {
    for (const ev of parseSse(text)) {
      if (!ev.data) continue;
      try {
        candidates.push(JSON.parse(ev.data));
      } catch {
        // not JSON: ignore
      }
    }
  } else if (text) {
    const v = JSON.parse(text);
    candidates.push(...(Array.isArray(v) ? v : [v]));
  }
  return candidates.find((m) => m && m.id === id && ('result' in m || 'error' in m)) ?? null;
}

let rawIds = 0;
/**
 * A Streamable HTTP session driven with plain fetch, for when a test needs the HTTP status and
 * headers, its own JSON-RPC ids, per-request headers or many calls in flight at once.
 * opts.headers go on every request (e.g. the subject header).
 * Returns {sessionId, call(name, args, {id, headers, signal}), close()}; call resolves to
 * {status, headers, contentType, body, message} where message is the JSON-RPC response for the
 * request id (null when the response carried none, e.g. an upstream stream that was cut).
 */
export async function rawSession(t, url, { headers = {} } = {}) {
  const base = { Accept: ACCEPT, 'Content-Type': 'application/json', ...headers };
  const init = await fetch(url, {
    method: 'POST',
    headers: base,
    body: JSON.stringify({
      jsonrpc: '2.0', id: 0, method: 'initialize',
      params: { protocolVersion: PROTOCOL_VERSION, capabilities: {}, clientInfo: { name: 'idemgw-raw', version: '1.0.0' } },
    }),
  });
  const initText = await init.text();
  if (init.status !== 200) throw new Error(`initialize: HTTP ${init.status}: ${initText}`);
  const sessionId = init.headers.get('mcp-session-id');
  const sessHeaders = { ...base, 'MCP-Protocol-Version': PROTOCOL_VERSION, ...(sessionId ? { 'Mcp-Session-Id': sessionId } : {}) };
  const note = await fetch(url, {
    method: 'POST', headers: sessHeaders, body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }),
  });
  await note.arrayBuffer();

  async function call(name, args, { id = `raw-${++rawIds}`, headers: extra = {}, signal } = {}) {
    const res = await fetch(url, {
      method: 'POST',
      headers: { ...sessHeaders, ...extra },
      body: JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: args } }),
      signal,
    });
    const body = await res.text();
    const contentType = res.headers.get('content-type');
    return { status: res.status, headers: res.headers, contentType, body, message: findResponse(contentType, body, id), id };
  }
  /** Any JSON-RPC request on the session: {status, body, message}. */
  async function request(method, params, { id = `raw-${++rawIds}`, headers: extra = {} } = {}) {
    const res = await fetch(url, {
      method: 'POST',
      headers: { ...sessHeaders, ...extra },
      body: JSON.stringify({ jsonrpc: '2.0', id, method, params }),
    });
    const body = await res.text();
    return { status: res.status, headers: res.headers, body, message: findResponse(res.headers.get('content-type'), body, id) };
  }
  async function close() {
    if (!sessionId) return;
    const r = await fetch(url, { method: 'DELETE', headers: sessHeaders }).catch(() => null);
    await r?.arrayBuffer().catch(() => {});
  }
  t.after(close);
  return { sessionId, call, request, close };
}

/**
 * A Postgres cluster of the test's own (scripts/pg-cluster.sh in a temp folder), for tests
 * that stop and start it. Returns {url (of a fresh database on it), baseUrl, dir, stop(), start()}.
 * Stopped when the test ends.
 */
export async function startPgCluster(t) {
  // Not tempDir: the folder may only be removed once the cluster has stopped, in one hook.
  // In RAM when there is a RAM-backed folder: the cluster keeps fsync on.
  const ram = await fs.access('/dev/shm', fs.constants.W_OK).then(() => true, () => false);
  const dir = await fs.mkdtemp(path.join(ram ? '/dev/shm' : os.tmpdir(), 'idemgw-pg-'));
  const script = path.join(REPO, 'scripts/pg-cluster.sh');
  const start = async () => {
    const r = await run('bash', [script, 'start', dir], { timeout: 90000 });
    if (r.code !== 0) throw new Error(`pg-cluster.sh start failed: ${r.stderr}`);
    return r.stdout.trim();
  };
  const stop = async () => {
    const r = await run('bash', [script, 'stop', dir], { timeout: 90000 });
    if (r.code !== 0) throw new Error(`pg-cluster.sh stop failed: ${r.stderr}`);
  };
  t.after(async () => {
    await stop().catch(() => {});
    await fs.rm(dir, { recursive: true, force: true }).catch(() => {});
  });
  const baseUrl = await start();
  const r = await run('psql', [baseUrl, '-v', 'ON_ERROR_STOP=1', '-qc', 'CREATE DATABASE idem']);
  if (r.code !== 0) throw new Error(`CREATE DATABASE failed: ${r.stderr}`);
  const u = new URL(baseUrl);
  u.pathname = '/idem';
  return { url: u.toString(), baseUrl, dir, stop, start };
}

/**
 * A streaming standby of primary (a startPgCluster handle): scripts/pg-cluster.sh standby,
 * pg_basebackup -R from it. Returns {baseUrl, dir, port, stop(), promote()}; stopped when the
 * test ends.
 */
export async function startPgStandby(t, primary) {
  const ram = await fs.access('/dev/shm', fs.constants.W_OK).then(() => true, () => false);
  const dir = await fs.mkdtemp(path.join(ram ? '/dev/shm' : os.tmpdir(), 'idemgw-pgs-'));
  const script = path.join(REPO, 'scripts/pg-cluster.sh');
  const stop = async () => {
    const r = await run('bash', [script, 'stop', dir], { timeout: 90000 });
    if (r.code !== 0) throw new Error(`pg-cluster.sh stop failed: ${r.stderr}`);
  };
  t.after(async () => {
    await stop().catch(() => {});
    await fs.rm(dir, { recursive: true, force: true }).catch(() => {});
  });
  const r = await run('bash', [script, 'standby', dir, primary.dir], { timeout: 90000 });
  if (r.code !== 0) throw new Error(`pg-cluster.sh standby failed: ${r.stderr}`);
  const baseUrl = r.stdout.trim();
  const promote = async () => {
    const p = await run('bash', [script, 'promote', dir], { timeout: 90000 });
    if (p.code !== 0) throw new Error(`pg-cluster.sh promote failed: ${p.stderr}`);
  };
  return { baseUrl, dir, port: Number(new URL(baseUrl).port), stop, promote };
}

/** The folder holding the data/ of the cluster made for dir: dir itself, or (as root) the
 * folder of its own that scripts/pg-cluster.sh made and named in dir/cluster. */
export async function pgClusterHome(dir) {
  try {
    return (await fs.readFile(path.join(dir, 'cluster'), 'utf8')).trim();
  } catch (e) {
    if (e.code === 'ENOENT') return dir;
    throw e;
  }
}

/** Every process of the cluster made for dir: the postmaster, then its children. */
export async function pgClusterPids(dir) {
  const pidFile = await fs.readFile(path.join(await pgClusterHome(dir), 'data/postmaster.pid'), 'utf8');
  const postmaster = Number(pidFile.split('\n')[0]);
  const kids = await run('ps', ['-o', 'pid=', '--ppid', String(postmaster)]);
  return [postmaster, ...kids.stdout.split('\n').map((s) => Number(s.trim())).filter(Boolean)];
}

/** Runs `idemgw key ARGS...`: {code, stdout, stderr}. */
export function idemgwKey(args) {
  return run(IDEMGW_BIN, ['key', ...args]);
}

/** The text blocks of a tool result, joined. */
export const toolText = (result) => (result?.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join('\n');
/** result._meta["idemgw/status"] of a gateway answer (refusal, in progress, unknown), or undefined. */
export const idemStatus = (result) => result?._meta?.['idemgw/status'];
/** result._meta["idemgw/replay"] of a replayed result, or undefined. */
export const replayMarker = (result) => result?._meta?.['idemgw/replay'];

// One SSE-polling call: the upstream ends the POST stream after its priming event (the claim
// stays in progress), the agent resumes with GET + Last-Event-ID and gets the result there.
export async function pollingCall(gw, s, args, id) {
  const first = await s.call('polling_refund', args, { id });
  assert.equal(first.status, 200);
  assert.equal(first.message, null, 'no result on the POST stream');
  const primingId = [...first.body.matchAll(/^id: ?(.+)$/gm)].map((m) => m[1].trim()).pop();
  assert.ok(primingId, `the priming event carries an id: ${first.body}`);

  const resumed = await fetch(gw.url, {
    method: 'GET',
    headers: { Accept: 'text/event-stream', 'Mcp-Session-Id': s.sessionId, 'MCP-Protocol-Version': '2025-11-25', 'Last-Event-ID': primingId },
  });
  assert.equal(resumed.status, 200);
  const reader = sseReader(resumed);
  let result = null;
  while (!result) {
    const ev = await reader.next();
    assert.ok(ev, 'the resumed stream ended before the result');
    if (ev.data && JSON.parse(ev.data).id === id) result = JSON.parse(ev.data).result;
  }
  await reader.cancel();
  return result;
}
