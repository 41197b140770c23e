/* Streams kept for resumption: the raw bytes of a POST's SSE stream and where each event id
 * ends in them, so an agent that drops the stream can pick it up with GET + Last-Event-ID
 * while the gateway still reads the upstream's stream (the upstream would refuse a second
 * reader); with several workers, the resume goes to the worker that reads the stream. */
#include "resume.h"
#include "handoff.h"
#include "log.h"
#include "subject.h"
#include "util.h"

#include <event2/buffer.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Past this many bytes the gateway stops keeping a stream and a resume goes to the upstream. */
#define RESUME_LOG_MAX (1024 * 1024)

void proxy_session_maybe_idle(proxy_t *p, const char *session)
{
    if (!session || p->ctx.n_workers < 2)
        return;
    for (exchange_t *o = p->tracked; o; o = o->next_tracked) {
        const char *s2 = exchange_session(o);
        if (s2 && strcmp(s2, session) == 0)
            return;
    }
    if (!p->hooks.session_busy || !p->hooks.session_busy(p->hooks.arg, session))
        handoff_note_stream(session, false);
}

void resume_stop(exchange_t *ex)
{
    if (!ex->sse_tracking)
        return;
    exchange_t **pp = &ex->proxy->tracked;
    while (*pp != ex)
        pp = &(*pp)->next_tracked;
    *pp = ex->next_tracked;
    ex->sse_tracking = false;
    proxy_session_maybe_idle(ex->proxy, exchange_session(ex));
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

void resume_start(exchange_t *ex)
{
    proxy_t *p = ex->proxy;
    ex->sse_tracking = true;
    ex->next_tracked = p->tracked;
    p->tracked = ex;
    handoff_note_stream(exchange_session(ex), true);
    ex->sse_log = evbuffer_new();
    sse_init(&ex->sse_ids, 64 * 1024, on_stream_event, ex);
}

void resume_feed(exchange_t *ex, const char *data, size_t len)
{
    if (!ex->sse_tracking)
        return;
    if (ex->sse_total + len > RESUME_LOG_MAX) {
        resume_stop(ex);
        return;
    }
    sse_feed(&ex->sse_ids, data, len);
    evbuffer_add(ex->sse_log, data, len);
    ex->sse_total += len;
}

/* A GET with Last-Event-ID for a stream the gateway still reads: the upstream would refuse a
 * second reader, so the gateway serves the resume itself, from the bytes it kept, and then
 * passes on the rest live. The agent may still look connected on the old stream (its close
 * not yet seen): resuming says it has left, so that connection is closed. */
static bool resume_stream(exchange_t *get)
{
    proxy_t *p = get->proxy;
    const char *last = http_headers_get(&get->req->headers, "last-event-id");
    const char *session = exchange_session(get);
    if (!last || !session)
        return false;
    for (exchange_t *ex = p->tracked; ex; ex = ex->next_tracked) {
        const char *s2 = exchange_session(ex);
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
        exchange_attach_agent(ex, conn);
        ex->keep_alive = get->req->keep_alive;
        struct evbuffer *out = http_conn_output(conn);
        char *cors = exchange_own_cors(get);
        char *extra = xasprintf("Cache-Control: no-cache\r\nMcp-Session-Id: %s\r\n%s", session,
                                cors ? cors : "");
        free(cors);
        http_write_response_head(out, 200, "text/event-stream", NULL, -1, ex->keep_alive, extra);
        free(extra);
        if (ex->sse_unheld > from) {
            size_t n = ex->sse_unheld - from;
            const char *bytes = (const char *)evbuffer_pullup(ex->sse_log, -1) + from;
            http_chunk_add(out, bytes, n);
        }
        log_info(get->conn_id, "stream resumed from the gateway after event %s", last);
        exchange_set_state(get, EX_DONE);
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

bool resume_serve(exchange_t *get)
{
    return resume_stream(get) || hand_off_resume(get);
}
