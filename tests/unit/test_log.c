/* The log's tap (what a command that writes no log keeps of it) and the rate limit of one
 * source's lines. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "log.h"
#include "log_limit.h"

#include <stdio.h>
#include <string.h>

typedef struct seen {
    int n;
    log_level_t level;
    char fields[64];
    char msg[64];
} seen_t;

static void keep(void *arg, log_level_t level, const char *fields, const char *msg)
{
    seen_t *s = arg;
    s->n++;
    s->level = level;
    snprintf(s->fields, sizeof(s->fields), "%s", fields ? fields : "");
    snprintf(s->msg, sizeof(s->msg), "%s", msg);
}

/* The lines written while the test runs, from a temporary stream. */
static void written(FILE *f, char *out, size_t len)
{
    fflush(f);
    rewind(f);
    out[fread(out, 1, len - 1, f)] = '\0';
}

static void test_tap_sees_lines_written_or_not(void **state)
{
    (void)state;
    FILE *f = tmpfile();
    assert_non_null(f);
    log_stream = f;
    log_threshold = LOG_INFO;
    seen_t s = {0};
    /* a command that writes warnings only, yet keeps the info lines it is given */
    log_set_tap(keep, &s, LOG_WARN);
    LOG_AT(LOG_INFO, 0, "\"server_pid\":42", "child said %s", "boom");
    assert_int_equal(s.n, 1);
    assert_int_equal(s.level, LOG_INFO);
    assert_string_equal(s.fields, "\"server_pid\":42");
    assert_string_equal(s.msg, "child said boom");
    LOG_AT(LOG_WARN, 0, NULL, "a warning");
    assert_int_equal(s.n, 2);
    assert_string_equal(s.fields, "");
    /* below the threshold nothing is formatted, so the tap does not see it either */
    log_debug(0, "not seen");
    assert_int_equal(s.n, 2);
    char out[2048];
    written(f, out, sizeof(out));
    assert_null(strstr(out, "child said"));
    assert_non_null(strstr(out, "\"msg\":\"a warning\""));

    /* without the tap every line at the threshold is written again */
    log_set_tap(NULL, NULL, LOG_DEBUG);
    log_info(0, "after the tap");
    assert_int_equal(s.n, 2);
    written(f, out, sizeof(out));
    assert_non_null(strstr(out, "after the tap"));
    log_stream = NULL;
    fclose(f);
}

static void test_limit_burst_then_rate(void **state)
{
    (void)state;
    log_limit_t l;
    uint64_t held = 99;
    log_limit_init(&l, 10, 5, 1000);
    /* the burst goes at once, with nothing held before it */
    for (int i = 0; i < 5; i++) {
        assert_true(log_limit_take(&l, 1000, &held));
        assert_int_equal(held, 0);
    }
    /* then the flood is held back and counted */
    for (int i = 0; i < 1000; i++)
        assert_false(log_limit_take(&l, 1000, &held));
    /* 10 a second: 99 ms is not yet a line, 100 ms is, and it carries the count */
    assert_false(log_limit_take(&l, 1099, &held));
    assert_true(log_limit_take(&l, 1100, &held));
    assert_int_equal(held, 1001);
    assert_false(log_limit_take(&l, 1100, &held));
    assert_true(log_limit_take(&l, 1200, &held));
    assert_int_equal(held, 1);
    /* a second of 49,626 lines lets through the burst (refilled during the pause before it)
     * and about a second's rate, not the flood */
    int let = 0;
    for (uint64_t i = 0; i < 49626; i++)
        let += log_limit_take(&l, 2000 + i * 1000 / 49626, &held);
    assert_in_range(let, 5 + 9, 5 + 10);
}

static void test_limit_refill_is_capped(void **state)
{
    (void)state;
    log_limit_t l;
    log_limit_init(&l, 2, 3, 0);
    for (int i = 0; i < 3; i++)
        assert_true(log_limit_take(&l, 0, NULL));
    assert_false(log_limit_take(&l, 0, NULL));
    /* a day of quiet refills the burst, no more */
    uint64_t day = 86400000, held = 0;
    for (int i = 0; i < 3; i++)
        assert_true(log_limit_take(&l, day, &held));
    assert_false(log_limit_take(&l, day, &held));
    /* a clock far along (a huge elapsed time) neither overflows nor overfills */
    log_limit_t big;
    log_limit_init(&big, UINT32_MAX, UINT32_MAX, 0);
    assert_true(log_limit_take(&big, UINT64_MAX, NULL));
    assert_true(big.credit <= (uint64_t)UINT32_MAX * 1000u);
}

static void test_limit_flush_and_zero_params(void **state)
{
    (void)state;
    log_limit_t l;
    log_limit_init(&l, 0, 0, 5); /* taken as 1 and 1 */
    assert_true(log_limit_take(&l, 5, NULL));
    assert_false(log_limit_take(&l, 5, NULL));
    assert_false(log_limit_take(&l, 6, NULL));
    /* the source ends: what was held back is said once */
    assert_int_equal(log_limit_flush(&l), 2);
    assert_int_equal(log_limit_flush(&l), 0);
    /* a clock read that went back a little takes no credit away */
    uint64_t held = 7;
    assert_true(log_limit_take(&l, 1005, &held));
    assert_int_equal(held, 0);
    assert_false(log_limit_take(&l, 1000, &held));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tap_sees_lines_written_or_not),
        cmocka_unit_test(test_limit_burst_then_rate),
        cmocka_unit_test(test_limit_refill_is_capped),
        cmocka_unit_test(test_limit_flush_and_zero_params),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
