/* Which layer retried (see include/dupsource.h). */
#include "dupsource.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static const char *const names[DUP_SOURCE_N] = {
    [DUP_RECONNECT] = "reconnect", [DUP_TRANSPORT] = "transport", [DUP_HARNESS] = "harness",
    [DUP_MODEL] = "model",         [DUP_LATE] = "late",
};

const char *dup_source_name(dup_source_t s)
{
    return (unsigned)s < DUP_SOURCE_N ? names[s] : "?";
}

static bool same(const char *a, const char *b)
{
    return a && b && strcmp(a, b) == 0;
}

/* The last gap is a step of a retry policy's backoff after the one before: the same (fixed
 * delay, with jitter) or up to four times it (exponential, factor 2, with jitter). */
static bool backoff_step(uint64_t last, uint64_t before)
{
    return last && before && 3 * last >= 2 * before && last <= 4 * before;
}

dup_source_t dup_source(const dup_facts_t *f, const dup_thresholds_t *t)
{
    bool sessions = f->first_session || f->session;
    if (f->first_session && !same(f->first_session, f->session))
        return DUP_RECONNECT;
    if (f->first_client && f->client && !same(f->first_client, f->client))
        return DUP_RECONNECT;
    if (same(f->first_id, f->id))
        return !sessions && f->gap_ms >= t->harness_ms ? DUP_RECONNECT : DUP_TRANSPORT;
    if ((f->first_running || f->first_unread) && f->gap_ms < t->model_ms)
        return DUP_HARNESS;
    if (f->gap_ms < t->harness_ms || (f->last_gap_ms && f->last_gap_ms < t->harness_ms))
        return DUP_HARNESS;
    if (backoff_step(f->last_gap_ms, f->step_ms) && f->gap_ms < t->model_ms)
        return DUP_HARNESS;
    if (f->gap_ms < t->model_ms)
        return DUP_MODEL;
    return DUP_LATE;
}

uint64_t dup_parse_time_ms(const char *iso)
{
    struct tm tm = {0};
    unsigned ms = 0;
    int n = 0;
    if (!iso || sscanf(iso, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                       &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &n) != 6)
        return 0;
    const char *rest = iso + n;
    if (*rest == '.') {
        unsigned scale = 100;
        for (rest++; *rest >= '0' && *rest <= '9'; rest++, scale /= 10)
            ms += (unsigned)(*rest - '0') * scale;
    }
    if (*rest != 'Z' && *rest != '\0')
        return 0;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    time_t secs = timegm(&tm);
    return secs < 0 ? 0 : (uint64_t)secs * 1000 + ms;
}
