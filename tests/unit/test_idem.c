/* The idempotency stage against a fake exchange (fake_exchange.h: the exchange_* functions
 * idem.c calls, so the archive's proxy is not linked) and a fake store (fake_store.h: a backend
 * whose calls the test answers itself). Each test drives one path the integration
 * tests reach through real processes: first execution, replay (from the store and from the cache),
 * in progress, unknown, store down or failing, no subject, a foreign answer, an agent that leaves
 * while waiting. */
#include "config.h"
#include "exchange.h"
#include "http_conn.h"
#include "idem.h"
#include "replay_cache.h"
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

/* --- set-up --- */

static const char YAML[] =
    "upstream: http://127.0.0.1:9/mcp\n"
    "subject:\n  header: X-Subject\n"
    "tools:\n"
    "  refund:\n    class: non_idempotent\n"
    "  refund_wait:\n    class: non_idempotent\n    in_progress: {wait: 5s}\n"
    "  refund_cancel:\n    class: non_idempotent\n    on_cancel: forward\n";

typedef struct world {
    struct event_base *base;
    config_t *cfg;
    replay_cache_t *cache;
    store_t *store;
    server_stats_t stats;
    subject_t *subject;
    task_routes_t *tasks;
    task_poll_t *task_poll;
    idem_t *idem;
} world_t;

static world_t w;

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
    w.task_poll =
        task_poll_new(&(task_poll_ctx_t){.base = w.base, .routes = w.tasks, .subject = w.subject});
    idem_ctx_t ctx = {
        .tasks = w.tasks,
        .base = w.base,
        .cfg = w.cfg,
        .subject = w.subject,
        .store = w.store,
        .cache = w.cache,
        .stats = &w.stats,
    };
    w.idem = idem_new(&ctx);
    return 0;
}

static int teardown(void **state)
{
    idem_free(w.idem);
    task_poll_free(w.task_poll);
    task_routes_free(w.tasks);
    subject_free(w.subject);
    store_free(w.store);
    replay_cache_free(w.cache);
    event_base_free(w.base);
    config_free(w.cfg);
    fake_store_clear();
    return 0;
}

/* A tools/call of tool with amount, from subject (NULL: no subject header), in session (NULL:
 * none). */
static exchange_t *call_in(const char *tool, int amount, const char *subject, const char *session)
{
    char body[200];
    snprintf(body, sizeof(body),
             "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/call\",\"params\":"
             "{\"name\":\"%s\",\"arguments\":{\"amount\":%d}}}",
             tool, amount);
    exchange_t *ex = fake_exchange_new(body);
    if (subject)
        fake_header(&ex->req.headers, "X-Subject", subject);
    if (session)
        fake_header(&ex->req.headers, "Mcp-Session-Id", session);
    idem_call(w.idem, ex);
    return ex;
}

static exchange_t *call(const char *tool, int amount, const char *subject)
{
    return call_in(tool, amount, subject, NULL);
}

static void free_call(exchange_t *ex)
{
    fake_exchange_free(ex);
}

static void deliver_acquired(void)
{
    store_claim_result_t res = {.acquired = true, .fence = 1, .attempts = 1};
    fs.claim_cb(STORE_OK, &res, fs.arg);
}

static void deliver_row(store_state_t state, const char *result)
{
    store_claim_result_t res = {.acquired = false};
    res.row.state = state;
    res.row.attempts = 1;
    res.row.result = result;
    res.row.result_len = result ? strlen(result) : 0;
    res.row.created_at = "2026-12-03T10:00:00.000Z";
    res.row.expires_in_ms = 60000;
    fs.claim_cb(STORE_OK, &res, fs.arg);
}

/* The upstream answers 200 with a JSON body. */
static observe_t answer_json(exchange_t *ex, const char *body)
{
    assert_int_equal(fake_head(ex, 200, "application/json", NULL), OBSERVE_HOLD);
    fake_body(ex, body, strlen(body));
    return fake_end(ex, UPSTREAM_OK);
}

static const char RESULT[] =
    "{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"ok\"}]}}";

/* --- tests --- */

static void first_execution_forwards_once_and_records(void **state)
{
    exchange_t *ex = call("refund", 5, "alice");
    assert_int_equal(fs.claims, 1);
    assert_string_equal(fs.subject, "alice"); /* passed as is, not parsed out of the key */
    assert_int_equal(ex->forwards, 0);
    assert_int_equal(w.stats.cache_misses, 1);
    assert_int_equal(w.stats.protected_in_flight, 0); /* claimed is not yet in flight */
    deliver_acquired();
    assert_int_equal(ex->forwards, 1);
    assert_int_equal(w.stats.protected_in_flight, 1);
    assert_true(ex->once);
    assert_non_null(strstr(ex->extra, "Accept-Encoding: identity"));
    assert_int_equal(answer_json(ex, RESULT), OBSERVE_HOLD);
    assert_int_equal(fs.finishes, 1);
    assert_int_equal(fs.state, STORE_STATE_SUCCEEDED);
    assert_non_null(strstr(fs.result, "\"text\":\"ok\""));
    assert_false(ex->released);                       /* held until the store has it */
    assert_int_equal(w.stats.protected_in_flight, 1); /* until the outcome is recorded */
    fs.finish_cb(STORE_OK, true, fs.arg);
    assert_int_equal(w.stats.protected_in_flight, 0);
    assert_true(ex->released);
    assert_string_equal(ex->outcome, "executed");
    assert_non_null(strstr(ex->fields, "\"recorded\":\"succeeded\""));
    assert_int_equal(w.stats.executions, 1);
    free_call(ex);

    /* the same call again: answered from this process's cache, no claim */
    exchange_t *again = call("refund", 5, "alice");
    assert_int_equal(fs.claims, 1);
    assert_int_equal(again->status, 200);
    assert_non_null(strstr(again->body, "\"replayed\":true"));
    assert_non_null(strstr(again->body, "\"text\":\"ok\""));
    assert_string_equal(again->rextra, "Idempotent-Replayed: true\r\n");
    assert_int_equal(w.stats.cache_replays, 1);
    assert_int_equal(w.stats.cache_hits, 1);
    assert_int_equal(w.stats.cache_misses, 1);
    /* counted in the store too, so --show agrees with the marker */
    assert_non_null(strstr(again->body, "\"attempts\":2"));
    assert_int_equal(fs.duplicates, 1);
    free_call(again);
}

/* A call that took over a released row is attempt 3: its cached replays go on from there,
 * as the store's count does. */
static void cache_counts_from_the_claims_attempts(void **state)
{
    exchange_t *ex = call("refund", 21, "alice");
    store_claim_result_t res = {.acquired = true, .taken_over = true, .fence = 2, .attempts = 3};
    fs.claim_cb(STORE_OK, &res, fs.arg);
    assert_int_equal(answer_json(ex, RESULT), OBSERVE_HOLD);
    fs.finish_cb(STORE_OK, true, fs.arg);
    free_call(ex);
    exchange_t *again = call("refund", 21, "alice");
    assert_int_equal(w.stats.cache_replays, 1);
    assert_non_null(strstr(again->body, "\"attempts\":4"));
    assert_int_equal(fs.duplicates, 1);
    free_call(again);
}

static void replay_from_the_store(void **state)
{
    exchange_t *ex = call("refund", 6, "alice");
    deliver_row(STORE_STATE_SUCCEEDED, "{\"content\":[{\"type\":\"text\",\"text\":\"stored\"}]}");
    assert_int_equal(ex->forwards, 0);
    assert_string_equal(ex->outcome, "replay");
    assert_non_null(strstr(ex->body, "\"text\":\"stored\""));
    assert_non_null(strstr(ex->body, "\"attempts\":2"));
    assert_int_equal(fs.duplicates, 1);
    assert_int_equal(w.stats.replays, 1);
    free_call(ex);

    /* cached with this replay counted: the next one is attempt 3, not 2 again */
    exchange_t *again = call("refund", 6, "alice");
    assert_int_equal(w.stats.cache_replays, 1);
    assert_non_null(strstr(again->body, "\"attempts\":3"));
    assert_int_equal(fs.duplicates, 2);
    free_call(again);
}

static void in_progress_is_not_forwarded(void **state)
{
    exchange_t *ex = call("refund", 7, "alice");
    deliver_row(STORE_STATE_IN_PROGRESS, NULL);
    assert_int_equal(ex->forwards, 0);
    assert_string_equal(ex->outcome, "in_progress");
    assert_non_null(strstr(ex->body, "\"code\":\"in_progress\""));
    assert_non_null(strstr(ex->fields, "\"code\":\"in_progress\""));
    assert_non_null(strstr(ex->body, "Do not retry it right now"));
    assert_int_equal(w.stats.in_progress, 1);
    /* recorded on the row's history, not counted in attempts */
    assert_int_equal(fs.dup_records[STORE_DUP_IN_PROGRESS], 1);
    assert_int_equal(fs.duplicates, 0);
    free_call(ex);
}

static void unknown_outcome_is_held(void **state)
{
    exchange_t *ex = call("refund", 8, "alice");
    deliver_row(STORE_STATE_UNKNOWN, NULL);
    assert_int_equal(ex->forwards, 0);
    assert_string_equal(ex->outcome, "unknown");
    assert_non_null(strstr(ex->body, "\"code\":\"outcome_unknown\""));
    assert_int_equal(fs.dup_records[STORE_DUP_UNKNOWN], 1);
    assert_int_equal(fs.duplicates, 0);
    free_call(ex);
}

static void store_down_refuses_safe_to_retry(void **state)
{
    fs.fail_next = STORE_ERR_UNAVAILABLE;
    exchange_t *ex = call("refund", 9, "alice");
    assert_int_equal(ex->forwards, 0);
    assert_string_equal(ex->outcome, "refused");
    assert_non_null(strstr(ex->body, "\"code\":\"store_unavailable\""));
    assert_non_null(strstr(ex->body, "safe to retry"));
    assert_int_equal(w.stats.refused, 1);
    free_call(ex);
}

static void statement_error_never_says_retry_later(void **state)
{
    exchange_t *ex = call("refund", 10, "alice");
    fs.claim_cb(STORE_ERR_STATEMENT, NULL, fs.arg);
    assert_int_equal(ex->forwards, 0);
    assert_non_null(strstr(ex->body, "\"code\":\"store_error\""));
    assert_null(strstr(ex->body, "retry the same call later"));
    assert_int_equal(w.stats.store_errors, 1);
    free_call(ex);
}

static void no_subject_refuses_before_the_store(void **state)
{
    exchange_t *ex = call("refund", 11, NULL);
    assert_int_equal(fs.claims, 0);
    assert_non_null(strstr(ex->body, "\"code\":\"no_subject\""));
    assert_non_null(strstr(ex->body, "X-Subject"));
    assert_null(strstr(ex->body, "key_hash"));                  /* no key was derived */
    assert_string_equal(ex->fields, "\"code\":\"no_subject\""); /* the log line says why */
    free_call(ex);
}

static void foreign_answer_is_replaced_and_recorded_unknown(void **state)
{
    exchange_t *ex = call("refund", 12, "alice");
    deliver_acquired();
    const char *other = "{\"jsonrpc\":\"2.0\",\"id\":99,\"result\":{\"content\":[]}}";
    assert_int_equal(answer_json(ex, other), OBSERVE_HOLD);
    assert_true(ex->discarded);
    assert_int_equal(fs.state, STORE_STATE_UNKNOWN);
    fs.finish_cb(STORE_OK, true, fs.arg);
    assert_true(ex->replaced);
    assert_false(ex->released);
    assert_non_null(strstr(ex->body, "a different request"));
    assert_null(strstr(ex->body, "\"id\":99"));
    free_call(ex);
}

/* A store that orders its finishes before every later call (the embedded store of one
 * process): the answer goes as soon as the finish is queued, and the exchange may end before
 * the store has it; its callback then only logs and fills the cache. An answer the gateway
 * replaces still waits for the store. */
static void ordered_store_answers_once_the_finish_is_queued(void **state)
{
    fs.ordered = true;
    exchange_t *ex = call("refund", 21, "alice");
    deliver_acquired();
    assert_int_equal(answer_json(ex, RESULT), OBSERVE_PASS);
    assert_int_equal(fs.finishes, 1);
    assert_int_equal(fs.state, STORE_STATE_SUCCEEDED);
    assert_true(ex->released);
    assert_int_equal(w.stats.protected_in_flight, 0);
    assert_string_equal(ex->outcome, "executed");
    assert_int_equal(w.stats.executions, 1);
    free_call(ex);
    fs.finish_cb(STORE_OK, true, fs.arg);

    exchange_t *again = call("refund", 21, "alice");
    assert_int_equal(fs.claims, 1); /* from the cache, filled when the store had it */
    assert_non_null(strstr(again->body, "\"replayed\":true"));
    free_call(again);

    exchange_t *other = call("refund", 22, "alice");
    deliver_acquired();
    const char *foreign = "{\"jsonrpc\":\"2.0\",\"id\":99,\"result\":{\"content\":[]}}";
    assert_int_equal(answer_json(other, foreign), OBSERVE_HOLD);
    assert_false(other->replaced);
    fs.finish_cb(STORE_OK, true, fs.arg);
    assert_true(other->replaced);
    free_call(other);
}

static void cut_answer_is_held_as_unknown(void **state)
{
    exchange_t *ex = call("refund", 13, "alice");
    deliver_acquired();
    assert_int_equal(fake_end(ex, UPSTREAM_ERR_CLOSED), OBSERVE_HOLD);
    assert_int_equal(fs.state, STORE_STATE_UNKNOWN);
    fs.finish_cb(STORE_OK, true, fs.arg);
    assert_true(ex->released);
    assert_string_equal(ex->outcome, "unknown");
    free_call(ex);
}

static void unreachable_upstream_is_released(void **state)
{
    exchange_t *ex = call("refund", 14, "alice");
    deliver_acquired();
    assert_int_equal(fake_end(ex, UPSTREAM_ERR_CONNECT), OBSERVE_HOLD);
    assert_int_equal(fs.state, STORE_STATE_FAILED); /* never sent: the next attempt may run */
    fs.finish_cb(STORE_OK, true, fs.arg);
    assert_string_equal(ex->outcome, "not_sent");
    free_call(ex);
}

static void tool_error_is_released(void **state)
{
    exchange_t *ex = call("refund", 15, "alice");
    deliver_acquired();
    const char *err = "{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"isError\":true,\"content\":[]}}";
    answer_json(ex, err);
    assert_int_equal(fs.state, STORE_STATE_FAILED);
    fs.finish_cb(STORE_OK, true, fs.arg);
    assert_true(ex->released);
    free_call(ex);
}

static void failed_write_still_answers_the_agent(void **state)
{
    exchange_t *ex = call("refund", 16, "alice");
    deliver_acquired();
    answer_json(ex, RESULT);
    fs.finish_cb(STORE_ERR_UNAVAILABLE, false, fs.arg);
    assert_true(ex->released);
    assert_int_equal(w.stats.store_errors, 1);
    free_call(ex);
    /* not cached: the store does not have it */
    exchange_t *again = call("refund", 16, "alice");
    assert_int_equal(fs.claims, 2);
    free_call(again);
}

static void agent_gone_while_waiting_ends_the_call(void **state)
{
    exchange_t *ex = call("refund_wait", 17, "alice");
    deliver_row(STORE_STATE_IN_PROGRESS, NULL);
    assert_null(ex->body);                /* waiting, not answered */
    ex->waiting = false;                  /* the agent leaves */
    event_base_loop(w.base, EVLOOP_ONCE); /* the first poll */
    assert_true(ex->ended);
    assert_int_equal(fs.gets, 0);
    assert_int_equal(ex->forwards, 0);
    free_call(ex);
}

static void waiting_duplicate_gets_the_result(void **state)
{
    exchange_t *ex = call("refund_wait", 18, "alice");
    deliver_row(STORE_STATE_IN_PROGRESS, NULL);
    event_base_loop(w.base, EVLOOP_ONCE);
    assert_int_equal(fs.gets, 1);
    store_row_t row = {.state = STORE_STATE_SUCCEEDED,
                       .attempts = 1,
                       .result = "{\"content\":[]}",
                       .result_len = 14,
                       .created_at = "2026-12-03T10:00:00.000Z"};
    fs.get_cb(STORE_OK, &row, fs.arg);
    assert_string_equal(ex->outcome, "replay");
    assert_int_equal(ex->forwards, 0);
    free_call(ex);
}

static void other_arguments_get_another_key(void **state)
{
    exchange_t *a = call("refund", 19, "alice");
    char *key_a = xstrdup(fs.key);
    exchange_t *b = call("refund", 20, "alice");
    exchange_t *c = call("refund", 19, "bob");
    assert_string_not_equal(key_a, fs.key);
    deliver_acquired(); /* c's claim */
    assert_int_equal(c->forwards, 1);
    free(key_a);
    free_call(a);
    free_call(b);
    free_call(c);
}

/* A task handle replayed from the store routes its caller's tasks/get to the session that
 * created the task; another caller's goes where it was sent. */
static exchange_t *task_get(const char *subject, const char *session)
{
    exchange_t *ex = fake_exchange_new("{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"tasks/get\","
                                       "\"params\":{\"taskId\":\"t-7\"}}");
    fake_header(&ex->req.headers, "X-Subject", subject);
    if (session)
        fake_header(&ex->req.headers, "Mcp-Session-Id", session);
    assert_int_equal(task_poll_offer(w.task_poll, ex), HANDLER_TAKEN);
    return ex;
}

static void task_poll_goes_to_the_tasks_session(void **state)
{
    exchange_t *ex = call("refund", 21, "alice");
    static const char task[] = "{\"task\":{\"taskId\":\"t-7\",\"status\":\"working\"}}";
    store_claim_result_t res = {.acquired = false};
    res.row.state = STORE_STATE_SUCCEEDED;
    res.row.attempts = 1;
    res.row.result = task;
    res.row.result_len = sizeof(task) - 1;
    res.row.created_at = "2026-12-03T10:00:00.000Z";
    res.row.expires_in_ms = 60000;
    res.row.first_session_id = "s-first";
    fs.claim_cb(STORE_OK, &res, fs.arg);
    assert_string_equal(ex->outcome, "replay");
    free_call(ex);

    exchange_t *mine = task_get("alice", "s-new");
    assert_int_equal(mine->forwards, 1);
    assert_string_equal(mine->extra, "Mcp-Session-Id: s-first\r\n");
    exchange_t *theirs = task_get("bob", "s-new");
    assert_int_equal(theirs->forwards, 1);
    assert_string_equal(theirs->extra, ""); /* bob never had that task */
    exchange_t *same = task_get("alice", "s-first");
    assert_string_equal(same->extra, ""); /* already its session */
    free_call(mine);
    free_call(theirs);
    free_call(same);
}

/* --- a caller's notifications/cancelled --- */

/* A cancel of request id from subject in session, before it goes upstream. */
static exchange_t *cancel_note(const char *subject, const char *session, int id)
{
    char body[200];
    snprintf(body, sizeof(body),
             "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\","
             "\"params\":{\"requestId\":%d}}",
             id);
    exchange_t *ex = fake_exchange_new(body);
    fake_header(&ex->req.headers, "X-Subject", subject);
    fake_header(&ex->req.headers, "Mcp-Session-Id", session);
    json_t *rid = json_integer(id);
    idem_cancel(w.idem, ex, rid);
    json_decref(rid);
    return ex;
}

static void cancel_of_a_running_call_is_kept(void **state)
{
    exchange_t *ex = call_in("refund", 40, "alice", "s1");
    deliver_acquired();
    assert_int_equal(ex->forwards, 1);
    exchange_t *note = cancel_note("alice", "s1", 7);
    assert_int_equal(note->forwards, 0); /* on_cancel: finish keeps it here */
    assert_int_equal(note->status, 202);
    assert_string_equal(note->outcome, "cancel_kept");
    assert_false(ex->cut);
    /* the call runs to its end and is recorded for the retry */
    answer_json(ex, RESULT);
    assert_int_equal(fs.state, STORE_STATE_SUCCEEDED);
    assert_non_null(strstr(ex->fields, "\"cancel\":\"kept\""));
    fs.finish_cb(STORE_OK, true, fs.arg);
    free_call(note);
    free_call(ex);
}

static void cancel_from_another_caller_is_ignored(void **state)
{
    exchange_t *ex = call_in("refund_cancel", 41, "alice", "s1");
    deliver_acquired();
    exchange_t *note = cancel_note("bob", "s1", 7);
    assert_int_equal(note->forwards, 0); /* it cannot stop a call it does not own */
    assert_int_equal(note->status, 202);
    assert_string_equal(note->outcome, "cancel_ignored");
    free_call(note);
    /* the call was not touched */
    answer_json(ex, RESULT);
    assert_int_equal(fs.state, STORE_STATE_SUCCEEDED);
    assert_null(strstr(ex->fields, "cancel"));
    fs.finish_cb(STORE_OK, true, fs.arg);
    free_call(ex);
}

static void cancel_naming_no_protected_call_goes_upstream(void **state)
{
    exchange_t *ex = call_in("refund", 42, "alice", "s1");
    deliver_acquired();
    exchange_t *other_id = cancel_note("alice", "s1", 8);
    assert_int_equal(other_id->forwards, 1);
    exchange_t *other_session = cancel_note("alice", "s2", 7);
    assert_int_equal(other_session->forwards, 1);
    free_call(other_id);
    free_call(other_session);
    free_call(ex);
}

static void forward_mode_drops_a_call_not_sent_yet(void **state)
{
    exchange_t *ex = call_in("refund_cancel", 43, "alice", "s1");
    assert_int_equal(fs.claims, 1); /* claiming: not upstream yet */
    exchange_t *note = cancel_note("alice", "s1", 7);
    assert_int_equal(note->forwards, 0);
    assert_string_equal(note->outcome, "cancel_dropped");
    free_call(note);
    deliver_acquired();
    assert_int_equal(ex->forwards, 0);              /* never sent */
    assert_int_equal(fs.state, STORE_STATE_FAILED); /* nothing ran: its key is released */
    fs.finish_cb(STORE_OK, true, fs.arg);
    assert_non_null(strstr(ex->body, "-32800"));
    assert_non_null(strstr(ex->body, "nothing was executed"));
    free_call(ex);
}

static void cancel_the_upstream_took_ends_the_call_cancelled(void **state)
{
    exchange_t *ex = call_in("refund_cancel", 44, "alice", "s1");
    deliver_acquired();
    exchange_t *note = cancel_note("alice", "s1", 7);
    assert_int_equal(note->forwards, 1); /* on_cancel: forward relays a running call's */
    json_t *rid = json_integer(7);
    idem_cancelled(w.idem, &note->req, "s1", rid);
    json_decref(rid);
    assert_true(ex->cut); /* no answer will come */
    assert_int_equal(fake_end(ex, UPSTREAM_ERR_CLOSED), OBSERVE_HOLD);
    assert_int_equal(fs.state, STORE_STATE_UNKNOWN); /* it may have run */
    assert_non_null(strstr(fs.result, "idemgw/cancelled"));
    fs.finish_cb(STORE_OK, true, fs.arg);
    free_call(note);
    free_call(ex);
    /* a retry hears that the first was cancelled, not merely unknown */
    exchange_t *again = call_in("refund_cancel", 44, "alice", "s1");
    deliver_row(STORE_STATE_UNKNOWN, "{\"idemgw/cancelled\":true}");
    assert_non_null(strstr(again->body, "\"code\":\"cancelled\""));
    assert_int_equal(again->forwards, 0);
    free_call(again);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(first_execution_forwards_once_and_records, setup, teardown),
        cmocka_unit_test_setup_teardown(replay_from_the_store, setup, teardown),
        cmocka_unit_test_setup_teardown(cache_counts_from_the_claims_attempts, setup, teardown),
        cmocka_unit_test_setup_teardown(in_progress_is_not_forwarded, setup, teardown),
        cmocka_unit_test_setup_teardown(unknown_outcome_is_held, setup, teardown),
        cmocka_unit_test_setup_teardown(store_down_refuses_safe_to_retry, setup, teardown),
        cmocka_unit_test_setup_teardown(statement_error_never_says_retry_later, setup, teardown),
        cmocka_unit_test_setup_teardown(no_subject_refuses_before_the_store, setup, teardown),
        cmocka_unit_test_setup_teardown(foreign_answer_is_replaced_and_recorded_unknown, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(ordered_store_answers_once_the_finish_is_queued, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(cut_answer_is_held_as_unknown, setup, teardown),
        cmocka_unit_test_setup_teardown(unreachable_upstream_is_released, setup, teardown),
        cmocka_unit_test_setup_teardown(tool_error_is_released, setup, teardown),
        cmocka_unit_test_setup_teardown(failed_write_still_answers_the_agent, setup, teardown),
        cmocka_unit_test_setup_teardown(agent_gone_while_waiting_ends_the_call, setup, teardown),
        cmocka_unit_test_setup_teardown(waiting_duplicate_gets_the_result, setup, teardown),
        cmocka_unit_test_setup_teardown(other_arguments_get_another_key, setup, teardown),
        cmocka_unit_test_setup_teardown(task_poll_goes_to_the_tasks_session, setup, teardown),
        cmocka_unit_test_setup_teardown(cancel_of_a_running_call_is_kept, setup, teardown),
        cmocka_unit_test_setup_teardown(cancel_from_another_caller_is_ignored, setup, teardown),
        cmocka_unit_test_setup_teardown(cancel_naming_no_protected_call_goes_upstream, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(forward_mode_drops_a_call_not_sent_yet, setup, teardown),
        cmocka_unit_test_setup_teardown(cancel_the_upstream_took_ends_the_call_cancelled, setup,
                                        teardown),
    };
    return cmocka_run_group_tests_name("idem", tests, NULL, NULL);
}
