/* Which store database_url names, and opening it: the one place that knows the backends. A
 * backend is a row of the table in store_open.c (its name, the database_url prefix it
 * accepts, how it opens); a new one is its own files (store.h's ops) plus one row there. */
#ifndef IDEMGW_STORE_OPEN_H
#define IDEMGW_STORE_OPEN_H

#include "store.h"
#include "store_pg.h"
#include "store_sqlite.h"
#include "store_url.h"

#include <stdbool.h>
#include <stddef.h>

struct event_base;

/* What a store is opened with: the options every backend takes, and each backend's own.
 * store_open fills in what database_url says (the conninfo, the file); the caller sets the
 * rest of each backend's options it knows (those of a backend not chosen are ignored). */
typedef struct store_open_opts {
    store_options_t common;
    store_pg_options_t pg;
    store_sqlite_options_t sqlite;
} store_open_opts_t;

typedef struct store_backend {
    const char *name;      /* "postgres", "sqlite": for logs and tests */
    store_url_kind_t kind; /* the kind of database_url it serves (store_url.h) */
    /* The file: the backend keeps its store in a local file (target); one process holds it, so
     * several workers are refused, and an operator's command never creates it. */
    bool local_file;
    /* Descriptors the store keeps open, with pool connections (the config's store.pool). */
    int (*fds)(int pool);
    /* Opens the store on target (store_choose's) with o; NULL with msg set when refused. */
    store_t *(*open)(struct event_base *base, const char *target, const store_open_opts_t *o,
                     char *msg, size_t msglen);
    /* Logs (info) that the store is open; named: database_url named it (not the default); o:
     * what it was opened with. */
    void (*opened)(const char *target, bool named, const store_open_opts_t *o);
} store_backend_t;

/* The backend that serves a kind of database_url (store_url.h); NULL for STORE_URL_NONE. */
const store_backend_t *store_backend_for(store_url_kind_t kind);
/* The backend database_url names (NULL: no store) and in *target what it opens (allocated,
 * free it, or NULL): store_url_parse's, and its backend. */
const store_backend_t *store_choose(const char *database_url, char **target);

/* Opens the store of backend b (store_choose's) on target. NULL with msg set when refused. */
store_t *store_open(const store_backend_t *b, struct event_base *base, const char *target,
                    const store_open_opts_t *o, char *msg, size_t msglen);

#endif
