/* Which server a request goes to, and the target its router sees (routes.h), as a table. */
#include "routes.h"

#include <stdarg.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

/* Three servers: two in folders of their own, one at the top. The proxies are only compared. */
static struct proxy *const BILLING = (struct proxy *)1, *const FILES = (struct proxy *)2,
                           *const ROOT = (struct proxy *)3;

static const route_t three[] = {
    {"billing", "/billing/mcp", "/billing", "/api/mcp", BILLING},
    {"files", "/tools/files/mcp", "/tools/files", "/mcp", FILES},
    {"root", "/mcp", "", "/v1/mcp", ROOT},
};

typedef struct route_case {
    const char *path, *query;
    struct proxy *to; /* NULL: no server (404) */
    const char *target;
} route_case_t;

static const route_case_t cases[] = {
    /* the endpoints, however a framework would route them */
    {"/billing/mcp", NULL, BILLING, "/api/mcp"},
    {"/Billing/MCP", NULL, BILLING, "/api/mcp"},
    {"/billing/mcp/", "a=1", BILLING, "/api/mcp?a=1"},
    {"/billing/mcp;x", NULL, BILLING, "/api/mcp"},
    {"/tools/files/mcp", NULL, FILES, "/mcp"},
    {"/mcp", NULL, ROOT, "/v1/mcp"},
    /* other paths under a folder: under the upstream's folder */
    {"/billing/authorize", "q=2", BILLING, "/api/authorize?q=2"},
    {"/billing", NULL, BILLING, "/api/"},
    {"/billing/", NULL, BILLING, "/api/"},
    {"/tools/files/x/y", NULL, FILES, "/x/y"},
    /* the longest folder wins; a folder is matched whole */
    {"/tools/files", NULL, FILES, "/"},
    {"/billingx/mcp", NULL, ROOT, "/v1/billingx/mcp"},
    /* RFC 9728 metadata of a server's URL: to that server, as it is */
    {"/.well-known/oauth-protected-resource/billing/mcp", NULL, BILLING,
     "/.well-known/oauth-protected-resource/billing/mcp"},
    {"/.well-known/oauth-protected-resource/mcp", NULL, ROOT,
     "/.well-known/oauth-protected-resource/mcp"},
    /* anything else: the one server at the top */
    {"/.well-known/oauth-authorization-server", NULL, ROOT,
     "/v1/.well-known/oauth-authorization-server"},
    {"/", NULL, ROOT, "/v1/"},
};

static void test_three(void **state)
{
    (void)state;
    routes_t *r = routes_new();
    routes_set(r, three, 3);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *target = NULL;
        const route_t *rt = routes_match(r, cases[i].path, cases[i].query, &target);
        if ((rt ? rt->proxy : NULL) != cases[i].to)
            fail_msg("case %zu (%s): wrong server %s", i, cases[i].path, rt ? rt->name : "none");
        if (cases[i].to && (!target || strcmp(target, cases[i].target) != 0))
            fail_msg("case %zu (%s): target %s, want %s", i, cases[i].path,
                     target ? target : "(none)", cases[i].target);
        free(target);
    }
    routes_free(r);
}

/* Without a server at the top, a path outside every folder is no server's; with two at the
 * top, neither's. */
static void test_no_root(void **state)
{
    (void)state;
    routes_t *r = routes_new();
    routes_set(r, three, 2);
    char *target = NULL;
    assert_null(routes_match(r, "/mcp", NULL, &target));
    assert_null(target);
    assert_null(routes_match(r, "/elsewhere", NULL, &target));
    const route_t two_roots[] = {
        {"a", "/a-mcp", "", "/mcp", BILLING},
        {"b", "/b-mcp", "", "/mcp", FILES},
    };
    routes_set(r, two_roots, 2);
    assert_ptr_equal(routes_match(r, "/b-mcp", NULL, &target)->proxy, FILES);
    free(target);
    assert_null(routes_match(r, "/other", NULL, &target));
    routes_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_three),
        cmocka_unit_test(test_no_root),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
