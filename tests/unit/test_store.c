/* The store against its real backends, the same cases for each: Postgres when
 * IDEMGW_TEST_PG_URL names a server (the test runner starts one with scripts/pg-cluster.sh;
 * each run creates and drops its own database), and the embedded SQLite store always, on a
 * file in a fresh temporary directory. The restart case starts a private cluster of its own so
 * it cannot disturb other tests on the shared one. Cases that only one backend can have skip
 * on the other; the SQLite group adds its own (the file lock, batching, a missed deadline).
 * Everything waits on the event loop with deadlines, never with sleeps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "log.h"
#include "store.h"
#include "store_pg.h"
#include "store_queue.h"
#include "key.h"
#include "stats.h"
#include "store_sqlite.h"
#include "util.h"

#include <event2/event.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef enum { BACKEND_PG = 0, BACKEND_SQLITE } backend_t;

static backend_t backend; /* of the group running */
static struct event_base *base;
static char *admin_url;   /* the server's maintenance database */
static char dbname[64];   /* this run's database */
static char *db_conninfo; /* conninfo of this run's database; with SQLite, the file */
static char sqlite_dir[64]; /* the SQLite group's temporary directory */
static store_t *st_main;  /* shared by most cases; keys are prefixed per case */

/* ---- helpers ---- */

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
}

/* Runs the loop until pred holds or timeout_ms passes; the tick bounds each loop pass. */
static bool wait_for(bool (*pred)(void *), void *arg, uint64_t timeout_ms)
{
    uint64_t deadline = util_now_ms() + timeout_ms;
    struct event *tick = event_new(base, -1, EV_PERSIST, tick_cb, NULL);
    struct timeval tv = {0, 10000};
    event_add(tick, &tv);
    while (!pred(arg) && util_now_ms() < deadline)
        event_base_loop(base, EVLOOP_ONCE);
    event_free(tick);
    return pred(arg);
}

static bool flag_set(void *arg)
{
    return *(bool *)arg;
}

static bool is_ready(void *arg)
{
    return store_ready(arg);
}

/* Every connection of the pool is up (a store is ready with one). */
static bool all_connected(void *arg)
{
    store_stats_t st;
    store_get_stats(arg, &st);
    return st.connections_up == st.connections_wanted;
}

static bool is_not_ready(void *arg)
{
    return !store_ready(arg);
}

/* Conninfo for another database on the same server as url. */
static char *conninfo_for(const char *url, const char *db)
{
    char *err = NULL;
    PQconninfoOption *opts = PQconninfoParse(url, &err);
    if (!opts) {
        fprintf(stderr, "cannot parse IDEMGW_TEST_PG_URL: %s\n", err ? err : "?");
        PQfreemem(err);
        return NULL;
    }
    size_t cap = 1024, len = 0;
    char *out = xmalloc(cap);
    out[0] = '\0';
    for (PQconninfoOption *o = opts; o->keyword; o++) {
        if (!o->val || strcmp(o->keyword, "dbname") == 0)
            continue;
        char esc[512];
        size_t e = 0;
        for (const char *p = o->val; *p && e + 3 < sizeof(esc); p++) {
            if (*p == '\'' || *p == '\\')
                esc[e++] = '\\';
            esc[e++] = *p;
        }
        esc[e] = '\0';
        char *piece = xasprintf("%s='%s' ", o->keyword, esc);
        size_t pl = strlen(piece);
        if (len + pl + 1 > cap) {
            cap = (len + pl + 1) * 2;
            out = xrealloc(out, cap);
        }
        memcpy(out + len, piece, pl + 1);
        len += pl;
        free(piece);
    }
    PQconninfoFree(opts);
    char *full = xasprintf("%sdbname='%s'", out, db);
    free(out);
    return full;
}

static void quiet_notice(void *arg, const char *msg)
{
    (void)arg;
    (void)msg;
}

/* sql1 on the SQLite file: a connection of its own, beside the store's. */
static const char *sqlite1(const char *path, const char *sql)
{
    static char val[256];
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    val[0] = '\0';
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK) {
        fprintf(stderr, "sqlite1 open: %s\n", sqlite3_errmsg(db));
        sqlite3_close(db);
        fail_msg("cannot open the file for a helper statement");
    }
    sqlite3_busy_timeout(db, 5000);
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        fprintf(stderr, "sqlite1 %s: %s\n", sql, sqlite3_errmsg(db));
        sqlite3_finalize(st);
        sqlite3_close(db);
        fail_msg("helper statement failed");
    }
    if (rc == SQLITE_ROW && sqlite3_column_text(st, 0))
        snprintf(val, sizeof(val), "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    sqlite3_close(db);
    return val;
}

/* Runs one statement on a blocking connection; returns the first value, or "" (static buffer). */
static const char *sql1(const char *conninfo, const char *sql)
{
    static char val[256];
    if (backend == BACKEND_SQLITE)
        return sqlite1(conninfo, sql);
    PGconn *pg = PQconnectdb(conninfo);
    val[0] = '\0';
    if (PQstatus(pg) != CONNECTION_OK) {
        fprintf(stderr, "sql1 connect: %s", PQerrorMessage(pg));
        PQfinish(pg);
        fail_msg("cannot connect for a helper statement");
    }
    PQsetNoticeProcessor(pg, quiet_notice, NULL);
    PGresult *r = PQexec(pg, sql);
    ExecStatusType rs = PQresultStatus(r);
    if (rs != PGRES_TUPLES_OK && rs != PGRES_COMMAND_OK) {
        fprintf(stderr, "sql1 %s: %s", sql, PQerrorMessage(pg));
        PQclear(r);
        PQfinish(pg);
        fail_msg("helper statement failed");
    }
    if (rs == PGRES_TUPLES_OK && PQntuples(r) > 0)
        snprintf(val, sizeof(val), "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    PQfinish(pg);
    return val;
}

/* The group's backend at pg->conninfo (a conninfo, or the SQLite file); NULL with msg set when
 * refused. */
static store_t *new_store(const store_options_t *o, const store_pg_options_t *pg, char *msg,
                          size_t msglen)
{
    if (backend == BACKEND_SQLITE) {
        store_sqlite_options_t sq = {.path = pg->conninfo};
        return store_sqlite_new(base, o, &sq, msg, msglen);
    }
    return store_pg_new(base, o, pg, msg, msglen);
}

static store_t *open_store(const char *conninfo, int pool, bool migrate, uint64_t sweep_ms,
                           int batch)
{
    store_options_t opt = {.migrate = migrate, .sweep_interval_ms = sweep_ms, .sweep_batch = batch};
    store_pg_options_t pg = {.conninfo = conninfo, .pool_size = pool, .group_commit = true};
    char msg[512] = "";
    store_t *s = new_store(&opt, &pg, msg, sizeof(msg));
    if (!s)
        fprintf(stderr, "%s store: %s\n", backend == BACKEND_SQLITE ? "sqlite" : "postgres", msg);
    assert_non_null(s);
    assert_true(wait_for(is_ready, s, 10000));
    return s;
}

/* A second store on this run's database. The SQLite file takes one opener at a time, so there
 * st_main is closed meanwhile; close_other opens it again. */
static store_t *open_other(int pool, uint64_t sweep_ms, int batch)
{
    if (backend == BACKEND_SQLITE) {
        store_free(st_main);
        st_main = NULL;
    }
    return open_store(db_conninfo, pool, true, sweep_ms, batch);
}

static void close_other(store_t *s)
{
    store_free(s);
    if (backend == BACKEND_SQLITE)
        st_main = open_store(db_conninfo, 4, true, 0, 0);
}

static int schema_version(void)
{
    return backend == BACKEND_SQLITE ? store_sqlite_schema_version() : store_schema_version();
}

/* "1" when the table exists, "0" when not. */
static const char *table_exists(const char *conninfo, const char *table)
{
    char *sql = backend == BACKEND_SQLITE
                    ? xasprintf("SELECT count(*) FROM sqlite_master WHERE name = '%s'", table)
                    : xasprintf("SELECT (to_regclass('%s') IS NOT NULL)::int", table);
    const char *v = sql1(conninfo, sql);
    free(sql);
    return v;
}

/* A claim's outcome, copied out of the callback. */
typedef struct {
    bool done;
    store_status_t st;
    bool acquired, taken_over, lease_expired, too_large;
    int64_t fence;
    int attempts;
    store_state_t state;
    char digest[80];
    char *result; /* owned copy, or NULL */
    size_t result_len;
    char created_at[40];
    char session[64];
} claim_out_t;

static void claim_cb(store_status_t st, const store_claim_result_t *res, void *arg)
{
    claim_out_t *o = arg;
    o->done = true;
    o->st = st;
    if (st != STORE_OK)
        return;
    o->acquired = res->acquired;
    o->taken_over = res->taken_over;
    o->fence = res->fence;
    o->attempts = res->attempts;
    o->state = res->row.state;
    o->lease_expired = res->row.lease_expired;
    o->too_large = res->row.result_too_large;
    snprintf(o->digest, sizeof(o->digest), "%s", res->row.args_digest ? res->row.args_digest : "");
    snprintf(o->created_at, sizeof(o->created_at), "%s", res->row.created_at);
    snprintf(o->session, sizeof(o->session), "%s",
             res->row.first_session_id ? res->row.first_session_id : "");
    if (res->row.result) {
        o->result = xstrndup(res->row.result, res->row.result_len);
        o->result_len = res->row.result_len;
    }
}

static store_claim_req_t req_for(const char *key, const char *digest)
{
    store_claim_req_t r = {.key = key,
                           .tool = "charge",
                           .subject = "tenant-a",
                           .args_digest = digest,
                           .explicit_key = false,
                           .session_id = "sess-1",
                           .jsonrpc_id = "7",
                           .lease_ms = 30000,
                           .window_ms = 600000,
                           .takeover_lease_expired = false};
    return r;
}

static claim_out_t do_claim(store_t *s, const store_claim_req_t *req)
{
    claim_out_t o;
    memset(&o, 0, sizeof(o));
    assert_int_equal(store_claim(s, req, claim_cb, &o), STORE_OK);
    assert_false(o.done); /* never called back from inside the call */
    assert_true(wait_for(flag_set, &o.done, 10000));
    assert_int_equal(o.st, STORE_OK);
    return o;
}

typedef struct {
    bool done;
    store_status_t st;
    bool matched;
} finish_out_t;

static void finish_cb(store_status_t st, bool matched, void *arg)
{
    finish_out_t *o = arg;
    o->done = true;
    o->st = st;
    o->matched = matched;
}

static bool do_finish(store_t *s, const char *key, int64_t fence, store_state_t state,
                      const char *result, uint64_t window_ms)
{
    finish_out_t o = {0};
    store_finish_req_t fin = {.key = key,
                              .fence = fence,
                              .state = state,
                              .result = result,
                              .result_len = result ? strlen(result) : 0,
                              .window_ms = window_ms};
    assert_int_equal(store_finish(s, &fin, finish_cb, &o), STORE_OK);
    assert_true(wait_for(flag_set, &o.done, 10000));
    assert_int_equal(o.st, STORE_OK);
    return o.matched;
}

typedef struct {
    bool done, found;
    store_status_t st;
    store_state_t state;
    int attempts;
    int64_t fence;
} get_out_t;

static void get_cb(store_status_t st, const store_row_t *row, void *arg)
{
    get_out_t *o = arg;
    o->done = true;
    o->st = st;
    o->found = row != NULL;
    if (row) {
        o->state = row->state;
        o->attempts = row->attempts;
        o->fence = row->fence;
    }
}

static get_out_t do_get(store_t *s, const char *key)
{
    get_out_t o;
    memset(&o, 0, sizeof(o));
    assert_int_equal(store_get(s, key, get_cb, &o), STORE_OK);
    assert_true(wait_for(flag_set, &o.done, 10000));
    assert_int_equal(o.st, STORE_OK);
    return o;
}

/* ---- setup ---- */

static int group_setup(void **state)
{
    (void)state;
    backend = BACKEND_PG;
    const char *url = getenv("IDEMGW_TEST_PG_URL");
    if (!url || !url[0]) {
        fprintf(stderr,
                "test_store: IDEMGW_TEST_PG_URL is not set. These tests need a real "
                "Postgres: d=$(mktemp -d); export IDEMGW_TEST_PG_URL=$(scripts/pg-cluster.sh "
                "start $d/pg)\n");
        return -1;
    }
    log_threshold = getenv("IDEMGW_TEST_LOG") ? LOG_DEBUG : LOG_ERROR;
    admin_url = xstrdup(url);
    snprintf(dbname, sizeof(dbname), "idemgw_test_%ld", (long)getpid());
    char *sql = xasprintf("DROP DATABASE IF EXISTS %s", dbname);
    sql1(admin_url, sql);
    free(sql);
    sql = xasprintf("CREATE DATABASE %s", dbname);
    sql1(admin_url, sql);
    free(sql);
    db_conninfo = conninfo_for(url, dbname);
    if (!db_conninfo)
        return -1;
    base = event_base_new();
    return base ? 0 : -1;
}

/* The SQLite group: a fresh directory, the file made by the first store. */
static int sqlite_setup(void **state)
{
    (void)state;
    backend = BACKEND_SQLITE;
    log_threshold = getenv("IDEMGW_TEST_LOG") ? LOG_DEBUG : LOG_ERROR;
    snprintf(sqlite_dir, sizeof(sqlite_dir), "/tmp/idemgw-store-sqlite.XXXXXX");
    if (!mkdtemp(sqlite_dir))
        return -1;
    db_conninfo = xasprintf("%s/keys.db", sqlite_dir);
    base = event_base_new();
    return base ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    store_free(st_main);
    st_main = NULL;
    if (backend == BACKEND_SQLITE && sqlite_dir[0]) {
        char *rm = xasprintf("rm -rf '%s'", sqlite_dir);
        if (system(rm) != 0)
            fprintf(stderr, "could not remove %s\n", sqlite_dir);
        free(rm);
        sqlite_dir[0] = '\0';
    }
    if (admin_url) {
        char *sql = xasprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", dbname);
        sql1(admin_url, sql);
        free(sql);
    }
    if (base)
        event_base_free(base);
    base = NULL;
    free(db_conninfo);
    db_conninfo = NULL;
    free(admin_url);
    admin_url = NULL;
    return 0;
}

/* ---- cases ---- */

static void test_strings(void **state)
{
    (void)state;
    assert_string_equal(store_status_str(STORE_OK), "ok");
    assert_string_equal(store_status_str(STORE_ERR_UNAVAILABLE), "unavailable");
    assert_string_equal(store_status_str(STORE_ERR_STATEMENT), "statement failed");
    assert_string_equal(store_status_str(STORE_ERR_SCHEMA), "schema mismatch");
    assert_string_equal(store_status_str(STORE_ERR_SHUTDOWN), "shutting down");
    assert_string_equal(store_status_str(STORE_ERR_FILE_LOST),
                        "the store's file was deleted or replaced");
    assert_string_equal(store_status_str((store_status_t)99), "unknown status");
    assert_string_equal(store_state_str(STORE_STATE_IN_PROGRESS), "in_progress");
    assert_string_equal(store_state_str(STORE_STATE_SUCCEEDED), "succeeded");
    assert_string_equal(store_state_str(STORE_STATE_FAILED), "failed");
    assert_string_equal(store_state_str(STORE_STATE_UNKNOWN), "unknown");
    assert_string_equal(store_state_str((store_state_t)42), "invalid");
    assert_true(store_schema_version() >= 1);
    assert_true(store_sqlite_schema_version() >= 1);
}

static void test_migrations_once(void **state)
{
    (void)state;
    st_main = open_store(db_conninfo, 4, true, 0, 0);
    char *want = xasprintf("%d", schema_version());
    assert_string_equal(sql1(db_conninfo, "SELECT max(version) FROM schema_migrations"), want);
    assert_string_equal(sql1(db_conninfo, "SELECT count(*) FROM schema_migrations"), want);
    /* a second start finds everything in place and applies nothing */
    store_t *again = open_other(1, 0, 0);
    assert_string_equal(sql1(db_conninfo, "SELECT count(*) FROM schema_migrations"), want);
    assert_string_equal(table_exists(db_conninfo, "idem_keys"), "1");
    close_other(again);
    free(want);
}

static void test_newer_schema_refused(void **state)
{
    (void)state;
    char *sql = xasprintf("INSERT INTO schema_migrations (version, name) VALUES (%d, 'future')",
                          schema_version() + 1);
    sql1(db_conninfo, sql);
    free(sql);
    if (backend == BACKEND_SQLITE) {
        store_free(st_main); /* its lock would refuse the new one first */
        st_main = NULL;
    }
    store_options_t opt = {.migrate = true};
    store_pg_options_t pg = {.conninfo = db_conninfo, .pool_size = 1};
    char msg[512] = "";
    store_t *s = new_store(&opt, &pg, msg, sizeof(msg));
    assert_null(s);
    assert_non_null(strstr(msg, "newer"));
    sql = xasprintf("DELETE FROM schema_migrations WHERE version = %d", schema_version() + 1);
    sql1(db_conninfo, sql);
    free(sql);
    if (backend == BACKEND_SQLITE)
        st_main = open_store(db_conninfo, 4, true, 0, 0);
}

static void test_missing_schema_without_migrate_refused(void **state)
{
    (void)state;
    if (backend == BACKEND_SQLITE) {
        char *path = xasprintf("%s/empty.db", sqlite_dir);
        store_options_t opt = {.migrate = false};
        store_sqlite_options_t sq = {.path = path};
        char msg[512] = "";
        store_t *s = store_sqlite_new(base, &opt, &sq, msg, sizeof(msg));
        assert_null(s);
        assert_non_null(strstr(msg, "migrations are disabled"));
        /* nothing was created in the file (the check ran in a rolled back transaction) */
        assert_string_equal(table_exists(path, "idem_keys"), "0");
        assert_string_equal(table_exists(path, "schema_migrations"), "0");
        free(path);
        return;
    }
    char other[80];
    snprintf(other, sizeof(other), "%s_empty", dbname);
    char *sql = xasprintf("CREATE DATABASE %s", other);
    sql1(admin_url, sql);
    free(sql);
    char *ci = conninfo_for(admin_url, other);
    store_options_t opt = {.migrate = false};
    store_pg_options_t pg = {.conninfo = ci, .pool_size = 1};
    char msg[512] = "";
    store_t *s = store_pg_new(base, &opt, &pg, msg, sizeof(msg));
    assert_null(s);
    assert_non_null(strstr(msg, "migrations are disabled"));
    /* nothing was created behind the operator's back (the check ran in a rolled back txn) */
    assert_string_equal(sql1(ci, "SELECT to_regclass('idem_keys') IS NULL"), "t");
    assert_string_equal(sql1(ci, "SELECT to_regclass('schema_migrations') IS NULL"), "t");
    free(ci);
    sql = xasprintf("DROP DATABASE %s WITH (FORCE)", other);
    sql1(admin_url, sql);
    free(sql);
}

static void test_claim_finish_replay(void **state)
{
    (void)state;
    store_claim_req_t req = req_for("t:charge:h:basic", "d1");
    claim_out_t a = do_claim(st_main, &req);
    assert_true(a.acquired);
    assert_false(a.taken_over);
    assert_int_equal(a.fence, 1);
    assert_int_equal(a.attempts, 1);
    assert_int_equal(a.state, STORE_STATE_IN_PROGRESS);
    assert_int_equal(strlen(a.created_at), 24); /* 2025-01-01T00:00:00.000Z */
    assert_int_equal(a.created_at[23], 'Z');

    claim_out_t b = do_claim(st_main, &req);
    assert_false(b.acquired);
    assert_int_equal(b.state, STORE_STATE_IN_PROGRESS);
    assert_int_equal(b.fence, 1);
    assert_false(b.lease_expired);
    assert_null(b.result);
    assert_string_equal(b.session, "sess-1");

    assert_false(do_finish(st_main, req.key, 2, STORE_STATE_SUCCEEDED, "{}", 600000));
    const char *result = "{\"content\":[{\"type\":\"text\",\"text\":\"charged \\u00e9 ok\"}]}";
    assert_true(do_finish(st_main, req.key, 1, STORE_STATE_SUCCEEDED, result, 600000));

    claim_out_t c = do_claim(st_main, &req);
    assert_false(c.acquired);
    assert_int_equal(c.state, STORE_STATE_SUCCEEDED);
    assert_int_equal(c.fence, 1);
    assert_non_null(c.result);
    assert_int_equal(c.result_len, strlen(result));
    assert_string_equal(c.result, result);
    assert_false(c.too_large);
    free(c.result);

    /* a stalled finish with the old fence cannot overwrite after a takeover */
    assert_false(do_finish(st_main, "t:charge:h:no-such-key", 1, STORE_STATE_FAILED, NULL, 1000));
}

static void test_failed_is_taken_over(void **state)
{
    (void)state;
    store_claim_req_t req = req_for("t:charge:h:failed", "d1");
    claim_out_t a = do_claim(st_main, &req);
    assert_true(a.acquired);
    assert_true(do_finish(st_main, req.key, a.fence, STORE_STATE_FAILED, NULL, 600000));
    claim_out_t b = do_claim(st_main, &req);
    assert_true(b.acquired);
    assert_true(b.taken_over);
    assert_int_equal(b.fence, 2);
    assert_int_equal(b.attempts, 2);
    assert_false(do_finish(st_main, req.key, 1, STORE_STATE_SUCCEEDED, "{}", 600000));
    assert_true(do_finish(st_main, req.key, 2, STORE_STATE_UNKNOWN, NULL, 600000));
    claim_out_t c = do_claim(st_main, &req);
    assert_false(c.acquired); /* unknown is held */
    assert_int_equal(c.state, STORE_STATE_UNKNOWN);
}

static void test_lease_expiry(void **state)
{
    (void)state;
    store_claim_req_t req = req_for("t:charge:h:lease", "d1");
    req.lease_ms = 0; /* the lease is over by the next statement, by the database clock */
    claim_out_t a = do_claim(st_main, &req);
    assert_true(a.acquired);

    req.lease_ms = 30000;
    req.takeover_lease_expired = false;
    claim_out_t b = do_claim(st_main, &req);
    assert_false(b.acquired);
    assert_int_equal(b.state, STORE_STATE_IN_PROGRESS);
    assert_true(b.lease_expired);

    req.takeover_lease_expired = true;
    claim_out_t c = do_claim(st_main, &req);
    assert_true(c.acquired);
    assert_true(c.taken_over);
    assert_int_equal(c.fence, 2);
    /* the new lease holds */
    claim_out_t d = do_claim(st_main, &req);
    assert_false(d.acquired);
    assert_false(d.lease_expired);
    assert_int_equal(d.fence, 2);
    /* the first attempt's late finish is fenced out */
    assert_false(do_finish(st_main, req.key, 1, STORE_STATE_SUCCEEDED, "{}", 600000));
}

static void test_window_expiry(void **state)
{
    (void)state;
    store_claim_req_t req = req_for("t:charge:h:window", "d1");
    claim_out_t a = do_claim(st_main, &req);
    assert_true(a.acquired);
    assert_true(do_finish(st_main, req.key, a.fence, STORE_STATE_SUCCEEDED, "{\"a\":1}", 0));
    req.session_id = "sess-2";
    claim_out_t b = do_claim(st_main, &req);
    assert_true(b.acquired);
    assert_true(b.taken_over);
    assert_int_equal(b.fence, 2);
    assert_int_equal(b.attempts, 1); /* a new life for the key */
    assert_null(b.result);
    get_out_t g = do_get(st_main, req.key);
    assert_true(g.found);
    assert_int_equal(g.state, STORE_STATE_IN_PROGRESS);
}

static void test_explicit_key_digest_mismatch(void **state)
{
    (void)state;
    store_claim_req_t req = req_for("t:charge:x:order-42", "digest-A");
    req.explicit_key = true;
    claim_out_t a = do_claim(st_main, &req);
    assert_true(a.acquired);
    assert_true(do_finish(st_main, req.key, a.fence, STORE_STATE_FAILED, NULL, 600000));

    /* failed, but reused with other arguments: returned for the caller to refuse */
    store_claim_req_t other = req;
    other.args_digest = "digest-B";
    claim_out_t b = do_claim(st_main, &other);
    assert_false(b.acquired);
    assert_string_equal(b.digest, "digest-A");
    assert_int_equal(b.state, STORE_STATE_FAILED);

    /* same arguments: taken over */
    claim_out_t c = do_claim(st_main, &req);
    assert_true(c.acquired);
    assert_int_equal(c.fence, 2);

    /* lease-expired in progress is not taken over with other arguments either */
    assert_true(do_finish(st_main, req.key, 2, STORE_STATE_FAILED, NULL, 600000));
    req.lease_ms = 0;
    claim_out_t d = do_claim(st_main, &req);
    assert_true(d.acquired);
    other.takeover_lease_expired = true;
    claim_out_t e = do_claim(st_main, &other);
    assert_false(e.acquired);
    assert_string_equal(e.digest, "digest-A");

    /* once expired, the key is free for anything */
    assert_true(do_finish(st_main, req.key, d.fence, STORE_STATE_SUCCEEDED, "{}", 0));
    claim_out_t f = do_claim(st_main, &other);
    assert_true(f.acquired);
    assert_string_equal(f.digest, "digest-B");
}

static bool dup_counted(void *arg)
{
    (void)arg;
    return strcmp(sql1(db_conninfo, "SELECT attempts FROM idem_keys WHERE key = 't:charge:h:dup'"),
                  "3") == 0;
}

static void test_duplicate_and_get(void **state)
{
    (void)state;
    get_out_t none = do_get(st_main, "t:charge:h:absent");
    assert_false(none.found);

    store_claim_req_t req = req_for("t:charge:h:dup", "d1");
    (void)do_claim(st_main, &req);
    finish_out_t o = {0};
    assert_int_equal(store_note_duplicate(st_main, req.key, finish_cb, &o), STORE_OK);
    assert_true(wait_for(flag_set, &o.done, 10000));
    assert_true(o.matched);
    /* cb may be NULL; calls on different pool connections are not ordered, so wait for the
     * row itself before reading it back */
    assert_int_equal(store_note_duplicate(st_main, req.key, NULL, NULL), STORE_OK);
    assert_true(wait_for(dup_counted, NULL, 10000));
    get_out_t g = do_get(st_main, req.key);
    assert_true(g.found);
    assert_int_equal(g.attempts, 3);
    assert_int_equal(g.fence, 1);
    assert_int_equal(g.state, STORE_STATE_IN_PROGRESS);
}

/* ---- operators' calls: release and forget ---- */

/* A row handed to a release or forget callback, copied out. */
typedef struct {
    bool done, found, released;
    store_status_t st;
    store_state_t state;
    int attempts;
    int64_t fence;
    char result[128];
    char created_at[40], finished_at[40], lease_until[40], expires_at[40];
    bool finished;
} op_row_t;

static void copy_row(op_row_t *o, store_status_t st, const store_row_t *row)
{
    o->done = true;
    o->st = st;
    o->found = row != NULL;
    if (!row)
        return;
    o->state = row->state;
    o->attempts = row->attempts;
    o->fence = row->fence;
    snprintf(o->result, sizeof(o->result), "%.*s", (int)row->result_len,
             row->result ? row->result : "");
    snprintf(o->created_at, sizeof(o->created_at), "%s", row->created_at);
    o->finished = row->finished_at != NULL;
    snprintf(o->finished_at, sizeof(o->finished_at), "%s",
             row->finished_at ? row->finished_at : "");
    snprintf(o->lease_until, sizeof(o->lease_until), "%s", row->lease_until);
    snprintf(o->expires_at, sizeof(o->expires_at), "%s", row->expires_at);
}

static void release_cb(store_status_t st, bool released, const store_row_t *row, void *arg)
{
    op_row_t *o = arg;
    copy_row(o, st, row);
    o->released = released;
}

static void forget_cb(store_status_t st, const store_row_t *row, void *arg)
{
    copy_row(arg, st, row);
}

static op_row_t do_release(store_t *s, const char *key)
{
    op_row_t o;
    memset(&o, 0, sizeof(o));
    assert_int_equal(store_release(s, key, release_cb, &o), STORE_OK);
    assert_false(o.done); /* never called back from inside the call */
    assert_true(wait_for(flag_set, &o.done, 10000));
    assert_int_equal(o.st, STORE_OK);
    return o;
}

static op_row_t do_forget(store_t *s, const char *key)
{
    op_row_t o;
    memset(&o, 0, sizeof(o));
    assert_int_equal(store_forget(s, key, forget_cb, &o), STORE_OK);
    assert_false(o.done);
    assert_true(wait_for(flag_set, &o.done, 10000));
    assert_int_equal(o.st, STORE_OK);
    return o;
}

/* A timestamp as the store prints it: 2025-01-01T00:00:00.000Z. */
static void assert_iso(const char *ts)
{
    assert_int_equal(strlen(ts), 24);
    assert_int_equal(ts[10], 'T');
    assert_int_equal(ts[23], 'Z');
}

/* Release turns a held outcome into a runnable one, once, and leaves anything else alone. */
static void test_release(void **state)
{
    (void)state;
    op_row_t none = do_release(st_main, "t:charge:h:release-absent");
    assert_false(none.found);
    assert_false(none.released);

    store_claim_req_t req = req_for("t:charge:h:release", "d1");
    claim_out_t a = do_claim(st_main, &req);
    assert_true(a.acquired);
    /* in progress with its lease running: not released */
    op_row_t live = do_release(st_main, req.key);
    assert_true(live.found);
    assert_false(live.released);
    assert_int_equal(live.state, STORE_STATE_IN_PROGRESS);
    assert_false(live.finished);
    assert_iso(live.lease_until);

    assert_true(do_finish(st_main, req.key, a.fence, STORE_STATE_UNKNOWN, NULL, 600000));
    op_row_t r = do_release(st_main, req.key);
    assert_true(r.released);
    assert_int_equal(r.state, STORE_STATE_UNKNOWN); /* the row as it was */
    assert_int_equal(r.fence, 1);
    assert_true(r.finished);
    assert_iso(r.finished_at);
    assert_iso(r.expires_at);
    get_out_t g = do_get(st_main, req.key);
    assert_int_equal(g.state, STORE_STATE_FAILED);
    assert_int_equal(g.fence, 2);
    /* the old claim's late finish cannot land */
    assert_false(do_finish(st_main, req.key, 1, STORE_STATE_SUCCEEDED, "{}", 600000));
    op_row_t again = do_release(st_main, req.key);
    assert_false(again.released);
    assert_int_equal(again.state, STORE_STATE_FAILED);

    /* the next identical call takes it over and runs; a success is never released */
    claim_out_t b = do_claim(st_main, &req);
    assert_true(b.acquired);
    assert_true(b.taken_over);
    assert_int_equal(b.fence, 3);
    assert_true(do_finish(st_main, req.key, b.fence, STORE_STATE_SUCCEEDED, "{\"ok\":1}", 600000));
    op_row_t done = do_release(st_main, req.key);
    assert_false(done.released);
    assert_int_equal(done.state, STORE_STATE_SUCCEEDED);
    assert_int_equal(do_get(st_main, req.key).state, STORE_STATE_SUCCEEDED);

    /* a claim whose lease ran out (its gateway died) is released too */
    store_claim_req_t lost = req_for("t:charge:h:release-lease", "d1");
    lost.lease_ms = 0;
    assert_true(do_claim(st_main, &lost).acquired);
    op_row_t l = do_release(st_main, lost.key);
    assert_true(l.released);
    assert_int_equal(l.state, STORE_STATE_IN_PROGRESS);
    assert_int_equal(do_get(st_main, lost.key).state, STORE_STATE_FAILED);
}

/* ---- the operator queue (store_queue.h) ---- */

typedef struct {
    bool done;
    store_status_t st;
    store_queue_answer_t a;
    json_t *body;
} queue_out_t;

static void queue_cb(store_status_t st, store_queue_answer_t a, const json_t *body, void *arg)
{
    queue_out_t *o = arg;
    o->done = true;
    o->st = st;
    o->a = a;
    o->body = body ? json_incref((json_t *)body) : NULL;
}

static queue_out_t queue_wait(queue_out_t *o)
{
    assert_false(o->done); /* never called back from inside the call */
    assert_true(wait_for(flag_set, &o->done, 10000));
    assert_int_equal(o->st, STORE_OK);
    return *o;
}

static queue_out_t q_list(store_queue_state_t state, int limit, const char *cursor)
{
    queue_out_t o = {0};
    store_queue_filter_t f = {.state = state, .server = "qsrv", .limit = limit, .cursor = cursor};
    assert_int_equal(store_queue_list(st_main, &f, queue_cb, &o), STORE_OK);
    return queue_wait(&o);
}

static queue_out_t q_resolve(const char *hash, store_queue_outcome_t outcome, const json_t *result)
{
    queue_out_t o = {0};
    store_queue_resolve_t r = {.key_hash = hash,
                               .outcome = outcome,
                               .result = result,
                               .actor = "tester",
                               .note = "checked downstream"};
    assert_int_equal(store_queue_resolve(st_main, &r, queue_cb, &o), STORE_OK);
    return queue_wait(&o);
}

static queue_out_t q_show(const char *hash)
{
    queue_out_t o = {0};
    assert_int_equal(store_queue_show(st_main, hash, queue_cb, &o), STORE_OK);
    return queue_wait(&o);
}

/* Returns once the wall clock has moved on to a new millisecond. */
static void next_ms(void)
{
    uint64_t now = util_wall_ms();
    while (util_wall_ms() == now)
        ;
}

static const char *entry_str(const json_t *e, const char *name)
{
    return json_string_value(json_object_get(e, name));
}

static void test_operator_queue(void **state)
{
    (void)state;
    char h_unknown[65], h_live[65], h_stuck[65];
    store_claim_req_t unknown = req_for("t:qsrv/qtool:h:unknown", "d1");
    unknown.tool = "qsrv/qtool";
    store_claim_req_t live = req_for("t:qsrv/qtool:h:live", "d1");
    live.tool = "qsrv/qtool";
    store_claim_req_t stuck = req_for("t:qsrv/other:h:stuck", "d1");
    stuck.tool = "qsrv/other";
    stuck.lease_ms = 0;
    key_hash_hex(unknown.key, h_unknown);
    key_hash_hex(live.key, h_live);
    key_hash_hex(stuck.key, h_stuck);
    claim_out_t a = do_claim(st_main, &unknown);
    assert_true(do_finish(st_main, unknown.key, a.fence, STORE_STATE_UNKNOWN, NULL, 600000));
    /* the list is newest first by the millisecond a key was created: one each */
    next_ms();
    assert_true(do_claim(st_main, &live).acquired);
    next_ms();
    assert_true(do_claim(st_main, &stuck).acquired);

    /* listed by state, and by server and tool */
    queue_out_t l = q_list(STORE_QUEUE_STATE_UNKNOWN, 0, NULL);
    assert_int_equal(json_array_size(json_object_get(l.body, "keys")), 1);
    const json_t *e = json_array_get(json_object_get(l.body, "keys"), 0);
    assert_string_equal(entry_str(e, "key_hash"), h_unknown);
    assert_string_equal(entry_str(e, "server"), "qsrv");
    assert_string_equal(entry_str(e, "tool"), "qtool");
    assert_string_equal(entry_str(e, "subject"), "tenant-a");
    assert_string_equal(entry_str(e, "state"), "unknown");
    assert_null(json_object_get(e, "key")); /* the key carries the subject: never answered */
    json_decref(l.body);
    l = q_list(STORE_QUEUE_STATE_STUCK, 0, NULL);
    assert_int_equal(json_array_size(json_object_get(l.body, "keys")), 1);
    assert_string_equal(entry_str(json_array_get(json_object_get(l.body, "keys"), 0), "key_hash"),
                        h_stuck);
    json_decref(l.body);
    /* open: unknown and stuck, newest first, a page at a time */
    l = q_list(STORE_QUEUE_STATE_OPEN, 1, NULL);
    assert_int_equal(json_array_size(json_object_get(l.body, "keys")), 1);
    assert_string_equal(entry_str(json_array_get(json_object_get(l.body, "keys"), 0), "key_hash"),
                        h_stuck);
    char *next = xstrdup(entry_str(l.body, "next"));
    json_decref(l.body);
    l = q_list(STORE_QUEUE_STATE_OPEN, 1, next);
    free(next);
    assert_string_equal(entry_str(json_array_get(json_object_get(l.body, "keys"), 0), "key_hash"),
                        h_unknown);
    json_decref(l.body);
    queue_out_t all = q_list(STORE_QUEUE_STATE_ANY, 0, NULL);
    assert_int_equal(json_array_size(json_object_get(all.body, "keys")), 3);
    json_decref(all.body);

    /* shown by a prefix */
    char prefix[11];
    snprintf(prefix, sizeof(prefix), "%.10s", h_unknown);
    queue_out_t sh = q_show(prefix);
    assert_int_equal(sh.a, STORE_QUEUE_OK);
    assert_string_equal(entry_str(sh.body, "state"), "unknown");
    assert_int_equal(json_array_size(json_object_get(sh.body, "actions")), 0);
    json_decref(sh.body);
    queue_out_t bad = q_show("xyz123");
    assert_int_equal(bad.a, STORE_QUEUE_INVALID);
    json_decref(bad.body);

    /* a live claim is not resolved */
    queue_out_t c = q_resolve(h_live, STORE_QUEUE_FAILED, NULL);
    assert_int_equal(c.a, STORE_QUEUE_CONFLICT);
    assert_string_equal(entry_str(c.body, "state"), "in_progress");
    json_decref(c.body);

    /* the unknown key resolved as succeeded: the next claim finds the operator's result */
    json_t *result =
        json_pack("{s:[{s:s,s:s}]}", "content", "type", "text", "text", "done by hand");
    queue_out_t r = q_resolve(prefix, STORE_QUEUE_SUCCEEDED, result);
    json_decref(result);
    assert_int_equal(r.a, STORE_QUEUE_OK);
    assert_string_equal(entry_str(r.body, "previous_state"), "unknown");
    assert_string_equal(entry_str(r.body, "by"), "tester");
    json_decref(r.body);
    claim_out_t again = do_claim(st_main, &unknown);
    assert_false(again.acquired);
    assert_int_equal(again.state, STORE_STATE_SUCCEEDED);
    json_t *stored = json_loadb(again.result, again.result_len, 0, NULL);
    free(again.result);
    const json_t *op = json_object_get(json_object_get(stored, "_meta"), STORE_QUEUE_META_OPERATOR);
    assert_string_equal(entry_str(op, "by"), "tester");
    assert_string_equal(entry_str(op, "note"), "checked downstream");
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(json_object_get(stored, "content"), 0), "text")),
                        "done by hand");
    json_decref(stored);
    c = q_resolve(h_unknown, STORE_QUEUE_FAILED, NULL);
    assert_int_equal(c.a, STORE_QUEUE_CONFLICT);
    assert_string_equal(entry_str(c.body, "state"), "succeeded");
    json_decref(c.body);

    /* the stuck claim resolved as failed: the next claim takes it over */
    r = q_resolve(h_stuck, STORE_QUEUE_FAILED, NULL);
    assert_int_equal(r.a, STORE_QUEUE_OK);
    assert_string_equal(entry_str(r.body, "previous_state"), "in_progress");
    json_decref(r.body);
    stuck.lease_ms = 30000;
    claim_out_t t = do_claim(st_main, &stuck);
    assert_true(t.acquired);
    assert_true(t.taken_over);

    /* forget deletes the row; its actions stay */
    assert_true(do_finish(st_main, stuck.key, t.fence, STORE_STATE_UNKNOWN, NULL, 600000));
    r = q_resolve(h_stuck, STORE_QUEUE_FORGET, NULL);
    assert_int_equal(r.a, STORE_QUEUE_OK);
    json_decref(r.body);
    assert_false(do_get(st_main, stuck.key).found);
    queue_out_t gone = q_show(h_stuck);
    assert_int_equal(gone.a, STORE_QUEUE_NOT_FOUND);
    json_decref(gone.body);

    sh = q_show(h_unknown);
    const json_t *acts = json_object_get(sh.body, "actions");
    assert_int_equal(json_array_size(acts), 1);
    assert_string_equal(entry_str(json_array_get(acts, 0), "outcome"), "succeeded");
    assert_string_equal(entry_str(json_array_get(acts, 0), "by"), "tester");
    assert_non_null(json_object_get(sh.body, "result"));
    json_decref(sh.body);

    /* the summary counts what is left unknown (none of qsrv's) and every resolution */
    queue_out_t sum = {0};
    assert_int_equal(store_queue_summary(st_main, queue_cb, &sum), STORE_OK);
    queue_wait(&sum);
    size_t i;
    json_t *u;
    json_array_foreach(json_object_get(sum.body, "unknown"), i, u)
        assert_null(strstr(entry_str(u, "tool"), "qsrv/"));
    int64_t resolved = 0;
    json_array_foreach(json_object_get(sum.body, "resolutions"), i, u) resolved +=
        json_integer_value(json_object_get(u, "count"));
    assert_int_equal(resolved, 3);
    json_decref(sum.body);
}

/* Forget deletes the row whatever its state and hands back what it was. */
static void test_forget(void **state)
{
    (void)state;
    op_row_t none = do_forget(st_main, "t:charge:h:forget-absent");
    assert_false(none.found);

    store_claim_req_t req = req_for("t:charge:h:forget", "d1");
    claim_out_t a = do_claim(st_main, &req);
    assert_true(do_finish(st_main, req.key, a.fence, STORE_STATE_SUCCEEDED, "{\"n\":7}", 600000));
    claim_out_t b = do_claim(st_main, &req);
    assert_false(b.acquired);
    free(b.result);
    op_row_t f = do_forget(st_main, req.key);
    assert_true(f.found);
    assert_int_equal(f.state, STORE_STATE_SUCCEEDED);
    assert_int_equal(f.fence, 1);
    assert_int_equal(f.attempts, 1);
    assert_string_equal(f.result, "{\"n\":7}");
    assert_string_equal(f.created_at, a.created_at);
    assert_iso(f.finished_at);
    assert_iso(f.expires_at);
    assert_false(do_get(st_main, req.key).found);
    assert_false(do_forget(st_main, req.key).found);

    /* the next identical call runs as if never seen */
    claim_out_t c = do_claim(st_main, &req);
    assert_true(c.acquired);
    assert_false(c.taken_over);
    assert_int_equal(c.attempts, 1);

    /* any state: in progress and unknown rows go too */
    op_row_t p = do_forget(st_main, req.key);
    assert_true(p.found);
    assert_int_equal(p.state, STORE_STATE_IN_PROGRESS);
    assert_false(p.finished);
    claim_out_t d = do_claim(st_main, &req);
    assert_true(do_finish(st_main, req.key, d.fence, STORE_STATE_UNKNOWN, NULL, 600000));
    assert_int_equal(do_forget(st_main, req.key).state, STORE_STATE_UNKNOWN);
    assert_false(do_get(st_main, req.key).found);
}

/* ---- pipelining: many ops in flight on one connection ---- */

#define PIPE_KEYS 40 /* 4 ops per key: 160 ops, several pipelines' worth */

typedef struct {
    int seq; /* completion order, 1-based; 0 = not yet */
    store_status_t st;
    bool acquired, found, matched;
    int64_t fence;
    store_state_t state;
} pipe_out_t;

static int pipe_seq;
static pipe_out_t pipe_outs[PIPE_KEYS * 4];

static void pipe_claim_cb(store_status_t st, const store_claim_result_t *res, void *arg)
{
    pipe_out_t *o = arg;
    o->seq = ++pipe_seq;
    o->st = st;
    if (res) {
        o->acquired = res->acquired;
        o->fence = res->fence;
        o->state = res->row.state;
    }
}

static void pipe_get_cb(store_status_t st, const store_row_t *row, void *arg)
{
    pipe_out_t *o = arg;
    o->seq = ++pipe_seq;
    o->st = st;
    o->found = row != NULL;
    if (row) {
        o->fence = row->fence;
        o->state = row->state;
    }
}

static void pipe_finish_cb(store_status_t st, bool matched, void *arg)
{
    pipe_out_t *o = arg;
    o->seq = ++pipe_seq;
    o->st = st;
    o->matched = matched;
}

static bool pipe_all_done(void *arg)
{
    int n = *(int *)arg;
    for (int i = 0; i < n; i++)
        if (!pipe_outs[i].seq)
            return false;
    return true;
}

static void test_pipeline_in_order(void **state)
{
    (void)state;
    /* one connection: every op goes through the same pipeline, and each sees the effects of
     * the ops sent before it (each is its own transaction, committed at its sync) */
    store_t *s = open_other(1, 0, 0);
    memset(pipe_outs, 0, sizeof(pipe_outs));
    pipe_seq = 0;
    for (int i = 0; i < PIPE_KEYS; i++) {
        char key[64];
        snprintf(key, sizeof(key), "t:pipe:h:%d", i);
        store_claim_req_t req = req_for(key, "d1");
        pipe_out_t *o = &pipe_outs[i * 4];
        assert_int_equal(store_claim(s, &req, pipe_claim_cb, &o[0]), STORE_OK);
        assert_int_equal(store_get(s, key, pipe_get_cb, &o[1]), STORE_OK);
        store_finish_req_t fin = {.key = key,
                                  .fence = 1,
                                  .state = STORE_STATE_SUCCEEDED,
                                  .result = "{}",
                                  .result_len = 2,
                                  .window_ms = 600000};
        assert_int_equal(store_finish(s, &fin, pipe_finish_cb, &o[2]), STORE_OK);
        assert_int_equal(store_get(s, key, pipe_get_cb, &o[3]), STORE_OK);
    }
    assert_int_equal(pipe_seq, 0); /* never called back from inside the calls */
    int n = PIPE_KEYS * 4;
    assert_true(wait_for(pipe_all_done, &n, 20000));
    for (int i = 0; i < PIPE_KEYS; i++) {
        pipe_out_t *o = &pipe_outs[i * 4];
        /* each key's calls in the order made; claims queued together may answer before an
         * earlier call on another key (group commit) */
        for (int j = 0; j < 4; j++) {
            assert_int_equal(o[j].st, STORE_OK);
            if (j > 0)
                assert_true(o[j].seq > o[j - 1].seq);
        }
        assert_true(o[0].acquired);
        assert_int_equal(o[0].fence, 1);
        assert_true(o[1].found);
        assert_int_equal(o[1].state, STORE_STATE_IN_PROGRESS);
        assert_true(o[2].matched);
        assert_true(o[3].found);
        assert_int_equal(o[3].state, STORE_STATE_SUCCEEDED);
    }
    close_other(s);
}

static void test_pipeline_error_fails_one(void **state)
{
    (void)state;
    /* a key that is not valid UTF-8 fails its statement when the server binds it (the test
     * clusters are UTF8); the ops around it in the same pipeline are unaffected */
    if (backend == BACKEND_SQLITE)
        skip(); /* SQLite keeps any bytes as text: no such statement error */
    store_t *s = open_store(db_conninfo, 1, true, 0, 0);
    memset(pipe_outs, 0, sizeof(pipe_outs));
    pipe_seq = 0;
    store_claim_req_t a = req_for("t:pipe:err:a", "d1");
    store_claim_req_t b = req_for("t:pipe:err:b", "d1");
    assert_int_equal(store_claim(s, &a, pipe_claim_cb, &pipe_outs[0]), STORE_OK);
    assert_int_equal(store_get(s, "t:pipe:err:a", pipe_get_cb, &pipe_outs[1]), STORE_OK);
    assert_int_equal(store_get(s, "t:pipe:err:\xff\xfe", pipe_get_cb, &pipe_outs[2]), STORE_OK);
    assert_int_equal(store_claim(s, &b, pipe_claim_cb, &pipe_outs[3]), STORE_OK);
    assert_int_equal(store_get(s, "t:pipe:err:b", pipe_get_cb, &pipe_outs[4]), STORE_OK);
    int n = 5;
    assert_true(wait_for(pipe_all_done, &n, 10000));
    for (int i = 0; i < n; i++)
        assert_int_equal(pipe_outs[i].seq, i + 1);
    assert_int_equal(pipe_outs[0].st, STORE_OK);
    assert_true(pipe_outs[0].acquired);
    assert_int_equal(pipe_outs[1].st, STORE_OK);
    assert_true(pipe_outs[1].found);
    assert_int_equal(pipe_outs[2].st, STORE_ERR_STATEMENT);
    assert_int_equal(pipe_outs[3].st, STORE_OK);
    assert_true(pipe_outs[3].acquired);
    assert_int_equal(pipe_outs[4].st, STORE_OK);
    assert_true(pipe_outs[4].found);
    /* the connection is still up and serves the next call */
    store_stats_t stats;
    store_get_stats(s, &stats);
    assert_int_equal(stats.connections_up, 1);
    assert_int_equal(stats.connects, 1);
    assert_true(do_get(s, "t:pipe:err:b").found);
    store_free(s);
}

/* ---- duplicates: counted in memory, written in batches ---- */

static const char *attempts_of(const char *key)
{
    char *sql = xasprintf("SELECT attempts FROM idem_keys WHERE key = '%s'", key);
    const char *v = sql1(db_conninfo, sql);
    free(sql);
    return v;
}

typedef struct {
    const char *key;
    const char *want;
} attempts_want_t;

static bool attempts_are(void *arg)
{
    for (const attempts_want_t *w = arg; w->key; w++)
        if (strcmp(attempts_of(w->key), w->want) != 0)
            return false;
    return true;
}

static void test_duplicates_batched(void **state)
{
    (void)state;
    /* keys with a double quote and a backslash: they travel inside an array literal */
    const char *keys[] = {"t:dupb:h:one", "t:dupb:h:q\"uo\\te", "t:dupb:h:other"};
    for (int k = 0; k < 3; k++) {
        store_claim_req_t req = req_for(keys[k], "d1");
        (void)do_claim(st_main, &req);
    }
    finish_out_t o = {0};
    for (int i = 0; i < 40; i++)
        assert_int_equal(store_note_duplicate(st_main, keys[0], NULL, NULL), STORE_OK);
    for (int i = 0; i < 7; i++)
        assert_int_equal(store_note_duplicate(st_main, keys[1], NULL, NULL), STORE_OK);
    assert_int_equal(store_note_duplicate(st_main, keys[2], finish_cb, &o), STORE_OK);
    assert_false(o.done); /* never called back from inside the call */
    assert_true(wait_for(flag_set, &o.done, 10000));
    assert_int_equal(o.st, STORE_OK);
    assert_true(o.matched);
    attempts_want_t want[] = {{keys[0], "41"}, {keys[1], "8"}, {keys[2], "2"}, {NULL, NULL}};
    assert_true(wait_for(attempts_are, want, 10000));
    get_out_t g = do_get(st_main, keys[0]);
    assert_int_equal(g.attempts, 41);
    assert_int_equal(g.state, STORE_STATE_IN_PROGRESS);
    assert_int_equal(g.fence, 1);

    /* a key without a row is skipped; the others in the batch still count */
    assert_int_equal(store_note_duplicate(st_main, "t:dupb:h:absent", NULL, NULL), STORE_OK);
    assert_int_equal(store_note_duplicate(st_main, keys[2], NULL, NULL), STORE_OK);
    attempts_want_t want2[] = {{keys[2], "3"}, {NULL, NULL}};
    assert_true(wait_for(attempts_are, want2, 10000));
    assert_false(do_get(st_main, "t:dupb:h:absent").found);

    /* counts still in memory are written by store_free, before it returns */
    store_t *s = open_other(1, 0, 0);
    for (int i = 0; i < 5; i++)
        assert_int_equal(store_note_duplicate(s, keys[0], NULL, NULL), STORE_OK);
    store_free(s);
    assert_string_equal(attempts_of(keys[0]), "46");
    if (backend == BACKEND_SQLITE)
        st_main = open_store(db_conninfo, 4, true, 0, 0);
}

/* A row's duplicates, copied out of get's callback. */
typedef struct {
    bool done, found;
    store_status_t st;
    int answers[STORE_DUP_ANSWERS_];
    int sources[DUP_SOURCE_N];
    json_t *history;
} dups_out_t;

static void dups_cb(store_status_t st, const store_row_t *row, void *arg)
{
    dups_out_t *o = arg;
    o->done = true;
    o->st = st;
    o->found = row != NULL;
    if (!row)
        return;
    memcpy(o->answers, row->dup_answers, sizeof(o->answers));
    memcpy(o->sources, row->dup_sources, sizeof(o->sources));
    o->history = row->dup_history ? json_loads(row->dup_history, 0, NULL) : NULL;
}

static dups_out_t do_get_dups(const char *key)
{
    dups_out_t o;
    memset(&o, 0, sizeof(o));
    assert_int_equal(store_get(st_main, key, dups_cb, &o), STORE_OK);
    assert_true(wait_for(flag_set, &o.done, 10000));
    assert_int_equal(o.st, STORE_OK);
    assert_true(o.found);
    assert_true(json_is_array(o.history));
    return o;
}

static store_dup_t dup_n(const char *key, int i)
{
    static char ids[64][16];
    snprintf(ids[i % 64], sizeof(ids[0]), "\"r-%d\"", i);
    store_dup_t d = {
        .key = key,
        .answered = (store_dup_answer_t)(i % STORE_DUP_ANSWERS_),
        .source = (dup_source_t)(i % DUP_SOURCE_N),
        .at_ms = UINT64_C(1764800000000) + (uint64_t)i,
        .gap_ms = (uint64_t)i * 10,
        .jsonrpc_id = ids[i % 64],
        .session_id = i % 2 ? "sess-odd" : NULL,
    };
    return d;
}

/* Each duplicate's answer, source and facts land on the row in the batched write: exact counts,
 * the last STORE_DUP_HISTORY_MAX in order across writes, attempts grown by the replays only; a
 * new life of the row starts them again. */
static void test_duplicate_history(void **state)
{
    (void)state;
    const char *key = "t:hist:h:one";
    store_claim_req_t req = req_for(key, "d1");
    req.tool = "history_tool";
    claim_out_t c = do_claim(st_main, &req);
    assert_true(c.acquired);
    assert_true(do_finish(st_main, key, c.fence, STORE_STATE_SUCCEEDED, "{\"ok\":1}", 600000));
    int replays = 0;
    for (int i = 0; i < 10; i++) {
        store_dup_t d = dup_n(key, i);
        replays += d.answered == STORE_DUP_REPLAY;
        assert_int_equal(store_record_duplicate(st_main, &d, NULL, NULL), STORE_OK);
    }
    char want[16];
    snprintf(want, sizeof(want), "%d", 1 + replays);
    attempts_want_t w1[] = {{key, want}, {NULL, NULL}};
    assert_true(wait_for(attempts_are, w1, 10000));
    /* the second write appends to the first's history and drops the oldest */
    for (int i = 10; i < 21; i++) {
        store_dup_t d = dup_n(key, i);
        replays += d.answered == STORE_DUP_REPLAY;
        assert_int_equal(store_record_duplicate(st_main, &d, NULL, NULL), STORE_OK);
    }
    /* an id cut at STORE_DUP_ID_MAX bytes, not inside a character */
    char long_id[STORE_DUP_ID_MAX + 8];
    memset(long_id, 'a', sizeof(long_id));
    memcpy(long_id + STORE_DUP_ID_MAX - 1, "\xc3\xa9", 2);
    long_id[sizeof(long_id) - 1] = '\0';
    store_dup_t last = dup_n(key, 21);
    last.session_id = long_id;
    replays += last.answered == STORE_DUP_REPLAY;
    assert_int_equal(store_record_duplicate(st_main, &last, NULL, NULL), STORE_OK);
    snprintf(want, sizeof(want), "%d", 1 + replays);
    attempts_want_t w2[] = {{key, want}, {NULL, NULL}};
    assert_true(wait_for(attempts_are, w2, 10000));

    dups_out_t o = do_get_dups(key);
    int total = 0;
    for (int a = 0; a < STORE_DUP_ANSWERS_; a++) {
        int n = 0;
        for (int i = 0; i < 22; i++)
            n += i % STORE_DUP_ANSWERS_ == a;
        assert_int_equal(o.answers[a], n);
        total += o.answers[a];
    }
    assert_int_equal(total, 22);
    for (int src = 0; src < DUP_SOURCE_N; src++) {
        int n = 0;
        for (int i = 0; i < 22; i++)
            n += i % DUP_SOURCE_N == src;
        assert_int_equal(o.sources[src], n);
    }
    assert_int_equal(json_array_size(o.history), STORE_DUP_HISTORY_MAX);
    for (size_t i = 0; i < STORE_DUP_HISTORY_MAX; i++) {
        int n = (int)i + 22 - STORE_DUP_HISTORY_MAX;
        json_t *e = json_array_get(o.history, i);
        store_dup_t d = dup_n(key, n);
        assert_string_equal(json_string_value(json_object_get(e, "source")),
                            dup_source_name(d.source));
        assert_string_equal(json_string_value(json_object_get(e, "answered")),
                            store_dup_answer_str(d.answered));
        assert_string_equal(json_string_value(json_object_get(e, "jsonrpc_id")), d.jsonrpc_id);
        assert_int_equal(json_integer_value(json_object_get(e, "gap_ms")), n * 10);
        char at[UTIL_ISO_LEN + 1];
        util_iso_utc_ms((int64_t)d.at_ms, at);
        assert_string_equal(json_string_value(json_object_get(e, "at")), at);
        if (n == 21) {
            const char *sess = json_string_value(json_object_get(e, "session_id"));
            assert_int_equal(strlen(sess), STORE_DUP_ID_MAX - 1);
        } else if (n % 2) {
            assert_string_equal(json_string_value(json_object_get(e, "session_id")), "sess-odd");
        } else {
            assert_true(json_is_null(json_object_get(e, "session_id")));
        }
    }
    json_decref(o.history);

    /* the window ends: the next claim starts a new life, without the old duplicates */
    assert_true(do_finish(st_main, key, c.fence, STORE_STATE_SUCCEEDED, "{\"ok\":1}", 0));
    c = do_claim(st_main, &req);
    assert_true(c.acquired);
    assert_int_equal(c.attempts, 1);
    o = do_get_dups(key);
    for (int a = 0; a < STORE_DUP_ANSWERS_; a++)
        assert_int_equal(o.answers[a], 0);
    for (int src = 0; src < DUP_SOURCE_N; src++)
        assert_int_equal(o.sources[src], 0);
    assert_int_equal(json_array_size(o.history), 0);
    json_decref(o.history);
}

typedef struct {
    bool done;
    store_status_t st;
    store_report_tool_t tool; /* the tool asked for; tool.tool NULL when absent */
    char key0[64];            /* the first of the top keys */
    int key0_attempts, key0_dups;
    size_t n_top, n_tools;
    const char *want_tool;
    const char *prefix; /* the report's tool_prefix: every tool and top key must start with it */
    bool off_prefix;    /* one did not */
} report_out_t;

static void report_cb(store_status_t st, const store_report_t *rep, void *arg)
{
    report_out_t *o = arg;
    o->done = true;
    o->st = st;
    if (!rep)
        return;
    if (rep->n_tools) /* Postgres reads its clock off the rows: none, no clock */
        assert_non_null(rep->now);
    size_t plen = o->prefix ? strlen(o->prefix) : 0;
    for (size_t i = 0; i < rep->n_tools; i++)
        o->off_prefix |= strncmp(rep->tools[i].tool, o->prefix ? o->prefix : "", plen) != 0;
    for (size_t i = 0; i < rep->n_top; i++)
        o->off_prefix |= strncmp(rep->top[i].tool, o->prefix ? o->prefix : "", plen) != 0;
    o->n_tools = rep->n_tools;
    for (size_t i = 0; i < rep->n_tools; i++) {
        if (strcmp(rep->tools[i].tool, o->want_tool) == 0) {
            o->tool = rep->tools[i];
            o->tool.tool = o->want_tool;
        }
    }
    o->n_top = rep->n_top;
    if (rep->n_top) {
        snprintf(o->key0, sizeof(o->key0), "%s", rep->top[0].key);
        o->key0_attempts = rep->top[0].attempts;
        o->key0_dups = rep->top[0].duplicates;
    }
}

/* The report adds the rows up per tool and names the keys with the most calls. */
static void test_report(void **state)
{
    (void)state;
    const char *keys[] = {"t:rep:h:a", "t:rep:h:b", "t:rep:h:c"};
    for (int k = 0; k < 3; k++) {
        store_claim_req_t req = req_for(keys[k], "d1");
        req.tool = "report_tool";
        claim_out_t c = do_claim(st_main, &req);
        if (k < 2)
            assert_true(do_finish(st_main, keys[k], c.fence, STORE_STATE_SUCCEEDED, "{}", 600000));
    }
    /* b: 3 replays, 1 unknown answer; c (in progress): 2 in-progress answers */
    store_dup_t d = {.key = keys[1], .answered = STORE_DUP_REPLAY, .source = DUP_HARNESS};
    for (int i = 0; i < 3; i++)
        assert_int_equal(store_record_duplicate(st_main, &d, NULL, NULL), STORE_OK);
    d.answered = STORE_DUP_UNKNOWN;
    d.source = DUP_TRANSPORT;
    assert_int_equal(store_record_duplicate(st_main, &d, NULL, NULL), STORE_OK);
    d.key = keys[2];
    d.answered = STORE_DUP_IN_PROGRESS;
    d.source = DUP_RECONNECT;
    for (int i = 0; i < 2; i++)
        assert_int_equal(store_record_duplicate(st_main, &d, NULL, NULL), STORE_OK);
    attempts_want_t w[] = {{keys[1], "4"}, {NULL, NULL}};
    assert_true(wait_for(attempts_are, w, 10000));
    /* the in-progress answers are written by the same statement as b's replays */
    report_out_t o = {.want_tool = "report_tool"};
    assert_int_equal(store_report(st_main, 3600 * 1000, 100, NULL, report_cb, &o), STORE_OK);
    assert_false(o.done);
    assert_true(wait_for(flag_set, &o.done, 10000));
    assert_int_equal(o.st, STORE_OK);
    assert_non_null(o.tool.tool);
    assert_int_equal(o.tool.keys, 3);
    assert_int_equal(o.tool.runs, 3);
    assert_int_equal(o.tool.calls, 3 + 3 + 1 + 2);
    assert_int_equal(o.tool.dup_answers[STORE_DUP_REPLAY], 3);
    assert_int_equal(o.tool.dup_answers[STORE_DUP_UNKNOWN], 1);
    assert_int_equal(o.tool.dup_answers[STORE_DUP_IN_PROGRESS], 2);
    assert_int_equal(o.tool.dup_sources[DUP_HARNESS], 3);
    assert_int_equal(o.tool.dup_sources[DUP_TRANSPORT], 1);
    assert_int_equal(o.tool.dup_sources[DUP_RECONNECT], 2);
    assert_int_equal(o.tool.states[STORE_STATE_SUCCEEDED], 2);
    assert_int_equal(o.tool.states[STORE_STATE_IN_PROGRESS], 1);
    /* earlier cases' rows have more attempts; b has 5 calls, the most of this case's keys */
    report_out_t top = {.want_tool = "report_tool"};
    assert_int_equal(store_report(st_main, 0, 1, NULL, report_cb, &top), STORE_OK);
    assert_true(wait_for(flag_set, &top.done, 10000));
    assert_int_equal(top.st, STORE_OK);
    assert_int_equal(top.n_top, 1);
    assert_true(top.key0_attempts + top.key0_dups >= 5);

    /* a tool prefix (one server's rows, key_scoped_tool) is compared byte for byte: '_' is no
     * wildcard, so a_b/ is not axb/ */
    const char *scoped[][2] = {{"t:a_b/rep:h:a", "a_b/report_tool"},
                               {"t:axb/rep:h:a", "axb/report_tool"}};
    for (int k = 0; k < 2; k++) {
        store_claim_req_t req = req_for(scoped[k][0], "d1");
        req.tool = scoped[k][1];
        claim_out_t c = do_claim(st_main, &req);
        assert_true(do_finish(st_main, scoped[k][0], c.fence, STORE_STATE_SUCCEEDED, "{}", 600000));
    }
    report_out_t one = {.want_tool = "a_b/report_tool", .prefix = "a_b/"};
    assert_int_equal(store_report(st_main, 0, 100, "a_b/", report_cb, &one), STORE_OK);
    assert_true(wait_for(flag_set, &one.done, 10000));
    assert_int_equal(one.st, STORE_OK);
    assert_int_equal(one.n_tools, 1);
    assert_int_equal(one.tool.keys, 1);
    assert_int_equal(one.n_top, 1);
    assert_string_equal(one.key0, scoped[0][0]);
    assert_false(one.off_prefix);
    report_out_t none = {.want_tool = "report_tool", .prefix = "nobody/"};
    assert_int_equal(store_report(st_main, 0, 100, "nobody/", report_cb, &none), STORE_OK);
    assert_true(wait_for(flag_set, &none.done, 10000));
    assert_int_equal(none.st, STORE_OK);
    assert_int_equal(none.n_tools, 0);
    assert_int_equal(none.n_top, 0);
}

#define CONCURRENT 50

static int outstanding(claim_out_t *outs)
{
    int n = 0;
    for (int i = 0; i < CONCURRENT; i++)
        n += !outs[i].done;
    return n;
}

static bool all_done(void *arg)
{
    return outstanding(arg) == 0;
}

static void test_concurrent_two_stores(void **state)
{
    (void)state;
    /* SQLite: one store per file, so the claims race inside one store's batches instead */
    store_t *other = backend == BACKEND_SQLITE ? st_main : open_store(db_conninfo, 4, true, 0, 0);
    static claim_out_t outs[CONCURRENT];
    memset(outs, 0, sizeof(outs));
    for (int round = 0; round < 3; round++) {
        char key[64];
        snprintf(key, sizeof(key), "t:charge:h:race-%d", round);
        store_claim_req_t req = req_for(key, "d1");
        memset(outs, 0, sizeof(outs));
        for (int i = 0; i < CONCURRENT; i++)
            assert_int_equal(store_claim(i % 2 ? other : st_main, &req, claim_cb, &outs[i]),
                             STORE_OK);
        assert_true(wait_for(all_done, outs, 20000));
        int acquired = 0;
        for (int i = 0; i < CONCURRENT; i++) {
            assert_int_equal(outs[i].st, STORE_OK);
            assert_int_equal(outs[i].fence, 1);
            assert_int_equal(outs[i].state, STORE_STATE_IN_PROGRESS);
            acquired += outs[i].acquired;
        }
        assert_int_equal(acquired, 1);
    }
    store_stats_t a, b;
    store_get_stats(st_main, &a);
    store_get_stats(other, &b);
    printf("# concurrent claims: retries after the snapshot corner: %llu\n",
           (unsigned long long)(a.claim_retries + b.claim_retries));
    if (other != st_main)
        store_free(other);
}

/* Group commit: claims and finishes issued at once go out in batches (Postgres); each still
 * gets the answer it would have got alone, in the order made for each key. */
#define GROUP_KEYS 20
static void test_group_commit(void **state)
{
    (void)state;
    store_t *s = open_other(1, 0, 0);
    static claim_out_t outs[CONCURRENT];
    char keys[CONCURRENT][64];
    /* rows to take over: 5 expired (window 0), 5 failed */
    for (int i = 0; i < 10; i++) {
        snprintf(keys[2 * GROUP_KEYS + i], sizeof(keys[0]), "t:group:h:%s-%d",
                 i < 5 ? "expired" : "failed", i);
        store_claim_req_t req = req_for(keys[2 * GROUP_KEYS + i], "d1");
        claim_out_t a = do_claim(s, &req);
        assert_true(a.acquired);
        assert_true(do_finish(s, req.key, 1, i < 5 ? STORE_STATE_SUCCEEDED : STORE_STATE_FAILED,
                              "{}", i < 5 ? 0 : 600000));
    }
    /* 20 new keys, each claimed twice, then the 10 takeovers, all at once */
    memset(outs, 0, sizeof(outs));
    for (int i = 0; i < 2 * GROUP_KEYS; i++)
        snprintf(keys[i], sizeof(keys[0]), "t:group:h:new-%d", i % GROUP_KEYS);
    for (int i = 0; i < CONCURRENT; i++) {
        store_claim_req_t req = req_for(keys[i], "d1");
        assert_int_equal(store_claim(s, &req, claim_cb, &outs[i]), STORE_OK);
    }
    assert_true(wait_for(all_done, outs, 20000));
    for (int i = 0; i < CONCURRENT; i++) {
        assert_int_equal(outs[i].st, STORE_OK);
        assert_int_equal(outs[i].state, STORE_STATE_IN_PROGRESS);
        if (i < GROUP_KEYS) { /* the first claim of a new key acquires it */
            assert_true(outs[i].acquired);
            assert_false(outs[i].taken_over);
            assert_int_equal(outs[i].fence, 1);
            assert_int_equal(outs[i].attempts, 1);
        } else if (i < 2 * GROUP_KEYS) { /* the second sees it in progress */
            assert_false(outs[i].acquired);
            assert_int_equal(outs[i].fence, 1);
            assert_false(outs[i].lease_expired);
        } else { /* takeovers: an expired row starts a new life, a failed one counts on */
            assert_true(outs[i].acquired);
            assert_true(outs[i].taken_over);
            assert_int_equal(outs[i].fence, 2);
            assert_int_equal(outs[i].attempts, i < 2 * GROUP_KEYS + 5 ? 1 : 2);
        }
    }

    /* finishes at once: per new key one with its fence and one stale, in either order */
    const char *result = "{\"ok\":\"\\\"q\\\"\"}";
    memset(pipe_outs, 0, sizeof(pipe_outs));
    pipe_seq = 0;
    for (int k = 0; k < GROUP_KEYS; k++) {
        for (int j = 0; j < 2; j++) {
            bool stale = (j == 0) == (k % 2 == 0);
            store_finish_req_t fin = {.key = keys[k],
                                      .fence = stale ? 7 : 1,
                                      .state = STORE_STATE_SUCCEEDED,
                                      .result = result,
                                      .result_len = strlen(result),
                                      .window_ms = 600000};
            assert_int_equal(store_finish(s, &fin, pipe_finish_cb, &pipe_outs[2 * k + j]),
                             STORE_OK);
        }
    }
    int n = 2 * GROUP_KEYS;
    assert_true(wait_for(pipe_all_done, &n, 20000));
    for (int k = 0; k < GROUP_KEYS; k++) {
        for (int j = 0; j < 2; j++) {
            bool stale = (j == 0) == (k % 2 == 0);
            assert_int_equal(pipe_outs[2 * k + j].st, STORE_OK);
            assert_int_equal(pipe_outs[2 * k + j].matched, !stale);
        }
        store_claim_req_t req = req_for(keys[k], "d1");
        claim_out_t c = do_claim(s, &req);
        assert_false(c.acquired);
        assert_int_equal(c.state, STORE_STATE_SUCCEEDED);
        assert_string_equal(c.result, result);
        free(c.result);
    }
    store_stats_t stats;
    store_get_stats(s, &stats);
    printf("# group commit: %llu claims in %llu batches, %llu finishes in %llu batches\n",
           (unsigned long long)stats.claims_batched, (unsigned long long)stats.claim_batches,
           (unsigned long long)stats.finishes_batched, (unsigned long long)stats.finish_batches);
    if (backend == BACKEND_PG) {
        assert_true(stats.claim_batches > 0);
        assert_true(stats.finish_batches > 0);
    }
    close_other(s);
}

/* A succeeded finish of key at fence, answered into pipe_outs[0] (cleared first). */
static void send_finish(store_t *s, const char *key, int64_t fence)
{
    memset(pipe_outs, 0, sizeof(pipe_outs));
    pipe_seq = 0;
    store_finish_req_t fin = {.key = key,
                              .fence = fence,
                              .state = STORE_STATE_SUCCEEDED,
                              .result = "{}",
                              .result_len = 2,
                              .window_ms = 600000};
    assert_int_equal(store_finish(s, &fin, pipe_finish_cb, &pipe_outs[0]), STORE_OK);
}

/* Group commit keeps one claim statement and one finish statement in flight per store, on one
 * connection: 50 claims and a finish issued at once with a pool of 4 leave as the first claim
 * alone, the finish beside it on its connection, and the other 49 claims in one batch when
 * the first comes back. One slot per connection sent four claims alone on four connections
 * and the finish on a fifth's worth (Postgres). */
static void test_group_commit_one_in_flight(void **state)
{
    (void)state;
    if (backend == BACKEND_SQLITE)
        skip();
    store_t *s = open_other(4, 0, 0);
    store_claim_req_t done = req_for("t:onefl:done", "d1");
    claim_out_t d = do_claim(s, &done);
    assert_true(d.acquired);
    store_stats_t before, busy, after;
    store_get_stats(s, &before);

    static claim_out_t outs[CONCURRENT];
    char keys[CONCURRENT][64];
    memset(outs, 0, sizeof(outs));
    for (int i = 0; i < CONCURRENT; i++) {
        snprintf(keys[i], sizeof(keys[0]), "t:onefl:%d", i);
        store_claim_req_t req = req_for(keys[i], "d1");
        assert_int_equal(store_claim(s, &req, claim_cb, &outs[i]), STORE_OK);
    }
    send_finish(s, done.key, d.fence);
    store_get_stats(s, &busy);
    assert_int_equal(busy.connections_busy, 1);

    assert_true(wait_for(all_done, outs, 20000));
    int n = 1;
    assert_true(wait_for(pipe_all_done, &n, 20000));
    assert_true(pipe_outs[0].matched);
    for (int i = 0; i < CONCURRENT; i++) {
        assert_int_equal(outs[i].st, STORE_OK);
        assert_true(outs[i].acquired);
    }
    store_get_stats(s, &after);
    assert_int_equal(after.claim_batches - before.claim_batches, 1);
    assert_int_equal(after.claims_batched - before.claims_batched, CONCURRENT - 1);
    close_other(s);
}

/* A batch goes only behind batches: with both connections of a pool of 2 carrying something,
 * a finish goes to the less busy one, not behind an operator's release that waits for a row
 * lock another session holds (it would wait out the lock). */
static void test_group_commit_not_behind_other(void **state)
{
    (void)state;
    if (backend == BACKEND_SQLITE)
        skip();
    store_t *s = open_other(2, 0, 0);
    assert_true(wait_for(all_connected, s, 10000));
    store_claim_req_t done = req_for("t:behind:done", "d1");
    claim_out_t d = do_claim(s, &done);
    assert_true(d.acquired);
    store_claim_req_t locked = req_for("t:behind:locked", "d1");
    assert_true(do_claim(s, &locked).acquired);
    PGconn *locker = PQconnectdb(db_conninfo);
    assert_int_equal(PQstatus(locker), CONNECTION_OK);
    PGresult *r = PQexec(locker, "BEGIN");
    PQclear(r);
    r = PQexec(locker, "SELECT 1 FROM idem_keys WHERE key = 't:behind:locked' FOR UPDATE");
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    PQclear(r);

    /* one pass: a claim (a batch slot) and a look take a connection each, the release goes
     * behind the claim (both connections carry one), then the finish */
    claim_out_t c;
    memset(&c, 0, sizeof(c));
    store_claim_req_t fresh = req_for("t:behind:fresh", "d1");
    assert_int_equal(store_claim(s, &fresh, claim_cb, &c), STORE_OK);
    get_out_t g;
    memset(&g, 0, sizeof(g));
    assert_int_equal(store_get(s, done.key, get_cb, &g), STORE_OK);
    op_row_t rel;
    memset(&rel, 0, sizeof(rel));
    assert_int_equal(store_release(s, locked.key, release_cb, &rel), STORE_OK);
    send_finish(s, done.key, d.fence);
    int n = 1;
    assert_true(wait_for(pipe_all_done, &n, 3000));
    assert_int_equal(pipe_outs[0].st, STORE_OK);
    assert_true(pipe_outs[0].matched);
    assert_false(rel.done);

    r = PQexec(locker, "ROLLBACK");
    PQclear(r);
    PQfinish(locker);
    assert_true(wait_for(flag_set, &rel.done, 10000));
    assert_int_equal(rel.st, STORE_OK);
    assert_true(wait_for(flag_set, &c.done, 10000));
    assert_true(c.acquired);
    close_other(s);
}

static bool swept_35(void *arg)
{
    store_stats_t stats;
    store_get_stats(arg, &stats);
    return stats.swept >= 35;
}

static void test_sweeper(void **state)
{
    (void)state;
    /* 35 expired rows and one in progress whose lease runs: batches of 10 must loop */
    for (int i = 0; i < 35; i++) {
        char key[64];
        snprintf(key, sizeof(key), "sweep:%d", i);
        store_claim_req_t req = req_for(key, "d1");
        claim_out_t a = do_claim(st_main, &req);
        assert_true(do_finish(st_main, key, a.fence, STORE_STATE_SUCCEEDED, "{}", 0));
    }
    store_claim_req_t live = req_for("sweep:live", "d1");
    live.window_ms = 0; /* expiry is still at least the lease */
    (void)do_claim(st_main, &live);

    store_t *sw = open_other(2, 20, 10);
    assert_true(wait_for(swept_35, sw, 10000));
    close_other(sw);
    assert_string_equal(
        sql1(db_conninfo, "SELECT count(*) FROM idem_keys WHERE key LIKE 'sweep:%'"), "1");
    get_out_t g = do_get(st_main, "sweep:live");
    assert_true(g.found);

    /* and on demand */
    store_claim_req_t req = req_for("sweep:now", "d1");
    claim_out_t a = do_claim(st_main, &req);
    assert_true(do_finish(st_main, req.key, a.fence, STORE_STATE_FAILED, NULL, 0));
    finish_out_t o = {0};
    assert_int_equal(store_sweep_now(st_main, finish_cb, &o), STORE_OK);
    assert_true(wait_for(flag_set, &o.done, 10000));
    assert_true(o.matched);
    assert_false(do_get(st_main, req.key).found);
}

typedef struct {
    int calls;
    store_status_t last;
} shut_t;

static void shut_get_cb(store_status_t st, const store_row_t *row, void *arg)
{
    (void)row;
    shut_t *sh = arg;
    sh->calls++;
    sh->last = st;
}

static void shut_release_cb(store_status_t st, bool released, const store_row_t *row, void *arg)
{
    assert_false(released);
    shut_get_cb(st, row, arg);
}

static void test_free_fails_pending(void **state)
{
    (void)state;
    store_t *s = open_other(1, 0, 0);
    shut_t sh = {0, STORE_OK};
    for (int i = 0; i < 5; i++)
        assert_int_equal(store_get(s, "t:charge:h:basic", shut_get_cb, &sh), STORE_OK);
    /* each kind fails through its own callback type */
    assert_int_equal(store_release(s, "t:charge:h:basic", shut_release_cb, &sh), STORE_OK);
    assert_int_equal(store_forget(s, "t:charge:h:basic", shut_get_cb, &sh), STORE_OK);
    assert_int_equal(sh.calls, 0);
    store_free(s);
    assert_int_equal(sh.calls, 7);
    assert_int_equal(sh.last, STORE_ERR_SHUTDOWN);
    close_other(NULL);
}

/* ---- claims whose answer was lost ---- */

#define INDOUBT_APP "idemgw-indoubt-test"

/* A store of its own with one connection, named so pg_stat_activity tells it from st_main's,
 * and a short deadline (the op's is 1.5 times it). */
static store_t *open_indoubt_store(void)
{
    char *ci = xasprintf("%s application_name='" INDOUBT_APP "'", db_conninfo);
    store_options_t opt = {.migrate = true, .timeout_ms = 1000};
    store_pg_options_t pg = {.conninfo = ci, .pool_size = 1, .group_commit = true};
    char msg[512] = "";
    store_t *s = store_pg_new(base, &opt, &pg, msg, sizeof(msg));
    free(ci);
    if (!s)
        fprintf(stderr, "postgres store: %s\n", msg);
    assert_non_null(s);
    assert_true(wait_for(is_ready, s, 10000));
    return s;
}

/* Polls the server from another connection, without running the loop (the store must not
 * read its answer meanwhile), until key's row is in state; the bound fails the case. */
static void await_row_state(const char *key, const char *state)
{
    char *sql = xasprintf("SELECT state FROM idem_keys WHERE key = '%s'", key);
    uint64_t until = util_now_ms() + 10000;
    while (strcmp(sql1(db_conninfo, sql), state) != 0) {
        if (util_now_ms() > until)
            fail_msg("row %s never reached state %s", key, state);
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    free(sql);
}

/* Loses whatever the server has sent the store's connection: the socket is replaced by an
 * unconnected one (the connection closes, unread bytes with it), so libpq reads nothing more
 * and the op in flight fails, by its deadline or the read error, whichever comes first. */
static void lose_store_connection(void)
{
    int port = atoi(sql1(db_conninfo, "SELECT client_port FROM pg_stat_activity WHERE "
                                      "application_name = '" INDOUBT_APP "'"));
    assert_true(port > 0);
    int victim = -1;
    for (int fd = 3; fd < 4096 && victim < 0; fd++) {
        struct sockaddr_in a;
        socklen_t len = sizeof(a);
        if (getsockname(fd, (struct sockaddr *)&a, &len) == 0 && a.sin_family == AF_INET &&
            ntohs(a.sin_port) == port)
            victim = fd;
    }
    assert_true(victim >= 0);
    int other = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(other >= 0);
    assert_int_equal(dup2(other, victim), victim);
    close(other);
}

/* The release statement has run for every claim kept (or nothing was kept). */
static bool in_doubt_settled(void *arg)
{
    store_stats_t st;
    store_get_stats(arg, &st);
    return st.claims_in_doubt > 0 && st.in_doubt_pending == 0;
}

/* A claim commits, then its connection dies before the answer is read: the caller is told
 * unavailable (not executed), the row holds the key, and once the store has a connection again
 * the row is released, so a retry runs the call as it should. */
static void test_claim_answer_lost_released(void **state)
{
    (void)state;
    if (backend != BACKEND_PG)
        skip(); /* the embedded store's claim commits in process: its answer is never lost */
    store_t *s = open_indoubt_store();
    store_claim_req_t req = req_for("t:indoubt:h:lost", "d1");
    claim_out_t o;
    memset(&o, 0, sizeof(o));
    assert_int_equal(store_claim(s, &req, claim_cb, &o), STORE_OK);
    await_row_state(req.key, "in_progress");
    static const char token_sql[] =
        "SELECT claim_token FROM idem_keys WHERE key = 't:indoubt:h:lost'";
    char *lost_token = xstrdup(sql1(db_conninfo, token_sql));
    assert_int_equal(strlen(lost_token), 32);
    lose_store_connection();

    assert_true(wait_for(flag_set, &o.done, 10000));
    assert_int_equal(o.st, STORE_ERR_UNAVAILABLE);
    /* the claim committed: the key is held, though its call was never forwarded */
    assert_string_equal(sql1(db_conninfo, "SELECT state FROM idem_keys WHERE key = "
                                          "'t:indoubt:h:lost'"),
                        "in_progress");
    store_stats_t st;
    store_get_stats(s, &st);
    assert_int_equal(st.claims_in_doubt, 1);
    assert_int_equal(st.in_doubt_pending, 1);

    /* reconnected and past the claim's deadline: released as `idemgw key --release` does */
    assert_true(wait_for(in_doubt_settled, s, 15000));
    store_get_stats(s, &st);
    assert_int_equal(st.in_doubt_released, 1);
    get_out_t g = do_get(s, req.key);
    assert_int_equal(g.state, STORE_STATE_FAILED);
    assert_int_equal(g.fence, 2);

    /* the retry takes the key and runs the call */
    claim_out_t again = do_claim(s, &req);
    assert_true(again.acquired);
    assert_int_equal(again.state, STORE_STATE_IN_PROGRESS);
    assert_int_equal(again.fence, 3);
    /* every claim writes a token of its own */
    assert_int_equal(strlen(sql1(db_conninfo, token_sql)), 32);
    assert_string_not_equal(sql1(db_conninfo, token_sql), lost_token);
    free(lost_token);
    assert_true(do_finish(s, req.key, again.fence, STORE_STATE_SUCCEEDED, "{}", 600000));
    store_free(s);
}

/* A claim whose answer was lost is kept by its token: when a newer claim has taken the key over
 * meanwhile (another token), the release leaves that one alone. */
static void test_claim_answer_lost_newer_claim_kept(void **state)
{
    (void)state;
    if (backend != BACKEND_PG)
        skip();
    store_t *s = open_indoubt_store();
    store_claim_req_t req = req_for("t:indoubt:h:newer", "d1");
    req.lease_ms = 1; /* over at once: the newer claim may take the key over */
    claim_out_t o;
    memset(&o, 0, sizeof(o));
    assert_int_equal(store_claim(s, &req, claim_cb, &o), STORE_OK);
    await_row_state(req.key, "in_progress");
    lose_store_connection();

    store_claim_req_t newer = req_for(req.key, "d1");
    newer.takeover_lease_expired = true;
    claim_out_t n = do_claim(st_main, &newer);
    assert_true(n.acquired);
    assert_int_equal(n.fence, 2);

    assert_true(wait_for(flag_set, &o.done, 10000));
    assert_int_equal(o.st, STORE_ERR_UNAVAILABLE);
    assert_true(wait_for(in_doubt_settled, s, 15000));
    store_stats_t st;
    store_get_stats(s, &st);
    assert_int_equal(st.claims_in_doubt, 1);
    assert_int_equal(st.in_doubt_released, 0);
    get_out_t g = do_get(st_main, req.key);
    assert_int_equal(g.state, STORE_STATE_IN_PROGRESS);
    assert_int_equal(g.fence, 2);
    assert_true(do_finish(st_main, req.key, n.fence, STORE_STATE_SUCCEEDED, "{}", 600000));
    store_free(s);
}

static const char *cluster_script(void)
{
    const char *p = getenv("IDEMGW_PG_CLUSTER_SCRIPT");
    return p && p[0] ? p : "scripts/pg-cluster.sh";
}

static char *run_cmd(const char *cmd)
{
    FILE *f = popen(cmd, "r");
    if (!f)
        return NULL;
    char buf[512] = "";
    if (!fgets(buf, sizeof(buf), f))
        buf[0] = '\0';
    int rc = pclose(f);
    if (rc != 0)
        return NULL;
    buf[strcspn(buf, "\n")] = '\0';
    return xstrdup(buf);
}

static void test_restart_recovers(void **state)
{
    (void)state;
    if (backend == BACKEND_SQLITE)
        skip(); /* stops and starts a Postgres cluster */
    if (access(cluster_script(), X_OK) != 0)
        fail_msg("cannot run %s (run from the repository root or set IDEMGW_PG_CLUSTER_SCRIPT)",
                 cluster_script());
    char dir[] = "/tmp/idemgw-store-restart.XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *cmd = xasprintf("%s start %s/pg", cluster_script(), dir);
    char *url = run_cmd(cmd);
    if (!url)
        fail_msg("could not start a private cluster: %s", cmd);

    store_t *s = open_store(url, 2, true, 0, 0);
    store_claim_req_t req = req_for("t:charge:h:restart", "d1");
    claim_out_t a = do_claim(s, &req);
    assert_true(a.acquired);

    char *stop = xasprintf("%s stop %s/pg", cluster_script(), dir);
    assert_int_equal(system(stop), 0);
    assert_true(wait_for(is_not_ready, s, 10000));

    /* down: refused at once, nothing queued */
    claim_out_t none;
    memset(&none, 0, sizeof(none));
    uint64_t t0 = util_now_ms();
    assert_int_equal(store_claim(s, &req, claim_cb, &none), STORE_ERR_UNAVAILABLE);
    get_out_t g;
    memset(&g, 0, sizeof(g));
    assert_int_equal(store_get(s, req.key, get_cb, &g), STORE_ERR_UNAVAILABLE);
    assert_true(util_now_ms() - t0 < 100);
    /* staying down a while: still refused, never a callback */
    bool never = false;
    (void)wait_for(flag_set, &never, 300);
    assert_false(none.done);
    assert_false(g.done);
    assert_int_equal(store_claim(s, &req, claim_cb, &none), STORE_ERR_UNAVAILABLE);

    free(run_cmd(cmd)); /* start again on the same port */
    uint64_t t1 = util_now_ms();
    assert_true(wait_for(is_ready, s, 20000));
    printf("# store recovered %llu ms after postgres came back\n",
           (unsigned long long)(util_now_ms() - t1));
    claim_out_t b = do_claim(s, &req);
    assert_false(b.acquired);
    assert_int_equal(b.state, STORE_STATE_IN_PROGRESS);
    assert_true(do_finish(s, req.key, a.fence, STORE_STATE_SUCCEEDED, "{}", 600000));

    store_free(s);
    assert_int_equal(system(stop), 0);
    char *rm = xasprintf("rm -rf %s", dir);
    assert_int_equal(system(rm), 0);
    free(rm);
    free(stop);
    free(url);
    free(cmd);
}

/* ---- the embedded store only ---- */

/* One process per file: a second opener is refused while the first holds the file, with a
 * message that names the file and the way out; the operator's shared mode is not. */
static void test_sqlite_lock_refuses_second(void **state)
{
    (void)state;
    if (backend != BACKEND_SQLITE)
        skip();
    store_options_t opt = {.migrate = true};
    store_sqlite_options_t sq = {.path = db_conninfo};
    char msg[512] = "";
    store_t *s = store_sqlite_new(base, &opt, &sq, msg, sizeof(msg));
    assert_null(s);
    assert_non_null(strstr(msg, db_conninfo));
    assert_non_null(strstr(msg, "in use by another process"));
    char pid[32];
    snprintf(pid, sizeof(pid), "(pid %ld)", (long)getpid());
    assert_non_null(strstr(msg, pid));
    assert_non_null(strstr(msg, "Postgres"));

    /* `idemgw key` beside a running gateway: no lock, one short transaction */
    store_options_t shared = {0};
    store_sqlite_options_t sq_shared = {.path = db_conninfo, .shared = true};
    store_t *op = store_sqlite_new(base, &shared, &sq_shared, msg, sizeof(msg));
    assert_non_null(op);
    assert_true(store_ready(op));
    store_claim_req_t req = req_for("t:lock:h:shared", "d1");
    assert_true(do_claim(st_main, &req).acquired);
    assert_int_equal(do_get(op, req.key).state, STORE_STATE_IN_PROGRESS);
    store_free(op);

    /* shared never creates a file */
    char *absent = xasprintf("%s/absent.db", sqlite_dir);
    sq_shared.path = absent;
    assert_null(store_sqlite_new(base, &shared, &sq_shared, msg, sizeof(msg)));
    assert_int_equal(access(absent, F_OK), -1);
    free(absent);

    /* the lock goes with the store */
    store_free(st_main);
    st_main = open_store(db_conninfo, 4, true, 0, 0);
}

#define BATCH_CLAIMS 300

/* A claim commits with an fsync; a finish alone does not (lost in a crash of the machine, it
 * leaves the claim: "unknown", never a second run), unless durable_finish. Either way the
 * finish is committed: another connection reads it. */
static void test_sqlite_finish_not_synced(void **state)
{
    (void)state;
    if (backend != BACKEND_SQLITE)
        skip();
    for (int durable = 0; durable <= 1; durable++) {
        char *path = xasprintf("%s/lazy-%d.db", sqlite_dir, durable);
        store_options_t opt = {.migrate = true};
        store_sqlite_options_t sq = {.path = path, .durable_finish = durable};
        char msg[512] = "";
        store_t *s = store_sqlite_new(base, &opt, &sq, msg, sizeof(msg));
        assert_non_null(s);
        store_stats_t st0, st1, st2;
        store_get_stats(s, &st0);
        store_claim_req_t req = req_for("t:lazy:h:1", "d1");
        assert_true(do_claim(s, &req).acquired);
        store_get_stats(s, &st1);
        assert_int_equal(st1.lazy_transactions, st0.lazy_transactions); /* the claim synced */
        assert_true(do_finish(s, req.key, 1, STORE_STATE_SUCCEEDED, "{}", 600000));
        store_get_stats(s, &st2);
        assert_int_equal(st2.lazy_transactions - st1.lazy_transactions, durable ? 0 : 1);
        /* and the next claim syncs again, the finish's WAL frames with it */
        store_claim_req_t next = req_for("t:lazy:h:2", "d1");
        assert_true(do_claim(s, &next).acquired);
        store_stats_t st3;
        store_get_stats(s, &st3);
        assert_int_equal(st3.lazy_transactions, st2.lazy_transactions);
        store_sqlite_options_t ro = {.path = path, .shared = true};
        store_options_t shared = {0};
        store_t *reader = store_sqlite_new(base, &shared, &ro, msg, sizeof(msg));
        assert_non_null(reader);
        assert_int_equal(do_get(reader, req.key).state, STORE_STATE_SUCCEEDED);
        store_free(reader);
        store_free(s);
        free(path);
    }
}

static bool never(void *arg)
{
    (void)arg;
    return false;
}

/* A store of this run's backend with store.commit_delay at 60 s (the pace bounds the holds
 * below, never the delay) and the given deadline; on SQLite, the file NAME of the group's
 * directory. */
static store_t *delay_store(const char *name, uint64_t timeout_ms)
{
    char *path = xasprintf("%s/%s", sqlite_dir, name);
    store_options_t opt = {.migrate = true, .timeout_ms = timeout_ms};
    uint64_t delay = 60 * 1000000ull;
    store_sqlite_options_t sq = {.path = path, .commit_delay_us = delay};
    store_pg_options_t pg = {
        .conninfo = db_conninfo, .pool_size = 1, .group_commit = true, .commit_delay_us = delay};
    char msg[512] = "";
    store_t *s = backend == BACKEND_SQLITE ? store_sqlite_new(base, &opt, &sq, msg, sizeof(msg))
                                           : store_pg_new(base, &opt, &pg, msg, sizeof(msg));
    free(path); /* the store keeps its own copy */
    assert_non_null(s);
    assert_true(wait_for(is_ready, s, 10000));
    return s;
}

/* One call at a time, then ten claims open (keys PREFIX0..9; on a slow machine the last ones may
 * already be held, once the first 100 ms gave a pace); then the loop idles idle_ms or more and
 * PREFIX0 finishes, which measures the pace: at most two finishes in that time, and nine claims
 * open, hold the next claim for at least 9 x (idle_ms / 2) / 8 ms (store_delay.c): 168 ms
 * after 300. */
static void nine_open(store_t *s, const char *prefix, char keys[10][40], uint64_t idle_ms)
{
    char a[40];
    snprintf(a, sizeof(a), "%sa", prefix);
    store_claim_req_t ra = req_for(a, "d1");
    assert_true(do_claim(s, &ra).acquired);
    assert_true(do_finish(s, a, 1, STORE_STATE_SUCCEEDED, "{}", 600000));
    for (int i = 0; i < 10; i++) {
        snprintf(keys[i], 40, "%s%d", prefix, i);
        store_claim_req_t r = req_for(keys[i], "d1");
        assert_true(do_claim(s, &r).acquired);
    }
    assert_false(wait_for(never, NULL, idle_ms));
    assert_true(do_finish(s, keys[0], 1, STORE_STATE_SUCCEEDED, "{}", 600000));
}

/* store.commit_delay: a claim made while many claims are open is held for company, and one
 * queued after it (here 20 ms later) commits with it, in one transaction (the embedded store)
 * or one batch statement (Postgres, with group commit); a claim with few open beside it is not
 * held. */
static void test_commit_delay(void **state)
{
    (void)state;
    bool sqlite = backend == BACKEND_SQLITE;
    store_t *s = delay_store("delay.db", 120000);
    char keys[10][40];
    nine_open(s, "t:delay:h:open", keys, 300);

    /* nine open: the next claim is held; one queued 20 ms later joins it */
    store_stats_t st1, st2, st3;
    store_get_stats(s, &st1);
    claim_out_t c, d;
    memset(&c, 0, sizeof(c));
    memset(&d, 0, sizeof(d));
    store_claim_req_t rc = req_for("t:delay:h:c", "d1");
    store_claim_req_t rd = req_for("t:delay:h:d", "d1");
    assert_int_equal(store_claim(s, &rc, claim_cb, &c), STORE_OK);
    assert_false(wait_for(flag_set, &c.done, 20));
    assert_int_equal(store_claim(s, &rd, claim_cb, &d), STORE_OK);
    assert_true(wait_for(flag_set, &c.done, 10000));
    assert_true(wait_for(flag_set, &d.done, 10000));
    assert_true(c.acquired && d.acquired);
    store_get_stats(s, &st2);
    assert_int_equal(st2.delayed_transactions - st1.delayed_transactions, 1);
    if (sqlite) {
        assert_int_equal(st2.transactions - st1.transactions, 1);
        assert_int_equal(st2.batched_ops - st1.batched_ops, 2);
    } else {
        assert_int_equal(st2.claim_batches - st1.claim_batches, 1);
        assert_int_equal(st2.claims_batched - st1.claims_batched, 2);
    }

    /* every call finished: the next claim goes at once */
    for (int i = 1; i < 10; i++)
        assert_true(do_finish(s, keys[i], 1, STORE_STATE_SUCCEEDED, "{}", 600000));
    assert_true(do_finish(s, rc.key, 1, STORE_STATE_SUCCEEDED, "{}", 600000));
    assert_true(do_finish(s, rd.key, 1, STORE_STATE_SUCCEEDED, "{}", 600000));
    store_claim_req_t e = req_for("t:delay:h:e", "d1");
    assert_true(do_claim(s, &e).acquired);
    store_get_stats(s, &st3);
    assert_int_equal(st3.delayed_transactions, st2.delayed_transactions);
    store_free(s);
}

/* A hold is at most a quarter of the operations' deadline (store.timeout): with 400 ms, a
 * claim that the pace alone would hold for 562 ms or more is held 100 ms and answered in time.
 * A store closed while it holds a claim fails it as closing. */
static void test_commit_delay_deadline(void **state)
{
    (void)state;
    store_t *s = delay_store("delay-deadline.db", 400);
    char keys[10][40];
    nine_open(s, "t:delay:h:dl", keys, 1000);
    store_stats_t st0, st1;
    store_get_stats(s, &st0);
    store_claim_req_t rc = req_for("t:delay:h:late", "d1");
    claim_out_t c = do_claim(s, &rc);
    assert_true(c.acquired);
    store_get_stats(s, &st1);
    assert_int_equal(st1.delayed_transactions - st0.delayed_transactions, 1);
    store_free(s);

    /* closing during a hold: the held claim fails as closing. On the embedded store a finish
     * queued behind it is still written (its agent may have had the answer: the call must not
     * read as unknown after a restart). */
    s = delay_store("delay-close.db", 120000);
    nine_open(s, "t:delay:h:cl", keys, 300);
    memset(&c, 0, sizeof(c));
    store_claim_req_t rq = req_for("t:delay:h:closing", "d1");
    assert_int_equal(store_claim(s, &rq, claim_cb, &c), STORE_OK);
    assert_false(wait_for(flag_set, &c.done, 20));
    send_finish(s, keys[1], 1);
    store_free(s);
    assert_true(c.done);
    assert_int_equal(c.st, STORE_ERR_SHUTDOWN);
    assert_int_not_equal(pipe_outs[0].seq, 0); /* its callback ran before store_free returned */
    if (backend == BACKEND_SQLITE) {
        char *path = xasprintf("%s/delay-close.db", sqlite_dir), msg[512] = "";
        store_sqlite_options_t ro = {.path = path, .shared = true};
        store_options_t shared = {0};
        store_t *reader = store_sqlite_new(base, &shared, &ro, msg, sizeof(msg));
        assert_non_null(reader);
        assert_int_equal(do_get(reader, keys[1]).state, STORE_STATE_SUCCEEDED);
        assert_int_equal(do_get(reader, keys[2]).state, STORE_STATE_IN_PROGRESS);
        assert_false(do_get(reader, rq.key).found);
        store_free(reader);
        free(path);
    }
}

/* Calls waiting together go in one transaction (one fsync), each with its own answer. */
static void test_sqlite_batching(void **state)
{
    (void)state;
    if (backend != BACKEND_SQLITE)
        skip();
    static claim_out_t outs[BATCH_CLAIMS];
    memset(outs, 0, sizeof(outs));
    store_stats_t before, after;
    store_get_stats(st_main, &before);
    char key[64];
    for (int i = 0; i < BATCH_CLAIMS; i++) {
        snprintf(key, sizeof(key), "t:batch:h:%d", i);
        store_claim_req_t req = req_for(key, "d1");
        assert_int_equal(store_claim(st_main, &req, claim_cb, &outs[i]), STORE_OK);
    }
    /* a repeat of the first, queued behind it: sees its claim, made in the same transaction */
    claim_out_t again;
    memset(&again, 0, sizeof(again));
    store_claim_req_t first = req_for("t:batch:h:0", "d1");
    assert_int_equal(store_claim(st_main, &first, claim_cb, &again), STORE_OK);
    for (int i = 0; i < BATCH_CLAIMS; i++)
        assert_true(wait_for(flag_set, &outs[i].done, 10000));
    assert_true(wait_for(flag_set, &again.done, 10000));
    for (int i = 0; i < BATCH_CLAIMS; i++) {
        assert_int_equal(outs[i].st, STORE_OK);
        assert_true(outs[i].acquired);
        assert_int_equal(outs[i].fence, 1);
    }
    assert_int_equal(again.st, STORE_OK);
    assert_false(again.acquired);
    assert_int_equal(again.state, STORE_STATE_IN_PROGRESS);
    store_get_stats(st_main, &after);
    uint64_t txns = after.transactions - before.transactions;
    uint64_t ops = after.batched_ops - before.batched_ops;
    printf("# %d claims: %llu operations in %llu transactions\n", BATCH_CLAIMS + 1,
           (unsigned long long)ops, (unsigned long long)txns);
    assert_int_equal(ops, BATCH_CLAIMS + 1);
    assert_true(txns >= 1);
    assert_true(ops > txns);
    assert_int_equal(after.claims - before.claims, BATCH_CLAIMS + 1);
}

typedef struct {
    int calls;
    store_status_t st;
} count_out_t;

static void count_claim_cb(store_status_t st, const store_claim_result_t *res, void *arg)
{
    (void)res;
    count_out_t *o = arg;
    o->calls++;
    o->st = st;
}

static bool count_called(void *arg)
{
    return ((count_out_t *)arg)->calls > 0;
}

/* The writer is stuck behind another connection's lock: the claim fails "unavailable" at its
 * deadline, once, and the late result neither calls back again nor takes the key. */
static void test_sqlite_deadline_missed(void **state)
{
    (void)state;
    if (backend != BACKEND_SQLITE)
        skip();
    store_free(st_main);
    st_main = NULL;
    store_options_t opt = {.migrate = true, .timeout_ms = 400};
    store_sqlite_options_t sq = {.path = db_conninfo};
    char msg[512] = "";
    store_t *s = store_sqlite_new(base, &opt, &sq, msg, sizeof(msg));
    assert_non_null(s);

    sqlite3 *blocker = NULL;
    assert_int_equal(sqlite3_open_v2(db_conninfo, &blocker, SQLITE_OPEN_READWRITE, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_exec(blocker, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);

    count_out_t o = {0, STORE_OK};
    store_claim_req_t req = req_for("t:deadline:h:1", "d1");
    uint64_t t0 = util_now_ms();
    assert_int_equal(store_claim(s, &req, count_claim_cb, &o), STORE_OK);
    assert_true(wait_for(count_called, &o, 5000));
    uint64_t took = util_now_ms() - t0;
    assert_int_equal(o.st, STORE_ERR_UNAVAILABLE);
    assert_true(took >= 350 && took < 2000);

    /* the lock goes while the writer still waits for it (busy timeout 1.5 x the deadline) */
    bool never = false;
    (void)wait_for(flag_set, &never, 100);
    assert_int_equal(sqlite3_exec(blocker, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(blocker);
    (void)wait_for(flag_set, &never, 800);
    assert_int_equal(o.calls, 1);
    store_stats_t stats;
    store_get_stats(s, &stats);
    assert_true(stats.unavailable >= 1);
    assert_int_equal(stats.queued, 0);

    /* the claim was never run: the key is free */
    assert_false(do_get(s, req.key).found);
    claim_out_t c = do_claim(s, &req);
    assert_true(c.acquired);
    assert_int_equal(c.fence, 1);
    store_free(s);
    st_main = open_store(db_conninfo, 4, true, 0, 0);
}

/* A drain waits for the writes the last answers started: the store counts calls whose callback
 * has not run, and says when the last one ended, after its callback (which may start more). */
typedef struct {
    int settled;
    int outstanding_then;
    store_t *s;
} settle_out_t;

static void on_settled(void *arg)
{
    settle_out_t *o = arg;
    o->settled++;
    o->outstanding_then = store_outstanding(o->s);
}

static bool settled_once(void *arg)
{
    return ((settle_out_t *)arg)->settled > 0;
}

static void test_outstanding_settles(void **state)
{
    (void)state;
    server_stats_t *stats = xcalloc(1, sizeof(*stats));
    store_free(st_main); /* one store per file: this case's own, observed */
    store_t *s = open_store(db_conninfo, 2, true, 0, 0);
    store_observe(s, stats, base);
    settle_out_t o = {.s = s};
    store_on_settled(s, on_settled, &o);
    assert_int_equal(store_outstanding(s), 0);
    assert_int_equal(store_outstanding(NULL), 0);

    store_claim_req_t req = req_for("t:settle:h:one", "d1");
    claim_out_t a = {0};
    assert_int_equal(store_claim(s, &req, claim_cb, &a), STORE_OK);
    assert_int_equal(store_outstanding(s), 1);
    store_claim_req_t req2 = req_for("t:settle:h:two", "d2");
    claim_out_t b = {0};
    assert_int_equal(store_claim(s, &req2, claim_cb, &b), STORE_OK);
    assert_int_equal(store_outstanding(s), 2);
    assert_true(wait_for(settled_once, &o, 10000));
    assert_true(a.done && b.done); /* only once both had their callbacks */
    assert_int_equal(o.settled, 1);
    assert_int_equal(o.outstanding_then, 0);
    assert_int_equal(store_outstanding(s), 0);
    free(a.result);
    free(b.result);
    store_free(s);
    free(stats);
    st_main = open_store(db_conninfo, 4, true, 0, 0);
}

int main(void)
{
    /* the same cases for each backend; the ones a backend cannot have skip there */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_migrations_once),
        cmocka_unit_test(test_newer_schema_refused),
        cmocka_unit_test(test_missing_schema_without_migrate_refused),
        cmocka_unit_test(test_claim_finish_replay),
        cmocka_unit_test(test_failed_is_taken_over),
        cmocka_unit_test(test_lease_expiry),
        cmocka_unit_test(test_window_expiry),
        cmocka_unit_test(test_explicit_key_digest_mismatch),
        cmocka_unit_test(test_duplicate_and_get),
        cmocka_unit_test(test_release),
        cmocka_unit_test(test_forget),
        cmocka_unit_test(test_operator_queue),
        cmocka_unit_test(test_pipeline_in_order),
        cmocka_unit_test(test_pipeline_error_fails_one),
        cmocka_unit_test(test_duplicates_batched),
        cmocka_unit_test(test_duplicate_history),
        cmocka_unit_test(test_report),
        cmocka_unit_test(test_concurrent_two_stores),
        cmocka_unit_test(test_group_commit),
        cmocka_unit_test(test_group_commit_one_in_flight),
        cmocka_unit_test(test_group_commit_not_behind_other),
        cmocka_unit_test(test_sweeper),
        cmocka_unit_test(test_free_fails_pending),
        cmocka_unit_test(test_restart_recovers),
        cmocka_unit_test(test_claim_answer_lost_released),
        cmocka_unit_test(test_claim_answer_lost_newer_claim_kept),
        cmocka_unit_test(test_sqlite_lock_refuses_second),
        cmocka_unit_test(test_sqlite_batching),
        cmocka_unit_test(test_sqlite_finish_not_synced),
        cmocka_unit_test(test_commit_delay),
        cmocka_unit_test(test_commit_delay_deadline),
        cmocka_unit_test(test_sqlite_deadline_missed),
        cmocka_unit_test(test_outstanding_settles),
    };
    int failed = cmocka_run_group_tests_name("store_sqlite", tests, sqlite_setup, group_teardown);
    const char *url = getenv("IDEMGW_TEST_PG_URL");
    if (!url || !url[0]) {
        /* `make unit` without a Postgres: say so and skip, rather than fail the run */
        printf("# SKIP store_postgres: IDEMGW_TEST_PG_URL is not set (make check starts a "
               "Postgres; or d=$(mktemp -d); export IDEMGW_TEST_PG_URL=$(scripts/pg-cluster.sh "
               "start $d/pg))\n");
        return failed;
    }
    return failed +
           cmocka_run_group_tests_name("store_postgres", tests, group_setup, group_teardown);
}
