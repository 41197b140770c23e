/* The commit delay's policy (store_delay.h).
 *
 * Every commit of a claim costs about the same whatever it carries: on the embedded store its
 * transaction's begin, commit, file locks, -wal write and fsync, and the writer thread's
 * wake-up and the loop's; on Postgres a statement, a commit and its WAL flush, a backend's
 * wake-up. Under concurrency each claim still goes almost alone, because the store is free most
 * of the time, so with many calls in flight most of the store's CPU goes to commits of one or
 * two calls. Holding a claim a little lets the calls in flight answer and their agents' next
 * claims join it.
 *
 * The hold must not leave the server behind the gateway idle, or the calls it saves CPU for
 * would queue behind it instead. So it is at most an eighth of the time the calls now open take
 * to finish at the pace finishes came in recently, and only with at least eight open beside the
 * claim: one agent calling in turn, or a few whose calls the server answers as they come, are
 * never held; many calls queued at a busy server are held up to the whole delay.
 *
 * The counts are the backend's own, of one process: a claim that acquired its key opens one, a
 * finish or release closes one. A call that ends with neither (the process stops first) leaves
 * the count high until the store closes, which can only hold a later claim when it need not. */
#include "store_delay.h"

#include <time.h>

#define SIBLINGS 8            /* open claims beside a new one before it may be held */
#define SLACK_SHARE 8         /* the hold: at most this fraction of the open calls' time */
#define WAIT_MIN_US 50        /* a shorter hold is not worth a timer */
#define PACE_WINDOW_US 100000 /* finishes are counted over this long at least */

uint64_t store_delay_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

void store_pace_note(store_pace_t *p, int opened, int closed, uint64_t now_us)
{
    p->open_claims += opened;
    p->open_claims = p->open_claims > closed ? p->open_claims - closed : 0;
    p->finishes += (uint64_t)closed;
    if (p->since_us == 0) {
        p->since_us = now_us;
    } else if (now_us - p->since_us >= PACE_WINDOW_US) {
        p->finishes_per_us = (double)p->finishes / (double)(now_us - p->since_us);
        p->since_us = now_us;
        p->finishes = 0;
    }
}

uint64_t store_delay_cap_us(uint64_t delay_us, uint64_t timeout_ms)
{
    uint64_t quarter = timeout_ms * 1000u / 4;
    return delay_us < quarter ? delay_us : quarter;
}

uint64_t store_delay_wait_us(uint64_t delay_us, int open_claims, double finishes_per_us)
{
    if (delay_us == 0 || open_claims < SIBLINGS || !(finishes_per_us > 0))
        return 0;
    double slack = (double)open_claims / finishes_per_us / SLACK_SHARE;
    uint64_t w = slack < (double)delay_us ? (uint64_t)slack : delay_us;
    return w < WAIT_MIN_US ? 0 : w;
}
