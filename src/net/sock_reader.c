/* A plain socket read by an event of its own into its bufferevent's input (see sock_reader.h
 * for why). One readv per readable event, into the space the input has reserved: what is in
 * its last chain, and a new chain when that is short. */
#include "sock_reader.h"

#include "util.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <stdlib.h>
#include <sys/uio.h>

struct sock_reader {
    struct bufferevent *bev;
    struct event *ev;             /* EV_READ | EV_PERSIST on the bufferevent's socket */
    struct evbuffer_cb_entry *wm; /* on the input while a high watermark is set */
    size_t high;                  /* 0: no limit */
    bool on;                      /* reading wanted */
    bool added;                   /* ev added: wanted, and the input below the watermark */
};

static bool below_high(const sock_reader_t *r)
{
    return r->high == 0 || evbuffer_get_length(bufferevent_get_input(r->bev)) < r->high;
}

/* The event added exactly when reading is wanted and the input has room. */
static void update(sock_reader_t *r)
{
    bool want = r->on && below_high(r);
    if (want == r->added)
        return;
    if (want)
        event_add(r->ev, NULL);
    else
        event_del(r->ev);
    r->added = want;
}

/* The input changed: a consumer drained it below the watermark, or a read filled it. */
static void input_changed(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
    (void)buf;
    (void)info;
    update(arg);
}

/* One read of at most want bytes into the input. Returns what readv returned. */
static ssize_t read_into(sock_reader_t *r, size_t want)
{
    struct evbuffer *in = bufferevent_get_input(r->bev);
    struct evbuffer_iovec v[2];
    /* a socket bufferevent freezes the end of its input for all but itself */
    evbuffer_unfreeze(in, 0);
    int nv = evbuffer_reserve_space(in, (ev_ssize_t)want, v, 2);
    if (nv <= 0) {
        evbuffer_freeze(in, 0);
        errno = ENOMEM;
        return -1;
    }
    struct iovec iov[2];
    size_t left = want;
    int used = 0;
    for (; used < nv && left > 0; used++) {
        iov[used].iov_base = v[used].iov_base;
        iov[used].iov_len = v[used].iov_len < left ? v[used].iov_len : left;
        left -= iov[used].iov_len;
    }
    ssize_t n = readv(event_get_fd(r->ev), iov, used);
    if (n > 0) {
        size_t got = (size_t)n;
        int filled = 0;
        for (; filled < used && got > 0; filled++) {
            v[filled].iov_len = got < iov[filled].iov_len ? got : iov[filled].iov_len;
            got -= v[filled].iov_len;
        }
        evbuffer_commit_space(in, v, filled);
    }
    evbuffer_freeze(in, 0);
    return n;
}

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sock_reader_t *r = arg;
    struct bufferevent *bev = r->bev;
    size_t want = SOCK_READER_CHUNK;
    if (r->high) {
        size_t len = evbuffer_get_length(bufferevent_get_input(bev));
        if (len >= r->high) {
            update(r);
            return;
        }
        if (r->high - len < want)
            want = r->high - len;
    }
    ssize_t n = read_into(r, want);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    bufferevent_data_cb readcb;
    bufferevent_event_cb eventcb;
    void *ctx;
    bufferevent_getcb(bev, &readcb, NULL, &eventcb, &ctx);
    if (n > 0) {
        if (readcb)
            readcb(bev, ctx); /* last: it may free the reader */
        return;
    }
    /* the end of the stream, or an error: no more reading, as a bufferevent stops */
    int saved = errno;
    r->on = false;
    update(r);
    errno = saved;
    if (eventcb)
        eventcb(bev, (short)(BEV_EVENT_READING | (n == 0 ? BEV_EVENT_EOF : BEV_EVENT_ERROR)), ctx);
}

sock_reader_t *sock_reader_new(struct bufferevent *bev)
{
    sock_reader_t *r = xcalloc(1, sizeof(*r));
    r->bev = bev;
    r->ev = event_new(bufferevent_get_base(bev), bufferevent_getfd(bev), EV_READ | EV_PERSIST,
                      on_readable, r);
    if (!r->ev) {
        free(r);
        return NULL;
    }
    return r;
}

void sock_reader_enable(sock_reader_t *r, bool on)
{
    r->on = on;
    update(r);
}

bool sock_reader_enabled(const sock_reader_t *r)
{
    return r->on;
}

void sock_reader_set_high(sock_reader_t *r, size_t high)
{
    struct evbuffer *in = bufferevent_get_input(r->bev);
    if (high && !r->wm)
        r->wm = evbuffer_add_cb(in, input_changed, r);
    else if (!high && r->wm) {
        evbuffer_remove_cb_entry(in, r->wm);
        r->wm = NULL;
    }
    r->high = high;
    update(r);
}

void sock_reader_free(sock_reader_t *r)
{
    if (!r)
        return;
    if (r->wm)
        evbuffer_remove_cb_entry(bufferevent_get_input(r->bev), r->wm);
    event_free(r->ev);
    free(r);
}

void sock_reading(struct bufferevent *bev, sock_reader_t *r, bool on)
{
    if (r)
        sock_reader_enable(r, on);
    else if (on)
        bufferevent_enable(bev, EV_READ);
    else
        bufferevent_disable(bev, EV_READ);
}

bool sock_is_reading(struct bufferevent *bev, const sock_reader_t *r)
{
    return r ? r->on : (bufferevent_get_enabled(bev) & EV_READ) != 0;
}

void sock_read_high(struct bufferevent *bev, sock_reader_t *r, size_t high)
{
    if (r)
        sock_reader_set_high(r, high);
    else
        bufferevent_setwatermark(bev, EV_READ, 0, high);
}
