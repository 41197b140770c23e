/* The status tool (config status_tool, the tool CATALOG_STATUS_TOOL the catalogue adds to
 * tools/list): a tools/call of it asks what became of an earlier protected call, named by its
 * tool and arguments (or its idempotency key). The caller is resolved as for the call itself
 * (subject.h), the key derived the same way (key.h), and the answer read from the store: the
 * stored result (a replay marked status_query), "running", "failed", "outcome unknown" or "not
 * found". Nothing is ever forwarded, and a caller learns only of its own calls: another
 * caller's key is another key. */
#ifndef IDEMGW_STATUS_H
#define IDEMGW_STATUS_H

#include "config.h"
#include "exchange.h"
#include "handler.h"
#include "stats.h"

struct store;
struct subject;

typedef struct status_tool status_tool_t;

typedef struct status_ctx {
    const config_t *cfg;
    struct store *store; /* NULL when no database is configured: every query is refused */
    struct subject *subject;
    server_stats_t *stats;
} status_ctx_t;

status_tool_t *status_new(const status_ctx_t *ctx);
void status_free(status_tool_t *s);
/* A reload: the configuration queries started from now on see. */
void status_reconfigure(status_tool_t *s, const config_t *cfg);

/* The router's handler (handler.h; arg: the status_tool_t): takes a tools/call of the status
 * tool while the setting is on; registered before the protected call's, which would otherwise
 * class it as an unknown tool. */
handler_verdict_t status_offer(void *arg, exchange_t *ex);

#endif
