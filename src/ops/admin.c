#include "admin.h"
#include "admin_keys.h"
#include "store_queue.h"
#include "upstream_stdio.h"
#include "policy.h"
#include "store.h"
#include "upstream_http.h"
#include "util.h"

#include <event2/buffer.h>
#include <jansson.h>
#include <llhttp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One server's part of a readiness probe. */
typedef struct ready_server {
    struct ready_probe *probe;
    char *name; /* a copy (a reload may free the configuration first); NULL: the one upstream */
    bool up;    /* its upstream's probe connected (a stdio server is always up) */
} ready_server_t;

typedef struct ready_probe {
    const admin_ctx_t *ctx;
    http_conn_t *conn; /* NULL once the agent has gone */
    bool keep_alive;
    ready_server_t *servers; /* as ctx->servers was when the probe began */
    size_t n;
    size_t waiting; /* upstream probes still out, and one for the start */
} ready_probe_t;

/* The key the store probe reads: no key has this form (keys have three ':'-separated parts). */
#define READY_PROBE_KEY "idemgw-readyz"

static void probe_gone(void *arg)
{
    ((ready_probe_t *)arg)->conn = NULL;
}

static void probe_free(ready_probe_t *p)
{
    for (size_t i = 0; i < p->n; i++)
        free(p->servers[i].name);
    free(p->servers);
    free(p);
}

/* Under servers: each server's state and the names of those down:
 * "servers":{NAME:"up"|"down",...},"servers_down":[NAME,...], */
static void servers_status(struct evbuffer *b, const ready_probe_t *p)
{
    json_t *all = json_object(), *down = json_array();
    for (size_t i = 0; i < p->n; i++) {
        const ready_server_t *rs = &p->servers[i];
        json_object_set_new(all, rs->name, json_string(rs->up ? "up" : "down"));
        if (!rs->up)
            json_array_append_new(down, json_string(rs->name));
    }
    char *a = json_dumps(all, JSON_COMPACT | JSON_PRESERVE_ORDER);
    char *d = json_dumps(down, JSON_COMPACT);
    evbuffer_add_printf(b, "\"servers\":%s,\"servers_down\":%s,", a ? a : "{}", d ? d : "[]");
    free(a);
    free(d);
    json_decref(all);
    json_decref(down);
}

/* With several workers each has its own store connections. The admin's worker reads its own
 * store; another's readiness is what that worker last published (store.c). Returns the number
 * (from 1) of a worker whose store is not up, or 0. */
static int worker_store_down(const admin_ctx_t *ctx)
{
    for (int w = 1; ctx->all_stats && w < ctx->n_workers; w++)
        if (!ctx->all_stats[w].store_present || !ctx->all_stats[w].store_up)
            return w + 1;
    return 0;
}

/* down_worker: 0, or the worker whose store is down while this one's answered */
static void probe_answer(ready_probe_t *p, bool store_ok, int down_worker)
{
    const admin_ctx_t *ctx = p->ctx;
    bool draining = ctx->draining && *ctx->draining;
    bool named = p->n > 0 && p->servers[0].name;
    size_t up = 0;
    for (size_t i = 0; i < p->n; i++)
        up += p->servers[i].up;
    /* one upstream: it must be up; under servers: one server up serves its calls */
    bool upstream_ok = named ? up > 0 : up == p->n;
    if (p->conn) {
        char why[1000] = "";
        bool ready = upstream_ok && store_ok && !draining;
        if (down_worker)
            snprintf(why, sizeof(why), "worker %d of %d is not connected to the store", down_worker,
                     ctx->n_workers);
        else if (!store_ok)
            store_down_reason(ctx->store, why, sizeof(why));
        /* the reason names a path: escaped as JSON (left out when it is not UTF-8) */
        json_t *why_str = why[0] ? json_string(why) : NULL;
        char *why_json = why_str ? json_dumps(why_str, JSON_ENCODE_ANY) : NULL;
        json_decref(why_str);
        struct evbuffer *b = evbuffer_new();
        evbuffer_add_printf(b, "{\"ready\":%s,\"upstream\":%s,\"store\":\"%s\",",
                            ready ? "true" : "false", up == p->n ? "true" : "false",
                            !ctx->store && ctx->store_missing
                                ? "not configured, but the policy needs one"
                            : !ctx->store ? "not configured"
                            : store_ok    ? "up"
                                          : "down");
        if (why_json)
            evbuffer_add_printf(b, "\"store_reason\":%s,", why_json);
        if (named)
            servers_status(b, p);
        evbuffer_add_printf(b, "\"draining\":%s}\n", draining ? "true" : "false");
        free(why_json);
        int status = ready ? 200 : 503;
        http_conn_set_observer(p->conn, NULL, NULL, NULL);
        http_conn_respond(p->conn, status, "application/json", (const char *)evbuffer_pullup(b, -1),
                          evbuffer_get_length(b), NULL, p->keep_alive);
        evbuffer_free(b);
    }
    probe_free(p);
}

static void probe_store_done(store_status_t st, const store_row_t *row, void *arg)
{
    (void)row;
    ready_probe_t *p = arg;
    int down_worker = st == STORE_OK ? worker_store_down(p->ctx) : 0;
    probe_answer(p, st == STORE_OK && !down_worker, down_worker);
}

/* The store is ready when a read of the key table answers within the store's deadline: a
 * connected store whose table is locked, or whose server stalls, is not. */
static void probe_store(ready_probe_t *p)
{
    store_t *store = p->ctx->store;
    if (!store) {
        probe_answer(p, !p->ctx->store_missing, 0);
        return;
    }
    if (!store_ready(store) || store_get(store, READY_PROBE_KEY, probe_store_done, p) != STORE_OK)
        probe_answer(p, false, 0);
}

/* One upstream's probe is in (or the start is done): the store is read once all are. */
static void upstream_probed(ready_probe_t *p)
{
    if (--p->waiting == 0)
        probe_store(p);
}

static void server_probed(bool ok, void *arg)
{
    ready_server_t *rs = arg;
    rs->up = ok;
    upstream_probed(rs->probe);
}

/* Probes every HTTP upstream at once (a TCP connect, and the TLS handshake for https), then
 * reads the store, then answers. */
static void ready_start(const admin_ctx_t *ctx, http_conn_t *conn, bool keep_alive)
{
    ready_probe_t *p = xcalloc(1, sizeof(*p));
    p->ctx = ctx;
    p->conn = conn;
    p->keep_alive = keep_alive;
    p->n = ctx->n_servers;
    p->servers = xcalloc(p->n ? p->n : 1, sizeof(*p->servers));
    p->waiting = 1; /* the start's own: no answer before every probe has begun */
    http_conn_set_observer(conn, NULL, probe_gone, p);
    for (size_t i = 0; i < p->n; i++) {
        const admin_server_t *sv = &ctx->servers[i];
        ready_server_t *rs = &p->servers[i];
        rs->probe = p;
        rs->name = sv->name ? xstrdup(sv->name) : NULL;
        rs->up = true; /* a stdio server: nothing to connect to */
        if (sv->pool) {
            p->waiting++;
            upstream_probe(sv->pool, server_probed, rs);
        }
    }
    upstream_probed(p);
}

/* One Prometheus histogram series: cumulative buckets in seconds, the sum, the count. labels
 * is "" or "name=\"value\"," (ending in a comma); le holds the STATS_BUCKETS - 1 finite
 * bounds and sum the total, both in units of 1/per_second seconds. */
static void histogram_in(struct evbuffer *b, const char *name, const char *labels,
                         const uint64_t *le, double per_second, const uint64_t *buckets,
                         uint64_t sum, uint64_t count)
{
    uint64_t cum = 0;
    for (int i = 0; i < STATS_BUCKETS; i++) {
        cum += buckets[i];
        if (i < STATS_BUCKETS - 1)
            evbuffer_add_printf(b, "%s_bucket{%sle=\"%g\"} %llu\n", name, labels,
                                (double)le[i] / per_second, (unsigned long long)cum);
        else
            evbuffer_add_printf(b, "%s_bucket{%sle=\"+Inf\"} %llu\n", name, labels,
                                (unsigned long long)cum);
    }
    size_t l = strlen(labels);
    evbuffer_add_printf(b, "%s_sum%s%.*s%s %.6f\n%s_count%s%.*s%s %llu\n", name, l ? "{" : "",
                        (int)(l ? l - 1 : 0), labels, l ? "}" : "", (double)sum / per_second, name,
                        l ? "{" : "", (int)(l ? l - 1 : 0), labels, l ? "}" : "",
                        (unsigned long long)count);
}

static void histogram(struct evbuffer *b, const char *name, const char *labels,
                      const uint64_t *buckets, uint64_t sum_ms, uint64_t count)
{
    histogram_in(b, name, labels, stats_bucket_le_ms, 1e3, buckets, sum_ms, count);
}

/* Adds a worker's tool table to the sum's, by server and name. */
static void merge_tools(server_stats_t *sum, const server_stats_t *w)
{
    for (int i = 0; i < STATS_TOOLS; i++) {
        const stats_tool_t *from = &w->tools[i];
        if (!__atomic_load_n(&from->used, __ATOMIC_ACQUIRE))
            continue;
        char name[STATS_TOOL_NAME], server[STATS_SERVER_NAME];
        snprintf(name, sizeof(name), "%s", from->name);
        snprintf(server, sizeof(server), "%s", from->server);
        stats_tool_t *to = stats_tool(sum, server, name, strcmp(name, STATS_OTHER_TOOL) != 0);
        to->cls = from->cls;
        for (int o = 0; o < STATS_OUT_N; o++)
            to->calls[o] += from->calls[o];
        for (int d = 0; d < DUP_SOURCE_N; d++)
            to->duplicates[d] += from->duplicates[d];
    }
}

/* Adds a worker's per-server request histograms to the sum's, by name. */
static void merge_servers(server_stats_t *sum, const server_stats_t *w)
{
    for (int i = 0; i < STATS_SERVERS; i++) {
        const stats_server_t *from = &w->servers[i];
        if (!__atomic_load_n(&from->used, __ATOMIC_ACQUIRE))
            continue;
        char name[STATS_SERVER_NAME];
        snprintf(name, sizeof(name), "%s", from->name);
        stats_server_t *to = stats_server(sum, name);
        for (int o = 0; o < STATS_OUT_N; o++) {
            for (int b = 0; b < STATS_BUCKETS; b++)
                to->request_buckets[o][b] += from->request_buckets[o][b];
            to->request_ms[o] += from->request_ms[o];
            to->request_count[o] += from->request_count[o];
        }
        to->upstream_errors += from->upstream_errors;
    }
}

/* A label value in the text format: backslash, quote and newline escaped. */
static void label_value(char *out, size_t outlen, const char *v)
{
    size_t o = 0;
    for (; *v && o + 3 < outlen; v++) {
        if (*v == '\\' || *v == '"')
            out[o++] = '\\';
        if (*v == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
            continue;
        }
        out[o++] = *v;
    }
    out[o] = '\0';
}

/* The server label of a series ("server=\"NAME\"," under servers:, else ""), into out. */
static void server_label(char *out, size_t outlen, const char *server)
{
    char v[2 * STATS_SERVER_NAME];
    label_value(v, sizeof(v), server ? server : "");
    snprintf(out, outlen, "%s%s%s", v[0] ? "server=\"" : "", v, v[0] ? "\"," : "");
}

/* Per tool: calls by class and outcome, duplicates by source (only the series with counts);
 * under servers: by server too. */
static void tool_series(struct evbuffer *b, const server_stats_t *s)
{
    evbuffer_add_printf(b, "# HELP idemgw_tool_calls_total Tool calls by server (under "
                           "servers:), tool (the policy's and the server's; others as _other), "
                           "class and outcome.\n"
                           "# TYPE idemgw_tool_calls_total counter\n");
    for (int i = 0; i < STATS_TOOLS; i++) {
        const stats_tool_t *t = &s->tools[i];
        char name[2 * STATS_TOOL_NAME], server[2 * STATS_SERVER_NAME + 16];
        label_value(name, sizeof(name), t->name);
        server_label(server, sizeof(server), t->server);
        for (int o = 0; t->used && o < STATS_OUT_N; o++)
            if (t->calls[o])
                evbuffer_add_printf(b,
                                    "idemgw_tool_calls_total{%stool=\"%s\",class=\"%s\","
                                    "outcome=\"%s\"} %llu\n",
                                    server, name,
                                    strcmp(t->name, STATS_OTHER_TOOL) == 0
                                        ? "mixed"
                                        : tool_class_name((tool_class_t)t->cls),
                                    stats_outcome_names[o], (unsigned long long)t->calls[o]);
    }
    evbuffer_add_printf(b, "# HELP idemgw_duplicates_total Duplicate protected calls (replayed, "
                           "answered in progress or unknown), by server (under servers:), tool "
                           "and the layer that most likely retried.\n"
                           "# TYPE idemgw_duplicates_total counter\n");
    for (int i = 0; i < STATS_TOOLS; i++) {
        const stats_tool_t *t = &s->tools[i];
        char name[2 * STATS_TOOL_NAME], server[2 * STATS_SERVER_NAME + 16];
        label_value(name, sizeof(name), t->name);
        server_label(server, sizeof(server), t->server);
        for (int d = 0; t->used && d < DUP_SOURCE_N; d++)
            if (t->duplicates[d])
                evbuffer_add_printf(
                    b, "idemgw_duplicates_total{%stool=\"%s\",source=\"%s\"} %llu\n", server, name,
                    dup_source_name((dup_source_t)d), (unsigned long long)t->duplicates[d]);
    }
}

/* Calls each for every server slot in use (under servers:), with its `server="NAME",` label;
 * false when there is none (the one-upstream form). */
static bool each_server(struct evbuffer *b, const server_stats_t *s,
                        void (*each)(struct evbuffer *b, const char *label,
                                     const stats_server_t *v))
{
    bool named = false;
    for (int i = 0; i < STATS_SERVERS; i++) {
        const stats_server_t *v = &s->servers[i];
        if (!v->used)
            continue;
        named = true;
        char label[2 * STATS_SERVER_NAME + 16];
        server_label(label, sizeof(label), v->name);
        each(b, label, v);
    }
    return named;
}

static void server_request_histograms(struct evbuffer *b, const char *server,
                                      const stats_server_t *v)
{
    for (int o = 0; o < STATS_OUT_N; o++) {
        char labels[3 * STATS_SERVER_NAME];
        snprintf(labels, sizeof(labels), "%soutcome=\"%s\",", server, stats_outcome_names[o]);
        histogram(b, "idemgw_request_duration_seconds", labels, v->request_buckets[o],
                  v->request_ms[o], v->request_count[o]);
    }
}

/* Agent requests' durations by outcome; under servers: by server and outcome, a series set
 * per server (each server's slot is made when its backend opens), never beside the totals,
 * which a sum over the label would then count twice. */
static void request_series(struct evbuffer *b, const server_stats_t *s)
{
    evbuffer_add_printf(b, "# HELP idemgw_request_duration_seconds Agent requests, from the "
                           "request's arrival to its end, by server (under servers:) and "
                           "outcome.\n"
                           "# TYPE idemgw_request_duration_seconds histogram\n");
    if (each_server(b, s, server_request_histograms))
        return;
    for (int o = 0; o < STATS_OUT_N; o++) {
        char labels[64];
        snprintf(labels, sizeof(labels), "outcome=\"%s\",", stats_outcome_names[o]);
        histogram(b, "idemgw_request_duration_seconds", labels, s->request_buckets[o],
                  s->request_ms[o], s->request_count[o]);
    }
}

static void server_upstream_errors(struct evbuffer *b, const char *server,
                                   const stats_server_t *v)
{
    /* the label without its trailing comma */
    evbuffer_add_printf(b, "idemgw_upstream_errors_total{%.*s} %llu\n", (int)strlen(server) - 1,
                        server, (unsigned long long)v->upstream_errors);
}

/* Requests answered 502 or 504: one series, or under servers: one per server (as the request
 * histograms, never beside the total). */
static void upstream_error_series(struct evbuffer *b, const server_stats_t *s)
{
    evbuffer_add_printf(b, "# HELP idemgw_upstream_errors_total Requests answered 502 or 504, by "
                           "server (under servers:).\n"
                           "# TYPE idemgw_upstream_errors_total counter\n");
    if (!each_server(b, s, server_upstream_errors))
        evbuffer_add_printf(b, "idemgw_upstream_errors_total %llu\n",
                            (unsigned long long)s->upstream_errors);
}

static bool same_server(const char *a, const char *b)
{
    return a == b || (a && b && strcmp(a, b) == 0);
}

static bool is_stdio(const admin_server_t *sv)
{
    return sv->upstream && strcmp(sv->upstream->ops->name, "stdio") == 0;
}

/* A stdio server's children, its retired backends' included (a server re-pointed by a reload
 * has both until the old one's last request ends); -1 when no backend of that name is stdio. */
static int children_of(const admin_ctx_t *ctx, const char *name)
{
    int n = -1;
    const admin_server_t *lists[2] = {ctx->servers, ctx->retired};
    size_t counts[2] = {ctx->n_servers, ctx->n_retired};
    for (int l = 0; l < 2; l++)
        for (size_t i = 0; i < counts[l]; i++)
            if (is_stdio(&lists[l][i]) && same_server(lists[l][i].name, name))
                n = (n < 0 ? 0 : n) + upstream_stdio_children(lists[l][i].upstream);
    return n;
}

/* The stdio servers' children: one series without servers:, one per stdio server under it, a
 * removed server's kept until its backend is freed with its last request. */
static void children_series(struct evbuffer *b, const admin_ctx_t *ctx)
{
    bool first = true;
    size_t total = ctx->n_servers + ctx->n_retired;
    for (size_t i = 0; i < total; i++) {
        const admin_server_t *sv =
            i < ctx->n_servers ? &ctx->servers[i] : &ctx->retired[i - ctx->n_servers];
        bool named_before = false; /* one series per name */
        for (size_t j = 0; j < i && !named_before; j++)
            named_before = same_server(
                (j < ctx->n_servers ? &ctx->servers[j] : &ctx->retired[j - ctx->n_servers])->name,
                sv->name);
        int n = named_before ? -1 : children_of(ctx, sv->name);
        if (n < 0)
            continue;
        if (first)
            evbuffer_add_printf(b, "# HELP idemgw_upstream_children Stdio server processes "
                                   "running (spawned and not yet reaped), by server (under "
                                   "servers:).\n# TYPE idemgw_upstream_children gauge\n");
        first = false;
        char server[2 * STATS_SERVER_NAME + 16];
        server_label(server, sizeof(server), sv->name);
        size_t l = strlen(server);
        evbuffer_add_printf(b, "idemgw_upstream_children%s%.*s%s %d\n", l ? "{" : "",
                            (int)(l ? l - 1 : 0), server, l ? "}" : "", n);
    }
}

/* The store's gauges and counters, every worker's added up. */
static void store_series(struct evbuffer *b, const server_stats_t *s)
{
#define GAUGE(name, help, v)                                                                       \
    evbuffer_add_printf(b,                                                                         \
                        "# HELP idemgw_" name " " help "\n# TYPE idemgw_" name                     \
                        " gauge\nidemgw_" name " %llu\n",                                          \
                        (unsigned long long)(v))
    /* up when every worker's store is: a worker without one cannot protect a call */
    GAUGE("store_up", "Whether the store is connected (in every worker).",
          s->store_present && s->store_up == s->store_present ? 1 : 0);
    GAUGE("store_connections", "Store connections ready (Postgres; the SQLite writer).",
          s->store_conns_open);
    GAUGE("store_connections_busy", "Store connections with statements in flight.",
          s->store_conns_busy);
    GAUGE("store_connections_wanted", "Store connections the pools keep open when they can.",
          s->store_conns_wanted);
    GAUGE("store_queued_operations",
          "Store operations waiting for a connection (Postgres) or the writer (SQLite).",
          s->store_queued);
    GAUGE("store_batch_slots",
          "Statements of each kind group commit allows in flight (Postgres; 1 when it is near).",
          s->store_batch_slots);
    GAUGE("protected_calls_in_flight",
          "Protected calls claimed and forwarded whose outcome is not yet recorded.",
          s->protected_in_flight);
#undef GAUGE
    evbuffer_add_printf(
        b,
        "# HELP idemgw_store_connects_total Store connections that became ready (reconnects "
        "included).\n# TYPE idemgw_store_connects_total counter\nidemgw_store_connects_total "
        "%llu\n# HELP idemgw_store_swept_rows_total Expired keys the sweeper deleted.\n# TYPE "
        "idemgw_store_swept_rows_total counter\nidemgw_store_swept_rows_total %llu\n"
        "# HELP idemgw_store_batches_total Store statements that carried several claims or "
        "finishes (Postgres group commit), or write transactions (SQLite, one commit each).\n# TYPE "
        "idemgw_store_batches_total "
        "counter\nidemgw_store_batches_total %llu\n# HELP idemgw_store_batched_operations_total "
        "Calls those batches carried.\n# TYPE idemgw_store_batched_operations_total counter\n"
        "idemgw_store_batched_operations_total %llu\n"
        "# HELP idemgw_store_claims_in_doubt_total Claims whose answer was lost with their "
        "connection (the call not forwarded).\n# TYPE idemgw_store_claims_in_doubt_total "
        "counter\nidemgw_store_claims_in_doubt_total %llu\n"
        "# HELP idemgw_store_claims_in_doubt_released_total Of those, rows that had committed, "
        "released once a connection was back.\n# TYPE "
        "idemgw_store_claims_in_doubt_released_total counter\n"
        "idemgw_store_claims_in_doubt_released_total %llu\n"
        "# HELP idemgw_replay_cache_lookups_total Replay cache lookups of protected calls, by "
        "result.\n# TYPE idemgw_replay_cache_lookups_total counter\n"
        "idemgw_replay_cache_lookups_total{result=\"hit\"} %llu\n"
        "idemgw_replay_cache_lookups_total{result=\"miss\"} %llu\n",
        (unsigned long long)s->store_connects, (unsigned long long)s->store_swept,
        (unsigned long long)s->store_batches, (unsigned long long)s->store_batched,
        (unsigned long long)s->store_in_doubt, (unsigned long long)s->store_in_doubt_released,
        (unsigned long long)s->cache_hits, (unsigned long long)s->cache_misses);
    evbuffer_add_printf(b, "# HELP idemgw_store_operation_duration_seconds Store operations, from "
                           "the call to its answer (queueing included), by operation.\n"
                           "# TYPE idemgw_store_operation_duration_seconds histogram\n");
    for (int o = 0; o < STATS_STORE_N; o++) {
        char labels[64];
        snprintf(labels, sizeof(labels), "op=\"%s\",", stats_store_op_names[o]);
        histogram_in(b, "idemgw_store_operation_duration_seconds", labels, stats_store_bucket_le_us,
                     1e6, s->store_op_buckets[o], s->store_op_us[o], s->store_op_count[o]);
    }
}

/* A scrape waiting for the store's count of unknown keys. */
typedef struct scrape {
    const admin_ctx_t *ctx;
    http_conn_t *conn; /* NULL once the scraper has gone */
    bool keep_alive;
    json_t *queue; /* the operator queue's summary (store_queue.h), or NULL */
} scrape_t;

static void metrics_answer(scrape_t *sc, bool counted, int64_t unknown_keys)
{
    const admin_ctx_t *ctx = sc->ctx;
    if (!sc->conn) {
        json_decref(sc->queue);
        free(sc);
        return;
    }
    server_stats_t *sum = xcalloc(1, sizeof(*sum));
    for (int w = 0; w < ctx->n_workers; w++) {
        const uint64_t *from = (const uint64_t *)&ctx->all_stats[w];
        uint64_t *to = (uint64_t *)sum;
        for (size_t i = 0; i < offsetof(server_stats_t, tools) / sizeof(uint64_t); i++)
            to[i] += from[i];
        merge_tools(sum, &ctx->all_stats[w]);
        merge_servers(sum, &ctx->all_stats[w]);
    }
    const server_stats_t *s = sum;
    struct evbuffer *b = evbuffer_new();
#define COUNTER(name, help, v)                                                                     \
    evbuffer_add_printf(b,                                                                         \
                        "# HELP idemgw_" name " " help "\n# TYPE idemgw_" name                     \
                        " counter\nidemgw_" name " %llu\n",                                        \
                        (unsigned long long)(v))
    COUNTER("connections_total", "Agent connections accepted.", s->connections);
    COUNTER("requests_total", "Agent requests handled.", s->requests);
    COUNTER("forwarded_total", "Requests sent to the upstream.", s->forwarded);
    COUNTER("bad_requests_total", "Requests refused with a 4xx by the gateway.", s->bad_requests);
    COUNTER("protected_calls_total", "Non-idempotent tool calls seen.", s->protected_calls);
    COUNTER("executions_total", "Protected calls the upstream answered with a result.",
            s->executions);
    COUNTER("replays_total", "Protected calls answered from the store.", s->replays);
    COUNTER("cache_replays_total", "Replays answered from the in-process cache.", s->cache_replays);
    COUNTER("in_progress_total", "Duplicates answered while the first call ran.", s->in_progress);
    COUNTER("unknown_total", "Duplicates answered with an unknown outcome.", s->unknown);
    COUNTER("refused_total", "Protected calls refused (no subject, key misuse, store down).",
            s->refused);
    COUNTER("passthrough_total", "Protected calls forwarded unprotected, store down.",
            s->passthrough);
    COUNTER("store_errors_total", "Store calls that failed.", s->store_errors);
    COUNTER("spans_exported_total", "Trace spans the OTLP endpoint took.", s->spans_exported);
    COUNTER("spans_dropped_total",
            "Trace spans dropped: the exporter lagged, was refused, or missed the deadline "
            "at exit.",
            s->spans_dropped);
    COUNTER("upstream_connections_total",
            "Connections opened to an HTTP upstream (a kept-alive one reused is not counted).",
            s->upstream_connects);
#undef COUNTER
    evbuffer_add_printf(b,
                        "# HELP idemgw_open_connections Agent connections open.\n"
                        "# TYPE idemgw_open_connections gauge\nidemgw_open_connections %llu\n",
                        (unsigned long long)s->open_conns);
    store_series(b, s);
    children_series(b, ctx);
    evbuffer_add_printf(b,
                        "# HELP idemgw_upstream_tls_handshakes_total TLS handshakes with an "
                        "https upstream, by whether a session from an earlier connection was "
                        "resumed.\n# TYPE idemgw_upstream_tls_handshakes_total counter\n"
                        "idemgw_upstream_tls_handshakes_total{resumed=\"false\"} %llu\n"
                        "idemgw_upstream_tls_handshakes_total{resumed=\"true\"} %llu\n",
                        (unsigned long long)s->upstream_tls_full,
                        (unsigned long long)s->upstream_tls_resumed);
    /* a count over the whole store (every replica's keys), so no worker sum; left out when
     * the store could not answer */
    evbuffer_add_printf(b, "# HELP idemgw_unknown_keys Keys held with an unknown outcome (every "
                           "replica's), counted in the store at the scrape.\n"
                           "# TYPE idemgw_unknown_keys gauge\n");
    if (counted)
        evbuffer_add_printf(b, "idemgw_unknown_keys %lld\n", (long long)unknown_keys);
    admin_keys_metrics(b, sc->queue);
    tool_series(b, s);
    request_series(b, s);
    upstream_error_series(b, s);
    evbuffer_add_printf(b, "# HELP idemgw_upstream_duration_seconds Requests to the upstream, "
                           "from sending to the end of its answer.\n"
                           "# TYPE idemgw_upstream_duration_seconds histogram\n");
    histogram(b, "idemgw_upstream_duration_seconds", "", s->upstream_buckets, s->upstream_ms,
              s->upstream_count);
    size_t n = evbuffer_get_length(b);
    http_conn_set_observer(sc->conn, NULL, NULL, NULL);
    http_conn_respond(sc->conn, 200, "text/plain; version=0.0.4",
                      (const char *)evbuffer_pullup(b, -1), n, NULL, sc->keep_alive);
    evbuffer_free(b);
    free(sum);
    json_decref(sc->queue);
    free(sc);
}

static void scrape_gone(void *arg)
{
    ((scrape_t *)arg)->conn = NULL;
}

static void unknown_counted(store_status_t st, int64_t n, void *arg)
{
    metrics_answer(arg, st == STORE_OK, n);
}

/* The queue's summary read, the count of unknown keys next. */
static void queue_summarized(store_status_t st, store_queue_answer_t a, const json_t *body,
                             void *arg)
{
    scrape_t *sc = arg;
    if (st == STORE_OK && a == STORE_QUEUE_OK)
        sc->queue = json_incref((json_t *)body);
    if (!sc->conn || store_count_unknown(sc->ctx->store, unknown_counted, sc) != STORE_OK) {
        if (sc->conn)
            http_conn_set_observer(sc->conn, NULL, NULL, NULL);
        metrics_answer(sc, false, 0);
    }
}

/* The count of unknown keys is read from the store now, off every call's path (one
 * statement per scrape, from the worker that serves /metrics); the rest is in memory. */
static void metrics(const admin_ctx_t *ctx, http_conn_t *conn, http_request_t *req)
{
    scrape_t *sc = xcalloc(1, sizeof(*sc));
    sc->ctx = ctx;
    sc->conn = conn;
    sc->keep_alive = req->keep_alive;
    if (!ctx->store || !store_ready(ctx->store)) {
        metrics_answer(sc, false, 0);
        return;
    }
    http_conn_set_observer(conn, NULL, scrape_gone, sc);
    if (store_queue_summary(ctx->store, queue_summarized, sc) != STORE_OK &&
        store_count_unknown(ctx->store, unknown_counted, sc) != STORE_OK) {
        http_conn_set_observer(conn, NULL, NULL, NULL);
        metrics_answer(sc, false, 0);
    }
}

void admin_handle(void *arg, http_conn_t *conn, http_request_t *req)
{
    const admin_ctx_t *ctx = arg;
    if (admin_keys_handle(ctx, conn, req))
        return;
    const char *t = req->target;
    size_t tlen = strcspn(t, "?");
    bool keep = req->keep_alive;
    if (req->method != HTTP_GET) {
        const char *b = "{\"error\":\"method not allowed\"}\n";
        http_conn_respond(conn, 405, "application/json", b, strlen(b), "Allow: GET\r\n", keep);
    } else if (tlen == 8 && strncmp(t, "/healthz", 8) == 0) {
        const char *b = "{\"status\":\"ok\"}\n";
        http_conn_respond(conn, 200, "application/json", b, strlen(b), NULL, keep);
    } else if (tlen == 7 && strncmp(t, "/readyz", 7) == 0) {
        ready_start(ctx, conn, keep);
    } else if (tlen == 8 && strncmp(t, "/metrics", 8) == 0) {
        metrics(ctx, conn, req);
    } else {
        const char *b = "{\"error\":\"not found\"}\n";
        http_conn_respond(conn, 404, "application/json", b, strlen(b), NULL, keep);
    }
    http_request_free(req);
}
