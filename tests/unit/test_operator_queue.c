/* The operator queue's pure parts: the admin token file and who a token names, the state and
 * outcome names of the API, and the webhook's message for a key. */
#include "../../src/ops/admin_keys.h"
#include "alerts.h"
#include "store_queue.h"
#include "util.h"

#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static void token_file_lines(void **state)
{
    (void)state;
    static const char file[] = "# operators\n"
                               "\n"
                               "alice:tok-alice\r\n"
                               "  bob:tok-bob  \n"
                               "tok-bare\n"
                               "carol:\n";
    static const struct {
        const char *auth;
        bool ok;
        const char *name;
    } cases[] = {
        {"Bearer tok-alice", true, "alice"},
        {"bearer tok-alice", true, "alice"},
        {"Bearer   tok-bob", true, "bob"},
        {"Bearer tok-bare", true, "admin-tokens"},
        {"Bearer tok-alic", false, NULL},
        {"Bearer tok-alicex", false, NULL},
        {"Bearer alice:tok-alice", false, NULL},
        {"Bearer # operators", false, NULL},
        {"Bearer ", false, NULL},
        {"Bearer", false, NULL},
        {"Basic tok-alice", false, NULL},
        {"tok-alice", false, NULL},
        {NULL, false, NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char name[64] = "";
        bool ok = admin_keys_token_match(file, "/etc/idemgw/admin-tokens", cases[i].auth, name,
                                         sizeof(name));
        if (ok != cases[i].ok)
            fail_msg("case %zu (%s): %d", i, cases[i].auth ? cases[i].auth : "(none)", ok);
        if (ok)
            assert_string_equal(name, cases[i].name);
    }
    char name[8];
    /* an empty token never matches, even an empty one given */
    assert_false(admin_keys_token_match("carol:\n", "f", "Bearer ", name, sizeof(name)));
    assert_false(admin_keys_token_match("", "f", "Bearer x", name, sizeof(name)));
}

static void state_and_outcome_names(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        bool ok;
        store_queue_state_t st;
    } cases[] = {
        {NULL, true, STORE_QUEUE_STATE_ANY},
        {"", true, STORE_QUEUE_STATE_ANY},
        {"unknown", true, STORE_QUEUE_STATE_UNKNOWN},
        {"in_progress", true, STORE_QUEUE_STATE_IN_PROGRESS},
        {"succeeded", true, STORE_QUEUE_STATE_SUCCEEDED},
        {"failed", true, STORE_QUEUE_STATE_FAILED},
        {"stuck", true, STORE_QUEUE_STATE_STUCK},
        {"open", true, STORE_QUEUE_STATE_OPEN},
        {"Unknown", false, 0},
        {"any", false, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        store_queue_state_t st = STORE_QUEUE_STATE_ANY;
        assert_int_equal(store_queue_state_parse(cases[i].name, &st), cases[i].ok);
        if (cases[i].ok)
            assert_int_equal(st, cases[i].st);
    }
    for (int o = STORE_QUEUE_SUCCEEDED; o <= STORE_QUEUE_FORGET; o++) {
        store_queue_outcome_t back;
        assert_true(store_queue_outcome_parse(store_queue_outcome_str(o), &back));
        assert_int_equal(back, o);
    }
    store_queue_outcome_t back;
    assert_false(store_queue_outcome_parse("release", &back));
    assert_false(store_queue_outcome_parse(NULL, &back));
    assert_string_equal(store_queue_answer_str(STORE_QUEUE_CONFLICT), "conflict");
    assert_string_equal(store_queue_answer_str(STORE_QUEUE_NOT_FOUND), "not_found");
}

static void webhook_bodies(void **state)
{
    (void)state;
    const char *entry = "{\"key_hash\":\"0123456789abcdef0123456789abcdef0123456789abcdef"
                        "0123456789abcdef\",\"server\":\"billing\",\"tool\":\"refund\","
                        "\"subject\":\"agent-7\",\"state\":\"unknown\","
                        "\"finished_at\":\"2026-12-06T05:00:00.000Z\"}";
    char *j = alerts_body(entry, ALERTS_FORMAT_JSON);
    json_t *m = json_loads(j, 0, NULL);
    assert_non_null(m);
    assert_string_equal(json_string_value(json_object_get(m, "event")), "key_unknown");
    assert_string_equal(json_string_value(json_object_get(json_object_get(m, "key"), "subject")),
                        "agent-7");
    const char *text = json_string_value(json_object_get(m, "text"));
    assert_non_null(strstr(text, "billing/refund is unknown"));
    assert_non_null(strstr(text, "0123456789abcdef,"));
    json_decref(m);
    free(j);

    char *s = alerts_body(entry, ALERTS_FORMAT_SLACK);
    m = json_loads(s, 0, NULL);
    assert_int_equal(json_object_size(m), 1);
    text = json_string_value(json_object_get(m, "text"));
    assert_non_null(text);
    assert_null(strstr(text, "agent-7")); /* the subject stays out of a chat */
    json_decref(m);
    free(s);

    assert_null(alerts_body("[1]", ALERTS_FORMAT_JSON));
    assert_null(alerts_body("not json", ALERTS_FORMAT_SLACK));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(token_file_lines),
        cmocka_unit_test(state_and_outcome_names),
        cmocka_unit_test(webhook_bodies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
