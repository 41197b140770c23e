/* A handler of the router: a concern that takes some MCP requests (the protected call, a
 * task's poll, a cancel, a stream resume to check) or watches them on their way upstream (the
 * catalogue's tools/list and list_changed watches). main registers the handlers with the router
 * (proxy_add_handler) in the order they are asked; a new concern is a new file and one registration
 * there, never an edit of the router or of another handler. */
#ifndef IDEMGW_HANDLER_H
#define IDEMGW_HANDLER_H

#include "exchange.h"

typedef enum {
    HANDLER_PASS = 0, /* not this handler's: the next is asked, then the request goes upstream */
    HANDLER_TAKEN,    /* the handler owns the exchange's next step (exchange.h) */
} handler_verdict_t;

typedef struct handler {
    const char *name; /* what it is, for the reader of main's table */
    /* Offered every request to the MCP endpoint that passed validation: a POST with its body
     * parsed (exchange_msg, exchange_tool_class, exchange_cancel_id) or a GET stream. A
     * handler that passes may have added an observer (exchange_add_observer): a watcher
     * that only reads the response passes, and the handlers after it are still asked. */
    handler_verdict_t (*offer)(void *arg, exchange_t *ex);
    void *arg;
} handler_t;

#endif
