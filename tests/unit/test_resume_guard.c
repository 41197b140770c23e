/* The resume guard: who may resume a session's streams, per remembered protected call. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "resume_guard.h"

#include <stdio.h>

static void test_unknown_session_is_unguarded(void **state)
{
    resume_guard_t *g = resume_guard_new();
    assert_false(resume_guard_knows(g, "s1", 0));
    assert_int_equal(resume_guard_check(g, "s1", "alice", 0), RESUME_UNGUARDED);
    assert_int_equal(resume_guard_check(g, "s1", NULL, 0), RESUME_UNGUARDED);
    resume_guard_free(g);
}

static void test_only_the_caller_resumes(void **state)
{
    resume_guard_t *g = resume_guard_new();
    resume_guard_note(g, "s1", "alice", 0, 1000);
    assert_true(resume_guard_knows(g, "s1", 10));
    assert_false(resume_guard_knows(g, "s2", 10));
    assert_int_equal(resume_guard_check(g, "s1", "alice", 10), RESUME_ALLOWED);
    assert_int_equal(resume_guard_check(g, "s1", "bob", 10), RESUME_FOREIGN);
    assert_int_equal(resume_guard_check(g, "s1", NULL, 10), RESUME_FOREIGN);
    /* a prefix, or the same name longer, is another caller */
    assert_int_equal(resume_guard_check(g, "s1", "alic", 10), RESUME_FOREIGN);
    assert_int_equal(resume_guard_check(g, "s1", "alicee", 10), RESUME_FOREIGN);
    assert_int_equal(resume_guard_check(g, "s2", "bob", 10), RESUME_UNGUARDED);
    resume_guard_free(g);
}

static void test_two_callers_in_one_session(void **state)
{
    /* a stream of the session may carry either call's result: neither caller may resume it */
    resume_guard_t *g = resume_guard_new();
    resume_guard_note(g, "s1", "alice", 0, 1000);
    resume_guard_note(g, "s1", "bob", 0, 500);
    assert_int_equal(resume_guard_check(g, "s1", "alice", 10), RESUME_FOREIGN);
    assert_int_equal(resume_guard_check(g, "s1", "bob", 10), RESUME_FOREIGN);
    /* once bob's call is forgotten, the session is alice's again */
    assert_int_equal(resume_guard_check(g, "s1", "alice", 500), RESUME_ALLOWED);
    resume_guard_free(g);
}

static void test_expiry_and_renewal(void **state)
{
    resume_guard_t *g = resume_guard_new();
    resume_guard_note(g, "s1", "alice", 0, 100);
    resume_guard_note(g, "s1", "alice", 50, 80); /* an earlier end does not shorten it */
    assert_int_equal(resume_guard_check(g, "s1", "bob", 99), RESUME_FOREIGN);
    assert_int_equal(resume_guard_check(g, "s1", "bob", 100), RESUME_UNGUARDED);
    assert_false(resume_guard_knows(g, "s1", 100));
    resume_guard_note(g, "s1", "alice", 100, 300);
    resume_guard_note(g, "s1", "alice", 150, 400);
    assert_int_equal(resume_guard_check(g, "s1", "bob", 350), RESUME_FOREIGN);
    resume_guard_free(g);
}

static void test_many_sessions(void **state)
{
    resume_guard_t *g = resume_guard_new();
    char s[32], who[32];
    for (int i = 0; i < 5000; i++) {
        snprintf(s, sizeof(s), "session-%d", i);
        snprintf(who, sizeof(who), "caller-%d", i);
        resume_guard_note(g, s, who, 0, 1000);
    }
    for (int i = 0; i < 5000; i++) {
        snprintf(s, sizeof(s), "session-%d", i);
        snprintf(who, sizeof(who), "caller-%d", i);
        assert_int_equal(resume_guard_check(g, s, who, 1), RESUME_ALLOWED);
        snprintf(who, sizeof(who), "caller-%d", i + 1);
        assert_int_equal(resume_guard_check(g, s, who, 1), RESUME_FOREIGN);
    }
    resume_guard_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unknown_session_is_unguarded),
        cmocka_unit_test(test_only_the_caller_resumes),
        cmocka_unit_test(test_two_callers_in_one_session),
        cmocka_unit_test(test_expiry_and_renewal),
        cmocka_unit_test(test_many_sessions),
    };
    return cmocka_run_group_tests_name("resume_guard", tests, NULL, NULL);
}
