/* A rate limit for log lines from one source that does not answer to the gateway (a stdio
 * server's stderr, a peer that keeps sending what is dropped): a token bucket of `burst` lines,
 * refilled at `rate` lines a second. A line over the limit is not logged but counted, and the
 * count is handed back with the next line let through, for one "N lines suppressed" line
 * before it, or by log_limit_flush when the source ends. One source's flood (tens of
 * thousands of lines a second) then costs a few lines a second of the log, and the log says
 * how much it left out. Pure: the caller gives the time, so it is tested without a clock. */
#ifndef IDEMGW_LOG_LIMIT_H
#define IDEMGW_LOG_LIMIT_H

#include <stdbool.h>
#include <stdint.h>

typedef struct log_limit {
    uint64_t credit;     /* thousandths of a line that may be logged now, at most burst * 1000 */
    uint64_t last_ms;    /* when credit was last topped up (a monotonic clock) */
    uint64_t suppressed; /* lines held back since the last count handed out */
    uint32_t rate;       /* lines a second once the burst is spent */
    uint32_t burst;      /* lines at once */
} log_limit_t;

/* A full bucket at now_ms. rate and burst of 0 are taken as 1. */
void log_limit_init(log_limit_t *l, uint32_t rate, uint32_t burst, uint64_t now_ms);

/* Whether a line of the source may be logged at now_ms (a clock that does not go back). When
 * it may, *held (if not NULL) is set to the lines held back before it, which the caller says
 * first, and the count starts again; 0 when none were. */
bool log_limit_take(log_limit_t *l, uint64_t now_ms, uint64_t *held)
    __attribute__((warn_unused_result));

/* The lines held back and not yet handed out (the source ended: say them now); the count
 * starts again. */
uint64_t log_limit_flush(log_limit_t *l);

#endif
