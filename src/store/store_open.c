/* The backends, and which one database_url names (see include/store_open.h). */
#include "store_open.h"

#include "log.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

static const char *env_get(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

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

/* Looked up in order: a prefix first, the row without one last. */
static const store_backend_t backends[] = {
    {.name = "sqlite",
     .prefix = "sqlite:",
     .local_file = true,
     .fds = sqlite_fds,
     .open = sqlite_open,
     .opened = sqlite_opened},
    {.name = "postgres", .prefix = NULL, .fds = pg_fds, .open = pg_open, .opened = pg_opened},
};

static const store_backend_t *backend_named(const char *name)
{
    for (size_t i = 0; i < ARRAY_LEN(backends); i++)
        if (strcmp(backends[i].name, name) == 0)
            return &backends[i];
    return NULL;
}

char *store_default_path(void)
{
    /* systemd lists several directories separated by ':' when several are configured */
    const char *dir = env_get("STATE_DIRECTORY");
    size_t n = dir ? strcspn(dir, ":") : 0;
    if (n)
        return xasprintf("%.*s/%s", (int)n, dir, STORE_SQLITE_DEFAULT_FILE);
    /* the XDG base directory spec: a relative value is invalid and ignored */
    const char *xdg = env_get("XDG_STATE_HOME");
    if (xdg && xdg[0] == '/')
        return xasprintf("%s/idemgw/%s", xdg, STORE_SQLITE_DEFAULT_FILE);
    const char *home = env_get("HOME");
    if (home)
        return xasprintf("%s/.local/state/idemgw/%s", home, STORE_SQLITE_DEFAULT_FILE);
    return NULL;
}

const store_backend_t *store_choose(const char *database_url, char **target)
{
    const char *url = database_url;
    *target = NULL;
    if (url && strcmp(url, "none") == 0)
        return NULL;
    for (size_t i = 0; url && i < ARRAY_LEN(backends); i++) {
        const char *prefix = backends[i].prefix;
        size_t n = prefix ? strlen(prefix) : 0;
        if (!prefix || strncmp(url, prefix, n) == 0) {
            *target = url[n] ? xstrdup(url + n) : NULL;
            return &backends[i];
        }
    }
    if (env_get("PGHOST") || env_get("PGDATABASE") || env_get("PGSERVICE"))
        return backend_named("postgres");
    *target = store_default_path();
    return backend_named("sqlite");
}

store_t *store_open(const store_backend_t *b, struct event_base *base, const char *target,
                    const store_open_opts_t *o, char *msg, size_t msglen)
{
    return b->open(base, target, o, msg, msglen);
}
