/* The embedded store (store_sqlite.h): one SQLite file, one writer thread, batched commits.
 *
 * Threads: the loop thread makes ops and queues them (q_head, under mu); the writer thread
 * takes every op waiting when it is free (up to BATCH_MAX), runs them in one BEGIN IMMEDIATE
 * transaction, each inside its own savepoint so a failing op rolls back only itself, commits,
 * and only then moves the batch to the done list (under mu) and wakes the loop through the
 * eventfd. The loop runs the callbacks. An op is owned by the queue, then by the writer, then
 * by the done list; the loop frees it after its callback.
 *
 * Deadlines (store.timeout): a timer on the loop per op. An op still queued at its deadline is
 * taken out and fails STORE_ERR_UNAVAILABLE; one the writer holds is answered
 * STORE_ERR_UNAVAILABLE at once and marked answered, so its late result calls nobody. The
 * writer does not start an op past its deadline, so a claim the caller was told failed never
 * takes the key afterwards (Postgres's claim carries its deadline for the same reason).
 *
 * Clock: each op reads the wall clock when the writer starts it; leases, windows and expiry are
 * compared with that, as Postgres compares with now().
 *
 * Duplicates are recorded in memory (dup_table.h) and written every DUP_FLUSH_MS as one op, as
 * the Postgres backend does; store_free writes what is left before it returns. */
#include "store_sqlite.h"
#include "store_sqlite_int.h"

#include "dup_table.h"

#include "key_hash.h"
#include "log.h"
#include "stats.h"
#include "store_migrations.h"
#include "util.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define QUEUE_MAX 10000
#define BATCH_MAX 512 /* ops per transaction: bounds the wait of the last one */
#define DUP_FLUSH_MS 500
#define DUP_FLUSH_KEYS 4096
/* Durations are clamped so that now + duration stays far inside int64 milliseconds. */
#define DURATION_MAX_MS INT64_C(1000000000000)
#define ISO_LEN 24 /* 2025-01-01T00:00:00.000Z */
/* How often the files are compared with the ones opened when nothing else writes, and a disk
 * that failed writes is probed. */
#define GUARD_CHECK_MS 1000
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
} sq_kind_t;

static const char *const kind_names[] = {"claim",  "finish",        "get",     "duplicates",
                                         "sweep",  "extend",        "release", "forget",
                                         "report", "count_unknown", "probe"};

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
    uint64_t lazy_transactions; /* committed with synchronous=NORMAL */

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
    bool lazy_sync;         /* writer: PRAGMA synchronous is NORMAL now, not FULL */
    struct event *guard_ev; /* every GUARD_CHECK_MS: the files, and the disk probe */
    bool probing;           /* the disk probe is queued or running (loop only) */
    /* under mu */
    char *lost;        /* why the files are no longer the store's; NULL while they are */
    int disk_failures; /* write transactions failed for the disk in a row */
} store_sqlite_t;

static const char *const stmt_sql[STMT_COUNT_] = {
    [STMT_SELECT] = "SELECT state, fence, attempts, args_digest, result, result_too_large,"
                    " lease_until, created_at, first_session_id, first_jsonrpc_id, expires_at,"
                    " finished_at FROM idem_keys WHERE key = ?1",
    [STMT_INSERT] = "INSERT INTO idem_keys (key, tool, subject, args_digest, explicit_key, state,"
                    " fence, attempts, first_session_id, first_jsonrpc_id, lease_until, created_at,"
                    " updated_at, expires_at)"
                    " VALUES (?1, ?2, ?3, ?4, ?5, 'in_progress', 1, 1, ?6, ?7, ?8, ?9, ?9, ?10)",
    /* a takeover: ?6 attempts, ?7 created_at and the first ids are the new life's when the row
     * had expired, else the row's own (see exec_claim) */
    [STMT_TAKEOVER] = "UPDATE idem_keys SET tool = ?2, subject = ?3, args_digest = ?4,"
                      " explicit_key = ?5, state = 'in_progress', fence = fence + 1,"
                      " attempts = ?6, created_at = ?7, first_session_id = ?8,"
                      " first_jsonrpc_id = ?9, result = NULL, result_too_large = 0,"
                      " lease_until = ?10, updated_at = ?11, finished_at = NULL,"
                      " expires_at = ?12,"
                      /* ?13: a new life, its duplicates too */
                      " dup_replay = dup_replay * (1 - ?13),"
                      " dup_in_progress = dup_in_progress * (1 - ?13),"
                      " dup_unknown = dup_unknown * (1 - ?13),"
                      " dup_reconnect = dup_reconnect * (1 - ?13),"
                      " dup_transport = dup_transport * (1 - ?13),"
                      " dup_harness = dup_harness * (1 - ?13), dup_model = dup_model * (1 - ?13),"
                      " dup_late = dup_late * (1 - ?13),"
                      " dup_history = CASE WHEN ?13 THEN '[]' ELSE dup_history END WHERE key = ?1",
    [STMT_FINISH] = "UPDATE idem_keys SET state = ?3, result = ?4, result_too_large = ?5,"
                    " updated_at = ?6, finished_at = ?6, expires_at = ?7"
                    " WHERE key = ?1 AND fence = ?2",
    /* one key's duplicates: ?2 replays (attempts too), ?4 in progress, ?5 unknown, ?6 to ?10
     * by source, ?11 the history merged (dup_history_merge) */
    [STMT_DUP] = "UPDATE idem_keys SET attempts = min(attempts + ?2, 2147483647), updated_at = ?3,"
                 " dup_replay = dup_replay + ?2, dup_in_progress = dup_in_progress + ?4,"
                 " dup_unknown = dup_unknown + ?5, dup_reconnect = dup_reconnect + ?6,"
                 " dup_transport = dup_transport + ?7, dup_harness = dup_harness + ?8,"
                 " dup_model = dup_model + ?9, dup_late = dup_late + ?10, dup_history = ?11"
                 " WHERE key = ?1",
    [STMT_EXTEND] = "UPDATE idem_keys SET lease_until = ?3, expires_at = max(expires_at, ?3),"
                    " updated_at = ?4 WHERE key = ?1 AND fence = ?2 AND state = 'in_progress'",
    [STMT_RELEASE] = "UPDATE idem_keys SET state = 'failed', fence = fence + 1, lease_until = ?2,"
                     " updated_at = ?2 WHERE key = ?1",
    [STMT_DELETE] = "DELETE FROM idem_keys WHERE key = ?1",
    /* expired as a claim judges it (expires_at <= now: times are whole milliseconds here).
     * An in-progress row whose lease still runs is never deleted (its expiry is never before
     * its lease, but be sure) */
    [STMT_SWEEP] = "DELETE FROM idem_keys WHERE key IN (SELECT key FROM idem_keys"
                   " WHERE expires_at <= ?1 AND NOT (state = 'in_progress' AND lease_until > ?1)"
                   " ORDER BY expires_at LIMIT ?2)",
    [STMT_COUNT_UNKNOWN] = "SELECT count(*) FROM idem_keys WHERE state = 'unknown'"
                           " AND expires_at > ?1",
    [STMT_DUPS] = "SELECT dup_replay, dup_in_progress, dup_unknown, dup_reconnect, dup_transport,"
                  " dup_harness, dup_model, dup_late, dup_history FROM idem_keys WHERE key = ?1",
    /* `idemgw report`: the rows updated since ?2 (?1 <= 0: all) whose tool starts with ?4 ("":
     * every row), per tool; then the keys with the most calls, up to ?3 */
    [STMT_REPORT_TOOLS] = "SELECT tool, count(*), sum(attempts), sum(dup_replay),"
                          " sum(dup_in_progress), sum(dup_unknown), sum(dup_reconnect),"
                          " sum(dup_transport), sum(dup_harness), sum(dup_model), sum(dup_late),"
                          " sum(state = 'in_progress'), sum(state = 'succeeded'),"
                          " sum(state = 'failed'), sum(state = 'unknown') FROM idem_keys"
                          " WHERE (?1 <= 0 OR updated_at >= ?2)"
                          " AND substr(tool, 1, length(?4)) = ?4 GROUP BY tool ORDER BY tool",
    [STMT_REPORT_TOP] = "SELECT tool, key, attempts, dup_replay + dup_in_progress + dup_unknown,"
                        " state, created_at, attempts + dup_in_progress + dup_unknown"
                        " FROM idem_keys WHERE (?1 <= 0 OR updated_at >= ?2)"
                        " AND substr(tool, 1, length(?4)) = ?4"
                        " ORDER BY attempts + dup_in_progress + dup_unknown DESC, key LIMIT ?3",
    [STMT_BEGIN_READ] = "BEGIN",
    [STMT_BEGIN_WRITE] = "BEGIN IMMEDIATE",
    [STMT_COMMIT] = "COMMIT",
    [STMT_ROLLBACK] = "ROLLBACK",
    [STMT_SAVEPOINT] = "SAVEPOINT op",
    [STMT_ROLLBACK_TO] = "ROLLBACK TO op",
    [STMT_RELEASE_SAVEPOINT] = "RELEASE op",
};

int store_sqlite_schema_version(void)
{
    return store_sqlite_migrations_count;
}

static struct event *must_event(struct event *ev)
{
    if (!ev) {
        fprintf(stderr, "idemgw: out of memory creating an event\n");
        abort();
    }
    return ev;
}

static int64_t clamp_ms(uint64_t ms)
{
    return (int64_t)(ms > (uint64_t)DURATION_MAX_MS ? (uint64_t)DURATION_MAX_MS : ms);
}

static char *dup_or_null(const char *s)
{
    return s ? xstrdup(s) : NULL;
}

/* Epoch milliseconds as ISO 8601 UTC with milliseconds, as the Postgres backend prints them. */
static void iso_utc(int64_t ms, char out[ISO_LEN + 1])
{
    util_iso_utc_ms(ms, out);
}

static void row_free(sq_row_t *r)
{
    free(r->digest);
    free(r->result);
    free(r->session);
    free(r->jsonrpc);
    free(r->dup_history);
    memset(r, 0, sizeof(*r));
}

/* ---- ops ---- */

static void op_free(sq_op_t *op)
{
    if (!op)
        return;
    free(op->key);
    free(op->tool);
    free(op->subject);
    free(op->digest);
    free(op->session);
    free(op->jsonrpc);
    free(op->result);
    dup_entries_free(op->dups, op->n_dups);
    for (size_t i = 0; i < op->n_rep_tools; i++)
        free((char *)op->rep_tools[i].tool);
    for (size_t i = 0; i < op->n_rep_top; i++) {
        free((char *)op->rep_top[i].tool);
        free((char *)op->rep_top[i].key);
        free((char *)op->rep_top[i].created_at);
    }
    free(op->rep_tools);
    free(op->rep_top);
    row_free(&op->row);
    if (op->deadline_ev)
        event_free(op->deadline_ev);
    free(op);
}

static sq_op_t *op_new(sq_kind_t kind, const char *key)
{
    sq_op_t *op = xcalloc(1, sizeof(*op));
    op->kind = kind;
    op->key = dup_or_null(key);
    return op;
}

/* ---- the writer thread ---- */

static char *col_text(sqlite3_stmt *st, int col)
{
    const unsigned char *t = sqlite3_column_text(st, col);
    return t ? xstrdup((const char *)t) : NULL;
}

/* Reads key's row: 1 found (row filled), 0 none, -1 error. */
static int row_load(store_sqlite_t *s, const char *key, sq_row_t *row)
{
    sqlite3_stmt *st = s->stmts[STMT_SELECT];
    memset(row, 0, sizeof(*row));
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    int out = 0;
    if (rc == SQLITE_ROW) {
        out = 1;
        const char *state = (const char *)sqlite3_column_text(st, 0);
        if (!store_state_parse(state, &row->state))
            out = -1;
        row->fence = sqlite3_column_int64(st, 1);
        row->attempts = sqlite3_column_int(st, 2);
        row->digest = col_text(st, 3);
        if (sqlite3_column_type(st, 4) != SQLITE_NULL) {
            const void *b = sqlite3_column_blob(st, 4);
            size_t n = (size_t)sqlite3_column_bytes(st, 4);
            row->result = xmalloc(n + 1);
            if (n)
                memcpy(row->result, b, n);
            row->result[n] = '\0';
            row->result_len = n;
        }
        row->too_large = sqlite3_column_int(st, 5) != 0;
        row->lease_until = sqlite3_column_int64(st, 6);
        row->created_at = sqlite3_column_int64(st, 7);
        row->session = col_text(st, 8);
        row->jsonrpc = col_text(st, 9);
        row->expires_at = sqlite3_column_int64(st, 10);
        row->finished_at =
            sqlite3_column_type(st, 11) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 11);
        if (!row->digest)
            out = -1;
    } else if (rc != SQLITE_DONE) {
        out = -1;
    }
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    if (out < 0)
        row_free(row);
    return out;
}

/* Reads key's duplicates into row: 1 found, 0 no row, -1 error. */
static int dups_load(store_sqlite_t *s, const char *key, sq_row_t *row)
{
    sqlite3_stmt *st = s->stmts[STMT_DUPS];
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st), out = 0;
    if (rc == SQLITE_ROW) {
        out = 1;
        for (int i = 0; i < STORE_DUP_ANSWERS_; i++)
            row->dup_answers[i] = sqlite3_column_int(st, i);
        for (int i = 0; i < DUP_SOURCE_N; i++)
            row->dup_sources[i] = sqlite3_column_int(st, STORE_DUP_ANSWERS_ + i);
        free(row->dup_history);
        row->dup_history = col_text(st, STORE_DUP_ANSWERS_ + DUP_SOURCE_N);
    } else if (rc != SQLITE_DONE) {
        out = -1;
    }
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return out;
}

/* Runs a prepared write statement to its end; the rows it changed, or -1. */
static int64_t stmt_run(store_sqlite_t *s, sqlite3_stmt *st)
{
    int rc = sqlite3_step(st);
    int64_t changed = rc == SQLITE_DONE ? sqlite3_changes64(s->db) : -1;
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return changed;
}

static void bind_text(sqlite3_stmt *st, int i, const char *v)
{
    if (v)
        sqlite3_bind_text(st, i, v, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, i);
}

/* The one-step claim of sql/ (store_pg_sql.c), as steps inside the writer's transaction: insert,
 * take over (expired; or same arguments and failed, or in progress past its lease when the
 * caller allows it), or return the existing row. An expired row starts a new life (created_at,
 * attempts, first ids) but keeps counting its fence. */
static store_status_t exec_claim(store_sqlite_t *s, sq_op_t *op, int64_t now)
{
    sq_row_t old;
    int found = row_load(s, op->key, &old);
    if (found < 0)
        return STORE_ERR_STATEMENT;
    int64_t lease_until = now + op->lease_ms;
    int64_t expires_at = now + (op->lease_ms > op->window_ms ? op->lease_ms : op->window_ms);
    sqlite3_stmt *st;
    if (found) {
        bool expired = old.expires_at <= now;
        bool take = expired ||
                    (strcmp(old.digest, op->digest) == 0 &&
                     (old.state == STORE_STATE_FAILED || (old.state == STORE_STATE_IN_PROGRESS &&
                                                          old.lease_until <= now && op->takeover)));
        if (!take) {
            op->row = old;
            op->has_row = true;
            return STORE_OK;
        }
        st = s->stmts[STMT_TAKEOVER];
        sqlite3_bind_int(st, 6, expired ? 1 : old.attempts + 1);
        sqlite3_bind_int64(st, 7, expired ? now : old.created_at);
        bind_text(st, 8, expired ? op->session : old.session);
        bind_text(st, 9, expired ? op->jsonrpc : old.jsonrpc);
        sqlite3_bind_int64(st, 10, lease_until);
        sqlite3_bind_int64(st, 11, now);
        sqlite3_bind_int64(st, 12, expires_at);
        sqlite3_bind_int(st, 13, expired);
    } else {
        st = s->stmts[STMT_INSERT];
        bind_text(st, 6, op->session);
        bind_text(st, 7, op->jsonrpc);
        sqlite3_bind_int64(st, 8, lease_until);
        sqlite3_bind_int64(st, 9, now);
        sqlite3_bind_int64(st, 10, expires_at);
    }
    bind_text(st, 1, op->key);
    bind_text(st, 2, op->tool);
    bind_text(st, 3, op->subject);
    bind_text(st, 4, op->digest);
    sqlite3_bind_int(st, 5, op->explicit_key);
    int64_t changed = stmt_run(s, st);
    row_free(&old);
    if (changed != 1)
        return STORE_ERR_STATEMENT;
    if (found) {
        /* a takeover keeps some of the old row's columns: read back what it became */
        if (row_load(s, op->key, &op->row) != 1)
            return STORE_ERR_STATEMENT;
    } else {
        /* a new row is what STMT_INSERT wrote: reading it back cost a third statement */
        op->row = (sq_row_t){
            .state = STORE_STATE_IN_PROGRESS,
            .fence = 1,
            .attempts = 1,
            .digest = xstrdup(op->digest),
            .session = dup_or_null(op->session),
            .jsonrpc = dup_or_null(op->jsonrpc),
            .lease_until = lease_until,
            .created_at = now,
            .expires_at = expires_at,
            .finished_at = -1,
        };
    }
    op->has_row = true;
    op->acquired = true;
    return STORE_OK;
}

/* One key's duplicates onto its row (skipped when the row is gone). */
static store_status_t exec_dup(store_sqlite_t *s, const dup_entry_t *e, int64_t now, int64_t *rows)
{
    sq_row_t cur;
    memset(&cur, 0, sizeof(cur));
    int found = dups_load(s, e->key, &cur);
    if (found <= 0)
        return found < 0 ? STORE_ERR_STATEMENT : STORE_OK;
    char *history = dup_history_merge(cur.dup_history, e);
    row_free(&cur);
    /* a history that is not JSON any more starts again rather than block the counts */
    if (!history)
        history = dup_history_merge(NULL, e);
    sqlite3_stmt *st = s->stmts[STMT_DUP];
    bind_text(st, 1, e->key);
    sqlite3_bind_int(st, 2, e->count);
    sqlite3_bind_int64(st, 3, now);
    sqlite3_bind_int(st, 4, e->p->answers[STORE_DUP_IN_PROGRESS]);
    sqlite3_bind_int(st, 5, e->p->answers[STORE_DUP_UNKNOWN]);
    for (int i = 0; i < DUP_SOURCE_N; i++)
        sqlite3_bind_int(st, 6 + i, e->p->sources[i]);
    bind_text(st, 11, history);
    int64_t n = stmt_run(s, st);
    free(history);
    if (n < 0)
        return STORE_ERR_STATEMENT;
    *rows += n;
    return STORE_OK;
}

/* The report, into op (strings copied). */
static store_status_t exec_report(store_sqlite_t *s, sq_op_t *op, int64_t now)
{
    sqlite3_stmt *st = s->stmts[STMT_REPORT_TOOLS];
    sqlite3_bind_int64(st, 1, op->since_ms);
    sqlite3_bind_int64(st, 2, now - op->since_ms);
    bind_text(st, 4, op->tool);
    size_t cap = 0;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (op->n_rep_tools == cap) {
            cap = cap ? cap * 2 : 8;
            op->rep_tools = xrealloc(op->rep_tools, cap * sizeof(*op->rep_tools));
        }
        store_report_tool_t *o = &op->rep_tools[op->n_rep_tools++];
        memset(o, 0, sizeof(*o));
        o->tool = col_text(st, 0);
        o->keys = sqlite3_column_int64(st, 1);
        int64_t attempts = sqlite3_column_int64(st, 2);
        for (int i = 0; i < STORE_DUP_ANSWERS_; i++)
            o->dup_answers[i] = sqlite3_column_int64(st, 3 + i);
        for (int i = 0; i < DUP_SOURCE_N; i++)
            o->dup_sources[i] = sqlite3_column_int64(st, 3 + STORE_DUP_ANSWERS_ + i);
        for (int i = 0; i < STORE_STATES; i++)
            o->states[i] = sqlite3_column_int64(st, 3 + STORE_DUP_ANSWERS_ + DUP_SOURCE_N + i);
        o->runs = attempts - o->dup_answers[STORE_DUP_REPLAY];
        o->calls =
            attempts + o->dup_answers[STORE_DUP_IN_PROGRESS] + o->dup_answers[STORE_DUP_UNKNOWN];
    }
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    if (rc != SQLITE_DONE)
        return STORE_ERR_STATEMENT;
    st = s->stmts[STMT_REPORT_TOP];
    sqlite3_bind_int64(st, 1, op->since_ms);
    sqlite3_bind_int64(st, 2, now - op->since_ms);
    sqlite3_bind_int(st, 3, op->top > 0 ? op->top : 0);
    bind_text(st, 4, op->tool);
    cap = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (op->n_rep_top == cap) {
            cap = cap ? cap * 2 : 8;
            op->rep_top = xrealloc(op->rep_top, cap * sizeof(*op->rep_top));
        }
        store_report_key_t *k = &op->rep_top[op->n_rep_top++];
        memset(k, 0, sizeof(*k));
        k->tool = col_text(st, 0);
        k->key = col_text(st, 1);
        k->attempts = sqlite3_column_int(st, 2);
        k->duplicates = sqlite3_column_int(st, 3);
        k->calls = sqlite3_column_int(st, 6);
        store_state_t state = STORE_STATE_UNKNOWN;
        (void)store_state_parse((const char *)sqlite3_column_text(st, 4), &state);
        k->state = state;
        char iso[ISO_LEN + 1];
        iso_utc(sqlite3_column_int64(st, 5), iso);
        k->created_at = xstrdup(iso);
    }
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR_STATEMENT;
}

static store_status_t exec_op(store_sqlite_t *s, sq_op_t *op, int64_t now)
{
    sqlite3_stmt *st;
    int64_t n;
    int found;
    switch (op->kind) {
    case SQ_CLAIM:
        return exec_claim(s, op, now);
    case SQ_FINISH:
        st = s->stmts[STMT_FINISH];
        bind_text(st, 1, op->key);
        sqlite3_bind_int64(st, 2, op->fence);
        bind_text(st, 3, store_state_str(op->state));
        if (op->result)
            sqlite3_bind_blob(st, 4, op->result, (int)op->result_len, SQLITE_STATIC);
        else
            sqlite3_bind_null(st, 4);
        sqlite3_bind_int(st, 5, op->too_large);
        sqlite3_bind_int64(st, 6, now);
        sqlite3_bind_int64(st, 7, now + op->window_ms);
        n = stmt_run(s, st);
        op->matched = n > 0;
        return n < 0 ? STORE_ERR_STATEMENT : STORE_OK;
    case SQ_GET:
        found = row_load(s, op->key, &op->row);
        if (found == 1)
            found = dups_load(s, op->key, &op->row);
        op->has_row = found == 1;
        return found < 0 ? STORE_ERR_STATEMENT : STORE_OK;
    case SQ_DUP:
        for (size_t i = 0; i < op->n_dups; i++)
            if (exec_dup(s, &op->dups[i], now, &op->rows) != STORE_OK)
                return STORE_ERR_STATEMENT;
        return STORE_OK;
    case SQ_REPORT:
        return exec_report(s, op, now);
    case SQ_SWEEP:
        st = s->stmts[STMT_SWEEP];
        sqlite3_bind_int64(st, 1, now);
        sqlite3_bind_int(st, 2, op->batch);
        n = stmt_run(s, st);
        op->rows = n;
        op->matched = n > 0;
        return n < 0 ? STORE_ERR_STATEMENT : STORE_OK;
    case SQ_EXTEND:
        st = s->stmts[STMT_EXTEND];
        bind_text(st, 1, op->key);
        sqlite3_bind_int64(st, 2, op->fence);
        sqlite3_bind_int64(st, 3, now + op->lease_ms);
        sqlite3_bind_int64(st, 4, now);
        n = stmt_run(s, st);
        op->matched = n > 0;
        return n < 0 ? STORE_ERR_STATEMENT : STORE_OK;
    case SQ_RELEASE:
        /* the row as it was; released when unknown, or in progress past its lease */
        found = row_load(s, op->key, &op->row);
        if (found == 1)
            found = dups_load(s, op->key, &op->row);
        if (found < 0)
            return STORE_ERR_STATEMENT;
        op->has_row = found == 1;
        if (!found || !(op->row.state == STORE_STATE_UNKNOWN ||
                        (op->row.state == STORE_STATE_IN_PROGRESS && op->row.lease_until <= now)))
            return STORE_OK;
        st = s->stmts[STMT_RELEASE];
        bind_text(st, 1, op->key);
        sqlite3_bind_int64(st, 2, now);
        n = stmt_run(s, st);
        op->acquired = n > 0;
        return n < 0 ? STORE_ERR_STATEMENT : STORE_OK;
    case SQ_FORGET:
        found = row_load(s, op->key, &op->row);
        if (found == 1)
            found = dups_load(s, op->key, &op->row);
        if (found < 0)
            return STORE_ERR_STATEMENT;
        op->has_row = found == 1;
        if (!found)
            return STORE_OK;
        st = s->stmts[STMT_DELETE];
        bind_text(st, 1, op->key);
        return stmt_run(s, st) < 0 ? STORE_ERR_STATEMENT : STORE_OK;
    case SQ_PROBE:
        /* 64 KiB written and committed (and freed again in the same transaction): a rewrite
         * of one row fits in the write-ahead log's space already taken and proves nothing */
        return sq_exec(s->db, "INSERT INTO schema_migrations (version, name)"
                              " VALUES (-1, zeroblob(65536));"
                              "DELETE FROM schema_migrations WHERE version = -1")
                   ? STORE_OK
                   : STORE_ERR_STATEMENT;
    case SQ_COUNT_UNKNOWN: {
        st = s->stmts[STMT_COUNT_UNKNOWN];
        sqlite3_bind_int64(st, 1, now);
        bool row = sqlite3_step(st) == SQLITE_ROW;
        op->rows = row ? sqlite3_column_int64(st, 0) : 0;
        sqlite3_reset(st);
        return row ? STORE_OK : STORE_ERR_STATEMENT;
    }
    }
    return STORE_ERR_STATEMENT;
}

static void batch_fail(sq_op_t *batch, store_status_t st)
{
    for (sq_op_t *op = batch; op; op = op->next) {
        if (op->status == STORE_OK) {
            op->status = st;
            row_free(&op->row);
            op->has_row = false;
        }
    }
}

/* Whether the files at the path are still the ones opened. Once they are not, the store is
 * lost for good (said once in the log): any thread; quick (their events first) from the writer
 * alone. */
static bool files_intact(store_sqlite_t *s, bool quick)
{
    if (!s->guarded)
        return true;
    pthread_mutex_lock(&s->mu);
    bool lost = s->lost != NULL;
    pthread_mutex_unlock(&s->mu);
    char why[600];
    if (lost || (quick ? sq_guard_quick(&s->guard, why, sizeof(why))
                       : sq_guard_check(&s->guard, why, sizeof(why))))
        return !lost;
    pthread_mutex_lock(&s->mu);
    bool first = s->lost == NULL;
    if (first)
        s->lost = xstrdup(why);
    pthread_mutex_unlock(&s->mu);
    if (first)
        log_error(0,
                  "store: the embedded store is lost: %s. Protected calls are refused "
                  "(store_error) and /readyz says not ready until the gateway is restarted; "
                  "the keys it held are gone with the file",
                  why);
    return false;
}

/* Codes that say the disk did not take a write. */
static bool disk_error(int rc)
{
    return (rc & 0xff) == SQLITE_FULL || (rc & 0xff) == SQLITE_IOERR;
}

/* A write transaction ended: failed for the disk, or committed. Repeated failures mark the
 * store down in /readyz, a commit brings it back. Writer thread. */
static void note_disk(store_sqlite_t *s, bool failed)
{
    pthread_mutex_lock(&s->mu);
    int before = s->disk_failures;
    s->disk_failures = failed ? before + 1 : 0;
    pthread_mutex_unlock(&s->mu);
    if (failed && before + 1 == DISK_FAILURES_DOWN)
        log_error(0,
                  "store: %d write transactions in a row failed for the disk (full, or I/O "
                  "errors) on %s: /readyz says not ready until a write succeeds",
                  DISK_FAILURES_DOWN, s->path);
    else if (!failed && before >= DISK_FAILURES_DOWN)
        log_info(0, "store: %s takes writes again", s->path);
}

/* Whether a write batch must be on disk when it commits. A claim must (the call goes out on
 * it), and so must everything else but finishes and duplicate counts: a finish lost in a crash
 * of the machine leaves its claim, so the retry hears the outcome is unknown and nothing runs
 * twice, as on Postgres (store.durable_finish makes finishes wait too). The WAL is one file
 * synced whole, so the next synchronous commit takes the finishes before it to disk. */
static bool batch_must_sync(const store_sqlite_t *s, const sq_op_t *batch)
{
    for (const sq_op_t *op = batch; op; op = op->next)
        if (s->durable_finish || (op->kind != SQ_FINISH && op->kind != SQ_DUP))
            return true;
    return false;
}

/* Runs one of the batch's own statements (begin, commit, savepoints, the sync pragma): they are
 * prepared once, as parsing them anew for every batch and op cost about what an op's own
 * statements did. The step's error stays the connection's (sqlite3_errmsg and the codes). */
static bool ctl(store_sqlite_t *s, int stmt)
{
    sqlite3_stmt *st = s->stmts[stmt];
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        ;
    sqlite3_reset(st);
    return rc == SQLITE_DONE;
}

/* PRAGMA synchronous for the next commit: FULL (fsync at commit) or NORMAL (WAL written, synced
 * at the next FULL commit or checkpoint). Writer thread, outside a transaction. SQLite sets the
 * level when the pragma is prepared, not when it is stepped: a statement prepared once and
 * stepped again later changes nothing, so this one is prepared anew each time. */
static bool set_sync(store_sqlite_t *s, bool full)
{
    if (s->lazy_sync == !full)
        return true;
    if (!sq_exec(s->db, full ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL"))
        return !full; /* a finish may still commit synchronously */
    s->lazy_sync = !full;
    return true;
}

/* Whether an op needs a savepoint of its own, so that its failure leaves the batch's other ops
 * as they were. Not one whose only write is its last statement (or that writes nothing): SQLite
 * undoes a failed statement itself, and a failure that takes the whole transaction with it is
 * seen below (autocommit). A finish is one UPDATE: the savepoint and its release were two of a
 * finish's three statements. */
static bool op_needs_savepoint(const sq_op_t *op)
{
    switch (op->kind) {
    case SQ_FINISH:
    case SQ_EXTEND:
    case SQ_SWEEP:
    case SQ_GET:
    case SQ_REPORT:
    case SQ_COUNT_UNKNOWN:
        return false;
    default:
        /* a claim reads its row back after a takeover, a duplicate write is one statement
         * per key, the probe two */
        return true;
    }
}

/* One transaction for the whole batch; every op's result is final once it committed. */
static void run_batch(store_sqlite_t *s, sq_op_t *batch)
{
    int ran = 0;
    /* reports and counts only read: a read transaction leaves the write lock to others (WAL) */
    bool read_only = true;
    bool disk_failed = false;
    for (const sq_op_t *op = batch; op; op = op->next)
        read_only = read_only && (op->kind == SQ_REPORT || op->kind == SQ_COUNT_UNKNOWN);
    /* reads too: the old file's rows are no longer the store's answer */
    if (!files_intact(s, true)) {
        batch_fail(batch, STORE_ERR_FILE_LOST);
        return;
    }
    if (!read_only && !set_sync(s, batch_must_sync(s, batch))) {
        log_warn(0, "store: sqlite: cannot set synchronous=FULL: %s", sqlite3_errmsg(s->db));
        batch_fail(batch, STORE_ERR_UNAVAILABLE);
        return;
    }
    if (!ctl(s, read_only ? STMT_BEGIN_READ : STMT_BEGIN_WRITE)) {
        int rc = sqlite3_extended_errcode(s->db);
        log_warn(0, "store: sqlite: cannot begin a transaction: %s", sqlite3_errmsg(s->db));
        batch_fail(batch, sq_status(rc));
        if (!read_only && disk_error(rc))
            note_disk(s, true);
        return;
    }
    for (sq_op_t *op = batch; op; op = op->next) {
        int64_t now = (int64_t)util_wall_ms();
        op->now_ms = now;
        if (op->deadline_wall_ms && (uint64_t)now > op->deadline_wall_ms) {
            /* answered unavailable by the loop already, or about to be: never run it */
            op->status = STORE_ERR_UNAVAILABLE;
            continue;
        }
        bool savepoint = op_needs_savepoint(op);
        if (savepoint && !ctl(s, STMT_SAVEPOINT)) {
            op->status = sq_status(sqlite3_extended_errcode(s->db));
            continue;
        }
        op->status = exec_op(s, op, now);
        if (op->status != STORE_OK) {
            int rc = sqlite3_extended_errcode(s->db);
            char h[KEY_HASH_LOG_LEN + 1] = "-";
            if (op->key)
                key_hash_log(op->key, h);
            log_error(0, "store: sqlite: %s of key %s failed: %s", kind_names[op->kind], h,
                      sqlite3_errmsg(s->db));
            row_free(&op->row);
            op->has_row = false;
            disk_failed = disk_failed || disk_error(rc);
            if (sqlite3_get_autocommit(s->db)) {
                /* SQLite rolled the whole transaction back: nothing of the batch holds */
                batch_fail(batch, sq_status(rc));
                if (!read_only && disk_failed)
                    note_disk(s, true);
                return;
            }
            op->status = sq_status(rc);
            if (savepoint)
                ctl(s, STMT_ROLLBACK_TO);
        }
        if (savepoint)
            ctl(s, STMT_RELEASE_SAVEPOINT);
        ran++;
    }
    if (!ctl(s, STMT_COMMIT)) {
        int rc = sqlite3_extended_errcode(s->db);
        if (batch->kind == SQ_PROBE && !batch->next)
            log_warn(0, "store: sqlite: the disk probe's 64 KiB write failed: %s",
                     sqlite3_errmsg(s->db));
        else
            log_error(0, "store: sqlite: commit of %d operations failed: %s", ran,
                      sqlite3_errmsg(s->db));
        if (!sqlite3_get_autocommit(s->db))
            ctl(s, STMT_ROLLBACK);
        batch_fail(batch,
                   sq_status(rc) == STORE_ERR_STATEMENT ? STORE_ERR_UNAVAILABLE : sq_status(rc));
        if (!read_only && (disk_failed || disk_error(rc)))
            note_disk(s, true);
        return;
    }
    if (!read_only)
        note_disk(s, disk_failed);
    pthread_mutex_lock(&s->mu);
    s->transactions++;
    s->lazy_transactions += !read_only && s->lazy_sync;
    s->batched_ops += (uint64_t)ran;
    pthread_mutex_unlock(&s->mu);
}

static void *writer_main(void *arg)
{
    store_sqlite_t *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->q_head && !s->stopping)
            pthread_cond_wait(&s->cv, &s->mu);
        if (!s->q_head) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        /* everything waiting, up to BATCH_MAX, in one transaction */
        sq_op_t *batch = s->q_head, *last = batch;
        int n = 1;
        batch->where = SQ_TAKEN;
        while (last->next && n < BATCH_MAX) {
            last = last->next;
            last->where = SQ_TAKEN;
            n++;
        }
        s->q_head = last->next;
        if (!s->q_head)
            s->q_tail = NULL;
        s->q_len -= n;
        last->next = NULL;
        pthread_mutex_unlock(&s->mu);

        run_batch(s, batch);
        sq_vfs_forget(s->db); /* a rolled-back batch's gathered frames */

        pthread_mutex_lock(&s->mu);
        if (s->done_tail)
            s->done_tail->next = batch;
        else
            s->done_head = batch;
        s->done_tail = last;
        pthread_mutex_unlock(&s->mu);
        uint64_t one = 1;
        ssize_t w = write(s->efd, &one, sizeof(one));
        (void)w; /* EAGAIN: the counter is already nonzero, the loop wakes anyway */
    }
    return NULL;
}

/* ---- the loop side: delivering results ---- */

/* The row as store.h hands it out: times formatted, lease and expiry judged by the clock the
 * op ran with. iso holds the four formatted times. */
static void row_view(const sq_row_t *r, int64_t now, store_row_t *out, char iso[4][ISO_LEN + 1])
{
    memset(out, 0, sizeof(*out));
    out->state = r->state;
    out->fence = r->fence;
    out->attempts = r->attempts;
    out->args_digest = r->digest;
    out->result = r->result;
    out->result_len = r->result_len;
    out->result_too_large = r->too_large;
    out->lease_expired = r->state == STORE_STATE_IN_PROGRESS && r->lease_until <= now;
    iso_utc(r->created_at, iso[0]);
    out->created_at = iso[0];
    if (r->finished_at >= 0) {
        iso_utc(r->finished_at, iso[1]);
        out->finished_at = iso[1];
    }
    iso_utc(r->lease_until, iso[2]);
    out->lease_until = iso[2];
    iso_utc(r->expires_at, iso[3]);
    out->expires_at = iso[3];
    out->first_session_id = r->session;
    out->first_jsonrpc_id = r->jsonrpc;
    out->expires_in_ms = r->expires_at > now ? r->expires_at - now : 0;
    memcpy(out->dup_answers, r->dup_answers, sizeof(out->dup_answers));
    memcpy(out->dup_sources, r->dup_sources, sizeof(out->dup_sources));
    out->dup_history = r->dup_history;
}

/* Calls op's callback with st and, when st is STORE_OK, its results. */
static void op_callback(store_sqlite_t *s, sq_op_t *op, store_status_t st)
{
    if (st == STORE_ERR_UNAVAILABLE)
        s->stats.unavailable++;
    if (op->internal && op->kind == SQ_PROBE) {
        s->probing = false;
        return;
    }
    if (op->internal) {
        if (s->timing)
            stats_observe_store_since(s->timing,
                                      op->kind == SQ_SWEEP ? STATS_STORE_SWEEP : STATS_STORE_DUP,
                                      op->start_us);
        if (op->kind == SQ_SWEEP) {
            s->sweeping = false;
            if (st == STORE_OK) {
                s->stats.swept += (uint64_t)op->rows;
                /* a full batch means more may wait: continue after the loop has run once */
                if (op->rows >= op->batch && !s->closing) {
                    struct timeval zero = {0, 0};
                    evtimer_add(s->sweep_more_ev, &zero);
                }
            }
        } else if (st != STORE_OK) {
            log_warn(0, "store: duplicate counts of %zu keys lost: %s", op->n_dups,
                     store_status_str(st));
        }
        return;
    }
    store_row_t row;
    char iso[4][ISO_LEN + 1];
    bool ok = st == STORE_OK;
    if (ok && op->has_row)
        row_view(&op->row, op->now_ms, &row, iso);
    switch (op->kind) {
    case SQ_CLAIM: {
        if (!ok) {
            op->cb.claim(st, NULL, op->arg);
            break;
        }
        store_claim_result_t cr;
        memset(&cr, 0, sizeof(cr));
        s->stats.claims++;
        cr.row = row;
        cr.acquired = op->acquired;
        cr.fence = row.fence;
        cr.attempts = row.attempts;
        /* every takeover increments the fence; only a fresh insert has fence 1 */
        cr.taken_over = cr.acquired && cr.fence > 1;
        op->cb.claim(STORE_OK, &cr, op->arg);
        break;
    }
    case SQ_GET:
    case SQ_FORGET:
        op->cb.get(st, ok && op->has_row ? &row : NULL, op->arg);
        break;
    case SQ_RELEASE:
        op->cb.release(st, ok && op->acquired, ok && op->has_row ? &row : NULL, op->arg);
        break;
    case SQ_COUNT_UNKNOWN:
        op->cb.count(st, ok ? op->rows : 0, op->arg);
        break;
    case SQ_REPORT: {
        char now[ISO_LEN + 1];
        iso_utc(op->now_ms, now);
        store_report_t rep = {.now = now,
                              .tools = op->rep_tools,
                              .n_tools = op->n_rep_tools,
                              .top = op->rep_top,
                              .n_top = op->n_rep_top};
        op->cb.report(st, ok ? &rep : NULL, op->arg);
        break;
    }
    case SQ_SWEEP:
        if (ok)
            s->stats.swept += (uint64_t)op->rows;
        /* fall through */
    default:
        if (op->cb.finish)
            op->cb.finish(st, ok && (op->kind == SQ_DUP || op->matched), op->arg);
        break;
    }
}

static sq_op_t *take_done(store_sqlite_t *s)
{
    pthread_mutex_lock(&s->mu);
    sq_op_t *list = s->done_head;
    s->done_head = s->done_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    return list;
}

/* Delivers a list of ops: with their own results, or with force (store_free) instead. */
static void deliver(store_sqlite_t *s, sq_op_t *list, bool force, store_status_t forced)
{
    while (list) {
        sq_op_t *op = list;
        list = op->next;
        op->next = NULL;
        if (op->deadline_ev)
            event_del(op->deadline_ev);
        if (!op->answered)
            op_callback(s, op, force && !op->internal ? forced : op->status);
        op_free(op);
    }
}

static void on_done(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    store_sqlite_t *s = arg;
    uint64_t n;
    ssize_t r = read(fd, &n, sizeof(n));
    (void)r;
    deliver(s, take_done(s), false, STORE_OK);
}

/* The op missed store.timeout: out of the queue if it is still there, else its late result is
 * dropped when it comes. Either way the caller hears "unavailable" now, once. */
static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sq_op_t *op = arg;
    store_sqlite_t *s = op->store;
    bool queued = false;
    pthread_mutex_lock(&s->mu);
    if (op->where == SQ_QUEUED) {
        sq_op_t **pp = &s->q_head, *prev = NULL;
        while (*pp && *pp != op) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        if (*pp) {
            *pp = op->next;
            if (s->q_tail == op)
                s->q_tail = prev;
            s->q_len--;
            op->next = NULL;
            queued = true;
        }
    }
    pthread_mutex_unlock(&s->mu);
    char h[KEY_HASH_LOG_LEN + 1] = "-";
    if (op->key)
        key_hash_log(op->key, h);
    log_warn(0, "store: %s of key %s got no answer within %llu ms%s", kind_names[op->kind], h,
             (unsigned long long)s->timeout_ms, queued ? " (still queued)" : "");
    op_callback(s, op, STORE_ERR_UNAVAILABLE);
    if (queued)
        op_free(op);
    else
        op->answered = true;
}

/* ---- queueing ---- */

/* Whether a public call is accepted now. */
static store_status_t admit(store_sqlite_t *s)
{
    store_status_t st = STORE_OK;
    pthread_mutex_lock(&s->mu);
    int q = s->q_len;
    pthread_mutex_unlock(&s->mu);
    if (s->closing)
        st = STORE_ERR_SHUTDOWN;
    else if (q >= QUEUE_MAX)
        st = STORE_ERR_UNAVAILABLE;
    if (st == STORE_ERR_UNAVAILABLE)
        s->stats.unavailable++;
    return st;
}

static void enqueue(store_sqlite_t *s, sq_op_t *op)
{
    op->store = s;
    op->where = SQ_QUEUED;
    op->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->q_tail)
        s->q_tail->next = op;
    else
        s->q_head = op;
    s->q_tail = op;
    s->q_len++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Accepts an op from a public call, or frees it when refused. */
static store_status_t submit(store_sqlite_t *s, sq_op_t *op)
{
    store_status_t st = admit(s);
    if (st != STORE_OK) {
        op_free(op);
        return st;
    }
    if (!op->internal) {
        op->deadline_wall_ms = util_wall_ms() + s->timeout_ms;
        op->deadline_ev = must_event(evtimer_new(s->base, on_deadline, op));
        struct timeval tv = util_ms_to_tv(s->timeout_ms);
        evtimer_add(op->deadline_ev, &tv);
    }
    enqueue(s, op);
    return STORE_OK;
}

/* ---- duplicates counted in memory ---- */

/* The counts as one internal op (the table is emptied), or NULL when there are none. */
static sq_op_t *dup_take(store_sqlite_t *s)
{
    if (s->dups.len == 0)
        return NULL;
    sq_op_t *op = op_new(SQ_DUP, NULL);
    op->internal = true;
    op->start_us = stats_now_us();
    op->dups = dup_table_take(&s->dups, &op->n_dups); /* the entries move into the op */
    return op;
}

static void dup_flush(store_sqlite_t *s)
{
    if (s->closing || s->dups.len == 0)
        return;
    sq_op_t *op = dup_take(s);
    if (submit(s, op) != STORE_OK)
        log_warn(0, "store: duplicate counts lost: the queue is full");
}

static void dup_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    dup_flush(arg);
}

/* ---- sweeper ---- */

static sq_op_t *sweep_op(const store_sqlite_t *s)
{
    sq_op_t *op = op_new(SQ_SWEEP, NULL);
    op->batch = s->sweep_batch;
    return op;
}

static void sweep_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    store_sqlite_t *s = arg;
    if (s->sweeping || s->closing)
        return;
    sq_op_t *op = sweep_op(s);
    op->internal = true;
    op->start_us = stats_now_us();
    s->sweeping = true;
    if (submit(s, op) != STORE_OK)
        s->sweeping = false;
}

/* The files, looked at when nothing else writes; and while the disk fails writes, one probe
 * write at a time, so /readyz comes back without waiting for a call. */
static void guard_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    store_sqlite_t *s = arg;
    if (s->closing || !files_intact(s, false))
        return;
    pthread_mutex_lock(&s->mu);
    bool failing = s->disk_failures >= DISK_FAILURES_DOWN;
    pthread_mutex_unlock(&s->mu);
    if (!failing || s->probing)
        return;
    sq_op_t *op = op_new(SQ_PROBE, NULL);
    op->internal = true;
    s->probing = true;
    if (submit(s, op) != STORE_OK)
        s->probing = false;
}

/* ---- opening: the lock, the file, the schema ---- */

/* Opens the file in WAL mode with synchronous=FULL: a commit is on disk when it returns. */
static store_status_t open_db(store_sqlite_t *s, sq_plan_t plan, bool allow_migrate, char *msg,
                              size_t msglen)
{
    if (plan.create) {
        /* created here, not by SQLite, so the keys (subjects, results) are the owner's only;
         * SQLite gives its -wal and -shm files the same mode */
        int fd = open(s->path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0) {
            snprintf(msg, msglen, "cannot open %s: %s", s->path, strerror(errno));
            return STORE_ERR_UNAVAILABLE;
        }
        close(fd);
    }
    int rc = sqlite3_open_v2(s->path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX,
                             plan.gather_wal && sq_vfs_register() ? SQ_VFS_NAME : NULL);
    if (rc != SQLITE_OK) {
        snprintf(msg, msglen, "cannot open %s: %s", s->path,
                 s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc));
        return STORE_ERR_UNAVAILABLE;
    }
    sqlite3_extended_result_codes(s->db, 1);
    /* a lock held by another connection (an operator's `idemgw key`, a sqlite3 shell) is waited
     * for a little longer than the ops' deadline: ops past it are not started anyway */
    sqlite3_busy_timeout(s->db, (int)(s->timeout_ms + s->timeout_ms / 2));
    /* Going to WAL takes the file's exclusive lock. A peer opening the same new file at the
     * same moment may hold a lock SQLite answers BUSY for at once, without its busy handler (a
     * read lock that cannot wait for a write lock): tried again until the same deadline. */
    bool wal = false;
    uint64_t deadline = util_now_ms() + s->timeout_ms + s->timeout_ms / 2;
    for (;;) {
        sqlite3_stmt *st = NULL;
        int prc = sqlite3_prepare_v2(s->db, "PRAGMA journal_mode = WAL", -1, &st, NULL);
        int src = prc == SQLITE_OK ? sqlite3_step(st) : prc;
        wal = src == SQLITE_ROW && strcmp((const char *)sqlite3_column_text(st, 0), "wal") == 0;
        sqlite3_finalize(st);
        if (wal || (src & 0xff) != SQLITE_BUSY || util_now_ms() >= deadline)
            break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (!wal || !sq_exec(s->db, "PRAGMA synchronous = FULL")) {
        snprintf(msg, msglen, "%s: cannot use write-ahead logging with synchronous=FULL: %s",
                 s->path, sqlite3_errmsg(s->db));
        return STORE_ERR_UNAVAILABLE;
    }
    store_status_t mst = sq_migrate(s->db, allow_migrate, msg, msglen);
    if (mst != STORE_OK)
        return mst;
    for (int i = 0; i < STMT_COUNT_; i++) {
        if (sqlite3_prepare_v3(s->db, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &s->stmts[i],
                               NULL) != SQLITE_OK) {
            snprintf(msg, msglen, "preparing a statement: %s", sqlite3_errmsg(s->db));
            return STORE_ERR_STATEMENT;
        }
    }
    return STORE_OK;
}

/* ---- life ---- */

static void sq_free(store_sqlite_t *s)
{
    if (!s)
        return;
    s->closing = true;
    sq_op_t *failed = NULL;
    if (s->thread_started) {
        /* queued calls fail; the counts still in memory are written before the thread ends */
        sq_op_t *dups = dup_take(s);
        pthread_mutex_lock(&s->mu);
        failed = s->q_head;
        s->q_head = s->q_tail = NULL;
        s->q_len = 0;
        if (dups) {
            dups->store = s;
            dups->where = SQ_QUEUED;
            s->q_head = s->q_tail = dups;
            s->q_len = 1;
        }
        s->stopping = true;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    /* the contract's one exception: these callbacks run before store_free returns. What the
     * writer had already taken fails the same way: its caller is going away. */
    deliver(s, failed, true, STORE_ERR_SHUTDOWN);
    deliver(s, take_done(s), true, STORE_ERR_SHUTDOWN);
    for (int i = 0; i < STMT_COUNT_; i++)
        sqlite3_finalize(s->stmts[i]);
    if (s->db && sqlite3_close(s->db) != SQLITE_OK)
        log_warn(0, "store: closing %s: %s", s->path, sqlite3_errmsg(s->db));
    if (s->lock_fd >= 0)
        close(s->lock_fd); /* the lock goes with it; the file stays, so no race on its name */
    if (s->done_ev)
        event_free(s->done_ev);
    if (s->sweep_ev)
        event_free(s->sweep_ev);
    if (s->sweep_more_ev)
        event_free(s->sweep_more_ev);
    if (s->dup_ev)
        event_free(s->dup_ev);
    if (s->guard_ev)
        event_free(s->guard_ev);
    if (s->guarded)
        sq_guard_free(&s->guard);
    free(s->lost);
    if (s->efd >= 0)
        close(s->efd);
    dup_table_free(&s->dups);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->path);
    free(s);
}

static store_sqlite_t *sq_open(struct event_base *base, const store_options_t *opt,
                               const store_sqlite_options_t *sq, char *msg, size_t msglen)
{
    if (!sq->path || !sq->path[0]) {
        snprintf(msg, msglen, "no file named for the embedded store");
        return NULL;
    }
    store_sqlite_t *s = xcalloc(1, sizeof(*s));
    s->base = base;
    s->path = xstrdup(sq->path);
    s->durable_finish = sq->durable_finish;
    s->lock_fd = -1;
    s->efd = -1;
    s->timeout_ms = opt->timeout_ms > 0 ? opt->timeout_ms : STORE_TIMEOUT_DEFAULT_MS;
    s->sweep_interval_ms = opt->sweep_interval_ms;
    s->sweep_batch = opt->sweep_batch > 0 ? opt->sweep_batch : 1000;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);

    sq_plan_t plan = sq_plan(sq->shared, sq->peers);
    if (!sq_lock_file(s->path, plan.lock, &s->lock_fd, msg, msglen))
        goto fail;
    if (open_db(s, plan, opt->migrate && plan.create, msg, msglen) != STORE_OK)
        goto fail;
    s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->efd < 0) {
        snprintf(msg, msglen, "eventfd: %s", strerror(errno));
        goto fail;
    }
    s->done_ev = must_event(event_new(base, s->efd, EV_READ | EV_PERSIST, on_done, s));
    s->sweep_ev = must_event(event_new(base, -1, EV_PERSIST, sweep_tick, s));
    s->sweep_more_ev = must_event(evtimer_new(base, sweep_tick, s));
    s->dup_ev = must_event(event_new(base, -1, EV_PERSIST, dup_tick, s));
    event_add(s->done_ev, NULL);
    if (s->sweep_interval_ms > 0) {
        struct timeval tv = util_ms_to_tv(s->sweep_interval_ms);
        event_add(s->sweep_ev, &tv);
    }
    struct timeval dup_tv = util_ms_to_tv(DUP_FLUSH_MS);
    event_add(s->dup_ev, &dup_tv);
    if (plan.guard) {
        sq_guard_init(&s->guard, s->path, s->lock_fd);
        s->guarded = true;
        s->guard_ev = must_event(event_new(base, -1, EV_PERSIST, guard_tick, s));
        struct timeval guard_tv = util_ms_to_tv(GUARD_CHECK_MS);
        event_add(s->guard_ev, &guard_tv);
    }
    int prc = pthread_create(&s->thread, NULL, writer_main, s);
    if (prc != 0) {
        snprintf(msg, msglen, "cannot start the writer thread: %s", strerror(prc));
        goto fail;
    }
    s->thread_started = true;
    s->stats.connects = 1;
    return s;
fail:
    sq_free(s);
    return NULL;
}

/* ---- the store interface ---- */

static store_status_t ops_claim(void *impl, const store_claim_req_t *req, store_claim_cb cb,
                                void *arg)
{
    sq_op_t *op = op_new(SQ_CLAIM, req->key);
    op->tool = dup_or_null(req->tool);
    op->subject = dup_or_null(req->subject);
    op->digest = dup_or_null(req->args_digest);
    op->session = dup_or_null(req->session_id);
    op->jsonrpc = dup_or_null(req->jsonrpc_id);
    op->explicit_key = req->explicit_key;
    op->takeover = req->takeover_lease_expired;
    op->lease_ms = clamp_ms(req->lease_ms);
    op->window_ms = clamp_ms(req->window_ms);
    op->cb.claim = cb;
    op->arg = arg;
    if (!req->key || !req->tool || !req->subject || !req->args_digest) {
        op_free(op);
        return STORE_ERR_STATEMENT;
    }
    return submit(impl, op);
}

static store_status_t ops_finish(void *impl, const store_finish_req_t *req, store_finish_cb cb,
                                 void *arg)
{
    /* finishing back into in_progress would hold the key with no lease owner */
    if (!req->key || req->state == STORE_STATE_IN_PROGRESS || !store_state_valid(req->state) ||
        req->result_len > INT32_MAX)
        return STORE_ERR_STATEMENT;
    sq_op_t *op = op_new(SQ_FINISH, req->key);
    op->fence = req->fence;
    op->state = req->state;
    if (req->result) {
        op->result = xmalloc(req->result_len ? req->result_len : 1);
        memcpy(op->result, req->result, req->result_len);
        op->result_len = req->result_len;
    }
    op->too_large = req->too_large;
    op->window_ms = clamp_ms(req->window_ms);
    op->cb.finish = cb;
    op->arg = arg;
    return submit(impl, op);
}

/* An op that carries only its key and its callback (get, release, forget). */
static store_status_t submit_keyed(void *impl, sq_kind_t kind, const char *key, store_cb_t cb,
                                   void *arg)
{
    if (!key)
        return STORE_ERR_STATEMENT;
    sq_op_t *op = op_new(kind, key);
    op->cb = cb;
    op->arg = arg;
    return submit(impl, op);
}

static store_status_t ops_get(void *impl, const char *key, store_get_cb cb, void *arg)
{
    return submit_keyed(impl, SQ_GET, key, (store_cb_t){.get = cb}, arg);
}

static store_status_t ops_record_duplicate(void *impl, const store_dup_t *dup, store_finish_cb cb,
                                           void *arg)
{
    store_sqlite_t *s = impl;
    store_status_t st = admit(s);
    if (st != STORE_OK)
        return st;
    dup_table_add(&s->dups, dup);
    if (s->dups.len >= DUP_FLUSH_KEYS)
        dup_flush(s);
    if (cb) {
        /* accepted once counted in memory: answered by the writer's next batch, never from
         * inside this call */
        sq_op_t *op = op_new(SQ_DUP, NULL);
        op->cb.finish = cb;
        op->arg = arg;
        return submit(s, op);
    }
    return STORE_OK;
}

static int ops_pending_duplicates(const void *impl, const char *key)
{
    return dup_table_count(&((const store_sqlite_t *)impl)->dups, key);
}

static store_status_t ops_extend_lease(void *impl, const char *key, int64_t fence,
                                       uint64_t lease_ms, store_finish_cb cb, void *arg)
{
    if (!key)
        return STORE_ERR_STATEMENT;
    sq_op_t *op = op_new(SQ_EXTEND, key);
    op->fence = fence;
    op->lease_ms = clamp_ms(lease_ms);
    op->cb.finish = cb;
    op->arg = arg;
    return submit(impl, op);
}

static store_status_t ops_sweep_now(void *impl, store_finish_cb cb, void *arg)
{
    sq_op_t *op = sweep_op(impl);
    op->cb.finish = cb;
    op->arg = arg;
    return submit(impl, op);
}

static store_status_t ops_release(void *impl, const char *key, store_release_cb cb, void *arg)
{
    return submit_keyed(impl, SQ_RELEASE, key, (store_cb_t){.release = cb}, arg);
}

static store_status_t ops_forget(void *impl, const char *key, store_get_cb cb, void *arg)
{
    return submit_keyed(impl, SQ_FORGET, key, (store_cb_t){.get = cb}, arg);
}

static store_status_t ops_count_unknown(void *impl, store_count_cb cb, void *arg)
{
    sq_op_t *op = op_new(SQ_COUNT_UNKNOWN, NULL);
    op->cb.count = cb;
    op->arg = arg;
    return submit(impl, op);
}

static store_status_t ops_report(void *impl, uint64_t since_ms, int top, const char *tool_prefix,
                                 store_report_cb cb, void *arg)
{
    sq_op_t *op = op_new(SQ_REPORT, NULL);
    op->tool = xstrdup(tool_prefix); /* the rows' tool prefix ("": every row) */
    op->since_ms = clamp_ms(since_ms);
    op->top = top;
    op->cb.report = cb;
    op->arg = arg;
    return submit(impl, op);
}

/* Not while the files are lost, nor while the disk fails every write. */
static bool ops_ready(const void *impl)
{
    store_sqlite_t *s = (store_sqlite_t *)impl; /* the mutex, not the state, changes */
    if (!s || s->closing || !s->thread_started)
        return false;
    pthread_mutex_lock(&s->mu);
    bool ok = !s->lost && s->disk_failures < DISK_FAILURES_DOWN;
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* The files lost, or the disk failing writes: named with the path, which the operator fixes. */
static void ops_down_reason(const void *impl, char *buf, size_t len)
{
    store_sqlite_t *s = (store_sqlite_t *)impl; /* the mutex, not the state, changes */
    pthread_mutex_lock(&s->mu);
    if (s->lost)
        snprintf(buf, len, "the embedded store is lost until a restart: %s", s->lost);
    else if (s->disk_failures >= DISK_FAILURES_DOWN)
        snprintf(buf, len,
                 "the disk of %s fails writes (full, or I/O errors): %d write transactions in "
                 "a row failed",
                 s->path, s->disk_failures);
    pthread_mutex_unlock(&s->mu);
}

static void ops_get_stats(const void *impl, store_stats_t *out)
{
    store_sqlite_t *s = (store_sqlite_t *)impl; /* the mutex, not the state, changes */
    *out = s->stats;
    pthread_mutex_lock(&s->mu);
    out->queued = s->q_len;
    out->transactions = s->transactions;
    out->lazy_transactions = s->lazy_transactions;
    out->batched_ops = s->batched_ops;
    pthread_mutex_unlock(&s->mu);
    out->connections_up = ops_ready(s) ? 1 : 0;
    out->connections_wanted = 1; /* the writer's */
}

static void ops_observe(void *impl, struct server_stats *stats)
{
    ((store_sqlite_t *)impl)->timing = stats;
}

static void ops_free(void *impl)
{
    sq_free(impl);
}

const store_ops_t store_sqlite_ops = {
    .name = "sqlite",
    .claim = ops_claim,
    .finish = ops_finish,
    .get = ops_get,
    .record_duplicate = ops_record_duplicate,
    .pending_duplicates = ops_pending_duplicates,
    .extend_lease = ops_extend_lease,
    .sweep_now = ops_sweep_now,
    .release = ops_release,
    .forget = ops_forget,
    .count_unknown = ops_count_unknown,
    .report = ops_report,
    .ready = ops_ready,
    .down_reason = ops_down_reason,
    .get_stats = ops_get_stats,
    .observe = ops_observe,
    .free = ops_free,
};

store_t *store_sqlite_new(struct event_base *base, const store_options_t *opt,
                          const store_sqlite_options_t *sq, char *msg, size_t msglen)
{
    store_sqlite_t *s = sq_open(base, opt, sq, msg, msglen);
    return s ? store_from_ops(&store_sqlite_ops, s) : NULL;
}
