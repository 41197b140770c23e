#include "proxy.h"
#include "handoff.h"
#include "config.h"
#include "idem.h"
#include "log.h"
#include "policy.h"
#include "server.h"
#include "util.h"

#include <event2/buffer.h>
#include <llhttp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* A dropped POST stream can be resumed from the gateway while it holds the upstream open; past
 * this many bytes the gateway stops keeping it and a resume goes to the upstream. */
#define RESUME_LOG_MAX (1024 * 1024)

typedef struct sse_mark {
    char *id;
    size_t end; /* offset in the stream just past the event */
} sse_mark_t;

/* POST streams kept for resumption (the agent may still be on them, or gone). */
static exchange_t *tracked_head;
/* GET streams in flight. */
static exchange_t *get_head;

static void get_list_remove(exchange_t *ex)
{
    if (!ex->in_get_list)
        return;
    if (ex->prev_get)
        ex->prev_get->next_get = ex->next_get;
    else
        get_head = ex->next_get;
    if (ex->next_get)
        ex->next_get->prev_get = ex->prev_get;
    ex->in_get_list = false;
}

/* Above this much unsent output to the agent, reading from the upstream pauses. */
#define CLIENT_HIGH_WATERMARK (256 * 1024)

static void on_up_head(void *arg, int status, const http_headers_t *headers);
static void on_up_body(void *arg, const char *data, size_t len);
static void on_up_end(void *arg, upstream_result_t res);
static const upstream_cbs_t up_cbs = {on_up_head, on_up_body, on_up_end};
static void respond_error(exchange_t *ex, int status, int code, const char *message,
                          const char *extra);

static void log_exchange(exchange_t *ex)
{
    if (LOG_INFO < log_threshold)
        return;
    char fields[1024], method[96] = "null", tool[300] = "null", outcome[64], target[300];
    if (ex->has_msg && ex->msg.method)
        log_json_string(method, sizeof(method), ex->msg.method);
    if (ex->has_msg && ex->msg.tool)
        log_json_string(tool, sizeof(tool), ex->msg.tool);
    log_json_string(outcome, sizeof(outcome), ex->outcome ? ex->outcome : "forwarded");
    log_json_string(target, sizeof(target), ex->req->target);
    const char *id =
        ex->has_msg && ex->msg.id_text && strlen(ex->msg.id_text) < 100 ? ex->msg.id_text : "null";
    char extra[400] = "";
    if (ex->extra_log)
        snprintf(extra, sizeof(extra), ",%s", ex->extra_log);
    snprintf(fields, sizeof(fields),
             "\"http_method\":\"%s\",\"path\":%s,\"rpc_method\":%s,\"rpc_id\":%s,\"tool\":%s,"
             "\"status\":%d,\"outcome\":%s,\"duration_ms\":%llu%s",
             ex->req->method_name, target, method, id, tool, ex->status, outcome,
             (unsigned long long)(util_now_ms() - ex->start_ms), extra);
    log_emit(LOG_INFO, ex->conn_id, fields, "request");
}

void proxy_session_maybe_idle(const char *session)
{
    if (!session || server->n_workers < 2)
        return;
    for (exchange_t *o = tracked_head; o; o = o->next_tracked) {
        const char *s2 = http_headers_get(&o->req->headers, "mcp-session-id");
        if (s2 && strcmp(s2, session) == 0)
            return;
    }
    if (!idem_has_pending(session))
        handoff_note_stream(session, false);
}

static void stop_tracking(exchange_t *ex)
{
    if (!ex->sse_tracking)
        return;
    exchange_t **pp = &tracked_head;
    while (*pp != ex)
        pp = &(*pp)->next_tracked;
    *pp = ex->next_tracked;
    ex->sse_tracking = false;
    proxy_session_maybe_idle(http_headers_get(&ex->req->headers, "mcp-session-id"));
    evbuffer_free(ex->sse_log);
    ex->sse_log = NULL;
    sse_free(&ex->sse_ids);
    for (size_t i = 0; i < ex->n_marks; i++)
        free(ex->marks[i].id);
    free(ex->marks);
    ex->marks = NULL;
    ex->n_marks = ex->cap_marks = 0;
}

static int on_stream_event(const sse_event_t *ev, void *arg)
{
    exchange_t *ex = arg;
    if (!ev->id || !*ev->id)
        return 0;
    if (ex->n_marks == ex->cap_marks) {
        ex->cap_marks = ex->cap_marks ? ex->cap_marks * 2 : 16;
        ex->marks = xrealloc(ex->marks, ex->cap_marks * sizeof(*ex->marks));
    }
    ex->marks[ex->n_marks].id = xstrdup(ev->id);
    ex->marks[ex->n_marks].end = ex->sse_total + ex->sse_ids.consumed;
    ex->n_marks++;
    return 0;
}

/* Keeps the raw stream for a possible resume; called before the bytes are passed on. */
static void track_stream(exchange_t *ex, const char *data, size_t len)
{
    if (!ex->sse_tracking)
        return;
    if (ex->sse_total + len > RESUME_LOG_MAX) {
        stop_tracking(ex);
        return;
    }
    sse_feed(&ex->sse_ids, data, len);
    evbuffer_add(ex->sse_log, data, len);
    ex->sse_total += len;
}

void proxy_maybe_free(exchange_t *ex)
{
    if (!ex->up_done || (ex->client && !ex->client_done) || idem_busy(ex))
        return;
    log_exchange(ex);
    if (ex->client)
        http_conn_set_observer(ex->client, NULL, NULL, NULL);
    stop_tracking(ex);
    get_list_remove(ex);
    if (ex->has_msg)
        mcp_msg_free(&ex->msg);
    json_decref(ex->cancel_id);
    if (ex->held)
        evbuffer_free(ex->held);
    idem_call_free(ex->call);
    http_request_free(ex->req);
    free(ex);
    server->open_exchanges--;
    server_check_drained();
}

/* Bytes for the agent: held while a store write is pending, dropped if the agent left. */
static void to_client(exchange_t *ex, const char *data, size_t len)
{
    if (ex->holding) {
        if (!ex->held)
            ex->held = evbuffer_new();
        evbuffer_add(ex->held, data, len);
        return;
    }
    if (!ex->client)
        return;
    ex->relayed = true;
    evbuffer_add(http_conn_output(ex->client), data, len);
}

static void body_to_client(exchange_t *ex, const char *data, size_t len)
{
    if (ex->chunked) {
        char hdr[24];
        int n = snprintf(hdr, sizeof(hdr), "%zx\r\n", len);
        to_client(ex, hdr, (size_t)n);
        to_client(ex, data, len);
        to_client(ex, "\r\n", 2);
    } else {
        to_client(ex, data, len);
    }
}

/* Ends the agent's response once the upstream has ended and nothing is held. */
static void complete_client(exchange_t *ex)
{
    if (ex->client_done || ex->holding || !ex->up_done || !ex->head_sent)
        return;
    ex->client_done = true;
    if (!ex->client)
        return;
    bool keep = ex->keep_alive;
    if (ex->chunked)
        evbuffer_add(http_conn_output(ex->client), "0\r\n\r\n", 5);
    else if (ex->up_result != UPSTREAM_OK)
        keep = false; /* a length-framed body was cut short: only closing tells the agent */
    http_conn_t *c = ex->client;
    http_conn_set_observer(c, NULL, NULL, NULL);
    ex->client = NULL;
    http_conn_response_done(c, keep);
}

void proxy_release_held(exchange_t *ex)
{
    ex->holding = false;
    if (ex->deferred_status) {
        int status = ex->deferred_status;
        ex->deferred_status = 0;
        if (ex->client && !ex->client_done) {
            respond_error(ex, status, -32603, ex->deferred_message, NULL);
            return;
        }
        ex->client_done = true;
        proxy_maybe_free(ex);
        return;
    }
    ex->sse_unheld = ex->sse_total;
    if (ex->held) {
        if (ex->client)
            evbuffer_add_buffer(http_conn_output(ex->client), ex->held);
        evbuffer_free(ex->held);
        ex->held = NULL;
    }
    complete_client(ex);
    proxy_maybe_free(ex);
}

void proxy_replace_answer(exchange_t *ex, const char *body)
{
    ex->holding = false;
    ex->deferred_status = 0;
    if (ex->held) {
        evbuffer_free(ex->held);
        ex->held = NULL;
    }
    if (!ex->relayed && !ex->client_done) {
        proxy_respond_json(ex, 200, body, NULL);
        return;
    }
    if (ex->client && !ex->client_done && ex->resp_sse && ex->chunked) {
        char *event = xasprintf("event: message\ndata: %s\n\n", body);
        body_to_client(ex, event, strlen(event));
        free(event);
    } else {
        ex->up_result = UPSTREAM_ERR_CLOSED; /* framing without room for it: close instead */
    }
    complete_client(ex);
    proxy_maybe_free(ex);
}

void proxy_respond_json(exchange_t *ex, int status, const char *body, const char *extra)
{
    ex->status = status;
    ex->head_sent = true;
    ex->up_done = true;
    ex->client_done = true;
    if (ex->client) {
        http_conn_t *c = ex->client;
        http_conn_set_observer(c, NULL, NULL, NULL);
        ex->client = NULL;
        http_conn_respond(c, status, "application/json", body, strlen(body), extra,
                          ex->req->keep_alive);
    }
    proxy_maybe_free(ex);
}

static void respond_error(exchange_t *ex, int status, int code, const char *message,
                          const char *extra)
{
    if (status >= 500)
        server->stats->upstream_errors++;
    else
        server->stats->bad_requests++;
    char *body = mcp_error_body(ex->has_msg ? ex->msg.id_text : NULL, code, message);
    proxy_respond_json(ex, status, body, extra);
    free(body);
}

/* --- agent side events --- */

static void on_client_drained(void *arg)
{
    exchange_t *ex = arg;
    if (ex->paused && ex->up) {
        ex->paused = false;
        upstream_pause(ex->up, false);
    }
}

static void on_client_gone(void *arg)
{
    exchange_t *ex = arg;
    ex->client = NULL;
    if (!ex->up_done && ex->up) {
        if (ex->req->method == HTTP_POST) {
            /* not a cancellation: read to the end so a protected result gets stored */
            if (ex->paused) {
                ex->paused = false;
                upstream_pause(ex->up, false);
            }
        } else {
            upstream_abandon(ex->up);
            ex->up = NULL;
            ex->up_done = true;
            ex->up_result = UPSTREAM_ERR_CLOSED;
        }
    }
    /* closing a GET stream is how an agent ends it; closing after the call's answer arrived
     * is a normal exit too. Only leaving before the answer is news. */
    if (ex->req->method == HTTP_GET) {
        if (!ex->outcome)
            ex->outcome = "closed_by_agent";
    } else if (!idem_answered(ex)) {
        log_info(ex->conn_id, "agent disconnected before its answer was complete");
        if (!ex->outcome)
            ex->outcome = "agent_gone";
    }
    proxy_maybe_free(ex);
}

/* --- upstream side events --- */

static long long header_ll(const http_headers_t *h, const char *name)
{
    const char *v = http_headers_get(h, name);
    if (!v || !*v)
        return -1;
    char *end;
    long long n = strtoll(v, &end, 10);
    return *end == '\0' && n >= 0 ? n : -1;
}

static void on_up_head(void *arg, int status, const http_headers_t *headers)
{
    exchange_t *ex = arg;
    ex->status = status;
    const char *ct = http_headers_get(headers, "content-type");
    ex->resp_sse = ct && strncasecmp(ct, "text/event-stream", 17) == 0;
    long long clen = header_ll(headers, "content-length");
    if (status == 204 || status == 304)
        clen = -2;
    else if (clen < 0 || (ex->resp_sse && ex->call && status == 200))
        clen = -1; /* chunked or close-delimited upstream, or a protected stream the gateway
                    * may have to end with an answer of its own: chunked to the agent */
    ex->chunked = clen == -1;
    ex->keep_alive = ex->req->keep_alive;
    if (ex->resp_sse && ex->chunked && ex->req->method == HTTP_POST && status == 200 &&
        http_headers_get(&ex->req->headers, "mcp-session-id")) {
        ex->sse_tracking = true;
        ex->next_tracked = tracked_head;
        tracked_head = ex;
        handoff_note_stream(http_headers_get(&ex->req->headers, "mcp-session-id"), true);
        ex->sse_log = evbuffer_new();
        sse_init(&ex->sse_ids, 64 * 1024, on_stream_event, ex);
    }
    if (ex->call)
        idem_on_head(ex, status, headers);
    struct evbuffer *head = evbuffer_new();
    const char *extra = NULL;
    http_write_response_head(head, status, headers, clen, ex->keep_alive && !server->draining,
                             extra);
    size_t n = evbuffer_get_length(head);
    to_client(ex, (const char *)evbuffer_pullup(head, -1), n);
    evbuffer_free(head);
    ex->head_sent = true;
}

static void on_up_body(void *arg, const char *data, size_t len)
{
    exchange_t *ex = arg;
    if (ex->call)
        idem_on_body(ex, data, len);
    track_stream(ex, data, len);
    body_to_client(ex, data, len);
    if (ex->resp_sse && ex->client && !ex->holding)
        http_conn_flush(ex->client);
    if (ex->sse_tracking && !ex->holding)
        ex->sse_unheld = ex->sse_total;
    if (ex->client && !ex->paused && ex->up &&
        http_conn_output_len(ex->client) > CLIENT_HIGH_WATERMARK) {
        ex->paused = true;
        upstream_pause(ex->up, true);
    }
}

static bool is_cancel(const exchange_t *ex)
{
    return ex->has_msg && ex->msg.kind == MCP_KIND_NOTIFICATION && ex->msg.method &&
           strcmp(ex->msg.method, "notifications/cancelled") == 0;
}

static void on_up_end(void *arg, upstream_result_t res)
{
    exchange_t *ex = arg;
    upstream_conn_t *up = ex->up;
    ex->up = NULL;
    ex->up_done = true;
    ex->up_result = res;
    if (res != UPSTREAM_OK && !ex->cut)
        log_warn(ex->conn_id, "upstream: %s", upstream_result_str(res));
    /* relayed once the upstream took it: a protected call it names will get no answer */
    if (res == UPSTREAM_OK && ex->status >= 200 && ex->status < 300 && is_cancel(ex))
        idem_cancel_relayed(ex);
    if (ex->call) {
        idem_on_end(ex, res);
        if (up && idem_answer_foreign(ex)) {
            log_warn(ex->conn_id, "upstream answered with another request's response: closing it");
            upstream_discard(up);
        }
    }
    if (!ex->head_sent) {
        ex->holding = false;
        if (ex->held) {
            evbuffer_free(ex->held);
            ex->held = NULL;
        }
        if (ex->client_done || !ex->client) {
            ex->client_done = true;
            proxy_maybe_free(ex);
            return;
        }
        int status = res == UPSTREAM_ERR_HEAD_TIMEOUT ? 504 : 502;
        const char *msg = res == UPSTREAM_ERR_CONNECT ? "upstream MCP server unreachable"
                          : res == UPSTREAM_ERR_HEAD_TIMEOUT
                              ? "upstream MCP server did not answer in time"
                              : "upstream MCP server failed to answer";
        if (idem_busy(ex)) {
            /* answered once the outcome is recorded (proxy_release_held) */
            ex->deferred_status = status;
            ex->deferred_message = msg;
            return;
        }
        respond_error(ex, status, -32603, msg, NULL);
        return;
    }
    complete_client(ex);
    proxy_maybe_free(ex);
}

void proxy_end_upstream(exchange_t *ex)
{
    if (ex->up_done || !ex->up)
        return;
    upstream_abandon(ex->up);
    ex->cut = true;
    on_up_end(ex, UPSTREAM_ERR_CLOSED);
}

void proxy_forward(exchange_t *ex, const char *extra_headers)
{
    const config_t *cfg = server->cfg;
    struct evbuffer *out = evbuffer_new();
    size_t blen = evbuffer_get_length(ex->req->body);
    long long body_len = ex->req->method == HTTP_POST || blen > 0 ? (long long)blen : -1;
    http_write_request_head(out, ex->req->method_name, ex->req->target, &ex->req->headers,
                            cfg->upstream_host_header, ex->req->client_ip, body_len, extra_headers);
    evbuffer_add_buffer(out, ex->req->body);
    ex->up_done = false;
    server->stats->forwarded++;
    ex->up = upstream_send(server->pool, out, ex->fresh_upstream, &up_cbs, ex);
    evbuffer_free(out);
}

/* Who is calling, as far as the gateway can tell: the configured subject header (every copy)
 * and the Authorization value, hashed so that comparing two requests leaks nothing by time. */
static void caller_digest(const http_request_t *req, unsigned char out[EVP_MAX_MD_SIZE])
{
    const config_t *cfg = server->cfg;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    /* fails only when OpenSSL cannot allocate: the out-of-memory policy applies */
    if (!md || !EVP_DigestInit_ex(md, EVP_sha256(), NULL)) {
        fprintf(stderr, "idemgw: SHA-256 failed\n");
        abort();
    }
    for (size_t i = 0; i < req->headers.n; i++) {
        const char *name = http_headers_name(&req->headers, i);
        bool subject = cfg->subject.kind == SUBJECT_HEADER && cfg->subject.value &&
                       strcasecmp(name, cfg->subject.value) == 0;
        if (!subject && strcasecmp(name, "authorization") != 0)
            continue;
        const char *v = http_headers_value(&req->headers, i);
        /* name and value with their terminating NULs: no two header lists hash alike */
        EVP_DigestUpdate(md, subject ? "s" : "a", 2);
        EVP_DigestUpdate(md, v, strlen(v) + 1);
    }
    unsigned int len = 0;
    memset(out, 0, EVP_MAX_MD_SIZE);
    EVP_DigestFinal_ex(md, out, &len);
    EVP_MD_CTX_free(md);
}

static bool same_caller(const http_request_t *a, const http_request_t *b)
{
    unsigned char da[EVP_MAX_MD_SIZE], db[EVP_MAX_MD_SIZE];
    caller_digest(a, da);
    caller_digest(b, db);
    return CRYPTO_memcmp(da, db, sizeof(da)) == 0;
}

/* A GET with Last-Event-ID for a stream the gateway still reads: the upstream would refuse a
 * second reader, so the gateway serves the resume itself, from the bytes it kept, and then
 * passes on the rest live. The agent may still look connected on the old stream (its close
 * not yet seen): resuming says it has left, so that connection is closed. */
static bool resume_stream(exchange_t *get)
{
    const char *last = http_headers_get(&get->req->headers, "last-event-id");
    const char *session = http_headers_get(&get->req->headers, "mcp-session-id");
    if (!last || !session)
        return false;
    for (exchange_t *ex = tracked_head; ex; ex = ex->next_tracked) {
        const char *s2 = http_headers_get(&ex->req->headers, "mcp-session-id");
        if (!s2 || strcmp(s2, session) != 0 || ex->client_done)
            continue;
        /* a session id and an event id are not credentials: the resume must come from the
         * caller of the stream it resumes, or it is the upstream's to judge */
        if (!same_caller(ex->req, get->req)) {
            log_info(get->conn_id, "stream resume not served from the gateway: another caller "
                                   "than the stream's");
            return false;
        }
        size_t from = SIZE_MAX;
        for (size_t i = 0; i < ex->n_marks && from == SIZE_MAX; i++)
            if (strcmp(ex->marks[i].id, last) == 0)
                from = ex->marks[i].end;
        if (from == SIZE_MAX)
            continue;
        if (ex->client) {
            http_conn_t *old = ex->client;
            http_conn_set_observer(old, NULL, NULL, NULL);
            ex->client = NULL;
            http_conn_response_done(old, false);
        }
        /* take the agent's connection over from the GET exchange */
        http_conn_t *conn = get->client;
        get->client = NULL;
        get->client_done = true;
        get->up_done = true;
        get->outcome = "resumed";
        get->status = 200;
        ex->client = conn;
        ex->client_done = false;
        ex->keep_alive = get->req->keep_alive;
        http_conn_set_observer(conn, on_client_drained, on_client_gone, ex);
        struct evbuffer *out = http_conn_output(conn);
        evbuffer_add_printf(out,
                            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                            "Cache-Control: no-cache\r\nMcp-Session-Id: %s\r\n"
                            "Transfer-Encoding: chunked\r\n%s\r\n",
                            session, ex->keep_alive ? "" : "Connection: close\r\n");
        if (ex->sse_unheld > from) {
            size_t n = ex->sse_unheld - from;
            const char *bytes = (const char *)evbuffer_pullup(ex->sse_log, -1) + from;
            evbuffer_add_printf(out, "%zx\r\n", n);
            evbuffer_add(out, bytes, n);
            evbuffer_add(out, "\r\n", 2);
        }
        log_info(get->conn_id, "stream resumed from the gateway after event %s", last);
        proxy_maybe_free(get);
        complete_client(ex);
        proxy_maybe_free(ex);
        return true;
    }
    return false;
}

/* A resume of a stream another worker reads goes to that worker, socket and all: the upstream
 * would refuse a second reader of the stream. */
static bool hand_off_resume(exchange_t *get)
{
    if (server->n_workers < 2)
        return false;
    const char *session = http_headers_get(&get->req->headers, "mcp-session-id");
    if (!session || !http_headers_get(&get->req->headers, "last-event-id"))
        return false;
    int owner = handoff_owner(session);
    if (owner < 0 || owner == server->worker || !http_conn_hand_off(get->client, get->req, owner))
        return false;
    log_info(get->conn_id, "stream resume handed to worker %d, which reads the stream", owner + 1);
    get->client = NULL;
    get->client_done = true;
    get->outcome = "handed_over";
    proxy_maybe_free(get);
    return true;
}

void proxy_drain(void)
{
    exchange_t *ex = get_head;
    while (ex) {
        exchange_t *next = ex->next_get;
        if (!ex->up_done && ex->up) {
            upstream_abandon(ex->up);
            ex->up = NULL;
            ex->up_done = true;
            ex->up_result = UPSTREAM_OK; /* a clean end of the stream for the agent */
            ex->outcome = "drained";
            if (!ex->head_sent && ex->client) {
                respond_error(ex, 503, -32000, "the gateway is shutting down", NULL);
            } else {
                complete_client(ex);
                proxy_maybe_free(ex);
            }
        }
        ex = next;
    }
}

/* --- request validation --- */

static bool path_matches(const char *target, const char *path)
{
    size_t plen = strlen(path);
    const char *q = strchr(target, '?');
    size_t tlen = q ? (size_t)(q - target) : strlen(target);
    return tlen == plen && memcmp(target, path, plen) == 0;
}

/* Checks the 2026 draft's mirrored headers against the body. */
static const char *header_mismatch(const http_request_t *req, const mcp_msg_t *m)
{
    const char *hm = http_headers_get(&req->headers, "mcp-method");
    if (hm && m->kind != MCP_KIND_BATCH && m->method && strcmp(hm, m->method) != 0)
        return "Mcp-Method header does not match the body's method";
    const char *hn = http_headers_get(&req->headers, "mcp-name");
    if (hn && m->tool && strncmp(hn, "=?base64?", 9) != 0 && strcmp(hn, m->tool) != 0)
        return "Mcp-Name header does not match the body's tool name";
    return NULL;
}

/* Headers whose copies a proxy cannot merge safely (RFC 9110 5.3): one copy checked, another
 * acted on, as Host, Origin, credentials, keys and sessions would be. */
static const char *duplicated_header(const http_headers_t *h)
{
    static const char *const once[] = {"Host", "Origin", "Authorization", "Idempotency-Key",
                                       "Mcp-Session-Id"};
    for (size_t i = 0; i < ARRAY_LEN(once); i++)
        if (http_headers_count(h, once[i]) > 1)
            return once[i];
    return NULL;
}

static const char *dup_field(exchange_t *ex, const char *name)
{
    snprintf(ex->log_detail, sizeof(ex->log_detail), "\"duplicate_header\":\"%s\"", name);
    return ex->log_detail;
}

/* A 403 for Host or Origin names the header, the value refused and the setting that would
 * allow it, in the log and in the answer. */
static void forbid(exchange_t *ex, const char *header, const char *value, const char *setting)
{
    char shown[200], val[220];
    snprintf(shown, sizeof(shown), "%s", value ? value : "");
    for (char *p = shown; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f || *p == '"' || *p == '\\')
            *p = '?';
    log_json_string(val, sizeof(val), shown);
    snprintf(ex->log_detail, sizeof(ex->log_detail),
             "\"forbidden_header\":\"%s\",\"value\":%s,\"setting\":\"%s\"", header, val, setting);
    ex->extra_log = ex->log_detail;
    char msg[400];
    snprintf(msg, sizeof(msg),
             "forbidden: %s \"%s\" is not allowed by this gateway; add it to the %s setting to "
             "allow it",
             header, value ? shown : "(missing)", setting);
    ex->outcome = "refused";
    respond_error(ex, 403, -32000, msg, NULL);
}

void proxy_handle(http_conn_t *conn, http_request_t *req)
{
    const config_t *cfg = server->cfg;
    exchange_t *ex = xcalloc(1, sizeof(*ex));
    ex->conn_id = http_conn_id(conn);
    ex->client = conn;
    ex->req = req;
    ex->up_done = true;
    ex->start_ms = req->start_ms;
    server->open_exchanges++;
    http_conn_fill_client_ip(conn, req);
    http_conn_set_observer(conn, on_client_drained, on_client_gone, ex);

    if (req->method != HTTP_POST && req->method != HTTP_GET && req->method != HTTP_DELETE) {
        ex->outcome = "refused";
        respond_error(ex, 405, -32600, "method not allowed: use POST, GET or DELETE",
                      "Allow: GET, POST, DELETE\r\n");
        return;
    }
    if (!path_matches(req->target, cfg->upstream_path)) {
        ex->outcome = "refused";
        respond_error(ex, 404, -32600, "not found: the MCP endpoint is elsewhere", NULL);
        return;
    }
    const char *dup = duplicated_header(&req->headers);
    if (dup) {
        char msg[160];
        snprintf(msg, sizeof(msg),
                 "bad request: the %s header appears more than once; send it once. Nothing was "
                 "forwarded.",
                 dup);
        ex->outcome = "refused";
        ex->extra_log = dup_field(ex, dup);
        respond_error(ex, 400, -32600, msg, NULL);
        return;
    }
    const char *host = http_headers_get(&req->headers, "host");
    const char *origin = http_headers_get(&req->headers, "origin");
    bool host_ok = config_host_allowed(cfg, host);
    if (!host_ok || !config_origin_allowed(cfg, origin)) {
        forbid(ex, host_ok ? "Origin" : "Host", host_ok ? origin : host,
               host_ok ? "allowed_origins" : "allowed_hosts");
        return;
    }
    if (req->method == HTTP_GET && (resume_stream(ex) || hand_off_resume(ex)))
        return;
    if (req->method != HTTP_POST) {
        if (req->method == HTTP_GET) {
            idem_watch_begin(ex);
            ex->in_get_list = true;
            ex->next_get = get_head;
            if (get_head)
                get_head->prev_get = ex;
            get_head = ex;
        }
        proxy_forward(ex, NULL);
        return;
    }
    size_t blen = evbuffer_get_length(req->body);
    const char *body = (const char *)evbuffer_pullup(req->body, -1);
    mcp_status_t st = mcp_parse(body ? body : "", blen, &ex->msg);
    if (st == MCP_ERR_PARSE) {
        ex->outcome = "refused";
        respond_error(ex, 400, -32700, "parse error: the body is not JSON", NULL);
        return;
    }
    if (st != MCP_OK) {
        ex->outcome = "refused";
        respond_error(ex, 400, -32600, "invalid request: expected a JSON-RPC object or array",
                      NULL);
        return;
    }
    ex->has_msg = true;
    const char *mismatch = header_mismatch(req, &ex->msg);
    if (mismatch) {
        ex->outcome = "refused";
        respond_error(ex, 400, -32020, mismatch, NULL);
        return;
    }
    if (ex->msg.kind == MCP_KIND_BATCH) {
        bool protected_inside = ex->msg.batch_bad_tool;
        for (size_t i = 0; i < ex->msg.n_batch_tools && !protected_inside; i++)
            protected_inside = policy_lookup(&cfg->policy, ex->msg.batch_tools[i])->cls ==
                               TOOL_CLASS_NON_IDEMPOTENT;
        if (protected_inside) {
            ex->outcome = "refused";
            respond_error(ex, 400, -32600,
                          "a batch may not contain a non-idempotent tools/call: send each "
                          "protected call in its own request; nothing was executed",
                          NULL);
            return;
        }
    }
    if (is_cancel(ex)) {
        /* the request id it names, kept for when the upstream has taken the cancel (the body
         * itself goes up) */
        json_t *root = json_loadb(body, blen, 0, NULL);
        ex->cancel_id = json_incref(json_object_get(json_object_get(root, "params"), "requestId"));
        json_decref(root);
    }
    if (ex->msg.kind == MCP_KIND_REQUEST && ex->msg.tool &&
        policy_lookup(&cfg->policy, ex->msg.tool)->cls == TOOL_CLASS_NON_IDEMPOTENT) {
        server->stats->protected_calls++;
        idem_begin(ex);
        return;
    }
    proxy_forward(ex, NULL);
}
