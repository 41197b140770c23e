/* The duplicate-source rules as a table: each row the facts and the source they give. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "dupsource.h"

#include <string.h>

static void test_rules(void **state)
{
    static const struct {
        const char *first_session, *session, *first_id, *id;
        uint64_t gap_ms;
        dup_source_t want;
    } rows[] = {
        /* another session: the client reconnected, whatever the id or the gap */
        {"s1", "s2", "1", "1", 5, DUP_RECONNECT},
        {"s1", "s2", "1", "7", 60000, DUP_RECONNECT},
        {"s1", NULL, "1", "1", 5, DUP_RECONNECT},
        /* same session, same id: below the client */
        {"s1", "s1", "1", "1", 5, DUP_TRANSPORT},
        {"s1", "s1", "\"a\"", "\"a\"", 900000, DUP_TRANSPORT},
        /* same session, new id: by the gap */
        {"s1", "s1", "1", "2", 0, DUP_HARNESS},
        {"s1", "s1", "1", "2", 1999, DUP_HARNESS},
        {"s1", "s1", "1", "2", 2000, DUP_MODEL},
        {"s1", "s1", "1", "2", 599999, DUP_MODEL},
        {"s1", "s1", "1", "2", 600000, DUP_LATE},
        /* a server without sessions: the id and the gap decide */
        {NULL, NULL, "1", "1", 5, DUP_TRANSPORT},
        {NULL, "s9", "1", "3", 5, DUP_HARNESS},
        {NULL, NULL, NULL, "3", 30000, DUP_MODEL},
    };
    dup_thresholds_t t = {DUP_HARNESS_DEFAULT_MS, DUP_MODEL_DEFAULT_MS};
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        dup_facts_t f = {rows[i].first_session, rows[i].session, rows[i].first_id, rows[i].id,
                         rows[i].gap_ms};
        dup_source_t got = dup_source(&f, &t);
        if (got != rows[i].want)
            fail_msg("row %zu: %s, want %s", i, dup_source_name(got),
                     dup_source_name(rows[i].want));
    }
    assert_string_equal(dup_source_name(DUP_LATE), "late");
}

static void test_times(void **state)
{
    assert_int_equal(dup_parse_time_ms("1970-01-01T00:00:01.5Z"), 1500);
    assert_int_equal(dup_parse_time_ms("2026-12-04T04:29:09.123Z"), 1796358549123ULL);
    assert_int_equal(dup_parse_time_ms("2026-12-04T04:29:09Z"), 1796358549000ULL);
    assert_int_equal(dup_parse_time_ms("yesterday"), 0);
    assert_int_equal(dup_parse_time_ms("2026-12-04T04:29:09+02:00"), 0);
    assert_int_equal(dup_parse_time_ms(NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rules),
        cmocka_unit_test(test_times),
    };
    return cmocka_run_group_tests_name("dupsource", tests, NULL, NULL);
}
