/* The commit delay's policy (store.commit_delay), shared by the backends: how long a claim may
 * be held for company, from the claims open and the recent pace of finishes. The embedded
 * store holds a write transaction (store_sqlite_delay.c), Postgres the head of its queue before
 * a batch claim statement (store_pg.c, with store.group_commit). */
#ifndef IDEMGW_STORE_DELAY_H
#define IDEMGW_STORE_DELAY_H

#include <stdint.h>

/* The claims open and the pace of finishes, as one thread of a backend sees them. */
typedef struct store_pace {
    int open_claims;        /* claims acquired, their calls not yet finished or released */
    uint64_t since_us;      /* the window's start (0: none yet) */
    uint64_t finishes;      /* finishes in the window so far */
    double finishes_per_us; /* over the last whole window; 0: not known yet */
} store_pace_t;

/* Counts claims opened and calls closed (finished or released) at now_us, and the pace once a
 * window of at least 100 ms is over. */
void store_pace_note(store_pace_t *p, int opened, int closed, uint64_t now_us);

/* How long to hold a claim, in microseconds (0: not at all): never with fewer than eight
 * claims open beside it or an unknown pace; else an eighth of the time the open calls take to
 * finish at that pace, at most delay_us, and nothing under 50 us. The backends hold only a
 * claim that finds the store idle (nothing queued as the last commit ended, no claim in
 * flight): a store kept busy batches by itself. */
uint64_t store_delay_wait_us(uint64_t delay_us, int open_claims, double finishes_per_us);

/* The longest hold a backend allows: the delay, and at most a quarter of its operations'
 * deadline (store.timeout), so a held claim is answered in time. */
uint64_t store_delay_cap_us(uint64_t delay_us, uint64_t timeout_ms);

/* CLOCK_MONOTONIC in microseconds. */
uint64_t store_delay_now_us(void);

#endif
