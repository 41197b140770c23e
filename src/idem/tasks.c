/* MCP Tasks across sessions (see include/tasks.h). */
#include "tasks.h"

#include "log.h"
#include "mcp.h"
#include "subject.h"
#include "util.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct task_route {
    char *task_id, *subject, *session;
    uint64_t expires_ms;
} task_route_t;

struct task_routes {
    task_route_t routes[TASK_ROUTES_MAX];
    size_t next; /* the slot a new task takes */
};

task_routes_t *task_routes_new(void)
{
    return xcalloc(1, sizeof(task_routes_t));
}

static void route_clear(task_route_t *t)
{
    free(t->task_id);
    free(t->subject);
    free(t->session);
    memset(t, 0, sizeof(*t));
}

void task_routes_free(task_routes_t *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < TASK_ROUTES_MAX; i++)
        route_clear(&r->routes[i]);
    free(r);
}

bool task_result_of(const char *result, size_t len, char **task_id, uint64_t *ttl_ms)
{
    /* every recorded result is asked: one that names no taskId, not even escaped, is none,
     * and needs no tree (most results are a few text contents) */
    if (!result || len == 0 || (!memmem(result, len, "taskId", 6) && !memchr(result, '\\', len))) {
        if (task_id)
            *task_id = NULL;
        if (ttl_ms)
            *ttl_ms = 0;
        return false;
    }
    json_t *root = json_loadb(result, len, 0, NULL);
    const json_t *task = json_object_get(root, "task");
    const char *rt = json_string_value(json_object_get(root, "resultType"));
    if (!json_is_object(task) && rt && strcmp(rt, "task") == 0)
        task = root; /* the 2026 flat form: the task's members in the result */
    const char *id = json_string_value(json_object_get(task, "taskId"));
    const json_t *ttl = json_object_get(task, "ttl");
    bool is_task = id && *id;
    if (task_id)
        *task_id = is_task ? xstrdup(id) : NULL;
    if (ttl_ms)
        *ttl_ms = is_task && json_is_integer(ttl) && json_integer_value(ttl) > 0
                      ? (uint64_t)json_integer_value(ttl)
                      : 0;
    json_decref(root);
    return is_task;
}

static task_route_t *find(const task_routes_t *r, const char *task_id)
{
    for (size_t i = 0; i < TASK_ROUTES_MAX; i++)
        if (r->routes[i].task_id && strcmp(r->routes[i].task_id, task_id) == 0)
            return (task_route_t *)&r->routes[i];
    return NULL;
}

void task_routes_note(task_routes_t *r, const char *result, size_t len, const char *subject,
                      const char *session, uint64_t expires_ms)
{
    char *id = NULL;
    if (!session || !*session || !subject || !task_result_of(result, len, &id, NULL))
        return;
    for (const char *s = session; *s; s++) {
        if ((unsigned char)*s <= 0x20 || (unsigned char)*s >= 0x7f) {
            free(id); /* not a session id this gateway would send on */
            return;
        }
    }
    task_route_t *t = find(r, id);
    if (!t) {
        t = &r->routes[r->next];
        r->next = (r->next + 1) % TASK_ROUTES_MAX;
    }
    route_clear(t);
    t->task_id = id;
    t->subject = xstrdup(subject);
    t->session = xstrdup(session);
    t->expires_ms = expires_ms;
}

const char *task_routes_session(const task_routes_t *r, const char *task_id, const char *subject,
                                uint64_t now_ms)
{
    const task_route_t *t = task_id ? find(r, task_id) : NULL;
    if (!t || now_ms >= t->expires_ms || strcmp(t->subject, subject) != 0)
        return NULL;
    return t->session;
}

char *task_request_id(const char *body, size_t len)
{
    json_t *root = json_loadb(body, len, 0, NULL);
    const char *id = json_string_value(json_object_get(json_object_get(root, "params"), "taskId"));
    char *out = id ? xstrdup(id) : NULL;
    json_decref(root);
    return out;
}

/* --- forwarding to the task's session --- */

typedef struct task_watch {
    exchange_t *ex;
    char *task_id, *session;
    struct event *later;
    bool gone; /* the server does not know the session any more */
} task_watch_t;

static void session_gone(evutil_socket_t fd, short what, void *arg)
{
    task_watch_t *w = arg;
    char msg[400];
    snprintf(msg, sizeof(msg),
             "task %.100s was created in an earlier session of yours (%.80s), which has ended: "
             "the server no longer knows it, and the task's status and result ended with it. "
             "Nothing was executed.",
             w->task_id, w->session);
    const mcp_msg_t *m = exchange_msg(w->ex);
    char *body = mcp_error_body(m ? m->id_text : NULL, -32602, msg);
    exchange_replace_answer(w->ex, body); /* may free the exchange, and w */
    free(body);
}

static observe_t watch_head(void *arg, int status, const http_headers_t *headers, bool sse)
{
    task_watch_t *w = arg;
    /* the spec's answer to an ended session is 404; some servers (server-everything) say 400
     * "No valid session ID": for a request that reached its server only by its session, both
     * mean the session is not there */
    w->gone = status == 404 || status == 400;
    return w->gone ? OBSERVE_HOLD : OBSERVE_PASS;
}

static observe_t watch_end(void *arg, upstream_result_t res)
{
    task_watch_t *w = arg;
    if (!w->gone)
        return OBSERVE_PASS;
    struct timeval zero = {0, 0};
    evtimer_add(w->later, &zero);
    return OBSERVE_HOLD;
}

static void watch_detach(void *arg)
{
    task_watch_t *w = arg;
    event_free(w->later);
    free(w->task_id);
    free(w->session);
    free(w);
}

static const response_observer_t watch_ops = {
    .on_head = watch_head,
    .on_end = watch_end,
    .detach = watch_detach,
};

void task_forward_to(exchange_t *ex, struct event_base *base, const char *task_id,
                     const char *session)
{
    task_watch_t *w = xcalloc(1, sizeof(*w));
    w->ex = ex;
    w->task_id = xstrdup(task_id);
    w->session = xstrdup(session);
    w->later = evtimer_new(base, session_gone, w);
    exchange_add_observer(ex, &watch_ops, w);
    char extra[300];
    exchange_set_facts(ex, &(exchange_facts_t){.task_session = "routed"});
    snprintf(extra, sizeof(extra), "Mcp-Session-Id: %.200s\r\n", session);
    exchange_forward(ex, extra, false);
}

/* --- the task poll handler --- */

struct task_poll {
    task_poll_ctx_t ctx;
};

/* A poll while its caller is being resolved. */
typedef struct task_ask {
    task_poll_t *poll;
    exchange_t *ex;
    char *task_id;
} task_ask_t;

static void on_task_subject(void *arg, const subject_result_t *res)
{
    task_ask_t *a = arg;
    const char *session = res->subject ? task_routes_session(a->poll->ctx.routes, a->task_id,
                                                             res->subject, util_now_ms())
                                       : NULL;
    const char *own = http_headers_get(&exchange_request(a->ex)->headers, "mcp-session-id");
    if (session && (!own || strcmp(own, session) != 0))
        task_forward_to(a->ex, a->poll->ctx.base, a->task_id, session);
    else
        exchange_forward(a->ex, NULL, false);
    free(a->task_id);
    free(a);
}

handler_verdict_t task_poll_offer(void *arg, exchange_t *ex)
{
    task_poll_t *p = arg;
    const mcp_msg_t *m = exchange_msg(ex);
    if (!m || m->kind != MCP_KIND_REQUEST || !m->method ||
        (strcmp(m->method, "tasks/get") != 0 && strcmp(m->method, "tasks/result") != 0 &&
         strcmp(m->method, "tasks/cancel") != 0))
        return HANDLER_PASS;
    struct evbuffer *b = exchange_request(ex)->body;
    char *id = task_request_id((const char *)evbuffer_pullup(b, -1), evbuffer_get_length(b));
    if (!id) {
        exchange_forward(ex, NULL, false);
        return HANDLER_TAKEN;
    }
    task_ask_t *a = xcalloc(1, sizeof(*a));
    a->poll = p;
    a->ex = ex;
    a->task_id = id;
    subject_resolve(p->ctx.subject, exchange_request(ex), on_task_subject, a);
    return HANDLER_TAKEN;
}

task_poll_t *task_poll_new(const task_poll_ctx_t *ctx)
{
    task_poll_t *p = xcalloc(1, sizeof(*p));
    p->ctx = *ctx;
    return p;
}

void task_poll_free(task_poll_t *p)
{
    free(p);
}
