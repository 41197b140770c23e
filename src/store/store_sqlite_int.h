/* Shared by the embedded store's files: store_sqlite.c (the ops, the queue, the loop's side,
 * the interface), store_sqlite_exec.c (the writer thread), store_sqlite_file.c (the file's lock
 * and schema), store_sqlite_vfs.c and store_sqlite_guard.c. */
#ifndef IDEMGW_STORE_SQLITE_INT_H
#define IDEMGW_STORE_SQLITE_INT_H

#include "dup_table.h"
#include "store_delay.h"
#include "stats.h"
#include "store.h"
#include "util.h"

#include <pthread.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct event;
struct event_base;

/* Runs sql, which returns no rows; true on success (the error is in sqlite3_errmsg). */
bool sq_exec(sqlite3 *db, const char *sql);
/* STORE_ERR_UNAVAILABLE for codes that say the file is in trouble, else STORE_ERR_STATEMENT. */
store_status_t sq_status(int rc);
/* How a process holds the file (sq_plan's answer for its options). */
typedef enum {
    SQ_LOCK_NONE = 0,  /* an operator's look (`idemgw key`): SQLite's own locks only */
    SQ_LOCK_SHARED,    /* a peer: beside other peers, never beside an exclusive holder */
    SQ_LOCK_EXCLUSIVE, /* the gateway alone */
} sq_lock_t;

typedef struct {
    sq_lock_t lock;  /* what it takes on PATH.lock for its life */
    bool create;     /* the file and its schema may be made */
    bool gather_wal; /* the -wal written through SQ_VFS_NAME (one process writes the file) */
    bool guard;      /* the files are watched: they are this process's (it holds their lock) */
} sq_plan_t;

/* What the options make of the file: pure, so the rules are unit tested as a table. */
sq_plan_t sq_plan(bool shared, bool peers);

/* Takes PATH.lock for the process's life, in mode: true with *fd its descriptor (-1 for
 * SQ_LOCK_NONE, which takes nothing), or false with msg saying why (held in the other mode: an
 * exclusive holder named by its pid). */
bool sq_lock_file(const char *path, sq_lock_t mode, int *fd, char *msg, size_t msglen);
/* Brings db's schema up to date (only with allow), in one transaction; a newer one is refused. */
store_status_t sq_migrate(sqlite3 *db, bool allow, char *msg, size_t msglen);

/* The VFS the store opens its file with (store_sqlite_vfs.c): the unix VFS, with a -wal file's
 * writes gathered into one per transaction. sq_vfs_register makes it known once per process;
 * false if it cannot be (the store then opens with SQLite's default). */
#define SQ_VFS_NAME "idemgw-unix"
bool sq_vfs_register(void);
/* Drops what db's -wal has gathered when db is outside a transaction: then it can only be frames
 * of one that rolled back, which nobody may write any more (another connection has the write
 * lock, or will, and appends at the same offsets). The writer calls it after every batch. */
void sq_vfs_forget(sqlite3 *db);

/* The files the store opened (store_sqlite_guard.c): the key file, -wal, -shm, the lock. */
#define SQ_GUARD_FILES 4
typedef struct {
    char *path;
    dev_t dev;
    ino_t ino;
    bool known; /* it existed when the store opened */
} sq_guard_file_t;
typedef struct {
    sq_guard_file_t files[SQ_GUARD_FILES];
    int lock_fd;  /* the held lock's descriptor */
    int watch_fd; /* inotify on the files (-1: none); read by sq_guard_quick alone */
} sq_guard_t;

/* Records which files path (the key file) and its companions are now, and the lock held. */
void sq_guard_init(sq_guard_t *g, const char *path, int lock_fd);
/* True while every file at its path is the one recorded; else false, and why says which was
 * deleted or replaced. Only stat()s: safe from any thread. */
bool sq_guard_check(const sq_guard_t *g, char *why, size_t len);
/* The same answer for one system call when nothing happened to the files: their inotify events
 * are read, and only when there are some (or no watch) are the files compared. One thread
 * only (the writer): the events it reads are no one else's. */
bool sq_guard_quick(sq_guard_t *g, char *why, size_t len);
void sq_guard_free(sq_guard_t *g);

/* store_sqlite_queue.c: the operator's queue (store_queue.h), run by the writer on its
 * connection inside the op's savepoint; sets q->out. */
struct store_queue_op;
store_status_t sq_queue_run(sqlite3 *db, struct store_queue_op *q, int64_t now);

/* ---- the store: its ops and their results, shared by the loop and the writer ---- */

#define SQ_ISO_LEN 24 /* 2025-01-01T00:00:00.000Z */
/* Write transactions failing for the disk (full, I/O error) in a row before /readyz says
 * down; one that succeeds again brings it back. */
#define DISK_FAILURES_DOWN 3

typedef enum {
    SQ_CLAIM = 0,
    SQ_FINISH,
    SQ_GET,
    SQ_DUP,
    SQ_SWEEP,
    SQ_EXTEND,
    SQ_RELEASE,
    SQ_FORGET,
    SQ_REPORT,        /* read-only: its batch runs in a read transaction */
    SQ_COUNT_UNKNOWN, /* for /metrics */
    SQ_PROBE,         /* internal: one write, to learn whether the disk takes writes again */
    SQ_QUEUE,         /* the operator's queue (store_sqlite_queue.c) */
} sq_kind_t;

/* The kinds' names, for log lines. */
extern const char *const sq_kind_names[];

/* A row read by the writer, every string owned. Times in epoch milliseconds. */
typedef struct sq_row {
    store_state_t state;
    int64_t fence;
    int attempts;
    char *digest;
    char *result; /* NUL-terminated copy, or NULL */
    size_t result_len;
    bool too_large;
    char *session, *jsonrpc;
    int64_t lease_until, created_at, expires_at;
    int64_t finished_at; /* -1: NULL */
    /* get, release, forget: the duplicates (sql/sqlite/002_dup_history.sql) */
    int dup_answers[STORE_DUP_ANSWERS_];
    int dup_sources[DUP_SOURCE_N];
    char *dup_history;
} sq_row_t;

typedef enum {
    SQ_QUEUED = 0, /* in the queue: the deadline may take it out */
    SQ_TAKEN,      /* the writer has it, or it is on the done list */
} sq_where_t;

typedef struct sq_op {
    struct sq_op *next;
    sq_kind_t kind;
    /* parameters, copied: the op outlives the caller's strings */
    char *key, *tool, *subject, *digest, *session, *jsonrpc;
    bool explicit_key, takeover, too_large;
    int64_t lease_ms, window_ms, fence;
    store_state_t state;
    char *result;
    size_t result_len;
    int batch;         /* sweep: rows per statement */
    dup_entry_t *dups; /* duplicate flush: what each key's duplicates add */
    size_t n_dups;
    int64_t since_ms; /* report: rows updated this long ago or later (0: all) */
    int top;          /* report: keys with the most calls */
    store_cb_t cb;
    void *arg;
    bool internal;     /* the sweeper's batch or the duplicate flush: no callback */
    uint64_t start_us; /* internal ops: when made (stats_now_us), for /metrics */

    struct store_sqlite *store;
    uint64_t deadline_wall_ms; /* 0: none (internal ops) */
    struct event *deadline_ev;
    sq_where_t where; /* under mu */
    bool answered;    /* loop only: the deadline already called back */

    /* results, written by the writer before the op reaches the done list */
    store_status_t status;
    bool acquired; /* claim; release: released */
    bool matched;  /* finish, extend: a row changed; sweep: rows > 0 */
    int64_t rows;  /* sweep: rows deleted; count: rows counted */
    bool has_row;  /* claim, get, release, forget */
    sq_row_t row;
    int64_t now_ms;                 /* the store's clock when the op ran */
    store_report_tool_t *rep_tools; /* report: strings owned */
    store_report_key_t *rep_top;
    size_t n_rep_tools, n_rep_top;
    /* queue: the request (the loop's) and the writer's copy of its inputs, which takes the
     * answer */
    struct store_queue_op *queue, *queue_work;
} sq_op_t;

enum {
    STMT_SELECT = 0,
    STMT_INSERT,
    STMT_TAKEOVER,
    STMT_FINISH,
    STMT_DUP,
    STMT_EXTEND,
    STMT_RELEASE,
    STMT_DELETE,
    STMT_SWEEP,
    STMT_COUNT_UNKNOWN,
    STMT_DUPS,
    STMT_REPORT_TOOLS,
    STMT_REPORT_TOP,
    /* the transaction's own statements, run for every batch (ctl) */
    STMT_BEGIN_READ,
    STMT_BEGIN_WRITE,
    STMT_COMMIT,
    STMT_ROLLBACK,
    STMT_SAVEPOINT,
    STMT_ROLLBACK_TO,
    STMT_RELEASE_SAVEPOINT,
    STMT_COUNT_
};

typedef struct store_sqlite {
    struct event_base *base;
    char *path;
    int lock_fd; /* -1 in shared mode */
    sqlite3 *db; /* the writer's once it runs */
    sqlite3_stmt *stmts[STMT_COUNT_];
    uint64_t timeout_ms;
    uint64_t sweep_interval_ms;
    int sweep_batch;

    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu */
    sq_op_t *q_head, *q_tail;
    int q_len;
    sq_op_t *done_head, *done_tail;
    bool stopping;
    uint64_t transactions, batched_ops;
    uint64_t lazy_transactions;    /* committed with synchronous=NORMAL */
    uint64_t delayed_transactions; /* waited for company (store.commit_delay) */
    bool lingering;                /* the writer waits for company: enqueue need not wake it */
    /* store.commit_delay (store_sqlite_delay.c) */
    uint64_t commit_delay_us; /* 0: off */
    store_pace_t pace;        /* writer only: claims open, the pace of finishes */

    int efd; /* the writer wakes the loop: results are on the done list */
    struct event *done_ev;
    struct event *sweep_ev, *sweep_more_ev, *dup_ev;
    bool sweeping;
    bool closing;
    dup_table_t dups;            /* duplicates per key not yet written (the loop's) */
    store_stats_t stats;         /* the loop's counters */
    struct server_stats *timing; /* the sweeper's and the duplicates' writes, or NULL */

    sq_guard_t guard;       /* the files opened (store_sqlite_guard.c) */
    bool guarded;           /* not in shared mode: this process holds the lock */
    bool durable_finish;    /* finishes wait for the disk too (store.durable_finish) */
    bool alone;             /* the file's only writer (its exclusive lock): calls commit in order */
    bool lazy_sync;         /* writer: PRAGMA synchronous is NORMAL now, not FULL */
    struct event *guard_ev; /* every GUARD_CHECK_MS: the files, and the disk probe */
    bool probing;           /* the disk probe is queued or running (loop only) */
    /* under mu */
    char *lost;        /* why the files are no longer the store's; NULL while they are */
    int disk_failures; /* write transactions failed for the disk in a row */
} store_sqlite_t;

/* Every statement the writer runs, by STMT_ number (prepared when the store opens). */
extern const char *const sq_stmt_sql[STMT_COUNT_];

/* Epoch milliseconds as ISO 8601 UTC with milliseconds, as the Postgres backend prints them. */
static inline void sq_iso_utc(int64_t ms, char out[SQ_ISO_LEN + 1])
{
    util_iso_utc_ms(ms, out);
}

/* Frees a row's strings and zeroes it. */
void sq_row_free(sq_row_t *r);

/* Operations in one transaction at most: bounds the wait of the last one. */
#define SQ_BATCH_MAX 512

/* The commit delay (store_sqlite_delay.c). sq_delay_wait: the writer, under mu, with ops
 * queued after it was idle: holds the batch while the policy allows (store_delay.h) and the
 * queue holds a claim.
 * sq_delay_wakes: under mu, after queueing an op: whether to wake the writer. sq_delay_count:
 * the writer, after a batch committed: the claims it opened and the calls it closed. */
void sq_delay_wait(store_sqlite_t *s);
bool sq_delay_wakes(const store_sqlite_t *s);
void sq_delay_count(store_sqlite_t *s, const sq_op_t *batch);

/* The writer thread (store_sqlite_exec.c): runs the queued ops in batches until stopping. */
void *sq_writer_main(void *arg);
/* Whether the files at the path are still the ones opened. Once they are not, the store is
 * lost for good (said once in the log): any thread; quick (their events first) from the writer
 * alone. */
bool sq_files_intact(store_sqlite_t *s, bool quick);

#endif
