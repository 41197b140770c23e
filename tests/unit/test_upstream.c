/* The upstream response path without a socket: framing decides where a response ends, so
 * what follows it is never read as part of it, and a close-delimited body is complete at the
 * close. Then the pool on a real loop against a small upstream on loopback: a response relayed,
 * a connection reused, one with stray bytes not reused, a refused connect, the timeouts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "upstream_http.h"
#include "util.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <stdlib.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

typedef struct seen {
    int status, heads;
    char body[256];
    size_t body_len;
} seen_t;

static void on_head(void *arg, int status, const http_headers_t *headers)
{
    seen_t *s = arg;
    s->status = status;
    s->heads++;
}

static void on_body(void *arg, const char *data, size_t len)
{
    seen_t *s = arg;
    assert_true(s->body_len + len < sizeof(s->body));
    memcpy(s->body + s->body_len, data, len);
    s->body_len += len;
}

static void on_end(void *arg, upstream_result_t res)
{
    fail_msg("on_end is not called by upstream_parse_response");
}

static const upstream_cbs_t cbs = {on_head, on_body, on_end};

static void test_framing(void **state)
{
    static const struct {
        const char *bytes;
        upstream_result_t res;
        int status;
        const char *body;
        size_t rest;
    } cases[] = {
        {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", UPSTREAM_OK, 200, "{}", 0},
        /* a second response right behind the first is left unread */
        {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}HTTP/1.1 200 OK\r\nContent-Length: "
         "0\r\n\r\n",
         UPSTREAM_OK, 200, "{}", 38},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\nX",
         UPSTREAM_OK, 200, "abc", 1},
        /* HTTP/1.0 without a length: the close ends it */
        {"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{\"a\":1}", UPSTREAM_OK, 200,
         "{\"a\":1}", 0},
        {"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 302 Found\r\nLocation: /x\r\nContent-Length: "
         "0\r\n\r\n",
         UPSTREAM_OK, 302, "", 0},
        {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", UPSTREAM_ERR_CLOSED, 200, "ab", 0},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n", UPSTREAM_ERR_CLOSED,
         200, "ab", 0},
        {"HTTP/1.1 200 OK\r\nContent-Le", UPSTREAM_ERR_CLOSED, 0, "", 0},
        {"HTTX/1.1 200 OK\r\n\r\n", UPSTREAM_ERR_PROTOCOL, 0, "", 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        seen_t s = {0};
        size_t rest = 99;
        upstream_result_t res =
            upstream_parse_response(cases[i].bytes, strlen(cases[i].bytes), &cbs, &s, &rest);
        assert_int_equal(res, cases[i].res);
        assert_int_equal(s.status, cases[i].status);
        assert_int_equal(s.heads, cases[i].status ? 1 : 0);
        assert_int_equal(s.body_len, strlen(cases[i].body));
        assert_memory_equal(s.body, cases[i].body, s.body_len);
        assert_int_equal(rest, cases[i].rest);
    }
    assert_string_equal(upstream_result_str(UPSTREAM_ERR_CLOSED), "closed mid-response");
}

/* Node's http server says "Keep-Alive: timeout=5" and closes idle sockets after 5 s: a pooled
 * connection kept longer is sent a request into the close. */
static void test_keep_alive(void **state)
{
    static const struct {
        const char *value;
        uint64_t ms;
    } cases[] = {
        {NULL, 30000},
        {"", 30000},
        {"timeout=5", 4000},
        {"timeout=5, max=1000", 4000},
        {"max=1000, Timeout=10", 9000},
        {"timeout=600", 30000},
        {"timeout=1", 0},
        {"timeout=0", 0},
        {"timeout=", 30000},
        {"timeout=x", 30000},
        {"max=5", 30000},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint64_t got = upstream_keep_alive_ms(cases[i].value, 30000);
        if (got != cases[i].ms)
            fail_msg("case %zu (%s): %llu, want %llu", i, cases[i].value ? cases[i].value : "NULL",
                     (unsigned long long)got, (unsigned long long)cases[i].ms);
    }
}

/* --- the pool on a real loop --- */

typedef enum {
    UP_ANSWER,       /* a JSON answer with a length, connection kept */
    UP_STRAY,        /* the answer, then bytes nobody asked for */
    UP_SILENT,       /* reads the request, never answers */
    UP_STALL,        /* the head and part of the body, then nothing */
    UP_CLOSE_REUSED, /* answers a connection's first request, closes it on the next unanswered */
} up_mode_t;

static struct event_base *base;
static struct evconnlistener *listener;
static unsigned port;
static up_mode_t mode;
static int accepts, requests;
static upstream_limits_t limits;
static upstream_pool_t *pool;

typedef struct exchange {
    seen_t seen;
    bool ended;
    upstream_result_t res;
} exchange_t;

static void ex_head(void *arg, int status, const http_headers_t *headers)
{
    on_head(&((exchange_t *)arg)->seen, status, headers);
    assert_string_equal(http_headers_get(headers, "content-type"), "application/json");
}

static void ex_body(void *arg, const char *data, size_t len)
{
    on_body(&((exchange_t *)arg)->seen, data, len);
}

static void ex_end(void *arg, upstream_result_t res)
{
    exchange_t *ex = arg;
    assert_false(ex->ended);
    ex->ended = true;
    ex->res = res;
}

static const upstream_cbs_t ex_cbs = {ex_head, ex_body, ex_end};

static void up_event(struct bufferevent *bev, short what, void *arg)
{
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        free(arg);
        bufferevent_free(bev);
    }
}

static void up_read(struct bufferevent *bev, void *arg)
{
    struct evbuffer *in = bufferevent_get_input(bev);
    struct evbuffer_ptr p = evbuffer_search(in, "\r\n\r\n", 4, NULL);
    if (p.pos < 0)
        return;
    requests++;
    int *served = arg; /* requests this connection read */
    (*served)++;
    evbuffer_drain(in, evbuffer_get_length(in));
    if (mode == UP_CLOSE_REUSED && *served > 1) {
        /* its keep-alive ended as the request arrived: closed before any byte of an answer */
        free(served);
        bufferevent_free(bev);
        return;
    }
    struct evbuffer *out = bufferevent_get_output(bev);
    const char *head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n";
    switch (mode) {
    case UP_ANSWER:
    case UP_CLOSE_REUSED:
        evbuffer_add_printf(out, "%sContent-Length: 7\r\n\r\n{\"a\":1}", head);
        break;
    case UP_STRAY:
        evbuffer_add_printf(out, "%sContent-Length: 7\r\n\r\n{\"a\":1}HTTP/1.1 200", head);
        break;
    case UP_SILENT:
        break;
    case UP_STALL:
        evbuffer_add_printf(out, "%sContent-Length: 7\r\n\r\n{\"a", head);
        break;
    }
}

static void up_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len,
                      void *arg)
{
    accepts++;
    struct bufferevent *bev = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE);
    bufferevent_setcb(bev, up_read, NULL, up_event, xcalloc(1, sizeof(int)));
    bufferevent_enable(bev, EV_READ | EV_WRITE);
}

static int setup_loop(void **state)
{
    base = event_base_new();
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    listener =
        evconnlistener_new_bind(base, up_accept, NULL, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE,
                                16, (struct sockaddr *)&sin, sizeof(sin));
    assert_non_null(listener);
    struct sockaddr_in bound;
    socklen_t bl = sizeof(bound);
    getsockname(evconnlistener_get_fd(listener), (struct sockaddr *)&bound, &bl);
    port = ntohs(bound.sin_port);
    limits = (upstream_limits_t){
        .connect_timeout_ms = 1000, .timeout_ms = 2000, .idle_timeout_ms = 2000, .pool = 4};
    upstream_opts_t uo = {.base = base, .host = "127.0.0.1", .port = port, .limits = &limits};
    char msg[200];
    pool = upstream_pool_new(&uo, msg, sizeof(msg));
    assert_non_null(pool);
    mode = UP_ANSWER;
    accepts = requests = 0;
    return 0;
}

static int teardown_loop(void **state)
{
    upstream_pool_close_idle(pool);
    if (listener)
        evconnlistener_free(listener);
    listener = NULL;
    for (int i = 0; i < 20; i++)
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    upstream_pool_free(pool);
    event_base_free(base);
    return 0;
}

/* Sends a GET and runs the loop until its exchange ends. */
static void exchange(exchange_t *ex, bool once)
{
    *ex = (exchange_t){0};
    struct evbuffer *req = evbuffer_new();
    evbuffer_add_printf(req, "GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    upstream_conn_t *up = upstream_http_send(pool, req, once, &ex_cbs, ex);
    assert_non_null(up);
    assert_false(ex->ended); /* never inside upstream_send */
    assert_int_equal(evbuffer_get_length(req), 0);
    evbuffer_free(req);
    for (int i = 0; i < 100000 && !ex->ended; i++)
        event_base_loop(base, EVLOOP_ONCE);
    assert_true(ex->ended);
}

static void test_relayed_and_reused(void **state)
{
    exchange_t ex;
    exchange(&ex, false);
    assert_int_equal(ex.res, UPSTREAM_OK);
    assert_int_equal(ex.seen.status, 200);
    assert_int_equal(ex.seen.heads, 1);
    assert_int_equal(ex.seen.body_len, 7);
    assert_memory_equal(ex.seen.body, "{\"a\":1}", 7);
    /* the second request goes on the pooled connection */
    exchange(&ex, false);
    assert_int_equal(ex.res, UPSTREAM_OK);
    assert_int_equal(requests, 2);
    assert_int_equal(accepts, 1);
    /* once (a protected call): the pooled connection too */
    exchange(&ex, true);
    assert_int_equal(ex.res, UPSTREAM_OK);
    assert_int_equal(requests, 3);
    assert_int_equal(accepts, 1);
}

/* A kept-alive connection closed before any byte of the answer: a request is sent once more on
 * a new connection, but never one sent with once (it may have run: a non_idempotent call). */
static void test_closed_reused_resent_unless_once(void **state)
{
    mode = UP_CLOSE_REUSED;
    exchange_t ex;
    exchange(&ex, false);
    assert_int_equal(ex.res, UPSTREAM_OK);
    exchange(&ex, false); /* read by the server, closed, sent again on a new connection */
    assert_int_equal(ex.res, UPSTREAM_OK);
    assert_int_equal(ex.seen.body_len, 7);
    assert_int_equal(requests, 3);
    assert_int_equal(accepts, 2);
    exchange(&ex, true); /* on the second connection, now pooled: closed, and never resent */
    assert_int_equal(ex.res, UPSTREAM_ERR_CLOSED);
    assert_int_equal(ex.seen.heads, 0);
    assert_int_equal(requests, 4);
    assert_int_equal(accepts, 2);
}

static void test_stray_bytes_not_reused(void **state)
{
    mode = UP_STRAY;
    exchange_t ex;
    exchange(&ex, false);
    /* the response itself is whole; the bytes after it make the connection unusable */
    assert_int_equal(ex.res, UPSTREAM_OK);
    assert_int_equal(ex.seen.body_len, 7);
    mode = UP_ANSWER;
    exchange(&ex, false);
    assert_int_equal(ex.res, UPSTREAM_OK);
    assert_int_equal(accepts, 2);
}

static void test_pool_limit(void **state)
{
    limits.pool = 0; /* read at each use: nothing is kept from now on */
    exchange_t ex;
    exchange(&ex, false);
    exchange(&ex, false);
    assert_int_equal(ex.res, UPSTREAM_OK);
    assert_int_equal(accepts, 2);
}

static void test_connect_refused(void **state)
{
    evconnlistener_free(listener); /* nothing listens on the port any more */
    listener = NULL;
    exchange_t ex;
    exchange(&ex, false);
    assert_int_equal(ex.res, UPSTREAM_ERR_CONNECT);
    assert_int_equal(ex.seen.heads, 0);
}

static void test_head_timeout(void **state)
{
    mode = UP_SILENT;
    limits.timeout_ms = 30;
    exchange_t ex;
    exchange(&ex, false);
    assert_int_equal(ex.res, UPSTREAM_ERR_HEAD_TIMEOUT);
    assert_int_equal(ex.seen.heads, 0);
    assert_int_equal(requests, 1);
}

static void test_idle_timeout(void **state)
{
    mode = UP_STALL;
    limits.idle_timeout_ms = 30;
    exchange_t ex;
    exchange(&ex, false);
    assert_int_equal(ex.res, UPSTREAM_ERR_IDLE_TIMEOUT);
    assert_int_equal(ex.seen.heads, 1);
    assert_int_equal(ex.seen.body_len, 3);
    /* a stalled connection is not pooled */
    mode = UP_ANSWER;
    exchange(&ex, false);
    assert_int_equal(ex.res, UPSTREAM_OK);
    assert_int_equal(accepts, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_framing),
        cmocka_unit_test(test_keep_alive),
        cmocka_unit_test_setup_teardown(test_relayed_and_reused, setup_loop, teardown_loop),
        cmocka_unit_test_setup_teardown(test_stray_bytes_not_reused, setup_loop, teardown_loop),
        cmocka_unit_test_setup_teardown(test_closed_reused_resent_unless_once, setup_loop,
                                        teardown_loop),
        cmocka_unit_test_setup_teardown(test_pool_limit, setup_loop, teardown_loop),
        cmocka_unit_test_setup_teardown(test_connect_refused, setup_loop, teardown_loop),
        cmocka_unit_test_setup_teardown(test_head_timeout, setup_loop, teardown_loop),
        cmocka_unit_test_setup_teardown(test_idle_timeout, setup_loop, teardown_loop),
    };
    return cmocka_run_group_tests_name("upstream", tests, NULL, NULL);
}
