/* Process-wide runtime state: the event loop, the live configuration, the store, the upstream
 * pool and the counters /metrics reports. One per process, owned by main. */
#ifndef IDEMGW_SERVER_H
#define IDEMGW_SERVER_H

#include "config.h"
#include "stats.h"

#include <stdbool.h>
#include <stdint.h>

struct event_base;
struct evconnlistener;
struct upstream_pool;
struct store;
struct proxy;
struct idem;
struct replay_cache;
struct ssl_ctx_st;


typedef struct server {
    struct event_base *base;
    config_t *cfg;              /* live config; replaced on SIGHUP */
    struct store *store;        /* NULL when no database is configured */
    struct upstream_pool *pool; /* keep-alive upstream connections */
    struct proxy *proxy;        /* the MCP listener's requests */
    struct idem *idem;          /* the idempotency stage */
    struct replay_cache *cache; /* finished results, so replays skip the store */
    struct evconnlistener *listener;
    struct evconnlistener *admin_listener;
    struct ssl_ctx_st *tls; /* for an https upstream, else NULL */
    bool draining;          /* SIGTERM seen: no new connections or requests */
    server_stats_t *stats;     /* this worker's counters (a slot of all_stats) */
    server_stats_t *all_stats; /* every worker's counters, shared memory; /metrics sums them */
    int worker;                /* 0-based worker number */
    int n_workers;
    uint64_t started_ms;
} server_t;

extern server_t *server;

/* Called whenever in-flight work ends; finishes a drain when nothing is left. */
void server_check_drained(void);

#endif
