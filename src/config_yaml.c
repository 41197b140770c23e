/* The YAML reader of the config module: walks a libfyaml document with tables of known keys and
 * writes into config_t. Every problem is collected with its line; nothing stops at the first. */
#include "config_yaml.h"
#include "jwt.h"
#include "log.h"
#include "peer_cert.h"
#include "util.h"

#include <errno.h>
#include <libfyaml.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define MS_S 1000ULL
#define MS_H (3600 * MS_S)
#define MS_D (24 * MS_H)
#define MAX_NAME 256
#define PATH_MAX_LEN 320

typedef struct yerr {
    int line;
    size_t seq; /* insertion order, so equal lines keep their order after sorting */
    char *msg;  /* without the "file:line: " prefix */
} yerr_t;

typedef struct ctx {
    const char *name; /* file name used in messages */
    config_t *c;
    config_yaml_result_t res;
    yerr_t *errs;
    size_t n_errs;
} ctx_t;

typedef enum {
    K_STR,     /* char *, non-empty */
    K_BOOL,    /* bool */
    K_INT,     /* int in [min, max] */
    K_DUR,     /* uint64_t milliseconds in [min, max] */
    K_SIZE,    /* uint64_t bytes in [min, max] */
    K_ADDR,    /* host_port_t */
    K_ENUM,    /* int-sized enum, value = index in names */
    K_SECTION, /* nested mapping described by sub */
    K_FN,      /* custom handler */
} kind_t;

typedef struct key_spec key_spec_t;
typedef void (*key_fn)(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base);

struct key_spec {
    const char *name;
    kind_t kind;
    size_t off;
    uint64_t min, max;
    const char *const *names; /* K_ENUM: NULL-terminated, in enum order */
    key_fn fn;                /* K_FN */
    const key_spec_t *sub;    /* K_SECTION */
    size_t n_sub;
    int order; /* top level only: sections handled in passes 0, 1, 2 (see walk_root) */
    /* Every key but a section says what a reload does with it (config_reload_merge). */
    config_key_reload_t reload;
    /* restart-only K_FN keys: whether two configs agree, and running's value into next (the
     * other kinds are compared and copied through kind and off) */
    bool (*same)(const config_t *a, const config_t *b);
    void (*carry)(config_t *next, const config_t *running);
};

/* Enums are written through an int; they must be int-sized. */
_Static_assert(sizeof(tool_class_t) == sizeof(int), "enum size");
_Static_assert(sizeof(on_tool_error_t) == sizeof(int), "enum size");
_Static_assert(sizeof(on_ambiguous_t) == sizeof(int), "enum size");
_Static_assert(sizeof(on_store_down_t) == sizeof(int), "enum size");

static void err_at(ctx_t *cx, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void err_at(ctx_t *cx, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *msg = xvasprintf(fmt, ap);
    va_end(ap);
    cx->errs = xrealloc(cx->errs, (cx->n_errs + 1) * sizeof(yerr_t));
    cx->errs[cx->n_errs] = (yerr_t){.line = line > 0 ? line : 1, .seq = cx->n_errs, .msg = msg};
    cx->n_errs++;
}

/* ---- node helpers ---- */

/* libfyaml 0.7 has no start mark for collections, so a mapping or sequence is located by the
 * line of the key that holds it (fallback). */
static int node_line(struct fy_node *n, int fallback)
{
    if (n && fy_node_is_scalar(n)) {
        const struct fy_mark *m = fy_token_start_mark(fy_node_get_scalar_token(n));
        if (m)
            return m->line + 1;
    }
    return fallback;
}

static bool node_is_null(struct fy_node *n)
{
    if (!n)
        return true;
    if (!fy_node_is_scalar(n) || fy_node_is_alias(n) || fy_node_get_style(n) != FYNS_PLAIN)
        return false;
    size_t len;
    const char *s = fy_node_get_scalar(n, &len);
    if (!s || len == 0)
        return true;
    return (len == 1 && s[0] == '~') ||
           (len == 4 && (!memcmp(s, "null", 4) || !memcmp(s, "Null", 4) || !memcmp(s, "NULL", 4)));
}

/* The line where a node's content starts: its first scalar, for a document root. */
static int first_line(struct fy_node *n, int fallback)
{
    void *it = NULL;
    for (int depth = 0; n && depth < 64; depth++) {
        if (fy_node_is_scalar(n))
            return node_line(n, fallback);
        it = NULL;
        if (fy_node_is_mapping(n)) {
            struct fy_node_pair *p = fy_node_mapping_iterate(n, &it);
            n = p ? fy_node_pair_key(p) : NULL;
        } else {
            n = fy_node_sequence_iterate(n, &it);
        }
    }
    return fallback;
}

static const char *node_kind(struct fy_node *n)
{
    if (node_is_null(n))
        return "nothing";
    if (fy_node_is_alias(n))
        return "an alias";
    if (fy_node_is_mapping(n))
        return "a mapping";
    if (fy_node_is_sequence(n))
        return "a list";
    return "a scalar";
}

/* The scalar text of v, or NULL after reporting what was expected instead. Aliases are refused
 * rather than resolved: the config is small, and resolving invites alias bombs. */
static const char *scalar(ctx_t *cx, struct fy_node *v, int line, const char *path,
                          const char *what)
{
    size_t len;
    if (v && fy_node_is_alias(v)) {
        err_at(cx, line, "%s: anchors and aliases are not supported", path);
        return NULL;
    }
    if (node_is_null(v) || !fy_node_is_scalar(v)) {
        err_at(cx, line, "%s: expected %s, got %s", path, what, node_kind(v));
        return NULL;
    }
    const char *s = fy_node_get_scalar(v, &len);
    if (!s || memchr(s, '\0', len)) {
        err_at(cx, line, "%s: contains a NUL byte", path);
        return NULL;
    }
    return fy_node_get_scalar0(v);
}

static void child_path(char *out, const char *path, const char *key)
{
    if (*path)
        snprintf(out, PATH_MAX_LEN, "%s.%.64s", path, key);
    else
        snprintf(out, PATH_MAX_LEN, "%.64s", key);
}

/* Durations and sizes are printed back in the largest unit that divides them. */
static void fmt_dur(char *buf, size_t len, uint64_t ms)
{
    static const struct {
        const char *u;
        uint64_t ms;
    } units[] = {{"d", MS_D}, {"h", MS_H}, {"m", 60 * MS_S}, {"s", MS_S}};
    for (size_t i = 0; i < ARRAY_LEN(units); i++) {
        if (ms && ms % units[i].ms == 0) {
            snprintf(buf, len, "%llu%s", (unsigned long long)(ms / units[i].ms), units[i].u);
            return;
        }
    }
    snprintf(buf, len, "%llums", (unsigned long long)ms);
}

static void fmt_size(char *buf, size_t len, uint64_t b)
{
    static const char *const units[] = {"GiB", "MiB", "KiB"};
    for (size_t i = 0; i < ARRAY_LEN(units); i++) {
        uint64_t m = 1ULL << (10 * (3 - i));
        if (b && b % m == 0) {
            snprintf(buf, len, "%llu%s", (unsigned long long)(b / m), units[i]);
            return;
        }
    }
    snprintf(buf, len, "%llu", (unsigned long long)b);
}

static void join_names(char *buf, size_t len, const char *const *names)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; names[i] && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? ", " : "", names[i]);
}

/* ---- typed values ---- */

static bool get_duration(ctx_t *cx, struct fy_node *v, int line, const char *path, uint64_t min,
                         uint64_t max, uint64_t *out)
{
    char a[32], b[32];
    const char *s = scalar(cx, v, line, path, "a duration (e.g. 90s)");
    if (!s)
        return false;
    if (policy_parse_duration(s, out) != 0) {
        err_at(cx, line,
               "%s: bad duration '%.64s' (a whole number with unit ms, s, m, h or d, "
               "e.g. 250ms, 90s, 10m)",
               path, s);
        return false;
    }
    if (*out < min || *out > max) {
        fmt_dur(a, sizeof(a), min);
        fmt_dur(b, sizeof(b), max);
        err_at(cx, line, "%s: %s is out of range (%s to %s)", path, s, a, b);
        return false;
    }
    return true;
}

static void set_string(char **dst, const char *s)
{
    free(*dst);
    *dst = xstrdup(s);
}

static void apply_spec(ctx_t *cx, const key_spec_t *k, struct fy_node *v, int line,
                       const char *path, void *base);

/* Walks a mapping against a table. Null counts as an empty mapping (a section left blank).
 * order >= 0 restricts the walk to specs of that order (top level passes). */
static void walk_map(ctx_t *cx, struct fy_node *map, int line, const char *path,
                     const key_spec_t *specs, size_t n, void *base, int order)
{
    void *it = NULL;
    struct fy_node_pair *pair;
    char cpath[PATH_MAX_LEN];
    if (node_is_null(map))
        return;
    if (fy_node_is_alias(map) || !fy_node_is_mapping(map)) {
        err_at(cx, line, "%s: expected a mapping, got %s", *path ? path : "top level",
               node_kind(map));
        return;
    }
    while ((pair = fy_node_mapping_iterate(map, &it))) {
        struct fy_node *kn = fy_node_pair_key(pair);
        struct fy_node *vn = fy_node_pair_value(pair);
        int kline = node_line(kn, node_line(vn, line));
        if (order > 0 && (!kn || !fy_node_is_scalar(kn) || fy_node_is_alias(kn)))
            continue; /* reported in pass 0 */
        const char *key = scalar(cx, kn, kline, *path ? path : "top level", "a key");
        if (!key)
            continue;
        const key_spec_t *k = NULL;
        for (size_t i = 0; i < n && !k; i++)
            if (strcmp(specs[i].name, key) == 0)
                k = &specs[i];
        if (!k) {
            if (order > 0)
                continue; /* reported in pass 0 */
            char allowed[600];
            size_t used = 0;
            allowed[0] = '\0';
            for (size_t i = 0; i < n && used < sizeof(allowed); i++)
                used += (size_t)snprintf(allowed + used, sizeof(allowed) - used, "%s%s",
                                         i ? ", " : "", specs[i].name);
            if (*path)
                err_at(cx, kline, "unknown key '%.64s' in %s (allowed: %s)", key, path, allowed);
            else
                err_at(cx, kline, "unknown key '%.64s' (allowed: %s)", key, allowed);
            continue;
        }
        if (order >= 0 && k->order != order)
            continue;
        child_path(cpath, path, key);
        apply_spec(cx, k, vn, node_line(vn, kline), cpath, base);
    }
}

static void apply_spec(ctx_t *cx, const key_spec_t *k, struct fy_node *v, int line,
                       const char *path, void *base)
{
    char *field = (char *)base + k->off;
    const char *s;
    char a[32], b[32], allowed[200];
    uint64_t u;
    switch (k->kind) {
    case K_STR:
        if (!(s = scalar(cx, v, line, path, "a string")))
            return;
        if (!*s) {
            err_at(cx, line, "%s: must not be empty", path);
            return;
        }
        set_string((char **)field, s);
        return;
    case K_BOOL:
        if (!(s = scalar(cx, v, line, path, "true or false")))
            return;
        if (strcasecmp(s, "true") == 0)
            *(bool *)field = true;
        else if (strcasecmp(s, "false") == 0)
            *(bool *)field = false;
        else
            err_at(cx, line, "%s: expected true or false, got '%.64s'", path, s);
        return;
    case K_INT: {
        if (!(s = scalar(cx, v, line, path, "an integer")))
            return;
        /* Digits only: no sign, no spaces, no hex; ten digits cannot overflow the check. */
        size_t len = strspn(s, "0123456789");
        uint64_t x = 0;
        for (size_t i = 0; i < len && i < 10; i++)
            x = x * 10 + (uint64_t)(s[i] - '0');
        if (len == 0 || s[len] || len > 10 || x < k->min || x > k->max) {
            err_at(cx, line, "%s: expected an integer from %llu to %llu, got '%.64s'", path,
                   (unsigned long long)k->min, (unsigned long long)k->max, s);
            return;
        }
        *(int *)field = (int)x;
        return;
    }
    case K_DUR:
        if (get_duration(cx, v, line, path, k->min, k->max, &u))
            *(uint64_t *)field = u;
        return;
    case K_SIZE:
        if (!(s = scalar(cx, v, line, path, "a size (e.g. 4MiB)")))
            return;
        if (policy_parse_size(s, &u) != 0) {
            err_at(cx, line,
                   "%s: bad size '%.64s' (a whole number with optional unit KiB, MiB "
                   "or GiB, e.g. 4MiB)",
                   path, s);
            return;
        }
        if (u < k->min || u > k->max) {
            fmt_size(a, sizeof(a), k->min);
            fmt_size(b, sizeof(b), k->max);
            err_at(cx, line, "%s: %s is out of range (%s to %s)", path, s, a, b);
            return;
        }
        *(uint64_t *)field = u;
        return;
    case K_ADDR: {
        host_port_t hp;
        if (!(s = scalar(cx, v, line, path, "host:port")))
            return;
        if (config_parse_host_port(s, &hp) != 0) {
            err_at(cx, line, "%s: bad address '%.100s' (expected host:port, [v6]:port or :port)",
                   path, s);
            return;
        }
        free(((host_port_t *)field)->host);
        *(host_port_t *)field = hp;
        return;
    }
    case K_ENUM:
        if (!(s = scalar(cx, v, line, path, "a name")))
            return;
        for (int i = 0; k->names[i]; i++) {
            if (strcmp(s, k->names[i]) == 0) {
                *(int *)field = i;
                return;
            }
        }
        join_names(allowed, sizeof(allowed), k->names);
        err_at(cx, line, "%s: unknown value '%.64s' (allowed: %s)", path, s, allowed);
        return;
    case K_SECTION:
        walk_map(cx, v, line, path, k->sub, k->n_sub, base, -1);
        return;
    case K_FN:
        k->fn(cx, v, line, path, base);
        return;
    }
}

/* ---- custom handlers ---- */

/* Iterates a list of strings (empty only when allow_empty), calling each(entry) with its line and
 * indexed path. */
typedef void (*entry_fn)(ctx_t *cx, const char *s, int line, const char *path, void *base);

static void walk_list(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base,
                      bool allow_empty, entry_fn each)
{
    void *it = NULL;
    struct fy_node *item;
    char ipath[PATH_MAX_LEN + 16];
    if (fy_node_is_alias(v) || node_is_null(v) || !fy_node_is_sequence(v)) {
        err_at(cx, line, "%s: expected a list, got %s", path, node_kind(v));
        return;
    }
    if (!allow_empty && fy_node_sequence_item_count(v) == 0) {
        err_at(cx, line, "%s: the list is empty (leave the key out for the default)", path);
        return;
    }
    for (size_t i = 0; (item = fy_node_sequence_iterate(v, &it)); i++) {
        int iline = first_line(item, line);
        snprintf(ipath, sizeof(ipath), "%s[%zu]", path, i);
        const char *s = scalar(cx, item, iline, ipath, "a string");
        if (s)
            each(cx, s, iline, ipath, base);
    }
}

static void strv_push(char ***v, size_t *n, char *s)
{
    *v = xrealloc(*v, (*n + 1) * sizeof(char *));
    (*v)[(*n)++] = s;
}

static void host_entry(ctx_t *cx, const char *s, int line, const char *path, void *base)
{
    config_t *c = base;
    const char *err = NULL;
    char *norm = config_host_entry_norm(s, &err);
    if (!norm)
        err_at(cx, line, "%s: '%.100s': %s", path, s, err);
    else
        strv_push(&c->allowed_hosts, &c->n_allowed_hosts, norm);
}

static void origin_entry(ctx_t *cx, const char *s, int line, const char *path, void *base)
{
    config_t *c = base;
    const char *err = NULL;
    char *norm = config_origin_entry_norm(s, &err);
    if (!norm)
        err_at(cx, line, "%s: '%.100s': %s", path, s, err);
    else
        strv_push(&c->allowed_origins, &c->n_allowed_origins, norm);
}

static void fn_allowed_hosts(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    walk_list(cx, v, line, path, base, false, host_entry);
}

static void fn_allowed_origins(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    walk_list(cx, v, line, path, base, false, origin_entry);
}

static void exclude_entry(ctx_t *cx, const char *s, int line, const char *path, void *base)
{
    policy_tool_t *t = base;
    size_t n = strlen(s);
    if (n == 0 || s[0] == '.' || s[n - 1] == '.' || strstr(s, "..")) {
        err_at(cx, line, "%s: '%.100s' is not a dotted argument path (e.g. meta.client_ts)", path,
               s);
        return;
    }
    strv_push(&t->exclude_args, &t->n_exclude_args, xstrdup(s));
}

static void fn_exclude_args(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    policy_tool_t *t = base;
    /* A tool's list replaces the inherited one rather than adding to it. */
    util_strv_free(t->exclude_args, t->n_exclude_args);
    t->exclude_args = NULL;
    t->n_exclude_args = 0;
    walk_list(cx, v, line, path, base, true, exclude_entry);
}

static void fn_upstream(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    cx->res.upstream_seen = true;
    const char *s = scalar(cx, v, line, path, "a URL");
    if (!s)
        return;
    const char *err = config_set_upstream(base, s);
    if (err)
        err_at(cx, line, "%s: bad URL '%.200s': %s", path, s, err);
}

static void fn_otlp_endpoint(ctx_t *cx, struct fy_node *v, int line, const char *path,
                             void *base)
{
    config_t *c = base;
    const char *s = scalar(cx, v, line, path, "a URL");
    if (!s)
        return;
    /* OTLP endpoints are given as a base URL, often without a path: it is the root */
    const char *scheme_end = strstr(s, "://");
    char *url = scheme_end && !strchr(scheme_end + 3, '/') ? xasprintf("%s/", s) : xstrdup(s);
    const char *err = config_parse_http_url(url, &c->otlp);
    if (err)
        err_at(cx, line, "%s: bad URL '%.200s': %s", path, s, err);
    free(url);
}

static void fn_otlp_sample_ratio(ctx_t *cx, struct fy_node *v, int line, const char *path,
                                 void *base)
{
    config_t *c = base;
    const char *s = scalar(cx, v, line, path, "a number from 0 to 1");
    if (!s)
        return;
    char *end;
    errno = 0;
    double r = strtod(s, &end);
    if (errno || end == s || *end || !(r >= 0.0 && r <= 1.0))
        err_at(cx, line, "%s: '%.200s' is not a number from 0 to 1", path, s);
    else
        c->otlp_sample_ratio = r;
}

static void fn_upstream_ca_file(ctx_t *cx, struct fy_node *v, int line, const char *path,
                                void *base)
{
    config_t *c = base;
    const char *s = scalar(cx, v, line, path, "a file name");
    if (!s)
        return;
    if (!*s) {
        err_at(cx, line, "%s: must not be empty", path);
        return;
    }
    if (access(s, R_OK) != 0) {
        err_at(cx, line, "%s: cannot read '%.200s': %s", path, s, strerror(errno));
        return;
    }
    free(c->upstream_ca_file);
    c->upstream_ca_file = xstrdup(s);
}

static void fn_database_url(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    config_t *c = base;
    const char *s = scalar(cx, v, line, path, "a string");
    if (!s)
        return;
    if (!*s) {
        err_at(cx, line, "%s: must not be empty", path);
        return;
    }
    char why[300];
    if (config_database_url_error(s, why, sizeof(why))) {
        err_at(cx, line, "%s: %s", path, why);
        return;
    }
    set_string(&c->database_url, s);
}

static void fn_log_level(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    config_t *c = base;
    const char *s = scalar(cx, v, line, path, "a level");
    if (!s)
        return;
    int lvl = log_level_parse(s);
    if (lvl < 0)
        err_at(cx, line, "%s: unknown value '%.64s' (allowed: debug, info, warn, error, off)", path,
               s);
    else
        c->log_level = lvl;
}

static bool header_token_valid(const char *s)
{
    if (!*s)
        return false;
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
              strchr("!#$%&'*+-.^_`|~", ch)))
            return false;
    }
    return true;
}

/* ---- listen_tls: {...} ---- */

static const char *const client_cert_names[] = {"optional", "required", NULL};
static const char *const tls_version_names[] = {"1.2", "1.3", NULL};

#define TLS_CONF(f) offsetof(listen_tls_conf_t, f)
/* Reload: listen_tls is replaced whole (the key "listen_tls" is reloadable). */
static const key_spec_t listen_tls_keys[] = {
    {.name = "cert_file",
     .kind = K_STR,
     .off = TLS_CONF(cert_file),
     .reload = CONFIG_KEY_RELOADABLE},
    {.name = "key_file", .kind = K_STR, .off = TLS_CONF(key_file), .reload = CONFIG_KEY_RELOADABLE},
    {.name = "client_ca_file",
     .kind = K_STR,
     .off = TLS_CONF(client_ca_file),
     .reload = CONFIG_KEY_RELOADABLE},
    {.name = "client_cert",
     .kind = K_ENUM,
     .off = TLS_CONF(client_cert),
     .names = client_cert_names,
     .reload = CONFIG_KEY_RELOADABLE},
    {.name = "min_version",
     .kind = K_ENUM,
     .off = TLS_CONF(min_version),
     .names = tls_version_names,
     .reload = CONFIG_KEY_RELOADABLE},
};
#undef TLS_CONF

static void readable(ctx_t *cx, int line, const char *path, const char *key, const char *file)
{
    if (file && access(file, R_OK) != 0)
        err_at(cx, line, "%s.%s: cannot read '%.200s': %s", path, key, file, strerror(errno));
}

static void fn_listen_tls(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    config_t *c = base;
    listen_tls_conf_t *t = &c->listen_tls;
    config_listen_tls_free(t);
    if (fy_node_is_alias(v) || node_is_null(v) || !fy_node_is_mapping(v)) {
        err_at(cx, line, "%s: expected a mapping (cert_file, key_file, client_ca_file, ...)", path);
        return;
    }
    t->client_cert = -1;
    size_t before = cx->n_errs;
    walk_map(cx, v, line, path, listen_tls_keys, ARRAY_LEN(listen_tls_keys), t, -1);
    if (t->client_cert < 0)
        t->client_cert = t->client_ca_file ? LISTEN_TLS_CLIENT_REQUIRED : LISTEN_TLS_CLIENT_NONE;
    if (cx->n_errs > before)
        return;
    if (!t->cert_file || !t->key_file) {
        err_at(cx, line, "%s: cert_file and key_file are required", path);
        return;
    }
    if (!t->client_ca_file && t->client_cert != LISTEN_TLS_CLIENT_NONE) {
        err_at(cx, line, "%s: client_cert needs client_ca_file (the CAs that verify them)", path);
        return;
    }
    readable(cx, line, path, "cert_file", t->cert_file);
    readable(cx, line, path, "key_file", t->key_file);
    readable(cx, line, path, "client_ca_file", t->client_ca_file);
    t->enabled = cx->n_errs == before;
}

/* ---- subject: {jwt: {...}} ---- */

/* A JWK Set is small; a file this large is a mistake. */
#define JWKS_MAX_FILE_BYTES (1024u * 1024)

static void fn_jwt_jwks_file(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    subject_jwt_conf_t *j = base;
    const char *s = scalar(cx, v, line, path, "a file name");
    if (!s)
        return;
    char err[300];
    size_t len = 0;
    char *text = *s ? util_read_file(s, JWKS_MAX_FILE_BYTES, &len, err, sizeof(err)) : NULL;
    if (!*s) {
        err_at(cx, line, "%s: must not be empty", path);
        return;
    }
    if (!text) {
        err_at(cx, line, "%s: %s", path, err);
        return;
    }
    /* a set that will not parse is refused now, not at the first call */
    jwks_t *keys = jwks_parse(text, len, err, sizeof(err));
    free(text);
    if (!keys) {
        err_at(cx, line, "%s: '%.200s' is not a usable JWK Set: %s", path, s, err);
        return;
    }
    jwks_free(keys);
    set_string(&j->jwks_file, s);
}

static void fn_jwt_jwks_url(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    const char *s = scalar(cx, v, line, path, "a URL");
    if (!s)
        return;
    const char *err = config_set_jwks_url(base, s);
    if (err)
        err_at(cx, line, "%s: bad URL '%.200s': %s", path, s, err);
}

static void fn_jwt_ca_file(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    subject_jwt_conf_t *j = base;
    const char *s = scalar(cx, v, line, path, "a file name");
    if (!s)
        return;
    if (!*s)
        err_at(cx, line, "%s: must not be empty", path);
    else if (access(s, R_OK) != 0)
        err_at(cx, line, "%s: cannot read '%.200s': %s", path, s, strerror(errno));
    else
        set_string(&j->ca_file, s);
}

static void audience_entry(ctx_t *cx, const char *s, int line, const char *path, void *base)
{
    subject_jwt_conf_t *j = base;
    if (!*s)
        err_at(cx, line, "%s: must not be empty", path);
    else
        strv_push(&j->audiences, &j->n_audiences, xstrdup(s));
}

/* A string or a list of strings. */
static void fn_jwt_audience(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    subject_jwt_conf_t *j = base;
    util_strv_free(j->audiences, j->n_audiences);
    j->audiences = NULL;
    j->n_audiences = 0;
    if (v && !fy_node_is_alias(v) && fy_node_is_sequence(v)) {
        walk_list(cx, v, line, path, base, false, audience_entry);
        return;
    }
    const char *s = scalar(cx, v, line, path, "a string or a list of strings");
    if (s)
        audience_entry(cx, s, line, path, base);
}

static void claim_entry(ctx_t *cx, const char *s, int line, const char *path, void *base)
{
    subject_jwt_conf_t *j = base;
    if (!*s)
        err_at(cx, line, "%s: must not be empty", path);
    else
        strv_push(&j->claims, &j->n_claims, xstrdup(s));
}

static void fn_jwt_claims(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    subject_jwt_conf_t *j = base;
    util_strv_free(j->claims, j->n_claims);
    j->claims = NULL;
    j->n_claims = 0;
    walk_list(cx, v, line, path, base, false, claim_entry);
}

static void algorithm_entry(ctx_t *cx, const char *s, int line, const char *path, void *base)
{
    subject_jwt_conf_t *j = base;
    unsigned bit = jwt_alg_parse(s);
    if (!bit)
        err_at(cx, line, "%s: '%.64s' is not allowed (allowed: %s; none and HS* never are)", path,
               s, jwt_alg_names());
    j->algorithms |= bit;
}

static void fn_jwt_algorithms(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    subject_jwt_conf_t *j = base;
    j->algorithms = 0;
    walk_list(cx, v, line, path, base, false, algorithm_entry);
    if (!j->algorithms)
        j->algorithms = JWT_ALGS_DEFAULT; /* the error is reported; keep a sane value */
}

#define JWT_CONF(f) offsetof(subject_jwt_conf_t, f)
/* Reload: subject is replaced whole (the key "subject" is reloadable). */
static const key_spec_t jwt_keys[] = {
    {.name = "jwks_file", .kind = K_FN, .fn = fn_jwt_jwks_file, .reload = CONFIG_KEY_RELOADABLE},
    {.name = "jwks_url", .kind = K_FN, .fn = fn_jwt_jwks_url, .reload = CONFIG_KEY_RELOADABLE},
    {.name = "ca_file", .kind = K_FN, .fn = fn_jwt_ca_file, .reload = CONFIG_KEY_RELOADABLE},
    {.name = "issuer", .kind = K_STR, .off = JWT_CONF(issuer), .reload = CONFIG_KEY_RELOADABLE},
    {.name = "audience", .kind = K_FN, .fn = fn_jwt_audience, .reload = CONFIG_KEY_RELOADABLE},
    {.name = "claims", .kind = K_FN, .fn = fn_jwt_claims, .reload = CONFIG_KEY_RELOADABLE},
    {.name = "algorithms", .kind = K_FN, .fn = fn_jwt_algorithms, .reload = CONFIG_KEY_RELOADABLE},
    {.name = "leeway",
     .kind = K_DUR,
     .off = JWT_CONF(leeway_ms),
     .min = 0,
     .max = 10 * 60 * MS_S,
     .reload = CONFIG_KEY_RELOADABLE},
    {.name = "refresh",
     .kind = K_DUR,
     .off = JWT_CONF(refresh_ms),
     .min = 10 * MS_S,
     .max = MS_D,
     .reload = CONFIG_KEY_RELOADABLE},
};
#undef JWT_CONF

static void subject_jwt(ctx_t *cx, struct fy_node *v, int line, const char *path, config_t *c)
{
    subject_jwt_conf_t *j = &c->subject.jwt;
    config_subject_jwt_free(j);
    if (fy_node_is_alias(v) || node_is_null(v) || !fy_node_is_mapping(v)) {
        err_at(cx, line, "%s: expected a mapping (jwks_url or jwks_file, issuer, audience, ...)",
               path);
        return;
    }
    j->algorithms = JWT_ALGS_DEFAULT;
    j->leeway_ms = 30 * MS_S;
    j->refresh_ms = 5 * 60 * MS_S;
    size_t before = cx->n_errs;
    walk_map(cx, v, line, path, jwt_keys, ARRAY_LEN(jwt_keys), j, -1);
    if (!j->n_claims) {
        strv_push(&j->claims, &j->n_claims, xstrdup("iss"));
        strv_push(&j->claims, &j->n_claims, xstrdup("sub"));
    }
    if (cx->n_errs > before)
        return; /* a missing key may only be a bad one, already reported */
    /* the keys say a token is genuine; issuer and audience say it is meant for this server,
     * not a token the same identity provider issued to another service */
    if (!j->jwks_file && !j->jwks.url)
        err_at(cx, line, "%s: give jwks_url or jwks_file (where the issuer's keys are)", path);
    else if (!j->issuer)
        err_at(cx, line, "%s: issuer is required (the iss every token must have)", path);
    else if (!j->n_audiences)
        err_at(cx, line, "%s: audience is required (the aud naming this server)", path);
    else if (j->ca_file && !j->jwks.url)
        err_at(cx, line, "%s: ca_file is only used with jwks_url", path);
    else
        c->subject.kind = SUBJECT_JWT;
}

/* subject: one source names the caller, or client_cert (the workload) with one of jwt, header,
 * bearer (the user it acts for). static with client_cert adds nothing; two of the others
 * would be two answers to "which user". */
static void fn_subject(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    config_t *c = base;
    void *it = NULL;
    struct fy_node_pair *pair;
    bool any = false, user_seen = false, static_seen = false, cert_seen = false;
    int cert = -1, cert_line = line;
    if (fy_node_is_alias(v) || node_is_null(v) || !fy_node_is_mapping(v)) {
        err_at(
            cx, line,
            "%s: expected a mapping with one of header, bearer, static, jwt, client_cert, got %s",
            path, node_kind(v));
        return;
    }
    c->subject.with_cert = false;
    while ((pair = fy_node_mapping_iterate(v, &it))) {
        struct fy_node *kn = fy_node_pair_key(pair), *vn = fy_node_pair_value(pair);
        int kline = node_line(kn, line);
        int vline = node_line(vn, kline);
        char cpath[PATH_MAX_LEN];
        const char *key = scalar(cx, kn, kline, path, "a key");
        if (!key)
            continue;
        any = true;
        child_path(cpath, path, key);
        bool known = !strcmp(key, "header") || !strcmp(key, "bearer") || !strcmp(key, "static") ||
                     !strcmp(key, "jwt") || !strcmp(key, "client_cert");
        if (!known) {
            err_at(cx, kline,
                   "unknown key '%.64s' in %s (allowed: header, bearer, static, jwt, client_cert)",
                   key, path);
            continue;
        }
        bool is_cert = !strcmp(key, "client_cert"), is_static = !strcmp(key, "static");
        if (!is_cert && user_seen) {
            err_at(cx, kline,
                   "%s: give only one of header, bearer, static, jwt (client_cert may be added "
                   "to jwt, header or bearer)",
                   path);
            continue;
        }
        if ((is_cert && static_seen) || (is_static && cert_seen)) {
            err_at(cx, kline,
                   "%s: static cannot be combined with client_cert (a fixed name adds nothing to "
                   "the certificate's; combine client_cert with jwt, header or bearer)",
                   path);
            continue;
        }
        if (is_cert)
            cert_seen = true;
        else
            user_seen = true;
        static_seen = static_seen || is_static;
        if (!strcmp(key, "jwt")) {
            subject_jwt(cx, vn, kline, cpath, c);
            continue;
        }
        const char *s = scalar(cx, vn, vline, cpath, "a string");
        if (!s)
            continue;
        if (is_cert) {
            int i = 0;
            while (peer_cert_source_names[i] && strcmp(s, peer_cert_source_names[i]) != 0)
                i++;
            if (!peer_cert_source_names[i]) {
                err_at(cx, vline,
                       "%s: unknown value '%.64s' (allowed: spiffe, san_uri, san_dns, cn)", cpath,
                       s);
            } else {
                cert = i;
                cert_line = kline;
            }
        } else if (!strcmp(key, "header")) {
            if (!header_token_valid(s)) {
                err_at(cx, vline, "%s: '%.64s' is not a valid header name", cpath, s);
            } else if (!strcasecmp(s, "authorization") || !strcasecmp(s, "proxy-authorization") ||
                       !strcasecmp(s, "cookie")) {
                /* The subject is stored in every key: it must never be a raw credential. */
                err_at(cx, vline, "%s: %s carries a credential; use 'bearer: sha256' instead",
                       cpath, s);
            } else {
                c->subject.kind = SUBJECT_HEADER;
                set_string(&c->subject.value, s);
            }
        } else if (!strcmp(key, "bearer")) {
            if (strcmp(s, "sha256") != 0) {
                err_at(cx, vline, "%s: unknown value '%.64s' (allowed: sha256)", cpath, s);
            } else {
                c->subject.kind = SUBJECT_BEARER_SHA256;
                free(c->subject.value);
                c->subject.value = NULL;
            }
        } else {
            bool ok = *s && strlen(s) <= MAX_NAME;
            for (const char *q = s; ok && *q; q++)
                ok = (unsigned char)*q > 0x20 && (unsigned char)*q < 0x7f;
            if (!ok) {
                err_at(cx, vline, "%s: must be 1-%d printable ASCII characters without spaces",
                       cpath, MAX_NAME);
            } else {
                c->subject.kind = SUBJECT_STATIC;
                set_string(&c->subject.value, s);
            }
        }
    }
    if (!any) {
        err_at(cx, line, "%s: give one of header, bearer, static, jwt, client_cert", path);
        return;
    }
    if (cert < 0)
        return;
    if (!c->listen_tls.client_ca_file)
        err_at(cx, cert_line,
               "%s.client_cert: needs listen_tls with client_ca_file (the CAs that verify the "
               "agents' certificates)",
               path);
    c->subject.client_cert = cert;
    if (!user_seen) {
        c->subject.kind = SUBJECT_CLIENT_CERT;
        free(c->subject.value);
        c->subject.value = NULL;
    } else {
        /* a user source with an error left the kind alone; the error fails the load */
        c->subject.with_cert = c->subject.kind == SUBJECT_JWT ||
                               c->subject.kind == SUBJECT_HEADER ||
                               c->subject.kind == SUBJECT_BEARER_SHA256;
    }
}

static void fn_in_progress(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    policy_tool_t *t = base;
    if (!fy_node_is_alias(v) && !node_is_null(v) && fy_node_is_mapping(v)) {
        void *it = NULL;
        struct fy_node_pair *pair;
        bool any = false;
        while ((pair = fy_node_mapping_iterate(v, &it))) {
            any = true;
            struct fy_node *kn = fy_node_pair_key(pair), *vn = fy_node_pair_value(pair);
            int kline = node_line(kn, line);
            char cpath[PATH_MAX_LEN];
            const char *key = scalar(cx, kn, kline, path, "a key");
            if (!key)
                continue;
            if (strcmp(key, "wait") != 0) {
                err_at(cx, kline, "unknown key '%.64s' in %s (allowed: wait)", key, path);
                continue;
            }
            child_path(cpath, path, key);
            uint64_t ms;
            if (get_duration(cx, vn, node_line(vn, kline), cpath, 1, MS_H, &ms))
                t->wait_ms = ms;
        }
        if (!any)
            err_at(cx, line, "%s: expected reject or {wait: DURATION}", path);
        return;
    }
    const char *s = scalar(cx, v, line, path, "reject or {wait: DURATION}");
    if (!s)
        return;
    if (strcmp(s, "reject") == 0)
        t->wait_ms = 0;
    else
        err_at(cx, line, "%s: unknown value '%.64s' (allowed: reject, {wait: DURATION})", path, s);
}

static void fn_lease(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    policy_tool_t *t = base;
    char a[32], b[32];
    uint64_t ms;
    if (v && fy_node_is_scalar(v) && !fy_node_is_alias(v)) {
        const char *s = fy_node_get_scalar0(v);
        if (s && strcmp(s, "auto") == 0) {
            t->lease_ms = 0;
            return;
        }
    }
    if (!get_duration(cx, v, line, path, 1, 7 * MS_D, &ms))
        return;
    /* A lease shorter than the upstream timeout expires while a slow first call is still
     * legitimately running, and a retry would then execute the tool a second time. */
    if (ms < cx->c->upstream_timeout_ms) {
        fmt_dur(a, sizeof(a), ms);
        fmt_dur(b, sizeof(b), cx->c->upstream_timeout_ms);
        err_at(cx, line,
               "%s: %s is shorter than timeouts.upstream (%s); a slow call could run "
               "twice (use auto or a longer lease)",
               path, a, b);
        return;
    }
    t->lease_ms = ms;
}

/* ---- key tables ---- */

#define CFG(f) offsetof(config_t, f)
#define TOOL(f) offsetof(policy_tool_t, f)

static const char *const class_names[] = {"read", "idempotent", "non_idempotent", NULL};
static const char *const tool_error_names[] = {"release", "store", NULL};
static const char *const ambiguous_names[] = {"hold", "release", NULL};
static const char *const store_down_names[] = {"reject", "passthrough", NULL};

/* Every per-tool setting; `defaults` takes the same keys. They say nothing about reloads: they
 * belong to the policy, which the `defaults` and `tools` keys reload whole. */
static const key_spec_t tool_keys[] = {
    {.name = "class", .kind = K_ENUM, .off = TOOL(cls), .names = class_names},
    {.name = "window", .kind = K_DUR, .off = TOOL(window_ms), .min = 1, .max = 365 * MS_D},
    {.name = "exclude_args", .kind = K_FN, .fn = fn_exclude_args},
    {.name = "key_arg", .kind = K_STR, .off = TOOL(key_arg)},
    {.name = "on_tool_error",
     .kind = K_ENUM,
     .off = TOOL(on_tool_error),
     .names = tool_error_names},
    {.name = "on_ambiguous", .kind = K_ENUM, .off = TOOL(on_ambiguous), .names = ambiguous_names},
    {.name = "in_progress", .kind = K_FN, .fn = fn_in_progress},
    {.name = "lease", .kind = K_FN, .fn = fn_lease},
    {.name = "max_stored_bytes", .kind = K_SIZE, .off = TOOL(max_stored_bytes), .max = 1ULL << 30},
    {.name = "forward_key", .kind = K_BOOL, .off = TOOL(forward_key)},
    {.name = "on_store_down",
     .kind = K_ENUM,
     .off = TOOL(on_store_down),
     .names = store_down_names},
    {.name = "advertise_key", .kind = K_BOOL, .off = TOOL(advertise_key)},
    {.name = "answer_after", .kind = K_DUR, .off = TOOL(answer_after_ms), .min = 1, .max = MS_D},
    /* last, as `defaults` alone takes it: whether unlisted tools follow their annotations */
    {.name = "trust_annotations", .kind = K_BOOL, .off = TOOL(trust_annotations)},
};
#define N_DEFAULT_KEYS ARRAY_LEN(tool_keys)
#define N_TOOL_KEYS (ARRAY_LEN(tool_keys) - 1)

/* Restart-only keys whose value is not one field of a simple kind. */
static bool str_same(const char *a, const char *b)
{
    if (!a || !b)
        return a == b;
    return strcmp(a, b) == 0;
}

static void str_carry(char **dst, const char *src)
{
    free(*dst);
    *dst = src ? xstrdup(src) : NULL;
}

static bool otlp_same(const config_t *a, const config_t *b)
{
    return str_same(a->otlp.url, b->otlp.url);
}

static bool ratio_same(const config_t *a, const config_t *b)
{
    return a->otlp_sample_ratio == b->otlp_sample_ratio;
}

static void ratio_carry(config_t *next, const config_t *running)
{
    next->otlp_sample_ratio = running->otlp_sample_ratio;
}

static void otlp_carry(config_t *next, const config_t *running)
{
    config_http_url_free(&next->otlp);
    if (running->otlp.url)
        (void)config_parse_http_url(running->otlp.url, &next->otlp);
}


static bool upstream_same(const config_t *a, const config_t *b)
{
    return str_same(a->upstream_url, b->upstream_url);
}

/* Everything derived from the URL goes with it. */
static void upstream_carry(config_t *next, const config_t *running)
{
    str_carry(&next->upstream_url, running->upstream_url);
    str_carry(&next->upstream.host, running->upstream.host);
    str_carry(&next->upstream_path, running->upstream_path);
    str_carry(&next->upstream_host_header, running->upstream_host_header);
    next->upstream.port = running->upstream.port;
    next->upstream_tls = running->upstream_tls;
}

static bool ca_file_same(const config_t *a, const config_t *b)
{
    return str_same(a->upstream_ca_file, b->upstream_ca_file);
}

static void ca_file_carry(config_t *next, const config_t *running)
{
    str_carry(&next->upstream_ca_file, running->upstream_ca_file);
}

static bool database_url_same(const config_t *a, const config_t *b)
{
    return str_same(a->database_url, b->database_url);
}

static void database_url_carry(config_t *next, const config_t *running)
{
    str_carry(&next->database_url, running->database_url);
}

#define LIVE .reload = CONFIG_KEY_RELOADABLE
#define RESTART .reload = CONFIG_KEY_RESTART_ONLY

/* The store is opened, its pool filled, its sweep timer armed and the replay cache sized once,
 * at start. */
static const key_spec_t store_keys[] = {
    {.name = "pool", .kind = K_INT, .off = CFG(store_pool), .min = 1, .max = 256, RESTART},
    {.name = "timeout",
     .kind = K_DUR,
     .off = CFG(store_timeout_ms),
     .min = 100,
     .max = 5 * 60 * MS_S,
     RESTART},
    {.name = "sweep_interval",
     .kind = K_DUR,
     .off = CFG(sweep_interval_ms),
     .min = MS_S,
     .max = MS_D,
     RESTART},
    {.name = "cache_entries",
     .kind = K_INT,
     .off = CFG(cache_entries),
     .min = 0,
     .max = 100000000,
     RESTART},
    {.name = "cache_bytes", .kind = K_SIZE, .off = CFG(cache_bytes), .max = 1ULL << 40, RESTART},
    {.name = "group_commit", .kind = K_BOOL, .off = CFG(store_group_commit), RESTART},
    {.name = "durable_finish", .kind = K_BOOL, .off = CFG(store_durable_finish), RESTART},
};

/* Read on every use: a reload applies to the next request, connection or drain. */
static const key_spec_t timeout_keys[] = {
    {.name = "client_header",
     .kind = K_DUR,
     .off = CFG(client_header_timeout_ms),
     .min = 1,
     .max = MS_H,
     LIVE},
    {.name = "client_body",
     .kind = K_DUR,
     .off = CFG(client_body_timeout_ms),
     .min = 1,
     .max = MS_D,
     LIVE},
    {.name = "client_idle",
     .kind = K_DUR,
     .off = CFG(client_idle_timeout_ms),
     .min = 1,
     .max = MS_D,
     LIVE},
    {.name = "upstream_connect",
     .kind = K_DUR,
     .off = CFG(upstream_connect_timeout_ms),
     .min = 1,
     .max = MS_H,
     LIVE},
    {.name = "upstream",
     .kind = K_DUR,
     .off = CFG(upstream_timeout_ms),
     .min = 1,
     .max = MS_D,
     LIVE},
    {.name = "upstream_idle",
     .kind = K_DUR,
     .off = CFG(upstream_idle_timeout_ms),
     .min = 1,
     .max = MS_D,
     LIVE},
    {.name = "drain", .kind = K_DUR, .off = CFG(drain_timeout_ms), .min = 1, .max = MS_D, LIVE},
};

static const key_spec_t limit_keys[] = {
    {.name = "max_body",
     .kind = K_SIZE,
     .off = CFG(max_body_bytes),
     .min = 1024,
     .max = 1ULL << 30,
     LIVE},
    {.name = "max_header",
     .kind = K_SIZE,
     .off = CFG(max_header_bytes),
     .min = 1024,
     .max = 1ULL << 20,
     LIVE},
    {.name = "max_connections",
     .kind = K_INT,
     .off = CFG(max_connections),
     .min = 1,
     .max = 1000000,
     LIVE},
    {.name = "upstream_pool",
     .kind = K_INT,
     .off = CFG(upstream_pool),
     .min = 0,
     .max = 100000,
     LIVE},
};

static const key_spec_t duplicate_keys[] = {
    {.name = "harness_within", .kind = K_DUR, .off = CFG(dup_harness_ms), .min = 1, .max = MS_D, LIVE},
    {.name = "model_within", .kind = K_DUR, .off = CFG(dup_model_ms), .min = 1, .max = 365 * MS_D, LIVE},
};

static const key_spec_t log_keys[] = {
    {.name = "level", .kind = K_FN, .fn = fn_log_level, LIVE},
};

static void fn_defaults(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base);
static void fn_tools(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base);

/* order: timeouts must be known before leases are checked, and defaults before tools inherit
 * them, whatever order the file lists them in. Sockets, the upstream's TLS context, the store
 * and the worker processes are made once, at start: their keys are restart-only. The policy
 * (defaults and tools, with every per-tool key) is replaced whole by a reload. */
static const char *const cors_names[] = {"mirror", "off", NULL};

static const key_spec_t top_keys[] = {
    {.name = "listen", .kind = K_ADDR, .off = CFG(listen), RESTART},
    {.name = "admin_listen", .kind = K_ADDR, .off = CFG(admin_listen), RESTART},
    {.name = "workers", .kind = K_INT, .off = CFG(workers), .min = 1, .max = 64, RESTART},
    {.name = "upstream",
     .kind = K_FN,
     .fn = fn_upstream,
     RESTART,
     .same = upstream_same,
     .carry = upstream_carry},
    {.name = "upstream_ca_file",
     .kind = K_FN,
     .fn = fn_upstream_ca_file,
     RESTART,
     .same = ca_file_same,
     .carry = ca_file_carry},
    {.name = "database_url",
     .kind = K_FN,
     .fn = fn_database_url,
     RESTART,
     .same = database_url_same,
     .carry = database_url_carry},
    {.name = "migrate", .kind = K_BOOL, .off = CFG(migrate), RESTART},
    {.name = "store", .kind = K_SECTION, .sub = store_keys, .n_sub = ARRAY_LEN(store_keys)},
    {.name = "timeouts", .kind = K_SECTION, .sub = timeout_keys, .n_sub = ARRAY_LEN(timeout_keys)},
    {.name = "limits", .kind = K_SECTION, .sub = limit_keys, .n_sub = ARRAY_LEN(limit_keys)},
    {.name = "allowed_hosts", .kind = K_FN, .fn = fn_allowed_hosts, LIVE},
    {.name = "allowed_origins", .kind = K_FN, .fn = fn_allowed_origins, LIVE},
    {.name = "forward_other_paths", .kind = K_BOOL, .off = CFG(forward_other_paths), LIVE},
    {.name = "cors", .kind = K_ENUM, .off = CFG(cors), .names = cors_names, LIVE},
    {.name = "status_tool", .kind = K_BOOL, .off = CFG(status_tool), LIVE},
    {.name = "otlp_endpoint",
     .kind = K_FN,
     .fn = fn_otlp_endpoint,
     RESTART,
     .same = otlp_same,
     .carry = otlp_carry},
    {.name = "otlp_sample_ratio",
     .kind = K_FN,
     .fn = fn_otlp_sample_ratio,
     RESTART,
     .same = ratio_same,
     .carry = ratio_carry},
    {.name = "log", .kind = K_SECTION, .sub = log_keys, .n_sub = ARRAY_LEN(log_keys)},
    {.name = "duplicates",
     .kind = K_SECTION,
     .sub = duplicate_keys,
     .n_sub = ARRAY_LEN(duplicate_keys)},
    {.name = "listen_tls", .kind = K_FN, .fn = fn_listen_tls, LIVE},
    /* after listen_tls: client_cert needs its client_ca_file */
    {.name = "subject", .kind = K_FN, .fn = fn_subject, .order = 1, LIVE},
    {.name = "defaults", .kind = K_FN, .fn = fn_defaults, .order = 1, LIVE},
    {.name = "tools", .kind = K_FN, .fn = fn_tools, .order = 2, LIVE},
};

#undef LIVE
#undef RESTART

static void fn_defaults(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    config_t *c = base;
    c->policy.defaults.line = line;
    walk_map(cx, v, line, path, tool_keys, N_DEFAULT_KEYS, &c->policy.defaults, -1);
}

static bool tool_name_valid(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > MAX_NAME)
        return false;
    for (; *s; s++)
        if ((unsigned char)*s <= 0x20 || *s == 0x7f)
            return false;
    return true;
}

static void fn_tools(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    config_t *c = base;
    void *it = NULL;
    struct fy_node_pair *pair;
    if (node_is_null(v))
        return;
    if (fy_node_is_alias(v) || !fy_node_is_mapping(v)) {
        err_at(cx, line, "%s: expected a mapping of tool names, got %s", path, node_kind(v));
        return;
    }
    while ((pair = fy_node_mapping_iterate(v, &it))) {
        struct fy_node *kn = fy_node_pair_key(pair), *vn = fy_node_pair_value(pair);
        int kline = node_line(kn, line);
        char cpath[PATH_MAX_LEN];
        const char *name = scalar(cx, kn, kline, path, "a tool name");
        if (!name)
            continue;
        if (!tool_name_valid(name)) {
            err_at(cx, kline, "%s: '%.64s' is not a tool name (1-%d characters, no spaces)", path,
                   name, MAX_NAME);
            continue;
        }
        child_path(cpath, path, name);
        policy_tool_t t;
        policy_tool_copy(&t, &c->policy.defaults);
        t.name = xstrdup(name);
        t.line = kline;
        walk_map(cx, vn, kline, cpath, tool_keys, N_TOOL_KEYS, &t, -1);
        c->policy.tools = xrealloc(c->policy.tools, (c->policy.n_tools + 1) * sizeof(t));
        c->policy.tools[c->policy.n_tools++] = t;
    }
    policy_sort(&c->policy);
}

/* ---- reload: what the tables say about each key ---- */

static void keys_each(const key_spec_t *specs, size_t n, const char *prefix, config_key_fn fn,
                      void *arg)
{
    char name[PATH_MAX_LEN];
    for (size_t i = 0; i < n; i++) {
        child_path(name, prefix, specs[i].name);
        if (specs[i].kind == K_SECTION)
            keys_each(specs[i].sub, specs[i].n_sub, name, fn, arg);
        else
            fn(name, specs[i].reload, arg);
    }
}

void config_keys_each(config_key_fn fn, void *arg)
{
    keys_each(top_keys, ARRAY_LEN(top_keys), "", fn, arg);
}

static bool key_same(const key_spec_t *k, const config_t *a, const config_t *b)
{
    const char *fa = (const char *)a + k->off, *fb = (const char *)b + k->off;
    switch (k->kind) {
    case K_STR:
        return str_same(*(char *const *)fa, *(char *const *)fb);
    case K_BOOL:
        return *(const bool *)fa == *(const bool *)fb;
    case K_INT:
    case K_ENUM:
        return *(const int *)fa == *(const int *)fb;
    case K_DUR:
    case K_SIZE:
        return *(const uint64_t *)fa == *(const uint64_t *)fb;
    case K_ADDR: {
        const host_port_t *x = (const host_port_t *)fa, *y = (const host_port_t *)fb;
        return x->port == y->port && str_same(x->host, y->host);
    }
    case K_FN:
        if (!k->same)
            abort(); /* a restart-only custom key without same/carry: fix the table */
        return k->same(a, b);
    case K_SECTION:
        break;
    }
    abort();
}

static void key_carry(const key_spec_t *k, config_t *next, const config_t *running)
{
    char *to = (char *)next + k->off;
    const char *from = (const char *)running + k->off;
    switch (k->kind) {
    case K_STR:
        str_carry((char **)to, *(char *const *)from);
        return;
    case K_BOOL:
        *(bool *)to = *(const bool *)from;
        return;
    case K_INT:
    case K_ENUM:
        *(int *)to = *(const int *)from;
        return;
    case K_DUR:
    case K_SIZE:
        *(uint64_t *)to = *(const uint64_t *)from;
        return;
    case K_ADDR:
        str_carry(&((host_port_t *)to)->host, ((const host_port_t *)from)->host);
        ((host_port_t *)to)->port = ((const host_port_t *)from)->port;
        return;
    case K_FN:
        if (!k->carry)
            abort();
        k->carry(next, running);
        return;
    case K_SECTION:
        break;
    }
    abort();
}

static int merge(const key_spec_t *specs, size_t n, const char *prefix, const config_t *running,
                 config_t *next, config_restart_fn report, void *arg)
{
    char name[PATH_MAX_LEN];
    int count = 0;
    for (size_t i = 0; i < n; i++) {
        const key_spec_t *k = &specs[i];
        child_path(name, prefix, k->name);
        if (k->kind == K_SECTION) {
            count += merge(k->sub, k->n_sub, name, running, next, report, arg);
            continue;
        }
        if (k->reload != CONFIG_KEY_RESTART_ONLY || key_same(k, running, next))
            continue;
        if (report)
            report(name, arg);
        key_carry(k, next, running);
        count++;
    }
    return count;
}

int config_reload_merge(const config_t *running, config_t *next, config_restart_fn report,
                        void *arg)
{
    int count = merge(top_keys, ARRAY_LEN(top_keys), "", running, next, report, arg);
    /* Derived from database_url and the environment (PG*, STATE_DIRECTORY), neither of which
     * a reload changes: the store is what it was at the start. */
    next->store_enabled = running->store_enabled;
    next->store_kind = running->store_kind;
    free(next->store_path);
    next->store_path = running->store_path ? xstrdup(running->store_path) : NULL;
    return count;
}

/* ---- document ---- */

static void walk_root(ctx_t *cx, struct fy_node *root)
{
    if (node_is_null(root)) {
        cx->res.readable = true;
        return;
    }
    if (fy_node_is_alias(root) || !fy_node_is_mapping(root)) {
        err_at(cx, first_line(root, 1), "top level must be a mapping of settings, got %s",
               node_kind(root));
        return;
    }
    cx->res.readable = true;
    for (int order = 0; order <= 2; order++)
        walk_map(cx, root, 1, "", top_keys, ARRAY_LEN(top_keys), cx->c, order);
}

static void discard_output(struct fy_diag *diag, void *user, const char *buf, size_t len)
{
    /* Errors are collected and reported through config_errors_t, never printed here. */
}

static int yerr_cmp(const void *a, const void *b)
{
    const yerr_t *x = a, *y = b;
    if (x->line != y->line)
        return x->line < y->line ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

config_yaml_result_t config_yaml_apply(config_t *c, const char *name, const char *text, size_t len,
                                       config_errors_t *errs)
{
    ctx_t cx = {.name = name, .c = c};
    struct fy_diag *diag = NULL;
    struct fy_parser *fyp = NULL;
    struct fy_document *doc = NULL, *extra = NULL;
    struct fy_diag_cfg dcfg;

    /* libfyaml 0.7.12 loops forever on some invalid UTF-8 (a directive line holding a stray
     * continuation byte), so the text is checked before it ever sees it. */
    size_t good = util_utf8_valid_prefix(text, len);
    if (good < len) {
        int line = 1;
        for (size_t i = 0; i < good; i++)
            line += text[i] == '\n';
        config_errors_add(errs, "%s:%d: %s (byte 0x%02x): the file must be UTF-8 text", name, line,
                          text[good] ? "invalid UTF-8" : "NUL byte", (unsigned char)text[good]);
        return cx.res;
    }

    fy_diag_cfg_default(&dcfg);
    dcfg.fp = NULL;
    dcfg.output_fn = discard_output;
    dcfg.level = FYET_ERROR;
    diag = fy_diag_create(&dcfg);
    if (!diag)
        abort(); /* only fails on out of memory */
    fy_diag_set_collect_errors(diag, true);
    struct fy_parse_cfg pcfg = {.flags = FYPCF_QUIET | FYPCF_COLLECT_DIAG, .diag = diag};
    fyp = fy_parser_create(&pcfg);
    if (!fyp || fy_parser_set_string(fyp, text, len) != 0)
        abort();

    doc = fy_parse_load_document(fyp);
    if (doc && !fy_parser_get_stream_error(fyp)) {
        extra = fy_parse_load_document(fyp);
        if (extra)
            err_at(&cx, first_line(fy_document_root(extra), 1),
                   "only one YAML document is allowed (remove the extra ---)");
    }
    if (!fy_parser_get_stream_error(fyp) && !extra) {
        walk_root(&cx, doc ? fy_document_root(doc) : NULL);
    } else {
        void *it = NULL;
        struct fy_diag_error *e;
        bool any = false;
        while ((e = fy_diag_errors_iterate(diag, &it))) {
            if (e->type < FYET_ERROR)
                continue;
            err_at(&cx, e->line, "%s", e->msg ? e->msg : "YAML syntax error");
            any = true;
        }
        if (!any && !extra)
            err_at(&cx, 1, "YAML syntax error");
    }

    if (cx.n_errs > 1)
        qsort(cx.errs, cx.n_errs, sizeof(yerr_t), yerr_cmp);
    for (size_t i = 0; i < cx.n_errs; i++) {
        config_errors_add(errs, "%s:%d: %s", name, cx.errs[i].line, cx.errs[i].msg);
        free(cx.errs[i].msg);
    }
    free(cx.errs);
    if (extra)
        fy_parse_document_destroy(fyp, extra);
    if (doc)
        fy_parse_document_destroy(fyp, doc);
    fy_parser_destroy(fyp);
    fy_diag_destroy(diag);
    return cx.res;
}
