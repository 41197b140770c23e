/* The upstream's answer to a protected call (idem_int.h): watched as the exchange's observer,
 * the final JSON-RPC response captured (decoded when compressed, out of JSON or SSE), its
 * outcome decided and recorded before the agent gets the answer (or, on a store that orders
 * its finishes, queued for the store before it: record). */
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

/* --- capturing the outcome --- */

static int on_sse_event(const sse_event_t *ev, void *arg)
{
    call_t *c = arg;
    if (c->final_seen || ev->data_len == 0)
        return 0;
    size_t off = 0, len = 0;
    mcp_resp_class_t cls =
        mcp_classify_response(ev->data, ev->data_len, call_msg(c)->id, &off, &len);
    if (cls == MCP_RESP_OTHER)
        return 0;
    c->final_seen = true;
    c->cls = cls;
    /* a foreign answer never reaches the agent; after our own, what follows waits until the
     * outcome is stored, so a retry right after sees it */
    c->hold_next = true;
    if (cls == MCP_RESP_FOREIGN) {
        c->foreign = true;
        return 0;
    }
    if (len > c->rules.max_stored_bytes) {
        c->too_large = true;
    } else {
        c->result = xstrndup(ev->data + off, len);
        c->result_len = len;
    }
    return 0;
}

static observe_t call_head(void *arg, int status, const http_headers_t *headers, bool sse)
{
    call_t *c = arg;
    if (c->state != CALL_FORWARDED)
        return OBSERVE_PASS;
    c->status = status;
    if (status != 200) {
        /* a redirect or a refusal released the claim: the agent learns of it once the release
         * is written, so a retry sent at once runs instead of hearing "in progress" */
        return OBSERVE_HOLD;
    }
    decode_coding_t coding = decode_coding_parse(http_headers_get(headers, "content-encoding"));
    if (coding == DECODE_CODING_UNSUPPORTED)
        c->undecodable = true;
    else
        c->decoder = decoder_new(coding);
    if (sse) {
        c->capture_sse = true;
        sse_init(&c->sse, c->rules.max_stored_bytes + 4096, on_sse_event, c);
        return OBSERVE_PASS;
    }
    c->capture_json = true;
    c->json_body = evbuffer_new();
    return OBSERVE_HOLD;
}

/* Bytes of the answer as the upstream meant them, before any Content-Encoding. */
static void capture(call_t *c, const char *data, size_t len)
{
    if (c->capture_sse) {
        int rc = sse_feed(&c->sse, data, len);
        (void)rc;
    } else if (c->capture_json && !c->too_large) {
        if (evbuffer_get_length(c->json_body) + len > c->rules.max_stored_bytes + 4096) {
            c->too_large = true;
            evbuffer_free(c->json_body);
            c->json_body = NULL;
        } else {
            evbuffer_add(c->json_body, data, len);
        }
    }
}

/* A decoding failure makes the answer unreadable, not the outcome unknown: the call ran. */
static void decode_failed(call_t *c, decode_status_t st)
{
    if (st == DECODE_ERR_LIMIT && c->capture_json) {
        c->too_large = true;
    } else {
        c->undecodable = true;
        log_warn(exchange_conn_id(c->ex), "compressed answer for key %.*s unreadable: %s",
                 KEY_HASH_LOG_LEN, c->key_hash, decode_status_str(st));
    }
    decoder_free(c->decoder);
    c->decoder = NULL;
}

static observe_t call_body(void *arg, const char *data, size_t len)
{
    call_t *c = arg;
    if (c->state != CALL_FORWARDED || c->undecodable || (!c->capture_sse && !c->capture_json))
        return OBSERVE_PASS;
    if (!c->decoder) {
        capture(c, data, len);
    } else {
        /* a JSON answer is kept whole, so its decoded size is bounded as a whole; a stream
         * only needs each read bounded, its events are bounded by the SSE parser */
        size_t limit = c->capture_json ? c->rules.max_stored_bytes + 4096
                                       : decoder_produced(c->decoder) + SSE_DECODED_PER_READ;
        struct evbuffer *plain = evbuffer_new();
        decode_status_t st = decoder_feed(c->decoder, data, len, plain, limit);
        size_t n = evbuffer_get_length(plain);
        if (n > 0)
            capture(c, (const char *)evbuffer_pullup(plain, -1), n);
        evbuffer_free(plain);
        if (st != DECODE_OK)
            decode_failed(c, st);
    }
    return c->hold_next ? OBSERVE_HOLD : OBSERVE_PASS;
}

static bool call_answer_seen(void *arg)
{
    const call_t *c = arg;
    return c->final_seen;
}

/* What the store made of a finish, in the log. */
static void log_recorded(uint64_t conn_id, const char *key_hash, store_status_t st,
                         bool fence_matched, store_state_t recorded, outcome_why_t why)
{
    if (st != STORE_OK) {
        log_error(conn_id, "could not record the outcome of key %.*s: %s", KEY_HASH_LOG_LEN,
                  key_hash, store_status_str(st));
    } else if (!fence_matched) {
        log_warn(conn_id, "outcome of key %.*s not recorded: the claim was taken over",
                 KEY_HASH_LOG_LEN, key_hash);
    } else {
        /* logged once the store has it: a retry sent after this line sees the outcome */
        log_info(conn_id, "key %.*s recorded as %s (%s)", KEY_HASH_LOG_LEN, key_hash,
                 store_state_str(recorded), outcome_why_str(why));
    }
}

/* A finish whose call was answered when it was queued (store_orders_finishes): the call and its
 * exchange may be gone by the time the store has it, so the log line keeps its own copy. */
typedef struct recorded_note {
    uint64_t conn_id;
    char key_hash[KEY_HASH_LOG_LEN + 1];
    store_state_t recorded;
    outcome_why_t why;
} recorded_note_t;

static void on_note_recorded(store_status_t st, bool fence_matched, uint64_t window_ms, void *arg)
{
    recorded_note_t *n = arg;
    (void)window_ms;
    log_recorded(n->conn_id, n->key_hash, st, fence_matched, n->recorded, n->why);
    free(n);
}

static void on_finished(store_status_t st, bool fence_matched, uint64_t window_ms, void *arg)
{
    call_t *c = arg;
    (void)window_ms;
    idem_t *i = c->idem;
    log_recorded(exchange_conn_id(c->ex), c->key_hash, st, fence_matched, c->recorded, c->why);
    call_set_state(c, CALL_DONE);
    if (c->foreign) {
        /* the upstream answered with another request's response: never the caller's */
        i->ctx.stats->unknown++;
        char *body =
            answer_body(ANSWER_FOREIGN, call_msg(c)->id_text, c->key_hash, NULL, NULL, NULL);
        exchange_set_outcome(c->ex, answer_outcome(ANSWER_FOREIGN));
        body = call_fit(c, body);
        exchange_replace_answer(c->ex, body);
        free(body);
        return;
    }
    if (c->cut && c->why == WHY_UNKNOWN) {
        /* what came of the answer is no answer: relayed, its head alone reads as an empty
         * 200, its body as a partial one. The agent learns instead that the call may have
         * run, and what a retry does. */
        bool held = c->recorded == STORE_STATE_UNKNOWN;
        char hint[300];
        char *body = answer_body(
            ANSWER_CUT, call_msg(c)->id_text, c->key_hash,
            held ? "Do NOT retry it: identical calls will not be executed until the idempotency "
                   "window ends."
                 : "Repeating it will execute it again.",
            NULL, reply_status_hint(i->ctx.cfg->status_tool, ANSWER_CUT, hint, sizeof(hint)));
        body = call_fit(c, body);
        exchange_replace_answer(c->ex, body);
        free(body);
        return;
    }
    exchange_release(c->ex);
}

static void deferred_finish_fail(evutil_socket_t fd, short what, void *arg)
{
    call_t *c = arg;
    on_finished(c->deferred_status, false, c->rules.window_ms, c);
}

/* Writes the outcome; a retry right after the agent's answer sees it. The answer waits for the
 * store's callback, unless the store orders a finish before every later call
 * (store_orders_finishes: the embedded store of one process, finishes not waiting for the disk):
 * then it goes as soon as the finish is queued, and saves the agent the round trip to the
 * writer thread and back. An answer the gateway replaces (another request's response, a cut
 * one) still waits. */
static observe_t record(call_t *c, store_state_t state, outcome_why_t why)
{
    idem_t *i = c->idem;
    call_set_state(c, CALL_RECORDING);
    call_note_stream_caller(c);
    exchange_set_outcome(c->ex, outcome_name(why));
    if (outcome_executed(why))
        i->ctx.stats->executions++;
    exchange_set_facts(c->ex, &(exchange_facts_t){
                                  .key_hash = c->key_hash,
                                  .recorded = store_state_str(state),
                                  .why = outcome_why_str(why),
                                  .answered = c->answered_early ? "still_running" : NULL,
                                  .cancel = c->cancel_kept ? "kept" : NULL,
                              });
    c->why = why;
    c->recorded = state;
    /* a caller that timed out never read the answer: its retry is no model's */
    if (!c->answered_early && (c->cancel_kept || !exchange_agent_waiting(c->ex)))
        dup_recent_unread(i->recent, c->key_hash);
    const char *result = state == STORE_STATE_SUCCEEDED ? c->result : NULL;
    size_t result_len = state == STORE_STATE_SUCCEEDED ? c->result_len : 0;
    if (state == STORE_STATE_UNKNOWN && c->cancelled) {
        result = CALL_CANCEL_NOTE;
        result_len = sizeof(CALL_CANCEL_NOTE) - 1;
    }
    recorder_call_t rc = {
        .key = c->key,
        .key_hash = c->key_hash,
        .fence = c->fence,
        .window_ms = c->rules.window_ms,
        .max_stored_bytes = c->rules.max_stored_bytes,
        .args_digest = c->args_digest,
        .claimed_at = c->claimed_at,
        .attempts = c->attempts,
        .subject = c->subject,
        .session = call_header(c, "mcp-session-id"),
        .jsonrpc_id = call_msg(c)->id_text,
    };
    recorded_note_t *note = NULL;
    if (!c->foreign && !(c->cut && why == WHY_UNKNOWN) && store_orders_finishes(i->ctx.store)) {
        note = xcalloc(1, sizeof(*note));
        note->conn_id = exchange_conn_id(c->ex);
        memcpy(note->key_hash, c->key_hash, KEY_HASH_LOG_LEN); /* calloc'd: NUL-terminated */
        note->recorded = state;
        note->why = why;
    }
    store_status_t st =
        recorder_finish(&i->recorder, &rc, state, result, result_len, c->too_large,
                        note ? on_note_recorded : on_finished, note ? (void *)note : c);
    if (st == STORE_OK && note) {
        call_set_state(c, CALL_DONE);
        exchange_release(c->ex);
        return OBSERVE_PASS;
    }
    free(note);
    if (st != STORE_OK) {
        /* reported from the loop: the proxy is still in its callback */
        c->deferred_status = st;
        struct timeval zero = {0, 0};
        event_base_once(i->ctx.base, -1, EV_TIMEOUT, deferred_finish_fail, c, &zero);
    }
    return OBSERVE_HOLD;
}

/* The JSON answer, whole: its final response, if it has one. */
static void read_json_answer(call_t *c)
{
    size_t len = evbuffer_get_length(c->json_body);
    const char *text = (const char *)evbuffer_pullup(c->json_body, -1);
    size_t off = 0, rlen = 0;
    mcp_resp_class_t cls =
        mcp_classify_response(text ? text : "", len, call_msg(c)->id, &off, &rlen);
    if (cls == MCP_RESP_FOREIGN) {
        c->foreign = true;
        return;
    }
    if (cls != MCP_RESP_OTHER) {
        c->final_seen = true;
        c->cls = cls;
        c->result = xstrndup(text + off, rlen);
        c->result_len = rlen;
    }
}

static observe_t call_end(void *arg, upstream_result_t res)
{
    call_t *c = arg;
    if (c->state != CALL_FORWARDED)
        return OBSERVE_PASS;
    call_fwd_remove(c);
    if (c->lease_timer)
        evtimer_del(c->lease_timer);
    if (c->decoder && res == UPSTREAM_OK) {
        decode_status_t ds = decoder_finish(c->decoder);
        if (ds != DECODE_OK)
            decode_failed(c, ds);
    }
    /* an answer with another id than the one the call went up with (call_ids.h) */
    if (res == UPSTREAM_ERR_PROTOCOL && exchange_upstream_desync(c->ex))
        c->foreign = true;
    c->cut = res != UPSTREAM_OK && c->status != 0;
    if (c->capture_json && res == UPSTREAM_OK && c->json_body && !c->foreign && !c->undecodable) {
        read_json_answer(c);
    } else if (c->capture_json && res == UPSTREAM_OK && c->too_large) {
        c->final_seen = true;
        c->cls = MCP_RESP_RESULT;
    }
    if (c->foreign) {
        exchange_discard_upstream(c->ex);
        return record(c, STORE_STATE_UNKNOWN, WHY_FOREIGN);
    }
    if (c->undecodable && res == UPSTREAM_OK) {
        c->too_large = true; /* recorded as ran, result not kept */
        return record(c, STORE_STATE_SUCCEEDED, WHY_UNDECODABLE);
    }
    store_state_t ambiguous =
        c->rules.on_ambiguous == ON_AMBIGUOUS_HOLD ? STORE_STATE_UNKNOWN : STORE_STATE_FAILED;
    if (c->final_seen) {
        outcome_why_t why;
        store_state_t st = outcome_final_state(c->cls, c->rules.on_tool_error, &why);
        return record(c, st, why);
    }
    if (c->cancelled) /* no answer will come: the caller gave up on it, and it may have run */
        return record(c, ambiguous, WHY_CANCELLED);
    const char *session = call_header(c, "mcp-session-id");
    if (c->capture_sse && session) {
        recorder_call_t rc = {
            .key = c->key,
            .key_hash = c->key_hash,
            .fence = c->fence,
            .window_ms = c->rules.window_ms,
            .max_stored_bytes = c->rules.max_stored_bytes,
            .args_digest = c->args_digest,
            .claimed_at = c->claimed_at,
            .attempts = c->attempts,
            .subject = c->subject,
            .session = session,
            .jsonrpc_id = call_msg(c)->id_text,
        };
        pending_add(c->idem->pending, &rc, call_msg(c)->id, &c->rules);
        call_note_stream_caller(c);
    }
    if (c->capture_sse && session && res == UPSTREAM_OK) {
        /* the server ended the stream early (SSE polling): the agent resumes it with GET and
         * the final response finishes the key there; until then the claim stays in progress */
        call_set_state(c, CALL_DONE);
        exchange_set_outcome(c->ex, "pending");
        exchange_release(c->ex);
        return OBSERVE_PASS;
    }
    if (res == UPSTREAM_ERR_CONNECT)
        return record(c, STORE_STATE_FAILED, WHY_NEVER_SENT);
    /* a redirect: the upstream sent the call elsewhere and ran nothing */
    if (res == UPSTREAM_OK && c->status >= 300 && c->status < 400)
        return record(c, STORE_STATE_FAILED, WHY_REDIRECTED);
    if (res == UPSTREAM_OK && c->status >= 400 && c->status < 500)
        return record(c, STORE_STATE_FAILED, WHY_REFUSED);
    return record(c, ambiguous, WHY_UNKNOWN);
}

const response_observer_t call_observer = {
    .on_head = call_head,
    .on_body = call_body,
    .on_end = call_end,
    .answer_seen = call_answer_seen,
    .detach = call_detach,
};
