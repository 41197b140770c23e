/* The upstream of one server of the configuration: the one place that chooses its transport,
 * a spawned stdio server (upstream_stdio.h) when the configuration gives a command, else HTTP
 * (upstream_http.h: a pool, and a TLS context for an https upstream). The gateway's backends
 * and the catalogue fetch of the commands both open their upstream here, as both open the
 * store through store_open.h. */
#ifndef IDEMGW_UPSTREAM_SERVER_H
#define IDEMGW_UPSTREAM_SERVER_H

#include "config.h"
#include "stats.h"
#include "upstream.h"
#include "upstream_http.h"

#include <stdbool.h>
#include <stddef.h>

struct event_base;

typedef struct upstream_server_opts {
    struct event_base *base;
    const upstream_limits_t *limits; /* outlives the upstream */
    const bool *draining;            /* when true, HTTP connections are not kept; may be NULL */
    server_stats_t *stats;           /* counts HTTP connects and TLS handshakes; may be NULL */
} upstream_server_opts_t;

/* What upstream_server_open made; each member is the caller's to free (upstream_free, then
 * upstream_pool_free, and SSL_CTX_free once nothing uses the pool), also after a failure,
 * which may leave some made. */
typedef struct upstream_server {
    upstream_t *upstream;
    upstream_pool_t *pool;  /* the HTTP transport's connections; NULL for stdio */
    struct ssl_ctx_st *tls; /* an https upstream's client context, else NULL */
} upstream_server_t;

/* Opens cfg's upstream into *out (zeroed first). False with msg when the TLS context or the
 * pool cannot be made (an unreadable upstream_ca_file, an address that does not resolve). */
bool upstream_server_open(const config_t *cfg, const upstream_server_opts_t *o,
                          upstream_server_t *out, char *msg, size_t msglen) MUST_CHECK;

#endif
