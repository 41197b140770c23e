#include "catalog_watch.h"
#include "mcp.h"
#include "stream_reader.h"
#include "util.h"

#include <llhttp.h>

#include <stdlib.h>
#include <string.h>

/* Notifications are small: a larger event is no list_changed and is skipped whole. */
#define WATCH_MAX_EVENT (64 * 1024)

struct catalog_watch {
    catalog_watch_ctx_t ctx;
};

/* One GET stream's watch. */
typedef struct stream_watch {
    catalog_watch_t *cw;
    stream_reader_t reader;
} stream_watch_t;

bool catalog_watch_is_list_changed(const char *data, size_t len)
{
    static const char name[] = "notifications/tools/list_changed";
    size_t off, n;
    /* told apart cheaply first: most events are not this one */
    return memmem(data, len, name, sizeof(name) - 1) &&
           mcp_member_span(data, len, "method", &off, &n) && n == sizeof(name) + 1 &&
           memcmp(data + off + 1, name, sizeof(name) - 1) == 0;
}

static int on_event(const sse_event_t *ev, void *arg)
{
    stream_watch_t *w = arg;
    if (catalog_watch_is_list_changed(ev->data, ev->data_len))
        w->cw->ctx.tools_changed(w->cw->ctx.arg);
    return 0;
}

static observe_t watch_head(void *arg, int status, const http_headers_t *headers, bool sse)
{
    stream_watch_t *w = arg;
    stream_reader_head(&w->reader, status, headers, sse, WATCH_MAX_EVENT, on_event, w);
    return OBSERVE_PASS;
}

static observe_t watch_body(void *arg, const char *data, size_t len)
{
    stream_watch_t *w = arg;
    stream_reader_body(&w->reader, data, len);
    return OBSERVE_PASS;
}

static void watch_detach(void *arg)
{
    stream_watch_t *w = arg;
    stream_reader_free(&w->reader);
    free(w);
}

static const response_observer_t watch_ops = {
    .on_head = watch_head,
    .on_body = watch_body,
    .detach = watch_detach,
};

handler_verdict_t catalog_watch_offer(void *arg, exchange_t *ex)
{
    catalog_watch_t *cw = arg;
    const http_request_t *req = exchange_request(ex);
    if (req->method != HTTP_GET || !http_headers_get(&req->headers, "mcp-session-id"))
        return HANDLER_PASS;
    stream_watch_t *w = xcalloc(1, sizeof(*w));
    w->cw = cw;
    w->reader.conn_id = exchange_conn_id(ex);
    w->reader.what = "GET stream (tools/list_changed watch)";
    exchange_add_observer(ex, &watch_ops, w);
    return HANDLER_PASS;
}

catalog_watch_t *catalog_watch_new(const catalog_watch_ctx_t *ctx)
{
    catalog_watch_t *w = xcalloc(1, sizeof(*w));
    w->ctx = *ctx;
    return w;
}

void catalog_watch_free(catalog_watch_t *w)
{
    free(w);
}
