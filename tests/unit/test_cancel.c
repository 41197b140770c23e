/* The cancel rules as tables: which call a cancel names, and what on_cancel does with it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cancel.h"

#include <string.h>

static void test_matches(void **state)
{
    static const struct {
        const char *call_subject, *call_session, *call_id;
        const char *note_subject, *note_session, *note_id;
        cancel_match_t want;
    } rows[] = {
        /* the same caller, session and id */
        {"alice", "s1", "1", "alice", "s1", "1", CANCEL_MATCH},
        {"alice", "s1", "\"call-1\"", "alice", "s1", "\"call-1\"", CANCEL_MATCH},
        /* no session on either side (2026-07-28, a stateless server): caller and id */
        {"alice", NULL, "7", "alice", NULL, "7", CANCEL_MATCH},
        /* another caller naming a request of the session cannot cancel it */
        {"alice", "s1", "1", "mallory", "s1", "1", CANCEL_FOREIGN},
        {"alice", "s1", "1", NULL, "s1", "1", CANCEL_FOREIGN},
        /* without a session, another caller's id is its own request */
        {"alice", NULL, "7", "mallory", NULL, "7", CANCEL_NO_MATCH},
        /* another session, or a session on one side only */
        {"alice", "s1", "1", "alice", "s2", "1", CANCEL_NO_MATCH},
        {"alice", "s1", "1", "alice", NULL, "1", CANCEL_NO_MATCH},
        {"alice", NULL, "1", "alice", "s1", "1", CANCEL_NO_MATCH},
        /* another id; a number and a string are different ids */
        {"alice", "s1", "1", "alice", "s1", "2", CANCEL_NO_MATCH},
        {"alice", "s1", "1", "alice", "s1", "\"1\"", CANCEL_NO_MATCH},
        /* ids that are not ids */
        {"alice", "s1", "1.0", "alice", "s1", "1.0", CANCEL_NO_MATCH},
        {"alice", "s1", "null", "alice", "s1", "null", CANCEL_NO_MATCH},
        {"alice", "s1", "1", "alice", "s1", NULL, CANCEL_NO_MATCH},
        /* no subject: never the caller's own */
        {NULL, "s1", "1", NULL, "s1", "1", CANCEL_FOREIGN},
        {NULL, NULL, "1", NULL, NULL, "1", CANCEL_NO_MATCH},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        json_t *cid = rows[i].call_id ? json_loads(rows[i].call_id, JSON_DECODE_ANY, NULL) : NULL;
        json_t *nid = rows[i].note_id ? json_loads(rows[i].note_id, JSON_DECODE_ANY, NULL) : NULL;
        cancel_party_t call = {rows[i].call_subject, rows[i].call_session, cid};
        cancel_party_t note = {rows[i].note_subject, rows[i].note_session, nid};
        cancel_match_t got = cancel_match(&call, &note);
        if (got != rows[i].want)
            fail_msg("row %zu: want %s, got %s", i, cancel_match_name(rows[i].want),
                     cancel_match_name(got));
        json_decref(cid);
        json_decref(nid);
    }
}

static void test_decide(void **state)
{
    static const struct {
        on_cancel_t mode;
        cancel_phase_t phase;
        cancel_action_t want;
    } rows[] = {
        {ON_CANCEL_FINISH, CANCEL_CALL_UNSENT, CANCEL_KEEP},
        {ON_CANCEL_FINISH, CANCEL_CALL_RUNNING, CANCEL_KEEP},
        {ON_CANCEL_FORWARD, CANCEL_CALL_UNSENT, CANCEL_DROP},
        {ON_CANCEL_FORWARD, CANCEL_CALL_RUNNING, CANCEL_RELAY},
        /* out of range: the cancel goes where it was sent */
        {(on_cancel_t)7, CANCEL_CALL_RUNNING, CANCEL_PASS},
        {ON_CANCEL_FINISH, (cancel_phase_t)9, CANCEL_PASS},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        if (cancel_decide(rows[i].mode, rows[i].phase) != rows[i].want)
            fail_msg("row %zu: want %s, got %s", i, cancel_action_name(rows[i].want),
                     cancel_action_name(cancel_decide(rows[i].mode, rows[i].phase)));
}

static void test_combine(void **state)
{
    static const struct {
        cancel_action_t a, b, want;
    } rows[] = {
        {CANCEL_PASS, CANCEL_KEEP, CANCEL_KEEP},   {CANCEL_KEEP, CANCEL_PASS, CANCEL_KEEP},
        {CANCEL_KEEP, CANCEL_DROP, CANCEL_DROP},   {CANCEL_RELAY, CANCEL_KEEP, CANCEL_RELAY},
        {CANCEL_DROP, CANCEL_RELAY, CANCEL_RELAY}, {CANCEL_PASS, CANCEL_PASS, CANCEL_PASS},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        assert_int_equal(cancel_combine(rows[i].a, rows[i].b), rows[i].want);
}

static void test_names(void **state)
{
    assert_string_equal(cancel_action_name(CANCEL_PASS), "pass");
    assert_string_equal(cancel_action_name(CANCEL_IGNORE), "ignore");
    assert_string_equal(cancel_action_name(CANCEL_KEEP), "keep");
    assert_string_equal(cancel_action_name(CANCEL_DROP), "drop");
    assert_string_equal(cancel_action_name(CANCEL_RELAY), "relay");
    assert_string_equal(cancel_action_name(CANCEL_N_ACTIONS), "unknown");
    assert_string_equal(on_cancel_name(ON_CANCEL_FINISH), "finish");
    assert_string_equal(on_cancel_name(ON_CANCEL_FORWARD), "forward");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches),
        cmocka_unit_test(test_decide),
        cmocka_unit_test(test_combine),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests_name("cancel", tests, NULL, NULL);
}
