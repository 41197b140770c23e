/* The embedded store's writer thread (store_sqlite.h, store_sqlite.c): it takes the queued ops
 * in batches, runs each batch in one transaction with a savepoint per op, syncs as the batch
 * needs, watches the files and the disk, and hands the batch back to the loop on the done list.
 * Only this thread touches the connection once the store is open. */
#include "store_sqlite_int.h"

#include "key_hash.h"
#include "log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const char *const sq_kind_names[] = {"claim",  "finish",        "get",     "duplicates",
                                     "sweep",  "extend",        "release", "forget",
                                     "report", "count_unknown", "probe",   "queue"};

const char *const sq_stmt_sql[STMT_COUNT_] = {
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

void sq_row_free(sq_row_t *r)
{
    free(r->digest);
    free(r->result);
    free(r->session);
    free(r->jsonrpc);
    free(r->dup_history);
    memset(r, 0, sizeof(*r));
}

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
        sq_row_free(row);
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
    sq_row_free(&old);
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
            .session = op->session ? xstrdup(op->session) : NULL,
            .jsonrpc = op->jsonrpc ? xstrdup(op->jsonrpc) : NULL,
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
    sq_row_free(&cur);
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
        char iso[SQ_ISO_LEN + 1];
        sq_iso_utc(sqlite3_column_int64(st, 5), iso);
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
    case SQ_QUEUE:
        return sq_queue_run(s->db, op->queue_work, now);
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
            sq_row_free(&op->row);
            op->has_row = false;
        }
    }
}

/* Whether the files at the path are still the ones opened. Once they are not, the store is
 * lost for good (said once in the log): any thread; quick (their events first) from the writer
 * alone. */
bool sq_files_intact(store_sqlite_t *s, bool quick)
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
         * per key, the probe two, the operator queue several */
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
    if (!sq_files_intact(s, true)) {
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
            log_error(0, "store: sqlite: %s of key %s failed: %s", sq_kind_names[op->kind], h,
                      sqlite3_errmsg(s->db));
            sq_row_free(&op->row);
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

void *sq_writer_main(void *arg)
{
    store_sqlite_t *s = arg;
    bool idle = true; /* nothing was queued when the last batch was handed back */
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->q_head && !s->stopping)
            pthread_cond_wait(&s->cv, &s->mu);
        if (!s->q_head) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        if (idle)
            sq_delay_wait(s);
        if (!s->q_head) {
            /* held, and meanwhile its ops missed their deadlines or the store began closing */
            bool stop = s->stopping;
            pthread_mutex_unlock(&s->mu);
            if (stop)
                break;
            continue;
        }
        /* everything waiting, up to SQ_BATCH_MAX, in one transaction */
        sq_op_t *batch = s->q_head, *last = batch;
        int n = 1;
        batch->where = SQ_TAKEN;
        while (last->next && n < SQ_BATCH_MAX) {
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
        sq_delay_count(s, batch);

        pthread_mutex_lock(&s->mu);
        if (s->done_tail)
            s->done_tail->next = batch;
        else
            s->done_head = batch;
        s->done_tail = last;
        idle = !s->q_head;
        pthread_mutex_unlock(&s->mu);
        uint64_t one = 1;
        ssize_t w = write(s->efd, &one, sizeof(one));
        (void)w; /* EAGAIN: the counter is already nonzero, the loop wakes anyway */
    }
    return NULL;
}
