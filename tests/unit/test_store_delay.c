/* The commit delay's policy (store_delay.c): how long a claim is held for company, from the
 * delay, the claims open and the pace of finishes, and how those are counted. The stores'
 * own behaviour with it is in test_store.c (test_sqlite_commit_delay, test_pg_commit_delay). */
#include "store_delay.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* finishes per microsecond from finishes per millisecond */
#define PER_MS(n) ((double)(n) / 1000.0)

static void test_off_never_waits(void **state)
{
    (void)state;
    assert_int_equal(store_delay_wait_us(0, 64, PER_MS(1)), 0);
}

static void test_few_open_never_wait(void **state)
{
    (void)state;
    /* one agent, or a few whose calls the server answers as they come: no wait, however slow
     * the server */
    for (int open = 0; open < 8; open++)
        assert_int_equal(store_delay_wait_us(2000, open, PER_MS(0.001)), 0);
    assert_true(store_delay_wait_us(2000, 8, PER_MS(0.001)) > 0);
}

static void test_unknown_pace_never_waits(void **state)
{
    (void)state;
    assert_int_equal(store_delay_wait_us(2000, 64, 0), 0);
    assert_int_equal(store_delay_wait_us(2000, 64, -1), 0);
}

static void test_wait_is_a_share_of_the_open_calls_time(void **state)
{
    (void)state;
    /* 16 open at 1 finish per ms: 16 ms of work queued, an eighth of it is 2 ms */
    assert_int_equal(store_delay_wait_us(100000, 16, PER_MS(1)), 2000);
    /* never more than the delay */
    assert_int_equal(store_delay_wait_us(500, 16, PER_MS(1)), 500);
    /* a fast pace leaves little slack: 8 open at 100 per ms is 80 us, an eighth is 10 us,
     * not worth a timed sleep */
    assert_int_equal(store_delay_wait_us(2000, 8, PER_MS(100)), 0);
    /* the wait grows with the calls open and shrinks with the pace */
    uint64_t a = store_delay_wait_us(100000, 10, PER_MS(2));
    uint64_t b = store_delay_wait_us(100000, 20, PER_MS(2));
    uint64_t c = store_delay_wait_us(100000, 20, PER_MS(4));
    assert_true(a < b);
    assert_true(c < b);
}

static void test_pace_counts_and_windows(void **state)
{
    (void)state;
    store_pace_t p = {0};
    uint64_t t = 5000000;
    store_pace_note(&p, 10, 0, t);
    assert_int_equal(p.open_claims, 10);
    assert_true(p.finishes_per_us == 0); /* no window is over yet */
    store_pace_note(&p, 0, 3, t + 50000);
    assert_int_equal(p.open_claims, 7);
    assert_true(p.finishes_per_us == 0);
    /* 100 ms after the window began: 5 finishes in it, 50 per second */
    store_pace_note(&p, 0, 2, t + 100000);
    assert_int_equal(p.open_claims, 5);
    assert_true(p.finishes_per_us > 0.0000499 && p.finishes_per_us < 0.0000501);
    /* a window without finishes: the pace falls to nothing known, so nothing is held */
    store_pace_note(&p, 4, 0, t + 300000);
    assert_true(p.finishes_per_us == 0);
    assert_int_equal(store_delay_wait_us(2000, p.open_claims, p.finishes_per_us), 0);
    /* more closed than counted open (a call opened before the count began): never below 0 */
    store_pace_note(&p, 0, 20, t + 310000);
    assert_int_equal(p.open_claims, 0);
}

static void test_cap_is_a_quarter_of_the_deadline(void **state)
{
    (void)state;
    assert_int_equal(store_delay_cap_us(2000, 5000), 2000);   /* 2 ms under 1.25 s */
    assert_int_equal(store_delay_cap_us(100000, 100), 25000); /* 100 ms over 25 ms */
    assert_int_equal(store_delay_cap_us(0, 100), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_off_never_waits),
        cmocka_unit_test(test_few_open_never_wait),
        cmocka_unit_test(test_unknown_pace_never_waits),
        cmocka_unit_test(test_wait_is_a_share_of_the_open_calls_time),
        cmocka_unit_test(test_pace_counts_and_windows),
        cmocka_unit_test(test_cap_is_a_quarter_of_the_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
