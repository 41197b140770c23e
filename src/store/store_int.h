/* Internals shared by store.c (the public calls, statements, queue, sweeper) and store_conn.c
 * (one libpq connection's life: connect, migrate, prepare, send, receive, die, back off).
 * Not part of the contract; only the two store files include it. */
#ifndef IDEMGW_STORE_INT_H
#define IDEMGW_STORE_INT_H

#include "dup_table.h"
#include "store.h"
#include "store_delay.h"

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

struct event;
struct event_base;

typedef struct store_pg store_pg_t;

typedef enum {
    STORE_OP_CLAIM = 0,
    STORE_OP_FINISH,
    STORE_OP_GET,
    STORE_OP_DUP,
    STORE_OP_SWEEP,
    STORE_OP_EXTEND,
    STORE_OP_RELEASE,
    STORE_OP_FORGET,
    STORE_OP_CLAIM_BATCH,   /* claims queued together: one statement, one commit */
    STORE_OP_FINISH_BATCH,  /* finishes queued together, committed without waiting for the flush */
    STORE_OP_REPORT,        /* `idemgw report`: read-only, never on a call's path */
    STORE_OP_FINISH_ASYNC,  /* one finish under group commit: no wait for the flush either */
    STORE_OP_COUNT_UNKNOWN, /* live rows held unknown, for /metrics */
    STORE_OP_RELEASE_IN_DOUBT, /* claims whose answer was lost (store_pg_indoubt.c) */
    STORE_OP_QUEUE_LIST,       /* the operator's queue (store_pg_queue.c) */
    STORE_OP_QUEUE_LIST_UNKNOWN,
    STORE_OP_QUEUE_SHOW,
    STORE_OP_QUEUE_RESOLVE,
    STORE_OP_QUEUE_SUMMARY,
    STORE_OP_CLAIM_LOOK, /* after a claim that wrote nothing: the row it met */
    STORE_OP_COUNT_,     /* number of kinds; also the number of prepared statements */
} store_op_kind_t;

#define STORE_MAX_PARAMS 12
/* A claim's parameters that are not the row's own: its deadline by the database's clock (set
 * when sent) and its token (sql/004_claim_token.sql). */
#define STORE_CLAIM_P_KEY 0
#define STORE_CLAIM_P_DIGEST 3
#define STORE_CLAIM_P_TAKEOVER 9
#define STORE_CLAIM_P_DEADLINE 10
#define STORE_CLAIM_P_TOKEN 11
#define STORE_CLAIM_NPARAMS 12
/* Ops in flight on one connection in pipeline mode. Enough to hide the round trip at the
 * rates one loop reaches; a dead connection fails at most this many ops as unavailable. */
#define STORE_PIPELINE_DEPTH 32

/* A connection must be ready (TCP, TLS, authentication, the statements prepared, the settings
 * read) within twice store.timeout of its start, and never less than this: libpq's
 * connect_timeout is not applied under PQconnectPoll, so without it a server that accepts and
 * never answers would hold the connection in "connecting" for good. */
#define STORE_CONNECT_DEADLINE_MIN_MS 5000
/* A migration run by a pool connection (the one at start could not connect) may wait for
 * another gateway's and rewrite tables: it gets this long instead. */
#define STORE_MIGRATE_DEADLINE_MS (10 * 60 * 1000)
/* Group commit: how many claim statements (and as many finish statements) each store keeps in
 * flight is store_pg_t.batch_slots, from the distance to Postgres (store_pg_slots.c): one when it
 * is near, which makes the largest batches (one per connection of a pool of 4 made batches of
 * about 2 calls and cost a local Postgres 140-250 us per call where one per store costs it about
 * 100: docs/performance.md, "Group commit: one statement of each kind in flight"). */
#define STORE_BATCH_MAX 128 /* calls in one batch statement */

/* One call, from the API until its callback. Owns copies of its parameters because it may wait
 * in the queue after the caller's strings are gone. */
typedef struct store_op {
    struct store_op *next; /* link in the queue or the delivery list */
    store_op_kind_t kind;
    int nparams;
    char *values[STORE_MAX_PARAMS]; /* NULL = SQL NULL */
    int lengths[STORE_MAX_PARAMS];  /* only for binary parameters */
    int formats[STORE_MAX_PARAMS];  /* 1 = binary: the result bytea, sent as is */
    store_cb_t cb;                  /* may be NULL for finish, duplicate and sweep */
    void *arg;
    int retries;                /* claim re-runs caused by the READ COMMITTED corner */
    struct store_op **members;  /* a batch: the calls it carries, in the order of its arrays */
    int nmembers;
    bool slot;                  /* holds one of the claim or finish statement slots */
    bool held;                  /* a claim held at the head once (store.commit_delay) */
    bool internal;              /* the sweeper's batch or the duplicate flush: no callback */
    int dup_keys;               /* duplicate flush: keys it carries (for log lines) */
    store_status_t fail_status; /* set while on the delivery list */
    store_pg_t *store;          /* set when submitted */
    struct store_conn *conn;    /* the connection carrying it; NULL while queued */
    struct event *deadline_ev;  /* the client-side deadline (store_pg_t.op_deadline_ms) */
    uint64_t deadline_wall_ms;  /* the same deadline by the wall clock, for the claim's own */
    uint64_t start_us;          /* internal ops: when made (stats_now_us), for /metrics */
    uint64_t sent_us;           /* when it went to a connection (store_delay_now_us) */
} store_op_t;

typedef enum {
    STORE_CONN_DOWN = 0,   /* no PGconn; the backoff timer starts the next attempt */
    STORE_CONN_CONNECTING, /* PQconnectPoll in progress */
    STORE_CONN_MIGRATING,  /* bringing the schema up to date (only until it is in place) */
    STORE_CONN_PREPARING,  /* PQsendPrepare, one statement at a time, then the settings check */
    STORE_CONN_IDLE,       /* ready, in pipeline mode, nothing in flight */
    STORE_CONN_BUSY,       /* ready, 1 to STORE_PIPELINE_DEPTH ops in flight */
    STORE_CONN_CLOSED,     /* store closing or schema refused: never reconnects */
} store_conn_state_t;

typedef struct store_conn {
    store_pg_t *s;
    int id;                   /* 1-based, for log lines */
    store_conn_state_t state; /* changed only in store_conn_set_state() */
    PGconn *pg;
    struct event *rd_ev;       /* socket readable (persistent once connected) */
    struct event *wr_ev;       /* socket writable: connect steps and PQflush backlog */
    struct event *retry_ev;    /* backoff timer */
    struct event *ready_ev;    /* the connect deadline: not ready by then, dropped and retried */
    uint64_t backoff_ms;       /* next reconnect delay, 100 ms doubling to 5 s */
    int step;                  /* progress through migrating / preparing */
    uint64_t settings_sent_ms; /* wall clock when the settings query left */
    int64_t clock_offset_ms;   /* the database's clock minus ours, measured at connect */
    PGresult *res;             /* result collected so far for the statement in flight (the head) */
    store_op_t *fl_head, *fl_tail; /* ops in flight when BUSY, in the order they were sent */
    int inflight;                  /* length of that list */
    bool await_sync;               /* the head op's results ended: its sync result comes next */
    bool flushing;                 /* PQflush returned 1: wait for EV_WRITE */
    bool corked;                   /* TCP_CORK set: ops of this loop pass leave as one write */
    bool sent_in_pass;             /* an op left uncorked in this loop pass: later ones cork */
    bool cork_unsupported;         /* not TCP (a Unix socket): never corked */
    struct event *uncork_ev;       /* clears TCP_CORK once the loop pass has queued its ops */
} store_conn_t;

/* A claim whose connection died after it was sent: it may have committed although its call was
 * never forwarded. Released (store_pg_indoubt.c) by key and token once due. */
typedef struct {
    char *key;
    char *token;     /* the claim's token (hex) */
    uint64_t due_ms; /* wall clock: past the claim's own deadline, it can no longer commit */
    int tries;       /* release statements that failed with it */
    bool sending;    /* carried by the release statement in flight */
} store_indoubt_t;

struct store_pg {
    struct event_base *base;
    char *conninfo; /* NULL = PG* environment */
    int servers;    /* hosts the conninfo lists: more than one is a primary and its standbys */
    int pool_size;
    char *pg_options;        /* libpq "options": the operator's, then the gateway's settings */
    uint64_t timeout_ms;     /* server-side statement_timeout and lock_timeout */
    uint64_t op_deadline_ms; /* client-side: an op unanswered this long kills its connection */
    uint64_t connect_deadline_ms; /* connect start to ready: 2 x timeout_ms, at least 5 s */
    bool settings_checked;   /* fsync / synchronous_commit looked at (logged once) */
    bool no_sync_warned;     /* several hosts, no synchronous standby: said once until it has one */
    bool migrate;
    bool group_commit; /* batch queued claims and finishes (else one statement each) */
    bool durable_finish; /* finishes wait for the WAL flush (and are never batched) */
    uint64_t commit_delay_us; /* with group_commit: how long a claim may be held for a batch */
    store_pace_t pace;        /* claims open, the pace of finishes (store_delay.h) */
    struct event *hold_ev;    /* a claim is held at the head until it fires */
    uint64_t sweep_interval_ms;
    int sweep_batch;

    store_conn_t *conns;         /* pool_size of them */
    store_op_t *q_head, *q_tail; /* FIFO of ops waiting for an idle connection */
    int q_len;
    store_op_t *dl_head, *dl_tail; /* failed ops whose callbacks run from deliver_ev */
    struct event *deliver_ev;
    struct event *sweep_ev;      /* every sweep_interval_ms */
    struct event *sweep_more_ev; /* zero timeout: next batch after yielding to the loop */
    bool sweeping;               /* a sweeper batch is queued or in flight */

    dup_table_t dups; /* duplicates per key not yet written */
    struct event *dup_ev; /* every STORE_DUP_FLUSH_MS: writes the counts in one statement */

    bool schema_ok;      /* migrations checked (and applied) by some connection */
    bool schema_refused; /* the database is newer than this binary: stay down */
    bool closing;        /* store_free in progress */
    int batch_inflight[2]; /* claim [0] and finish [1] statements holding a slot */
    int batch_slots;       /* slots of each kind (store_pg_slots.c): 1 until measured */
    uint64_t rt_window_us; /* store_pg_slots.c: the current window's start (0: none yet) */
    uint64_t rt_fast_us, rt_fast_prev_us; /* the fastest claim round trip in it, and the last */
    uint64_t rt_n, rt_prev_n;             /* round trips seen in each */
    store_indoubt_t *indoubt; /* claims in doubt, STORE_INDOUBT_MAX at most */
    int indoubt_len;
    int indoubt_dropped;      /* not kept since the last warning: the list was full */
    bool indoubt_releasing;   /* a release statement is queued or in flight */
    struct event *indoubt_ev; /* the next entry falls due */
    store_stats_t stats;
    struct server_stats *timing; /* the sweeper's and the duplicates' statements, or NULL */
    char token_prefix[17];       /* random per store: claim tokens unlike another process's */
    uint64_t token_next;         /* ... followed by a count */
};

/* store_pg_dups.c: the duplicates' columns (sql/002_dup_history.sql) and `idemgw report` */
/* The columns get, release and forget add after the row's, parsed by store_pg_parse_dups. */
/* clang-format off */
#define STORE_PG_DUP_COLS                                                                          \
    "k.dup_replay, k.dup_in_progress, k.dup_unknown, k.dup_reconnect, k.dup_transport, "           \
    "k.dup_harness, k.dup_model, k.dup_late, k.dup_history"
#define STORE_PG_DUP_NCOLS 9
/* A claim's update: an expired row starts a new life, its duplicates too (as attempts). */
#define STORE_PG_NEW_LIFE_DUPS                                                                     \
    " dup_replay = k.dup_replay * (k.expires_at > now())::int,"                                   \
    " dup_in_progress = k.dup_in_progress * (k.expires_at > now())::int,"                         \
    " dup_unknown = k.dup_unknown * (k.expires_at > now())::int,"                                 \
    " dup_reconnect = k.dup_reconnect * (k.expires_at > now())::int,"                             \
    " dup_transport = k.dup_transport * (k.expires_at > now())::int,"                             \
    " dup_harness = k.dup_harness * (k.expires_at > now())::int,"                                 \
    " dup_model = k.dup_model * (k.expires_at > now())::int,"                                     \
    " dup_late = k.dup_late * (k.expires_at > now())::int,"                                       \
    " dup_history = CASE WHEN k.expires_at <= now() THEN '[]'::jsonb ELSE k.dup_history END,"
/* clang-format on */
/* Writes the duplicates recorded since the last write: $1, dup_entries_json (dup_table.h). */
extern const char store_pg_dup_sql[];
/* $1 since (ms, 0: all), $2 top keys. */
extern const char store_pg_report_sql[];
/* Fills row's duplicates from tuple t's columns from col on (STORE_PG_DUP_COLS). */
void store_pg_parse_dups(const PGresult *r, int t, int col, store_row_t *row);
/* Calls cb with the report res holds (STORE_ERR_STATEMENT when it is not one). */
void store_pg_report_deliver(const PGresult *res, store_report_cb cb, void *arg);

/* store_pg_indoubt.c: claims whose answer was lost (sql/004_claim_token.sql) */
#define STORE_INDOUBT_MAX 4096
extern const char store_pg_indoubt_sql[];
void store_indoubt_init(store_pg_t *s);
/* op (a claim or a batch of claims) was sent on a connection that died before its answer came:
 * keeps each claim's key and token. Before its failure is delivered. */
void store_indoubt_note(store_pg_t *s, const store_op_t *op);
/* Sends the release of the entries due, when a connection is up and none is in flight. Called
 * when a connection becomes ready; arms its own timer for entries not due yet. */
void store_indoubt_kick(store_pg_t *s);
/* The release statement ended: st, and the rows it released when STORE_OK. Frees nothing. */
void store_indoubt_done(store_pg_t *s, store_status_t st, long released);
/* At store_free: says what is left, frees the list. */
void store_indoubt_free(store_pg_t *s);

/* store_pg_queue.c: the operator's queue (store_queue.h); op->arg is its store_queue_op_t */
extern const char store_pg_queue_list_sql[];
extern const char store_pg_queue_list_unknown_sql[];
extern const char store_pg_queue_show_sql[];
extern const char store_pg_queue_resolve_sql[];
extern const char store_pg_queue_summary_sql[];
bool store_pg_queue_kind(store_op_kind_t kind);
/* store_ops_t.queue */
store_status_t store_pg_queue(void *impl, struct store_queue_op *q);
/* op answered (st STORE_OK, res its result) or failed (res NULL): answers its request. */
void store_pg_queue_done(store_op_t *op, const PGresult *res, store_status_t st);

/* store.c's submit for the files beside it: accepts op, or frees it when refused. */
store_status_t store_pg_submit(store_pg_t *s, store_op_t *op);

/* store_conn.c */
void store_conn_init(store_pg_t *s, store_conn_t *c, int id);
void store_conn_start(store_conn_t *c);
/* Room for one more op: ready and fewer than STORE_PIPELINE_DEPTH in flight. */
bool store_conn_can_send(const store_conn_t *c);
/* Sends op on a connection that can_send. False: the connection died (op not sent, still the
 * caller's; the ops that were in flight on it have been failed). */
bool store_conn_send(store_conn_t *c, store_op_t *op);
/* The connection stopped answering (an op missed its deadline): closes it, fails its ops in
 * flight as unavailable, reconnects after the backoff. */
void store_conn_abort(store_conn_t *c, const char *why);
/* Tears down the connection for store_free; hands back the ops in flight (a list), if any. */
store_op_t *store_conn_close(store_conn_t *c);
/* Blocking migration at store_pg_new. UNAVAILABLE: could not connect (retry in the background). */
store_status_t store_migrate_sync(store_pg_t *s, char *msg, size_t msglen);
/* Connection parameters shared by the blocking and the non-blocking connects: arrays of
 * STORE_CONN_PARAMS entries. */
#define STORE_CONN_PARAMS 12
void store_conn_params(const store_pg_t *s, const char **kw, const char **val);

/* store.c, called by store_conn.c */
/* Fills the parameters that depend on the connection (the claim's deadline by its clock). */
void store_op_bind(store_op_t *op, int64_t clock_offset_ms);
const char *store_stmt_name(store_op_kind_t kind);
const char *store_stmt_sql(store_op_kind_t kind);
/* A connection became IDLE (or finished an op): hand it queued work. */
void store_pump(store_pg_t *s);
/* The oldest op in flight on a connection completed with res (owned by the callee). It is off
 * the connection's list already; the callee may send more ops, on any connection. */
void store_op_done(store_pg_t *s, store_op_t *op, PGresult *res);
/* The op cannot complete: its callback runs from the loop with st. */
void store_op_fail(store_pg_t *s, store_op_t *op, store_status_t st);
/* Accepts an internal op (no caller waits on it): false, and op freed, when refused. */
bool store_submit_internal(store_pg_t *s, store_op_t *op);
/* A connection went down: when none is up, fail what is queued. */
void store_conn_lost(store_pg_t *s);
int store_up_count(const store_pg_t *s);

/* store_pg_slots.c: group commit's statements in flight. store_slots_note takes a claim
 * statement's round trip (send to answer) and sets s->batch_slots (wider only once 16 were seen
 * in the two windows); store_slots_for is the rule: one, and one more per 500 us of the fastest
 * round trip (UINT64_MAX: none yet), at most pool. */
void store_slots_note(store_pg_t *s, uint64_t round_trip_us, uint64_t now_us);
int store_slots_for(uint64_t fastest_us, int pool);

#endif
