/* The Postgres backend's statements: each op's SQL and the name it is prepared under. The
 * ops that send them, and the parsing of what comes back, live in store_pg.c (the columns of
 * ROW_COLS are its COL_ enum, in this order), store_pg_dups.c and store_pg_indoubt.c. */
#include "store_int.h"

/* A timestamptz as ISO 8601 UTC text (2025-01-01T00:00:00.000Z). */
#define ISO_UTC(col) "to_char(" col " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"
/* Columns every row-returning statement ends with, parsed by parse_row(); k is idem_keys. */
/* clang-format off */
#define ROW_COLS                                                                                   \
    "k.state, k.fence, k.attempts, k.args_digest, k.result, k.result_too_large, "                  \
    "(k.state = 'in_progress' AND k.lease_until <= now()), "                                       \
    ISO_UTC("k.created_at") ", "                                                                   \
    "k.first_session_id, k.first_jsonrpc_id, "                                                     \
    "greatest(0, extract(epoch FROM k.expires_at - now()) * 1000)::bigint, "                       \
    ISO_UTC("k.finished_at") ", " ISO_UTC("k.lease_until") ", " ISO_UTC("k.expires_at")
/* clang-format on */

/* The row may be taken over by this claim ($4 digest, $10 takeover flag). An explicit key
 * reused with other arguments has a different digest and is never taken over unless expired:
 * the caller must see it to refuse the call. */
#define TAKEOVER_COND(k, digest) TAKEOVER_COND_IF(k, digest, "$10::boolean")
#define TAKEOVER_COND_IF(k, digest, flag)                                                          \
    "(" k ".expires_at <= now() OR (" k ".args_digest = " digest " AND (" k ".state = 'failed'"    \
    " OR (" k ".state = 'in_progress' AND " k ".lease_until <= now() AND " flag "))))"

/* The claim's own deadline ($11: epoch milliseconds by the database's clock). A claim the
 * gateway gave up on may still reach the database later: a backend that was stopped, or one
 * still waiting for a lock when its connection was closed, runs it once it can. Past the
 * deadline it inserts and takes over nothing, so no call the gateway refused holds its key. */
#define CLAIM_IN_TIME "clock_timestamp() <= to_timestamp($11::bigint / 1000.0)"

/* What a claim that takes a row over sets (both the single claim and the batch): an expired row
 * starts a new life (created_at, attempts, first ids, duplicate counts), a live one counts on. */
#define CLAIM_SET_NEW_LIFE                                                                         \
    " tool = excluded.tool, subject = excluded.subject, args_digest = excluded.args_digest,"       \
    " explicit_key = excluded.explicit_key, state = 'in_progress', fence = k.fence + 1,"           \
    " attempts = CASE WHEN k.expires_at <= now() THEN 1 ELSE k.attempts + 1 END,"                  \
    " created_at = CASE WHEN k.expires_at <= now() THEN now() ELSE k.created_at END,"              \
    " first_session_id = CASE WHEN k.expires_at <= now() THEN excluded.first_session_id"           \
    "  ELSE k.first_session_id END,"                                                               \
    " first_jsonrpc_id = CASE WHEN k.expires_at <= now() THEN excluded.first_jsonrpc_id"           \
    "  ELSE k.first_jsonrpc_id END,"                                                               \
    " result = NULL, result_too_large = false, lease_until = "                                     \
    "excluded.lease_until," STORE_PG_NEW_LIFE_DUPS                                                 \
    " updated_at = now(), finished_at = NULL, expires_at = excluded.expires_at,"

/* Insert, or take over ($4 digest, $10 takeover flag, $11 deadline as below). A claim that
 * wrote its row gets back only what its caller uses: the fence, the attempts and when the key
 * was first seen. A claim that wrote nothing (the key is held, or the deadline passed) gets no
 * row and is followed by claim_look_sql. The row's full set of columns, and a second branch to
 * return the existing row in the same statement, made Postgres build and send about three
 * times the expressions on every claim, most of them for the rarer case (pgbench, one claim
 * per transaction: 90-107 against 61-64 us of the server's CPU). An expired row starts a new
 * life (created_at, attempts, first ids) but keeps counting its fence, so a stalled finish from
 * its previous life cannot match. */
static const char claim_sql[] =
    "INSERT INTO idem_keys AS k (key, tool, subject, args_digest, explicit_key, state, fence,"
    " attempts, first_session_id, first_jsonrpc_id, lease_until, created_at, updated_at,"
    " expires_at, claim_token)"
    " SELECT $1::text, $2::text, $3::text, $4::text, $5::boolean, 'in_progress'::text, 1, 1,"
    " $6::text, $7::text, now() + $8::bigint * interval '1 millisecond', now(), now(),"
    " now() + greatest($8::bigint, $9::bigint) * interval '1 millisecond', $12::text"
    " WHERE " CLAIM_IN_TIME " ON CONFLICT (key) DO UPDATE SET" CLAIM_SET_NEW_LIFE
    " claim_token = excluded.claim_token"
    " WHERE " CLAIM_IN_TIME " AND " TAKEOVER_COND(
        "k", "excluded.args_digest") " RETURNING k.fence, k.attempts, " ISO_UTC("k.created_at");

/* After a claim that wrote nothing: the row as it is now ($1 key, $2 digest, $3 takeover flag),
 * with whether this claim could take it over. That happens when the row changed between the
 * two statements (finished as failed, released, its lease or life ended) or when the claim's
 * own deadline kept it from writing: the caller runs the claim again. No row: it was swept or
 * forgotten in between, or the claim never inserted it; the same. */
static const char claim_look_sql[] = "SELECT false, " TAKEOVER_COND_IF(
    "k", "$2::text", "$3::boolean") ", " ROW_COLS " FROM idem_keys k WHERE k.key = $1::text";

/* Group commit: the claims queued while the claim slots were busy, one row of each array per
 * call ($1..$12 as in claim_sql, keys distinct: one key's later claims wait for the next
 * statement, as if they came after). The rows are inserted in key order, so two batches on
 * overlapping keys lock them in the same order and cannot deadlock. Each call's takeover flag
 * and deadline are looked up by key where the update decides. Each call gets a row: whether it
 * acquired the key, whether it could take the key over (the row it met may be older than one
 * committed since this statement's snapshot), ROW_COLS, then the key and the call's position
 * (1-based); a call with no row, or a stale one, hit that READ COMMITTED corner and is re-run
 * alone. */
#define BATCH_ROW(col) "(SELECT r." col " FROM r WHERE r.key = excluded.key)"
/* clang-format off */
static const char claim_batch_sql[] =
    "WITH r AS MATERIALIZED (SELECT * FROM unnest($1::text[], $2::text[], $3::text[],"
    " $4::text[], $5::boolean[], $6::text[], $7::text[], $8::bigint[], $9::bigint[],"
    " $10::boolean[], $11::bigint[], $12::text[]) WITH ORDINALITY AS r(key, tool, subject,"
    " args_digest, explicit_key, session_id, jsonrpc_id, lease_ms, window_ms, takeover, deadline,"
    " token, i)),"
    " ins AS ("
    " INSERT INTO idem_keys AS k (key, tool, subject, args_digest, explicit_key, state, fence,"
    "  attempts, first_session_id, first_jsonrpc_id, lease_until, created_at, updated_at,"
    "  expires_at, claim_token)"
    " SELECT r.key, r.tool, r.subject, r.args_digest, r.explicit_key, 'in_progress'::text, 1, 1,"
    "  r.session_id, r.jsonrpc_id, now() + r.lease_ms * interval '1 millisecond', now(), now(),"
    "  now() + greatest(r.lease_ms, r.window_ms) * interval '1 millisecond', r.token"
    " FROM r WHERE clock_timestamp() <= to_timestamp(r.deadline / 1000.0) ORDER BY r.key"
    " ON CONFLICT (key) DO UPDATE SET"
    CLAIM_SET_NEW_LIFE
    "  claim_token = excluded.claim_token"
    " WHERE clock_timestamp() <= to_timestamp(" BATCH_ROW("deadline") " / 1000.0) AND "
    TAKEOVER_COND_IF("k", "excluded.args_digest", BATCH_ROW("takeover"))
    " RETURNING true, false, " ROW_COLS ", k.key)"
    " SELECT ins.*, r.i FROM ins JOIN r ON r.key = ins.key"
    " UNION ALL"
    " SELECT false, " TAKEOVER_COND_IF("k", "r.args_digest", "r.takeover") ", " ROW_COLS
    ", k.key, r.i FROM r JOIN idem_keys k ON k.key = r.key"
    " WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.key = r.key)";
/* clang-format on */

static const char finish_sql[] =
    "UPDATE idem_keys SET state = $3::text, result = $4::bytea, result_too_large = $5::boolean,"
    " updated_at = now(), finished_at = now(),"
    " expires_at = now() + $6::bigint * interval '1 millisecond'"
    " WHERE key = $1::text AND fence = $2::bigint";

/* Group commit of finishes: $1..$6 as in finish_sql, one row per call, keys distinct. Returns
 * the positions (1-based) whose fence matched. The rows are locked in key order first (no
 * deadlock with a claim batch). The commit does not wait for the WAL flush: a finish lost in a
 * crash of Postgres leaves the claim in progress, which blocks a second execution and reads as
 * unknown once its lease ends; claims stay synchronous. */
static const char finish_batch_sql[] =
    "WITH f AS (SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bytea[],"
    " $5::boolean[], $6::bigint[]) WITH ORDINALITY AS f(key, fence, state, result, too_large,"
    " window_ms, i)),"
    " l AS MATERIALIZED (SELECT k.key FROM idem_keys k WHERE k.key IN (SELECT f.key FROM f)"
    "  ORDER BY k.key FOR UPDATE),"
    " c AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true) AS v)"
    " UPDATE idem_keys k SET state = f.state, result = f.result, result_too_large = f.too_large,"
    " updated_at = now(), finished_at = now(),"
    " expires_at = now() + f.window_ms * interval '1 millisecond'"
    " FROM f JOIN l ON l.key = f.key, c"
    " WHERE k.key = f.key AND k.fence = f.fence AND c.v = 'off' RETURNING f.i";

/* finish_sql without waiting for the WAL flush, as a batch of finishes commits: the default
 * finish (store.durable_finish off). The claim before it stays synchronous. The setting is
 * changed from the row's filter, not from a CTE joined in (whose plan nodes every execution
 * built and tore down): a row is only written once the whole filter held, set_config included,
 * and a statement that writes no row leaves nothing to flush. */
static const char finish_async_sql[] =
    "UPDATE idem_keys SET state = $3::text, result = $4::bytea, result_too_large = $5::boolean,"
    " updated_at = now(), finished_at = now(),"
    " expires_at = now() + $6::bigint * interval '1 millisecond'"
    " WHERE key = $1::text AND fence = $2::bigint"
    " AND set_config('synchronous_commit', 'off', true) = 'off'";

/* An operator's look (and wait mode's poll): the row, then its duplicates. */
static const char get_sql[] = "SELECT false, false, " ROW_COLS ", " STORE_PG_DUP_COLS
                              " FROM idem_keys k WHERE k.key = $1::text";

/* Keeps a live call's claim from being counted as lost while its stream still runs. */
static const char extend_sql[] =
    "UPDATE idem_keys SET lease_until = now() + $3::bigint * interval '1 millisecond',"
    " expires_at = greatest(expires_at, now() + $3::bigint * interval '1 millisecond'),"
    " updated_at = now()"
    " WHERE key = $1::text AND fence = $2::bigint AND state = 'in_progress'";

/* An operator's release: an unknown outcome, or a claim whose lease ran out, becomes 'failed'
 * (store.h). The row is locked first and returned as it was, its first column saying whether
 * it was released; the update applies the same condition to the same locked version. */
#define RELEASABLE(k)                                                                              \
    "(" k ".state = 'unknown' OR (" k ".state = 'in_progress' AND " k ".lease_until <= now()))"
/* clang-format off */
static const char release_sql[] =
    "WITH old AS MATERIALIZED ("
    " SELECT " RELEASABLE("k") ", false, " ROW_COLS ", " STORE_PG_DUP_COLS
    " FROM idem_keys k WHERE k.key = $1::text FOR UPDATE),"
    " upd AS ("
    " UPDATE idem_keys k SET state = 'failed', fence = k.fence + 1, lease_until = now(),"
    "  updated_at = now()"
    " FROM old WHERE k.key = $1::text AND " RELEASABLE("k") " RETURNING 1)"
    " SELECT * FROM old";
/* clang-format on */

/* An operator's forget: the row goes, whatever its state, and comes back as it was. */
static const char forget_sql[] =
    "DELETE FROM idem_keys k WHERE k.key = $1::text RETURNING false, false, " ROW_COLS
    ", " STORE_PG_DUP_COLS;

/* SKIP LOCKED: a row a claim is taking over right now is left for the next sweep. The outer
 * conditions are re-checked because a row updated between the subselect and the delete is
 * re-evaluated against its new version only through them. An in-progress row whose lease still
 * runs is never deleted (its expiry is never before its lease, but be sure). */
#define SWEEPABLE(k)                                                                               \
    k ".expires_at < now() AND NOT (" k ".state = 'in_progress' AND " k ".lease_until > now())"
static const char sweep_sql[] =
    "DELETE FROM idem_keys d WHERE d.key IN ("
    " SELECT k.key FROM idem_keys k WHERE " SWEEPABLE(
        "k") " ORDER BY k.expires_at"
             " LIMIT $1::integer FOR UPDATE SKIP LOCKED) AND " SWEEPABLE("d");

static const char count_unknown_sql[] =
    "SELECT count(*) FROM idem_keys WHERE state = 'unknown' AND expires_at > now()";

static const struct {
    const char *name;
    const char *sql;
} stmts[STORE_OP_COUNT_] = {
    [STORE_OP_CLAIM] = {"idemgw_claim", claim_sql},
    [STORE_OP_FINISH] = {"idemgw_finish", finish_sql},
    [STORE_OP_GET] = {"idemgw_get", get_sql},
    [STORE_OP_DUP] = {"idemgw_dup", store_pg_dup_sql},
    [STORE_OP_SWEEP] = {"idemgw_sweep", sweep_sql},
    [STORE_OP_EXTEND] = {"idemgw_extend", extend_sql},
    [STORE_OP_RELEASE] = {"idemgw_release", release_sql},
    [STORE_OP_FORGET] = {"idemgw_forget", forget_sql},
    [STORE_OP_CLAIM_BATCH] = {"idemgw_claim_batch", claim_batch_sql},
    [STORE_OP_FINISH_BATCH] = {"idemgw_finish_batch", finish_batch_sql},
    [STORE_OP_COUNT_UNKNOWN] = {"idemgw_count_unknown", count_unknown_sql},
    [STORE_OP_REPORT] = {"idemgw_report", store_pg_report_sql},
    [STORE_OP_FINISH_ASYNC] = {"idemgw_finish_async", finish_async_sql},
    [STORE_OP_RELEASE_IN_DOUBT] = {"idemgw_release_in_doubt", store_pg_indoubt_sql},
    [STORE_OP_QUEUE_LIST] = {"idemgw_queue_list", store_pg_queue_list_sql},
    [STORE_OP_QUEUE_LIST_UNKNOWN] = {"idemgw_queue_list_unknown", store_pg_queue_list_unknown_sql},
    [STORE_OP_QUEUE_SHOW] = {"idemgw_queue_show", store_pg_queue_show_sql},
    [STORE_OP_QUEUE_RESOLVE] = {"idemgw_queue_resolve", store_pg_queue_resolve_sql},
    [STORE_OP_QUEUE_SUMMARY] = {"idemgw_queue_summary", store_pg_queue_summary_sql},
    [STORE_OP_CLAIM_LOOK] = {"idemgw_claim_look", claim_look_sql},
};

const char *store_stmt_name(store_op_kind_t kind)
{
    return stmts[kind].name;
}

const char *store_stmt_sql(store_op_kind_t kind)
{
    return stmts[kind].sql;
}
