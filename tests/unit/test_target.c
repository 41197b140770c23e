/* The request target's normal form and the endpoint match, as tables of cases: every spelling a
 * server framework routes to its MCP endpoint must be recognised as the endpoint. */
#include "target.h"

#include <stdarg.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

typedef struct norm_case {
    const char *raw;
    target_status_t st;
    const char *path;      /* expected on TARGET_OK */
    const char *query;     /* expected query, or NULL */
    const char *authority; /* expected authority, or NULL */
} norm_case_t;

static const norm_case_t norm_cases[] = {
    {"/mcp", TARGET_OK, "/mcp", NULL, NULL},
    {"/mcp?x=1", TARGET_OK, "/mcp", "x=1", NULL},
    {"/", TARGET_OK, "/", NULL, NULL},
    {"/./mcp", TARGET_OK, "/mcp", NULL, NULL},
    {"/x/../mcp", TARGET_OK, "/mcp", NULL, NULL},
    {"/../../mcp", TARGET_OK, "/mcp", NULL, NULL},
    {"//mcp", TARGET_OK, "/mcp", NULL, NULL},
    {"/a//b///c", TARGET_OK, "/a/b/c", NULL, NULL},
    {"/mcp/", TARGET_OK, "/mcp/", NULL, NULL},
    {"/mcp/.", TARGET_OK, "/mcp/", NULL, NULL},
    {"/mcp/x/..", TARGET_OK, "/mcp/", NULL, NULL},
    {"/a/b/../../mcp?q=/../", TARGET_OK, "/mcp", "q=/../", NULL},
    {"/%6Dcp", TARGET_OK, "/mcp", NULL, NULL},
    {"/%6dcp", TARGET_OK, "/mcp", NULL, NULL},
    {"/%2e/mcp", TARGET_OK, "/mcp", NULL, NULL},
    {"/x/%2E%2E/mcp", TARGET_OK, "/mcp", NULL, NULL},
    /* an escaped separator: a server that decodes it first sees other segments */
    {"/m%2fcp", TARGET_ERR_ENCODED_SLASH, NULL, NULL, NULL},
    {"/ab/..%2Fa/mcp", TARGET_ERR_ENCODED_SLASH, NULL, NULL, NULL},
    {"/ab/..%2fa/mcp", TARGET_ERR_ENCODED_SLASH, NULL, NULL, NULL},
    {"/ab/..%5Ca/mcp", TARGET_ERR_ENCODED_SLASH, NULL, NULL, NULL},
    {"/ab/..%5ca/mcp", TARGET_ERR_ENCODED_SLASH, NULL, NULL, NULL},
    {"http://h/x%2F..%2Fmcp", TARGET_ERR_ENCODED_SLASH, NULL, NULL, NULL},
    {"/mcp?next=%2Fa%5Cb", TARGET_OK, "/mcp", "next=%2Fa%5Cb", NULL},
    {"/a%252Fb", TARGET_OK, "/a%252Fb", NULL, NULL},
    {"/a%20b", TARGET_OK, "/a%20b", NULL, NULL},
    {"\\mcp", TARGET_OK, "/mcp", NULL, NULL},
    {"/x\\..\\mcp", TARGET_OK, "/mcp", NULL, NULL},
    {"/mcp#frag", TARGET_ERR_FRAGMENT, NULL, NULL, NULL},
    {"/mcp?a#b", TARGET_ERR_FRAGMENT, NULL, NULL, NULL},
    {"/m%cp", TARGET_ERR_ESCAPE, NULL, NULL, NULL},
    {"/mcp%", TARGET_ERR_ESCAPE, NULL, NULL, NULL},
    {"/mcp%4", TARGET_ERR_ESCAPE, NULL, NULL, NULL},
    {"mcp", TARGET_ERR_FORM, NULL, NULL, NULL},
    {"*", TARGET_OK, "*", NULL, NULL},
    {"http://anyhost/mcp", TARGET_OK, "/mcp", NULL, "anyhost"},
    {"HTTP://h:8080/./mcp?s=1", TARGET_OK, "/mcp", "s=1", "h:8080"},
    {"https://h", TARGET_OK, "/", NULL, "h"},
    {"http://h?x", TARGET_OK, "/", "x", "h"},
    {"http://user@h/mcp", TARGET_ERR_USERINFO, NULL, NULL, NULL},
    {"http:///mcp", TARGET_ERR_FORM, NULL, NULL, NULL},
    {"ftp://h/mcp", TARGET_ERR_FORM, NULL, NULL, NULL},
};

static void test_normalize_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(norm_cases); i++) {
        const norm_case_t *c = &norm_cases[i];
        target_t t;
        target_status_t st = target_normalize(c->raw, &t);
        if (st != c->st)
            fail_msg("%s: status %d (%s), want %d", c->raw, st, target_status_str(st), c->st);
        if (st == TARGET_OK) {
            if (strcmp(t.path, c->path) != 0)
                fail_msg("%s: path %s, want %s", c->raw, t.path, c->path);
            if ((t.query == NULL) != (c->query == NULL) ||
                (t.query && strcmp(t.query, c->query) != 0))
                fail_msg("%s: query %s, want %s", c->raw, t.query ? t.query : "(none)",
                         c->query ? c->query : "(none)");
            if ((t.authority == NULL) != (c->authority == NULL) ||
                (t.authority && strcmp(t.authority, c->authority) != 0))
                fail_msg("%s: authority %s, want %s", c->raw, t.authority ? t.authority : "(none)",
                         c->authority ? c->authority : "(none)");
        }
        target_free(&t);
    }
}

typedef struct endpoint_case {
    const char *path, *endpoint;
    bool is;
} endpoint_case_t;

static const endpoint_case_t endpoint_cases[] = {
    {"/mcp", "/mcp", true},
    {"/MCP", "/mcp", true},
    {"/Mcp", "/mcp", true},
    {"/mcp/", "/mcp", true},
    {"/mcp;jsessionid=1", "/mcp", true},
    {"/mcp;x/", "/mcp", true},
    {"/api/mcp", "/api/mcp", true},
    {"/API/Mcp/", "/api/mcp", true},
    {"/mcp/", "/mcp/", true},
    {"/mcp", "/mcp/", true},
    {"/", "/", true},
    {"/mcpx", "/mcp", false},
    {"/mc", "/mcp", false},
    {"/mcp/x", "/mcp", false},
    {"/api", "/api/mcp", false},
    {"/messages", "/mcp", false},
    {"/x", "/", false},
    {"/m%2Fcp", "/mcp", false},
};

static void test_endpoint_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(endpoint_cases); i++) {
        const endpoint_case_t *c = &endpoint_cases[i];
        if (target_is_endpoint(c->path, c->endpoint) != c->is)
            fail_msg("%s against %s: %s, want %s", c->path, c->endpoint,
                     c->is ? "not the endpoint" : "the endpoint", c->is ? "it" : "not it");
    }
}

static void test_origin_form(void **state)
{
    (void)state;
    char *s = target_origin_form("/mcp", "a=1");
    assert_string_equal(s, "/mcp?a=1");
    free(s);
    s = target_origin_form("/mcp", NULL);
    assert_string_equal(s, "/mcp");
    free(s);
}

static void test_status_strings(void **state)
{
    (void)state;
    for (int st = TARGET_OK; st <= TARGET_ERR_ENCODED_SLASH; st++)
        assert_string_not_equal(target_status_str((target_status_t)st), "unknown");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_normalize_table),
        cmocka_unit_test(test_endpoint_table),
        cmocka_unit_test(test_origin_form),
        cmocka_unit_test(test_status_strings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
