// Ways to reach an MCP endpoint that a byte-for-byte comparison of the request target would
// miss, and bodies a server framework reads that a strict JSON parser does not: shared by
// tests/integration/request-target.test.mjs and the fault suite.
import net from 'node:net';
import zlib from 'node:zlib';
import { findResponse } from './harness.mjs';

const PROTOCOL_VERSION = '2025-11-25';

/** One request written byte for byte (any target, any body bytes); {status, headers, body}. */
export function rawRequest(port, { method = 'POST', target, headers = {}, body = Buffer.alloc(0) }) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1');
    const chunks = [];
    sock.on('data', (c) => chunks.push(c));
    sock.on('error', reject);
    sock.on('end', () => {
      const text = Buffer.concat(chunks).toString('latin1');
      const m = /^HTTP\/1\.1 (\d{3})/.exec(text);
      const sep = text.indexOf('\r\n\r\n');
      const head = text.slice(0, sep);
      const hdrs = {};
      for (const line of head.split('\r\n').slice(1)) {
        const i = line.indexOf(':');
        hdrs[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
      }
      let rest = Buffer.concat(chunks).subarray(Buffer.byteLength(head, 'latin1') + 4);
      if (/chunked/i.test(hdrs['transfer-encoding'] ?? '')) {
        const parts = [];
        for (let s = rest.toString('latin1'); ;) {
          const nl = s.indexOf('\r\n');
          const n = parseInt(s.slice(0, nl), 16);
          if (!n) break;
          parts.push(Buffer.from(s.slice(nl + 2, nl + 2 + n), 'latin1'));
          s = s.slice(nl + 2 + n + 2);
        }
        rest = Buffer.concat(parts);
      }
      resolve({ status: m ? Number(m[1]) : 0, headers: hdrs, body: rest.toString('utf8') });
    });
    const all = {
      Host: `127.0.0.1:${port}`,
      Accept: 'application/json, text/event-stream',
      'Content-Type': 'application/json',
      'MCP-Protocol-Version': PROTOCOL_VERSION,
      ...headers,
      'Content-Length': String(body.length),
      Connection: 'close',
    };
    const head = `${method} ${target} HTTP/1.1\r\n${Object.entries(all).map(([k, v]) => `${k}: ${v}`).join('\r\n')}\r\n\r\n`;
    sock.write(Buffer.concat([Buffer.from(head, 'latin1'), body]));
  });
}

export const callBody = (id, name, args) => JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: args } });

/** The message answering id in a raw answer (JSON or SSE), or null. */
export function answerOf(res, id) {
  try {
    return findResponse(res.headers['content-type'], res.body, id);
  } catch {
    return null;
  }
}

// The endpoint spelled as frameworks route it. expect: 'protected' (first runs, repeats
// replayed), or an HTTP status every send gets (nothing runs).
export const spellings = (port) => [
  { target: '/./mcp', expect: 'protected' },
  { target: '/x/../mcp', expect: 'protected' },
  { target: '/x/%2e%2e/mcp', expect: 'protected' },
  { target: '//mcp', expect: 'protected' },
  { target: '/mcp/', expect: 'protected' },
  { target: '/MCP', expect: 'protected' },
  { target: '/Mcp?x=1', expect: 'protected' },
  { target: '/%6Dcp', expect: 'protected' },
  { target: '/x\\..\\mcp', expect: 'protected' },
  { target: '/mcp;jsessionid=1', expect: 'protected' },
  { target: `http://127.0.0.1:${port}/mcp`, expect: 'protected' },
  { target: `HTTP://LOCALHOST:${port}/./mcp`, expect: 'protected' },
  { target: '/mcp#frag', expect: 400 },
  { target: '/m%zzcp', expect: 400 },
  { target: 'http://anyhost/mcp', expect: 403 },
  { target: 'http://user@127.0.0.1/mcp', expect: 400 },
];

// Bodies a server framework may read that the gateway cannot: each refused 400, nothing runs.
export function unreadableBodies(tool, args) {
  const text = callBody('b-1', tool, args);
  const nested = `${'['.repeat(3000)}${']'.repeat(3000)}`;
  return [
    { name: 'lone surrogate', body: Buffer.from(text.replace(/}}}$/, ',"note":"\\ud800"}}}')) },
    { name: 'raw 0xFF byte', body: Buffer.concat([Buffer.from(text.replace(/}}}$/, ',"note":"')), Buffer.from([0xff]), Buffer.from('"}}}')]) },
    { name: '3000-deep nesting', body: Buffer.from(text.replace(/}}}$/, `,"note":${nested}}}}`)) },
    { name: 'byte order mark', body: Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(text)]) },
    { name: 'gzip body', body: zlib.gzipSync(text), headers: { 'Content-Encoding': 'gzip' } },
    { name: 'deflate body', body: zlib.deflateSync(text), headers: { 'Content-Encoding': 'deflate' } },
    { name: 'json type, not json', body: Buffer.from(`${text.slice(0, -1)},`), headers: { 'Content-Type': 'application/json' } },
  ];
}

