/* The request's revision, the mirrored headers, and every answer the gateway writes made to fit
 * both eras. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "answers.h"
#include "mcp.h"
#include "revision.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static void test_version_era(void **state)
{
    static const struct {
        const char *version;
        revision_t want;
    } cases[] = {
        {NULL, REVISION_2025},
        {"", REVISION_2025},
        {"2024-11-05", REVISION_2025},
        {"2025-03-26", REVISION_2025},
        {"2025-06-18", REVISION_2025},
        {"2025-11-25", REVISION_2025},
        {"2026-07-27", REVISION_2025},
        {"2026-07-28", REVISION_2026},
        {"2026-12-01", REVISION_2026},
        {"2027-01-15", REVISION_2026},
        {"DRAFT-2026-v1", REVISION_2025}, /* not a date: no claim to the new era */
        {"2026-07-28 ", REVISION_2025},
        {"2026-7-28", REVISION_2025},
        {"9999-99-99x", REVISION_2025},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_int_equal(revision_of_version(cases[i].version), cases[i].want);
    assert_string_equal(revision_str(REVISION_2025), "2025");
    assert_string_equal(revision_str(REVISION_2026), "2026-07-28");
}

static void test_request_era(void **state)
{
    static const struct {
        const char *header, *meta;
        revision_t want;
    } cases[] = {
        {NULL, NULL, REVISION_2025},
        {"2025-11-25", NULL, REVISION_2025},
        {NULL, "2025-06-18", REVISION_2025},
        {"2026-07-28", NULL, REVISION_2026},
        {NULL, "2026-07-28", REVISION_2026},
        {"2026-07-28", "2026-07-28", REVISION_2026},
        {"2025-11-25", "2026-07-28", REVISION_2026},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_int_equal(revision_of_request(cases[i].header, cases[i].meta), cases[i].want);
}

static void test_meta_version(void **state)
{
    static const struct {
        const char *body;
        const char *want;
    } cases[] = {
        {"{\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"t\",\"_meta\":{\"io."
         "modelcontextprotocol/protocolVersion\":\"2026-07-28\"}}}",
         "2026-07-28"},
        /* an escaped slash inside _meta is still the same member */
        {"{\"params\":{\"_meta\":{\"io.modelcontextprotocol\\/protocolVersion\":\"2026-07-28\"}}}",
         "2026-07-28"},
        {"{\"params\":{\"_meta\":{\"protocolVersion\":\"2026-07-28\"}}}", NULL},
        {"{\"params\":{\"_meta\":{\"io.modelcontextprotocol/protocolVersion\":20260728}}}", NULL},
        {"{\"params\":{\"name\":\"t\"}}", NULL},
        {"{\"method\":\"ping\"}", NULL},
        {"[1,2]", NULL},
        {"{\"params\":{\"_meta\":[]}}", NULL},
        {"not json", NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *v = revision_meta_version(cases[i].body, strlen(cases[i].body));
        if (cases[i].want) {
            assert_non_null(v);
            assert_string_equal(v, cases[i].want);
        } else {
            assert_null(v);
        }
        free(v);
    }
}

static void test_header_value(void **state)
{
    static const struct {
        const char *in;
        const char *want; /* NULL: refused */
        size_t want_len;
    } cases[] = {
        {"refund", "refund", 6},
        {"", "", 0},
        {"=?base64?cmVmdW5k?=", "refund", 6},
        {"=?base64?w6lsw6h2ZQ==?=", "\xc3\xa9l\xc3\xa8ve", 7}, /* "élève" */
        {"=?base64?IHNwYWNlZCA=?=", " spaced ", 8},
        {"=?base64?\?=", "", 0},
        {"=?base64?cmVmdW5k?", "=?base64?cmVmdW5k?", 18}, /* no sentinel: a plain value */
        {"=?base64?cmVmdW5?=", NULL, 0},                  /* not a multiple of four */
        {"=?base64?cm!mdW5k?=", NULL, 0},                 /* not the alphabet */
        {"=?base64?=mVmdW5k?=", NULL, 0},                 /* padding in the middle */
        {"=?base64?AGE=?=", NULL, 0},                     /* a NUL byte */
        {"=?base64?/w==?=", NULL, 0},                     /* not UTF-8 */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t n = 99;
        char *v = revision_header_value(cases[i].in, &n);
        if (!cases[i].want) {
            assert_null(v);
            continue;
        }
        assert_non_null(v);
        assert_int_equal(n, cases[i].want_len);
        assert_memory_equal(v, cases[i].want, n);
        free(v);
    }
}

#define META_2026 "\"_meta\":{\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\"}"

static void test_header_mismatch(void **state)
{
    static const struct {
        const char *body;
        revision_headers_t h;
        const char *want; /* a word of the reason, or NULL: agrees */
    } cases[] = {
        {"{\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"refund\"}}", {0}, NULL},
        {"{\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"refund\"}}",
         {NULL, "tools/call", "refund"},
         NULL},
        {"{\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"refund\"}}",
         {NULL, "tools/list", NULL},
         "Mcp-Method"},
        {"{\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"refund\"}}",
         {NULL, "tools/call", "get_ledger"},
         "Mcp-Name"},
        /* the base64 form is decoded and compared */
        {"{\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"refund\"}}",
         {NULL, "tools/call", "=?base64?cmVmdW5k?="},
         NULL},
        {"{\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"refund\"}}",
         {NULL, "tools/call", "=?base64?Z2V0X2xlZGdlcg==?="},
         "Mcp-Name"},
        {"{\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"r\\u00e9f\"}}",
         {NULL, "tools/call", "=?base64?csOpZg==?="},
         NULL},
        {"{\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"refund\"}}",
         {NULL, "tools/call", "=?base64?cmVmdW5?="},
         "base64"},
        /* a name that is a prefix of the real one is not it */
        {"{\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"refund_all\"}}",
         {NULL, NULL, "refund"},
         "Mcp-Name"},
        /* a tools/call without a name while the header names one */
        {"{\"id\":1,\"method\":\"tools/call\",\"params\":{}}", {NULL, NULL, "refund"}, "Mcp-Name"},
        {"{\"id\":1,\"method\":\"resources/read\",\"params\":{\"uri\":\"file:///a\"}}",
         {NULL, "resources/read", "file:///a"},
         NULL},
        {"{\"id\":1,\"method\":\"resources/read\",\"params\":{\"uri\":\"file:///a\"}}",
         {NULL, "resources/read", "file:///b"},
         "uri"},
        {"{\"id\":1,\"method\":\"prompts/get\",\"params\":{\"name\":\"greet\"}}",
         {NULL, NULL, "greet"},
         NULL},
        {"{\"id\":1,\"method\":\"prompts/get\",\"params\":{\"name\":\"greet\"}}",
         {NULL, NULL, "other"},
         "Mcp-Name"},
        /* a method without a mirrored name: Mcp-Name is not the gateway's to judge */
        {"{\"id\":1,\"method\":\"tools/list\"}", {NULL, "tools/list", "anything"}, NULL},
        /* the version header against the body's claim */
        {"{\"id\":1,\"method\":\"tools/list\",\"params\":{" META_2026 "}}",
         {"2026-07-28", "tools/list", NULL},
         NULL},
        {"{\"id\":1,\"method\":\"tools/list\",\"params\":{" META_2026 "}}",
         {"2025-11-25", NULL, NULL},
         "MCP-Protocol-Version"},
        {"{\"id\":1,\"method\":\"tools/list\"}", {"2025-11-25", NULL, NULL}, NULL},
        /* a notification has no name to mirror, a response no method */
        {"{\"method\":\"notifications/initialized\"}",
         {NULL, "notifications/initialized", NULL},
         NULL},
        {"{\"id\":3,\"result\":{}}", {NULL, "tools/call", NULL}, NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *b = cases[i].body;
        mcp_msg_t m;
        assert_int_equal(mcp_parse(b, strlen(b), &m), MCP_OK);
        const char *why = revision_header_mismatch(&cases[i].h, &m, b, strlen(b));
        if (cases[i].want) {
            if (!why || !strstr(why, cases[i].want))
                fail_msg("case %zu: want a mismatch naming %s, got %s", i, cases[i].want,
                         why ? why : "none");
        } else if (why) {
            fail_msg("case %zu: want no mismatch, got %s", i, why);
        }
        mcp_msg_free(&m);
    }
}

/* The result of a response body: parsed, with its resultType removed into *rt (a copy). */
static json_t *result_without_type(const char *body, char **rt)
{
    json_error_t err;
    json_t *root = json_loads(body, 0, &err);
    if (!root)
        fail_msg("not JSON (%s): %s", err.text, body);
    json_t *result = json_incref(json_object_get(root, "result"));
    json_decref(root);
    assert_true(json_is_object(result));
    const char *v = json_string_value(json_object_get(result, "resultType"));
    *rt = v ? strdup(v) : NULL;
    json_object_del(result, "resultType");
    return result;
}

/* body as both eras get it: 2025 unchanged, 2026 the same with resultType "complete". */
static void check_fits(const char *what, char *(*make)(int, void *), int arg, void *ctx)
{
    char *legacy = revision_fit(make(arg, ctx), REVISION_2025);
    char *modern = revision_fit(make(arg, ctx), REVISION_2026);
    char *plain = make(arg, ctx);
    if (strcmp(legacy, plain) != 0)
        fail_msg("%s %d: a 2025 answer changed: %s", what, arg, legacy);
    char *rt_legacy, *rt_modern;
    json_t *a = result_without_type(legacy, &rt_legacy);
    json_t *b = result_without_type(modern, &rt_modern);
    if (rt_legacy)
        fail_msg("%s %d: a 2025 answer has resultType %s", what, arg, rt_legacy);
    if (!rt_modern || strcmp(rt_modern, "complete") != 0)
        fail_msg("%s %d: a 2026 answer lacks resultType complete: %s", what, arg, modern);
    if (!json_equal(a, b))
        fail_msg("%s %d: the eras differ beyond resultType:\n%s\n%s", what, arg, legacy, modern);
    /* the 2026 form is still a tool result: content of text blocks */
    json_t *content = json_object_get(b, "content");
    assert_true(json_is_array(content) && json_array_size(content) > 0);
    json_decref(a);
    json_decref(b);
    free(rt_modern);
    free(legacy);
    free(modern);
    free(plain);
}

static char *make_answer(int a, void *ctx)
{
    return answer_body((answer_t)a, "7", ctx ? "abc" : NULL, "2026-01-01T00:00:00.000Z", "why",
                       ctx ? "A hint." : NULL);
}

static void test_every_answer_both_eras(void **state)
{
    int with_key = 1;
    for (int a = 0; a < ANSWER_N; a++) {
        check_fits(answer_code((answer_t)a), make_answer, a, NULL);
        check_fits(answer_code((answer_t)a), make_answer, a, &with_key);
    }
}

static char *make_status_text(int is_error, void *ctx)
{
    return mcp_tool_text_body("\"s\"", "not found", "{\"code\":\"not_found\"}", is_error);
}

static char *make_too_large(int unused, void *ctx)
{
    return answer_replay_too_large("1", "{\"replayed\":true}", "2026-01-01T00:00:00.000Z");
}

static void test_status_and_too_large(void **state)
{
    check_fits("status tool", make_status_text, 0, NULL);
    check_fits("status tool", make_status_text, 1, NULL);
    check_fits("too large", make_too_large, 0, NULL);
}

/* A stored result replayed: 2026 gains resultType only when it has none; nothing else moves. */
static void test_replay_across_eras(void **state)
{
    static const struct {
        const char *stored;
        const char *want_2026; /* the result member's text for a 2026 caller */
    } cases[] = {
        /* stored from a 2025 session */
        {"{\"content\":[{\"type\":\"text\",\"text\":\"ok\"}]}",
         "{\"resultType\":\"complete\",\"_meta\":{\"idemgw/replay\":{}},\"content\":[{\"type\":"
         "\"text\",\"text\":\"ok\"}]}"},
        {"{\"content\":[],\"_meta\":{\"x\":1}}",
         "{\"resultType\":\"complete\",\"content\":[],\"_meta\":{\"idemgw/replay\":{},\"x\":1}}"},
        {"{ }", "{\"resultType\":\"complete\",\"_meta\":{\"idemgw/replay\":{}} }"},
        /* stored from a 2026 caller: already says what it is */
        {"{\"resultType\":\"complete\",\"content\":[]}",
         "{\"_meta\":{\"idemgw/replay\":{}},\"resultType\":\"complete\",\"content\":[]}"},
        {"{\"resultType\":\"task\",\"taskId\":\"t1\"}",
         "{\"_meta\":{\"idemgw/replay\":{}},\"resultType\":\"task\",\"taskId\":\"t1\"}"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *s = cases[i].stored;
        char *legacy = revision_fit(mcp_replay_body("9", s, strlen(s), "{}"), REVISION_2025);
        char *plain = mcp_replay_body("9", s, strlen(s), "{}");
        assert_string_equal(legacy, plain); /* a 2025 caller gets the stored bytes */
        char *modern = revision_fit(mcp_replay_body("9", s, strlen(s), "{}"), REVISION_2026);
        char *want = NULL;
        assert_true(asprintf(&want, "{\"jsonrpc\":\"2.0\",\"id\":9,\"result\":%s}",
                             cases[i].want_2026) > 0);
        assert_string_equal(modern, want);
        free(want);
        free(legacy);
        free(plain);
        free(modern);
    }
}

/* JSON-RPC errors and odd bodies pass through revision_fit untouched. */
static void test_fit_leaves_the_rest(void **state)
{
    static const char *const bodies[] = {
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":-32020,\"message\":\"m\"}}",
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":[1]}",
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":\"text\"}",
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"resultType\":\"input_required\"}}",
        "not json at all",
        "",
    };
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        char *b = revision_fit(strdup(bodies[i]), REVISION_2026);
        assert_string_equal(b, bodies[i]);
        free(b);
    }
    assert_null(revision_fit(NULL, REVISION_2026));
    char *err = mcp_error_body("1", -32600, "bad");
    char *fit = revision_fit(strdup(err), REVISION_2026);
    assert_string_equal(fit, err);
    free(err);
    free(fit);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version_era),          cmocka_unit_test(test_request_era),
        cmocka_unit_test(test_meta_version),         cmocka_unit_test(test_header_value),
        cmocka_unit_test(test_header_mismatch),      cmocka_unit_test(test_every_answer_both_eras),
        cmocka_unit_test(test_status_and_too_large), cmocka_unit_test(test_replay_across_eras),
        cmocka_unit_test(test_fit_leaves_the_rest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
