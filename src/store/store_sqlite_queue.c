/* The operator's queue on the embedded store (store_queue.h): run by the writer thread, inside
 * the savepoint of its batch, on the writer's connection, so a resolve's read, change and
 * action commit together. A key_hash is computed by idemgw_key_hash(), registered on the
 * connection before each run; a lookup by its prefix reads every live row, the list of
 * unknown keys reads idem_keys_unknown_idx (sql/sqlite/005_operator_actions.sql). */
#include "store_sqlite_int.h"
#include "store_queue.h"

#include "key_hash.h"
#include "util.h"

#include <jansson.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

#define Q_COLS                                                                                     \
    "key, tool, subject, state, attempts, created_at, updated_at, lease_until, expires_at,"        \
    " finished_at, (state = 'in_progress' AND lease_until <= ?1), result_too_large"
#define Q_NCOLS 12
#define OPEN_ROW "(state = 'unknown' OR (state = 'in_progress' AND lease_until <= ?1))"

static void key_hash_fn(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    const unsigned char *k = sqlite3_value_text(argv[0]);
    if (!k) {
        sqlite3_result_null(ctx);
        return;
    }
    char hex[65];
    key_hash_hex((const char *)k, hex);
    sqlite3_result_text(ctx, hex, 64, SQLITE_TRANSIENT);
}

static const char *text(sqlite3_stmt *st, int col)
{
    const char *t = (const char *)sqlite3_column_text(st, col);
    return t ? t : "";
}

static json_t *row_at(sqlite3_stmt *st)
{
    return store_queue_row(
        text(st, 0), text(st, 1), text(st, 2), text(st, 3), sqlite3_column_int(st, 4),
        sqlite3_column_int64(st, 5), sqlite3_column_int64(st, 6), sqlite3_column_int64(st, 7),
        sqlite3_column_int64(st, 8),
        sqlite3_column_type(st, 9) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 9),
        sqlite3_column_int(st, 10) != 0, sqlite3_column_int(st, 11) != 0);
}

static void bind_opt(sqlite3_stmt *st, int i, const char *v)
{
    if (v)
        sqlite3_bind_text(st, i, v, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, i);
}

/* Steps st to its end, each row through each(st, acc). */
static store_status_t rows(sqlite3_stmt *st, void (*each)(sqlite3_stmt *, json_t *), json_t *acc)
{
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        each(st, acc);
    return rc == SQLITE_DONE ? STORE_OK : sq_status(rc);
}

static void list_row(sqlite3_stmt *st, json_t *acc)
{
    json_array_append_new(acc, row_at(st));
}

static store_status_t run_list(sqlite3 *db, store_queue_op_t *q, int64_t now)
{
    /* the state's condition is written into the statement, so a list of unknown keys (the
     * alerts' poll, twice a second) reads idem_keys_unknown_idx instead of the table */
    static const char *const states[] = {
        [STORE_QUEUE_STATE_ANY] = "1",
        [STORE_QUEUE_STATE_UNKNOWN] = "state = 'unknown'",
        [STORE_QUEUE_STATE_IN_PROGRESS] = "state = 'in_progress'",
        [STORE_QUEUE_STATE_SUCCEEDED] = "state = 'succeeded'",
        [STORE_QUEUE_STATE_FAILED] = "state = 'failed'",
        [STORE_QUEUE_STATE_STUCK] = "state = 'in_progress' AND lease_until <= ?1",
        [STORE_QUEUE_STATE_OPEN] = OPEN_ROW,
    };
    char *sql = xasprintf(
        "SELECT " Q_COLS ", idemgw_key_hash(key) AS h FROM idem_keys"
        " WHERE expires_at > ?1 AND (%s)"
        " AND (?3 IS NULL OR tool = ?3)"
        " AND (?4 IS NULL OR substr(tool, 1, length(?4)) = ?4)"
        " AND (?5 IS NULL OR subject = ?5)"
        " AND (?6 = 0 OR updated_at >= ?6)"
        " AND (?6 > 0 OR ?7 < 0 OR (created_at, idemgw_key_hash(key)) < (?7, ?8))"
        " ORDER BY CASE WHEN ?6 > 0 THEN updated_at END, created_at DESC, h DESC LIMIT ?9",
        states[q->state]);
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    free(sql);
    if (rc != SQLITE_OK)
        return sq_status(rc);
    sqlite3_bind_int64(st, 1, now);
    bind_opt(st, 3, q->tool_exact);
    bind_opt(st, 4, q->tool_prefix);
    bind_opt(st, 5, q->subject);
    sqlite3_bind_int64(st, 6, q->updated_since_ms);
    sqlite3_bind_int64(st, 7, q->cursor_ms);
    sqlite3_bind_text(st, 8, q->cursor_hash, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 9, q->limit);
    json_t *list = json_array();
    store_status_t out = rows(st, list_row, list);
    sqlite3_finalize(st);
    q->out = json_pack("{s:o}", "rows", list);
    return out;
}

static void action_row(sqlite3_stmt *st, json_t *acc)
{
    json_array_append_new(
        acc, json_pack("{s:s,s:s,s:s,s:o,s:I,s:I}", "outcome", text(st, 0), "previous_state",
                       text(st, 1), "actor", text(st, 2), "note",
                       sqlite3_column_type(st, 3) == SQLITE_NULL ? json_null()
                                                                 : json_string(text(st, 3)),
                       "at_ms", (json_int_t)sqlite3_column_int64(st, 4), "waited_ms",
                       (json_int_t)sqlite3_column_int64(st, 5)));
}

static void show_row(sqlite3_stmt *st, json_t *acc)
{
    json_t *r = row_at(st);
    json_object_set_new(r, "dup_replay", json_integer(sqlite3_column_int(st, Q_NCOLS)));
    json_object_set_new(r, "dup_in_progress", json_integer(sqlite3_column_int(st, Q_NCOLS + 1)));
    json_object_set_new(r, "dup_unknown", json_integer(sqlite3_column_int(st, Q_NCOLS + 2)));
    json_object_set_new(r, "history", json_string(text(st, Q_NCOLS + 3)));
    if (sqlite3_column_type(st, Q_NCOLS + 4) != SQLITE_NULL)
        json_object_set_new(r, "result",
                            json_stringn((const char *)sqlite3_column_blob(st, Q_NCOLS + 4),
                                         (size_t)sqlite3_column_bytes(st, Q_NCOLS + 4)));
    json_array_append_new(acc, r);
}

static store_status_t run_show(sqlite3 *db, store_queue_op_t *q, int64_t now)
{
    static const char sql[] =
        "SELECT " Q_COLS ", dup_replay, dup_in_progress, dup_unknown, dup_history,"
        " CASE WHEN state = 'succeeded' THEN result END FROM idem_keys"
        " WHERE expires_at > ?1 AND ?2 <> ''"
        " AND substr(idemgw_key_hash(key), 1, length(?2)) = ?2 LIMIT 2";
    static const char acts_sql[] =
        "SELECT outcome, previous_state, actor, note, at, waited_ms FROM idem_key_actions"
        " WHERE key_hash = ?1 ORDER BY id";
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK)
        return sq_status(rc);
    sqlite3_bind_int64(st, 1, now);
    sqlite3_bind_text(st, 2, q->prefix, -1, SQLITE_STATIC);
    json_t *list = json_array();
    store_status_t out = rows(st, show_row, list);
    sqlite3_finalize(st);
    q->out = json_pack("{s:o}", "rows", list);
    size_t i;
    json_t *r;
    json_array_foreach(list, i, r)
    {
        if (out != STORE_OK)
            break;
        rc = sqlite3_prepare_v2(db, acts_sql, -1, &st, NULL);
        if (rc != SQLITE_OK)
            return sq_status(rc);
        char hash[65];
        key_hash_hex(json_string_value(json_object_get(r, "key")), hash);
        sqlite3_bind_text(st, 1, hash, -1, SQLITE_STATIC);
        json_t *acts = json_array();
        out = rows(st, action_row, acts);
        sqlite3_finalize(st);
        json_object_set_new(r, "actions", acts);
    }
    return out;
}

static store_status_t run_resolve(sqlite3 *db, store_queue_op_t *q, int64_t now)
{
    static const char sel_sql[] = "SELECT state, tool, subject, finished_at, lease_until, " OPEN_ROW
                                  " FROM idem_keys WHERE key = ?2 AND expires_at > ?1";
    static const char upd_sql[] =
        "UPDATE idem_keys SET state = ?2, result = ?3, result_too_large = 0, fence = fence + 1,"
        " finished_at = ?4, updated_at = ?4 WHERE key = ?1";
    static const char del_sql[] = "DELETE FROM idem_keys WHERE key = ?1";
    static const char act_sql[] =
        "INSERT INTO idem_key_actions (key_hash, tool, subject, outcome, previous_state, actor,"
        " note, waited_ms, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, sel_sql, -1, &st, NULL);
    if (rc != SQLITE_OK)
        return sq_status(rc);
    sqlite3_bind_int64(st, 1, now);
    sqlite3_bind_text(st, 2, q->key, -1, SQLITE_STATIC);
    rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        sqlite3_finalize(st);
        if (rc != SQLITE_DONE)
            return sq_status(rc);
        q->out = json_pack("{s:n,s:b}", "state", "done", 0);
        return STORE_OK;
    }
    char *state = xstrdup(text(st, 0)), *tool = xstrdup(text(st, 1));
    char *subject = xstrdup(text(st, 2));
    int64_t since = sqlite3_column_int64(st, 4);
    if (strcmp(state, "unknown") == 0 && sqlite3_column_type(st, 3) != SQLITE_NULL)
        since = sqlite3_column_int64(st, 3);
    bool open = sqlite3_column_int(st, 5) != 0;
    sqlite3_finalize(st);
    st = NULL;
    int64_t waited = now > since ? now - since : 0;
    store_status_t out = STORE_OK;
    if (open) {
        bool forget = q->outcome == STORE_QUEUE_FORGET;
        rc = sqlite3_prepare_v2(db, forget ? del_sql : upd_sql, -1, &st, NULL);
        if (rc == SQLITE_OK) {
            sqlite3_bind_text(st, 1, q->key, -1, SQLITE_STATIC);
            if (!forget) {
                sqlite3_bind_text(st, 2, store_queue_outcome_str(q->outcome), -1, SQLITE_STATIC);
                if (q->result)
                    sqlite3_bind_blob(st, 3, q->result, (int)q->result_len, SQLITE_STATIC);
                sqlite3_bind_int64(st, 4, now);
            }
            rc = sqlite3_step(st);
            sqlite3_finalize(st);
        }
        if (rc == SQLITE_DONE)
            rc = sqlite3_prepare_v2(db, act_sql, -1, &st, NULL);
        if (rc == SQLITE_OK) {
            sqlite3_bind_text(st, 1, q->key_hash, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 2, tool, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 3, subject, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 4, store_queue_outcome_str(q->outcome), -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 5, state, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 6, q->actor, -1, SQLITE_STATIC);
            bind_opt(st, 7, q->note);
            sqlite3_bind_int64(st, 8, waited);
            sqlite3_bind_int64(st, 9, now);
            rc = sqlite3_step(st);
            sqlite3_finalize(st);
        }
        if (rc != SQLITE_DONE)
            out = sq_status(rc);
    }
    if (out == STORE_OK)
        q->out = json_pack("{s:s,s:b,s:I,s:I}", "state", state, "done", open, "waited_ms",
                           (json_int_t)waited, "at_ms", (json_int_t)now);
    free(state);
    free(tool);
    free(subject);
    return out;
}

static void unknown_row(sqlite3_stmt *st, json_t *acc)
{
    json_array_append_new(acc, json_pack("{s:s,s:I,s:I}", "tool", text(st, 0), "keys",
                                         (json_int_t)sqlite3_column_int64(st, 1), "oldest_ms",
                                         (json_int_t)sqlite3_column_int64(st, 2)));
}

static void resolution_row(sqlite3_stmt *st, json_t *acc)
{
    json_array_append_new(acc, json_pack("{s:s,s:I,s:I}", "outcome", text(st, 0), "count",
                                         (json_int_t)sqlite3_column_int64(st, 1), "waited_ms",
                                         (json_int_t)sqlite3_column_int64(st, 2)));
}

static store_status_t run_summary(sqlite3 *db, store_queue_op_t *q, int64_t now)
{
    static const char unknown_sql[] =
        "SELECT tool, count(*), max(0, ?1 - min(coalesce(finished_at, updated_at)))"
        " FROM idem_keys WHERE state = 'unknown' AND expires_at > ?1 GROUP BY tool";
    static const char res_sql[] = "SELECT outcome, count(*), coalesce(sum(waited_ms), 0)"
                                  " FROM idem_key_actions GROUP BY outcome";
    json_t *unknown = json_array(), *res = json_array();
    q->out = json_pack("{s:o,s:o}", "unknown", unknown, "resolutions", res);
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(db, unknown_sql, -1, &st, NULL);
    if (rc != SQLITE_OK)
        return sq_status(rc);
    sqlite3_bind_int64(st, 1, now);
    store_status_t out = rows(st, unknown_row, unknown);
    sqlite3_finalize(st);
    if (out != STORE_OK)
        return out;
    rc = sqlite3_prepare_v2(db, res_sql, -1, &st, NULL);
    if (rc != SQLITE_OK)
        return sq_status(rc);
    out = rows(st, resolution_row, res);
    sqlite3_finalize(st);
    return out;
}

store_status_t sq_queue_run(sqlite3 *db, store_queue_op_t *q, int64_t now)
{
    int rc = sqlite3_create_function(db, "idemgw_key_hash", 1, SQLITE_UTF8 | SQLITE_DETERMINISTIC,
                                     NULL, key_hash_fn, NULL, NULL);
    if (rc != SQLITE_OK)
        return sq_status(rc);
    json_decref(q->out);
    q->out = NULL;
    switch (q->kind) {
    case STORE_QUEUE_LIST:
        return run_list(db, q, now);
    case STORE_QUEUE_SHOW:
        return run_show(db, q, now);
    case STORE_QUEUE_RESOLVE:
        return run_resolve(db, q, now);
    case STORE_QUEUE_SUMMARY:
        return run_summary(db, q, now);
    case STORE_QUEUE_KINDS_:
        break;
    }
    return STORE_ERR_STATEMENT;
}
