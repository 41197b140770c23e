/* The ids requests go upstream with, and their answers mapped back (call_ids.h). */
#include "call_ids.h"
#include "log.h"
#include "rpc_id.h"
#include "subject.h"
#include "util.h"

#include <event2/buffer.h>
#include <llhttp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Most bytes of a call's JSON answer, or of one event of its stream, once decoded: the filter
 * reads a JSON answer whole to find its id (as the stage holds a protected one whole anyway). */
#define CALL_IDS_MAX_ANSWER (64u * 1024 * 1024)
/* How long the id of a call whose POST stream ended before its answer is kept for the
 * session's GET stream, and how many such calls at most. */
#define PENDING_KEEP_MS (15u * 60 * 1000)
#define PENDING_MAX 1024

/* One request sent up with an assigned id (a protected call, or any request with an id when
 * every_request): its ids, and the filter of its exchange while that runs. */
typedef struct entry {
    call_ids_t *ids;
    const http_request_t *req; /* its request while its exchange runs (live): whose call it is */
    char assigned[RPC_ID_TEXT_MAX]; /* the id it went up with, as JSON text */
    size_t assigned_len;            /* its length; 0 until it went up */
    char *caller_text;              /* the caller's id, as its request wrote it */
    json_t *caller_id;
    char *session; /* its Mcp-Session-Id, or NULL */
    bool live;     /* its exchange runs (else it waits for a GET stream, until expires_ms) */
    bool forwarded;
    bool answered; /* its final response was seen: nothing more to map */
    /* answered on a POST stream its agent had left: the agent may resume it (Last-Event-ID),
     * and a server that replays it sends the answer with the assigned id again, so it is
     * mapped on the session's GET streams until it expires */
    bool resumable;
    exchange_t *ex; /* while live and forwarded */
    bool sse;       /* its answer is a stream */
    int status;     /* the HTTP status of its answer, once the head came */
    uint64_t expires_ms;
    rpc_id_rewriter_t *rw;  /* the answer, once it began */
    http_headers_t headers; /* the answer's head as the filter gives it out */
    struct entry *prev, *next;
} entry_t;

/* A GET stream of a session with calls waiting for their answer. */
typedef struct tap {
    call_ids_t *ids;
    char *session;
    rpc_id_rewriter_t *rw; /* NULL: the stream is relayed as it is */
    http_headers_t headers;
} tap_t;

struct call_ids {
    call_ids_ctx_t ctx;
    char nonce[17]; /* random per process: ids unlike any another process assigns */
    uint64_t next;
    entry_t *entries; /* newest first */
    size_t n, n_pending;
};

call_ids_t *call_ids_new(const call_ids_ctx_t *ctx)
{
    call_ids_t *ids = xcalloc(1, sizeof(*ids));
    ids->ctx = *ctx;
    util_nonce_hex(ids->nonce);
    return ids;
}

static void entry_free(entry_t *e)
{
    call_ids_t *ids = e->ids;
    if (e->prev)
        e->prev->next = e->next;
    else
        ids->entries = e->next;
    if (e->next)
        e->next->prev = e->prev;
    ids->n--;
    if (!e->live)
        ids->n_pending--;
    json_decref(e->caller_id);
    free(e->caller_text);
    free(e->session);
    rpc_id_rewriter_free(e->rw);
    http_headers_free(&e->headers);
    free(e);
}

void call_ids_free(call_ids_t *ids)
{
    if (!ids)
        return;
    /* the live entries are their exchanges' filters: the proxy, freed first, detached them */
    while (ids->entries)
        entry_free(ids->entries);
    free(ids);
}

size_t call_ids_tracked(const call_ids_t *ids)
{
    return ids->n;
}

static bool same_session(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* Pending entries answered (on a GET stream) or past their time, and the oldest beyond the
 * most kept. Never from inside a lookup: the caller's id it returned is still in use. */
static void expire(call_ids_t *ids)
{
    if (ids->n_pending == 0)
        return;
    uint64_t now = util_now_ms();
    entry_t *last = ids->entries;
    while (last && last->next)
        last = last->next;
    size_t over = ids->n_pending > PENDING_MAX ? ids->n_pending - PENDING_MAX : 0;
    for (entry_t *e = last; e;) {
        entry_t *prev = e->prev;
        if (!e->live && ((e->answered && !e->resumable) || over > 0 || e->expires_ms <= now)) {
            if (over > 0)
                over--;
            entry_free(e);
        }
        e = prev;
    }
}

/* --- the answer's head: what is rewritten, and the head it goes on with --- */

/* A copy of in without the headers a rewritten body no longer matches. */
static void copy_head(http_headers_t *out, const http_headers_t *in)
{
    http_headers_reset(out);
    for (size_t i = 0; i < in->n; i++) {
        const char *name = http_headers_name(in, i), *value = http_headers_value(in, i);
        size_t nlen = http_headers_name_len(in, i);
        if (HTTP_NAME_IS(name, nlen, "content-length") ||
            HTTP_NAME_IS(name, nlen, "content-encoding"))
            continue;
        http_headers_add_name(out, name, nlen);
        http_headers_end_name(out);
        http_headers_add_value(out, value, strlen(value));
        http_headers_end_value(out);
    }
}

static bool is_sse(const http_headers_t *h)
{
    const char *ct = http_headers_get(h, "content-type");
    return ct && strncasecmp(ct, "text/event-stream", 17) == 0;
}

static bool pass_bytes(rpc_id_rewriter_t *rw, const char *data, size_t len, struct evbuffer *out)
{
    if (!rw) {
        evbuffer_add(out, data, len);
        return true;
    }
    rpc_id_status_t st = rpc_id_rewriter_feed(rw, data, len, out);
    if (st != RPC_ID_OK && st != RPC_ID_DESYNC) /* a desync is the exchange's to log */
        log_warn(0, "the answer of a call sent with an assigned id cannot be checked: %s",
                 rpc_id_status_str(st));
    return st == RPC_ID_OK;
}

static bool pass_end(rpc_id_rewriter_t *rw, bool complete, struct evbuffer *out)
{
    if (!rw)
        return true;
    rpc_id_status_t st = rpc_id_rewriter_finish(rw, complete, out);
    if (st != RPC_ID_OK && st != RPC_ID_DESYNC) /* a desync is the exchange's to log */
        log_warn(0, "the answer of a call sent with an assigned id cannot be checked: %s",
                 rpc_id_status_str(st));
    return st == RPC_ID_OK;
}

/* --- a call's filter --- */

static bool id_is_null(const char *id, size_t len)
{
    return !id || (len == 4 && memcmp(id, "null", 4) == 0);
}

/* Strict: the answer is this call's, so only its assigned id is known. */
static const char *call_lookup(void *arg, const char *id, size_t len, bool response)
{
    entry_t *e = arg;
    /* An HTTP refusal (4xx, 5xx) with a JSON-RPC error whose id is null is the request's own:
     * a server that refuses a request before it reads it (an unknown session: the SDKs' 404
     * "Session not found") has no id to give. It stays null. A success (2xx) with a null id
     * is no answer to this request: a desync. */
    if (response && id_is_null(id, len) && e->status >= 400) {
        e->answered = true;
        return "null";
    }
    if (!id || !rpc_id_same(id, len, e->assigned, e->assigned_len))
        return NULL;
    if (response)
        e->answered = true;
    return e->caller_text;
}

static void call_forward(void *arg, exchange_t *ex)
{
    entry_t *e = arg;
    call_ids_t *ids = e->ids;
    rpc_id_format(e->assigned, ids->nonce, ++ids->next);
    /* the id rewritten where it is: the body is not written out again */
    if (!rpc_id_put_request_id(exchange_request(ex)->body, e->assigned, exchange_msg(ex))) {
        /* an id written with escapes in its member name: it goes as the caller wrote it, on a
         * connection of its own (another caller's answer may carry the same id), and only an
         * answer with that id is the call's */
        log_warn(exchange_conn_id(ex), "request forwarded with its caller's id, on a connection "
                                       "of its own: its id member could not be rewritten");
        snprintf(e->assigned, sizeof(e->assigned), "%s", e->caller_text);
        exchange_upstream_alone(ex);
    }
    e->assigned_len = strlen(e->assigned);
    e->forwarded = true;
    e->ex = ex;
}

static bool call_head(void *arg, int status, const http_headers_t *in, const http_headers_t **out)
{
    entry_t *e = arg;
    e->status = status;
    /* every answer of the call is read (a 4xx may carry a JSON-RPC error with its id too) */
    bool sse = is_sse(in);
    e->sse = sse;
    decode_coding_t coding = decode_coding_parse(http_headers_get(in, "content-encoding"));
    rpc_id_rewriter_free(e->rw);
    e->rw = rpc_id_rewriter_new(sse ? RPC_BODY_SSE : RPC_BODY_JSON, coding, CALL_IDS_MAX_ANSWER,
                                call_lookup, e, true);
    copy_head(&e->headers, in);
    *out = &e->headers;
    if (coding == DECODE_CODING_UNSUPPORTED) {
        log_warn(0, "request answered in a coding the gateway cannot read: its id is not "
                    "known to be the request's");
        return false;
    }
    return true;
}

static bool call_body(void *arg, const char *data, size_t len, struct evbuffer *out)
{
    entry_t *e = arg;
    return pass_bytes(e->rw, data, len, out);
}

static bool call_end(void *arg, bool complete, struct evbuffer *out)
{
    entry_t *e = arg;
    e->resumable = e->sse && e->session && !exchange_agent_waiting(e->ex);
    return pass_end(e->rw, complete, out);
}

/* The exchange ended: a call still waiting for its answer, or one whose stream its agent may
 * resume, keeps its ids for the session's GET streams; the others are forgotten. */
static void call_detach(void *arg)
{
    entry_t *e = arg;
    rpc_id_rewriter_free(e->rw);
    e->rw = NULL;
    e->req = NULL; /* freed with its exchange */
    e->ex = NULL;
    if (!e->forwarded || (e->answered && !e->resumable) || !e->session) {
        entry_free(e);
        return;
    }
    e->live = false;
    e->ids->n_pending++;
    e->expires_ms = util_now_ms() + PENDING_KEEP_MS;
    expire(e->ids);
}

static bool call_answered(void *arg)
{
    const entry_t *e = arg;
    return e->answered;
}

static const response_filter_t call_filter = {
    .on_forward = call_forward,
    .on_head = call_head,
    .on_body = call_body,
    .on_end = call_end,
    .detach = call_detach,
    .answered = call_answered,
};

/* --- a GET stream of a session whose calls wait for their answer --- */

/* Lenient: any call of the session forwarded and not yet answered (or resumable). */
static const char *tap_lookup(void *arg, const char *id, size_t len, bool response)
{
    tap_t *t = arg;
    if (!id)
        return NULL;
    for (entry_t *e = t->ids->entries; e; e = e->next) {
        if (!e->forwarded || (e->answered && !e->resumable) || !e->assigned_len ||
            !same_session(e->session, t->session) ||
            !rpc_id_same(id, len, e->assigned, e->assigned_len))
            continue;
        if (response)
            e->answered = true; /* forgotten once its exchange (if any still runs) ends */
        return e->caller_text;
    }
    return NULL;
}

static bool session_waits(const call_ids_t *ids, const char *session)
{
    for (const entry_t *e = ids->entries; e; e = e->next)
        if (e->forwarded && !e->answered && same_session(e->session, session))
            return true;
    return false;
}

static bool tap_head(void *arg, int status, const http_headers_t *in, const http_headers_t **out)
{
    tap_t *t = arg;
    if (status != 200 || !is_sse(in))
        return true;
    /* a compressed stream is decoded to be read only when a call of the session waits for its
     * answer now; one opened before is left as it came (its answer would reach the agent with
     * the assigned id: a known gap, compressed GET streams are rare) */
    decode_coding_t coding = decode_coding_parse(http_headers_get(in, "content-encoding"));
    if (coding == DECODE_CODING_UNSUPPORTED ||
        (coding != DECODE_CODING_IDENTITY && !session_waits(t->ids, t->session)))
        return true;
    t->rw = rpc_id_rewriter_new(RPC_BODY_SSE, coding, CALL_IDS_MAX_ANSWER, tap_lookup, t, false);
    copy_head(&t->headers, in);
    *out = &t->headers;
    return true;
}

static bool tap_body(void *arg, const char *data, size_t len, struct evbuffer *out)
{
    tap_t *t = arg;
    return pass_bytes(t->rw, data, len, out);
}

static bool tap_end(void *arg, bool complete, struct evbuffer *out)
{
    tap_t *t = arg;
    return pass_end(t->rw, complete, out);
}

static void tap_detach(void *arg)
{
    tap_t *t = arg;
    expire(t->ids); /* the calls it answered */
    rpc_id_rewriter_free(t->rw);
    http_headers_free(&t->headers);
    free(t->session);
    free(t);
}

static const response_filter_t tap_filter = {
    .on_head = tap_head,
    .on_body = tap_body,
    .on_end = tap_end,
    .detach = tap_detach,
};

/* --- the handler --- */

static const char *session_of(const exchange_t *ex)
{
    return http_headers_get(&exchange_request(ex)->headers, "mcp-session-id");
}

static void offer_call(call_ids_t *ids, exchange_t *ex, const mcp_msg_t *m)
{
    entry_t *e = xcalloc(1, sizeof(*e));
    e->ids = ids;
    e->req = exchange_request(ex);
    e->live = true;
    e->caller_text = xstrdup(m->id_text);
    e->caller_id = json_incref(m->id);
    const char *session = session_of(ex);
    e->session = session ? xstrdup(session) : NULL;
    http_headers_init(&e->headers);
    e->next = ids->entries;
    if (ids->entries)
        ids->entries->prev = e;
    ids->entries = e;
    ids->n++;
    exchange_set_filter(ex, &call_filter, e);
}

/* Whether the cancel comes from the call's caller. While the call's exchange runs, its request
 * and the cancel's are compared (subject_same_caller): a session id alone is no proof, another
 * caller may know it. A call waiting for its answer on a GET stream (its exchange over) has
 * only its session, which the cancel shares. */
static bool cancel_names(const call_ids_t *ids, const entry_t *e, const http_request_t *note,
                         const char *session, const json_t *request_id)
{
    if (e->answered || !same_session(e->session, session) || !json_equal(e->caller_id, request_id))
        return false;
    if (!e->live)
        return e->session != NULL;
    return subject_same_caller(ids->ctx.subject, e->req, note);
}

/* A cancel names a call by the caller's id; the server knows it by the id it went up with.
 * Only a call of the cancel's own caller is looked for: a cancel is never rewritten to name
 * another caller's request. */
static handler_verdict_t offer_cancel(call_ids_t *ids, exchange_t *ex, const json_t *request_id)
{
    const char *session = session_of(ex);
    const http_request_t *note = exchange_request(ex);
    for (entry_t *e = ids->entries; e; e = e->next) {
        if (!cancel_names(ids, e, note, session, request_id))
            continue;
        if (!e->forwarded || !e->assigned_len)
            return HANDLER_PASS; /* not sent yet: the idempotency stage decides (cancel.h) */
        struct evbuffer *buf = note->body;
        size_t len = evbuffer_get_length(buf), out_len = 0;
        char *body = rpc_id_set_cancel_id((const char *)evbuffer_pullup(buf, -1), len, e->assigned,
                                          &out_len);
        if (body)
            exchange_replace_body(ex, body, out_len);
        free(body);
        return HANDLER_PASS;
    }
    if (session || !ids->ctx.every_request)
        return HANDLER_PASS; /* the server knows a session's requests by their assigned ids */
    /* Without a session, and every request with an id sent up with an assigned one: the id
     * names no request of this caller at the server, and may name one another caller's
     * request went up with (one sent alone with its own id). Nothing to cancel: a notification
     * gets no answer, its POST gets 202. */
    exchange_set_outcome(ex, "cancel_unmatched");
    exchange_respond_json(ex, 202, "", NULL);
    return HANDLER_TAKEN;
}

/* Every GET stream of a session is read: a call whose POST stream ends before its answer may
 * be answered on a stream the agent opened before it (its events are scanned, and parsed only
 * when they hold an assigned id, rpc_id_map_message). */
static void offer_stream(call_ids_t *ids, exchange_t *ex)
{
    const char *session = session_of(ex);
    if (!session)
        return;
    tap_t *t = xcalloc(1, sizeof(*t));
    t->ids = ids;
    t->session = xstrdup(session);
    http_headers_init(&t->headers);
    exchange_set_filter(ex, &tap_filter, t);
}

handler_verdict_t call_ids_offer(void *arg, exchange_t *ex)
{
    call_ids_t *ids = arg;
    expire(ids);
    const http_request_t *req = exchange_request(ex);
    const mcp_msg_t *m = exchange_msg(ex);
    if (req->method == HTTP_GET) {
        offer_stream(ids, ex);
        return HANDLER_PASS;
    }
    if (!m)
        return HANDLER_PASS;
    bool is_protected = m->tool && exchange_tool_class(ex) == TOOL_CLASS_NON_IDEMPOTENT;
    if (m->kind == MCP_KIND_REQUEST && m->id_text && m->id &&
        (is_protected || ids->ctx.every_request))
        offer_call(ids, ex, m);
    else if (exchange_cancel_id(ex))
        return offer_cancel(ids, ex, exchange_cancel_id(ex));
    else if (ids->ctx.every_request && (m->kind == MCP_KIND_BATCH || m->kind == MCP_KIND_OTHER))
        /* a batch's answer holds many ids, to map one by one: batches are rare (no revision
         * since 2025-03-26 has them), so they go alone rather than through a second mapper;
         * and an object that is no JSON-RPC request has no id to tell its answer by */
        exchange_upstream_alone(ex);
    return HANDLER_PASS;
}
