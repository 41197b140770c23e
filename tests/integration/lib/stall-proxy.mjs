// A TCP proxy in front of a real Postgres that can be switched between passing bytes and
// stalling, as a network path that accepts connections and then stops answering:
//   pass       forwards both ways;
//   stall      accepts and reads, forwards nothing (a black hole);
//   handshake  forwards what the client sends, but only the first `handshakeBytes` bytes the
//              server answers (by default one: the answer to libpq's SSL request), so the
//              connection stops in the middle of its startup exchange.
// A connection keeps the mode it was accepted in. setMode(mode, { cut: true }) also closes the
// connections already open, so the client has to reconnect into the new mode.
import net from 'node:net';

/**
 * Starts the proxy towards target (a postgresql:// URL) on a free loopback port. Returns
 * { url (target with the proxy's port), port, setMode(mode, opts), accepted() (connections
 * accepted so far), waitAccepted(n, {timeoutMs}) (resolves once n have been), close() }. Closed when t ends.
 */
export async function startStallProxy(t, target, { mode = 'pass', handshakeBytes = 1 } = {}) {
  const dest = new URL(target);
  const open = new Set();
  let current = mode;
  let accepted = 0;
  const waiters = [];

  const server = net.createServer((client) => {
    accepted++;
    for (const w of waiters.splice(0)) {
      if (accepted >= w.n) w.resolve();
      else waiters.push(w);
    }
    const connMode = current;
    const upstream = net.connect(Number(dest.port), dest.hostname);
    const pair = { client, upstream };
    open.add(pair);
    const done = () => {
      open.delete(pair);
      client.destroy();
      upstream.destroy();
    };
    client.on('error', done).on('close', done);
    upstream.on('error', done).on('close', done);
    if (connMode === 'stall') {
      client.on('data', () => {}); // read, and drop
      return;
    }
    client.on('data', (d) => upstream.write(d));
    let allowance = connMode === 'handshake' ? handshakeBytes : Infinity;
    upstream.on('data', (d) => {
      if (allowance <= 0) return;
      const part = d.length > allowance ? d.subarray(0, allowance) : d;
      allowance -= part.length;
      client.write(part);
    });
  });
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', resolve);
  });
  const port = server.address().port;
  const close = () => new Promise((resolve) => {
    for (const p of open) {
      p.client.destroy();
      p.upstream.destroy();
    }
    server.close(() => resolve());
  });
  t.after(close);
  const url = new URL(target);
  url.hostname = '127.0.0.1';
  url.port = String(port);
  return {
    url: url.toString(),
    port,
    setMode(m, { cut = false } = {}) {
      current = m;
      if (cut) {
        for (const p of open) {
          p.client.destroy();
          p.upstream.destroy();
        }
      }
    },
    accepted: () => accepted,
    waitAccepted(n, { timeoutMs = 30000 } = {}) {
      if (accepted >= n) return Promise.resolve();
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`${accepted} connections accepted, not ${n}, within ${timeoutMs} ms`)), timeoutMs);
        waiters.push({ n, resolve: () => { clearTimeout(timer); resolve(); } });
      });
    },
    close,
  };
}
