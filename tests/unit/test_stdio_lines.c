/* The stdio server's stdout as lines (src/net/stdio_lines.c): what reaches the message router
 * (stdio_child_message, faked here, so upstream_stdio.c is not linked) from bytes as a pipe
 * gives them: several lines in one read, a line in pieces, CRLF, blank and broken lines,
 * batches, a line over the limit (skipped, the answer it held failed by its id), and a last
 * line written without its newline. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <jansson.h>

#include "stdio_int.h"

/* --- the router, faked: what it was given --- */

#define MAX_SEEN 16
static char *seen[MAX_SEEN];
static int n_seen;
static uint64_t lost[MAX_SEEN];
static int n_lost;
static bool lost_answer = true; /* what stdio_answer_lost says */

void stdio_child_message(child_t *c, json_t *msg)
{
    (void)c;
    assert_true(n_seen < MAX_SEEN);
    seen[n_seen++] = json_dumps(msg, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
}

bool stdio_answer_lost(child_t *c, uint64_t gid)
{
    (void)c;
    assert_true(n_lost < MAX_SEEN);
    lost[n_lost++] = gid;
    return lost_answer;
}

/* --- a child whose stdout is a socket pair the test writes into --- */

typedef struct {
    struct event_base *base;
    stdio_up_t up;
    child_t c;
    int fds[2];
} rig_t;

static int setup(void **state)
{
    rig_t *r = calloc(1, sizeof(*r));
    r->base = event_base_new();
    r->up.base = r->base;
    r->up.label = "t";
    r->up.max_line = 256;
    r->c.up = &r->up;
    r->c.pid = 42;
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, r->fds) != 0)
        return -1;
    r->c.out = bufferevent_socket_new(r->base, r->fds[0], BEV_OPT_CLOSE_ON_FREE);
    /* the test puts bytes in the input itself, as a read would (never enabled: no reads) */
    evbuffer_unfreeze(bufferevent_get_input(r->c.out), 0);
    n_seen = n_lost = 0;
    lost_answer = true;
    *state = r;
    return 0;
}

static int teardown(void **state)
{
    rig_t *r = *state;
    if (r->c.out)
        bufferevent_free(r->c.out);
    if (r->c.unended)
        event_free(r->c.unended);
    close(r->fds[1]);
    event_base_free(r->base);
    free(r);
    for (int i = 0; i < n_seen; i++)
        free(seen[i]);
    return 0;
}

/* bytes as one read of the pipe gives them */
static void feed(rig_t *r, const char *bytes, size_t len)
{
    evbuffer_add(bufferevent_get_input(r->c.out), bytes, len);
    stdio_lines_read(r->c.out, &r->c);
}

static void feeds(rig_t *r, const char *s)
{
    feed(r, s, strlen(s));
}

static size_t held(rig_t *r)
{
    return evbuffer_get_length(bufferevent_get_input(r->c.out));
}

static void lines_in_one_read_and_in_pieces(void **state)
{
    rig_t *r = *state;
    feeds(r, "{\"id\":1,\"result\":{}}\n{\"id\":2,\"result\":{}}\n{\"id\":3,");
    assert_int_equal(n_seen, 2);
    assert_string_equal(seen[0], "{\"id\":1,\"result\":{}}");
    assert_string_equal(seen[1], "{\"id\":2,\"result\":{}}");
    assert_int_equal(held(r), strlen("{\"id\":3,"));
    feeds(r, "\"result\":");
    assert_int_equal(n_seen, 2);
    feeds(r, "{}}\n");
    assert_int_equal(n_seen, 3);
    assert_string_equal(seen[2], "{\"id\":3,\"result\":{}}");
    assert_int_equal(held(r), 0);
}

static void crlf_blank_and_broken_lines(void **state)
{
    rig_t *r = *state;
    feeds(r, "{\"a\":1}  \r\n\n \r\nnot json at all\n{\"a\":2}\n");
    assert_int_equal(n_seen, 2);
    assert_string_equal(seen[0], "{\"a\":1}");
    assert_string_equal(seen[1], "{\"a\":2}");
    /* a key twice is refused as JSON, and the line after it still goes */
    feeds(r, "{\"id\":1,\"id\":2}\n[1]\n");
    assert_int_equal(n_seen, 3);
    assert_string_equal(seen[2], "1");
    assert_int_equal(n_lost, 0);
}

static void a_batch_line_is_each_of_its_messages(void **state)
{
    rig_t *r = *state;
    feeds(r, "[{\"id\":1,\"result\":1},{\"method\":\"notifications/x\"}]\n");
    assert_int_equal(n_seen, 2);
    assert_string_equal(seen[0], "{\"id\":1,\"result\":1}");
    assert_string_equal(seen[1], "{\"method\":\"notifications/x\"}");
}

/* A line of n bytes of JSON whose id is id, written first or last. */
static char *long_answer(size_t n, int id, bool id_first)
{
    char *s = malloc(n + 2);
    size_t at = 0;
    if (id_first)
        at += (size_t)sprintf(s, "{\"id\":%d,\"result\":\"", id);
    else
        at += (size_t)sprintf(s, "{\"result\":\"");
    char tail[40];
    int tlen = id_first ? sprintf(tail, "\"}") : sprintf(tail, "\",\"id\":%d}", id);
    while (at < n - (size_t)tlen)
        s[at++] = 'x';
    memcpy(s + at, tail, (size_t)tlen);
    at += (size_t)tlen;
    s[at++] = '\n';
    s[at] = '\0';
    return s;
}

static void an_over_long_line_fails_its_answer_by_the_id_at_its_end(void **state)
{
    rig_t *r = *state;
    char *s = long_answer(1000, 7, false);
    /* in pieces: the first has no newline and is already over the limit */
    feed(r, s, 300);
    assert_true(r->c.skipping);
    feed(r, s + 300, 300);
    feeds(r, s + 600);
    free(s);
    assert_false(r->c.skipping);
    assert_int_equal(n_seen, 0);
    assert_int_equal(n_lost, 1);
    assert_int_equal(lost[0], 7);
    /* what follows is read as before */
    feeds(r, "{\"id\":8,\"result\":{}}\n");
    assert_int_equal(n_seen, 1);
    assert_string_equal(seen[0], "{\"id\":8,\"result\":{}}");
}

static void an_over_long_line_fails_its_answer_by_the_id_at_its_start(void **state)
{
    rig_t *r = *state;
    char *s = long_answer(600, 12, true);
    feeds(r, s); /* whole, newline and all, in one read */
    free(s);
    assert_int_equal(n_seen, 0);
    assert_int_equal(n_lost, 1);
    assert_int_equal(lost[0], 12);
    assert_int_equal(held(r), 0);
}

static void an_over_long_line_without_an_id_fails_nothing(void **state)
{
    rig_t *r = *state;
    char big[700];
    memset(big, 'y', sizeof(big));
    big[sizeof(big) - 1] = '\n';
    feed(r, big, sizeof(big));
    feeds(r, "{\"method\":\"m\"}\n");
    assert_int_equal(n_lost, 0);
    assert_int_equal(n_seen, 1);
    assert_string_equal(seen[0], "{\"method\":\"m\"}");
}

/* The loop runs until nothing is left to wait for: the pause after an unended line is the
 * only event, so this returns once it has been handled. */
static void run_out(rig_t *r)
{
    assert_int_equal(event_base_dispatch(r->base), 1);
}

static void a_whole_message_without_its_newline_is_taken_after_a_pause(void **state)
{
    rig_t *r = *state;
    feeds(r, "{\"id\":4,\"result\":{}}");
    assert_int_equal(n_seen, 0);
    run_out(r);
    assert_int_equal(n_seen, 1);
    assert_string_equal(seen[0], "{\"id\":4,\"result\":{}}");
    assert_int_equal(held(r), 0);
    /* the next line is a line of its own */
    feeds(r, "{\"id\":5,\"result\":{}}\n");
    assert_int_equal(n_seen, 2);
}

static void a_part_of_a_message_waits_for_the_rest(void **state)
{
    rig_t *r = *state;
    feeds(r, "{\"id\":4,\"result\":{");
    run_out(r);
    assert_int_equal(n_seen, 0);
    assert_int_equal(held(r), strlen("{\"id\":4,\"result\":{"));
    feeds(r, "}}\n");
    assert_int_equal(n_seen, 1);
    assert_string_equal(seen[0], "{\"id\":4,\"result\":{}}");
}

static void a_gone_child_reads_nothing(void **state)
{
    rig_t *r = *state;
    r->c.gone = true;
    feeds(r, "{\"id\":1,\"result\":{}}\n");
    assert_int_equal(n_seen, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(lines_in_one_read_and_in_pieces, setup, teardown),
        cmocka_unit_test_setup_teardown(crlf_blank_and_broken_lines, setup, teardown),
        cmocka_unit_test_setup_teardown(a_batch_line_is_each_of_its_messages, setup, teardown),
        cmocka_unit_test_setup_teardown(an_over_long_line_fails_its_answer_by_the_id_at_its_end,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(an_over_long_line_fails_its_answer_by_the_id_at_its_start,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(an_over_long_line_without_an_id_fails_nothing, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(a_whole_message_without_its_newline_is_taken_after_a_pause,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(a_part_of_a_message_waits_for_the_rest, setup, teardown),
        cmocka_unit_test_setup_teardown(a_gone_child_reads_nothing, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
