/* The ids protected calls go upstream with. A non_idempotent tools/call (protected, or passed
 * through with the store down) is forwarded with a JSON-RPC id of the gateway's own (rpc_id.h)
 * and its answer is mapped back to the caller's id by a filter on its exchange (exchange.h),
 * so the call may ride a kept-alive upstream connection: an answer that carries any other id
 * was left on that connection by an earlier request (or came late), and ends the call as a
 * protocol error, recorded unknown, never handed to the caller.
 *
 * It is a handler main registers first (handler.h); it never takes a request, it sets filters
 * and rewrites bodies and passes:
 * - a protected call: its filter assigns the id when the call is forwarded, and rewrites the
 *   answer (a JSON body or an SSE stream, compressed or not) strictly;
 * - a notifications/cancelled naming such a call of the same session: its requestId becomes
 *   the assigned id, so the server knows which request is meant (the idempotency stage still
 *   decides whether it goes up at all);
 * - a GET stream of a session whose protected call's POST stream ended before its answer: the
 *   answer comes on it with the assigned id, which is mapped back there (leniently: a GET
 *   stream carries answers to many requests).
 * The ids are the worker's: a GET stream or a cancel that reaches another worker sees the
 * assigned id unmapped (as a pending call finishes only on the worker that forwarded it). */
#ifndef IDEMGW_CALL_IDS_H
#define IDEMGW_CALL_IDS_H

#include "exchange.h"
#include "handler.h"

#include <stddef.h>

typedef struct call_ids call_ids_t;

call_ids_t *call_ids_new(void);
/* After the proxy: its exchanges' filters are this module's. */
void call_ids_free(call_ids_t *ids);

/* The handler (arg: the call_ids_t). */
handler_verdict_t call_ids_offer(void *arg, exchange_t *ex);

/* Calls whose ids are known: in flight, or waiting for an answer on a GET stream. */
size_t call_ids_tracked(const call_ids_t *ids);

#endif
