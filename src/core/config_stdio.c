/* The config's stdio upstream: `upstream: {command: [ARGV...], env, cwd, sessions,
 * max_children, idle_timeout, path}`, read by the YAML walker of config_yaml.c, and the
 * functions that set, copy, compare and free it. A URL upstream and a command upstream exclude
 * each other: setting one clears the other. */
#include "config_yaml_int.h"
#include "util.h"

#include <libfyaml.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STDIO_DEFAULT_PATH "/mcp"

static void strv_free_null(char **v)
{
    for (size_t i = 0; v && v[i]; i++)
        free(v[i]);
    free(v);
}

void config_stdio_free(stdio_conf_t *s)
{
    strv_free_null(s->argv);
    strv_free_null(s->env);
    strv_free_null(s->pass_env);
    free(s->cwd);
    *s = (stdio_conf_t){0};
}

static void stdio_defaults(stdio_conf_t *s)
{
    s->sessions = STDIO_PER_SESSION;
    s->max_children = 32;
    s->idle_timeout_ms = 10 * 60 * MS_S;
    s->grace_ms = 5 * MS_S;
    s->start_timeout_ms = 30 * MS_S;
}

/* "stdio: node server.mjs --flag": how logs and errors name the server. */
static char *command_label(char *const *argv)
{
    size_t n = strlen("stdio:") + 1;
    for (size_t i = 0; argv[i]; i++)
        n += strlen(argv[i]) + 1;
    char *s = xmalloc(n);
    strcpy(s, "stdio:");
    for (size_t i = 0; argv[i]; i++) {
        strcat(s, i ? " " : "");
        strcat(s, argv[i]);
    }
    return s;
}

/* The URL fields give way to the command. */
static void clear_url(config_t *c)
{
    free(c->upstream_url);
    free(c->upstream.host);
    free(c->upstream_path);
    free(c->upstream_host_header);
    c->upstream_url = NULL;
    c->upstream = (host_port_t){0};
    c->upstream_path = NULL;
    c->upstream_host_header = NULL;
    c->upstream_tls = false;
}

void config_set_upstream_command(config_t *c, char *const *argv)
{
    clear_url(c);
    config_stdio_free(&c->stdio);
    stdio_defaults(&c->stdio);
    size_t n = 0;
    while (argv[n])
        n++;
    c->stdio.argv = xcalloc(n + 1, sizeof(char *));
    for (size_t i = 0; i < n; i++)
        c->stdio.argv[i] = xstrdup(argv[i]);
    c->stdio.argc = n;
    c->upstream_url = command_label(c->stdio.argv);
    c->upstream_path = xstrdup(STDIO_DEFAULT_PATH);
}

static char **strv_copy(char *const *v)
{
    if (!v)
        return NULL;
    size_t n = 0;
    while (v[n])
        n++;
    char **out = xcalloc(n + 1, sizeof(char *));
    for (size_t i = 0; i < n; i++)
        out[i] = xstrdup(v[i]);
    return out;
}

void config_stdio_copy(stdio_conf_t *dst, const stdio_conf_t *src)
{
    config_stdio_free(dst);
    *dst = *src;
    dst->argv = strv_copy(src->argv);
    dst->env = strv_copy(src->env);
    dst->pass_env = strv_copy(src->pass_env);
    dst->cwd = src->cwd ? xstrdup(src->cwd) : NULL;
}

static bool strv_same(char *const *a, char *const *b)
{
    if (!a || !b)
        return a == b;
    size_t i = 0;
    for (; a[i] && b[i]; i++)
        if (strcmp(a[i], b[i]) != 0)
            return false;
    return !a[i] && !b[i];
}

bool config_stdio_same(const stdio_conf_t *a, const stdio_conf_t *b)
{
    return strv_same(a->argv, b->argv) && strv_same(a->env, b->env) &&
           strv_same(a->pass_env, b->pass_env) &&
           ((!a->cwd && !b->cwd) || (a->cwd && b->cwd && strcmp(a->cwd, b->cwd) == 0)) &&
           a->sessions == b->sessions && a->max_children == b->max_children &&
           a->idle_timeout_ms == b->idle_timeout_ms && a->grace_ms == b->grace_ms &&
           a->start_timeout_ms == b->start_timeout_ms;
}

/* ---- upstream: {command: ...} ---- */

/* What the walk fills before the command is known to be valid. */
typedef struct stdio_walk {
    stdio_conf_t conf;
    char **argv;
    size_t argc;
    char **env;
    size_t n_env;
    char **pass;
    size_t n_pass;
    char *path;
    bool command_seen;
} stdio_walk_t;

static void argv_entry(ctx_t *cx, const char *s, int line, const char *path, void *base)
{
    stdio_walk_t *w = base;
    if (w->argc == 0 && !*s)
        cy_err_at(cx, line, "%s: the program name is empty", path);
    cy_strv_push(&w->argv, &w->argc, xstrdup(s));
}

static void fn_command(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    stdio_walk_t *w = base;
    w->command_seen = true;
    if (fy_node_is_scalar(v) && !fy_node_is_alias(v) && !cy_node_is_null(v)) {
        cy_err_at(cx, line,
                  "%s: expected a list (the program and its arguments, e.g. [npx, -y, "
                  "@modelcontextprotocol/server-memory]), got a scalar",
                  path);
        return;
    }
    cy_walk_list(cx, v, line, path, base, false, argv_entry);
}

static bool env_name_valid(const char *s)
{
    if (!*s || (*s >= '0' && *s <= '9'))
        return false;
    for (; *s; s++)
        if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') ||
              *s == '_'))
            return false;
    return true;
}

static void fn_env(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    stdio_walk_t *w = base;
    if (cy_node_is_null(v))
        return;
    if (fy_node_is_alias(v) || !fy_node_is_mapping(v)) {
        cy_err_at(cx, line, "%s: expected a mapping of NAME: value, got %s", path, cy_node_kind(v));
        return;
    }
    void *it = NULL;
    struct fy_node_pair *pair;
    char cpath[PATH_MAX_LEN];
    while ((pair = fy_node_mapping_iterate(v, &it))) {
        struct fy_node *kn = fy_node_pair_key(pair);
        struct fy_node *vn = fy_node_pair_value(pair);
        int kline = cy_node_line(kn, line);
        const char *name = cy_scalar(cx, kn, kline, path, "a variable name");
        if (!name)
            continue;
        if (!env_name_valid(name)) {
            cy_err_at(cx, kline, "%s: '%.64s' is not a variable name (letters, digits, _)", path,
                      name);
            continue;
        }
        cy_child_path(cpath, path, name);
        const char *val = cy_node_is_null(vn) ? "" : cy_scalar(cx, vn, kline, cpath, "a string");
        if (val)
            cy_strv_push(&w->env, &w->n_env, xasprintf("%s=%s", name, val));
    }
}

static void pass_entry(ctx_t *cx, const char *s, int line, const char *path, void *base)
{
    stdio_walk_t *w = base;
    if (!env_name_valid(s)) {
        cy_err_at(cx, line, "%s: '%.64s' is not a variable name (letters, digits, _)", path, s);
        return;
    }
    cy_strv_push(&w->pass, &w->n_pass, xstrdup(s));
}

/* pass_env: [NAME, ...]: variables of the gateway's own environment the child gets as well,
 * named one by one (a proxy, a CA bundle), never the whole environment. */
static void fn_pass_env(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    if (fy_node_is_scalar(v) && !fy_node_is_alias(v) && !cy_node_is_null(v)) {
        cy_err_at(cx, line,
                  "%s: expected a list of variable names (e.g. [HTTPS_PROXY, "
                  "NODE_EXTRA_CA_CERTS]), got a scalar",
                  path);
        return;
    }
    cy_walk_list(cx, v, line, path, base, false, pass_entry);
}

static void fn_path(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    stdio_walk_t *w = base;
    const char *s = cy_scalar(cx, v, line, path, "a path (e.g. /mcp)");
    if (!s)
        return;
    if (s[0] != '/' || strpbrk(s, "?# \t") || strstr(s, "//")) {
        cy_err_at(cx, line, "%s: '%.100s' must be a path starting with / (e.g. /mcp)", path, s);
        return;
    }
    free(w->path);
    w->path = xstrdup(s);
}

static const char *const sessions_names[] = {"per_session", "shared", NULL};

#define W(f) offsetof(stdio_walk_t, f)
static const key_spec_t stdio_keys[] = {
    {.name = "command", .kind = K_FN, .fn = fn_command},
    {.name = "env", .kind = K_FN, .fn = fn_env},
    {.name = "pass_env", .kind = K_FN, .fn = fn_pass_env},
    {.name = "cwd", .kind = K_STR, .off = W(conf.cwd)},
    {.name = "sessions", .kind = K_ENUM, .off = W(conf.sessions), .names = sessions_names},
    {.name = "max_children", .kind = K_INT, .off = W(conf.max_children), .min = 1, .max = 100000},
    {.name = "idle_timeout",
     .kind = K_DUR,
     .off = W(conf.idle_timeout_ms),
     .min = MS_S,
     .max = STDIO_IDLE_TIMEOUT_MAX_MS},
    {.name = "grace", .kind = K_DUR, .off = W(conf.grace_ms), .min = 1, .max = 10 * 60 * MS_S},
    {.name = "start_timeout",
     .kind = K_DUR,
     .off = W(conf.start_timeout_ms),
     .min = 100,
     .max = 10 * 60 * MS_S},
    {.name = "path", .kind = K_FN, .fn = fn_path},
};
#undef W

void cy_upstream_command(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    config_t *c = base;
    stdio_walk_t w = {0};
    stdio_defaults(&w.conf);
    size_t errs_before = cx->n_errs;
    cy_walk_map(cx, v, line, path, stdio_keys, ARRAY_LEN(stdio_keys), &w, -1);
    if (!w.command_seen)
        cy_err_at(cx, line,
                  "%s: a URL, or a mapping with a command (e.g. {command: [npx, -y, "
                  "@modelcontextprotocol/server-memory]})",
                  path);
    if (cx->n_errs == errs_before && w.argc > 0) {
        cy_strv_push(&w.argv, &w.argc, NULL);
        w.argc--;
        config_set_upstream_command(c, w.argv);
        char *cwd = w.conf.cwd;
        w.conf.cwd = NULL;
        int sessions = w.conf.sessions, max = w.conf.max_children;
        c->stdio.cwd = cwd;
        c->stdio.sessions = sessions;
        c->stdio.max_children = max;
        c->stdio.idle_timeout_ms = w.conf.idle_timeout_ms;
        c->stdio.grace_ms = w.conf.grace_ms;
        c->stdio.start_timeout_ms = w.conf.start_timeout_ms;
        if (w.n_env) {
            cy_strv_push(&w.env, &w.n_env, NULL);
            c->stdio.env = w.env;
            c->stdio.n_env = w.n_env - 1;
            w.env = NULL;
            w.n_env = 0;
        }
        if (w.n_pass) {
            cy_strv_push(&w.pass, &w.n_pass, NULL);
            c->stdio.pass_env = w.pass;
            w.pass = NULL;
            w.n_pass = 0;
        }
        if (w.path) {
            free(c->upstream_path);
            c->upstream_path = w.path;
            w.path = NULL;
        }
    }
    util_strv_free(w.argv, w.argc);
    util_strv_free(w.env, w.n_env);
    util_strv_free(w.pass, w.n_pass);
    free(w.conf.cwd);
    free(w.path);
}
