/* database_url as libpq reads it (see include/store_url.h). */
#include "store_url.h"
#include "store_open.h"

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    const store_backend_t *b = store_choose(url, &target);
    bool no_file = b && b->local_file && !target;
    free(target);
    if (no_file) {
        snprintf(buf, len, "%s needs a file (%sPATH)", b->prefix, b->prefix);
        return buf;
    }
    /* what follows reads the URL as libpq does: the backend without a prefix */
    if (!b || b->prefix)
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

