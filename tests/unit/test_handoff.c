/* The hand-off channel between workers, in one process standing in for two workers: the
 * owner table (who reads a session's streams), a socket and its bytes handed to a worker and
 * adopted from its loop, and the sends that cannot be made. The channel is process-wide state
 * made once, so the tests run in order: before the set-up, then after it. */
#include "handoff.h"
#include "log.h"

#include <event2/event.h>
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

static struct event_base *base;

/* What the adopting worker was given. */
static struct {
    int calls;
    int fd;
    char bytes[256];
    size_t len;
} adopted;

static void adopt(void *arg, int fd, const char *bytes, size_t len)
{
    assert_ptr_equal(arg, &adopted);
    adopted.calls++;
    adopted.fd = fd;
    adopted.len = len < sizeof(adopted.bytes) ? len : sizeof(adopted.bytes);
    memcpy(adopted.bytes, bytes, adopted.len);
}

/* Runs the loop until a socket has been adopted, or a bound of turns. */
static void run_until_adopted(int calls)
{
    for (int i = 0; i < 1000 && adopted.calls < calls; i++)
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
}

/* Without handoff_setup (one worker) there is no table and no channel: nothing is known,
 * nothing can be sent. */
static void before_setup_nothing_is_shared(void **state)
{
    handoff_note_stream("s1", true);
    assert_int_equal(handoff_owner("s1"), -1);
    int fds[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    assert_false(handoff_send(0, fds[0], "GET / HTTP/1.1\r\n\r\n", 18));
    close(fds[0]);
    close(fds[1]);
}

static void setup_two_workers(void **state)
{
    assert_int_equal(handoff_setup(2), 0);
    /* a worker's table is empty until it notes a stream */
    assert_int_equal(handoff_owner("s1"), -1);
}

/* The table says which worker reads a session's stream; a worker that stops reading clears
 * only its own entry. */
static void owners_are_noted_and_cleared(void **state)
{
    handoff_start(base, 0, adopt, &adopted);
    handoff_note_stream("session-a", true);
    assert_int_equal(handoff_owner("session-a"), 0);
    assert_int_equal(handoff_owner("session-b"), -1);
    assert_int_equal(handoff_owner(NULL), -1);
    handoff_note_stream(NULL, true); /* ignored */
    handoff_note_stream("session-a", false);
    assert_int_equal(handoff_owner("session-a"), -1);
    handoff_stop();

    /* worker 2 takes session-a's stream; worker 1's late "no longer" must not erase that */
    handoff_start(base, 1, adopt, &adopted);
    handoff_note_stream("session-a", true);
    assert_int_equal(handoff_owner("session-a"), 1);
    handoff_stop();
    handoff_start(base, 0, adopt, &adopted);
    handoff_note_stream("session-a", false);
    assert_int_equal(handoff_owner("session-a"), 1);
    handoff_stop();
}

enum { MANY = 3000 };

/* Worker w (0 or 1) notes (on) or clears each of the sessions many-N with N % 2 == w. */
static void note_many(bool on)
{
    char name[32];
    for (int w = 0; w < 2; w++) {
        handoff_start(base, w, adopt, &adopted);
        for (int i = w; i < MANY; i += 2) {
            snprintf(name, sizeof(name), "many-%d", i);
            handoff_note_stream(name, on);
        }
        handoff_stop();
    }
}

/* Many sessions held at once, some of whose hashes meet in the table: each keeps its own
 * owner (a session that lost its slot to another would have its resume served by a worker
 * that cannot map the answer's id back). */
static void many_sessions_keep_their_owners(void **state)
{
    char name[32];
    note_many(true);
    for (int i = 0; i < MANY; i++) {
        snprintf(name, sizeof(name), "many-%d", i);
        assert_int_equal(handoff_owner(name), i % 2);
    }
    note_many(false);
    for (int i = 0; i < MANY; i++) {
        snprintf(name, sizeof(name), "many-%d", i);
        assert_int_equal(handoff_owner(name), -1);
    }
}

/* Worker 1 notes (on) or clears the sessions PREFIX-0 .. PREFIX-(n-1). */
static void note_range(const char *prefix, int n, bool on)
{
    char name[32];
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof(name), "%s-%d", prefix, i);
        handoff_note_stream(name, on);
    }
}

/* A slot is cleared only when its worker sees the session idle, so sessions whose callers
 * left stay: a long-running gateway fills the table. A session that finds every slot it may
 * take held then takes the least recently noted one, not a live session's. */
static void a_full_table_gives_up_its_oldest_slots(void **state)
{
    enum { OLD = 40000, LIVE = 200, NEW = 2000 };
    char name[32];
    handoff_start(base, 0, adopt, &adopted);
    note_range("old", OLD, true); /* more than the table holds */
    note_range("live", LIVE, true);
    note_range("new", NEW, true);
    for (int i = 0; i < LIVE; i++) {
        snprintf(name, sizeof(name), "live-%d", i);
        assert_int_equal(handoff_owner(name), 0);
    }
    for (int i = 0; i < NEW; i++) {
        snprintf(name, sizeof(name), "new-%d", i);
        assert_int_equal(handoff_owner(name), 0);
    }
    note_range("old", OLD, false);
    note_range("live", LIVE, false);
    note_range("new", NEW, false);
    assert_int_equal(handoff_owner("live-0"), -1);
    handoff_stop();
}

/* A socket handed to worker 1 arrives from its loop with the bytes read of it, and is the
 * same connection: what the new owner writes reaches the agent. */
static void a_socket_is_handed_over(void **state)
{
    memset(&adopted, 0, sizeof(adopted));
    adopted.fd = -1;
    handoff_start(base, 0, adopt, &adopted);
    int agent[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, agent), 0);
    static const char req[] = "GET /mcp HTTP/1.1\r\nLast-Event-ID: 7\r\n\r\n";
    assert_true(handoff_send(0, agent[0], req, sizeof(req) - 1));
    close(agent[0]); /* the sender's copy: the connection lives on in the receiver's */
    assert_int_equal(adopted.calls, 0); /* adopted from the loop, not inside the send */
    run_until_adopted(1);
    assert_int_equal(adopted.calls, 1);
    assert_int_equal(adopted.len, sizeof(req) - 1);
    assert_memory_equal(adopted.bytes, req, adopted.len);
    assert_true(adopted.fd >= 0);
    assert_int_equal(write(adopted.fd, "resumed", 7), 7);
    close(adopted.fd);
    char got[16] = "";
    assert_int_equal(read(agent[1], got, sizeof(got)), 7);
    assert_memory_equal(got, "resumed", 7);
    close(agent[1]);
    handoff_stop();
}

/* Sends that cannot be made say so: no such worker, a request larger than a hand-off
 * carries, a receiver whose channel is full. */
static void sends_that_cannot_be_made_fail(void **state)
{
    int agent[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, agent), 0);
    assert_false(handoff_send(2, agent[0], "x", 1));
    assert_false(handoff_send(-1, agent[0], "x", 1));
    char *big = calloc(1, HANDOFF_MAX_BYTES + 1);
    assert_non_null(big);
    assert_false(handoff_send(0, agent[0], big, HANDOFF_MAX_BYTES + 1));

    /* worker 2 reads nothing here: its channel fills, and then a send fails at once rather
     * than block the sending worker's loop */
    FILE *logged = tmpfile();
    assert_non_null(logged);
    log_stream = logged;
    int sent = 0;
    while (sent < 1000 && handoff_send(1, agent[0], big, HANDOFF_MAX_BYTES))
        sent++;
    assert_true(sent < 1000);
    assert_false(handoff_send(1, agent[0], big, HANDOFF_MAX_BYTES));
    log_stream = NULL;
    rewind(logged);
    char line[512] = "";
    assert_non_null(fgets(line, sizeof(line), logged));
    fclose(logged);
    assert_non_null(strstr(line, "could not hand a resumed stream to worker 2"));
    free(big);
    close(agent[0]);
    close(agent[1]);
}

static int group_setup(void **state)
{
    base = event_base_new();
    return base ? 0 : -1;
}

static int group_teardown(void **state)
{
    handoff_stop();
    event_base_free(base);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(before_setup_nothing_is_shared),
        cmocka_unit_test(setup_two_workers),
        cmocka_unit_test(owners_are_noted_and_cleared),
        cmocka_unit_test(many_sessions_keep_their_owners),
        cmocka_unit_test(a_full_table_gives_up_its_oldest_slots),
        cmocka_unit_test(a_socket_is_handed_over),
        cmocka_unit_test(sends_that_cannot_be_made_fail),
    };
    return cmocka_run_group_tests_name("handoff", tests, group_setup, group_teardown);
}
