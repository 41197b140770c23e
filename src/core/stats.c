/* Duration histograms for /metrics (see include/stats.h). */
#include "stats.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

const uint64_t stats_bucket_le_ms[STATS_BUCKETS - 1] = {5,   10,   25,   50,   100,  250,
                                                        500, 1000, 2500, 5000, 10000};

const char *const stats_outcome_names[STATS_OUT_N] = {
    [STATS_OUT_FORWARDED] = "forwarded", [STATS_OUT_EXECUTED] = "executed",
    [STATS_OUT_REPLAY] = "replay",       [STATS_OUT_IN_PROGRESS] = "in_progress",
    [STATS_OUT_UNKNOWN] = "unknown",     [STATS_OUT_REFUSED] = "refused",
    [STATS_OUT_OTHER] = "other",
};

const char *const stats_store_op_names[STATS_STORE_N] = {
    [STATS_STORE_CLAIM] = "claim",
    [STATS_STORE_FINISH] = "finish",
    [STATS_STORE_GET] = "get",
    [STATS_STORE_DUP] = "dup",
    [STATS_STORE_EXTEND] = "extend",
    [STATS_STORE_RELEASE] = "release",
    [STATS_STORE_FORGET] = "forget",
    [STATS_STORE_SWEEP] = "sweep",
    [STATS_STORE_COUNT] = "count_unknown",
};

const uint64_t stats_store_bucket_le_us[STATS_BUCKETS - 1] = {
    250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 1000000};

static int bucket_of(const uint64_t *le, uint64_t v)
{
    int b = 0;
    while (b < STATS_BUCKETS - 1 && v > le[b])
        b++;
    return b;
}

static int bucket(uint64_t ms)
{
    return bucket_of(stats_bucket_le_ms, ms);
}

stats_outcome_t stats_outcome_of(const char *outcome)
{
    for (int i = 0; i < STATS_OUT_OTHER; i++)
        if (outcome && strcmp(outcome, stats_outcome_names[i]) == 0)
            return (stats_outcome_t)i;
    return STATS_OUT_OTHER;
}

void stats_observe_request(server_stats_t *s, const char *server, const char *outcome, uint64_t ms)
{
    stats_outcome_t o = stats_outcome_of(outcome);
    int b = bucket(ms);
    s->request_buckets[o][b]++;
    s->request_ms[o] += ms;
    s->request_count[o]++;
    stats_server_t *v = stats_server(s, server);
    if (v) {
        v->request_buckets[o][b]++;
        v->request_ms[o] += ms;
        v->request_count[o]++;
    }
}

void stats_upstream_error(server_stats_t *s, const char *server)
{
    s->upstream_errors++;
    stats_server_t *v = stats_server(s, server);
    if (v)
        v->upstream_errors++;
}

void stats_observe_upstream(server_stats_t *s, uint64_t ms)
{
    s->upstream_buckets[bucket(ms)]++;
    s->upstream_ms += ms;
    s->upstream_count++;
}

void stats_observe_store(server_stats_t *s, stats_store_op_t op, uint64_t us)
{
    s->store_op_buckets[op][bucket_of(stats_store_bucket_le_us, us)]++;
    s->store_op_us[op] += us;
    s->store_op_count[op]++;
}

uint64_t stats_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

void stats_observe_store_since(server_stats_t *s, stats_store_op_t op, uint64_t start_us)
{
    uint64_t end = stats_now_us();
    stats_observe_store(s, op, end > start_us ? end - start_us : 0);
}

static stats_tool_t *claim_slot(stats_tool_t *t, const char *server, const char *name)
{
    snprintf(t->name, sizeof(t->name), "%s", name);
    snprintf(t->server, sizeof(t->server), "%s", server);
    __atomic_store_n(&t->used, 1, __ATOMIC_RELEASE);
    return t;
}

/* The last slot: every name past the cap, under one label whatever its server. */
static stats_tool_t *tool_overflow(server_stats_t *s, const char *server)
{
    stats_tool_t *t = &s->tools[STATS_TOOLS - 1];
    return t->used ? t : claim_slot(t, *server ? STATS_OTHER_SERVER : "", STATS_OTHER_TOOL);
}

stats_tool_t *stats_tool(server_stats_t *s, const char *server, const char *name, bool known)
{
    const char *sv = server ? server : "";
    if (strlen(sv) >= STATS_SERVER_NAME)
        return tool_overflow(s, STATS_OTHER_SERVER);
    if (!known || !name || strlen(name) >= STATS_TOOL_NAME) {
        if (!*sv)
            return tool_overflow(s, sv); /* the one upstream's others: the last slot, as ever */
        name = STATS_OTHER_TOOL;         /* a server's others: a slot of its own */
    }
    for (int i = 0; i < STATS_TOOLS - 1; i++) {
        stats_tool_t *t = &s->tools[i];
        if (!t->used)
            return claim_slot(t, sv, name);
        if (strcmp(t->name, name) == 0 && strcmp(t->server, sv) == 0)
            return t;
    }
    return tool_overflow(s, sv);
}

static stats_server_t *claim_server(stats_server_t *v, const char *name)
{
    snprintf(v->name, sizeof(v->name), "%s", name);
    __atomic_store_n(&v->used, 1, __ATOMIC_RELEASE);
    return v;
}

stats_server_t *stats_server(server_stats_t *s, const char *name)
{
    if (!name || !*name)
        return NULL;
    bool fits = strlen(name) < STATS_SERVER_NAME;
    for (int i = 0; fits && i < STATS_SERVERS - 1; i++) {
        stats_server_t *v = &s->servers[i];
        if (!v->used)
            return claim_server(v, name);
        if (strcmp(v->name, name) == 0)
            return v;
    }
    stats_server_t *last = &s->servers[STATS_SERVERS - 1];
    return last->used ? last : claim_server(last, STATS_OTHER_SERVER);
}
