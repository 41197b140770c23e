/* Which caller a message the stdio server sends on its own belongs to (stdio_int.h).
 *
 * One child may serve several callers (sessions: shared, and every sessionless caller of a
 * shared child), and a request or notification the server sends while it runs a call does not
 * say which call caused it. So a message is given to a caller only where no other caller can
 * be meant: the calls in flight on the child are all one caller's (a session, or a sessionless
 * caller's tag), or the child is one session's own. Anything else reaches no one: a request
 * gets an error back at once (the server need not wait out its own timeout), a notification is
 * dropped and counted. Progress is exact (its token is the call's own), and a list's change or
 * a subscribed resource's update is news for the sessions that asked for it.
 *
 * A request that is delivered goes under an id of the gateway's own, recorded with the caller
 * it went to; only that caller's answer, naming that id, is written to the server, under the
 * server's id. Another caller's answer, guessed or replayed, is refused before anything of its
 * POST reaches the server. */
#include "stdio_int.h"

#include "log.h"
#include "util.h"

#include <event2/bufferevent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *stdio_call_scope(const upstream_call_t *call, char out[SESSION_ID_MAX])
{
    if (call->sess)
        snprintf(out, SESSION_ID_MAX, "%s", call->sess->id);
    else
        snprintf(out, SESSION_ID_MAX, "caller:%s", call->caller);
    return out;
}

/* --- the server's requests, delivered and answered --- */

static void sreq_free(sreq_t *r)
{
    json_decref(r->server_id);
    free(r);
}

/* An error for the server's request id: no caller will answer it. */
static void refuse_request(child_t *c, json_t *id, const char *why)
{
    json_t *e = json_pack("{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id", id, "error", "code",
                          -32603, "message", why);
    stdio_child_write(c, e);
    json_decref(e);
}

static void deliver_request(child_t *c, upstream_call_t *target, json_t *msg)
{
    if (c->n_sreqs >= SREQ_MAX) {
        /* the oldest question was never answered: its caller will not now */
        sreq_t **pp = &c->sreqs;
        while ((*pp)->next)
            pp = &(*pp)->next;
        refuse_request(c, (*pp)->server_id, "the client did not answer in time");
        sreq_free(*pp);
        *pp = NULL;
        c->n_sreqs--;
    }
    sreq_t *r = xcalloc(1, sizeof(*r));
    r->gid = ++c->up->next_sreq;
    r->server_id = json_incref(json_object_get(msg, "id"));
    stdio_call_scope(target, r->scope);
    r->next = c->sreqs;
    c->sreqs = r;
    c->n_sreqs++;
    json_t *copy = json_copy(msg);
    json_object_set_new(copy, "id", json_integer((json_int_t)r->gid));
    stdio_call_deliver(target, copy);
    json_decref(copy);
}

/* The record of the request id names, delivered to scope; NULL when there is none. */
static sreq_t **sreq_find(child_t *c, const json_t *id, const char *scope)
{
    if (!json_is_integer(id))
        return NULL;
    for (sreq_t **pp = &c->sreqs; *pp; pp = &(*pp)->next)
        if ((*pp)->gid == (uint64_t)json_integer_value(id) && strcmp((*pp)->scope, scope) == 0)
            return pp;
    return NULL;
}

static bool is_response(json_t *m)
{
    return !json_object_get(m, "method") && json_object_get(m, "id") &&
           (json_object_get(m, "result") || json_object_get(m, "error"));
}

bool stdio_answers_belong(child_t *c, const upstream_call_t *call, json_t *msgs)
{
    char scope[SESSION_ID_MAX];
    stdio_call_scope(call, scope);
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m)
    {
        if (!json_object_get(m, "method") && !is_response(m))
            return false; /* neither a message nor an answer: nothing the server can use */
        if (is_response(m) && !sreq_find(c, json_object_get(m, "id"), scope))
            return false;
    }
    return true;
}

void stdio_answer_to_server(child_t *c, const upstream_call_t *call, json_t *msg)
{
    char scope[SESSION_ID_MAX];
    sreq_t **pp = sreq_find(c, json_object_get(msg, "id"), stdio_call_scope(call, scope));
    if (!pp)
        return; /* stdio_answers_belong let nothing else through */
    sreq_t *r = *pp;
    *pp = r->next;
    c->n_sreqs--;
    json_t *copy = json_copy(msg);
    json_object_set(copy, "id", r->server_id);
    stdio_child_write(c, copy);
    json_decref(copy);
    sreq_free(r);
}

void stdio_sreqs_gone(child_t *c, const char *scope)
{
    for (sreq_t **pp = &c->sreqs; *pp;) {
        sreq_t *r = *pp;
        if (strcmp(r->scope, scope) != 0) {
            pp = &r->next;
            continue;
        }
        refuse_request(c, r->server_id, "the client that was asked has gone");
        *pp = r->next;
        c->n_sreqs--;
        sreq_free(r);
    }
}

void stdio_sreqs_free(child_t *c)
{
    while (c->sreqs) {
        sreq_t *r = c->sreqs;
        c->sreqs = r->next;
        sreq_free(r);
    }
    c->n_sreqs = 0;
}

/* --- subscriptions --- */

void stdio_note_subscription(session_t *s, json_t *req)
{
    const char *method = json_string_value(json_object_get(req, "method"));
    json_t *uri = json_object_get(json_object_get(req, "params"), "uri");
    if (!s || !method || !json_is_string(uri))
        return;
    bool sub = strcmp(method, "resources/subscribe") == 0;
    if (!sub && strcmp(method, "resources/unsubscribe") != 0)
        return;
    if (!s->subs)
        s->subs = json_object();
    if (sub)
        json_object_set(s->subs, json_string_value(uri), json_true());
    else
        json_object_del(s->subs, json_string_value(uri));
}

/* --- what the server sends on its own --- */

static bool is_list_changed(const char *method)
{
    static const char *const news[] = {
        "notifications/tools/list_changed",
        "notifications/prompts/list_changed",
        "notifications/resources/list_changed",
    };
    for (size_t i = 0; i < ARRAY_LEN(news); i++)
        if (strcmp(method, news[i]) == 0)
            return true;
    return false;
}

/* Where the session hears news: its GET stream, else a stream of its calls. */
static upstream_call_t *news_stream(session_t *s)
{
    return s->get ? s->get : stdio_stream_of(s);
}

/* A progress notification goes to the call whose token it names, if that call streams. */
static void route_progress(child_t *c, json_t *msg)
{
    json_t *params = json_object_get(msg, "params");
    json_t *token = json_object_get(params, "progressToken");
    for (pend_t *p = c->pends; p && json_is_integer(token); p = p->next) {
        if ((uint64_t)json_integer_value(token) != p->gid || !p->orig_token)
            continue;
        if (p->call && p->call->mode == MODE_SSE) {
            json_object_set(params, "progressToken", p->orig_token);
            stdio_call_deliver(p->call, msg);
        }
        return;
    }
}

/* The stream of the one caller a message of the server's can belong to; NULL when none can be
 * told (*several: because calls of more than one caller are in flight). */
static upstream_call_t *owner_stream(child_t *c, bool *several)
{
    char first[SESSION_ID_MAX] = "", scope[SESSION_ID_MAX];
    upstream_call_t *streaming = NULL; /* the newest of that caller's calls that streams */
    session_t *sess = NULL;
    *several = false;
    for (pend_t *p = c->pends; p; p = p->next) {
        if (!p->call || p->init)
            continue;
        stdio_call_scope(p->call, scope);
        if (!*first)
            memcpy(first, scope, sizeof(first));
        else if (strcmp(first, scope) != 0) {
            *several = true;
            return NULL;
        }
        if (!streaming && p->call->mode == MODE_SSE && !p->call->end_queued)
            streaming = p->call;
        if (p->call->sess)
            sess = p->call->sess;
    }
    if (streaming)
        return streaming;
    if (sess)
        return stdio_stream_of(sess);
    /* nothing in flight: a child of one session's own speaks to that session */
    if (!*first && !c->shared && c->sessions && !c->sessions->cnext)
        return stdio_stream_of(c->sessions);
    return NULL;
}

void stdio_route_from_server(child_t *c, json_t *msg)
{
    const char *method = json_string_value(json_object_get(msg, "method"));
    json_t *id = json_object_get(msg, "id");
    if (!method) {
        log_warn(0,
                 "stdio upstream %s: pid %d wrote a message whose method is not a string, "
                 "dropped",
                 c->up->label, (int)c->pid);
        return;
    }
    if (strcmp(method, "notifications/progress") == 0) {
        route_progress(c, msg);
        return;
    }
    if (!id && is_list_changed(method)) {
        for (session_t *s = c->sessions; s; s = s->cnext) {
            upstream_call_t *to = news_stream(s);
            if (to)
                stdio_call_deliver(to, msg);
        }
        return;
    }
    if (!id && strcmp(method, "notifications/resources/updated") == 0) {
        const char *uri = json_string_value(json_object_get(json_object_get(msg, "params"), "uri"));
        for (session_t *s = c->sessions; s && uri; s = s->cnext) {
            upstream_call_t *to = json_object_get(s->subs, uri) ? news_stream(s) : NULL;
            if (to)
                stdio_call_deliver(to, msg);
        }
        return;
    }
    bool several;
    upstream_call_t *to = owner_stream(c, &several);
    if (to && id && to->modern) {
        /* the 2026 era has no requests from the server: its client would never answer */
        refuse_request(c, id, "the client speaks 2026-07-28, where a server sends no requests");
        return;
    }
    if (to && id) {
        deliver_request(c, to, msg);
        return;
    }
    if (to) {
        stdio_call_deliver(to, msg);
        return;
    }
    uint64_t n = ++c->up->unrouted;
    const char *why = several ? "calls of several clients are in flight on this shared server, "
                                "and the request does not say which it belongs to"
                              : "no client of this server has a stream open to carry it";
    /* a server that keeps talking to no one must not flood the log: the 1st, 2nd, 4th, ... */
    if ((n & (n - 1)) == 0)
        log_warn(0, "stdio upstream %s: pid %d: %s '%s' reaches no client: %s (%llu so far)",
                 c->up->label, (int)c->pid, id ? "request" : "notification", method, why,
                 (unsigned long long)n);
    if (id)
        refuse_request(c, id,
                       several ? "the gateway cannot tell which of its clients this request "
                                 "is for (sessions: per_session keeps them apart)"
                               : "no client is connected to answer it");
}
