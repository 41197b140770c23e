/* The backends, and which one database_url names (see include/store_open.h). */
#include "store_open.h"

#include "log.h"
#include "util.h"

static int pg_fds(int pool)
{
    return pool;
}

static store_t *pg_open(struct event_base *base, const char *target, const store_open_opts_t *o,
                        char *msg, size_t msglen)
{
    store_pg_options_t pg = o->pg;
    pg.conninfo = target;
    return store_pg_new(base, &o->common, &pg, msg, msglen);
}

static void pg_opened(const char *target, bool named, const store_open_opts_t *o)
{
    (void)target;
    (void)o;
    log_info(0, "store: postgres (%s)", named ? "database_url" : "the PG* environment");
}

/* the file, its -wal and -shm, the lock, the eventfd */
static int sqlite_fds(int pool)
{
    (void)pool;
    return 5;
}

static store_t *sqlite_open(struct event_base *base, const char *target, const store_open_opts_t *o,
                            char *msg, size_t msglen)
{
    store_sqlite_options_t sq = o->sqlite;
    sq.path = target;
    return store_sqlite_new(base, &o->common, &sq, msg, msglen);
}

static void sqlite_opened(const char *target, bool named, const store_open_opts_t *o)
{
    log_info(0,
             "store: embedded SQLite at %s%s (%s; several replicas or machines need Postgres: "
             "set database_url)",
             target, named ? "" : " (the default)",
             o->sqlite.peers ? "shared by its peers on this machine" : "this process only");
}

/* One row for each kind of database_url but STORE_URL_NONE. */
static const store_backend_t backends[] = {
    {.name = "sqlite",
     .kind = STORE_URL_FILE,
     .local_file = true,
     .fds = sqlite_fds,
     .open = sqlite_open,
     .opened = sqlite_opened},
    {.name = "postgres",
     .kind = STORE_URL_SERVER,
     .fds = pg_fds,
     .open = pg_open,
     .opened = pg_opened},
};

const store_backend_t *store_backend_for(store_url_kind_t kind)
{
    for (size_t i = 0; i < ARRAY_LEN(backends); i++)
        if (backends[i].kind == kind)
            return &backends[i];
    return NULL;
}

const store_backend_t *store_choose(const char *database_url, char **target)
{
    return store_backend_for(store_url_parse(database_url, target));
}

store_t *store_open(const store_backend_t *b, struct event_base *base, const char *target,
                    const store_open_opts_t *o, char *msg, size_t msglen)
{
    return b->open(base, target, o, msg, msglen);
}
