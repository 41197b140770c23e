/* The stdio server's stdout as lines of JSON-RPC (stdio_int.h): a line at a time to the
 * message router of upstream_stdio.c; a line over the size limit skipped, the answer it held
 * (its id read from its ends) failed; a last line written without its newline taken as one. */
#include "stdio_int.h"

#include "log.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static void child_line(child_t *c, const char *line, size_t len)
{
    while (len > 0 && (line[len - 1] == '\r' || line[len - 1] == ' '))
        len--;
    if (len == 0)
        return;
    json_error_t jerr;
    json_t *msg = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!msg) {
        /* the line is not NUL-terminated: its own length bounds what is quoted */
        log_warn(0, "stdio upstream %s: pid %d wrote a line that is not JSON (%.*s%s), dropped",
                 c->up->label, (int)c->pid, (int)(len > 60 ? 60 : len), line,
                 len > 60 ? "…" : "");
        return;
    }
    if (json_is_array(msg)) {
        size_t i;
        json_t *m;
        json_array_foreach(msg, i, m) stdio_child_message(c, m);
    } else {
        stdio_child_message(c, msg);
    }
    json_decref(msg);
}

/* The id of an over-long line, from its ends ("id":N as JSON writers put it first or last). */
static bool long_line_id(const child_t *c, uint64_t *gid)
{
    const char *ends[2] = {c->head, c->tail};
    for (int i = 0; i < 2; i++) {
        const char *at = strstr(ends[i], "\"id\":");
        if (!at)
            continue;
        char *end;
        unsigned long long v = strtoull(at + 5, &end, 10);
        if (end != at + 5 && (*end == ',' || *end == '}')) {
            *gid = v;
            return true;
        }
    }
    return false;
}

static void long_line_done(child_t *c)
{
    c->skipping = false;
    uint64_t gid;
    bool lost = long_line_id(c, &gid) && stdio_answer_lost(c, gid);
    log_warn(0, "stdio upstream %s: pid %d wrote a line over %zu bytes, dropped%s", c->up->label,
             (int)c->pid, c->up->max_line, lost ? " (the answer to a request: it fails)" : "");
}

static void keep_tail(child_t *c, const char *data, size_t n)
{
    if (n >= LONG_LINE_KEEP) {
        memcpy(c->tail, data + n - LONG_LINE_KEEP, LONG_LINE_KEEP);
        c->tail_len = LONG_LINE_KEEP;
    } else {
        size_t keep = c->tail_len + n > LONG_LINE_KEEP ? LONG_LINE_KEEP - n : c->tail_len;
        memmove(c->tail, c->tail + c->tail_len - keep, keep);
        memcpy(c->tail + keep, data, n);
        c->tail_len = keep + n;
    }
    c->tail[c->tail_len] = '\0';
}

/* A message the server wrote without its newline (some write their last line so): taken as a
 * line once nothing more came for a moment and what came reads as whole JSON (no proper
 * prefix of a JSON object or array is one). Else the call would wait out its idle timeout. */
static void on_unended(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    child_t *c = arg;
    if (c->gone || !c->out || c->skipping)
        return;
    struct evbuffer *in = bufferevent_get_input(c->out);
    size_t n = evbuffer_get_length(in);
    if (n == 0 || evbuffer_search_eol(in, NULL, NULL, EVBUFFER_EOL_LF).pos >= 0)
        return;
    char *data = (char *)evbuffer_pullup(in, (ssize_t)n);
    json_t *whole = json_loadb(data, n, JSON_REJECT_DUPLICATES, NULL);
    if (!whole)
        return; /* the rest is still to come */
    json_decref(whole);
    log_warn(0, "stdio upstream %s: pid %d wrote a message without its newline: taken as a line",
             c->up->label, (int)c->pid);
    child_line(c, data, n);
    evbuffer_drain(in, n);
}

void stdio_lines_read(struct bufferevent *bev, void *arg)
{
    child_t *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    while (!c->gone && c->out) {
        size_t eol_len;
        struct evbuffer_ptr eol = evbuffer_search_eol(in, NULL, &eol_len, EVBUFFER_EOL_LF);
        size_t avail = evbuffer_get_length(in);
        if (c->skipping) {
            size_t n = eol.pos >= 0 ? (size_t)eol.pos : avail;
            if (n > 0) {
                char *data = (char *)evbuffer_pullup(in, (ssize_t)n);
                keep_tail(c, data, n);
            }
            evbuffer_drain(in, n + (eol.pos >= 0 ? eol_len : 0));
            if (eol.pos < 0)
                return;
            long_line_done(c);
            continue;
        }
        if (eol.pos < 0) {
            if (avail <= c->up->max_line) {
                if (avail > 0) {
                    if (!c->unended)
                        c->unended = evtimer_new(c->up->base, on_unended, c);
                    struct timeval tv = {0, UNENDED_WAIT_MS * 1000};
                    evtimer_add(c->unended, &tv);
                }
                return;
            }
            c->skipping = true;
            c->head_len = LONG_LINE_KEEP;
            evbuffer_copyout(in, c->head, c->head_len);
            c->head[c->head_len] = '\0';
            c->tail_len = 0;
            continue;
        }
        if ((size_t)eol.pos > c->up->max_line) {
            c->skipping = true;
            evbuffer_copyout(in, c->head, LONG_LINE_KEEP);
            c->head[LONG_LINE_KEEP] = '\0';
            c->tail_len = 0;
            continue;
        }
        char *line = (char *)evbuffer_pullup(in, eol.pos + (ssize_t)eol_len);
        child_line(c, line, (size_t)eol.pos);
        evbuffer_drain(in, (size_t)eol.pos + eol_len);
    }
}
