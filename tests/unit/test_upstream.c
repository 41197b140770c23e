/* The upstream response path without a socket: framing decides where a response ends, so
 * what follows it is never read as part of it, and a close-delimited body is complete at the
 * close. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "upstream.h"

#include <string.h>

/* upstream.c links against the process; the socketless parser never reaches it */

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_framing),
        cmocka_unit_test(test_keep_alive),
    };
    return cmocka_run_group_tests_name("upstream", tests, NULL, NULL);
}
