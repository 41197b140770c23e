/* The memo of configuration warnings: each said once per change. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "warn_memo.h"

static void test_once_per_change(void **state)
{
    warn_memo_t *m = warn_memo_new();
    /* the first load: everything is new, a repeat within it too (the caller logs it again) */
    warn_memo_begin(m);
    assert_true(warn_memo_fresh(m, "a"));
    assert_true(warn_memo_fresh(m, "b"));
    /* the same warnings again: said already */
    warn_memo_begin(m);
    assert_false(warn_memo_fresh(m, "a"));
    assert_false(warn_memo_fresh(m, "b"));
    /* one changed: only it is new; b went away */
    warn_memo_begin(m);
    assert_false(warn_memo_fresh(m, "a"));
    assert_true(warn_memo_fresh(m, "c"));
    /* b comes back: said again; a load without warnings forgets them all */
    warn_memo_begin(m);
    assert_true(warn_memo_fresh(m, "b"));
    warn_memo_begin(m);
    warn_memo_begin(m);
    assert_true(warn_memo_fresh(m, "b"));
    warn_memo_free(m);
}

static void test_without_begin(void **state)
{
    /* warnings before the first begin belong to the first load */
    warn_memo_t *m = warn_memo_new();
    assert_true(warn_memo_fresh(m, "x"));
    warn_memo_begin(m);
    assert_false(warn_memo_fresh(m, "x"));
    warn_memo_free(m);
    warn_memo_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_once_per_change),
        cmocka_unit_test(test_without_begin),
    };
    return cmocka_run_group_tests_name("warn_memo", tests, NULL, NULL);
}
