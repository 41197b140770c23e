#include "pending.h"
#include "handoff.h"
#include "key.h"
#include "log.h"
#include "outcome.h"
#include "recorder.h"
#include "stream_reader.h"
#include "util.h"

#include <event2/buffer.h>
#include <stdlib.h>
#include <string.h>

typedef struct pending {
    char *session_id;
    json_t *id; /* the JSON-RPC id the final response will carry */
    char *key;
    char key_hash[65];
    int64_t fence;
    uint64_t window_ms;
    size_t max_stored_bytes;
    char *args_digest;
    char *claimed_at;
    int attempts;
    char *subject;
    char *jsonrpc_id; /* the id's text, for the replay cache's first call */
    on_tool_error_t on_tool_error;
    uint64_t until_ms; /* forgotten after this: the lease decides the row's fate */
    struct pending *next;
} pending_t;

struct pending_reg {
    pending_ctx_t ctx;
    pending_t *head;
};

/* A GET stream of a session: a pending call's response may arrive on it. */
typedef struct watcher {
    pending_reg_t *reg;
    exchange_t *ex;
    char *session_id;
    stream_reader_t reader;
} watcher_t;

pending_reg_t *pending_new(const pending_ctx_t *ctx)
{
    pending_reg_t *r = xcalloc(1, sizeof(*r));
    r->ctx = *ctx;
    return r;
}

static void entry_free(pending_t *p)
{
    free(p->session_id);
    json_decref(p->id);
    free(p->key);
    free(p->args_digest);
    free(p->claimed_at);
    free(p->subject);
    free(p->jsonrpc_id);
    free(p);
}

void pending_free(pending_reg_t *r)
{
    if (!r)
        return;
    while (r->head) {
        pending_t *p = r->head;
        r->head = p->next;
        entry_free(p);
    }
    free(r);
}

static char *dup_or_null(const char *s)
{
    return s ? xstrdup(s) : NULL;
}

void pending_add(pending_reg_t *r, const recorder_call_t *call, const json_t *id,
                 const policy_rules_t *rules)
{
    pending_t *p = xcalloc(1, sizeof(*p));
    p->session_id = xstrdup(call->session);
    p->id = json_deep_copy(id);
    p->key = xstrdup(call->key);
    snprintf(p->key_hash, sizeof(p->key_hash), "%s", call->key_hash);
    p->fence = call->fence;
    p->window_ms = call->window_ms;
    p->max_stored_bytes = call->max_stored_bytes;
    p->args_digest = dup_or_null(call->args_digest);
    p->claimed_at = dup_or_null(call->claimed_at);
    p->attempts = call->attempts;
    p->subject = dup_or_null(call->subject);
    p->jsonrpc_id = dup_or_null(call->jsonrpc_id);
    p->on_tool_error = rules->on_tool_error;
    p->until_ms = util_now_ms() + rules->lease_ms;
    p->next = r->head;
    r->head = p;
    /* the GET that resumes the session may reach another worker: it is handed here */
    handoff_note_stream(call->session, true);
}

bool pending_has_session(pending_reg_t *r, const char *session)
{
    uint64_t now = util_now_ms();
    bool found = false;
    for (pending_t **pp = &r->head; *pp;) {
        pending_t *p = *pp;
        if (p->until_ms <= now) {
            *pp = p->next;
            entry_free(p);
            continue;
        }
        if (session && strcmp(p->session_id, session) == 0)
            found = true;
        pp = &p->next;
    }
    return found;
}

typedef struct resumed_finish {
    uint64_t conn_id;
    char key_hash[65];
    store_state_t state;
    outcome_why_t why;
} resumed_finish_t;

static void on_resumed_finished(store_status_t st, bool fence_matched, uint64_t window_ms,
                                void *arg)
{
    resumed_finish_t *rf = arg;
    (void)window_ms;
    if (st != STORE_OK)
        log_error(rf->conn_id, "could not record key %.*s: %s", KEY_HASH_LOG_LEN, rf->key_hash,
                  store_status_str(st));
    else if (!fence_matched)
        log_warn(rf->conn_id, "outcome of key %.*s not recorded: the claim was taken over",
                 KEY_HASH_LOG_LEN, rf->key_hash);
    else
        log_info(rf->conn_id, "key %.*s recorded as %s from a resumed stream (%s)",
                 KEY_HASH_LOG_LEN, rf->key_hash, store_state_str(rf->state),
                 outcome_why_str(rf->why));
    free(rf);
}

/* Finishes p's key with the response at data[off, off+len) of class cls. */
static void finish(pending_reg_t *r, uint64_t conn_id, const pending_t *p, mcp_resp_class_t cls,
                   const char *data, size_t off, size_t len)
{
    outcome_why_t why;
    store_state_t st = outcome_final_state(cls, p->on_tool_error, &why);
    if (outcome_executed(why))
        r->ctx.stats->executions++;
    resumed_finish_t *rf = xcalloc(1, sizeof(*rf));
    rf->conn_id = conn_id;
    memcpy(rf->key_hash, p->key_hash, sizeof(rf->key_hash));
    rf->state = st;
    rf->why = why;
    recorder_call_t call = {
        .key = p->key,
        .key_hash = p->key_hash,
        .fence = p->fence,
        .window_ms = p->window_ms,
        .max_stored_bytes = p->max_stored_bytes,
        .args_digest = p->args_digest,
        .claimed_at = p->claimed_at,
        .attempts = p->attempts,
        .subject = p->subject,
        .session = p->session_id,
        .jsonrpc_id = p->jsonrpc_id,
    };
    const char *result = st == STORE_STATE_SUCCEEDED ? data + off : NULL;
    size_t result_len = st == STORE_STATE_SUCCEEDED ? len : 0;
    store_status_t ss = recorder_finish(r->ctx.recorder, &call, st, result, result_len, false,
                                        on_resumed_finished, rf);
    if (ss != STORE_OK) {
        log_error(conn_id, "could not record key %.*s: %s", KEY_HASH_LOG_LEN, p->key_hash,
                  store_status_str(ss));
        free(rf);
    }
}

static int on_watch_event(const sse_event_t *ev, void *arg)
{
    watcher_t *w = arg;
    pending_reg_t *r = w->reg;
    bool finished_one = false;
    for (pending_t **pp = &r->head; *pp;) {
        pending_t *p = *pp;
        size_t off = 0, len = 0;
        mcp_resp_class_t cls = MCP_RESP_OTHER;
        if (strcmp(p->session_id, w->session_id) == 0)
            cls = mcp_classify_response(ev->data, ev->data_len, p->id, &off, &len);
        if (cls == MCP_RESP_OTHER || cls == MCP_RESP_FOREIGN) {
            /* a GET stream carries the answers of several calls: another's is no sign */
            pp = &p->next;
            continue;
        }
        finish(r, exchange_conn_id(w->ex), p, cls, ev->data, off, len);
        *pp = p->next;
        entry_free(p);
        finished_one = true;
    }
    if (finished_one && r->ctx.session_idle)
        r->ctx.session_idle(r->ctx.arg, w->session_id);
    return 0;
}

static observe_t watch_head(void *arg, int status, const http_headers_t *headers, bool sse)
{
    watcher_t *w = arg;
    /* a stream that cannot be read leaves the pending calls' rows to their leases */
    stream_reader_head(&w->reader, status, headers, sse, 16 * 1024 * 1024, on_watch_event, w);
    return OBSERVE_PASS;
}

static observe_t watch_body(void *arg, const char *data, size_t len)
{
    watcher_t *w = arg;
    stream_reader_body(&w->reader, data, len);
    return OBSERVE_PASS;
}

static void watch_detach(void *arg)
{
    watcher_t *w = arg;
    stream_reader_free(&w->reader);
    free(w->session_id);
    free(w);
}

static const response_observer_t watch_ops = {
    .on_head = watch_head,
    .on_body = watch_body,
    .detach = watch_detach,
};

void pending_watch(pending_reg_t *r, exchange_t *ex)
{
    const char *session = http_headers_get(&exchange_request(ex)->headers, "mcp-session-id");
    if (!session)
        return;
    if (!r->ctx.store)
        return;
    watcher_t *w = xcalloc(1, sizeof(*w));
    w->reg = r;
    w->ex = ex;
    w->session_id = xstrdup(session);
    w->reader.conn_id = exchange_conn_id(ex);
    w->reader.what = "pending calls' GET stream";
    exchange_add_observer(ex, &watch_ops, w);
}
