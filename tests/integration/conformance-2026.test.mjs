// The official conformance suite at --spec-version 2026-07-28 against the v2 fixture
// (tests/fixtures/v2-server.mjs, @modelcontextprotocol/server 2.4.0), directly and through
// the gateway: every scenario that passes directly must pass through it, with the fixture's
// tools forwarded untouched (class read) and with them protected (claimed, stored).
// Only the newest suite knows the revision: conformance 0.2.0-alpha.12 (`conformance-next`)
// takes --spec-version 2026-07-28; the release 0.1.16 refuses it ("Unknown spec version"; it
// knows 2025-03-26, 2025-06-18, 2025-11-25, draft and extension), which the first test checks
// so this note cannot go stale unnoticed. The fixture serves the suite's content tools,
// resources and prompts (measured directly: 17 of 20 scenarios pass; completion, progress and
// dns-rebinding-protection do not); the gateway must lose none of them, and adds
// dns-rebinding-protection, which the fixture leaves to it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { NODE, TESTS, createDatabase, run, startGateway, startV2Server, tempDir } from './lib/harness.mjs';

const RELEASE = path.join(TESTS, 'node_modules/@modelcontextprotocol/conformance/dist/index.js');
const NEXT = path.join(TESTS, 'node_modules/conformance-next/dist/index.js');

/** Runs the active server suite at 2026-07-28; Map scenario → {passed, failed}. */
async function suite2026(t, url, label) {
  const out = await tempDir(t, 'idemgw-conf26-');
  const r = await run(NODE, [NEXT, 'server', '--url', url, '--suite', 'active', '--spec-version', '2026-07-28', '-o', out], {
    cwd: out, timeout: 300000, maxBuffer: 64 * 1024 * 1024,
  });
  const results = new Map();
  for (const m of r.stdout.matchAll(/^[✓✗] (\S+): (\d+) passed, (\d+) failed/gm)) {
    results.set(m[1], { passed: Number(m[2]), failed: Number(m[3]) });
  }
  if (results.size === 0) throw new Error(`no results from the conformance CLI against ${url} (exit ${r.code})\n${r.stdout}\n${r.stderr}`);
  results.output = r.stdout;
  t.diagnostic(`${label}: ${[...passing(results)].length}/${results.size} scenarios pass at 2026-07-28`);
  return results;
}

// The suite's tools say readOnlyHint; protected, they are claimed, forwarded and stored.
const PROTECTED = Object.fromEntries(['test_simple_text', 'test_image_content', 'test_audio_content', 'test_embedded_resource',
  'test_multiple_content_types', 'test_error_handling'].map((n) => [n, { class: 'non_idempotent' }]));

const passing = (results) => new Set([...results].filter(([, v]) => v.failed === 0).map(([k]) => k));

function failureReport(results, names) {
  return names.map((n) => {
    const block = results.output.split('=== Running scenario: ').find((b) => b.startsWith(`${n} ===`)) ?? '';
    return `--- ${n}\n${block.split('\n').filter((l) => /Error|FAIL|✗/.test(l)).join('\n')}`;
  }).join('\n');
}

test('conformance 0.1.16 has no 2026-07-28 scenarios (only 0.2.0-alpha.12 runs them)', async () => {
  const r = await run(NODE, [RELEASE, 'server', '--url', 'http://127.0.0.1:9/mcp', '--spec-version', '2026-07-28']);
  assert.notEqual(r.code, 0);
  assert.match(r.stdout + r.stderr, /Unknown spec version: 2026-07-28/);
});

for (const protect of [false, true]) {
  const how = protect ? 'protected' : 'forwarded untouched';
  test(`conformance 0.2.0-alpha.12 at 2026-07-28: the v2 fixture through the gateway (tools ${how}) passes whatever it passes directly`, async (t) => {
    const upstream = await startV2Server(t);
    const gw = await startGateway(t, {
      upstream: upstream.url,
      ...(protect ? { databaseUrl: await createDatabase() } : {}),
      config: protect ? { subject: { static: 'conformance' }, tools: PROTECTED } : { defaults: { class: 'read' } },
    });
    const direct = await suite2026(t, upstream.url, 'v2 fixture directly');
    const via = await suite2026(t, gw.url, `v2 fixture through the gateway (${how})`);
    assert.ok(passing(direct).size > 0, 'some scenarios pass directly');
    const lost = [...passing(direct)].filter((s) => !passing(via).has(s));
    assert.deepEqual(lost, [], `passing directly but failing through the gateway:\n${failureReport(via, lost)}`);
    assert.ok(passing(via).has('dns-rebinding-protection'),
      `dns-rebinding-protection fails through the gateway:\n${failureReport(via, ['dns-rebinding-protection'])}`);
    assert.equal(via.size, direct.size, 'both runs cover the same scenarios');
    if (protect) assert.match(gw.logs(), /"tool":"test_simple_text".*"recorded":"succeeded"/, 'the suite\'s calls were protected');
  });
}
