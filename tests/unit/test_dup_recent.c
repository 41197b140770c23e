/* The recent attempts of a key: what an attempt learns of the ones before it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "dup_recent.h"

#include <string.h>

#define K1 "00000000000000010000000000000000000000000000000000000000000000aa"
#define K2 "00000000000000020000000000000000000000000000000000000000000000bb"
/* K3 shares K1's slot in a table of one */
#define K3 "00000000000000030000000000000000000000000000000000000000000000cc"

static void test_steps(void **state)
{
    static const struct {
        const char *key, *client;
        uint64_t at;
        int want_attempts;
        uint64_t want_last, want_before_last;
        const char *want_first_client;
    } rows[] = {
        {K1, "agent/1", 1000, 0, 0, 0, ""},      /* the first call */
        {K1, NULL, 3000, 1, 1000, 0, "agent/1"}, /* a retry 2 s later */
        {K1, "other/2", 7000, 2, 3000, 1000, "agent/1"},
        {K2, NULL, 7001, 0, 0, 0, ""}, /* another key: its own slot */
        {K1, NULL, 15000, 3, 7000, 3000, "agent/1"},
        /* past forget_ms (60 s) since the last: a new life */
        {K1, "late/1", 80000, 0, 0, 0, ""},
        {K1, NULL, 81000, 1, 80000, 0, "late/1"},
    };
    dup_recent_t *r = dup_recent_new(64);
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        dup_recent_seen_t seen;
        dup_recent_note(r, rows[i].key, rows[i].at, 60000, rows[i].client, &seen);
        if (seen.attempts != rows[i].want_attempts || seen.last_ms != rows[i].want_last ||
            seen.before_last_ms != rows[i].want_before_last ||
            strcmp(seen.first_client, rows[i].want_first_client) != 0)
            fail_msg("row %zu: attempts %d last %llu before %llu client '%s'", i, seen.attempts,
                     (unsigned long long)seen.last_ms, (unsigned long long)seen.before_last_ms,
                     seen.first_client);
    }
    dup_recent_free(r);
}

static void test_slot_taken_over(void **state)
{
    dup_recent_t *r = dup_recent_new(1);
    dup_recent_seen_t seen;
    dup_recent_note(r, K1, 1000, 60000, "a/1", NULL);
    dup_recent_note(r, K3, 1500, 60000, NULL, &seen);
    assert_int_equal(seen.attempts, 0); /* K1's attempts are not K3's */
    dup_recent_note(r, K1, 2000, 60000, NULL, &seen);
    assert_int_equal(seen.attempts, 0); /* and K1 lost its slot */
    dup_recent_note(r, K1, 2500, 60000, NULL, &seen);
    assert_int_equal(seen.attempts, 1);
    assert_int_equal(seen.last_ms, 2000);
    dup_recent_free(r);
}

static void test_unread(void **state)
{
    dup_recent_t *r = dup_recent_new(1);
    dup_recent_seen_t seen;
    dup_recent_unread(r, K1); /* no attempt yet: nothing to mark */
    dup_recent_note(r, K1, 1000, 60000, NULL, &seen);
    assert_false(seen.first_unread);
    dup_recent_unread(r, K3); /* another key: K1's slot is left as it is */
    dup_recent_note(r, K1, 1200, 60000, NULL, &seen);
    assert_false(seen.first_unread);
    dup_recent_unread(r, K1);
    dup_recent_note(r, K1, 3000, 60000, NULL, &seen);
    assert_true(seen.first_unread);
    assert_int_equal(seen.attempts, 2);
    /* forgotten with the key's other attempts */
    dup_recent_note(r, K1, 90000, 60000, NULL, &seen);
    assert_false(seen.first_unread);
    dup_recent_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_steps),
        cmocka_unit_test(test_slot_taken_over),
        cmocka_unit_test(test_unread),
    };
    return cmocka_run_group_tests_name("dup_recent", tests, NULL, NULL);
}
