/* Which server a request goes to, by path (routes.h). */
#include "routes.h"

#include "log.h"
#include "mcp.h"
#include "proxy.h"
#include "target.h"
#include "util.h"

#include <llhttp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define WELL_KNOWN_RESOURCE "/.well-known/oauth-protected-resource"

struct routes {
    route_t *v;
    size_t n;
};

routes_t *routes_new(void)
{
    return xcalloc(1, sizeof(routes_t));
}

void routes_free(routes_t *r)
{
    if (!r)
        return;
    free(r->v);
    free(r);
}

void routes_set(routes_t *r, const route_t *routes, size_t n)
{
    free(r->v);
    r->v = xcalloc(n ? n : 1, sizeof(route_t));
    memcpy(r->v, routes, n * sizeof(route_t));
    r->n = n;
}

/* The rest of path after prefix when path is prefix itself or below it (compared as the
 * endpoint is, without case), else NULL. */
static const char *under(const char *path, const char *prefix)
{
    size_t n = strlen(prefix);
    if (n == 0 || strncasecmp(path, prefix, n) != 0)
        return NULL;
    if (path[n] == '\0' || path[n] == '/')
        return path + n;
    return NULL;
}

/* The folder of a server's endpoint path, with rest after it: /api/mcp and /x give /api/x. */
static char *relayed(const route_t *rt, const char *rest, const char *query)
{
    const char *slash = strrchr(rt->upstream_path, '/');
    size_t base = slash ? (size_t)(slash - rt->upstream_path) : 0;
    char *path = xasprintf("%.*s%s", (int)base, rt->upstream_path, *rest ? rest : "/");
    char *t = target_origin_form(path, query);
    free(path);
    return t;
}

const route_t *routes_match(const routes_t *r, const char *path, const char *query,
                            char **target)
{
    *target = NULL;
    for (size_t i = 0; i < r->n; i++)
        if (target_is_endpoint(path, r->v[i].agent_path)) {
            *target = target_origin_form(r->v[i].upstream_path, query);
            return &r->v[i];
        }
    const char *meta = under(path, WELL_KNOWN_RESOURCE);
    for (size_t i = 0; meta && *meta && i < r->n; i++)
        if (target_is_endpoint(meta, r->v[i].agent_path)) {
            *target = target_origin_form(path, query);
            return &r->v[i];
        }
    const route_t *best = NULL;
    const char *rest = NULL;
    for (size_t i = 0; i < r->n; i++) {
        const char *x = under(path, r->v[i].prefix);
        if (x && (!best || strlen(r->v[i].prefix) > strlen(best->prefix))) {
            best = &r->v[i];
            rest = x;
        }
    }
    if (best) {
        *target = relayed(best, rest, query);
        return best;
    }
    const route_t *root = NULL;
    for (size_t i = 0; i < r->n; i++)
        if (!*r->v[i].prefix) {
            if (root)
                return NULL; /* two servers at the top: the path names neither */
            root = &r->v[i];
        }
    if (root)
        *target = relayed(root, path, query);
    return root;
}

static void not_found(http_conn_t *conn, http_request_t *req, const char *path)
{
    char msg[400];
    snprintf(msg, sizeof(msg),
             "not found: no MCP server of this gateway is at %.200s; nothing was forwarded",
             path);
    char *body = mcp_error_body(NULL, -32600, msg);
    http_conn_respond(conn, 404, "application/json", body, strlen(body), NULL, req->keep_alive);
    free(body);
    http_request_free(req);
}

void routes_handle(void *arg, http_conn_t *conn, http_request_t *req)
{
    routes_t *r = arg;
    if (r->n == 1 && !r->v[0].agent_path) {
        proxy_handle(r->v[0].proxy, conn, req);
        return;
    }
    target_t t;
    /* a target the routers would refuse goes to one of them, to be refused as it would be
     * anywhere; CONNECT's is an authority, refused by method */
    if (req->method == HTTP_CONNECT || target_normalize(req->target, &t) != TARGET_OK) {
        if (req->method != HTTP_CONNECT)
            target_free(&t);
        proxy_handle(r->v[0].proxy, conn, req);
        return;
    }
    char *target = NULL;
    const route_t *rt = routes_match(r, t.path, t.query, &target);
    if (!rt) {
        log_debug(0, "no server at %s: 404", t.path);
        not_found(conn, req, t.path);
        target_free(&t);
        return;
    }
    /* a hand-off to another worker sends what the agent sent, to be routed there again */
    free(req->routed_from);
    req->routed_from = req->target;
    /* the absolute form keeps its authority, which the router checks as it checks Host */
    req->target = t.authority ? xasprintf("http://%s%s", t.authority, target) : xstrdup(target);
    free(target);
    target_free(&t);
    proxy_handle(rt->proxy, conn, req);
}
