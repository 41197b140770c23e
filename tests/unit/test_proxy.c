/* The proxy on a real event loop: an agent on a socketpair through a real http_conn, a real
 * upstream pool towards a small upstream listening on loopback in the same loop, and a fake
 * stage. Covers the refusals the proxy writes itself, forwarding, observers, an answer held
 * past the upstream's end (HOLDING, RECORDING) then released or replaced, the hand-over of a
 * protected call to the stage, and an unreachable upstream. */
#include "config.h"
#include "exchange.h"
#include "http_conn.h"
#include "proxy.h"
#include "subject.h"
#include "upstream_http.h"
#include "util.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

static struct event_base *base;
static struct evconnlistener *up_listener;
static int up_port;
static int up_requests; /* requests the upstream saw */
static config_t *cfg;
static server_stats_t stats;
static upstream_limits_t up_limits = {1000, 2000, 2000, 4};
static upstream_pool_t *pool;
static upstream_t *upstream; /* over pool */
static proxy_t *proxy;
static http_limits_t limits = {16384, 65536, 2000, 2000, 2000, 100};
static http_context_t conns;
static http_site_t site;
static int stage_calls;
static const char *up_extra = ""; /* header lines the upstream adds to its answers */
static char up_last_head[1024];   /* the request head the upstream saw last */

/* --- the upstream: answers every request head with one JSON body and closes --- */

static void up_written(struct bufferevent *bev, void *arg)
{
    bufferevent_free(bev);
}

static void up_event(struct bufferevent *bev, short what, void *arg);

static void up_read(struct bufferevent *bev, void *arg)
{
    struct evbuffer *in = bufferevent_get_input(bev);
    struct evbuffer_ptr p = evbuffer_search(in, "\r\n\r\n", 4, NULL);
    if (p.pos < 0)
        return;
    up_requests++;
    size_t head =
        (size_t)p.pos < sizeof(up_last_head) - 1 ? (size_t)p.pos : sizeof(up_last_head) - 1;
    evbuffer_copyout(in, up_last_head, head);
    up_last_head[head] = '\0';
    evbuffer_drain(in, evbuffer_get_length(in));
    /* a body even for HEAD: the gateway must not relay it */
    const char *body = "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"from\":\"upstream\"}}";
    evbuffer_add_printf(bufferevent_get_output(bev),
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%s"
                        "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                        up_extra, strlen(body), body);
    bufferevent_setcb(bev, NULL, up_written, up_event, NULL); /* closes once it is sent */
}

static void up_event(struct bufferevent *bev, short what, void *arg)
{
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
        bufferevent_free(bev);
}

static void up_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len,
                      void *arg)
{
    struct bufferevent *bev = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE);
    bufferevent_setcb(bev, up_read, NULL, up_event, NULL);
    bufferevent_enable(bev, EV_READ | EV_WRITE);
}

/* --- the fake stage --- */

/* A handler that takes the tools/call requests the router classed non_idempotent. */
static handler_verdict_t stage_call(void *arg, exchange_t *ex)
{
    (void)arg;
    const mcp_msg_t *m = exchange_msg(ex);
    if (!m || !m->tool || exchange_tool_class(ex) != TOOL_CLASS_NON_IDEMPOTENT)
        return HANDLER_PASS;
    stage_calls++;
    assert_string_equal(m->tool, "refund");
    exchange_respond_json(ex, 200, "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"from\":\"stage\"}}",
                          NULL);
    return HANDLER_TAKEN;
}

/* A watcher that sees every request the router offers and never takes one. */
static int watched;
static handler_verdict_t watch_all(void *arg, exchange_t *ex)
{
    (void)arg;
    (void)ex;
    watched++;
    return HANDLER_PASS;
}

/* Observers of the responses to lookup calls, added by a handler that passes: the first
 * holds the answer and releases it from its on_end when hold is set, the others only count. */
typedef enum { LATER_NOTHING = 0, LATER_RELEASE, LATER_REPLACE } later_t;
typedef struct seen {
    exchange_t *ex;
    bool hold;
    later_t later; /* with hold: answer from a timer after on_end, not from on_end itself */
    bool agent_had_nothing; /* when the timer fired: no byte had reached the agent */
    bool agent_waiting;     /* when the timer fired: exchange_agent_waiting */
    int heads, bodies, ends, detaches;
} seen_t;
static struct evbuffer *agent_got; /* what the agent has read so far, in exchange() */
static seen_t seen[3];
static int n_seen; /* observers the handler adds to each lookup */

static observe_t seen_head(void *arg, int status, const http_headers_t *headers, bool sse)
{
    seen_t *o = arg;
    o->heads++;
    return o->hold ? OBSERVE_HOLD : OBSERVE_PASS;
}
static observe_t seen_body(void *arg, const char *data, size_t len)
{
    seen_t *o = arg;
    o->bodies++;
    return OBSERVE_PASS;
}
/* The answer a stage writes in place of the upstream's (a replay, an unknown outcome). */
#define STAGE_ANSWER "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"from\":\"later\"}}"

/* The stage's store write is done: the held answer goes out now, the upstream long ended. */
static void seen_later(evutil_socket_t fd, short what, void *arg)
{
    seen_t *o = arg;
    o->agent_had_nothing = evbuffer_get_length(agent_got) == 0;
    o->agent_waiting = exchange_agent_waiting(o->ex);
    if (o->later == LATER_RELEASE)
        exchange_release(o->ex);
    else
        exchange_replace_answer(o->ex, STAGE_ANSWER);
}

static observe_t seen_end(void *arg, upstream_result_t res)
{
    seen_t *o = arg;
    o->ends++;
    if (o->hold && o->later != LATER_NOTHING) /* held while "recording": answered later */
        event_base_once(base, -1, EV_TIMEOUT, seen_later, o, &(struct timeval){0, 20000});
    else if (o->hold)
        exchange_release(o->ex); /* answered from on_end (exchange.h) */
    return OBSERVE_PASS;
}
static void seen_detach(void *arg)
{
    seen_t *o = arg;
    o->detaches++;
}
static const response_observer_t seen_ops = {
    .on_head = seen_head, .on_body = seen_body, .on_end = seen_end, .detach = seen_detach};

static handler_verdict_t observe_lookups(void *arg, exchange_t *ex)
{
    (void)arg;
    const mcp_msg_t *m = exchange_msg(ex);
    if (!m || !m->tool || strcmp(m->tool, "lookup") != 0)
        return HANDLER_PASS;
    for (int i = 0; i < n_seen; i++) {
        seen[i].ex = ex;
        exchange_add_observer(ex, &seen_ops, &seen[i]);
    }
    return HANDLER_PASS;
}

/* --- set-up --- */

static subject_t *subject;

static int setup(void **state)
{
    base = event_base_new();
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    up_listener =
        evconnlistener_new_bind(base, up_accept, NULL, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE,
                                16, (struct sockaddr *)&sin, sizeof(sin));
    assert_non_null(up_listener);
    struct sockaddr_in bound;
    socklen_t bl = sizeof(bound);
    getsockname(evconnlistener_get_fd(up_listener), (struct sockaddr *)&bound, &bl);
    up_port = ntohs(bound.sin_port);
    char yaml[512];
    snprintf(yaml, sizeof(yaml),
             "upstream: http://127.0.0.1:%d/mcp\n"
             "subject: {static: me}\n"
             "tools:\n  refund:\n    class: non_idempotent\n  lookup:\n    class: read\n",
             up_port);
    config_errors_t errs = {0};
    cfg = config_load_string("t.yaml", yaml, &errs);
    if (!cfg) {
        for (size_t i = 0; i < errs.n; i++)
            fprintf(stderr, "%s\n", errs.msgs[i]);
        return -1;
    }
    upstream_opts_t uo = {
        .base = base, .host = "127.0.0.1", .port = (unsigned)up_port, .limits = &up_limits};
    char msg[200];
    pool = upstream_pool_new(&uo, msg, sizeof(msg));
    assert_non_null(pool);
    upstream = upstream_http_new(pool, cfg->upstream_host_header);
    subject = subject_new(base, &cfg->subject, msg, sizeof(msg));
    assert_non_null(subject);
    proxy_ctx_t pc = {.base = base,
                      .cfg = cfg,
                      .upstream = upstream,
                      .stats = &stats,
                      .subject = subject,
                      .n_workers = 1};
    proxy = proxy_new(&pc);
    proxy_add_handler(proxy, &(handler_t){"watch", watch_all, NULL});
    proxy_add_handler(proxy, &(handler_t){"observers", observe_lookups, NULL});
    memset(seen, 0, sizeof(seen));
    n_seen = 0;
    proxy_add_handler(proxy, &(handler_t){"protected call", stage_call, NULL});
    watched = 0;
    conns = (http_context_t){.base = base, .limits = &limits, .stats = &stats};
    site = (http_site_t){.ctx = &conns, .handler = proxy_handle, .arg = proxy, .name = "mcp"};
    up_requests = 0;
    stage_calls = 0;
    up_extra = "";
    up_last_head[0] = '\0';
    memset(&stats, 0, sizeof(stats));
    return 0;
}

static int teardown(void **state)
{
    for (int i = 0; i < 200 && (conns.open > 0 || proxy_exchanges(proxy) > 0); i++)
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    proxy_free(proxy);
    subject_free(subject);
    upstream_free(upstream);
    upstream_pool_free(pool);
    if (up_listener)
        evconnlistener_free(up_listener);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    config_free(cfg);
    return 0;
}

/* Sends one request (with Connection: close) as an agent and returns the whole response. */
static char *exchange(const char *method, const char *target, const char *extra_headers,
                      const char *body)
{
    int fds[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    evutil_make_socket_nonblocking(fds[0]);
    evutil_make_socket_nonblocking(fds[1]);
    http_conn_accept(NULL, fds[0], NULL, 0, &site);
    char req[2048];
    int n =
        snprintf(req, sizeof(req),
                 "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                 "Content-Type: application/json\r\n"
                 "Accept: application/json, text/event-stream\r\n%sContent-Length: %zu\r\n\r\n%s",
                 method, target, extra_headers ? extra_headers : "", body ? strlen(body) : 0,
                 body ? body : "");
    assert_int_equal(write(fds[1], req, (size_t)n), n);
    struct evbuffer *got = agent_got = evbuffer_new();
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
    agent_got = NULL;
    return out;
}

#define LOOKUP_CALL                                                                                \
    "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\","                                     \
    "\"params\":{\"name\":\"lookup\",\"arguments\":{}}}"

#define REFUND_CALL                                                                                \
    "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\","                                     \
    "\"params\":{\"name\":\"refund\",\"arguments\":{}}}"

#define LOOKUP_NOTIFICATION                                                                        \
    "{\"jsonrpc\":\"2.0\",\"method\":\"tools/call\","                                              \
    "\"params\":{\"name\":\"lookup\",\"arguments\":{}}}"

static void refusals_are_written_by_the_proxy(void **state)
{
    /* a protected call anywhere but a POST to the MCP endpoint would run unprotected */
    char *r = exchange("PUT", "/mcp", NULL, REFUND_CALL);
    assert_non_null(strstr(r, "HTTP/1.1 400"));
    assert_non_null(strstr(r, "only accepted as a POST to the MCP endpoint /mcp"));
    free(r);
    r = exchange("POST", "/messages?sessionId=1", NULL, REFUND_CALL);
    assert_non_null(strstr(r, "HTTP/1.1 400"));
    assert_non_null(strstr(r, "nothing was executed"));
    free(r);
    r = exchange("POST", "/mcp", "Authorization: a\r\nAuthorization: b\r\n", "{}");
    assert_non_null(strstr(r, "HTTP/1.1 400"));
    assert_non_null(strstr(r, "Authorization header appears more than once"));
    free(r);
    r = exchange("POST", "/mcp", NULL, "{not json");
    assert_non_null(strstr(r, "HTTP/1.1 400"));
    assert_non_null(strstr(r, "-32700"));
    free(r);
    r = exchange("POST", "/mcp", "Origin: http://evil.example\r\n",
                 "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}");
    assert_non_null(strstr(r, "HTTP/1.1 403"));
    assert_non_null(strstr(r, "allowed_origins"));
    free(r);
    r = exchange("POST", "/mcp", NULL,
                 "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\","
                 "\"params\":{\"name\":\"refund\",\"arguments\":{}}}]");
    assert_non_null(strstr(r, "HTTP/1.1 400"));
    assert_non_null(strstr(r, "batch may not contain"));
    free(r);
    assert_int_equal(up_requests, 0); /* nothing refused went upstream */
    assert_int_equal(stage_calls, 0);
}

/* Routes a lenient server would run a call by, which the router never classified: a body on a
 * method that has none, a tools/call without an id (whatever its tool, on the endpoint and off
 * it, alone or in a batch), an escaped '/' in the path. Each refused, none sent upstream. */
static void unclassified_routes_are_refused(void **state)
{
    static const struct {
        const char *method, *target, *body, *status, *says;
    } cases[] = {
        {"GET", "/mcp", LOOKUP_CALL, "HTTP/1.1 400", "carries no body"},
        {"GET", "/MCP/", REFUND_CALL, "HTTP/1.1 400", "carries no body"},
        {"DELETE", "/mcp", REFUND_CALL, "HTTP/1.1 400", "carries no body"},
        {"GET", "/health", LOOKUP_CALL, "HTTP/1.1 400", "carries no body"},
        {"DELETE", "/other", "x", "HTTP/1.1 400", "carries no body"},
        {"HEAD", "/health", "x", "HTTP/1.1 400", NULL},
        {"POST", "/mcp", LOOKUP_NOTIFICATION, "HTTP/1.1 400", "a tools/call needs an id"},
        {"POST", "/mcp", "[" LOOKUP_CALL "," LOOKUP_NOTIFICATION "]", "HTTP/1.1 400",
         "a tools/call needs an id"},
        {"POST", "/other", LOOKUP_NOTIFICATION, "HTTP/1.1 400", "a tools/call needs an id"},
        {"PUT", "/mcp", LOOKUP_NOTIFICATION, "HTTP/1.1 400", "a tools/call needs an id"},
        {"POST", "/x/..%2Fmcp", LOOKUP_CALL, "HTTP/1.1 400", "%2F or %5C"},
        {"POST", "/x/..%5cmcp", LOOKUP_CALL, "HTTP/1.1 400", "%2F or %5C"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        char *r = exchange(cases[i].method, cases[i].target, NULL, cases[i].body);
        if (strncmp(r, cases[i].status, strlen(cases[i].status)) != 0 ||
            (cases[i].says && !strstr(r, cases[i].says)))
            fail_msg("%s %s: %s", cases[i].method, cases[i].target, r);
        free(r);
    }
    assert_int_equal(up_requests, 0);
    assert_int_equal(stage_calls, 0);
    /* without a body those methods go up as before */
    char *r = exchange("GET", "/health", NULL, NULL);
    assert_non_null(strstr(r, "HTTP/1.1 200"));
    free(r);
    r = exchange("DELETE", "/mcp", NULL, NULL);
    assert_non_null(strstr(r, "HTTP/1.1 200"));
    free(r);
    assert_int_equal(up_requests, 2);
}

static void reads_are_forwarded(void **state)
{
    char *r = exchange("POST", "/mcp", NULL,
                       "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\","
                       "\"params\":{\"name\":\"lookup\",\"arguments\":{}}}");
    assert_non_null(strstr(r, "HTTP/1.1 200"));
    assert_non_null(strstr(r, "\"from\":\"upstream\""));
    free(r);
    assert_int_equal(up_requests, 1);
    assert_int_equal(stage_calls, 0);
    assert_int_equal(stats.forwarded, 1);
}

/* Every observer of an exchange sees the whole response, in turn, and is let go once; one
 * that holds the answer and releases it from its on_end does not keep the others from their
 * on_end. */
static void several_observers_each_see_the_response(void **state)
{
    n_seen = EXCHANGE_MAX_OBSERVERS - 1;
    seen[0].hold = true;
    char *r = exchange("POST", "/mcp", NULL,
                       "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\","
                       "\"params\":{\"name\":\"lookup\",\"arguments\":{}}}");
    assert_non_null(strstr(r, "HTTP/1.1 200"));
    assert_non_null(strstr(r, "\"from\":\"upstream\"")); /* released whole */
    free(r);
    for (int i = 0; i < n_seen; i++) {
        assert_int_equal(seen[i].heads, 1);
        assert_true(seen[i].bodies >= 1);
        assert_int_equal(seen[i].ends, 1);
        assert_int_equal(seen[i].detaches, 1);
    }
}

/* HOLDING then RECORDING: the upstream's whole answer arrived and its connection closed, the
 * stage still writes it down; nothing reaches the agent until the stage releases it, and then
 * the whole answer does. */
static void held_answer_waits_for_the_stage_after_the_upstream_ended(void **state)
{
    n_seen = 2;
    seen[0].hold = true;
    seen[0].later = LATER_RELEASE;
    char *r = exchange("POST", "/mcp", NULL, LOOKUP_CALL);
    assert_true(seen[0].agent_had_nothing);
    assert_true(seen[0].agent_waiting);
    assert_non_null(strstr(r, "HTTP/1.1 200"));
    assert_non_null(strstr(r, "\"from\":\"upstream\""));
    free(r);
    assert_int_equal(seen[1].ends, 1); /* the other observer was not held up */
    assert_int_equal(seen[0].detaches, 1);
    assert_int_equal(seen[1].detaches, 1);
    assert_int_equal(up_requests, 1);
}

/* A held answer the stage replaces (the upstream's answer was not the caller's): the agent
 * gets the stage's answer and not one byte of the upstream's. */
static void held_answer_replaced_by_the_stage(void **state)
{
    n_seen = 1;
    seen[0].hold = true;
    seen[0].later = LATER_REPLACE;
    char *r = exchange("POST", "/mcp", NULL, LOOKUP_CALL);
    assert_true(seen[0].agent_had_nothing);
    assert_non_null(strstr(r, "HTTP/1.1 200"));
    assert_non_null(strstr(r, "\"from\":\"later\""));
    assert_null(strstr(r, "\"from\":\"upstream\""));
    free(r);
    assert_int_equal(seen[0].detaches, 1);
}

static void protected_calls_go_to_the_stage(void **state)
{
    char *r = exchange("POST", "/mcp", NULL,
                       "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\","
                       "\"params\":{\"name\":\"refund\",\"arguments\":{\"amount\":5}}}");
    assert_non_null(strstr(r, "\"from\":\"stage\""));
    free(r);
    assert_int_equal(stage_calls, 1);
    assert_int_equal(watched, 1); /* handlers are asked in order: the watcher saw it first */
    assert_int_equal(up_requests, 0);
}

static void other_paths_and_methods_are_relayed(void **state)
{
    char *r = exchange("GET", "/.well-known/oauth-protected-resource/mcp", NULL, NULL);
    assert_non_null(strstr(r, "HTTP/1.1 200"));
    assert_non_null(strstr(r, "\"from\":\"upstream\""));
    assert_non_null(strstr(up_last_head, "GET /.well-known/oauth-protected-resource/mcp HTTP/1.1"));
    free(r);
    /* a body on another path that is no protected call goes up as it is */
    r = exchange("POST", "/token", NULL, "{\"grant_type\":\"client_credentials\"}");
    assert_non_null(strstr(r, "HTTP/1.1 200"));
    free(r);
    /* one that says it is JSON and is not is refused: the gateway could not tell what it holds */
    r = exchange("POST", "/token", NULL, "grant_type=client_credentials");
    assert_non_null(strstr(r, "HTTP/1.1 400"));
    assert_non_null(strstr(r, "parse error"));
    free(r);
    r = exchange("OPTIONS", "/mcp", "Origin: http://localhost:5173\r\n", NULL);
    assert_non_null(strstr(r, "HTTP/1.1 200"));
    assert_non_null(strstr(up_last_head, "OPTIONS /mcp HTTP/1.1"));
    free(r);
    /* HEAD: the head only, even when the upstream wrongly sends a body */
    r = exchange("HEAD", "/health", NULL, NULL);
    assert_non_null(strstr(r, "HTTP/1.1 200"));
    assert_non_null(strstr(r, "Content-Length: "));
    assert_null(strstr(r, "\"from\""));
    free(r);
    assert_int_equal(up_requests, 4);
    assert_int_equal(stage_calls, 0);

    cfg->forward_other_paths = false;
    r = exchange("GET", "/health", NULL, NULL);
    assert_non_null(strstr(r, "HTTP/1.1 404"));
    assert_non_null(strstr(r, "forward_other_paths"));
    free(r);
    assert_int_equal(up_requests, 4);
}

static void own_answers_carry_cors(void **state)
{
    const char *batch = "[" REFUND_CALL "]";
    /* nothing learned yet: the origin passed allowed_origins, but no CORS is invented for it */
    char *r = exchange("POST", "/mcp", "Origin: http://localhost:5173\r\n", batch);
    assert_non_null(strstr(r, "HTTP/1.1 400"));
    assert_null(strstr(r, "Access-Control-"));
    free(r);
    /* an upstream answer without CORS teaches nothing */
    r = exchange("POST", "/mcp", "Origin: http://localhost:5173\r\n",
                 "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}");
    assert_null(strstr(r, "Access-Control-"));
    free(r);
    r = exchange("POST", "/mcp", "Origin: http://localhost:5173\r\n", batch);
    assert_null(strstr(r, "Access-Control-"));
    free(r);
    /* the upstream names the origin itself: so do the gateway's answers, with Vary */
    up_extra = "Access-Control-Allow-Origin: http://localhost:5173\r\n";
    r = exchange("POST", "/mcp", "Origin: http://localhost:5173\r\n",
                 "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}");
    free(r);
    r = exchange("POST", "/mcp", "Origin: http://localhost:5173\r\n", batch);
    assert_non_null(strstr(r, "Access-Control-Allow-Origin: http://localhost:5173\r\n"));
    assert_non_null(strstr(r, "Vary: Origin\r\n"));
    assert_non_null(
        strstr(r, "Access-Control-Expose-Headers: Mcp-Session-Id, Idempotent-Replayed\r\n"));
    free(r);
    /* another origin the upstream never answered gets nothing */
    r = exchange("POST", "/mcp", "Origin: http://127.0.0.1:5173\r\n", batch);
    assert_non_null(strstr(r, "HTTP/1.1 400"));
    assert_null(strstr(r, "Access-Control-"));
    free(r);
    /* no Origin, no CORS */
    r = exchange("POST", "/mcp", NULL, batch);
    assert_null(strstr(r, "Access-Control-"));
    free(r);
    /* the upstream answers this origin with "*": the gateway's own answers say the same */
    up_extra =
        "Access-Control-Allow-Origin: *\r\nAccess-Control-Expose-Headers: mcp-session-id\r\n";
    r = exchange("POST", "/mcp", "Origin: http://localhost:5173\r\n",
                 "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}");
    assert_non_null(strstr(r, "Access-Control-Allow-Origin: *\r\n"));
    free(r);
    r = exchange("POST", "/mcp", "Origin: http://localhost:5173\r\n", batch);
    assert_non_null(strstr(r, "Access-Control-Allow-Origin: *\r\n"));
    assert_null(strstr(r, "Vary: Origin"));
    assert_non_null(
        strstr(r, "Access-Control-Expose-Headers: mcp-session-id, Idempotent-Replayed\r\n"));
    free(r);
    /* a preflight asking for Idempotency-Key gets it allowed when the upstream forgot it */
    up_extra = "Access-Control-Allow-Origin: *\r\nAccess-Control-Allow-Headers: content-type\r\n";
    r = exchange("OPTIONS", "/mcp",
                 "Origin: http://localhost:5173\r\n"
                 "Access-Control-Request-Headers: content-type, idempotency-key\r\n",
                 NULL);
    assert_non_null(strstr(r, "Access-Control-Allow-Headers: content-type\r\n"));
    assert_non_null(strstr(r, "Access-Control-Allow-Headers: Idempotency-Key\r\n"));
    free(r);
    cfg->cors = CORS_OFF;
    r = exchange("POST", "/mcp", "Origin: http://localhost:5173\r\n", batch);
    assert_null(strstr(r, "Access-Control-"));
    free(r);
}

static void unreachable_upstream_is_a_502(void **state)
{
    /* the upstream's port closes: connecting is refused */
    evconnlistener_free(up_listener);
    up_listener = NULL;
    char *r = exchange("POST", "/mcp", NULL, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}");
    assert_non_null(strstr(r, "HTTP/1.1 502"));
    assert_non_null(strstr(r, "upstream MCP server unreachable"));
    free(r);
    assert_int_equal(stats.upstream_errors, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(refusals_are_written_by_the_proxy, setup, teardown),
        cmocka_unit_test_setup_teardown(unclassified_routes_are_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(reads_are_forwarded, setup, teardown),
        cmocka_unit_test_setup_teardown(several_observers_each_see_the_response, setup, teardown),
        cmocka_unit_test_setup_teardown(held_answer_waits_for_the_stage_after_the_upstream_ended,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(held_answer_replaced_by_the_stage, setup, teardown),
        cmocka_unit_test_setup_teardown(protected_calls_go_to_the_stage, setup, teardown),
        cmocka_unit_test_setup_teardown(other_paths_and_methods_are_relayed, setup, teardown),
        cmocka_unit_test_setup_teardown(own_answers_carry_cors, setup, teardown),
        cmocka_unit_test_setup_teardown(unreachable_upstream_is_a_502, setup, teardown),
    };
    return cmocka_run_group_tests_name("proxy", tests, NULL, NULL);
}
