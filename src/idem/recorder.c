#include "recorder.h"
#include "replay_cache.h"
#include "tasks.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

/* A finish the store has not answered yet: what the cache needs once it has. */
typedef struct finishing {
    replay_cache_t *cache;
    server_stats_t *stats;
    store_state_t state;
    char *key;
    char *args_digest;
    char *claimed_at;
    char *session;
    char *jsonrpc_id;
    char *result; /* NULL: not kept (too large, or not a success) */
    size_t result_len;
    int attempts;
    uint64_t window_ms;
    recorder_done_cb done;
    void *arg;
} finishing_t;

static char *dup_or_null(const char *s)
{
    return s ? xstrdup(s) : NULL;
}

static void finishing_free(finishing_t *f)
{
    free(f->key);
    free(f->args_digest);
    free(f->claimed_at);
    free(f->session);
    free(f->jsonrpc_id);
    free(f->result);
    free(f);
}

static void on_store_finished(store_status_t st, bool fence_matched, void *arg)
{
    finishing_t *f = arg;
    if (st != STORE_OK)
        f->stats->store_errors++;
    /* only a write this claim made: a claim taken over left another's outcome in the row */
    if (st == STORE_OK && fence_matched && f->state == STORE_STATE_SUCCEEDED && f->cache) {
        replay_cache_put(f->cache, f->key, f->args_digest ? f->args_digest : "", f->result,
                         f->result_len, f->claimed_at ? f->claimed_at : "", f->attempts,
                         util_now_ms() + f->window_ms);
        replay_cache_set_first(f->cache, f->key, f->session, f->jsonrpc_id);
    }
    if (f->done)
        f->done(st, fence_matched, f->window_ms, f->arg);
    finishing_free(f);
}

store_status_t recorder_finish(const recorder_ctx_t *r, const recorder_call_t *call,
                               store_state_t state, const char *result, size_t result_len,
                               bool too_large, recorder_done_cb done, void *arg)
{
    uint64_t window_ms = call->window_ms;
    if (state == STORE_STATE_SUCCEEDED) {
        /* the limit holds whichever stream carried the answer */
        if (!result || result_len > call->max_stored_bytes)
            too_large = true;
        if (too_large) {
            result = NULL;
            result_len = 0;
        }
    } else {
        too_large = false;
    }
    uint64_t ttl = 0;
    if (result && state == STORE_STATE_SUCCEEDED &&
        task_result_of(result, result_len, NULL, &ttl)) {
        /* a replay of a task that no longer exists would point the retry at nothing */
        if (ttl && ttl < window_ms)
            window_ms = ttl;
        task_routes_note(r->tasks, result, result_len, call->subject, call->session,
                         util_now_ms() + window_ms);
    }
    finishing_t *f = xcalloc(1, sizeof(*f));
    f->cache = r->cache;
    f->stats = r->stats;
    f->state = state;
    f->key = xstrdup(call->key);
    f->args_digest = dup_or_null(call->args_digest);
    f->claimed_at = dup_or_null(call->claimed_at);
    f->session = dup_or_null(call->session);
    f->jsonrpc_id = dup_or_null(call->jsonrpc_id);
    if (result && state == STORE_STATE_SUCCEEDED) {
        f->result = xstrndup(result, result_len);
        f->result_len = result_len;
    }
    f->attempts = call->attempts;
    f->window_ms = window_ms;
    f->done = done;
    f->arg = arg;
    store_finish_req_t fin = {.key = call->key,
                              .fence = call->fence,
                              .state = state,
                              .result = result,
                              .result_len = result_len,
                              .too_large = too_large,
                              .window_ms = window_ms};
    store_status_t st = store_finish(r->store, &fin, on_store_finished, f);
    if (st != STORE_OK) {
        r->stats->store_errors++;
        finishing_free(f);
    }
    return st;
}
