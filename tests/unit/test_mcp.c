/* JSON-RPC extraction and the bodies the gateway writes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "mcp.h"

#include <stdlib.h>
#include <string.h>

static mcp_msg_t parse_ok(const char *s)
{
    mcp_msg_t m;
    assert_int_equal(mcp_parse(s, strlen(s), &m), MCP_OK);
    return m;
}

static void test_request_kinds(void **state)
{
    static const struct {
        const char *body;
        mcp_kind_t kind;
        const char *method;
        const char *id_text;
    } cases[] = {
        {"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}", MCP_KIND_REQUEST, "ping", "1"},
        {"{\"jsonrpc\":\"2.0\",\"id\":\"a b\",\"method\":\"tools/list\"}", MCP_KIND_REQUEST,
         "tools/list", "\"a b\""},
        {"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}", MCP_KIND_NOTIFICATION,
         "notifications/initialized", NULL},
        {"{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"x\"}", MCP_KIND_NOTIFICATION, "x", NULL},
        {"{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}", MCP_KIND_RESPONSE, NULL, NULL},
        {"{\"jsonrpc\":\"2.0\",\"id\":7,\"error\":{\"code\":1}}", MCP_KIND_RESPONSE, NULL, NULL},
        {"{\"hello\":1}", MCP_KIND_OTHER, NULL, NULL},
        /* the raw id text is kept byte for byte, even where a double would round it */
        {"{\"id\": 123456789012345678901234567890 ,\"method\":\"m\"}", MCP_KIND_REQUEST, "m",
         "123456789012345678901234567890"},
        {"{\"method\":\"m\",\"id\":1.50}", MCP_KIND_REQUEST, "m", "1.50"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        mcp_msg_t m = parse_ok(cases[i].body);
        assert_int_equal(m.kind, cases[i].kind);
        if (cases[i].method)
            assert_string_equal(m.method, cases[i].method);
        else
            assert_null(m.method);
        if (cases[i].id_text)
            assert_string_equal(m.id_text, cases[i].id_text);
        else
            assert_null(m.id_text);
        mcp_msg_free(&m);
    }
}

static void test_tools_call(void **state)
{
    mcp_msg_t m = parse_ok("{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/call\",\"params\":"
                           "{\"name\":\"issue_refund\",\"arguments\":{\"order_id\":\"A1\"},"
                           "\"_meta\":{\"progressToken\":1}}}");
    assert_string_equal(m.tool, "issue_refund");
    assert_true(json_is_integer(m.id));
    mcp_msg_free(&m);

    m = parse_ok(
        "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/call\",\"params\":{\"name\":5}}");
    assert_null(m.tool);
    mcp_msg_free(&m);

    m = parse_ok(
        "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/call\",\"params\":{\"name\":\"t\"}}");
    assert_string_equal(m.tool, "t");
    mcp_msg_free(&m);
}

static void test_batch(void **state)
{
    mcp_msg_t m = parse_ok("[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":"
                           "{\"name\":\"a\"}},{\"jsonrpc\":\"2.0\",\"method\":\"n\"},"
                           "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":"
                           "{\"name\":\"b\"}},{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":"
                           "\"tools/call\",\"params\":{}}]");
    assert_int_equal(m.kind, MCP_KIND_BATCH);
    assert_int_equal(m.n_batch_tools, 2);
    assert_string_equal(m.batch_tools[0], "a");
    assert_string_equal(m.batch_tools[1], "b");
    assert_true(m.batch_bad_tool);
    mcp_msg_free(&m);
}

/* A tools/call without an id (or with a null one) is marked, alone or anywhere in a batch: the
 * router refuses it, since a notification has no answer to replay and a lenient server runs it
 * all the same. Other notifications and calls with an id are not marked. */
static void test_call_without_id(void **state)
{
    static const struct {
        const char *body;
        bool marked;
    } cases[] = {
        {"{\"jsonrpc\":\"2.0\",\"method\":\"tools/call\",\"params\":{\"name\":\"a\"}}", true},
        {"{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"tools/call\",\"params\":{}}", true},
        {"{\"method\":\"tools\\/call\",\"params\":{\"name\":\"a\"}}", true},
        {"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"},"
         "{\"jsonrpc\":\"2.0\",\"method\":\"tools/call\",\"params\":{\"name\":\"a\"}}]",
         true},
        {"{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"tools/call\",\"params\":{\"name\":\"a\"}}",
         false},
        {"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}", false},
        {"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"a\"}},"
         "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\"}]",
         false},
        {"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}", false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        mcp_msg_t m = parse_ok(cases[i].body);
        if (m.call_without_id != cases[i].marked)
            fail_msg("%s: call_without_id %d", cases[i].body, m.call_without_id);
        if (cases[i].marked)
            assert_null(m.tool); /* no call to protect: the router refuses it instead */
        mcp_msg_free(&m);
    }
}

typedef struct seen_calls {
    int n, with_id;
    const char *last;
} seen_calls_t;

static void count_call(void *arg, const char *tool, bool has_id)
{
    seen_calls_t *s = arg;
    s->n++;
    s->with_id += has_id;
    s->last = tool;
}

/* The scan off the endpoint sees notifications too, and says which had an id. */
static void test_each_call(void **state)
{
    const char *body = "[{\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"a\"}},"
                       "{\"id\":null,\"method\":\"tools/call\",\"params\":{\"name\":\"b\"}},"
                       "{\"method\":\"tools/call\",\"params\":{\"name\":[\"c\"]}},"
                       "{\"method\":\"ping\",\"id\":2}]";
    seen_calls_t s = {0};
    assert_int_equal(mcp_each_call(body, strlen(body), count_call, &s), MCP_OK);
    assert_int_equal(s.n, 3);
    assert_int_equal(s.with_id, 1);
    assert_null(s.last);
    assert_int_equal(mcp_each_call("{", 1, count_call, &s), MCP_ERR_PARSE);
}

static void test_bad_bodies(void **state)
{
    static const char *const parse_errors[] = {"", "{", "not json", "{\"a\":}", "[1,]", "{} x"};
    static const char *const shape_errors[] = {"1", "\"s\"", "null", "[]", "true"};
    mcp_msg_t m;
    for (size_t i = 0; i < sizeof(parse_errors) / sizeof(parse_errors[0]); i++)
        assert_int_equal(mcp_parse(parse_errors[i], strlen(parse_errors[i]), &m), MCP_ERR_PARSE);
    for (size_t i = 0; i < sizeof(shape_errors) / sizeof(shape_errors[0]); i++)
        assert_int_equal(mcp_parse(shape_errors[i], strlen(shape_errors[i]), &m), MCP_ERR_SHAPE);
    /* integers wider than 64 bits are valid JSON and must not be refused */
    const char *big =
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":"
        "\"t\",\"arguments\":{\"n\":184467440737095516160}}}";
    assert_int_equal(mcp_parse(big, strlen(big), &m), MCP_OK);
    assert_string_equal(m.tool, "t");
    mcp_msg_free(&m);
    assert_string_equal(mcp_status_str(MCP_ERR_PARSE), "parse error");
}

static void expect_without(const char *in, const char *name, const char *want)
{
    size_t n = 0;
    char *out = mcp_without_argument(in, strlen(in), name, &n);
    if (!want) {
        assert_null(out);
        return;
    }
    assert_non_null(out);
    assert_int_equal(n, strlen(want));
    assert_string_equal(out, want);
    free(out);
}

static void test_without_argument(void **state)
{
    /* first, middle, last, only; every other byte (number spellings, spaces) as it was */
    expect_without(
        "{\"params\":{\"name\":\"t\",\"arguments\":{\"idempotency_key\":\"k\", \"a\":1.10}}}",
        "idempotency_key", "{\"params\":{\"name\":\"t\",\"arguments\":{\"a\":1.10}}}");
    expect_without(
        "{\"params\":{\"arguments\":{\"a\":1e2,\"idempotency_key\":\"k\",\"b\":[1, 2]}}}",
        "idempotency_key", "{\"params\":{\"arguments\":{\"a\":1e2,\"b\":[1, 2]}}}");
    expect_without(
        "{\"params\":{\"arguments\":{\"a\":{\"idempotency_key\":1} , \"idempotency_key\" : 7 }}}",
        "idempotency_key", "{\"params\":{\"arguments\":{\"a\":{\"idempotency_key\":1} }}}");
    expect_without("{\"id\":1,\"params\":{\"arguments\":{\"idempotency_key\":\"k\"}},\"x\":2}",
                   "idempotency_key", "{\"id\":1,\"params\":{\"arguments\":{}},\"x\":2}");
    /* the name as JSON reads it: escapes in it are undone before comparing */
    expect_without("{\"params\":{\"arguments\":{\"idempotency_k\\u0065y\":\"k\",\"a\":1}}}",
                   "idempotency_key", "{\"params\":{\"arguments\":{\"a\":1}}}");
    expect_without("{\"p\\u0061rams\":{\"arguments\":{\"a\":1,\"\\u0069dempotency_key\":2}}}",
                   "idempotency_key", "{\"p\\u0061rams\":{\"arguments\":{\"a\":1}}}");
    expect_without("{\"params\":{\"arguments\":{\"idempotency\\/key\":\"k\"}}}", "idempotency_key",
                   NULL);
    expect_without("{\"params\":{\"arguments\":{\"idempotency_key\\u0000\":\"k\"}}}",
                   "idempotency_key", NULL);
    /* not there: nothing to do */
    expect_without("{\"params\":{\"arguments\":{\"a\":1}}}", "idempotency_key", NULL);
    expect_without("{\"params\":{\"arguments\":[1]}}", "idempotency_key", NULL);
    expect_without("{\"params\":{}}", "idempotency_key", NULL);
    expect_without("not json", "idempotency_key", NULL);
}

static void test_member_span(void **state)
{
    const char *t =
        " { \"a\" : [1,{\"result\":2}], \"s\":\"x\\\"}\" , \"result\" : {\"k\": [ ]} } ";
    size_t off, len;
    assert_true(mcp_member_span(t, strlen(t), "result", &off, &len));
    assert_int_equal(len, strlen("{\"k\": [ ]}"));
    assert_memory_equal(t + off, "{\"k\": [ ]}", len);
    assert_true(mcp_member_span(t, strlen(t), "s", &off, &len));
    assert_memory_equal(t + off, "\"x\\\"}\"", len);
    assert_false(mcp_member_span(t, strlen(t), "nope", &off, &len));
    assert_false(mcp_member_span("[1]", 3, "a", &off, &len));
    assert_false(mcp_member_span("{\"a\":", 5, "a", &off, &len));
    /* strings skipped to their closing quote past runs of backslashes, odd and even */
    const char *bs = "{\"p\":\"a\\\\\",\"q\":\"\\\\\\\"\",\"id\":7}";
    assert_true(mcp_member_span(bs, strlen(bs), "id", &off, &len));
    assert_memory_equal(bs + off, "7", len);
    assert_true(mcp_member_span(bs, strlen(bs), "q", &off, &len));
    assert_memory_equal(bs + off, "\"\\\\\\\"\"", len);
    assert_false(mcp_member_span("{\"p\":\"a\\\"}", 11, "p", &off, &len));
}

/* Several members in one walk, each where mcp_member_span finds it. */
static void test_member_spans(void **state)
{
    static const char *const names[] = {"id", "result", "method", "params"};
    const char *texts[] = {
        "{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"result\":{\"id\":1}}",
        "{\"id\":1, \"id\" : [2] ,\"method\":\"m\",\"i\\u0064\":3}",
        "{\"params\":{\"x\":\"\\\"\"}}",
        "{}",
    };
    for (size_t t = 0; t < sizeof(texts) / sizeof(texts[0]); t++) {
        mcp_span_t sp[4];
        assert_true(mcp_member_spans(texts[t], strlen(texts[t]), names, 4, sp));
        for (size_t k = 0; k < 4; k++) {
            size_t off, len;
            bool one = mcp_member_span(texts[t], strlen(texts[t]), names[k], &off, &len);
            assert_int_equal(sp[k].present, one);
            if (one) {
                assert_int_equal(sp[k].off, off);
                assert_int_equal(sp[k].len, len);
            }
        }
    }
    mcp_span_t sp[4];
    assert_false(mcp_member_spans("{\"id\":1,", 8, names, 4, sp));
    assert_false(sp[0].present);
    assert_false(mcp_member_spans("[1]", 3, names, 4, sp));

    /* keys told apart by length first: an escaped key is longer than what it decodes to, and a
     * name may hold a backslash of its own */
    static const struct {
        const char *text, *name;
        bool found;
    } keys[] = {
        {"{\"\\u0069d\":1}", "id", true},     /* escaped, longer than the name */
        {"{\"idx\":1,\"i\":2}", "id", false}, /* longer and shorter, no escape */
        {"{\"a\\\\b\":1}", "a\\b", true},     /* "a\\b" is a, backslash, b */
        {"{\"a\\b\":1}", "a\\b", false},      /* "a\b" is a, backspace: same length */
        {"{\"\\\"x\":1}", "\"x", true},       /* an escaped quote */
    };
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        size_t off, len;
        const char *one[] = {keys[i].name};
        mcp_span_t k[1];
        assert_int_equal(
            mcp_member_span(keys[i].text, strlen(keys[i].text), keys[i].name, &off, &len),
            keys[i].found);
        assert_true(mcp_member_spans(keys[i].text, strlen(keys[i].text), one, 1, k));
        assert_int_equal(k[0].present, keys[i].found);
    }
}

static void test_classify(void **state)
{
    json_t *id = json_integer(11);
    static const struct {
        const char *msg;
        mcp_resp_class_t cls;
        const char *span;
    } cases[] = {
        {"{\"result\":{\"content\":[]},\"jsonrpc\":\"2.0\",\"id\":11}", MCP_RESP_RESULT,
         "{\"content\":[]}"},
        {"{\"jsonrpc\":\"2.0\",\"id\":11,\"result\":{\"content\":[],\"isError\":true}}",
         MCP_RESP_TOOL_ERROR, "{\"content\":[],\"isError\":true}"},
        {"{\"jsonrpc\":\"2.0\",\"id\":11,\"result\":{\"resultType\":\"input_required\"}}",
         MCP_RESP_INPUT_REQUIRED, NULL},
        {"{\"jsonrpc\":\"2.0\",\"id\":11,\"error\":{\"code\":-32602,\"message\":\"x\"}}",
         MCP_RESP_ERROR, NULL},
        {"{\"jsonrpc\":\"2.0\",\"id\":12,\"result\":{}}", MCP_RESP_FOREIGN, NULL},
        {"{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32600}}", MCP_RESP_FOREIGN, NULL},
        {"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}",
         MCP_RESP_OTHER, NULL},
        /* a server request that happens to reuse the id is not our response */
        {"{\"jsonrpc\":\"2.0\",\"id\":11,\"method\":\"sampling/createMessage\"}", MCP_RESP_OTHER,
         NULL},
        {"{\"jsonrpc\":\"2.0\",\"id\":\"11\",\"result\":{}}", MCP_RESP_FOREIGN, NULL},
        {"{\"jsonrpc\":\"2.0\",\"id\":12}", MCP_RESP_OTHER, NULL},
        {"garbage", MCP_RESP_OTHER, NULL},
        /* read from the text where it is valid JSON, as the tree reads it */
        {"{\"id\":11,\"result\":{\"resultType\":\"input\\u005frequired\"}}",
         MCP_RESP_INPUT_REQUIRED, NULL},
        {"{\"id\":11.0,\"result\":{\"isError\":false} }", MCP_RESP_RESULT, "{\"isError\":false}"},
        {"{\"i\\u0064\":11,\"error\":null}", MCP_RESP_ERROR, "null"},
        {"{\"id\":11,\"result\":[1],\"error\":{\"code\":1}}", MCP_RESP_ERROR, "{\"code\":1}"},
        {"{\"id\":11,\"result\":\"x\"}", MCP_RESP_OTHER, NULL},
        {"[{\"id\":11,\"result\":{}}]", MCP_RESP_OTHER, NULL},
        {"{\"id\":11,\"result\":{}} x", MCP_RESP_OTHER, NULL},
        {"{\"id\":11,\"result\":{\"s\":\"\xff\"}}", MCP_RESP_OTHER, NULL},
        /* a number out of a double's range: jansson refuses the whole message */
        {"{\"id\":11,\"result\":{\"n\":1e400}}", MCP_RESP_OTHER, NULL},
        {"{\"id\":11,\"result\":{\"n\":1e3}}", MCP_RESP_RESULT, "{\"n\":1e3}"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t off = 0, len = 0;
        mcp_resp_class_t c =
            mcp_classify_response(cases[i].msg, strlen(cases[i].msg), id, &off, &len);
        assert_int_equal(c, cases[i].cls);
        if (cases[i].span) {
            assert_int_equal(len, strlen(cases[i].span));
            assert_memory_equal(cases[i].msg + off, cases[i].span, len);
        }
    }
    json_decref(id);
    assert_string_equal(mcp_resp_class_str(MCP_RESP_TOOL_ERROR), "tool_error");
    assert_string_equal(mcp_resp_class_str(MCP_RESP_FOREIGN), "foreign");
}

static void test_bodies(void **state)
{
    char *b = mcp_error_body(NULL, -32700, "parse \"error\"");
    assert_string_equal(b, "{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32700,"
                           "\"message\":\"parse \\\"error\\\"\"}}");
    free(b);
    b = mcp_tool_error_body("\"x\"", "in progress", "{\"code\":\"in_progress\"}");
    json_error_t e;
    json_t *j = json_loads(b, 0, &e);
    assert_non_null(j);
    assert_true(json_is_true(json_object_get(json_object_get(j, "result"), "isError")));
    json_decref(j);
    free(b);
}

static void test_replay(void **state)
{
    const char *marker = "{\"replayed\":true}";
    const char *stored = "{\"content\":[{\"type\":\"text\",\"text\":\"ok\"}],\"n\":0.1}";
    char *b = mcp_replay_body("42", stored, strlen(stored), marker);
    assert_string_equal(b,
                        "{\"jsonrpc\":\"2.0\",\"id\":42,\"result\":{\"_meta\":{\"idemgw/replay\":"
                        "{\"replayed\":true}},\"content\":[{\"type\":\"text\",\"text\":\"ok\"}],"
                        "\"n\":0.1}}");
    free(b);
    b = mcp_replay_body("1", "{ }", 3, marker);
    assert_string_equal(b, "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"_meta\":{\"idemgw/replay\":"
                           "{\"replayed\":true}} }}");
    free(b);
    const char *with_meta = "{\"_meta\":{\"a\":1},\"content\":[]}";
    b = mcp_replay_body("1", with_meta, strlen(with_meta), marker);
    assert_string_equal(b, "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"_meta\":{\"idemgw/replay\":"
                           "{\"replayed\":true},\"a\":1},\"content\":[]}}");
    free(b);
    assert_null(mcp_replay_body("1", "[1]", 3, marker));
}

/* The scanner and the jansson tree agree on what a body is. */
static void test_fast_path_matches_tree(void **state)
{
    static const char *const bodies[] = {
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"a\"}}",
        /* ids of every kind: the scanner makes the usual ones itself */
        "{\"id\":-0,\"method\":\"x\"}",
        "{\"id\":-17,\"method\":\"x\"}",
        "{\"id\":999999999999999999,\"method\":\"x\"}",
        "{\"id\":-999999999999999999,\"method\":\"x\"}",
        "{\"id\":9223372036854775807,\"method\":\"x\"}",
        "{\"id\":-9223372036854775808,\"method\":\"x\"}",
        "{\"id\":92233720368547758070,\"method\":\"x\"}",
        "{\"id\":1.5,\"method\":\"x\"}",
        "{\"id\":1e3,\"method\":\"x\"}",
        "{\"id\":\"\",\"method\":\"x\"}",
        "{\"id\":\"caf\xc3\xa9\",\"method\":\"x\"}",
        "{\"id\":\"a\\u0000b\",\"method\":\"x\"}",
        "{\"id\":\"a\\\"b\",\"method\":\"x\"}",
        "{\"id\":true,\"method\":\"x\"}",
        "{\"id\":{\"k\":[1]},\"method\":\"x\"}",
        "{\"method\":\"tools/call\",\"id\":\"x\",\"params\":{\"arguments\":{\"name\":\"no\"}}}",
        "{\"method\":\"tools/call\",\"id\":2,\"params\":{\"name\":\"a\"},\"params\":{}}",
        "{\"method\":\"m\",\"method\":\"tools/call\",\"id\":3,\"params\":{\"name\":\"b\"}}",
        "{\"method\":5,\"result\":null}",
        "{\"id\":null,\"method\":\"n\"}",
        "{\"id\":null,\"method\":\"tools/call\",\"params\":{\"name\":\"a\"}}",
        "{\"method\":\"tools/call\",\"params\":{\"name\":\"a\"}}",
        "{\"m\\u0065thod\":\"tools/call\",\"id\":1}",
        "{\"method\":\"tools\\/call\",\"id\":1,\"params\":{\"name\":\"t\"}}",
        "{\"a\":\"\\ud83d\\ude02\",\"b\":[1,-0.5e+3,true,false,null,{}],\"method\":\"x\"}",
        "{\"a\":\"\\ud83d\"}",
        "{\"a\":\"\\ude02\"}",
        "{\"a\":\"\xc3\x28\"}",
        "{\"a\":\"\xed\xa0\x80\"}",
        "{\"a\":01}",
        "{\"a\":1.}",
        "{\"a\":\"\t\"}",
        "{\"a\":[1,]}",
        "{\"a\":1,}",
        "{\"a\" 1}",
        "{} {}",
        " {\"id\":[1]} ",
        "{\"a\":tru}",
    };
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        mcp_msg_t f, t;
        const char *b = bodies[i];
        mcp_status_t sf = mcp_parse(b, strlen(b), &f);
        mcp_status_t st = mcp_parse_tree(b, strlen(b), &t);
        assert_int_equal(sf, st);
        if (sf != MCP_OK)
            continue;
        assert_int_equal(f.kind, t.kind);
        assert_int_equal(f.call_without_id, t.call_without_id);
        if (t.method)
            assert_string_equal(f.method, t.method);
        else
            assert_null(f.method);
        if (t.tool)
            assert_string_equal(f.tool, t.tool);
        else
            assert_null(f.tool);
        if (t.id_text)
            assert_string_equal(f.id_text, t.id_text);
        else
            assert_null(f.id_text);
        if (t.id)
            assert_true(f.id && json_equal(f.id, t.id));
        else
            assert_null(f.id);
        mcp_msg_free(&f);
        mcp_msg_free(&t);
    }
}

/* Strings are skipped eight bytes at a time while the bytes are plain: a byte that needs a
 * closer look (a quote, an escape, a control character, DEL, a UTF-8 sequence, valid or not)
 * at every offset of a long string, including across the eight-byte steps and at the end,
 * is judged exactly as the tree parser judges it. */
static void test_long_strings_every_offset(void **state)
{
    (void)state;
    static const char *const specials[] = {
        "\\\"",
        "\\n",
        "\\u00e9",
        "\x01",
        "\x1f",
        "\x7f",
        "\xc3\xa9",
        "\xe2\x82\xac",
        "\xf0\x9f\x98\x82",
        "\x80",
        "\xc3",
        "\xff",
        "\xed\xa0\x80",
        "\"",
        "\\",
        " ",
        "\t",
    };
    char body[256], text[64];
    for (size_t k = 0; k < sizeof(specials) / sizeof(specials[0]); k++) {
        for (size_t at = 0; at <= 24; at++) {
            memset(text, 'x', at);
            snprintf(text + at, sizeof(text) - at, "%s%s", specials[k], "abcdefghijklmnopq");
            snprintf(body, sizeof(body),
                     "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/call\","
                     "\"params\":{\"name\":\"t\",\"arguments\":{\"s\":\"%s\"}}}",
                     text);
            mcp_msg_t f, t;
            mcp_status_t sf = mcp_parse(body, strlen(body), &f);
            mcp_status_t st = mcp_parse_tree(body, strlen(body), &t);
            if (sf != st)
                fail_msg("special %zu at %zu: fast %d, tree %d", k, at, (int)sf, (int)st);
            if (sf == MCP_OK)
                assert_string_equal(f.tool, "t");
            if (sf == MCP_OK)
                mcp_msg_free(&f);
            if (st == MCP_OK)
                mcp_msg_free(&t);
        }
    }
    /* a body cut inside a long plain string is refused, whatever the cut's offset */
    const char *whole = "{\"method\":\"x\",\"a\":\"abcdefghijklmnopqrstuvwxyz0123456789\"}";
    for (size_t cut = 20; cut < strlen(whole) - 2; cut++) {
        mcp_msg_t f;
        assert_int_equal(mcp_parse(whole, cut, &f), MCP_ERR_PARSE);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_kinds),
        cmocka_unit_test(test_tools_call),
        cmocka_unit_test(test_batch),
        cmocka_unit_test(test_call_without_id),
        cmocka_unit_test(test_each_call),
        cmocka_unit_test(test_bad_bodies),
        cmocka_unit_test(test_member_span),
        cmocka_unit_test(test_member_spans),
        cmocka_unit_test(test_without_argument),
        cmocka_unit_test(test_classify),
        cmocka_unit_test(test_bodies),
        cmocka_unit_test(test_replay),
        cmocka_unit_test(test_fast_path_matches_tree),
        cmocka_unit_test(test_long_strings_every_offset),
    };
    return cmocka_run_group_tests_name("mcp", tests, NULL, NULL);
}
