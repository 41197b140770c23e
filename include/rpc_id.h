/* JSON-RPC ids the gateway assigns to the requests it forwards, and the answer mapped back to
 * the caller's id. A protected call goes up with an id of the gateway's own, so an answer on a
 * kept-alive connection is known for the call's own by its id: one that carries any other id
 * (a stray or late answer to an earlier request) is a desync, never the caller's answer. This
 * file is the pure part: the ids' form, the request and cancel rewritten, and an answer body
 * (JSON, or an SSE stream, compressed or not) rewritten as it streams. No I/O.
 *
 * The form is a string, "idemgw-<16 hex>-<n>": the hex is random per process (workers and
 * replicas that share an upstream session never pick the same id, nor a restarted gateway one
 * its predecessor had out), n counts the process's calls. Agents number their requests with
 * small integers or their own strings; none is expected to send this prefix, and an id that
 * differs from every agent's keeps the server's in-flight table of a session free of clashes. */
#ifndef IDEMGW_RPC_ID_H
#define IDEMGW_RPC_ID_H

#include "decode.h"
#include "mcp.h"
#include "util.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct evbuffer;

/* Room for an assigned id's JSON text, quotes and terminator included. */
#define RPC_ID_TEXT_MAX 48

typedef enum {
    RPC_ID_OK = 0,
    RPC_ID_DESYNC,     /* a response to another request (or to none): the channel is out of step */
    RPC_ID_TOO_LARGE,  /* a JSON answer or one SSE event outgrew the limit */
    RPC_ID_UNREADABLE, /* the answer's Content-Encoding could not be decoded */
} rpc_id_status_t;

const char *rpc_id_status_str(rpc_id_status_t st);

/* The JSON text of the n-th assigned id of a process whose nonce is hex (16 hex digits). */
void rpc_id_format(char out[RPC_ID_TEXT_MAX], const char *nonce, uint64_t n);

/* A request body with its top-level "id" set to id_text (a JSON value's text), every other
 * byte as it was; NULL when the body has no id member to replace. Length in *out_len. */
char *rpc_id_set_request_id(const char *body, size_t len, const char *id_text, size_t *out_len);
/* The same, in place in a request's body (its bytes before the id and the id rewritten, the
 * rest left where it is); false, the body untouched, when it has no id member to replace. body
 * is a buffer of the caller's own, its start not frozen (evbuffer_prepend). parsed, when not
 * NULL, is the parse of exactly these bytes (mcp_parse): where it found the id is used rather
 * than walking the body again (a body changed since must not be passed with it). */
bool rpc_id_put_request_id(struct evbuffer *body, const char *id_text,
                           const mcp_msg_t *parsed) MUST_CHECK;
/* The same for params.requestId of a notifications/cancelled. */
char *rpc_id_set_cancel_id(const char *body, size_t len, const char *id_text, size_t *out_len);

/* Whether two ids' JSON texts are the same JSON value: byte for byte without parsing, else
 * as jansson reads them (an escaped string, 1 and 1.0). */
bool rpc_id_same(const char *a, size_t alen, const char *b, size_t blen);

/* Which caller id an id seen in the answer stands for: its JSON text (the callee's, valid
 * until the next call), or NULL when the id is none the gateway assigned. id: the id's JSON
 * text as the answer wrote it (len bytes, not terminated), NULL when the answer has no id
 * (read as null). response: the id is a response's (the call's final answer), not a
 * requestId named in a notification. */
typedef const char *(*rpc_id_lookup_fn)(void *arg, const char *id, size_t len, bool response);

typedef enum {
    RPC_MSG_PASS = 0, /* nothing to map: relay it as it is */
    RPC_MSG_MAPPED,   /* *out holds the message with the caller's id */
    RPC_MSG_DESYNC,   /* strict, and a response whose id the lookup does not know */
} rpc_msg_verdict_t;

/* One JSON-RPC message (a JSON body or an SSE event's data): a response whose id the lookup
 * knows gets the caller's id; a notification or request whose params.requestId it knows gets
 * that mapped too. strict: the message answers the one request forwarded, so a response with an
 * id the lookup does not know (or none, or a batch holding one) is a desync. Text that is not
 * JSON passes. *out (malloc'd, *out_len bytes) only with RPC_MSG_MAPPED. */
rpc_msg_verdict_t rpc_id_map_message(const char *text, size_t len, rpc_id_lookup_fn lookup,
                                     void *arg, bool strict, char **out, size_t *out_len);

/* An answer body rewritten as it arrives. */
typedef enum {
    RPC_BODY_JSON = 0, /* one message, read whole before any byte goes on */
    RPC_BODY_SSE,      /* an event stream, each event rewritten once complete */
} rpc_body_t;

typedef struct rpc_id_rewriter rpc_id_rewriter_t;

/* coding: the answer's Content-Encoding (decoded here; what comes out is identity). limit:
 * most bytes of a JSON answer, or of one SSE event, once decoded. */
rpc_id_rewriter_t *rpc_id_rewriter_new(rpc_body_t kind, decode_coding_t coding, size_t limit,
                                       rpc_id_lookup_fn lookup, void *arg, bool strict);
/* Appends to out what can go on now. After a status other than OK the rewriter takes nothing
 * more and out must not be relayed further. */
rpc_id_status_t rpc_id_rewriter_feed(rpc_id_rewriter_t *r, const char *data, size_t len,
                                     struct evbuffer *out) MUST_CHECK;
/* The body ended (complete: the whole answer arrived): appends what was kept back. An answer
 * that did not arrive whole yields nothing more: what it kept back may name the assigned id. */
rpc_id_status_t rpc_id_rewriter_finish(rpc_id_rewriter_t *r, bool complete,
                                       struct evbuffer *out) MUST_CHECK;
void rpc_id_rewriter_free(rpc_id_rewriter_t *r);

#endif
