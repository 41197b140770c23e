/* The HTTP upstream: the connection pool, and the upstream interface over it. */
#include "upstream_http.h"
#include "http_parse.h"
#include "log.h"
#include "sock_reader.h"
#include "util.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <errno.h>
#include <sys/socket.h>

/* Session tickets kept per upstream: a full TLS 1.3 handshake usually brings two. */
#define TLS_SESSIONS_KEPT 4

/* An idle pooled connection is closed after this long unused. */
#define IDLE_KEEP_MS 30000

typedef enum {
    UP_CONNECTING = 0, /* TCP (and TLS) handshake */
    UP_WAIT_HEAD,      /* request written or being written, no response head yet */
    UP_READ_BODY,      /* streaming the response */
    UP_IDLE,           /* in the pool */
    UP_DEAD,           /* closed, waiting to be freed */
} up_state_t;

struct upstream_conn {
    upstream_pool_t *pool;
    up_state_t state;
    struct bufferevent *bev;
    sock_reader_t *rd; /* reads bev's socket; NULL over TLS (the bufferevent reads) */
    http_parser_t parser;
    http_headers_t headers;
    int status;
    bool msg_done; /* on_message_complete seen */
    const upstream_cbs_t *cbs;
    void *arg;
    struct event *timer;
    struct upstream_conn *next; /* in the idle list */
    bool reused;
    bool discard;   /* the owner saw a response that was not its own: never pool this one */
    bool alone;     /* its request's answer cannot be told by its id: a connection of its own */
    bool eof;       /* the server closed or reset: nothing more can be asked on it */
    bool head_only; /* the request is a HEAD: its response has no body, whatever it says */
    /* A request sent on a kept-alive connection, kept until its answer begins: a server that
     * closes that connection before any byte of an answer (its keep-alive ending as the request
     * arrived) has it sent once more on a new connection. Never a request sent with once (a
     * protected call): it may have run, and must not run twice. */
    struct evbuffer *resend;
    bool got_bytes; /* some of the answer arrived */
};

struct upstream_pool {
    struct event_base *base;
    struct ssl_ctx_st *tls;
    char *host;
    const upstream_limits_t *limits;
    const bool *draining;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    upstream_conn_t *idle; /* LIFO: the warmest connection first */
    int n_idle;
    /* sessions the upstream gave, to resume later handshakes with: a TLS 1.3 ticket is used
     * once (RFC 8446 C.4; servers refuse a second use), a TLS 1.2 session until replaced */
    SSL_SESSION *tls_sessions[TLS_SESSIONS_KEPT];
    int n_tls_sessions;
    uint64_t *tls_full, *tls_resumed; /* counters of handshakes, or NULL */
    uint64_t *connects;               /* counter of connections opened, or NULL */
    /* the upstream once answered a request with another's answer (a stray, a late one):
     * requests never sent twice take a connection of their own from then on, so no stray
     * left on a kept-alive one costs a protected call its answer */
    bool out_of_step;
};

upstream_pool_t *upstream_pool_new(const upstream_opts_t *opts, char *msg, size_t msglen)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    char port[8];
    snprintf(port, sizeof(port), "%u", opts->port);
    int rc = getaddrinfo(opts->host, port, &hints, &res);
    if (rc != 0 || !res) {
        snprintf(msg, msglen, "cannot resolve upstream host %s: %s", opts->host, gai_strerror(rc));
        return NULL;
    }
    upstream_pool_t *pool = xcalloc(1, sizeof(*pool));
    pool->base = opts->base;
    pool->tls = opts->tls;
    pool->host = xstrdup(opts->host);
    pool->limits = opts->limits;
    pool->draining = opts->draining;
    pool->tls_full = opts->tls_full;
    pool->tls_resumed = opts->tls_resumed;
    pool->connects = opts->connects;
    memcpy(&pool->addr, res->ai_addr, res->ai_addrlen);
    pool->addrlen = res->ai_addrlen;
    freeaddrinfo(res);
    return pool;
}

static void conn_free(upstream_conn_t *up)
{
    sock_reader_free(up->rd);
    if (up->bev)
        bufferevent_free(up->bev);
    event_free(up->timer);
    http_headers_free(&up->headers);
    if (up->resend)
        evbuffer_free(up->resend);
    free(up);
}

static void free_cb(evutil_socket_t fd, short what, void *arg)
{
    conn_free(arg);
}

/* Freed from the loop: we may be inside one of its own callbacks. */
static void kill_conn(upstream_conn_t *up)
{
    if (up->state == UP_DEAD)
        return;
    up->state = UP_DEAD;
    up->cbs = NULL;
    sock_reading(up->bev, up->rd, false);
    bufferevent_disable(up->bev, EV_WRITE);
    evtimer_del(up->timer);
    struct timeval zero = {0, 0};
    event_base_once(up->pool->base, -1, EV_TIMEOUT, free_cb, up, &zero);
}

void upstream_pool_close_idle(upstream_pool_t *pool)
{
    if (!pool)
        return;
    while (pool->idle) {
        upstream_conn_t *up = pool->idle;
        pool->idle = up->next;
        pool->n_idle--;
        kill_conn(up);
    }
}

void upstream_pool_free(upstream_pool_t *pool)
{
    if (!pool)
        return;
    while (pool->idle) {
        upstream_conn_t *up = pool->idle;
        pool->idle = up->next;
        conn_free(up);
    }
    for (int i = 0; i < pool->n_tls_sessions; i++)
        SSL_SESSION_free(pool->tls_sessions[i]);
    free(pool->host);
    free(pool);
}

static void arm(upstream_conn_t *up, uint64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
    evtimer_add(up->timer, &tv);
}

/* Only a connection whose last response was framed to its end, with nothing after it, may
 * serve another request; anything else could hand the next caller bytes meant for someone else.
 * Nor one whose request is still being sent (the server answered before reading the whole
 * body): the next request, written to the socket directly, would land inside that body. */
static bool may_pool(upstream_conn_t *up, upstream_result_t res)
{
    return res == UPSTREAM_OK && up->msg_done && !up->discard && !up->alone && !up->eof &&
           llhttp_should_keep_alive(&up->parser.llhttp) &&
           evbuffer_get_length(bufferevent_get_input(up->bev)) == 0 &&
           evbuffer_get_length(bufferevent_get_output(up->bev)) == 0 &&
           !(up->pool->draining && *up->pool->draining) &&
           up->pool->n_idle < up->pool->limits->pool;
}

/* Ends the exchange for the owner, then pools or closes the connection. The owner hears first,
 * so it can still ask for the connection to be closed (upstream_http_discard). */
static void finish(upstream_conn_t *up, upstream_result_t res)
{
    const upstream_cbs_t *cbs = up->cbs;
    void *arg = up->arg;
    up->cbs = NULL;
    up->arg = NULL;
    if (up->resend) {
        evbuffer_free(up->resend);
        up->resend = NULL;
    }
    if (cbs)
        cbs->on_end(arg, res);
    if (!may_pool(up, res)) {
        kill_conn(up);
        return;
    }
    /* a server that says how long it keeps an idle connection closes it then; give it back
     * before that, so a request is never sent into the server's close */
    uint64_t keep =
        upstream_keep_alive_ms(http_headers_get(&up->headers, "keep-alive"), IDLE_KEEP_MS);
    if (keep == 0) {
        kill_conn(up);
        return;
    }
    up->state = UP_IDLE;
    up->reused = true;
    http_parse_reset(&up->parser);
    http_headers_reset(&up->headers);
    up->msg_done = false;
    up->status = 0;
    sock_reading(up->bev, up->rd, true);
    arm(up, keep);
    up->next = up->pool->idle;
    up->pool->idle = up;
    up->pool->n_idle++;
}

uint64_t upstream_keep_alive_ms(const char *keep_alive, uint64_t dflt)
{
    /* Keep-Alive: timeout=5, max=100 (RFC 2068 19.7.1.1; parameters in any order) */
    for (const char *p = keep_alive; p && *p;) {
        p += strspn(p, " \t,");
        if (strncasecmp(p, "timeout=", 8) == 0) {
            char *end = NULL;
            unsigned long secs = strtoul(p + 8, &end, 10);
            if (end == p + 8)
                break;
            if (secs <= 1)
                return 0; /* too short to be worth keeping */
            uint64_t ms = (uint64_t)(secs - 1) * 1000;
            return ms < dflt ? ms : dflt;
        }
        p += strcspn(p, ",");
    }
    return dflt;
}

static void unlink_idle(upstream_conn_t *up)
{
    upstream_conn_t **pp = &up->pool->idle;
    while (*pp && *pp != up)
        pp = &(*pp)->next;
    if (*pp) {
        *pp = up->next;
        up->pool->n_idle--;
    }
    up->next = NULL;
}

/* --- parser callbacks (arg is the connection) --- */

static int on_headers_complete(void *arg)
{
    upstream_conn_t *up = arg;
    up->status = up->parser.llhttp.status_code;
    if (up->status < 200)
        return 0; /* interim response: wait for the real one */
    up->state = UP_READ_BODY;
    if (up->resend) {
        evbuffer_free(up->resend);
        up->resend = NULL;
    }
    if (up->timer)
        arm(up, up->pool->limits->idle_timeout_ms);
    if (up->cbs)
        up->cbs->on_head(up->arg, up->status, &up->headers);
    return up->head_only ? 1 : 0; /* 1: llhttp reads no body */
}

static int on_body(void *arg, const char *at, size_t len)
{
    upstream_conn_t *up = arg;
    if (up->cbs)
        up->cbs->on_body(up->arg, at, len);
    return 0;
}

static int on_message_complete(void *arg)
{
    upstream_conn_t *up = arg;
    if (up->status < 200) {
        http_headers_reset(&up->headers);
        return 0;
    }
    up->msg_done = true;
    return HTTP_PARSE_STOP;
}

static const http_parse_cbs_t parse_cbs = {
    .on_head = on_headers_complete,
    .on_body = on_body,
    .on_end = on_message_complete,
};

/* A response head larger than this is not one an MCP server sends. */
static const uint64_t max_head_bytes = 64 * 1024;

static void parser_init(upstream_conn_t *up)
{
    http_headers_init(&up->headers);
    http_parse_init(&up->parser, HTTP_RESPONSE, &parse_cbs, up, &up->headers, &max_head_bytes,
                    false);
}

/* --- events --- */

static void read_cb(struct bufferevent *bev, void *arg)
{
    upstream_conn_t *up = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    if (up->state == UP_IDLE) {
        /* a pooled connection must stay silent; anything else makes it unusable */
        unlink_idle(up);
        kill_conn(up);
        return;
    }
    if (evbuffer_get_length(in) > 0)
        up->got_bytes = true;
    while (evbuffer_get_length(in) > 0 &&
           (up->state == UP_WAIT_HEAD || up->state == UP_READ_BODY)) {
        if (http_parse_chunk(&up->parser, in) == HTTP_PARSE_FAILED) {
            log_warn(0, "upstream response unparseable: %s (%s)",
                     http_parse_error_str(up->parser.error), http_parse_errno_name(&up->parser));
            finish(up, UPSTREAM_ERR_PROTOCOL);
            return;
        }
        if (up->msg_done) {
            finish(up, UPSTREAM_OK);
            return;
        }
        if (up->state == UP_READ_BODY)
            arm(up, up->pool->limits->idle_timeout_ms);
        if (!sock_is_reading(bev, up->rd))
            return; /* paused by the owner: leave the rest for later */
    }
}

/* A close-delimited body (HTTP/1.0, or no length) is complete when the server closes. */
static bool body_ends_at_close(upstream_conn_t *up)
{
    return http_parse_finish(&up->parser) && up->msg_done;
}

static struct bufferevent *new_bev(upstream_pool_t *pool, upstream_conn_t *up);
static void event_cb(struct bufferevent *bev, short what, void *arg);

/* The connect is under way, so the socket exists: no Nagle delay, close-on-exec (libevent makes
 * it without), and a reader of its own for a plain one (sock_reader.h). */
static void connect_started(upstream_conn_t *up)
{
    int fd = bufferevent_getfd(up->bev), one = 1;
    if (fd >= 0) {
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        evutil_make_socket_closeonexec(fd);
    }
    if (!up->pool->tls && fd >= 0)
        up->rd = sock_reader_new(up->bev);
}

/* The kept-alive connection closed before any byte of the answer: the same request once more,
 * on a new connection, under the same handle (the owner has heard nothing yet). */
static void send_again(upstream_conn_t *up)
{
    upstream_pool_t *pool = up->pool;
    struct evbuffer *request = up->resend;
    up->resend = NULL;
    log_info(0, "upstream closed a kept-alive connection before answering: the request goes "
                "again on a new connection");
    sock_reader_free(up->rd);
    up->rd = NULL;
    bufferevent_free(up->bev);
    http_parse_reset(&up->parser);
    http_headers_reset(&up->headers);
    up->eof = false;
    up->reused = false;
    up->status = 0;
    if (pool->connects)
        (*pool->connects)++;
    up->bev = new_bev(pool, up);
    up->state = UP_CONNECTING;
    bufferevent_setcb(up->bev, read_cb, NULL, event_cb, up);
    arm(up, pool->limits->connect_timeout_ms);
    if (bufferevent_socket_connect(up->bev, (struct sockaddr *)&pool->addr, (int)pool->addrlen) !=
        0) {
        evbuffer_free(request);
        finish(up, UPSTREAM_ERR_CONNECT);
        return;
    }
    connect_started(up);
    bufferevent_write_buffer(up->bev, request);
    evbuffer_free(request);
    sock_reading(up->bev, up->rd, true);
    bufferevent_enable(up->bev, EV_WRITE);
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
    upstream_conn_t *up = arg;
    if (what & BEV_EVENT_CONNECTED) {
        if (up->pool->tls) {
            uint64_t *n = SSL_session_reused(bufferevent_openssl_get_ssl(bev))
                              ? up->pool->tls_resumed
                              : up->pool->tls_full;
            if (n)
                (*n)++;
        }
        up->state = UP_WAIT_HEAD;
        arm(up, up->pool->limits->timeout_ms);
        return;
    }
    if (!(what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)))
        return;
    up->eof = true;
    switch (up->state) {
    case UP_CONNECTING: {
        unsigned long tls_err = up->pool->tls ? bufferevent_get_openssl_error(bev) : 0;
        if (tls_err) {
            char why[256];
            ERR_error_string_n(tls_err, why, sizeof(why));
            long vr = SSL_get_verify_result(bufferevent_openssl_get_ssl(bev));
            log_warn(0, "upstream TLS handshake failed: %s%s%s", why,
                     vr != X509_V_OK ? "; certificate: " : "",
                     vr != X509_V_OK ? X509_verify_cert_error_string(vr) : "");
        } else {
            log_warn(0, "upstream connect failed: %s",
                     evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
        }
        finish(up, UPSTREAM_ERR_CONNECT);
    } break;
    case UP_IDLE:
        unlink_idle(up);
        kill_conn(up);
        break;
    case UP_WAIT_HEAD:
    case UP_READ_BODY:
        /* data still buffered is parsed first; EOF may also end a close-delimited body */
        read_cb(bev, up);
        if (up->state != UP_WAIT_HEAD && up->state != UP_READ_BODY)
            break;
        if (up->state == UP_WAIT_HEAD && up->resend && !up->got_bytes) {
            send_again(up);
            break;
        }
        if ((what & BEV_EVENT_EOF) && body_ends_at_close(up)) {
            finish(up, UPSTREAM_OK);
            break;
        }
        finish(up, UPSTREAM_ERR_CLOSED);
        break;
    case UP_DEAD:
        break;
    }
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
    upstream_conn_t *up = arg;
    switch (up->state) {
    case UP_CONNECTING:
        finish(up, UPSTREAM_ERR_CONNECT);
        break;
    case UP_WAIT_HEAD:
        finish(up, UPSTREAM_ERR_HEAD_TIMEOUT);
        break;
    case UP_READ_BODY:
        finish(up, UPSTREAM_ERR_IDLE_TIMEOUT);
        break;
    case UP_IDLE:
        unlink_idle(up);
        kill_conn(up);
        break;
    case UP_DEAD:
        break;
    }
}

/* A session ticket (TLS 1.3) or session (TLS 1.2) the upstream sent on one of the pool's
 * connections: kept to resume a later handshake with, so a new connection costs a resumption
 * rather than a certificate check and key exchange. The pool is the
 * connection's, which outlives its SSL's callbacks; a probe's SSL has no connection and keeps
 * nothing. Sessions come only after the certificate was verified (SSL_VERIFY_PEER). */
static int remember_session(SSL *ssl, SSL_SESSION *sess)
{
    upstream_conn_t *up = SSL_get_app_data(ssl);
    if (!up || !SSL_SESSION_is_resumable(sess))
        return 0;
    upstream_pool_t *pool = up->pool;
    if (pool->n_tls_sessions == TLS_SESSIONS_KEPT) { /* the oldest goes */
        SSL_SESSION_free(pool->tls_sessions[0]);
        memmove(pool->tls_sessions, pool->tls_sessions + 1,
                (TLS_SESSIONS_KEPT - 1) * sizeof(pool->tls_sessions[0]));
        pool->n_tls_sessions--;
    }
    pool->tls_sessions[pool->n_tls_sessions++] = sess;
    return 1; /* the reference is the pool's now */
}

/* Offers the newest kept session to ssl; a TLS 1.3 ticket is not offered again. */
static void offer_session(upstream_pool_t *pool, SSL *ssl)
{
    if (pool->n_tls_sessions == 0)
        return;
    SSL_SESSION *sess = pool->tls_sessions[pool->n_tls_sessions - 1];
    SSL_set_session(ssl, sess); /* takes a reference; the server may still want a full one */
    if (SSL_SESSION_get_protocol_version(sess) >= TLS1_3_VERSION) {
        pool->n_tls_sessions--;
        SSL_SESSION_free(sess);
    }
}

static struct bufferevent *new_bev(upstream_pool_t *pool, upstream_conn_t *up)
{
    if (!pool->tls)
        return bufferevent_socket_new(pool->base, -1, BEV_OPT_CLOSE_ON_FREE);
    SSL *ssl = SSL_new(pool->tls);
    SSL_set_app_data(ssl, up);
    if (up)
        offer_session(pool, ssl);
    const char *host = pool->host;
    unsigned char addr[16];
    if (inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1) {
        /* an address: the certificate must name it; SNI never carries one (RFC 6066) */
        X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host);
    } else {
        SSL_set_tlsext_host_name(ssl, host);
        SSL_set1_host(ssl, host);
    }
    return bufferevent_openssl_socket_new(pool->base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
                                          BEV_OPT_CLOSE_ON_FREE);
}

/* Callbacks run from the loop even when connect fails at once. */
static void connect_failed_cb(evutil_socket_t fd, short what, void *arg)
{
    upstream_conn_t *up = arg;
    finish(up, UPSTREAM_ERR_CONNECT);
}

/* True when nothing at all has arrived on an idle connection: no buffered or decrypted byte,
 * no raw byte (for TLS, any record may be the start of a response), no end of stream. Checked
 * right before reuse, because the loop may not have read what arrived since it was pooled. */
static bool idle_is_clean(upstream_conn_t *up)
{
    if (evbuffer_get_length(bufferevent_get_input(up->bev)) > 0)
        return false;
    if (up->pool->tls && SSL_pending(bufferevent_openssl_get_ssl(up->bev)) > 0)
        return false;
    int fd = bufferevent_getfd(up->bev);
    if (fd < 0)
        return false;
    char byte;
    ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

/* The warmest idle connection that is provably clean; the others are closed on the way. */
static upstream_conn_t *take_idle(upstream_pool_t *pool)
{
    while (pool->idle) {
        upstream_conn_t *up = pool->idle;
        pool->idle = up->next;
        pool->n_idle--;
        up->next = NULL;
        if (idle_is_clean(up))
            return up;
        kill_conn(up);
    }
    return NULL;
}

/* alone: a request whose answer nothing but the connection tells apart (upstream.h) takes a
 * new connection, which no later request takes: a stray left on a kept-alive one would be read
 * as its answer, and one left after its answer as the next request's. */
static upstream_conn_t *send_on(upstream_pool_t *pool, struct evbuffer *request, bool once,
                                bool alone, const upstream_cbs_t *cbs, void *arg)
{
    upstream_conn_t *up = alone || (once && pool->out_of_step) ? NULL : take_idle(pool);
    if (up) {
        up->state = UP_WAIT_HEAD;
        up->got_bytes = false;
        if (!once) {
            up->resend = evbuffer_new();
            evbuffer_add(up->resend, evbuffer_pullup(request, -1), evbuffer_get_length(request));
        }
        arm(up, up->pool->limits->timeout_ms);
    } else {
        up = xcalloc(1, sizeof(*up));
        up->pool = pool;
        if (pool->connects)
            (*pool->connects)++;
        parser_init(up);
        up->timer = evtimer_new(pool->base, timer_cb, up);
        up->bev = new_bev(pool, up);
        up->state = UP_CONNECTING;
        bufferevent_setcb(up->bev, read_cb, NULL, event_cb, up);
        arm(up, up->pool->limits->connect_timeout_ms);
        if (bufferevent_socket_connect(up->bev, (struct sockaddr *)&pool->addr,
                                       (int)pool->addrlen) != 0) {
            up->cbs = cbs;
            up->arg = arg;
            struct timeval zero = {0, 0};
            evtimer_del(up->timer);
            event_base_once(pool->base, -1, EV_TIMEOUT, connect_failed_cb, up, &zero);
            evbuffer_drain(request, evbuffer_get_length(request));
            return up;
        }
        connect_started(up);
    }
    up->alone = alone;
    up->cbs = cbs;
    up->arg = arg;
    char method[5] = "";
    up->head_only =
        evbuffer_copyout(request, method, sizeof(method)) == (ev_ssize_t)sizeof(method) &&
        memcmp(method, "HEAD ", sizeof(method)) == 0;
    /* On a pooled plain connection the request goes out now, from here: handing it to the
     * bufferevent would cost a loop pass and two epoll_ctl calls to switch EPOLLOUT on and
     * off. What the socket does not take (or an error, which the bufferevent then sees and
     * reports) is left to the bufferevent. */
    if (up->state == UP_WAIT_HEAD && !up->pool->tls)
        (void)evbuffer_write(request, bufferevent_getfd(up->bev));
    if (evbuffer_get_length(request) > 0) {
        bufferevent_write_buffer(up->bev, request);
        bufferevent_enable(up->bev, EV_WRITE);
    }
    sock_reading(up->bev, up->rd, true);
    return up;
}

upstream_conn_t *upstream_http_send(upstream_pool_t *pool, struct evbuffer *request, bool once,
                                    const upstream_cbs_t *cbs, void *arg)
{
    return send_on(pool, request, once, false, cbs, arg);
}

void upstream_http_pause(upstream_conn_t *up, bool paused)
{
    if (up->state != UP_READ_BODY && up->state != UP_WAIT_HEAD)
        return;
    if (paused) {
        sock_reading(up->bev, up->rd, false);
    } else {
        sock_reading(up->bev, up->rd, true);
        if (evbuffer_get_length(bufferevent_get_input(up->bev)) > 0)
            read_cb(up->bev, up);
    }
}

void upstream_http_discard(upstream_conn_t *up)
{
    up->discard = true;
    if (!up->pool->out_of_step)
        log_warn(0,
                 "upstream %s answered a request with another's answer: protected calls go up "
                 "on connections of their own from now on",
                 up->pool->host);
    up->pool->out_of_step = true;
}

void upstream_http_abandon(upstream_conn_t *up)
{
    up->cbs = NULL;
    up->arg = NULL;
    kill_conn(up);
}

/* --- the response path without a socket --- */

upstream_result_t upstream_parse_response(const char *data, size_t len, const upstream_cbs_t *cbs,
                                          void *arg, size_t *rest)
{
    upstream_conn_t up = {.state = UP_WAIT_HEAD, .cbs = cbs, .arg = arg};
    parser_init(&up);
    size_t used = 0;
    bool bad = http_parse_feed(&up.parser, data, len, &used) == HTTP_PARSE_FAILED;
    upstream_result_t res = bad                                      ? UPSTREAM_ERR_PROTOCOL
                            : up.msg_done || body_ends_at_close(&up) ? UPSTREAM_OK
                                                                     : UPSTREAM_ERR_CLOSED;
    *rest = bad ? 0 : len - used;
    http_headers_free(&up.headers);
    return res;
}

/* --- TLS --- */

struct ssl_ctx_st *upstream_tls_new(const char *ca_file, const char *setting, char *msg,
                                    size_t msglen)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        snprintf(msg, msglen, "TLS: cannot make a client context");
        return NULL;
    }
    if (ca_file) {
        if (SSL_CTX_load_verify_locations(ctx, ca_file, NULL) != 1) {
            snprintf(msg, msglen, "%s %s: no usable certificate in it", setting, ca_file);
            SSL_CTX_free(ctx);
            return NULL;
        }
    } else {
        SSL_CTX_set_default_verify_paths(ctx);
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    /* sessions are remembered per pool (one host each), never in the context's own cache */
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
    SSL_CTX_sess_set_new_cb(ctx, remember_session);
    return ctx;
}

/* --- readiness probe --- */

typedef struct probe {
    struct bufferevent *bev;
    void (*cb)(bool, void *);
    void *arg;
    struct event *timer;
} probe_t;

static void probe_done(probe_t *pr, bool ok)
{
    void (*cb)(bool, void *) = pr->cb;
    void *arg = pr->arg;
    bufferevent_free(pr->bev);
    event_free(pr->timer);
    free(pr);
    cb(ok, arg);
}

static void probe_event(struct bufferevent *bev, short what, void *arg)
{
    probe_done(arg, (what & BEV_EVENT_CONNECTED) != 0);
}

static void probe_timeout(evutil_socket_t fd, short what, void *arg)
{
    probe_done(arg, false);
}

void upstream_probe(upstream_pool_t *pool, void (*cb)(bool ok, void *arg), void *arg)
{
    probe_t *pr = xcalloc(1, sizeof(*pr));
    pr->cb = cb;
    pr->arg = arg;
    pr->bev = new_bev(pool, NULL); /* an https upstream is ready once its certificate verifies */
    pr->timer = evtimer_new(pool->base, probe_timeout, pr);
    bufferevent_setcb(pr->bev, NULL, NULL, probe_event, pr);
    uint64_t ms = pool->limits->connect_timeout_ms;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
    evtimer_add(pr->timer, &tv);
    if (bufferevent_socket_connect(pr->bev, (struct sockaddr *)&pool->addr, (int)pool->addrlen) !=
        0) {
        struct timeval zero = {0, 0};
        evtimer_add(pr->timer, &zero);
    }
}

/* --- the upstream interface over the pool --- */

typedef struct http_upstream {
    upstream_pool_t *pool;
    char *host_header; /* the Host of every request */
} http_upstream_t;

/* A call is the connection that carries it. */
static upstream_conn_t *conn_of(upstream_call_t *call)
{
    return (upstream_conn_t *)call;
}

static upstream_call_t *http_open(void *state, const upstream_request_t *req,
                                  const upstream_cbs_t *cbs, void *arg)
{
    http_upstream_t *hu = state;
    http_headers_t none;
    http_headers_init(&none);
    size_t blen = req->body ? evbuffer_get_length(req->body) : 0;
    struct evbuffer *out = evbuffer_new();
    http_write_request_head(out, req->method, req->target, req->headers ? req->headers : &none,
                            hu->host_header, req->client_ip,
                            req->has_body || blen > 0 ? (long long)blen : -1, req->extra_headers);
    if (req->body)
        evbuffer_add_buffer(out, req->body);
    upstream_conn_t *up = send_on(hu->pool, out, req->once, req->alone, cbs, arg);
    evbuffer_free(out);
    http_headers_free(&none);
    return (upstream_call_t *)up;
}

static void http_pause(void *state, upstream_call_t *call, bool paused)
{
    upstream_http_pause(conn_of(call), paused);
}

static void http_abandon(void *state, upstream_call_t *call)
{
    upstream_http_abandon(conn_of(call));
}

static void http_discard(void *state, upstream_call_t *call)
{
    upstream_http_discard(conn_of(call));
}

static void http_free(void *state)
{
    http_upstream_t *hu = state;
    free(hu->host_header);
    free(hu);
}

static const upstream_ops_t http_ops = {
    .name = "http",
    .open = http_open,
    .pause = http_pause,
    .abandon = http_abandon,
    .discard = http_discard,
    .free = http_free,
};

upstream_t *upstream_http_new(upstream_pool_t *pool, const char *host_header)
{
    http_upstream_t *hu = xcalloc(1, sizeof(*hu));
    hu->pool = pool;
    hu->host_header = host_header ? xstrdup(host_header) : NULL;
    upstream_t *u = xcalloc(1, sizeof(*u));
    u->ops = &http_ops;
    u->state = hu;
    return u;
}
