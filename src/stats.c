/* Duration histograms for /metrics (see include/stats.h). */
#include "stats.h"

#include <string.h>

const uint64_t stats_bucket_le_ms[STATS_BUCKETS - 1] = {5,   10,   25,   50,   100,  250,
                                                        500, 1000, 2500, 5000, 10000};

const char *const stats_outcome_names[STATS_OUT_N] = {
    [STATS_OUT_FORWARDED] = "forwarded", [STATS_OUT_EXECUTED] = "executed",
    [STATS_OUT_REPLAY] = "replay",       [STATS_OUT_IN_PROGRESS] = "in_progress",
    [STATS_OUT_UNKNOWN] = "unknown",     [STATS_OUT_REFUSED] = "refused",
    [STATS_OUT_OTHER] = "other",
};

static int bucket(uint64_t ms)
{
    int b = 0;
    while (b < STATS_BUCKETS - 1 && ms > stats_bucket_le_ms[b])
        b++;
    return b;
}

void stats_observe_request(server_stats_t *s, const char *outcome, uint64_t ms)
{
    int o = STATS_OUT_OTHER;
    for (int i = 0; i < STATS_OUT_OTHER; i++)
        if (outcome && strcmp(outcome, stats_outcome_names[i]) == 0)
            o = i;
    s->request_buckets[o][bucket(ms)]++;
    s->request_ms[o] += ms;
    s->request_count[o]++;
}

void stats_observe_upstream(server_stats_t *s, uint64_t ms)
{
    s->upstream_buckets[bucket(ms)]++;
    s->upstream_ms += ms;
    s->upstream_count++;
}
