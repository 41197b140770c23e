/* The exchange as the simulator plays it: the functions of exchange.h the idempotency stage
 * calls, defined here so the real pipeline is not linked. It keeps what the stage did with the
 * request (forwarded, answered, released, replaced, ended) and plays the upstream's answer to
 * the observers the stage added. What reached the agent is told to the simulator. */
#include "sim.h"

#include "exchange.h"
#include "http_conn.h"
#include "mcp.h"
#include "util.h"

#include <event2/buffer.h>
#include <llhttp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct exchange {
    http_request_t req;
    mcp_msg_t msg;
    struct sim_attempt *att;
    bool waiting; /* the agent still reads its connection */
    struct {
        const response_observer_t *ops;
        void *arg;
    } obs[EXCHANGE_MAX_OBSERVERS];
    int n_obs;
    bool detached;
    const response_filter_t *filter;
    void *filter_arg;
    bool forwarded;
    struct evbuffer *up_body; /* the upstream's body as relayed */
    char *answer;             /* what the agent got */
    bool ended;               /* closed without an answer */
    bool early;               /* an early answer went out: the end is no second answer */
    int up_result;            /* upstream_result_t of the end */
    bool up_head;             /* a response head came */
};

static void add_header(http_headers_t *h, const char *name, const char *value)
{
    http_headers_add_name(h, name, strlen(name));
    http_headers_end_name(h);
    http_headers_add_value(h, value, strlen(value));
    http_headers_end_value(h);
}

exchange_t *sim_exchange_new(struct sim_attempt *att, const char *body, const char *const *hdrs)
{
    exchange_t *ex = xcalloc(1, sizeof(*ex));
    ex->att = att;
    ex->waiting = true;
    http_headers_init(&ex->req.headers);
    for (int i = 0; hdrs && hdrs[i]; i += 2)
        add_header(&ex->req.headers, hdrs[i], hdrs[i + 1]);
    add_header(&ex->req.headers, "Content-Type", "application/json");
    ex->req.body = evbuffer_new();
    ex->req.method = HTTP_POST;
    evbuffer_add(ex->req.body, body, strlen(body));
    if (mcp_parse(body, strlen(body), &ex->msg) != MCP_OK) {
        fprintf(stderr, "sim: a request the simulator made does not parse: %s\n", body);
        abort();
    }
    ex->up_body = evbuffer_new();
    return ex;
}

struct sim_attempt *sim_exchange_attempt(const exchange_t *ex)
{
    return ex->att;
}

void sim_exchange_detach(exchange_t *ex)
{
    if (ex->detached)
        return;
    ex->detached = true;
    for (int i = 0; i < ex->n_obs; i++)
        if (ex->obs[i].ops->detach)
            ex->obs[i].ops->detach(ex->obs[i].arg);
    if (ex->filter && ex->filter->detach)
        ex->filter->detach(ex->filter_arg);
}

void sim_exchange_free(exchange_t *ex)
{
    sim_exchange_detach(ex);
    mcp_msg_free(&ex->msg);
    http_headers_free(&ex->req.headers);
    evbuffer_free(ex->req.body);
    evbuffer_free(ex->up_body);
    free(ex->answer);
    free(ex);
}

void sim_exchange_leave(exchange_t *ex)
{
    ex->waiting = false;
}

bool sim_exchange_forwarded(const exchange_t *ex)
{
    return ex->forwarded;
}

const char *sim_exchange_answer(const exchange_t *ex, bool *ended)
{
    *ended = ex->ended;
    return ex->answer;
}

/* The agent reads an answer: once, and only while it waits. */
static void deliver(exchange_t *ex, const char *body)
{
    if (ex->answer || ex->ended)
        return;
    if (!ex->waiting) {
        ex->ended = true;
        return;
    }
    ex->answer = xstrdup(body ? body : "");
    sim_on_answer(ex);
}

observe_t sim_exchange_head(exchange_t *ex, int status, const char *content_type)
{
    ex->up_head = true;
    http_headers_t h;
    http_headers_init(&h);
    add_header(&h, "Content-Type", content_type);
    observe_t v = OBSERVE_PASS;
    for (int i = 0; i < ex->n_obs && !ex->detached; i++)
        if (ex->obs[i].ops->on_head &&
            ex->obs[i].ops->on_head(ex->obs[i].arg, status, &h, false) == OBSERVE_HOLD)
            v = OBSERVE_HOLD;
    http_headers_free(&h);
    return v;
}

observe_t sim_exchange_body(exchange_t *ex, const char *data, size_t len)
{
    evbuffer_add(ex->up_body, data, len);
    observe_t v = OBSERVE_PASS;
    for (int i = 0; i < ex->n_obs && !ex->detached; i++)
        if (ex->obs[i].ops->on_body &&
            ex->obs[i].ops->on_body(ex->obs[i].arg, data, len) == OBSERVE_HOLD)
            v = OBSERVE_HOLD;
    return v;
}

/* What reaches the agent of what the upstream sent: its bytes, or, when it failed before a
 * head, the proxy's own error with the request's id (as the pipeline writes it). */
static char *relayed(exchange_t *ex)
{
    if (!ex->up_head && ex->up_result != UPSTREAM_OK) {
        char *b = xasprintf("{\"jsonrpc\":\"2.0\",\"id\":%s,\"error\":{\"code\":-32603,"
                            "\"message\":\"upstream failed\"}}",
                            ex->msg.id_text);
        return b;
    }
    size_t n = evbuffer_get_length(ex->up_body);
    return xstrndup(n ? (const char *)evbuffer_pullup(ex->up_body, -1) : "", n);
}

observe_t sim_exchange_end(exchange_t *ex, int upstream_result)
{
    ex->up_result = upstream_result;
    observe_t v = OBSERVE_PASS;
    for (int i = 0; i < ex->n_obs && !ex->detached; i++)
        if (ex->obs[i].ops->on_end &&
            ex->obs[i].ops->on_end(ex->obs[i].arg, (upstream_result_t)upstream_result) ==
                OBSERVE_HOLD)
            v = OBSERVE_HOLD;
    /* nobody held it: the upstream's bytes went to the agent as they came */
    if (v == OBSERVE_PASS && !ex->answer && !ex->ended && !ex->early) {
        char *b = relayed(ex);
        deliver(ex, b);
        free(b);
    }
    return v;
}

/* ---- exchange.h ---- */

const http_request_t *exchange_request(const exchange_t *ex)
{
    return &ex->req;
}

const mcp_msg_t *exchange_msg(const exchange_t *ex)
{
    return &ex->msg;
}

uint64_t exchange_conn_id(const exchange_t *ex)
{
    return 1;
}

tool_class_t exchange_tool_class(const exchange_t *ex)
{
    return TOOL_CLASS_NON_IDEMPOTENT;
}

const json_t *exchange_cancel_id(const exchange_t *ex)
{
    return NULL;
}

bool exchange_agent_waiting(const exchange_t *ex)
{
    return ex->waiting && !ex->answer;
}

void exchange_add_observer(exchange_t *ex, const response_observer_t *ops, void *arg)
{
    if (ex->n_obs >= EXCHANGE_MAX_OBSERVERS)
        abort();
    ex->obs[ex->n_obs].ops = ops;
    ex->obs[ex->n_obs].arg = arg;
    ex->n_obs++;
}

void exchange_set_filter(exchange_t *ex, const response_filter_t *ops, void *arg)
{
    ex->filter = ops;
    ex->filter_arg = arg;
}

bool exchange_upstream_desync(const exchange_t *ex)
{
    return false;
}

void exchange_forward(exchange_t *ex, const char *extra, bool once)
{
    if (ex->filter && ex->filter->on_forward)
        ex->filter->on_forward(ex->filter_arg, ex);
    ex->forwarded = true;
    sim_on_forward(ex);
}

void exchange_drop_request_header(exchange_t *ex, const char *name)
{
    http_headers_remove(&ex->req.headers, name);
}

void exchange_answer_early(exchange_t *ex, const char *body)
{
    ex->early = true;
    deliver(ex, body);
}

void exchange_upstream_alone(exchange_t *ex)
{
}

void exchange_replace_body(exchange_t *ex, const char *body, size_t len)
{
    evbuffer_drain(ex->req.body, evbuffer_get_length(ex->req.body));
    evbuffer_add(ex->req.body, body, len);
}

void exchange_respond_json(exchange_t *ex, int status, const char *body, const char *extra)
{
    deliver(ex, body);
    ex->waiting = false;
    sim_exchange_detach(ex);
}

void exchange_end(exchange_t *ex)
{
    if (!ex->answer)
        ex->ended = true;
    sim_exchange_detach(ex);
}

void exchange_release(exchange_t *ex)
{
    if (ex->early)
        return;
    char *b = relayed(ex);
    deliver(ex, b);
    free(b);
}

void exchange_replace_answer(exchange_t *ex, const char *body)
{
    if (!ex->early)
        deliver(ex, body);
}

void exchange_end_upstream(exchange_t *ex)
{
}

void exchange_discard_upstream(exchange_t *ex)
{
}

void exchange_set_outcome(exchange_t *ex, const char *outcome)
{
}

void exchange_set_facts(exchange_t *ex, const exchange_facts_t *f)
{
    (void)ex;
    (void)f;
}
