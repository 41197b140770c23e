#include "answers.h"
#include "mcp.h"
#include "util.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A caller that cannot be identified, whether the identity is missing or unusable. */
#define SUBJECT_REFUSED                                                                            \
    "Refused: this tool is protected against duplicate execution, and %s, so the call cannot be "  \
    "attributed to a caller. Nothing was executed. Retrying will be refused the same way until "   \
    "the caller is identified."

static const struct {
    const char *code;
    const char *executed; /* JSON: false or "unknown" */
    const char *outcome;
    const char *text; /* up to two %s: detail, detail2 */
} answers[ANSWER_N] = {
    [ANSWER_IN_PROGRESS] = {"in_progress", "false", "in_progress",
                            "This tool call is already running: an identical call (same tool, "
                            "same arguments, same caller) started at %s and has not finished yet. "
                            "It was NOT executed again. Do not retry it right now. Wait for the "
                            "first call to finish, then call again with exactly the same "
                            "arguments to receive its result."},
    [ANSWER_CANCELLED] = {"cancelled", "\"unknown\"", "unknown",
                          "An identical earlier call (started at %s) was cancelled by its caller "
                          "while it ran. It may have executed before it was stopped; its outcome "
                          "is unknown. It was NOT executed again, and identical calls will not be "
                          "executed until the idempotency window ends. Check whether the earlier "
                          "call took effect (for example with a read or status tool) before doing "
                          "anything else."},
    [ANSWER_UNKNOWN] = {"outcome_unknown", "false", "unknown",
                        "An identical earlier call (started at %s) may have executed, but its "
                        "outcome is unknown: the upstream server did not answer completely. To "
                        "avoid doing it twice, it was NOT executed again, and identical calls will "
                        "not be executed until the idempotency window ends. Check whether the "
                        "earlier call took effect (for example with a read or status tool) before "
                        "doing anything else."},
    [ANSWER_FOREIGN] = {"outcome_unknown", NULL, "unknown",
                        "The upstream server answered this call with the response to a different "
                        "request, so whether this call executed is unknown. That answer was "
                        "discarded. Identical calls will not be executed until the idempotency "
                        "window ends. Check whether the call took effect (for example with a read "
                        "or status tool) before doing anything else."},
    [ANSWER_CUT] = {"outcome_unknown", "\"unknown\"", "unknown",
                    "This call reached the upstream server, but the server's answer was cut off "
                    "before it was complete, so whether the call executed is unknown. %s Check "
                    "whether the call took effect (for example with a read or status tool) "
                    "before doing anything else."},
    [ANSWER_KEY_REUSED] = {"key_reused", "false", "refused",
                           "Refused: this idempotency key was already used for a call with "
                           "different arguments. Nothing was executed. Use a new key for a "
                           "different call, or repeat the original arguments to get the original "
                           "result."},
    [ANSWER_STORE_DOWN] = {"store_unavailable", "false", "refused",
                           "Not executed: the gateway's idempotency store is unavailable, so this "
                           "call could not be protected against running twice. Nothing was "
                           "executed. It is safe to retry the same call later."},
    [ANSWER_NO_STORE] = {"store_not_configured", "false", "refused",
                         "Not executed: this tool is protected against duplicate execution, but "
                         "the gateway in front of it has no idempotency store configured, so it "
                         "refuses such calls. Nothing was executed. Retrying will be refused the "
                         "same way until the gateway's operator configures a store."},
    [ANSWER_SHUTTING_DOWN] = {"store_unavailable", "false", "refused",
                              "Not executed: the gateway is shutting down, so this call could not "
                              "be protected against running twice. Nothing was executed. It is "
                              "safe to retry the same call."},
    [ANSWER_STORE_ERROR] = {"store_error", "false", "refused",
                            "Not executed: the gateway's idempotency store rejected this call, so "
                            "it could not be protected against running twice. Nothing was "
                            "executed. Repeating the same call will fail the same way; the "
                            "gateway's operator has the error in the gateway's log."},
    [ANSWER_NO_SUBJECT] = {"no_subject", "false", "refused", SUBJECT_REFUSED},
    [ANSWER_BAD_SUBJECT] = {"bad_subject", "false", "refused", SUBJECT_REFUSED},
    [ANSWER_BAD_TOKEN] = {"bad_token", "false", "refused",
                          "Refused: this tool is protected against duplicate execution, and the "
                          "caller's access token was not accepted (%s), so the call cannot be "
                          "attributed to a caller. Nothing was executed. Retrying with the same "
                          "token will be refused the same way: an expired token must be "
                          "refreshed first; for any other reason the token or the gateway's "
                          "settings must change."},
    [ANSWER_BAD_ARGUMENTS] = {"bad_arguments", "false", "refused",
                              "Refused: the call's arguments cannot be put in canonical form "
                              "(%s), so duplicates could not be recognised. Nothing was "
                              "executed."},
    [ANSWER_BAD_KEY] = {"bad_key", "false", "refused", "Refused: %s (%s). Nothing was executed."},
    [ANSWER_STILL_RUNNING] = {"still_running", "\"running\"", "still_running",
                              "This call is still running (it started at %s) and takes longer "
                              "than usual. It runs once and will not be executed again: do NOT "
                              "repeat it now. The gateway keeps its result: later, repeat exactly "
                              "the same call to receive it."},
    [ANSWER_REPLAY_FAILED] = {"replay_failed", "false", "refused",
                              "This call already ran, but its stored result could not be "
                              "replayed. It was NOT executed again."},
};

bool answer_has_later(answer_t a)
{
    return a == ANSWER_IN_PROGRESS || a == ANSWER_UNKNOWN || a == ANSWER_CANCELLED ||
           a == ANSWER_FOREIGN || a == ANSWER_CUT || a == ANSWER_STILL_RUNNING;
}

const char *answer_code(answer_t a)
{
    return answers[a].code;
}

const char *answer_outcome(answer_t a)
{
    return answers[a].outcome;
}

char *answer_body(answer_t a, const char *id_text, const char *key_hash, const char *detail,
                  const char *detail2, const char *hint)
{
    char text[1600], status[300];
    int n = snprintf(text, sizeof(text), answers[a].text, detail ? detail : "an earlier time",
                     detail2 ? detail2 : "");
    if (hint && n > 0 && (size_t)n < sizeof(text))
        snprintf(text + n, sizeof(text) - (size_t)n, " %s", hint);
    if (answers[a].executed)
        snprintf(status, sizeof(status), "{\"code\":\"%s\",\"executed\":%s%s%s%s}", answers[a].code,
                 answers[a].executed, key_hash ? ",\"key_hash\":\"" : "", key_hash ? key_hash : "",
                 key_hash ? "\"" : "");
    else
        snprintf(status, sizeof(status), "{\"code\":\"%s\"%s%s%s}", answers[a].code,
                 key_hash ? ",\"key_hash\":\"" : "", key_hash ? key_hash : "",
                 key_hash ? "\"" : "");
    return mcp_tool_error_body(id_text, text, status);
}

char *answer_replay_too_large(const char *id_text, const char *marker, const char *first_seen)
{
    char text[400];
    snprintf(text, sizeof(text),
             "This call already ran successfully (first seen %s). Its result was too large for "
             "the gateway to keep, so it cannot be shown again; it was NOT executed a second "
             "time.",
             first_seen ? first_seen : "earlier");
    json_t *j = json_string(text);
    char *t = json_dumps(j, JSON_ENCODE_ANY);
    json_decref(j);
    char *body =
        xasprintf("{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"_meta\":{\"idemgw/replay\":%s},"
                  "\"content\":[{\"type\":\"text\",\"text\":%s}]}}",
                  id_text, marker, t);
    free(t);
    return body;
}

char *answer_resume_refused(const char *why)
{
    char text[600];
    snprintf(text, sizeof(text),
             "Refused: this session's streams carry the result of a protected tool call, and %s, "
             "so the stream was not resumed and nothing of it was relayed. Only the caller that "
             "made the call (the same subject) may resume its stream; nothing was executed.",
             why);
    return mcp_error_body(NULL, -32000, text);
}
