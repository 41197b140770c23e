/* MCP Tasks across sessions: recognising a CreateTaskResult, the routes kept per caller, and
 * a task's request sent to its own session, against a fake exchange (fake_exchange.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tasks.h"

#include <event2/event.h>
#include <stdlib.h>
#include <string.h>

#include "fake_exchange.h"

static void test_create_task_results(void **state)
{
    char *id = NULL;
    uint64_t ttl = 1;
    const char *nested = "{\"task\":{\"taskId\":\"t-1\",\"status\":\"working\",\"ttl\":300000}}";
    assert_true(task_result_of(nested, strlen(nested), &id, &ttl));
    assert_string_equal(id, "t-1");
    assert_int_equal(ttl, 300000);
    free(id);
    const char *flat = "{\"resultType\":\"task\",\"taskId\":\"t-2\"}";
    assert_true(task_result_of(flat, strlen(flat), &id, &ttl));
    assert_string_equal(id, "t-2");
    assert_int_equal(ttl, 0); /* none given */
    free(id);
    const char *plain = "{\"content\":[{\"type\":\"text\",\"text\":\"x\"}]}";
    assert_false(task_result_of(plain, strlen(plain), &id, &ttl));
    assert_null(id);
    const char *flat_no = "{\"taskId\":\"t-3\"}"; /* no resultType: not the flat form */
    assert_false(task_result_of(flat_no, strlen(flat_no), NULL, NULL));
    assert_false(task_result_of("nope", 4, NULL, NULL));
    assert_false(task_result_of("", 0, &id, &ttl));
    assert_null(id);
    /* the member's name written with an escape is the same name */
    const char *escaped = "{\"task\":{\"task\\u0049d\":\"t-4\",\"ttl\":5}}";
    assert_true(task_result_of(escaped, strlen(escaped), &id, &ttl));
    assert_string_equal(id, "t-4");
    assert_int_equal(ttl, 5);
    free(id);
}

static void test_routes(void **state)
{
    task_routes_t *r = task_routes_new();
    const char *res = "{\"task\":{\"taskId\":\"t-1\"}}";
    task_routes_note(r, res, strlen(res), "alice", "s-1", 1000);
    assert_string_equal(task_routes_session(r, "t-1", "alice", 999), "s-1");
    assert_null(task_routes_session(r, "t-1", "bob", 999));    /* another caller's */
    assert_null(task_routes_session(r, "t-1", "alice", 1000)); /* expired */
    assert_null(task_routes_session(r, "t-2", "alice", 0));
    /* a session id the gateway would not send on is not kept */
    task_routes_note(r, res, strlen(res), "alice", "bad\r\nX: y", 5000);
    assert_string_equal(task_routes_session(r, "t-1", "alice", 999), "s-1");
    /* a later note replaces */
    task_routes_note(r, res, strlen(res), "alice", "s-2", 5000);
    assert_string_equal(task_routes_session(r, "t-1", "alice", 4000), "s-2");
    task_routes_free(r);

    char *id = task_request_id("{\"method\":\"tasks/get\",\"params\":{\"taskId\":\"t-9\"}}", 48);
    assert_string_equal(id, "t-9");
    free(id);
    assert_null(task_request_id("{\"params\":{}}", 13));
}

static const char TASK_GET[] =
    "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"tasks/get\",\"params\":{\"taskId\":\"t-1\"}}";

static void test_forward_to_the_tasks_session(void **state)
{
    struct event_base *base = event_base_new();
    exchange_t *ex = fake_exchange_new(TASK_GET);
    task_forward_to(ex, base, "t-1", "s-first");
    assert_int_equal(ex->forwards, 1);
    assert_string_equal(ex->extra, "Mcp-Session-Id: s-first\r\n");
    assert_non_null(strstr(ex->fields, "\"task_session\":\"routed\""));
    /* the session is alive: its answer goes to the caller untouched */
    assert_int_equal(fake_head(ex, 200, "application/json", NULL), OBSERVE_PASS);
    assert_int_equal(fake_end(ex, UPSTREAM_OK), OBSERVE_PASS);
    event_base_loop(base, EVLOOP_NONBLOCK);
    assert_false(ex->replaced);
    fake_exchange_free(ex);
    event_base_free(base);
}

/* The server no longer knows the session (404, or 400 as some say): the caller is told that
 * the task ended with it, once the loop is out of the exchange's callbacks. */
static void ended_session(int status)
{
    struct event_base *base = event_base_new();
    exchange_t *ex = fake_exchange_new(TASK_GET);
    task_forward_to(ex, base, "t-1", "s-first");
    assert_int_equal(fake_head(ex, status, "application/json", NULL), OBSERVE_HOLD);
    assert_int_equal(fake_end(ex, UPSTREAM_OK), OBSERVE_HOLD);
    assert_false(ex->replaced); /* not from inside on_end */
    event_base_loop(base, EVLOOP_NONBLOCK);
    assert_true(ex->replaced);
    assert_non_null(strstr(ex->body, "\"id\":4"));
    assert_non_null(strstr(ex->body, "t-1"));
    assert_non_null(strstr(ex->body, "has ended"));
    assert_non_null(strstr(ex->body, "Nothing was executed"));
    fake_exchange_free(ex);
    event_base_free(base);
}

static void test_ended_session_is_said(void **state)
{
    ended_session(404);
    ended_session(400);
}

/* An exchange that ends before the answer is written takes its timer with it. */
static void test_exchange_gone_first(void **state)
{
    struct event_base *base = event_base_new();
    exchange_t *ex = fake_exchange_new(TASK_GET);
    task_forward_to(ex, base, "t-1", "s-first");
    fake_head(ex, 404, "application/json", NULL);
    fake_end(ex, UPSTREAM_OK);
    fake_detach(ex);
    event_base_loop(base, EVLOOP_NONBLOCK);
    assert_false(ex->replaced);
    fake_exchange_free(ex);
    event_base_free(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_task_results),
        cmocka_unit_test(test_routes),
        cmocka_unit_test(test_forward_to_the_tasks_session),
        cmocka_unit_test(test_ended_session_is_said),
        cmocka_unit_test(test_exchange_gone_first),
    };
    return cmocka_run_group_tests_name("tasks", tests, NULL, NULL);
}
