/* The socket reader: what arrives on a plain socket reaches the bufferevent's input and its
 * read callback in reads of up to 16 KiB (libevent's own take 4 KiB and an ioctl each), the high
 * watermark stops and restarts reading, the end of the stream and a reset reach the event
 * callback as the bufferevent's own reading reports them, and a callback may free everything. */
#include "sock_reader.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

/* One connection under test: the bufferevent over one end, the reader, the peer's end. */
typedef struct {
    struct event_base *base;
    struct bufferevent *bev;
    sock_reader_t *rd;
    int peer;
    int reads;       /* read callbacks */
    short events;    /* the last event callback's flags */
    int event_calls; /* event callbacks */
    int err;         /* errno in the last event callback */
    size_t seen;     /* input length at the last read callback */
    bool free_in_cb; /* the read callback frees the reader and the bufferevent */
    bool drain_in_cb;
} rig_t;

static void on_read(struct bufferevent *bev, void *arg)
{
    rig_t *t = arg;
    t->reads++;
    t->seen = evbuffer_get_length(bufferevent_get_input(bev));
    if (t->drain_in_cb)
        evbuffer_drain(bufferevent_get_input(bev), t->seen);
    if (t->free_in_cb) {
        sock_reader_free(t->rd);
        bufferevent_free(bev);
        t->rd = NULL;
        t->bev = NULL;
    }
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    rig_t *t = arg;
    t->events = what;
    t->event_calls++;
    t->err = EVUTIL_SOCKET_ERROR();
}

/* fds[0] is read by the rig, fds[1] is the peer. */
static void rig_open(rig_t *t, int fds[2])
{
    memset(t, 0, sizeof(*t));
    t->base = event_base_new();
    evutil_make_socket_nonblocking(fds[0]);
    t->bev = bufferevent_socket_new(t->base, fds[0], BEV_OPT_CLOSE_ON_FREE);
    bufferevent_setcb(t->bev, on_read, NULL, on_event, t);
    t->rd = sock_reader_new(t->bev);
    assert_non_null(t->rd);
    t->peer = fds[1];
}

static void rig_unix(rig_t *t)
{
    int fds[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    rig_open(t, fds);
}

static void rig_close(rig_t *t)
{
    sock_reader_free(t->rd);
    if (t->bev)
        bufferevent_free(t->bev);
    if (t->peer >= 0)
        close(t->peer);
    event_base_free(t->base);
}

/* Runs the loop without blocking until nothing more is ready (bounded). */
static void settle(rig_t *t)
{
    for (int i = 0; i < 20; i++)
        event_base_loop(t->base, EVLOOP_NONBLOCK);
}

/* Runs the loop until the read callbacks reach n (bounded). */
static void run_until_reads(rig_t *t, int n)
{
    for (int i = 0; i < 1000 && t->reads < n; i++)
        event_base_loop(t->base, EVLOOP_ONCE);
}

static void peer_write(rig_t *t, size_t len, char byte)
{
    char buf[4096];
    memset(buf, byte, sizeof(buf));
    while (len > 0) {
        size_t n = len < sizeof(buf) ? len : sizeof(buf);
        assert_int_equal(write(t->peer, buf, n), (ssize_t)n);
        len -= n;
    }
}

static void bytes_reach_the_input_and_the_read_callback(void **state)
{
    rig_t t;
    rig_unix(&t);
    sock_reader_enable(t.rd, true);
    assert_int_equal(write(t.peer, "hello", 5), 5);
    run_until_reads(&t, 1);
    assert_int_equal(t.reads, 1);
    char got[8] = "";
    assert_int_equal(evbuffer_remove(bufferevent_get_input(t.bev), got, sizeof(got)), 5);
    assert_memory_equal(got, "hello", 5);
    /* the bufferevent's own reading stays off: the reader is the only one */
    assert_false(bufferevent_get_enabled(t.bev) & EV_READ);
    assert_true(sock_is_reading(t.bev, t.rd));
    rig_close(&t);
}

/* 12 KiB waiting is one read: libevent's own reading takes 4 KiB at a time. */
static void one_read_takes_up_to_16_kib(void **state)
{
    rig_t t;
    rig_unix(&t);
    peer_write(&t, 12288, 'a');
    sock_reader_enable(t.rd, true);
    run_until_reads(&t, 1);
    assert_int_equal(t.seen, 12288);
    /* more than a chunk: the first read stops at the chunk */
    t.drain_in_cb = true;
    peer_write(&t, SOCK_READER_CHUNK + 100, 'b');
    run_until_reads(&t, 2);
    assert_int_equal(t.seen, 12288 + SOCK_READER_CHUNK);
    run_until_reads(&t, 3);
    assert_int_equal(t.seen, 100);
    rig_close(&t);
}

static void a_disabled_reader_reads_nothing(void **state)
{
    rig_t t;
    rig_unix(&t);
    assert_false(sock_reader_enabled(t.rd));
    assert_int_equal(write(t.peer, "x", 1), 1);
    settle(&t);
    assert_int_equal(t.reads, 0);
    sock_reader_enable(t.rd, true);
    sock_reader_enable(t.rd, false);
    settle(&t);
    assert_int_equal(t.reads, 0);
    sock_reading(t.bev, t.rd, true);
    run_until_reads(&t, 1);
    assert_int_equal(t.reads, 1);
    assert_int_equal(t.seen, 1);
    rig_close(&t);
}

/* Reading stops at the high watermark, reads no more than fills it, and starts again once a
 * consumer drained the input below it. */
static void the_high_watermark_stops_and_restarts_reading(void **state)
{
    rig_t t;
    rig_unix(&t);
    sock_read_high(t.bev, t.rd, 1000);
    sock_reader_enable(t.rd, true);
    peer_write(&t, 5000, 'w');
    run_until_reads(&t, 1);
    settle(&t);
    assert_int_equal(t.reads, 1);
    assert_int_equal(evbuffer_get_length(bufferevent_get_input(t.bev)), 1000);
    evbuffer_drain(bufferevent_get_input(t.bev), 600);
    run_until_reads(&t, 2);
    settle(&t);
    assert_int_equal(t.reads, 2);
    assert_int_equal(evbuffer_get_length(bufferevent_get_input(t.bev)), 1000);
    /* no limit: the rest at once */
    sock_read_high(t.bev, t.rd, 0);
    run_until_reads(&t, 3);
    assert_int_equal(evbuffer_get_length(bufferevent_get_input(t.bev)), 5000 - 600);
    rig_close(&t);
}

static void the_end_of_the_stream_is_reading_eof(void **state)
{
    rig_t t;
    rig_unix(&t);
    sock_reader_enable(t.rd, true);
    assert_int_equal(write(t.peer, "last", 4), 4);
    close(t.peer);
    t.peer = -1;
    for (int i = 0; i < 1000 && t.event_calls == 0; i++)
        event_base_loop(t.base, EVLOOP_ONCE);
    assert_int_equal(t.reads, 1);
    assert_int_equal(t.event_calls, 1);
    assert_int_equal(t.events, BEV_EVENT_READING | BEV_EVENT_EOF);
    /* reading stopped, as a bufferevent stops at the end of its stream */
    assert_false(sock_reader_enabled(t.rd));
    settle(&t);
    assert_int_equal(t.event_calls, 1);
    rig_close(&t);
}

/* A reset (a TCP peer closing with unread data and SO_LINGER 0) is a read error. */
static void a_reset_is_a_reading_error(void **state)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(lfd, 1), 0);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&sa, &sl), 0);
    int fds[2];
    fds[1] = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(connect(fds[1], (struct sockaddr *)&sa, sizeof(sa)), 0);
    fds[0] = accept(lfd, NULL, NULL);
    assert_true(fds[0] >= 0);
    close(lfd);
    rig_t t;
    rig_open(&t, fds);
    sock_reader_enable(t.rd, true);
    struct linger lg = {1, 0};
    assert_int_equal(setsockopt(t.peer, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
    close(t.peer);
    t.peer = -1;
    for (int i = 0; i < 1000 && t.event_calls == 0; i++)
        event_base_loop(t.base, EVLOOP_ONCE);
    assert_int_equal(t.events, BEV_EVENT_READING | BEV_EVENT_ERROR);
    assert_int_equal(t.err, ECONNRESET);
    assert_false(sock_reader_enabled(t.rd));
    rig_close(&t);
}

/* The read callback may free the reader and the bufferevent (the sanitizer build checks that
 * nothing is touched afterwards). */
static void the_read_callback_may_free_everything(void **state)
{
    rig_t t;
    rig_unix(&t);
    t.free_in_cb = true;
    sock_reader_set_high(t.rd, 100);
    sock_reader_enable(t.rd, true);
    peer_write(&t, 300, 'f');
    run_until_reads(&t, 1);
    assert_int_equal(t.reads, 1);
    assert_null(t.bev);
    settle(&t);
    assert_int_equal(t.reads, 1);
    rig_close(&t);
}

/* Without a reader (a TLS connection) the switch is the bufferevent's own. */
static void without_a_reader_the_bufferevent_reads(void **state)
{
    rig_t t;
    rig_unix(&t);
    sock_reader_free(t.rd);
    t.rd = NULL;
    sock_reading(t.bev, NULL, true);
    assert_true(bufferevent_get_enabled(t.bev) & EV_READ);
    assert_true(sock_is_reading(t.bev, NULL));
    assert_int_equal(write(t.peer, "tls", 3), 3);
    run_until_reads(&t, 1);
    assert_int_equal(t.seen, 3);
    sock_reading(t.bev, NULL, false);
    assert_false(sock_is_reading(t.bev, NULL));
    rig_close(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bytes_reach_the_input_and_the_read_callback),
        cmocka_unit_test(one_read_takes_up_to_16_kib),
        cmocka_unit_test(a_disabled_reader_reads_nothing),
        cmocka_unit_test(the_high_watermark_stops_and_restarts_reading),
        cmocka_unit_test(the_end_of_the_stream_is_reading_eof),
        cmocka_unit_test(a_reset_is_a_reading_error),
        cmocka_unit_test(the_read_callback_may_free_everything),
        cmocka_unit_test(without_a_reader_the_bufferevent_reads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
