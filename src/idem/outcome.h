/* What happened to a protected call, decided in one place: the state its key is recorded in,
 * why, what the request's log line calls it, and whether it counts as an execution. */
#ifndef IDEMGW_OUTCOME_H
#define IDEMGW_OUTCOME_H

#include "mcp.h"
#include "policy.h"
#include "store.h"

#include <stdbool.h>

typedef enum {
    WHY_RESULT = 0,     /* a result: the tool ran */
    WHY_TOOL_ERROR,     /* a result with isError: the tool ran and said it failed */
    WHY_INPUT_REQUIRED, /* the tool asks for input: not final */
    WHY_JSONRPC_ERROR,  /* the upstream declined the call */
    WHY_REFUSED,        /* an HTTP 4xx from the upstream */
    WHY_REDIRECTED,     /* an HTTP 3xx from the upstream: it ran nothing */
    WHY_NEVER_SENT,     /* the upstream could not be reached */
    WHY_CANCELLED,      /* its caller cancelled it while it ran */
    WHY_DROPPED,        /* its caller cancelled it before it was sent (on_cancel: forward) */
    WHY_UNDECODABLE,    /* it ran; its answer's coding could not be read */
    WHY_FOREIGN,        /* the upstream answered with another request's response */
    WHY_UNKNOWN,        /* no complete answer */
    WHY_N
} outcome_why_t;

/* The phrase for logs ("json-rpc error"). */
const char *outcome_why_str(outcome_why_t why);
/* The log line's outcome ("executed", "rejected_by_upstream", ...) */
const char *outcome_name(outcome_why_t why);
/* Only a result (a tool error included: the tool ran) counts as an execution. */
bool outcome_executed(outcome_why_t why);

/* The state a final response of class cls records, and why. */
store_state_t outcome_final_state(mcp_resp_class_t cls, on_tool_error_t on_tool_error,
                                  outcome_why_t *why);

#endif
