#include "outcome.h"
#include "util.h"

/* A JSON-RPC error or an HTTP refusal is the upstream declining; a call never sent or cut
 * short did not get an answer at all. */
static const struct {
    const char *why, *outcome;
    bool executed;
} outcomes[WHY_N] = {
    [WHY_RESULT] = {"result", "executed", true},
    [WHY_TOOL_ERROR] = {"tool error", "executed", true},
    [WHY_INPUT_REQUIRED] = {"input required: not final", "input_required", false},
    [WHY_JSONRPC_ERROR] = {"json-rpc error", "rejected_by_upstream", false},
    [WHY_REFUSED] = {"refused by upstream", "rejected_by_upstream", false},
    [WHY_REDIRECTED] = {"redirected by upstream", "redirected", false},
    [WHY_NEVER_SENT] = {"never sent", "not_sent", false},
    [WHY_CANCELLED] = {"cancelled by its caller", "cancelled", false},
    [WHY_DROPPED] = {"cancelled by its caller before it was sent", "cancelled", false},
    [WHY_UNDECODABLE] = {"answer not decodable", "executed", true},
    [WHY_FOREIGN] = {"response id mismatch", "unknown", false},
    [WHY_UNKNOWN] = {"outcome unknown", "unknown", false},
};

const char *outcome_why_str(outcome_why_t why)
{
    return outcomes[why].why;
}

const char *outcome_name(outcome_why_t why)
{
    return outcomes[why].outcome;
}

bool outcome_executed(outcome_why_t why)
{
    return outcomes[why].executed;
}

store_state_t outcome_final_state(mcp_resp_class_t cls, on_tool_error_t on_tool_error,
                                  outcome_why_t *why)
{
    switch (cls) {
    case MCP_RESP_RESULT:
        *why = WHY_RESULT;
        return STORE_STATE_SUCCEEDED;
    case MCP_RESP_TOOL_ERROR:
        *why = WHY_TOOL_ERROR;
        return on_tool_error == ON_TOOL_ERROR_STORE ? STORE_STATE_SUCCEEDED : STORE_STATE_FAILED;
    case MCP_RESP_INPUT_REQUIRED:
        *why = WHY_INPUT_REQUIRED;
        return STORE_STATE_FAILED;
    case MCP_RESP_ERROR:
    case MCP_RESP_FOREIGN:
    case MCP_RESP_OTHER:
        break;
    }
    *why = WHY_JSONRPC_ERROR;
    return STORE_STATE_FAILED;
}
