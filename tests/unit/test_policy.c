/* Unit tests for policy.c: defaults, lookup, lease, class names, duration and size syntax. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "policy.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

static void test_defaults(void **state)
{
    policy_tool_t t;
    policy_defaults_init(&t);
    assert_null(t.name);
    assert_int_equal(t.cls, TOOL_CLASS_NON_IDEMPOTENT);
    assert_int_equal(t.window_ms, 600000);
    assert_string_equal(t.key_arg, "idempotency_key");
    assert_int_equal(t.on_tool_error, ON_TOOL_ERROR_RELEASE);
    assert_int_equal(t.on_ambiguous, ON_AMBIGUOUS_HOLD);
    assert_int_equal(t.wait_ms, 0);
    assert_int_equal(t.lease_ms, 0);
    assert_int_equal(t.max_stored_bytes, 1024 * 1024);
    assert_false(t.forward_key);
    assert_int_equal(t.on_store_down, ON_STORE_DOWN_REJECT);
    assert_int_equal(t.on_cancel, ON_CANCEL_FINISH);
    assert_int_equal(t.n_exclude_args, 0);
    policy_tool_free(&t);
}

static void test_durations(void **state)
{
    static const struct {
        const char *in;
        int rc;
        uint64_t ms;
    } cases[] = {
        {"250ms", 0, 250},
        {"90s", 0, 90000},
        {"10m", 0, 600000},
        {"2h", 0, 7200000},
        {"1d", 0, 86400000},
        {"0s", 0, 0},
        {"45", 0, 45000}, /* bare number: seconds */
        {"007s", 0, 7000},
        {"18446744073709551615ms", 0, UINT64_MAX},
        {"18446744073709551616ms", -1, 0}, /* one past UINT64_MAX */
        {"18446744073709551615s", -1, 0},  /* overflow on scaling */
        {"213503982334602d", -1, 0},
        {"", -1, 0},
        {"s", -1, 0},
        {"-5s", -1, 0},
        {"+5s", -1, 0},
        {" 5s", -1, 0},
        {"5s ", -1, 0},
        {"5 s", -1, 0},
        {"1.5s", -1, 0},
        {"5sec", -1, 0},
        {"5S", -1, 0},
        {"5w", -1, 0},
        {"5us", -1, 0},
        {"1h30m", -1, 0},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        uint64_t ms = 12345;
        int rc = policy_parse_duration(cases[i].in, &ms);
        if (rc != cases[i].rc)
            fail_msg("duration '%s': rc %d, want %d", cases[i].in, rc, cases[i].rc);
        if (rc == 0 && ms != cases[i].ms)
            fail_msg("duration '%s': %llu ms, want %llu", cases[i].in, (unsigned long long)ms,
                     (unsigned long long)cases[i].ms);
    }
    uint64_t ms;
    assert_int_equal(policy_parse_duration(NULL, &ms), -1);
}

static void test_sizes(void **state)
{
    static const struct {
        const char *in;
        int rc;
        uint64_t bytes;
    } cases[] = {
        {"512", 0, 512},
        {"0", 0, 0},
        {"512B", 0, 512},
        {"64KiB", 0, 65536},
        {"64kib", 0, 65536},
        {"64KB", 0, 65536},
        {"64k", 0, 65536},
        {"64K", 0, 65536},
        {"1MiB", 0, 1048576},
        {"1MB", 0, 1048576},
        {"1M", 0, 1048576},
        {"1GiB", 0, 1073741824},
        {"2G", 0, 2147483648ULL},
        {"18446744073709551615", 0, UINT64_MAX},
        {"17179869184GiB", -1, 0}, /* 2^34 GiB = 2^64 bytes */
        {"17179869183GiB", 0, 17179869183ULL << 30},
        {"99999999999999999999", -1, 0},
        {"", -1, 0},
        {"KiB", -1, 0},
        {"-1", -1, 0},
        {"1.5MiB", -1, 0},
        {"1 MiB", -1, 0},
        {"1TiB", -1, 0},
        {"1Mi", -1, 0},
        {"1MiBs", -1, 0},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        uint64_t b = 12345;
        int rc = policy_parse_size(cases[i].in, &b);
        if (rc != cases[i].rc)
            fail_msg("size '%s': rc %d, want %d", cases[i].in, rc, cases[i].rc);
        if (rc == 0 && b != cases[i].bytes)
            fail_msg("size '%s': %llu, want %llu", cases[i].in, (unsigned long long)b,
                     (unsigned long long)cases[i].bytes);
    }
    uint64_t b;
    assert_int_equal(policy_parse_size(NULL, &b), -1);
}

static void test_class_names(void **state)
{
    static const struct {
        const char *name;
        tool_class_t cls;
    } cases[] = {
        {"read", TOOL_CLASS_READ},
        {"idempotent", TOOL_CLASS_IDEMPOTENT},
        {"non_idempotent", TOOL_CLASS_NON_IDEMPOTENT},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        tool_class_t c = (tool_class_t)99;
        assert_string_equal(tool_class_name(cases[i].cls), cases[i].name);
        assert_int_equal(tool_class_parse(cases[i].name, &c), 0);
        assert_int_equal(c, cases[i].cls);
    }
    static const char *const bad[] = {"", "READ", "non-idempotent", "write", "read "};
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        tool_class_t c = TOOL_CLASS_READ;
        assert_int_equal(tool_class_parse(bad[i], &c), -1);
        assert_int_equal(c, TOOL_CLASS_READ);
    }
    assert_string_equal(tool_class_name((tool_class_t)42), "unknown");
}

static void add_tool(policy_t *p, const char *name, tool_class_t cls)
{
    p->tools = xrealloc(p->tools, (p->n_tools + 1) * sizeof(policy_tool_t));
    policy_tool_t *t = &p->tools[p->n_tools++];
    policy_tool_copy(t, &p->defaults);
    t->name = xstrdup(name);
    t->cls = cls;
}

static void test_lookup(void **state)
{
    policy_t p = {0};
    policy_defaults_init(&p.defaults);
    /* Empty policy: everything falls back to the defaults. */
    assert_ptr_equal(policy_lookup(&p, "anything"), &p.defaults);
    assert_ptr_equal(policy_lookup(&p, NULL), &p.defaults);

    static const char *const names[] = {"zeta",  "alpha",    "issue_refund", "m", "alpha_2",
                                        "Alpha", "get-user", "a.b.c",        "x"};
    for (size_t i = 0; i < ARRAY_LEN(names); i++)
        add_tool(&p, names[i], i % 2 ? TOOL_CLASS_READ : TOOL_CLASS_IDEMPOTENT);
    policy_sort(&p);
    for (size_t i = 1; i < p.n_tools; i++)
        assert_true(strcmp(p.tools[i - 1].name, p.tools[i].name) < 0);
    for (size_t i = 0; i < ARRAY_LEN(names); i++) {
        const policy_tool_t *t = policy_lookup(&p, names[i]);
        assert_non_null(t->name);
        assert_string_equal(t->name, names[i]);
        assert_int_equal(t->cls, i % 2 ? TOOL_CLASS_READ : TOOL_CLASS_IDEMPOTENT);
    }
    static const char *const missing[] = {"", "alph", "alpha_", "ALPHA", "zz", "0", "issue"};
    for (size_t i = 0; i < ARRAY_LEN(missing); i++)
        assert_ptr_equal(policy_lookup(&p, missing[i]), &p.defaults);
    assert_ptr_equal(policy_lookup(&p, NULL), &p.defaults);

    /* A deep copy looks up the same and owns its own memory (ASan checks the frees). */
    policy_t q;
    policy_copy(&q, &p);
    policy_free(&p);
    assert_string_equal(policy_lookup(&q, "zeta")->name, "zeta");
    assert_string_equal(policy_lookup(&q, "unknown")->key_arg, "idempotency_key");
    policy_free(&q);
    policy_free(&q); /* idempotent */
}

static void test_lease(void **state)
{
    policy_tool_t t;
    policy_defaults_init(&t);
    assert_int_equal(policy_lease_ms(&t, 60000), 90000);
    assert_int_equal(policy_lease_ms(&t, 0), 30000);
    assert_int_equal(policy_lease_ms(&t, UINT64_MAX - 1), UINT64_MAX);
    t.lease_ms = 5000;
    assert_int_equal(policy_lease_ms(&t, 60000), 5000);
    policy_tool_free(&t);
}

static void test_tool_copy(void **state)
{
    policy_tool_t a, b;
    policy_defaults_init(&a);
    a.name = xstrdup("t");
    a.exclude_args = xcalloc(2, sizeof(char *));
    a.exclude_args[0] = xstrdup("note");
    a.exclude_args[1] = xstrdup("meta.ts");
    a.n_exclude_args = 2;
    a.wait_ms = 5000;
    policy_tool_copy(&b, &a);
    policy_tool_free(&a);
    assert_string_equal(b.name, "t");
    assert_int_equal(b.n_exclude_args, 2);
    assert_string_equal(b.exclude_args[1], "meta.ts");
    assert_int_equal(b.wait_ms, 5000);
    policy_tool_free(&b);
    policy_tool_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),  cmocka_unit_test(test_durations),
        cmocka_unit_test(test_sizes),     cmocka_unit_test(test_class_names),
        cmocka_unit_test(test_lookup),    cmocka_unit_test(test_lease),
        cmocka_unit_test(test_tool_copy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
