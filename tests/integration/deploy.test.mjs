// The Kubernetes example parses and has what a sidecar deployment needs; the policy inside
// it is a valid gateway config.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import path from 'node:path';
import { parseAllDocuments } from 'yaml';
import { IDEMGW_BIN, REPO, run, tempDir } from './lib/harness.mjs';

test('deploy/kubernetes: a native sidecar with probes, a hardened context and a valid policy', async (t) => {
  const text = await fs.readFile(path.join(REPO, 'deploy/kubernetes/idemgw-sidecar.yaml'), 'utf8');
  const docs = parseAllDocuments(text);
  for (const d of docs) assert.deepEqual(d.errors, [], 'every document parses');
  const objs = docs.map((d) => d.toJS());
  const kind = (k) => objs.find((o) => o.kind === k);
  const cm = kind('ConfigMap');
  const dep = kind('Deployment');
  const svc = kind('Service');
  assert.ok(cm && dep && svc && kind('Secret'));

  const pod = dep.spec.template.spec;
  const gw = pod.initContainers.find((c) => c.name === 'idemgw');
  assert.equal(gw.restartPolicy, 'Always', 'a native sidecar (Kubernetes >= 1.29)');
  assert.equal(gw.readinessProbe.httpGet.path, '/readyz');
  assert.equal(gw.livenessProbe.httpGet.path, '/healthz');
  assert.equal(gw.startupProbe.httpGet.path, '/healthz');
  assert.equal(gw.readinessProbe.httpGet.port, 'admin');
  const sc = gw.securityContext;
  assert.equal(sc.runAsNonRoot, true);
  assert.equal(sc.readOnlyRootFilesystem, true);
  assert.equal(sc.allowPrivilegeEscalation, false);
  assert.deepEqual(sc.capabilities.drop, ['ALL']);
  assert.ok(gw.resources.requests.memory && gw.resources.requests.cpu);
  assert.equal(gw.env.find((e) => e.name === 'IDEMGW_DATABASE_URL').valueFrom.secretKeyRef.name, kind('Secret').metadata.name);
  assert.equal(svc.spec.ports[0].targetPort, 'mcp');
  assert.deepEqual(svc.spec.selector, dep.spec.selector.matchLabels);

  // The policy in the ConfigMap loads, and the grace period outlasts its drain.
  const dir = await tempDir(t, 'idemgw-deploy-');
  const file = path.join(dir, 'idemgw.yaml');
  await fs.writeFile(file, cm.data['idemgw.yaml']);
  const check = await run(IDEMGW_BIN, ['--check-config', '-c', file]);
  assert.equal(check.code, 0, check.stderr);
  const drain = /drain: (\d+)s/.exec(cm.data['idemgw.yaml'])[1];
  assert.ok(pod.terminationGracePeriodSeconds > Number(drain), 'terminationGracePeriodSeconds above timeouts.drain');
  const mounts = Object.fromEntries(gw.volumeMounts.map((m) => [m.mountPath, m.name]));
  assert.ok(mounts['/etc/idemgw'] && mounts['/var/lib/idemgw'], 'config and state mounted');
});
