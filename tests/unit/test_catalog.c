/* The tool catalogue (learning tools/list results, classifying unlisted tools from their
 * annotations) and the JSON-RPC response reader it uses on JSON and SSE answers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "catalog.h"
#include "config.h"
#include "http_headers.h"
#include "log.h"
#include "rpc_reader.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <zlib.h>

static config_t *load(const char *yaml)
{
    config_errors_t errs = {0};
    config_t *c = config_load_string("t.yaml", yaml, &errs);
    for (size_t i = 0; i < errs.n; i++)
        fprintf(stderr, "%s\n", errs.msgs[i]);
    config_errors_free(&errs);
    assert_non_null(c);
    return c;
}

static const char LIST[] =
    "{\"tools\":["
    "{\"name\":\"list_tickets\",\"annotations\":{\"readOnlyHint\":true}},"
    "{\"name\":\"set_status\",\"annotations\":{\"idempotentHint\":true,\"destructiveHint\":false}},"
    "{\"name\":\"create_ticket\",\"annotations\":{\"readOnlyHint\":false}},"
    "{\"name\":\"plain\"},"
    "{\"name\":\"refund\",\"annotations\":{\"readOnlyHint\":true}},"
    "{\"nameless\":1}],\"nextCursor\":\"p2\"}";

static void test_annotations_classify_unlisted_tools(void **state)
{
    config_t *cfg = load("upstream: http://127.0.0.1:1/mcp\n"
                         "tools:\n  refund: {class: non_idempotent}\n");
    catalog_t *c = catalog_new();
    catalog_set_policy(c, &cfg->policy);
    class_source_t src;
    /* nothing learned: the default class */
    assert_int_equal(catalog_classify(c, "list_tickets", &src), TOOL_CLASS_NON_IDEMPOTENT);
    assert_int_equal(src, CLASS_FROM_DEFAULT);

    assert_int_equal(catalog_learn(c, LIST, strlen(LIST)), 5);
    assert_int_equal(catalog_classify(c, "list_tickets", &src), TOOL_CLASS_READ);
    assert_int_equal(src, CLASS_FROM_ANNOTATION);
    assert_int_equal(catalog_classify(c, "set_status", &src), TOOL_CLASS_IDEMPOTENT);
    assert_int_equal(src, CLASS_FROM_ANNOTATION);
    assert_int_equal(catalog_classify(c, "create_ticket", &src), TOOL_CLASS_NON_IDEMPOTENT);
    assert_int_equal(src, CLASS_FROM_DEFAULT);
    assert_int_equal(catalog_classify(c, "plain", &src), TOOL_CLASS_NON_IDEMPOTENT);
    /* the policy wins over what the server says */
    assert_int_equal(catalog_classify(c, "refund", &src), TOOL_CLASS_NON_IDEMPOTENT);
    assert_int_equal(src, CLASS_FROM_POLICY);
    assert_int_equal(catalog_size(c), 5);
    assert_string_equal(catalog_at(c, 0)->name, "create_ticket"); /* sorted */

    /* a later page changes a tool's hints */
    const char *page2 = "{\"tools\":[{\"name\":\"list_tickets\",\"annotations\":{}}]}";
    assert_int_equal(catalog_learn(c, page2, strlen(page2)), 1);
    assert_int_equal(catalog_classify(c, "list_tickets", &src), TOOL_CLASS_NON_IDEMPOTENT);

    /* not a tools/list result */
    assert_int_equal(catalog_learn(c, "{\"x\":1}", 7), -1);
    assert_int_equal(catalog_learn(c, "not json", 8), -1);
    catalog_free(c);
    config_free(cfg);
}

static void test_untrusted_annotations_are_ignored(void **state)
{
    config_t *cfg = load("upstream: http://127.0.0.1:1/mcp\n"
                         "defaults: {trust_annotations: false, class: idempotent}\n");
    catalog_t *c = catalog_new();
    catalog_set_policy(c, &cfg->policy);
    assert_int_equal(catalog_learn(c, LIST, strlen(LIST)), 5);
    class_source_t src;
    assert_int_equal(catalog_classify(c, "list_tickets", &src), TOOL_CLASS_IDEMPOTENT);
    assert_int_equal(src, CLASS_FROM_DEFAULT);
    catalog_free(c);
    config_free(cfg);
}

static void test_trust_annotations_only_in_defaults(void **state)
{
    config_errors_t errs = {0};
    config_t *c = config_load_string("t.yaml",
                                     "upstream: http://127.0.0.1:1/mcp\n"
                                     "tools:\n  a: {trust_annotations: false}\n",
                                     &errs);
    assert_null(c);
    assert_true(errs.n >= 1);
    assert_non_null(strstr(errs.msgs[0], "trust_annotations"));
    config_errors_free(&errs);
}

static void test_called_unknown_tools_are_bounded(void **state)
{
    config_t *cfg = load("upstream: http://127.0.0.1:1/mcp\n");
    catalog_t *c = catalog_new();
    catalog_set_policy(c, &cfg->policy);
    log_threshold = LOG_OFF;
    char name[32];
    for (int i = 0; i < 1000; i++) {
        snprintf(name, sizeof(name), "made_up_%d", i);
        assert_int_equal(catalog_classify_call(c, name), TOOL_CLASS_NON_IDEMPOTENT);
    }
    assert_true(catalog_size(c) <= 256); /* an agent's made-up names stay bounded */
    /* the server's tools still fit */
    assert_int_equal(catalog_learn(c, LIST, strlen(LIST)), 5);
    assert_int_equal(catalog_classify(c, "list_tickets", NULL), TOOL_CLASS_READ);
    log_threshold = LOG_INFO;
    catalog_free(c);
    config_free(cfg);
}

/* --- the reader --- */

static void headers_with(http_headers_t *h, const char *name, const char *value)
{
    http_headers_init(h);
    if (name) {
        http_headers_add_name(h, name, strlen(name));
        http_headers_end_name(h);
        http_headers_add_value(h, value, strlen(value));
        http_headers_end_value(h);
    }
}

static void test_reader_json_and_sse(void **state)
{
    json_t *id = json_integer(7);
    http_headers_t h;
    headers_with(&h, NULL, NULL);
    rpc_reader_t r;
    rpc_reader_init(&r, id, 1 << 20);
    rpc_reader_head(&r, 200, &h, false);
    const char *body = "{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"tools\":[]}}";
    rpc_reader_body(&r, body, 10);
    rpc_reader_body(&r, body + 10, strlen(body) - 10);
    assert_true(rpc_reader_end(&r));
    assert_int_equal(r.cls, MCP_RESP_RESULT);
    assert_string_equal(r.result, "{\"tools\":[]}");
    rpc_reader_free(&r);

    /* a stream: a notification and another id's answer first, split anywhere */
    rpc_reader_init(&r, id, 1 << 20);
    rpc_reader_head(&r, 200, &h, true);
    const char *sse =
        "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n"
        "data: {\"jsonrpc\":\"2.0\",\"id\":8,\"result\":{}}\n\n"
        "data: {\"jsonrpc\":\"2.0\",\"id\":7,\"error\":{\"code\":-1,\"message\":\"x\"}}\n\n";
    for (size_t i = 0; i < strlen(sse); i += 5)
        rpc_reader_body(&r, sse + i, strlen(sse) - i < 5 ? strlen(sse) - i : 5);
    assert_true(rpc_reader_end(&r));
    assert_int_equal(r.cls, MCP_RESP_ERROR);
    rpc_reader_free(&r);

    /* not 200, or not the answer: nothing */
    rpc_reader_init(&r, id, 1 << 20);
    rpc_reader_head(&r, 500, &h, false);
    rpc_reader_body(&r, body, strlen(body));
    assert_false(rpc_reader_end(&r));
    rpc_reader_free(&r);
    rpc_reader_init(&r, id, 8);
    rpc_reader_head(&r, 200, &h, false);
    rpc_reader_body(&r, body, strlen(body)); /* over max_bytes */
    assert_false(rpc_reader_end(&r));
    rpc_reader_free(&r);
    http_headers_free(&h);
    json_decref(id);
}

static void test_reader_gzip(void **state)
{
    const char *body =
        "{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"result\":{\"tools\":[{\"name\":\"t\"}]}}";
    unsigned char gz[512];
    z_stream z = {0};
    assert_int_equal(deflateInit2(&z, 6, Z_DEFLATED, 16 + 15, 8, Z_DEFAULT_STRATEGY), Z_OK);
    z.next_in = (unsigned char *)body;
    z.avail_in = (unsigned)strlen(body);
    z.next_out = gz;
    z.avail_out = sizeof(gz);
    assert_int_equal(deflate(&z, Z_FINISH), Z_STREAM_END);
    size_t n = sizeof(gz) - z.avail_out;
    deflateEnd(&z);

    json_t *id = json_string("a");
    http_headers_t h;
    headers_with(&h, "Content-Encoding", "gzip");
    rpc_reader_t r;
    rpc_reader_init(&r, id, 1 << 20);
    rpc_reader_head(&r, 200, &h, false);
    rpc_reader_body(&r, (const char *)gz, n);
    assert_true(rpc_reader_end(&r));
    assert_string_equal(r.result, "{\"tools\":[{\"name\":\"t\"}]}");
    rpc_reader_free(&r);
    http_headers_free(&h);
    json_decref(id);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_annotations_classify_unlisted_tools),
        cmocka_unit_test(test_untrusted_annotations_are_ignored),
        cmocka_unit_test(test_trust_annotations_only_in_defaults),
        cmocka_unit_test(test_called_unknown_tools_are_bounded),
        cmocka_unit_test(test_reader_json_and_sse),
        cmocka_unit_test(test_reader_gzip),
    };
    return cmocka_run_group_tests_name("catalog", tests, NULL, NULL);
}
