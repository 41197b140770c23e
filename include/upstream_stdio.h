/* The stdio upstream: the MCP server is a program the gateway spawns, speaking newline-delimited
 * JSON-RPC on its stdin and stdout. It implements the upstream interface (upstream.h) by
 * answering each request as a Streamable HTTP server would, so the exchange, the policy, the
 * catalogue and replays work unchanged:
 * - POST initialize starts a session (Mcp-Session-Id): per_session spawns a child for it and
 *   feeds it the client's initialize; shared initializes one child once and gives later
 *   sessions its answer. Requests without a session (2026-07-28 clients) use the shared child.
 * - Every request's id is rewritten to one the gateway picks, so colliding ids of sessions on
 *   one child route back right; progress tokens and cancellations are rewritten with them.
 * - A POST with requests is answered as an event stream (or JSON when the agent accepts only
 *   JSON); one with only notifications or responses gets 202. GET opens the session's stream
 *   for what the server sends outside a request; DELETE ends the session.
 * - A child that exits ends its sessions (their ids then get 404) and every call in flight
 *   with UPSTREAM_ERR_CLOSED: a protected call is recorded unknown, never run again.
 * - A spawn that fails, or max_children reached, answers 503 for that session alone. */
#ifndef IDEMGW_UPSTREAM_STDIO_H
#define IDEMGW_UPSTREAM_STDIO_H

#include "config.h"
#include "upstream.h"
#include "upstream_http.h"

#include <stddef.h>

struct event_base;

typedef struct upstream_stdio_opts {
    struct event_base *base;
    const stdio_conf_t *conf;        /* copied */
    const char *path;                /* the MCP endpoint agents use; other paths get 404 */
    const upstream_limits_t *limits; /* timeout_ms: initialize; idle_timeout_ms: silence in a
                                        call's answer. Read at each use; outlives the upstream */
    size_t max_line;                 /* the longest stdout line kept (the body limit) */
    const char *server;              /* the server's name in servers:, or NULL: in log lines */
} upstream_stdio_opts_t;

upstream_t *upstream_stdio_new(const upstream_stdio_opts_t *opts);

/* Children alive (spawned and not yet reaped) of a stdio upstream; 0 for another kind. */
int upstream_stdio_children(const upstream_t *u);

/* The program a command runs, allocated: prog itself when it names a path, else the first
 * executable match on path_env (a PATH value); NULL when there is none on PATH. */
char *upstream_stdio_resolve(const char *prog, const char *path_env);

#endif
