/* The status tool (status.c) against a fake exchange and a fake store: what it takes, the key
 * it reads (the one the protected call was claimed with, for the same caller only), each state
 * a row can be in, and its refusals. Nothing it answers is ever forwarded. */
#include "config.h"
#include "exchange.h"
#include "idem.h"
#include "replay_cache.h"
#include "status.h"
#include "store.h"
#include "subject.h"
#include "tasks.h"
#include "util.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fake_exchange.h"
#include "fake_store.h"

static const char YAML[] = "upstream: http://127.0.0.1:9/mcp\n"
                           "status_tool: true\n"
                           "subject:\n  header: X-Subject\n"
                           "tools:\n"
                           "  refund:\n    class: non_idempotent\n";

static struct {
    struct event_base *base;
    config_t *cfg;
    replay_cache_t *cache;
    store_t *store;
    server_stats_t stats;
    subject_t *subject;
    task_routes_t *tasks;
    idem_t *idem;
    status_tool_t *status;
} w;

static int setup(void **state)
{
    memset(&w, 0, sizeof(w));
    fake_store_clear();
    config_errors_t errs = {0};
    w.cfg = config_load_string("t.yaml", YAML, &errs);
    if (!w.cfg) {
        for (size_t i = 0; i < errs.n; i++)
            fprintf(stderr, "%s\n", errs.msgs[i]);
        config_errors_free(&errs);
        return -1;
    }
    w.base = event_base_new();
    w.cache = replay_cache_new(100, 1 << 20);
    w.store = store_from_ops(&fake_ops, &fs);
    char msg[200];
    w.subject = subject_new(w.base, &w.cfg->subject, msg, sizeof(msg));
    assert_non_null(w.subject);
    w.tasks = task_routes_new();
    idem_ctx_t ic = {.tasks = w.tasks,
                     .base = w.base,
                     .cfg = w.cfg,
                     .subject = w.subject,
                     .store = w.store,
                     .cache = w.cache,
                     .stats = &w.stats};
    w.idem = idem_new(&ic);
    status_ctx_t sc = {.cfg = w.cfg, .store = w.store, .subject = w.subject, .stats = &w.stats};
    w.status = status_new(&sc);
    return 0;
}

static int teardown(void **state)
{
    status_free(w.status);
    idem_free(w.idem);
    task_routes_free(w.tasks);
    subject_free(w.subject);
    store_free(w.store);
    replay_cache_free(w.cache);
    event_base_free(w.base);
    config_free(w.cfg);
    fake_store_clear();
    return 0;
}

static exchange_t *request(const char *tool, const char *arguments, const char *subject)
{
    char body[400];
    snprintf(body, sizeof(body),
             "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/call\",\"params\":"
             "{\"name\":\"%s\",\"arguments\":%s}}",
             tool, arguments);
    exchange_t *ex = fake_exchange_new(body);
    if (subject)
        fake_header(&ex->req.headers, "X-Subject", subject);
    return ex;
}

/* A status query of subject about refund with {"amount":amount}; taken by the handler. */
static exchange_t *ask(int amount, const char *subject)
{
    char args[200];
    snprintf(args, sizeof(args), "{\"tool\":\"refund\",\"arguments\":{\"amount\":%d}}", amount);
    exchange_t *ex = request("idemgw_call_status", args, subject);
    assert_int_equal(status_offer(w.status, ex), HANDLER_TAKEN);
    return ex;
}

static void deliver(store_state_t state, const char *result, bool lease_expired)
{
    store_row_t row = {.state = state,
                       .attempts = 2,
                       .result = result,
                       .result_len = result ? strlen(result) : 0,
                       .created_at = "2026-12-05T06:00:00.000Z",
                       .lease_expired = lease_expired};
    fs.get_cb(STORE_OK, &row, fs.arg);
}

static void only_the_status_tool_is_taken(void **state)
{
    exchange_t *ex = request("refund", "{\"amount\":1}", "alice");
    assert_int_equal(status_offer(w.status, ex), HANDLER_PASS);
    assert_int_equal(ex->n_obs, 0);
    fake_exchange_free(ex);
    /* with the setting off, the name is any other tool's */
    w.cfg->status_tool = false;
    ex = request("idemgw_call_status", "{\"tool\":\"refund\"}", "alice");
    assert_int_equal(status_offer(w.status, ex), HANDLER_PASS);
    fake_exchange_free(ex);
    assert_int_equal(fs.gets, 0);
}

static void reads_the_key_the_call_was_claimed_with(void **state)
{
    exchange_t *call = request("refund", "{\"amount\":5}", "alice");
    idem_call(w.idem, call);
    assert_int_equal(fs.claims, 1);
    char *claimed = xstrdup(fs.key);

    exchange_t *mine = ask(5, "alice");
    assert_int_equal(fs.gets, 1);
    assert_string_equal(fs.get_key, claimed);
    exchange_t *theirs = ask(5, "bob"); /* another caller asks about the same call */
    assert_int_equal(fs.gets, 2);
    assert_string_not_equal(fs.get_key, claimed);
    exchange_t *other = ask(6, "alice"); /* other arguments: another call */
    assert_string_not_equal(fs.get_key, claimed);

    free(claimed);
    fake_exchange_free(call);
    fake_exchange_free(mine);
    fake_exchange_free(theirs);
    fake_exchange_free(other);
}

static void succeeded_call_is_replayed_marked(void **state)
{
    exchange_t *ex = ask(5, "alice");
    deliver(STORE_STATE_SUCCEEDED, "{\"content\":[{\"type\":\"text\",\"text\":\"refunded\"}]}",
            false);
    assert_int_equal(ex->forwards, 0);
    assert_int_equal(ex->status, 200);
    assert_non_null(strstr(ex->body, "refunded"));
    assert_non_null(strstr(ex->body, "\"status_query\":true"));
    assert_non_null(strstr(ex->body, "\"id\":5")); /* the query's id, not the call's */
    assert_string_equal(ex->rextra, "Idempotent-Replayed: true\r\n");
    assert_string_equal(ex->outcome, "status");
    assert_true(ex->detached);
    fake_exchange_free(ex);
}

/* The code in the answer's status for a row in state. */
static void expect_code(store_state_t state, bool lease_expired, const char *code)
{
    exchange_t *ex = ask(5, "alice");
    deliver(state, NULL, lease_expired);
    char want[80];
    snprintf(want, sizeof(want), "\"code\":\"%s\"", code);
    assert_non_null(strstr(ex->body, want));
    assert_non_null(strstr(ex->fields, want)); /* the log line says it too */
    assert_int_equal(ex->forwards, 0);
    assert_string_equal(ex->outcome, "status");
    fake_exchange_free(ex);
}

static void each_state_has_its_answer(void **state)
{
    expect_code(STORE_STATE_IN_PROGRESS, false, "running");
    expect_code(STORE_STATE_IN_PROGRESS, true, "outcome_unknown"); /* its lease ran out */
    expect_code(STORE_STATE_FAILED, false, "failed");
    expect_code(STORE_STATE_UNKNOWN, false, "outcome_unknown");
}

static void unknown_call_is_not_found(void **state)
{
    exchange_t *ex = ask(5, "alice");
    fs.get_cb(STORE_OK, NULL, fs.arg);
    assert_non_null(strstr(ex->body, "\"code\":\"not_found\""));
    assert_non_null(strstr(ex->body, "Nothing was executed now"));
    assert_null(strstr(ex->body, "\"isError\":true"));
    fake_exchange_free(ex);
}

static void query_without_a_tool_is_a_bad_request(void **state)
{
    exchange_t *ex = request("idemgw_call_status", "{\"arguments\":{\"amount\":5}}", "alice");
    assert_int_equal(status_offer(w.status, ex), HANDLER_TAKEN);
    assert_int_equal(fs.gets, 0);
    assert_non_null(strstr(ex->body, "\"code\":\"bad_request\""));
    assert_non_null(strstr(ex->body, "\"isError\":true"));
    fake_exchange_free(ex);
    /* an idempotency key that is not a string */
    ex = request("idemgw_call_status", "{\"tool\":\"refund\",\"idempotency_key\":7}", "alice");
    assert_int_equal(status_offer(w.status, ex), HANDLER_TAKEN);
    assert_non_null(strstr(ex->body, "\"code\":\"bad_request\""));
    fake_exchange_free(ex);
    assert_int_equal(fs.gets, 0);
}

static void no_subject_is_refused_before_the_store(void **state)
{
    exchange_t *ex = ask(5, NULL);
    assert_int_equal(fs.gets, 0);
    assert_non_null(strstr(ex->body, "\"code\":\"no_subject\""));
    assert_int_equal(w.stats.refused, 1);
    fake_exchange_free(ex);
}

static void store_down_is_said_and_nothing_forwarded(void **state)
{
    fs.fail_next = STORE_ERR_UNAVAILABLE;
    exchange_t *ex = ask(5, "alice");
    assert_int_equal(ex->forwards, 0);
    assert_non_null(strstr(ex->body, "\"code\":\"store_unavailable\""));
    fake_exchange_free(ex);
    fs.fail_next = STORE_OK;
    /* a failure the store reports later is the same */
    ex = ask(5, "alice");
    fs.get_cb(STORE_ERR_UNAVAILABLE, NULL, fs.arg);
    assert_non_null(strstr(ex->body, "\"code\":\"store_unavailable\""));
    assert_int_equal(ex->forwards, 0);
    fake_exchange_free(ex);
}

static void agent_gone_ends_the_query(void **state)
{
    exchange_t *ex = ask(5, "alice");
    ex->waiting = false;
    deliver(STORE_STATE_SUCCEEDED, "{\"content\":[]}", false);
    assert_true(ex->ended);
    assert_null(ex->body);
    fake_exchange_free(ex);
}

static void without_a_store_every_query_is_refused(void **state)
{
    status_ctx_t sc = {.cfg = w.cfg, .subject = w.subject, .stats = &w.stats};
    status_tool_t *no_store = status_new(&sc);
    exchange_t *ex = request("idemgw_call_status", "{\"tool\":\"refund\"}", "alice");
    assert_int_equal(status_offer(no_store, ex), HANDLER_TAKEN);
    assert_non_null(strstr(ex->body, "\"code\":\"store_not_configured\""));
    fake_exchange_free(ex);
    status_free(no_store);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(only_the_status_tool_is_taken, setup, teardown),
        cmocka_unit_test_setup_teardown(reads_the_key_the_call_was_claimed_with, setup, teardown),
        cmocka_unit_test_setup_teardown(succeeded_call_is_replayed_marked, setup, teardown),
        cmocka_unit_test_setup_teardown(each_state_has_its_answer, setup, teardown),
        cmocka_unit_test_setup_teardown(unknown_call_is_not_found, setup, teardown),
        cmocka_unit_test_setup_teardown(query_without_a_tool_is_a_bad_request, setup, teardown),
        cmocka_unit_test_setup_teardown(no_subject_is_refused_before_the_store, setup, teardown),
        cmocka_unit_test_setup_teardown(store_down_is_said_and_nothing_forwarded, setup, teardown),
        cmocka_unit_test_setup_teardown(agent_gone_ends_the_query, setup, teardown),
        cmocka_unit_test_setup_teardown(without_a_store_every_query_is_refused, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
