/* Which layer retried (see include/dupsource.h). */
#include "dupsource.h"

#include <stdbool.h>
#include <stdint.h>
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

/* The digits s[0..n) as a number; -1 unless all n are digits. */
static int digits(const char *s, int n)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

/* Days from 1970-01-01 to a date of the proleptic Gregorian calendar (m 1..12): the years are
 * counted from March, so the leap day ends a year, and eras of 400 years repeat. */
static int64_t days_from_civil(int64_t y, int m, int d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* Every row time the stores write has one layout, YYYY-MM-DDTHH:MM:SS[.fff]Z, read here by
 * position (a replay reads one per answer; sscanf and timegm cost as much as the rest of the
 * judgement); anything else goes the general way. */
static bool parse_fixed(const char *iso, uint64_t *out)
{
    if (strlen(iso) < 20 || iso[4] != '-' || iso[7] != '-' || iso[10] != 'T' || iso[13] != ':' ||
        iso[16] != ':')
        return false;
    int y = digits(iso, 4), mo = digits(iso + 5, 2), d = digits(iso + 8, 2);
    int h = digits(iso + 11, 2), mi = digits(iso + 14, 2), sec = digits(iso + 17, 2);
    if (y < 1970 || mo < 1 || mo > 12 || d < 1 || d > 31 || h < 0 || h > 23 || mi < 0 || mi > 59 ||
        sec < 0 || sec > 60)
        return false;
    const char *rest = iso + 19;
    unsigned ms = 0;
    if (*rest == '.') {
        unsigned scale = 100;
        for (rest++; *rest >= '0' && *rest <= '9'; rest++, scale /= 10)
            ms += (unsigned)(*rest - '0') * scale;
    }
    if (rest[0] != 'Z' || rest[1] != '\0')
        return false;
    int64_t secs = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec;
    *out = (uint64_t)secs * 1000 + ms;
    return true;
}

uint64_t dup_parse_time_ms(const char *iso)
{
    uint64_t fixed;
    if (iso && parse_fixed(iso, &fixed))
        return fixed;
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
