/* Records a protected call's final answer. The answer reaches the gateway two ways: on the
 * POST's own response (idem.c), or on the session's GET stream after the POST stream ended
 * early (pending.c). Both finish the key here, so a result is kept, limited, cached and routed
 * the same whichever stream carried it. */
#ifndef IDEMGW_RECORDER_H
#define IDEMGW_RECORDER_H

#include "stats.h"
#include "store.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct replay_cache;
struct task_routes;

typedef struct recorder_ctx {
    store_t *store;
    struct replay_cache *cache; /* succeeded results, for replays without a store round trip */
    struct task_routes *tasks;  /* task handles recorded here: the sessions they live in */
    server_stats_t *stats;      /* store_errors counts the writes that failed */
} recorder_ctx_t;

/* What the call was, as the recorder needs it. Every pointer is read during recorder_finish
 * only: the recorder keeps its own copies until the store answers. */
typedef struct recorder_call {
    const char *key;
    const char *key_hash; /* for logs */
    int64_t fence;
    uint64_t window_ms;      /* how long a succeeded row is kept (a task's ttl may shorten it) */
    size_t max_stored_bytes; /* a larger result is recorded as ran, its text not kept */
    const char *args_digest;
    const char *claimed_at; /* ISO 8601, the replay marker's first_seen */
    int attempts;           /* the row's attempts when this call claimed it */
    const char *subject;    /* the caller, whose task routes a task handle registers */
    const char *session;    /* the first call's Mcp-Session-Id (may be NULL) */
    const char *jsonrpc_id; /* the first call's JSON-RPC id text (may be NULL) */
} recorder_call_t;

/* The store's answer. window_ms is the window the row was written with. Called once, from the
 * loop; the recorder has filled the replay cache before it when the outcome was kept. */
typedef void (*recorder_done_cb)(store_status_t st, bool fence_matched, uint64_t window_ms,
                                 void *arg);

/* Finishes call's key as state. result (may be NULL) is the final response's result or error
 * member; a succeeded call's result above max_stored_bytes, or marked too_large, is recorded as
 * ran without its text. A task handle registers its route. On a status other than STORE_OK done
 * is not called. */
store_status_t recorder_finish(const recorder_ctx_t *r, const recorder_call_t *call,
                               store_state_t state, const char *result, size_t result_len,
                               bool too_large, recorder_done_cb done, void *arg) MUST_CHECK;

#endif
