/* servers: several MCP servers behind one gateway. Each entry becomes a view (config.h): a
 * config_t of its own for the server's path, upstream, policy and CORS mode, the top level's
 * values for everything else. Parsed after the top level's defaults and tools, which a
 * server's own inherit. */
#include "config_yaml_int.h"
#include "log.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Server names go into keys, metric labels and log lines: kept to a plain word. */
#define SERVER_NAME_MAX 64

static bool server_name_valid(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > SERVER_NAME_MAX)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '-' || *s == '.'))
            return false;
    return true;
}

/* An agent path the router compares as it is: absolute, in its normal form (target.h), with
 * no query and no trailing '/'. NULL, or what is wrong with it. */
static const char *agent_path_error(const char *p)
{
    if (p[0] != '/')
        return "must start with '/'";
    if (strlen(p) > 200)
        return "is longer than 200 characters";
    if (strcmp(p, "/") == 0)
        return "must name an endpoint, not '/'";
    if (p[strlen(p) - 1] == '/')
        return "must not end with '/'";
    for (const char *s = p; *s; s++) {
        bool plain = (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
                     (*s >= '0' && *s <= '9') || strchr("/-._~", *s);
        if (!plain)
            return "may hold letters, digits and / - . _ ~ only";
        if (s[0] == '/' && s[1] == '/')
            return "must not hold an empty segment (//)";
        if (s[0] == '/' && s[1] == '.' && (s[2] == '/' || !s[2] || (s[2] == '.' && (s[3] == '/' || !s[3]))))
            return "must not hold . or .. segments";
    }
    return NULL;
}

static void fn_path(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    config_t *c = base;
    const char *s = cy_scalar(cx, v, line, path, "a path such as /billing/mcp");
    if (!s)
        return;
    const char *err = agent_path_error(s);
    if (err) {
        cy_err_at(cx, line, "%s: '%.200s' %s", path, s, err);
        return;
    }
    cy_set_string(&c->agent_path, s);
    const char *slash = strrchr(s, '/');
    free(c->agent_prefix);
    c->agent_prefix = xstrndup(s, (size_t)(slash - s));
}

static const char *const cors_names[] = {"mirror", "off", NULL};

#define SERVER(f) offsetof(config_t, f)
static const key_spec_t server_keys[] = {
    {.name = "path", .kind = K_FN, .fn = fn_path, .reload = CONFIG_KEY_RELOADABLE},
    {.name = "upstream", .kind = K_FN, .fn = cy_fn_upstream, .reload = CONFIG_KEY_RELOADABLE},
    {.name = "cors",
     .kind = K_ENUM,
     .off = SERVER(cors),
     .names = cors_names,
     .reload = CONFIG_KEY_RELOADABLE},
    {.name = "defaults", .kind = K_FN, .fn = cy_fn_defaults, .order = 1,
     .reload = CONFIG_KEY_RELOADABLE},
    {.name = "tools", .kind = K_FN, .fn = cy_fn_tools, .order = 2,
     .reload = CONFIG_KEY_RELOADABLE},
};

/* The top level's tools the server does not name itself, as the server's too. */
static void inherit_tools(config_t *v, const policy_t *top)
{
    for (size_t i = 0; i < top->n_tools; i++) {
        if (policy_find(&v->policy, top->tools[i].name))
            continue;
        v->policy.tools = xrealloc(v->policy.tools, (v->policy.n_tools + 1) * sizeof(policy_tool_t));
        policy_tool_copy(&v->policy.tools[v->policy.n_tools++], &top->tools[i]);
    }
    policy_sort(&v->policy);
}

/* Two servers the router could not tell apart: the same path (compared as the router does,
 * without case), or the same folder for their other paths. */
static void check_clash(ctx_t *cx, const config_t *a, const config_t *b, const char *path)
{
    if (!a->agent_path || !b->agent_path)
        return;
    if (strcasecmp(a->agent_path, b->agent_path) == 0)
        cy_err_at(cx, b->server_line, "%s.path: %s is already server %s's path (line %d)", path,
                  b->agent_path, a->server_name, a->server_line);
    else if (*a->agent_prefix && strcasecmp(a->agent_prefix, b->agent_prefix) == 0)
        cy_err_at(cx, b->server_line,
                  "%s.path: %s is in %s/, as server %s's path is (line %d): their other paths "
                  "could not be told apart; give each server a folder of its own",
                  path, b->agent_path, b->agent_prefix, a->server_name, a->server_line);
}

void cy_fn_servers(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    config_t *c = base;
    cx->res.servers_seen = true;
    if (fy_node_is_alias(v) || !fy_node_is_mapping(v) || fy_node_mapping_item_count(v) == 0) {
        cy_err_at(cx, line,
                  "%s: expected a mapping of server names to {path, upstream, ...}, got %s",
                  path,
                  cy_node_is_null(v) ? "nothing"
                  : fy_node_is_mapping(v) && !fy_node_is_alias(v) ? "an empty mapping"
                                                                  : cy_node_kind(v));
        return;
    }
    bool upstream_seen = cx->res.upstream_seen; /* the top level's, not an entry's */
    void *it = NULL;
    struct fy_node_pair *pair;
    while ((pair = fy_node_mapping_iterate(v, &it))) {
        struct fy_node *kn = fy_node_pair_key(pair), *vn = fy_node_pair_value(pair);
        int kline = cy_node_line(kn, line);
        const char *name = cy_scalar(cx, kn, kline, path, "a server name");
        if (!name)
            continue;
        char spath[PATH_MAX_LEN];
        cy_child_path(spath, path, name);
        if (!server_name_valid(name)) {
            cy_err_at(cx, kline, "%s: '%.64s' is not a server name (1-%d letters, digits, _ - .)",
                      path, name, SERVER_NAME_MAX);
            continue;
        }
        if (strcmp(name, "_other") == 0) { /* stats.h's STATS_OTHER_SERVER */
            cy_err_at(cx, kline,
                      "%s: '_other' is reserved: /metrics counts the servers past its limit "
                      "under it",
                      path);
            continue;
        }
        config_t *sv = xcalloc(1, sizeof(*sv));
        sv->server_name = xstrdup(name);
        sv->server_line = kline;
        sv->cors = -1; /* the top level's unless given */
        policy_tool_copy(&sv->policy.defaults, &c->policy.defaults);
        cx->res.upstream_seen = false;
        size_t errs_before = cx->n_errs;
        for (int order = 0; order <= 2; order++)
            cy_walk_map(cx, vn, kline, spath, server_keys, ARRAY_LEN(server_keys), sv, order);
        if (!cx->res.upstream_seen)
            cy_err_at(cx, kline, "%s: upstream is required (a URL, or {command: [...]})", spath);
        if (!sv->agent_path && cx->n_errs == errs_before)
            cy_err_at(cx, kline, "%s: path is required (where agents connect, e.g. /%s/mcp)",
                      spath, name);
        inherit_tools(sv, &c->policy);
        for (size_t i = 0; i < c->n_servers; i++)
            check_clash(cx, c->servers[i], sv, spath);
        c->servers = xrealloc(c->servers, (c->n_servers + 1) * sizeof(*c->servers));
        c->servers[c->n_servers++] = sv;
    }
    cx->res.upstream_seen = upstream_seen;
}

/* A view's own fields; the rest of a view is its parent's, copied again by each refresh. */
#define VIEW_OWN_FIELDS(X)                                                                         \
    X(upstream_url)                                                                                \
    X(upstream_path)                                                                               \
    X(upstream_host_header)                                                                        \
    X(upstream_tls)                                                                                \
    X(upstream)                                                                                    \
    X(stdio)                                                                                       \
    X(policy)                                                                                      \
    X(cors)                                                                                        \
    X(server_name)                                                                                 \
    X(agent_path)                                                                                  \
    X(agent_prefix)                                                                                \
    X(server_line)

void config_views_refresh(config_t *c)
{
    for (size_t i = 0; i < c->n_servers; i++) {
        config_t *v = c->servers[i];
        const config_t own = *v;
        *v = *c;
        v->servers = NULL;
        v->n_servers = 0;
        v->parent = c;
#define KEEP_OWN(field) v->field = own.field;
        VIEW_OWN_FIELDS(KEEP_OWN)
#undef KEEP_OWN
        if ((int)v->cors < 0) /* not given for the server: the top level's */
            v->cors = c->cors;
    }
}

void config_view_free(config_t *v)
{
    free(v->upstream_url);
    free(v->upstream.host);
    free(v->upstream_path);
    free(v->upstream_host_header);
    config_stdio_free(&v->stdio);
    policy_free(&v->policy);
    free(v->server_name);
    free(v->agent_path);
    free(v->agent_prefix);
    free(v);
}

config_t *config_server_named(const config_t *c, const char *name)
{
    for (size_t i = 0; i < c->n_servers; i++)
        if (strcmp(c->servers[i]->server_name, name) == 0)
            return c->servers[i];
    return NULL;
}

bool config_needs_store(const config_t *c)
{
    for (size_t i = 0; i < config_n_servers(c); i++)
        if (policy_needs_store(&config_server(c, i)->policy))
            return true;
    return false;
}
