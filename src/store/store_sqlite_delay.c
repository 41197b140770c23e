/* The embedded store's commit delay (store.commit_delay): a write transaction holding a claim
 * waits for company, for as long as store_delay.c's policy allows from the claims open and the
 * pace of finishes the writer counted.
 *
 * Only a batch the writer was idle for is held: ops already queued when the last batch ended
 * have waited for the disk as long as a hold would make them, and go at once (a store kept
 * busy by a fast server batches by itself, and holding there costs calls).
 *
 * The writer thread waits on the queue's condition variable with the mutex released, until the
 * hold is over, the batch is full (SQ_BATCH_MAX) or the store stops. While it waits, queueing
 * an operation does not wake it (that wake-up is part of what is saved) unless the batch is
 * full. The pace and the open claims are the writer's own (only that thread reads or writes
 * them); the claims and finishes are counted as their batch commits. */
#include "store_sqlite_int.h"

#include <errno.h>
#include <time.h>

static bool queue_holds_claim(const store_sqlite_t *s)
{
    for (const sq_op_t *op = s->q_head; op; op = op->next)
        if (op->kind == SQ_CLAIM)
            return true;
    return false;
}

void sq_delay_wait(store_sqlite_t *s)
{
    uint64_t w =
        store_delay_wait_us(s->commit_delay_us, s->pace.open_claims, s->pace.finishes_per_us);
    if (w == 0 || !queue_holds_claim(s))
        return;
    uint64_t end = store_delay_now_us() + w;
    struct timespec until = {.tv_sec = (time_t)(end / 1000000u),
                             .tv_nsec = (long)(end % 1000000u) * 1000};
    s->lingering = true;
    while (!s->stopping && s->q_len < SQ_BATCH_MAX)
        if (pthread_cond_timedwait(&s->cv, &s->mu, &until) == ETIMEDOUT)
            break;
    s->lingering = false;
    s->delayed_transactions++;
}

bool sq_delay_wakes(const store_sqlite_t *s)
{
    return !s->lingering || s->q_len >= SQ_BATCH_MAX;
}

void sq_delay_count(store_sqlite_t *s, const sq_op_t *batch)
{
    if (s->commit_delay_us == 0)
        return;
    int opened = 0, closed = 0;
    for (const sq_op_t *op = batch; op; op = op->next) {
        if (op->status != STORE_OK)
            continue;
        if (op->kind == SQ_CLAIM && op->acquired)
            opened++;
        else if (op->kind == SQ_FINISH || op->kind == SQ_RELEASE)
            closed++;
    }
    store_pace_note(&s->pace, opened, closed, store_delay_now_us());
}
