/* The HTTP upstream: a pool of keep-alive HTTP/1.1 connections (plain or TLS), each parsing
 * one response at a time with llhttp and streaming it to its owner. The MCP server's pool is
 * the first implementation of the upstream interface (upstream.h, upstream_http_new); the
 * gateway's other HTTP clients (the JWKS fetch, the OTLP export) use the pool directly.
 *
 * Contract: upstream_http_send hands the request bytes to a connection and returns it. The owner
 * then gets on_head once (unless the exchange fails first), on_body any number of times, and
 * on_end exactly once, last. During on_end the owner may still call upstream_http_discard; once
 * on_end returns the connection is no longer the owner's: it goes back to the pool or is closed.
 * upstream_http_abandon ends the relationship early (the connection is closed, no more
 * callbacks). Callbacks never run inside upstream_http_send. */
#ifndef IDEMGW_UPSTREAM_HTTP_H
#define IDEMGW_UPSTREAM_HTTP_H

#include "http_headers.h"
#include "upstream.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct evbuffer;

struct event_base;
struct ssl_ctx_st;

typedef struct upstream_conn upstream_conn_t;
typedef struct upstream_pool upstream_pool_t;

/* What the pool reads at each use, so a reload that changes it takes effect at once. */
typedef struct upstream_limits {
    uint64_t connect_timeout_ms; /* connect (and TLS handshake) */
    uint64_t timeout_ms;         /* request sent -> response head */
    uint64_t idle_timeout_ms;    /* most silence inside a response, and of an idle connection */
    int pool;                    /* idle keep-alive connections kept */
} upstream_limits_t;

typedef struct upstream_opts {
    struct event_base *base;
    struct ssl_ctx_st *tls; /* an https upstream (verifying host), else NULL */
    const char *host;       /* copied */
    unsigned port;
    const upstream_limits_t *limits; /* outlives the pool */
    const bool *draining;            /* when true, connections are not kept; may be NULL */
    /* counted TLS handshakes: full ones, and those that resumed a session the upstream gave on
     * an earlier connection; may be NULL */
    uint64_t *tls_full, *tls_resumed;
    uint64_t *connects; /* counted connections opened (a pooled one reused is not); may be NULL */
} upstream_opts_t;

/* A TLS client context that verifies the upstream's certificate against ca_file (PEM), or the
 * system's CA store when ca_file is NULL. NULL with msg on failure, naming ca_file by setting,
 * the configuration key it came from ("upstream_ca_file"). */
struct ssl_ctx_st *upstream_tls_new(const char *ca_file, const char *setting, char *msg,
                                    size_t msglen);

/* Resolves the upstream address (blocking, at start). NULL with msg on failure. */
upstream_pool_t *upstream_pool_new(const upstream_opts_t *opts, char *msg, size_t msglen);
void upstream_pool_free(upstream_pool_t *pool);
/* Closes idle connections (drain, reload). */
void upstream_pool_close_idle(upstream_pool_t *pool);

/* Sends request (moved out of the buffer) on a pooled connection that is provably clean (no
 * byte and no end of stream arrived on it since its last answer), or on a new one. A request
 * on a pooled connection that the server closes before any byte of the answer is sent once
 * more on a new connection, unless once: a request that must never be sent twice (a
 * non_idempotent tool's call) then ends as UPSTREAM_ERR_CLOSED. */
upstream_conn_t *upstream_http_send(upstream_pool_t *pool, struct evbuffer *request, bool once,
                                    const upstream_cbs_t *cbs, void *arg);
/* Stops or resumes reading the response (backpressure from a slow agent). */
void upstream_http_pause(upstream_conn_t *up, bool paused);
void upstream_http_abandon(upstream_conn_t *up);
/* The response read on up was not the one asked for: close the connection when the exchange
 * ends instead of pooling it. May be called from any callback, on_end included. */
void upstream_http_discard(upstream_conn_t *up);

/* The response path without a socket (for the fuzzer): parses one response from bytes that end
 * where the server closed. Calls on_head and on_body as a connection would, never on_end; returns
 * the result and in *rest how many bytes followed the response. */
/* How long an idle connection may be kept, given the response's Keep-Alive header (NULL when
 * absent): a second under the server's own timeout, at most dflt; 0 means do not keep it. */
uint64_t upstream_keep_alive_ms(const char *keep_alive, uint64_t dflt);

upstream_result_t upstream_parse_response(const char *data, size_t len, const upstream_cbs_t *cbs,
                                          void *arg, size_t *rest);

/* Probes the upstream with a TCP connect; cb(ok, arg) runs later from the loop. */
void upstream_probe(upstream_pool_t *pool, void (*cb)(bool ok, void *arg), void *arg);

/* The MCP server over HTTP as an upstream (upstream.h): each request becomes an HTTP/1.1
 * request on pool, with host_header (copied) as its Host. The pool must outlive it; freed with
 * upstream_free. */
upstream_t *upstream_http_new(upstream_pool_t *pool, const char *host_header);

#endif
