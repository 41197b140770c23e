/* The proxy: one exchange per agent request. It validates the request, classifies it by the
 * policy, relays it to the upstream and the response back as it arrives, with backpressure
 * both ways. The requests a concern takes (protected tool calls, task polls, cancels, stream
 * resumes) go to the handlers main registers (handler.h), which see the exchange through
 * exchange.h only.
 *
 * Lifetime: an exchange lives until the upstream response has ended, the stage has released
 * what it held, and the agent has its answer or has gone. The agent leaving does not end a
 * POST exchange: the upstream response is read to the end so a protected result is stored. */
#ifndef IDEMGW_PROXY_H
#define IDEMGW_PROXY_H

#include "config.h"
#include "exchange.h"
#include "handler.h"
#include "stats.h"

#include <event2/util.h>
#include <jansson.h>
#include <stdbool.h>

struct event_base;
struct upstream;

typedef struct proxy proxy_t;

/* What the request object tells a stage apart from the requests handlers take. Each may be
 * NULL. */
typedef struct proxy_hooks {
    /* a notifications/cancelled of session, naming request_id, that the upstream accepted */
    void (*cancelled)(void *arg, const http_request_t *note, const char *session,
                      const json_t *request_id);
    /* a result of session is still awaited on a stream (multi-worker resumes) */
    bool (*session_busy)(void *arg, const char *session);
    void *arg;
} proxy_hooks_t;

/* How the router learns a tool's class, given by whoever wires it (main gives the catalogue's,
 * catalog.h), so the router calls nothing above it. Without call_class the policy alone
 * classes a call and no per-tool counts are kept. */
typedef struct proxy_classifier {
    /* The class a tools/call of tool gets, as it is read. */
    tool_class_t (*call_class)(void *arg, const char *tool);
    /* As a call ends, for /metrics: whether tool is a name a label may be made of, and its
     * class then (the tools may have been listed while the call ran). */
    bool (*known)(void *arg, const char *tool);
    tool_class_t (*tool_class)(void *arg, const char *tool);
    void *arg;
} proxy_classifier_t;

/* How many handlers a router asks at most. */
#define PROXY_MAX_HANDLERS 12

typedef struct proxy_ctx {
    struct event_base *base;
    const config_t *cfg;
    struct upstream *upstream; /* where requests go (upstream.h); outlives the proxy */
    server_stats_t *stats;
    proxy_classifier_t classify; /* a tool's class (the upstream's tools and the policy) */
    struct tracer *tracer;       /* OpenTelemetry spans; NULL: tracing off */
    struct subject *subject;     /* who is calling: a resume must come from the stream's caller */
    int worker, n_workers;
    const bool *draining; /* the process is shutting down: agent connections are not kept */
    /* an exchange was freed (a drain may be finished) */
    void (*exchange_ended)(void *arg);
    void *arg;
} proxy_ctx_t;

proxy_t *proxy_new(const proxy_ctx_t *ctx);
/* Ends the exchanges still in flight (a drain that timed out left them): their upstream calls
 * abandoned, their observers and filters let go, their memory freed. So it goes before the
 * upstream and the stages the exchanges use are freed. */
void proxy_free(proxy_t *p);
void proxy_set_hooks(proxy_t *p, const proxy_hooks_t *hooks);
/* Adds a handler after those added before (handler.h); aborts past PROXY_MAX_HANDLERS. */
void proxy_add_handler(proxy_t *p, const handler_t *h);
/* A reload: the configuration exchanges started from now on see. */
void proxy_reconfigure(proxy_t *p, const config_t *cfg);

/* The request handler of the MCP listener (arg: the proxy_t). */
void proxy_handle(void *arg, http_conn_t *conn, http_request_t *req);

/* Drain: ends every GET stream (they carry no call and never end by themselves; the agent
 * reconnects elsewhere). POST streams are left to finish. */
void proxy_drain(proxy_t *p);
/* Requests in flight, including those whose agent has gone. */
uint64_t proxy_exchanges(const proxy_t *p);

/* Several workers: once this worker reads no stream of session and the stage waits for no
 * result on one, resumes of that session are no longer sent here (handoff.h). */
void proxy_session_maybe_idle(proxy_t *p, const char *session);

#endif
