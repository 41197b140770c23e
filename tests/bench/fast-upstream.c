/* A fast fixed-answer MCP upstream for the benchmarks: one thread, epoll, HTTP/1.1 keep-alive.
 *
 *   fast-upstream PORT [SSE_INTERVAL_US]
 *
 * Every POST gets a JSON-RPC tools/call result, echoing the request's "id" (parsed minimally).
 * Two tool names switch to an SSE response (text/event-stream):
 *   "stream..."  100 notifications/progress events, SSE_INTERVAL_US apart (default 1000), then
 *                the result. Each event's message is "ts=<CLOCK_REALTIME in ns>" written just
 *                before the event is sent, so a receiver computes upstream-write -> receipt.
 *   "hold..."    one progress event, then the stream stays open until the client closes it.
 * Any other request (GET, DELETE) gets 405 with Content-Length: 0. */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RBUF 65536
#define EVENTS 100

typedef struct conn {
    int fd;
    size_t len;
    int sse;           /* 0 none, 1 streaming events, 2 holding */
    int sent;          /* progress events sent */
    uint64_t next_ns;  /* when the next event is due */
    char id[64];
    struct conn *next; /* list of streaming connections */
    char buf[RBUF];
} conn_t;

static conn_t *streaming;
static uint64_t interval_ns = 1000000;

static uint64_t now_ns(int clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Best effort: a benchmark client that cannot keep up just loses the connection. */
static int send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
            continue;
        }
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void close_conn(int ep, conn_t *c)
{
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    for (conn_t **pp = &streaming; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    free(c);
}

/* The id's raw JSON text (number or string), or "1". */
static void find_id(const char *body, size_t len, char *out, size_t outsz)
{
    const char *p = memmem(body, len, "\"id\"", 4);
    snprintf(out, outsz, "1");
    if (!p)
        return;
    p += 4;
    const char *end = body + len;
    while (p < end && (*p == ' ' || *p == ':'))
        p++;
    const char *s = p;
    if (p < end && *p == '"') {
        p++;
        while (p < end && *p != '"')
            p += (*p == '\\') ? 2 : 1;
        p++;
    } else {
        while (p < end && *p != ',' && *p != '}' && *p != ' ')
            p++;
    }
    if (p > end || p - s <= 0 || (size_t)(p - s) >= outsz)
        return;
    memcpy(out, s, (size_t)(p - s));
    out[p - s] = 0;
}

static int handle_request(int ep, conn_t *c, const char *head, size_t hlen, const char *body,
                          size_t blen)
{
    static const char result_fmt[] =
        "{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"ok\"}]}}";
    char out[1024], json[256];
    find_id(body, blen, c->id, sizeof(c->id));
    if (hlen < 5 || memcmp(head, "POST ", 5) != 0) {
        static const char r405[] = "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n";
        return send_all(c->fd, r405, sizeof(r405) - 1);
    }
    int sse = memmem(body, blen, "\"name\":\"stream", 14) ? 1
              : memmem(body, blen, "\"name\":\"hold", 12) ? 2
                                                         : 0;
    if (!sse) {
        int jn = snprintf(json, sizeof(json), result_fmt, c->id);
        int n = snprintf(out, sizeof(out),
                         "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         "Content-Length: %d\r\nConnection: keep-alive\r\n\r\n%s",
                         jn, json);
        return send_all(c->fd, out, (size_t)n);
    }
    static const char sse_head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                   "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n"
                                   "Transfer-Encoding: chunked\r\n\r\n";
    (void)ep;
    if (send_all(c->fd, sse_head, sizeof(sse_head) - 1) < 0)
        return -1;
    c->sse = sse;
    c->sent = 0;
    c->next_ns = now_ns(CLOCK_MONOTONIC);
    c->next = streaming;
    streaming = c;
    return 0;
}

/* Events go out as chunks; written here so the timestamp is taken right before the write. */
static int sse_tick(conn_t *c)
{
    char chunk[600], ev[512];
    int n;
    if (c->sent < (c->sse == 2 ? 1 : EVENTS)) {
        n = snprintf(ev, sizeof(ev),
                     "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\","
                     "\"params\":{\"progressToken\":%s,\"progress\":%d,\"total\":%d,"
                     "\"message\":\"ts=%llu\"}}\n\n",
                     c->id, c->sent + 1, EVENTS, (unsigned long long)now_ns(CLOCK_REALTIME));
        c->sent++;
        int m = snprintf(chunk, sizeof(chunk), "%x\r\n%.*s\r\n", n, n, ev);
        return send_all(c->fd, chunk, (size_t)m);
    }
    if (c->sse == 2)
        return 0; /* hold: nothing more until the client leaves */
    n = snprintf(ev, sizeof(ev),
                 "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":"
                 "[{\"type\":\"text\",\"text\":\"ok\"}]}}\n\n",
                 c->id);
    int m = snprintf(chunk, sizeof(chunk), "%x\r\n%.*s\r\n0\r\n\r\n", n, n, ev);
    c->sse = 0;
    for (conn_t **pp = &streaming; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    return send_all(c->fd, chunk, (size_t)m);
}

/* Parses as many complete requests as the buffer holds. -1: close. */
static int on_readable(int ep, conn_t *c)
{
    for (;;) {
        ssize_t r = recv(c->fd, c->buf + c->len, RBUF - c->len, 0);
        if (r == 0)
            return -1;
        if (r < 0)
            return (errno == EAGAIN || errno == EINTR) ? 0 : -1;
        c->len += (size_t)r;
        for (;;) {
            char *eoh = memmem(c->buf, c->len, "\r\n\r\n", 4);
            if (!eoh) {
                if (c->len == RBUF)
                    return -1;
                break;
            }
            size_t hlen = (size_t)(eoh - c->buf) + 4, blen = 0;
            for (char *p = c->buf; p < eoh; p++) {
                if ((*p == 'C' || *p == 'c') && strncasecmp(p, "content-length:", 15) == 0) {
                    blen = strtoul(p + 15, NULL, 10);
                    break;
                }
            }
            if (hlen + blen > RBUF)
                return -1;
            if (c->len < hlen + blen)
                break;
            if (handle_request(ep, c, c->buf, hlen, c->buf + hlen, blen) < 0)
                return -1;
            memmove(c->buf, c->buf + hlen + blen, c->len - hlen - blen);
            c->len -= hlen + blen;
        }
        if ((size_t)r < RBUF)
            return 0;
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: fast-upstream PORT [SSE_INTERVAL_US]\n");
        return 2;
    }
    if (argc > 2)
        interval_ns = strtoull(argv[2], NULL, 10) * 1000;
    signal(SIGPIPE, SIG_IGN);
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 4096) < 0) {
        perror("fast-upstream: bind/listen");
        return 1;
    }
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    printf("fast-upstream listening on 127.0.0.1:%s\n", argv[1]);
    fflush(stdout);
    struct epoll_event evs[256];
    for (;;) {
        int timeout = -1;
        if (streaming) {
            uint64_t now = now_ns(CLOCK_MONOTONIC), due = UINT64_MAX;
            for (conn_t *c = streaming; c; c = c->next)
                if (c->sse == 1 || c->sent == 0)
                    due = c->next_ns < due ? c->next_ns : due;
            if (due != UINT64_MAX)
                timeout = due <= now ? 0 : (int)((due - now + 999999) / 1000000);
        }
        int n = epoll_wait(ep, evs, 256, timeout);
        for (int i = 0; i < n; i++) {
            conn_t *c = evs[i].data.ptr;
            if (!c) {
                int fd;
                while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
                    conn_t *nc = calloc(1, sizeof(*nc));
                    nc->fd = fd;
                    struct epoll_event cev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = nc};
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev);
                }
                continue;
            }
            if ((evs[i].events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP)) && !(evs[i].events & EPOLLIN)) {
                close_conn(ep, c);
                continue;
            }
            if (on_readable(ep, c) < 0)
                close_conn(ep, c);
        }
        if (streaming) {
            uint64_t now = now_ns(CLOCK_MONOTONIC);
            conn_t *c = streaming, *next;
            for (; c; c = next) {
                next = c->next;
                if ((c->sse == 2 && c->sent > 0) || c->next_ns > now)
                    continue;
                c->next_ns += interval_ns;
                if (sse_tick(c) < 0)
                    close_conn(ep, c);
            }
        }
    }
}
