/* The operator's queue on Postgres (store_queue.h): four prepared statements, each answering
 * one row of one column, the JSON store_queue.c reads (built by the database, so no column
 * is parsed here). A key_hash is key_hash_hex of the key, computed by the database as
 * encode(sha256(...)); a lookup by its prefix reads every live row (no index of the hash: it
 * would cost every claim), the list of open keys reads idem_keys_unknown_idx. */
#include "store_int.h"
#include "store_queue.h"

#include "log.h"
#include "util.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* clang-format off */
#define MS(c) "floor(extract(epoch FROM " c ") * 1000)::bigint"
#define HASH(k) "encode(sha256(convert_to(" k ".key, 'UTF8')), 'hex')"
#define Q_ROW                                                                                      \
    "k.key, k.tool, k.subject, k.state, k.attempts, " MS("k.created_at") " AS created_ms, "       \
    MS("k.updated_at") " AS updated_ms, " MS("k.lease_until") " AS lease_until_ms, "              \
    MS("k.expires_at") " AS expires_ms, " MS("k.finished_at") " AS finished_ms, "                 \
    "(k.state = 'in_progress' AND k.lease_until <= now()) AS lease_expired, "                     \
    "k.result_too_large, " HASH("k") " AS h"
#define OPEN_ROW(k)                                                                                \
    "(" k ".state = 'unknown' OR (" k ".state = 'in_progress' AND " k ".lease_until <= now()))"

/* $1 state filter ('' any, a state, 'stuck', 'open'), $2 scoped tool, $3 tool prefix,
 * $4 subject, $5 limit, $6 cursor ms (-1: none), $7 cursor hash, $8 updated since (ms, 0: none;
 * then oldest update first). STATE is the state's condition. */
#define LIST_SQL(STATE)                                                                            \
    "SELECT json_build_object('rows', coalesce(json_agg(to_json(r)"                                \
    " ORDER BY r.since, r.created_ms DESC, r.h DESC), '[]'::json))::text FROM ("                   \
    " SELECT " Q_ROW ", CASE WHEN $8::bigint > 0 THEN " MS("k.updated_at") " END AS since"       \
    " FROM idem_keys k WHERE k.expires_at > now() AND " STATE                                      \
    " AND ($2::text IS NULL OR k.tool = $2::text)"                                                 \
    " AND ($3::text IS NULL OR left(k.tool, length($3::text)) = $3::text)"                         \
    " AND ($4::text IS NULL OR k.subject = $4::text)"                                              \
    " AND ($8::bigint = 0 OR k.updated_at >= to_timestamp($8::bigint / 1000.0))"                   \
    " AND ($8::bigint > 0 OR $6::bigint < 0"                                                       \
    "  OR (" MS("k.created_at") ", " HASH("k") ") < ($6::bigint, $7::text))"                      \
    " ORDER BY since, created_ms DESC, h DESC LIMIT $5::integer) r"

const char store_pg_queue_list_sql[] = LIST_SQL(
    "CASE $1::text WHEN '' THEN true"
    "  WHEN 'stuck' THEN k.state = 'in_progress' AND k.lease_until <= now()"
    "  WHEN 'open' THEN " OPEN_ROW("k") " ELSE k.state = $1::text END");

/* The same for the unknown keys alone, with the state written in: it reads the partial index
 * idem_keys_unknown_idx whatever plan the statement is given (the alerts poll it twice a
 * second). $1 is 'unknown'. */
const char store_pg_queue_list_unknown_sql[] = LIST_SQL("k.state = 'unknown' AND $1::text <> ''");

/* $1 key_hash prefix: at most two live rows, each with its duplicates, result and actions */
const char store_pg_queue_show_sql[] =
    "SELECT json_build_object('rows', coalesce(json_agg(to_json(r)), '[]'::json))::text FROM ("
    " SELECT " Q_ROW ", k.dup_replay, k.dup_in_progress, k.dup_unknown,"
    " k.dup_history::text AS history,"
    " CASE WHEN k.state = 'succeeded' THEN convert_from(k.result, 'UTF8') END AS result,"
    " (SELECT coalesce(json_agg(json_build_object('outcome', a.outcome, 'previous_state',"
    "   a.previous_state, 'actor', a.actor, 'note', a.note, 'at_ms', " MS("a.at") ","
    "   'waited_ms', a.waited_ms) ORDER BY a.id), '[]'::json)"
    "  FROM idem_key_actions a WHERE a.key_hash = " HASH("k") ") AS actions"
    " FROM idem_keys k WHERE k.expires_at > now() AND $1::text <> ''"
    " AND left(" HASH("k") ", length($1::text)) = $1::text LIMIT 2) r";

/* $1 key, $2 outcome, $3 result (bytea), $4 actor, $5 note, $6 key_hash. The row is locked,
 * changed only if it is open (the same version), and the action kept in the same statement. */
const char store_pg_queue_resolve_sql[] =
    "WITH cur AS (SELECT k.key, k.tool, k.subject, k.state, k.finished_at, k.lease_until,"
    "  " OPEN_ROW("k") " AS open"
    "  FROM idem_keys k WHERE k.key = $1::text AND k.expires_at > now() FOR UPDATE),"
    " ok AS (SELECT * FROM cur WHERE open),"
    " upd AS (UPDATE idem_keys k SET state = $2::text, result = $3::bytea,"
    "  result_too_large = false, fence = k.fence + 1, finished_at = now(), updated_at = now()"
    "  FROM ok WHERE k.key = ok.key AND $2::text <> 'forget' RETURNING k.key),"
    " del AS (DELETE FROM idem_keys k USING ok WHERE k.key = ok.key AND $2::text = 'forget'"
    "  RETURNING k.key),"
    " act AS (INSERT INTO idem_key_actions (key_hash, tool, subject, outcome, previous_state,"
    "  actor, note, waited_ms)"
    "  SELECT $6::text, ok.tool, ok.subject, $2::text, ok.state, $4::text, $5::text,"
    "  greatest(0, " MS("now()") " - " MS("CASE WHEN ok.state = 'unknown'"
    "   THEN coalesce(ok.finished_at, ok.lease_until) ELSE ok.lease_until END") ")"
    "  FROM ok RETURNING waited_ms, at)"
    " SELECT json_build_object('state', (SELECT state FROM cur),"
    " 'done', EXISTS (SELECT 1 FROM act), 'waited_ms', (SELECT waited_ms FROM act),"
    " 'at_ms', (SELECT " MS("at") " FROM act))::text";

const char store_pg_queue_summary_sql[] =
    "SELECT json_build_object("
    " 'unknown', (SELECT coalesce(json_agg(json_build_object('tool', t.tool, 'keys', t.n,"
    "  'oldest_ms', t.oldest)), '[]'::json) FROM (SELECT tool, count(*) AS n,"
    "  greatest(0, " MS("now()") " - " MS("min(coalesce(finished_at, updated_at))") ") AS oldest"
    "  FROM idem_keys WHERE state = 'unknown' AND expires_at > now() GROUP BY tool) t),"
    " 'resolutions', (SELECT coalesce(json_agg(json_build_object('outcome', a.outcome,"
    "  'count', a.n, 'waited_ms', a.w)), '[]'::json) FROM (SELECT outcome, count(*) AS n,"
    "  sum(waited_ms)::bigint AS w FROM idem_key_actions GROUP BY outcome) a))::text";
/* clang-format on */

bool store_pg_queue_kind(store_op_kind_t kind)
{
    return kind == STORE_OP_QUEUE_LIST || kind == STORE_OP_QUEUE_LIST_UNKNOWN ||
           kind == STORE_OP_QUEUE_SHOW || kind == STORE_OP_QUEUE_RESOLVE ||
           kind == STORE_OP_QUEUE_SUMMARY;
}

static void param(store_op_t *op, const char *v)
{
    op->values[op->nparams++] = v ? xstrdup(v) : NULL;
}

static void param_int(store_op_t *op, int64_t v)
{
    op->values[op->nparams++] = xasprintf("%" PRId64, v);
}

store_status_t store_pg_queue(void *impl, store_queue_op_t *q)
{
    static const store_op_kind_t kinds[STORE_QUEUE_KINDS_] = {
        [STORE_QUEUE_LIST] = STORE_OP_QUEUE_LIST,
        [STORE_QUEUE_SHOW] = STORE_OP_QUEUE_SHOW,
        [STORE_QUEUE_RESOLVE] = STORE_OP_QUEUE_RESOLVE,
        [STORE_QUEUE_SUMMARY] = STORE_OP_QUEUE_SUMMARY,
    };
    static const char *const states[] = {"",       "unknown", "in_progress", "succeeded",
                                         "failed", "stuck",   "open"};
    if ((unsigned)q->kind >= STORE_QUEUE_KINDS_)
        return STORE_ERR_STATEMENT;
    store_op_t *op = xcalloc(1, sizeof(*op));
    op->kind = kinds[q->kind];
    if (q->kind == STORE_QUEUE_LIST && q->state == STORE_QUEUE_STATE_UNKNOWN)
        op->kind = STORE_OP_QUEUE_LIST_UNKNOWN;
    op->arg = q;
    switch (q->kind) {
    case STORE_QUEUE_LIST:
        param(op, states[q->state]);
        param(op, q->tool_exact);
        param(op, q->tool_prefix);
        param(op, q->subject);
        param_int(op, q->limit);
        param_int(op, q->cursor_ms);
        param(op, q->cursor_hash);
        param_int(op, q->updated_since_ms);
        break;
    case STORE_QUEUE_SHOW:
        param(op, q->prefix);
        break;
    case STORE_QUEUE_RESOLVE:
        param(op, q->key);
        param(op, store_queue_outcome_str(q->outcome));
        op->nparams++; /* the result, bytes as they are */
        if (q->result) {
            op->values[2] = xmalloc(q->result_len ? q->result_len : 1);
            memcpy(op->values[2], q->result, q->result_len);
            op->lengths[2] = (int)q->result_len;
            op->formats[2] = 1;
        }
        param(op, q->actor);
        param(op, q->note);
        param(op, q->key_hash);
        break;
    default:
        break;
    }
    return store_pg_submit(impl, op);
}

void store_pg_queue_done(store_op_t *op, const PGresult *res, store_status_t st)
{
    store_queue_op_t *q = op->arg;
    if (st == STORE_OK) {
        json_error_t err;
        json_t *out = PQntuples(res) == 1 && PQnfields(res) == 1
                          ? json_loads(PQgetvalue(res, 0, 0), 0, &err)
                          : NULL;
        if (!json_is_object(out)) {
            log_error(0, "store: %s returned no JSON object", store_stmt_name(op->kind));
            json_decref(out);
            st = STORE_ERR_STATEMENT;
        } else {
            q->out = out;
        }
    }
    store_queue_done(q, st);
}
