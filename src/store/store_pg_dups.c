/* The Postgres backend's duplicates (sql/002_dup_history.sql) and its report: the statements
 * and the parsing of their results. The ops that carry them live in store_pg.c. */
#include "store_int.h"

#include "log.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

/* The history keeps the elements from last - 15 to last: STORE_DUP_HISTORY_MAX of them. */
#define HISTORY_LAST "15"
_Static_assert(STORE_DUP_HISTORY_MAX == 16, "HISTORY_LAST is STORE_DUP_HISTORY_MAX - 1");

/* Adds the duplicates recorded since the last write, one element of $1 per key (keys
 * distinct): replays to attempts, the counts to theirs, the history after the row's, keeping
 * the last STORE_DUP_HISTORY_MAX (a jsonpath slice: no unnesting and sorting per row). The rows are
 * locked in key order first, so two gateways writing overlapping keys cannot deadlock. A key whose
 * row is gone (swept) is skipped. */
/* clang-format off */
const char store_pg_dup_sql[] =
    "WITH d AS (SELECT * FROM jsonb_to_recordset($1::jsonb) AS d(key text, replay integer,"
    " in_progress integer, unknown integer, reconnect integer, transport integer,"
    " harness integer, model integer, late integer, history jsonb)),"
    " l AS MATERIALIZED (SELECT k.key FROM idem_keys k WHERE k.key IN (SELECT d.key FROM d)"
    "  ORDER BY k.key FOR UPDATE)"
    " UPDATE idem_keys k SET attempts = k.attempts + d.replay, updated_at = now(),"
    " dup_replay = k.dup_replay + d.replay, dup_in_progress = k.dup_in_progress + d.in_progress,"
    " dup_unknown = k.dup_unknown + d.unknown, dup_reconnect = k.dup_reconnect + d.reconnect,"
    " dup_transport = k.dup_transport + d.transport, dup_harness = k.dup_harness + d.harness,"
    " dup_model = k.dup_model + d.model, dup_late = k.dup_late + d.late,"
    " dup_history = jsonb_path_query_array(k.dup_history || d.history,"
    "  '$[last - " HISTORY_LAST " to last]')"
    " FROM d JOIN l ON l.key = d.key WHERE k.key = d.key";
/* clang-format on */

/* The rows updated in the last $1 ms (0: all) whose tool starts with $3 ("": every row; left()
 * compares bytes, where LIKE would read a '_' of a server's name as a wildcard): one tuple per
 * tool (kind 0), then up to $2 keys with the most calls (kind 1). Columns: kind, tool, key,
 * rows, attempts, the duplicates by answer (3) and by source (5), rows by state (4), the key's
 * state, created_at, now. */
#define ISO(col) "to_char(" col " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"
#define STATE_COUNT(st) "count(*) FILTER (WHERE k.state = '" st "')"
/* clang-format off */
const char store_pg_report_sql[] =
    "WITH r AS MATERIALIZED (SELECT k.key, k.tool, k.state, k.attempts, k.created_at,"
    "  k.dup_replay, k.dup_in_progress, k.dup_unknown, k.dup_reconnect, k.dup_transport,"
    "  k.dup_harness, k.dup_model, k.dup_late FROM idem_keys k"
    "  WHERE ($1::bigint <= 0 OR k.updated_at >= now() - $1::bigint * interval '1 millisecond')"
    "  AND left(k.tool, length($3::text)) = $3::text)"
    " SELECT 0, k.tool, NULL::text, count(*), sum(k.attempts), sum(k.dup_replay),"
    "  sum(k.dup_in_progress), sum(k.dup_unknown), sum(k.dup_reconnect), sum(k.dup_transport),"
    "  sum(k.dup_harness), sum(k.dup_model), sum(k.dup_late), " STATE_COUNT("in_progress") ", "
    STATE_COUNT("succeeded") ", " STATE_COUNT("failed") ", " STATE_COUNT("unknown") ","
    "  NULL::text, NULL::text, " ISO("now()") " FROM r k GROUP BY k.tool"
    " UNION ALL"
    " SELECT * FROM (SELECT 1, k.tool, k.key, 1::bigint, k.attempts::bigint,"
    "  k.dup_replay::bigint, k.dup_in_progress::bigint, k.dup_unknown::bigint,"
    "  k.dup_reconnect::bigint, k.dup_transport::bigint, k.dup_harness::bigint,"
    "  k.dup_model::bigint, k.dup_late::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint,"
    "  k.state, " ISO("k.created_at") ", " ISO("now()") " FROM r k"
    "  ORDER BY k.attempts + k.dup_in_progress + k.dup_unknown DESC, k.key"
    "  LIMIT greatest($2::integer, 0)) t";
/* clang-format on */

enum {
    RC_KIND = 0,
    RC_TOOL,
    RC_KEY,
    RC_ROWS,
    RC_ATTEMPTS,
    RC_ANSWERS,                                   /* STORE_DUP_ANSWERS_ of them */
    RC_SOURCES = RC_ANSWERS + STORE_DUP_ANSWERS_, /* DUP_SOURCE_N */
    RC_STATES = RC_SOURCES + DUP_SOURCE_N,        /* STORE_STATES */
    RC_STATE = RC_STATES + STORE_STATES,
    RC_CREATED,
    RC_NOW,
    RC_COUNT_
};

static int64_t col_int(const PGresult *r, int t, int col)
{
    return PQgetisnull(r, t, col) ? 0 : strtoll(PQgetvalue(r, t, col), NULL, 10);
}

void store_pg_parse_dups(const PGresult *r, int t, int col, store_row_t *row)
{
    if (PQnfields(r) < col + STORE_PG_DUP_NCOLS)
        return;
    for (int i = 0; i < STORE_DUP_ANSWERS_; i++)
        row->dup_answers[i] = (int)col_int(r, t, col + i);
    for (int i = 0; i < DUP_SOURCE_N; i++)
        row->dup_sources[i] = (int)col_int(r, t, col + STORE_DUP_ANSWERS_ + i);
    int h = col + STORE_DUP_ANSWERS_ + DUP_SOURCE_N;
    row->dup_history = PQgetisnull(r, t, h) ? NULL : PQgetvalue(r, t, h);
}

static int state_of(const char *txt)
{
    for (int i = 0; i < STORE_STATES; i++)
        if (strcmp(txt, store_state_str((store_state_t)i)) == 0)
            return i;
    return -1;
}

void store_pg_report_deliver(const PGresult *res, store_report_cb cb, void *arg)
{
    int n = PQntuples(res);
    if (PQnfields(res) != RC_COUNT_) {
        log_error(0, "store: report returned %d columns, not %d", PQnfields(res), RC_COUNT_);
        cb(STORE_ERR_STATEMENT, NULL, arg);
        return;
    }
    store_report_tool_t *tools = xcalloc((size_t)n + 1, sizeof(*tools));
    store_report_key_t *top = xcalloc((size_t)n + 1, sizeof(*top));
    store_report_t rep = {.tools = tools, .top = top};
    for (int t = 0; t < n; t++) {
        rep.now = PQgetvalue(res, t, RC_NOW);
        if (col_int(res, t, RC_KIND) == 0) {
            store_report_tool_t *o = &tools[rep.n_tools++];
            o->tool = PQgetvalue(res, t, RC_TOOL);
            o->keys = col_int(res, t, RC_ROWS);
            for (int i = 0; i < STORE_DUP_ANSWERS_; i++)
                o->dup_answers[i] = col_int(res, t, RC_ANSWERS + i);
            for (int i = 0; i < DUP_SOURCE_N; i++)
                o->dup_sources[i] = col_int(res, t, RC_SOURCES + i);
            for (int i = 0; i < STORE_STATES; i++)
                o->states[i] = col_int(res, t, RC_STATES + i);
            int64_t attempts = col_int(res, t, RC_ATTEMPTS);
            o->runs = attempts - o->dup_answers[STORE_DUP_REPLAY];
            o->calls = attempts + o->dup_answers[STORE_DUP_IN_PROGRESS] +
                       o->dup_answers[STORE_DUP_UNKNOWN];
        } else {
            store_report_key_t *k = &top[rep.n_top++];
            k->tool = PQgetvalue(res, t, RC_TOOL);
            k->key = PQgetvalue(res, t, RC_KEY);
            k->attempts = (int)col_int(res, t, RC_ATTEMPTS);
            for (int i = 0; i < STORE_DUP_ANSWERS_; i++)
                k->duplicates += (int)col_int(res, t, RC_ANSWERS + i);
            k->calls = k->attempts + (int)col_int(res, t, RC_ANSWERS + STORE_DUP_IN_PROGRESS) +
                       (int)col_int(res, t, RC_ANSWERS + STORE_DUP_UNKNOWN);
            int st = state_of(PQgetvalue(res, t, RC_STATE));
            k->state = st < 0 ? STORE_STATE_UNKNOWN : (store_state_t)st;
            k->created_at = PQgetvalue(res, t, RC_CREATED);
        }
    }
    cb(STORE_OK, &rep, arg);
    free(tools);
    free(top);
}
