/* Group commit's statements in flight (store_pg_slots.c): one more per 500 us of the fastest
 * claim round trip lately, up to the pool's size, over two windows of 2 s. The store's
 * behaviour with one slot is in test_store.c (test_group_commit_one_in_flight). */
#include "store_int.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#define S(n) ((uint64_t)(n)*1000000u)

static void test_rule(void **state)
{
    (void)state;
    assert_int_equal(store_slots_for(UINT64_MAX, 4), 1); /* nothing measured */
    assert_int_equal(store_slots_for(0, 4), 1);
    assert_int_equal(store_slots_for(120, 4), 1); /* Postgres beside the gateway */
    assert_int_equal(store_slots_for(499, 4), 1);
    assert_int_equal(store_slots_for(500, 4), 2);
    assert_int_equal(store_slots_for(1250, 4), 3);  /* a millisecond away */
    assert_int_equal(store_slots_for(40000, 4), 4); /* never past the pool */
    assert_int_equal(store_slots_for(40000, 16), 16);
    assert_int_equal(store_slots_for(40000, 0), 1);
}

/* n round trips of us each at now_us. */
static void note_n(store_pg_t *s, int n, uint64_t us, uint64_t now_us)
{
    for (int i = 0; i < n; i++)
        store_slots_note(s, us, now_us);
}

/* The fastest round trip of this window and the last one counts: a slow one (queued behind
 * other statements) never widens the slots while a fast one is remembered, and a database that
 * moved farther is seen once both windows hold only slow ones. Widening waits for 16 round trips
 * in the two windows; narrowing does not. */
static void test_windows(void **state)
{
    (void)state;
    store_pg_t s;
    memset(&s, 0, sizeof(s));
    s.pool_size = 4;
    s.batch_slots = 1;
    note_n(&s, 15, 1300, S(10)); /* a fresh connection's first statements: not yet a measure */
    assert_int_equal(s.batch_slots, 1);
    note_n(&s, 1, 1300, S(10));
    assert_int_equal(s.batch_slots, 3);
    store_slots_note(&s, 200, S(10) + 1000); /* one fast one narrows at once */
    assert_int_equal(s.batch_slots, 1);
    store_slots_note(&s, 5000, S(11)); /* same window: the fast one holds */
    assert_int_equal(s.batch_slots, 1);
    note_n(&s, 20, 5000, S(12) + 1); /* a new window; the last one's fastest still counts */
    assert_int_equal(s.batch_slots, 1);
    note_n(&s, 20, 1300, S(14) + 2); /* both windows slow now */
    assert_int_equal(s.batch_slots, 3);
    store_slots_note(&s, 900, S(15));
    assert_int_equal(s.batch_slots, 2);
    /* a long silence forgets both windows, and the count */
    store_slots_note(&s, 2600, S(30));
    assert_int_equal(s.batch_slots, 2);
    note_n(&s, 15, 2600, S(30) + 5);
    assert_int_equal(s.batch_slots, 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rule),
        cmocka_unit_test(test_windows),
    };
    return cmocka_run_group_tests_name("store_slots", tests, NULL, NULL);
}
