/* The YAML reader of the config module: walks a libfyaml document with tables of known keys and
 * writes into config_t. Every problem is collected with its line; nothing stops at the first. */
#include "config_yaml.h"
#include "store_url.h"
#include "config_yaml_int.h"
#include "log.h"
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

/* Enums are written through an int; they must be int-sized. */
_Static_assert(sizeof(tool_class_t) == sizeof(int), "enum size");
_Static_assert(sizeof(on_tool_error_t) == sizeof(int), "enum size");
_Static_assert(sizeof(on_ambiguous_t) == sizeof(int), "enum size");
_Static_assert(sizeof(on_cancel_t) == sizeof(int), "enum size");
_Static_assert(sizeof(on_store_down_t) == sizeof(int), "enum size");

void cy_err_at(ctx_t *cx, int line, const char *fmt, ...)
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
int cy_node_line(struct fy_node *n, int fallback)
{
    if (n && fy_node_is_scalar(n)) {
        const struct fy_mark *m = fy_token_start_mark(fy_node_get_scalar_token(n));
        if (m)
            return m->line + 1;
    }
    return fallback;
}

bool cy_node_is_null(struct fy_node *n)
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
            return cy_node_line(n, fallback);
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

const char *cy_node_kind(struct fy_node *n)
{
    if (cy_node_is_null(n))
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
const char *cy_scalar(ctx_t *cx, struct fy_node *v, int line, const char *path, const char *what)
{
    size_t len;
    if (v && fy_node_is_alias(v)) {
        cy_err_at(cx, line, "%s: anchors and aliases are not supported", path);
        return NULL;
    }
    if (cy_node_is_null(v) || !fy_node_is_scalar(v)) {
        cy_err_at(cx, line, "%s: expected %s, got %s", path, what, cy_node_kind(v));
        return NULL;
    }
    const char *s = fy_node_get_scalar(v, &len);
    if (!s || memchr(s, '\0', len)) {
        cy_err_at(cx, line, "%s: contains a NUL byte", path);
        return NULL;
    }
    return fy_node_get_scalar0(v);
}

void cy_child_path(char *out, const char *path, const char *key)
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
    const char *s = cy_scalar(cx, v, line, path, "a duration (e.g. 90s)");
    if (!s)
        return false;
    if (policy_parse_duration(s, out) != 0) {
        cy_err_at(cx, line,
                  "%s: bad duration '%.64s' (a whole number with unit ms, s, m, h or d, "
                  "e.g. 250ms, 90s, 10m)",
                  path, s);
        return false;
    }
    if (*out < min || *out > max) {
        fmt_dur(a, sizeof(a), min);
        fmt_dur(b, sizeof(b), max);
        cy_err_at(cx, line, "%s: %s is out of range (%s to %s)", path, s, a, b);
        return false;
    }
    return true;
}

void cy_set_string(char **dst, const char *s)
{
    free(*dst);
    *dst = xstrdup(s);
}

static void apply_spec(ctx_t *cx, const key_spec_t *k, struct fy_node *v, int line,
                       const char *path, void *base);

/* Walks a mapping against a table. Null counts as an empty mapping (a section left blank).
 * order >= 0 restricts the walk to specs of that order (top level passes). */
void cy_walk_map(ctx_t *cx, struct fy_node *map, int line, const char *path,
                 const key_spec_t *specs, size_t n, void *base, int order)
{
    void *it = NULL;
    struct fy_node_pair *pair;
    char cpath[PATH_MAX_LEN];
    if (cy_node_is_null(map))
        return;
    if (fy_node_is_alias(map) || !fy_node_is_mapping(map)) {
        cy_err_at(cx, line, "%s: expected a mapping, got %s", *path ? path : "top level",
                  cy_node_kind(map));
        return;
    }
    while ((pair = fy_node_mapping_iterate(map, &it))) {
        struct fy_node *kn = fy_node_pair_key(pair);
        struct fy_node *vn = fy_node_pair_value(pair);
        int kline = cy_node_line(kn, cy_node_line(vn, line));
        if (order > 0 && (!kn || !fy_node_is_scalar(kn) || fy_node_is_alias(kn)))
            continue; /* reported in pass 0 */
        const char *key = cy_scalar(cx, kn, kline, *path ? path : "top level", "a key");
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
                cy_err_at(cx, kline, "unknown key '%.64s' in %s (allowed: %s)", key, path, allowed);
            else
                cy_err_at(cx, kline, "unknown key '%.64s' (allowed: %s)", key, allowed);
            continue;
        }
        if (order >= 0 && k->order != order)
            continue;
        cy_child_path(cpath, path, key);
        apply_spec(cx, k, vn, cy_node_line(vn, kline), cpath, base);
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
        if (!(s = cy_scalar(cx, v, line, path, "a string")))
            return;
        if (!*s) {
            cy_err_at(cx, line, "%s: must not be empty", path);
            return;
        }
        cy_set_string((char **)field, s);
        return;
    case K_BOOL:
        if (!(s = cy_scalar(cx, v, line, path, "true or false")))
            return;
        if (strcasecmp(s, "true") == 0)
            *(bool *)field = true;
        else if (strcasecmp(s, "false") == 0)
            *(bool *)field = false;
        else
            cy_err_at(cx, line, "%s: expected true or false, got '%.64s'", path, s);
        return;
    case K_INT: {
        if (!(s = cy_scalar(cx, v, line, path, "an integer")))
            return;
        /* Digits only: no sign, no spaces, no hex; ten digits cannot overflow the check. */
        size_t len = strspn(s, "0123456789");
        uint64_t x = 0;
        for (size_t i = 0; i < len && i < 10; i++)
            x = x * 10 + (uint64_t)(s[i] - '0');
        if (len == 0 || s[len] || len > 10 || x < k->min || x > k->max) {
            cy_err_at(cx, line, "%s: expected an integer from %llu to %llu, got '%.64s'", path,
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
        if (!(s = cy_scalar(cx, v, line, path, "a size (e.g. 4MiB)")))
            return;
        if (policy_parse_size(s, &u) != 0) {
            cy_err_at(cx, line,
                      "%s: bad size '%.64s' (a whole number with optional unit KiB, MiB "
                      "or GiB, e.g. 4MiB)",
                      path, s);
            return;
        }
        if (u < k->min || u > k->max) {
            fmt_size(a, sizeof(a), k->min);
            fmt_size(b, sizeof(b), k->max);
            cy_err_at(cx, line, "%s: %s is out of range (%s to %s)", path, s, a, b);
            return;
        }
        *(uint64_t *)field = u;
        return;
    case K_ADDR: {
        host_port_t hp;
        if (!(s = cy_scalar(cx, v, line, path, "host:port")))
            return;
        if (config_parse_host_port(s, &hp) != 0) {
            cy_err_at(cx, line, "%s: bad address '%.100s' (expected host:port, [v6]:port or :port)",
                      path, s);
            return;
        }
        free(((host_port_t *)field)->host);
        *(host_port_t *)field = hp;
        return;
    }
    case K_ENUM:
        if (!(s = cy_scalar(cx, v, line, path, "a name")))
            return;
        for (int i = 0; k->names[i]; i++) {
            if (strcmp(s, k->names[i]) == 0) {
                *(int *)field = i;
                return;
            }
        }
        join_names(allowed, sizeof(allowed), k->names);
        cy_err_at(cx, line, "%s: unknown value '%.64s' (allowed: %s)", path, s, allowed);
        return;
    case K_SECTION:
        cy_walk_map(cx, v, line, path, k->sub, k->n_sub, base, -1);
        return;
    case K_FN:
        k->fn(cx, v, line, path, base);
        return;
    }
}

/* ---- custom handlers ---- */

/* Iterates a list of strings (empty only when allow_empty), calling each(entry) with its line and
 * indexed path. */

void cy_walk_list(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base,
                  bool allow_empty, entry_fn each)
{
    void *it = NULL;
    struct fy_node *item;
    char ipath[PATH_MAX_LEN + 16];
    if (fy_node_is_alias(v) || cy_node_is_null(v) || !fy_node_is_sequence(v)) {
        cy_err_at(cx, line, "%s: expected a list, got %s", path, cy_node_kind(v));
        return;
    }
    if (!allow_empty && fy_node_sequence_item_count(v) == 0) {
        cy_err_at(cx, line, "%s: the list is empty (leave the key out for the default)", path);
        return;
    }
    for (size_t i = 0; (item = fy_node_sequence_iterate(v, &it)); i++) {
        int iline = first_line(item, line);
        snprintf(ipath, sizeof(ipath), "%s[%zu]", path, i);
        const char *s = cy_scalar(cx, item, iline, ipath, "a string");
        if (s)
            each(cx, s, iline, ipath, base);
    }
}

void cy_strv_push(char ***v, size_t *n, char *s)
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
        cy_err_at(cx, line, "%s: '%.100s': %s", path, s, err);
    else
        cy_strv_push(&c->allowed_hosts, &c->n_allowed_hosts, norm);
}

static void origin_entry(ctx_t *cx, const char *s, int line, const char *path, void *base)
{
    config_t *c = base;
    const char *err = NULL;
    char *norm = config_origin_entry_norm(s, &err);
    if (!norm)
        cy_err_at(cx, line, "%s: '%.100s': %s", path, s, err);
    else
        cy_strv_push(&c->allowed_origins, &c->n_allowed_origins, norm);
}

static void fn_allowed_hosts(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    cy_walk_list(cx, v, line, path, base, false, host_entry);
}

static void fn_allowed_origins(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    cy_walk_list(cx, v, line, path, base, false, origin_entry);
}

static void exclude_entry(ctx_t *cx, const char *s, int line, const char *path, void *base)
{
    policy_tool_t *t = base;
    size_t n = strlen(s);
    if (n == 0 || s[0] == '.' || s[n - 1] == '.' || strstr(s, "..")) {
        cy_err_at(cx, line, "%s: '%.100s' is not a dotted argument path (e.g. meta.client_ts)",
                  path, s);
        return;
    }
    cy_strv_push(&t->exclude_args, &t->n_exclude_args, xstrdup(s));
}

static void fn_exclude_args(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    policy_tool_t *t = base;
    /* A tool's list replaces the inherited one rather than adding to it. */
    util_strv_free(t->exclude_args, t->n_exclude_args);
    t->exclude_args = NULL;
    t->n_exclude_args = 0;
    cy_walk_list(cx, v, line, path, base, true, exclude_entry);
}

void cy_fn_upstream(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    cx->res.upstream_seen = true;
    if (fy_node_is_mapping(v) && !fy_node_is_alias(v)) {
        cy_upstream_command(cx, v, line, path, base);
        return;
    }
    const char *s = cy_scalar(cx, v, line, path, "a URL, or {command: [...]}");
    if (!s)
        return;
    const char *err = config_set_upstream(base, s);
    if (err)
        cy_err_at(cx, line, "%s: bad URL '%.200s': %s", path, s, err);
}

static void fn_otlp_endpoint(ctx_t *cx, struct fy_node *v, int line, const char *path,
                             void *base)
{
    config_t *c = base;
    const char *s = cy_scalar(cx, v, line, path, "a URL");
    if (!s)
        return;
    /* OTLP endpoints are given as a base URL, often without a path: it is the root */
    const char *scheme_end = strstr(s, "://");
    char *url = scheme_end && !strchr(scheme_end + 3, '/') ? xasprintf("%s/", s) : xstrdup(s);
    const char *err = config_parse_http_url(url, &c->otlp);
    if (err)
        cy_err_at(cx, line, "%s: bad URL '%.200s': %s", path, s, err);
    free(url);
}

static void fn_otlp_sample_ratio(ctx_t *cx, struct fy_node *v, int line, const char *path,
                                 void *base)
{
    config_t *c = base;
    const char *s = cy_scalar(cx, v, line, path, "a number from 0 to 1");
    if (!s)
        return;
    char *end;
    errno = 0;
    double r = strtod(s, &end);
    if (errno || end == s || *end || !(r >= 0.0 && r <= 1.0))
        cy_err_at(cx, line, "%s: '%.200s' is not a number from 0 to 1", path, s);
    else
        c->otlp_sample_ratio = r;
}

static void fn_upstream_ca_file(ctx_t *cx, struct fy_node *v, int line, const char *path,
                                void *base)
{
    config_t *c = base;
    const char *s = cy_scalar(cx, v, line, path, "a file name");
    if (!s)
        return;
    if (!*s) {
        cy_err_at(cx, line, "%s: must not be empty", path);
        return;
    }
    if (access(s, R_OK) != 0) {
        cy_err_at(cx, line, "%s: cannot read '%.200s': %s", path, s, strerror(errno));
        return;
    }
    free(c->upstream_ca_file);
    c->upstream_ca_file = xstrdup(s);
}

static void fn_database_url(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    config_t *c = base;
    const char *s = cy_scalar(cx, v, line, path, "a string");
    if (!s)
        return;
    if (!*s) {
        cy_err_at(cx, line, "%s: must not be empty", path);
        return;
    }
    char why[300];
    if (store_url_error(s, why, sizeof(why))) {
        cy_err_at(cx, line, "%s: %s", path, why);
        return;
    }
    cy_set_string(&c->database_url, s);
}

static void fn_log_level(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    config_t *c = base;
    const char *s = cy_scalar(cx, v, line, path, "a level");
    if (!s)
        return;
    int lvl = log_level_parse(s);
    if (lvl < 0)
        cy_err_at(cx, line, "%s: unknown value '%.64s' (allowed: debug, info, warn, error, off)",
                  path, s);
    else
        c->log_level = lvl;
}

static void fn_in_progress(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    policy_tool_t *t = base;
    if (!fy_node_is_alias(v) && !cy_node_is_null(v) && fy_node_is_mapping(v)) {
        void *it = NULL;
        struct fy_node_pair *pair;
        bool any = false;
        while ((pair = fy_node_mapping_iterate(v, &it))) {
            any = true;
            struct fy_node *kn = fy_node_pair_key(pair), *vn = fy_node_pair_value(pair);
            int kline = cy_node_line(kn, line);
            char cpath[PATH_MAX_LEN];
            const char *key = cy_scalar(cx, kn, kline, path, "a key");
            if (!key)
                continue;
            if (strcmp(key, "wait") != 0) {
                cy_err_at(cx, kline, "unknown key '%.64s' in %s (allowed: wait)", key, path);
                continue;
            }
            cy_child_path(cpath, path, key);
            uint64_t ms;
            if (get_duration(cx, vn, cy_node_line(vn, kline), cpath, 1, MS_H, &ms))
                t->wait_ms = ms;
        }
        if (!any)
            cy_err_at(cx, line, "%s: expected reject or {wait: DURATION}", path);
        return;
    }
    const char *s = cy_scalar(cx, v, line, path, "reject or {wait: DURATION}");
    if (!s)
        return;
    if (strcmp(s, "reject") == 0)
        t->wait_ms = 0;
    else
        cy_err_at(cx, line, "%s: unknown value '%.64s' (allowed: reject, {wait: DURATION})", path,
                  s);
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
        cy_err_at(cx, line,
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
static const char *const cancel_names[] = {"finish", "forward", NULL};

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
    {.name = "on_cancel", .kind = K_ENUM, .off = TOOL(on_cancel), .names = cancel_names},
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
    return str_same(a->upstream_url, b->upstream_url) && str_same(a->upstream_path, b->upstream_path) &&
           config_stdio_same(&a->stdio, &b->stdio);
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
    config_stdio_copy(&next->stdio, &running->stdio);
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
    {.name = "commit_delay",
     .kind = K_DUR,
     .off = CFG(store_commit_delay_ms),
     .min = 0,
     .max = 100,
     RESTART},
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

static const char *const webhook_formats[] = {"json", "slack", NULL};

static const key_spec_t alert_keys[] = {
    {.name = "webhook_url", .kind = K_STR, .off = CFG(alerts_webhook_url), RESTART},
    {.name = "webhook_format",
     .kind = K_ENUM,
     .off = CFG(alerts_webhook_format),
     .names = webhook_formats,
     RESTART},
    {.name = "webhook_timeout",
     .kind = K_DUR,
     .off = CFG(alerts_webhook_timeout_ms),
     .min = 100,
     .max = 10 * 60 * MS_S,
     RESTART},
};

static const key_spec_t log_keys[] = {
    {.name = "level", .kind = K_FN, .fn = fn_log_level, LIVE},
};


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
     .fn = cy_fn_upstream,
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
    {.name = "admin_token_file", .kind = K_STR, .off = CFG(admin_token_file), LIVE},
    {.name = "alerts", .kind = K_SECTION, .sub = alert_keys, .n_sub = ARRAY_LEN(alert_keys)},
    {.name = "duplicates",
     .kind = K_SECTION,
     .sub = duplicate_keys,
     .n_sub = ARRAY_LEN(duplicate_keys)},
    {.name = "listen_tls", .kind = K_FN, .fn = cy_fn_listen_tls, LIVE},
    /* after listen_tls: client_cert needs its client_ca_file */
    {.name = "subject", .kind = K_FN, .fn = cy_fn_subject, .order = 1, LIVE},
    {.name = "defaults", .kind = K_FN, .fn = cy_fn_defaults, .order = 1, LIVE},
    {.name = "tools", .kind = K_FN, .fn = cy_fn_tools, .order = 2, LIVE},
    /* after defaults and tools, which each server's inherit (config_servers.c); a reload
     * adds, removes and changes servers */
    {.name = "servers", .kind = K_FN, .fn = cy_fn_servers, .order = 3, LIVE},
};

#undef LIVE
#undef RESTART

void cy_fn_defaults(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    config_t *c = base;
    c->policy.defaults.line = line;
    cy_walk_map(cx, v, line, path, tool_keys, N_DEFAULT_KEYS, &c->policy.defaults, -1);
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

void cy_fn_tools(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    config_t *c = base;
    void *it = NULL;
    struct fy_node_pair *pair;
    if (cy_node_is_null(v))
        return;
    if (fy_node_is_alias(v) || !fy_node_is_mapping(v)) {
        cy_err_at(cx, line, "%s: expected a mapping of tool names, got %s", path, cy_node_kind(v));
        return;
    }
    while ((pair = fy_node_mapping_iterate(v, &it))) {
        struct fy_node *kn = fy_node_pair_key(pair), *vn = fy_node_pair_value(pair);
        int kline = cy_node_line(kn, line);
        char cpath[PATH_MAX_LEN];
        const char *name = cy_scalar(cx, kn, kline, path, "a tool name");
        if (!name)
            continue;
        if (!tool_name_valid(name)) {
            cy_err_at(cx, kline, "%s: '%.64s' is not a tool name (1-%d characters, no spaces)",
                      path, name, MAX_NAME);
            continue;
        }
        cy_child_path(cpath, path, name);
        policy_tool_t t;
        policy_tool_copy(&t, &c->policy.defaults);
        t.name = xstrdup(name);
        t.line = kline;
        cy_walk_map(cx, vn, kline, cpath, tool_keys, N_TOOL_KEYS, &t, -1);
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
        cy_child_path(name, prefix, specs[i].name);
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
        cy_child_path(name, prefix, k->name);
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
    /* Derived from database_url and the environment (PG*, STATE_DIRECTORY, XDG_STATE_HOME,
     * HOME), neither of which a reload changes: the store is what it was at the start. */
    next->store_enabled = running->store_enabled;
    next->store_kind = running->store_kind;
    free(next->store_target);
    next->store_target = running->store_target ? xstrdup(running->store_target) : NULL;
    config_views_refresh(next);
    return count;
}

/* ---- document ---- */

static void walk_root(ctx_t *cx, struct fy_node *root)
{
    if (cy_node_is_null(root)) {
        cx->res.readable = true;
        return;
    }
    if (fy_node_is_alias(root) || !fy_node_is_mapping(root)) {
        cy_err_at(cx, first_line(root, 1), "top level must be a mapping of settings, got %s",
                  cy_node_kind(root));
        return;
    }
    cx->res.readable = true;
    for (int order = 0; order <= 3; order++)
        cy_walk_map(cx, root, 1, "", top_keys, ARRAY_LEN(top_keys), cx->c, order);
    /* for the errors config.c finds between settings, after the walk */
    struct fy_node *w = fy_node_mapping_lookup_by_string(root, "workers", FY_NT);
    cx->res.workers_line = w ? cy_node_line(w, 1) : 0;
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
            cy_err_at(&cx, first_line(fy_document_root(extra), 1),
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
            cy_err_at(&cx, e->line, "%s", e->msg ? e->msg : "YAML syntax error");
            any = true;
        }
        if (!any && !extra)
            cy_err_at(&cx, 1, "YAML syntax error");
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
