/* A caller's notifications/cancelled for a protected call: which call it names, and what the
 * gateway does with it (the tool's on_cancel, policy.h). Pure: values in, a verdict out; the
 * idempotency stage (idem.c) acts on it.
 *
 * finish keeps the cancel at the gateway: the call runs to its end and is recorded, so the
 * caller's retry gets the one execution's result. forward tells the upstream: a call not sent
 * yet is never sent (its key released: nothing ran), a running one is recorded cancelled. */
#ifndef IDEMGW_CANCEL_H
#define IDEMGW_CANCEL_H

#include "policy.h"

#include <jansson.h>
#include <stdbool.h>

/* Who made a request and which: a protected call, or the cancel that names one. */
typedef struct cancel_party {
    const char *subject; /* the resolved caller */
    const char *session; /* Mcp-Session-Id; NULL without a session (2026-07-28, stateless) */
    const json_t *id;    /* the call's JSON-RPC id, or the cancel's params.requestId */
} cancel_party_t;

/* Where the named call is. */
typedef enum {
    CANCEL_CALL_UNSENT = 0, /* claiming its key, or waiting for an identical call: not upstream */
    CANCEL_CALL_RUNNING,    /* the upstream has it */
} cancel_phase_t;

typedef enum {
    CANCEL_PASS = 0, /* no protected call of this caller: the upstream gets the cancel */
    CANCEL_IGNORE,   /* another caller names a protected call in its session: answered 202
                      * here and not passed on, so it cannot stop a call it does not own */
    CANCEL_KEEP,     /* finish: answered 202 here; the call goes on and is recorded */
    CANCEL_DROP,     /* forward, not sent yet: answered 202 here; the call is never sent and
                      * its key released */
    CANCEL_RELAY,    /* forward, running: the upstream gets the cancel; the call ends cancelled */
    CANCEL_N_ACTIONS
} cancel_action_t;

typedef enum {
    CANCEL_NO_MATCH = 0, /* another request */
    CANCEL_MATCH,        /* this call, by its own caller */
    CANCEL_FOREIGN,      /* this call's session and id, but not its caller (or none) */
} cancel_match_t;

/* Whether the cancel names the call: one caller, one session (both none, or the same), and the
 * same request id (a number and a string never match). */
cancel_match_t cancel_match(const cancel_party_t *call, const cancel_party_t *note);
const char *cancel_match_name(cancel_match_t m);

/* What to do with a cancel that names a call of phase whose tool says mode. */
cancel_action_t cancel_decide(on_cancel_t mode, cancel_phase_t phase);

/* Several calls named by one cancel (only without sessions, where ids are not unique): the
 * verdict for the cancel itself. A relay wins (the upstream needs it), then drop and keep. */
cancel_action_t cancel_combine(cancel_action_t a, cancel_action_t b);

/* "pass", "ignore", "keep", "drop", "relay": for log lines. */
const char *cancel_action_name(cancel_action_t a);

#endif
