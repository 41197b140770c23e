// The official MCP conformance suite (server scenarios, active suite), in two versions: the
// release 0.1.16 and the newest 0.2.0 alpha (installed as `conformance-next`), each run
// against two upstreams, directly and through the gateway:
//   server-everything: a third-party server that implements only part of what the
//     scenarios call (measured directly with conformance 0.1.16 and server-everything
//     2026.8.31: 11 of 30 pass — server-initialize, logging-set-level, ping, tools-list,
//     tools-call-simple-text, tools-call-error, server-sse-multiple-streams, resources-list,
//     resources-subscribe, resources-unsubscribe, prompts-list);
//   tests/fixtures/conformance-server.mjs: implements every scenario; all pass directly
//     except dns-rebinding-protection, which it leaves to the gateway.
// The gateway must pass whatever passes directly, and dns-rebinding-protection on top.
// The fixture runs under each version a second time, through the gateway's TLS listener
// (listen_tls, certificates from the openssl CLI, the suite trusting their CA through
// NODE_EXTRA_CA_CERTS), with the same expectations: HTTPS towards agents changes nothing an
// MCP client sees.
// Every tool is class `read` here: this measures the transparent proxy, not replay.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import {
  NODE, TESTS, makeCertificates, run, startEverything, startFixture, startGateway, tempDir,
} from './lib/harness.mjs';

const SUITES = [
  { version: '0.1.16', cli: path.join(TESTS, 'node_modules/@modelcontextprotocol/conformance/dist/index.js') },
  { version: '0.2.0-alpha.12', cli: path.join(TESTS, 'node_modules/conformance-next/dist/index.js') },
];
const PASSTHROUGH = { defaults: { class: 'read' } };

// Runs the active server suite against url; returns Map scenario → {passed, failed} checks,
// read from the CLI's summary lines ("✓ name: N passed, M failed"). ca: a PEM file the suite
// trusts besides the system's (an https url).
async function conformance(t, suite, url, label, { ca } = {}) {
  const out = await tempDir(t, 'idemgw-conf-');
  label = `${label} (conformance ${suite.version})`;
  const env = ca ? { ...process.env, NODE_EXTRA_CA_CERTS: ca } : process.env;
  const r = await run(NODE, [suite.cli, 'server', '--url', url, '--suite', 'active', '-o', out], {
    cwd: out,
    env,
    timeout: 300000,
    maxBuffer: 64 * 1024 * 1024,
  });
  const results = new Map();
  for (const m of r.stdout.matchAll(/^[✓✗] (\S+): (\d+) passed, (\d+) failed/gm)) {
    results.set(m[1], { passed: Number(m[2]), failed: Number(m[3]) });
  }
  const ok = [...results].filter(([, v]) => v.failed === 0).map(([k]) => k);
  t.diagnostic(`${label}: ${ok.length}/${results.size} scenarios pass`);
  if (results.size === 0) {
    throw new Error(`no results from the conformance CLI against ${url} (exit ${r.code})\n${r.stdout}\n${r.stderr}`);
  }
  results.output = r.stdout;
  return results;
}

const passing = (results) => new Set([...results].filter(([, v]) => v.failed === 0).map(([k]) => k));

function failureReport(results, names) {
  return names.map((n) => {
    const block = results.output.split('=== Running scenario: ').find((b) => b.startsWith(`${n} ===`)) ?? '';
    return `--- ${n}\n${block.split('\n').filter((l) => /Error|FAIL|✗/.test(l)).join('\n')}`;
  }).join('\n');
}

// The host name dns-rebinding-protection sends as Host and Origin. Over HTTPS its client
// takes the TLS server name from Host, so a certificate without this name ends the request in
// the handshake (TLS refusing the rebinding on its own) and the gateway's Host check would go
// untested; the test certificate carries the name, as a wildcard certificate would, and the
// gateway must refuse the request itself.
const REBINDING_HOST = 'evil.example.com';

// The gateway in front of upstream, over plain HTTP or (tls) its TLS listener: the URL an
// agent uses and the CA it must trust.
async function gatewayBefore(t, upstream, { tls = false } = {}) {
  if (!tls) return { url: (await startGateway(t, { upstream: upstream.url, config: PASSTHROUGH })).url };
  const certs = await makeCertificates(t, { dnsNames: [REBINDING_HOST] });
  const gw = await startGateway(t, {
    upstream: upstream.url,
    config: { ...PASSTHROUGH, listen_tls: { cert_file: certs.cert, key_file: certs.key } },
  });
  return { url: gw.url.replace(/^http:/, 'https:'), ca: certs.ca };
}

for (const suite of SUITES) {
  test(`conformance ${suite.version}: server-everything passes through the gateway whatever it passes directly`, async (t) => {
    const upstream = await startEverything(t);
    const gw = await startGateway(t, { upstream: upstream.url, config: PASSTHROUGH });

    const direct = await conformance(t, suite, upstream.url, 'server-everything directly');
    const via = await conformance(t, suite, gw.url, 'server-everything through the gateway');

    const lost = [...passing(direct)].filter((s) => !passing(via).has(s));
    assert.deepEqual(lost, [], `scenarios passing directly but failing through the gateway:\n${failureReport(via, lost)}`);
    assert.ok(passing(via).has('dns-rebinding-protection'),
      `dns-rebinding-protection fails through the gateway:\n${failureReport(via, ['dns-rebinding-protection'])}`);
  });

  for (const tls of [false, true]) {
    const over = tls ? ' over HTTPS' : '';
    test(`conformance ${suite.version}: every active scenario passes against the fixture through the gateway${over}`, async (t) => {
      const upstream = await startFixture(t);
      const gw = await gatewayBefore(t, upstream, { tls });

      const direct = await conformance(t, suite, upstream.url, 'fixture directly');
      const via = await conformance(t, suite, gw.url, `fixture through the gateway${over}`, { ca: gw.ca });

      const directFailing = [...direct.keys()].filter((s) => !passing(direct).has(s));
      assert.deepEqual(directFailing, ['dns-rebinding-protection'],
        `the fixture itself should pass every scenario but dns-rebinding-protection:\n${failureReport(direct, directFailing)}`);
      const viaFailing = [...via.keys()].filter((s) => !passing(via).has(s));
      assert.deepEqual(viaFailing, [], `scenarios failing through the gateway:\n${failureReport(via, viaFailing)}`);
      assert.equal(via.size, direct.size, 'both runs cover the same scenarios');
    });
  }
}
