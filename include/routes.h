/* Several MCP servers behind one listener (servers:): which server's router (proxy.h) a request
 * goes to, by its path, and the target that router sees. Each server has an agent path (where
 * agents reach its MCP endpoint, /billing/mcp) and a prefix (the folder of that path, /billing)
 * under which its other paths are relayed:
 *   - the agent path, however spelled (target_is_endpoint): the server's own endpoint path;
 *   - /.well-known/oauth-protected-resource + agent path (RFC 9728's metadata of that
 *     resource): to the server, unchanged. A server behind OAuth knows the URL its callers
 *     use (the gateway's: its metadata must name that resource, or clients refuse it) and
 *     serves the document at that URL's path;
 *   - PREFIX/REST: the folder of the server's endpoint path + /REST (longest prefix wins);
 *   - anything else: the one server whose prefix is empty (/mcp), if exactly one is; else 404.
 * The router behind then reads the rewritten target as a one-server gateway reads its own: the
 * endpoint checks and the policy apply unchanged. With one route and no agent path (no
 * servers:), requests go to its router untouched. */
#ifndef IDEMGW_ROUTES_H
#define IDEMGW_ROUTES_H

#include "http_conn.h"

#include <stddef.h>

struct proxy;

typedef struct route {
    const char *name;          /* the server's name, for the 404's message; NULL: the only one */
    const char *agent_path;    /* NULL: every request, untouched (no servers:) */
    const char *prefix;        /* its other paths are under it; "" for none */
    const char *upstream_path; /* the server's own endpoint path */
    struct proxy *proxy;       /* its router */
} route_t;

typedef struct routes routes_t;

routes_t *routes_new(void);
void routes_free(routes_t *r);
/* The routes requests from now on take (copied; the strings must outlive them, until the next
 * routes_set). */
void routes_set(routes_t *r, const route_t *routes, size_t n);

/* The request handler of the MCP listener (arg: the routes_t). */
void routes_handle(void *arg, http_conn_t *conn, http_request_t *req);

/* The route a normalised path goes to and the target its router gets (allocated into
 * *target), or NULL. Exposed for tests. */
const route_t *routes_match(const routes_t *r, const char *path, const char *query,
                            char **target);

#endif
