/* The replay cache: expiry, replacement, eviction by count and by bytes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "replay_cache.h"

#include <stdio.h>
#include <string.h>

static void test_hit_miss_expiry(void **state)
{
    replay_cache_t *rc = replay_cache_new(10, 1 << 20);
    assert_null(replay_cache_get(rc, "k", 0));
    replay_cache_put(rc, "k", "d1", "{\"a\":1}", 7, "2026-01-01T00:00:00Z", 1, 1000);
    const replay_entry_t *e = replay_cache_get(rc, "k", 999);
    assert_non_null(e);
    assert_memory_equal(e->result, "{\"a\":1}", 7);
    assert_string_equal(e->args_digest, "d1");
    assert_int_equal(e->attempts, 2);
    assert_int_equal(replay_cache_get(rc, "k", 999)->attempts, 3);
    /* at the expiry instant the store would run the call again: so must we */
    assert_null(replay_cache_get(rc, "k", 1000));
    assert_int_equal(replay_cache_count(rc), 0);
    replay_cache_free(rc);
}

static void test_replace_and_too_large(void **state)
{
    replay_cache_t *rc = replay_cache_new(10, 1 << 20);
    replay_cache_put(rc, "k", "d1", "{}", 2, "t1", 1, 100);
    replay_cache_put(rc, "k", "d2", NULL, 0, "t2", 4, 200);
    assert_int_equal(replay_cache_count(rc), 1);
    const replay_entry_t *e = replay_cache_get(rc, "k", 150);
    assert_non_null(e);
    assert_null(e->result);
    assert_string_equal(e->created_at, "t2");
    assert_int_equal(e->attempts, 5);
    replay_cache_free(rc);
}

static void test_eviction(void **state)
{
    replay_cache_t *rc = replay_cache_new(3, 1 << 20);
    char key[16];
    for (int i = 0; i < 5; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        replay_cache_put(rc, key, "d", "{}", 2, "t", 1, 100);
    }
    assert_int_equal(replay_cache_count(rc), 3);
    assert_null(replay_cache_get(rc, "k0", 0));
    assert_null(replay_cache_get(rc, "k1", 0));
    assert_non_null(replay_cache_get(rc, "k4", 0));
    replay_cache_free(rc);

    /* by bytes: a big result pushes older ones out; one larger than the budget is not kept */
    rc = replay_cache_new(100, 4096);
    char big[3000];
    memset(big, 'x', sizeof(big));
    replay_cache_put(rc, "a", "d", big, 2000, "t", 1, 100);
    replay_cache_put(rc, "b", "d", big, 2000, "t", 1, 100);
    assert_int_equal(replay_cache_count(rc), 1);
    assert_non_null(replay_cache_get(rc, "b", 0));
    replay_cache_put(rc, "c", "d", big, sizeof(big), "t", 1, 100);
    assert_int_equal(replay_cache_count(rc), 1);
    assert_null(replay_cache_get(rc, "b", 0));
    assert_non_null(replay_cache_get(rc, "c", 0));
    replay_cache_free(rc);
    rc = replay_cache_new(100, 1024);
    replay_cache_put(rc, "huge", "d", big, sizeof(big), "t", 1, 100);
    assert_int_equal(replay_cache_count(rc), 0);
    replay_cache_free(rc);

    rc = replay_cache_new(0, 1 << 20); /* disabled */
    replay_cache_put(rc, "a", "d", "{}", 2, "t", 1, 100);
    assert_null(replay_cache_get(rc, "a", 0));
    replay_cache_free(rc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hit_miss_expiry),
        cmocka_unit_test(test_replace_and_too_large),
        cmocka_unit_test(test_eviction),
    };
    return cmocka_run_group_tests_name("replay_cache", tests, NULL, NULL);
}
