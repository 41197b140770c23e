/* The admin listener: GET /healthz (process alive), GET /readyz (upstream reachable and,
 * when configured, the store connected), GET /metrics (Prometheus text). */
#ifndef IDEMGW_ADMIN_H
#define IDEMGW_ADMIN_H

#include "http_conn.h"
#include "stats.h"

#include <stdbool.h>

struct store;
struct upstream_pool;

/* What the admin endpoint reports on; owned by main. */
typedef struct admin_ctx {
    struct store *store;             /* NULL when no database is configured */
    struct upstream_pool *pool;      /* an HTTP upstream's, probed by /readyz; NULL: stdio */
    const struct upstream *upstream; /* the MCP server: a stdio one reports its children */
    const server_stats_t *all_stats; /* every worker's counters; /metrics sums them */
    int n_workers;
    const bool *draining; /* a draining process is not ready */
    /* no store, and the policy protects some tool with on_store_down: reject, so those calls
     * could only be refused: not ready (main keeps it current across reloads) */
    bool store_missing;
} admin_ctx_t;

/* The admin site's handler (arg: an admin_ctx_t). */
void admin_handle(void *arg, http_conn_t *conn, http_request_t *req);

#endif
