/* Protected calls whose POST stream ended without their final response (the server ended the
 * stream early, SSE polling): the response may still arrive on a GET stream the agent resumes
 * with Last-Event-ID, and it must finish the key. The registry keeps them, per session, until
 * their lease ends, and watches the session's GET streams for their responses. */
#ifndef IDEMGW_PENDING_H
#define IDEMGW_PENDING_H

#include "exchange.h"
#include "policy.h"
#include "stats.h"
#include "store.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct pending_reg pending_reg_t;
struct recorder_ctx;
struct recorder_call;

typedef struct pending_ctx {
    store_t *store;
    /* finishes the keys, as for an answer on the POST's own stream (recorder.h): lives as long
     * as the registry */
    const struct recorder_ctx *recorder;
    server_stats_t *stats;
    /* a response finished a pending call of session: the session may be idle now */
    void (*session_idle)(void *arg, const char *session);
    void *arg;
} pending_ctx_t;

pending_reg_t *pending_new(const pending_ctx_t *ctx);
void pending_free(pending_reg_t *r);

/* Remembers a call (call->session, which must not be NULL): what its recorder needs, copied, and
 * the JSON-RPC id its final response will carry. */
void pending_add(pending_reg_t *r, const struct recorder_call *call, const json_t *id,
                 const policy_rules_t *rules);
/* A call of session is still pending (entries past their lease are dropped first). */
bool pending_has_session(pending_reg_t *r, const char *session);
/* A GET stream of a session is about to be forwarded: watched (with a store), as a call of its
 * session may be left pending while it is open and answered on it. */
void pending_watch(pending_reg_t *r, exchange_t *ex);

#endif
