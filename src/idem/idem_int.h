/* The protected call's insides, shared by idem.c (a call's life: who calls, the claim, the
 * wait, the stage and cancels), idem_answer.c (what the stage answers itself: a duplicate's
 * replay, in progress or unknown, and the store's failures) and idem_capture.c (the upstream's
 * answer watched, captured and recorded). Private to src/idem/. */
#ifndef IDEMGW_IDEM_INT_H
#define IDEMGW_IDEM_INT_H

#include "idem.h"
#include "answers.h"
#include "decode.h"
#include "dup_recent.h"
#include "mcp.h"
#include "outcome.h"
#include "pending.h"
#include "policy.h"
#include "recorder.h"
#include "revision.h"
#include "sse.h"
#include "store.h"
#include "tasks.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct evbuffer;
struct event;

/* Where 2026-07-28 requests name their client (params._meta). */
#define CLIENT_INFO_META "io.modelcontextprotocol/clientInfo"

/* Stored as the result of an unknown row whose call its caller cancelled: another process
 * answering a duplicate can then say so. Unknown rows carry no result otherwise. */
#define CALL_CANCEL_NOTE "{\"idemgw/cancelled\":true}"

/* A protected call's life:
 *
 *   RESOLVING --> CLAIMING <--> WAITING
 *       |            |  ^          |
 *       |            |  +- (again) |
 *       |            +--> FORWARDED --> RECORDING --> DONE
 *       |            +--> RECORDING (cancelled before it was sent: the claim released)
 *       |            +--> PASSTHROUGH (store down, the policy says forward unprotected)
 *       +------------+-------------+--> DONE (answered: replay, refusal, in progress ...)
 *
 * The call belongs to its exchange: the proxy frees it (detach) when the exchange ends, which
 * cannot happen while a store call or a timer of the call is out (the exchange is CLAIMING or
 * RECORDING then). */
typedef enum {
    CALL_RESOLVING = 0, /* finding out who calls */
    CALL_CLAIMING,      /* claim sent */
    CALL_WAITING,       /* duplicate in wait mode, polling the row */
    CALL_FORWARDED,     /* ours: the upstream runs it */
    CALL_PASSTHROUGH,   /* forwarded without protection */
    CALL_RECORDING,     /* outcome being written */
    CALL_DONE,          /* nothing more to do */
    CALL_N_STATES
} call_state_t;

struct idem {
    idem_ctx_t ctx;
    pending_reg_t *pending;
    recorder_ctx_t recorder; /* finishes keys, for the POST's answers and the GET streams' */
    struct call *live;       /* calls claiming their key or run by the upstream: for cancels */
    task_routes_t *tasks;    /* tasks stored or replayed here: their sessions (main's) */
    dup_recent_t *recent;    /* each key's recent attempts, for the duplicate-source rules */
};

typedef struct call {
    idem_t *idem;
    exchange_t *ex;
    call_state_t state;
    policy_rules_t rules; /* the tool's policy, copied: a reload may free the config */
    char *subject;
    char *store_tool; /* the tool as the store names it (key_scoped_tool) */
    char *key;
    char key_hash[65];
    char args_digest[65];
    bool explicit_key;
    int64_t fence;
    int attempts;                   /* the row's attempts when this call claimed it */
    char claimed_at[32];            /* wall clock at the claim, ISO 8601, for the cache's marker */
    store_status_t deferred_status; /* a finish that failed before it was sent */
    store_state_t recorded;         /* the outcome being written */
    outcome_why_t why;              /* why that outcome */
    int status;                     /* the upstream's HTTP status */
    bool cut; /* the upstream's answer began and did not end whole (closed, or gone silent) */
    /* capture of the final response */
    bool capture_json, capture_sse;
    struct evbuffer *json_body;
    sse_parser_t sse;
    bool final_seen;
    bool hold_next; /* the SSE event just read ends the answer: hold from here on */
    mcp_resp_class_t cls;
    char *result;
    size_t result_len;
    bool too_large;
    bool foreign;       /* the final response carried another request's id */
    decoder_t *decoder; /* the upstream compressed the answer: decoded for capture only */
    bool undecodable;   /* the answer's coding could not be read: stored as not replayable */
    bool cancelled;     /* its caller's notifications/cancelled reached the upstream */
    bool cancel_kept;   /* its caller cancelled it; on_cancel: finish kept that here */
    bool drop_unsent;   /* its caller cancelled it before it was sent; on_cancel: forward */
    struct call *prev_fwd, *next_fwd; /* in the list of live calls */
    bool in_fwd;
    struct event *lease_timer; /* renews the claim while the upstream call runs */
    struct event *early_timer; /* answer_after: answers the agent still_running */
    bool answered_early;       /* it did */
    exchange_dup_facts_t dup;  /* a duplicate: its source and facts, for the log line */
    char dup_first_seen[41];   /* dup.first_seen's text */
    struct event *timer;       /* wait mode */
    uint64_t wait_deadline_ms;
    uint64_t poll_ms;
    revision_t revision; /* the caller's protocol era: what the answers written here look like */
} call_t;

/* --- idem.c --- */

/* Every change of a call's state; a transition the table does not allow aborts. */
void call_set_state(call_t *c, call_state_t to);
const mcp_msg_t *call_msg(const call_t *c);
/* A header of the call's request, or NULL. */
const char *call_header(const call_t *c, const char *name);
/* Every answer this stage writes itself passes here (or through reply.h) on its way out: it
 * fits the caller's era. */
char *call_fit(const call_t *c, char *body);
/* The session's streams may carry this call's result: only its caller may resume them while
 * the call can run and its result is remembered (resume_guard.h). */
void call_note_stream_caller(call_t *c);
/* Off the list of live calls (those a cancel may name). */
void call_fwd_remove(call_t *c);
/* The observer's detach: the exchange ends, the call is freed. */
void call_detach(void *arg);

/* --- idem_answer.c --- */

/* The call ends here with an answer of the gateway's own (reply.h). Last use of c. */
void call_answer(call_t *c, answer_t a, const char *detail, const char *detail2);
/* The same; why (may be NULL): a short reason the log line carries with the code. */
void call_answer_why(call_t *c, answer_t a, const char *detail, const char *detail2,
                     const char *why);
void call_answer_store_down(call_t *c);
void call_answer_store_failed(call_t *c, store_status_t st);
void call_answer_unknown(call_t *c, const store_row_t *row);
void call_answer_in_progress(call_t *c, const store_row_t *row);
void call_answer_replay(call_t *c, const store_row_t *row, bool from_cache);
/* The row's attempts, this call's included (the replay marker's count and `idemgw key`'s). */
int call_row_attempts(const call_t *c, const store_row_t *row);
/* The clientInfo a 2026-07-28 request carries in params._meta, as "name/version"; "" if none. */
void call_client(const call_t *c, char *out, size_t len);
/* An attempt of the call's key (the first, a takeover or a duplicate), for the rules that look
 * at the steps between attempts; before: what was known until then (may be NULL). */
void call_note_attempt(call_t *c, const char *client, dup_recent_seen_t *before);
/* The agent's own Idempotency-Key leaves the request; with forward_key only the key's hash
 * goes up (a header line appended to extra). */
void call_key_header(call_t *c, char *extra, size_t size);
/* A key the gateway advertised in tools/list (advertise_key) leaves the arguments before they
 * go up, unless the server's own schema has it. */
void call_strip_advertised_key(call_t *c);

/* --- idem_capture.c --- */

/* What watches the upstream's answer to a forwarded call, captures it and records it. */
extern const response_observer_t call_observer;

#endif
