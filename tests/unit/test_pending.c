/* Calls left pending by a POST stream that ended early, finished from a GET stream of their
 * session (pending.c), against a fake exchange and a fake store: which stream finishes which
 * call, with what outcome, read through a compressed stream too; and what is forgotten. */
#include "exchange.h"
#include "../../src/idem/pending.h"
#include "../../src/idem/recorder.h"
#include "replay_cache.h"
#include "store.h"
#include "util.h"

#include <event2/buffer.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include <cmocka.h>

#include "fake_exchange.h"
#include "fake_store.h"

static struct {
    store_t *store;
    replay_cache_t *cache;
    server_stats_t stats;
    recorder_ctx_t recorder;
    pending_reg_t *reg;
    int idle_calls;
    char idle_session[64];
} w;

static void session_idle(void *arg, const char *session)
{
    w.idle_calls++;
    snprintf(w.idle_session, sizeof(w.idle_session), "%s", session);
}

static int setup(void **state)
{
    memset(&w, 0, sizeof(w));
    fake_store_clear();
    w.store = store_from_ops(&fake_ops, &fs);
    w.cache = replay_cache_new(100, 1 << 20);
    w.recorder = (recorder_ctx_t){.store = w.store, .cache = w.cache, .stats = &w.stats};
    pending_ctx_t pc = {
        .store = w.store,
        .recorder = &w.recorder,
        .stats = &w.stats,
        .session_idle = session_idle,
    };
    w.reg = pending_new(&pc);
    return 0;
}

static int teardown(void **state)
{
    if (fs.finish_cb) /* a finish the test did not answer */
        fake_store_finished(STORE_OK, true);
    pending_free(w.reg);
    store_free(w.store);
    replay_cache_free(w.cache);
    fake_store_clear();
    return 0;
}

/* A protected call of session with JSON-RPC id 7, left pending for lease_ms. */
static void add_call(const char *session, const char *key, uint64_t lease_ms,
                     on_tool_error_t on_tool_error)
{
    recorder_call_t rc = {
        .key = key,
        .key_hash = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        .fence = 3,
        .window_ms = 60000,
        .max_stored_bytes = 1 << 20,
        .args_digest = "digest",
        .claimed_at = "2026-12-05T06:00:00.000Z",
        .attempts = 1,
        .subject = "alice",
        .session = session,
        .jsonrpc_id = "7",
    };
    policy_rules_t rules = {.lease_ms = lease_ms, .on_tool_error = on_tool_error};
    json_t *id = json_integer(7);
    pending_add(w.reg, &rc, id, &rules);
    json_decref(id);
}

/* A GET stream of session, offered to the registry and answered 200 text/event-stream. */
static exchange_t *get_stream(const char *session, const char *coding)
{
    exchange_t *ex = fake_exchange_new(NULL);
    fake_header(&ex->req.headers, "Mcp-Session-Id", session);
    pending_watch(w.reg, ex);
    fake_head(ex, 200, "text/event-stream", coding);
    return ex;
}

static void send_event(exchange_t *ex, const char *data)
{
    char buf[512];
    int n = snprintf(buf, sizeof(buf), "event: message\ndata: %s\n\n", data);
    assert_int_equal(fake_body(ex, buf, (size_t)n), OBSERVE_PASS);
}

static const char RESULT7[] =
    "{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"ok\"}]}}";

static void result_on_get_stream_finishes_the_key(void **state)
{
    add_call("s1", "alice:refund:h:1", 60000, ON_TOOL_ERROR_RELEASE);
    assert_true(pending_has_session(w.reg, "s1"));
    exchange_t *ex = get_stream("s1", NULL);
    /* a notification and another call's answer are no sign */
    send_event(ex, "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}");
    send_event(ex, "{\"jsonrpc\":\"2.0\",\"id\":8,\"result\":{\"content\":[]}}");
    assert_int_equal(fs.finishes, 0);
    send_event(ex, RESULT7);
    assert_int_equal(fs.finishes, 1);
    assert_string_equal(fs.finish_key, "alice:refund:h:1");
    assert_int_equal(fs.fence, 3); /* only the claim it was pending for */
    assert_int_equal(fs.state, STORE_STATE_SUCCEEDED);
    assert_non_null(strstr(fs.result, "\"text\":\"ok\""));
    assert_int_equal(w.stats.executions, 1);
    /* finished once: the call is no longer pending, and its session may be idle */
    assert_false(pending_has_session(w.reg, "s1"));
    assert_int_equal(w.idle_calls, 1);
    assert_string_equal(w.idle_session, "s1");
    /* once the store has it, the replay cache has it too */
    fake_store_finished(STORE_OK, true);
    assert_non_null(replay_cache_get(w.cache, "alice:refund:h:1", util_now_ms()));
    /* the same answer again finishes nothing */
    send_event(ex, RESULT7);
    assert_int_equal(fs.finishes, 1);
    fake_exchange_free(ex);
}

static void another_sessions_stream_finishes_nothing(void **state)
{
    add_call("s1", "alice:refund:h:2", 60000, ON_TOOL_ERROR_RELEASE);
    exchange_t *ex = get_stream("s2", NULL);
    send_event(ex, RESULT7); /* the same id, in another session: another call */
    assert_int_equal(fs.finishes, 0);
    assert_true(pending_has_session(w.reg, "s1"));
    assert_int_equal(w.idle_calls, 0);
    fake_exchange_free(ex);
}

static void tool_error_is_released(void **state)
{
    add_call("s1", "alice:refund:h:3", 60000, ON_TOOL_ERROR_RELEASE);
    exchange_t *ex = get_stream("s1", NULL);
    send_event(ex, "{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"isError\":true,\"content\":[]}}");
    assert_int_equal(fs.finishes, 1);
    assert_int_equal(fs.state, STORE_STATE_FAILED);
    assert_null(fs.result); /* a released call keeps no answer */
    fake_store_finished(STORE_OK, true);
    assert_null(replay_cache_get(w.cache, "alice:refund:h:3", util_now_ms()));
    fake_exchange_free(ex);
}

static void tool_error_is_stored_when_the_policy_says(void **state)
{
    add_call("s1", "alice:refund:h:4", 60000, ON_TOOL_ERROR_STORE);
    exchange_t *ex = get_stream("s1", NULL);
    send_event(ex, "{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"isError\":true,\"content\":[]}}");
    assert_int_equal(fs.state, STORE_STATE_SUCCEEDED);
    fake_exchange_free(ex);
}

static void event_split_across_reads_still_finishes(void **state)
{
    add_call("s1", "alice:refund:h:5", 60000, ON_TOOL_ERROR_RELEASE);
    exchange_t *ex = get_stream("s1", NULL);
    char buf[512];
    int n = snprintf(buf, sizeof(buf), "data: %s\n\n", RESULT7);
    fake_body(ex, buf, 10);
    assert_int_equal(fs.finishes, 0);
    fake_body(ex, buf + 10, (size_t)n - 10);
    assert_int_equal(fs.finishes, 1);
    fake_exchange_free(ex);
}

static void compressed_stream_is_read(void **state)
{
    add_call("s1", "alice:refund:h:6", 60000, ON_TOOL_ERROR_RELEASE);
    exchange_t *ex = get_stream("s1", "deflate");
    char plain[512];
    int n = snprintf(plain, sizeof(plain), "data: %s\n\n", RESULT7);
    unsigned char packed[1024];
    uLongf packed_len = sizeof(packed);
    assert_int_equal(compress(packed, &packed_len, (const Bytef *)plain, (uLong)n), Z_OK);
    fake_body(ex, (const char *)packed, packed_len);
    assert_int_equal(fs.finishes, 1);
    assert_int_equal(fs.state, STORE_STATE_SUCCEEDED);
    fake_exchange_free(ex);
}

static void unknown_coding_leaves_the_call_to_its_lease(void **state)
{
    add_call("s1", "alice:refund:h:7", 60000, ON_TOOL_ERROR_RELEASE);
    exchange_t *ex = get_stream("s1", "zstd");
    send_event(ex, RESULT7); /* not readable as it is: never taken for the answer */
    assert_int_equal(fs.finishes, 0);
    assert_true(pending_has_session(w.reg, "s1"));
    fake_exchange_free(ex);
}

static void past_its_lease_a_call_is_forgotten(void **state)
{
    add_call("s1", "alice:refund:h:8", 0, ON_TOOL_ERROR_RELEASE);
    assert_false(pending_has_session(w.reg, "s1"));
    exchange_t *ex = get_stream("s1", NULL);
    send_event(ex, RESULT7);
    assert_int_equal(fs.finishes, 0); /* its row is the lease's now */
    fake_exchange_free(ex);
}

static void refused_write_is_counted_not_kept(void **state)
{
    add_call("s1", "alice:refund:h:9", 60000, ON_TOOL_ERROR_RELEASE);
    exchange_t *ex = get_stream("s1", NULL);
    send_event(ex, RESULT7);
    fake_store_finished(STORE_ERR_UNAVAILABLE, false);
    assert_int_equal(w.stats.store_errors, 1);
    assert_null(replay_cache_get(w.cache, "alice:refund:h:9", util_now_ms()));
    fake_exchange_free(ex);
}

static void stream_without_session_or_store_is_not_watched(void **state)
{
    exchange_t *ex = fake_exchange_new(NULL);
    pending_watch(w.reg, ex);
    assert_int_equal(ex->n_obs, 0);
    fake_exchange_free(ex);

    pending_ctx_t pc = {.recorder = &w.recorder, .stats = &w.stats};
    pending_reg_t *no_store = pending_new(&pc);
    ex = fake_exchange_new(NULL);
    fake_header(&ex->req.headers, "Mcp-Session-Id", "s1");
    pending_watch(no_store, ex);
    assert_int_equal(ex->n_obs, 0);
    fake_exchange_free(ex);
    pending_free(no_store);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(result_on_get_stream_finishes_the_key, setup, teardown),
        cmocka_unit_test_setup_teardown(another_sessions_stream_finishes_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(tool_error_is_released, setup, teardown),
        cmocka_unit_test_setup_teardown(tool_error_is_stored_when_the_policy_says, setup, teardown),
        cmocka_unit_test_setup_teardown(event_split_across_reads_still_finishes, setup, teardown),
        cmocka_unit_test_setup_teardown(compressed_stream_is_read, setup, teardown),
        cmocka_unit_test_setup_teardown(unknown_coding_leaves_the_call_to_its_lease, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(past_its_lease_a_call_is_forgotten, setup, teardown),
        cmocka_unit_test_setup_teardown(refused_write_is_counted_not_kept, setup, teardown),
        cmocka_unit_test_setup_teardown(stream_without_session_or_store_is_not_watched, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
