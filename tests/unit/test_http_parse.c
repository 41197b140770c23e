/* The shared llhttp set-up without sockets: where a message ends, the head limit, strict
 * header names, a refusal by the owner, and the same result fed whole or byte by byte. */
#include "http_parse.h"

#include <event2/buffer.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

typedef struct owner {
    http_parser_t parser;
    http_headers_t headers;
    int begins, heads, ends;
    char target[64];
    char body[64];
    size_t body_len;
    bool refuse_body;
} owner_t;

static int on_begin(void *arg)
{
    owner_t *o = arg;
    o->begins++;
    http_headers_reset(&o->headers);
    o->target[0] = '\0';
    return 0;
}

static int on_url(void *arg, const char *at, size_t len)
{
    owner_t *o = arg;
    strncat(o->target, at,
            len < sizeof(o->target) - strlen(o->target) - 1
                ? len
                : sizeof(o->target) - strlen(o->target) - 1);
    return 0;
}

static int on_head(void *arg)
{
    ((owner_t *)arg)->heads++;
    return 0;
}

static int on_body(void *arg, const char *at, size_t len)
{
    owner_t *o = arg;
    if (o->refuse_body)
        return -1;
    assert_true(o->body_len + len < sizeof(o->body));
    memcpy(o->body + o->body_len, at, len);
    o->body_len += len;
    return 0;
}

static int on_end(void *arg)
{
    owner_t *o = arg;
    /* an interim response goes on to the real one */
    if (o->parser.llhttp.type == HTTP_RESPONSE && o->parser.llhttp.status_code < 200)
        return 0;
    o->ends++;
    return HTTP_PARSE_STOP;
}

static const http_parse_cbs_t cbs = {on_begin, on_url, on_head, on_body, on_end};

static uint64_t limit = 64;

static void owner_init(owner_t *o, llhttp_type_t type, bool strict)
{
    memset(o, 0, sizeof(*o));
    http_headers_init(&o->headers);
    http_parse_init(&o->parser, type, &cbs, o, &o->headers, &limit, strict);
}

static void test_error_str(void **state)
{
    assert_string_equal(http_parse_error_str(HTTP_PARSE_ERR_NONE), "none");
    assert_string_equal(http_parse_error_str(HTTP_PARSE_ERR_HEAD_TOO_LARGE), "head too large");
    assert_string_equal(http_parse_error_str(HTTP_PARSE_ERR_BAD_HEADER_NAME),
                        "header name not a token");
    assert_string_equal(http_parse_error_str(HTTP_PARSE_ERR_REFUSED), "refused");
    assert_string_equal(http_parse_error_str(HTTP_PARSE_ERR_INVALID), "invalid HTTP");
    assert_string_equal(http_parse_error_str((http_parse_error_t)99), "unknown");
}

static void test_cases(void **state)
{
    static const struct {
        llhttp_type_t type;
        bool strict;
        const char *bytes;
        http_parse_result_t res;
        http_parse_error_t err;
        size_t used; /* when END */
        const char *body;
    } cases[] = {
        {HTTP_REQUEST, true, "GET /a HTTP/1.1\r\nHost: x\r\n\r\n", HTTP_PARSE_END, 0, 28, ""},
        /* the next request is left unread */
        {HTTP_REQUEST, true, "POST /b HTTP/1.1\r\nContent-Length: 2\r\n\r\nhiGET /", HTTP_PARSE_END,
         0, 41, "hi"},
        {HTTP_REQUEST, true, "GET /a HTTP/1.1\r\nHost: x\r\n", HTTP_PARSE_MORE, 0, 0, ""},
        /* target and fields: 2 + 4 + 58 = 64 bytes is the limit, 65 is over */
        {HTTP_REQUEST, true,
         "GET /a HTTP/1.1\r\nHost: 0123456789012345678901234567890123456789012345678901234567\r\n"
         "\r\n",
         HTTP_PARSE_END, 0, 85, ""},
        {HTTP_REQUEST, true,
         "GET /ab HTTP/1.1\r\nHost: 0123456789012345678901234567890123456789012345678901234567\r\n"
         "\r\n",
         HTTP_PARSE_FAILED, HTTP_PARSE_ERR_HEAD_TOO_LARGE, 0, ""},
        {HTTP_REQUEST, true, "GET / HTTP/1.1\r\nHost : x\r\n\r\n", HTTP_PARSE_FAILED,
         HTTP_PARSE_ERR_BAD_HEADER_NAME, 0, ""},
        {HTTP_REQUEST, true, "GET / HTTP/1.1\nHost: x\n\n", HTTP_PARSE_FAILED,
         HTTP_PARSE_ERR_INVALID, 0, ""},
        {HTTP_RESPONSE, false,
         "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nxHTTP",
         HTTP_PARSE_END, 0, 64, "x"},
        {HTTP_RESPONSE, false,
         "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\ny\r\n0\r\n\r\n", HTTP_PARSE_END,
         0, 58, "y"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *b = cases[i].bytes;
        size_t len = strlen(b);
        /* whole, then one byte at a time: the same outcome */
        for (int bytewise = 0; bytewise < 2; bytewise++) {
            owner_t o;
            owner_init(&o, cases[i].type, cases[i].strict);
            http_parse_result_t res = HTTP_PARSE_MORE;
            size_t at = 0, used = 0;
            while (at < len && res == HTTP_PARSE_MORE) {
                size_t n = bytewise ? 1 : len - at;
                res = http_parse_feed(&o.parser, b + at, n, &used);
                at += used;
            }
            if (res != cases[i].res || o.parser.error != cases[i].err)
                fail_msg("case %zu%s: result %d error %s", i, bytewise ? " bytewise" : "", res,
                         http_parse_error_str(o.parser.error));
            if (res == HTTP_PARSE_END) {
                assert_int_equal(at, cases[i].used);
                assert_int_equal(o.ends, 1);
                assert_int_equal(o.body_len, strlen(cases[i].body));
                assert_memory_equal(o.body, cases[i].body, o.body_len);
            }
            http_headers_free(&o.headers);
        }
    }
}

static void test_chunk_and_refusal(void **state)
{
    owner_t o;
    owner_init(&o, HTTP_REQUEST, true);
    struct evbuffer *in = evbuffer_new();
    evbuffer_add_printf(in, "GET /one HTTP/1.1\r\nX-A: 1\r\n\r\nGET /two HTTP/1.1\r\n\r\n");
    assert_int_equal(http_parse_chunk(&o.parser, in), HTTP_PARSE_END);
    assert_string_equal(o.target, "/one");
    assert_string_equal(http_headers_get(&o.headers, "x-a"), "1");
    /* the parser goes on with the next message */
    assert_int_equal(http_parse_chunk(&o.parser, in), HTTP_PARSE_END);
    assert_string_equal(o.target, "/two");
    assert_null(http_headers_get(&o.headers, "x-a"));
    assert_int_equal(evbuffer_get_length(in), 0);
    assert_int_equal(o.begins, 2);
    /* the owner refuses a body: FAILED, and the reason is the owner's */
    o.refuse_body = true;
    evbuffer_add_printf(in, "POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc");
    assert_int_equal(http_parse_chunk(&o.parser, in), HTTP_PARSE_FAILED);
    assert_int_equal(o.parser.error, HTTP_PARSE_ERR_REFUSED);
    evbuffer_free(in);
    http_headers_free(&o.headers);
}

static void test_close_delimited(void **state)
{
    owner_t o;
    owner_init(&o, HTTP_RESPONSE, false);
    const char *b = "HTTP/1.0 200 OK\r\n\r\nall of it";
    size_t used;
    assert_int_equal(http_parse_feed(&o.parser, b, strlen(b), &used), HTTP_PARSE_MORE);
    assert_int_equal(o.ends, 0);
    assert_true(http_parse_finish(&o.parser));
    assert_int_equal(o.ends, 1);
    assert_int_equal(o.body_len, 9);
    http_headers_free(&o.headers);
    /* a length not reached is cut short by the close */
    owner_init(&o, HTTP_RESPONSE, false);
    b = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab";
    assert_int_equal(http_parse_feed(&o.parser, b, strlen(b), &used), HTTP_PARSE_MORE);
    assert_false(http_parse_finish(&o.parser));
    assert_int_equal(o.ends, 0);
    http_headers_free(&o.headers);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_str),
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_chunk_and_refusal),
        cmocka_unit_test(test_close_delimited),
    };
    return cmocka_run_group_tests_name("http_parse", tests, NULL, NULL);
}
