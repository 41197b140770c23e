#include "sse.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

void sse_init(sse_parser_t *p, size_t max_event, sse_event_cb cb, void *arg)
{
    memset(p, 0, sizeof(*p));
    p->max_event = max_event;
    p->cb = cb;
    p->arg = arg;
}

void sse_free(sse_parser_t *p)
{
    free(p->line);
    free(p->data);
    free(p->id);
    memset(p, 0, sizeof(*p));
}

static void grow(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return;
    size_t n = *cap ? *cap : 256;
    while (n < need)
        n *= 2;
    *buf = xrealloc(*buf, n);
    *cap = n;
}

static void reset_event(sse_parser_t *p)
{
    p->data_len = 0;
    p->event[0] = '\0';
    p->has_data = false;
    p->overflow = false;
    /* the id persists across events per the SSE spec, but we only report it per event */
    free(p->id);
    p->id = NULL;
}

static int dispatch(sse_parser_t *p)
{
    int rc = 0;
    if (p->has_data && !p->overflow) {
        grow(&p->data, &p->data_cap, p->data_len + 1);
        p->data[p->data_len] = '\0';
        sse_event_t ev = {p->event, p->id, p->data, p->data_len};
        rc = p->cb ? p->cb(&ev, p->arg) : 0;
    }
    reset_event(p);
    return rc;
}

/* One complete line (without its terminator). */
static int process_line(sse_parser_t *p, const char *line, size_t len)
{
    if (len == 0)
        return dispatch(p);
    if (line[0] == ':')
        return 0; /* comment */
    const char *colon = memchr(line, ':', len);
    size_t flen = colon ? (size_t)(colon - line) : len;
    const char *val = colon ? colon + 1 : line + len;
    size_t vlen = colon ? len - flen - 1 : 0;
    if (vlen && *val == ' ') {
        val++;
        vlen--;
    }
    if (flen == 4 && memcmp(line, "data", 4) == 0) {
        size_t need = p->data_len + (p->has_data ? 1 : 0) + vlen;
        if (p->max_event && need > p->max_event) {
            p->overflow = true;
            p->has_data = true;
            return 0;
        }
        if (p->overflow)
            return 0;
        grow(&p->data, &p->data_cap, need + 1);
        if (p->has_data)
            p->data[p->data_len++] = '\n';
        memcpy(p->data + p->data_len, val, vlen);
        p->data_len += vlen;
        p->has_data = true;
    } else if (flen == 5 && memcmp(line, "event", 5) == 0) {
        size_t n = vlen < sizeof(p->event) - 1 ? vlen : sizeof(p->event) - 1;
        memcpy(p->event, val, n);
        p->event[n] = '\0';
    } else if (flen == 2 && memcmp(line, "id", 2) == 0) {
        free(p->id);
        p->id = xstrndup(val, vlen);
    }
    /* retry: and unknown fields are ignored */
    return 0;
}

/* Skips one UTF-8 byte order mark at the start of the stream (the SSE spec ignores it), which
 * may arrive split across feeds. Returns how many bytes of buf it took. */
static size_t skip_bom(sse_parser_t *p, const char *buf, size_t len)
{
    static const unsigned char bom[3] = {0xEF, 0xBB, 0xBF};
    size_t i = 0;
    while (!p->bom_done && i < len) {
        if ((unsigned char)buf[i] != bom[p->bom_matched]) {
            p->bom_done = true;
            if (p->bom_matched) {
                /* not a BOM after all: the bytes taken begin the first line */
                grow(&p->line, &p->line_cap, p->bom_matched + 1);
                memcpy(p->line, bom, p->bom_matched);
                p->line_len = p->bom_matched;
            }
            break;
        }
        i++;
        if (++p->bom_matched == sizeof(bom))
            p->bom_done = true;
    }
    return i;
}

int sse_feed(sse_parser_t *p, const char *buf, size_t len)
{
    size_t i = skip_bom(p, buf, len);
    if (p->last_cr && i < len && buf[i] == '\n')
        i++;
    p->last_cr = false;
    while (i < len) {
        const char *start = buf + i;
        size_t rest = len - i, k = 0;
        while (k < rest && start[k] != '\n' && start[k] != '\r')
            k++;
        if (k == rest) {
            /* partial line: keep it, unless it is already longer than any event we keep */
            if (p->max_event && p->line_len + rest > p->max_event + 64)
                p->line_too_long = true;
            if (!p->line_too_long) {
                grow(&p->line, &p->line_cap, p->line_len + rest + 1);
                memcpy(p->line + p->line_len, start, rest);
                p->line_len += rest;
            }
            return 0;
        }
        size_t next = i + k + 1;
        bool crlf = start[k] == '\r' && next < len && buf[next] == '\n';
        if (crlf)
            next++;
        p->consumed = next;
        int rc = 0;
        if (p->line_too_long || (p->max_event && p->line_len + k > p->max_event + 64)) {
            /* however it was split, an overlong line drops its event */
            p->overflow = true;
            p->has_data = true;
            p->line_len = 0;
            p->line_too_long = false;
        } else if (p->line_len) {
            grow(&p->line, &p->line_cap, p->line_len + k + 1);
            memcpy(p->line + p->line_len, start, k);
            p->line_len += k;
            rc = process_line(p, p->line, p->line_len);
            p->line_len = 0;
        } else {
            rc = process_line(p, start, k);
        }
        i = next;
        if (start[k] == '\r' && !crlf && i == len)
            p->last_cr = true;
        if (rc)
            return rc;
    }
    return 0;
}
