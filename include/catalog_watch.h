/* The catalogue's watch of GET streams: a server says its tools changed with
 * notifications/tools/list_changed, on a session's GET stream; the watch tells whoever keeps
 * the catalogue (main, which reads the tools again). A handler of the router (handler.h) that
 * only adds an observer and never takes a request: it is registered before the handlers that
 * may take a GET (the stream resume check), so it sees every stream. */
#ifndef IDEMGW_CATALOG_WATCH_H
#define IDEMGW_CATALOG_WATCH_H

#include "exchange.h"
#include "handler.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct catalog_watch catalog_watch_t;

typedef struct catalog_watch_ctx {
    void (*tools_changed)(void *arg); /* called once per notification seen */
    void *arg;
} catalog_watch_ctx_t;

catalog_watch_t *catalog_watch_new(const catalog_watch_ctx_t *ctx);
void catalog_watch_free(catalog_watch_t *w);

/* The router's handler (arg: the catalog_watch_t): a GET stream of a session gets watched. */
handler_verdict_t catalog_watch_offer(void *arg, exchange_t *ex);

/* Whether an SSE event's data is notifications/tools/list_changed. Pure. */
bool catalog_watch_is_list_changed(const char *data, size_t len);

#endif
