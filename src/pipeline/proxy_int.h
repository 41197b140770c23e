/* The router's insides: what proxy.c keeps, and what the exchanges it makes read of it (its
 * context, hooks and CORS table) and keep in it (their lists). Private to the pipeline. */
#ifndef IDEMGW_PROXY_INT_H
#define IDEMGW_PROXY_INT_H

#include "cors.h"
#include "exchange_int.h"
#include "handler.h"
#include "proxy.h"

#include <stddef.h>

struct proxy {
    proxy_ctx_t ctx;
    proxy_hooks_t hooks;
    handler_t handlers[PROXY_MAX_HANDLERS]; /* asked in order */
    size_t n_handlers;
    exchange_lists_t exchanges;              /* exchange.c's */
    void (*on_closed)(const exchange_t *ex); /* the router's, as each exchange ends */
    cors_table_t cors; /* the upstream's CORS answers, mirrored on the gateway's own */
};

#endif
