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

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct evbuffer;
struct bufferevent;
struct evconnlistener;
struct sockaddr;

typedef struct http_request {
    uint64_t conn_id;  /* the connection that read it, for logs */
    int method;        /* llhttp_method_t */
    char *method_name; /* "POST" */
    char *target;      /* request target as received */
    http_headers_t headers;
    struct evbuffer *body; /* complete body */
    bool keep_alive;       /* the agent wants the connection kept */
    char client_ip[64];    /* peer address, for X-Forwarded-For */
    uint64_t start_ms;     /* when the request head started */
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

/* What a listener serves: the handler of its requests. */
typedef struct http_site {
    http_handler_fn handler;
    void *arg;        /* the handler's own context (the proxy, the admin context) */
    const char *name; /* "mcp" or "admin", for logs */
} http_site_t;

/* Accept callback for evconnlistener_new_bind; arg is an http_site_t that outlives it. */
void http_conn_accept(struct evconnlistener *l, int fd, struct sockaddr *sa, int socklen,
                      void *arg);

/* A connection handed over by another worker (handoff.h): bytes are what that worker had read
 * of it, parsed here as if just received. Takes fd. */
void http_conn_adopt(int fd, const http_site_t *site, const char *bytes, size_t len);

/* Hands the agent's socket and req (re-serialised, with any input read after it) to worker,
 * and closes this worker's copy without writing to it. False when it cannot: a connection
 * that was itself handed over, one with output pending, or the send failed. */
bool http_conn_hand_off(http_conn_t *conn, const http_request_t *req, int worker);

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

/* A gateway error as a JSON-RPC error body (id_text may be NULL). */
void http_conn_respond_error(http_conn_t *conn, int status, const char *id_text, int code,
                             const char *message, bool keep_alive);

/* Fills req->client_ip from the connection's peer address. */
void http_conn_fill_client_ip(http_conn_t *conn, http_request_t *req);

/* Closes every idle keep-alive connection (drain). */
void http_conn_close_idle(void);

#endif
