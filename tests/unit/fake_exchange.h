/* A fake exchange for the unit tests of handlers and observers: it defines the exchange_*
 * functions of exchange.h (so the archive's pipeline is not linked), records what the code
 * under test did with the request, and lets the test play the upstream's answer to the
 * observers the code added. Include in one test file, after cmocka.h. */
#ifndef IDEMGW_TEST_FAKE_EXCHANGE_H
#define IDEMGW_TEST_FAKE_EXCHANGE_H

#include "exchange.h"
#include "exchange_facts.h"
#include "http_conn.h"
#include "util.h"

#include <event2/buffer.h>
#include <llhttp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct exchange {
    http_request_t req;
    mcp_msg_t msg;
    bool has_msg; /* a POST whose body parsed */
    tool_class_t cls;
    json_t *cancel_id; /* a notifications/cancelled: the id it names (the test's) */
    bool waiting;
    struct {
        const response_observer_t *ops;
        void *arg;
    } obs[EXCHANGE_MAX_OBSERVERS];
    int n_obs;
    bool detached;
    int forwards;
    bool once;
    bool desync; /* the answer was out of step (exchange_upstream_desync) */
    const response_filter_t *filter;
    void *filter_arg;
    char extra[256];
    int status;       /* of a response the code wrote */
    char *body;       /* that response, or the replacement answer */
    char rextra[128]; /* its extra headers */
    bool ended, released, replaced, discarded, cut;
    bool alone; /* exchange_upstream_alone */
    const char *outcome;
    exchange_facts_t facts; /* the last exchange_set_facts, */
    char *facts_kept;
    char fields[640]; /* and the log line's members made from them */
};

/* The exchange ends: each observer's last call, once. */
static inline void fake_detach(exchange_t *ex)
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

const http_request_t *exchange_request(const exchange_t *ex)
{
    return &ex->req;
}
const mcp_msg_t *exchange_msg(const exchange_t *ex)
{
    return ex->has_msg ? &ex->msg : NULL;
}
uint64_t exchange_conn_id(const exchange_t *ex)
{
    return 1;
}
tool_class_t exchange_tool_class(const exchange_t *ex)
{
    return ex->cls;
}
const json_t *exchange_cancel_id(const exchange_t *ex)
{
    return ex->cancel_id;
}
bool exchange_agent_waiting(const exchange_t *ex)
{
    return ex->waiting;
}
void exchange_add_observer(exchange_t *ex, const response_observer_t *ops, void *arg)
{
    assert_true(ex->n_obs < EXCHANGE_MAX_OBSERVERS);
    ex->obs[ex->n_obs].ops = ops;
    ex->obs[ex->n_obs].arg = arg;
    ex->n_obs++;
}
void exchange_set_filter(exchange_t *ex, const response_filter_t *ops, void *arg)
{
    assert_null(ex->filter);
    ex->filter = ops;
    ex->filter_arg = arg;
}
bool exchange_upstream_desync(const exchange_t *ex)
{
    return ex->desync;
}
void exchange_forward(exchange_t *ex, const char *extra, bool once)
{
    if (ex->filter && ex->filter->on_forward)
        ex->filter->on_forward(ex->filter_arg, ex);
    ex->forwards++;
    ex->once = once;
    snprintf(ex->extra, sizeof(ex->extra), "%s", extra ? extra : "");
}
void exchange_drop_request_header(exchange_t *ex, const char *name)
{
    http_headers_remove(&ex->req.headers, name);
}
void exchange_answer_early(exchange_t *ex, const char *body)
{
    ex->status = 200;
    ex->body = xstrdup(body);
}
void exchange_upstream_alone(exchange_t *ex)
{
    ex->alone = true;
}
void exchange_replace_body(exchange_t *ex, const char *body, size_t len)
{
    evbuffer_drain(ex->req.body, evbuffer_get_length(ex->req.body));
    evbuffer_add(ex->req.body, body, len);
}
void exchange_respond_json(exchange_t *ex, int status, const char *body, const char *extra)
{
    ex->status = status;
    free(ex->body);
    ex->body = xstrdup(body);
    snprintf(ex->rextra, sizeof(ex->rextra), "%s", extra ? extra : "");
    ex->waiting = false;
    fake_detach(ex);
}
void exchange_end(exchange_t *ex)
{
    ex->ended = true;
    fake_detach(ex);
}
void exchange_release(exchange_t *ex)
{
    ex->released = true;
}
void exchange_replace_answer(exchange_t *ex, const char *body)
{
    ex->replaced = true;
    free(ex->body);
    ex->body = xstrdup(body);
}
void exchange_end_upstream(exchange_t *ex)
{
    ex->cut = true;
}
void exchange_discard_upstream(exchange_t *ex)
{
    ex->discarded = true;
}
void exchange_set_outcome(exchange_t *ex, const char *outcome)
{
    ex->outcome = outcome;
}
void exchange_set_facts(exchange_t *ex, const exchange_facts_t *f)
{
    free(ex->facts_kept);
    ex->facts_kept = exchange_facts_keep(&ex->facts, f);
    exchange_facts_render(&ex->facts, ex->fields, sizeof(ex->fields));
}

static inline void fake_header(http_headers_t *h, const char *name, const char *value)
{
    http_headers_add_name(h, name, strlen(name));
    http_headers_end_name(h);
    http_headers_add_value(h, value, strlen(value));
    http_headers_end_value(h);
}

/* A request: a POST with a JSON-RPC body (parsed), or a GET when body is NULL. The agent
 * waits; a tools/call is classed non_idempotent unless the test says otherwise. */
static inline exchange_t *fake_exchange_new(const char *body)
{
    exchange_t *ex = xcalloc(1, sizeof(*ex));
    ex->waiting = true;
    ex->cls = TOOL_CLASS_NON_IDEMPOTENT;
    http_headers_init(&ex->req.headers);
    ex->req.body = evbuffer_new();
    ex->req.method = body ? HTTP_POST : HTTP_GET;
    if (body) {
        evbuffer_add(ex->req.body, body, strlen(body));
        assert_int_equal(mcp_parse(body, strlen(body), &ex->msg), MCP_OK);
        ex->has_msg = true;
    }
    return ex;
}

static inline void fake_exchange_free(exchange_t *ex)
{
    fake_detach(ex);
    if (ex->has_msg)
        mcp_msg_free(&ex->msg);
    http_headers_free(&ex->req.headers);
    evbuffer_free(ex->req.body);
    free(ex->body);
    free(ex->facts_kept);
    free(ex);
}

/* The upstream's answer, played to every observer in turn; HOLD if any held. */
static inline observe_t fake_head(exchange_t *ex, int status, const char *content_type,
                                  const char *content_encoding)
{
    http_headers_t h;
    http_headers_init(&h);
    if (content_type)
        fake_header(&h, "Content-Type", content_type);
    if (content_encoding)
        fake_header(&h, "Content-Encoding", content_encoding);
    bool sse = content_type && strncmp(content_type, "text/event-stream", 17) == 0;
    observe_t v = OBSERVE_PASS;
    for (int i = 0; i < ex->n_obs && !ex->detached; i++)
        if (ex->obs[i].ops->on_head &&
            ex->obs[i].ops->on_head(ex->obs[i].arg, status, &h, sse) == OBSERVE_HOLD)
            v = OBSERVE_HOLD;
    http_headers_free(&h);
    return v;
}

static inline observe_t fake_body(exchange_t *ex, const char *data, size_t len)
{
    observe_t v = OBSERVE_PASS;
    for (int i = 0; i < ex->n_obs && !ex->detached; i++)
        if (ex->obs[i].ops->on_body &&
            ex->obs[i].ops->on_body(ex->obs[i].arg, data, len) == OBSERVE_HOLD)
            v = OBSERVE_HOLD;
    return v;
}

static inline observe_t fake_end(exchange_t *ex, upstream_result_t res)
{
    observe_t v = OBSERVE_PASS;
    for (int i = 0; i < ex->n_obs && !ex->detached; i++)
        if (ex->obs[i].ops->on_end && ex->obs[i].ops->on_end(ex->obs[i].arg, res) == OBSERVE_HOLD)
            v = OBSERVE_HOLD;
    return v;
}

#endif
