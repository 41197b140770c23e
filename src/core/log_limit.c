/* Rate limits for log lines of one source (see include/log_limit.h). */
#include "log_limit.h"

#define MILLI 1000u

void log_limit_init(log_limit_t *l, uint32_t rate, uint32_t burst, uint64_t now_ms)
{
    l->rate = rate ? rate : 1;
    l->burst = burst ? burst : 1;
    l->credit = (uint64_t)l->burst * MILLI;
    l->last_ms = now_ms;
    l->suppressed = 0;
}

bool log_limit_take(log_limit_t *l, uint64_t now_ms, uint64_t *held)
{
    uint64_t cap = (uint64_t)l->burst * MILLI;
    if (now_ms > l->last_ms) {
        /* rate lines a second are rate thousandths of a line each ms; a quiet spell long
         * enough to fill the bucket fills it, without a product that could overflow */
        uint64_t elapsed = now_ms - l->last_ms;
        uint64_t gain = elapsed > cap / l->rate ? cap : elapsed * l->rate;
        l->credit = l->credit + gain >= cap ? cap : l->credit + gain;
        l->last_ms = now_ms;
    }
    if (l->credit < MILLI) {
        l->suppressed++;
        return false;
    }
    l->credit -= MILLI;
    if (held)
        *held = log_limit_flush(l);
    return true;
}

uint64_t log_limit_flush(log_limit_t *l)
{
    uint64_t n = l->suppressed;
    l->suppressed = 0;
    return n;
}
