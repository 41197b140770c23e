/* MCP Tasks across sessions: recognising a CreateTaskResult, the routes kept per caller. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tasks.h"

#include <stdlib.h>
#include <string.h>

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
}

static void test_routes(void **state)
{
    task_routes_t *r = task_routes_new();
    const char *res = "{\"task\":{\"taskId\":\"t-1\"}}";
    task_routes_note(r, res, strlen(res), "alice", "s-1", 1000);
    assert_string_equal(task_routes_session(r, "t-1", "alice", 999), "s-1");
    assert_null(task_routes_session(r, "t-1", "bob", 999));  /* another caller's */
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_task_results),
        cmocka_unit_test(test_routes),
    };
    return cmocka_run_group_tests_name("tasks", tests, NULL, NULL);
}
