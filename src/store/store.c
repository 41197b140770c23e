#include "store.h"
#include "stats.h"
#include "util.h"

#include <event2/event.h>
#include <stdlib.h>
#include <string.h>

#define STORE_PUBLISH_MS 1000
/* Until the store is first up: another worker's /readyz waits on this worker's figure. */
#define STORE_PUBLISH_START_MS 20

struct store {
    const store_ops_t *ops;
    void *impl;
    server_stats_t *stats;    /* NULL: calls are not timed */
    struct event *publish_ev; /* copies the store's gauges into stats */
    bool was_up;              /* has been ready once: published at the slower pace */
    int outstanding;          /* timed calls whose callback has not run yet */
    void (*settled_cb)(void *arg);
    void *settled_arg;
};

/* One timed call: the caller's callback and argument, and when the call was made. */
typedef struct timed {
    store_t *store;
    stats_store_op_t op;
    uint64_t start_us;
    store_cb_t cb;
    void *arg;
} timed_t;

static timed_t *timed_new(store_t *s, stats_store_op_t op, void *arg)
{
    timed_t *t = xcalloc(1, sizeof(*t));
    t->store = s;
    t->op = op;
    t->arg = arg;
    t->start_us = stats_now_us();
    s->outstanding++;
    return t;
}

/* After a caller's callback: the last outstanding call has ended (what the callback sent in
 * turn is outstanding already). */
static void settled(store_t *s)
{
    if (s->outstanding == 0 && s->settled_cb)
        s->settled_cb(s->settled_arg);
}

/* Files the duration; the caller's callback runs next. Frees t. */
static void timed_end(timed_t *t)
{
    stats_observe_store_since(t->store->stats, t->op, t->start_us);
    t->store->outstanding--;
    free(t);
}

/* A call the backend refused at once has no callback coming: t is dropped. */
static store_status_t timed_sent(timed_t *t, store_status_t st)
{
    if (t && st != STORE_OK) {
        t->store->outstanding--;
        free(t);
    }
    return st;
}

static void timed_claim(store_status_t st, const store_claim_result_t *res, void *arg)
{
    timed_t t = *(timed_t *)arg;
    timed_end(arg);
    t.cb.claim(st, res, t.arg);
    settled(t.store);
}

static void timed_finish(store_status_t st, bool matched, void *arg)
{
    timed_t t = *(timed_t *)arg;
    timed_end(arg);
    if (t.cb.finish)
        t.cb.finish(st, matched, t.arg);
    settled(t.store);
}

static void timed_get(store_status_t st, const store_row_t *row, void *arg)
{
    timed_t t = *(timed_t *)arg;
    timed_end(arg);
    t.cb.get(st, row, t.arg);
    settled(t.store);
}

static void timed_release(store_status_t st, bool released, const store_row_t *row, void *arg)
{
    timed_t t = *(timed_t *)arg;
    timed_end(arg);
    t.cb.release(st, released, row, t.arg);
    settled(t.store);
}

static void timed_count(store_status_t st, int64_t n, void *arg)
{
    timed_t t = *(timed_t *)arg;
    timed_end(arg);
    t.cb.count(st, n, t.arg);
    settled(t.store);
}

static void publish(evutil_socket_t fd, short what, void *arg)
{
    store_t *s = arg;
    store_stats_t st;
    s->ops->get_stats(s->impl, &st);
    server_stats_t *o = s->stats;
    o->store_present = 1;
    o->store_up = s->ops->ready(s->impl) ? 1 : 0;
    o->store_conns_wanted = (uint64_t)st.connections_wanted;
    o->store_conns_open = (uint64_t)st.connections_up;
    o->store_conns_busy = (uint64_t)st.connections_busy;
    o->store_queued = (uint64_t)st.queued;
    o->store_batch_slots = st.batch_slots > 0 ? (uint64_t)st.batch_slots : 0;
    o->store_claims = st.claims;
    o->store_connects = st.connects;
    o->store_swept = st.swept;
    o->store_in_doubt = st.claims_in_doubt;
    o->store_in_doubt_released = st.in_doubt_released;
    /* Postgres batches claims and finishes into statements; SQLite batches every call into a
     * transaction (one commit) */
    o->store_batches = st.claim_batches + st.finish_batches + st.transactions;
    o->store_batched = st.claims_batched + st.finishes_batched + st.batched_ops;
    if (s->publish_ev) {
        s->was_up = s->was_up || o->store_up;
        struct timeval tv = util_ms_to_tv(s->was_up ? STORE_PUBLISH_MS : STORE_PUBLISH_START_MS);
        evtimer_add(s->publish_ev, &tv);
    }
}

int store_outstanding(const store_t *s)
{
    return s ? s->outstanding : 0;
}

void store_on_settled(store_t *s, void (*cb)(void *arg), void *arg)
{
    s->settled_cb = cb;
    s->settled_arg = arg;
}

void store_observe(store_t *s, server_stats_t *stats, struct event_base *base)
{
    s->stats = stats;
    if (s->ops->observe)
        s->ops->observe(s->impl, stats);
    s->publish_ev = event_new(base, -1, 0, publish, s);
    if (!s->publish_ev)
        abort();
    publish(-1, 0, s); /* and arms the next */
}

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
    if (s->publish_ev)
        event_free(s->publish_ev);
    s->ops->free(s->impl);
    free(s);
}

bool store_ready(const store_t *s)
{
    return s && s->ops->ready(s->impl);
}

bool store_orders_finishes(const store_t *s)
{
    return s && s->ops->orders_finishes && s->ops->orders_finishes(s->impl);
}

void store_down_reason(const store_t *s, char *buf, size_t len)
{
    if (len)
        buf[0] = '\0';
    if (s && s->ops->down_reason && len)
        s->ops->down_reason(s->impl, buf, len);
}

void store_get_stats(const store_t *s, store_stats_t *out)
{
    s->ops->get_stats(s->impl, out);
}

store_status_t store_claim(store_t *s, const store_claim_req_t *req, store_claim_cb cb, void *arg)
{
    if (!s->stats)
        return s->ops->claim(s->impl, req, cb, arg);
    timed_t *t = timed_new(s, STATS_STORE_CLAIM, arg);
    t->cb.claim = cb;
    return timed_sent(t, s->ops->claim(s->impl, req, timed_claim, t));
}

store_status_t store_finish(store_t *s, const store_finish_req_t *req, store_finish_cb cb,
                            void *arg)
{
    if (!s->stats)
        return s->ops->finish(s->impl, req, cb, arg);
    timed_t *t = timed_new(s, STATS_STORE_FINISH, arg);
    t->cb.finish = cb;
    return timed_sent(t, s->ops->finish(s->impl, req, timed_finish, t));
}

store_status_t store_get(store_t *s, const char *key, store_get_cb cb, void *arg)
{
    if (!s->stats)
        return s->ops->get(s->impl, key, cb, arg);
    timed_t *t = timed_new(s, STATS_STORE_GET, arg);
    t->cb.get = cb;
    return timed_sent(t, s->ops->get(s->impl, key, timed_get, t));
}

const char *store_status_str(store_status_t st)
{
    switch (st) {
    case STORE_OK:
        return "ok";
    case STORE_ERR_UNAVAILABLE:
        return "unavailable";
    case STORE_ERR_STATEMENT:
        return "statement failed";
    case STORE_ERR_SCHEMA:
        return "schema mismatch";
    case STORE_ERR_SHUTDOWN:
        return "shutting down";
    case STORE_ERR_FILE_LOST:
        return "the store's file was deleted or replaced";
    }
    return "unknown status";
}

static const char *const state_names[] = {
    [STORE_STATE_IN_PROGRESS] = "in_progress",
    [STORE_STATE_SUCCEEDED] = "succeeded",
    [STORE_STATE_FAILED] = "failed",
    [STORE_STATE_UNKNOWN] = "unknown",
};

const char *store_state_str(store_state_t st)
{
    if ((unsigned)st >= ARRAY_LEN(state_names))
        return "invalid";
    return state_names[st];
}

bool store_state_valid(store_state_t st)
{
    return (unsigned)st < ARRAY_LEN(state_names);
}

bool store_state_parse(const char *txt, store_state_t *out)
{
    for (unsigned i = 0; txt && i < ARRAY_LEN(state_names); i++) {
        if (strcmp(txt, state_names[i]) == 0) {
            *out = (store_state_t)i;
            return true;
        }
    }
    return false;
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
    /* without a callback a duplicate is only recorded in memory (its write is the batched
     * flush): nothing to time, and a callback would make a backend queue an op for it */
    if (!s->stats || !cb)
        return s->ops->record_duplicate(s->impl, dup, cb, arg);
    timed_t *t = timed_new(s, STATS_STORE_DUP, arg);
    t->cb.finish = cb;
    return timed_sent(t, s->ops->record_duplicate(s->impl, dup, timed_finish, t));
}

store_status_t store_note_duplicate(store_t *s, const char *key, store_finish_cb cb, void *arg)
{
    store_dup_t d = {.key = key, .answered = STORE_DUP_REPLAY, .at_ms = util_wall_ms()};
    return store_record_duplicate(s, &d, cb, arg);
}

store_status_t store_report(store_t *s, uint64_t since_ms, int top, const char *tool_prefix,
                            store_report_cb cb, void *arg)
{
    return s->ops->report(s->impl, since_ms, top, tool_prefix ? tool_prefix : "", cb, arg);
}

int store_pending_duplicates(const store_t *s, const char *key)
{
    return s->ops->pending_duplicates(s->impl, key);
}

store_status_t store_extend_lease(store_t *s, const char *key, int64_t fence, uint64_t lease_ms,
                                  store_finish_cb cb, void *arg)
{
    if (!s->stats)
        return s->ops->extend_lease(s->impl, key, fence, lease_ms, cb, arg);
    timed_t *t = timed_new(s, STATS_STORE_EXTEND, arg);
    t->cb.finish = cb;
    return timed_sent(t, s->ops->extend_lease(s->impl, key, fence, lease_ms, timed_finish, t));
}

store_status_t store_sweep_now(store_t *s, store_finish_cb cb, void *arg)
{
    if (!s->stats)
        return s->ops->sweep_now(s->impl, cb, arg);
    timed_t *t = timed_new(s, STATS_STORE_SWEEP, arg);
    t->cb.finish = cb;
    return timed_sent(t, s->ops->sweep_now(s->impl, timed_finish, t));
}

store_status_t store_release(store_t *s, const char *key, store_release_cb cb, void *arg)
{
    if (!s->stats)
        return s->ops->release(s->impl, key, cb, arg);
    timed_t *t = timed_new(s, STATS_STORE_RELEASE, arg);
    t->cb.release = cb;
    return timed_sent(t, s->ops->release(s->impl, key, timed_release, t));
}

store_status_t store_forget(store_t *s, const char *key, store_get_cb cb, void *arg)
{
    if (!s->stats)
        return s->ops->forget(s->impl, key, cb, arg);
    timed_t *t = timed_new(s, STATS_STORE_FORGET, arg);
    t->cb.get = cb;
    return timed_sent(t, s->ops->forget(s->impl, key, timed_get, t));
}

store_status_t store_queue_submit(store_t *s, struct store_queue_op *op)
{
    return s->ops->queue ? s->ops->queue(s->impl, op) : STORE_ERR_STATEMENT;
}

store_status_t store_count_unknown(store_t *s, store_count_cb cb, void *arg)
{
    if (!s->ops->count_unknown)
        return STORE_ERR_STATEMENT;
    if (!s->stats)
        return s->ops->count_unknown(s->impl, cb, arg);
    timed_t *t = timed_new(s, STATS_STORE_COUNT, arg);
    t->cb.count = cb;
    return timed_sent(t, s->ops->count_unknown(s->impl, timed_count, t));
}
