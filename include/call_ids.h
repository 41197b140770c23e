/* The ids requests go upstream with. A non_idempotent tools/call (protected, or passed
 * through with the store down) and, on an HTTP upstream (every_request), every request with a
 * JSON-RPC id, is forwarded with an id of the gateway's own (rpc_id.h) and its answer is mapped
 * back to the caller's id by a filter on its exchange (exchange.h), so it may ride a kept-alive
 * upstream connection: an answer that carries any other id was left on that connection by an
 * earlier request (or came late), and is never handed to the caller (a protected call ends as a
 * protocol error, recorded unknown; any other request gets a JSON-RPC error with its own id).
 * A request whose answer no id can tell (a batch, an id member the gateway cannot replace) goes
 * up on a connection of its own instead (exchange_upstream_alone).
 *
 * It is a handler main registers first (handler.h); it sets filters and rewrites bodies and
 * passes, but for one kind of cancel:
 * - a call: its filter assigns the id when the call is forwarded, and rewrites the answer (a
 *   JSON body or an SSE stream, compressed or not) strictly;
 * - a notifications/cancelled naming such a call of the same caller (subject_same_caller on
 *   the two requests, and the same session or none): its requestId becomes the assigned id, so
 *   the server knows which request is meant (the idempotency stage still decides whether it
 *   goes up at all). A cancel from another caller is never rewritten; without a session, and
 *   with every_request, one naming no call of its own caller is taken and answered 202 here:
 *   the server knows no request by that id that is the caller's;
 * - a GET stream of a session whose call's POST stream ended before its answer: the answer
 *   comes on it with the assigned id, which is mapped back there (leniently: a GET stream
 *   carries answers to many requests).
 * The ids are the worker's: a GET stream or a cancel that reaches another worker sees the
 * assigned id unmapped (as a pending call finishes only on the worker that forwarded it). */
#ifndef IDEMGW_CALL_IDS_H
#define IDEMGW_CALL_IDS_H

#include "exchange.h"
#include "handler.h"

#include <stdbool.h>
#include <stddef.h>

struct subject;
typedef struct call_ids call_ids_t;

typedef struct call_ids_ctx {
    const struct subject *subject; /* tells whose call a cancel names (subject_same_caller) */
    /* every request with an id goes up with an assigned id, not only protected calls: the
     * upstream's kept-alive connections may carry a stray answer (an HTTP one; a stdio child
     * is given its ids by its own transport) */
    bool every_request;
} call_ids_ctx_t;

call_ids_t *call_ids_new(const call_ids_ctx_t *ctx);
/* After the proxy: its exchanges' filters are this module's. */
void call_ids_free(call_ids_t *ids);

/* The handler (arg: the call_ids_t). */
handler_verdict_t call_ids_offer(void *arg, exchange_t *ex);

/* Calls whose ids are known: in flight, or waiting for an answer on a GET stream. */
size_t call_ids_tracked(const call_ids_t *ids);

#endif
