// What reaches the store is text Postgres accepts, and a statement Postgres rejects is not a
// store that is down. Header values that are not UTF-8 once made the claim fail in Postgres
// ("invalid byte sequence for encoding UTF8"), which the gateway took for "store down": with
// on_store_down: passthrough every repeat ran unprotected.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  createDatabase, idemStatus, rawSession, readLedger, replayMarker, run, startGateway, startRefundServer, toolText,
  waitForLog,
} from './lib/harness.mjs';

const SUBJECT = { 'X-Subject': 'agent-utf8' };

function assertRefused(result, code) {
  assert.equal(result?.isError, true, `a refusal is a tool error: ${JSON.stringify(result)}`);
  const st = idemStatus(result);
  assert.equal(st?.code, code, `refusal code: ${JSON.stringify(st)}`);
  assert.equal(st.executed, false);
  assert.equal(replayMarker(result), undefined);
}

async function setup(t, onStoreDown = 'passthrough') {
  const upstream = await startRefundServer(t, { jsonResponse: true });
  const databaseUrl = await createDatabase();
  const gw = await startGateway(t, {
    upstream: upstream.url,
    databaseUrl,
    config: { subject: { header: 'X-Subject' }, tools: { issue_refund: { class: 'non_idempotent', on_store_down: onStoreDown } } },
  });
  return { upstream, databaseUrl, gw };
}

test('an Idempotency-Key that is not UTF-8 is refused, naming the header; nothing runs', async (t) => {
  const { upstream, gw } = await setup(t);
  const s = await rawSession(t, gw.url, { headers: SUBJECT });
  for (let i = 0; i < 3; i++) {
    // U+00FF goes on the wire as the single byte 0xff
    const r = await s.call('issue_refund', { order_id: 'ord-key', amount_cents: 100 }, { headers: { 'Idempotency-Key': 'k\xff' } });
    assert.equal(r.status, 200, r.body);
    assertRefused(r.message?.result, 'bad_key');
    assert.match(toolText(r.message.result), /Idempotency-Key header/);
    assert.match(toolText(r.message.result), /UTF-8/);
  }
  assert.equal((await readLedger(upstream.ledger)).length, 0, 'never executed, never passed through');
  assert.doesNotMatch(gw.logs(), /without protection/);
});

test('a subject header that is not UTF-8 is refused, naming the header; nothing runs', async (t) => {
  const { upstream, gw } = await setup(t);
  const s = await rawSession(t, gw.url, { headers: { 'X-Subject': 'Jos\xe9' } });
  for (let i = 0; i < 3; i++) {
    const r = await s.call('issue_refund', { order_id: 'ord-subject', amount_cents: 100 });
    assert.equal(r.status, 200, r.body);
    assertRefused(r.message?.result, 'bad_subject');
    assert.match(toolText(r.message.result), /X-Subject/i);
    assert.match(toolText(r.message.result), /UTF-8/);
  }
  assert.equal((await readLedger(upstream.ledger)).length, 0, 'never executed, never passed through');
  assert.doesNotMatch(gw.logs(), /without protection/);

  // The same name in UTF-8 is a subject like any other.
  const ok = await rawSession(t, gw.url, { headers: { 'X-Subject': Buffer.from('José', 'utf8').toString('latin1') } });
  const r = await ok.call('issue_refund', { order_id: 'ord-subject', amount_cents: 100 });
  assert.match(toolText(r.message?.result), /^Refunded 100 cents/);
  const again = await ok.call('issue_refund', { order_id: 'ord-subject', amount_cents: 100 });
  assert.ok(replayMarker(again.message?.result), 'the repeat is a replay');
  assert.equal((await readLedger(upstream.ledger)).length, 1);
});

test('an Mcp-Session-Id that is not UTF-8 is stored hex-escaped: the call stays protected', async (t) => {
  // reject, so that a claim that failed would show as a store_unavailable refusal
  const { upstream, databaseUrl, gw } = await setup(t, 'reject');
  const s = await rawSession(t, gw.url, { headers: SUBJECT });
  const args = { order_id: 'ord-session', amount_cents: 100 };
  const r = await s.call('issue_refund', args, { headers: { 'Mcp-Session-Id': '\xff' } });
  // the upstream does not know that session: its answer passes through, the claim is released
  assert.notEqual(idemStatus(r.message?.result)?.code, 'store_unavailable', r.body);
  assert.doesNotMatch(gw.logs(), /claim failed/);
  const row = await run('psql', [databaseUrl, '-qAtc', 'SELECT first_session_id FROM idem_keys']);
  assert.equal(row.stdout.trim(), '\\xff', 'the session id is kept in bytea hex notation');

  // and the same call in the agent's real session runs once, then replays
  const ok = await s.call('issue_refund', args);
  assert.match(toolText(ok.message?.result), /^Refunded 100 cents/);
  const again = await s.call('issue_refund', args);
  assert.ok(replayMarker(again.message?.result));
  assert.equal((await readLedger(upstream.ledger)).length, 1);
});

test('a statement error is not "store down": refused without "retry later", never passed through', async (t) => {
  const { upstream, databaseUrl, gw } = await setup(t, 'passthrough');
  // Postgres answers every claim with an error while the connection stays healthy.
  const ddl = `CREATE FUNCTION refuse_claims() RETURNS trigger LANGUAGE plpgsql AS
    $$BEGIN RAISE EXCEPTION 'claims refused by test trigger' USING ERRCODE = 'P0001'; END$$;
    CREATE TRIGGER refuse_claims BEFORE INSERT OR UPDATE ON idem_keys FOR EACH ROW EXECUTE FUNCTION refuse_claims();`;
  const r0 = await run('psql', [databaseUrl, '-v', 'ON_ERROR_STOP=1', '-qc', ddl]);
  assert.equal(r0.code, 0, r0.stderr);

  const s = await rawSession(t, gw.url, { headers: SUBJECT });
  for (let i = 0; i < 3; i++) {
    const r = await s.call('issue_refund', { order_id: 'ord-stmt', amount_cents: 100 });
    assert.equal(r.status, 200, r.body);
    assertRefused(r.message?.result, 'store_error');
    assert.doesNotMatch(toolText(r.message.result), /retry later|safe to retry/i);
    assert.match(toolText(r.message.result), /Nothing was executed/);
  }
  assert.equal((await readLedger(upstream.ledger)).length, 0, 'not passed through');
  assert.doesNotMatch(gw.logs(), /without protection/);
  await waitForLog(gw, /"level":"error".*SQLSTATE P0001: .*claims refused by test trigger/);
  const ready = await fetch(`${gw.adminUrl}/readyz`);
  assert.equal(ready.status, 200, 'the store answers: it is up');
  await ready.arrayBuffer();
});
