#include "store.h"
#include "util.h"

#include <stdlib.h>

struct store {
    const store_ops_t *ops;
    void *impl;
};

store_t *store_from_ops(const store_ops_t *ops, void *impl)
{
    store_t *s = xcalloc(1, sizeof(*s));
    s->ops = ops;
    s->impl = impl;
    return s;
}

const char *store_backend_name(const store_t *s)
{
    return s->ops->name;
}

void store_free(store_t *s)
{
    if (!s)
        return;
    s->ops->free(s->impl);
    free(s);
}

bool store_ready(const store_t *s)
{
    return s && s->ops->ready(s->impl);
}

void store_get_stats(const store_t *s, store_stats_t *out)
{
    s->ops->get_stats(s->impl, out);
}

store_status_t store_claim(store_t *s, const store_claim_req_t *req, store_claim_cb cb, void *arg)
{
    return s->ops->claim(s->impl, req, cb, arg);
}

store_status_t store_finish(store_t *s, const char *key, int64_t fence, store_state_t state,
                            const char *result, size_t result_len, bool too_large,
                            uint64_t window_ms, store_finish_cb cb, void *arg)
{
    return s->ops->finish(s->impl, key, fence, state, result, result_len, too_large, window_ms, cb,
                          arg);
}

store_status_t store_get(store_t *s, const char *key, store_get_cb cb, void *arg)
{
    return s->ops->get(s->impl, key, cb, arg);
}

const char *store_dup_answer_str(store_dup_answer_t a)
{
    static const char *const names[STORE_DUP_ANSWERS_] = {
        [STORE_DUP_REPLAY] = "replay",
        [STORE_DUP_IN_PROGRESS] = "in_progress",
        [STORE_DUP_UNKNOWN] = "unknown",
    };
    return (unsigned)a < STORE_DUP_ANSWERS_ ? names[a] : "?";
}

store_status_t store_record_duplicate(store_t *s, const store_dup_t *dup, store_finish_cb cb,
                                      void *arg)
{
    if (!dup->key || (unsigned)dup->answered >= STORE_DUP_ANSWERS_ ||
        (unsigned)dup->source >= DUP_SOURCE_N)
        return STORE_ERR_STATEMENT;
    return s->ops->record_duplicate(s->impl, dup, cb, arg);
}

store_status_t store_note_duplicate(store_t *s, const char *key, store_finish_cb cb, void *arg)
{
    store_dup_t d = {.key = key, .answered = STORE_DUP_REPLAY, .at_ms = util_wall_ms()};
    return store_record_duplicate(s, &d, cb, arg);
}

store_status_t store_report(store_t *s, uint64_t since_ms, int top, store_report_cb cb, void *arg)
{
    return s->ops->report(s->impl, since_ms, top, cb, arg);
}

int store_pending_duplicates(const store_t *s, const char *key)
{
    return s->ops->pending_duplicates(s->impl, key);
}

store_status_t store_extend_lease(store_t *s, const char *key, int64_t fence, uint64_t lease_ms,
                                  store_finish_cb cb, void *arg)
{
    return s->ops->extend_lease(s->impl, key, fence, lease_ms, cb, arg);
}

store_status_t store_sweep_now(store_t *s, store_finish_cb cb, void *arg)
{
    return s->ops->sweep_now(s->impl, cb, arg);
}

store_status_t store_release(store_t *s, const char *key, store_release_cb cb, void *arg)
{
    return s->ops->release(s->impl, key, cb, arg);
}

store_status_t store_forget(store_t *s, const char *key, store_get_cb cb, void *arg)
{
    return s->ops->forget(s->impl, key, cb, arg);
}
