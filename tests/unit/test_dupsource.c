/* The duplicate-source rules as a table: each row the facts and the source they give. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "dupsource.h"
#include <time.h>

#include <string.h>

static void test_rules(void **state)
{
    static const struct {
        const char *what;
        dup_facts_t f;
        dup_source_t want;
    } rows[] = {
        /* another session: the client reconnected, whatever the id or the gap */
        {"new session, same id",
         {.first_session = "s1", .session = "s2", .first_id = "1", .id = "1", .gap_ms = 5},
         DUP_RECONNECT},
        {"new session, new id",
         {.first_session = "s1", .session = "s2", .first_id = "1", .id = "7", .gap_ms = 60000},
         DUP_RECONNECT},
        {"session lost",
         {.first_session = "s1", .session = NULL, .first_id = "1", .id = "1", .gap_ms = 5},
         DUP_RECONNECT},
        /* same session, same id: below the client */
        {"re-sent at once",
         {.first_session = "s1", .session = "s1", .first_id = "1", .id = "1", .gap_ms = 5},
         DUP_TRANSPORT},
        {"re-sent late",
         {.first_session = "s1",
          .session = "s1",
          .first_id = "\"a\"",
          .id = "\"a\"",
          .gap_ms = 900000},
         DUP_TRANSPORT},
        /* same session, new id: by the gap */
        {"new id at once",
         {.first_session = "s1", .session = "s1", .first_id = "1", .id = "2", .gap_ms = 0},
         DUP_HARNESS},
        {"new id below harness_within",
         {.first_session = "s1", .session = "s1", .first_id = "1", .id = "2", .gap_ms = 1999},
         DUP_HARNESS},
        {"new id after harness_within",
         {.first_session = "s1", .session = "s1", .first_id = "1", .id = "2", .gap_ms = 2000},
         DUP_MODEL},
        {"new id below model_within",
         {.first_session = "s1", .session = "s1", .first_id = "1", .id = "2", .gap_ms = 599999},
         DUP_MODEL},
        {"new id after model_within",
         {.first_session = "s1", .session = "s1", .first_id = "1", .id = "2", .gap_ms = 600000},
         DUP_LATE},
        /* a server without sessions: the id and the gap decide */
        {"no sessions, re-sent at once",
         {.first_session = NULL, .session = NULL, .first_id = "1", .id = "1", .gap_ms = 5},
         DUP_TRANSPORT},
        {"first without session",
         {.first_session = NULL, .session = "s9", .first_id = "1", .id = "3", .gap_ms = 5},
         DUP_HARNESS},
        {"no first id",
         {.first_session = NULL, .session = NULL, .first_id = NULL, .id = "3", .gap_ms = 30000},
         DUP_MODEL},
        /* 2026-07-28, no sessions: a restarted client's ids begin again, so its re-sent
         * work comes with the same id, later than any transport re-send */
        {"no sessions, same id later",
         {.first_session = NULL, .session = NULL, .first_id = "1", .id = "1", .gap_ms = 2000},
         DUP_RECONNECT},
        {"no sessions, same id much later",
         {.first_session = NULL, .session = NULL, .first_id = "3", .id = "3", .gap_ms = 45000},
         DUP_RECONNECT},
        /* clientInfo (2026-07-28 _meta): another client or version re-sent it */
        {"another client",
         {.first_id = "1", .id = "9", .gap_ms = 100, .first_client = "a/1", .client = "b/1"},
         DUP_RECONNECT},
        {"a new version of the client",
         {.first_id = "1", .id = "1", .gap_ms = 100, .first_client = "a/1", .client = "a/2"},
         DUP_RECONNECT},
        {"the same client",
         {.first_id = "1", .id = "4", .gap_ms = 30000, .first_client = "a/1", .client = "a/1"},
         DUP_MODEL},
        {"clientInfo on one side only",
         {.first_id = "1", .id = "4", .gap_ms = 30000, .client = "a/1"},
         DUP_MODEL},
        /* the first call still running: no answer for a model to read, so a harness retried
         * (the AI SDK's maxRetries after a load balancer's 504, 2.3 s later) */
        {"first running, 2.3 s",
         {.first_id = "1", .id = "2", .gap_ms = 2300, .first_running = true},
         DUP_HARNESS},
        {"first running, 57 s",
         {.first_id = "1", .id = "7", .gap_ms = 57000, .first_running = true},
         DUP_HARNESS},
        {"first running, past model_within",
         {.first_id = "1", .id = "7", .gap_ms = 600000, .first_running = true},
         DUP_LATE},
        {"first finished, 2.3 s", {.first_id = "1", .id = "2", .gap_ms = 2300}, DUP_MODEL},
        /* the first call finished after its caller left: nobody read its answer, so a model
         * cannot have re-issued it (the AI SDK's retry 2 s after a 504, LangChain's withRetry
         * 1 to 2 s after its defaultToolTimeout, both measured through the gateway) */
        {"first unread, 2.3 s",
         {.first_id = "1", .id = "2", .gap_ms = 2300, .first_unread = true},
         DUP_HARNESS},
        {"first unread, past model_within",
         {.first_id = "1", .id = "2", .gap_ms = 600000, .first_unread = true},
         DUP_LATE},
        {"first unread, another session",
         {.first_session = "s1",
          .session = "s2",
          .first_id = "1",
          .id = "2",
          .gap_ms = 2300,
          .first_unread = true},
         DUP_RECONNECT},
        /* backoff: the gaps between attempts fixed or growing (LangChain withRetry: 6 tries
         * over 57 s, exponential with jitter) */
        {"exponential step",
         {.first_id = "1", .id = "5", .gap_ms = 15000, .last_gap_ms = 8000, .step_ms = 4000},
         DUP_HARNESS},
        {"jittered exponential step",
         {.first_id = "1", .id = "6", .gap_ms = 45000, .last_gap_ms = 26000, .step_ms = 7000},
         DUP_HARNESS},
        {"fixed step",
         {.first_id = "1", .id = "4", .gap_ms = 15000, .last_gap_ms = 5000, .step_ms = 5000},
         DUP_HARNESS},
        {"within harness_within of the attempt before",
         {.first_id = "1", .id = "3", .gap_ms = 30000, .last_gap_ms = 1500},
         DUP_HARNESS},
        /* a model's turns: irregular steps */
        {"shorter step",
         {.first_id = "1", .id = "4", .gap_ms = 40000, .last_gap_ms = 5000, .step_ms = 30000},
         DUP_MODEL},
        {"much longer step",
         {.first_id = "1", .id = "4", .gap_ms = 50000, .last_gap_ms = 45000, .step_ms = 3000},
         DUP_MODEL},
        {"one step only",
         {.first_id = "1", .id = "3", .gap_ms = 9000, .last_gap_ms = 9000},
         DUP_MODEL},
        {"steps, past model_within",
         {.first_id = "1", .id = "9", .gap_ms = 700000, .last_gap_ms = 8000, .step_ms = 4000},
         DUP_LATE},
    };
    dup_thresholds_t t = {DUP_HARNESS_DEFAULT_MS, DUP_MODEL_DEFAULT_MS};
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        dup_source_t got = dup_source(&rows[i].f, &t);
        if (got != rows[i].want)
            fail_msg("row %zu (%s): %s, want %s", i, rows[i].what, dup_source_name(got),
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
    /* the stores' layout is read by position: every few days from 1970 to 2200 (leap days,
     * century years) with a time of day that moves, against the C library's own gmtime */
    for (int64_t t = 0; t < INT64_C(7258118400); t += 86400 * 3 + 3599) {
        time_t tt = (time_t)t;
        struct tm tm;
        char iso[40];
        gmtime_r(&tt, &tm);
        strftime(iso, sizeof iso, "%Y-%m-%dT%H:%M:%S", &tm);
        strcat(iso, ".042Z");
        if (dup_parse_time_ms(iso) != (uint64_t)t * 1000 + 42)
            fail_msg("%s: %llu", iso, (unsigned long long)dup_parse_time_ms(iso));
    }
    assert_int_equal(dup_parse_time_ms("2000-02-29T23:59:59Z"), 951868799000ULL);
    assert_int_equal(dup_parse_time_ms("2100-03-01T00:00:00Z"), 4107542400000ULL);
    /* a letter where a digit goes */
    assert_int_equal(dup_parse_time_ms("2026-12-04T04:29:0aZ"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rules),
        cmocka_unit_test(test_times),
    };
    return cmocka_run_group_tests_name("dupsource", tests, NULL, NULL);
}
