/* The stdio upstream (upstream_stdio.h): children spawned with posix_spawn in a session of
 * their own, pipes on the event loop, JSON-RPC ids rewritten per child, answers handed to the
 * owner from a per-call event so no callback ever runs inside open or inside a read of the
 * child's output. */

#include "upstream_stdio.h"

#include "log.h"
#include "util.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/rand.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "stdio_int.h"

/* ---- delivery to the owner ---- */

static void kick_now(upstream_call_t *call)
{
    if (!call->paused)
        event_active(call->kick, EV_TIMEOUT, 0);
}

static void set_timer(upstream_call_t *call, uint64_t ms)
{
    struct timeval tv = util_ms_to_tv(ms);
    evtimer_add(call->timer, &tv);
}

void stdio_add_header(http_headers_t *h, const char *name, const char *value)
{
    http_headers_add_name(h, name, strlen(name));
    http_headers_end_name(h);
    http_headers_add_value(h, value, strlen(value));
    http_headers_end_value(h);
}

static void queue_head(upstream_call_t *call, int status, const char *content_type)
{
    call->status = status;
    if (content_type)
        stdio_add_header(&call->headers, "Content-Type", content_type);
    if (content_type && strcmp(content_type, "text/event-stream") == 0)
        stdio_add_header(&call->headers, "Cache-Control", "no-cache");
    if (call->sess && !call->sess->hidden)
        stdio_add_header(&call->headers, "Mcp-Session-Id", call->sess->id);
    call->head_queued = true;
    kick_now(call);
}

void stdio_call_end(upstream_call_t *call, upstream_result_t res)
{
    if (call->end_queued)
        return;
    call->end_queued = true;
    call->res = res;
    evtimer_del(call->timer);
    kick_now(call);
}

/* The call no longer waits for anything: its pending requests' answers will be dropped. */
void stdio_call_detach(upstream_call_t *call)
{
    if (call->child)
        for (pend_t *p = call->child->pends; p; p = p->next)
            if (p->call == call)
                p->call = NULL;
    if (call->child) {
        for (upstream_call_t **w = &call->child->init_waiters; *w; w = &(*w)->wnext)
            if (*w == call) {
                *w = call->wnext;
                break;
            }
        for (upstream_call_t **w = &call->child->era_waiters; *w; w = &(*w)->wnext)
            if (*w == call) {
                *w = call->wnext;
                break;
            }
        if (call->full && call->child->n_full-- == 1 && call->child->out)
            bufferevent_enable(call->child->out, EV_READ);
    }
    call->full = false;
    session_t *s = call->sess;
    if (s && s->get == call)
        s->get = NULL;
    call->outstanding = 0;
    call->child = NULL; /* it may be freed before the call's last delivery */
}

/* A call of a registered session is on the session's list until it is freed, so a session
 * that ends first can let go of it (call->sess NULL) whatever state the call is in. */
void stdio_call_link(upstream_call_t *call, session_t *s)
{
    call->sess = s;
    call->sprev = NULL;
    call->snext = s->calls;
    if (s->calls)
        s->calls->sprev = call;
    s->calls = call;
}

static void call_unlink(upstream_call_t *call)
{
    session_t *s = call->sess;
    if (!s || !(call->sprev || s->calls == call))
        return;
    if (call->sprev)
        call->sprev->snext = call->snext;
    else
        s->calls = call->snext;
    if (call->snext)
        call->snext->sprev = call->sprev;
    call->snext = call->sprev = NULL;
}

static void call_free(upstream_call_t *call)
{
    stdio_call_detach(call);
    call_unlink(call);
    /* an initialize that ends here leaves no session behind */
    if (call->init_id && call->sess)
        stdio_session_discard(call->sess);
    json_decref(call->parked);
    event_free(call->kick);
    event_free(call->timer);
    evbuffer_free(call->out);
    http_headers_free(&call->headers);
    json_decref(call->answers);
    json_decref(call->init_id);
    free(call);
}

static void on_kick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    upstream_call_t *call = arg;
    if (call->paused)
        return;
    if (call->head_queued && !call->head_sent) {
        call->head_sent = true;
        call->cb.on_head(call->arg, call->status, &call->headers);
        if (call->paused)
            return;
    }
    size_t n = evbuffer_get_length(call->out);
    if (n > 0 && call->head_sent) {
        char *data = (char *)evbuffer_pullup(call->out, -1);
        call->cb.on_body(call->arg, data, n);
        evbuffer_drain(call->out, n);
        if (call->full) {
            call->full = false;
            if (call->child && call->child->n_full-- == 1 && call->child->out)
                bufferevent_enable(call->child->out, EV_READ);
        }
        if (call->paused)
            return;
    }
    if (call->end_queued) {
        stdio_call_detach(call);
        call->cb.on_end(call->arg, call->res);
        call_free(call);
    }
}

static void on_call_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    upstream_call_t *call = arg;
    bool init = call->init_id != NULL;
    child_t *c = call->child;
    log_warn(0, "stdio upstream %s: %s", call->up->label,
             init              ? "no answer to initialize in time"
             : call->cancelled ? "a cancelled request was not answered: it ends unanswered"
                               : "the answer went silent for too long");
    upstream_result_t res =
        call->head_queued ? UPSTREAM_ERR_IDLE_TIMEOUT : UPSTREAM_ERR_HEAD_TIMEOUT;
    stdio_call_detach(call);
    stdio_call_end(call, res);
    /* a child that never answered its initialize is of no use to anyone */
    if (init && c && !c->init_result && !c->init_waiters)
        stdio_child_stop(c, "no answer to initialize");
}

static upstream_call_t *call_new(stdio_up_t *up, const upstream_cbs_t *cbs, void *arg)
{
    upstream_call_t *call = xcalloc(1, sizeof(*call));
    call->up = up;
    call->cb = *cbs;
    call->arg = arg;
    call->mode = MODE_FIXED;
    call->out = evbuffer_new();
    http_headers_init(&call->headers);
    call->kick = event_new(up->base, -1, 0, on_kick, call);
    call->timer = evtimer_new(up->base, on_call_timer, call);
    return call;
}

/* An answer made here: status, a body, done. */
static upstream_call_t *answer_fixed(upstream_call_t *call, int status, const char *content_type,
                                     const char *body)
{
    call->mode = MODE_FIXED;
    queue_head(call, status, body ? content_type : NULL);
    if (body)
        evbuffer_add(call->out, body, strlen(body));
    stdio_call_end(call, UPSTREAM_OK);
    return call;
}

/* A JSON-RPC error as the answer (id null: the request could not be read or routed). */
upstream_call_t *stdio_call_error(upstream_call_t *call, int status, json_t *id, int code,
                                  const char *message)
{
    json_t *e = json_pack("{s:s, s:O?, s:{s:i, s:s}}", "jsonrpc", "2.0", "id",
                          id ? id : json_null(), "error", "code", code, "message", message);
    char *body = json_dumps(e, JSON_COMPACT);
    json_decref(e);
    answer_fixed(call, status, "application/json", body);
    free(body);
    return call;
}

/* A message for the agent on the call's stream (an event) or in its JSON answer. */
void stdio_call_deliver(upstream_call_t *call, json_t *msg)
{
    if (call->mode == MODE_JSON) {
        if (!json_object_get(msg, "method"))
            json_array_append(call->answers, msg);
        return;
    }
    char *s = json_dumps(msg, JSON_COMPACT);
    evbuffer_add_printf(call->out, "event: message\ndata: %s\n\n", s);
    free(s);
    if (call->mode == MODE_SSE && !call->cancelled)
        set_timer(call, call->up->limits->idle_timeout_ms);
    if (call->paused && !call->full && evbuffer_get_length(call->out) > OUT_HIGH_WATER &&
        call->child && call->child->shared) {
        /* one caller that stops reading must not stall the others of a shared child: its call
         * is cut off instead (a protected one is then recorded unknown by its owner) */
        log_warn(0,
                 "stdio upstream %s: a client is not reading its answer (%zu bytes waiting): "
                 "its call is cut off, the shared server goes on",
                 call->up->label, evbuffer_get_length(call->out));
        stdio_call_detach(call);
        stdio_call_end(call, UPSTREAM_ERR_CLOSED);
        return;
    }
    if (call->paused && !call->full && evbuffer_get_length(call->out) > OUT_HIGH_WATER &&
        call->child) {
        /* a child of one caller's own waits for that caller to read */
        call->full = true;
        if (call->child->n_full++ == 0 && call->child->out)
            bufferevent_disable(call->child->out, EV_READ);
    }
    kick_now(call);
}

/* One of the call's requests got its answer. */
void stdio_call_answered(upstream_call_t *call)
{
    if (--call->outstanding > 0)
        return;
    if (call->mode == MODE_JSON) {
        json_t *body = call->batch ? json_incref(call->answers)
                                   : json_incref(json_array_get(call->answers, 0));
        char *s = body ? json_dumps(body, JSON_COMPACT) : NULL;
        json_decref(body);
        queue_head(call, 200, "application/json");
        if (s)
            evbuffer_add(call->out, s, strlen(s));
        free(s);
    }
    stdio_call_detach(call);
    stdio_call_end(call, UPSTREAM_OK);
}

/* ---- sessions ---- */

static session_t **bucket(stdio_up_t *up, const char *id)
{
    return &up->buckets[util_fnv1a64(id) % SESSION_BUCKETS];
}

/* A session by its id; hidden: a sessionless caller's (by "caller:" and its tag), which no
 * Mcp-Session-Id header can name. */
static session_t *session_find(stdio_up_t *up, const char *id, bool hidden)
{
    for (session_t *s = *bucket(up, id); s; s = s->hnext)
        if (s->hidden == hidden && strcmp(s->id, id) == 0)
            return s;
    return NULL;
}

static void on_idle(evutil_socket_t fd, short what, void *arg);

static void session_touch(session_t *s)
{
    s->last_ms = util_now_ms();
    uint64_t ms = s->up->conf.idle_timeout_ms;
    struct timeval tv = util_ms_to_tv(ms);
    evtimer_add(s->idle, &tv);
}

static session_t *session_new(stdio_up_t *up)
{
    session_t *s = xcalloc(1, sizeof(*s));
    unsigned char raw[16];
    if (RAND_bytes(raw, sizeof(raw)) != 1) {
        for (size_t i = 0; i < sizeof(raw); i++)
            raw[i] = (unsigned char)(util_now_ms() >> (i % 8)) ^ (unsigned char)rand();
    }
    util_hex(raw, sizeof(raw), s->id);
    s->up = up;
    s->idle = evtimer_new(up->base, on_idle, s);
    return s;
}

void stdio_session_register(session_t *s, child_t *c)
{
    s->child = c;
    s->cnext = c->sessions;
    if (c->sessions)
        c->sessions->cprev = s;
    c->sessions = s;
    session_t **b = bucket(s->up, s->id);
    s->hnext = *b;
    *b = s;
    s->registered = true;
    session_touch(s);
}

/* Frees a session that was never registered (its initialize failed). */
void stdio_session_discard(session_t *s)
{
    if (!s || s->registered)
        return;
    event_free(s->idle);
    json_decref(s->caps);
    json_decref(s->subs);
    free(s);
}

/* The session is over: its id answers 404 from now on; its GET stream ends. A per_session
 * child is stopped with it (its calls in flight then end CLOSED); a shared one keeps running
 * what the session sent. */
void stdio_session_end(session_t *s)
{
    stdio_up_t *up = s->up;
    for (session_t **p = bucket(up, s->id); *p; p = &(*p)->hnext)
        if (*p == s) {
            *p = s->hnext;
            break;
        }
    child_t *c = s->child;
    if (c) {
        stdio_sreqs_gone(c, s->id);
        if (s->cprev)
            s->cprev->cnext = s->cnext;
        else
            c->sessions = s->cnext;
        if (s->cnext)
            s->cnext->cprev = s->cprev;
    }
    if (s->get) {
        upstream_call_t *get = s->get;
        stdio_call_detach(get);
        stdio_call_end(get, UPSTREAM_OK);
    }
    while (s->calls) {
        upstream_call_t *call = s->calls;
        s->calls = call->snext;
        call->snext = call->sprev = NULL;
        call->sess = NULL;
    }
    event_free(s->idle);
    json_decref(s->caps);
    json_decref(s->subs);
    free(s);
    if (c && !c->shared && !c->sessions)
        stdio_child_stop(c, "its session ended");
}

static void on_idle(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    session_t *s = arg;
    /* a tool still running is not idleness */
    for (upstream_call_t *call = s->calls; call; call = call->snext)
        if (call->outstanding > 0) {
            session_touch(s);
            return;
        }
    /* how long it really was: a session whose agent dropped its GET stream ends sooner */
    log_info(0, "stdio upstream %s: session %.8s… idle for %llus, ended", s->up->label, s->id,
             (unsigned long long)((util_now_ms() - s->last_ms + 500) / 1000));
    stdio_session_end(s);
}

/* A sessionless caller of a per_session server has a child of its own, as a session would:
 * a session no header names, found by the caller's tag, reaped when idle. */
static session_t *caller_session(stdio_up_t *up, const char *caller, bool modern, char *why,
                                 size_t whylen)
{
    char id[SESSION_ID_MAX];
    snprintf(id, sizeof(id), "%s:%s", modern ? "caller26" : "caller", caller);
    session_t *s = session_find(up, id, true);
    if (s)
        return s;
    child_t *c = stdio_own_child(up, false, NULL, modern, why, whylen);
    if (!c)
        return NULL;
    s = session_new(up);
    s->hidden = true;
    memcpy(s->id, id, sizeof(s->id));
    stdio_session_register(s, c);
    return s;
}

/* ---- requests from the agent ---- */

/* Sends one request of call to c with an id of c's own; its progress token goes with it. */
static pend_t *send_request(child_t *c, upstream_call_t *call, json_t *req)
{
    pend_t *p = stdio_pend_add(c, call, json_object_get(req, "id"));
    json_t *copy = json_deep_copy(req);
    json_object_set_new(copy, "id", json_integer((json_int_t)p->gid));
    json_t *meta = json_object_get(json_object_get(copy, "params"), "_meta");
    json_t *token = json_object_get(meta, "progressToken");
    if (token) {
        p->orig_token = json_incref(token);
        json_object_set_new(meta, "progressToken", json_integer((json_int_t)p->gid));
    }
    stdio_child_write(c, copy);
    json_decref(copy);
    if (call)
        call->outstanding++;
    return p;
}

/* The agent cancels one of its requests: the child hears of it by the id it saw. */
static void send_cancel(child_t *c, upstream_call_t *call, json_t *note)
{
    json_t *params = json_object_get(note, "params");
    json_t *rid = json_object_get(params, "requestId");
    /* only the caller's own call: another's id (2026 clients all start at 1) names nothing */
    char mine[SESSION_ID_MAX], theirs[SESSION_ID_MAX];
    stdio_call_scope(call, mine);
    for (pend_t *p = c->pends; p && rid; p = p->next) {
        if (!p->call || strcmp(stdio_call_scope(p->call, theirs), mine) != 0 ||
            !json_equal(p->orig_id, rid))
            continue;
        json_t *copy = json_deep_copy(note);
        json_object_set_new(json_object_get(copy, "params"), "requestId",
                            json_integer((json_int_t)p->gid));
        stdio_child_write(c, copy);
        json_decref(copy);
        /* a server need not answer a cancelled request (most do not): its caller has stopped
         * waiting, and neither its stream nor a drain waits for it longer than the grace */
        if (p->call->outstanding == 1 && !p->call->cancelled) {
            p->call->cancelled = true;
            set_timer(p->call, CANCEL_GRACE_MS);
        }
        return;
    }
}

/* A header of the request: the agent's, else one the gateway adds in extra_headers. Copied
 * into out (cut to its size); false when there is none. */
static bool req_header(const upstream_request_t *req, const char *name, char *out, size_t outlen)
{
    const char *v = req->headers ? http_headers_get(req->headers, name) : NULL;
    size_t nlen = strlen(name);
    for (const char *l = req->extra_headers; !v && l && *l;) {
        size_t len = strcspn(l, "\r\n");
        if (len > nlen && l[nlen] == ':' && util_strncaseeq(l, nlen, name)) {
            const char *val = l + nlen + 1;
            while (*val == ' ' || *val == '\t')
                val++;
            snprintf(out, outlen, "%.*s", (int)(len - (size_t)(val - l)), val);
            return true;
        }
        l += len;
        l += strspn(l, "\r\n");
    }
    if (!v)
        return false;
    snprintf(out, outlen, "%s", v);
    return true;
}

static bool accepts_sse(const upstream_request_t *req)
{
    char accept[512];
    return !req_header(req, "accept", accept, sizeof(accept)) ||
           strstr(accept, "text/event-stream") || strstr(accept, "*/*");
}

static upstream_call_t *open_initialize(stdio_up_t *up, upstream_call_t *call, json_t *req)
{
    char why[300];
    json_t *id = json_object_get(req, "id");
    call->mode = MODE_JSON;
    call->answers = json_array();
    call->init_id = json_incref(id);
    call->sess = session_new(up);
    call->sess->caps = json_incref(json_object_get(json_object_get(req, "params"), "capabilities"));
    child_t *c;
    if (up->conf.sessions == STDIO_SHARED) {
        c = stdio_shared_child(up, json_object_get(req, "params"), false, why, sizeof(why));
    } else {
        c = stdio_child_spawn(up, false, false, why, sizeof(why));
        if (c) {
            pend_t *p = stdio_pend_add(c, NULL, json_null());
            p->init = true;
            json_t *copy = json_deep_copy(req);
            json_object_set_new(copy, "id", json_integer((json_int_t)p->gid));
            stdio_child_write(c, copy);
            json_decref(copy);
        }
    }
    if (!c) {
        stdio_session_discard(call->sess);
        call->sess = NULL;
        stdio_add_header(&call->headers, "Retry-After", "5");
        return stdio_call_error(call, 503, id, -32000, why);
    }
    call->child = c;
    if (c->init_result) {
        json_t *answer =
            json_pack("{s:s, s:O, s:O}", "jsonrpc", "2.0", "id", id, "result", c->init_result);
        stdio_session_register(call->sess, c);
        stdio_call_link(call, call->sess);
        call->outstanding = 1;
        json_array_append_new(call->answers, answer);
        stdio_call_answered(call);
        return call;
    }
    /* no timer of the call's own: starting a server is not a tool call, and the child's start
     * deadline (start_timeout) answers every initialize waiting on it */
    call->wnext = c->init_waiters;
    c->init_waiters = call;
    return call;
}

static bool is_request(json_t *m)
{
    return json_is_string(json_object_get(m, "method")) && json_object_get(m, "id");
}

static upstream_call_t *open_post(stdio_up_t *up, upstream_call_t *call,
                                  const upstream_request_t *req, const char *sid)
{
    size_t len = req->body ? evbuffer_get_length(req->body) : 0;
    char *data = len ? (char *)evbuffer_pullup(req->body, -1) : NULL;
    json_error_t jerr;
    json_t *body = data ? json_loadb(data, len, 0, &jerr) : NULL;
    if (req->body)
        evbuffer_drain(req->body, len);
    if (!body || !(json_is_object(body) || (json_is_array(body) && json_array_size(body) > 0))) {
        json_decref(body);
        return stdio_call_error(call, 400, NULL, -32700, "Parse error: the body is not JSON-RPC");
    }
    json_t *msgs = json_is_array(body) ? json_incref(body) : json_pack("[O]", body);
    call->batch = json_is_array(body);
    json_decref(body);
    size_t i;
    json_t *m;
    size_t n_requests = 0;
    json_t *init = NULL;
    json_array_foreach(msgs, i, m)
    {
        json_t *mv = json_is_object(m) ? json_object_get(m, "method") : NULL;
        bool answer = json_is_object(m) && !mv && json_object_get(m, "id") &&
                      (json_object_get(m, "result") || json_object_get(m, "error"));
        if (!json_is_object(m) || (mv && !json_is_string(mv)) || (!mv && !answer)) {
            json_decref(msgs);
            return stdio_call_error(call, 400, NULL, -32600,
                                    "Invalid Request: neither a request, a notification nor an "
                                    "answer");
        }
        n_requests += is_request(m);
        const char *method = json_string_value(json_object_get(m, "method"));
        if (method && strcmp(method, "initialize") == 0 && is_request(m))
            init = m;
    }
    if (init) {
        if (json_array_size(msgs) != 1) {
            json_decref(msgs);
            return stdio_call_error(call, 400, NULL, -32600,
                                    "Invalid Request: initialize must be sent alone");
        }
        json_incref(init);
        json_decref(msgs);
        upstream_call_t *r = open_initialize(up, call, init);
        json_decref(init);
        return r;
    }
    char version[64];
    call->modern = stdio_era_of_request(
        req_header(req, "mcp-protocol-version", version, sizeof(version)) ? version : NULL, msgs);
    child_t *c;
    char why[300];
    session_t *s = NULL;
    if (sid) {
        s = session_find(up, sid, false);
        if (!s) {
            json_decref(msgs);
            return stdio_call_error(call, 404, NULL, -32001, "Session not found");
        }
    } else if (up->conf.sessions != STDIO_SHARED) {
        s = caller_session(up, call->caller, call->modern, why, sizeof(why));
    }
    if (s) {
        session_touch(s);
        stdio_call_link(call, s);
        c = s->child;
    } else if (sid || up->conf.sessions != STDIO_SHARED ||
               !(c = stdio_shared_child(up, NULL, call->modern, why, sizeof(why)))) {
        json_decref(msgs);
        stdio_add_header(&call->headers, "Retry-After", "5");
        return stdio_call_error(call, 503, NULL, -32000, why);
    }
    /* an answer goes to the server only from the client its request went to, and only all of
     * a POST's answers or none */
    if (!stdio_answers_belong(c, call, msgs)) {
        json_decref(msgs);
        log_warn(0,
                 "stdio upstream %s: an answer names no request the server sent this client: "
                 "refused",
                 up->label);
        return stdio_call_error(call, 400, NULL, -32600,
                                "Invalid Request: the answer names no request the server sent "
                                "to this client");
    }
    if (c->in && evbuffer_get_length(bufferevent_get_output(c->in)) > IN_HIGH_WATER) {
        json_decref(msgs);
        stdio_add_header(&call->headers, "Retry-After", "1");
        return stdio_call_error(call, 503, NULL, -32000, "the MCP server is not reading its input");
    }
    call->child = c;
    if (n_requests > 0) {
        call->mode = accepts_sse(req) ? MODE_SSE : MODE_JSON;
        call->answers = json_array();
    }
    if (n_requests > 0 && !c->era_known) {
        /* what a 2026 request becomes depends on what the child speaks: it waits to know */
        call->parked = json_incref(msgs);
        call->wnext = c->era_waiters;
        c->era_waiters = call;
    } else {
        stdio_call_send(c, call, msgs);
    }
    json_decref(msgs);
    if (n_requests == 0)
        return answer_fixed(call, 202, NULL, NULL);
    if (call->mode == MODE_SSE)
        queue_head(call, 200, "text/event-stream");
    set_timer(call, up->limits->idle_timeout_ms);
    return call;
}

/* The messages of a POST to c. A 2026 caller's to a 2025 child are bridged: server/discover
 * becomes a ping the gateway answers for, from the child's initialize (stdio_era.c). */
void stdio_call_send(child_t *c, upstream_call_t *call, json_t *msgs)
{
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m)
    {
        const char *method = json_string_value(json_object_get(m, "method"));
        if (is_request(m) && call->modern && !c->modern && strcmp(method, "server/discover") == 0) {
            json_t *ping = json_pack("{s:s, s:O, s:s}", "jsonrpc", "2.0", "id",
                                     json_object_get(m, "id"), "method", "ping");
            send_request(c, call, ping)->discover = true;
            json_decref(ping);
        } else if (is_request(m)) {
            stdio_note_subscription(call->sess, m);
            send_request(c, call, m)->cacheable =
                call->modern && !c->modern && stdio_era_cacheable(method);
        } else if (!method) {
            stdio_answer_to_server(c, call, m);
        } else if (strcmp(method, "notifications/cancelled") == 0) {
            send_cancel(c, call, m);
        } else if (strcmp(method, "notifications/initialized") == 0 && c->own_init) {
            ; /* the gateway said it when it initialized the child */
        } else {
            stdio_child_write(c, m);
        }
    }
}

static upstream_call_t *stdio_open(void *state, const upstream_request_t *req,
                                   const upstream_cbs_t *cbs, void *arg)
{
    stdio_up_t *up = state;
    upstream_call_t *call = call_new(up, cbs, arg);
    snprintf(call->caller, sizeof(call->caller), "%s", req->caller ? req->caller : "");
    size_t plen = strcspn(req->target, "?");
    if (plen != strlen(up->path) || strncmp(req->target, up->path, plen) != 0) {
        if (req->body)
            evbuffer_drain(req->body, evbuffer_get_length(req->body));
        return answer_fixed(call, 404, "text/plain", "Not Found\n");
    }
    char sid_buf[128];
    const char *sid = req_header(req, "mcp-session-id", sid_buf, sizeof(sid_buf)) ? sid_buf : NULL;
    if (strcmp(req->method, "POST") == 0)
        return open_post(up, call, req, sid);
    if (req->body)
        evbuffer_drain(req->body, evbuffer_get_length(req->body));
    if (strcmp(req->method, "GET") != 0 && strcmp(req->method, "DELETE") != 0) {
        stdio_add_header(&call->headers, "Allow", "GET, POST, DELETE");
        return answer_fixed(call, 405, "text/plain", "Method Not Allowed\n");
    }
    if (!sid) {
        stdio_add_header(&call->headers, "Allow", "POST");
        return stdio_call_error(call, 405, NULL, -32000,
                                "Method Not Allowed: no session (send Mcp-Session-Id)");
    }
    session_t *s = session_find(up, sid, false);
    if (!s)
        return stdio_call_error(call, 404, NULL, -32001, "Session not found");
    if (strcmp(req->method, "DELETE") == 0) {
        stdio_session_end(s);
        return answer_fixed(call, 200, NULL, NULL);
    }
    /* A second GET replaces the first: a reconnecting client's old stream is likely dead. */
    if (s->get) {
        upstream_call_t *old = s->get;
        stdio_call_detach(old);
        stdio_call_end(old, UPSTREAM_OK);
    }
    call->mode = MODE_GET;
    stdio_call_link(call, s);
    call->child = s->child;
    s->get = call;
    queue_head(call, 200, "text/event-stream");
    return call;
}

static void stdio_pause(void *state, upstream_call_t *call, bool paused)
{
    (void)state;
    call->paused = paused;
    if (!paused)
        event_active(call->kick, EV_TIMEOUT, 0);
}

static void stdio_abandon(void *state, upstream_call_t *call)
{
    (void)state;
    /* The agent dropped its session's GET stream: clients keep one open for the session's
     * life, so unless it comes back (or a request comes) soon, the agent has left without a
     * DELETE and its child need not wait out the whole idle_timeout. */
    session_t *s =
        call->mode == MODE_GET && call->sess && call->sess->get == call && !call->sess->hidden
            ? call->sess
            : NULL;
    call_free(call);
    if (s && s->up->conf.idle_timeout_ms > GONE_GRACE_MS &&
        s->up->conf.idle_timeout_ms <= STDIO_IDLE_TIMEOUT_MAX_MS) { /* not the wrapper's */
        struct timeval tv = util_ms_to_tv(GONE_GRACE_MS);
        evtimer_add(s->idle, &tv);
    }
}

/* Ids are the gateway's own per child: an answer cannot be another request's. Nothing to do. */
static void stdio_discard(void *state, upstream_call_t *call)
{
    (void)state;
    (void)call;
}

static void stdio_free(void *state)
{
    stdio_up_t *up = state;
    stdio_proc_end_all(up);
    for (size_t b = 0; b < SESSION_BUCKETS; b++)
        while (up->buckets[b]) {
            session_t *s = up->buckets[b];
            up->buckets[b] = s->hnext;
            while (s->calls) {
                upstream_call_t *call = s->calls;
                call_free(call);
            }
            event_free(s->idle);
            json_decref(s->caps);
            json_decref(s->subs);
            free(s);
        }
    while (up->children) {
        child_t *c = up->children;
        up->children = c->next;
        while (c->init_waiters) {
            upstream_call_t *call = c->init_waiters;
            c->init_waiters = call->wnext;
            stdio_session_discard(call->sess);
            call->sess = NULL;
            call->child = NULL;
            call_free(call);
        }
        for (pend_t *p = c->pends; p; p = p->next)
            p->call = NULL;
        stdio_child_free(c);
    }
    if (up->sigchld)
        event_free(up->sigchld);
    for (size_t i = 0; up->conf.argv && up->conf.argv[i]; i++)
        free(up->conf.argv[i]);
    free(up->conf.argv);
    for (size_t i = 0; up->conf.env && up->conf.env[i]; i++)
        free(up->conf.env[i]);
    free(up->conf.env);
    for (size_t i = 0; up->conf.pass_env && up->conf.pass_env[i]; i++)
        free(up->conf.pass_env[i]);
    free(up->conf.pass_env);
    free(up->conf.cwd);
    free(up->path);
    free(up->label);
    free(up);
}

static const upstream_ops_t stdio_ops = {
    .name = "stdio",
    .wants_caller = true,
    .open = stdio_open,
    .pause = stdio_pause,
    .abandon = stdio_abandon,
    .discard = stdio_discard,
    .free = stdio_free,
};

static char **strv_dup(char *const *v)
{
    if (!v)
        return NULL;
    size_t n = 0;
    while (v[n])
        n++;
    char **out = xcalloc(n + 1, sizeof(char *));
    for (size_t i = 0; i < n; i++)
        out[i] = xstrdup(v[i]);
    return out;
}

upstream_t *upstream_stdio_new(const upstream_stdio_opts_t *opts)
{
    stdio_up_t *up = xcalloc(1, sizeof(*up));
    up->base = opts->base;
    up->conf = *opts->conf;
    up->conf.argv = strv_dup(opts->conf->argv);
    up->conf.env = strv_dup(opts->conf->env);
    up->conf.pass_env = strv_dup(opts->conf->pass_env); /* a reload frees the config's */
    up->conf.cwd = opts->conf->cwd ? xstrdup(opts->conf->cwd) : NULL;
    up->path = xstrdup(opts->path ? opts->path : "/mcp");
    up->limits = opts->limits;
    up->max_line = opts->max_line ? opts->max_line : (4u << 20);
    const char *slash = strrchr(up->conf.argv[0], '/');
    const char *prog = slash ? slash + 1 : up->conf.argv[0];
    /* several servers may run the same program (node, npx, uvx): the name tells them apart */
    up->label = opts->server ? xasprintf("%s (%s)", opts->server, prog) : xstrdup(prog);
    up->sigchld = evsignal_new(up->base, SIGCHLD, stdio_on_sigchld, up);
    event_add(up->sigchld, NULL);
    upstream_t *u = xcalloc(1, sizeof(*u));
    u->ops = &stdio_ops;
    u->state = up;
    return u;
}

int upstream_stdio_children(const upstream_t *u)
{
    if (!u || u->ops != &stdio_ops)
        return 0;
    const stdio_up_t *up = u->state;
    return up->n_children;
}
