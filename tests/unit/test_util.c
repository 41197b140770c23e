/* The shared primitives of util.c, as tables of cases. */
#include "log.h"
#include "util.h"

#include <stdarg.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct utf8_case {
    const char *name;
    const char *bytes;
    size_t len;
    size_t valid_prefix; /* expected util_utf8_valid_prefix */
} utf8_case_t;

#define CASE(name, lit, prefix)                                                                    \
    {                                                                                              \
        name, lit, sizeof(lit) - 1, prefix                                                         \
    }

static const utf8_case_t utf8_cases[] = {
    CASE("empty", "", 0),
    CASE("ascii", "order-42", 8),
    CASE("two-byte e acute", "Jos\xc3\xa9", 5),
    CASE("three-byte euro", "\xe2\x82\xac", 3),
    CASE("four-byte emoji", "\xf0\x9f\x98\x80", 4),
    CASE("highest code point U+10FFFF", "\xf4\x8f\xbf\xbf", 4),
    CASE("latin-1 e acute", "Jos\xe9", 3),
    CASE("lone 0xff", "k\xff", 1),
    CASE("lone continuation byte",
         "\x80"
         "abc",
         0),
    CASE("overlong slash (C0 AF)", "\xc0\xaf", 0),
    CASE("overlong NUL (C0 80)", "a\xc0\x80", 1),
    CASE("overlong three-byte (E0 80 AF)", "\xe0\x80\xaf", 0),
    CASE("surrogate U+D800", "\xed\xa0\x80", 0),
    CASE("past U+10FFFF (F4 90 80 80)", "\xf4\x90\x80\x80", 0),
    CASE("F5 lead byte", "\xf5\x80\x80\x80", 0),
    CASE("truncated two-byte at end", "ab\xc3", 2),
    CASE("truncated four-byte", "\xf0\x9f\x98", 0),
    CASE("bad continuation", "\xe2\x28\xa1", 0),
    CASE("NUL inside", "ab\0cd", 2),
    CASE("valid then invalid", "\xc3\xa9\xc3\xa9\xfe", 4),
};

static void test_utf8_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(utf8_cases); i++) {
        const utf8_case_t *c = &utf8_cases[i];
        size_t got = util_utf8_valid_prefix(c->bytes, c->len);
        if (got != c->valid_prefix)
            fail_msg("%s: valid prefix %zu, want %zu", c->name, got, c->valid_prefix);
        if (util_utf8_valid(c->bytes, c->len) != (c->valid_prefix == c->len))
            fail_msg("%s: util_utf8_valid disagrees with the prefix", c->name);
    }
}

static void test_utf8_decode(void **state)
{
    (void)state;
    uint32_t cp = 0;
    assert_int_equal(util_utf8_decode((const unsigned char *)"\xc3\xa9", 2, &cp), 2);
    assert_int_equal(cp, 0xE9);
    assert_int_equal(util_utf8_decode((const unsigned char *)"\xf0\x9f\x98\x80", 4, &cp), 4);
    assert_int_equal(cp, 0x1F600);
    assert_int_equal(util_utf8_decode((const unsigned char *)"", 1, &cp), 1);
    assert_int_equal(cp, 0);
    assert_int_equal(util_utf8_decode((const unsigned char *)"\xc3\xa9", 1, &cp), 0);
    assert_int_equal(util_utf8_decode((const unsigned char *)"a", 0, &cp), 0);
}
/* The one ISO 8601 formatter: milliseconds kept, times before the epoch counted back. */
static void test_iso_utc_ms(void **state)
{
    static const struct {
        int64_t ms;
        const char *want;
    } cases[] = {
        {0, "1970-01-01T00:00:00.000Z"},
        {1, "1970-01-01T00:00:00.001Z"},
        {1735689599999, "2024-12-31T23:59:59.999Z"},
        {1735689600000, "2025-01-01T00:00:00.000Z"},
        {951782400123, "2000-02-29T00:00:00.123Z"},
        {-1, "1969-12-31T23:59:59.999Z"},
        {-1000, "1969-12-31T23:59:59.000Z"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        char out[UTIL_ISO_LEN + 1];
        util_iso_utc_ms(cases[i].ms, out);
        assert_string_equal(out, cases[i].want);
        assert_int_equal(strlen(out), UTIL_ISO_LEN);
    }
}

/* Log lines carry their time in that form, first in the object. */
static void test_log_line_time(void **state)
{
    FILE *f = tmpfile();
    assert_non_null(f);
    FILE *was = log_stream;
    log_stream = f;
    log_emit(LOG_INFO, 7, NULL, "hello %d", 1);
    log_stream = was;
    rewind(f);
    char line[256] = "";
    assert_non_null(fgets(line, sizeof(line), f));
    fclose(f);
    static const char lead[] = "{\"time\":\"";
    assert_memory_equal(line, lead, sizeof(lead) - 1);
    const char *t = line + sizeof(lead) - 1;
    /* YYYY-MM-DDTHH:MM:SS.mmmZ */
    for (int i = 0; i < UTIL_ISO_LEN; i++) {
        char c = t[i];
        switch (i) {
        case 4:
        case 7:
            assert_int_equal(c, '-');
            break;
        case 10:
            assert_int_equal(c, 'T');
            break;
        case 13:
        case 16:
            assert_int_equal(c, ':');
            break;
        case 19:
            assert_int_equal(c, '.');
            break;
        case 23:
            assert_int_equal(c, 'Z');
            break;
        default:
            assert_true(c >= '0' && c <= '9');
        }
    }
    assert_string_equal(t + UTIL_ISO_LEN,
                        "\",\"level\":\"info\",\"conn\":7,\"msg\":\"hello 1\"}\n");
}

/* FNV-1a's published test vectors. */
static void test_fnv1a64(void **state)
{
    assert_true(util_fnv1a64("") == UINT64_C(0xcbf29ce484222325));
    assert_true(util_fnv1a64("a") == UINT64_C(0xaf63dc4c8601ec8c));
    assert_true(util_fnv1a64("foobar") == UINT64_C(0x85944171f73967e8));
}

/* The folders on the way to a file are made with the mode asked for, those there are kept; a
 * file in the way is an error naming it. */
/* util_json_plain_len stops at the first byte a JSON string cannot hold as it is, wherever
 * it falls in or across the eight-byte steps, and runs to the end of all-plain text. */
static void test_json_plain_len(void **state)
{
    (void)state;
    static const unsigned char stops[] = {'"', '\\', 0x00, 0x01, 0x1f, 0x80, 0xc3, 0xff};
    char buf[48];
    /* every offset of the sixteen-byte blocks, the eight-byte ones and the bytes after them */
    for (size_t k = 0; k < sizeof(stops); k++) {
        for (size_t at = 0; at < sizeof(buf); at++) {
            memset(buf, 'a', sizeof(buf));
            buf[at] = (char)stops[k];
            assert_int_equal(util_json_plain_len(buf, sizeof(buf)), at);
            /* a second special byte later changes nothing: the first one counts */
            if (at + 1 < sizeof(buf)) {
                buf[sizeof(buf) - 1] = '"';
                assert_int_equal(util_json_plain_len(buf, sizeof(buf)), at);
            }
        }
    }
    /* each byte value, in each kind of step: special exactly when JSON cannot hold it as is */
    static const size_t offsets[] = {3, 20, 37, 45};
    for (int c = 0; c < 256; c++) {
        bool special = c < 0x20 || c >= 0x80 || c == '"' || c == '\\';
        for (size_t o = 0; o < sizeof(offsets) / sizeof(offsets[0]); o++) {
            memset(buf, 'b', sizeof(buf));
            buf[offsets[o]] = (char)c;
            assert_int_equal(util_json_plain_len(buf, sizeof(buf)),
                             special ? offsets[o] : sizeof(buf));
        }
    }
    memset(buf, ' ', sizeof(buf));
    buf[5] = 0x7f; /* DEL is plain */
    buf[9] = '~';
    for (size_t n = 0; n <= sizeof(buf); n++)
        assert_int_equal(util_json_plain_len(buf, n), n);
}

static void test_mkdir_parents(void **state)
{
    (void)state;
    char root[] = "/tmp/idemgw-mkdir-XXXXXX";
    assert_non_null(mkdtemp(root));
    char file[256], err[300] = "";
    snprintf(file, sizeof file, "%s/a/b/keys.db", root);
    mode_t old = umask(022);
    assert_int_equal(util_mkdir_parents(file, 0700, err, sizeof err), 0);
    char dir[256];
    snprintf(dir, sizeof dir, "%s/a/b", root);
    struct stat st;
    assert_int_equal(stat(dir, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0700);
    assert_int_equal(access(file, F_OK), -1); /* the file is not made */
    /* all there already: nothing to do */
    assert_int_equal(util_mkdir_parents(file, 0700, err, sizeof err), 0);
    /* no folder in the name: nothing to make */
    assert_int_equal(util_mkdir_parents("keys.db", 0700, err, sizeof err), 0);
    assert_int_equal(util_mkdir_parents("/keys.db", 0700, err, sizeof err), 0);

    /* a file where a folder should be */
    char blocker[256];
    snprintf(blocker, sizeof blocker, "%s/a/b/f", root);
    FILE *f = fopen(blocker, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(file, sizeof file, "%s/a/b/f/g/keys.db", root);
    assert_int_equal(util_mkdir_parents(file, 0700, err, sizeof err), -1);
    char want[300];
    snprintf(want, sizeof want, "cannot create the folder %s/a/b/f: it exists and is not a folder",
             root);
    assert_string_equal(err, want);
    umask(old);

    assert_int_equal(unlink(blocker), 0);
    assert_int_equal(rmdir(dir), 0);
    snprintf(dir, sizeof dir, "%s/a", root);
    assert_int_equal(rmdir(dir), 0);
    assert_int_equal(rmdir(root), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_utf8_table),    cmocka_unit_test(test_utf8_decode),
        cmocka_unit_test(test_iso_utc_ms),    cmocka_unit_test(test_log_line_time),
        cmocka_unit_test(test_fnv1a64),       cmocka_unit_test(test_json_plain_len),
        cmocka_unit_test(test_mkdir_parents),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
