/* What the protected call's stage answers itself (idem_int.h): a duplicate's replay, in
 * progress or unknown, judged for which layer retried and recorded on its row; a refusal; the
 * store's failures. */
#include "idem_int.h"
#include "answers.h"
#include "cancel.h"
#include "catalog.h"
#include "decode.h"
#include "dup_recent.h"
#include "dupsource.h"
#include "handoff.h"
#include "jcs.h"
#include "key.h"
#include "log.h"
#include "outcome.h"
#include "pending.h"
#include "recorder.h"
#include "reply.h"
#include "policy.h"
#include "replay_cache.h"
#include "revision.h"
#include "resume_guard.h"
#include "sse.h"
#include "store.h"
#include "subject.h"
#include "tasks.h"
#include "util.h"

#include <event2/buffer.h>
#include <llhttp.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* --- answers the gateway writes --- */

/* How the answers of reply.h reach this call's caller. */
static reply_t reply_of(const call_t *c)
{
    return (reply_t){
        .ex = c->ex,
        .stats = c->idem->ctx.stats,
        .revision = c->revision,
        .status_tool = c->idem->ctx.cfg->status_tool,
        .key_hash = c->key ? c->key_hash : NULL,
        .dup = &c->dup,
    };
}

/* The call ends here with an answer of the gateway's own. Last use of c.
 * why (may be NULL): a short reason the log line carries with the code ("expired"). */
void call_answer_why(call_t *c, answer_t a, const char *detail, const char *detail2,
                     const char *why)
{
    reply_t r = reply_of(c);
    call_set_state(c, CALL_DONE);
    reply_answer(&r, a, detail, detail2, why);
}

void call_answer(call_t *c, answer_t a, const char *detail, const char *detail2)
{
    call_answer_why(c, a, detail, detail2, NULL);
}

/* A key the gateway advertised in tools/list (advertise_key) is the gateway's, not the
 * server's: it leaves the arguments before they go up, unless the server's own schema has it. */
void call_strip_advertised_key(call_t *c)
{
    const idem_t *i = c->idem;
    const mcp_msg_t *m = call_msg(c);
    const char *key_arg = policy_lookup(&i->ctx.cfg->policy, m->tool)->key_arg;
    if (!c->rules.advertise_key || !key_arg || !*key_arg || !i->ctx.catalog ||
        catalog_declares(i->ctx.catalog, m->tool, key_arg))
        return;
    struct evbuffer *buf = exchange_request(c->ex)->body;
    size_t len = evbuffer_get_length(buf), out_len = 0;
    char *body =
        mcp_without_argument((const char *)evbuffer_pullup(buf, -1), len, key_arg, &out_len);
    if (body)
        exchange_replace_body(c->ex, body, out_len);
    free(body);
}

/* The agent's own Idempotency-Key of a protected call is the gateway's to use, never the
 * upstream's (it may be a secret of the agent's; forward_key: false means the upstream sees no
 * key). With forward_key only the key's hash goes up (appended to extra). */
void call_key_header(call_t *c, char *extra, size_t size)
{
    exchange_drop_request_header(c->ex, "idempotency-key");
    size_t used = strlen(extra);
    if (c->rules.forward_key)
        snprintf(extra + used, size - used, "Idempotency-Key: %s\r\n", c->key_hash);
}

void call_answer_store_down(call_t *c)
{
    if (c->rules.on_store_down == ON_STORE_DOWN_PASSTHROUGH) {
        c->idem->ctx.stats->passthrough++;
        log_warn(exchange_conn_id(c->ex), "store unavailable: forwarding %s without protection",
                 call_msg(c)->tool);
        exchange_set_outcome(c->ex, "passthrough");
        call_set_state(c, CALL_PASSTHROUGH);
        call_note_stream_caller(c);
        char extra[100] = "";
        call_key_header(c, extra, sizeof(extra));
        call_strip_advertised_key(c);
        /* unprotected, yet a call of a non_idempotent tool: never sent a second time after a
         * kept-alive connection closed under it */
        exchange_forward(c->ex, *extra ? extra : NULL, true);
        return;
    }
    call_answer(c, ANSWER_STORE_DOWN, NULL, NULL);
}

/* A store call failed. Only a store that does not answer is "down" (reply.h): passing a call
 * through over a statement the store rejected would run every repeat of it unprotected. */
void call_answer_store_failed(call_t *c, store_status_t st)
{
    if (st == STORE_ERR_UNAVAILABLE) {
        call_answer_store_down(c);
        return;
    }
    reply_t r = reply_of(c);
    call_set_state(c, CALL_DONE);
    reply_store_failed(&r, st, call_msg(c)->tool);
}

/* The clientInfo a 2026-07-28 request carries in params._meta, as "name/version"; "" if none. */
void call_client(const call_t *c, char *out, size_t len)
{
    out[0] = '\0';
    struct evbuffer *b = exchange_request(c->ex)->body;
    size_t n = evbuffer_get_length(b);
    const char *body = (const char *)evbuffer_pullup(b, -1);
    if (!body || !memmem(body, n, CLIENT_INFO_META, sizeof(CLIENT_INFO_META) - 1))
        return;
    json_t *root = json_loadb(body, n, 0, NULL);
    json_t *info = json_object_get(json_object_get(json_object_get(root, "params"), "_meta"),
                                   CLIENT_INFO_META);
    const char *name = json_string_value(json_object_get(info, "name"));
    const char *version = json_string_value(json_object_get(info, "version"));
    if (name)
        snprintf(out, len, "%.60s/%.30s", name, version ? version : "");
    json_decref(root);
}

/* An attempt of the call's key (the first, a takeover or a duplicate), for the rules that
 * look at the steps between attempts; before: what was known until then (may be NULL). */
void call_note_attempt(call_t *c, const char *client, dup_recent_seen_t *before)
{
    dup_recent_note(c->idem->recent, c->key_hash, util_now_ms(), c->idem->ctx.cfg->dup_model_ms,
                    client && *client ? client : NULL, before);
}

/* A duplicate of row's call, answered as it says: which layer most likely retried, counted,
 * kept for the log, and recorded on the key's row (its counts and history; a replay also
 * counts in attempts). The record rides on the next batched write, never a store call of its
 * own; one that is lost loses nothing else. */
static void judge_duplicate(call_t *c, const store_row_t *row, int attempt,
                            store_dup_answer_t answered)
{
    const config_t *cfg = c->idem->ctx.cfg;
    uint64_t first = dup_parse_time_ms(row->created_at), now = util_wall_ms();
    char client[96];
    call_client(c, client, sizeof(client));
    dup_recent_seen_t seen;
    call_note_attempt(c, client, &seen);
    uint64_t mono = util_now_ms();
    dup_facts_t f = {
        .first_session = row->first_session_id,
        .session = call_header(c, "mcp-session-id"),
        .first_id = row->first_jsonrpc_id,
        .id = call_msg(c)->id_text,
        .gap_ms = first && now > first ? now - first : 0,
        .first_running = row->state == STORE_STATE_IN_PROGRESS && !row->lease_expired,
        .first_unread = seen.attempts && seen.first_unread,
        .first_client = seen.attempts && seen.first_client[0] ? seen.first_client : NULL,
        .client = client[0] ? client : NULL,
        /* 0 says "not known": a gap of 0 ms counts as 1 */
        .last_gap_ms = seen.attempts ? (mono > seen.last_ms ? mono - seen.last_ms : 1) : 0,
        .step_ms =
            seen.before_last_ms
                ? (seen.last_ms > seen.before_last_ms ? seen.last_ms - seen.before_last_ms : 1)
                : 0,
    };
    dup_thresholds_t t = {cfg->dup_harness_ms, cfg->dup_model_ms};
    dup_source_t src = dup_source(&f, &t);
    const char *tool = call_msg(c)->tool;
    catalog_t *cat = c->idem->ctx.catalog;
    stats_tool(c->idem->ctx.stats, cfg->server_name, tool, cat && catalog_known(cat, tool))
        ->duplicates[src]++;
    snprintf(c->dup_first_seen, sizeof(c->dup_first_seen), "%s",
             row->created_at ? row->created_at : "");
    c->dup = (exchange_dup_facts_t){
        .source = dup_source_name(src),
        .attempt = attempt,
        .first_seen = c->dup_first_seen,
        .gap_ms = f.gap_ms,
        .first_state = store_state_str(row->state),
    };
    if (c->idem->ctx.store) {
        store_dup_t d = {
            .key = c->key,
            .answered = answered,
            .source = src,
            .at_ms = now,
            .gap_ms = f.gap_ms,
            .jsonrpc_id = f.id,
            .session_id = f.session,
        };
        store_status_t st = store_record_duplicate(c->idem->ctx.store, &d, NULL, NULL);
        (void)st;
    }
}

void call_answer_unknown(call_t *c, const store_row_t *row)
{
    if (row)
        judge_duplicate(c, row, call_row_attempts(c, row) + 1, STORE_DUP_UNKNOWN);
    bool cancelled = row && row->state == STORE_STATE_UNKNOWN && row->result &&
                     row->result_len == sizeof(CALL_CANCEL_NOTE) - 1 &&
                     memcmp(row->result, CALL_CANCEL_NOTE, row->result_len) == 0;
    call_answer(c, cancelled ? ANSWER_CANCELLED : ANSWER_UNKNOWN, row ? row->created_at : NULL,
                NULL);
}

void call_answer_in_progress(call_t *c, const store_row_t *row)
{
    if (row)
        judge_duplicate(c, row, call_row_attempts(c, row) + 1, STORE_DUP_IN_PROGRESS);
    call_answer(c, ANSWER_IN_PROGRESS, row ? row->created_at : NULL, NULL);
}

/* The replay marker's attempts and `idemgw key --show`'s are one count (store_row_t): calls
 * with this key that ran or were replayed, the first call and each takeover and replay, this
 * replay included. Every replay is counted in the store, from the cache too, so once the
 * batched counts are written (within DUP_FLUSH_MS) --show prints what the last marker said.
 * A process knows only its own unwritten counts: with several gateways (or workers), a
 * marker may be lower than --show, never higher.
 *
 * Attempts a row read from the store stands for: its count plus the duplicates this process
 * counted and has not written yet (they are batched). */
int call_row_attempts(const call_t *c, const store_row_t *row)
{
    store_t *store = c->idem->ctx.store;
    return row->attempts + (store ? store_pending_duplicates(store, c->key) : 0);
}

void call_answer_replay(call_t *c, const store_row_t *row, bool from_cache)
{
    idem_t *i = c->idem;
    int attempts = (from_cache ? row->attempts : call_row_attempts(c, row)) + 1;
    char marker[400];
    snprintf(marker, sizeof(marker),
             "{\"replayed\":true,\"first_seen\":\"%s\",\"attempts\":%d,\"key_hash\":\"%s\"}",
             row->created_at ? row->created_at : "", attempts, c->key_hash);
    char *body = reply_replay_body(call_msg(c)->id_text, row, marker);
    if (!body) {
        call_answer(c, ANSWER_REPLAY_FAILED, NULL, NULL);
        return;
    }
    /* recorded for --show and the report, from the cache too */
    judge_duplicate(c, row, attempts, STORE_DUP_REPLAY);
    exchange_set_facts(c->ex, &(exchange_facts_t){.key_hash = c->key_hash, .dup = c->dup});
    i->ctx.stats->replays++;
    if (from_cache)
        i->ctx.stats->cache_replays++;
    if (!from_cache && row->result && row->expires_in_ms > 0)
        task_routes_note(i->tasks, row->result, row->result_len, c->subject, row->first_session_id,
                         util_now_ms() + (uint64_t)row->expires_in_ms);
    exchange_set_outcome(c->ex, "replay");
    reply_t r = reply_of(c);
    call_set_state(c, CALL_DONE);
    reply_send(&r, body, "Idempotent-Replayed: true\r\n");
}
