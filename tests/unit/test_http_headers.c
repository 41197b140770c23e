/* Header lists and what crosses the proxy. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "http_headers.h"

#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void add(http_headers_t *h, const char *name, const char *value)
{
    /* llhttp may split names and values anywhere: do it here too */
    size_t nl = strlen(name), vl = strlen(value);
    http_headers_add_name(h, name, nl / 2);
    http_headers_add_name(h, name + nl / 2, nl - nl / 2);
    http_headers_end_name(h);
    if (vl) {
        http_headers_add_value(h, value, 1);
        http_headers_add_value(h, value + 1, vl - 1);
    }
    http_headers_end_value(h);
}

static char *drain(struct evbuffer *b)
{
    size_t n = evbuffer_get_length(b);
    char *s = malloc(n + 1);
    evbuffer_remove(b, s, n);
    s[n] = '\0';
    return s;
}

static void test_pieces_and_lookup(void **state)
{
    http_headers_t h;
    http_headers_init(&h);
    add(&h, "Content-Type", "application/json");
    add(&h, "X-Empty", "");
    add(&h, "Mcp-Session-Id", "abc");
    assert_int_equal(h.n, 3);
    assert_string_equal(http_headers_get(&h, "content-type"), "application/json");
    assert_string_equal(http_headers_get(&h, "MCP-SESSION-ID"), "abc");
    assert_string_equal(http_headers_get(&h, "x-empty"), "");
    assert_null(http_headers_get(&h, "content"));
    assert_string_equal(http_headers_name(&h, 1), "X-Empty");
    http_headers_reset(&h);
    assert_int_equal(h.n, 0);
    assert_null(http_headers_get(&h, "content-type"));
    http_headers_free(&h);
}

static void test_optional_whitespace_trimmed(void **state)
{
    http_headers_t h;
    http_headers_init(&h);
    add(&h, "X-Subject", "alice \t ");
    add(&h, "X-Lead", " \tbob");
    add(&h, "X-Inner", "a b\tc");
    add(&h, "X-Blank", " \t ");
    add(&h, "X-After", "next");
    assert_string_equal(http_headers_get(&h, "x-subject"), "alice");
    assert_string_equal(http_headers_get(&h, "x-lead"), "bob");
    assert_string_equal(http_headers_get(&h, "x-inner"), "a b\tc");
    assert_string_equal(http_headers_get(&h, "x-blank"), "");
    assert_string_equal(http_headers_get(&h, "x-after"), "next");
    assert_string_equal(http_headers_name(&h, 4), "X-After");
    http_headers_free(&h);
}

static void test_count_and_remove(void **state)
{
    http_headers_t h;
    http_headers_init(&h);
    add(&h, "Idempotency-Key", "one");
    add(&h, "Accept", "*/*");
    add(&h, "idempotency-key", "two");
    assert_int_equal(http_headers_count(&h, "IDEMPOTENCY-KEY"), 2);
    assert_int_equal(http_headers_count(&h, "accept"), 1);
    assert_int_equal(http_headers_count(&h, "host"), 0);
    http_headers_remove(&h, "Idempotency-Key");
    assert_int_equal(h.n, 1);
    assert_null(http_headers_get(&h, "idempotency-key"));
    assert_string_equal(http_headers_get(&h, "accept"), "*/*");
    http_headers_free(&h);
}

static void test_name_is_token(void **state)
{
    static const struct {
        const char *name;
        bool token;
    } cases[] = {
        {"Content-Type", true}, {"X_Y.z~!#$%&'*+^`|", true},
        {"Foo ", false},        {"Foo\t", false},
        {" Foo", false},        {"Fo o", false},
        {"Foo:", false},        {"", false},
        {"a\x7f", false},       {"caf\xc3\xa9", false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_int_equal(http_header_name_is_token(cases[i].name), cases[i].token);
    /* each byte value inside a name: a token character exactly when RFC 9110's tchar lists it */
    for (int c = 1; c < 256; c++) {
        bool tchar = (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                     (c < 0x80 && strchr("!#$%&'*+-.^_`|~", c) != NULL);
        char name[4] = {'a', (char)c, 'b', '\0'};
        assert_int_equal(http_header_name_is_token(name), tchar);
    }
}

static void test_hop_by_hop(void **state)
{
    static const struct {
        const char *name;
        const char *connection;
        bool hop;
    } cases[] = {
        {"Connection", NULL, true},
        {"keep-alive", NULL, true},
        {"Transfer-Encoding", NULL, true},
        {"TE", NULL, true},
        {"Upgrade", NULL, true},
        {"Proxy-Authorization", NULL, true},
        {"Trailer", NULL, true},
        {"Authorization", NULL, false},
        {"Mcp-Session-Id", NULL, false},
        {"Last-Event-ID", NULL, false},
        {"traceparent", NULL, false},
        {"X-Custom", "keep-alive, x-custom", true},
        {"X-Custom", "x-customer", false},
        {"Mcp-Param-Region", NULL, false},
        {"TRAILERS", NULL, true},
        {"Proxy-Connection", NULL, true},
        {"proxy-authenticate", NULL, true},
        {"Keep-Alive", NULL, true},
        {"T", NULL, false},
        {"Tea", NULL, false},
        {"Upgrades", NULL, false},
        {"Keep-Alive2", NULL, false},
        {"Transfer-Encodings", NULL, false},
        {"", NULL, false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_int_equal(http_header_is_hop_by_hop(cases[i].name, cases[i].connection),
                         cases[i].hop);
}

static void test_request_head(void **state)
{
    http_headers_t h;
    http_headers_init(&h);
    add(&h, "Host", "localhost:8080");
    add(&h, "Connection", "keep-alive, X-Drop");
    add(&h, "X-Drop", "1");
    add(&h, "Authorization", "Bearer t");
    add(&h, "Mcp-Session-Id", "s1");
    add(&h, "MCP-Protocol-Version", "2025-11-25");
    add(&h, "Accept", "application/json, text/event-stream");
    add(&h, "Content-Length", "999");
    add(&h, "Transfer-Encoding", "chunked");
    add(&h, "X-Forwarded-For", "10.0.0.1");
    add(&h, "traceparent", "00-abc-def-01");
    add(&h, "Hostname", "h"); /* names a letter longer than dropped ones: kept */
    add(&h, "CONTENT-LENGTHS", "1");
    add(&h, "Accept-Encoding", "gzip, br");
    for (size_t i = 0; i < h.n; i++)
        assert_int_equal(http_headers_name_len(&h, i), strlen(http_headers_name(&h, i)));
    struct evbuffer *b = evbuffer_new();
    /* the extra lines replace the request's own headers of the same names */
    http_write_request_head(b, "POST", "/mcp?x=1", &h, "127.0.0.1:3001", "127.0.0.2", 12,
                            "Idempotency-Key: k\r\naccept-encoding: identity\r\n");
    char *s = drain(b);
    assert_string_equal(s, "POST /mcp?x=1 HTTP/1.1\r\n"
                           "Host: 127.0.0.1:3001\r\n"
                           "Authorization: Bearer t\r\n"
                           "Mcp-Session-Id: s1\r\n"
                           "MCP-Protocol-Version: 2025-11-25\r\n"
                           "Accept: application/json, text/event-stream\r\n"
                           "traceparent: 00-abc-def-01\r\n"
                           "Hostname: h\r\n"
                           "CONTENT-LENGTHS: 1\r\n"
                           "X-Forwarded-For: 10.0.0.1, 127.0.0.2\r\n"
                           "Content-Length: 12\r\n"
                           "Idempotency-Key: k\r\n"
                           "accept-encoding: identity\r\n"
                           "\r\n");
    free(s);
    evbuffer_free(b);
    http_headers_free(&h);
}

static void test_response_head(void **state)
{
    http_headers_t h;
    http_headers_init(&h);
    add(&h, "Content-Type", "text/event-stream");
    add(&h, "Transfer-Encoding", "chunked");
    add(&h, "Connection", "keep-alive");
    add(&h, "mcp-session-id", "s9");
    struct evbuffer *b = evbuffer_new();
    http_write_response_head(b, 200, NULL, &h, -1, true, NULL);
    char *s = drain(b);
    assert_string_equal(s, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                           "mcp-session-id: s9\r\nTransfer-Encoding: chunked\r\n\r\n");
    free(s);
    http_write_response_head(b, 202, NULL, NULL, 0, false, "X-A: b\r\n");
    s = drain(b);
    assert_string_equal(s, "HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\nConnection: close\r\n"
                           "X-A: b\r\n\r\n");
    free(s);
    /* an answer of the gateway's own: its type first; -2 writes no framing at all */
    http_write_response_head(b, 413, "application/json", NULL, 12, true, NULL);
    s = drain(b);
    assert_string_equal(s, "HTTP/1.1 413 Content Too Large\r\nContent-Type: application/json\r\n"
                           "Content-Length: 12\r\n\r\n");
    free(s);
    http_write_response_head(b, 304, NULL, NULL, -2, true, NULL);
    s = drain(b);
    assert_string_equal(s, "HTTP/1.1 304 Not Modified\r\n\r\n");
    free(s);
    /* a field longer than a line on the stack, a length of many digits */
    char big[700];
    memset(big, 'v', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    http_headers_t g;
    http_headers_init(&g);
    add(&g, "x-big", big);
    http_write_response_head(b, 200, NULL, &g, 123456789012LL, true, NULL);
    s = drain(b);
    char *want = NULL;
    assert_true(asprintf(&want,
                         "HTTP/1.1 200 OK\r\nx-big: %s\r\nContent-Length: 123456789012\r\n\r\n",
                         big) > 0);
    assert_string_equal(s, want);
    free(want);
    free(s);
    http_headers_free(&g);
    evbuffer_free(b);
    http_headers_free(&h);
    assert_string_equal(http_status_reason(431), "Request Header Fields Too Large");
    assert_string_equal(http_status_reason(302), "Found");
    assert_string_equal(http_status_reason(308), "Permanent Redirect");
}

/* A chunked head made to carry a length: short and long lengths, a head in two pieces, and
 * one that is not chunked. */
static void test_head_set_length(void **state)
{
    static const struct {
        long long len;
        const char *want;
    } cases[] = {
        {0, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 0\r\n"
            "Connection: keep-alive\r\n\r\n"},
        {1234567890, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                     "1234567890\r\nConnection: keep-alive\r\n\r\n"},
        {123456789012345LL, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                            "123456789012345\r\nConnection: keep-alive\r\n\r\n"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct evbuffer *h = evbuffer_new();
        evbuffer_add_printf(h, "HTTP/1.1 200 OK\r\nContent-Type: application/json");
        evbuffer_add_printf(h, "\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n");
        assert_true(http_head_set_length(h, cases[i].len));
        size_t n = evbuffer_get_length(h);
        assert_int_equal(n, strlen(cases[i].want));
        assert_memory_equal(evbuffer_pullup(h, -1), cases[i].want, n);
        evbuffer_free(h);
    }
    struct evbuffer *h = evbuffer_new();
    evbuffer_add_printf(h, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n");
    assert_false(http_head_set_length(h, 5));
    assert_int_equal(evbuffer_get_length(h),
                     strlen("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n"));
    evbuffer_free(h);
}

static void test_chunks(void **state)
{
    (void)state;
    char line[HTTP_CHUNK_LINE_MAX];
    assert_int_equal(http_chunk_line(line, 26), 4);
    assert_memory_equal(line, "1a\r\n", 4);
    struct evbuffer *out = evbuffer_new();
    http_chunk_add(out, "hello", 5);
    http_chunk_add(out, "", 0); /* an empty chunk would end the body: the caller never sends one */
    evbuffer_add(out, HTTP_CHUNK_LAST, strlen(HTTP_CHUNK_LAST));
    size_t n = evbuffer_get_length(out);
    const char *want = "5\r\nhello\r\n0\r\n\r\n0\r\n\r\n";
    assert_int_equal(n, strlen(want));
    assert_memory_equal(evbuffer_pullup(out, -1), want, n);
    evbuffer_free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pieces_and_lookup),
        cmocka_unit_test(test_optional_whitespace_trimmed),
        cmocka_unit_test(test_count_and_remove),
        cmocka_unit_test(test_name_is_token),
        cmocka_unit_test(test_hop_by_hop),
        cmocka_unit_test(test_request_head),
        cmocka_unit_test(test_response_head),
        cmocka_unit_test(test_chunks),
        cmocka_unit_test(test_head_set_length),
    };
    return cmocka_run_group_tests_name("http_headers", tests, NULL, NULL);
}
