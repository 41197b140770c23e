/* The bodies the router relays without reading them as MCP, as tables of cases: a body on a
 * method that has none, and off the endpoint anything but UTF-8 (UTF-16 and UTF-32 with or
 * without their byte order mark, another charset named, NULs and bytes that are not UTF-8 in a
 * body relayed as text), each refused; what clients send there (OAuth forms, JSON, uploads)
 * relayed. */
#include "body_rules.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <llhttp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct method_case {
    int method;
    const char *content_length, *transfer_encoding;
    size_t body_len;
    body_rules_status_t st;
} method_case_t;

static const method_case_t method_cases[] = {
    {HTTP_GET, NULL, NULL, 0, BODY_RULES_OK},
    {HTTP_GET, "0", NULL, 0, BODY_RULES_OK},
    {HTTP_GET, "00", NULL, 0, BODY_RULES_OK},
    {HTTP_GET, "12", NULL, 12, BODY_RULES_ERR_METHOD},
    {HTTP_GET, "10", NULL, 0, BODY_RULES_ERR_METHOD},      /* declared, whatever arrived */
    {HTTP_GET, NULL, "chunked", 0, BODY_RULES_ERR_METHOD}, /* chunked framing, even of nothing */
    {HTTP_GET, NULL, NULL, 3, BODY_RULES_ERR_METHOD},
    {HTTP_HEAD, "5", NULL, 5, BODY_RULES_ERR_METHOD},
    {HTTP_HEAD, NULL, NULL, 0, BODY_RULES_OK},
    {HTTP_DELETE, NULL, "chunked", 4, BODY_RULES_ERR_METHOD},
    {HTTP_DELETE, "0", NULL, 0, BODY_RULES_OK},
    {HTTP_TRACE, "1", NULL, 1, BODY_RULES_ERR_METHOD},
    {HTTP_POST, "12", NULL, 12, BODY_RULES_OK},
    {HTTP_PUT, NULL, "chunked", 12, BODY_RULES_OK},
    {HTTP_OPTIONS, "2", NULL, 2, BODY_RULES_OK},
    {HTTP_PATCH, "2", NULL, 2, BODY_RULES_OK},
};

static void test_method(void **state)
{
    for (size_t i = 0; i < ARRAY_LEN(method_cases); i++) {
        const method_case_t *c = &method_cases[i];
        body_rules_status_t st =
            body_rules_method(c->method, c->content_length, c->transfer_encoding, c->body_len);
        if (st != c->st)
            fail_msg("case %zu (%s): %d, want %d", i, llhttp_method_name(c->method), st, c->st);
    }
}

/* A body and its Content-Type; len 0 means strlen. */
typedef struct body_case {
    const char *content_type;
    const char *body;
    size_t len;
    body_rules_status_t encoding; /* body_rules_encoding */
    body_rules_status_t text;     /* body_rules_text, when encoding passed */
} body_case_t;

#define CALL "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\"}"

static const body_case_t body_cases[] = {
    /* what clients send off the endpoint */
    {"application/x-www-form-urlencoded", "grant_type=client_credentials", 0, BODY_RULES_OK,
     BODY_RULES_OK},
    {"application/json; charset=utf-8", "{\"client_name\":\"x\"}", 0, BODY_RULES_OK, BODY_RULES_OK},
    {"text/plain;charset=\"UTF-8\"", "caf\xc3\xa9", 0, BODY_RULES_OK, BODY_RULES_OK},
    {"text/plain; charset=us-ascii", "plain", 0, BODY_RULES_OK, BODY_RULES_OK},
    {NULL, "no type at all", 0, BODY_RULES_OK, BODY_RULES_OK},
    {"image/png", "\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16, BODY_RULES_OK, BODY_RULES_OK},
    {"video/mp4",
     "\0\0\0\x18"
     "ftypmp42",
     12, BODY_RULES_OK, BODY_RULES_OK},
    {"Audio/MPEG", "\xff\xfb\x90\x00", 4, BODY_RULES_OK, BODY_RULES_OK},
    {"application/octet-stream", "\x01\x02\xff\0", 4, BODY_RULES_OK, BODY_RULES_OK},
    /* JSON in UTF-16 and UTF-32, with and without a byte order mark, whatever its type */
    {"text/plain", "\xff\xfe{\0\"\0", 6, BODY_RULES_ERR_WIDE, 0},
    {"text/plain", "\xfe\xff\0{\0\"", 6, BODY_RULES_ERR_WIDE, 0},
    {NULL, "{\0\"\0j\0", 6, BODY_RULES_ERR_WIDE, 0},
    {NULL, " \0\n\0[\0", 6, BODY_RULES_ERR_WIDE, 0},
    {"text/plain", "\0{\0\"", 4, BODY_RULES_ERR_WIDE, 0},
    {"application/x-www-form-urlencoded", "{\0\0\0\"\0\0\0", 8, BODY_RULES_ERR_WIDE, 0},
    {NULL, "\0\0\0{\0\0\0\"", 8, BODY_RULES_ERR_WIDE, 0},
    {NULL, "\xff\xfe\0\0{\0\0\0", 8, BODY_RULES_ERR_WIDE, 0},
    {NULL, "\0\0\xfe\xff\0\0\0{", 8, BODY_RULES_ERR_WIDE, 0},
    {"image/png", "{\0\"\0j\0", 6, BODY_RULES_ERR_WIDE, 0},
    {"application/octet-stream", "\xff\xfe{\0", 4, BODY_RULES_ERR_WIDE, 0},
    /* a UTF-16 byte order mark before anything is refused, JSON or not */
    {NULL, "\xff\xfeh\0i\0", 6, BODY_RULES_ERR_WIDE, 0},
    /* another charset named: what a server decodes is not what the gateway scanned */
    {"text/plain; charset=utf-16le", "{\"a\":1}", 0, BODY_RULES_ERR_CHARSET, 0},
    {"application/json;charset=UTF-7", "+AHs-", 0, BODY_RULES_ERR_CHARSET, 0},
    {"text/plain; format=flowed; charset=\"iso-8859-1\"", "x", 0, BODY_RULES_ERR_CHARSET, 0},
    {"image/png; charset=utf-16", "\x89PNG", 4, BODY_RULES_ERR_CHARSET, 0},
    /* text that is not UTF-8 */
    {"text/plain", "a\0b", 3, BODY_RULES_OK, BODY_RULES_ERR_NUL},
    {NULL, "caf\xe9", 4, BODY_RULES_OK, BODY_RULES_ERR_UTF8},
    {"application/json", CALL "\xff", sizeof(CALL), BODY_RULES_OK, BODY_RULES_ERR_UTF8},
    {"multipart/form-data; boundary=x", "--x\r\n\x89PNG", 9, BODY_RULES_OK, BODY_RULES_ERR_UTF8},
    /* a type that only starts like a listed one is not one */
    {"image", "\xff", 1, BODY_RULES_OK, BODY_RULES_ERR_UTF8},
    {"application/octet-streamx", "\xff", 1, BODY_RULES_OK, BODY_RULES_ERR_UTF8},
    {"text/image/png", "\xff", 1, BODY_RULES_OK, BODY_RULES_ERR_UTF8},
};

static void test_bodies(void **state)
{
    for (size_t i = 0; i < ARRAY_LEN(body_cases); i++) {
        const body_case_t *c = &body_cases[i];
        size_t len = c->len ? c->len : strlen(c->body);
        body_rules_status_t st = body_rules_encoding(c->content_type, c->body, len);
        if (st != c->encoding)
            fail_msg("case %zu (%s): encoding %d, want %d", i,
                     c->content_type ? c->content_type : "no type", st, c->encoding);
        if (st != BODY_RULES_OK)
            continue;
        st = body_rules_text(c->content_type, c->body, len);
        if (st != c->text)
            fail_msg("case %zu (%s): text %d, want %d", i,
                     c->content_type ? c->content_type : "no type", st, c->text);
    }
}

static void test_status_strings(void **state)
{
    for (int st = BODY_RULES_OK; st <= BODY_RULES_ERR_UTF8; st++)
        assert_string_not_equal(body_rules_status_str((body_rules_status_t)st), "unknown");
    assert_non_null(strstr(body_rules_status_str(BODY_RULES_ERR_WIDE), "UTF-16"));
    assert_non_null(strstr(body_rules_status_str(BODY_RULES_ERR_METHOD), "GET"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_method),
        cmocka_unit_test(test_bodies),
        cmocka_unit_test(test_status_strings),
    };
    return cmocka_run_group_tests_name("body_rules", tests, NULL, NULL);
}
