/* The Postgres backend of the store (store.h): a pool of non-blocking libpq connections on the
 * event loop, migrations, the one-statement claim, fenced finish, sweeper. */
#ifndef IDEMGW_STORE_PG_H
#define IDEMGW_STORE_PG_H

#include "store.h"

#include <stdbool.h>
#include <stddef.h>

struct event_base;

extern const store_ops_t store_pg_ops;

/* The Postgres backend's own options. */
typedef struct store_pg_options {
    const char *conninfo;     /* libpq conninfo/URL; NULL or "" = PG* environment */
    int pool_size;            /* connections, default 4 */
    bool group_commit;        /* queued claims (finishes) share one statement */
    bool durable_finish;      /* a finish waits for the WAL flush (never batched) */
    uint64_t commit_delay_us; /* with group_commit: a claim among many open is held this long
                                 at most for a batch (store_delay.h; 0: never) */
} store_pg_options_t;

/* Creates the store and starts connecting in the background. When the database is reachable
 * at start, migrations are applied before this returns (blocking, once); when it is not, the
 * store keeps retrying with backoff and migrates on the first successful connection. Returns
 * NULL only for errors that retrying cannot fix (schema newer than known), with msg set. */
store_t *store_pg_new(struct event_base *base, const store_options_t *opt,
                      const store_pg_options_t *pg, char *msg, size_t msglen);

#endif
