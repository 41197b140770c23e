/* The upstream: where the gateway sends an MCP request and from where the answer streams back.
 * An ops table (as the store's): the MCP server over HTTP (upstream_http.h) is one
 * implementation, a child process speaking JSON-RPC on its stdio can be another. The request
 * object and the catalogue fetch hold an upstream_t main gives them and call only through it.
 *
 * Callback contract. upstream_open hands the request over and returns the call's handle; no
 * callback runs inside upstream_open (not even for a request that fails at once: that one ends
 * from the loop). Then the owner gets on_head at most once (never when the call fails before an
 * answer begins), on_body any number of times after on_head, and on_end exactly once, last.
 * - From on_head and on_body the owner may pause or resume the call and discard it; from on_end
 *   it may only discard it. It abandons a call from outside that call's callbacks (from another
 *   event: the agent gone, a cancel, the drain), never from inside them: an implementation in
 *   the middle of delivering what it read need not survive it. After upstream_abandon no
 *   callback runs for the call, on_end included.
 * - From on_end the owner may open its next call on the same upstream (a client's next step).
 * - The headers passed to on_head and the bytes passed to on_body are the implementation's:
 *   valid only during the callback; the owner copies what it keeps.
 * - During on_end the owner may still call upstream_discard. Once on_end returns (or once
 *   upstream_abandon returns) the handle is no longer the owner's: the implementation may reuse
 *   or free it, and the owner must not pass it to any call again.
 * - The owner may free itself only after the call is over (on_end returned, or it abandoned the
 *   call), and never from inside on_head or on_body of a call still running. */
#ifndef IDEMGW_UPSTREAM_H
#define IDEMGW_UPSTREAM_H

#include "http_headers.h"

#include <stdbool.h>
#include <stddef.h>

struct evbuffer;

/* How a call ended. A transport maps its own failures onto these. */
typedef enum {
    UPSTREAM_OK = 0,           /* the whole response arrived */
    UPSTREAM_ERR_CONNECT,      /* could not connect: the request was never sent */
    UPSTREAM_ERR_HEAD_TIMEOUT, /* sent, no response head in time */
    UPSTREAM_ERR_IDLE_TIMEOUT, /* response body went silent for too long */
    UPSTREAM_ERR_CLOSED,       /* the server closed or reset before the response ended */
    UPSTREAM_ERR_PROTOCOL,     /* the response was not valid for the transport */
} upstream_result_t;

const char *upstream_result_str(upstream_result_t r);

/* What the owner of a call hears (arg is the one it passed to upstream_open). */
typedef struct upstream_cbs {
    /* the answer begins: its status and headers as an HTTP response to the agent carries
     * them (a transport without them makes them up: 200, Content-Type) */
    void (*on_head)(void *arg, int status, const http_headers_t *headers);
    /* the next bytes of the answer's body */
    void (*on_body)(void *arg, const char *data, size_t len);
    /* the call is over: res says whether the whole answer arrived */
    void (*on_end)(void *arg, upstream_result_t res);
} upstream_cbs_t;

/* One request as the agent sent it, with what the gateway adds. */
typedef struct upstream_request {
    const char *method;            /* "POST", "GET", "DELETE", ... */
    const char *target;            /* origin-form path and query */
    const http_headers_t *headers; /* the agent's; NULL: none. Hop-by-hop ones are dropped */
    const char *extra_headers;     /* lines the gateway adds ("Name: v\r\n"...), or NULL */
    const char *client_ip;         /* the agent's address, or NULL */
    struct evbuffer *body;         /* drained by upstream_open; NULL: none */
    bool has_body;                 /* a body is sent, if empty (POST); false: no body at all */
    /* never sent twice (a non_idempotent tool's call): a transport that sends a request again
     * when a kept-alive channel closed before any byte of its answer must not send this one */
    bool once;
    /* who sent it, as far as the gateway can tell (subject_caller_tag: a digest of what names
     * the caller), for a transport that shares one server between callers; NULL: the gateway's
     * own request, or a transport that did not ask (upstream_ops_t.wants_caller) */
    const char *caller;
    /* its answer cannot be told from a stray one by its JSON-RPC id (a batch, an id the gateway
     * could not replace): a transport that keeps channels alive gives it a new one of its own
     * and never reuses that channel afterwards */
    bool alone;
} upstream_request_t;

/* One request in flight: the implementation's, opaque to the owner. */
typedef struct upstream_call upstream_call_t;

typedef struct upstream_ops {
    const char *name; /* for logs: "http", "stdio" */
    /* the owner should fill upstream_request_t.caller (it costs a digest per request) */
    bool wants_caller;
    /* Sends req; never NULL (a failure is reported through on_end from the loop). */
    upstream_call_t *(*open)(void *state, const upstream_request_t *req, const upstream_cbs_t *cbs,
                             void *arg);
    /* Stops (true) or resumes reading the answer: backpressure from a slow agent. */
    void (*pause)(void *state, upstream_call_t *call, bool paused);
    /* Ends the call now: no more callbacks; the request may be cut off. */
    void (*abandon)(void *state, upstream_call_t *call);
    /* The answer was not the one asked for: whatever carried it is not used again. */
    void (*discard)(void *state, upstream_call_t *call);
    /* Frees the state (calls still running were abandoned first). */
    void (*free)(void *state);
} upstream_ops_t;

/* An upstream: an implementation and its state. */
typedef struct upstream {
    const upstream_ops_t *ops;
    void *state;
} upstream_t;

upstream_call_t *upstream_open(upstream_t *u, const upstream_request_t *req,
                               const upstream_cbs_t *cbs, void *arg);
void upstream_pause(upstream_t *u, upstream_call_t *call, bool paused);
void upstream_abandon(upstream_t *u, upstream_call_t *call);
void upstream_discard(upstream_t *u, upstream_call_t *call);
/* Whether requests to u should say who sent them (upstream_request_t.caller). */
bool upstream_wants_caller(const upstream_t *u);
/* Frees u and its state; NULL is fine. */
void upstream_free(upstream_t *u);

#endif
