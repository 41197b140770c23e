/* An agent's connection on a real event loop: the agent is the other end of a socketpair,
 * the site's handler records what it is given and answers. Covers a request handed over
 * whole, keep-alive, pipelining, the refusals the connection writes itself (431 with the
 * site's error body, 413) and the drain closing idle connections. */
#include "http_conn.h"
#include "util.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <fcntl.h>
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
static server_stats_t stats;
static http_limits_t limits;
static bool draining;
static int closes; /* on_close calls */
static http_context_t ctx;
static http_site_t site;
static int agent = -1; /* the agent's end of the socketpair */

typedef struct seen {
    int n;
    char target[4][64];
    char body[4][64];
    bool keep_alive[4];
} seen_t;
static seen_t seen;

static void handle(void *arg, http_conn_t *conn, http_request_t *req)
{
    assert_ptr_equal(arg, &seen);
    int i = seen.n++;
    assert_true(i < 4);
    snprintf(seen.target[i], sizeof(seen.target[i]), "%s", req->target);
    size_t n = evbuffer_get_length(req->body);
    assert_true(n < sizeof(seen.body[i]));
    evbuffer_remove(req->body, seen.body[i], n);
    seen.body[i][n] = '\0';
    seen.keep_alive[i] = req->keep_alive;
    char body[80];
    int len = snprintf(body, sizeof(body), "ok %s", req->target);
    http_conn_respond(conn, 200, "text/plain", body, (size_t)len, NULL, req->keep_alive);
    http_request_free(req);
}

static char *error_json(const char *message)
{
    return xasprintf("{\"error\":\"%s\"}", message);
}

static void on_close(void *arg)
{
    assert_ptr_equal(arg, &ctx);
    closes++;
}

static int setup(void **state)
{
    base = event_base_new();
    limits = (http_limits_t){
        .max_header_bytes = 512,
        .max_body_bytes = 64,
        .header_timeout_ms = 2000,
        .body_timeout_ms = 2000,
        .idle_timeout_ms = 2000,
        .max_connections = 10,
    };
    memset(&stats, 0, sizeof(stats));
    memset(&seen, 0, sizeof(seen));
    draining = false;
    closes = 0;
    ctx = (http_context_t){.base = base,
                           .limits = &limits,
                           .stats = &stats,
                           .draining = &draining,
                           .on_close = on_close,
                           .arg = &ctx};
    site = (http_site_t){.ctx = &ctx,
                         .handler = handle,
                         .arg = &seen,
                         .name = "test",
                         .error_body = error_json,
                         .error_type = "application/json"};
    int fds[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    evutil_make_socket_nonblocking(fds[0]);
    evutil_make_socket_nonblocking(fds[1]);
    http_conn_accept(NULL, fds[0], NULL, 0, &site);
    agent = fds[1];
    return 0;
}

static int teardown(void **state)
{
    if (agent >= 0)
        close(agent);
    agent = -1;
    for (int i = 0; i < 200 && ctx.open > 0; i++)
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    assert_int_equal(ctx.open, 0);
    event_base_free(base);
    return 0;
}

static void send_str(const char *s)
{
    assert_int_equal(write(agent, s, strlen(s)), (ssize_t)strlen(s));
}

/* Runs the loop and collects what the agent receives until it holds want responses (counted
 * by status lines), the connection closed, or a few hundred passes went by. */
static char *receive(int want, bool *closed)
{
    static char buf[8192];
    size_t len = 0;
    *closed = false;
    for (int i = 0; i < 400; i++) {
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        ssize_t n = read(agent, buf + len, sizeof(buf) - 1 - len);
        if (n == 0) {
            *closed = true;
            break;
        }
        if (n > 0)
            len += (size_t)n;
        buf[len] = '\0';
        int got = 0;
        for (const char *p = buf; (p = strstr(p, "HTTP/1.1 ")); p++)
            got++;
        if (got >= want && n < 0 && i > 20) /* and nothing more has come since */
            break;
        usleep(500);
    }
    buf[len] = '\0';
    return buf;
}

static void test_request_handed_to_handler(void **state)
{
    send_str("POST /mcp?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello");
    bool closed;
    const char *r = receive(1, &closed);
    assert_int_equal(seen.n, 1);
    assert_string_equal(seen.target[0], "/mcp?x=1");
    assert_string_equal(seen.body[0], "hello");
    assert_true(seen.keep_alive[0]);
    assert_string_equal(r, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 11\r\n"
                           "\r\nok /mcp?x=1");
    assert_false(closed);
    assert_int_equal(stats.requests, 1);
    assert_int_equal(stats.connections, 1);
    assert_int_equal(ctx.open, 1);
}

static void test_keep_alive(void **state)
{
    bool closed;
    send_str("GET /a HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_non_null(strstr(receive(1, &closed), "ok /a"));
    assert_false(closed);
    send_str("GET /b HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    const char *r = receive(1, &closed);
    assert_non_null(strstr(r, "Connection: close\r\n"));
    assert_non_null(strstr(r, "ok /b"));
    assert_true(closed);
    assert_int_equal(seen.n, 2);
    assert_false(seen.keep_alive[1]);
    /* the write side is shut; the connection lingers, reading, until the agent closes too */
    assert_int_equal(ctx.open, 1);
    close(agent);
    agent = -1;
    for (int i = 0; i < 50 && ctx.open > 0; i++)
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    assert_int_equal(ctx.open, 0);
    assert_int_equal(closes, 1);
}

static void test_pipelined(void **state)
{
    send_str("GET /1 HTTP/1.1\r\nHost: a\r\n\r\n"
             "POST /2 HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc"
             "GET /3 HTTP/1.1\r\nHost: a\r\n\r\n");
    bool closed;
    const char *r = receive(3, &closed);
    assert_int_equal(seen.n, 3);
    assert_string_equal(seen.target[0], "/1");
    assert_string_equal(seen.target[1], "/2");
    assert_string_equal(seen.body[1], "abc");
    assert_string_equal(seen.target[2], "/3");
    /* answered in order */
    const char *a = strstr(r, "ok /1"), *b = strstr(r, "ok /2"), *c = strstr(r, "ok /3");
    assert_true(a && b && c && a < b && b < c);
    assert_false(closed);
}

static void test_header_too_large(void **state)
{
    char req[1024];
    snprintf(req, sizeof(req), "GET / HTTP/1.1\r\nHost: a\r\nX-Big: %0600d\r\n\r\n", 0);
    send_str(req);
    bool closed;
    const char *r = receive(1, &closed);
    assert_string_equal(r, "HTTP/1.1 431 Request Header Fields Too Large\r\n"
                           "Content-Type: application/json\r\nContent-Length: 37\r\n"
                           "Connection: close\r\n\r\n{\"error\":\"request headers too large\"}");
    assert_true(closed);
    assert_int_equal(seen.n, 0);
    assert_int_equal(stats.bad_requests, 1);
}

static void test_body_too_large(void **state)
{
    /* declared too large: refused before a byte of the body */
    send_str("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 65\r\n\r\n");
    bool closed;
    const char *r = receive(1, &closed);
    assert_non_null(strstr(r, "HTTP/1.1 413 Content Too Large\r\n"));
    assert_non_null(strstr(r, "{\"error\":\"request body too large\"}"));
    assert_true(closed);
    assert_int_equal(seen.n, 0);
}

static void test_chunked_body_too_large(void **state)
{
    /* no length given: refused when the chunks pass the limit */
    send_str("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
             "40\r\n0123456789012345678901234567890123456789012345678901234567890123\r\n"
             "1\r\nx\r\n0\r\n\r\n");
    bool closed;
    const char *r = receive(1, &closed);
    assert_non_null(strstr(r, "HTTP/1.1 413 Content Too Large\r\n"));
    assert_true(closed);
    assert_int_equal(seen.n, 0);
}

static void test_bad_header_name(void **state)
{
    /* the site writes no error body of its own: plain text */
    site.error_body = NULL;
    send_str("GET / HTTP/1.1\r\nHost : a\r\n\r\n");
    bool closed;
    const char *r = receive(1, &closed);
    assert_non_null(strstr(r, "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n"));
    assert_non_null(strstr(r, "\r\n\r\nmalformed HTTP request: a header name is not a token"));
    assert_true(closed);
}

static void test_drain_closes_idle(void **state)
{
    bool closed;
    send_str("GET /a HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_non_null(strstr(receive(1, &closed), "ok /a"));
    assert_false(closed);
    assert_int_equal(ctx.open, 1);
    draining = true;
    http_conn_close_idle(&ctx);
    receive(1, &closed);
    assert_true(closed);
    assert_int_equal(ctx.open, 0);
    assert_int_equal(closes, 1);
    /* no new connection while draining */
    int fds[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    http_conn_accept(NULL, fds[0], NULL, 0, &site);
    assert_int_equal(ctx.open, 0);
    char c;
    assert_int_equal(read(fds[1], &c, 1), 0);
    close(fds[1]);
}

static void test_drain_closes_on_next_request(void **state)
{
    /* an idle connection that sends a request once the drain began is closed unanswered: the
     * agent retries it elsewhere */
    draining = true;
    send_str("GET /a HTTP/1.1\r\nHost: a\r\n\r\n");
    bool closed;
    const char *r = receive(1, &closed);
    assert_string_equal(r, "");
    assert_true(closed);
    assert_int_equal(seen.n, 0);
}

static void test_header_timeout(void **state)
{
    /* limits are read at each use: a change made after the connection opened applies */
    limits.header_timeout_ms = 20;
    send_str("GET / HTTP/1.1\r\nHost: a\r\n");
    bool closed;
    const char *r = receive(1, &closed);
    assert_non_null(strstr(r, "HTTP/1.1 408 Request Timeout\r\n"));
    assert_non_null(strstr(r, "{\"error\":\"request not received in time\"}"));
    assert_true(closed);
    assert_int_equal(seen.n, 0);
}

/* --- handing a connection to another worker --- */

static char handed[512];
static int handed_fd = -1;

static bool fake_send(void *arg, int fd, const char *bytes, size_t len)
{
    assert_ptr_equal(arg, handed);
    assert_true(len < sizeof(handed));
    memcpy(handed, bytes, len);
    handed[len] = '\0';
    handed_fd = dup(fd);
    return true;
}

static void handle_by_handing_off(void *arg, http_conn_t *conn, http_request_t *req)
{
    seen.n++;
    assert_true(http_conn_hand_off(conn, req, sizeof(handed) - 1, fake_send, handed));
    http_request_free(req);
}

static void test_hand_off(void **state)
{
    site.handler = handle_by_handing_off;
    send_str("GET /mcp HTTP/1.1\r\nHost: a\r\nLast-Event-ID: 7\r\n\r\nGET /next");
    bool closed;
    const char *r = receive(1, &closed);
    assert_int_equal(seen.n, 1);
    /* nothing written to the agent; this process's copy of the socket is closed */
    assert_string_equal(r, "");
    assert_int_equal(ctx.open, 0);
    /* the request as sent, and what followed it */
    assert_string_equal(handed,
                        "GET /mcp HTTP/1.1\r\nHost: a\r\nLast-Event-ID: 7\r\n\r\nGET /next");
    /* the receiver's copy still reaches the agent */
    assert_true(handed_fd >= 0);
    assert_int_equal(write(handed_fd, "x", 1), 1);
    char c = 0;
    assert_int_equal(read(agent, &c, 1), 1);
    assert_int_equal(c, 'x');
    close(handed_fd);
    handed_fd = -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_request_handed_to_handler, setup, teardown),
        cmocka_unit_test_setup_teardown(test_keep_alive, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipelined, setup, teardown),
        cmocka_unit_test_setup_teardown(test_header_too_large, setup, teardown),
        cmocka_unit_test_setup_teardown(test_body_too_large, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chunked_body_too_large, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_header_name, setup, teardown),
        cmocka_unit_test_setup_teardown(test_drain_closes_idle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_drain_closes_on_next_request, setup, teardown),
        cmocka_unit_test_setup_teardown(test_header_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hand_off, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
