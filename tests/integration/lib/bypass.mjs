// Ways to reach an MCP endpoint that a byte-for-byte comparison of the request target would
// miss, and bodies a server framework reads that a strict JSON parser does not: shared by
// tests/integration/request-target.test.mjs and the fault suite.
import net from 'node:net';
import zlib from 'node:zlib';
import { findResponse } from './harness.mjs';

const PROTOCOL_VERSION = '2025-11-25';

/**
 * One request written byte for byte (any target, any body bytes); {status, headers, body}. A
 * header given as null is left out; chunked sends the body as one chunk with
 * Transfer-Encoding: chunked instead of a Content-Length. Rejects when the socket is idle for
 * timeoutMs before the answer ends: a request relayed to a stream that never ends (a GET's
 * SSE) fails the test that sent it rather than hanging it.
 */
export function rawRequest(port, { method = 'POST', target, headers = {}, body = Buffer.alloc(0), chunked = false, timeoutMs = 15000 }) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1');
    const chunks = [];
    sock.setTimeout(timeoutMs, () => {
      sock.destroy();
      reject(new Error(`${method} ${target}: idle ${timeoutMs} ms without a complete answer`));
    });
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
      ...(chunked ? { 'Transfer-Encoding': 'chunked' } : { 'Content-Length': String(body.length) }),
      Connection: 'close',
    };
    const lines = Object.entries(all).filter(([, v]) => v !== null && v !== undefined).map(([k, v]) => `${k}: ${v}`);
    const head = `${method} ${target} HTTP/1.1\r\n${lines.join('\r\n')}\r\n\r\n`;
    const framed = chunked
      ? Buffer.concat([Buffer.from(`${body.length.toString(16)}\r\n`), body, Buffer.from('\r\n0\r\n\r\n')])
      : body;
    sock.write(Buffer.concat([Buffer.from(head, 'latin1'), framed]));
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
// replayed), or an HTTP status every send gets (nothing runs), with says when the refusal's
// message must say why. An escaped '/' or '\' is one segment to the gateway and two to a server
// that decodes it before routing.
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
  { target: '/x/..%2Fmcp', expect: 400, says: /%2F or %5C/ },
  { target: '/x/..%2fmcp', expect: 400, says: /%2F or %5C/ },
  { target: '/x/..%5Cmcp', expect: 400, says: /%2F or %5C/ },
];

/** text in UTF-32 code units, big-endian or little-endian. */
function utf32(text, bigEndian) {
  const cps = [...text].map((c) => c.codePointAt(0));
  const b = Buffer.alloc(4 * cps.length);
  cps.forEach((cp, i) => (bigEndian ? b.writeUInt32BE(cp, 4 * i) : b.writeUInt32LE(cp, 4 * i)));
  return b;
}

// Requests a lenient server runs a call from that the gateway never read as one: a body on a
// method that has none, a body off the endpoint in UTF-16 or UTF-32 (with or without a byte
// order mark, or named by its charset), a tools/call without an id. Each refused with status,
// its message matching says (HEAD's answer has no body to say it); nothing runs.
export function unclassifiedRoutes(tool, args) {
  const call = callBody('u-1', tool, args);
  const note = { jsonrpc: '2.0', method: 'tools/call', params: { name: tool, arguments: args } };
  const BOM = '\ufeff';
  const noBody = /GET, HEAD, DELETE or TRACE request carries no body/;
  const wide = /relayed only as UTF-8: this one is UTF-16 or UTF-32/;
  const needsId = /a tools\/call needs an id/;
  const text = { 'Content-Type': 'text/plain' };
  return [
    { name: 'GET with a body', method: 'GET', target: '/mcp', body: Buffer.from(call), status: 400, says: noBody },
    { name: 'DELETE with a body', method: 'DELETE', target: '/mcp', body: Buffer.from(call), status: 400, says: noBody },
    { name: 'HEAD with a body', method: 'HEAD', target: '/mcp', body: Buffer.from(call), status: 400 },
    { name: 'GET with a chunked body', method: 'GET', target: '/mcp', body: Buffer.from(call), chunked: true, status: 400, says: noBody },
    { name: 'GET with a body off the endpoint', method: 'GET', target: '/other', body: Buffer.from(call), status: 400, says: noBody },
    { name: 'UTF-16LE with a BOM', target: '/other', headers: text, body: Buffer.from(BOM + call, 'utf16le'), status: 415, says: wide },
    { name: 'UTF-16BE, no BOM, no media type', target: '/other', headers: { 'Content-Type': null }, body: Buffer.from(call, 'utf16le').swap16(), status: 415, says: wide },
    { name: 'UTF-32LE with a BOM', target: '/other', headers: text, body: utf32(BOM + call, false), status: 415, says: wide },
    { name: 'UTF-32BE, no BOM, as bytes', target: '/other', headers: { 'Content-Type': 'application/octet-stream' }, body: utf32(call, true), status: 415, says: wide },
    { name: 'UTF-16LE named by its charset', target: '/other', headers: { 'Content-Type': 'text/plain; charset=utf-16le' }, body: Buffer.from(call, 'utf16le'), status: 415, says: /Content-Type names another charset/ },
    { name: 'tools/call notification', target: '/mcp', body: Buffer.from(JSON.stringify(note)), status: 400, says: needsId },
    { name: 'tools/call with a null id', target: '/mcp', body: Buffer.from(JSON.stringify({ ...note, id: null })), status: 400, says: needsId },
    { name: 'tools/call notification in a batch', target: '/mcp', body: Buffer.from(JSON.stringify([{ jsonrpc: '2.0', id: 'u-2', method: 'ping' }, note])), status: 400, says: needsId },
  ];
}

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

