/* database_url as libpq reads it (see include/store_url.h). */
#include "store_url.h"
#include "util.h"

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *env_get(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

store_url_kind_t store_url_parse(const char *database_url, char **target)
{
    const char *url = database_url;
    size_t n = strlen(STORE_URL_FILE_PREFIX);
    *target = NULL;
    if (url && strcmp(url, "none") == 0)
        return STORE_URL_NONE;
    if (url && strncmp(url, STORE_URL_FILE_PREFIX, n) == 0) {
        *target = url[n] ? xstrdup(url + n) : NULL;
        return STORE_URL_FILE;
    }
    if (url) {
        *target = url[0] ? xstrdup(url) : NULL;
        return STORE_URL_SERVER;
    }
    if (env_get("PGHOST") || env_get("PGDATABASE") || env_get("PGSERVICE"))
        return STORE_URL_SERVER;
    *target = store_default_path();
    return STORE_URL_FILE;
}

char *store_default_path(void)
{
    /* systemd lists several directories separated by ':' when several are configured */
    const char *dir = env_get("STATE_DIRECTORY");
    size_t n = dir ? strcspn(dir, ":") : 0;
    if (n)
        return xasprintf("%.*s/%s", (int)n, dir, STORE_URL_DEFAULT_FILE);
    /* the XDG base directory spec: a relative value is invalid and ignored */
    const char *xdg = env_get("XDG_STATE_HOME");
    if (xdg && xdg[0] == '/')
        return xasprintf("%s/idemgw/%s", xdg, STORE_URL_DEFAULT_FILE);
    const char *home = env_get("HOME");
    if (home)
        return xasprintf("%s/.local/state/idemgw/%s", home, STORE_URL_DEFAULT_FILE);
    return NULL;
}

/* Entries of a libpq comma-separated list ("a,,b" is three: an empty one is the default). */
static int conninfo_list_len(const char *v)
{
    if (!v || !v[0])
        return 0;
    int n = 1;
    for (; *v; v++)
        n += *v == ',';
    return n;
}

/* libpq's parse error, when it names a key rather than quoting a value (which may be a
 * password): the usual mistake is a misspelt keyword. */
static bool conninfo_error_names_key(const char *err)
{
    static const char option[] = "invalid connection option \"";
    static const char param[] = "invalid URI query parameter: \"";
    return err && (strncmp(err, option, sizeof(option) - 1) == 0 ||
                   strncmp(err, param, sizeof(param) - 1) == 0);
}

/* How many servers a parsed conninfo names: hostaddr decides over host, and none is one. */
static int conninfo_servers(const PQconninfoOption *opts)
{
    int nhost = 0, naddr = 0;
    for (const PQconninfoOption *o = opts; o->keyword; o++) {
        if (strcmp(o->keyword, "host") == 0)
            nhost = conninfo_list_len(o->val);
        else if (strcmp(o->keyword, "hostaddr") == 0)
            naddr = conninfo_list_len(o->val);
    }
    return naddr ? naddr : nhost ? nhost : 1;
}

int store_url_servers(const char *url)
{
    PQconninfoOption *opts = url ? PQconninfoParse(url, NULL) : NULL;
    int n = opts ? conninfo_servers(opts) : 1;
    PQconninfoFree(opts);
    return n;
}

const char *store_url_error(const char *url, char *buf, size_t len)
{
    char *target = NULL;
    store_url_kind_t kind = store_url_parse(url, &target);
    bool no_file = kind == STORE_URL_FILE && !target;
    free(target);
    if (no_file) {
        snprintf(buf, len, "%s needs a file (%sPATH)", STORE_URL_FILE_PREFIX,
                 STORE_URL_FILE_PREFIX);
        return buf;
    }
    /* what follows reads the URL as libpq does: a Postgres server's */
    if (kind != STORE_URL_SERVER)
        return NULL;
    char *err = NULL;
    PQconninfoOption *opts = PQconninfoParse(url, &err);
    if (!opts) {
        if (err)
            err[strcspn(err, "\n")] = '\0';
        bool named = conninfo_error_names_key(err);
        snprintf(buf, len,
                 "not a libpq connection string (host=... dbname=...) or URL "
                 "(postgresql://...)%s%s",
                 named ? ": " : "", named ? err : "");
        PQfreemem(err);
        return buf;
    }
    const char *host = NULL, *hostaddr = NULL, *port = NULL, *tsa = NULL;
    for (PQconninfoOption *o = opts; o->keyword; o++) {
        if (!o->val)
            continue;
        if (strcmp(o->keyword, "host") == 0)
            host = o->val;
        else if (strcmp(o->keyword, "hostaddr") == 0)
            hostaddr = o->val;
        else if (strcmp(o->keyword, "port") == 0)
            port = o->val;
        else if (strcmp(o->keyword, "target_session_attrs") == 0)
            tsa = o->val;
    }
    int nhost = conninfo_list_len(host), naddr = conninfo_list_len(hostaddr);
    int nport = conninfo_list_len(port);
    int servers = conninfo_servers(opts);
    const char *out = buf;
    if (naddr && nhost && nhost != naddr)
        snprintf(buf, len, "%d hosts and %d hostaddr values: give one address for each host", nhost,
                 naddr);
    else if (nport > 1 && nport != servers)
        snprintf(buf, len,
                 "%d hosts and %d ports: give one port for each host, or a single port for all",
                 servers, nport);
    else if (tsa && tsa[0] && strcmp(tsa, "read-write") != 0)
        snprintf(buf, len,
                 "target_session_attrs=%.40s: the gateway writes every claim, so it only uses a "
                 "server that accepts writes; leave it out or set read-write",
                 tsa);
    else
        out = NULL;
    PQconninfoFree(opts);
    return out;
}
