/* The admin endpoints on a real event loop: a scraper or probe on a socketpair through a real
 * http_conn, an upstream listening on loopback for the readiness probe's connect, and a fake
 * store (store_from_ops) whose answers the test sets. Covers /healthz, the refusals (method,
 * path), every reason /readyz gives for not ready, the servers it names down under servers:,
 * and /metrics summing the workers, with and without a server label. */
#include "admin.h"
#include "http_conn.h"
#include "policy.h"
#include "stats.h"
#include "store.h"
#include "upstream_http.h"
#include "util.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

static struct event_base *base;
static struct evconnlistener *up_listener; /* the upstream: accepting is all the probe needs */
static int up_port;
static upstream_limits_t up_limits = {1000, 2000, 2000, 1};
static upstream_pool_t *pool;
static admin_server_t one_upstream[1]; /* without servers: */
static http_limits_t limits = {16384, 65536, 2000, 2000, 2000, 100};
static server_stats_t conn_stats;
static http_context_t conns;
static http_site_t site;
static server_stats_t workers[2];
static bool draining;
static admin_ctx_t admin;

/* --- the fake store: ready or not; get and count answer from the loop as set --- */

static struct {
    bool ready;
    store_status_t refuse; /* returned by a call instead of STORE_OK */
    store_status_t answer; /* the status its callback gets */
    int64_t unknown;       /* the count it answers */
    int gets, counts;      /* calls made */
    int answered;          /* callbacks run */
    char key[64];          /* the key the last get read */
    store_get_cb get_cb;
    store_count_cb count_cb;
    void *arg;
} fs;

static void fake_deliver(evutil_socket_t fd, short what, void *arg)
{
    fs.answered++;
    if (fs.get_cb) {
        store_get_cb cb = fs.get_cb;
        fs.get_cb = NULL;
        cb(fs.answer, NULL, fs.arg);
    } else if (fs.count_cb) {
        store_count_cb cb = fs.count_cb;
        fs.count_cb = NULL;
        cb(fs.answer, fs.answer == STORE_OK ? fs.unknown : 0, fs.arg);
    }
}

static void later(void)
{
    struct timeval zero = {0, 0};
    assert_int_equal(event_base_once(base, -1, EV_TIMEOUT, fake_deliver, NULL, &zero), 0);
}

static store_status_t fake_get(void *impl, const char *key, store_get_cb cb, void *arg)
{
    fs.gets++;
    snprintf(fs.key, sizeof(fs.key), "%s", key);
    if (fs.refuse)
        return fs.refuse;
    fs.get_cb = cb;
    fs.arg = arg;
    later();
    return STORE_OK;
}

static store_status_t fake_count(void *impl, store_count_cb cb, void *arg)
{
    fs.counts++;
    if (fs.refuse)
        return fs.refuse;
    fs.count_cb = cb;
    fs.arg = arg;
    later();
    return STORE_OK;
}

static bool fake_ready(const void *impl)
{
    return fs.ready;
}

static void fake_free(void *impl)
{
}

static const store_ops_t fake_ops = {
    .name = "fake",
    .get = fake_get,
    .count_unknown = fake_count,
    .ready = fake_ready,
    .free = fake_free,
};

/* --- set-up --- */

static int setup(void **state)
{
    base = event_base_new();
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    up_listener = evconnlistener_new_bind(base, NULL, NULL, LEV_OPT_CLOSE_ON_FREE, 16,
                                          (struct sockaddr *)&sin, sizeof(sin));
    assert_non_null(up_listener);
    struct sockaddr_in bound;
    socklen_t bl = sizeof(bound);
    getsockname(evconnlistener_get_fd(up_listener), (struct sockaddr *)&bound, &bl);
    up_port = ntohs(bound.sin_port);
    upstream_opts_t uo = {
        .base = base, .host = "127.0.0.1", .port = (unsigned)up_port, .limits = &up_limits};
    char msg[200];
    pool = upstream_pool_new(&uo, msg, sizeof(msg));
    assert_non_null(pool);
    memset(&fs, 0, sizeof(fs));
    memset(workers, 0, sizeof(workers));
    draining = false;
    one_upstream[0] = (admin_server_t){.pool = pool};
    admin = (admin_ctx_t){.servers = one_upstream,
                          .n_servers = 1,
                          .all_stats = workers,
                          .n_workers = 2,
                          .draining = &draining};
    conns = (http_context_t){.base = base, .limits = &limits, .stats = &conn_stats};
    site = (http_site_t){.ctx = &conns, .handler = admin_handle, .arg = &admin, .name = "admin"};
    return 0;
}

static int teardown(void **state)
{
    for (int i = 0; i < 200 && conns.open > 0; i++)
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    if (admin.store)
        store_free(admin.store);
    upstream_pool_free(pool);
    if (up_listener)
        evconnlistener_free(up_listener);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    return 0;
}

static void with_store(bool ready)
{
    fs.ready = ready;
    admin.store = store_from_ops(&fake_ops, &fs);
    /* the other worker's store, as that worker publishes it */
    workers[1].store_present = 1;
    workers[1].store_up = 1;
}

/* Sends one request (Connection: close) and returns the whole response. */
static char *request(const char *method, const char *target)
{
    int fds[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    evutil_make_socket_nonblocking(fds[0]);
    evutil_make_socket_nonblocking(fds[1]);
    http_conn_accept(NULL, fds[0], NULL, 0, &site);
    char req[512];
    int n =
        snprintf(req, sizeof(req), "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                 method, target);
    assert_int_equal(write(fds[1], req, (size_t)n), n);
    struct evbuffer *got = evbuffer_new();
    for (int i = 0; i < 5000; i++) {
        char buf[4096];
        ssize_t r = read(fds[1], buf, sizeof(buf));
        if (r == 0)
            break;
        if (r > 0) {
            evbuffer_add(got, buf, (size_t)r);
            continue;
        }
        event_base_loop(base, EVLOOP_ONCE);
    }
    close(fds[1]);
    size_t len = evbuffer_get_length(got);
    char *out = xstrndup((const char *)evbuffer_pullup(got, -1), len);
    evbuffer_free(got);
    return out;
}

/* Asserts r is status with body (exactly), and frees r. */
static void expect(char *r, const char *status, const char *body)
{
    if (strncmp(r, status, strlen(status)) != 0)
        fail_msg("want %s, got: %s", status, r);
    const char *b = strstr(r, "\r\n\r\n");
    assert_non_null(b);
    assert_string_equal(b + 4, body);
    free(r);
}

/* --- /healthz and refusals --- */

static void healthz_and_refusals(void **state)
{
    expect(request("GET", "/healthz"), "HTTP/1.1 200", "{\"status\":\"ok\"}\n");
    expect(request("GET", "/healthz?from=k8s"), "HTTP/1.1 200", "{\"status\":\"ok\"}\n");
    char *r = request("POST", "/healthz");
    assert_non_null(strstr(r, "Allow: GET\r\n"));
    expect(r, "HTTP/1.1 405", "{\"error\":\"method not allowed\"}\n");
    expect(request("GET", "/healthzz"), "HTTP/1.1 404", "{\"error\":\"not found\"}\n");
    expect(request("GET", "/"), "HTTP/1.1 404", "{\"error\":\"not found\"}\n");
    expect(request("DELETE", "/nowhere"), "HTTP/1.1 405", "{\"error\":\"method not allowed\"}\n");
    r = request("GET", "/healthz");
    assert_non_null(strstr(r, "Content-Type: application/json\r\n"));
    free(r);
}

/* --- /readyz --- */

static void ready_without_a_store(void **state)
{
    expect(request("GET", "/readyz"), "HTTP/1.1 200",
           "{\"ready\":true,\"upstream\":true,\"store\":\"not configured\",\"draining\":false}\n");
}

static void not_ready_for_each_reason(void **state)
{
    /* the policy protects a tool that must be refused without a store */
    admin.store_missing = true;
    expect(request("GET", "/readyz"), "HTTP/1.1 503",
           "{\"ready\":false,\"upstream\":true,\"store\":\"not configured, but the policy needs "
           "one\",\"draining\":false}\n");
    admin.store_missing = false;

    draining = true;
    expect(request("GET", "/readyz"), "HTTP/1.1 503",
           "{\"ready\":false,\"upstream\":true,\"store\":\"not configured\",\"draining\":true}\n");
    draining = false;

    evconnlistener_free(up_listener); /* connecting to the upstream is refused */
    up_listener = NULL;
    expect(
        request("GET", "/readyz"), "HTTP/1.1 503",
        "{\"ready\":false,\"upstream\":false,\"store\":\"not configured\",\"draining\":false}\n");
}

static void the_store_is_read_to_be_ready(void **state)
{
    with_store(true);
    expect(request("GET", "/readyz"), "HTTP/1.1 200",
           "{\"ready\":true,\"upstream\":true,\"store\":\"up\",\"draining\":false}\n");
    assert_int_equal(fs.gets, 1);
    /* a key no call can have */
    assert_string_equal(fs.key, "idemgw-readyz");

    /* connected, but the read misses its deadline (a locked table) */
    fs.answer = STORE_ERR_UNAVAILABLE;
    expect(request("GET", "/readyz"), "HTTP/1.1 503",
           "{\"ready\":false,\"upstream\":true,\"store\":\"down\",\"draining\":false}\n");
    /* the read is refused at once */
    fs.answer = STORE_OK;
    fs.refuse = STORE_ERR_SHUTDOWN;
    expect(request("GET", "/readyz"), "HTTP/1.1 503",
           "{\"ready\":false,\"upstream\":true,\"store\":\"down\",\"draining\":false}\n");
    assert_int_equal(fs.gets, 3);
    /* not connected: not even asked */
    fs.refuse = STORE_OK;
    fs.ready = false;
    expect(request("GET", "/readyz"), "HTTP/1.1 503",
           "{\"ready\":false,\"upstream\":true,\"store\":\"down\",\"draining\":false}\n");
    assert_int_equal(fs.gets, 3);
}

/* The admin's worker reads its own store; another worker whose store is not up yet (just
 * started, or reconnecting) makes the gateway not ready, since the calls it takes would be
 * refused. */
static void another_workers_store_down_is_not_ready(void **state)
{
    with_store(true);
    workers[1].store_up = 0;
    expect(request("GET", "/readyz"), "HTTP/1.1 503",
           "{\"ready\":false,\"upstream\":true,\"store\":\"down\",\"store_reason\":\"worker 2 "
           "of 2 is not connected to the store\",\"draining\":false}\n");
    /* not published at all yet */
    workers[1].store_present = 0;
    expect(request("GET", "/readyz"), "HTTP/1.1 503",
           "{\"ready\":false,\"upstream\":true,\"store\":\"down\",\"store_reason\":\"worker 2 "
           "of 2 is not connected to the store\",\"draining\":false}\n");
    workers[1].store_present = 1;
    workers[1].store_up = 1;
    expect(request("GET", "/readyz"), "HTTP/1.1 200",
           "{\"ready\":true,\"upstream\":true,\"store\":\"up\",\"draining\":false}\n");
}

/* A probe whose caller leaves before the store answers is dropped quietly. */
static void a_probe_whose_caller_left(void **state)
{
    with_store(true);
    int fds[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    evutil_make_socket_nonblocking(fds[0]);
    http_conn_accept(NULL, fds[0], NULL, 0, &site);
    static const char req[] = "GET /readyz HTTP/1.1\r\nHost: a\r\n\r\n";
    assert_int_equal(write(fds[1], req, sizeof(req) - 1), (ssize_t)(sizeof(req) - 1));
    for (int i = 0; i < 1000 && fs.gets == 0; i++)
        event_base_loop(base, EVLOOP_ONCE);
    assert_int_equal(fs.gets, 1);
    close(fds[1]);
    for (int i = 0; i < 1000 && (fs.answered == 0 || conns.open > 0); i++)
        event_base_loop(base, EVLOOP_ONCE);
    assert_int_equal(fs.answered, 1);
    assert_int_equal(conns.open, 0);
}

/* --- /readyz under servers: --- */

/* A pool to a loopback port nothing listens on: its probe is refused. */
static upstream_pool_t *pool_to_nowhere(void)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    socklen_t sl = sizeof(sin);
    getsockname(fd, (struct sockaddr *)&sin, &sl);
    close(fd);
    upstream_opts_t uo = {
        .base = base, .host = "127.0.0.1", .port = ntohs(sin.sin_port), .limits = &up_limits};
    char msg[200];
    upstream_pool_t *p = upstream_pool_new(&uo, msg, sizeof(msg));
    assert_non_null(p);
    return p;
}

/* One server down fails its own calls only: the gateway stays ready and names it. */
static void readyz_names_the_servers_down(void **state)
{
    upstream_pool_t *gone = pool_to_nowhere();
    admin_server_t servers[] = {
        {.name = "billing", .pool = pool},
        {.name = "crm", .pool = gone},
        {.name = "files"}, /* a stdio server: nothing to connect to */
    };
    admin.servers = servers;
    admin.n_servers = 3;
    expect(request("GET", "/readyz"), "HTTP/1.1 200",
           "{\"ready\":true,\"upstream\":false,\"store\":\"not configured\",\"servers\":{"
           "\"billing\":\"up\",\"crm\":\"down\",\"files\":\"up\"},\"servers_down\":[\"crm\"],"
           "\"draining\":false}\n");

    admin.n_servers = 1; /* billing alone, up */
    expect(request("GET", "/readyz"), "HTTP/1.1 200",
           "{\"ready\":true,\"upstream\":true,\"store\":\"not configured\",\"servers\":{"
           "\"billing\":\"up\"},\"servers_down\":[],\"draining\":false}\n");

    /* every server down: no call can be served */
    servers[0].pool = gone;
    admin.n_servers = 2;
    expect(request("GET", "/readyz"), "HTTP/1.1 503",
           "{\"ready\":false,\"upstream\":false,\"store\":\"not configured\",\"servers\":{"
           "\"billing\":\"down\",\"crm\":\"down\"},\"servers_down\":[\"billing\",\"crm\"],"
           "\"draining\":false}\n");

    /* a server up, but the store down or the process draining: not ready */
    servers[0].pool = pool;
    with_store(false);
    expect(request("GET", "/readyz"), "HTTP/1.1 503",
           "{\"ready\":false,\"upstream\":false,\"store\":\"down\",\"servers\":{"
           "\"billing\":\"up\",\"crm\":\"down\"},\"servers_down\":[\"crm\"],"
           "\"draining\":false}\n");
    fs.ready = true;
    draining = true;
    expect(request("GET", "/readyz"), "HTTP/1.1 503",
           "{\"ready\":false,\"upstream\":false,\"store\":\"up\",\"servers\":{"
           "\"billing\":\"up\",\"crm\":\"down\"},\"servers_down\":[\"crm\"],"
           "\"draining\":true}\n");
    upstream_pool_free(gone);
}

/* A reload replaces the servers while a probe waits for the store: the answer names the
 * servers the probe began with, from copies of its own. */
static void readyz_outlives_a_reload(void **state)
{
    with_store(true);
    admin_server_t *servers = xcalloc(2, sizeof(*servers));
    servers[0] = (admin_server_t){.name = xstrdup("billing"), .pool = pool};
    servers[1] = (admin_server_t){.name = xstrdup("files")};
    admin.servers = servers;
    admin.n_servers = 2;
    int fds[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    evutil_make_socket_nonblocking(fds[0]);
    http_conn_accept(NULL, fds[0], NULL, 0, &site);
    static const char req[] = "GET /readyz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    assert_int_equal(write(fds[1], req, sizeof(req) - 1), (ssize_t)(sizeof(req) - 1));
    for (int i = 0; i < 1000 && fs.gets == 0; i++)
        event_base_loop(base, EVLOOP_ONCE);
    assert_int_equal(fs.gets, 1); /* the upstreams have answered; the store is being read */
    for (size_t i = 0; i < 2; i++)
        free((char *)servers[i].name);
    free(servers);
    admin.servers = one_upstream;
    admin.n_servers = 1;
    for (int i = 0; i < 1000 && fs.answered == 0; i++)
        event_base_loop(base, EVLOOP_ONCE);
    char got[1024];
    size_t n = 0;
    for (int i = 0; i < 1000; i++) {
        ssize_t r = read(fds[1], got + n, sizeof(got) - 1 - n);
        if (r == 0)
            break;
        if (r > 0)
            n += (size_t)r;
        else
            event_base_loop(base, EVLOOP_ONCE);
    }
    got[n] = '\0';
    close(fds[1]);
    const char *body = strstr(got, "\r\n\r\n");
    assert_non_null(body);
    assert_string_equal(body + 4, "{\"ready\":true,\"upstream\":true,\"store\":\"up\",\"servers\":{"
                                  "\"billing\":\"up\",\"files\":\"up\"},\"servers_down\":[],"
                                  "\"draining\":false}\n");
}

/* --- /metrics --- */

/* The line of text that starts with prefix, as a string (freed by the caller), or NULL. */
static char *line_of(const char *text, const char *prefix)
{
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, prefix, strlen(prefix)) == 0)
            return xstrndup(p, strcspn(p, "\n"));
    }
    return NULL;
}

static void expect_line(const char *text, const char *line)
{
    char *got = line_of(text, line);
    if (!got || strcmp(got, line) != 0)
        fail_msg("no line '%s' in the scrape", line);
    free(got);
}

static void metrics_add_up_the_workers(void **state)
{
    with_store(true);
    fs.unknown = 9;
    workers[0].requests = 3;
    workers[1].requests = 4;
    workers[1].spans_dropped = 2;
    stats_upstream_error(&workers[0], NULL);
    stats_upstream_error(&workers[1], NULL);
    workers[0].store_present = workers[1].store_present = 1;
    workers[0].store_up = workers[1].store_up = 1;
    workers[0].upstream_buckets[0] = 2;
    workers[1].upstream_buckets[STATS_BUCKETS - 1] = 3;
    workers[0].upstream_count = 2;
    workers[1].upstream_count = 3;
    workers[0].upstream_ms = 1;
    workers[1].upstream_ms = 1500;
    stats_tool_t *a = stats_tool(&workers[0], NULL, "refund", true);
    a->cls = TOOL_CLASS_NON_IDEMPOTENT;
    a->calls[STATS_OUT_EXECUTED] = 1;
    stats_tool_t *b = stats_tool(&workers[1], NULL, "refund", true);
    b->cls = TOOL_CLASS_NON_IDEMPOTENT;
    b->calls[STATS_OUT_EXECUTED] = 2;
    b->duplicates[0] = 4;
    stats_tool_t *odd = stats_tool(&workers[1], NULL, "we\"ird\\", true);
    odd->cls = TOOL_CLASS_READ;
    odd->calls[STATS_OUT_FORWARDED] = 1;

    char *r = request("GET", "/metrics");
    assert_non_null(strstr(r, "HTTP/1.1 200"));
    assert_non_null(strstr(r, "Content-Type: text/plain; version=0.0.4\r\n"));
    expect_line(r, "idemgw_requests_total 7");
    expect_line(r, "idemgw_spans_dropped_total 2");
    expect_line(r, "idemgw_upstream_errors_total 2");
    expect_line(r, "idemgw_store_up 1");
    expect_line(r, "idemgw_unknown_keys 9");
    char want[256];
    snprintf(want, sizeof(want),
             "idemgw_tool_calls_total{tool=\"refund\",class=\"%s\",outcome=\"executed\"} 3",
             tool_class_name(TOOL_CLASS_NON_IDEMPOTENT));
    expect_line(r, want);
    snprintf(want, sizeof(want), "idemgw_duplicates_total{tool=\"refund\",source=\"%s\"} 4",
             dup_source_name((dup_source_t)0));
    expect_line(r, want);
    /* a label value keeps its quote and backslash escaped */
    snprintf(want, sizeof(want),
             "idemgw_tool_calls_total{tool=\"we\\\"ird\\\\\",class=\"%s\",outcome=\"forwarded\"} 1",
             tool_class_name(TOOL_CLASS_READ));
    expect_line(r, want);
    /* histograms: cumulative buckets, the sum in seconds */
    snprintf(want, sizeof(want), "idemgw_upstream_duration_seconds_bucket{le=\"%g\"} 2",
             (double)stats_bucket_le_ms[0] / 1e3);
    expect_line(r, want);
    expect_line(r, "idemgw_upstream_duration_seconds_bucket{le=\"+Inf\"} 5");
    expect_line(r, "idemgw_upstream_duration_seconds_sum 1.501000");
    expect_line(r, "idemgw_upstream_duration_seconds_count 5");
    /* one upstream: no server label anywhere */
    expect_line(r, "idemgw_request_duration_seconds_count{outcome=\"replay\"} 0");
    assert_null(strstr(r, "server=\""));
    free(r);
    assert_int_equal(fs.counts, 1);

    /* one worker's store down: the store is not up */
    workers[1].store_up = 0;
    r = request("GET", "/metrics");
    expect_line(r, "idemgw_store_up 0");
    free(r);
}

/* Under servers: the same tool on two servers is two series, told apart by the server label;
 * the request histograms and the upstream errors are per server (never the unlabelled totals
 * beside them), a server with no request yet among them. */
static void metrics_by_server(void **state)
{
    admin_server_t servers[] = {{.name = "billing", .pool = pool}, {.name = "crm", .pool = pool}};
    admin.servers = servers;
    admin.n_servers = 2;
    stats_server(&workers[0], "billing");
    stats_server(&workers[0], "crm");
    stats_server(&workers[1], "crm");
    stats_server(&workers[1], "billing");
    stats_server(&workers[1], "idle");
    stats_tool_t *a = stats_tool(&workers[0], "billing", "refund", true);
    a->cls = TOOL_CLASS_NON_IDEMPOTENT;
    a->calls[STATS_OUT_EXECUTED] = 1;
    stats_tool_t *b = stats_tool(&workers[1], "billing", "refund", true);
    b->cls = TOOL_CLASS_NON_IDEMPOTENT;
    b->calls[STATS_OUT_EXECUTED] = 2;
    stats_tool_t *c = stats_tool(&workers[1], "crm", "refund", true);
    c->cls = TOOL_CLASS_NON_IDEMPOTENT;
    c->calls[STATS_OUT_REPLAY] = 1;
    c->duplicates[0] = 1;
    stats_tool(&workers[0], "crm", "mystery", false)->calls[STATS_OUT_FORWARDED] = 1;
    stats_observe_request(&workers[0], "billing", "executed", 3);
    stats_observe_request(&workers[1], "billing", "executed", 30);
    stats_observe_request(&workers[1], "crm", "replay", 1);
    stats_upstream_error(&workers[0], "crm");
    stats_upstream_error(&workers[1], "crm");

    char *r = request("GET", "/metrics");
    const char *ni = tool_class_name(TOOL_CLASS_NON_IDEMPOTENT);
    char want[256];
    snprintf(want, sizeof(want),
             "idemgw_tool_calls_total{server=\"billing\",tool=\"refund\",class=\"%s\","
             "outcome=\"executed\"} 3",
             ni);
    expect_line(r, want);
    snprintf(want, sizeof(want),
             "idemgw_tool_calls_total{server=\"crm\",tool=\"refund\",class=\"%s\","
             "outcome=\"replay\"} 1",
             ni);
    expect_line(r, want);
    snprintf(want, sizeof(want),
             "idemgw_duplicates_total{server=\"crm\",tool=\"refund\",source=\"%s\"} 1",
             dup_source_name((dup_source_t)0));
    expect_line(r, want);
    assert_null(strstr(r, "idemgw_duplicates_total{server=\"billing\""));
    /* a name the server does not list: its own server's _other */
    expect_line(r, "idemgw_tool_calls_total{server=\"crm\",tool=\"_other\",class=\"mixed\","
                   "outcome=\"forwarded\"} 1");
    expect_line(r,
                "idemgw_request_duration_seconds_count{server=\"billing\",outcome=\"executed\"} 2");
    expect_line(r, "idemgw_request_duration_seconds_sum{server=\"billing\",outcome=\"executed\"} "
                   "0.033000");
    snprintf(want, sizeof(want),
             "idemgw_request_duration_seconds_bucket{server=\"billing\",outcome=\"executed\","
             "le=\"%g\"} 1",
             (double)stats_bucket_le_ms[0] / 1e3);
    expect_line(r, want);
    expect_line(r, "idemgw_request_duration_seconds_count{server=\"crm\",outcome=\"replay\"} 1");
    expect_line(r, "idemgw_request_duration_seconds_count{server=\"idle\",outcome=\"replay\"} 0");
    assert_null(strstr(r, "idemgw_request_duration_seconds_count{outcome="));
    /* which server's upstream fails */
    expect_line(r, "idemgw_upstream_errors_total{server=\"crm\"} 2");
    expect_line(r, "idemgw_upstream_errors_total{server=\"billing\"} 0");
    assert_null(strstr(r, "\nidemgw_upstream_errors_total "));
    assert_null(strstr(r, "idemgw_tool_calls_total{tool="));
    free(r);
}

/* The count of unknown keys is left out, not made up, when the store cannot give it. */
static void metrics_without_the_stores_count(void **state)
{
    with_store(true);
    fs.answer = STORE_ERR_UNAVAILABLE;
    char *r = request("GET", "/metrics");
    assert_non_null(strstr(r, "HTTP/1.1 200"));
    assert_non_null(strstr(r, "# TYPE idemgw_unknown_keys gauge\n"));
    assert_null(strstr(r, "\nidemgw_unknown_keys "));
    free(r);
    fs.answer = STORE_OK;
    fs.refuse = STORE_ERR_STATEMENT; /* a backend that cannot count */
    r = request("GET", "/metrics");
    assert_null(strstr(r, "\nidemgw_unknown_keys "));
    free(r);
    fs.refuse = STORE_OK;
    fs.ready = false; /* not asked */
    r = request("GET", "/metrics");
    assert_null(strstr(r, "\nidemgw_unknown_keys "));
    free(r);
    assert_int_equal(fs.counts, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(healthz_and_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(ready_without_a_store, setup, teardown),
        cmocka_unit_test_setup_teardown(not_ready_for_each_reason, setup, teardown),
        cmocka_unit_test_setup_teardown(the_store_is_read_to_be_ready, setup, teardown),
        cmocka_unit_test_setup_teardown(a_probe_whose_caller_left, setup, teardown),
        cmocka_unit_test_setup_teardown(another_workers_store_down_is_not_ready, setup, teardown),
        cmocka_unit_test_setup_teardown(readyz_names_the_servers_down, setup, teardown),
        cmocka_unit_test_setup_teardown(readyz_outlives_a_reload, setup, teardown),
        cmocka_unit_test_setup_teardown(metrics_add_up_the_workers, setup, teardown),
        cmocka_unit_test_setup_teardown(metrics_by_server, setup, teardown),
        cmocka_unit_test_setup_teardown(metrics_without_the_stores_count, setup, teardown),
    };
    return cmocka_run_group_tests_name("admin", tests, NULL, NULL);
}
