/* The admin listener: GET /healthz (process alive), GET /readyz (the upstreams reachable and,
 * when configured, the store connected), GET /metrics (Prometheus text).
 *
 * With one upstream, /readyz is ready when that upstream is reachable, the store answers (and,
 * with several workers, every other worker last published its store up) and the process is
 * not draining; its body is {"ready", "upstream", "store", ["store_reason"],
 * "draining"}. Under servers: an upstream that is down fails only its own server's calls (the
 * router sends each call to its server's upstream alone), so taking the whole gateway out of
 * a load balancer for it would fail every other server's calls too: ready then needs at least
 * one server's upstream reachable (with the store and not draining as before), "upstream" says
 * whether every one is, and the body adds "servers" ({NAME: "up" | "down"}) and
 * "servers_down" (the names of those down, in the configuration's order). A stdio server has
 * nothing to connect to and is always up.
 *
 * /metrics: under servers:, the per-tool series, the request duration histogram and the
 * stdio children carry a server label; with one upstream they carry none, as before. */
#ifndef IDEMGW_ADMIN_H
#define IDEMGW_ADMIN_H

#include "http_conn.h"
#include "stats.h"

#include <stdbool.h>
#include <stddef.h>

struct store;
struct upstream;
struct upstream_pool;

/* One MCP server behind the gateway, as /readyz probes it and /metrics reports it. */
typedef struct admin_server {
    const char *name;                /* its name under servers:; NULL: the one upstream */
    struct upstream_pool *pool;      /* an HTTP upstream's, probed by /readyz; NULL: stdio */
    const struct upstream *upstream; /* the MCP server: a stdio one reports its children */
} admin_server_t;

/* What the admin endpoint reports on; owned by main. */
typedef struct admin_ctx {
    struct store *store; /* NULL when no database is configured */
    /* every server behind the gateway, in the configuration's order; main replaces the array
     * on a reload (a probe in flight keeps copies of what it reports) */
    const admin_server_t *servers;
    size_t n_servers;
    /* servers a reload removed or re-pointed, serving their last requests: their stdio
     * children still count in idemgw_upstream_children (under their name) until freed */
    const admin_server_t *retired;
    size_t n_retired;
    const server_stats_t *all_stats; /* every worker's counters; /metrics sums them */
    int n_workers;
    const bool *draining; /* a draining process is not ready */
    /* no store, and the policy protects some tool with on_store_down: reject, so those calls
     * could only be refused: not ready (main keeps it current across reloads) */
    bool store_missing;
    /* admin_token_file: the operator API's tokens (admin_keys.h); NULL: the API is off (main
     * keeps it current across reloads) */
    const char *token_file;
} admin_ctx_t;

/* The admin site's handler (arg: an admin_ctx_t). */
void admin_handle(void *arg, http_conn_t *conn, http_request_t *req);

#endif
