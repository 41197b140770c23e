#include "idem.h"
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

/* Keys whose recent attempts are kept for the duplicate-source rules. */
#define DUP_RECENT_SLOTS 4096

/* Wait mode polls the store: replicas share nothing else. */
#define WAIT_POLL_FIRST_MS 25
#define WAIT_POLL_MAX_MS 250

static const char *const call_state_names[CALL_N_STATES] = {
    "resolving", "claiming", "waiting", "forwarded", "passthrough", "recording", "done",
};

#define TO(s) (1u << (s))
static const unsigned call_transitions[CALL_N_STATES] = {
    [CALL_RESOLVING] = TO(CALL_CLAIMING) | TO(CALL_DONE),
    [CALL_CLAIMING] = TO(CALL_CLAIMING) | TO(CALL_WAITING) | TO(CALL_FORWARDED) |
                      TO(CALL_PASSTHROUGH) | TO(CALL_RECORDING) | TO(CALL_DONE),
    [CALL_WAITING] = TO(CALL_CLAIMING) | TO(CALL_DONE),
    [CALL_FORWARDED] = TO(CALL_RECORDING) | TO(CALL_DONE),
    [CALL_PASSTHROUGH] = 0,
    [CALL_RECORDING] = TO(CALL_DONE),
    [CALL_DONE] = 0,
};
#undef TO

void call_set_state(call_t *c, call_state_t to)
{
    if (!(call_transitions[c->state] & (1u << to))) {
        log_error(exchange_conn_id(c->ex), "protected call: no transition from %s to %s",
                  call_state_names[c->state], call_state_names[to]);
        abort();
    }
    /* claimed and forwarded until the outcome is written: the in-flight gauge */
    bool was = c->state == CALL_FORWARDED || c->state == CALL_RECORDING;
    bool is = to == CALL_FORWARDED || to == CALL_RECORDING;
    if (was != is) {
        if (is)
            c->idem->ctx.stats->protected_in_flight++;
        else
            c->idem->ctx.stats->protected_in_flight--;
    }
    c->state = to;
}

const mcp_msg_t *call_msg(const call_t *c)
{
    return exchange_msg(c->ex);
}

const char *call_header(const call_t *c, const char *name)
{
    return http_headers_get(&exchange_request(c->ex)->headers, name);
}

/* Every answer this stage writes itself passes here (or through reply.h) on its way out: it
 * fits the caller's era. */
char *call_fit(const call_t *c, char *body)
{
    return revision_fit(body, c->revision);
}

/* The session's streams may carry this call's result: only its caller may resume them while
 * the call can run and its result is remembered (resume_guard.h). */
void call_note_stream_caller(call_t *c)
{
    const char *session = call_header(c, "mcp-session-id");
    uint64_t now = util_now_ms();
    if (!session || !c->subject || !c->idem->ctx.guard)
        return;
    resume_guard_note(c->idem->ctx.guard, session, c->subject, now,
                      now + c->rules.lease_ms + c->rules.window_ms);
    /* with several workers, the session's resumes are handed here, where the note is */
    handoff_note_stream(session, true);
}

/* --- the list of live calls: claiming, waiting or forwarded, for cancels --- */

void call_fwd_remove(call_t *c)
{
    if (!c->in_fwd)
        return;
    if (c->prev_fwd)
        c->prev_fwd->next_fwd = c->next_fwd;
    else
        c->idem->live = c->next_fwd;
    if (c->next_fwd)
        c->next_fwd->prev_fwd = c->prev_fwd;
    c->in_fwd = false;
}

static void fwd_add(call_t *c)
{
    if (c->in_fwd)
        return;
    c->prev_fwd = NULL;
    c->next_fwd = c->idem->live;
    if (c->next_fwd)
        c->next_fwd->prev_fwd = c;
    c->idem->live = c;
    c->in_fwd = true;
}

void call_detach(void *arg)
{
    call_t *c = arg;
    if (c->state == CALL_FORWARDED || c->state == CALL_RECORDING)
        c->idem->ctx.stats->protected_in_flight--;
    call_fwd_remove(c);
    free(c->key);
    free(c->subject);
    free(c->store_tool);
    if (c->json_body)
        evbuffer_free(c->json_body);
    decoder_free(c->decoder);
    if (c->capture_sse)
        sse_free(&c->sse);
    free(c->result);
    if (c->timer)
        event_free(c->timer);
    if (c->lease_timer)
        event_free(c->lease_timer);
    if (c->early_timer)
        event_free(c->early_timer);
    free(c);
}
/* --- claim --- */

static void claim(call_t *c);

/* The agent left while a store call ran: the call ends without an answer. */
static bool agent_left(call_t *c)
{
    if (exchange_agent_waiting(c->ex))
        return false;
    call_set_state(c, CALL_DONE);
    exchange_end(c->ex);
    return true;
}

static void on_get(store_status_t st, const store_row_t *row, void *arg)
{
    call_t *c = arg;
    if (agent_left(c))
        return;
    if (st != STORE_OK) {
        /* the first call was running a moment ago: forwarding now (passthrough) could run
         * it twice, so the duplicate hears "in progress" */
        call_answer_in_progress(c, NULL);
        return;
    }
    if (!row || row->state == STORE_STATE_FAILED) {
        /* the first attempt was released (or expired): this one may run */
        call_set_state(c, CALL_CLAIMING);
        claim(c);
        return;
    }
    if (row->state == STORE_STATE_SUCCEEDED) {
        call_answer_replay(c, row, false);
        return;
    }
    if (row->state == STORE_STATE_UNKNOWN ||
        (row->lease_expired && c->rules.on_ambiguous == ON_AMBIGUOUS_HOLD)) {
        call_answer_unknown(c, row);
        return;
    }
    if (row->lease_expired) {
        call_set_state(c, CALL_CLAIMING);
        claim(c);
        return;
    }
    if (util_now_ms() >= c->wait_deadline_ms) {
        call_answer_in_progress(c, row);
        return;
    }
    struct timeval tv;
    tv = util_ms_to_tv(c->poll_ms);
    evtimer_add(c->timer, &tv);
    c->poll_ms = c->poll_ms * 2 > WAIT_POLL_MAX_MS ? WAIT_POLL_MAX_MS : c->poll_ms * 2;
}

static void answer_dropped(call_t *c);

static void wait_tick(evutil_socket_t fd, short what, void *arg)
{
    call_t *c = arg;
    if (agent_left(c))
        return;
    if (c->drop_unsent) {
        answer_dropped(c); /* cancelled while it waited: it never goes up */
        return;
    }
    if (store_get(c->idem->ctx.store, c->key, on_get, c) != STORE_OK)
        call_answer_in_progress(c, NULL);
}

static void start_wait(call_t *c)
{
    log_debug(exchange_conn_id(c->ex), "key %.*s: an identical call runs; waiting for its outcome",
              KEY_HASH_LOG_LEN, c->key_hash);
    call_set_state(c, CALL_WAITING);
    c->wait_deadline_ms = util_now_ms() + c->rules.wait_ms;
    c->poll_ms = WAIT_POLL_FIRST_MS;
    if (!c->timer)
        c->timer = evtimer_new(c->idem->ctx.base, wait_tick, c);
    struct timeval tv;
    tv = util_ms_to_tv(c->poll_ms);
    evtimer_add(c->timer, &tv);
}

static void lease_interval(const call_t *c, struct timeval *tv)
{
    *tv = util_ms_to_tv(c->rules.lease_ms / 3 < 1000 ? 1000 : c->rules.lease_ms / 3);
}

/* A long streamed call renews its lease, so duplicates keep hearing "in progress" rather than
 * "unknown" (or, with on_ambiguous: release, running it a second time) while it is alive. */
static void renew_lease(evutil_socket_t fd, short what, void *arg)
{
    call_t *c = arg;
    store_t *store = c->idem->ctx.store;
    if (c->state != CALL_FORWARDED || !store)
        return;
    if (store_extend_lease(store, c->key, c->fence, c->rules.lease_ms, NULL, NULL) != STORE_OK)
        log_warn(exchange_conn_id(c->ex), "could not renew the lease of key %.*s", KEY_HASH_LOG_LEN,
                 c->key_hash);
    struct timeval tv;
    lease_interval(c, &tv);
    evtimer_add(c->lease_timer, &tv);
}

/* answer_after: the call is still running; the agent hears so, the result is kept. */
static void answer_still_running(evutil_socket_t fd, short what, void *arg)
{
    call_t *c = arg;
    if (c->state != CALL_FORWARDED || c->final_seen || !exchange_agent_waiting(c->ex))
        return;
    char hint[300];
    char *body = answer_body(
        ANSWER_STILL_RUNNING, call_msg(c)->id_text, c->key_hash, c->claimed_at, NULL,
        reply_status_hint(c->idem->ctx.cfg->status_tool, ANSWER_STILL_RUNNING, hint, sizeof(hint)));
    exchange_set_facts(c->ex,
                       &(exchange_facts_t){.key_hash = c->key_hash, .answered = "still_running"});
    c->idem->ctx.stats->in_progress++;
    c->answered_early = true;
    body = call_fit(c, body);
    exchange_answer_early(c->ex, body);
    free(body);
}

static void forward_claimed(call_t *c)
{
    call_set_state(c, CALL_FORWARDED);
    fwd_add(c);
    call_note_stream_caller(c);
    struct timeval tv;
    lease_interval(c, &tv);
    c->lease_timer = evtimer_new(c->idem->ctx.base, renew_lease, c);
    evtimer_add(c->lease_timer, &tv);
    if (c->rules.answer_after_ms) {
        uint64_t ms = c->rules.answer_after_ms;
        struct timeval after = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
        c->early_timer = evtimer_new(c->idem->ctx.base, answer_still_running, c);
        evtimer_add(c->early_timer, &after);
    }
    exchange_set_outcome(c->ex, "forwarded"); /* until the upstream's answer says what happened */
    /* the result is read to be stored: ask for it uncompressed (decoded anyway if it is not) */
    char extra[160] = "Accept-Encoding: identity\r\n";
    call_key_header(c, extra, sizeof(extra));
    call_strip_advertised_key(c);
    exchange_forward(c->ex, extra, true);
}

/* A call its caller cancelled before it went up (on_cancel: forward) ends here. The caller
 * expects no answer; one still connected gets an error saying nothing ran, which ends its
 * request. */
static void answer_dropped(call_t *c)
{
    call_set_state(c, CALL_DONE);
    exchange_set_outcome(c->ex, outcome_name(WHY_DROPPED));
    if (!exchange_agent_waiting(c->ex)) {
        exchange_end(c->ex);
        return;
    }
    char *body = mcp_error_body(call_msg(c)->id_text, -32800,
                                "the request was cancelled by its caller before it reached the "
                                "server; nothing was executed, and repeating it is safe");
    exchange_respond_json(c->ex, 200, body, NULL);
    free(body);
}

/* The claim is released without the call going up: nothing ran. The agent, if it still
 * waits, hears that the call was cancelled and not executed. */
static void on_released(store_status_t st, bool fence_matched, void *arg)
{
    call_t *c = arg;
    if (st != STORE_OK || !fence_matched)
        log_warn(exchange_conn_id(c->ex),
                 "key %.*s: the release of a cancelled call was not "
                 "written (%s); the claim ends with its lease",
                 KEY_HASH_LOG_LEN, c->key_hash,
                 st != STORE_OK ? store_status_str(st) : "taken over");
    answer_dropped(c);
}

static void deferred_release_fail(evutil_socket_t fd, short what, void *arg)
{
    call_t *c = arg;
    on_released(c->deferred_status, false, c);
}

static void release_unsent(call_t *c)
{
    idem_t *i = c->idem;
    call_set_state(c, CALL_RECORDING);
    call_fwd_remove(c);
    c->recorded = STORE_STATE_FAILED;
    c->why = WHY_DROPPED;
    exchange_set_outcome(c->ex, outcome_name(c->why));
    exchange_set_facts(c->ex, &(exchange_facts_t){.key_hash = c->key_hash,
                                                  .recorded = store_state_str(c->recorded),
                                                  .why = outcome_why_str(c->why)});
    log_info(exchange_conn_id(c->ex),
             "key %.*s: cancelled by its caller before it was sent; "
             "released, not forwarded",
             KEY_HASH_LOG_LEN, c->key_hash);
    store_finish_req_t fin = {.key = c->key,
                              .fence = c->fence,
                              .state = STORE_STATE_FAILED,
                              .window_ms = c->rules.window_ms};
    store_status_t st = store_finish(i->ctx.store, &fin, on_released, c);
    if (st != STORE_OK) {
        c->deferred_status = st;
        struct timeval zero = {0, 0};
        event_base_once(i->ctx.base, -1, EV_TIMEOUT, deferred_release_fail, c, &zero);
    }
}

static void on_claim(store_status_t st, const store_claim_result_t *res, void *arg)
{
    call_t *c = arg;
    idem_t *i = c->idem;
    if (st != STORE_OK) {
        i->ctx.stats->store_errors++;
        log_warn(exchange_conn_id(c->ex), "claim failed: %s", store_status_str(st));
        call_answer_store_failed(c, st);
        return;
    }
    if (res->acquired) {
        c->fence = res->fence;
        c->attempts = res->attempts;
        log_debug(exchange_conn_id(c->ex), "claimed key %s fence %lld", c->key_hash,
                  (long long)c->fence);
        if (c->drop_unsent) {
            release_unsent(c);
            return;
        }
        char client[96];
        call_client(c, client, sizeof(client));
        call_note_attempt(c, client, NULL);
        forward_claimed(c);
        return;
    }
    const store_row_t *row = &res->row;
    if (c->explicit_key && row->args_digest && strcmp(row->args_digest, c->args_digest) != 0) {
        call_answer(c, ANSWER_KEY_REUSED, NULL, NULL);
        return;
    }
    switch (row->state) {
    case STORE_STATE_SUCCEEDED:
        /* another process (or an earlier life of this one) recorded it: keep it for the
         * next replay, no longer than the row itself lives; its attempts include this replay */
        replay_cache_put(i->ctx.cache, c->key, row->args_digest, row->result, row->result_len,
                         row->created_at, call_row_attempts(c, row) + 1,
                         util_now_ms() + (uint64_t)row->expires_in_ms);
        replay_cache_set_first(i->ctx.cache, c->key, row->first_session_id, row->first_jsonrpc_id);
        call_answer_replay(c, row, false);
        return;
    case STORE_STATE_UNKNOWN:
        call_answer_unknown(c, row);
        return;
    case STORE_STATE_IN_PROGRESS:
        if (row->lease_expired) {
            call_answer_unknown(c, row);
            return;
        }
        if (c->rules.wait_ms > 0 && exchange_agent_waiting(c->ex)) {
            start_wait(c);
            return;
        }
        call_answer_in_progress(c, row);
        return;
    case STORE_STATE_FAILED:
        /* a released row the claim could not take over (race): run the claim again */
        claim(c);
        return;
    }
}

static bool replay_from_cache(call_t *c)
{
    const replay_entry_t *e = replay_cache_get(c->idem->ctx.cache, c->key, util_now_ms());
    if (!e) {
        c->idem->ctx.stats->cache_misses++;
        return false;
    }
    c->idem->ctx.stats->cache_hits++;
    if (c->explicit_key && strcmp(e->args_digest, c->args_digest) != 0) {
        call_answer(c, ANSWER_KEY_REUSED, NULL, NULL);
        return true;
    }
    store_row_t row = {
        .state = STORE_STATE_SUCCEEDED,
        .attempts = e->attempts - 1,
        .args_digest = e->args_digest,
        .result = e->result,
        .result_len = e->result_len,
        .result_too_large = e->result == NULL,
        .created_at = e->created_at,
        .first_session_id = e->first_session_id,
        .first_jsonrpc_id = e->first_jsonrpc_id,
    };
    call_answer_replay(c, &row, true);
    return true;
}

/* A copy of a value for a diagnostic text column. The column holds only UTF-8: a value that is
 * not (an Mcp-Session-Id with a byte like 0xff) is kept as "\x" and the hex of its bytes,
 * bytea's notation, rather than refusing a call over a value the gateway never interprets.
 * NULL stays NULL. */
static char *row_text(const char *v)
{
    if (!v)
        return NULL;
    size_t n = strlen(v);
    if (util_utf8_valid(v, n))
        return xstrdup(v);
    char *out = xmalloc(2 * n + 3);
    out[0] = '\\';
    out[1] = 'x';
    util_hex((const unsigned char *)v, n, out + 2);
    return out;
}

static void claim(call_t *c)
{
    idem_t *i = c->idem;
    if (replay_from_cache(c))
        return;
    if (!i->ctx.store && c->rules.on_store_down != ON_STORE_DOWN_PASSTHROUGH) {
        call_answer(c, ANSWER_NO_STORE, NULL, NULL); /* no store will come: retrying cannot help */
        return;
    }
    if (!i->ctx.store) {
        call_answer_store_down(c);
        return;
    }
    util_iso_utc_ms((int64_t)util_wall_ms(), c->claimed_at);
    /* stored for diagnosis only; never compared */
    char *session = row_text(call_header(c, "mcp-session-id"));
    char *rpc_id = row_text(call_msg(c)->id_text);
    store_claim_req_t req = {
        .key = c->key,
        .tool = c->store_tool,
        .subject = c->subject,
        .args_digest = c->args_digest,
        .explicit_key = c->explicit_key,
        .session_id = session,
        .jsonrpc_id = rpc_id,
        .lease_ms = c->rules.lease_ms,
        .window_ms = c->rules.window_ms,
        .takeover_lease_expired = c->rules.on_ambiguous == ON_AMBIGUOUS_RELEASE,
    };
    store_status_t st = store_claim(i->ctx.store, &req, on_claim, c);
    free(session);
    free(rpc_id);
    if (st != STORE_OK) {
        i->ctx.stats->store_errors++;
        call_answer_store_failed(c, st);
    }
}

/* The caller is known: derive the key and claim it. */
static void on_subject(void *arg, const subject_result_t *res)
{
    call_t *c = arg;
    if (!res->subject) {
        call_answer_why(c, res->refusal, res->why, NULL, res->reason);
        return;
    }
    c->subject = xstrdup(res->subject);
    const config_t *cfg = c->idem->ctx.cfg;
    const mcp_msg_t *m = call_msg(c);
    const policy_tool_t *pt = policy_lookup(&cfg->policy, m->tool);

    /* the key needs exact numbers, so the body is read again with the canonical parser */
    struct evbuffer *body_buf = exchange_request(c->ex)->body;
    const char *body = (const char *)evbuffer_pullup(body_buf, -1);
    size_t blen = evbuffer_get_length(body_buf);
    jcs_value_t *root = NULL;
    char err[160];
    jcs_status_t js = jcs_parse(body, blen, &root, err, sizeof(err));
    if (js != JCS_OK) {
        call_answer(c, ANSWER_BAD_ARGUMENTS, jcs_status_str(js), NULL);
        return;
    }
    key_call_t call = {.subject = c->subject,
                       .server = cfg->server_name,
                       .tool = m->tool,
                       .params = jcs_object_get(root, "params"),
                       .header_key = call_header(c, "idempotency-key"),
                       .pt = pt};
    key_result_t kr = {0};
    char msg[200] = "";
    key_status_t ks = key_for_call(&call, &kr, msg, sizeof(msg));
    jcs_free(root);
    if (ks != KEY_OK) {
        call_answer(c, ANSWER_BAD_KEY, key_status_str(ks), msg);
        return;
    }
    c->key = kr.key;
    kr.key = NULL;
    c->store_tool = key_scoped_tool(cfg->server_name, m->tool);
    memcpy(c->args_digest, kr.args_digest, sizeof(c->args_digest));
    memcpy(c->key_hash, kr.key_hash, sizeof(c->key_hash));
    c->explicit_key = kr.explicit_key;
    key_result_free(&kr);
    exchange_set_facts(c->ex, &(exchange_facts_t){.key_hash = c->key_hash});
    call_set_state(c, CALL_CLAIMING);
    fwd_add(c); /* a cancel may name it from now on */
    claim(c);
}

/* --- the stage --- */

void idem_call(void *arg, exchange_t *ex)
{
    idem_t *i = arg;
    const config_t *cfg = i->ctx.cfg;
    call_t *c = xcalloc(1, sizeof(*c));
    c->idem = i;
    c->ex = ex;
    c->state = CALL_RESOLVING;
    c->revision = reply_revision(ex);
    c->rules =
        policy_rules(policy_lookup(&cfg->policy, exchange_msg(ex)->tool), cfg->upstream_timeout_ms);
    exchange_add_observer(ex, &call_observer, c);
    subject_resolve(i->ctx.subject, exchange_request(ex), on_subject, c);
}

/* A GET of a session whose streams may carry a protected call's result, while its caller is
 * being resolved. */
typedef struct stream_ask {
    idem_t *idem;
    exchange_t *ex;
} stream_ask_t;

static void on_stream_subject(void *arg, const subject_result_t *res)
{
    stream_ask_t *a = arg;
    idem_t *i = a->idem;
    exchange_t *ex = a->ex;
    free(a);
    const char *session = http_headers_get(&exchange_request(ex)->headers, "mcp-session-id");
    resume_verdict_t v = resume_guard_check(i->ctx.guard, session, res->subject, util_now_ms());
    if (v == RESUME_FOREIGN) {
        const char *why =
            res->subject ? "the request comes from another caller" : "the request names no caller";
        log_warn(exchange_conn_id(ex),
                 "stream of session refused: %s than the caller of its "
                 "protected call",
                 res->subject ? "another caller" : "no caller");
        char *body = answer_resume_refused(why);
        exchange_set_outcome(ex, "refused");
        exchange_respond_json(ex, 403, body, NULL);
        free(body);
        return;
    }
    if (!exchange_agent_waiting(ex)) {
        exchange_end(ex);
        return;
    }
    pending_watch(i->pending, ex);
    exchange_forward(ex, NULL, false);
}

bool idem_stream(void *arg, exchange_t *ex)
{
    idem_t *i = arg;
    const http_headers_t *h = &exchange_request(ex)->headers;
    const char *session = http_headers_get(h, "mcp-session-id");
    /* a resume may replay a protected result; a new stream may carry a pending one */
    bool guarded =
        session && i->ctx.guard &&
        (http_headers_get(h, "last-event-id") || pending_has_session(i->pending, session)) &&
        resume_guard_knows(i->ctx.guard, session, util_now_ms());
    if (!guarded) {
        pending_watch(i->pending, ex);
        return false;
    }
    stream_ask_t *a = xcalloc(1, sizeof(*a));
    a->idem = i;
    a->ex = ex;
    subject_resolve(i->ctx.subject, exchange_request(ex), on_stream_subject, a);
    return true;
}

bool idem_session_busy(void *arg, const char *session)
{
    idem_t *i = arg;
    /* a session whose resumes this worker checks keeps them coming here */
    return pending_has_session(i->pending, session) ||
           (i->ctx.guard && resume_guard_knows(i->ctx.guard, session, util_now_ms()));
}

/* --- a caller's notifications/cancelled (cancel.h) --- */

/* A cancel while its caller is being resolved: ex is the notification's own exchange before it
 * goes upstream (idem_cancel), NULL once the upstream has taken it (idem_cancelled). */
typedef struct cancel {
    idem_t *idem;
    exchange_t *ex;
    char *session;
    json_t *request_id;
} cancel_t;

static cancel_party_t call_party(const call_t *c)
{
    return (cancel_party_t){c->subject, call_header(c, "mcp-session-id"), call_msg(c)->id};
}

static void cancel_free(cancel_t *k)
{
    free(k->session);
    json_decref(k->request_id);
    free(k);
}

/* What on_cancel makes of a cancel for each live call it names; the cancel itself goes
 * upstream unless every call it names keeps or drops it here. */
static void on_note_subject(void *arg, const subject_result_t *res)
{
    cancel_t *k = arg;
    cancel_party_t note = {res->subject, k->session, k->request_id};
    cancel_action_t verdict = CANCEL_PASS;
    for (call_t *c = k->idem->live; c; c = c->next_fwd) {
        cancel_phase_t phase;
        if (c->state == CALL_FORWARDED && !c->final_seen)
            phase = CANCEL_CALL_RUNNING;
        else if (c->state == CALL_CLAIMING || c->state == CALL_WAITING)
            phase = CANCEL_CALL_UNSENT;
        else
            continue;
        cancel_party_t call = call_party(c);
        cancel_match_t m = cancel_match(&call, &note);
        if (m == CANCEL_FOREIGN) {
            log_warn(exchange_conn_id(k->ex),
                     "a cancel names the protected call of key %.*s but comes from another "
                     "caller: not passed on",
                     KEY_HASH_LOG_LEN, c->key_hash);
            verdict = cancel_combine(verdict, CANCEL_IGNORE);
            continue;
        }
        if (m != CANCEL_MATCH)
            continue;
        cancel_action_t a = cancel_decide(c->rules.on_cancel, phase);
        if (a == CANCEL_KEEP) {
            log_info(exchange_conn_id(c->ex),
                     "key %.*s: its caller cancelled the call; on_cancel: finish, so it runs "
                     "to its end and is recorded for the retry",
                     KEY_HASH_LOG_LEN, c->key_hash);
            c->cancel_kept = true;
        } else if (a == CANCEL_DROP) {
            c->drop_unsent = true;
        }
        verdict = cancel_combine(verdict, a);
    }
    exchange_t *ex = k->ex;
    cancel_free(k);
    if (verdict == CANCEL_PASS || verdict == CANCEL_RELAY) {
        exchange_forward(ex, NULL, false);
        return;
    }
    /* a notification gets no JSON-RPC answer; the POST carrying it gets 202 */
    exchange_set_outcome(ex, verdict == CANCEL_KEEP   ? "cancel_kept"
                             : verdict == CANCEL_DROP ? "cancel_dropped"
                                                      : "cancel_ignored");
    exchange_respond_json(ex, 202, "", NULL);
}

void idem_cancel(void *arg, exchange_t *ex, const json_t *request_id)
{
    idem_t *i = arg;
    if (!i->live) {
        exchange_forward(ex, NULL, false);
        return;
    }
    cancel_t *k = xcalloc(1, sizeof(*k));
    k->idem = i;
    k->ex = ex;
    const char *session = http_headers_get(&exchange_request(ex)->headers, "mcp-session-id");
    k->session = session ? xstrdup(session) : NULL;
    k->request_id = json_deep_copy(request_id);
    subject_resolve(i->ctx.subject, exchange_request(ex), on_note_subject, k);
}

static void on_cancel_subject(void *arg, const subject_result_t *res)
{
    cancel_t *k = arg;
    cancel_party_t note = {res->subject, k->session, k->request_id};
    for (call_t *c = k->idem->live; c;) {
        call_t *next = c->next_fwd;
        cancel_party_t call = call_party(c);
        /* the upstream took the cancel: no answer will come for the call it names */
        if (c->state == CALL_FORWARDED && !c->final_seen &&
            cancel_match(&call, &note) == CANCEL_MATCH) {
            log_info(exchange_conn_id(c->ex), "key %.*s: its caller cancelled the call; ending it",
                     KEY_HASH_LOG_LEN, c->key_hash);
            c->cancelled = true;
            exchange_end_upstream(c->ex);
        }
        c = next;
    }
    cancel_free(k);
}

void idem_cancelled(void *arg, const http_request_t *note, const char *session,
                    const json_t *request_id)
{
    idem_t *i = arg;
    if (!request_id || !i->live)
        return;
    cancel_t *k = xcalloc(1, sizeof(*k));
    k->idem = i;
    k->session = session ? xstrdup(session) : NULL;
    k->request_id = json_deep_copy(request_id);
    subject_resolve(i->ctx.subject, note, on_cancel_subject, k);
}

idem_t *idem_new(const idem_ctx_t *ctx)
{
    idem_t *i = xcalloc(1, sizeof(*i));
    i->ctx = *ctx;
    i->tasks = ctx->tasks;
    i->recent = dup_recent_new(DUP_RECENT_SLOTS);
    i->recorder = (recorder_ctx_t){
        .store = ctx->store,
        .cache = ctx->cache,
        .tasks = i->tasks,
        .stats = ctx->stats,
    };
    pending_ctx_t pc = {
        .store = ctx->store,
        .recorder = &i->recorder,
        .stats = ctx->stats,
        .session_idle = ctx->session_idle,
        .arg = ctx->arg,
    };
    i->pending = pending_new(&pc);
    return i;
}

void idem_free(idem_t *i)
{
    if (!i)
        return;
    pending_free(i->pending);
    dup_recent_free(i->recent);
    free(i);
}

void idem_reconfigure(idem_t *i, const config_t *cfg)
{
    i->ctx.cfg = cfg;
}

/* --- the router's handlers (handler.h) --- */

handler_verdict_t idem_offer_call(void *arg, exchange_t *ex)
{
    idem_t *i = arg;
    const mcp_msg_t *m = exchange_msg(ex);
    if (!m || m->kind != MCP_KIND_REQUEST || !m->tool)
        return HANDLER_PASS;
    if (exchange_tool_class(ex) != TOOL_CLASS_NON_IDEMPOTENT)
        return HANDLER_PASS;
    i->ctx.stats->protected_calls++;
    idem_call(arg, ex);
    return HANDLER_TAKEN;
}

handler_verdict_t idem_offer_cancel(void *arg, exchange_t *ex)
{
    const json_t *id = exchange_cancel_id(ex);
    if (!id)
        return HANDLER_PASS;
    idem_cancel(arg, ex, id);
    return HANDLER_TAKEN;
}

handler_verdict_t idem_offer_stream(void *arg, exchange_t *ex)
{
    if (exchange_request(ex)->method != HTTP_GET)
        return HANDLER_PASS;
    return idem_stream(arg, ex) ? HANDLER_TAKEN : HANDLER_PASS;
}
