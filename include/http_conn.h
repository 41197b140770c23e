/* An agent's HTTP/1.1 connection: reads one request at a time with llhttp, enforces the head
 * and body limits and the client timeouts, hands each complete request to its handler, and
 * carries the handler's response back.
 *
 * Contract with the handler (proxy or admin):
 * - handler(arg, conn, req) takes ownership of req. The connection reads nothing more until the
 *   handler calls http_conn_response_done (or http_conn_respond, which calls it).
 * - While a response is in progress the handler writes through http_conn_output() and may
 *   register a drain callback for backpressure.
 * - When the agent goes away, the connection calls gone(arg) once and forgets the handler;
 *   after that the handler must not touch conn. The connection frees itself later, from the
 *   event loop, never inside a callback chain. */
#ifndef IDEMGW_HTTP_CONN_H
#define IDEMGW_HTTP_CONN_H

#include "http_headers.h"
#include "stats.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct evbuffer;
struct bufferevent;
struct evconnlistener;
struct sockaddr;
struct ssl_ctx_st;
struct x509_st;

typedef struct http_request {
    uint64_t conn_id;  /* the connection that read it, for logs */
    int method;        /* llhttp_method_t */
    char *method_name; /* "POST" */
    char *target;      /* request target as received, then as the router rewrote it */
    char *routed_from; /* the target as received when routes.c rewrote it for a server, else
                          NULL: what a hand-off to another worker sends, so it routes again */
    http_headers_t headers;
    struct evbuffer *body; /* complete body */
    bool keep_alive;       /* the agent wants the connection kept */
    char client_ip[64];    /* peer address, for X-Forwarded-For */
    uint64_t start_ms;     /* when the request head started */
    struct x509_st *peer_cert; /* the agent's verified TLS client certificate, or NULL; a
                                  reference of the request's own */
} http_request_t;

void http_request_free(http_request_t *req);

typedef struct http_conn http_conn_t;

typedef void (*http_handler_fn)(void *arg, http_conn_t *conn, http_request_t *req);

typedef enum {
    CONN_IDLE = 0, /* keep-alive, waiting for the next request */
    CONN_READING,  /* a request head or body is arriving */
    CONN_HANDLING, /* a handler owns the request and is answering */
    CONN_CLOSING,  /* flushing the last bytes, then closed */
} http_conn_state_t;

const char *http_conn_state_str(http_conn_state_t st);

/* What a connection reads at each use, so a reload that changes it takes effect at once. */
typedef struct http_limits {
    uint64_t max_header_bytes;  /* request head -> 431 */
    uint64_t max_body_bytes;    /* request body -> 413 */
    uint64_t header_timeout_ms; /* the whole head must arrive within */
    uint64_t body_timeout_ms;   /* the whole body must arrive within */
    uint64_t idle_timeout_ms;   /* keep-alive idle before close */
    int max_connections;
} http_limits_t;

/* The connections of one process (every site): made by main, outliving them. */
typedef struct http_context {
    struct event_base *base;
    const http_limits_t *limits;
    server_stats_t *stats;
    const bool *draining;        /* no new connections or requests; idle ones close */
    bool serve_while_draining;   /* a drain still accepts, and answers each request then closes
                                    (the admin port: /readyz must say 503, not refuse) */
    void (*on_close)(void *arg); /* a connection closed (a drain may be finished); may be NULL */
    void *arg;
    uint64_t next_id;      /* the last connection id given */
    uint64_t open;         /* connections open now */
    bool refusing;         /* an episode of refused connections is on (logged once) */
    struct http_conn *all; /* every open connection */
} http_context_t;

/* What a listener serves: the handler of its requests. */
typedef struct http_site {
    http_context_t *ctx;
    http_handler_fn handler;
    void *arg;        /* the handler's own context (the proxy, the admin context) */
    const char *name; /* "mcp" or "admin", for logs */
    /* the body of an error the connection answers itself (431, 413, 408...), malloc'd; NULL:
     * the message as plain text */
    char *(*error_body)(const char *message);
    const char *error_type; /* its Content-Type */
    /* agents connect with TLS when set; each connection takes a reference to the context it
     * is accepted with, so the owner may replace (and free) it at a reload */
    struct ssl_ctx_st *tls;
} http_site_t;

/* Accept callback for evconnlistener_new_bind; arg is an http_site_t that outlives it. */
void http_conn_accept(struct evconnlistener *l, int fd, struct sockaddr *sa, int socklen,
                      void *arg);

/* A connection handed over by another worker (handoff.h): bytes are what that worker had read
 * of it, parsed here as if just received. Takes fd. */
void http_conn_adopt(int fd, const http_site_t *site, const char *bytes, size_t len);

/* Hands the agent's socket and req (re-serialised, with any input read after it) to another
 * process with send(arg, fd, bytes, len), and closes this copy without writing to it. False
 * when it cannot: a TLS connection (its session cannot leave the process), one that was
 * itself handed over, one with output pending, more than max_bytes to pass on, or the send
 * failed. */
typedef bool (*http_send_fd_fn)(void *arg, int fd, const char *bytes, size_t len);
bool http_conn_hand_off(http_conn_t *conn, const http_request_t *req, size_t max_bytes,
                        http_send_fd_fn send, void *arg);

uint64_t http_conn_id(const http_conn_t *conn);
struct evbuffer *http_conn_output(http_conn_t *conn);
size_t http_conn_output_len(http_conn_t *conn);

/* Writes queued output to the socket now rather than on the next loop pass (a streamed event
 * reaches the agent one loop pass sooner). What the socket does not take stays queued. */
void http_conn_flush(http_conn_t *conn);

/* Backpressure and disconnect notifications for the handler of the current request. drained
 * runs when the output has fallen below the low watermark; gone runs once if the agent goes. */
void http_conn_set_observer(http_conn_t *conn, void (*drained)(void *), void (*gone)(void *),
                            void *arg);

/* The response is complete. keep_alive false closes the connection once flushed. */
void http_conn_response_done(http_conn_t *conn, bool keep_alive);

/* A whole response in one call; then response_done. extra: "Name: value\r\n" lines or NULL. */
void http_conn_respond(http_conn_t *conn, int status, const char *content_type, const char *body,
                       size_t len, const char *extra, bool keep_alive);

/* Fills req->client_ip from the connection's peer address. */
void http_conn_fill_client_ip(http_conn_t *conn, http_request_t *req);

/* Closes every idle keep-alive connection (drain). */
void http_conn_close_idle(http_context_t *ctx);

#endif
