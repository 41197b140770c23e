/* The SSE observer: events split at every possible byte boundary must come out the same. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct seen {
    char log[2048];
    int n;
} seen_t;

static int collect(const sse_event_t *ev, void *arg)
{
    seen_t *s = arg;
    size_t len = strlen(s->log);
    snprintf(s->log + len, sizeof(s->log) - len, "[%s|%s|%.*s]", ev->event, ev->id ? ev->id : "-",
             (int)ev->data_len, ev->data);
    s->n++;
    return 0;
}

static void feed_split(const char *stream, size_t split, seen_t *out, size_t max_event)
{
    sse_parser_t p;
    memset(out, 0, sizeof(*out));
    sse_init(&p, max_event, collect, out);
    size_t n = strlen(stream);
    if (split > n)
        split = n;
    assert_int_equal(sse_feed(&p, stream, split), 0);
    assert_int_equal(sse_feed(&p, stream + split, n - split), 0);
    sse_free(&p);
}

static void test_sdk_stream(void **state)
{
    /* the shape the TypeScript SDK writes: priming event, then messages */
    const char *stream = "id: prime\ndata: \n\n"
                         "event: message\nid: e1\ndata: {\"method\":\"notifications/progress\"}\n\n"
                         "event: message\nid: e2\ndata: {\"result\":{},\"id\":1}\n\n";
    const char *want = "[|prime|][message|e1|{\"method\":\"notifications/progress\"}]"
                       "[message|e2|{\"result\":{},\"id\":1}]";
    for (size_t split = 0; split <= strlen(stream); split++) {
        seen_t s;
        feed_split(stream, split, &s, 0);
        assert_string_equal(s.log, want);
    }
}

static void test_line_endings_and_fields(void **state)
{
    const char *stream = ": comment\r\nretry: 1000\r\ndata:a\r\ndata: b\r\n\r\n"
                         "data\rdata: c\r\r"
                         "event: x\nunknown: y\ndata:  two spaces\n\n"
                         "event: lonely\n\n";
    const char *want = "[|-|a\nb][|-|\nc][x|-| two spaces]";
    for (size_t split = 0; split <= strlen(stream); split++) {
        seen_t s;
        feed_split(stream, split, &s, 0);
        assert_string_equal(s.log, want);
    }
}

static void test_incomplete_event_not_dispatched(void **state)
{
    seen_t s;
    feed_split("data: partial\n", 3, &s, 0);
    assert_int_equal(s.n, 0);
}

static void test_oversized_event_skipped(void **state)
{
    char stream[400];
    memset(stream, 0, sizeof(stream));
    strcat(stream, "data: ");
    memset(stream + 6, 'x', 200);
    strcat(stream, "\n\ndata: small\n\n");
    seen_t s;
    feed_split(stream, 50, &s, 64);
    assert_string_equal(s.log, "[|-|small]");
}

static void test_byte_order_mark(void **state)
{
    /* one BOM at the start of the stream is skipped, however the bytes are split; a second
     * one, or one later on, is part of the field name and so hides nothing else */
    const char *stream = "\xEF\xBB\xBF"
                         "data: {\"id\":1}\n\n"
                         "\xEF\xBB\xBF"
                         "data: x\n\ndata: y\n\n";
    for (size_t split = 0; split <= strlen(stream); split++) {
        seen_t s;
        feed_split(stream, split, &s, 0);
        assert_string_equal(s.log, "[|-|{\"id\":1}][|-|y]");
    }
    /* bytes that only begin like a BOM are kept */
    const char *almost = "\xEF\xBB"
                         "data: z\n\ndata: w\n\n";
    for (size_t split = 0; split <= strlen(almost); split++) {
        seen_t s;
        feed_split(almost, split, &s, 0);
        assert_string_equal(s.log, "[|-|w]");
    }
}

static int stop_at_first(const sse_event_t *ev, void *arg)
{
    (*(int *)arg)++;
    return 7;
}

static void test_callback_stops(void **state)
{
    int calls = 0;
    sse_parser_t p;
    sse_init(&p, 0, stop_at_first, &calls);
    assert_int_equal(sse_feed(&p, "data: 1\n\ndata: 2\n\n", 18), 7);
    assert_int_equal(calls, 1);
    sse_free(&p);
}

typedef struct ends {
    size_t at[8];
    int n;
    sse_parser_t *p;
} ends_t;

static int record_end(const sse_event_t *ev, void *arg)
{
    ends_t *e = arg;
    e->at[e->n++] = e->p->consumed;
    return 0;
}

/* consumed tells where in the current feed an event ends: resumption starts there */
static void test_event_end_offsets(void **state)
{
    const char *s = "id: a\ndata: 1\n\nid: b\r\ndata: 2\r\n\r\n: c\n";
    ends_t e = {{0}, 0, NULL};
    sse_parser_t p;
    e.p = &p;
    sse_init(&p, 0, record_end, &e);
    assert_int_equal(sse_feed(&p, s, strlen(s)), 0);
    assert_int_equal(e.n, 2);
    assert_int_equal(e.at[0], strlen("id: a\ndata: 1\n\n"));
    assert_int_equal(e.at[1], strlen("id: a\ndata: 1\n\nid: b\r\ndata: 2\r\n\r\n"));
    sse_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sdk_stream),
        cmocka_unit_test(test_line_endings_and_fields),
        cmocka_unit_test(test_incomplete_event_not_dispatched),
        cmocka_unit_test(test_oversized_event_skipped),
        cmocka_unit_test(test_byte_order_mark),
        cmocka_unit_test(test_callback_stops),
        cmocka_unit_test(test_event_end_offsets),
    };
    return cmocka_run_group_tests_name("sse", tests, NULL, NULL);
}
