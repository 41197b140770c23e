/* Key derivation tables. Policies are built by hand. */
#include "key.h"

#include <stdarg.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SHA_EMPTY_OBJ "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
#define SHA_A1_B2 "43258cff783fe7036d8a43033f830adfc60ec037382473548ac742b888292777"
#define SHA_A1 "015abd7f5cc57a2dd94b7590f04ad8084273905ee33ec5cebeae62276a97f862"
#define SHA_A1_META_X1 "5bd6257dd62a3083c679467fd79753ecc996312d2467ded82c384a2d3fdb4b4e"
#define SHA_BIG_ID "2185812179ffd2b19c8154d2d409599d231fb75ef4968df59b7f02b435c094fa"

/* A policy with the given exclusions (NULL-terminated) and key_arg. */
typedef struct test_policy {
    policy_tool_t pt;
    char *ex[8];
} test_policy_t;

static const policy_tool_t *make_policy(test_policy_t *tp, const char *key_arg, ...)
{
    memset(tp, 0, sizeof *tp);
    va_list ap;
    va_start(ap, key_arg);
    const char *p;
    while ((p = va_arg(ap, const char *)) != NULL && tp->pt.n_exclude_args < ARRAY_LEN(tp->ex))
        tp->ex[tp->pt.n_exclude_args++] = (char *)p;
    va_end(ap);
    tp->pt.exclude_args = tp->ex;
    tp->pt.key_arg = (char *)key_arg;
    return &tp->pt;
}

static jcs_value_t *parse(const char *s)
{
    if (!s)
        return NULL;
    jcs_value_t *v;
    char err[128];
    if (jcs_parse(s, strlen(s), &v, err, sizeof err) != JCS_OK)
        fail_msg("%s: %s", s, err);
    return v;
}

/* Derives a key; returns the status and, on success, fills key (caller frees) and digest. */
static key_status_t derive(const char *subject, const char *tool, const char *args_json,
                           const policy_tool_t *pt, const char *header, char **key, char digest[65],
                           bool *expl)
{
    jcs_value_t *args = parse(args_json);
    key_result_t r;
    char msg[256];
    key_call_t call = {
        .subject = subject, .tool = tool, .arguments = args, .header_key = header, .pt = pt};
    key_status_t st = key_for_call(&call, &r, msg, sizeof msg);
    jcs_free(args);
    if (st != KEY_OK) {
        assert_true(strlen(msg) > 0);
        assert_null(r.key);
        *key = NULL;
        return st;
    }
    *key = r.key;
    r.key = NULL;
    if (digest)
        memcpy(digest, r.args_digest, 65);
    if (expl)
        *expl = r.explicit_key;
    key_result_free(&r);
    return st;
}

typedef struct key_case {
    const char *subject, *tool, *args, *header;
    const char *key_arg; /* policy key_arg; ignored when use_pt is false */
    const char *excl[3]; /* policy exclude_args */
    bool use_pt;         /* false: pass a NULL policy */
    key_status_t st;
    const char *want_key; /* exact key, or NULL */
    const char *want_digest;
} key_case_t;

static void test_key_table(void **state)
{
    (void)state;
    static const key_case_t cases[] = {
        /* hashed keys: known SHA-256 prefixes of the canonical arguments */
        {"s",
         "t",
         "{}",
         NULL,
         NULL,
         {0},
         false,
         KEY_OK,
         "s:t:h:44136fa355b3678a1146ad16f7e8649e",
         SHA_EMPTY_OBJ},
        {"s",
         "t",
         NULL,
         NULL,
         NULL,
         {0},
         false,
         KEY_OK,
         "s:t:h:44136fa355b3678a1146ad16f7e8649e",
         SHA_EMPTY_OBJ},
        {"s",
         "t",
         "null",
         NULL,
         NULL,
         {0},
         false,
         KEY_OK,
         "s:t:h:44136fa355b3678a1146ad16f7e8649e",
         SHA_EMPTY_OBJ},
        {"s",
         "t",
         " { \"b\" : 2.0, \"a\" : 1e0 } ",
         NULL,
         NULL,
         {0},
         false,
         KEY_OK,
         "s:t:h:43258cff783fe7036d8a43033f830adf",
         SHA_A1_B2},
        {"s",
         "t",
         "{\"id\":9007199254740993}",
         NULL,
         NULL,
         {0},
         false,
         KEY_OK,
         "s:t:h:2185812179ffd2b19c8154d2d409599d",
         SHA_BIG_ID},
        /* exclude_args, nested, and missing paths are ignored */
        {"s",
         "t",
         "{\"a\":1,\"meta\":{\"ts\":5,\"x\":1}}",
         NULL,
         "idempotency_key",
         {"meta.ts", "nope.deeper", "also_missing"},
         true,
         KEY_OK,
         "s:t:h:5bd6257dd62a3083c679467fd79753ec",
         SHA_A1_META_X1},
        {"s",
         "t",
         "{\"a\":1,\"b\":{\"c\":{\"d\":1}}}",
         NULL,
         "idempotency_key",
         {"b"},
         true,
         KEY_OK,
         NULL,
         SHA_A1},
        /* key_arg: removed from the digest, becomes the explicit key */
        {"s",
         "t",
         "{\"a\":1,\"idempotency_key\":\"abc\"}",
         NULL,
         NULL,
         {0},
         false,
         KEY_OK,
         "s:t:x:abc",
         SHA_A1},
        {"s",
         "t",
         "{\"a\":1,\"request_id\":\"r-1:2\"}",
         NULL,
         "request_id",
         {0},
         true,
         KEY_OK,
         "s:t:x:r-1:2",
         SHA_A1},
        {"s",
         "t",
         "{\"a\":1,\"idempotency_key\":42}",
         NULL,
         NULL,
         {0},
         false,
         KEY_OK,
         "s:t:x:42",
         SHA_A1},
        {"s",
         "t",
         "{\"a\":1,\"idempotency_key\":9007199254740993}",
         NULL,
         NULL,
         {0},
         false,
         KEY_OK,
         "s:t:x:9007199254740993",
         SHA_A1},
        {"s",
         "t",
         "{\"a\":1,\"idempotency_key\":null}",
         NULL,
         NULL,
         {0},
         false,
         KEY_OK,
         "s:t:h:015abd7f5cc57a2dd94b7590f04ad808",
         SHA_A1},
        /* a policy without key_arg: the member is an ordinary argument */
        {"s",
         "t",
         "{\"a\":1,\"idempotency_key\":\"abc\"}",
         NULL,
         NULL,
         {0},
         true,
         KEY_OK,
         NULL,
         NULL},
        /* the header wins over the argument, which still leaves the digest */
        {"s",
         "t",
         "{\"a\":1,\"idempotency_key\":\"abc\"}",
         "H-1",
         NULL,
         {0},
         false,
         KEY_OK,
         "s:t:x:H-1",
         SHA_A1},
        {"s",
         "t",
         "{\"a\":1,\"idempotency_key\":{\"bad\":true}}",
         "H-1",
         NULL,
         {0},
         false,
         KEY_OK,
         "s:t:x:H-1",
         SHA_A1},
        {"s", "t", NULL, "H-2", NULL, {0}, false, KEY_OK, "s:t:x:H-2", SHA_EMPTY_OBJ},
        /* separators in subject and tool are encoded */
        {"alice:x",
         "t",
         "{}",
         NULL,
         NULL,
         {0},
         false,
         KEY_OK,
         "alice%3Ax:t:h:44136fa355b3678a1146ad16f7e8649e",
         NULL},
        {"alice",
         "x:t",
         "{}",
         NULL,
         NULL,
         {0},
         false,
         KEY_OK,
         "alice:x%3At:h:44136fa355b3678a1146ad16f7e8649e",
         NULL},
        {"a%3Ab",
         "t",
         "{}",
         NULL,
         NULL,
         {0},
         false,
         KEY_OK,
         "a%253Ab:t:h:44136fa355b3678a1146ad16f7e8649e",
         NULL},
        /* errors */
        {"s", "t", "[]", NULL, NULL, {0}, false, KEY_ERR_ARGS_NOT_OBJECT, NULL, NULL},
        {"s", "t", "\"x\"", NULL, NULL, {0}, false, KEY_ERR_ARGS_NOT_OBJECT, NULL, NULL},
        {"s", "t", "1", NULL, NULL, {0}, false, KEY_ERR_ARGS_NOT_OBJECT, NULL, NULL},
        {"s", "t", "true", NULL, "idempotency_key", {0}, true, KEY_ERR_ARGS_NOT_OBJECT, NULL, NULL},
        /* header keys that are not UTF-8 would fail the claim in Postgres: refused here */
        {"s", "t", "{}", "k\xff", NULL, {0}, false, KEY_ERR_BAD_EXPLICIT, NULL, NULL},
        {"s", "t", "{}", "Jos\xe9", NULL, {0}, false, KEY_ERR_BAD_EXPLICIT, NULL, NULL},
        {"s",
         "t",
         "{}",
         "Jos\xc3\xa9",
         NULL,
         {0},
         false,
         KEY_OK,
         "s:t:x:Jos\xc3\xa9",
         SHA_EMPTY_OBJ},
        {"s",
         "t",
         "{\"idempotency_key\":\"\"}",
         NULL,
         NULL,
         {0},
         false,
         KEY_ERR_BAD_EXPLICIT,
         NULL,
         NULL},
        {"s",
         "t",
         "{\"idempotency_key\":true}",
         NULL,
         NULL,
         {0},
         false,
         KEY_ERR_BAD_EXPLICIT,
         NULL,
         NULL},
        {"s",
         "t",
         "{\"idempotency_key\":[\"k\"]}",
         NULL,
         NULL,
         {0},
         false,
         KEY_ERR_BAD_EXPLICIT,
         NULL,
         NULL},
        {"s",
         "t",
         "{\"idempotency_key\":\"a\\u0000b\"}",
         NULL,
         NULL,
         {0},
         false,
         KEY_ERR_BAD_EXPLICIT,
         NULL,
         NULL},
        {"s", "t", "{}", "", NULL, {0}, false, KEY_ERR_BAD_EXPLICIT, NULL, NULL},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        const key_case_t *c = &cases[i];
        test_policy_t tp;
        const policy_tool_t *pt = NULL;
        if (c->use_pt)
            pt = make_policy(&tp, c->key_arg, c->excl[0], c->excl[1], c->excl[2], NULL);
        char *key, digest[65];
        bool expl = false;
        key_status_t st = derive(c->subject, c->tool, c->args, pt, c->header, &key, digest, &expl);
        if (st != c->st)
            fail_msg("case %zu: status %s want %s", i, key_status_str(st), key_status_str(c->st));
        if (st != KEY_OK)
            continue;
        if (c->want_key && strcmp(key, c->want_key) != 0)
            fail_msg("case %zu: key %s want %s", i, key, c->want_key);
        if (c->want_digest && strcmp(digest, c->want_digest) != 0)
            fail_msg("case %zu: digest %s want %s", i, digest, c->want_digest);
        assert_int_equal(expl, strstr(key, ":x:") != NULL && strstr(key, ":h:") == NULL);
        free(key);
    }
}

/* Derives with the default policy and returns the key (caller frees). */
static char *key_of(const char *subject, const char *tool, const char *args, const char *header)
{
    char *key;
    assert_int_equal(derive(subject, tool, args, NULL, header, &key, NULL, NULL), KEY_OK);
    return key;
}

static void test_key_relations(void **state)
{
    (void)state;
    char *a = key_of("alice", "send", "{\"to\":\"bob\",\"n\":1}", NULL);
    char *b = key_of("alice", "send", "{\"n\":1.0,\"to\":\"\\u0062ob\"}", NULL);
    char *c = key_of("carol", "send", "{\"to\":\"bob\",\"n\":1}", NULL);
    char *d = key_of("alice", "mail", "{\"to\":\"bob\",\"n\":1}", NULL);
    char *e = key_of("alice", "send", "{\"to\":\"bob\",\"n\":2}", NULL);
    char *f = key_of("alice", "send", "{\"id\":9007199254740993}", NULL);
    char *g = key_of("alice", "send", "{\"id\":9007199254740992}", NULL);
    assert_string_equal(a, b);     /* same call written differently */
    assert_string_not_equal(a, c); /* different subjects never share */
    assert_string_not_equal(a, d);
    assert_string_not_equal(a, e);
    assert_string_not_equal(f, g); /* large ids stay distinct */
    assert_int_equal(strlen(a), strlen("alice:send:h:") + 32);
    free(a), free(b), free(c), free(d), free(e), free(f), free(g);

    /* the same explicit key with other arguments: same key, other digest */
    char *k1, *k2, d1[65], d2[65];
    assert_int_equal(
        derive("s", "t", "{\"idempotency_key\":\"k\",\"a\":1}", NULL, NULL, &k1, d1, NULL), KEY_OK);
    assert_int_equal(
        derive("s", "t", "{\"idempotency_key\":\"k\",\"a\":2}", NULL, NULL, &k2, d2, NULL), KEY_OK);
    assert_string_equal(k1, k2);
    assert_string_not_equal(d1, d2);
    free(k1), free(k2);
}

static void test_explicit_length(void **state)
{
    (void)state;
    char json[600], hdr[300], *key;
    memset(hdr, 'k', 255);
    hdr[255] = '\0';
    snprintf(json, sizeof json, "{\"idempotency_key\":\"%s\"}", hdr);
    assert_int_equal(derive("s", "t", json, NULL, NULL, &key, NULL, NULL), KEY_OK);
    free(key);
    assert_int_equal(derive("s", "t", "{}", NULL, hdr, &key, NULL, NULL), KEY_OK);
    free(key);
    strcat(hdr, "k");
    snprintf(json, sizeof json, "{\"idempotency_key\":\"%s\"}", hdr);
    assert_int_equal(derive("s", "t", json, NULL, NULL, &key, NULL, NULL), KEY_ERR_BAD_EXPLICIT);
    assert_int_equal(derive("s", "t", "{}", NULL, hdr, &key, NULL, NULL), KEY_ERR_BAD_EXPLICIT);
}

static void test_args_modified(void **state)
{
    (void)state;
    test_policy_t tp;
    const policy_tool_t *pt = make_policy(&tp, "k", "m.ts", NULL);
    jcs_value_t *args = parse("{\"a\":1,\"k\":\"x\",\"m\":{\"ts\":1}}");
    key_result_t r;
    key_call_t call = {.subject = "s", .tool = "t", .arguments = args, .pt = pt};
    assert_int_equal(key_for_call(&call, &r, NULL, 0), KEY_OK);
    char *canon = jcs_serialize(args, NULL);
    assert_string_equal(canon, "{\"a\":1,\"m\":{}}");
    assert_string_equal(r.key, "s:t:x:x");
    assert_true(r.explicit_key);
    free(canon);
    key_result_free(&r);
    key_result_free(&r); /* idempotent */
    jcs_free(args);
}

static void test_key_hash_hex(void **state)
{
    (void)state;
    char out[65];
    key_hash_hex("abc", out);
    assert_string_equal(out, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    key_hash_hex("", out);
    assert_string_equal(out, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

static void test_key_status_str(void **state)
{
    (void)state;
    assert_string_equal(key_status_str(KEY_OK), "ok");
    assert_string_equal(key_status_str(KEY_ERR_ARGS_NOT_OBJECT), "arguments are not an object");
    assert_string_equal(key_status_str(KEY_ERR_BAD_EXPLICIT), "bad explicit idempotency key");
    assert_string_equal(key_status_str((key_status_t)42), "unknown key status");
}

/* params.idempotencyKey: an explicit key outside the arguments. The header wins over it, it
 * wins over the key argument, and it is refused when unusable. */
static void test_params_key(void **state)
{
    (void)state;
    static const struct {
        const char *params, *header;
        key_status_t st;
        const char *key;   /* on KEY_OK */
        const char *canon; /* the arguments hashed, on KEY_OK */
    } cases[] = {
        {"{\"arguments\":{\"a\":1},\"idempotencyKey\":\"p1\"}", NULL, KEY_OK, "s:t:x:p1",
         "{\"a\":1}"},
        {"{\"arguments\":{\"a\":1},\"idempotencyKey\":\"p1\"}", "h1", KEY_OK, "s:t:x:h1",
         "{\"a\":1}"},
        {"{\"arguments\":{\"a\":1,\"idempotency_key\":\"arg\"},\"idempotencyKey\":\"p1\"}", NULL,
         KEY_OK, "s:t:x:p1", "{\"a\":1}"},
        {"{\"arguments\":{\"a\":1,\"idempotency_key\":\"arg\"}}", NULL, KEY_OK, "s:t:x:arg",
         "{\"a\":1}"},
        {"{\"arguments\":{\"a\":1},\"idempotencyKey\":null}", NULL, KEY_OK, NULL, "{\"a\":1}"},
        {"{\"idempotencyKey\":42}", NULL, KEY_OK, "s:t:x:42", "{}"},
        {"{\"arguments\":{\"a\":1},\"idempotencyKey\":\"\"}", NULL, KEY_ERR_BAD_EXPLICIT, NULL,
         NULL},
        {"{\"arguments\":{\"a\":1},\"idempotencyKey\":{\"k\":1}}", NULL, KEY_ERR_BAD_EXPLICIT, NULL,
         NULL},
        {"{\"arguments\":{\"a\":1},\"idempotencyKey\":[\"k\"]}", NULL, KEY_ERR_BAD_EXPLICIT, NULL,
         NULL},
        {"{\"arguments\":[1],\"idempotencyKey\":\"p1\"}", NULL, KEY_ERR_ARGS_NOT_OBJECT, NULL,
         NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        jcs_value_t *params = parse(cases[i].params);
        key_result_t r;
        char msg[256];
        key_call_t call = {
            .subject = "s", .tool = "t", .params = params, .header_key = cases[i].header};
        key_status_t st = key_for_call(&call, &r, msg, sizeof msg);
        if (st != cases[i].st)
            fail_msg("case %zu: status %s, want %s (%s)", i, key_status_str(st),
                     key_status_str(cases[i].st), msg);
        if (st != KEY_OK) {
            if (st == KEY_ERR_BAD_EXPLICIT)
                assert_non_null(strstr(msg, "params.idempotencyKey"));
            jcs_free(params);
            continue;
        }
        char digest[65];
        util_sha256_hex(cases[i].canon, strlen(cases[i].canon), digest);
        assert_string_equal(r.args_digest, digest);
        if (cases[i].key) {
            assert_string_equal(r.key, cases[i].key);
            assert_true(r.explicit_key);
        } else {
            assert_false(r.explicit_key);
        }
        key_result_free(&r);
        jcs_free(params);
    }
    /* the same key with other arguments: same key, another digest (what key_reused compares) */
    jcs_value_t *a = parse("{\"arguments\":{\"a\":1},\"idempotencyKey\":\"p\"}");
    jcs_value_t *b = parse("{\"arguments\":{\"a\":2},\"idempotencyKey\":\"p\"}");
    key_result_t ra, rb;
    key_call_t ca = {.subject = "s", .tool = "t", .params = a};
    key_call_t cb = {.subject = "s", .tool = "t", .params = b};
    assert_int_equal(key_for_call(&ca, &ra, NULL, 0), KEY_OK);
    assert_int_equal(key_for_call(&cb, &rb, NULL, 0), KEY_OK);
    assert_string_equal(ra.key, rb.key);
    assert_string_not_equal(ra.args_digest, rb.args_digest);
    key_result_free(&ra);
    key_result_free(&rb);
    jcs_free(a);
    jcs_free(b);
}

/* key_for_call end to end: each source of the call (params with its idempotencyKey, or the
 * arguments alone; the header; the policy's key_arg and exclusions) to the key, its hash, the
 * digest and whether the key was the client's. */
static void test_key_for_call(void **state)
{
    (void)state;
    static const struct {
        const char *params;    /* the tools/call's params, or NULL */
        const char *arguments; /* used when params is NULL */
        const char *header;
        const char *key_arg; /* policy key_arg; NULL: no policy */
        const char *excl;    /* one exclude_args path, or NULL */
        key_status_t st;
        const char *key;   /* on KEY_OK */
        const char *canon; /* the arguments hashed, on KEY_OK */
        bool explicit_key;
    } cases[] = {
        /* hashed arguments */
        {"{\"arguments\":{\"a\":1}}", NULL, NULL, NULL, NULL, KEY_OK,
         "u%3A1:t%25x:h:015abd7f5cc57a2dd94b7590f04ad808", "{\"a\":1}", false},
        {"{}", NULL, NULL, NULL, NULL, KEY_OK, "u%3A1:t%25x:h:44136fa355b3678a1146ad16f7e8649e",
         "{}", false},
        {NULL, NULL, NULL, NULL, NULL, KEY_OK, "u%3A1:t%25x:h:44136fa355b3678a1146ad16f7e8649e",
         "{}", false},
        {"{\"arguments\":{\"a\":1,\"ts\":9}}", NULL, NULL, "k", "ts", KEY_OK,
         "u%3A1:t%25x:h:015abd7f5cc57a2dd94b7590f04ad808", "{\"a\":1}", false},
        /* the three explicit sources, in their order */
        {"{\"arguments\":{\"a\":1,\"k\":\"arg\"},\"idempotencyKey\":\"par\"}", NULL, "hdr", "k",
         NULL, KEY_OK, "u%3A1:t%25x:x:hdr", "{\"a\":1}", true},
        {"{\"arguments\":{\"a\":1,\"k\":\"arg\"},\"idempotencyKey\":\"par\"}", NULL, NULL, "k",
         NULL, KEY_OK, "u%3A1:t%25x:x:par", "{\"a\":1}", true},
        {"{\"arguments\":{\"a\":1,\"k\":\"arg\"}}", NULL, NULL, "k", NULL, KEY_OK,
         "u%3A1:t%25x:x:arg", "{\"a\":1}", true},
        /* a policy without key_arg hashes the member with the rest */
        {"{\"arguments\":{\"a\":1,\"k\":\"arg\"}}", NULL, NULL, "", NULL, KEY_OK,
         "u%3A1:t%25x:h:", "{\"a\":1,\"k\":\"arg\"}", false},
        /* the arguments alone: an idempotencyKey there is an argument, not a source */
        {NULL, "{\"a\":1,\"idempotencyKey\":\"p\"}", NULL, NULL, NULL, KEY_OK,
         "u%3A1:t%25x:h:", "{\"a\":1,\"idempotencyKey\":\"p\"}", false},
        {NULL, "{\"a\":1}", "hdr", NULL, NULL, KEY_OK, "u%3A1:t%25x:x:hdr", "{\"a\":1}", true},
        /* refusals */
        {"{\"arguments\":{\"a\":1}}", NULL, "", NULL, NULL, KEY_ERR_BAD_EXPLICIT, NULL, NULL,
         false},
        {"{\"arguments\":{\"a\":1},\"idempotencyKey\":true}", NULL, NULL, NULL, NULL,
         KEY_ERR_BAD_EXPLICIT, NULL, NULL, false},
        {"{\"arguments\":\"a\"}", NULL, NULL, NULL, NULL, KEY_ERR_ARGS_NOT_OBJECT, NULL, NULL,
         false},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        jcs_value_t *params = parse(cases[i].params);
        jcs_value_t *arguments = parse(cases[i].arguments);
        test_policy_t tp;
        key_call_t call = {
            .subject = "u:1",
            .tool = "t%x",
            .params = params,
            .arguments = arguments,
            .header_key = cases[i].header,
            .pt = cases[i].key_arg ? make_policy(&tp, cases[i].key_arg, cases[i].excl, NULL) : NULL,
        };
        key_result_t r;
        char msg[256] = "";
        key_status_t st = key_for_call(&call, &r, msg, sizeof msg);
        if (st != cases[i].st)
            fail_msg("case %zu: status %s, want %s (%s)", i, key_status_str(st),
                     key_status_str(cases[i].st), msg);
        if (st != KEY_OK) {
            assert_null(r.key);
            assert_true(strlen(msg) > 0);
        } else {
            /* a hashed key ends with the digest's first 32 characters */
            assert_memory_equal(r.key, cases[i].key, strlen(cases[i].key));
            char digest[65], hash[65];
            util_sha256_hex(cases[i].canon, strlen(cases[i].canon), digest);
            assert_string_equal(r.args_digest, digest);
            if (!cases[i].explicit_key)
                assert_memory_equal(strrchr(r.key, ':') + 1, digest, 32);
            else
                assert_string_equal(r.key, cases[i].key);
            key_hash_hex(r.key, hash);
            assert_string_equal(r.key_hash, hash);
            assert_int_equal(r.explicit_key, cases[i].explicit_key);
        }
        key_result_free(&r);
        jcs_free(params);
        jcs_free(arguments);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_table),       cmocka_unit_test(test_key_relations),
        cmocka_unit_test(test_explicit_length), cmocka_unit_test(test_args_modified),
        cmocka_unit_test(test_key_hash_hex),    cmocka_unit_test(test_key_status_str),
        cmocka_unit_test(test_params_key),      cmocka_unit_test(test_key_for_call),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
