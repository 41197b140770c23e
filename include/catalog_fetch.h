/* The gateway as an MCP client of its upstream, for one purpose: reading the tool catalogue.
 * initialize, notifications/initialized, tools/list (every page), then DELETE of the session,
 * on the event loop through the upstream pool. Used at start (retried until the upstream
 * answers) and by `idemgw tools`. */
#ifndef IDEMGW_CATALOG_FETCH_H
#define IDEMGW_CATALOG_FETCH_H

#include "catalog.h"
#include "upstream.h"

#include <stdint.h>

typedef struct catalog_fetch catalog_fetch_t;

/* n_tools >= 0 when the catalogue was read; else error says why (valid during the call). The
 * fetch is finished when this runs; it frees itself after. */
typedef void (*catalog_fetch_done_fn)(void *arg, int n_tools, const char *error);

typedef struct catalog_fetch_opts {
    struct event_base *base;
    upstream_pool_t *pool;
    const char *target;  /* the MCP endpoint's path */
    const char *host;    /* the Host header */
    const char *headers; /* extra request header lines ("Name: v\r\n"...), may be NULL */
    catalog_t *catalog;  /* learns every page */
    catalog_fetch_done_fn done;
    void *arg;
} catalog_fetch_opts_t;

catalog_fetch_t *catalog_fetch_start(const catalog_fetch_opts_t *opts);
/* Stops a fetch in progress; done is not called. */
void catalog_fetch_cancel(catalog_fetch_t *f);

#endif
