/* The gateway configuration: built-in defaults, file (config_yaml.c), environment overrides,
 * derived settings, and the pure helpers other modules ask about it (Host / Origin checks).
 * Which keys a reload may change is declared with the keys, in config_yaml.c. */
#include "config.h"
#include "store_url.h"
#include "config_yaml.h"
#include "dupsource.h"
#include "log.h"
#include "util.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <libpq-fe.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* A config file is a few kilobytes; anything this large is a mistake (or /dev/zero). */
#define CONFIG_MAX_FILE_BYTES (4u << 20)
#define HOST_MAX 253

/* ---- errors ---- */

void config_errors_add(config_errors_t *e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *msg = xvasprintf(fmt, ap);
    va_end(ap);
    e->msgs = xrealloc(e->msgs, (e->n + 1) * sizeof(char *));
    e->msgs[e->n++] = msg;
}

void config_errors_free(config_errors_t *e)
{
    if (!e)
        return;
    for (size_t i = 0; i < e->n; i++)
        free(e->msgs[i]);
    free(e->msgs);
    e->msgs = NULL;
    e->n = 0;
}

/* ---- host names, addresses, authorities ---- */

static bool host_name_valid(const char *s, size_t n)
{
    if (n == 0 || n > HOST_MAX || s[0] == '.' || s[0] == '-')
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (!(isalnum(ch) || ch == '-' || ch == '.' || ch == '_'))
            return false;
        if (ch == '.' && i + 1 < n && s[i + 1] == '.')
            return false;
    }
    return true;
}

/* An IPv6 literal without brackets, optionally with a %zone. */
static bool host_v6_valid(const char *s, size_t n)
{
    char buf[64];
    struct in6_addr a;
    const char *zone = memchr(s, '%', n);
    size_t alen = zone ? (size_t)(zone - s) : n;
    if (alen == 0 || alen >= sizeof(buf))
        return false;
    if (zone) {
        size_t zlen = n - alen - 1;
        if (zlen == 0 || zlen > 32)
            return false;
        for (size_t i = 1; i <= zlen; i++)
            if (!isalnum((unsigned char)zone[i]) && zone[i] != '_' && zone[i] != '-' &&
                zone[i] != '.')
                return false;
    }
    memcpy(buf, s, alen);
    buf[alen] = '\0';
    return inet_pton(AF_INET6, buf, &a) == 1;
}

typedef struct authority {
    const char *host; /* points into the parsed text, brackets stripped */
    size_t hlen;
    bool v6;
    int port; /* -1 when absent */
} authority_t;

/* Splits "host[:port]" / "[v6][:port]". The host is syntax-checked; the port is 0-65535. */
static int authority_parse(const char *s, size_t n, authority_t *a)
{
    const char *port = NULL;
    size_t plen = 0;
    a->v6 = false;
    if (n > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', n);
        if (!close)
            return -1;
        a->host = s + 1;
        a->hlen = (size_t)(close - s) - 1;
        a->v6 = true;
        if (!host_v6_valid(a->host, a->hlen))
            return -1;
        size_t used = (size_t)(close - s) + 1;
        if (used < n) {
            if (s[used] != ':')
                return -1;
            port = s + used + 1;
            plen = n - used - 1;
        }
    } else {
        const char *colon = memchr(s, ':', n);
        a->host = s;
        a->hlen = colon ? (size_t)(colon - s) : n;
        if (colon) {
            port = colon + 1;
            plen = n - a->hlen - 1;
        }
        if (!host_name_valid(a->host, a->hlen))
            return -1;
    }
    a->port = -1;
    if (port) {
        if (plen == 0 || plen > 5)
            return -1;
        int v = 0;
        for (size_t i = 0; i < plen; i++) {
            if (port[i] < '0' || port[i] > '9')
                return -1;
            v = v * 10 + (port[i] - '0');
        }
        if (v > 65535)
            return -1;
        a->port = v;
    }
    return 0;
}

int config_parse_host_port(const char *s, host_port_t *out)
{
    authority_t a;
    char buf[16];
    if (!s)
        return -1;
    size_t n = strlen(s);
    if (n > 1 && s[0] == ':') {
        /* ":port": every IPv4 interface (the common meaning of an empty host). */
        int r = snprintf(buf, sizeof(buf), "0.0.0.0%s", s);
        if (r < 0 || (size_t)r >= sizeof(buf))
            return -1;
        s = buf;
        n = (size_t)r;
    }
    if (authority_parse(s, n, &a) != 0 || a.port < 1)
        return -1;
    out->host = xstrndup(a.host, a.hlen);
    out->port = (uint16_t)a.port;
    return 0;
}

bool config_host_is_loopback(const char *host)
{
    struct in_addr v4;
    struct in6_addr v6;
    if (!host)
        return false;
    if (strcasecmp(host, "localhost") == 0 || strcasecmp(host, "localhost.") == 0)
        return true;
    if (inet_pton(AF_INET, host, &v4) == 1)
        return (ntohl(v4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &v6) == 1) {
        if (IN6_IS_ADDR_LOOPBACK(&v6))
            return true;
        return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
    }
    return false;
}

/* ---- upstream URL ---- */

/* Splits an http(s) URL into its scheme, authority and path; NULL or what is wrong. */
static const char *url_split(const char *url, bool *tls_out, authority_t *a, const char **path_out)
{
    bool tls;
    const char *p;
    if (strncasecmp(url, "http://", 7) == 0) {
        tls = false;
        p = url + 7;
    } else if (strncasecmp(url, "https://", 8) == 0) {
        tls = true;
        p = url + 8;
    } else {
        return "must start with http:// or https://";
    }
    size_t alen = strcspn(p, "/?#");
    if (memchr(p, '@', alen))
        return "credentials in the URL are not supported";
    if (alen == 0 || authority_parse(p, alen, a) != 0)
        return "bad host or port";
    if (a->port == 0)
        return "port must be 1-65535";
    const char *path = p + alen;
    if (*path != '/')
        return *path ? "query strings and fragments are not supported"
                     : "needs a path, e.g. http://127.0.0.1:3001/mcp (\"/\" for the root)";
    for (const char *q = path; *q; q++) {
        if (*q == '?' || *q == '#')
            return "query strings and fragments are not supported";
        if ((unsigned char)*q <= 0x20 || *q == 0x7f)
            return "spaces and control characters are not allowed in the path";
    }
    if (a->port < 0)
        a->port = tls ? 443 : 80;
    *tls_out = tls;
    *path_out = path;
    return NULL;
}

static char *host_header(const authority_t *a)
{
    return a->v6 ? xasprintf("[%.*s]:%d", (int)a->hlen, a->host, a->port)
                 : xasprintf("%.*s:%d", (int)a->hlen, a->host, a->port);
}

const char *config_set_upstream(config_t *c, const char *url)
{
    http_url_t u = {0};
    const char *err = config_parse_http_url(url, &u);
    if (err)
        return err;
    free(c->upstream_url);
    free(c->upstream.host);
    free(c->upstream_path);
    free(c->upstream_host_header);
    c->upstream_url = u.url;
    c->upstream_tls = u.tls;
    c->upstream = u.hp;
    c->upstream_path = u.path;
    c->upstream_host_header = u.host_header;
    config_stdio_free(&c->stdio);
    return NULL;
}

const char *config_parse_http_url(const char *url, http_url_t *out)
{
    bool tls;
    authority_t a;
    const char *path;
    const char *err = url_split(url, &tls, &a, &path);
    if (err)
        return err;
    config_http_url_free(out);
    out->url = xstrdup(url);
    out->tls = tls;
    out->hp.host = xstrndup(a.host, a.hlen);
    out->hp.port = (uint16_t)a.port;
    out->path = xstrdup(path);
    out->host_header = host_header(&a);
    return NULL;
}

void config_http_url_free(http_url_t *u)
{
    free(u->url);
    free(u->hp.host);
    free(u->path);
    free(u->host_header);
    memset(u, 0, sizeof(*u));
}

const char *config_set_jwks_url(subject_jwt_conf_t *j, const char *url)
{
    /* the keys decide who a caller is: they must come from a server that proved its name */
    if (strncasecmp(url, "https://", 8) != 0 && strncasecmp(url, "http://", 7) == 0)
        return "must be https://";
    return config_parse_http_url(url, &j->jwks);
}

void config_listen_tls_free(listen_tls_conf_t *t)
{
    free(t->cert_file);
    free(t->key_file);
    free(t->client_ca_file);
    memset(t, 0, sizeof(*t));
}

void config_subject_jwt_free(subject_jwt_conf_t *j)
{
    free(j->jwks_file);
    config_http_url_free(&j->jwks);
    free(j->ca_file);
    free(j->issuer);
    util_strv_free(j->audiences, j->n_audiences);
    util_strv_free(j->claims, j->n_claims);
    memset(j, 0, sizeof(*j));
}

/* ---- allowed_hosts / allowed_origins ---- */

static char *lower_dup(const char *s, size_t n)
{
    char *d = xstrndup(s, n);
    for (char *q = d; *q; q++)
        *q = (char)tolower((unsigned char)*q);
    return d;
}

/* Host part of an entry or header: strips brackets and one trailing dot. */
static bool bare_host(const char *s, size_t n, const char **h, size_t *hlen)
{
    authority_t a;
    if (authority_parse(s, n, &a) != 0)
        return false;
    *h = a.host;
    *hlen = a.hlen;
    if (!a.v6 && *hlen > 1 && a.host[*hlen - 1] == '.')
        (*hlen)--;
    return true;
}

char *config_host_entry_norm(const char *s, const char **err)
{
    size_t n = strlen(s);
    if (strcmp(s, "*") == 0)
        return xstrdup("*");
    /* An IPv6 address needs no brackets here: ports are never part of an entry. */
    if (memchr(s, ':', n) && s[0] != '[' && host_v6_valid(s, n))
        return lower_dup(s, n);
    authority_t a;
    if (authority_parse(s, n, &a) != 0) {
        *err = "not a host name or address";
        return NULL;
    }
    if (a.port >= 0) {
        *err = "give the host without a port (the port is not compared)";
        return NULL;
    }
    return lower_dup(a.host, a.hlen);
}

typedef struct origin {
    bool tls;
    const char *host;
    size_t hlen;
    int port; /* default port filled in */
} origin_t;

static int origin_parse(const char *s, origin_t *o)
{
    const char *p;
    authority_t a;
    if (strncasecmp(s, "http://", 7) == 0) {
        o->tls = false;
        p = s + 7;
    } else if (strncasecmp(s, "https://", 8) == 0) {
        o->tls = true;
        p = s + 8;
    } else {
        return -1;
    }
    if (authority_parse(p, strlen(p), &a) != 0 || a.port == 0)
        return -1;
    o->host = a.host;
    o->hlen = a.hlen;
    if (!a.v6 && o->hlen > 1 && o->host[o->hlen - 1] == '.')
        o->hlen--;
    o->port = a.port >= 0 ? a.port : (o->tls ? 443 : 80);
    return 0;
}

char *config_origin_entry_norm(const char *s, const char **err)
{
    origin_t o;
    if (strcmp(s, "*") == 0 || strcasecmp(s, "null") == 0)
        return lower_dup(s, strlen(s));
    if (strstr(s, "://")) {
        if (origin_parse(s, &o) != 0) {
            *err = "not an origin: expected scheme://host[:port] with http or https and no path";
            return NULL;
        }
        return lower_dup(s, strlen(s));
    }
    return config_host_entry_norm(s, err);
}

static bool list_has_star(char *const *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i], "*") == 0)
            return true;
    return false;
}

bool config_host_allowed(const config_t *c, const char *host_header)
{
    const char *h;
    size_t hlen;
    if (list_has_star(c->allowed_hosts, c->n_allowed_hosts))
        return true;
    if (!host_header || !bare_host(host_header, strlen(host_header), &h, &hlen))
        return false;
    for (size_t i = 0; i < c->n_allowed_hosts; i++)
        if (util_strncaseeq(h, hlen, c->allowed_hosts[i]))
            return true;
    return false;
}

bool config_origin_allowed(const config_t *c, const char *origin)
{
    origin_t o, e;
    if (!origin)
        return true;
    if (list_has_star(c->allowed_origins, c->n_allowed_origins))
        return true;
    bool is_null = strcasecmp(origin, "null") == 0;
    bool parsed = !is_null && origin_parse(origin, &o) == 0;
    for (size_t i = 0; i < c->n_allowed_origins; i++) {
        const char *ent = c->allowed_origins[i];
        if (strcmp(ent, "null") == 0) {
            if (is_null)
                return true;
        } else if (!parsed) {
            continue;
        } else if (strstr(ent, "://")) {
            if (origin_parse(ent, &e) == 0 && e.tls == o.tls && e.port == o.port &&
                e.hlen == o.hlen && strncasecmp(e.host, o.host, o.hlen) == 0)
                return true;
        } else if (util_strncaseeq(o.host, o.hlen, ent)) {
            return true;
        }
    }
    return false;
}

static void strv_set(char ***v, size_t *n, const char *const *src, size_t count)
{
    *v = xcalloc(count, sizeof(char *));
    for (size_t i = 0; i < count; i++)
        (*v)[i] = xstrdup(src[i]);
    *n = count;
}

static void fill_allowed_defaults(config_t *c)
{
    static const char *const loopback[] = {"localhost", "127.0.0.1", "::1"};
    static const char *const any[] = {"*"};
    /* Only loopback listeners are safe to lock down by default: a rebound DNS name then
     * reaches us with its own Host, which is refused. Elsewhere we cannot guess the names. */
    bool lo = config_host_is_loopback(c->listen.host);
    if (c->n_allowed_hosts == 0)
        strv_set(&c->allowed_hosts, &c->n_allowed_hosts, lo ? loopback : any,
                 lo ? ARRAY_LEN(loopback) : 1);
    if (c->n_allowed_origins == 0)
        strv_set(&c->allowed_origins, &c->n_allowed_origins, lo ? loopback : any,
                 lo ? ARRAY_LEN(loopback) : 1);
}

/* ---- load ---- */

static void config_defaults(config_t *c)
{
    memset(c, 0, sizeof(*c));
    c->listen.host = xstrdup("127.0.0.1");
    c->listen.port = 8080;
    c->admin_listen.host = xstrdup("127.0.0.1");
    c->admin_listen.port = 8081;
    c->alerts_webhook_timeout_ms = 5000;
    c->migrate = true;
    c->forward_other_paths = true;
    c->dup_harness_ms = DUP_HARNESS_DEFAULT_MS;
    c->dup_model_ms = DUP_MODEL_DEFAULT_MS;
    c->store_pool = 4;
    c->store_group_commit = true;
    c->store_timeout_ms = 5 * 1000;
    c->workers = 1;
    c->otlp_sample_ratio = 1.0;
    c->sweep_interval_ms = 60 * 1000;
    c->cache_entries = 100000;
    c->cache_bytes = 64u * 1024 * 1024;
    c->client_header_timeout_ms = 10 * 1000;
    c->client_body_timeout_ms = 30 * 1000;
    c->client_idle_timeout_ms = 60 * 1000;
    c->upstream_connect_timeout_ms = 5 * 1000;
    c->upstream_timeout_ms = 60 * 1000;
    c->upstream_idle_timeout_ms = 300 * 1000;
    c->drain_timeout_ms = 30 * 1000;
    c->max_body_bytes = 4u << 20;
    c->max_header_bytes = 16u << 10;
    c->max_connections = 10000;
    c->upstream_pool = 64;
    c->log_level = LOG_INFO;
    c->subject.kind = SUBJECT_DEFAULT;
    policy_defaults_init(&c->policy.defaults);
}

static const char *env_get(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static void env_host_port(const char *var, host_port_t *hp, config_errors_t *errs)
{
    const char *v = env_get(var);
    host_port_t parsed;
    if (!v)
        return;
    if (config_parse_host_port(v, &parsed) != 0) {
        config_errors_add(
            errs, "env %s: bad address '%.100s' (expected host:port, [v6]:port or :port)", var, v);
        return;
    }
    free(hp->host);
    *hp = parsed;
}

/* Returns whether IDEMGW_UPSTREAM was given (valid or not). */
static bool apply_env(config_t *c, config_errors_t *errs)
{
    bool upstream_seen = false;
    const char *v;
    env_host_port("IDEMGW_LISTEN", &c->listen, errs);
    env_host_port("IDEMGW_ADMIN_LISTEN", &c->admin_listen, errs);
    if ((v = env_get("IDEMGW_UPSTREAM"))) {
        upstream_seen = true;
        const char *err = config_set_upstream(c, v);
        if (err)
            config_errors_add(errs, "env IDEMGW_UPSTREAM: bad URL '%.200s': %s", v, err);
    }
    if ((v = env_get("IDEMGW_DATABASE_URL"))) {
        char why[300];
        if (store_url_error(v, why, sizeof(why)))
            config_errors_add(errs, "env IDEMGW_DATABASE_URL: %s", why);
        free(c->database_url);
        c->database_url = xstrdup(v);
    }
    if ((v = env_get("IDEMGW_UPSTREAM_CA_FILE"))) {
        free(c->upstream_ca_file);
        c->upstream_ca_file = xstrdup(v);
    }
    if ((v = env_get("IDEMGW_LOG_LEVEL"))) {
        int lvl = log_level_parse(v);
        if (lvl < 0)
            config_errors_add(errs,
                              "env IDEMGW_LOG_LEVEL: unknown level '%.50s' (allowed: debug, "
                              "info, warn, error, off)",
                              v);
        else
            c->log_level = lvl;
    }
    return upstream_seen;
}

/* The store, and the error of its choice: several workers on the embedded store, which takes
 * one process ("sqlite:" without a file is refused where database_url is read). */
static void choose_store(config_t *c, const char *name, int workers_line,
                         config_errors_t *errs)
{
    char where[300];
    if (name && workers_line > 0)
        snprintf(where, sizeof(where), "%s:%d", name, workers_line);
    else
        snprintf(where, sizeof(where), "%s", name ? name : "env");
    c->store_kind = store_url_parse(c->database_url, &c->store_target);
    c->store_enabled = c->store_kind != STORE_URL_NONE;
    if (c->store_kind == STORE_URL_FILE && !c->store_target && !c->database_url) {
        config_errors_add(errs,
                          "%s: no database_url, and no folder for the embedded store's default "
                          "file (none of STATE_DIRECTORY, XDG_STATE_HOME, HOME is set): name "
                          "its file with database_url: sqlite:PATH (or IDEMGW_DATABASE_URL)",
                          name ? name : "env");
        return;
    }
    if (c->store_kind == STORE_URL_FILE && c->workers > 1)
        config_errors_add(errs,
                          "%s: workers: %d with the embedded store (%s): each worker is a "
                          "process and the file takes one; set workers: 1, or database_url to "
                          "a Postgres database (or none)",
                          where, c->workers, c->store_target ? c->store_target : "sqlite:");
}

static config_t *load(const char *name, const char *text, size_t len, config_errors_t *out)
{
    config_errors_t local = {0};
    config_errors_t *errs = out ? out : &local;
    size_t before = errs->n;
    config_t *c = xmalloc(sizeof(*c));
    config_defaults(c);
    if (name)
        c->path = xstrdup(name);

    config_yaml_result_t yr = {.readable = true};
    if (text)
        yr = config_yaml_apply(c, name, text, len, errs);
    bool env_upstream = apply_env(c, errs);

    /* A file we could not read, or an upstream given but invalid, already has its error;
     * "required" on top would only mislead. */
    if (yr.servers_seen && (yr.upstream_seen || env_upstream))
        config_errors_add(errs,
                          "%s: upstream%s and servers are both given: with servers, each "
                          "server names its own upstream; remove the top-level one",
                          name ? name : "env", env_upstream ? " (IDEMGW_UPSTREAM)" : "");
    else if (!c->upstream_url && yr.readable && !yr.upstream_seen && !env_upstream &&
             !yr.servers_seen) {
        if (text)
            config_errors_add(errs, "%s:1: upstream is required (or set IDEMGW_UPSTREAM)", name);
        else
            config_errors_add(errs, "upstream is required");
    }
    fill_allowed_defaults(c);
    choose_store(c, name, yr.workers_line, errs);
    for (size_t i = 0; i < config_n_servers(c); i++) {
        const config_t *sv = config_server(c, i);
        if (!sv->stdio.argv || c->workers <= 1)
            continue;
        char where[300];
        snprintf(where, sizeof(where), "%s:%d", name ? name : "env", yr.workers_line);
        config_errors_add(errs,
                          "%s: workers: %d with a stdio upstream%s%s: each worker is a process "
                          "with children of its own, and the kernel gives a session's next "
                          "connection to any worker, which would not have that session's child; "
                          "set workers: 1",
                          name && yr.workers_line > 0 ? where : (name ? name : "env"), c->workers,
                          sv->server_name ? " in server " : "",
                          sv->server_name ? sv->server_name : "");
        break;
    }
    config_views_refresh(c);

    bool failed = errs->n > before;
    config_errors_free(&local);
    if (failed) {
        config_free(c);
        return NULL;
    }
    return c;
}

config_t *config_load_string(const char *name, const char *yaml, config_errors_t *errs)
{
    if (!name)
        name = "<string>";
    if (!yaml)
        yaml = "";
    return load(name, yaml, strlen(yaml), errs);
}

config_t *config_load(const char *path, config_errors_t *errs)
{
    config_t *c = NULL;
    char *buf = NULL;
    FILE *f = NULL;
    config_errors_t local = {0};
    if (!errs)
        errs = &local;
    if (!path)
        return load(NULL, NULL, 0, errs == &local ? NULL : errs);

    f = fopen(path, "rbe");
    if (!f) {
        config_errors_add(errs, "%s: cannot open: %s", path, strerror(errno));
        goto out;
    }
    buf = xmalloc(CONFIG_MAX_FILE_BYTES + 1);
    size_t n = fread(buf, 1, CONFIG_MAX_FILE_BYTES + 1, f);
    if (ferror(f)) {
        config_errors_add(errs, "%s: cannot read: %s", path, strerror(errno));
        goto out;
    }
    if (n > CONFIG_MAX_FILE_BYTES) {
        config_errors_add(errs, "%s: file is larger than %u bytes", path, CONFIG_MAX_FILE_BYTES);
        goto out;
    }
    buf[n] = '\0';
    c = load(path, buf, n, errs);
out:
    if (f)
        fclose(f);
    free(buf);
    config_errors_free(&local);
    return c;
}

void config_free(config_t *c)
{
    if (!c || c->parent) /* a view is freed with its top level */
        return;
    free(c->path);
    config_http_url_free(&c->otlp);
    free(c->listen.host);
    free(c->admin_listen.host);
    free(c->upstream_url);
    free(c->upstream.host);
    free(c->upstream_path);
    free(c->upstream_host_header);
    config_stdio_free(&c->stdio);
    free(c->database_url);
    free(c->store_target);
    free(c->upstream_ca_file);
    free(c->admin_token_file);
    free(c->alerts_webhook_url);
    util_strv_free(c->allowed_hosts, c->n_allowed_hosts);
    util_strv_free(c->allowed_origins, c->n_allowed_origins);
    free(c->subject.value);
    config_subject_jwt_free(&c->subject.jwt);
    config_listen_tls_free(&c->listen_tls);
    policy_free(&c->policy);
    for (size_t i = 0; i < c->n_servers; i++)
        config_view_free(c->servers[i]);
    free(c->servers);
    free(c);
}
