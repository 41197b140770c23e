#include "proxy.h"
#include "catalog.h"
#include "trace.h"
#include "cors.h"
#include "handoff.h"
#include "log.h"
#include "policy.h"
#include "sse.h"
#include "subject.h"
#include "upstream.h"
#include "util.h"

#include <event2/buffer.h>
#include <llhttp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* A dropped POST stream can be resumed from the gateway while it holds the upstream open; past
 * this many bytes the gateway stops keeping it and a resume goes to the upstream. */
#define RESUME_LOG_MAX (1024 * 1024)

/* Above this much unsent output to the agent, reading from the upstream pauses. */
#define CLIENT_HIGH_WATERMARK (256 * 1024)

/* An exchange's life. The upstream side drives it; the agent side is a pointer that becomes
 * NULL when the agent leaves (a POST is still read to its end, so its result is recorded).
 *
 *   CLASSIFYING --> CLAIMING --> FORWARDING --> STREAMING <--> HOLDING
 *        |             |             |              |             |
 *        |             |             +--------------+-------------+--> RECORDING
 *        +-------------+-------------+--------------+-------------+--------+--> DONE
 *
 * CLAIMING: a stage has the request and no upstream request is out. HOLDING: the stage keeps
 * back the bytes for the agent while the upstream still sends. RECORDING: the upstream has
 * ended and the stage holds the answer until its write is done. DONE frees the exchange. */
typedef enum {
    EX_CLASSIFYING = 0,
    EX_CLAIMING,
    EX_FORWARDING,
    EX_STREAMING,
    EX_HOLDING,
    EX_RECORDING,
    EX_DONE,
    EX_N_STATES
} ex_state_t;

static const char *const ex_state_names[EX_N_STATES] = {
    "classifying", "claiming", "forwarding", "streaming", "holding", "recording", "done",
};

#define TO(s) (1u << (s))
static const unsigned ex_transitions[EX_N_STATES] = {
    [EX_CLASSIFYING] = TO(EX_CLAIMING) | TO(EX_FORWARDING) | TO(EX_DONE),
    [EX_CLAIMING] = TO(EX_FORWARDING) | TO(EX_DONE),
    [EX_FORWARDING] = TO(EX_STREAMING) | TO(EX_HOLDING) | TO(EX_RECORDING) | TO(EX_DONE),
    [EX_STREAMING] = TO(EX_HOLDING) | TO(EX_RECORDING) | TO(EX_DONE),
    [EX_HOLDING] = TO(EX_STREAMING) | TO(EX_RECORDING) | TO(EX_DONE),
    [EX_RECORDING] = TO(EX_DONE),
    [EX_DONE] = 0,
};
#undef TO

typedef struct sse_mark {
    char *id;
    size_t end; /* offset in the stream just past the event */
} sse_mark_t;

struct exchange {
    proxy_t *proxy;
    ex_state_t state;
    uint64_t conn_id;    /* agent connection id, for logs */
    http_conn_t *client; /* NULL once the agent has gone or has its whole answer */
    http_request_t *req; /* owned */
    mcp_msg_t msg;       /* parsed POST body */
    bool has_msg;
    json_t *cancel_id;   /* notifications/cancelled: the requestId it names; owned */
    upstream_conn_t *up; /* while the upstream exchange runs */
    upstream_result_t up_result;
    bool cut;              /* the gateway ended the upstream exchange itself (a cancelled call) */
    bool discard_up;       /* the upstream connection must not be reused */
    bool paused;           /* upstream reading paused for backpressure */
    bool resp_sse;         /* the upstream answered text/event-stream */
    bool chunked;          /* agent response uses chunked framing */
    bool keep_alive;       /* agent connection may be reused afterwards */
    bool head_sent;        /* a response head was produced for the agent (maybe held) */
    bool relayed;          /* some bytes reached the agent's output, not held */
    bool answered;         /* the agent's response is complete (or was never to be) */
    int status;            /* response status sent (or to send) to the agent */
    struct evbuffer *held; /* bytes kept back while a stage holds */
    int deferred_status;   /* an error answer waiting for the hold to end */
    const char *deferred_message;
    const response_observer_t *obs; /* the stage watching the response, or NULL */
    void *obs_arg;
    /* resumption: the raw SSE bytes of a POST stream and where each event id ends in them,
     * so an agent that drops the stream can pick it up again with GET + Last-Event-ID while
     * the gateway still holds the upstream stream open */
    struct evbuffer *sse_log;
    sse_parser_t sse_ids;
    sse_mark_t *marks; /* event id -> end offset in sse_log */
    size_t n_marks, cap_marks;
    size_t sse_total;  /* bytes appended to sse_log */
    size_t sse_unheld; /* of those, bytes already passed on (not held back) */
    bool sse_tracking; /* off once the stream outgrows the resumption limit */
    exchange_t *next_tracked;
    exchange_t *next_get, *prev_get; /* GET streams, ended by a drain */
    bool in_get_list;
    const char *outcome; /* for the log line: "forwarded", "replay", ... */
    char *log_fields;    /* extra JSON members for the log line */
    uint64_t start_ms;
    uint64_t forward_ms; /* when the request went upstream (0: it did not) */
    /* tracing: the agent's request (SERVER) and the call to the upstream (CLIENT) */
    span_ctx_t span, client_span;
    uint8_t parent_span_id[8]; /* the agent's span, from its traceparent */
    bool has_parent, traced;
    uint64_t start_ns, forward_ns;
};

struct proxy {
    proxy_ctx_t ctx;
    proxy_stage_t stage;
    exchange_t *tracked; /* POST streams kept for resumption (the agent on them or gone) */
    exchange_t *gets;    /* GET streams in flight */
    uint64_t open;       /* exchanges in flight */
    cors_table_t cors;   /* the upstream's CORS answers, mirrored on the gateway's own */
};

static void on_up_head(void *arg, int status, const http_headers_t *headers);
static void on_up_body(void *arg, const char *data, size_t len);
static void on_up_end(void *arg, upstream_result_t res);
static const upstream_cbs_t up_cbs = {on_up_head, on_up_body, on_up_end};
static void exchange_free(exchange_t *ex);

/* --- the state machine --- */

static void set_state(exchange_t *ex, ex_state_t to)
{
    if (!(ex_transitions[ex->state] & (1u << to))) {
        /* a broken invariant: going on could answer an agent twice or free in use */
        log_error(ex->conn_id, "exchange: no transition from %s to %s", ex_state_names[ex->state],
                  ex_state_names[to]);
        abort();
    }
    ex->state = to;
    if (to == EX_DONE)
        exchange_free(ex);
}

static bool upstream_running(const exchange_t *ex)
{
    return ex->state == EX_FORWARDING || ex->state == EX_STREAMING || ex->state == EX_HOLDING;
}

static bool holding(const exchange_t *ex)
{
    return ex->state == EX_HOLDING || ex->state == EX_RECORDING;
}

/* --- logging --- */

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
    snprintf(fields, sizeof(fields),
             "\"http_method\":\"%s\",\"path\":%s,\"rpc_method\":%s,\"rpc_id\":%s,\"tool\":%s,"
             "\"status\":%d,\"outcome\":%s,\"duration_ms\":%llu%s%s",
             ex->req->method_name, target, method, id, tool, ex->status, outcome,
             (unsigned long long)(util_now_ms() - ex->start_ms), ex->log_fields ? "," : "",
             ex->log_fields ? ex->log_fields : "");
    log_emit(LOG_INFO, ex->conn_id, fields, "request");
}

void exchange_set_outcome(exchange_t *ex, const char *outcome)
{
    ex->outcome = outcome;
}

void exchange_set_log_fields(exchange_t *ex, const char *fields)
{
    free(ex->log_fields);
    ex->log_fields = fields ? xstrdup(fields) : NULL;
}

/* --- accessors --- */

const http_request_t *exchange_request(const exchange_t *ex)
{
    return ex->req;
}

const mcp_msg_t *exchange_msg(const exchange_t *ex)
{
    return ex->has_msg ? &ex->msg : NULL;
}

uint64_t exchange_conn_id(const exchange_t *ex)
{
    return ex->conn_id;
}

bool exchange_agent_waiting(const exchange_t *ex)
{
    return ex->client && !ex->answered;
}

void exchange_set_observer(exchange_t *ex, const response_observer_t *ops, void *arg)
{
    ex->obs = ops;
    ex->obs_arg = arg;
}

void exchange_drop_request_header(exchange_t *ex, const char *name)
{
    http_headers_remove(&ex->req->headers, name);
}

void exchange_replace_body(exchange_t *ex, const char *body, size_t len)
{
    evbuffer_drain(ex->req->body, evbuffer_get_length(ex->req->body));
    evbuffer_add(ex->req->body, body, len);
}

/* --- streams kept for resumption --- */

static const char *session_of(const exchange_t *ex)
{
    return http_headers_get(&ex->req->headers, "mcp-session-id");
}

void proxy_session_maybe_idle(proxy_t *p, const char *session)
{
    if (!session || p->ctx.n_workers < 2)
        return;
    for (exchange_t *o = p->tracked; o; o = o->next_tracked) {
        const char *s2 = session_of(o);
        if (s2 && strcmp(s2, session) == 0)
            return;
    }
    if (!p->stage.session_busy || !p->stage.session_busy(p->stage.arg, session))
        handoff_note_stream(session, false);
}

static void stop_tracking(exchange_t *ex)
{
    if (!ex->sse_tracking)
        return;
    exchange_t **pp = &ex->proxy->tracked;
    while (*pp != ex)
        pp = &(*pp)->next_tracked;
    *pp = ex->next_tracked;
    ex->sse_tracking = false;
    proxy_session_maybe_idle(ex->proxy, session_of(ex));
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

static void start_tracking(exchange_t *ex)
{
    proxy_t *p = ex->proxy;
    ex->sse_tracking = true;
    ex->next_tracked = p->tracked;
    p->tracked = ex;
    handoff_note_stream(session_of(ex), true);
    ex->sse_log = evbuffer_new();
    sse_init(&ex->sse_ids, 64 * 1024, on_stream_event, ex);
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

static void get_list_add(exchange_t *ex)
{
    proxy_t *p = ex->proxy;
    ex->in_get_list = true;
    ex->prev_get = NULL;
    ex->next_get = p->gets;
    if (p->gets)
        p->gets->prev_get = ex;
    p->gets = ex;
}

static void get_list_remove(exchange_t *ex)
{
    if (!ex->in_get_list)
        return;
    if (ex->prev_get)
        ex->prev_get->next_get = ex->next_get;
    else
        ex->proxy->gets = ex->next_get;
    if (ex->next_get)
        ex->next_get->prev_get = ex->prev_get;
    ex->in_get_list = false;
}

/* --- the agent's side --- */

/* --- tracing --- */

/* The agent's traceparent: the header, else params._meta.traceparent of the body. */
static void trace_start(exchange_t *ex)
{
    span_ctx_t parent;
    const char *tp = http_headers_get(&ex->req->headers, "traceparent");
    ex->has_parent = trace_parse_parent(tp, &parent);
    ex->traced = true;
    ex->start_ns = trace_now_ns();
    trace_new_span(ex->proxy->ctx.tracer, &ex->span, ex->has_parent ? &parent : NULL);
    if (!ex->has_parent)
        ex->span.sampled = tracer_sampled(ex->proxy->ctx.tracer, ex->span.trace_id);
    if (ex->has_parent)
        memcpy(ex->parent_span_id, parent.span_id, sizeof(ex->parent_span_id));
}

static void trace_adopt_meta(exchange_t *ex, const char *body, size_t len)
{
    size_t po, pl, mo, ml, to, tl;
    span_ctx_t parent;
    if (ex->has_parent || !mcp_member_span(body, len, "params", &po, &pl) ||
        !mcp_member_span(body + po, pl, "_meta", &mo, &ml) ||
        !mcp_member_span(body + po + mo, ml, "traceparent", &to, &tl) || tl < 2)
        return;
    char value[80];
    snprintf(value, sizeof(value), "%.*s", (int)(tl - 2), body + po + mo + to + 1);
    if (!trace_parse_parent(value, &parent))
        return;
    ex->has_parent = true;
    memcpy(ex->parent_span_id, parent.span_id, sizeof(ex->parent_span_id));
    trace_new_span(ex->proxy->ctx.tracer, &ex->span, &parent);
}

/* One member of the log fields ("\"key_hash\":\"...\"" ...), unquoted, into out; NULL if absent. */
static const char *log_field(const exchange_t *ex, const char *name, char *out, size_t outlen)
{
    if (!ex->log_fields)
        return NULL;
    char *obj = xasprintf("{%s}", ex->log_fields);
    size_t off, len;
    const char *r = NULL;
    if (mcp_member_span(obj, strlen(obj), name, &off, &len) && len >= 2 && obj[off] == '"') {
        snprintf(out, outlen, "%.*s", (int)(len - 2), obj + off + 1);
        r = out;
    }
    free(obj);
    return r;
}

static void trace_record(exchange_t *ex, int kind)
{
    if (!(kind == SPAN_SERVER ? ex->span : ex->client_span).sampled)
        return; /* not exported: its attributes are not worth collecting */
    const char *method = ex->has_msg && ex->msg.method ? ex->msg.method : ex->req->method_name;
    const char *tool = ex->has_msg ? ex->msg.tool : NULL;
    char name[300], status[8], key_hash[80], source[40], code[40], id[80];
    snprintf(name, sizeof(name), "%s%s%s", method, tool ? " " : "", tool ? tool : "");
    snprintf(status, sizeof(status), "%d", ex->status);
    const char *rpc_id = NULL;
    if (ex->has_msg && ex->msg.id_text) {
        const char *t = ex->msg.id_text;
        size_t n = strlen(t);
        snprintf(id, sizeof(id), "%.*s", (int)(t[0] == '"' && n >= 2 ? n - 2 : n),
                 t[0] == '"' && n >= 2 ? t + 1 : t);
        rpc_id = id;
    }
    span_attr_t attrs[] = {
        {"mcp.method.name", ex->has_msg ? ex->msg.method : NULL},
        {"mcp.session.id", http_headers_get(&ex->req->headers, "mcp-session-id")},
        {"mcp.protocol.version", http_headers_get(&ex->req->headers, "mcp-protocol-version")},
        {"gen_ai.tool.name", tool},
        {"jsonrpc.request.id", rpc_id},
        {"network.transport", "tcp"},
        {"http.response.status_code", ex->status ? status : NULL},
        {"idemgw.outcome", kind == SPAN_SERVER ? (ex->outcome ? ex->outcome : "forwarded") : NULL},
        {"idemgw.class", kind == SPAN_SERVER && tool && ex->proxy->ctx.catalog
                             ? tool_class_name(catalog_classify(ex->proxy->ctx.catalog, tool, NULL))
                             : NULL},
        {"idemgw.key_hash", kind == SPAN_SERVER ? log_field(ex, "key_hash", key_hash, sizeof(key_hash)) : NULL},
        {"idemgw.duplicate_source",
         kind == SPAN_SERVER ? log_field(ex, "duplicate_source", source, sizeof(source)) : NULL},
        {"idemgw.code", kind == SPAN_SERVER ? log_field(ex, "code", code, sizeof(code)) : NULL},
    };
    span_t s = {
        .name = name,
        .kind = kind,
        .ctx = kind == SPAN_SERVER ? ex->span : ex->client_span,
        .parent_span_id = kind == SPAN_SERVER ? (ex->has_parent ? ex->parent_span_id : NULL)
                                              : ex->span.span_id,
        .start_ns = kind == SPAN_SERVER ? ex->start_ns : ex->forward_ns,
        .end_ns = trace_now_ns(),
        .attrs = attrs,
        .n_attrs = ARRAY_LEN(attrs),
        .error = kind == SPAN_SERVER ? ex->status >= 500 : ex->up_result != UPSTREAM_OK,
    };
    tracer_record(ex->proxy->ctx.tracer, &s);
}

/* A tools/call, by tool, class and outcome, for /metrics. */
static void count_tool_call(const exchange_t *ex)
{
    const proxy_t *p = ex->proxy;
    if (!ex->has_msg || ex->msg.kind != MCP_KIND_REQUEST || !ex->msg.tool || !p->ctx.catalog)
        return;
    const char *tool = ex->msg.tool;
    stats_tool_t *t = stats_tool(p->ctx.stats, tool, catalog_known(p->ctx.catalog, tool));
    t->cls = (uint32_t)catalog_classify(p->ctx.catalog, tool, NULL);
    stats_outcome_t o = stats_outcome_of(ex->outcome ? ex->outcome : "forwarded");
    t->calls[o]++;
}

static void exchange_free(exchange_t *ex)
{
    proxy_t *p = ex->proxy;
    log_exchange(ex);
    if (ex->traced)
        trace_record(ex, SPAN_SERVER);
    stats_observe_request(p->ctx.stats, ex->outcome ? ex->outcome : "forwarded",
                          util_now_ms() - ex->start_ms);
    count_tool_call(ex);
    if (ex->obs && ex->obs->detach)
        ex->obs->detach(ex->obs_arg);
    if (ex->client)
        http_conn_set_observer(ex->client, NULL, NULL, NULL);
    stop_tracking(ex);
    get_list_remove(ex);
    if (ex->has_msg)
        mcp_msg_free(&ex->msg);
    json_decref(ex->cancel_id);
    if (ex->held)
        evbuffer_free(ex->held);
    free(ex->log_fields);
    http_request_free(ex->req);
    free(ex);
    p->open--;
    if (p->ctx.exchange_ended)
        p->ctx.exchange_ended(p->ctx.arg);
}

/* Bytes for the agent: held while a stage holds, dropped if the agent left. */
static void to_client(exchange_t *ex, const char *data, size_t len)
{
    if (holding(ex)) {
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

/* The agent's response is complete: the connection goes back to its keep-alive loop. */
static void finish_client(exchange_t *ex, bool keep)
{
    ex->answered = true;
    if (!ex->client)
        return;
    http_conn_t *c = ex->client;
    http_conn_set_observer(c, NULL, NULL, NULL);
    ex->client = NULL;
    http_conn_response_done(c, keep);
}

/* Ends the agent's relayed response after the upstream's end. */
static void complete_client(exchange_t *ex)
{
    if (ex->answered || !ex->head_sent)
        return;
    bool keep = ex->keep_alive;
    if (ex->client && ex->chunked)
        evbuffer_add(http_conn_output(ex->client), "0\r\n\r\n", 5);
    else if (ex->up_result != UPSTREAM_OK)
        keep = false; /* a length-framed body was cut short: only closing tells the agent */
    finish_client(ex, keep);
}

static const char *origin_of(const exchange_t *ex)
{
    return http_headers_get(&ex->req->headers, "origin");
}

/* CORS lines for an answer the gateway writes itself, or NULL. */
static char *own_cors_headers(const exchange_t *ex)
{
    if (ex->proxy->ctx.cfg->cors == CORS_OFF)
        return NULL;
    return cors_headers(&ex->proxy->cors, origin_of(ex));
}

void exchange_respond_json(exchange_t *ex, int status, const char *body, const char *extra)
{
    ex->status = status;
    ex->head_sent = true;
    ex->answered = true;
    if (ex->client) {
        http_conn_t *c = ex->client;
        http_conn_set_observer(c, NULL, NULL, NULL);
        ex->client = NULL;
        char *cors = own_cors_headers(ex);
        char *all = cors ? xasprintf("%s%s", extra ? extra : "", cors) : NULL;
        http_conn_respond(c, status, "application/json", body, strlen(body), all ? all : extra,
                          ex->req->keep_alive);
        free(all);
        free(cors);
    }
    if (ex->up) {
        /* a drain ends a GET stream that had no head yet */
        upstream_abandon(ex->up);
        ex->up = NULL;
    }
    set_state(ex, EX_DONE);
}

static void respond_error(exchange_t *ex, int status, int code, const char *message,
                          const char *extra)
{
    if (status >= 500)
        ex->proxy->ctx.stats->upstream_errors++;
    else
        ex->proxy->ctx.stats->bad_requests++;
    char *body = mcp_error_body(ex->has_msg ? ex->msg.id_text : NULL, code, message);
    exchange_respond_json(ex, status, body, extra);
    free(body);
}

void exchange_end(exchange_t *ex)
{
    ex->answered = true;
    set_state(ex, EX_DONE);
}

/* After the upstream's end with nothing held: the agent gets the rest, the exchange ends. */
static void conclude(exchange_t *ex)
{
    if (ex->deferred_status && !ex->answered && ex->client) {
        respond_error(ex, ex->deferred_status, -32603, ex->deferred_message, NULL);
        return;
    }
    if (!ex->head_sent)
        ex->answered = true;
    complete_client(ex);
    set_state(ex, EX_DONE);
}

void exchange_release(exchange_t *ex)
{
    if (!holding(ex))
        return;
    ex->sse_unheld = ex->sse_total;
    if (ex->held) {
        if (ex->client && !ex->deferred_status) {
            evbuffer_add_buffer(http_conn_output(ex->client), ex->held);
            ex->relayed = true;
        }
        evbuffer_free(ex->held);
        ex->held = NULL;
    }
    if (ex->state == EX_HOLDING)
        set_state(ex, EX_STREAMING);
    else
        conclude(ex);
}

void exchange_replace_answer(exchange_t *ex, const char *body)
{
    if (ex->held) {
        evbuffer_free(ex->held);
        ex->held = NULL;
    }
    ex->deferred_status = 0;
    if (!ex->relayed && !ex->answered) {
        exchange_respond_json(ex, 200, body, NULL);
        return;
    }
    if (ex->client && !ex->answered && ex->resp_sse && ex->chunked) {
        char *event = xasprintf("event: message\ndata: %s\n\n", body);
        struct evbuffer *out = http_conn_output(ex->client);
        evbuffer_add_printf(out, "%zx\r\n", strlen(event));
        evbuffer_add(out, event, strlen(event));
        evbuffer_add(out, "\r\n", 2);
        free(event);
    } else {
        ex->up_result = UPSTREAM_ERR_CLOSED; /* framing without room for it: close instead */
    }
    if (ex->state == EX_HOLDING)
        set_state(ex, EX_STREAMING);
    else if (ex->state == EX_RECORDING)
        conclude(ex);
}

void exchange_answer_early(exchange_t *ex, const char *body)
{
    http_conn_t *c = ex->client;
    if (!c || ex->answered)
        return;
    if (ex->held) {
        evbuffer_free(ex->held); /* what the agent has not seen it never will */
        ex->held = NULL;
    }
    ex->answered = true;
    if (!ex->relayed) {
        http_conn_set_observer(c, NULL, NULL, NULL);
        ex->client = NULL;
        char *cors = own_cors_headers(ex);
        http_conn_respond(c, 200, "application/json", body, strlen(body), cors,
                          ex->req->keep_alive);
        free(cors);
        return;
    }
    bool keep = false;
    if (ex->resp_sse && ex->chunked) {
        char *event = xasprintf("event: message\ndata: %s\n\n", body);
        struct evbuffer *out = http_conn_output(c);
        evbuffer_add_printf(out, "%zx\r\n%s\r\n0\r\n\r\n", strlen(event), event);
        free(event);
        keep = ex->keep_alive;
    } /* else a length-framed body was partly relayed: only closing ends it */
    finish_client(ex, keep);
}

static void on_client_drained(void *arg)
{
    exchange_t *ex = arg;
    if (ex->paused && ex->up) {
        ex->paused = false;
        upstream_pause(ex->up, false);
    }
}

static bool answer_seen(const exchange_t *ex)
{
    return ex->obs && ex->obs->answer_seen && ex->obs->answer_seen(ex->obs_arg) && !holding(ex);
}

static void on_client_gone(void *arg)
{
    exchange_t *ex = arg;
    ex->client = NULL;
    /* closing a GET stream is how an agent ends it; closing after the call's answer arrived
     * is a normal exit too. Only leaving before the answer is news. */
    if (ex->req->method == HTTP_GET) {
        if (!ex->outcome)
            ex->outcome = "closed_by_agent";
    } else if (!answer_seen(ex)) {
        log_info(ex->conn_id, "agent disconnected before its answer was complete");
        if (!ex->outcome)
            ex->outcome = "agent_gone";
    }
    if (!upstream_running(ex))
        return; /* a stage has it: it sees the agent gone at its next step */
    if (ex->req->method == HTTP_POST) {
        /* not a cancellation: read to the end so a protected result gets stored */
        if (ex->paused && ex->up) {
            ex->paused = false;
            upstream_pause(ex->up, false);
        }
        return;
    }
    if (ex->up) {
        upstream_abandon(ex->up);
        ex->up = NULL;
    }
    ex->answered = true;
    set_state(ex, EX_DONE);
}

/* --- the upstream's side --- */

static long long header_ll(const http_headers_t *h, const char *name)
{
    const char *v = http_headers_get(h, name);
    if (!v || !*v)
        return -1;
    char *end;
    long long n = strtoll(v, &end, 10);
    return *end == '\0' && n >= 0 ? n : -1;
}

static void observe(exchange_t *ex, observe_t verdict)
{
    if (verdict == OBSERVE_HOLD && ex->state == EX_STREAMING)
        set_state(ex, EX_HOLDING);
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
    else if (ex->req->method == HTTP_HEAD)
        clen = clen >= 0 ? clen : -2; /* no body follows, whatever the head says */
    else if (clen < 0 || (ex->resp_sse && ex->obs && status == 200))
        clen = -1; /* chunked or close-delimited upstream, or a watched stream the gateway
                    * may have to end with an answer of its own: chunked to the agent */
    ex->chunked = clen == -1;
    ex->keep_alive = ex->req->keep_alive;
    if (ex->resp_sse && ex->chunked && ex->req->method == HTTP_POST && status == 200 &&
        session_of(ex))
        start_tracking(ex);
    set_state(ex, EX_STREAMING);
    if (ex->obs && ex->obs->on_head)
        observe(ex, ex->obs->on_head(ex->obs_arg, status, headers, ex->resp_sse));
    cors_learn(&ex->proxy->cors, origin_of(ex), headers);
    char *extra = NULL;
    if (ex->req->method == HTTP_OPTIONS)
        extra = cors_preflight_extra(
            http_headers_get(&ex->req->headers, "access-control-request-headers"), headers);
    struct evbuffer *head = evbuffer_new();
    bool draining = ex->proxy->ctx.draining && *ex->proxy->ctx.draining;
    http_write_response_head(head, status, NULL, headers, clen, ex->keep_alive && !draining, extra);
    free(extra);
    size_t n = evbuffer_get_length(head);
    to_client(ex, (const char *)evbuffer_pullup(head, -1), n);
    evbuffer_free(head);
    ex->head_sent = true;
}

static void on_up_body(void *arg, const char *data, size_t len)
{
    exchange_t *ex = arg;
    if (ex->obs && ex->obs->on_body)
        observe(ex, ex->obs->on_body(ex->obs_arg, data, len));
    track_stream(ex, data, len);
    body_to_client(ex, data, len);
    bool held = holding(ex);
    if (ex->resp_sse && ex->client && !held)
        http_conn_flush(ex->client);
    if (ex->sse_tracking && !held)
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
    proxy_t *p = ex->proxy;
    upstream_conn_t *up = ex->up;
    ex->up = NULL;
    ex->up_result = res;
    if (ex->forward_ms)
        stats_observe_upstream(p->ctx.stats, util_now_ms() - ex->forward_ms);
    if (ex->traced && ex->forward_ns)
        trace_record(ex, SPAN_CLIENT);
    if (res != UPSTREAM_OK && !ex->cut)
        log_warn(ex->conn_id, "upstream: %s", upstream_result_str(res));
    /* relayed once the upstream took it: a protected call it names will get no answer */
    if (res == UPSTREAM_OK && ex->status >= 200 && ex->status < 300 && is_cancel(ex) &&
        p->stage.cancelled)
        p->stage.cancelled(p->stage.arg, ex->req, session_of(ex), ex->cancel_id);
    bool hold = holding(ex);
    if (ex->obs && ex->obs->on_end && ex->obs->on_end(ex->obs_arg, res) == OBSERVE_HOLD)
        hold = true;
    if (up && ex->discard_up) {
        log_warn(ex->conn_id, "upstream answered with another request's response: closing it");
        upstream_discard(up);
    }
    if (!ex->head_sent) {
        if (ex->held) {
            evbuffer_free(ex->held);
            ex->held = NULL;
        }
        if (ex->client && !ex->answered) {
            ex->deferred_status = res == UPSTREAM_ERR_HEAD_TIMEOUT ? 504 : 502;
            ex->deferred_message = res == UPSTREAM_ERR_CONNECT ? "upstream MCP server unreachable"
                                   : res == UPSTREAM_ERR_HEAD_TIMEOUT
                                       ? "upstream MCP server did not answer in time"
                                       : "upstream MCP server failed to answer";
        }
    }
    if (hold) {
        /* answered once the stage's write is done (exchange_release) */
        set_state(ex, EX_RECORDING);
        return;
    }
    conclude(ex);
}

void exchange_end_upstream(exchange_t *ex)
{
    if (!ex->up)
        return;
    upstream_abandon(ex->up);
    ex->cut = true;
    on_up_end(ex, UPSTREAM_ERR_CLOSED);
}

void exchange_discard_upstream(exchange_t *ex)
{
    ex->discard_up = true;
}

void exchange_forward(exchange_t *ex, const char *extra_headers, bool fresh)
{
    proxy_t *p = ex->proxy;
    set_state(ex, EX_FORWARDING);
    char *traced_extra = NULL;
    if (ex->traced) {
        /* the upstream continues the trace from the gateway's CLIENT span */
        char tp[64];
        trace_new_span(ex->proxy->ctx.tracer, &ex->client_span, &ex->span);
        trace_format_parent(&ex->client_span, tp, sizeof(tp));
        ex->forward_ns = trace_now_ns();
        traced_extra = xasprintf("%straceparent: %s\r\n", extra_headers ? extra_headers : "", tp);
        extra_headers = traced_extra;
    }
    struct evbuffer *out = evbuffer_new();
    size_t blen = evbuffer_get_length(ex->req->body);
    long long body_len = ex->req->method == HTTP_POST || blen > 0 ? (long long)blen : -1;
    http_write_request_head(out, ex->req->method_name, ex->req->target, &ex->req->headers,
                            p->ctx.cfg->upstream_host_header, ex->req->client_ip, body_len,
                            extra_headers);
    evbuffer_add_buffer(out, ex->req->body);
    p->ctx.stats->forwarded++;
    ex->forward_ms = util_now_ms();
    ex->up = upstream_send(p->ctx.pool, out, fresh, &up_cbs, ex);
    evbuffer_free(out);
    free(traced_extra);
}

/* --- GET streams: resumes and the drain --- */

/* A GET with Last-Event-ID for a stream the gateway still reads: the upstream would refuse a
 * second reader, so the gateway serves the resume itself, from the bytes it kept, and then
 * passes on the rest live. The agent may still look connected on the old stream (its close
 * not yet seen): resuming says it has left, so that connection is closed. */
static bool resume_stream(exchange_t *get)
{
    proxy_t *p = get->proxy;
    const char *last = http_headers_get(&get->req->headers, "last-event-id");
    const char *session = session_of(get);
    if (!last || !session)
        return false;
    for (exchange_t *ex = p->tracked; ex; ex = ex->next_tracked) {
        const char *s2 = session_of(ex);
        if (!s2 || strcmp(s2, session) != 0 || ex->answered)
            continue;
        /* a session id and an event id are not credentials: the resume must come from the
         * caller of the stream it resumes, or it is the upstream's to judge */
        if (!subject_same_caller(p->ctx.subject, ex->req, get->req)) {
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
        get->answered = true;
        get->outcome = "resumed";
        get->status = 200;
        ex->client = conn;
        ex->keep_alive = get->req->keep_alive;
        http_conn_set_observer(conn, on_client_drained, on_client_gone, ex);
        struct evbuffer *out = http_conn_output(conn);
        char *cors = own_cors_headers(get);
        char *extra = xasprintf("Cache-Control: no-cache\r\nMcp-Session-Id: %s\r\n%s", session,
                                cors ? cors : "");
        free(cors);
        http_write_response_head(out, 200, "text/event-stream", NULL, -1, ex->keep_alive, extra);
        free(extra);
        if (ex->sse_unheld > from) {
            size_t n = ex->sse_unheld - from;
            const char *bytes = (const char *)evbuffer_pullup(ex->sse_log, -1) + from;
            evbuffer_add_printf(out, "%zx\r\n", n);
            evbuffer_add(out, bytes, n);
            evbuffer_add(out, "\r\n", 2);
        }
        log_info(get->conn_id, "stream resumed from the gateway after event %s", last);
        set_state(get, EX_DONE);
        return true;
    }
    return false;
}

static bool send_to_worker(void *arg, int fd, const char *bytes, size_t len)
{
    return handoff_send(*(const int *)arg, fd, bytes, len);
}

/* A resume of a stream another worker reads goes to that worker, socket and all: the upstream
 * would refuse a second reader of the stream. */
static bool hand_off_resume(exchange_t *get)
{
    proxy_t *p = get->proxy;
    if (p->ctx.n_workers < 2)
        return false;
    const char *session = session_of(get);
    if (!session || !http_headers_get(&get->req->headers, "last-event-id"))
        return false;
    int owner = handoff_owner(session);
    if (owner < 0 || owner == p->ctx.worker ||
        !http_conn_hand_off(get->client, get->req, HANDOFF_MAX_BYTES, send_to_worker, &owner))
        return false;
    log_info(get->conn_id, "stream resume handed to worker %d, which reads the stream", owner + 1);
    get->client = NULL;
    get->answered = true;
    get->outcome = "handed_over";
    set_state(get, EX_DONE);
    return true;
}

void proxy_drain(proxy_t *p)
{
    exchange_t *ex = p->gets;
    while (ex) {
        exchange_t *next = ex->next_get;
        if (upstream_running(ex)) {
            ex->outcome = "drained";
            if (!ex->head_sent && ex->client) {
                respond_error(ex, 503, -32000, "the gateway is shutting down", NULL);
            } else {
                if (ex->up) {
                    upstream_abandon(ex->up);
                    ex->up = NULL;
                }
                ex->up_result = UPSTREAM_OK; /* a clean end of the stream for the agent */
                if (ex->state == EX_FORWARDING)
                    ex->answered = true;
                complete_client(ex);
                set_state(ex, EX_DONE);
            }
        }
        ex = next;
    }
}

uint64_t proxy_exchanges(const proxy_t *p)
{
    return p->open;
}

/* --- request validation and classification --- */

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

static void refuse(exchange_t *ex, int status, int code, const char *message, const char *extra)
{
    ex->outcome = "refused";
    respond_error(ex, status, code, message, extra);
}

/* A 403 for Host or Origin names the header, the value refused and the setting that would
 * allow it, in the log and in the answer. */
static void forbid(exchange_t *ex, const char *header, const char *value, const char *setting)
{
    char shown[200], val[220], fields[400];
    snprintf(shown, sizeof(shown), "%s", value ? value : "");
    for (char *s = shown; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f || *s == '"' || *s == '\\')
            *s = '?';
    log_json_string(val, sizeof(val), shown);
    snprintf(fields, sizeof(fields), "\"forbidden_header\":\"%s\",\"value\":%s,\"setting\":\"%s\"",
             header, val, setting);
    exchange_set_log_fields(ex, fields);
    char msg[400];
    snprintf(msg, sizeof(msg),
             "forbidden: %s \"%s\" is not allowed by this gateway; add it to the %s setting to "
             "allow it",
             header, value ? shown : "(missing)", setting);
    refuse(ex, 403, -32000, msg, NULL);
}

/* The request's head: method, path, header copies, Host and Origin. False when refused. */
static bool head_acceptable(exchange_t *ex)
{
    const config_t *cfg = ex->proxy->ctx.cfg;
    const http_request_t *req = ex->req;
    if (req->method == HTTP_CONNECT) {
        refuse(ex, 405, -32600, "method not allowed: CONNECT is not proxied", NULL);
        return false;
    }
    if (!path_matches(req->target, cfg->upstream_path) && !cfg->forward_other_paths) {
        refuse(ex, 404, -32600,
               "not found: the MCP endpoint is elsewhere (forward_other_paths is off)", NULL);
        return false;
    }
    const char *dup = duplicated_header(&req->headers);
    if (dup) {
        char msg[160], fields[100];
        snprintf(msg, sizeof(msg),
                 "bad request: the %s header appears more than once; send it once. Nothing was "
                 "forwarded.",
                 dup);
        snprintf(fields, sizeof(fields), "\"duplicate_header\":\"%s\"", dup);
        exchange_set_log_fields(ex, fields);
        refuse(ex, 400, -32600, msg, NULL);
        return false;
    }
    const char *host = http_headers_get(&req->headers, "host");
    const char *origin = http_headers_get(&req->headers, "origin");
    bool host_ok = config_host_allowed(cfg, host);
    if (!host_ok || !config_origin_allowed(cfg, origin)) {
        forbid(ex, host_ok ? "Origin" : "Host", host_ok ? origin : host,
               host_ok ? "allowed_origins" : "allowed_hosts");
        return false;
    }
    return true;
}

static bool protected_tool(proxy_t *p, const char *tool)
{
    if (p->ctx.catalog)
        return catalog_classify_call(p->ctx.catalog, tool) == TOOL_CLASS_NON_IDEMPOTENT;
    return policy_lookup(&p->ctx.cfg->policy, tool)->cls == TOOL_CLASS_NON_IDEMPOTENT;
}

/* The POST body: JSON-RPC, headers that agree with it, no protected call inside a batch. False
 * when refused. */
static bool body_acceptable(exchange_t *ex)
{
    size_t blen = evbuffer_get_length(ex->req->body);
    const char *body = (const char *)evbuffer_pullup(ex->req->body, -1);
    mcp_status_t st = mcp_parse(body ? body : "", blen, &ex->msg);
    if (st == MCP_ERR_PARSE) {
        refuse(ex, 400, -32700, "parse error: the body is not JSON", NULL);
        return false;
    }
    if (st != MCP_OK) {
        refuse(ex, 400, -32600, "invalid request: expected a JSON-RPC object or array", NULL);
        return false;
    }
    ex->has_msg = true;
    if (ex->traced)
        trace_adopt_meta(ex, body ? body : "", blen);
    const char *mismatch = header_mismatch(ex->req, &ex->msg);
    if (mismatch) {
        refuse(ex, 400, -32020, mismatch, NULL);
        return false;
    }
    if (ex->msg.kind == MCP_KIND_BATCH) {
        bool protected_inside = ex->msg.batch_bad_tool;
        for (size_t i = 0; i < ex->msg.n_batch_tools && !protected_inside; i++)
            protected_inside = protected_tool(ex->proxy, ex->msg.batch_tools[i]);
        if (protected_inside) {
            refuse(ex, 400, -32600,
                   "a batch may not contain a non-idempotent tools/call: send each protected call "
                   "in its own request; nothing was executed",
                   NULL);
            return false;
        }
    }
    if (is_cancel(ex)) {
        /* the request id it names, kept for when the upstream has taken the cancel (the body
         * itself goes up) */
        json_t *root = json_loadb(body, blen, 0, NULL);
        ex->cancel_id = json_incref(json_object_get(json_object_get(root, "params"), "requestId"));
        json_decref(root);
    }
    return true;
}

/* A request the MCP rules do not apply to (another path: OAuth metadata, health, a legacy
 * SSE stream; or OPTIONS, HEAD, DELETE...): relayed as a plain reverse proxy would. A body
 * holding a protected tools/call (the legacy HTTP+SSE transport posts its messages to another
 * path) is refused: forwarding it would execute it unprotected. */
static void forward_plain(exchange_t *ex)
{
    const config_t *cfg = ex->proxy->ctx.cfg;
    size_t blen = evbuffer_get_length(ex->req->body);
    if (blen > 0) {
        const char *body = (const char *)evbuffer_pullup(ex->req->body, -1);
        if (mcp_parse(body, blen, &ex->msg) == MCP_OK) {
            ex->has_msg = true; /* the log line names the method and tool */
            const mcp_msg_t *m = &ex->msg;
            bool protected_inside =
                (m->kind == MCP_KIND_REQUEST && m->tool && protected_tool(ex->proxy, m->tool)) ||
                (m->kind == MCP_KIND_BATCH && m->batch_bad_tool);
            for (size_t i = 0; i < m->n_batch_tools && !protected_inside; i++)
                protected_inside = protected_tool(ex->proxy, m->batch_tools[i]);
            if (protected_inside) {
                char msg[400];
                snprintf(msg, sizeof(msg),
                         "a non-idempotent tools/call is only accepted as a POST to the MCP "
                         "endpoint %s (Streamable HTTP), where it is protected; nothing was "
                         "executed",
                         cfg->upstream_path);
                refuse(ex, 400, -32600, msg, NULL);
                return;
            }
        }
    }
    if (ex->req->method == HTTP_GET)
        get_list_add(ex); /* a stream (legacy SSE): the drain ends it */
    exchange_forward(ex, NULL, false);
}

void proxy_handle(void *arg, http_conn_t *conn, http_request_t *req)
{
    proxy_t *p = arg;
    exchange_t *ex = xcalloc(1, sizeof(*ex));
    ex->proxy = p;
    ex->state = EX_CLASSIFYING;
    ex->conn_id = http_conn_id(conn);
    ex->client = conn;
    ex->req = req;
    ex->start_ms = req->start_ms;
    p->open++;
    http_conn_fill_client_ip(conn, req);
    http_conn_set_observer(conn, on_client_drained, on_client_gone, ex);
    if (p->ctx.tracer)
        trace_start(ex);

    if (!head_acceptable(ex))
        return;
    bool mcp_path = path_matches(req->target, p->ctx.cfg->upstream_path);
    if (!mcp_path || (req->method != HTTP_GET && req->method != HTTP_POST)) {
        forward_plain(ex);
        return;
    }
    if (req->method == HTTP_GET) {
        if (resume_stream(ex) || hand_off_resume(ex))
            return;
        get_list_add(ex);
        set_state(ex, EX_CLAIMING);
        if (p->stage.stream && p->stage.stream(p->stage.arg, ex))
            return;
        exchange_forward(ex, NULL, false);
        return;
    }
    if (req->method == HTTP_POST) {
        if (!body_acceptable(ex))
            return;
        if (ex->msg.kind == MCP_KIND_REQUEST && ex->msg.tool && p->stage.call &&
            ((p->ctx.cfg->status_tool && strcmp(ex->msg.tool, CATALOG_STATUS_TOOL) == 0) ||
             protected_tool(p, ex->msg.tool))) {
            p->ctx.stats->protected_calls++;
            set_state(ex, EX_CLAIMING);
            p->stage.call(p->stage.arg, ex);
            return;
        }
        if (ex->msg.kind == MCP_KIND_REQUEST && ex->msg.method && p->stage.task &&
            (strcmp(ex->msg.method, "tasks/get") == 0 ||
             strcmp(ex->msg.method, "tasks/result") == 0 ||
             strcmp(ex->msg.method, "tasks/cancel") == 0)) {
            set_state(ex, EX_CLAIMING);
            p->stage.task(p->stage.arg, ex);
            return;
        }
        if (ex->msg.kind == MCP_KIND_REQUEST && ex->msg.method && p->ctx.catalog &&
            strcmp(ex->msg.method, "tools/list") == 0)
            catalog_observe(p->ctx.catalog, p->ctx.base,
                            &(catalog_rewrite_t){.status_tool = p->ctx.cfg->status_tool}, ex);
    }
    exchange_forward(ex, NULL, false);
}

/* --- the proxy --- */

proxy_t *proxy_new(const proxy_ctx_t *ctx)
{
    proxy_t *p = xcalloc(1, sizeof(*p));
    p->ctx = *ctx;
    return p;
}

void proxy_free(proxy_t *p)
{
    /* NULL when the worker failed before wiring its stages (the store refused to open) */
    if (!p)
        return;
    cors_table_free(&p->cors);
    free(p);
}

void proxy_set_stage(proxy_t *p, const proxy_stage_t *stage)
{
    p->stage = *stage;
}

void proxy_reconfigure(proxy_t *p, const config_t *cfg)
{
    p->ctx.cfg = cfg;
}
