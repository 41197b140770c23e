/* Group commit's statements in flight (store_int.h; store_pump in store_pg.c sends within them).
 *
 * One claim statement and one finish statement in flight per process makes the largest batches,
 * which is what Postgres's CPU wants when it runs beside the gateway: a claim that arrives while
 * a batch is out waits for it (a round trip and the flush) and goes in the next one. Across a
 * network that wait is mostly wire, and Postgres sits idle meanwhile: with 1 ms between them, 4
 * and 16 agents' first executions went 25 to 30 % slower with group commit than one statement
 * per call (docs/performance.md). So the statements of each kind allowed in flight grow with
 * the distance: one more for every SLOT_ROUND_TRIP_US of the fastest recent claim statement (send
 * to answer: the wire both ways, the statement and its flush), up to the pool's size.
 *
 * The fastest, not a typical one: queueing behind other statements and a busy machine only
 * ever lengthen a round trip, and must not read as distance (smaller batches would then cost a
 * busy Postgres more CPU, as it is busiest). It is kept over the current window of WINDOW_US and
 * the one before, so a database that moved farther away (a failover to another zone) is seen
 * within two windows. Widening waits for MIN_SAMPLES round trips in the two windows: the first
 * statements of a fresh connection, or a lone claim on a loaded machine, are no measure. */
#include "store_int.h"

#define SLOT_ROUND_TRIP_US 500u
#define WINDOW_US 2000000u
#define MIN_SAMPLES 16u

int store_slots_for(uint64_t fastest_us, int pool)
{
    if (fastest_us == UINT64_MAX)
        return 1; /* nothing measured yet */
    uint64_t n = 1 + fastest_us / SLOT_ROUND_TRIP_US;
    if (pool < 1)
        pool = 1;
    return n > (uint64_t)pool ? pool : (int)n;
}

void store_slots_note(store_pg_t *s, uint64_t round_trip_us, uint64_t now_us)
{
    if (s->rt_window_us == 0 || now_us - s->rt_window_us >= 2 * (uint64_t)WINDOW_US) {
        s->rt_fast_prev_us = UINT64_MAX;
        s->rt_prev_n = 0;
        s->rt_fast_us = round_trip_us;
        s->rt_n = 1;
        s->rt_window_us = now_us;
    } else if (now_us - s->rt_window_us >= WINDOW_US) {
        s->rt_fast_prev_us = s->rt_fast_us;
        s->rt_prev_n = s->rt_n;
        s->rt_fast_us = round_trip_us;
        s->rt_n = 1;
        s->rt_window_us = now_us;
    } else {
        if (round_trip_us < s->rt_fast_us)
            s->rt_fast_us = round_trip_us;
        s->rt_n++;
    }
    uint64_t fastest = s->rt_fast_us < s->rt_fast_prev_us ? s->rt_fast_us : s->rt_fast_prev_us;
    int slots = store_slots_for(fastest, s->pool_size);
    if (slots < s->batch_slots || s->rt_n + s->rt_prev_n >= MIN_SAMPLES)
        s->batch_slots = slots;
}
