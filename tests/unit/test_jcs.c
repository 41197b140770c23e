/* Canonical JSON: the RFC 8785 vectors, the ES6 number table, and tables of edge cases.
 * Test data is read from $IDEMGW_TESTDATA (default tests/data, relative to the repo root). */
#include "jcs.h"

#include <stdarg.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *data_dir(void)
{
    const char *d = getenv("IDEMGW_TESTDATA");
    return d && *d ? d : "tests/data";
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *p = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : 4096;
            p = xrealloc(p, cap + 1);
        }
        size_t r = fread(p + n, 1, cap - n, f);
        if (r == 0)
            break;
        n += r;
    }
    fclose(f);
    p[n] = '\0';
    *len = n;
    return p;
}

/* Parses and serializes s; returns the canonical text (caller frees) or NULL on error. */
static char *canon(const char *s, size_t len, jcs_status_t *st)
{
    jcs_value_t *v;
    char err[128];
    *st = jcs_parse(s, len, &v, err, sizeof err);
    if (*st != JCS_OK) {
        assert_null(v);
        assert_true(strncmp(err, "byte ", 5) == 0);
        return NULL;
    }
    char *out = jcs_serialize(v, NULL);
    jcs_free(v);
    return out;
}

static void test_rfc8785_vectors(void **state)
{
    (void)state;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/jcs/input", data_dir());
    DIR *d = opendir(dir);
    assert_non_null(d);
    int pairs = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char in_path[1024], out_path[1024];
        snprintf(in_path, sizeof in_path, "%s/jcs/input/%s", data_dir(), e->d_name);
        snprintf(out_path, sizeof out_path, "%s/jcs/output/%s", data_dir(), e->d_name);
        size_t in_len, want_len, got_len;
        char *in = read_file(in_path, &in_len);
        char *want = read_file(out_path, &want_len);
        assert_non_null(in);
        assert_non_null(want);
        jcs_value_t *v;
        char err[128];
        if (jcs_parse(in, in_len, &v, err, sizeof err) != JCS_OK)
            fail_msg("%s: %s", e->d_name, err);
        char *got = jcs_serialize(v, &got_len);
        if (got_len != want_len || memcmp(got, want, want_len) != 0)
            fail_msg("%s: got %s\nwant %s", e->d_name, got, want);
        free(got);
        jcs_free(v);
        free(in);
        free(want);
        pairs++;
    }
    closedir(d);
    assert_true(pairs >= 6);
    print_message("RFC 8785 vector pairs checked: %d\n", pairs);
}

static void test_es6_numbers(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/jcs/es6-numbers.csv", data_dir());
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[256];
    long lines = 0, failures = 0;
    while (fgets(line, sizeof line, f)) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        if (!line[0])
            continue;
        char *comma = strchr(line, ',');
        assert_non_null(comma);
        *comma = '\0';
        uint64_t bits = strtoull(line, NULL, 16);
        double d;
        memcpy(&d, &bits, sizeof d);
        char got[32];
        jcs_format_double(d, got);
        if (strcmp(got, comma + 1) != 0) {
            if (failures++ < 10)
                print_error("%s: got %s want %s\n", line, got, comma + 1);
        }
        lines++;
    }
    fclose(f);
    print_message("es6-numbers.csv lines checked: %ld, failures: %ld\n", lines, failures);
    assert_int_equal(failures, 0);
    assert_true(lines >= 20000);
}

static void test_format_double_table(void **state)
{
    (void)state;
    static const struct {
        double d;
        const char *want;
    } cases[] = {
        {0.0, "0"},
        {-0.0, "0"},
        {1.0, "1"},
        {-1.0, "-1"},
        {0.1, "0.1"},
        {100.0, "100"},
        {1e20, "100000000000000000000"},
        {1e21, "1e+21"},
        {1.5e21, "1.5e+21"},
        {1e-6, "0.000001"},
        {1.5e-6, "0.0000015"},
        {1e-7, "1e-7"},
        {-1.25e-7, "-1.25e-7"},
        {5e-324, "5e-324"},
        {1.7976931348623157e308, "1.7976931348623157e+308"},
        {9007199254740992.0, "9007199254740992"},
        {123456789.125, "123456789.125"},
        {333333333.33333329, "333333333.3333333"},
        {4.5, "4.5"},
        {0.002, "0.002"},
        {1e30, "1e+30"},
        /* powers of two: the gap below is half the gap above, so the nearest 16-digit
         * decimal misses while its neighbour still round-trips (and is the ES answer) */
        {0x1p-1017, "7.120236347223045e-307"},
        {0x1p-1007, "7.291122019556398e-304"},
        {-0x1p-1017, "-7.120236347223045e-307"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        char got[32];
        jcs_format_double(cases[i].d, got);
        if (strcmp(got, cases[i].want) != 0)
            fail_msg("case %zu: got %s want %s", i, got, cases[i].want);
    }
}

typedef struct canon_case {
    const char *in;
    const char *want; /* canonical text, or NULL when the status is an error */
    jcs_status_t st;
} canon_case_t;

static void run_table(const canon_case_t *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        jcs_status_t st;
        char *got = canon(cases[i].in, strlen(cases[i].in), &st);
        if (st != cases[i].st)
            fail_msg("case %zu (%s): status %s, want %s", i, cases[i].in, jcs_status_str(st),
                     jcs_status_str(cases[i].st));
        if (cases[i].want && (!got || strcmp(got, cases[i].want) != 0))
            fail_msg("case %zu (%s): got %s want %s", i, cases[i].in, got ? got : "(null)",
                     cases[i].want);
        free(got);
    }
}

static void test_numbers(void **state)
{
    (void)state;
    static const canon_case_t cases[] = {
        /* integers a double holds exactly: ECMAScript form */
        {"9007199254740992", "9007199254740992", JCS_OK},
        {"100", "100", JCS_OK},
        {"1e2", "100", JCS_OK},
        {"1000000000000000000000", "1e+21", JCS_OK},
        {"-0", "0", JCS_OK},
        /* up to 15 digits the literal is its form; 16 go through the double */
        {"[0, -7, 999999999999999, -123456789012345]", "[0,-7,999999999999999,-123456789012345]",
         JCS_OK},
        {"1000000000000000", "1000000000000000", JCS_OK},
        {"[-0.0, 0e10, -0E-3]", "[0,0,0]", JCS_OK},
        /* integers a double cannot hold: exact digits kept */
        {"9007199254740993", "9007199254740993", JCS_OK},
        {"-9007199254740993", "-9007199254740993", JCS_OK},
        {"18446744073709551617", "18446744073709551617", JCS_OK},
        {"-18446744073709551617", "-18446744073709551617", JCS_OK},
        {"12345678901234567890", "12345678901234567890", JCS_OK},
        {"1234567890123456789012345678901234567890", "1234567890123456789012345678901234567890",
         JCS_OK},
        {"[9007199254740993, 9007199254740995]", "[9007199254740993,9007199254740995]", JCS_OK},
        /* a fraction or exponent makes it a double again */
        {"9007199254740993.0", "9007199254740992", JCS_OK},
        {"9007199254740993e0", "9007199254740992", JCS_OK},
        {"123456789012345678901234567890e0", "1.2345678901234568e+29", JCS_OK},
        {"1E400", NULL, JCS_ERR_NUMBER},
        {"-1.5e309", NULL, JCS_ERR_NUMBER},
        {"1e-400", "0", JCS_OK},
        {"0.000001", "0.000001", JCS_OK},
        {"0.0000001", "1e-7", JCS_OK},
        {"4.50", "4.5", JCS_OK},
        {"2e-3", "0.002", JCS_OK},
        {"1E+2", "100", JCS_OK},
        /* a 400-digit integer cannot be a double but is an exact integer: kept */
        {"1000000000000000000000000000000000000000000000000000000000000000000000000000000000"
         "0000000000000000000000000000000000000000000000000000000000000000000000000000000000"
         "0000000000000000000000000000000000000000000000000000000000000000000000000000000000"
         "0000000000000000000000000000000000000000000000000000000000000000000000000000000000"
         "000000000000000000000000000000000000000000000000000000000000000000000000",
         NULL, JCS_OK},
        /* grammar */
        {"01", NULL, JCS_ERR_SYNTAX},
        {"-01", NULL, JCS_ERR_SYNTAX},
        {"-00", NULL, JCS_ERR_SYNTAX},
        {"+1", NULL, JCS_ERR_SYNTAX},
        {"1.", NULL, JCS_ERR_SYNTAX},
        {".5", NULL, JCS_ERR_SYNTAX},
        {"1e", NULL, JCS_ERR_SYNTAX},
        {"1e+", NULL, JCS_ERR_SYNTAX},
        {"-", NULL, JCS_ERR_SYNTAX},
        {"NaN", NULL, JCS_ERR_SYNTAX},
        {"Infinity", NULL, JCS_ERR_SYNTAX},
        {"0x10", NULL, JCS_ERR_SYNTAX},
    };
    run_table(cases, ARRAY_LEN(cases));
}

static void test_strings(void **state)
{
    (void)state;
    static const canon_case_t cases[] = {
        {"\"\\u0000\\u001f\\u007f\\u2028\\u2029\"",
         "\"\\u0000\\u001f\x7f\xe2\x80\xa8\xe2\x80\xa9\"", JCS_OK},
        {"\"\\b\\f\\n\\r\\t\\\"\\\\\\/\"", "\"\\b\\f\\n\\r\\t\\\"\\\\/\"", JCS_OK},
        {"\"\\u000b\\u001B\"", "\"\\u000b\\u001b\"", JCS_OK},
        {"\"\\u00e9\\u20AC\\ud83d\\ude02\"", "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x82\"", JCS_OK},
        {"\"\xf4\x8f\xbf\xbf\"", "\"\xf4\x8f\xbf\xbf\"", JCS_OK},
        /* invalid UTF-8 */
        {"\"\xff\"", NULL, JCS_ERR_UTF8},
        {"\"\xc0\xaf\"", NULL, JCS_ERR_UTF8},         /* overlong '/' */
        {"\"\xe0\x80\xaf\"", NULL, JCS_ERR_UTF8},     /* overlong, 3 bytes */
        {"\"\xed\xa0\x80\"", NULL, JCS_ERR_UTF8},     /* surrogate encoded in UTF-8 */
        {"\"\xf4\x90\x80\x80\"", NULL, JCS_ERR_UTF8}, /* above U+10FFFF */
        {"\"\xe2\x82\"", NULL, JCS_ERR_UTF8},         /* truncated */
        {"\"\x80\"", NULL, JCS_ERR_UTF8},             /* lone continuation byte */
        {"{\"\xfe\":1}", NULL, JCS_ERR_UTF8},
        /* lone surrogates */
        {"\"\\ud800\"", NULL, JCS_ERR_UTF8},
        {"\"\\udc00\"", NULL, JCS_ERR_UTF8},
        {"\"\\ud800\\u0041\"", NULL, JCS_ERR_UTF8},
        {"\"\\ud800x\"", NULL, JCS_ERR_UTF8},
        {"\"\\ude02\\ud83d\"", NULL, JCS_ERR_UTF8},
        /* bad escapes, raw control characters, unterminated */
        {"\"\\x\"", NULL, JCS_ERR_SYNTAX},
        {"\"\\u12G4\"", NULL, JCS_ERR_SYNTAX},
        {"\"\\u12\"", NULL, JCS_ERR_SYNTAX},
        {"\"\\'\"", NULL, JCS_ERR_SYNTAX},
        {"\"a\tb\"", NULL, JCS_ERR_SYNTAX},
        {"\"a\nb\"", NULL, JCS_ERR_SYNTAX},
        {"\"abc", NULL, JCS_ERR_SYNTAX},
        {"\"abc\\", NULL, JCS_ERR_SYNTAX},
        {"'abc'", NULL, JCS_ERR_SYNTAX},
    };
    run_table(cases, ARRAY_LEN(cases));
}

/* Plain runs are copied eight bytes at a time: a byte that is not plain (an escape, a raw
 * control character, UTF-8, valid or not, a quote) at every offset of a long string, across the
 * eight-byte steps, comes out as it does alone. */
static void test_strings_every_offset(void **state)
{
    (void)state;
    static const struct {
        const char *in, *out; /* out NULL: refused */
    } specials[] = {
        {"\\n", "\\n"},
        {"\\u0001", "\\u0001"},
        {"\\\"", "\\\""},
        {"\\\\", "\\\\"},
        {"\\/", "/"},
        {"\x7f", "\x7f"},
        {"\xc3\xa9", "\xc3\xa9"},
        {"\\u00e9", "\xc3\xa9"},
        {"\xf0\x9f\x98\x82", "\xf0\x9f\x98\x82"},
        {"\x01", NULL},
        {"\x80", NULL},
        {"\xc3", NULL},
        {"\xff", NULL},
    };
    char in[128], want[128];
    for (size_t k = 0; k < ARRAY_LEN(specials); k++) {
        for (size_t at = 0; at <= 20; at++) {
            char pad[32];
            memset(pad, 'x', at);
            pad[at] = '\0';
            snprintf(in, sizeof in, "\"%s%sabcdefghijklmnop\"", pad, specials[k].in);
            jcs_status_t st;
            char *got = canon(in, strlen(in), &st);
            if (!specials[k].out) {
                if (got)
                    fail_msg("special %zu at %zu accepted: %s", k, at, got);
                continue;
            }
            snprintf(want, sizeof want, "\"%s%sabcdefghijklmnop\"", pad, specials[k].out);
            if (!got || strcmp(got, want) != 0)
                fail_msg("special %zu at %zu: got %s, want %s", k, at, got ? got : "(refused)",
                         want);
            free(got);
        }
    }
}

static void test_structure(void **state)
{
    (void)state;
    static const canon_case_t cases[] = {
        {" { \"b\" : [ 1 , true , null ] , \"a\" : { } } ", "{\"a\":{},\"b\":[1,true,null]}",
         JCS_OK},
        {"[]", "[]", JCS_OK},
        {"{}", "{}", JCS_OK},
        {"\t\r\nnull\n", "null", JCS_OK},
        {"{\"b\":1,\"a\":2,\"aa\":3,\"\":4,\"B\":5}", "{\"\":4,\"B\":5,\"a\":2,\"aa\":3,\"b\":1}",
         JCS_OK},
        /* UTF-16 order: U+1F602 (D83D DE02) sorts before U+FB33 and U+E000 although its
         * code point and its UTF-8 bytes are larger */
        {"{\"\\ufb33\":1,\"\\ud83d\\ude02\":2,\"\\ue000\":3,\"\\u20ac\":4}",
         "{\"\xe2\x82\xac\":4,\"\xf0\x9f\x98\x82\":2,\"\xee\x80\x80\":3,\"\xef\xac\xb3\":1}",
         JCS_OK},
        /* two supplementary characters: ordered by code point */
        {"{\"\\ud83d\\ude03\":1,\"\\ud83d\\ude02\":2,\"\\ud800\\udc00\":3}",
         "{\"\xf0\x90\x80\x80\":3,\"\xf0\x9f\x98\x82\":2,\"\xf0\x9f\x98\x83\":1}", JCS_OK},
        /* a prefix sorts first */
        {"{\"ab\\ud83d\\ude02\":1,\"ab\":2}", "{\"ab\":2,\"ab\xf0\x9f\x98\x82\":1}", JCS_OK},
        /* names with NUL are distinct from their prefixes */
        {"{\"a\\u0000\":1,\"a\":2}", "{\"a\":2,\"a\\u0000\":1}", JCS_OK},
        /* duplicate names */
        {"{\"a\":1,\"a\":2}", NULL, JCS_ERR_DUPLICATE},
        {"{\"a\":1,\"b\":0,\"\\u0061\":2}", NULL, JCS_ERR_DUPLICATE},
        {"{\"x\":{\"k\":1,\"k\":1}}", NULL, JCS_ERR_DUPLICATE},
        {"[{\"\\ud83d\\ude02\":1,\"\xf0\x9f\x98\x82\":2}]", NULL, JCS_ERR_DUPLICATE},
        /* trailing garbage and structure errors */
        {"{} x", NULL, JCS_ERR_SYNTAX},
        {"1 2", NULL, JCS_ERR_SYNTAX},
        {"[1]]", NULL, JCS_ERR_SYNTAX},
        {"{}{}", NULL, JCS_ERR_SYNTAX},
        {"", NULL, JCS_ERR_SYNTAX},
        {"  ", NULL, JCS_ERR_SYNTAX},
        {"[1,]", NULL, JCS_ERR_SYNTAX},
        {"[,1]", NULL, JCS_ERR_SYNTAX},
        {"{\"a\":1,}", NULL, JCS_ERR_SYNTAX},
        {"{\"a\" 1}", NULL, JCS_ERR_SYNTAX},
        {"{a:1}", NULL, JCS_ERR_SYNTAX},
        {"{1:1}", NULL, JCS_ERR_SYNTAX},
        {"[1", NULL, JCS_ERR_SYNTAX},
        {"{\"a\":1", NULL, JCS_ERR_SYNTAX},
        {"tru", NULL, JCS_ERR_SYNTAX},
        {"nul", NULL, JCS_ERR_SYNTAX},
        {"True", NULL, JCS_ERR_SYNTAX},
        {"\xef\xbb\xbf{}", NULL, JCS_ERR_SYNTAX}, /* no byte order mark */
        {"/* c */ {}", NULL, JCS_ERR_SYNTAX},
    };
    run_table(cases, ARRAY_LEN(cases));
}

static void test_embedded_nul(void **state)
{
    (void)state;
    jcs_status_t st;
    char *got = canon("[1]\0", 4, &st);
    assert_int_equal(st, JCS_ERR_SYNTAX);
    assert_null(got);
}

static char *nested(int depth, char open, char close)
{
    char *s = xmalloc((size_t)depth * 2 + 1);
    for (int i = 0; i < depth; i++) {
        s[i] = open;
        s[depth * 2 - 1 - i] = close;
    }
    s[depth * 2] = '\0';
    return s;
}

static void test_depth(void **state)
{
    (void)state;
    jcs_status_t st;
    char *s = nested(JCS_MAX_DEPTH, '[', ']');
    char *got = canon(s, strlen(s), &st);
    assert_int_equal(st, JCS_OK);
    assert_string_equal(got, s);
    free(got);
    free(s);

    s = nested(JCS_MAX_DEPTH + 1, '[', ']');
    assert_null(canon(s, strlen(s), &st));
    assert_int_equal(st, JCS_ERR_DEPTH);
    free(s);

    /* objects count too: {"a":{"a":...}} */
    size_t n = JCS_MAX_DEPTH + 1;
    s = xmalloc(n * 6 + 8);
    char *o = s;
    for (size_t i = 0; i < n; i++)
        o += sprintf(o, "{\"a\":");
    o += sprintf(o, "1");
    for (size_t i = 0; i < n; i++)
        *o++ = '}';
    *o = '\0';
    assert_null(canon(s, strlen(s), &st));
    assert_int_equal(st, JCS_ERR_DEPTH);
    free(s);

    /* very deep input fails fast without exhausting the stack */
    s = nested(100000, '[', ']');
    assert_null(canon(s, strlen(s), &st));
    assert_int_equal(st, JCS_ERR_DEPTH);
    free(s);
}

static void test_error_offsets(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        const char *prefix;
    } cases[] = {
        {"[1,]", "byte 3: "},          {"{\"a\":1,\"a\":2}", "byte 7: "},
        {"  \"\\ud800\"", "byte 3: "}, {"[\"ok\", \"\xff\"]", "byte 8: "},
        {"{} x", "byte 3: "},          {"[1e999]", "byte 1: "},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        jcs_value_t *v;
        char err[128];
        assert_int_not_equal(jcs_parse(cases[i].in, strlen(cases[i].in), &v, err, sizeof err),
                             JCS_OK);
        assert_null(v);
        if (strncmp(err, cases[i].prefix, strlen(cases[i].prefix)) != 0)
            fail_msg("case %zu: message \"%s\", want prefix \"%s\"", i, err, cases[i].prefix);
    }
    /* err may be NULL, or too small */
    jcs_value_t *v;
    char tiny[4];
    assert_int_equal(jcs_parse("[", 1, &v, NULL, 0), JCS_ERR_SYNTAX);
    assert_int_equal(jcs_parse("[", 1, &v, tiny, sizeof tiny), JCS_ERR_SYNTAX);
    assert_true(strlen(tiny) < sizeof tiny);
}

static jcs_value_t *parse_ok(const char *s)
{
    jcs_value_t *v;
    char err[128];
    if (jcs_parse(s, strlen(s), &v, err, sizeof err) != JCS_OK)
        fail_msg("%s: %s", s, err);
    return v;
}

static void assert_canon(const jcs_value_t *v, const char *want)
{
    char *got = jcs_serialize(v, NULL);
    assert_string_equal(got, want);
    free(got);
}

static void test_access_and_remove(void **state)
{
    (void)state;
    jcs_value_t *v =
        parse_ok("{\"b\":{\"c\":{\"d\":1,\"e\":2},\"f\":[{\"g\":1}]},\"a\":\"x\\u0000y\","
                 "\"h.i\":3}");
    assert_int_equal(jcs_type(v), JCS_OBJECT);
    size_t len;
    const char *s = jcs_string(jcs_object_get(v, "a"), &len);
    assert_non_null(s);
    assert_int_equal(len, 3);
    assert_memory_equal(s, "x\0y", 4);
    assert_null(jcs_string(jcs_object_get(v, "b"), &len));
    assert_null(jcs_object_get(v, "zz"));
    assert_null(jcs_object_get(jcs_object_get(v, "a"), "x")); /* not an object */
    assert_int_equal(jcs_type(jcs_object_get(v, "b")), JCS_OBJECT);

    assert_true(jcs_remove_path(v, "b.c.d"));
    assert_canon(v, "{\"a\":\"x\\u0000y\",\"b\":{\"c\":{\"e\":2},\"f\":[{\"g\":1}]},\"h.i\":3}");
    assert_false(jcs_remove_path(v, "b.c.d"));  /* already gone */
    assert_false(jcs_remove_path(v, "b.f.g"));  /* arrays are not traversed */
    assert_false(jcs_remove_path(v, "a.x"));    /* through a string */
    assert_false(jcs_remove_path(v, "nope.x")); /* missing parent */
    assert_false(jcs_remove_path(v, "h.i"));    /* dotted names are not addressable */
    assert_true(jcs_remove_path(v, "b.c"));
    assert_canon(v, "{\"a\":\"x\\u0000y\",\"b\":{\"f\":[{\"g\":1}]},\"h.i\":3}");
    assert_true(jcs_object_remove(v, "a"));
    assert_false(jcs_object_remove(v, "a"));
    assert_true(jcs_remove_path(v, "b"));
    assert_canon(v, "{\"h.i\":3}");
    jcs_free(v);

    jcs_value_t *arr = parse_ok("[1]");
    assert_false(jcs_object_remove(arr, "a"));
    assert_false(jcs_remove_path(arr, "a.b"));
    jcs_free(arr);
    jcs_free(NULL);
}

static void test_status_str(void **state)
{
    (void)state;
    const char *seen[JCS_ERR_DUPLICATE + 1];
    for (int s = JCS_OK; s <= JCS_ERR_DUPLICATE; s++) {
        seen[s] = jcs_status_str((jcs_status_t)s);
        assert_non_null(seen[s]);
        assert_true(strlen(seen[s]) > 0);
        for (int t = JCS_OK; t < s; t++)
            assert_string_not_equal(seen[s], seen[t]);
    }
    assert_string_equal(jcs_status_str(JCS_OK), "ok");
    assert_string_equal(jcs_status_str((jcs_status_t)99), "unknown jcs status");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rfc8785_vectors),
        cmocka_unit_test(test_es6_numbers),
        cmocka_unit_test(test_format_double_table),
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_strings_every_offset),
        cmocka_unit_test(test_structure),
        cmocka_unit_test(test_embedded_nul),
        cmocka_unit_test(test_depth),
        cmocka_unit_test(test_error_offsets),
        cmocka_unit_test(test_access_and_remove),
        cmocka_unit_test(test_status_str),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
