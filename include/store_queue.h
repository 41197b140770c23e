/* The operator's queue (docs/operator-queue.md): the keys a person has to decide about, listed
 * and read by their key_hash, and resolved (succeeded with a result the operator supplies,
 * failed, or forgotten), each decision kept in idem_key_actions with who, when and a note.
 *
 * Never on a call's path: the admin API, /metrics, the alerts' poll and `idemgw keys` call it.
 * Each backend runs the query part (store_pg_queue.c, store_sqlite_queue.c) through the one
 * entry of store_ops_t, `queue`; this file's functions check the request, turn a key_hash
 * prefix into the key, and shape the answers as JSON.
 *
 * Callback contract: as store.h's. The JSON handed to a callback is valid only during the
 * callback (json_incref what you keep). */
#ifndef IDEMGW_STORE_QUEUE_H
#define IDEMGW_STORE_QUEUE_H

#include "store.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Keys a list answers at most, and by default. */
#define STORE_QUEUE_LIMIT_MAX 500
#define STORE_QUEUE_LIMIT_DEFAULT 50
/* A key_hash prefix must be this long at least: shorter ones match too many keys to mean one. */
#define STORE_QUEUE_PREFIX_MIN 6
/* Notes and actor names are cut to these many bytes. */
#define STORE_QUEUE_NOTE_MAX 1000
#define STORE_QUEUE_ACTOR_MAX 100
/* The member of a resolved result's _meta that says an operator supplied it (beside the
 * replay's "idemgw/replay"). */
#define STORE_QUEUE_META_OPERATOR "idemgw/operator"

typedef enum {
    STORE_QUEUE_LIST = 0, /* keys by state, tool, subject; newest first; a cursor */
    STORE_QUEUE_SHOW,     /* the keys whose key_hash starts with a prefix (2 at most) */
    STORE_QUEUE_RESOLVE,  /* one key's decision: its row changed, the action kept */
    STORE_QUEUE_SUMMARY,  /* for /metrics: unknown keys per tool, resolutions by outcome */
    STORE_QUEUE_KINDS_,
} store_queue_kind_t;

/* Which rows a list names by state: every one, one state, in progress past its lease
 * ("stuck"), or the two a person has to decide about ("open": unknown or stuck). */
typedef enum {
    STORE_QUEUE_STATE_ANY = 0,
    STORE_QUEUE_STATE_UNKNOWN,
    STORE_QUEUE_STATE_IN_PROGRESS,
    STORE_QUEUE_STATE_SUCCEEDED,
    STORE_QUEUE_STATE_FAILED,
    STORE_QUEUE_STATE_STUCK,
    STORE_QUEUE_STATE_OPEN,
} store_queue_state_t;

/* The state filter's name ("unknown", "stuck", ...): false when name is none of them. "" and
 * NULL are STORE_QUEUE_STATE_ANY. */
bool store_queue_state_parse(const char *name, store_queue_state_t *out);

/* What an operator decides. */
typedef enum {
    STORE_QUEUE_SUCCEEDED = 0, /* it ran: retries replay the result the operator supplies */
    STORE_QUEUE_FAILED,        /* it did not run: the next retry runs it */
    STORE_QUEUE_FORGET,        /* the row is deleted: the next call runs as if never seen */
} store_queue_outcome_t;

const char *store_queue_outcome_str(store_queue_outcome_t o);
bool store_queue_outcome_parse(const char *name, store_queue_outcome_t *out);

typedef struct store_queue_filter {
    store_queue_state_t state;
    const char *server;  /* keys of this server of servers: (tools "SERVER/..."), or NULL */
    const char *tool;    /* the tool's own name (without its server), or NULL */
    const char *subject; /* or NULL */
    int limit;           /* 0: STORE_QUEUE_LIMIT_DEFAULT; at most STORE_QUEUE_LIMIT_MAX */
    const char *cursor;  /* a list's "next", or NULL for the first page */
    /* only rows updated at or after this (ms since the epoch; 0: any), oldest first: the
     * alerts' poll. Ignores cursor. */
    int64_t updated_since_ms;
} store_queue_filter_t;

typedef struct store_queue_resolve {
    const char *key_hash; /* a unique prefix of it */
    store_queue_outcome_t outcome;
    /* SUCCEEDED: the CallToolResult (a JSON object) retries replay; stored with
     * _meta[STORE_QUEUE_META_OPERATOR] = {"by","at","note"} added */
    const json_t *result;
    const char *actor; /* who: the admin token's name, or the command's user */
    const char *note;  /* or NULL */
} store_queue_resolve_t;

/* How a request ended, beside the store's status. */
typedef enum {
    STORE_QUEUE_OK = 0,
    STORE_QUEUE_NOT_FOUND, /* no key has that key_hash (prefix) */
    STORE_QUEUE_AMBIGUOUS, /* the prefix names several keys */
    STORE_QUEUE_CONFLICT,  /* resolve: the key is neither unknown nor in progress past its lease */
    STORE_QUEUE_INVALID,   /* the request is malformed (a bad prefix, cursor or result) */
} store_queue_answer_t;

const char *store_queue_answer_str(store_queue_answer_t a);

/* st: the store's status; a: what became of the request when st is STORE_OK; body: the JSON
 * answer when st is STORE_OK (for every a: an error's {"error","message"[, "state"]}). */
typedef void (*store_queue_cb)(store_status_t st, store_queue_answer_t a, const json_t *body,
                               void *arg);

/* {"keys":[ENTRY...],"next":CURSOR|null}; ENTRY is {"key_hash","server","tool","subject",
 * "state","attempts","first_seen","updated","lease_until","expires_at","finished_at",
 * "lease_expired","result_too_large"} (server null outside servers:). */
store_status_t store_queue_list(store_t *s, const store_queue_filter_t *f, store_queue_cb cb,
                                void *arg) MUST_CHECK;
/* ENTRY with "duplicates" ({"replay","in_progress","unknown"}), "history" (the duplicates'
 * history, store.h), "actions" ([{"outcome","previous_state","by","note","at","waited_ms"}]),
 * and "result" (a succeeded key's stored result, when it is JSON). */
store_status_t store_queue_show(store_t *s, const char *key_hash, store_queue_cb cb,
                                void *arg) MUST_CHECK;
/* {"key_hash","outcome","previous_state","by","at"}; CONFLICT says the key's "state". */
store_status_t store_queue_resolve(store_t *s, const store_queue_resolve_t *r, store_queue_cb cb,
                                   void *arg) MUST_CHECK;
/* {"unknown":[{"tool","keys","oldest_ms"}],"resolutions":[{"outcome","count","waited_ms"}]}:
 * the live unknown keys per tool with the age of the oldest (since its outcome became unknown),
 * and every resolution ever kept, by outcome, with the sum of their waits. */
store_status_t store_queue_summary(store_t *s, store_queue_cb cb, void *arg) MUST_CHECK;

/* ---- for the backends ---- */

/* One request to a backend: made by store_queue.c, handed to store_ops_t.queue, answered with
 * store_queue_done (exactly once, from the loop, never from inside the queue call). */
typedef struct store_queue_op {
    store_queue_kind_t kind;
    /* LIST */
    store_queue_state_t state;
    char *tool_exact;  /* the scoped tool, or NULL */
    char *tool_prefix; /* "SERVER/", or NULL */
    char *subject;
    int limit;
    int64_t cursor_ms; /* -1: first page; else rows before (cursor_ms, cursor_hash) */
    char cursor_hash[65];
    int64_t updated_since_ms; /* 0: none */
    /* SHOW: lowercase hex, STORE_QUEUE_PREFIX_MIN to 64 characters */
    char prefix[65];
    /* RESOLVE */
    char *key; /* the full key */
    char key_hash[65];
    store_queue_outcome_t outcome;
    char *result; /* SUCCEEDED: the result to store */
    size_t result_len;
    char *actor, *note;

    /* the backend's answer: LIST and SHOW, rows ("rows": [ROW...]); RESOLVE, {"done": bool,
     * "state": the state before (null: no row), "waited_ms", "at_ms"}; SUMMARY, as
     * store_queue_summary's. ROW: {"key","tool","subject","state","attempts","created_ms",
     * "updated_ms","lease_until_ms","expires_ms","finished_ms" (null),"lease_expired",
     * "result_too_large"}, and for SHOW "dup_replay","dup_in_progress","dup_unknown",
     * "history" (text), "result" (text or null), "actions" ([{"outcome","previous_state",
     * "actor","note","at_ms","waited_ms"}]) */
    json_t *out;

    /* the request's own continuation (store_queue.c) */
    store_t *store;
    store_queue_cb cb;
    void *arg;
    bool resolving; /* SHOW as a resolve's first step: RESOLVE follows with the key found */
} store_queue_op_t;

/* A copy of op's inputs (no continuation, no output), for a backend whose work may outlive
 * the request (the embedded store's writer, past the op's deadline); store_queue_op_free. */
store_queue_op_t *store_queue_op_clone(const store_queue_op_t *op);
void store_queue_op_free(store_queue_op_t *op);

/* The backend's answer to op (st STORE_OK: op->out set). Frees op or sends its next step. */
void store_queue_done(store_queue_op_t *op, store_status_t st);

/* ROW's fields, for the backends: a new object with the common members set. */
json_t *store_queue_row(const char *key, const char *tool, const char *subject, const char *state,
                        int attempts, int64_t created_ms, int64_t updated_ms,
                        int64_t lease_until_ms, int64_t expires_ms, int64_t finished_ms,
                        bool lease_expired, bool too_large);

#endif
