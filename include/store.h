/* The key store: an interface (store_ops_t) over a backend; Postgres (store_pg.h), through
 * libpq in non-blocking mode on the libevent loop, is the first; an embedded SQLite file
 * (store_sqlite.h), for one gateway process, is the second.
 *
 * One table (see sql/). A claim is one atomic statement that inserts, takes over (expired,
 * failed, or in progress past its lease when the caller allows it) or returns the existing
 * row. Every claim or takeover increments the fence; finish writes only WHERE fence = $n.
 *
 * Callback contract: every call that returns STORE_OK invokes its callback exactly once, later,
 * from the event loop (never from inside the call). Pointers inside a result are valid only
 * during the callback; copy what you keep. A callback may issue new store calls. */
#ifndef IDEMGW_STORE_H
#define IDEMGW_STORE_H

#include "dupsource.h"
#include "util.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct server_stats;
struct store_queue_op;

typedef enum {
    STORE_OK = 0,
    STORE_ERR_UNAVAILABLE, /* no answer: no connection (down, reconnecting, lost mid-call) or
                              the operation missed its deadline (store.timeout) */
    STORE_ERR_STATEMENT,   /* Postgres answered with an error: the store is up, retrying the
                              same call fails the same way */
    STORE_ERR_SCHEMA,      /* the database has a newer schema than this binary knows */
    STORE_ERR_SHUTDOWN,    /* the store is closing */
    STORE_ERR_FILE_LOST,   /* the embedded store's files were deleted or replaced: down until a
                              restart (retrying fails the same way) */
} store_status_t;

const char *store_status_str(store_status_t st);

typedef enum {
    STORE_STATE_IN_PROGRESS = 0,
    STORE_STATE_SUCCEEDED,
    STORE_STATE_FAILED,  /* released: the next claim takes it over */
    STORE_STATE_UNKNOWN, /* outcome unknown, held: not executed again until it expires */
} store_state_t;
#define STORE_STATES 4 /* number of states */

const char *store_state_str(store_state_t st);
/* Whether st is one of the states above (a finish may name none other). */
bool store_state_valid(store_state_t st);
/* The state a name written by store_state_str names, in *out; false for none (or NULL). */
bool store_state_parse(const char *txt, store_state_t *out);

typedef struct store store_t;

typedef struct store_claim_req {
    const char *key;
    const char *tool;
    const char *subject;
    const char *args_digest;     /* hex SHA-256 of the canonical arguments */
    bool explicit_key;           /* key came from the client */
    const char *session_id;      /* Mcp-Session-Id of the first call, or NULL */
    const char *jsonrpc_id;      /* JSON text of the request id, or NULL */
    uint64_t lease_ms;           /* in-progress validity */
    uint64_t window_ms;          /* remember the finished call this long */
    bool takeover_lease_expired; /* in progress past its lease may be taken over (release) */
} store_claim_req_t;

/* The outcome of a claim, for store_finish. */
typedef struct store_finish_req {
    const char *key;
    int64_t fence;       /* the claim's: the row is written only if it still holds it */
    store_state_t state; /* SUCCEEDED, FAILED or UNKNOWN, never IN_PROGRESS */
    const char *result;  /* the response's result JSON to store, or NULL */
    size_t result_len;
    bool too_large;     /* succeeded, but the result was over max_stored_bytes (not stored) */
    uint64_t window_ms; /* remember the finished call this long from now */
} store_finish_req_t;

/* How a duplicate was answered: replayed from the stored result, told the first call is still
 * running, or told its outcome is unknown (cancelled calls included). */
typedef enum {
    STORE_DUP_REPLAY = 0,
    STORE_DUP_IN_PROGRESS,
    STORE_DUP_UNKNOWN,
    STORE_DUP_ANSWERS_, /* number of kinds */
} store_dup_answer_t;

const char *store_dup_answer_str(store_dup_answer_t a);

/* Duplicates kept on a key's row (its history); older ones are dropped, the counts stay exact. */
#define STORE_DUP_HISTORY_MAX 16
/* The longest JSON-RPC id and session id a history entry keeps (longer ones are cut). */
#define STORE_DUP_ID_MAX 128

/* One duplicate of a key's call, as the gateway answered it (store_record_duplicate). */
typedef struct store_dup {
    const char *key;
    store_dup_answer_t answered;
    dup_source_t source;    /* which layer most likely retried (dupsource.h) */
    uint64_t at_ms;         /* when it was answered, by the gateway's wall clock */
    uint64_t gap_ms;        /* since the key's first call */
    const char *jsonrpc_id; /* its JSON-RPC id as JSON text, or NULL */
    const char *session_id; /* its Mcp-Session-Id, or NULL */
} store_dup_t;

typedef struct store_row {
    store_state_t state;
    int64_t fence;
    /* Calls with this key that ran or were replayed in the row's life: the first call, each
     * takeover, and each replay once written (store_note_duplicate batches them). Calls
     * answered "in progress", "outcome unknown" or refused are not counted. The replay
     * marker's attempts is the same count, that replay included. */
    int attempts;
    const char *args_digest;
    const char *result; /* stored response result JSON (succeeded), else NULL */
    size_t result_len;
    bool result_too_large;   /* ran, but the result was over max_stored_bytes */
    bool lease_expired;      /* in progress and past its lease (by the database clock) */
    const char *created_at;  /* first seen, ISO 8601 UTC */
    const char *finished_at; /* outcome recorded, ISO 8601 UTC; NULL while in progress */
    const char *lease_until; /* ISO 8601 UTC */
    const char *expires_at;  /* ISO 8601 UTC */
    const char *first_session_id;
    const char *first_jsonrpc_id;
    int64_t expires_in_ms; /* until the row expires, by the database clock */
    /* Duplicates recorded on the row (store_record_duplicate), exact, by answer and by
     * source; filled by get, release and forget only (zero in a claim's row). */
    int dup_answers[STORE_DUP_ANSWERS_];
    int dup_sources[DUP_SOURCE_N];
    /* The last STORE_DUP_HISTORY_MAX of them as a JSON array, oldest first, each
     * {"at","source","answered","jsonrpc_id","session_id","gap_ms"}; NULL where the counts
     * are zero. */
    const char *dup_history;
} store_row_t;

typedef struct store_claim_result {
    bool acquired;   /* true: ours to forward, with fence; false: row is the existing one */
    bool taken_over; /* acquired by taking over an expired / failed / lease-lost row */
    int64_t fence;
    int attempts;
    /* the existing row when !acquired; when acquired, only its state, fence, attempts,
     * args_digest and created_at are sure to be filled */
    store_row_t row;
} store_claim_result_t;

/* res is NULL unless st == STORE_OK. */
typedef void (*store_claim_cb)(store_status_t st, const store_claim_result_t *res, void *arg);
typedef void (*store_finish_cb)(store_status_t st, bool fence_matched, void *arg);
typedef void (*store_get_cb)(store_status_t st, const store_row_t *row /* NULL: no row */,
                             void *arg);
/* n: the rows counted (0 unless st == STORE_OK). */
typedef void (*store_count_cb)(store_status_t st, int64_t n, void *arg);
/* row: the row as it was before the call (NULL: no row); released: it was changed. */
typedef void (*store_release_cb)(store_status_t st, bool released, const store_row_t *row,
                                 void *arg);

#define STORE_TIMEOUT_DEFAULT_MS 5000

/* What every backend takes; each backend's own options are in its header (store_pg.h,
 * store_sqlite.h), and store_open.h opens the one database_url names. */
typedef struct store_options {
    uint64_t timeout_ms;        /* deadline of each operation, default STORE_TIMEOUT_DEFAULT_MS */
    bool migrate;               /* apply missing migrations at start */
    uint64_t sweep_interval_ms; /* 0 = no sweeper */
    int sweep_batch;            /* rows per sweep statement, default 1000 */
} store_options_t;

/* Fails pending and queued calls with STORE_ERR_SHUTDOWN (callbacks run before it returns,
 * the one exception to the contract above) and frees everything. Must not be called from
 * inside a store callback. */
void store_free(store_t *s);

/* At least one connection is up and the schema is in place. */
bool store_ready(const store_t *s);
/* Why the store is not ready, for /readyz, into buf (NUL-terminated); "" when it is ready or
 * its backend does not say. */
void store_down_reason(const store_t *s, char *buf, size_t len);

/* Claims req->key. STORE_ERR_UNAVAILABLE means the caller must not forward the call; if the
 * claim committed and only its answer was lost, the store itself releases that claim (and no
 * newer one) once it has a connection again and the claim's deadline has passed. */
store_status_t store_claim(store_t *s, const store_claim_req_t *req, store_claim_cb cb,
                           void *arg) MUST_CHECK;
/* Records the outcome of a claim: state SUCCEEDED (result stored, kept window_ms from now),
 * FAILED (released) or UNKNOWN (held until window_ms from now). result may be NULL;
 * too_large marks a succeeded call whose result was not stored. cb may be NULL. */
store_status_t store_finish(store_t *s, const store_finish_req_t *req, store_finish_cb cb,
                            void *arg) MUST_CHECK;
/* Whether a finish is ordered before every later call: once store_finish returned STORE_OK,
 * a claim or read of its key made through this store after that sees what the finish wrote,
 * even before its callback ran, and no other process writes the store meanwhile. So an answer
 * need not wait for its finish's callback for a retry to find the outcome. True for the
 * embedded store of the process that holds its file alone, when finishes do not wait for the
 * disk (one writer thread runs the calls in the order they came); false for Postgres (a finish
 * and a later claim may go on two connections), for the embedded store's peers, and with
 * durable finishes (the answer then waits for the disk). */
bool store_orders_finishes(const store_t *s);
/* Reads a row (wait mode polls with it). */
store_status_t store_get(store_t *s, const char *key, store_get_cb cb, void *arg) MUST_CHECK;
/* Records a duplicate on the key's row without changing its state: its counts, and an entry
 * of its history (the last STORE_DUP_HISTORY_MAX). A replay also counts in attempts. Kept in
 * memory and written within 500 ms by the statement that writes every key's duplicates of
 * that time (no store call of its own); cb (may be NULL) gets fence_matched = true once it is
 * accepted. A key whose row is gone by then is skipped. */
store_status_t store_record_duplicate(store_t *s, const store_dup_t *dup, store_finish_cb cb,
                                      void *arg) MUST_CHECK;
/* store_record_duplicate of a replay with no facts about it (source reconnect, now). */
store_status_t store_note_duplicate(store_t *s, const char *key, store_finish_cb cb,
                                    void *arg) MUST_CHECK;

/* Duplicates of key counted by store_note_duplicate and not yet written: add them to a row's
 * attempts read from Postgres to know the attempts so far. */
int store_pending_duplicates(const store_t *s, const char *key);

/* Renews the lease of an in-progress claim still held with fence (a long streamed call);
 * cb gets fence_matched = renewed. cb may be NULL. */
store_status_t store_extend_lease(store_t *s, const char *key, int64_t fence, uint64_t lease_ms,
                                  store_finish_cb cb, void *arg) MUST_CHECK;

/* For operators (`idemgw key --release`), after checking what the call did: an UNKNOWN row,
 * or one IN_PROGRESS past its lease (a gateway died holding it), becomes FAILED, so the next
 * identical call takes it over and runs. The fence moves on, so a finish still on its way
 * from the old claim cannot land. Any other row is left as it is (released = false). */
store_status_t store_release(store_t *s, const char *key, store_release_cb cb,
                             void *arg) MUST_CHECK;
/* For operators (`idemgw key --forget`): deletes the row, whatever its state; cb gets the row
 * as it was (NULL: there was none). The next identical call runs as if never seen, except
 * where a gateway still holds a success in its replay cache (until the window ends). Meant
 * for finished rows: a call still in progress keeps running, an identical one may start
 * beside it, and the fence starts again at 1, so the first call's outcome may land on the
 * second's row. */
store_status_t store_forget(store_t *s, const char *key, store_get_cb cb, void *arg) MUST_CHECK;

/* Counts the live rows held in state UNKNOWN (every replica's): for /metrics, read when it is
 * scraped, never on a call's path. STORE_ERR_STATEMENT when the backend cannot count. */
store_status_t store_count_unknown(store_t *s, store_count_cb cb, void *arg) MUST_CHECK;
/* `idemgw report`: what the rows touched since a time say, per tool. Read-only, one statement,
 * never on a call's path. */
typedef struct store_report_tool {
    const char *tool;
    int64_t keys;  /* rows: distinct protected calls */
    int64_t calls; /* protected calls seen: runs (first calls and takeovers) and duplicates */
    int64_t runs;  /* forwarded to the upstream: first calls and takeovers */
    int64_t dup_answers[STORE_DUP_ANSWERS_];
    int64_t dup_sources[DUP_SOURCE_N];
    int64_t states[STORE_STATES]; /* rows by store_state_t */
} store_report_tool_t;

typedef struct store_report_key {
    const char *tool;
    const char *key; /* the full key: the caller prints its key_hash (key.h), not the key */
    int attempts;    /* calls that ran or were replayed (store_row_t) */
    int duplicates;  /* duplicates recorded, of every answer */
    int calls;       /* calls seen: attempts and the duplicates not replayed */
    store_state_t state;
    const char *created_at;
} store_report_key_t;

typedef struct store_report {
    const char *now;                  /* the store's clock, ISO 8601 UTC */
    const store_report_tool_t *tools; /* by tool name */
    size_t n_tools;
    const store_report_key_t *top; /* the keys with the most calls (attempts + duplicates
                                      answered without running), most first */
    size_t n_top;
} store_report_t;

/* report is NULL unless st == STORE_OK; valid only during the callback. */
typedef void (*store_report_cb)(store_status_t st, const store_report_t *report, void *arg);
/* The rows updated in the last since_ms (0: all), and up to top keys; with tool_prefix (NULL or
 * "": every row), only the rows whose tool starts with it, compared byte for byte: "billing/"
 * is one server's rows (key_scoped_tool), whatever its name holds (no LIKE wildcards). */
store_status_t store_report(store_t *s, uint64_t since_ms, int top, const char *tool_prefix,
                            store_report_cb cb, void *arg) MUST_CHECK;

/* Whichever callback an operation was given: what the backends and the timing wrapper keep. */
typedef union store_cb {
    store_claim_cb claim;
    store_finish_cb finish;
    store_get_cb get;
    store_release_cb release;
    store_count_cb count;
    store_report_cb report;
} store_cb_t;

/* Deletes up to batch expired rows now; for tests. cb gets fence_matched = (rows > 0). */
store_status_t store_sweep_now(store_t *s, store_finish_cb cb, void *arg) MUST_CHECK;

/* The newest migration number this binary knows. */
int store_schema_version(void);

/* Counters for /metrics and tests. */
typedef struct store_stats {
    uint64_t claims;        /* claim statements that returned a row */
    uint64_t claim_retries; /* claim re-runs: the conflicting row was not in the snapshot */
    uint64_t unavailable;   /* calls answered STORE_ERR_UNAVAILABLE (refused or failed) */
    uint64_t connects;      /* connections that became ready (first connect and reconnects) */
    uint64_t swept;         /* rows deleted by the sweeper and store_sweep_now */
    int queued;             /* calls waiting for a connection now */
    int connections_up;     /* connections ready now */
    int connections_busy;   /* of those, with statements in flight now */
    int connections_wanted; /* connections the store keeps open when it can */
    uint64_t transactions;  /* embedded store: write transactions committed */
    uint64_t lazy_transactions; /* of those, finishes alone, committed without an fsync */
    uint64_t delayed_transactions; /* of those, waited for company (store.commit_delay) */
    uint64_t batched_ops;   /* embedded store: operations those transactions carried */
    uint64_t claim_batches; /* Postgres: batch claim statements (two or more claims) */
    uint64_t claims_batched;   /* claims those statements carried */
    int batch_slots;           /* Postgres, group commit: statements of each kind allowed in
                                  flight now (store_pg_slots.c); 0 without group commit */
    uint64_t finish_batches;   /* Postgres: batch finish statements */
    uint64_t finishes_batched; /* finishes those statements carried */
    uint64_t claims_in_doubt;  /* Postgres: claims whose answer was lost with their connection */
    uint64_t in_doubt_released; /* of those, rows released once a connection was back */
    int in_doubt_pending;       /* kept now, waiting for their release */
} store_stats_t;

void store_get_stats(const store_t *s, store_stats_t *out);

/* Times every call with a callback into stats (idemgw_store_operation_duration_seconds), has
 * the backend time the statements it sends on its own (sweeps, duplicates' writes), and copies the
 * store's gauges and counters there every second, on base's loop. Once, after the store is made;
 * store_free stops it. */
void store_observe(store_t *s, struct server_stats *stats, struct event_base *base);

/* Calls made through the store since store_observe whose callback has not run yet (0 for a
 * NULL store), and cb, run after a callback leaves none outstanding: a drain waits for the
 * writes its last answers started before the process exits. */
int store_outstanding(const store_t *s);
void store_on_settled(store_t *s, void (*cb)(void *arg), void *arg);

/* A backend: the operations above, on its own state (impl). Each follows the contract of the
 * function of the same name. The backends are store_pg.h and store_sqlite.h. */
typedef struct store_ops {
    const char *name; /* "postgres", "sqlite", for logs */
    store_status_t (*claim)(void *impl, const store_claim_req_t *req, store_claim_cb cb, void *arg);
    store_status_t (*finish)(void *impl, const store_finish_req_t *req, store_finish_cb cb,
                             void *arg);
    store_status_t (*get)(void *impl, const char *key, store_get_cb cb, void *arg);
    store_status_t (*record_duplicate)(void *impl, const store_dup_t *dup, store_finish_cb cb,
                                       void *arg);
    int (*pending_duplicates)(const void *impl, const char *key);
    store_status_t (*extend_lease)(void *impl, const char *key, int64_t fence, uint64_t lease_ms,
                                   store_finish_cb cb, void *arg);
    store_status_t (*sweep_now)(void *impl, store_finish_cb cb, void *arg);
    store_status_t (*release)(void *impl, const char *key, store_release_cb cb, void *arg);
    store_status_t (*forget)(void *impl, const char *key, store_get_cb cb, void *arg);
    store_status_t (*count_unknown)(void *impl, store_count_cb cb, void *arg); /* may be NULL */
    store_status_t (*report)(void *impl, uint64_t since_ms, int top, const char *tool_prefix,
                             store_report_cb cb, void *arg);
    /* may be NULL: the operator's queue (store_queue.h), answered with store_queue_done */
    store_status_t (*queue)(void *impl, struct store_queue_op *op);
    bool (*ready)(const void *impl);
    /* may be NULL (false): store_orders_finishes */
    bool (*orders_finishes)(const void *impl);
    /* may be NULL: why the store is not ready, into buf ("" when it is) */
    void (*down_reason)(const void *impl, char *buf, size_t len);
    void (*get_stats)(const void *impl, store_stats_t *out);
    /* may be NULL: the backend times its own statements (the sweeper's, the duplicates' write)
     * into stats, as store_observe does the calls */
    void (*observe)(void *impl, struct server_stats *stats);
    void (*free)(void *impl);
} store_ops_t;

/* A store over a backend's state; store_free frees impl with ops->free. */
store_t *store_from_ops(const store_ops_t *ops, void *impl);
const char *store_backend_name(const store_t *s);
/* Hands an operator's queue request to the backend (store_queue.c's only way in). */
store_status_t store_queue_submit(store_t *s, struct store_queue_op *op) MUST_CHECK;

#endif
