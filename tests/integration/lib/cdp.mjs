// A headless Chromium driven over the DevTools protocol on --remote-debugging-pipe (file
// descriptors 3 and 4, one JSON message per NUL-ended frame), so a test can load a page, read
// it, click through it and take a screenshot without a WebSocket client or a browser library.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { tempDir } from './harness.mjs';

/**
 * Starts Chromium with a page target attached: {send(method, params), evaluate(expr),
 * waitFor(expr, what), navigate(url), screenshot()}. Killed when the test ends.
 */
export async function headlessPage(t) {
  const profile = await tempDir(t, 'idemgw-chromium-');
  const browser = spawn('chromium', [
    '--headless=new', '--no-sandbox', '--disable-gpu', '--remote-debugging-pipe',
    '--no-first-run', '--no-default-browser-check', `--user-data-dir=${profile}`, 'about:blank',
  ], { stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'], detached: true });
  let stderr = '';
  browser.stderr.on('data', (d) => { stderr += d; });
  const exited = once(browser, 'exit');
  // the profile folder is removed after the browser has gone (registered first, runs last)
  t.after(async () => {
    try { process.kill(-browser.pid, 'SIGKILL'); } catch { /* already gone */ }
    await exited;
  });
  const toBrowser = browser.stdio[3];
  const fromBrowser = browser.stdio[4];
  let nextId = 1;
  const pending = new Map();
  const listeners = [];
  let buf = Buffer.alloc(0);
  fromBrowser.on('data', (chunk) => {
    buf = Buffer.concat([buf, chunk]);
    let end;
    while ((end = buf.indexOf(0)) >= 0) {
      const msg = JSON.parse(buf.subarray(0, end).toString('utf8'));
      buf = buf.subarray(end + 1);
      if (msg.id && pending.has(msg.id)) {
        const { resolve, reject } = pending.get(msg.id);
        pending.delete(msg.id);
        if (msg.error) reject(new Error(`${msg.error.message} (${JSON.stringify(msg.error)})`));
        else resolve(msg.result);
      } else if (msg.method) {
        for (const l of listeners.splice(0)) if (!l(msg)) listeners.push(l);
      }
    }
  });
  exited.then(() => {
    for (const { reject } of pending.values()) reject(new Error(`chromium exited: ${stderr.slice(-2000)}`));
  });
  function raw(method, params = {}, sessionId) {
    const id = nextId++;
    const p = new Promise((resolve, reject) => pending.set(id, { resolve, reject }));
    toBrowser.write(JSON.stringify({ id, method, params, ...(sessionId ? { sessionId } : {}) }) + '\0');
    return p;
  }
  /** Resolves with the first event named method (of this page's session). */
  function event(method) {
    return new Promise((resolve) => listeners.push((msg) => {
      if (msg.method !== method) return false;
      resolve(msg.params);
      return true;
    }));
  }

  const { targetId } = await raw('Target.createTarget', { url: 'about:blank' });
  const { sessionId } = await raw('Target.attachToTarget', { targetId, flatten: true });
  const send = (method, params) => raw(method, params, sessionId);
  await send('Page.enable');
  await send('Runtime.enable');
  await send('Emulation.setDeviceMetricsOverride', { width: 1280, height: 800, deviceScaleFactor: 1, mobile: false });

  async function evaluate(expression) {
    const r = await send('Runtime.evaluate', { expression, awaitPromise: true, returnByValue: true });
    if (r.exceptionDetails) throw new Error(`page: ${r.exceptionDetails.exception?.description ?? r.exceptionDetails.text}`);
    return r.result.value;
  }
  async function waitFor(expression, what, timeoutMs = 10000) {
    const until = Date.now() + timeoutMs;
    for (;;) {
      const v = await evaluate(expression);
      if (v) return v;
      if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  async function navigate(url) {
    const loaded = event('Page.loadEventFired');
    await send('Page.navigate', { url });
    await loaded;
  }
  async function screenshot() {
    const { data } = await send('Page.captureScreenshot', { format: 'png' });
    return Buffer.from(data, 'base64');
  }
  return { send, evaluate, waitFor, navigate, screenshot };
}
