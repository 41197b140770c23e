/* An exchange's facts as the request's log line carries them: each set of facts a handler
 * gives, and the exact members it makes, in the order operators and tests read them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "exchange_facts.h"

#include <stdlib.h>
#include <string.h>

/* f kept (as the exchange keeps it) and written. */
static void written(const exchange_facts_t *f, char *out, size_t len)
{
    exchange_facts_t kept;
    char *block = exchange_facts_keep(&kept, f);
    exchange_facts_render(&kept, out, len);
    free(block);
}

static void test_each_handler_s_members(void **state)
{
    (void)state;
    static const char hash[] = "0123456789abcdef0123456789abcdef";
    const exchange_dup_facts_t dup = {.source = "harness",
                                      .attempt = 3,
                                      .first_seen = "2026-01-02T03:04:05.678Z",
                                      .gap_ms = 1250,
                                      .first_state = "succeeded"};
    const struct {
        exchange_facts_t f;
        const char *want;
    } cases[] = {
        {{0}, ""},
        {{.key_hash = hash}, "\"key_hash\":\"0123456789abcdef\""},
        {{.key_hash = hash, .dup = dup},
         "\"key_hash\":\"0123456789abcdef\",\"duplicate_source\":\"harness\",\"attempt\":3,"
         "\"first_seen\":\"2026-01-02T03:04:05.678Z\",\"gap_ms\":1250,"
         "\"first_state\":\"succeeded\""},
        {{.key_hash = hash, .code = "in_progress", .dup = dup, .why = "expired"},
         "\"key_hash\":\"0123456789abcdef\",\"code\":\"in_progress\","
         "\"duplicate_source\":\"harness\",\"attempt\":3,"
         "\"first_seen\":\"2026-01-02T03:04:05.678Z\",\"gap_ms\":1250,"
         "\"first_state\":\"succeeded\",\"why\":\"expired\""},
        {{.code = "no_subject", .why = "expired"}, "\"code\":\"no_subject\",\"why\":\"expired\""},
        {{.key_hash = hash,
          .recorded = "succeeded",
          .why = "result",
          .answered = "still_running",
          .cancel = "kept"},
         "\"key_hash\":\"0123456789abcdef\",\"recorded\":\"succeeded\",\"why\":\"result\","
         "\"answered\":\"still_running\",\"cancel\":\"kept\""},
        {{.task_session = "routed"}, "\"task_session\":\"routed\""},
        {{.forbidden_header = "Origin", .value = "http://x", .setting = "allowed_origins"},
         "\"forbidden_header\":\"Origin\",\"value\":\"http://x\",\"setting\":\"allowed_origins\""},
        {{.duplicate_header = "Host"}, "\"duplicate_header\":\"Host\""},
        /* a string is escaped, whoever wrote it */
        {{.code = "a\"b"}, "\"code\":\"a\\\"b\""},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char out[640];
        written(&cases[i].f, out, sizeof(out));
        assert_string_equal(out, cases[i].want);
    }
}

/* The kept copy does not point at the handler's buffers, which go before the log line. */
static void test_strings_are_copied(void **state)
{
    (void)state;
    char code[16] = "refused";
    exchange_facts_t kept;
    char *block = exchange_facts_keep(&kept, &(exchange_facts_t){.code = code});
    strcpy(code, "changed");
    assert_string_equal(kept.code, "refused");
    assert_null(kept.key_hash);
    free(block);
}

/* A line too small for every member keeps the whole ones before it. */
static void test_cut_between_members(void **state)
{
    (void)state;
    char out[24];
    size_t n = exchange_facts_render(&(exchange_facts_t){.code = "in_progress", .why = "expired"},
                                     out, sizeof(out));
    assert_string_equal(out, "\"code\":\"in_progress\"");
    assert_int_equal(n, strlen(out));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_handler_s_members),
        cmocka_unit_test(test_strings_are_copied),
        cmocka_unit_test(test_cut_between_members),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
