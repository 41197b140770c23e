/* One MCP server behind the gateway and everything that is its own: the upstream (an HTTP
 * pool or a stdio child), the tool catalogue and its fetch, the router (proxy.c) with its
 * handlers, and the stages they call. Without servers: the worker has one; with servers:, one
 * per entry, chosen per request by path (routes.h). What every server shares (the store, the
 * replay cache, who is calling, spans, the counters) comes from the worker in backend_env_t. */
#ifndef IDEMGW_BACKEND_H
#define IDEMGW_BACKEND_H

#include "config.h"
#include "stats.h"
#include "upstream_http.h"

#include <stdbool.h>
#include <stddef.h>

struct event_base;
struct proxy;
struct upstream;
struct upstream_pool;

/* What the worker lends each backend; outlives them all. */
typedef struct backend_env {
    struct event_base *base;
    struct store *store;               /* NULL when no store is configured */
    struct replay_cache *cache;        /* finished results, so replays skip the store */
    struct subject *subject;           /* who is calling */
    struct resume_guard *guard;        /* who may resume a session's streams */
    struct tracer *tracer;             /* spans, or NULL */
    server_stats_t *stats;             /* this worker's counters */
    const upstream_limits_t *limits;   /* read by the upstreams at each use */
    int worker, n_workers;
    const bool *draining;              /* the worker is shutting down */
    bool fetch_catalog;                /* the gateway may list a server's tools itself */
    void (*exchange_ended)(void *arg); /* an agent request's exchange was freed */
} backend_env_t;

typedef struct backend backend_t;

/* Opens the server cfg describes (the top level, or a view of servers:; it must outlive the
 * backend or be replaced by backend_reconfigure first): its upstream and its stages. NULL with
 * msg filled when the upstream cannot be set up (a CA file that does not load). */
backend_t *backend_open(const backend_env_t *env, config_t *cfg, char *msg, size_t msglen);
/* A reload that keeps the server's upstream: its policy, catalogue rules and CORS mode from
 * cfg, for requests from now on. */
void backend_reconfigure(backend_t *b, config_t *cfg);
/* Whether a reload's cfg names the same upstream, so the running one can stay. */
bool backend_same_upstream(const backend_t *b, const config_t *cfg);
/* Reads the server's tools itself when the policy needs them (and is not reading them). */
void backend_start_fetch(backend_t *b);
/* Stops taking requests: no catalogue fetch, idle agent and upstream connections closed,
 * requests in flight served to their end. */
void backend_drain(backend_t *b);
/* Agent requests the backend still serves. */
uint64_t backend_exchanges(const backend_t *b);
void backend_free(backend_t *b);

const config_t *backend_config(const backend_t *b);
struct proxy *backend_proxy(const backend_t *b);
struct upstream_pool *backend_pool(const backend_t *b); /* NULL for a stdio server */
struct upstream *backend_upstream(const backend_t *b);

#endif
