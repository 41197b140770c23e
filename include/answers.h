/* The texts the gateway writes to agents in place of an upstream answer, in one table: what a
 * model reads when its call was not executed (or not executed again), and why. Each answer is
 * a JSON-RPC result with isError and a machine-readable status in _meta (mcp.h). */
#ifndef IDEMGW_ANSWERS_H
#define IDEMGW_ANSWERS_H

#include <stdbool.h>

typedef enum {
    ANSWER_IN_PROGRESS = 0, /* detail: when the first call started */
    ANSWER_CANCELLED,       /* detail: when the first call started */
    ANSWER_UNKNOWN,         /* detail: when the first call started */
    ANSWER_FOREIGN,         /* the upstream answered with another request's response */
    ANSWER_CUT,             /* the call's own answer was cut off; detail: what a retry does */
    ANSWER_KEY_REUSED,
    ANSWER_STORE_DOWN,
    ANSWER_NO_STORE, /* the gateway has no store configured at all */
    ANSWER_SHUTTING_DOWN,
    ANSWER_STORE_ERROR,
    ANSWER_NO_SUBJECT,    /* detail: why there is no caller identity */
    ANSWER_BAD_SUBJECT,   /* detail: why the caller identity is unusable */
    ANSWER_BAD_TOKEN,     /* detail: why the bearer token did not verify (jwt subject) */
    ANSWER_BAD_ARGUMENTS, /* detail: the canonical parser's status */
    ANSWER_BAD_KEY,       /* detail: the key status, detail2: its explanation */
    ANSWER_REPLAY_FAILED,
    ANSWER_STILL_RUNNING, /* detail: when the call started (answer_after) */
    ANSWER_N
} answer_t;

/* The code in the status (_meta "idemgw/status".code), e.g. "in_progress". */
const char *answer_code(answer_t a);
/* What the request's log line says happened: "refused", "in_progress" or "unknown". */
const char *answer_outcome(answer_t a);

/* The whole JSON-RPC response for request id_text; key_hash may be NULL (no key derived yet);
 * detail and detail2 fill the text where the answer has room for them (NULL: a generic
 * phrase); hint (may be NULL) is a sentence added at the end. */
char *answer_body(answer_t a, const char *id_text, const char *key_hash, const char *detail,
                  const char *detail2, const char *hint);

/* Whether the answer is about a call that may still run or has an unknown outcome: the ones
 * that can point at the status tool. */
bool answer_has_later(answer_t a);

/* A replay of a call whose result was too large to keep: a success that says so. marker is
 * the replay's _meta member. */
char *answer_replay_too_large(const char *id_text, const char *marker, const char *first_seen);

/* A GET that would resume a session's stream for another caller than the one whose protected
 * call it carries (resume_guard.h): a JSON-RPC error (id null) saying why (a phrase: "the
 * request names another caller"). */
char *answer_resume_refused(const char *why);

#endif
