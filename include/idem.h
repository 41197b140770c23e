/* The idempotency stage: for a non_idempotent tools/call, derive the key, claim it in the
 * store, forward once, capture the final JSON-RPC response (JSON body or the matching SSE
 * message), record it, and answer duplicates from the store.
 *
 * The proxy calls idem_begin instead of proxy_forward for a protected call, and then feeds
 * the upstream response through the idem_on_* hooks while exchange->call is set. */
#ifndef IDEMGW_IDEM_H
#define IDEMGW_IDEM_H

#include "http_headers.h"
#include "upstream.h"

#include <stdbool.h>
#include <stddef.h>

struct exchange;
struct idem_call;

void idem_begin(struct exchange *ex);
/* A GET stream of a session with calls pending: watch it for their final responses. */
void idem_watch_begin(struct exchange *ex);
void idem_on_head(struct exchange *ex, int status, const http_headers_t *headers);
void idem_on_body(struct exchange *ex, const char *data, size_t len);
void idem_on_end(struct exchange *ex, upstream_result_t res);
/* The upstream answered with another request's response: its connection must not be reused. */
bool idem_answer_foreign(const struct exchange *ex);
/* The call's final response has reached the agent's connection (false for unprotected
 * exchanges, whose responses are not read). */
bool idem_answered(const struct exchange *ex);
/* note, a notifications/cancelled the upstream accepted: a protected call in flight here with
 * the same session, caller and request id is ended now and recorded as cancelled (unknown). */
void idem_cancel_relayed(struct exchange *note);
/* A store write for this call is still pending: the exchange must stay. */
bool idem_busy(const struct exchange *ex);
/* A protected call of session waits for its result on a resumed GET stream. */
bool idem_has_pending(const char *session);
void idem_call_free(struct idem_call *call);

/* Process-wide registry of calls in flight (wait mode, GET-resumed responses). */
struct idem_registry *idem_registry_new(void);
void idem_registry_free(struct idem_registry *r);

#endif
