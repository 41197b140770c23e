/* Streams kept for resumption: the raw bytes of a POST's SSE stream and where each event id
 * ends in them, so an agent that drops the stream can pick it up with GET + Last-Event-ID
 * while the gateway still reads the upstream's stream (the upstream would refuse a second
 * reader); with several workers, the resume goes to the worker that reads the stream. */
#include "resume.h"
#include "handoff.h"
#include "proxy_int.h"
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
    for (exchange_t *o = p->exchanges.tracked; o; o = o->next_tracked) {
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
    exchange_t **pp = &ex->proxy->exchanges.tracked;
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
    ex->next_tracked = p->exchanges.tracked;
    p->exchanges.tracked = ex;
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

exchange_t *resume_find(const exchange_t *get, const char *session, const char *last, size_t *from)
{
    proxy_t *p = get->proxy;
    for (exchange_t *ex = p->exchanges.tracked; ex; ex = ex->next_tracked) {
        const char *s2 = exchange_session(ex);
        if (!s2 || strcmp(s2, session) != 0 || ex->answered)
            continue;
        /* a session id and an event id are not credentials: the resume must come from the
         * caller of the stream it resumes, or it is the upstream's to judge */
        if (!subject_same_caller(p->ctx.subject, ex->req, get->req)) {
            log_info(get->conn_id, "stream resume not served from the gateway: another caller "
                                   "than the stream's");
            return NULL;
        }
        for (size_t i = 0; i < ex->n_marks; i++) {
            if (strcmp(ex->marks[i].id, last) == 0) {
                *from = ex->marks[i].end;
                return ex;
            }
        }
    }
    return NULL;
}

void resume_replay(const exchange_t *ex, size_t from, struct evbuffer *out)
{
    if (ex->sse_unheld <= from)
        return;
    size_t n = ex->sse_unheld - from;
    const char *bytes = (const char *)evbuffer_pullup(ex->sse_log, -1) + from;
    http_chunk_add(out, bytes, n);
}
