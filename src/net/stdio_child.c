/* The stdio upstream's children (stdio_int.h): spawned and started (one at a time until the
 * command is proven), opened with initialize or, for 2026 callers, server/discover
 * (stdio_era.c), written to and read from, ended, and what their end means for the calls and
 * sessions that were on them. */

#include "stdio_int.h"

#include "log.h"
#include "util.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- children: spawn, write, read, end ---- */

void stdio_child_write(child_t *c, json_t *msg)
{
    char *s = json_dumps(msg, JSON_COMPACT);
    bool live = c->ready && c->in;
    struct evbuffer *to = live ? bufferevent_get_output(c->in) : c->held;
    if (to) {
        bool idle = live && evbuffer_get_length(to) == 0;
        evbuffer_add(to, s, strlen(s));
        evbuffer_add(to, "\n", 1);
        /* Nothing queued before it: written now, not when the loop next polls the pipe (a
         * round of the loop before the child could start on it). A socket bufferevent keeps
         * its output's front frozen but for its own writes, so the same is done here. What
         * the pipe does not take (full, or closed) stays for the bufferevent, which writes it
         * or reports the error as usual. */
        if (idle) {
            evbuffer_unfreeze(to, 1);
            (void)evbuffer_write(to, bufferevent_getfd(c->in));
            evbuffer_freeze(to, 1);
        }
    }
    free(s);
}

pend_t *stdio_pend_add(child_t *c, upstream_call_t *call, json_t *orig_id)
{
    pend_t *p = xcalloc(1, sizeof(*p));
    p->gid = ++c->next_gid;
    p->orig_id = json_incref(orig_id);
    p->call = call;
    p->next = c->pends;
    c->pends = p;
    return p;
}

static pend_t *pend_take(child_t *c, uint64_t gid)
{
    for (pend_t **pp = &c->pends; *pp; pp = &(*pp)->next)
        if ((*pp)->gid == gid) {
            pend_t *p = *pp;
            *pp = p->next;
            return p;
        }
    return NULL;
}

static void pend_free(pend_t *p)
{
    json_decref(p->orig_id);
    json_decref(p->orig_token);
    free(p);
}

void stdio_child_free(child_t *c)
{
    if (c->in)
        bufferevent_free(c->in);
    if (c->out)
        bufferevent_free(c->out);
    if (c->err)
        bufferevent_free(c->err);
    while (c->pends) {
        pend_t *p = c->pends;
        c->pends = p->next;
        pend_free(p);
    }
    if (c->held)
        evbuffer_free(c->held);
    if (c->start_timer)
        event_free(c->start_timer);
    if (c->probe_timer)
        event_free(c->probe_timer);
    if (c->unended)
        event_free(c->unended);
    json_decref(c->init_req);
    stdio_sreqs_free(c);
    json_decref(c->init_result);
    free(c);
}

/* Reaps what has exited; a child is freed once reaped and its pipes are done with. */
/* Whether c has exited, reaped now if so (its calls end, saying how it ended); not freed. */
static bool child_wait(child_t *c)
{
    int status;
    if (c->exited || c->pid <= 0 || waitpid(c->pid, &status, WNOHANG) != c->pid)
        return c->exited;
    c->exited = true;
    c->up->n_children--;
    char why[64];
    if (WIFSIGNALED(status))
        snprintf(why, sizeof(why), "the server was ended by signal %d", WTERMSIG(status));
    else
        snprintf(why, sizeof(why), "the server exited with status %d", WEXITSTATUS(status));
    log_info(0, "stdio upstream %s: pid %d: %s", c->up->label, (int)c->pid, why);
    stdio_proc_leader_gone(c);
    stdio_child_gone(c, why);
    return true;
}

void stdio_reap(stdio_up_t *up)
{
    for (child_t **pp = &up->children; *pp;) {
        child_t *c = *pp;
        child_wait(c);
        if (c->exited && c->gone) {
            *pp = c->next;
            stdio_child_free(c);
        } else {
            pp = &c->next;
        }
    }
}

void stdio_on_sigchld(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    stdio_reap(arg);
}

/* Asks the child's process group to end: stdin closed, SIGTERM, SIGKILL after the grace. */
void stdio_child_stop(child_t *c, const char *why)
{
    if (c->stopping || c->exited)
        return;
    c->stopping = true;
    if (c->pid <= 0) { /* never started: nothing runs */
        c->exited = true;
        c->up->n_children--;
        return;
    }
    log_info(0, "stdio upstream %s: stopping pid %d: %s", c->up->label, (int)c->pid, why);
    if (c->in) {
        bufferevent_free(c->in);
        c->in = NULL;
    }
    stdio_proc_stop(c);
}

/* A request the child never got ends with an error for its id: nothing of it ran. */
static void fail_unsent(upstream_call_t *call, pend_t *p, const char *why)
{
    json_t *e = json_pack("{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id", p->orig_id, "error",
                          "code", -32000, "message", why);
    stdio_call_deliver(call, e);
    json_decref(e);
    stdio_call_answered(call);
}

static void start_waiting(stdio_up_t *up);
static void era_waiter_fail(upstream_call_t *call, const char *why);

/* The child can serve no more: its sessions end and every call waiting on it ends CLOSED (a
 * protected call among them is recorded unknown by its owner). */
void stdio_child_gone(child_t *c, const char *why)
{
    if (c->gone)
        return;
    c->gone = true;
    stdio_up_t *up = c->up;
    if (up->shared == c)
        up->shared = NULL;
    if (up->shared26 == c)
        up->shared26 = NULL;
    stdio_proc_drain_err(c);
    char full[ERR_TAIL_MAX + 200];
    why = stdio_proc_why(c, why, full, sizeof(full));
    if (c->start_timer)
        evtimer_del(c->start_timer);
    if (c->probe_timer)
        evtimer_del(c->probe_timer);
    while (c->era_waiters) {
        upstream_call_t *call = c->era_waiters;
        c->era_waiters = call->wnext;
        call->wnext = NULL;
        call->child = NULL;
        era_waiter_fail(call, why);
    }
    /* what a child that never started, or never answered the gateway's initialize, holds in
     * c->held it never read: those calls fail as not sent. The others may have run. */
    bool unsent = c->pid <= 0 || (c->own_init && !c->ready);
    for (pend_t *p = c->pends; p; p = p->next) {
        upstream_call_t *call = p->call;
        if (!call || call->end_queued)
            continue;
        if (unsent) {
            fail_unsent(call, p, why);
            continue;
        }
        log_warn(0, "stdio upstream %s: pid %d: %s with a request in flight", up->label,
                 (int)c->pid, why);
        stdio_call_detach(call);
        stdio_call_end(call, UPSTREAM_ERR_CLOSED);
    }
    while (c->init_waiters) {
        upstream_call_t *call = c->init_waiters;
        c->init_waiters = call->wnext;
        session_t *s = call->sess;
        call->sess = NULL;
        stdio_session_discard(s);
        stdio_call_detach(call);
        stdio_add_header(&call->headers, "Retry-After", "5");
        stdio_call_error(call, 503, call->init_id, -32000, why);
    }
    while (c->sessions)
        stdio_session_end(c->sessions);
    if (c->out) {
        bufferevent_free(c->out);
        c->out = NULL;
    }
    stdio_proc_close_err(c);
    if (!c->exited)
        stdio_child_stop(c, why);
    if (up->starting == c) {
        up->starting = NULL;
        /* the command did not answer in start_timeout: those waiting behind it would each
         * wait as long again for the same answer, so they hear it now */
        for (child_t *w = up->children; c->start_timed_out && w; w = w->next)
            if (w->pid <= 0 && !w->gone && !w->stopping) {
                w->exited = true;
                up->n_children--;
                stdio_child_gone(w, why);
            }
        start_waiting(up);
    }
}

/* ---- what the child writes ---- */

static void send_init(child_t *c);
static json_t *initialize_req(uint64_t gid, const char *version, bool for_modern);

/* The child's era is known: the 2026 calls that waited for it are sent, in their order. */
static void era_settled(child_t *c, bool modern)
{
    c->era_known = true;
    c->modern = modern;
    upstream_call_t *order = NULL;
    while (c->era_waiters) { /* the list is newest first */
        upstream_call_t *call = c->era_waiters;
        c->era_waiters = call->wnext;
        call->wnext = order;
        order = call;
    }
    while (order) {
        upstream_call_t *call = order;
        order = call->wnext;
        call->wnext = NULL;
        json_t *msgs = call->parked;
        call->parked = NULL;
        stdio_call_send(c, call, msgs);
        json_decref(msgs);
    }
}

/* A 2026 call that waited for its child's era fails: nothing of it was sent. */
static void era_waiter_fail(upstream_call_t *call, const char *why)
{
    size_t i;
    json_t *m;
    call->outstanding = 1;
    json_array_foreach(call->parked, i, m) if (json_object_get(m, "id"))
    {
        json_t *e = json_pack("{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id",
                              json_object_get(m, "id"), "error", "code", -32000, "message", why);
        stdio_call_deliver(call, e);
        json_decref(e);
    }
    stdio_call_answered(call);
}

/* The answer to the server/discover that opened a child for 2026 callers. */
static void child_probed(child_t *c, json_t *msg)
{
    stdio_up_t *up = c->up;
    c->probe_gid = 0;
    if (c->probe_timer)
        evtimer_del(c->probe_timer);
    if (c->era_known)
        return; /* late: the child answered the initialize sent after it first */
    if (!stdio_era_discovered(msg)) {
        log_info(0,
                 "stdio upstream %s: pid %d does not speak the 2026-07-28 era: opened with "
                 "initialize, answered for 2026 callers by the gateway",
                 up->label, (int)c->pid);
        up->legacy_only = true;
        if (!c->init_out) {
            pend_t *p = stdio_pend_add(c, NULL, json_null());
            p->init = true;
            c->init_req = initialize_req(p->gid, NULL, true);
            send_init(c);
        }
        era_settled(c, false); /* their requests wait in held for the initialize's answer */
        return;
    }
    log_info(0, "stdio upstream %s: pid %d speaks the 2026-07-28 era", up->label, (int)c->pid);
    if (c->start_timer)
        evtimer_del(c->start_timer);
    c->init_result = json_incref(json_object_get(msg, "result"));
    c->initializing = false;
    c->ready = true;
    if (c->in && c->held)
        evbuffer_add_buffer(bufferevent_get_output(c->in), c->held);
    era_settled(c, true);
    if (!up->proven) {
        up->proven = true;
        up->starting = NULL;
        start_waiting(up);
    }
}

/* server/discover unanswered for DISCOVER_WAIT_MS: some 2025 servers drop a request that
 * comes before initialize, so initialize goes too; whichever is answered first decides. */
static void on_probe_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    child_t *c = arg;
    if (c->era_known || c->init_out)
        return;
    log_info(0,
             "stdio upstream %s: pid %d has not answered server/discover in %ums: sending "
             "initialize",
             c->up->label, (int)c->pid, (unsigned)DISCOVER_WAIT_MS);
    c->init_out = true;
    pend_t *p = stdio_pend_add(c, NULL, json_null());
    p->init = true;
    c->init_req = initialize_req(p->gid, NULL, true);
    send_init(c);
}

/* The initialize answer: waiters get it (a result registers their sessions). */
static void child_initialized(child_t *c, json_t *msg)
{
    if (c->modern)
        return; /* the initialize sent when server/discover was slow: the child chose 2026 */
    json_t *result = json_object_get(msg, "result");
    if (c->start_timer)
        evtimer_del(c->start_timer);
    if (result && json_is_object(result)) {
        if (c->own_init) {
            c->init_result = json_incref(result);
            json_t *note =
                json_pack("{s:s, s:s}", "jsonrpc", "2.0", "method", "notifications/initialized");
            c->ready = true;
            stdio_child_write(c, note);
            json_decref(note);
            if (c->in && c->held)
                evbuffer_add_buffer(bufferevent_get_output(c->in), c->held);
        }
    } else {
        result = NULL;
        log_warn(0, "stdio upstream %s: pid %d refused initialize", c->up->label, (int)c->pid);
    }
    c->initializing = false;
    if (!c->era_known) { /* it never answered server/discover: a 2025 server */
        c->up->legacy_only = true;
        era_settled(c, false);
    }
    while (c->init_waiters) {
        upstream_call_t *call = c->init_waiters;
        c->init_waiters = call->wnext;
        call->wnext = NULL;
        json_t *answer = json_deep_copy(msg);
        json_object_set(answer, "id", call->init_id);
        if (result && call->sess) {
            stdio_session_register(call->sess, c);
            stdio_call_link(call, call->sess);
        } else {
            stdio_session_discard(call->sess);
            call->sess = NULL;
        }
        call->outstanding = 1;
        json_array_append_new(call->answers, answer);
        stdio_call_answered(call);
    }
    if (!result)
        stdio_child_stop(c, "initialize refused");
    else if (!c->shared && !c->sessions)
        stdio_child_stop(c, "the initialize that started it was given up");
    if (result && !c->up->proven) {
        /* the command runs: those waiting to start may all start now */
        c->up->proven = true;
        c->up->starting = NULL;
        start_waiting(c->up);
    }
}

/* Where a message the server sends on its own goes: the newest call of the session still
 * streaming, else the session's GET stream; NULL: nowhere (dropped). */
upstream_call_t *stdio_stream_of(session_t *s)
{
    for (upstream_call_t *call = s ? s->calls : NULL; call; call = call->snext)
        if (call->mode == MODE_SSE && !call->end_queued)
            return call;
    return s ? s->get : NULL;
}

void stdio_child_message(child_t *c, json_t *msg)
{
    if (!json_is_object(msg)) {
        log_warn(0,
                 "stdio upstream %s: pid %d wrote a JSON value that is not a JSON-RPC "
                 "message, dropped",
                 c->up->label, (int)c->pid);
        return;
    }
    if (json_object_get(msg, "method")) {
        stdio_route_from_server(c, msg);
        return;
    }
    json_t *id = json_object_get(msg, "id");
    pend_t *p = json_is_integer(id) ? pend_take(c, (uint64_t)json_integer_value(id)) : NULL;
    if (!p) {
        log_warn(0, "stdio upstream %s: pid %d answered a request it was not sent, dropped",
                 c->up->label, (int)c->pid);
        return;
    }
    if (p->probe) {
        child_probed(c, msg);
    } else if (p->init) {
        child_initialized(c, msg);
    } else if (p->call) {
        if (p->call->modern && !c->modern)
            stdio_era_bridge_answer(msg, c->init_result, p->discover, p->cacheable);
        json_object_set(msg, "id", p->orig_id);
        stdio_call_deliver(p->call, msg);
        stdio_call_answered(p->call);
    }
    pend_free(p);
}

bool stdio_answer_lost(child_t *c, uint64_t gid)
{
    pend_t *p = pend_take(c, gid);
    if (!p)
        return false;
    upstream_call_t *call = p->call;
    if (call && !call->end_queued) {
        stdio_call_detach(call);
        stdio_call_end(call, UPSTREAM_ERR_PROTOCOL);
    }
    pend_free(p);
    return true;
}

static void on_child_out_event(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    child_t *c = arg;
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        /* most often it exited: how is the better why, when it is known already */
        if (!child_wait(c))
            stdio_child_gone(c, "the server closed its output");
        stdio_reap(c->up);
    }
}

static void on_child_in_event(struct bufferevent *bev, short what, void *arg)
{
    child_t *c = arg;
    if ((what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) && c->in == bev) {
        bufferevent_free(c->in);
        c->in = NULL;
        stdio_child_gone(c, "the server closed its input");
    }
}

static struct bufferevent *pipe_bev(stdio_up_t *up, int fd)
{
    evutil_make_socket_nonblocking(fd);
    return bufferevent_socket_new(up->base, fd, BEV_OPT_CLOSE_ON_FREE);
}

/* An own_init child's initialize goes first, once the child runs. */
static void send_init(child_t *c)
{
    if (!c->init_req || !c->in)
        return;
    char *line = json_dumps(c->init_req, JSON_COMPACT);
    evbuffer_add(bufferevent_get_output(c->in), line, strlen(line));
    evbuffer_add(bufferevent_get_output(c->in), "\n", 1);
    free(line);
    json_decref(c->init_req);
    c->init_req = NULL;
}

static void on_start_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    child_t *c = arg;
    char why[96];
    snprintf(why, sizeof(why), "no answer to initialize within %llus of its start",
             (unsigned long long)(c->up->conf.start_timeout_ms / 1000));
    log_warn(0, "stdio upstream %s: pid %d: %s", c->up->label, (int)c->pid, why);
    c->start_timed_out = true;
    stdio_child_gone(c, why);
    stdio_reap(c->up);
}

/* server/discover's deadline, from the start of a running child that was sent one. */
static void arm_probe(child_t *c)
{
    if (!c->probe_gid || c->pid <= 0 || c->probe_timer)
        return;
    struct timeval tv = util_ms_to_tv(DISCOVER_WAIT_MS);
    c->probe_timer = evtimer_new(c->up->base, on_probe_timeout, c);
    evtimer_add(c->probe_timer, &tv);
}

/* Runs c's program and wires its pipes to the loop; what waited for it goes to it. */
static bool child_exec(child_t *c, char *why, size_t whylen)
{
    stdio_up_t *up = c->up;
    int fds[3];
    if (!stdio_proc_spawn(c, fds, why, whylen))
        return false;
    c->in = pipe_bev(up, fds[0]);
    c->out = pipe_bev(up, fds[1]);
    c->err = pipe_bev(up, fds[2]);
    bufferevent_setcb(c->in, NULL, NULL, on_child_in_event, c);
    bufferevent_setcb(c->out, stdio_lines_read, NULL, on_child_out_event, c);
    bufferevent_enable(c->in, EV_WRITE);
    bufferevent_enable(c->out, EV_READ);
    stdio_proc_watch_err(c);
    uint64_t ms = up->conf.start_timeout_ms;
    struct timeval tv = util_ms_to_tv(ms);
    c->start_timer = evtimer_new(up->base, on_start_timeout, c);
    evtimer_add(c->start_timer, &tv);
    arm_probe(c);
    send_init(c);
    if (c->ready)
        evbuffer_add_buffer(bufferevent_get_output(c->in), c->held);
    if (!up->proven)
        up->starting = c;
    log_info(0, "stdio upstream %s: started pid %d (%s)", up->label, (int)c->pid,
             c->shared     ? "shared"
             : c->own_init ? "one caller"
                           : "one session");
    return true;
}

/* Children that wait to start: all of them once one child of the command has answered
 * initialize, else the oldest, alone. */
static void start_waiting(stdio_up_t *up)
{
    while (!up->starting) {
        child_t *next = NULL;
        for (child_t *c = up->children; c; c = c->next)
            if (c->pid <= 0 && !c->gone && !c->stopping)
                next = c; /* the list is newest first: the last is the oldest */
        if (!next)
            return;
        char why[300];
        if (!child_exec(next, why, sizeof(why))) {
            next->exited = true;
            up->n_children--;
            stdio_child_gone(next, why); /* freed by the next stdio_reap */
        }
        if (up->proven)
            up->starting = NULL;
    }
}

/* Children running or starting, not those being stopped. */
static int live_children(const stdio_up_t *up)
{
    int n = 0;
    for (const child_t *c = up->children; c; c = c->next)
        n += !c->stopping && !c->exited;
    return n;
}

/* At max_children: the session used least recently that has no call in flight on a child of
 * its own ends (an agent that left without DELETE leaves such sessions until idle_timeout).
 * false when every child is busy or shared. */
static bool evict_idle(stdio_up_t *up)
{
    session_t *oldest = NULL;
    for (child_t *c = up->children; c; c = c->next) {
        session_t *s = c->sessions;
        if (c->shared || c->stopping || c->exited || c->pid <= 0 || !s || s->cnext ||
            c->init_waiters)
            continue;
        bool busy = false;
        for (pend_t *p = c->pends; p && !busy; p = p->next)
            busy = p->call != NULL || p->init;
        if (!busy && (!oldest || s->last_ms < oldest->last_ms))
            oldest = s;
    }
    if (!oldest)
        return false;
    log_info(0,
             "stdio upstream %s: max_children (%d) reached: ending session %.8s…, idle for %llus, "
             "the least recently used",
             up->label, up->conf.max_children, oldest->id,
             (unsigned long long)((util_now_ms() - oldest->last_ms) / 1000));
    stdio_session_end(oldest);
    return true;
}

/* A child, started now, or once the first of its command has (it then waits with what is
 * written to it); NULL with why after a log line. */
child_t *stdio_child_spawn(stdio_up_t *up, bool shared, bool own_init, char *why, size_t whylen)
{
    if (live_children(up) >= up->conf.max_children && !evict_idle(up)) {
        snprintf(why, whylen, "max_children (%d) servers are running, each with a call in flight",
                 up->conf.max_children);
        log_warn(0, "stdio upstream %s: not started: %s", up->label, why);
        return NULL;
    }
    child_t *c = xcalloc(1, sizeof(*c));
    c->up = up;
    c->shared = shared;
    c->own_init = own_init;
    c->ready = !own_init;
    c->era_known = !own_init;
    c->held = evbuffer_new();
    c->next = up->children;
    up->children = c;
    up->n_children++;
    if (up->starting) {
        log_info(0, "stdio upstream %s: waiting for pid %d, the first of this command, to start",
                 up->label, (int)up->starting->pid);
        return c;
    }
    if (!child_exec(c, why, whylen)) {
        up->children = c->next;
        up->n_children--;
        stdio_child_free(c);
        return NULL;
    }
    return c;
}

/* The initialize a child the gateway opens itself gets. It is told the client can do what any
 * client might (a client that cannot answers that request with an error), in version (the first
 * session's) or the newest 2025 one; for 2026 callers nothing: their era has no requests from
 * the server, so none would reach them. */
static json_t *initialize_req(uint64_t gid, const char *version, bool for_modern)
{
    json_t *caps = for_modern ? json_object()
                              : json_pack("{s:{s:{}}, s:{}, s:{s:b}}", "elicitation", "form",
                                          "sampling", "roots", "listChanged", 0);
    json_t *params =
        json_pack("{s:s, s:o, s:{s:s, s:s}}", "protocolVersion", version ? version : "2025-11-25",
                  "capabilities", caps, "clientInfo", "name", "idemgw", "version", "0.1.0");
    return json_pack("{s:s, s:I, s:s, s:o}", "jsonrpc", "2.0", "id", (json_int_t)gid, "method",
                     "initialize", "params", params);
}

/* A child the gateway starts and opens itself: the shared one, or a sessionless caller's own;
 * for 2026 callers (for_modern) with server/discover, else with initialize. */
child_t *stdio_own_child(stdio_up_t *up, bool shared, const char *version, bool for_modern,
                         char *why, size_t whylen)
{
    child_t *c = stdio_child_spawn(up, shared, true, why, whylen);
    if (!c)
        return NULL;
    c->for_modern = for_modern;
    pend_t *p = stdio_pend_add(c, NULL, json_null());
    p->init = true;
    if (for_modern && !up->legacy_only) {
        p->probe = true;
        c->probe_gid = p->gid;
        c->init_req = stdio_era_discover(p->gid);
    } else {
        c->era_known = true;
        c->init_req = initialize_req(p->gid, version, for_modern);
    }
    send_init(c); /* written ahead of what waits for ready */
    arm_probe(c); /* a child that started at once (the command is proven) */
    c->initializing = true;
    return c;
}

/* Where shared-mode callers of an era go: 2026 callers to a child of their own era, unless the
 * command is known to speak only 2025 (then the one child serves both, bridged). */
static child_t **shared_slot(stdio_up_t *up, bool modern)
{
    return modern && (up->shared26 || !up->legacy_only) ? &up->shared26 : &up->shared;
}

/* The shared child of the caller's era, started when none is. */
child_t *stdio_shared_child(stdio_up_t *up, json_t *init_params, bool modern, char *why,
                            size_t whylen)
{
    child_t **slot = shared_slot(up, modern);
    if (*slot)
        return *slot;
    const char *version = json_string_value(json_object_get(init_params, "protocolVersion"));
    child_t *c = stdio_own_child(up, true, version, slot == &up->shared26, why, whylen);
    if (c)
        *slot = c;
    return c;
}
