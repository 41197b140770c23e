/* The idempotency stage: for a non_idempotent tools/call, resolve the caller (subject.h),
 * derive the key (key.h), claim it in the store (store.h), forward once, watch the upstream's
 * answer as a response observer (exchange.h), record the outcome, and answer duplicates from
 * the store. Calls whose stream ended early finish from a GET stream (pending.h).
 *
 * The stage sees the request only through exchange.h and writes nothing of the proxy's. */
#ifndef IDEMGW_IDEM_H
#define IDEMGW_IDEM_H

#include "config.h"
#include "exchange.h"
#include "handler.h"
#include "stats.h"

#include <jansson.h>
#include <stdbool.h>

struct event_base;
struct store;
struct replay_cache;
struct subject;
struct resume_guard;
struct task_routes;

typedef struct idem idem_t;

typedef struct idem_ctx {
    struct event_base *base;
    const config_t *cfg;
    struct store *store; /* NULL when no database is configured */
    struct replay_cache *cache;
    server_stats_t *stats;
    struct catalog *catalog;    /* the upstream's tools: which arguments its schemas declare */
    struct subject *subject;    /* who is calling (subject.h) */
    struct resume_guard *guard; /* who may resume a session's streams (resume_guard.h) */
    struct task_routes *tasks;  /* the sessions of the tasks calls stored or replayed (tasks.h) */
    /* a pending call of session finished: the proxy may stop routing its resumes here */
    void (*session_idle)(void *arg, const char *session);
    void *arg;
} idem_ctx_t;

idem_t *idem_new(const idem_ctx_t *ctx);
void idem_free(idem_t *i);
/* A reload: the configuration calls started from now on see. */
void idem_reconfigure(idem_t *i, const config_t *cfg);

/* The router's handlers (handler.h; arg: the idem_t), in the order main registers them:
 * a cancel of a protected call, the protected call (a non_idempotent tools/call; the status
 * tool is status.h's, registered before it), a GET stream (a resume checked against the
 * caller of the calls it may carry). A task's poll is tasks.h's, over the same routes. */
handler_verdict_t idem_offer_cancel(void *arg, exchange_t *ex);
handler_verdict_t idem_offer_call(void *arg, exchange_t *ex);
handler_verdict_t idem_offer_stream(void *arg, exchange_t *ex);

/* What the handlers call once they took a request. */
void idem_call(void *arg, exchange_t *ex);
/* A GET stream: true when the stage took it (its caller is checked first), false when the
 * proxy forwards it. */
bool idem_stream(void *arg, exchange_t *ex);
/* A caller's notifications/cancelled, before it goes upstream: kept here, or forwarded, as the
 * on_cancel of the protected call it names says (cancel.h). */
void idem_cancel(void *arg, exchange_t *ex, const json_t *request_id);
/* The proxy_hooks_t (arg: the idem_t).
 * A notifications/cancelled the upstream accepted: a running call it names ends cancelled. */
void idem_cancelled(void *arg, const http_request_t *note, const char *session,
                    const json_t *request_id);
bool idem_session_busy(void *arg, const char *session);

#endif
