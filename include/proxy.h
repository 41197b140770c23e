/* The proxy: one exchange per agent request. It validates the request, classifies it by the
 * policy, relays it to the upstream and the response back as it arrives, with backpressure
 * both ways. Protected tool calls and GET streams go to a stage (proxy_stage_t), which sees the
 * exchange through exchange.h only.
 *
 * Lifetime: an exchange lives until the upstream response has ended, the stage has released
 * what it held, and the agent has its answer or has gone. The agent leaving does not end a
 * POST exchange: the upstream response is read to the end so a protected result is stored. */
#ifndef IDEMGW_PROXY_H
#define IDEMGW_PROXY_H

#include "config.h"
#include "exchange.h"
#include "stats.h"

#include <event2/util.h>
#include <jansson.h>
#include <stdbool.h>

struct event_base;
struct upstream_pool;

typedef struct proxy proxy_t;

/* What a stage does with the requests the proxy hands it. Each may be NULL. */
typedef struct proxy_stage {
    /* a non_idempotent tools/call: the stage owns its next step (exchange.h) */
    void (*call)(void *arg, exchange_t *ex);
    /* a tasks/get, tasks/result or tasks/cancel: the stage owns its next step */
    void (*task)(void *arg, exchange_t *ex);
    /* a GET stream about to be forwarded: the stage may set an observer on it and return
     * false (the proxy forwards it), or take it and return true: it then owns its next step,
     * as for call (a resume checked against the caller of the calls it may carry) */
    bool (*stream)(void *arg, exchange_t *ex);
    /* a notifications/cancelled naming request_id, before it goes upstream: the stage owns its
     * next step (exchange_forward, or exchange_respond_json with 202 to keep it) */
    void (*cancel)(void *arg, exchange_t *ex, const json_t *request_id);
    /* a notifications/cancelled of session, naming request_id, that the upstream accepted */
    void (*cancelled)(void *arg, const http_request_t *note, const char *session,
                      const json_t *request_id);
    /* the stage still waits for a result of session on a stream (multi-worker resumes) */
    bool (*session_busy)(void *arg, const char *session);
    void *arg;
} proxy_stage_t;

typedef struct proxy_ctx {
    struct event_base *base;
    const config_t *cfg;
    struct upstream_pool *pool;
    server_stats_t *stats;
    struct catalog *catalog; /* the upstream's tools, learned from tools/list; NULL: policy only */
    struct tracer *tracer;   /* OpenTelemetry spans; NULL: tracing off */
    struct subject *subject; /* who is calling: a resume must come from the stream's caller */
    int worker, n_workers;
    const bool *draining; /* the process is shutting down: agent connections are not kept */
    /* an exchange was freed (a drain may be finished) */
    void (*exchange_ended)(void *arg);
    void *arg;
} proxy_ctx_t;

proxy_t *proxy_new(const proxy_ctx_t *ctx);
void proxy_free(proxy_t *p);
void proxy_set_stage(proxy_t *p, const proxy_stage_t *stage);
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
