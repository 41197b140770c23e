/* Which protected call a caller's cancel names, and what on_cancel makes of it. */
#include "cancel.h"
#include "util.h"

#include <string.h>

static const char *const action_names[CANCEL_N_ACTIONS] = {
    [CANCEL_PASS] = "pass", [CANCEL_IGNORE] = "ignore", [CANCEL_KEEP] = "keep",
    [CANCEL_DROP] = "drop", [CANCEL_RELAY] = "relay",
};

/* The verdict by tool setting and phase: one table, read by cancel_decide. */
static const cancel_action_t verdicts[2][2] = {
    [ON_CANCEL_FINISH] = {[CANCEL_CALL_UNSENT] = CANCEL_KEEP, [CANCEL_CALL_RUNNING] = CANCEL_KEEP},
    [ON_CANCEL_FORWARD] =
        {[CANCEL_CALL_UNSENT] = CANCEL_DROP, [CANCEL_CALL_RUNNING] = CANCEL_RELAY},
};

static bool same_text(const char *a, const char *b)
{
    if (!a || !b)
        return a == b;
    return strcmp(a, b) == 0;
}

/* A request id as JSON-RPC has them: a string or an integer. */
static bool is_id(const json_t *id)
{
    return id && (json_is_string(id) || json_is_integer(id));
}

cancel_match_t cancel_match(const cancel_party_t *call, const cancel_party_t *note)
{
    /* json_equal says 1 == 1.0; ids compare as written, so their types must agree too */
    if (!is_id(call->id) || !is_id(note->id) || json_typeof(call->id) != json_typeof(note->id) ||
        !json_equal(call->id, note->id) || !same_text(call->session, note->session))
        return CANCEL_NO_MATCH;
    if (call->subject && note->subject && strcmp(call->subject, note->subject) == 0)
        return CANCEL_MATCH;
    /* without a session an id says nothing about whose request it is */
    return call->session ? CANCEL_FOREIGN : CANCEL_NO_MATCH;
}

const char *cancel_match_name(cancel_match_t m)
{
    return m == CANCEL_MATCH ? "match" : m == CANCEL_FOREIGN ? "foreign" : "no_match";
}

cancel_action_t cancel_decide(on_cancel_t mode, cancel_phase_t phase)
{
    if ((unsigned)mode > ON_CANCEL_FORWARD || (unsigned)phase > CANCEL_CALL_RUNNING)
        return CANCEL_PASS;
    return verdicts[mode][phase];
}

cancel_action_t cancel_combine(cancel_action_t a, cancel_action_t b)
{
    if ((unsigned)a >= CANCEL_N_ACTIONS)
        return b;
    if ((unsigned)b >= CANCEL_N_ACTIONS)
        return a;
    return a >= b ? a : b; /* the enum lists the verdicts weakest first */
}

const char *cancel_action_name(cancel_action_t a)
{
    if ((unsigned)a >= ARRAY_LEN(action_names))
        return "unknown";
    return action_names[a];
}
