#include "idem.h"
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
/* Where 2026-07-28 requests name their client (params._meta). */
#define CLIENT_INFO_META "io.modelcontextprotocol/clientInfo"

/* Wait mode polls the store: replicas share nothing else. */
#define WAIT_POLL_FIRST_MS 25
#define WAIT_POLL_MAX_MS 250

/* Stored as the result of an unknown row whose call its caller cancelled: another process
 * answering a duplicate can then say so. Unknown rows carry no result otherwise. */
static const char CANCEL_NOTE[] = "{\"idemgw/cancelled\":true}";

/* A protected call's life:
 *
 *   RESOLVING --> CLAIMING <--> WAITING
 *       |            |  ^          |
 *       |            |  +- (again) |
 *       |            +--> FORWARDED --> RECORDING --> DONE
 *       |            +--> RECORDING (cancelled before it was sent: the claim released)
 *       |            +--> PASSTHROUGH (store down, the policy says forward unprotected)
 *       +------------+-------------+--> DONE (answered: replay, refusal, in progress ...)
 *
 * The call belongs to its exchange: the proxy frees it (detach) when the exchange ends, which
 * cannot happen while a store call or a timer of the call is out (the exchange is CLAIMING or
 * RECORDING then). */
typedef enum {
    CALL_RESOLVING = 0, /* finding out who calls */
    CALL_CLAIMING,      /* claim sent */
    CALL_WAITING,       /* duplicate in wait mode, polling the row */
    CALL_FORWARDED,     /* ours: the upstream runs it */
    CALL_PASSTHROUGH,   /* forwarded without protection */
    CALL_RECORDING,     /* outcome being written */
    CALL_DONE,          /* nothing more to do */
    CALL_N_STATES
} call_state_t;

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

struct idem {
    idem_ctx_t ctx;
    pending_reg_t *pending;
    recorder_ctx_t recorder; /* finishes keys, for the POST's answers and the GET streams' */
    struct call *live;       /* calls claiming their key or run by the upstream: for cancels */
    task_routes_t *tasks;    /* tasks stored or replayed here: their sessions (main's) */
    dup_recent_t *recent;    /* each key's recent attempts, for the duplicate-source rules */
};

typedef struct call {
    idem_t *idem;
    exchange_t *ex;
    call_state_t state;
    policy_rules_t rules; /* the tool's policy, copied: a reload may free the config */
    char *subject;
    char *store_tool; /* the tool as the store names it (key_scoped_tool) */
    char *key;
    char key_hash[65];
    char args_digest[65];
    bool explicit_key;
    int64_t fence;
    int attempts;                   /* the row's attempts when this call claimed it */
    char claimed_at[32];            /* wall clock at the claim, ISO 8601, for the cache's marker */
    store_status_t deferred_status; /* a finish that failed before it was sent */
    store_state_t recorded;         /* the outcome being written */
    outcome_why_t why;              /* why that outcome */
    int status;                     /* the upstream's HTTP status */
    bool cut; /* the upstream's answer began and did not end whole (closed, or gone silent) */
    /* capture of the final response */
    bool capture_json, capture_sse;
    struct evbuffer *json_body;
    sse_parser_t sse;
    bool final_seen;
    bool hold_next; /* the SSE event just read ends the answer: hold from here on */
    mcp_resp_class_t cls;
    char *result;
    size_t result_len;
    bool too_large;
    bool foreign;       /* the final response carried another request's id */
    decoder_t *decoder; /* the upstream compressed the answer: decoded for capture only */
    bool undecodable;   /* the answer's coding could not be read: stored as not replayable */
    bool cancelled;     /* its caller's notifications/cancelled reached the upstream */
    bool cancel_kept;   /* its caller cancelled it; on_cancel: finish kept that here */
    bool drop_unsent;   /* its caller cancelled it before it was sent; on_cancel: forward */
    struct call *prev_fwd, *next_fwd; /* in the list of live calls */
    bool in_fwd;
    struct event *lease_timer; /* renews the claim while the upstream call runs */
    struct event *early_timer; /* answer_after: answers the agent still_running */
    bool answered_early;       /* it did */
    char dup_fields[256];      /* a duplicate: its source and facts, for the log line */
    struct event *timer;       /* wait mode */
    uint64_t wait_deadline_ms;
    uint64_t poll_ms;
    revision_t revision; /* the caller's protocol era: what the answers written here look like */
} call_t;

static void set_state(call_t *c, call_state_t to)
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

static const mcp_msg_t *msg_of(const call_t *c)
{
    return exchange_msg(c->ex);
}

static const char *header_of(const call_t *c, const char *name)
{
    return http_headers_get(&exchange_request(c->ex)->headers, name);
}

/* Every answer this stage writes itself passes here (or through reply.h) on its way out: it
 * fits the caller's era. */
static char *fit(const call_t *c, char *body)
{
    return revision_fit(body, c->revision);
}

/* The session's streams may carry this call's result: only its caller may resume them while
 * the call can run and its result is remembered (resume_guard.h). */
static void note_stream_caller(call_t *c)
{
    const char *session = header_of(c, "mcp-session-id");
    uint64_t now = util_now_ms();
    if (!session || !c->subject || !c->idem->ctx.guard)
        return;
    resume_guard_note(c->idem->ctx.guard, session, c->subject, now,
                      now + c->rules.lease_ms + c->rules.window_ms);
    /* with several workers, the session's resumes are handed here, where the note is */
    handoff_note_stream(session, true);
}

/* --- the list of live calls: claiming, waiting or forwarded, for cancels --- */

static void fwd_remove(call_t *c)
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

static void call_detach(void *arg)
{
    call_t *c = arg;
    if (c->state == CALL_FORWARDED || c->state == CALL_RECORDING)
        c->idem->ctx.stats->protected_in_flight--;
    fwd_remove(c);
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
        .log_extra = c->dup_fields,
    };
}

/* The call ends here with an answer of the gateway's own. Last use of c.
 * why (may be NULL): a short reason the log line carries with the code ("expired"). */
static void answer_why(call_t *c, answer_t a, const char *detail, const char *detail2,
                       const char *why)
{
    reply_t r = reply_of(c);
    set_state(c, CALL_DONE);
    reply_answer(&r, a, detail, detail2, why);
}

static void answer(call_t *c, answer_t a, const char *detail, const char *detail2)
{
    answer_why(c, a, detail, detail2, NULL);
}

/* A key the gateway advertised in tools/list (advertise_key) is the gateway's, not the
 * server's: it leaves the arguments before they go up, unless the server's own schema has it. */
static void strip_advertised_key(call_t *c)
{
    const idem_t *i = c->idem;
    const mcp_msg_t *m = msg_of(c);
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
static void key_header(call_t *c, char *extra, size_t size)
{
    exchange_drop_request_header(c->ex, "idempotency-key");
    size_t used = strlen(extra);
    if (c->rules.forward_key)
        snprintf(extra + used, size - used, "Idempotency-Key: %s\r\n", c->key_hash);
}

static void answer_store_down(call_t *c)
{
    if (c->rules.on_store_down == ON_STORE_DOWN_PASSTHROUGH) {
        c->idem->ctx.stats->passthrough++;
        log_warn(exchange_conn_id(c->ex), "store unavailable: forwarding %s without protection",
                 msg_of(c)->tool);
        exchange_set_outcome(c->ex, "passthrough");
        set_state(c, CALL_PASSTHROUGH);
        note_stream_caller(c);
        char extra[100] = "";
        key_header(c, extra, sizeof(extra));
        strip_advertised_key(c);
        /* unprotected, yet a call of a non_idempotent tool: never sent a second time after a
         * kept-alive connection closed under it */
        exchange_forward(c->ex, *extra ? extra : NULL, true);
        return;
    }
    answer(c, ANSWER_STORE_DOWN, NULL, NULL);
}

/* A store call failed. Only a store that does not answer is "down" (reply.h): passing a call
 * through over a statement the store rejected would run every repeat of it unprotected. */
static void answer_store_failed(call_t *c, store_status_t st)
{
    if (st == STORE_ERR_UNAVAILABLE) {
        answer_store_down(c);
        return;
    }
    reply_t r = reply_of(c);
    set_state(c, CALL_DONE);
    reply_store_failed(&r, st, msg_of(c)->tool);
}

static int row_attempts(const call_t *c, const store_row_t *row);

/* A duplicate of row's call, answered as it says: which layer most likely retried, counted,
 * kept for the log, and recorded on the key's row (its counts and history; a replay also
 * counts in attempts). The record rides on the next batched write, never a store call of its
 * own; one that is lost loses nothing else. */
/* The clientInfo a 2026-07-28 request carries in params._meta, as "name/version"; "" if none. */
static void client_of(const call_t *c, char *out, size_t len)
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
static void note_attempt(call_t *c, const char *client, dup_recent_seen_t *before)
{
    dup_recent_note(c->idem->recent, c->key_hash, util_now_ms(), c->idem->ctx.cfg->dup_model_ms,
                    client && *client ? client : NULL, before);
}

static void judge_duplicate(call_t *c, const store_row_t *row, int attempt,
                            store_dup_answer_t answered)
{
    const config_t *cfg = c->idem->ctx.cfg;
    uint64_t first = dup_parse_time_ms(row->created_at), now = util_wall_ms();
    char client[96];
    client_of(c, client, sizeof(client));
    dup_recent_seen_t seen;
    note_attempt(c, client, &seen);
    uint64_t mono = util_now_ms();
    dup_facts_t f = {
        .first_session = row->first_session_id,
        .session = header_of(c, "mcp-session-id"),
        .first_id = row->first_jsonrpc_id,
        .id = msg_of(c)->id_text,
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
    const char *tool = msg_of(c)->tool;
    catalog_t *cat = c->idem->ctx.catalog;
    stats_tool(c->idem->ctx.stats, cfg->server_name, tool, cat && catalog_known(cat, tool))
        ->duplicates[src]++;
    snprintf(c->dup_fields, sizeof(c->dup_fields),
             ",\"duplicate_source\":\"%s\",\"attempt\":%d,\"first_seen\":\"%.40s\",\"gap_ms\":%llu"
             ",\"first_state\":\"%s\"",
             dup_source_name(src), attempt, row->created_at ? row->created_at : "",
             (unsigned long long)f.gap_ms, store_state_str(row->state));
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

static void answer_unknown(call_t *c, const store_row_t *row)
{
    if (row)
        judge_duplicate(c, row, row_attempts(c, row) + 1, STORE_DUP_UNKNOWN);
    bool cancelled = row && row->state == STORE_STATE_UNKNOWN && row->result &&
                     row->result_len == sizeof(CANCEL_NOTE) - 1 &&
                     memcmp(row->result, CANCEL_NOTE, row->result_len) == 0;
    answer(c, cancelled ? ANSWER_CANCELLED : ANSWER_UNKNOWN, row ? row->created_at : NULL, NULL);
}

static void answer_in_progress(call_t *c, const store_row_t *row)
{
    if (row)
        judge_duplicate(c, row, row_attempts(c, row) + 1, STORE_DUP_IN_PROGRESS);
    answer(c, ANSWER_IN_PROGRESS, row ? row->created_at : NULL, NULL);
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
static int row_attempts(const call_t *c, const store_row_t *row)
{
    store_t *store = c->idem->ctx.store;
    return row->attempts + (store ? store_pending_duplicates(store, c->key) : 0);
}

static void answer_replay(call_t *c, const store_row_t *row, bool from_cache)
{
    idem_t *i = c->idem;
    int attempts = (from_cache ? row->attempts : row_attempts(c, row)) + 1;
    char marker[400];
    snprintf(marker, sizeof(marker),
             "{\"replayed\":true,\"first_seen\":\"%s\",\"attempts\":%d,\"key_hash\":\"%s\"}",
             row->created_at ? row->created_at : "", attempts, c->key_hash);
    char *body = reply_replay_body(msg_of(c)->id_text, row, marker);
    if (!body) {
        answer(c, ANSWER_REPLAY_FAILED, NULL, NULL);
        return;
    }
    /* recorded for --show and the report, from the cache too */
    judge_duplicate(c, row, attempts, STORE_DUP_REPLAY);
    char fields[300];
    snprintf(fields, sizeof(fields), "\"key_hash\":\"%.*s\"%s", KEY_HASH_LOG_LEN, c->key_hash,
             c->dup_fields);
    exchange_set_log_fields(c->ex, fields);
    i->ctx.stats->replays++;
    if (from_cache)
        i->ctx.stats->cache_replays++;
    if (!from_cache && row->result && row->expires_in_ms > 0)
        task_routes_note(i->tasks, row->result, row->result_len, c->subject, row->first_session_id,
                         util_now_ms() + (uint64_t)row->expires_in_ms);
    exchange_set_outcome(c->ex, "replay");
    reply_t r = reply_of(c);
    set_state(c, CALL_DONE);
    reply_send(&r, body, "Idempotent-Replayed: true\r\n");
}

/* --- claim --- */

static void claim(call_t *c);

/* The agent left while a store call ran: the call ends without an answer. */
static bool agent_left(call_t *c)
{
    if (exchange_agent_waiting(c->ex))
        return false;
    set_state(c, CALL_DONE);
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
        answer_in_progress(c, NULL);
        return;
    }
    if (!row || row->state == STORE_STATE_FAILED) {
        /* the first attempt was released (or expired): this one may run */
        set_state(c, CALL_CLAIMING);
        claim(c);
        return;
    }
    if (row->state == STORE_STATE_SUCCEEDED) {
        answer_replay(c, row, false);
        return;
    }
    if (row->state == STORE_STATE_UNKNOWN ||
        (row->lease_expired && c->rules.on_ambiguous == ON_AMBIGUOUS_HOLD)) {
        answer_unknown(c, row);
        return;
    }
    if (row->lease_expired) {
        set_state(c, CALL_CLAIMING);
        claim(c);
        return;
    }
    if (util_now_ms() >= c->wait_deadline_ms) {
        answer_in_progress(c, row);
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
        answer_in_progress(c, NULL);
}

static void start_wait(call_t *c)
{
    log_debug(exchange_conn_id(c->ex), "key %.*s: an identical call runs; waiting for its outcome",
              KEY_HASH_LOG_LEN, c->key_hash);
    set_state(c, CALL_WAITING);
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
    char hint[300], fields[128];
    char *body = answer_body(
        ANSWER_STILL_RUNNING, msg_of(c)->id_text, c->key_hash, c->claimed_at, NULL,
        reply_status_hint(c->idem->ctx.cfg->status_tool, ANSWER_STILL_RUNNING, hint, sizeof(hint)));
    snprintf(fields, sizeof(fields), "\"key_hash\":\"%.*s\",\"answered\":\"still_running\"",
             KEY_HASH_LOG_LEN, c->key_hash);
    exchange_set_log_fields(c->ex, fields);
    c->idem->ctx.stats->in_progress++;
    c->answered_early = true;
    body = fit(c, body);
    exchange_answer_early(c->ex, body);
    free(body);
}

static void forward_claimed(call_t *c)
{
    set_state(c, CALL_FORWARDED);
    fwd_add(c);
    note_stream_caller(c);
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
    key_header(c, extra, sizeof(extra));
    strip_advertised_key(c);
    exchange_forward(c->ex, extra, true);
}

/* A call its caller cancelled before it went up (on_cancel: forward) ends here. The caller
 * expects no answer; one still connected gets an error saying nothing ran, which ends its
 * request. */
static void answer_dropped(call_t *c)
{
    set_state(c, CALL_DONE);
    exchange_set_outcome(c->ex, outcome_name(WHY_DROPPED));
    if (!exchange_agent_waiting(c->ex)) {
        exchange_end(c->ex);
        return;
    }
    char *body = mcp_error_body(msg_of(c)->id_text, -32800,
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
    set_state(c, CALL_RECORDING);
    fwd_remove(c);
    c->recorded = STORE_STATE_FAILED;
    c->why = WHY_DROPPED;
    exchange_set_outcome(c->ex, outcome_name(c->why));
    char fields[200];
    snprintf(fields, sizeof(fields), "\"key_hash\":\"%.*s\",\"recorded\":\"%s\",\"why\":\"%s\"",
             KEY_HASH_LOG_LEN, c->key_hash, store_state_str(c->recorded), outcome_why_str(c->why));
    exchange_set_log_fields(c->ex, fields);
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
        answer_store_failed(c, st);
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
        client_of(c, client, sizeof(client));
        note_attempt(c, client, NULL);
        forward_claimed(c);
        return;
    }
    const store_row_t *row = &res->row;
    if (c->explicit_key && row->args_digest && strcmp(row->args_digest, c->args_digest) != 0) {
        answer(c, ANSWER_KEY_REUSED, NULL, NULL);
        return;
    }
    switch (row->state) {
    case STORE_STATE_SUCCEEDED:
        /* another process (or an earlier life of this one) recorded it: keep it for the
         * next replay, no longer than the row itself lives; its attempts include this replay */
        replay_cache_put(i->ctx.cache, c->key, row->args_digest, row->result, row->result_len,
                         row->created_at, row_attempts(c, row) + 1,
                         util_now_ms() + (uint64_t)row->expires_in_ms);
        replay_cache_set_first(i->ctx.cache, c->key, row->first_session_id, row->first_jsonrpc_id);
        answer_replay(c, row, false);
        return;
    case STORE_STATE_UNKNOWN:
        answer_unknown(c, row);
        return;
    case STORE_STATE_IN_PROGRESS:
        if (row->lease_expired) {
            answer_unknown(c, row);
            return;
        }
        if (c->rules.wait_ms > 0 && exchange_agent_waiting(c->ex)) {
            start_wait(c);
            return;
        }
        answer_in_progress(c, row);
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
        answer(c, ANSWER_KEY_REUSED, NULL, NULL);
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
    answer_replay(c, &row, true);
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
        answer(c, ANSWER_NO_STORE, NULL, NULL); /* no store will come: retrying cannot help */
        return;
    }
    if (!i->ctx.store) {
        answer_store_down(c);
        return;
    }
    util_iso_utc_ms((int64_t)util_wall_ms(), c->claimed_at);
    /* stored for diagnosis only; never compared */
    char *session = row_text(header_of(c, "mcp-session-id"));
    char *rpc_id = row_text(msg_of(c)->id_text);
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
        answer_store_failed(c, st);
    }
}

/* The caller is known: derive the key and claim it. */
static void on_subject(void *arg, const subject_result_t *res)
{
    call_t *c = arg;
    if (!res->subject) {
        answer_why(c, res->refusal, res->why, NULL, res->reason);
        return;
    }
    c->subject = xstrdup(res->subject);
    const config_t *cfg = c->idem->ctx.cfg;
    const mcp_msg_t *m = msg_of(c);
    const policy_tool_t *pt = policy_lookup(&cfg->policy, m->tool);

    /* the key needs exact numbers, so the body is read again with the canonical parser */
    struct evbuffer *body_buf = exchange_request(c->ex)->body;
    const char *body = (const char *)evbuffer_pullup(body_buf, -1);
    size_t blen = evbuffer_get_length(body_buf);
    jcs_value_t *root = NULL;
    char err[160];
    jcs_status_t js = jcs_parse(body, blen, &root, err, sizeof(err));
    if (js != JCS_OK) {
        answer(c, ANSWER_BAD_ARGUMENTS, jcs_status_str(js), NULL);
        return;
    }
    key_call_t call = {.subject = c->subject,
                       .server = cfg->server_name,
                       .tool = m->tool,
                       .params = jcs_object_get(root, "params"),
                       .header_key = header_of(c, "idempotency-key"),
                       .pt = pt};
    key_result_t kr = {0};
    char msg[200] = "";
    key_status_t ks = key_for_call(&call, &kr, msg, sizeof(msg));
    jcs_free(root);
    if (ks != KEY_OK) {
        answer(c, ANSWER_BAD_KEY, key_status_str(ks), msg);
        return;
    }
    c->key = kr.key;
    kr.key = NULL;
    c->store_tool = key_scoped_tool(cfg->server_name, m->tool);
    memcpy(c->args_digest, kr.args_digest, sizeof(c->args_digest));
    memcpy(c->key_hash, kr.key_hash, sizeof(c->key_hash));
    c->explicit_key = kr.explicit_key;
    key_result_free(&kr);
    char fields[64];
    snprintf(fields, sizeof(fields), "\"key_hash\":\"%.*s\"", KEY_HASH_LOG_LEN, c->key_hash);
    exchange_set_log_fields(c->ex, fields);
    set_state(c, CALL_CLAIMING);
    fwd_add(c); /* a cancel may name it from now on */
    claim(c);
}

/* --- capturing the outcome --- */

static int on_sse_event(const sse_event_t *ev, void *arg)
{
    call_t *c = arg;
    if (c->final_seen || ev->data_len == 0)
        return 0;
    size_t off = 0, len = 0;
    mcp_resp_class_t cls = mcp_classify_response(ev->data, ev->data_len, msg_of(c)->id, &off, &len);
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

static void on_finished(store_status_t st, bool fence_matched, uint64_t window_ms, void *arg)
{
    call_t *c = arg;
    (void)window_ms;
    idem_t *i = c->idem;
    uint64_t conn_id = exchange_conn_id(c->ex);
    if (st != STORE_OK) {
        log_error(conn_id, "could not record the outcome of key %.*s: %s", KEY_HASH_LOG_LEN,
                  c->key_hash, store_status_str(st));
    } else if (!fence_matched) {
        log_warn(conn_id, "outcome of key %.*s not recorded: the claim was taken over",
                 KEY_HASH_LOG_LEN, c->key_hash);
    } else {
        /* logged once the store has it: a retry sent after this line sees the outcome */
        log_info(conn_id, "key %.*s recorded as %s (%s)", KEY_HASH_LOG_LEN, c->key_hash,
                 store_state_str(c->recorded), outcome_why_str(c->why));
    }
    set_state(c, CALL_DONE);
    if (c->foreign) {
        /* the upstream answered with another request's response: never the caller's */
        i->ctx.stats->unknown++;
        char *body = answer_body(ANSWER_FOREIGN, msg_of(c)->id_text, c->key_hash, NULL, NULL, NULL);
        exchange_set_outcome(c->ex, answer_outcome(ANSWER_FOREIGN));
        body = fit(c, body);
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
            ANSWER_CUT, msg_of(c)->id_text, c->key_hash,
            held ? "Do NOT retry it: identical calls will not be executed until the idempotency "
                   "window ends."
                 : "Repeating it will execute it again.",
            NULL, reply_status_hint(i->ctx.cfg->status_tool, ANSWER_CUT, hint, sizeof(hint)));
        body = fit(c, body);
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

/* Writes the outcome; the agent's answer waits for it, so a retry right after sees it. */
static observe_t record(call_t *c, store_state_t state, outcome_why_t why)
{
    idem_t *i = c->idem;
    set_state(c, CALL_RECORDING);
    note_stream_caller(c);
    exchange_set_outcome(c->ex, outcome_name(why));
    if (outcome_executed(why))
        i->ctx.stats->executions++;
    char fields[200];
    snprintf(fields, sizeof(fields), "\"key_hash\":\"%.*s\",\"recorded\":\"%s\",\"why\":\"%s\"%s%s",
             KEY_HASH_LOG_LEN, c->key_hash, store_state_str(state), outcome_why_str(why),
             c->answered_early ? ",\"answered\":\"still_running\"" : "",
             c->cancel_kept ? ",\"cancel\":\"kept\"" : "");
    exchange_set_log_fields(c->ex, fields);
    c->why = why;
    c->recorded = state;
    /* a caller that timed out never read the answer: its retry is no model's */
    if (!c->answered_early && (c->cancel_kept || !exchange_agent_waiting(c->ex)))
        dup_recent_unread(i->recent, c->key_hash);
    const char *result = state == STORE_STATE_SUCCEEDED ? c->result : NULL;
    size_t result_len = state == STORE_STATE_SUCCEEDED ? c->result_len : 0;
    if (state == STORE_STATE_UNKNOWN && c->cancelled) {
        result = CANCEL_NOTE;
        result_len = sizeof(CANCEL_NOTE) - 1;
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
        .session = header_of(c, "mcp-session-id"),
        .jsonrpc_id = msg_of(c)->id_text,
    };
    store_status_t st =
        recorder_finish(&i->recorder, &rc, state, result, result_len, c->too_large, on_finished, c);
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
    mcp_resp_class_t cls = mcp_classify_response(text ? text : "", len, msg_of(c)->id, &off, &rlen);
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
    fwd_remove(c);
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
    const char *session = header_of(c, "mcp-session-id");
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
            .jsonrpc_id = msg_of(c)->id_text,
        };
        pending_add(c->idem->pending, &rc, msg_of(c)->id, &c->rules);
        note_stream_caller(c);
    }
    if (c->capture_sse && session && res == UPSTREAM_OK) {
        /* the server ended the stream early (SSE polling): the agent resumes it with GET and
         * the final response finishes the key there; until then the claim stays in progress */
        set_state(c, CALL_DONE);
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

static const response_observer_t call_ops = {
    .on_head = call_head,
    .on_body = call_body,
    .on_end = call_end,
    .answer_seen = call_answer_seen,
    .detach = call_detach,
};

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
    exchange_add_observer(ex, &call_ops, c);
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
    return (cancel_party_t){c->subject, header_of(c, "mcp-session-id"), msg_of(c)->id};
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
