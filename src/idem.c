#include "idem.h"
#include "handoff.h"
#include "config.h"
#include "decode.h"
#include "jcs.h"
#include "key.h"
#include "log.h"
#include "policy.h"
#include "proxy.h"
#include "replay_cache.h"
#include "server.h"
#include "store.h"
#include "util.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* Wait mode polls the store: replicas share nothing else. */
#define WAIT_POLL_FIRST_MS 25
#define WAIT_POLL_MAX_MS 250

/* Most decoded bytes one read of a compressed SSE answer may expand to. */
#define SSE_DECODED_PER_READ (16 * 1024 * 1024)

/* Stored as the result of an unknown row whose call its caller cancelled: another process
 * answering a duplicate can then say so. Unknown rows carry no result otherwise. */
static const char CANCEL_NOTE[] = "{\"idemgw/cancelled\":true}";

typedef enum {
    CALL_CLAIMING = 0, /* claim sent */
    CALL_WAITING,      /* duplicate in wait mode, polling the row */
    CALL_FORWARDED,    /* ours: the upstream runs it */
    CALL_FINISHING,    /* outcome being written */
    CALL_DONE,         /* nothing more to do */
    CALL_WATCH,        /* a GET stream that may carry final responses of pending calls */
} call_state_t;

typedef struct idem_call {
    exchange_t *ex;
    call_state_t state;
    char *key;
    char key_hash[65];
    char args_digest[65];
    bool explicit_key;
    /* the tool's policy, copied: a reload may free the config while we run */
    uint64_t window_ms, lease_ms, wait_ms, max_stored;
    on_tool_error_t on_tool_error;
    on_ambiguous_t on_ambiguous;
    on_store_down_t on_store_down;
    bool forward_key;
    int64_t fence;
    char claimed_at[32];            /* wall clock at the claim, ISO 8601, for the cache's marker */
    bool store_pending;             /* a store call is out */
    store_status_t deferred_status; /* a finish that failed before it was sent */
    store_state_t recorded;         /* the outcome being written */
    const char *why;                /* why that outcome, for the log */
    char log_extra[160];            /* key fields on the exchange's request log line */
    /* capture of the final response */
    bool capture_json, capture_sse;
    struct evbuffer *json_body;
    sse_parser_t sse;
    bool final_seen;
    mcp_resp_class_t cls;
    char *result;
    size_t result_len;
    bool too_large;
    bool foreign;       /* the final response carried another request's id */
    decoder_t *decoder; /* the upstream compressed the answer: decoded for capture only */
    bool undecodable;   /* the answer's coding could not be read: stored as not replayable */
    char *session_id;   /* CALL_WATCH: the stream's session */
    char *subject;      /* the caller, to match a cancel to its call */
    bool cancelled;     /* its caller's notifications/cancelled reached the upstream */
    struct idem_call *prev_fwd, *next_fwd; /* CALL_FORWARDED: in the registry's list */
    bool in_fwd;
    struct event *lease_timer; /* renews the claim while the upstream call runs */
    /* wait mode */
    struct event *timer;
    uint64_t wait_deadline_ms;
    uint64_t poll_ms;
} idem_call_t;

/* A protected call whose POST stream ended without its final response: the response may
 * still arrive on a GET stream the agent resumes with Last-Event-ID, and must finish the key. */
typedef struct pending {
    char *session_id;
    json_t *id; /* the JSON-RPC id the final response will carry */
    char *key;
    char key_hash[65];
    int64_t fence;
    uint64_t window_ms;
    on_tool_error_t on_tool_error;
    uint64_t until_ms; /* forget it after this (the lease decides the row's fate) */
    struct pending *next;
} pending_t;

typedef struct idem_registry {
    pending_t *head;
    idem_call_t *forwarded; /* calls the upstream runs now, for cancels */
} idem_registry_t;

static void fwd_remove(idem_call_t *c)
{
    if (!c->in_fwd)
        return;
    if (c->prev_fwd)
        c->prev_fwd->next_fwd = c->next_fwd;
    else
        server->idem->forwarded = c->next_fwd;
    if (c->next_fwd)
        c->next_fwd->prev_fwd = c->prev_fwd;
    c->in_fwd = false;
}

static void fwd_add(idem_call_t *c)
{
    c->prev_fwd = NULL;
    c->next_fwd = server->idem->forwarded;
    if (c->next_fwd)
        c->next_fwd->prev_fwd = c;
    server->idem->forwarded = c;
    c->in_fwd = true;
}

idem_registry_t *idem_registry_new(void)
{
    return xcalloc(1, sizeof(idem_registry_t));
}

static void pending_free(pending_t *p)
{
    free(p->session_id);
    json_decref(p->id);
    free(p->key);
    free(p);
}

void idem_registry_free(idem_registry_t *r)
{
    if (!r)
        return;
    while (r->head) {
        pending_t *p = r->head;
        r->head = p->next;
        pending_free(p);
    }
    free(r);
}

/* Drops expired entries; true when one for session remains. */
static bool registry_has_session(idem_registry_t *r, const char *session)
{
    uint64_t now = util_now_ms();
    bool found = false;
    for (pending_t **pp = &r->head; *pp;) {
        pending_t *p = *pp;
        if (p->until_ms <= now) {
            *pp = p->next;
            pending_free(p);
            continue;
        }
        if (session && strcmp(p->session_id, session) == 0)
            found = true;
        pp = &p->next;
    }
    return found;
}

bool idem_has_pending(const char *session)
{
    return registry_has_session(server->idem, session);
}

bool idem_answer_foreign(const exchange_t *ex)
{
    return ex->call && ex->call->foreign;
}

bool idem_busy(const exchange_t *ex)
{
    const idem_call_t *c = ex->call;
    return c && (c->store_pending || c->state == CALL_WAITING);
}

bool idem_answered(const exchange_t *ex)
{
    const idem_call_t *c = ex->call;
    return c && c->state != CALL_WATCH && c->final_seen && !ex->holding;
}

void idem_call_free(idem_call_t *c)
{
    if (!c)
        return;
    fwd_remove(c);
    free(c->key);
    free(c->session_id);
    free(c->subject);
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
    free(c);
}

/* --- answers the gateway writes --- */

static const char *id_text(exchange_t *ex)
{
    return ex->msg.id_text;
}

static void answer_status(exchange_t *ex, const char *code, const char *executed, const char *text,
                          const char *outcome)
{
    idem_call_t *c = ex->call;
    char status[300];
    snprintf(status, sizeof(status), "{\"code\":\"%s\",\"executed\":%s%s%s%s}", code, executed,
             c && c->key ? ",\"key_hash\":\"" : "", c && c->key ? c->key_hash : "",
             c && c->key ? "\"" : "");
    char *body = mcp_tool_error_body(id_text(ex), text, status);
    ex->outcome = outcome;
    if (c)
        c->state = CALL_DONE;
    proxy_respond_json(ex, 200, body, NULL);
    free(body);
}

static void answer_tool_error(exchange_t *ex, const char *code, const char *text,
                              const char *outcome)
{
    answer_status(ex, code, "false", text, outcome);
}

static void refuse(exchange_t *ex, const char *code, const char *text)
{
    server->stats->refused++;
    answer_tool_error(ex, code, text, "refused");
}

static void refuse_key_reused(exchange_t *ex)
{
    refuse(ex, "key_reused",
           "Refused: this idempotency key was already used for a call with different "
           "arguments. Nothing was executed. Use a new key for a different call, or repeat "
           "the original arguments to get the original result.");
}

static void answer_store_down(exchange_t *ex)
{
    idem_call_t *c = ex->call;
    if (c->on_store_down == ON_STORE_DOWN_PASSTHROUGH) {
        server->stats->passthrough++;
        log_warn(ex->conn_id, "store unavailable: forwarding %s without protection", ex->msg.tool);
        ex->outcome = "passthrough";
        c->state = CALL_DONE;
        proxy_forward(ex, NULL);
        return;
    }
    refuse(ex, "store_unavailable",
           "Not executed: the gateway's idempotency store is unavailable, so this call could not "
           "be protected against running twice. Nothing was executed. It is safe to retry the "
           "same call later.");
}

/* A store call failed. Only a store that does not answer (no connection, or past its
 * deadline) is "down"; a statement Postgres rejected says nothing about its availability, and
 * passing the call through would run every repeat of it unprotected. */
static void answer_store_failed(exchange_t *ex, store_status_t st)
{
    if (st == STORE_ERR_UNAVAILABLE) {
        answer_store_down(ex);
        return;
    }
    if (st == STORE_ERR_SHUTDOWN) {
        refuse(ex, "store_unavailable",
               "Not executed: the gateway is shutting down, so this call could not be protected "
               "against running twice. Nothing was executed. It is safe to retry the same call.");
        return;
    }
    log_error(ex->conn_id, "store refused the call to %s (key %.16s): %s; not forwarded",
              ex->msg.tool, ex->call->key_hash, store_status_str(st));
    refuse(ex, "store_error",
           "Not executed: the gateway's idempotency store rejected this call, so it could not be "
           "protected against running twice. Nothing was executed. Repeating the same call will "
           "fail the same way; the gateway's operator has the error in the gateway's log.");
}

static void answer_in_progress(exchange_t *ex, const store_row_t *row)
{
    server->stats->in_progress++;
    char text[700];
    snprintf(text, sizeof(text),
             "This tool call is already running: an identical call (same tool, same arguments, "
             "same caller) started at %s and has not finished yet. It was NOT executed again. "
             "Do not retry it right now. Wait for the first call to finish, then call again with "
             "exactly the same arguments to receive its result.",
             row && row->created_at ? row->created_at : "an earlier time");
    answer_tool_error(ex, "in_progress", text, "in_progress");
}

static void answer_cancelled(exchange_t *ex, const store_row_t *row)
{
    char text[700];
    snprintf(text, sizeof(text),
             "An identical earlier call (started at %s) was cancelled by its caller while it "
             "ran. It may have executed before it was stopped; its outcome is unknown. It was NOT "
             "executed again, and identical calls will not be executed until the idempotency "
             "window ends. Check whether the earlier call took effect (for example with a read or "
             "status tool) before doing anything else.",
             row && row->created_at ? row->created_at : "an earlier time");
    answer_status(ex, "cancelled", "\"unknown\"", text, "unknown");
}

static void answer_unknown(exchange_t *ex, const store_row_t *row)
{
    server->stats->unknown++;
    if (row && row->state == STORE_STATE_UNKNOWN && row->result &&
        row->result_len == sizeof(CANCEL_NOTE) - 1 &&
        memcmp(row->result, CANCEL_NOTE, row->result_len) == 0) {
        answer_cancelled(ex, row);
        return;
    }
    char text[800];
    snprintf(text, sizeof(text),
             "An identical earlier call (started at %s) may have executed, but its outcome is "
             "unknown: the upstream server did not answer completely. To avoid doing it twice, "
             "it was NOT executed again, and identical calls will not be executed until the "
             "idempotency window ends. Check whether the earlier call took effect (for example "
             "with a read or status tool) before doing anything else.",
             row && row->created_at ? row->created_at : "an earlier time");
    answer_tool_error(ex, "outcome_unknown", text, "unknown");
}

/* Attempts a row read from Postgres stands for: its count plus the duplicates this process
 * counted and has not written yet (they are batched). */
static int row_attempts(const idem_call_t *c, const store_row_t *row)
{
    return row->attempts + (server->store ? store_pending_duplicates(server->store, c->key) : 0);
}

static void answer_replay(exchange_t *ex, const store_row_t *row, bool from_cache)
{
    idem_call_t *c = ex->call;
    server->stats->replays++;
    int attempts = (from_cache ? row->attempts : row_attempts(c, row)) + 1;
    c->state = CALL_DONE;
    ex->outcome = "replay";
    char marker[400];
    snprintf(marker, sizeof(marker),
             "{\"replayed\":true,\"first_seen\":\"%s\",\"attempts\":%d,\"key_hash\":\"%s\"}",
             row->created_at ? row->created_at : "", attempts, c->key_hash);
    char *body = NULL;
    if (row->result_too_large || !row->result) {
        char text[400];
        snprintf(text, sizeof(text),
                 "This call already ran successfully (first seen %s). Its result was too large "
                 "for the gateway to keep, so it cannot be shown again; it was NOT executed a "
                 "second time.",
                 row->created_at ? row->created_at : "earlier");
        char *t = NULL;
        json_t *j = json_string(text);
        t = json_dumps(j, JSON_ENCODE_ANY);
        json_decref(j);
        body =
            xasprintf("{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"_meta\":{\"idemgw/replay\":%s},"
                      "\"content\":[{\"type\":\"text\",\"text\":%s}]}}",
                      id_text(ex), marker, t);
        free(t);
    } else {
        body = mcp_replay_body(id_text(ex), row->result, row->result_len, marker);
    }
    if (!body) {
        refuse(ex, "replay_failed",
               "This call already ran, but its stored result could not be replayed. It was NOT "
               "executed again.");
        return;
    }
    if (from_cache) {
        server->stats->cache_replays++;
    } else if (server->store) {
        store_status_t st = store_note_duplicate(server->store, c->key, NULL, NULL);
        (void)st;
    }
    proxy_respond_json(ex, 200, body, "Idempotent-Replayed: true\r\n");
    free(body);
}

/* --- claim --- */

static void claim(exchange_t *ex);

static void wait_tick(evutil_socket_t fd, short what, void *arg);

static void on_get(store_status_t st, const store_row_t *row, void *arg)
{
    exchange_t *ex = arg;
    idem_call_t *c = ex->call;
    c->store_pending = false;
    if (!ex->client) {
        c->state = CALL_DONE;
        proxy_maybe_free(ex);
        return;
    }
    if (st != STORE_OK) {
        /* the first call was running a moment ago: forwarding now (passthrough) could run
         * it twice, so the duplicate hears "in progress" */
        c->state = CALL_DONE;
        answer_in_progress(ex, NULL);
        return;
    }
    if (!row || row->state == STORE_STATE_FAILED) {
        /* the first attempt was released (or expired): this one may run */
        c->state = CALL_CLAIMING;
        claim(ex);
        return;
    }
    if (row->state == STORE_STATE_SUCCEEDED) {
        answer_replay(ex, row, false);
        return;
    }
    if (row->state == STORE_STATE_UNKNOWN ||
        (row->lease_expired && c->on_ambiguous == ON_AMBIGUOUS_HOLD)) {
        answer_unknown(ex, row);
        return;
    }
    if (row->lease_expired) {
        c->state = CALL_CLAIMING;
        claim(ex);
        return;
    }
    if (util_now_ms() >= c->wait_deadline_ms) {
        answer_in_progress(ex, row);
        return;
    }
    struct timeval tv = {0, (suseconds_t)(c->poll_ms * 1000)};
    evtimer_add(c->timer, &tv);
    c->poll_ms = c->poll_ms * 2 > WAIT_POLL_MAX_MS ? WAIT_POLL_MAX_MS : c->poll_ms * 2;
}

static void wait_tick(evutil_socket_t fd, short what, void *arg)
{
    exchange_t *ex = arg;
    idem_call_t *c = ex->call;
    if (!ex->client) {
        c->state = CALL_DONE;
        proxy_maybe_free(ex);
        return;
    }
    if (store_get(server->store, c->key, on_get, ex) != STORE_OK) {
        c->state = CALL_DONE;
        answer_in_progress(ex, NULL);
        return;
    }
    c->store_pending = true;
}

static void start_wait(exchange_t *ex)
{
    idem_call_t *c = ex->call;
    c->state = CALL_WAITING;
    c->wait_deadline_ms = util_now_ms() + c->wait_ms;
    c->poll_ms = WAIT_POLL_FIRST_MS;
    if (!c->timer)
        c->timer = evtimer_new(server->base, wait_tick, ex);
    struct timeval tv = {0, (suseconds_t)(c->poll_ms * 1000)};
    evtimer_add(c->timer, &tv);
}

static void lease_interval(const idem_call_t *c, struct timeval *tv)
{
    uint64_t ms = c->lease_ms / 3 < 1000 ? 1000 : c->lease_ms / 3;
    tv->tv_sec = (time_t)(ms / 1000);
    tv->tv_usec = (suseconds_t)((ms % 1000) * 1000);
}

/* A long streamed call renews its lease, so duplicates keep hearing "in progress" rather than
 * "unknown" (or, with on_ambiguous: release, running it a second time) while it is alive. */
static void renew_lease(evutil_socket_t fd, short what, void *arg)
{
    exchange_t *ex = arg;
    idem_call_t *c = ex->call;
    if (c->state != CALL_FORWARDED || !server->store)
        return;
    if (store_extend_lease(server->store, c->key, c->fence, c->lease_ms, NULL, NULL) != STORE_OK)
        log_warn(ex->conn_id, "could not renew the lease of key %.16s", c->key_hash);
    struct timeval tv;
    lease_interval(c, &tv);
    evtimer_add(c->lease_timer, &tv);
}

static void forward_claimed(exchange_t *ex)
{
    idem_call_t *c = ex->call;
    c->state = CALL_FORWARDED;
    fwd_add(c);
    struct timeval tv;
    lease_interval(c, &tv);
    c->lease_timer = evtimer_new(server->base, renew_lease, ex);
    evtimer_add(c->lease_timer, &tv);
    ex->outcome = "forwarded"; /* until the upstream's answer says what happened */
    /* the result is read to be stored: ask for it uncompressed (decoded anyway if it is not) */
    char extra[160] = "Accept-Encoding: identity\r\n";
    if (c->forward_key) {
        /* only the hash goes up: the agent's own key may be a secret of its own */
        http_headers_remove(&ex->req->headers, "idempotency-key");
        snprintf(extra + strlen(extra), sizeof(extra) - strlen(extra), "Idempotency-Key: %s\r\n",
                 c->key_hash);
    }
    ex->fresh_upstream = true;
    proxy_forward(ex, extra);
}

static void on_claim(store_status_t st, const store_claim_result_t *res, void *arg)
{
    exchange_t *ex = arg;
    idem_call_t *c = ex->call;
    c->store_pending = false;
    if (st != STORE_OK) {
        server->stats->store_errors++;
        log_warn(ex->conn_id, "claim failed: %s", store_status_str(st));
        c->state = CALL_DONE;
        answer_store_failed(ex, st);
        return;
    }
    if (res->acquired) {
        c->fence = res->fence;
        log_debug(ex->conn_id, "claimed key %s fence %lld", c->key_hash, (long long)c->fence);
        forward_claimed(ex);
        return;
    }
    const store_row_t *row = &res->row;
    if (c->explicit_key && row->args_digest && strcmp(row->args_digest, c->args_digest) != 0) {
        refuse_key_reused(ex);
        return;
    }
    switch (row->state) {
    case STORE_STATE_SUCCEEDED:
        /* another process (or an earlier life of this one) recorded it: keep it for the
         * next replay, no longer than the row itself lives */
        replay_cache_put(server->cache, c->key, row->args_digest, row->result, row->result_len,
                         row->created_at, row_attempts(c, row),
                         util_now_ms() + (uint64_t)row->expires_in_ms);
        answer_replay(ex, row, false);
        return;
    case STORE_STATE_UNKNOWN:
        answer_unknown(ex, row);
        return;
    case STORE_STATE_IN_PROGRESS:
        if (row->lease_expired) {
            answer_unknown(ex, row);
            return;
        }
        if (c->wait_ms > 0 && ex->client) {
            start_wait(ex);
            return;
        }
        answer_in_progress(ex, row);
        return;
    case STORE_STATE_FAILED:
        /* a released row the claim could not take over (race): run the claim again */
        claim(ex);
        return;
    }
}

static bool replay_from_cache(exchange_t *ex)
{
    idem_call_t *c = ex->call;
    const replay_entry_t *e = replay_cache_get(server->cache, c->key, util_now_ms());
    if (!e)
        return false;
    if (c->explicit_key && strcmp(e->args_digest, c->args_digest) != 0) {
        refuse_key_reused(ex);
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
    };
    answer_replay(ex, &row, true);
    return true;
}

static void iso_now(char *out, size_t outlen)
{
    uint64_t ms = util_wall_ms();
    time_t secs = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&secs, &tm);
    size_t n = strftime(out, outlen, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, outlen - n, ".%03uZ", (unsigned)(ms % 1000));
}

/* A copy of a value for a diagnostic text column. The column is Postgres text, which holds
 * only UTF-8: a value that is not (an Mcp-Session-Id with a byte like 0xff) is kept as "\x"
 * and the hex of its bytes, bytea's notation, rather than refusing a call over a value the
 * gateway never interprets. NULL stays NULL. */
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

static void claim(exchange_t *ex)
{
    idem_call_t *c = ex->call;
    if (replay_from_cache(ex))
        return;
    if (!server->store) {
        answer_store_down(ex);
        return;
    }
    iso_now(c->claimed_at, sizeof(c->claimed_at));
    /* stored for diagnosis only; never compared */
    char *session = row_text(http_headers_get(&ex->req->headers, "mcp-session-id"));
    char *rpc_id = row_text(ex->msg.id_text);
    store_claim_req_t req = {
        .key = c->key,
        .tool = ex->msg.tool,
        .subject = NULL,
        .args_digest = c->args_digest,
        .explicit_key = c->explicit_key,
        .session_id = session,
        .jsonrpc_id = rpc_id,
        .lease_ms = c->lease_ms,
        .window_ms = c->window_ms,
        .takeover_lease_expired = c->on_ambiguous == ON_AMBIGUOUS_RELEASE,
    };
    /* the subject is the key's first segment; stored separately for diagnosis */
    char *subject = xstrndup(c->key, strcspn(c->key, ":"));
    req.subject = subject;
    store_status_t st = store_claim(server->store, &req, on_claim, ex);
    free(subject);
    free(session);
    free(rpc_id);
    if (st != STORE_OK) {
        server->stats->store_errors++;
        c->state = CALL_DONE;
        answer_store_failed(ex, st);
        return;
    }
    c->store_pending = true;
}

/* The caller's identity, per the subject setting; NULL when it cannot be established, with
 * why (a phrase for the refusal, why_len bytes) and the refusal's code. */
static char *derive_subject(const config_t *cfg, const http_request_t *req, char *why,
                            size_t why_len, const char **code)
{
    *code = "no_subject";
    switch (cfg->subject.kind) {
    case SUBJECT_STATIC:
        return xstrdup(cfg->subject.value);
    case SUBJECT_HEADER: {
        const char *v = http_headers_get(&req->headers, cfg->subject.value);
        if (http_headers_count(&req->headers, cfg->subject.value) > 1) {
            /* which copy is the caller? a proxy before us may have checked another one */
            snprintf(why, why_len, "the caller identity header (%s) appears more than once",
                     cfg->subject.value);
            return NULL;
        }
        if (!v || !*v) {
            snprintf(why, why_len, "the request has no caller identity header (%s)",
                     cfg->subject.value);
            return NULL;
        }
        /* the subject is part of the key, stored as Postgres text */
        if (!util_utf8_valid(v, strlen(v))) {
            snprintf(why, why_len,
                     "the caller identity header %s is not valid UTF-8 text (send it UTF-8 "
                     "encoded)",
                     cfg->subject.value);
            *code = "bad_subject";
            return NULL;
        }
        return xstrdup(v);
    }
    case SUBJECT_BEARER_SHA256: {
        const char *v = http_headers_get(&req->headers, "authorization");
        if (!v || strncasecmp(v, "bearer ", 7) != 0 || !v[7]) {
            snprintf(why, why_len, "the request has no bearer token");
            return NULL;
        }
        unsigned char md[EVP_MAX_MD_SIZE];
        unsigned int mdlen = 0;
        const char *tok = v + 7;
        EVP_Digest(tok, strlen(tok), md, &mdlen, EVP_sha256(), NULL);
        char hex[2 * EVP_MAX_MD_SIZE + 1];
        util_hex(md, 16, hex);
        return xasprintf("bearer-%s", hex);
    }
    case SUBJECT_NONE:
        break;
    }
    snprintf(why, why_len, "the gateway has no subject source configured");
    return NULL;
}

void idem_begin(exchange_t *ex)
{
    const config_t *cfg = server->cfg;
    const policy_tool_t *pt = policy_lookup(&cfg->policy, ex->msg.tool);
    idem_call_t *c = xcalloc(1, sizeof(*c));
    c->ex = ex;
    ex->call = c;
    c->window_ms = pt->window_ms;
    c->lease_ms = policy_lease_ms(pt, cfg->upstream_timeout_ms);
    c->wait_ms = pt->wait_ms;
    c->max_stored = pt->max_stored_bytes;
    c->on_tool_error = pt->on_tool_error;
    c->on_ambiguous = pt->on_ambiguous;
    c->on_store_down = pt->on_store_down;
    c->forward_key = pt->forward_key;

    char why[300];
    const char *code = NULL;
    char *subject = derive_subject(cfg, ex->req, why, sizeof(why), &code);
    if (!subject) {
        char text[600];
        snprintf(text, sizeof(text),
                 "Refused: this tool is protected against duplicate execution, and %s, so the "
                 "call cannot be attributed to a caller. Nothing was executed. Retrying will be "
                 "refused the same way until the caller is identified.",
                 why);
        refuse(ex, code, text);
        return;
    }

    /* the key needs exact numbers, so the body is read again with the canonical parser */
    const char *body = (const char *)evbuffer_pullup(ex->req->body, -1);
    size_t blen = evbuffer_get_length(ex->req->body);
    jcs_value_t *root = NULL;
    char err[160];
    jcs_status_t js = jcs_parse(body, blen, &root, err, sizeof(err));
    if (js != JCS_OK) {
        free(subject);
        char text[300];
        snprintf(text, sizeof(text),
                 "Refused: the call's arguments cannot be put in canonical form (%s), so "
                 "duplicates could not be recognised. Nothing was executed.",
                 jcs_status_str(js));
        refuse(ex, "bad_arguments", text);
        return;
    }
    jcs_value_t *args = jcs_object_get(jcs_object_get(root, "params"), "arguments");
    key_result_t kr = {0};
    char msg[200] = "";
    key_status_t ks =
        key_derive(subject, ex->msg.tool, args, pt,
                   http_headers_get(&ex->req->headers, "idempotency-key"), &kr, msg, sizeof(msg));
    jcs_free(root);
    if (ks != KEY_OK) {
        free(subject);
        char text[400];
        snprintf(text, sizeof(text), "Refused: %s (%s). Nothing was executed.", key_status_str(ks),
                 msg);
        refuse(ex, "bad_key", text);
        return;
    }
    c->key = kr.key;
    kr.key = NULL;
    c->subject = subject;
    memcpy(c->args_digest, kr.args_digest, sizeof(c->args_digest));
    c->explicit_key = kr.explicit_key;
    key_result_free(&kr);
    key_hash_hex(c->key, c->key_hash);
    snprintf(c->log_extra, sizeof(c->log_extra), "\"key_hash\":\"%.16s\"", c->key_hash);
    ex->extra_log = c->log_extra;
    claim(ex);
}

/* --- capturing the outcome --- */

static int on_watch_event(const sse_event_t *ev, void *arg);

static int on_sse_event(const sse_event_t *ev, void *arg)
{
    exchange_t *ex = arg;
    idem_call_t *c = ex->call;
    if (c->final_seen || ev->data_len == 0)
        return 0;
    size_t off = 0, len = 0;
    mcp_resp_class_t cls = mcp_classify_response(ev->data, ev->data_len, ex->msg.id, &off, &len);
    if (cls == MCP_RESP_OTHER)
        return 0;
    c->final_seen = true;
    c->cls = cls;
    if (cls == MCP_RESP_FOREIGN) {
        c->foreign = true;
        ex->holding = true; /* nothing from here on reaches the agent */
        return 0;
    }
    if (len > c->max_stored) {
        c->too_large = true;
    } else {
        c->result = xstrndup(ev->data + off, len);
        c->result_len = len;
    }
    /* hold what follows until the outcome is stored, so a retry right after sees it */
    ex->holding = true;
    return 0;
}

void idem_on_head(exchange_t *ex, int status, const http_headers_t *headers)
{
    idem_call_t *c = ex->call;
    if (c->state == CALL_WATCH) {
        if (status == 200 && ex->resp_sse) {
            c->capture_sse = true;
            sse_init(&c->sse, 16 * 1024 * 1024, on_watch_event, ex);
        }
        return;
    }
    if (c->state != CALL_FORWARDED)
        return;
    if (status != 200) {
        /* a redirect or a refusal released the claim: the agent learns of it once the release
         * is written, so a retry sent at once runs instead of hearing "in progress" */
        ex->holding = true;
        return;
    }
    decode_coding_t coding = decode_coding_parse(http_headers_get(headers, "content-encoding"));
    if (coding == DECODE_CODING_UNSUPPORTED)
        c->undecodable = true;
    else
        c->decoder = decoder_new(coding);
    if (ex->resp_sse) {
        c->capture_sse = true;
        sse_init(&c->sse, c->max_stored + 4096, on_sse_event, ex);
    } else {
        c->capture_json = true;
        c->json_body = evbuffer_new();
        ex->holding = true;
    }
}

/* Bytes of the answer as the upstream meant them, before any Content-Encoding. */
static void capture(idem_call_t *c, const char *data, size_t len)
{
    if (c->capture_sse) {
        int rc = sse_feed(&c->sse, data, len);
        (void)rc;
    } else if (c->capture_json && !c->too_large) {
        if (evbuffer_get_length(c->json_body) + len > c->max_stored + 4096) {
            c->too_large = true;
            evbuffer_free(c->json_body);
            c->json_body = NULL;
        } else {
            evbuffer_add(c->json_body, data, len);
        }
    }
}

/* A decoding failure makes the answer unreadable, not the outcome unknown: the call ran. */
static void decode_failed(exchange_t *ex, decode_status_t st)
{
    idem_call_t *c = ex->call;
    if (st == DECODE_ERR_LIMIT && c->capture_json) {
        c->too_large = true;
    } else {
        c->undecodable = true;
        log_warn(ex->conn_id, "compressed answer for key %.16s unreadable: %s", c->key_hash,
                 decode_status_str(st));
    }
    decoder_free(c->decoder);
    c->decoder = NULL;
}

void idem_on_body(exchange_t *ex, const char *data, size_t len)
{
    idem_call_t *c = ex->call;
    if (c->undecodable || (!c->capture_sse && !c->capture_json))
        return;
    if (!c->decoder) {
        capture(c, data, len);
        return;
    }
    /* a JSON answer is kept whole, so its decoded size is bounded as a whole; a stream only
     * needs each read bounded, its events are bounded by the SSE parser */
    size_t limit = c->capture_json ? c->max_stored + 4096
                                   : decoder_produced(c->decoder) + SSE_DECODED_PER_READ;
    struct evbuffer *plain = evbuffer_new();
    decode_status_t st = decoder_feed(c->decoder, data, len, plain, limit);
    size_t n = evbuffer_get_length(plain);
    if (n > 0)
        capture(c, (const char *)evbuffer_pullup(plain, -1), n);
    evbuffer_free(plain);
    if (st != DECODE_OK)
        decode_failed(ex, st);
}

/* The upstream answered with another request's response: that answer is never the caller's. */
static void answer_foreign(exchange_t *ex)
{
    idem_call_t *c = ex->call;
    server->stats->unknown++;
    char status[200];
    snprintf(status, sizeof(status), "{\"code\":\"outcome_unknown\",\"key_hash\":\"%s\"}",
             c->key_hash);
    char *body = mcp_tool_error_body(
        id_text(ex),
        "The upstream server answered this call with the response to a different request, so "
        "whether this call executed is unknown. That answer was discarded. Identical calls will "
        "not be executed until the idempotency window ends. Check whether the call took effect "
        "(for example with a read or status tool) before doing anything else.",
        status);
    ex->outcome = "unknown";
    proxy_replace_answer(ex, body);
    free(body);
}

static void on_finished(store_status_t st, bool fence_matched, void *arg)
{
    exchange_t *ex = arg;
    idem_call_t *c = ex->call;
    c->store_pending = false;
    c->state = CALL_DONE;
    if (st != STORE_OK) {
        server->stats->store_errors++;
        log_error(ex->conn_id, "could not record the outcome of key %.16s: %s", c->key_hash,
                  store_status_str(st));
    } else if (!fence_matched) {
        log_warn(ex->conn_id, "outcome of key %.16s not recorded: the claim was taken over",
                 c->key_hash);
    } else {
        /* logged once Postgres has it: a retry sent after this line sees the outcome */
        log_info(ex->conn_id, "key %.16s recorded as %s (%s)", c->key_hash,
                 store_state_str(c->recorded), c->why);
        if (c->recorded == STORE_STATE_SUCCEEDED)
            replay_cache_put(server->cache, c->key, c->args_digest, c->result, c->result_len,
                             c->claimed_at, 1, util_now_ms() + c->window_ms);
    }
    if (c->foreign) {
        answer_foreign(ex);
        return;
    }
    proxy_release_held(ex);
}

static store_state_t final_state(mcp_resp_class_t cls, on_tool_error_t on_tool_error,
                                 const char **why)
{
    switch (cls) {
    case MCP_RESP_RESULT:
        *why = "result";
        return STORE_STATE_SUCCEEDED;
    case MCP_RESP_TOOL_ERROR:
        *why = "tool error";
        return on_tool_error == ON_TOOL_ERROR_STORE ? STORE_STATE_SUCCEEDED : STORE_STATE_FAILED;
    case MCP_RESP_INPUT_REQUIRED:
        *why = "input required: not final";
        return STORE_STATE_FAILED;
    case MCP_RESP_ERROR:
    case MCP_RESP_FOREIGN:
    case MCP_RESP_OTHER:
        break;
    }
    *why = "json-rpc error";
    return STORE_STATE_FAILED;
}

static void remember_pending(exchange_t *ex, const char *session)
{
    idem_call_t *c = ex->call;
    pending_t *p = xcalloc(1, sizeof(*p));
    p->session_id = xstrdup(session);
    p->id = json_deep_copy(ex->msg.id);
    p->key = xstrdup(c->key);
    memcpy(p->key_hash, c->key_hash, sizeof(p->key_hash));
    p->fence = c->fence;
    p->window_ms = c->window_ms;
    p->on_tool_error = c->on_tool_error;
    p->until_ms = util_now_ms() + c->lease_ms;
    p->next = server->idem->head;
    server->idem->head = p;
    /* the GET that resumes the session may reach another worker: it is handed here */
    handoff_note_stream(session, true);
}

static void deferred_finish_fail(evutil_socket_t fd, short what, void *arg)
{
    exchange_t *ex = arg;
    on_finished(ex->call->deferred_status, false, ex);
}

/* What the log line and the metrics say happened to a call, by why it was recorded. Only a
 * result (a tool error result included: the tool ran) counts as an execution; a JSON-RPC
 * error or an HTTP refusal is the upstream declining, and a call never sent or cut short did
 * not get an answer at all. */
static const char *outcome_of(const char *why, bool *executed)
{
    static const struct {
        const char *why, *outcome;
        bool executed;
    } table[] = {
        {"result", "executed", true},
        {"tool error", "executed", true},
        {"input required: not final", "input_required", false},
        {"json-rpc error", "rejected_by_upstream", false},
        {"refused by upstream", "rejected_by_upstream", false},
        {"never sent", "not_sent", false},
        {"cancelled by its caller", "cancelled", false},
        {"answer not decodable", "executed", true},
        {"redirected by upstream", "redirected", false},
        {"response id mismatch", "unknown", false},
    };
    for (size_t i = 0; i < ARRAY_LEN(table); i++)
        if (strcmp(why, table[i].why) == 0) {
            *executed = table[i].executed;
            return table[i].outcome;
        }
    *executed = false;
    return "unknown";
}

static void count_outcome(exchange_t *ex, const char *why)
{
    bool executed = false;
    const char *outcome = outcome_of(why, &executed);
    if (ex)
        ex->outcome = outcome;
    if (executed)
        server->stats->executions++;
}

static void record(exchange_t *ex, store_state_t state, const char *why)
{
    idem_call_t *c = ex->call;
    c->state = CALL_FINISHING;
    count_outcome(ex, why);
    snprintf(c->log_extra, sizeof(c->log_extra),
             "\"key_hash\":\"%.16s\",\"recorded\":\"%s\",\"why\":\"%s\"", c->key_hash,
             store_state_str(state), why);
    ex->extra_log = c->log_extra;
    c->why = why;
    bool too_large = state == STORE_STATE_SUCCEEDED && (c->too_large || !c->result);
    c->recorded = state;
    /* the agent's answer waits for the write, so a retry right after sees the outcome */
    ex->holding = true;
    const char *result = state == STORE_STATE_SUCCEEDED ? c->result : NULL;
    size_t result_len = state == STORE_STATE_SUCCEEDED ? c->result_len : 0;
    if (state == STORE_STATE_UNKNOWN && c->cancelled) {
        result = CANCEL_NOTE;
        result_len = sizeof(CANCEL_NOTE) - 1;
    }
    store_status_t st = store_finish(server->store, c->key, c->fence, state, result, result_len,
                                     too_large, c->window_ms, on_finished, ex);
    c->store_pending = true;
    if (st != STORE_OK) {
        /* reported from the loop: the caller is still using the exchange */
        c->deferred_status = st;
        struct timeval zero = {0, 0};
        event_base_once(server->base, -1, EV_TIMEOUT, deferred_finish_fail, ex, &zero);
    }
}

void idem_on_end(exchange_t *ex, upstream_result_t res)
{
    idem_call_t *c = ex->call;
    if (c->state != CALL_FORWARDED)
        return;
    fwd_remove(c);
    if (c->lease_timer)
        evtimer_del(c->lease_timer);
    if (c->decoder && res == UPSTREAM_OK) {
        decode_status_t ds = decoder_finish(c->decoder);
        if (ds != DECODE_OK)
            decode_failed(ex, ds);
    }
    if (c->foreign) {
        record(ex, STORE_STATE_UNKNOWN, "response id mismatch");
        return;
    }
    if (c->undecodable && res == UPSTREAM_OK) {
        c->too_large = true; /* recorded as ran, result not kept */
        record(ex, STORE_STATE_SUCCEEDED, "answer not decodable");
        return;
    }
    if (c->capture_json && res == UPSTREAM_OK && c->json_body) {
        size_t len = evbuffer_get_length(c->json_body);
        const char *text = (const char *)evbuffer_pullup(c->json_body, -1);
        size_t off = 0, rlen = 0;
        mcp_resp_class_t cls =
            mcp_classify_response(text ? text : "", len, ex->msg.id, &off, &rlen);
        if (cls == MCP_RESP_FOREIGN) {
            c->foreign = true;
            record(ex, STORE_STATE_UNKNOWN, "response id mismatch");
            return;
        }
        if (cls != MCP_RESP_OTHER) {
            c->final_seen = true;
            c->cls = cls;
            c->result = xstrndup(text + off, rlen);
            c->result_len = rlen;
        }
    } else if (c->capture_json && res == UPSTREAM_OK && c->too_large) {
        c->final_seen = true;
        c->cls = MCP_RESP_RESULT;
    }
    bool ambiguous_hold = c->on_ambiguous == ON_AMBIGUOUS_HOLD;
    if (c->final_seen) {
        const char *why;
        store_state_t st = final_state(c->cls, c->on_tool_error, &why);
        record(ex, st, why);
        return;
    }
    if (c->cancelled) {
        /* no answer will come: the caller gave up on it, and it may have run */
        record(ex, ambiguous_hold ? STORE_STATE_UNKNOWN : STORE_STATE_FAILED,
               "cancelled by its caller");
        return;
    }
    const char *session = http_headers_get(&ex->req->headers, "mcp-session-id");
    if (c->capture_sse && session)
        remember_pending(ex, session);
    if (c->capture_sse && session && res == UPSTREAM_OK) {
        /* the server ended the stream early (SSE polling): the agent resumes it with GET and
         * the final response finishes the key there; until then the claim stays in progress */
        c->state = CALL_DONE;
        ex->holding = false;
        ex->outcome = "pending";
        return;
    }
    if (res == UPSTREAM_ERR_CONNECT) {
        record(ex, STORE_STATE_FAILED, "never sent");
        return;
    }
    if (res == UPSTREAM_OK && ex->status >= 300 && ex->status < 400) {
        /* the upstream sent the call elsewhere and ran nothing: the next attempt may run */
        record(ex, STORE_STATE_FAILED, "redirected by upstream");
        return;
    }
    if (res == UPSTREAM_OK && ex->status >= 400 && ex->status < 500) {
        record(ex, STORE_STATE_FAILED, "refused by upstream");
        return;
    }
    record(ex, ambiguous_hold ? STORE_STATE_UNKNOWN : STORE_STATE_FAILED, "outcome unknown");
}

/* --- GET streams: final responses of calls whose POST stream ended early --- */

typedef struct resumed_finish {
    uint64_t conn_id;
    char key_hash[65];
    store_state_t state;
    const char *why;
} resumed_finish_t;

static void on_resumed_finished(store_status_t st, bool fence_matched, void *arg)
{
    resumed_finish_t *rf = arg;
    if (st != STORE_OK)
        log_error(rf->conn_id, "could not record key %.16s: %s", rf->key_hash,
                  store_status_str(st));
    else if (!fence_matched)
        log_warn(rf->conn_id, "outcome of key %.16s not recorded: the claim was taken over",
                 rf->key_hash);
    else
        log_info(rf->conn_id, "key %.16s recorded as %s from a resumed stream (%s)", rf->key_hash,
                 store_state_str(rf->state), rf->why);
    free(rf);
}

static int on_watch_event(const sse_event_t *ev, void *arg)
{
    exchange_t *ex = arg;
    idem_call_t *c = ex->call;
    bool finished_one = false;
    for (pending_t **pp = &server->idem->head; *pp;) {
        pending_t *p = *pp;
        size_t off = 0, len = 0;
        mcp_resp_class_t cls = MCP_RESP_OTHER;
        if (strcmp(p->session_id, c->session_id) == 0)
            cls = mcp_classify_response(ev->data, ev->data_len, p->id, &off, &len);
        if (cls == MCP_RESP_OTHER || cls == MCP_RESP_FOREIGN) {
            /* a GET stream carries the answers of several calls: another's is no sign */
            pp = &p->next;
            continue;
        }
        const char *why;
        store_state_t st = final_state(cls, p->on_tool_error, &why);
        count_outcome(NULL, why);
        bool store_it = st == STORE_STATE_SUCCEEDED && cls != MCP_RESP_INPUT_REQUIRED;
        resumed_finish_t *rf = xcalloc(1, sizeof(*rf));
        rf->conn_id = ex->conn_id;
        memcpy(rf->key_hash, p->key_hash, sizeof(rf->key_hash));
        rf->state = st;
        rf->why = why;
        store_status_t ss =
            store_finish(server->store, p->key, p->fence, st, store_it ? ev->data + off : NULL,
                         store_it ? len : 0, false, p->window_ms, on_resumed_finished, rf);
        if (ss != STORE_OK) {
            log_error(ex->conn_id, "could not record key %.16s: %s", p->key_hash,
                      store_status_str(ss));
            free(rf);
        }
        *pp = p->next;
        pending_free(p);
        finished_one = true;
    }
    if (finished_one)
        proxy_session_maybe_idle(c->session_id);
    return 0;
}

void idem_watch_begin(exchange_t *ex)
{
    const char *session = http_headers_get(&ex->req->headers, "mcp-session-id");
    if (!server->store || !session || !registry_has_session(server->idem, session))
        return;
    idem_call_t *c = xcalloc(1, sizeof(*c));
    c->ex = ex;
    c->state = CALL_WATCH;
    c->session_id = xstrdup(session);
    ex->call = c;
}

void idem_cancel_relayed(exchange_t *note)
{
    const char *session = http_headers_get(&note->req->headers, "mcp-session-id");
    if (!session || !server->idem->forwarded)
        return;
    json_t *req_id = note->cancel_id;
    char why[200];
    const char *code = NULL;
    char *subject = req_id ? derive_subject(server->cfg, note->req, why, sizeof(why), &code) : NULL;
    for (idem_call_t *c = server->idem->forwarded; c && subject;) {
        idem_call_t *next = c->next_fwd;
        exchange_t *ex = c->ex;
        const char *s2 = http_headers_get(&ex->req->headers, "mcp-session-id");
        /* the session, the caller and the request id must all be the call's */
        if (!c->final_seen && s2 && strcmp(s2, session) == 0 && strcmp(c->subject, subject) == 0 &&
            json_equal(ex->msg.id, req_id)) {
            log_info(ex->conn_id, "key %.16s: its caller cancelled the call; ending it",
                     c->key_hash);
            c->cancelled = true;
            proxy_end_upstream(ex);
        }
        c = next;
    }
    free(subject);
}
