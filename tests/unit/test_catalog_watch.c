/* The catalogue's watch of GET streams (catalog_watch.c), against a fake exchange: which
 * streams it watches, and that it tells of notifications/tools/list_changed and of nothing
 * else, however the stream is cut or compressed. */
#include "catalog_watch.h"
#include "exchange.h"
#include "util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include <cmocka.h>

#include "fake_exchange.h"

static int changes;

static void tools_changed(void *arg)
{
    (void)arg;
    changes++;
}

static const char CHANGED[] =
    "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}";

static void test_is_list_changed(void **state)
{
    assert_true(catalog_watch_is_list_changed(CHANGED, strlen(CHANGED)));
    const char *spaced =
        "{ \"method\" : \"notifications/tools/list_changed\", \"jsonrpc\":\"2.0\" }";
    assert_true(catalog_watch_is_list_changed(spaced, strlen(spaced)));
    /* the name in another member, or another method, is not the notification */
    const char *quoted =
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[{\"type\":\"text\","
        "\"text\":\"notifications/tools/list_changed\"}]}}";
    assert_false(catalog_watch_is_list_changed(quoted, strlen(quoted)));
    const char *prompts = "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/prompts/list_changed\"}";
    assert_false(catalog_watch_is_list_changed(prompts, strlen(prompts)));
    const char *longer =
        "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed/more\"}";
    assert_false(catalog_watch_is_list_changed(longer, strlen(longer)));
}

/* A GET stream of session (NULL: none), offered to the watch. */
static exchange_t *stream(catalog_watch_t *cw, const char *session)
{
    exchange_t *ex = fake_exchange_new(NULL);
    if (session)
        fake_header(&ex->req.headers, "Mcp-Session-Id", session);
    assert_int_equal(catalog_watch_offer(cw, ex), HANDLER_PASS); /* never takes one */
    return ex;
}

static void test_watches_session_get_streams_only(void **state)
{
    catalog_watch_t *cw = catalog_watch_new(&(catalog_watch_ctx_t){.tools_changed = tools_changed});
    exchange_t *get = stream(cw, "s1");
    assert_int_equal(get->n_obs, 1);
    exchange_t *bare = stream(cw, NULL);
    assert_int_equal(bare->n_obs, 0);
    exchange_t *post =
        fake_exchange_new("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{}}");
    fake_header(&post->req.headers, "Mcp-Session-Id", "s1");
    assert_int_equal(catalog_watch_offer(cw, post), HANDLER_PASS);
    assert_int_equal(post->n_obs, 0);
    fake_exchange_free(get);
    fake_exchange_free(bare);
    fake_exchange_free(post);
    catalog_watch_free(cw);
}

static void test_tells_of_each_change(void **state)
{
    changes = 0;
    catalog_watch_t *cw = catalog_watch_new(&(catalog_watch_ctx_t){.tools_changed = tools_changed});
    exchange_t *ex = stream(cw, "s1");
    assert_int_equal(fake_head(ex, 200, "text/event-stream", NULL), OBSERVE_PASS);
    char buf[512];
    int n = snprintf(buf, sizeof(buf),
                     "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n"
                     "data: %s\n\n",
                     CHANGED);
    /* cut in the middle of the notification */
    assert_int_equal(fake_body(ex, buf, (size_t)n - 20), OBSERVE_PASS);
    assert_int_equal(changes, 0);
    assert_int_equal(fake_body(ex, buf + n - 20, 20), OBSERVE_PASS);
    assert_int_equal(changes, 1);
    n = snprintf(buf, sizeof(buf), "event: message\ndata: %s\n\n", CHANGED);
    fake_body(ex, buf, (size_t)n);
    assert_int_equal(changes, 2);
    fake_exchange_free(ex);
    catalog_watch_free(cw);
}

static void test_reads_a_compressed_stream(void **state)
{
    changes = 0;
    catalog_watch_t *cw = catalog_watch_new(&(catalog_watch_ctx_t){.tools_changed = tools_changed});
    exchange_t *ex = stream(cw, "s1");
    fake_head(ex, 200, "text/event-stream", "deflate");
    char plain[256];
    int n = snprintf(plain, sizeof(plain), "data: %s\n\n", CHANGED);
    unsigned char packed[512];
    uLongf packed_len = sizeof(packed);
    assert_int_equal(compress(packed, &packed_len, (const Bytef *)plain, (uLong)n), Z_OK);
    fake_body(ex, (const char *)packed, packed_len);
    assert_int_equal(changes, 1);
    fake_exchange_free(ex);
    catalog_watch_free(cw);
}

static void test_not_an_event_stream_is_not_read(void **state)
{
    changes = 0;
    catalog_watch_t *cw = catalog_watch_new(&(catalog_watch_ctx_t){.tools_changed = tools_changed});
    exchange_t *refused = stream(cw, "s1");
    fake_head(refused, 404, "text/event-stream", NULL);
    char buf[256];
    int n = snprintf(buf, sizeof(buf), "data: %s\n\n", CHANGED);
    fake_body(refused, buf, (size_t)n);
    exchange_t *json = stream(cw, "s1");
    fake_head(json, 200, "application/json", NULL);
    fake_body(json, buf, (size_t)n);
    exchange_t *unknown = stream(cw, "s1");
    fake_head(unknown, 200, "text/event-stream", "zstd");
    fake_body(unknown, buf, (size_t)n);
    assert_int_equal(changes, 0);
    fake_exchange_free(refused);
    fake_exchange_free(json);
    fake_exchange_free(unknown);
    catalog_watch_free(cw);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_is_list_changed),
        cmocka_unit_test(test_watches_session_get_streams_only),
        cmocka_unit_test(test_tells_of_each_change),
        cmocka_unit_test(test_reads_a_compressed_stream),
        cmocka_unit_test(test_not_an_event_stream_is_not_read),
    };
    return cmocka_run_group_tests_name("catalog_watch", tests, NULL, NULL);
}
