// Shared pieces of the fault suite (tests/faults/run.mjs): a scope that owns what a scenario
// starts, a load loop of protected calls from several callers, and the tally each scenario
// prints. Every answer is checked against the call it answers: a result that names another
// call's order is an answer that reached the wrong caller.
import { run } from '../integration/lib/harness.mjs';

/**
 * A stand-in for node:test's context: the harness helpers register cleanups with after().
 * close() runs them last-in first-out; logs of what was started are printed when a scenario fails.
 */
export function scope(name) {
  const hooks = [];
  return {
    name,
    passed: true,
    after(fn) {
      hooks.push(fn);
    },
    async close() {
      while (hooks.length) {
        try {
          await hooks.pop()();
        } catch (err) {
          process.stderr.write(`faults: cleanup of ${name}: ${err.message}\n`);
        }
      }
    },
  };
}

/** Counts of one scenario. */
export function tally() {
  return {
    calls: 0,
    executed: 0, // answered with a first execution's result
    replays: 0, // answered with a replay marker
    refusals: 0, // answered by the gateway with an idemgw/status code
    http_errors: 0, // a non-200 status, a cut connection or no answer in time
    wrong_caller: 0, // an answer naming another call's order
    codes: {},
  };
}

const PROTOCOL_VERSION = '2025-11-25';

/**
 * One protected call as a raw POST: a fresh connection each (no SDK: the suite must see the
 * exact status and body). opts.id is the JSON-RPC id (callers in the wild reuse small ids, so
 * the default is 1 for everyone). Returns {status, text, message} or {error}.
 */
export async function protectedCall(url, { subject, tool = 'issue_refund', args, id = 1, timeoutMs = 15000, session }) {
  const headers = {
    Accept: 'application/json, text/event-stream',
    'Content-Type': 'application/json',
    'MCP-Protocol-Version': PROTOCOL_VERSION,
    'X-Subject': subject,
  };
  if (session) headers['Mcp-Session-Id'] = session;
  try {
    const res = await fetch(url, {
      method: 'POST',
      headers,
      body: JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: tool, arguments: args } }),
      signal: AbortSignal.timeout(timeoutMs),
    });
    const text = await res.text();
    return { status: res.status, text, message: findMessage(res.headers.get('content-type'), text, id) };
  } catch (err) {
    return { error: err.name === 'TimeoutError' ? 'timeout' : err.message };
  }
}

function findMessage(contentType, text, id) {
  const msgs = [];
  try {
    if ((contentType ?? '').startsWith('text/event-stream')) {
      for (const block of text.split(/\r?\n\r?\n/)) {
        const data = block.split(/\r?\n/).filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trimStart()).join('\n');
        if (data) msgs.push(JSON.parse(data));
      }
    } else if (text) {
      msgs.push(JSON.parse(text));
    }
  } catch {
    return null;
  }
  return msgs.find((m) => m && m.id === id && ('result' in m || 'error' in m)) ?? null;
}

/** An MCP session on the upstream through the gateway (initialize + initialized); its id. */
export async function openSession(url, subject) {
  const headers = {
    Accept: 'application/json, text/event-stream',
    'Content-Type': 'application/json',
    'X-Subject': subject,
  };
  const init = await fetch(url, {
    method: 'POST',
    headers,
    body: JSON.stringify({
      jsonrpc: '2.0', id: 0, method: 'initialize',
      params: { protocolVersion: PROTOCOL_VERSION, capabilities: {}, clientInfo: { name: 'idemgw-faults', version: '1' } },
    }),
  });
  await init.text();
  const session = init.headers.get('mcp-session-id');
  const note = await fetch(url, {
    method: 'POST',
    headers: { ...headers, 'MCP-Protocol-Version': PROTOCOL_VERSION, ...(session ? { 'Mcp-Session-Id': session } : {}) },
    body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }),
  });
  await note.arrayBuffer();
  return session;
}

/**
 * Files one answer into the tally. `order` is the order id the call asked for; an answer whose
 * text names an order at all must name this one. Returns the kind: executed, replay, refusal
 * or error.
 */
export function classify(tl, answer, order) {
  tl.calls++;
  if (answer.error || answer.status !== 200 || !answer.message) {
    tl.http_errors++;
    const code = answer.error ?? `http_${answer.status}`;
    tl.codes[code] = (tl.codes[code] ?? 0) + 1;
    return 'error';
  }
  const result = answer.message.result;
  const text = (result?.content ?? []).map((c) => c.text ?? '').join('\n');
  // the refund fixture says "order X"; the misbehaving one echoes the arguments
  const named = [...text.matchAll(/order (\S+?)[ )]|"order_id":"([^"]+)"/g)].map((m) => m[1] ?? m[2]);
  if (named.some((o) => o !== order)) tl.wrong_caller++;
  const status = result?._meta?.['idemgw/status'];
  if (status) {
    tl.refusals++;
    tl.codes[status.code] = (tl.codes[status.code] ?? 0) + 1;
    return 'refusal';
  }
  if (result?._meta?.['idemgw/replay']) {
    tl.replays++;
    return 'replay';
  }
  if (answer.message.error) {
    tl.http_errors++;
    tl.codes.jsonrpc_error = (tl.codes.jsonrpc_error ?? 0) + 1;
    return 'error';
  }
  tl.executed++;
  return 'executed';
}

/**
 * Runs `workers` loops until each has made `perWorker` calls or stop() says so. Each loop is
 * its own subject; every call is a new order, sent twice in a row (the second must be a
 * replay when the first was executed; repeat: false sends it once). onCall(i) runs before call i of worker 0, so a
 * scenario can inject its fault at a point in the load. Returns the tally and, per order, the
 * kind of the first answer.
 */
export async function load(url, { workers = 8, perWorker = 50, tool = 'issue_refund', tag, onCall, stop = () => false, timeoutMs, repeat = true } = {}) {
  const tl = tally();
  const firstKinds = new Map();
  const loops = [];
  for (let w = 0; w < workers; w++) {
    loops.push((async () => {
      const subject = `${tag}-caller-${w}`;
      let session = null;
      try {
        session = await openSession(url, subject);
      } catch {
        // the fault may already be in effect: calls then go without a session
      }
      for (let i = 0; i < perWorker && !stop(); i++) {
        if (w === 0 && onCall) await onCall(i);
        const order = `${tag}-w${w}-n${i}`;
        const args = { order_id: order, amount_cents: 100 + w };
        const first = await protectedCall(url, { subject, tool, args, timeoutMs, session });
        const kind = classify(tl, first, order);
        firstKinds.set(order, kind);
        if (!repeat) continue;
        const again = await protectedCall(url, { subject, tool, args, timeoutMs, session });
        const kind2 = classify(tl, again, order);
        if (kind === 'executed' && kind2 === 'executed') tl.codes.executed_twice = (tl.codes.executed_twice ?? 0) + 1;
      }
    })());
  }
  await Promise.all(loops);
  return { tl, firstKinds };
}

/** Orders that the upstream's ledger shows executed more than once. */
export function doubleExecutions(ledger) {
  const seen = new Map();
  for (const e of ledger) seen.set(e.order_id, (seen.get(e.order_id) ?? 0) + 1);
  return [...seen.values()].filter((n) => n > 1).length;
}

/** One line per scenario: name, counts, verdict. failIf fails it for a scenario's own reason. */
export function report(name, tl, { executions, doubles = 0, extra = '', maxErrors = Infinity, failIf = false } = {}) {
  const bad = tl.wrong_caller > 0 || doubles > 0 || (tl.codes.executed_twice ?? 0) > 0 || tl.http_errors > maxErrors || failIf;
  const codes = Object.entries(tl.codes).map(([k, v]) => `${k}=${v}`).join(',');
  const line = `${bad ? 'FAIL' : 'ok  '} ${name.padEnd(24)} calls=${tl.calls} executions=${executions ?? tl.executed} ` +
    `replays=${tl.replays} refusals=${tl.refusals} errors=${tl.http_errors} double_executions=${doubles} ` +
    `wrong_caller=${tl.wrong_caller}${codes ? ` codes=${codes}` : ''}${extra ? ` ${extra}` : ''}`;
  console.log(line);
  return !bad;
}

/** psql against url with one command; throws with its stderr on failure. */
export async function psql(url, sql) {
  const r = await run('psql', [url, '-v', 'ON_ERROR_STOP=1', '-qAtc', sql]);
  if (r.code !== 0) throw new Error(`psql failed: ${r.stderr}`);
  return r.stdout.trim();
}
