// Helpers for the node:test integration tests. Every helper takes the test context `t`
// first: what it starts is stopped, and what it writes is removed, when that test ends
// (t.after). When the test failed, the output of every process it started is printed.
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

const here = path.dirname(fileURLToPath(import.meta.url));
export const REPO = path.resolve(here, '../../..');
export const TESTS = path.join(REPO, 'tests');
export const IDEMGW_BIN = path.resolve(REPO, process.env.IDEMGW_BIN ?? 'build/idemgw');
export const NODE = process.execPath;
const execFileP = promisify(execFile);

/** A TCP port on 127.0.0.1 that nothing listens on right now. */
export async function freePort() {
  const srv = net.createServer();
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  const { port } = srv.address();
  srv.close();
  await once(srv, 'close');
  return port;
}

/** A fresh temporary folder, removed when the test ends. */
export async function tempDir(t, prefix = 'idemgw-test-') {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), prefix));
  t.after(() => fs.rm(dir, { recursive: true, force: true }));
  return dir;
}

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
 * GET /healthz on the admin listener answers 200.
 * Returns {url, adminUrl, port, adminPort, configPath, dir, proc, logs(), exited}.
 */
export async function startGateway(t, { upstream, databaseUrl, config = {}, env = {}, args = [] } = {}) {
  const dir = await tempDir(t, 'idemgw-gw-');
  const port = await freePort();
  const adminPort = await freePort();
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
    env,
    readyUrl: `${adminUrl}/healthz`,
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

let dbCounter = 0;
/** Creates a fresh database on the cluster at IDEMGW_TEST_PG_URL and returns its URL. */
export async function createDatabase() {
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
 * opts.headers go on every request. Closed when the test ends.
 */
export async function mcpClient(t, url, { capabilities = {}, headers = {}, name = 'idemgw-test-client' } = {}) {
  const client = new Client({ name, version: '1.0.0' }, { capabilities });
  const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
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
