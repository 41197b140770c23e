#include "http_conn.h"
#include "http_parse.h"
#include "log.h"
#include "sock_reader.h"
#include "util.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* Output above this stops the upstream side (see proxy.c); drained fires below LOW. */
#define OUT_LOW_WATERMARK (64 * 1024)
/* How long a closing connection keeps discarding what the agent still sends. */
#define LINGER_MS 2000
/* Pipelined input waiting while a request is handled is bounded by this. */
#define IN_HIGH_WATERMARK (256 * 1024)

struct http_conn {
    uint64_t id;
    http_conn_state_t state;
    struct bufferevent *bev;
    sock_reader_t *rd; /* reads bev's socket; NULL for TLS (the bufferevent reads) */
    http_parser_t parser;
    const http_site_t *site;
    http_request_t *req;    /* the request being read */
    int fail_status;        /* set by a parser callback that refuses the request (413) */
    bool req_complete;      /* on_message_complete seen for req */
    struct event *timer;    /* idle, header or body deadline, by state */
    struct event *resume;   /* processes pipelined input after a response */
    struct event *flush_ev; /* writes output that no caller flushed, within this loop pass */
    bool flush_pending;
    void (*drained)(void *); /* observer of the current response */
    void (*gone)(void *);
    void *obs_arg;
    bool free_scheduled;
    bool lingering;  /* answer sent and write side shut: draining input, then close */
    bool adopted;    /* its request was handed over by another worker: that one is never handed on
                        again (the agent's later requests on the connection may be) */
    bool handed_off; /* given to another worker: close our copy, touch nothing */
    bool tls;        /* bev is an OpenSSL bufferevent (listen_tls) */
    bool first_pending;            /* no request begun yet: the header deadline runs from accept */
    uint64_t accepted_ms;          /* when the connection was accepted */
    X509 *peer_cert;               /* the verified client certificate, from the handshake */
    char peer[64];                 /* agent address, for X-Forwarded-For */
    struct http_conn *prev, *next; /* all agent connections, for drain */
};

const char *http_conn_state_str(http_conn_state_t st)
{
    switch (st) {
    case CONN_IDLE:
        return "idle";
    case CONN_READING:
        return "reading";
    case CONN_HANDLING:
        return "handling";
    case CONN_CLOSING:
        return "closing";
    }
    return "unknown";
}

void http_request_free(http_request_t *req)
{
    if (!req)
        return;
    free(req->method_name);
    free(req->target);
    free(req->routed_from);
    http_headers_free(&req->headers);
    if (req->body)
        evbuffer_free(req->body);
    X509_free(req->peer_cert);
    free(req);
}

static bool draining(const http_context_t *ctx)
{
    return ctx->draining && *ctx->draining;
}

static void set_state(http_conn_t *c, http_conn_state_t st)
{
    static const unsigned allowed[] = {
        [CONN_IDLE] = 1u << CONN_READING | 1u << CONN_CLOSING,
        [CONN_READING] = 1u << CONN_HANDLING | 1u << CONN_CLOSING,
        [CONN_HANDLING] = 1u << CONN_IDLE | 1u << CONN_CLOSING,
        [CONN_CLOSING] = 1u << CONN_CLOSING,
    };
    if (!(allowed[c->state] & (1u << st))) {
        log_error(c->id, "invalid connection transition %s -> %s", http_conn_state_str(c->state),
                  http_conn_state_str(st));
#ifndef NDEBUG
        abort();
#endif
    }
    c->state = st;
}

static void arm_timer(http_conn_t *c, uint64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
    evtimer_add(c->timer, &tv);
}

static void free_now(evutil_socket_t fd, short what, void *arg)
{
    http_conn_t *c = arg;
    if (c->gone) {
        void (*gone)(void *) = c->gone;
        c->gone = NULL;
        c->drained = NULL;
        gone(c->obs_arg);
    }
    if (c->prev)
        c->prev->next = c->next;
    else
        c->site->ctx->all = c->next;
    if (c->next)
        c->next->prev = c->prev;
    sock_reader_free(c->rd);
    bufferevent_free(c->bev);
    event_free(c->timer);
    event_free(c->resume);
    event_free(c->flush_ev);
    http_request_free(c->req);
    X509_free(c->peer_cert);
    log_debug(c->id, "connection closed");
    http_context_t *ctx = c->site->ctx;
    free(c);
    ctx->open--;
    ctx->stats->open_conns = ctx->open;
    if (ctx->on_close)
        ctx->on_close(ctx->arg);
}

/* Closing is deferred to the loop so no caller up the stack holds a freed connection. */
static void schedule_free(http_conn_t *c)
{
    if (c->free_scheduled)
        return;
    c->free_scheduled = true;
    if (c->state != CONN_CLOSING)
        set_state(c, CONN_CLOSING);
    sock_reading(c->bev, c->rd, false);
    bufferevent_disable(c->bev, EV_WRITE);
    evtimer_del(c->timer);
    struct timeval zero = {0, 0};
    event_base_once(c->site->ctx->base, -1, EV_TIMEOUT, free_now, c, &zero);
}

/* Once the answer is out: half-close and discard what the agent still sends for a moment.
 * Closing a socket with unread input makes the kernel send a reset, which can destroy the
 * answer (a 413 to an agent still uploading) before the agent reads it. */
static void linger(http_conn_t *c)
{
    if (c->lingering)
        return;
    c->lingering = true;
    if (c->tls) /* close_notify, written to the socket at once: the output is empty */
        SSL_shutdown(bufferevent_openssl_get_ssl(c->bev));
    shutdown(bufferevent_getfd(c->bev), SHUT_WR);
    evbuffer_drain(bufferevent_get_input(c->bev),
                   evbuffer_get_length(bufferevent_get_input(c->bev)));
    sock_read_high(c->bev, c->rd, 0);
    sock_reading(c->bev, c->rd, true);
    arm_timer(c, LINGER_MS);
}

/* Stops reading requests and closes once the output is flushed. */
static void close_after_flush(http_conn_t *c)
{
    if (c->state != CONN_CLOSING)
        set_state(c, CONN_CLOSING);
    bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
        linger(c);
    else
        arm_timer(c, 5000); /* an agent that never reads its answer does not pin us */
}

/* --- parser callbacks (arg is the connection) --- */

static int on_message_begin(void *arg)
{
    http_conn_t *c = arg;
    if (c->state == CONN_IDLE)
        set_state(c, CONN_READING);
    http_request_free(c->req);
    c->req = xcalloc(1, sizeof(*c->req));
    http_headers_init(&c->req->headers);
    c->parser.headers = &c->req->headers;
    c->req->conn_id = c->id;
    c->req->start_ms = util_now_ms();
    c->req->body = evbuffer_new();
    c->req->target = xstrdup("");
    if (c->peer_cert && X509_up_ref(c->peer_cert))
        c->req->peer_cert = c->peer_cert;
    c->req_complete = false;
    /* the first request's head is due header_timeout after accept, a TLS handshake included:
     * a peer that trickles the handshake or its first bytes gets no fresh deadline */
    uint64_t ms = c->site->ctx->limits->header_timeout_ms;
    if (c->first_pending) {
        uint64_t spent = c->req->start_ms - c->accepted_ms;
        ms = spent < ms ? ms - spent : 1;
    }
    c->first_pending = false;
    arm_timer(c, ms);
    return 0;
}

static int on_url(void *arg, const char *at, size_t len)
{
    http_conn_t *c = arg;
    size_t old = strlen(c->req->target);
    c->req->target = xrealloc(c->req->target, old + len + 1);
    memcpy(c->req->target + old, at, len);
    c->req->target[old + len] = '\0';
    return 0;
}

static int on_headers_complete(void *arg)
{
    http_conn_t *c = arg;
    llhttp_t *p = &c->parser.llhttp;
    c->req->method = llhttp_get_method(p);
    c->req->method_name = xstrdup(llhttp_method_name((llhttp_method_t)c->req->method));
    c->req->keep_alive = llhttp_should_keep_alive(p);
    if ((p->flags & F_CONTENT_LENGTH) && p->content_length > c->site->ctx->limits->max_body_bytes) {
        c->fail_status = 413;
        return -1;
    }
    arm_timer(c, c->site->ctx->limits->body_timeout_ms);
    return 0;
}

static int on_body(void *arg, const char *at, size_t len)
{
    http_conn_t *c = arg;
    if (evbuffer_get_length(c->req->body) + len > c->site->ctx->limits->max_body_bytes) {
        c->fail_status = 413;
        return -1;
    }
    evbuffer_add(c->req->body, at, len);
    return 0;
}

static int on_message_complete(void *arg)
{
    http_conn_t *c = arg;
    if (!c->req || c->state != CONN_READING)
        return -1; /* a message end without a beginning: stray bytes after a request */
    c->req_complete = true;
    return HTTP_PARSE_STOP;
}

static const http_parse_cbs_t parse_cbs = {
    .on_begin = on_message_begin,
    .on_url = on_url,
    .on_head = on_headers_complete,
    .on_body = on_body,
    .on_end = on_message_complete,
};

/* --- reading --- */

static void refuse(http_conn_t *c, int status, const char *message)
{
    c->site->ctx->stats->bad_requests++;
    log_info(c->id, "request refused: %d %s", status, message);
    const http_site_t *site = c->site;
    char *body = site->error_body ? site->error_body(message) : xstrdup(message);
    if (c->state == CONN_IDLE)
        set_state(c, CONN_READING);
    evbuffer_drain(bufferevent_get_input(c->bev),
                   evbuffer_get_length(bufferevent_get_input(c->bev)));
    struct evbuffer *out = bufferevent_get_output(c->bev);
    size_t len = strlen(body);
    http_write_response_head(out, status,
                             site->error_body && site->error_type ? site->error_type : "text/plain",
                             NULL, (long long)len, false, NULL);
    evbuffer_add(out, body, len);
    free(body);
    close_after_flush(c);
}

/* The parser stopped on an error: the status and words the agent gets for it. */
static void refuse_unparsed(http_conn_t *c)
{
    switch (c->parser.error) {
    case HTTP_PARSE_ERR_HEAD_TOO_LARGE:
        refuse(c, 431, "request headers too large");
        return;
    case HTTP_PARSE_ERR_BAD_HEADER_NAME:
        refuse(c, 400,
               "malformed HTTP request: a header name is not a token (whitespace before "
               "the colon?)");
        return;
    case HTTP_PARSE_ERR_REFUSED:
        if (c->fail_status == 413) {
            refuse(c, 413, "request body too large");
            return;
        }
        break;
    case HTTP_PARSE_ERR_NONE:
    case HTTP_PARSE_ERR_INVALID:
        break;
    }
    refuse(c, 400, "malformed HTTP request");
}

static void dispatch(http_conn_t *c)
{
    http_request_t *req = c->req;
    c->req = NULL;
    c->req_complete = false;
    evtimer_del(c->timer);
    set_state(c, CONN_HANDLING);
    c->site->ctx->stats->requests++;
    c->site->handler(c->site->arg, c, req);
}

static void process_input(http_conn_t *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    if (c->state == CONN_CLOSING) {
        evbuffer_drain(in, evbuffer_get_length(in));
        return;
    }
    while ((c->state == CONN_IDLE || c->state == CONN_READING) && evbuffer_get_length(in) > 0) {
        if (draining(c->site->ctx) && !c->site->ctx->serve_while_draining &&
            c->state == CONN_IDLE) {
            close_after_flush(c);
            return;
        }
        if (http_parse_chunk(&c->parser, in) == HTTP_PARSE_FAILED) {
            refuse_unparsed(c);
            return;
        }
        if (c->req_complete) {
            dispatch(c);
            return;
        }
    }
}

static void read_cb(struct bufferevent *bev, void *arg)
{
    process_input(arg);
}

static void resume_cb(evutil_socket_t fd, short what, void *arg)
{
    process_input(arg);
}

/* The bufferevent wrote a backlog down below the low watermark. */
static void write_cb(struct bufferevent *bev, void *arg)
{
    http_conn_t *c = arg;
    bool empty = evbuffer_get_length(bufferevent_get_output(bev)) == 0;
    if (empty)
        bufferevent_disable(bev, EV_WRITE); /* back to writing from http_conn_flush */
    if (c->state == CONN_CLOSING) {
        if (empty)
            linger(c);
        return;
    }
    if (c->drained)
        c->drained(c->obs_arg);
}

static void flush_cb(evutil_socket_t fd, short what, void *arg)
{
    http_conn_t *c = arg;
    c->flush_pending = false;
    http_conn_flush(c);
}

/* Output added and not flushed by its writer is written later in the same loop pass. */
static void output_added(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
    http_conn_t *c = arg;
    if (info->n_added == 0 || c->flush_pending || c->free_scheduled ||
        (bufferevent_get_enabled(c->bev) & EV_WRITE))
        return;
    c->flush_pending = true;
    event_active(c->flush_ev, 0, 0);
}

/* The TLS handshake is done: the client certificate, verified by then, is kept for the
 * requests (a subject may be read from it). */
static void tls_connected(http_conn_t *c)
{
    SSL *ssl = bufferevent_openssl_get_ssl(c->bev);
    if (SSL_get_verify_result(ssl) == X509_V_OK)
        c->peer_cert = SSL_get1_peer_certificate(ssl);
    log_debug(c->id, "TLS %s established%s", SSL_get_version(ssl),
              c->peer_cert ? " with a client certificate" : "");
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
    http_conn_t *c = arg;
    if (what & BEV_EVENT_CONNECTED) {
        if (c->tls)
            tls_connected(c);
        return;
    }
    if (c->tls && (what & BEV_EVENT_ERROR) && !c->peer_cert && c->state == CONN_IDLE) {
        unsigned long e = bufferevent_get_openssl_error(bev);
        if (e) {
            char buf[256];
            ERR_error_string_n(e, buf, sizeof(buf));
            log_debug(c->id, "TLS: %s", buf);
        }
    }
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        /* whether the agent left early is the handler's to say (gone): a GET stream ends so */
        if (c->state == CONN_HANDLING)
            log_debug(c->id, "agent closed its connection during a response");
        schedule_free(c);
    }
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
    http_conn_t *c = arg;
    switch (c->state) {
    case CONN_IDLE:
    case CONN_CLOSING:
        schedule_free(c);
        break;
    case CONN_READING:
        refuse(c, 408, "request not received in time");
        break;
    case CONN_HANDLING:
        break;
    }
}

/* The peer address for X-Forwarded-For, formatted once per connection. */
static void format_peer(const struct sockaddr *sa, char *out, size_t outlen)
{
    out[0] = '\0';
    if (!sa)
        return;
    if (sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, out, (socklen_t)outlen);
    else if (sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, out, (socklen_t)outlen);
}

/* A TLS server bufferevent over fd, or NULL (fd then still ours to close). */
static struct bufferevent *tls_bev(struct event_base *base, int fd, struct ssl_ctx_st *tls)
{
    SSL *ssl = SSL_new(tls);
    if (!ssl)
        return NULL;
    /* frees ssl when it fails, and with itself (BEV_OPT_CLOSE_ON_FREE) */
    struct bufferevent *bev = bufferevent_openssl_socket_new(
        base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE);
    if (bev) /* an agent that closes without close_notify has finished, not failed */
        bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    return bev;
}

/* tls: the context of a TLS connection, NULL for plain HTTP. NULL when the connection cannot
 * be made (fd closed). */
static http_conn_t *conn_new(int fd, const struct sockaddr *sa, const http_site_t *site,
                             struct ssl_ctx_st *tls)
{
    http_context_t *ctx = site->ctx;
    struct bufferevent *bev = tls ? tls_bev(ctx->base, fd, tls)
                                  : bufferevent_socket_new(ctx->base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (!bev) {
        log_warn(0, "cannot set up a connection%s", tls ? " (TLS)" : "");
        evutil_closesocket(fd);
        return NULL;
    }
    http_conn_t *c = xcalloc(1, sizeof(*c));
    c->rd = tls ? NULL : sock_reader_new(bev); /* NULL: the bufferevent reads, as for TLS */
    c->id = ++ctx->next_id;
    c->site = site;
    c->state = CONN_IDLE;
    c->bev = bev;
    c->tls = tls != NULL;
    c->timer = evtimer_new(ctx->base, timer_cb, c);
    c->resume = event_new(ctx->base, -1, 0, resume_cb, c);
    c->flush_ev = event_new(ctx->base, -1, 0, flush_cb, c);
    http_parse_init(&c->parser, HTTP_REQUEST, &parse_cbs, c, NULL, &ctx->limits->max_header_bytes,
                    true);
    bufferevent_setcb(c->bev, read_cb, write_cb, event_cb, c);
    sock_read_high(c->bev, c->rd, IN_HIGH_WATERMARK);
    bufferevent_setwatermark(c->bev, EV_WRITE, OUT_LOW_WATERMARK, 0);
    /* Writing is enabled only while a backlog waits for the socket: answers go out from
     * http_conn_flush at once, and EPOLLOUT is not switched on and off for each one. */
    bufferevent_disable(c->bev, EV_WRITE); /* a new bufferevent starts write-enabled */
    sock_reading(c->bev, c->rd, true);
    evbuffer_add_cb(bufferevent_get_output(c->bev), output_added, c);
    c->first_pending = true;
    c->accepted_ms = util_now_ms();
    arm_timer(c, c->site->ctx->limits->header_timeout_ms);
    c->next = ctx->all;
    if (ctx->all)
        ctx->all->prev = c;
    ctx->all = c;
    format_peer(sa, c->peer, sizeof(c->peer));
    ctx->open++;
    ctx->stats->open_conns = ctx->open;
    ctx->stats->connections++;
    return c;
}

void http_conn_accept(struct evconnlistener *l, int fd, struct sockaddr *sa, int socklen, void *arg)
{
    (void)l;
    (void)socklen;
    const http_site_t *site = arg;
    http_context_t *ctx = site->ctx;
    /* one line per episode of refusals: under a flood, one per connection would be the flood */
    bool full = (long long)ctx->open >= (long long)ctx->limits->max_connections;
    bool closed = draining(ctx) && !ctx->serve_while_draining;
    if (closed || full) {
        if (!ctx->refusing)
            log_warn(0, "refusing new connections: %s (%llu open)",
                     closed ? "draining" : "max_connections reached",
                     (unsigned long long)ctx->open);
        ctx->refusing = true;
        evutil_closesocket(fd);
        return;
    }
    if (ctx->refusing)
        log_debug(0, "accepting connections again");
    ctx->refusing = false;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    /* An agent that vanished without a FIN (a laptop closed, a pod gone) is found within about
     * 90 s even on an idle GET stream, so its stream and what it holds upstream end. */
    int idle = 60, interval = 10, count = 3;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
    conn_new(fd, sa, site, site->tls);
}

void http_conn_adopt(int fd, const http_site_t *site, const char *bytes, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    bool have_peer = getpeername(fd, (struct sockaddr *)&ss, &sl) == 0;
    evutil_make_socket_nonblocking(fd);
    /* only plain connections are handed over */
    http_conn_t *c = conn_new(fd, have_peer ? (struct sockaddr *)&ss : NULL, site, NULL);
    if (!c)
        return;
    c->adopted = true;
    struct evbuffer *in = bufferevent_get_input(c->bev);
    evbuffer_unfreeze(in, 0); /* a socket bufferevent lets only itself add input */
    evbuffer_add(in, bytes, len);
    evbuffer_freeze(in, 0);
    log_debug(c->id, "connection handed over by another worker");
    event_active(c->resume, 0, 0);
}

bool http_conn_hand_off(http_conn_t *c, const http_request_t *req, size_t max_bytes,
                        http_send_fd_fn send, void *arg)
{
    if (c->tls || c->adopted || c->free_scheduled ||
        evbuffer_get_length(bufferevent_get_output(c->bev)))
        return false;
    /* the request as the agent sent it (headers in order, Host included), then whatever the
     * agent sent after it */
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "%s %s HTTP/1.1\r\n", req->method_name,
                        req->routed_from ? req->routed_from : req->target);
    for (size_t i = 0; i < req->headers.n; i++)
        evbuffer_add_printf(b, "%s: %s\r\n", http_headers_name(&req->headers, i),
                            http_headers_value(&req->headers, i));
    if (!req->keep_alive && !http_headers_get(&req->headers, "connection"))
        evbuffer_add(b, "Connection: close\r\n", 19);
    evbuffer_add(b, "\r\n", 2);
    evbuffer_add_buffer(b, bufferevent_get_input(c->bev));
    size_t len = evbuffer_get_length(b);
    bool sent = len <= max_bytes &&
                send(arg, bufferevent_getfd(c->bev), (const char *)evbuffer_pullup(b, -1), len);
    evbuffer_free(b);
    if (!sent)
        return false;
    /* our copy of the socket closes with the bufferevent; nothing is written or shut down */
    c->handed_off = true;
    c->drained = NULL;
    c->gone = NULL;
    c->obs_arg = NULL;
    schedule_free(c);
    return true;
}

uint64_t http_conn_id(const http_conn_t *conn)
{
    return conn->id;
}

void http_conn_flush(http_conn_t *conn)
{
    struct evbuffer *out = bufferevent_get_output(conn->bev);
    if (conn->free_scheduled || (bufferevent_get_enabled(conn->bev) & EV_WRITE))
        return; /* the bufferevent is writing a backlog: keep the order */
    if (conn->tls && evbuffer_get_length(out) > 0) {
        /* only the bufferevent can encrypt: it writes once enabled */
        bufferevent_enable(conn->bev, EV_WRITE);
        return;
    }
    if (evbuffer_get_length(out) > 0) {
        /* a socket bufferevent freezes the front of its output for everyone but itself */
        evbuffer_unfreeze(out, 1);
        (void)evbuffer_write(out, bufferevent_getfd(conn->bev));
        evbuffer_freeze(out, 1);
    }
    if (evbuffer_get_length(out) > 0) {
        /* a backlog, or an error, which the bufferevent's own write sees and reports */
        bufferevent_enable(conn->bev, EV_WRITE);
        return;
    }
    if (conn->state == CONN_CLOSING)
        linger(conn);
}

struct evbuffer *http_conn_output(http_conn_t *conn)
{
    return bufferevent_get_output(conn->bev);
}

size_t http_conn_output_len(http_conn_t *conn)
{
    return evbuffer_get_length(bufferevent_get_output(conn->bev));
}

void http_conn_set_observer(http_conn_t *conn, void (*drained)(void *), void (*gone)(void *),
                            void *arg)
{
    conn->drained = drained;
    conn->gone = gone;
    conn->obs_arg = arg;
}

void http_conn_response_done(http_conn_t *c, bool keep_alive)
{
    c->drained = NULL;
    c->gone = NULL;
    c->obs_arg = NULL;
    c->adopted = false;
    if (c->free_scheduled)
        return;
    if (!keep_alive || draining(c->site->ctx)) {
        close_after_flush(c);
        return;
    }
    set_state(c, CONN_IDLE);
    arm_timer(c, c->site->ctx->limits->idle_timeout_ms);
    event_active(c->resume, 0, 0);
}

void http_conn_respond(http_conn_t *c, int status, const char *content_type, const char *body,
                       size_t len, const char *extra, bool keep_alive)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    http_write_response_head(out, status, content_type, NULL, (long long)len,
                             keep_alive && !draining(c->site->ctx), extra);
    if (len)
        evbuffer_add(out, body, len);
    http_conn_flush(c);
    http_conn_response_done(c, keep_alive);
}

void http_conn_fill_client_ip(http_conn_t *c, http_request_t *req)
{
    memcpy(req->client_ip, c->peer, sizeof(req->client_ip));
}

void http_conn_close_idle(http_context_t *ctx)
{
    for (http_conn_t *c = ctx->all; c; c = c->next)
        if (c->state == CONN_IDLE)
            schedule_free(c);
}
