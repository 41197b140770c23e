/* The embedded store's commit delay (store.commit_delay; store_sqlite_int.h).
 *
 * Every write transaction costs about the same whatever it carries: its begin and commit, the
 * file locks, one write of the -wal and, for a claim, one fsync, and the writer thread's wake-up
 * and the loop's. Under concurrency the writer is free most of the time (an fsync takes a
 * fraction of a millisecond) and takes each claim almost alone, so with many calls in flight
 * the store spends most of its CPU on transactions of one or two operations.
 *
 * With a delay set, a batch holding a claim may wait for more operations to share its commit:
 * the calls in flight answer, their agents send the next ones, and those claims commit
 * together. The wait must not leave the server idle, or the calls it saves CPU for would queue
 * behind it instead: it is at most an eighth of the time the calls now open (claimed and
 * acquired by this process, not yet finished) take to finish at the pace finishes came in
 * recently, and never more than the delay. So one agent calling in turn, or a few whose calls
 * the server answers as they come, wait nothing or next to nothing, and many calls queued at a
 * busy server wait the whole delay. While the writer waits, queueing an operation does not wake
 * it (the wake-up is part of what is saved) unless the batch is full.
 *
 * What it costs: up to the delay on a first execution that arrives while many others run,
 * before the call goes out (the claim is as durable as before). What it saves: transactions,
 * fsyncs and wake-ups per call, which counts where the gateway shares its cores with the server
 * it protects. Off (0) by default.
 *
 * open_claims and the pace are the writer's own (only that thread reads or writes them): a
 * claim that acquired its key opens one, a finish or a release of a key closes one. A call
 * that ends without either (the process stops first) leaves the count high until the store
 * closes, which can only make a later claim wait when it need not. */
#include "store_sqlite_int.h"

#include <errno.h>
#include <time.h>

#define SIBLINGS 8            /* open claims beside a new one before it may wait */
#define SLACK_SHARE 8         /* the wait: at most this fraction of the open calls' time */
#define WAIT_MIN_US 50        /* a shorter wait is not worth the timed sleep */
#define PACE_WINDOW_US 100000 /* finishes are counted over this long at least */

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static bool queue_holds_claim(const store_sqlite_t *s)
{
    for (const sq_op_t *op = s->q_head; op; op = op->next)
        if (op->kind == SQ_CLAIM)
            return true;
    return false;
}

uint64_t sq_delay_wait_us(uint64_t delay_us, int open_claims, double finishes_per_us)
{
    if (delay_us == 0 || open_claims < SIBLINGS || !(finishes_per_us > 0))
        return 0;
    double slack = (double)open_claims / finishes_per_us / SLACK_SHARE;
    uint64_t w = slack < (double)delay_us ? (uint64_t)slack : delay_us;
    return w < WAIT_MIN_US ? 0 : w;
}

void sq_delay_wait(store_sqlite_t *s)
{
    uint64_t w = sq_delay_wait_us(s->commit_delay_us, s->open_claims, s->finishes_per_us);
    if (w == 0 || !queue_holds_claim(s))
        return;
    uint64_t end = now_us() + w;
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
    for (const sq_op_t *op = batch; op; op = op->next) {
        if (op->status != STORE_OK)
            continue;
        if (op->kind == SQ_CLAIM && op->acquired) {
            s->open_claims++;
        } else if (op->kind == SQ_FINISH || op->kind == SQ_RELEASE) {
            if (s->open_claims > 0)
                s->open_claims--;
            s->pace_finishes++;
        }
    }
    uint64_t now = now_us();
    if (s->pace_since_us == 0) {
        s->pace_since_us = now;
    } else if (now - s->pace_since_us >= PACE_WINDOW_US) {
        s->finishes_per_us = (double)s->pace_finishes / (double)(now - s->pace_since_us);
        s->pace_since_us = now;
        s->pace_finishes = 0;
    }
}
