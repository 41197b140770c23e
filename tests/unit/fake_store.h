/* A fake store backend for unit tests (store_from_ops): it records each call and keeps its
 * callback; the test delivers the store's answer itself, when it chooses. Include in one test
 * file, after cmocka.h; reset fs before each test and call fake_store_clear after it. */
#ifndef IDEMGW_TEST_FAKE_STORE_H
#define IDEMGW_TEST_FAKE_STORE_H

#include "store.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

static struct {
    store_status_t fail_next;               /* returned by the next call instead of STORE_OK */
    int claims, finishes, gets, duplicates; /* duplicates: replays recorded */
    int dup_records[STORE_DUP_ANSWERS_];    /* every duplicate recorded, by answer */
    dup_source_t dup_source;                /* the last one's */
    store_claim_cb claim_cb;
    store_finish_cb finish_cb;
    store_get_cb get_cb;
    void *arg;
    char *key, *subject, *result;
    char *finish_key, *get_key; /* what the last finish and get named */
    int64_t fence;              /* the last finish's */
    store_state_t state;
    bool ordered; /* store_orders_finishes says so */
} fs;

static store_status_t fake_claim(void *impl, const store_claim_req_t *req, store_claim_cb cb,
                                 void *arg)
{
    fs.claims++;
    if (fs.fail_next)
        return fs.fail_next;
    free(fs.key);
    free(fs.subject);
    fs.key = xstrdup(req->key);
    fs.subject = xstrdup(req->subject);
    fs.claim_cb = cb;
    fs.arg = arg;
    return STORE_OK;
}
static store_status_t fake_finish(void *impl, const store_finish_req_t *req, store_finish_cb cb,
                                  void *arg)
{
    fs.finishes++;
    if (fs.fail_next)
        return fs.fail_next;
    fs.state = req->state;
    fs.fence = req->fence;
    free(fs.result);
    fs.result = req->result ? xstrndup(req->result, req->result_len) : NULL;
    free(fs.finish_key);
    fs.finish_key = xstrdup(req->key);
    fs.finish_cb = cb;
    fs.arg = arg;
    return STORE_OK;
}
static store_status_t fake_get(void *impl, const char *key, store_get_cb cb, void *arg)
{
    fs.gets++;
    if (fs.fail_next)
        return fs.fail_next;
    free(fs.get_key);
    fs.get_key = xstrdup(key);
    fs.get_cb = cb;
    fs.arg = arg;
    return STORE_OK;
}
static store_status_t fake_record_duplicate(void *impl, const store_dup_t *dup, store_finish_cb cb,
                                            void *arg)
{
    if (dup->answered == STORE_DUP_REPLAY)
        fs.duplicates++;
    fs.dup_records[dup->answered]++;
    fs.dup_source = dup->source;
    return STORE_OK;
}
static int fake_pending_duplicates(const void *impl, const char *key)
{
    return 0;
}
static store_status_t fake_extend_lease(void *impl, const char *key, int64_t fence,
                                        uint64_t lease_ms, store_finish_cb cb, void *arg)
{
    return STORE_OK;
}
static bool fake_ready(const void *impl)
{
    return true;
}
static bool fake_orders_finishes(const void *impl)
{
    return fs.ordered;
}
static void fake_free(void *impl)
{
}

static const store_ops_t fake_ops = {
    .name = "fake",
    .claim = fake_claim,
    .finish = fake_finish,
    .get = fake_get,
    .record_duplicate = fake_record_duplicate,
    .pending_duplicates = fake_pending_duplicates,
    .extend_lease = fake_extend_lease,
    .ready = fake_ready,
    .orders_finishes = fake_orders_finishes,
    .free = fake_free,
};

/* The store answers the last finish, once: a finish never answered leaks what its caller
 * keeps until then. */
static inline void fake_store_finished(store_status_t st, bool fence_matched)
{
    store_finish_cb cb = fs.finish_cb;
    fs.finish_cb = NULL;
    cb(st, fence_matched, fs.arg);
}

/* Frees what the fake kept and forgets every call. */
static inline void fake_store_clear(void)
{
    free(fs.key);
    free(fs.subject);
    free(fs.result);
    free(fs.finish_key);
    free(fs.get_key);
    memset(&fs, 0, sizeof(fs));
}

#endif
