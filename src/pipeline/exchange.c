/* The request object: one agent request and its upstream call, with the relay between them
 * (backpressure both ways), holding and releasing the answer for a stage, the gateway's own
 * answers, streams kept for resumption, the request's log line, metrics and spans. The router
 * (proxy.c) makes exchanges and decides where each goes; stages drive them through exchange.h. */
#include "exchange_int.h"
#include "exchange_facts.h"
#include "proxy_int.h"
#include "resume.h"
#include "handoff.h"
#include "log.h"
#include "policy.h"
#include "subject.h"
#include "upstream.h"
#include "util.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <llhttp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Above this much unsent output to the agent, reading from the upstream pauses. */
#define CLIENT_HIGH_WATERMARK (256 * 1024)

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

static void on_up_head(void *arg, int status, const http_headers_t *headers);
static void on_up_body(void *arg, const char *data, size_t len);
static void on_up_end(void *arg, upstream_result_t res);
static const upstream_cbs_t up_cbs = {on_up_head, on_up_body, on_up_end};
static void exchange_close(exchange_t *ex);
static void answer_desync(exchange_t *ex);
static void reap_cb(evutil_socket_t fd, short what, void *arg);

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
        exchange_close(ex);
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
    /* a server of servers: is named on each of its lines (its names are plain words) */
    const char *server = ex->proxy->ctx.cfg->server_name;
    int n = snprintf(fields, sizeof(fields),
                     "%s%s%s\"http_method\":\"%s\",\"path\":%s,\"rpc_method\":%s,\"rpc_id\":%s,"
                     "\"tool\":%s,\"status\":%d,\"outcome\":%s,\"duration_ms\":%llu",
                     server ? "\"server\":\"" : "", server ? server : "", server ? "\"," : "",
                     ex->req->method_name, target, method, id, tool, ex->status, outcome,
                     (unsigned long long)(util_now_ms() - ex->start_ms));
    /* then the handlers' facts, after a comma when there are any */
    if (n > 0 && (size_t)n + 1 < sizeof(fields)) {
        fields[n] = ',';
        if (!exchange_facts_render(&ex->facts, fields + n + 1, sizeof(fields) - (size_t)n - 1))
            fields[n] = '\0';
    }
    log_emit(LOG_INFO, ex->conn_id, fields, "request");
}

void exchange_set_outcome(exchange_t *ex, const char *outcome)
{
    ex->outcome = outcome;
}

void exchange_set_facts(exchange_t *ex, const exchange_facts_t *f)
{
    free(ex->facts_kept);
    ex->facts_kept = exchange_facts_keep(&ex->facts, f);
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

tool_class_t exchange_tool_class(const exchange_t *ex)
{
    return ex->tool_class;
}

const json_t *exchange_cancel_id(const exchange_t *ex)
{
    return ex->cancel_id;
}

bool exchange_agent_waiting(const exchange_t *ex)
{
    return ex->client && !ex->answered;
}

void exchange_add_observer(exchange_t *ex, const response_observer_t *ops, void *arg)
{
    if (ex->n_obs == EXCHANGE_MAX_OBSERVERS) {
        /* main's wiring gives no request more than a few concerns: this is a bug */
        log_error(ex->conn_id, "more than %d observers of one exchange", EXCHANGE_MAX_OBSERVERS);
        abort();
    }
    ex->obs[ex->n_obs].ops = ops;
    ex->obs[ex->n_obs].arg = arg;
    ex->n_obs++;
}

void exchange_set_filter(exchange_t *ex, const response_filter_t *ops, void *arg)
{
    if (ex->filter) {
        /* one concern rewrites an answer; two would have to know of each other */
        log_error(ex->conn_id, "a second filter of one exchange");
        abort();
    }
    ex->filter = ops;
    ex->filter_arg = arg;
}

bool exchange_upstream_desync(const exchange_t *ex)
{
    return ex->desync;
}

static void detach_filter(exchange_t *ex)
{
    const response_filter_t *f = ex->filter;
    ex->filter = NULL;
    if (f && f->detach)
        f->detach(ex->filter_arg);
}

/* Each observer's last call. The list is emptied first, so a round of callbacks under way
 * stops at the next observer. */
static void detach_observers(exchange_t *ex)
{
    int n = ex->n_obs;
    ex->n_obs = 0;
    for (int i = 0; i < n; i++)
        if (ex->obs[i].ops->detach)
            ex->obs[i].ops->detach(ex->obs[i].arg);
}

void exchange_drop_request_header(exchange_t *ex, const char *name)
{
    http_headers_remove(&ex->req->headers, name);
}

void exchange_upstream_alone(exchange_t *ex)
{
    ex->alone = true;
}

void exchange_replace_body(exchange_t *ex, const char *body, size_t len)
{
    ex->msg.id_at_known = false; /* the parse's offsets were into the old bytes */
    evbuffer_drain(ex->req->body, evbuffer_get_length(ex->req->body));
    evbuffer_add(ex->req->body, body, len);
}

static void get_list_add(exchange_t *ex)
{
    proxy_t *p = ex->proxy;
    ex->in_get_list = true;
    ex->prev_get = NULL;
    ex->next_get = p->exchanges.gets;
    if (p->exchanges.gets)
        p->exchanges.gets->prev_get = ex;
    p->exchanges.gets = ex;
}

static void get_list_remove(exchange_t *ex)
{
    if (!ex->in_get_list)
        return;
    if (ex->prev_get)
        ex->prev_get->next_get = ex->next_get;
    else
        ex->proxy->exchanges.gets = ex->next_get;
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

static void trace_record(exchange_t *ex, int kind)
{
    if (!(kind == SPAN_SERVER ? ex->span : ex->client_span).sampled)
        return; /* not exported: its attributes are not worth collecting */
    const char *method = ex->has_msg && ex->msg.method ? ex->msg.method : ex->req->method_name;
    const char *tool = ex->has_msg ? ex->msg.tool : NULL;
    char name[300], status[8], id[80];
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
        {"idemgw.class", kind == SPAN_SERVER && tool ? tool_class_name(ex->tool_class) : NULL},
        {"idemgw.key_hash", kind == SPAN_SERVER ? ex->facts.key_hash : NULL},
        {"idemgw.duplicate_source", kind == SPAN_SERVER ? ex->facts.dup.source : NULL},
        {"idemgw.code", kind == SPAN_SERVER ? ex->facts.code : NULL},
        /* which server of servers: the request was for (none with one upstream) */
        {"idemgw.server", ex->proxy->ctx.cfg->server_name},
    };
    span_t s = {
        .name = name,
        .kind = kind,
        .ctx = kind == SPAN_SERVER ? ex->span : ex->client_span,
        .parent_span_id =
            kind == SPAN_SERVER ? (ex->has_parent ? ex->parent_span_id : NULL) : ex->span.span_id,
        .start_ns = kind == SPAN_SERVER ? ex->start_ns : ex->forward_ns,
        .end_ns = trace_now_ns(),
        .attrs = attrs,
        .n_attrs = ARRAY_LEN(attrs),
        .error = kind == SPAN_SERVER ? ex->status >= 500 : ex->up_result != UPSTREAM_OK,
    };
    tracer_record(ex->proxy->ctx.tracer, &s);
}

/* The exchange's log line, span and counts, once: when it closes, or before an answer the
 * gateway writes itself goes out (exchange_respond_json), so that once the agent has read
 * it, /metrics (served by any worker) and the log already include it, as they include the
 * duplicate the stage counted before answering. */
static void account(exchange_t *ex)
{
    if (ex->accounted)
        return;
    ex->accounted = true;
    proxy_t *p = ex->proxy;
    log_exchange(ex);
    if (ex->traced)
        trace_record(ex, SPAN_SERVER);
    stats_observe_request(p->ctx.stats, p->ctx.cfg->server_name,
                          ex->outcome ? ex->outcome : "forwarded", util_now_ms() - ex->start_ms);
    if (p->on_closed)
        p->on_closed(ex); /* the router's count of the call, by tool, class and outcome */
}

/* The exchange has ended: logged, counted, and let go by its observer, its agent connection
 * and the lists that name it. Its memory stays until the loop is out of every callback that
 * may still hold a pointer to it (exchange_reap); until then its accessors still answer. */
static void exchange_close(exchange_t *ex)
{
    proxy_t *p = ex->proxy;
    account(ex);
    if (!ex->ending)
        detach_observers(ex); /* else once every on_end has been called (on_up_end) */
    detach_filter(ex);
    if (ex->desync_ev)
        event_del(ex->desync_ev);
    if (ex->client)
        http_conn_set_observer(ex->client, NULL, NULL, NULL);
    ex->client = NULL;
    resume_stop(ex);
    get_list_remove(ex);
    if (ex->prev_live)
        ex->prev_live->next_live = ex->next_live;
    else
        p->exchanges.live = ex->next_live;
    if (ex->next_live)
        ex->next_live->prev_live = ex->prev_live;
    ex->next_closed = p->exchanges.closed;
    p->exchanges.closed = ex;
    if (!p->exchanges.reap_ev)
        p->exchanges.reap_ev = event_new(p->ctx.base, -1, 0, reap_cb, p);
    event_active(p->exchanges.reap_ev, EV_TIMEOUT, 0);
}

static void exchange_free(exchange_t *ex)
{
    if (ex->has_msg)
        mcp_msg_free(&ex->msg);
    json_decref(ex->cancel_id);
    if (ex->held)
        evbuffer_free(ex->held);
    if (ex->head_wait)
        evbuffer_free(ex->head_wait);
    if (ex->desync_ev)
        event_free(ex->desync_ev);
    free(ex->facts_kept);
    http_request_free(ex->req);
    free(ex);
}

void exchange_reap(proxy_t *p)
{
    bool any = p->exchanges.closed != NULL;
    while (p->exchanges.closed) {
        exchange_t *ex = p->exchanges.closed;
        p->exchanges.closed = ex->next_closed;
        exchange_free(ex);
        p->exchanges.open--;
    }
    if (any && p->ctx.exchange_ended)
        p->ctx.exchange_ended(p->ctx.arg);
}

void exchange_end_all(proxy_t *p)
{
    /* a drain that timed out left these: nothing will end them now but the exit. Their calls
     * stay as the store has them (a protected call's claim ends with its lease). */
    while (p->exchanges.live) {
        exchange_t *ex = p->exchanges.live;
        if (ex->up) {
            upstream_abandon(p->ctx.upstream, ex->up);
            ex->up = NULL;
        }
        if (!ex->outcome)
            ex->outcome = "drained";
        ex->answered = true;
        set_state(ex, EX_DONE); /* off the live list */
    }
    exchange_reap(p);
    if (p->exchanges.reap_ev)
        event_free(p->exchanges.reap_ev);
    p->exchanges.reap_ev = NULL;
}

static void reap_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    exchange_reap(arg);
}

/* A head kept back (head_wait) is not needed any more: the gateway answers itself. */
static void drop_head(exchange_t *ex)
{
    if (ex->head_wait) {
        evbuffer_free(ex->head_wait);
        ex->head_wait = NULL;
    }
}

/* A head kept back goes to the agent (or, while a stage holds, where the body goes). */
static void send_head(exchange_t *ex, bool hold)
{
    if (!ex->head_wait)
        return;
    if (hold) {
        if (!ex->held)
            ex->held = evbuffer_new();
        evbuffer_add_buffer(ex->held, ex->head_wait);
    } else if (ex->client) {
        ex->relayed = true;
        evbuffer_add_buffer(http_conn_output(ex->client), ex->head_wait);
    }
    drop_head(ex);
}

/* Bytes for the agent: held while a stage holds, dropped if the agent left; a head kept
 * back goes first. */
static void to_client(exchange_t *ex, const char *data, size_t len)
{
    send_head(ex, holding(ex));
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
        char line[HTTP_CHUNK_LINE_MAX];
        to_client(ex, line, http_chunk_line(line, len));
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
    send_head(ex, false); /* an answer without a body: its head is all of it */
    bool keep = ex->keep_alive;
    /* an answer cut short ends with no last chunk, closed, so the agent sees it broken; a
     * complete chunked end would read as the whole answer. A GET stream has no whole: however
     * the upstream ended it, the agent reconnects, so it ends as before. */
    if (ex->up_result != UPSTREAM_OK && !ex->cut && !ex->last_event_given &&
        ex->req->method != HTTP_GET)
        keep = false;
    else if (ex->client && ex->chunked)
        evbuffer_add(http_conn_output(ex->client), HTTP_CHUNK_LAST, strlen(HTTP_CHUNK_LAST));
    else if (ex->up_result != UPSTREAM_OK)
        keep = false; /* a length-framed body ended early by the gateway: closing ends it */
    finish_client(ex, keep);
}

static const char *origin_of(const exchange_t *ex)
{
    return http_headers_get(&ex->req->headers, "origin");
}

/* CORS lines for an answer the gateway writes itself, or NULL. */
char *exchange_own_cors(const exchange_t *ex)
{
    if (ex->proxy->ctx.cfg->cors == CORS_OFF)
        return NULL;
    return cors_headers(&ex->proxy->cors, origin_of(ex));
}

void exchange_respond_json(exchange_t *ex, int status, const char *body, const char *extra)
{
    drop_head(ex);
    ex->status = status;
    ex->head_sent = true;
    ex->answered = true;
    if (ex->client) {
        http_conn_t *c = ex->client;
        http_conn_set_observer(c, NULL, NULL, NULL);
        ex->client = NULL;
        char *cors = exchange_own_cors(ex);
        char *all = cors ? xasprintf("%s%s", extra ? extra : "", cors) : NULL;
        account(ex); /* http_conn_respond writes to the socket now */
        http_conn_respond(c, status, "application/json", body, strlen(body), all ? all : extra,
                          ex->req->keep_alive);
        free(all);
        free(cors);
    }
    if (ex->up) {
        /* a drain ends a GET stream that had no head yet */
        upstream_abandon(ex->proxy->ctx.upstream, ex->up);
        ex->up = NULL;
    }
    set_state(ex, EX_DONE);
}

static void respond_error(exchange_t *ex, int status, int code, const char *message,
                          const char *extra)
{
    if (status >= 500)
        stats_upstream_error(ex->proxy->ctx.stats, ex->proxy->ctx.cfg->server_name);
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
    if (ex->state == EX_HOLDING) {
        set_state(ex, EX_STREAMING); /* on_up_end, still to come, sees to a desync */
        return;
    }
    if (ex->desync)
        answer_desync(ex);
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
        http_chunk_add(http_conn_output(ex->client), event, strlen(event));
        free(event);
        ex->last_event_given = true;
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
        drop_head(ex);
        http_conn_set_observer(c, NULL, NULL, NULL);
        ex->client = NULL;
        char *cors = exchange_own_cors(ex);
        http_conn_respond(c, 200, "application/json", body, strlen(body), cors,
                          ex->req->keep_alive);
        free(cors);
        return;
    }
    bool keep = false;
    if (ex->resp_sse && ex->chunked) {
        char *event = xasprintf("event: message\ndata: %s\n\n", body);
        struct evbuffer *out = http_conn_output(c);
        http_chunk_add(out, event, strlen(event));
        evbuffer_add(out, HTTP_CHUNK_LAST, strlen(HTTP_CHUNK_LAST));
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
        upstream_pause(ex->proxy->ctx.upstream, ex->up, false);
    }
}

static bool answer_seen(const exchange_t *ex)
{
    if (holding(ex))
        return false;
    for (int i = 0; i < ex->n_obs; i++)
        if (ex->obs[i].ops->answer_seen && ex->obs[i].ops->answer_seen(ex->obs[i].arg))
            return true;
    return false;
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
            upstream_pause(ex->proxy->ctx.upstream, ex->up, false);
        }
        return;
    }
    if (ex->up) {
        upstream_abandon(ex->proxy->ctx.upstream, ex->up);
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

static void on_up_end(void *arg, upstream_result_t res);

/* The upstream call is out of step: ended as a protocol error once the loop is out of its
 * callbacks (upstream.h: a call is abandoned from another event). */
static void desync_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    exchange_t *ex = arg;
    if (!ex->up || !upstream_running(ex))
        return;
    upstream_discard(ex->proxy->ctx.upstream, ex->up); /* the upstream is known to stray */
    upstream_abandon(ex->proxy->ctx.upstream, ex->up); /* its connection is closed */
    ex->up = NULL;
    on_up_end(ex, UPSTREAM_ERR_PROTOCOL);
}

static void filter_failed(exchange_t *ex)
{
    if (ex->desync)
        return;
    ex->desync = true;
    log_warn(ex->conn_id, "upstream answer out of step with the request it was sent with: the "
                          "connection is closed, the call ends as a protocol error");
    if (!ex->desync_ev)
        ex->desync_ev = event_new(ex->proxy->ctx.base, -1, 0, desync_cb, ex);
    event_active(ex->desync_ev, EV_TIMEOUT, 0);
}

static void on_up_head(void *arg, int status, const http_headers_t *headers)
{
    exchange_t *ex = arg;
    if (ex->filter) {
        const http_headers_t *out = headers;
        if (!ex->filter->on_head(ex->filter_arg, status, headers, &out))
            filter_failed(ex);
        headers = out;
    }
    ex->status = status;
    const char *ct = http_headers_get(headers, "content-type");
    ex->resp_sse = ct && strncasecmp(ct, "text/event-stream", 17) == 0;
    long long clen = header_ll(headers, "content-length");
    if (status == 204 || status == 304)
        clen = -2;
    else if (ex->req->method == HTTP_HEAD)
        clen = clen >= 0 ? clen : -2; /* no body follows, whatever the head says */
    else if (clen < 0 || (ex->resp_sse && ex->n_obs > 0 && status == 200))
        clen = -1; /* chunked or close-delimited upstream, or a watched stream the gateway
                    * may have to end with an answer of its own: chunked to the agent */
    ex->chunked = clen == -1;
    ex->keep_alive = ex->req->keep_alive;
    if (ex->resp_sse && ex->chunked && ex->req->method == HTTP_POST && status == 200 &&
        exchange_session(ex))
        resume_start(ex);
    set_state(ex, EX_STREAMING);
    for (int i = 0; i < ex->n_obs; i++)
        if (ex->obs[i].ops->on_head)
            observe(ex, ex->obs[i].ops->on_head(ex->obs[i].arg, status, headers, ex->resp_sse));
    cors_learn(&ex->proxy->cors, origin_of(ex), headers);
    char *extra = NULL;
    if (ex->req->method == HTTP_OPTIONS)
        extra = cors_preflight_extra(
            http_headers_get(&ex->req->headers, "access-control-request-headers"), headers);
    struct evbuffer *head = evbuffer_new();
    bool draining = ex->proxy->ctx.draining && *ex->proxy->ctx.draining;
    http_write_response_head(head, status, NULL, headers, clen, ex->keep_alive && !draining, extra);
    free(extra);
    if (ex->req->method == HTTP_POST && !holding(ex) && !ex->resp_sse) {
        /* a JSON answer's head goes with the body's first bytes, or at the end. An event
         * stream's goes now: a call may run for long without an event, longer than a client
         * waits for a head (undici's fetch, the SDKs': 300 s), and one cut before its answer
         * can still end with an error event (answer_cut_stream) */
        ex->head_wait = head;
    } else {
        to_client(ex, (const char *)evbuffer_pullup(head, -1), evbuffer_get_length(head));
        evbuffer_free(head);
    }
    ex->head_sent = true;
}

/* The head kept back goes out (or into the hold) before its body. */
static void head_out(exchange_t *ex)
{
    send_head(ex, holding(ex));
}

/* What the agent gets when its answer was not its request's: an error with its own id, never
 * what the upstream sent. Unless the observer that holds the answer replaces it (the protected
 * call's stage answers in its place): this runs when the upstream ends with nothing held, or
 * when the holder releases. */
static const char DESYNC_MESSAGE[] =
    "the upstream MCP server answered with another request's response (one left on a "
    "kept-alive connection); the request may have run: send it again for its own answer";

/* A relayed event stream cut before the request's own answer came through: an error event
 * for its id ends the stream whole, so the agent's client fails the request now rather than
 * wait on a broken stream for an answer that will not come (a protected call's stage answers
 * in its place and holds it: not this). */
static void answer_cut_stream(exchange_t *ex)
{
    if (ex->cut || ex->desync || !ex->client || ex->answered || ex->last_event_given ||
        !ex->relayed || !ex->resp_sse || !ex->chunked || ex->req->method != HTTP_POST ||
        !ex->has_msg || ex->msg.kind != MCP_KIND_REQUEST || !ex->msg.id_text)
        return;
    /* whether the request's answer went out already: certainly not when nothing of the body
     * did; else its filter knows, or nobody does (the stream ends broken) */
    bool unanswered = !ex->body_out ||
                      (ex->filter && ex->filter->answered && !ex->filter->answered(ex->filter_arg));
    if (!unanswered)
        return;
    char *body = mcp_error_body(ex->msg.id_text, -32603,
                                "the upstream MCP server's answer was cut off before it was "
                                "complete; the request may have run");
    char *event = xasprintf("event: message\ndata: %s\n\n", body);
    body_to_client(ex, event, strlen(event));
    free(event);
    free(body);
    ex->last_event_given = true;
}

static void answer_desync(exchange_t *ex)
{
    if (!ex->client || ex->answered)
        return;
    if (ex->head_wait) {
        /* nothing of it went out: conclude answers it whole */
        evbuffer_free(ex->head_wait);
        ex->head_wait = NULL;
        ex->deferred_status = 502;
        ex->deferred_message = DESYNC_MESSAGE;
        return;
    }
    if (!ex->resp_sse || !ex->chunked)
        return; /* framing without room for an error: the close tells the agent */
    char *body = mcp_error_body(ex->has_msg ? ex->msg.id_text : NULL, -32603, DESYNC_MESSAGE);
    char *event = xasprintf("event: message\ndata: %s\n\n", body);
    body_to_client(ex, event, strlen(event));
    free(event);
    free(body);
}

/* Bytes of the answer, as the filter gave them out, to the observers and the agent. */
static void relay_body(exchange_t *ex, const char *data, size_t len)
{
    head_out(ex);
    for (int i = 0; i < ex->n_obs; i++)
        if (ex->obs[i].ops->on_body)
            observe(ex, ex->obs[i].ops->on_body(ex->obs[i].arg, data, len));
    resume_feed(ex, data, len);
    body_to_client(ex, data, len);
    if (len > 0)
        ex->body_out = true;
    bool held = holding(ex);
    if (ex->resp_sse && ex->client && !held)
        http_conn_flush(ex->client);
    if (ex->sse_tracking && !held)
        ex->sse_unheld = ex->sse_total;
    if (ex->client && !ex->paused && ex->up &&
        http_conn_output_len(ex->client) > CLIENT_HIGH_WATERMARK) {
        ex->paused = true;
        upstream_pause(ex->proxy->ctx.upstream, ex->up, true);
    }
}

/* Relays a filter's output (drained). */
static void relay_out(exchange_t *ex, struct evbuffer *out)
{
    size_t n = evbuffer_get_length(out);
    if (n > 0)
        relay_body(ex, (const char *)evbuffer_pullup(out, -1), n);
    evbuffer_drain(out, n);
}

static void on_up_body(void *arg, const char *data, size_t len)
{
    exchange_t *ex = arg;
    if (ex->desync)
        return; /* nothing more of an answer that is not the request's */
    if (!ex->filter) {
        relay_body(ex, data, len);
        return;
    }
    struct evbuffer *out = evbuffer_new();
    if (ex->filter->on_body(ex->filter_arg, data, len, out))
        relay_out(ex, out);
    else
        filter_failed(ex);
    evbuffer_free(out);
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
    upstream_call_t *up = ex->up;
    ex->up = NULL; /* from here on nothing pauses the call: it is over */
    if (ex->filter && !ex->desync) {
        /* what the filter kept back (a JSON answer is read whole) */
        struct evbuffer *out = evbuffer_new();
        if (ex->filter->on_end(ex->filter_arg, res == UPSTREAM_OK, out)) {
            /* a JSON answer the filter gave out whole, its head still kept back: framed by its
             * length, as the upstream framed it, not chunked */
            if (res == UPSTREAM_OK && ex->head_wait && ex->chunked && !ex->body_out &&
                !ex->resp_sse &&
                http_head_set_length(ex->head_wait, (long long)evbuffer_get_length(out)))
                ex->chunked = false;
            relay_out(ex, out);
        } else
            filter_failed(ex);
        evbuffer_free(out);
    }
    if (ex->desync) {
        /* whatever the upstream said of its end, the answer was not this request's */
        res = UPSTREAM_ERR_PROTOCOL;
        ex->discard_up = true;
        event_del(ex->desync_ev);
    }
    if (!ex->desync && res == UPSTREAM_OK)
        head_out(ex); /* an empty body: the head alone (a cut one is answered below) */
    ex->up_result = res;
    if (ex->forward_ms)
        stats_observe_upstream(p->ctx.stats, util_now_ms() - ex->forward_ms);
    if (ex->traced && ex->forward_ns)
        trace_record(ex, SPAN_CLIENT);
    if (res != UPSTREAM_OK && !ex->cut && !ex->desync) /* a desync was logged as such */
        log_warn(ex->conn_id, "upstream: %s", upstream_result_str(res));
    /* relayed once the upstream took it: a protected call it names will get no answer */
    if (res == UPSTREAM_OK && ex->status >= 200 && ex->status < 300 && is_cancel(ex) &&
        p->hooks.cancelled)
        p->hooks.cancelled(p->hooks.arg, ex->req, exchange_session(ex), ex->cancel_id);
    bool hold = false;
    /* every observer hears the end, even after one answered from its on_end */
    ex->ending = true;
    for (int i = 0; i < ex->n_obs; i++)
        if (ex->obs[i].ops->on_end && ex->obs[i].ops->on_end(ex->obs[i].arg, res) == OBSERVE_HOLD)
            hold = true;
    ex->ending = false;
    if (ex->state == EX_DONE) {
        /* an observer answered from on_end: nothing of the exchange is left to do */
        detach_observers(ex);
        return;
    }
    /* still held after the round: an observer that released from its on_end let it go */
    hold = hold || holding(ex);
    if (ex->desync && !hold)
        answer_desync(ex);
    if (res != UPSTREAM_OK && !hold)
        answer_cut_stream(ex);
    if (up && ex->discard_up) {
        log_warn(ex->conn_id, "upstream answered with another request's response: closing it");
        upstream_discard(p->ctx.upstream, up);
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
    } else if (res != UPSTREAM_OK && !ex->cut && !ex->relayed && ex->client && !ex->answered) {
        /* cut before any of it reached the agent (its head kept back or held): an error for
         * the request's id says so; the head and what came of the body would read as a whole,
         * empty or partial, answer. A holder may still answer in its place. */
        ex->deferred_status = 502;
        ex->deferred_message = "the upstream MCP server's answer was cut off";
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
    upstream_abandon(ex->proxy->ctx.upstream, ex->up);
    ex->cut = true;
    on_up_end(ex, UPSTREAM_ERR_CLOSED);
}

void exchange_discard_upstream(exchange_t *ex)
{
    ex->discard_up = true;
}

void exchange_forward(exchange_t *ex, const char *extra_headers, bool once)
{
    proxy_t *p = ex->proxy;
    set_state(ex, EX_FORWARDING);
    if (ex->filter && ex->filter->on_forward)
        ex->filter->on_forward(ex->filter_arg, ex);
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
    upstream_request_t r = {
        .method = ex->req->method_name,
        .target = ex->req->target,
        .headers = &ex->req->headers,
        .extra_headers = extra_headers,
        .client_ip = ex->req->client_ip,
        .body = ex->req->body,
        .has_body = ex->req->method == HTTP_POST,
        .once = once,
        .alone = ex->alone,
    };
    char caller[SUBJECT_TAG_HEX + 1];
    if (p->ctx.subject && upstream_wants_caller(p->ctx.upstream)) {
        subject_caller_tag(p->ctx.subject, ex->req, caller);
        r.caller = caller;
    }
    p->ctx.stats->forwarded++;
    ex->forward_ms = util_now_ms();
    ex->up = upstream_open(p->ctx.upstream, &r, &up_cbs, ex);
    free(traced_extra);
}

/* --- GET streams: resumes and the drain --- */

void proxy_drain(proxy_t *p)
{
    exchange_t *ex = p->exchanges.gets;
    while (ex) {
        exchange_t *next = ex->next_get;
        if (upstream_running(ex)) {
            ex->outcome = "drained";
            if (!ex->head_sent && ex->client) {
                respond_error(ex, 503, -32000, "the gateway is shutting down", NULL);
            } else {
                if (ex->up) {
                    upstream_abandon(p->ctx.upstream, ex->up);
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
    return p->exchanges.open;
}

/* --- what the router calls --- */

void exchange_attach_agent(exchange_t *ex, http_conn_t *conn)
{
    ex->client = conn;
    http_conn_set_observer(conn, on_client_drained, on_client_gone, ex);
}

exchange_t *exchange_new(proxy_t *p, http_conn_t *conn, http_request_t *req)
{
    exchange_t *ex = xcalloc(1, sizeof(*ex));
    ex->proxy = p;
    ex->state = EX_CLASSIFYING;
    ex->conn_id = http_conn_id(conn);
    ex->client = conn;
    ex->req = req;
    ex->start_ms = req->start_ms;
    p->exchanges.open++;
    ex->next_live = p->exchanges.live;
    if (p->exchanges.live)
        p->exchanges.live->prev_live = ex;
    p->exchanges.live = ex;
    http_conn_fill_client_ip(conn, req);
    http_conn_set_observer(conn, on_client_drained, on_client_gone, ex);
    if (p->ctx.tracer)
        trace_start(ex);
    return ex;
}

void exchange_set_state(exchange_t *ex, ex_state_t to)
{
    set_state(ex, to);
}

void exchange_respond_error(exchange_t *ex, int status, int code, const char *message,
                            const char *extra)
{
    respond_error(ex, status, code, message, extra);
}

void exchange_track_get(exchange_t *ex)
{
    get_list_add(ex);
}

/* A GET with Last-Event-ID for a stream the gateway still reads: the upstream would refuse a
 * second reader, so the gateway serves the resume itself, from the bytes it kept (resume.c),
 * and then passes on the rest live. The agent may still look connected on the old stream (its
 * close not yet seen): resuming says it has left, so that connection is closed. */
static bool resume_here(exchange_t *get)
{
    const char *last = http_headers_get(&get->req->headers, "last-event-id");
    const char *session = exchange_session(get);
    size_t from = 0;
    exchange_t *ex = last && session ? resume_find(get, session, last, &from) : NULL;
    if (!ex)
        return false;
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
    exchange_attach_agent(ex, conn);
    ex->keep_alive = get->req->keep_alive;
    struct evbuffer *out = http_conn_output(conn);
    char *cors = exchange_own_cors(get);
    char *extra =
        xasprintf("Cache-Control: no-cache\r\nMcp-Session-Id: %s\r\n%s", session, cors ? cors : "");
    free(cors);
    http_write_response_head(out, 200, "text/event-stream", NULL, -1, ex->keep_alive, extra);
    free(extra);
    resume_replay(ex, from, out);
    log_info(get->conn_id, "stream resumed from the gateway after event %s", last);
    exchange_set_state(get, EX_DONE);
    return true;
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
    const char *session = exchange_session(get);
    if (!session || !http_headers_get(&get->req->headers, "last-event-id"))
        return false;
    int owner = handoff_owner(session);
    if (owner < 0 || owner == p->ctx.worker)
        return false;
    if (!http_conn_hand_off(get->client, get->req, HANDOFF_MAX_BYTES, send_to_worker, &owner)) {
        /* a TLS connection cannot move, nor one still writing an answer */
        log_warn(get->conn_id,
                 "stream resume of a session worker %d reads cannot be handed there (a TLS "
                 "connection, or one still writing): the upstream serves it from this worker, "
                 "which cannot map back the ids of that worker's calls",
                 owner + 1);
        return false;
    }
    log_info(get->conn_id, "stream resume handed to worker %d, which reads the stream", owner + 1);
    get->client = NULL;
    get->answered = true;
    get->outcome = "handed_over";
    exchange_set_state(get, EX_DONE);
    return true;
}

bool exchange_resume(exchange_t *get)
{
    return resume_here(get) || hand_off_resume(get);
}

void exchange_adopt_trace_meta(exchange_t *ex, const char *body, size_t len)
{
    trace_adopt_meta(ex, body, len);
}

bool exchange_is_cancel(const exchange_t *ex)
{
    return is_cancel(ex);
}
