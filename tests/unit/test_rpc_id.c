/* Assigned JSON-RPC ids: the request and cancel rewritten byte for byte, each message of an
 * answer mapped back to the caller's id or found out of step, and whole answers (JSON, SSE, in
 * any split, compressed) rewritten as they stream. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "rpc_id.h"

#include <event2/buffer.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define ASSIGNED "\"idemgw-0123456789abcdef-7\""

/* The strict lookup of one call sent with ASSIGNED by a caller whose id was 42. */
typedef struct one {
    json_t *assigned;
    const char *caller;
    int responses; /* lookups of a response's id that matched */
} one_t;

static const char *one_lookup(void *arg, const char *id, size_t len, bool response)
{
    one_t *o = arg;
    json_t *seen = id ? json_loadb(id, len, JSON_DECODE_ANY, NULL) : json_null();
    bool same = json_equal(seen, o->assigned);
    json_decref(seen);
    if (!same)
        return NULL;
    if (response)
        o->responses++;
    return o->caller;
}

static one_t one(const char *caller)
{
    return (one_t){json_loads(ASSIGNED, JSON_DECODE_ANY, NULL), caller, 0};
}

static void test_status_and_format(void **state)
{
    assert_string_equal(rpc_id_status_str(RPC_ID_OK), "ok");
    assert_string_equal(rpc_id_status_str(RPC_ID_DESYNC), "desync");
    assert_string_equal(rpc_id_status_str(RPC_ID_TOO_LARGE), "too_large");
    assert_string_equal(rpc_id_status_str(RPC_ID_UNREADABLE), "unreadable");
    char id[RPC_ID_TEXT_MAX];
    rpc_id_format(id, "0123456789abcdef", 7);
    assert_string_equal(id, ASSIGNED);
    rpc_id_format(id, "0123456789abcdef", UINT64_MAX);
    assert_string_equal(id, "\"idemgw-0123456789abcdef-18446744073709551615\"");
}

static void test_request_and_cancel_rewritten(void **state)
{
    static const char call[] = "{\"jsonrpc\":\"2.0\", \"id\" : 42,\"method\":\"tools/call\","
                               "\"params\":{\"name\":\"refund\",\"arguments\":{\"id\":1}}}";
    size_t n = 0;
    char *out = rpc_id_set_request_id(call, strlen(call), ASSIGNED, &n);
    assert_string_equal(out,
                        "{\"jsonrpc\":\"2.0\", \"id\" : " ASSIGNED ",\"method\":\"tools/call\","
                        "\"params\":{\"name\":\"refund\",\"arguments\":{\"id\":1}}}");
    assert_int_equal(n, strlen(out));
    free(out);
    assert_null(rpc_id_set_request_id("{\"method\":\"x\"}", 14, ASSIGNED, &n));

    static const char cancel[] = "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\","
                                 "\"params\":{\"requestId\":\"a\",\"reason\":\"bored\"}}";
    out = rpc_id_set_cancel_id(cancel, strlen(cancel), ASSIGNED, &n);
    assert_string_equal(out, "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\","
                             "\"params\":{\"requestId\":" ASSIGNED ",\"reason\":\"bored\"}}");
    free(out);
    assert_null(rpc_id_set_cancel_id("{\"params\":{}}", 13, ASSIGNED, &n));
}

/* The request's id rewritten inside its buffer: the same bytes as the copy would be, wherever
 * the id is and whatever its length. */
static void test_request_id_in_place(void **state)
{
    static const char *bodies[] = {
        "{\"jsonrpc\":\"2.0\",\"id\":42,\"method\":\"tools/call\",\"params\":{}}",
        "{\"jsonrpc\":\"2.0\",\"id\":\"idemgw-0123456789abcdef-8\",\"method\":\"x\"}",
        "{\"params\":{\"pad\":\"................................................................"
        "...............................................................................\"},"
        "\"method\":\"tools/call\",\"jsonrpc\":\"2.0\",\"id\":\"a-rather-long-id-of-the-caller\"}",
    };
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        size_t n = 0;
        char *want = rpc_id_set_request_id(bodies[i], strlen(bodies[i]), ASSIGNED, &n);
        /* walking the body, and from where its parse found the id */
        for (int hinted = 0; hinted < 2; hinted++) {
            mcp_msg_t m;
            assert_int_equal(mcp_parse(bodies[i], strlen(bodies[i]), &m), MCP_OK);
            assert_true(m.id_at_known);
            struct evbuffer *b = evbuffer_new();
            evbuffer_add(b, bodies[i], strlen(bodies[i]));
            assert_true(rpc_id_put_request_id(b, ASSIGNED, hinted ? &m : NULL));
            assert_int_equal(evbuffer_get_length(b), n);
            assert_memory_equal(evbuffer_pullup(b, -1), want, n);
            evbuffer_free(b);
            mcp_msg_free(&m);
        }
        free(want);
    }
    struct evbuffer *b = evbuffer_new();
    evbuffer_add(b, "{\"method\":\"x\"}", 14);
    assert_false(rpc_id_put_request_id(b, ASSIGNED, NULL));
    assert_int_equal(evbuffer_get_length(b), 14);
    evbuffer_free(b);
}

/* A parse of other bytes than the body's (the body replaced since, an argument cut out before
 * the id) is not trusted: the id is found by walking the body, and only the id changes. */
static void test_request_id_stale_parse(void **state)
{
    static const char parsed[] =
        "{\"method\":\"x\",\"params\":{\"k\":\"secret\",\"n\":7},\"id\":7}";
    /* where the parse saw the id, these bytes hold the pad */
    static const char now[] =
        "{\"method\":\"x\",\"params\":{\"n\":7},\"id\":7,\"pad\":\"xxxxxxxxxxxxxxxxxxxx\"}";
    static const char want[] = "{\"method\":\"x\",\"params\":{\"n\":7},\"id\":" ASSIGNED
                               ",\"pad\":\"xxxxxxxxxxxxxxxxxxxx\"}";
    mcp_msg_t m;
    assert_int_equal(mcp_parse(parsed, strlen(parsed), &m), MCP_OK);
    assert_true(m.id_at_known);
    assert_true(m.id_off < strlen(now) && now[m.id_off] == 'x');
    struct evbuffer *b = evbuffer_new();
    evbuffer_add(b, now, strlen(now));
    assert_true(rpc_id_put_request_id(b, ASSIGNED, &m));
    assert_int_equal(evbuffer_get_length(b), strlen(want));
    assert_memory_equal(evbuffer_pullup(b, -1), want, strlen(want));
    evbuffer_free(b);
    /* and a body shorter than where the parse saw the id */
    b = evbuffer_new();
    evbuffer_add(b, "{\"id\":7}", 8);
    assert_true(rpc_id_put_request_id(b, ASSIGNED, &m));
    assert_memory_equal(evbuffer_pullup(b, -1), "{\"id\":" ASSIGNED "}", strlen(ASSIGNED) + 7);
    evbuffer_free(b);
    mcp_msg_free(&m);
}

/* Ids compared as JSON values, from their texts. */
static void test_same_id(void **state)
{
    static const struct {
        const char *a, *b;
        bool same;
    } cases[] = {
        {ASSIGNED, ASSIGNED, true},
        {ASSIGNED, "\"idemgw-0123456789abcdef-\\u0037\"", true},
        {ASSIGNED, "\"idemgw-0123456789abcdef-8\"", false},
        {"1", "1.0", true},
        {"1", "\"1\"", false},
        {"null", "null", true},
        {"null", "0", false},
        {"\"a\"", "[\"a\"]", false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        bool same = rpc_id_same(cases[i].a, strlen(cases[i].a), cases[i].b, strlen(cases[i].b));
        if (same != cases[i].same)
            fail_msg("case %zu: %s and %s", i, cases[i].a, cases[i].b);
    }
}

/* Each message against the strict lookup of one call, and what it becomes. */
static void test_messages(void **state)
{
    static const struct {
        const char *in;
        rpc_msg_verdict_t v;
        const char *out; /* with MAPPED */
    } cases[] = {
        /* the call's own answer: the caller's id, every other byte kept */
        {"{\"jsonrpc\":\"2.0\",\"id\":" ASSIGNED ",\"result\":{\"x\":\"\\u00e9\",\"n\":1.50}}",
         RPC_MSG_MAPPED,
         "{\"jsonrpc\":\"2.0\",\"id\":42,\"result\":{\"x\":\"\\u00e9\",\"n\":1.50}}"},
        {"{\"error\":{\"code\":-1},\"id\": " ASSIGNED " }", RPC_MSG_MAPPED,
         "{\"error\":{\"code\":-1},\"id\": 42 }"},
        /* the same id written with an escape is the same id */
        {"{\"id\":\"idemgw-0123456789abcdef-\\u0037\",\"result\":{}}", RPC_MSG_MAPPED,
         "{\"id\":42,\"result\":{}}"},
        /* an answer to anyone else: the caller's own id, a number, null, none, a batch */
        {"{\"jsonrpc\":\"2.0\",\"id\":42,\"result\":{}}", RPC_MSG_DESYNC, NULL},
        {"{\"id\":\"idemgw-0123456789abcdef-6\",\"result\":{}}", RPC_MSG_DESYNC, NULL},
        {"{\"id\":null,\"error\":{\"code\":-32700}}", RPC_MSG_DESYNC, NULL},
        {"{\"result\":{}}", RPC_MSG_DESYNC, NULL},
        {"[{\"id\":" ASSIGNED ",\"result\":{}}]", RPC_MSG_DESYNC, NULL},
        /* the id under an escaped member name is still found where it is read */
        {"{\"i\\u0064\":" ASSIGNED ",\"result\":{}}", RPC_MSG_MAPPED,
         "{\"i\\u0064\":42,\"result\":{}}"},
        /* two ids: the last one is the message's, for jansson as for the agent's parser */
        {"{\"id\":" ASSIGNED ",\"id\":1,\"result\":{}}", RPC_MSG_DESYNC, NULL},
        /* the server's own requests and notifications; one naming the call is mapped */
        {"{\"method\":\"notifications/progress\",\"params\":{\"progressToken\":1}}", RPC_MSG_PASS,
         NULL},
        {"{\"id\":5,\"method\":\"elicitation/create\",\"params\":{}}", RPC_MSG_PASS, NULL},
        {"{\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":" ASSIGNED "}}",
         RPC_MSG_MAPPED, "{\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":42}}"},
        {"[{\"method\":\"notifications/message\"}]", RPC_MSG_PASS, NULL},
        /* not JSON-RPC, not JSON */
        {"{\"hello\":1}", RPC_MSG_PASS, NULL},
        {"<html>bad gateway</html>", RPC_MSG_PASS, NULL},
        {"", RPC_MSG_PASS, NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        one_t o = one("42");
        char *out = NULL;
        size_t n = 0;
        rpc_msg_verdict_t v =
            rpc_id_map_message(cases[i].in, strlen(cases[i].in), one_lookup, &o, true, &out, &n);
        if (v != cases[i].v)
            fail_msg("case %zu (%s): verdict %d, not %d", i, cases[i].in, v, cases[i].v);
        if (cases[i].out) {
            assert_non_null(out);
            assert_int_equal(n, strlen(cases[i].out));
            assert_string_equal(out, cases[i].out);
        } else {
            assert_null(out);
        }
        free(out);
        json_decref(o.assigned);
    }
    /* lenient (a GET stream): an answer to another request goes by as it is */
    one_t o = one("42");
    char *out = NULL;
    size_t n;
    assert_int_equal(
        rpc_id_map_message("{\"id\":3,\"result\":{}}", 20, one_lookup, &o, false, &out, &n),
        RPC_MSG_PASS);
    assert_null(out);
    json_decref(o.assigned);
}

/* body fed to a new rewriter in pieces of step bytes; the output, or NULL when it failed with
 * *st. */
static char *rewrite(rpc_body_t kind, decode_coding_t coding, const char *body, size_t len,
                     size_t step, const char *caller, bool complete, rpc_id_status_t *st)
{
    one_t o = one(caller);
    rpc_id_rewriter_t *r = rpc_id_rewriter_new(kind, coding, 4096, one_lookup, &o, true);
    struct evbuffer *out = evbuffer_new();
    *st = RPC_ID_OK;
    for (size_t at = 0; at < len && *st == RPC_ID_OK; at += step)
        *st = rpc_id_rewriter_feed(r, body + at, at + step < len ? step : len - at, out);
    if (*st == RPC_ID_OK)
        *st = rpc_id_rewriter_finish(r, complete, out);
    char *text = NULL;
    if (*st == RPC_ID_OK) {
        size_t n = evbuffer_get_length(out);
        text = xmalloc(n + 1);
        evbuffer_remove(out, text, n);
        text[n] = '\0';
    }
    evbuffer_free(out);
    rpc_id_rewriter_free(r);
    json_decref(o.assigned);
    return text;
}

static void test_json_answer(void **state)
{
    static const char body[] = "{\"jsonrpc\":\"2.0\",\"id\":" ASSIGNED ",\"result\":{\"ok\":1}}";
    for (size_t step = 1; step <= sizeof(body); step++) {
        rpc_id_status_t st;
        char *out = rewrite(RPC_BODY_JSON, DECODE_CODING_IDENTITY, body, strlen(body), step,
                            "\"mine\"", true, &st);
        assert_int_equal(st, RPC_ID_OK);
        assert_string_equal(out, "{\"jsonrpc\":\"2.0\",\"id\":\"mine\",\"result\":{\"ok\":1}}");
        free(out);
    }
    /* another request's answer, whole: a desync */
    static const char stray[] = "{\"jsonrpc\":\"2.0\",\"id\":\"mine\",\"result\":{}}";
    rpc_id_status_t st;
    assert_null(rewrite(RPC_BODY_JSON, DECODE_CODING_IDENTITY, stray, strlen(stray), 5, "\"mine\"",
                        true, &st));
    assert_int_equal(st, RPC_ID_DESYNC);
    /* a cut answer gives out nothing of what it kept (it names the assigned id) */
    char *out = rewrite(RPC_BODY_JSON, DECODE_CODING_IDENTITY, body, 20, 7, "1", false, &st);
    assert_int_equal(st, RPC_ID_OK);
    assert_string_equal(out, "");
    free(out);
    /* more than the limit */
    char big[5000];
    memset(big, ' ', sizeof(big));
    assert_null(
        rewrite(RPC_BODY_JSON, DECODE_CODING_IDENTITY, big, sizeof(big), 1000, "1", true, &st));
    assert_int_equal(st, RPC_ID_TOO_LARGE);
}

static void test_sse_answer(void **state)
{
    /* a comment, a progress notification over two data lines with CRLF, the answer with its
     * event id and type, then a server request: only the answer's id changes */
    static const char body[] =
        ": ping\n\n"
        "event: message\r\ndata: {\"method\":\"notifications/progress\",\r\ndata: "
        "\"params\":{\"progressToken\":9}}\r\n\r\n"
        "id: ev-2\nevent: message\ndata: {\"id\":" ASSIGNED ",\"result\":{\"a\":1}}\nretry: 5\n\n"
        "data: {\"id\":1,\"method\":\"ping\"}\n\n";
    static const char want[] =
        ": ping\n\n"
        "event: message\r\ndata: {\"method\":\"notifications/progress\",\r\ndata: "
        "\"params\":{\"progressToken\":9}}\r\n\r\n"
        "id: ev-2\nevent: message\ndata: {\"id\":7,\"result\":{\"a\":1}}\nretry: 5\n\n"
        "data: {\"id\":1,\"method\":\"ping\"}\n\n";
    for (size_t step = 1; step <= sizeof(body); step++) {
        rpc_id_status_t st;
        char *out =
            rewrite(RPC_BODY_SSE, DECODE_CODING_IDENTITY, body, strlen(body), step, "7", true, &st);
        assert_int_equal(st, RPC_ID_OK);
        assert_string_equal(out, want);
        free(out);
    }
    /* a multi-line answer: its data lines come back one per line of the message */
    static const char split[] = "data: {\"id\":\ndata: " ASSIGNED ",\"result\":{}}\n\n";
    rpc_id_status_t st;
    char *out =
        rewrite(RPC_BODY_SSE, DECODE_CODING_IDENTITY, split, strlen(split), 3, "7", true, &st);
    assert_string_equal(out, "data: {\"id\":\ndata: 7,\"result\":{}}\n\n");
    free(out);
    /* a byte order mark ahead of the first event, and lone CRs as line ends */
    static const char bom[] = "\xEF\xBB\xBF"
                              "data: {\"id\":" ASSIGNED ",\"result\":{}}\r\r";
    out = rewrite(RPC_BODY_SSE, DECODE_CODING_IDENTITY, bom, strlen(bom), 1, "7", true, &st);
    assert_string_equal(out, "\xEF\xBB\xBF"
                             "data: {\"id\":7,\"result\":{}}\n\r");
    free(out);
    /* an answer with any other id in the stream: a desync, whatever came before it */
    static const char stray[] = "data: {\"method\":\"notifications/progress\"}\n\n"
                                "data: {\"id\":7,\"result\":{}}\n\n";
    assert_null(
        rewrite(RPC_BODY_SSE, DECODE_CODING_IDENTITY, stray, strlen(stray), 4, "7", true, &st));
    assert_int_equal(st, RPC_ID_DESYNC);
    /* an event the stream did not end is passed as it came (a client drops it) */
    static const char unended[] = "data: {\"id\":" ASSIGNED ",\"result\":{}}\n";
    out =
        rewrite(RPC_BODY_SSE, DECODE_CODING_IDENTITY, unended, strlen(unended), 4, "7", true, &st);
    assert_string_equal(out, unended);
    free(out);
    /* an event larger than the limit */
    char big[5000];
    memset(big, 'x', sizeof(big));
    memcpy(big, "data: ", 6);
    assert_null(
        rewrite(RPC_BODY_SSE, DECODE_CODING_IDENTITY, big, sizeof(big), 999, "7", true, &st));
    assert_int_equal(st, RPC_ID_TOO_LARGE);
}

/* An SSE event near the limit (4096 bytes, its terminators included): the verdict is the
 * same whether the event arrives in one read or a byte at a time, ended or not. An event past
 * the limit once passed when a read ended with a whole line of it (or the event itself) and
 * failed when a read ended inside a line, where alone the bytes kept were measured. */
static void test_sse_limit_boundary(void **state)
{
    (void)state;
    static const size_t steps[] = {1, 2, 7, 4095, 4096, 4097, 1 << 20};
    for (size_t over = 0; over <= 1; over++) {
        /* "data: xxx...x\n\n", 4096 + over bytes */
        size_t len = 4096 + over;
        char *ev = xmalloc(len + 1);
        memcpy(ev, "data: ", 6);
        memset(ev + 6, 'x', len - 8);
        memcpy(ev + len - 2, "\n\n", 2);
        ev[len] = '\0';
        for (size_t i = 0; i < ARRAY_LEN(steps); i++) {
            rpc_id_status_t st;
            char *out =
                rewrite(RPC_BODY_SSE, DECODE_CODING_IDENTITY, ev, len, steps[i], "7", true, &st);
            if (over) {
                assert_int_equal(st, RPC_ID_TOO_LARGE);
                assert_null(out);
            } else {
                assert_int_equal(st, RPC_ID_OK);
                assert_string_equal(out, ev); /* not JSON-RPC: relayed as it came */
            }
            free(out);
        }
        free(ev);
    }
    /* an event the stream did not end, its lines whole, past the limit: it fails as it does
     * when a read ends in the middle of one of its lines */
    char unended[4200];
    for (size_t at = 0; at < sizeof(unended); at += 100) {
        memset(unended + at, 'x', 100);
        memcpy(unended + at, "data: ", 6);
        unended[at + 99] = '\n';
    }
    for (size_t i = 0; i < ARRAY_LEN(steps); i++) {
        rpc_id_status_t st;
        assert_null(rewrite(RPC_BODY_SSE, DECODE_CODING_IDENTITY, unended, sizeof(unended),
                            steps[i], "7", true, &st));
        assert_int_equal(st, RPC_ID_TOO_LARGE);
    }
}

static size_t gzip(const char *in, unsigned char *out, size_t cap)
{
    z_stream z = {0};
    assert_int_equal(deflateInit2(&z, 6, Z_DEFLATED, 16 + 15, 8, Z_DEFAULT_STRATEGY), Z_OK);
    z.next_in = (Bytef *)in;
    z.avail_in = (uInt)strlen(in);
    z.next_out = out;
    z.avail_out = (uInt)cap;
    assert_int_equal(deflate(&z, Z_FINISH), Z_STREAM_END);
    size_t n = cap - z.avail_out;
    deflateEnd(&z);
    return n;
}

static void test_compressed_answers(void **state)
{
    unsigned char z[512];
    size_t n = gzip("{\"id\":" ASSIGNED ",\"result\":{\"t\":\"hello hello\"}}", z, sizeof(z));
    rpc_id_status_t st;
    char *out = rewrite(RPC_BODY_JSON, DECODE_CODING_GZIP, (const char *)z, n, 3, "42", true, &st);
    assert_int_equal(st, RPC_ID_OK);
    assert_string_equal(out, "{\"id\":42,\"result\":{\"t\":\"hello hello\"}}");
    free(out);
    n = gzip("data: {\"id\":" ASSIGNED ",\"result\":{}}\n\n", z, sizeof(z));
    out = rewrite(RPC_BODY_SSE, DECODE_CODING_GZIP, (const char *)z, n, 1, "42", true, &st);
    assert_string_equal(out, "data: {\"id\":42,\"result\":{}}\n\n");
    free(out);
    /* a compressed stray is found out once decoded */
    n = gzip("{\"id\":42,\"result\":{}}", z, sizeof(z));
    assert_null(rewrite(RPC_BODY_JSON, DECODE_CODING_GZIP, (const char *)z, n, 4, "42", true, &st));
    assert_int_equal(st, RPC_ID_DESYNC);
    /* cut short, or a coding nobody reads: the id cannot be known */
    n = gzip("{\"id\":" ASSIGNED ",\"result\":{}}", z, sizeof(z));
    assert_null(
        rewrite(RPC_BODY_JSON, DECODE_CODING_GZIP, (const char *)z, n - 4, 4, "42", true, &st));
    assert_int_equal(st, RPC_ID_UNREADABLE);
    assert_null(rewrite(RPC_BODY_JSON, DECODE_CODING_UNSUPPORTED, "x", 1, 1, "42", true, &st));
    assert_int_equal(st, RPC_ID_UNREADABLE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_and_format),
        cmocka_unit_test(test_request_and_cancel_rewritten),
        cmocka_unit_test(test_request_id_in_place),
        cmocka_unit_test(test_request_id_stale_parse),
        cmocka_unit_test(test_same_id),
        cmocka_unit_test(test_messages),
        cmocka_unit_test(test_json_answer),
        cmocka_unit_test(test_sse_answer),
        cmocka_unit_test(test_sse_limit_boundary),
        cmocka_unit_test(test_compressed_answers),
    };
    return cmocka_run_group_tests_name("rpc_id", tests, NULL, NULL);
}
