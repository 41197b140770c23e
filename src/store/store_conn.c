/* One pooled libpq connection, non-blocking on the libevent loop: connect (PQconnectPoll),
 * bring the schema up to date if nobody has yet, prepare the statements, then enter pipeline
 * mode and carry up to STORE_PIPELINE_DEPTH statements at a time. A connection that dies fails
 * its ops in flight, closes, and reconnects after a backoff; with several hosts listed (a
 * primary and its standbys) the reconnect finds whichever takes writes, so a failover needs no
 * restart. Also the blocking migration used once by store_pg_new.
 *
 * Pipeline mode: with one statement at a time, each connection idles for a full round trip per
 * statement. Each op is sent as its prepared statement followed by its own sync, so every op is
 * its own implicit transaction: a failing statement aborts only itself (its result is an error,
 * the ops behind it run normally). The results come back in the order sent; per op: its
 * result, a NULL, then the sync's PGRES_PIPELINE_SYNC, which completes the op. */
#include "store_int.h"

#include "log.h"
#include "store_migrations.h"
#include "util.h"

#include <event2/event.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000

/* Serialises migrations between gateways starting together (any constant, fixed forever). */
#define MIGRATION_LOCK_ID "7310311502647731009"

/* The last step before a connection is ready: what the server does with a commit, and whether
 * it takes writes at all (target_session_attrs=read-write already skips a server that says it
 * does not; this also catches one that turned read-only since). */
static const char settings_sql[] =
    "SELECT current_setting('fsync'), current_setting('synchronous_commit'),"
    " (extract(epoch FROM clock_timestamp()) * 1000)::bigint,"
    " current_setting('transaction_read_only'), current_setting('synchronous_standby_names')";

/* First migration step: lock, make sure the bookkeeping table exists, read the version. */
static const char migrate_begin_sql[] = "BEGIN;"
                                        "SET LOCAL client_min_messages = warning;"
                                        /* the per-operation deadline is not for migrations,
                                         * which wait for each other and may rewrite tables */
                                        "SET LOCAL statement_timeout = 0;"
                                        "SET LOCAL lock_timeout = 0;"
                                        "SELECT pg_advisory_xact_lock(" MIGRATION_LOCK_ID ");"
                                        "CREATE TABLE IF NOT EXISTS schema_migrations ("
                                        " version integer PRIMARY KEY,"
                                        " name text NOT NULL,"
                                        " applied_at timestamptz NOT NULL DEFAULT now());"
                                        "SELECT coalesce(max(version), 0) FROM schema_migrations";

static void conn_on_io(evutil_socket_t fd, short what, void *arg);
static void conn_on_retry(evutil_socket_t fd, short what, void *arg);
static void conn_on_ready_deadline(evutil_socket_t fd, short what, void *arg);
static void conn_uncork(evutil_socket_t fd, short what, void *arg);
static void conn_dead(store_conn_t *c, const char *why);

static const char *const conn_state_names[] = {
    "down", "connecting", "migrating", "preparing", "idle", "busy", "closed",
};

/* Every state change goes through here so the transitions can be checked in one place. */
static void store_conn_set_state(store_conn_t *c, store_conn_state_t to)
{
#ifndef NDEBUG
    /* CLOSED is final; every other state may fall to DOWN or CLOSED. */
    if (c->state == STORE_CONN_CLOSED && to != STORE_CONN_CLOSED) {
        log_error(0, "store conn %d: invalid transition %s -> %s", c->id,
                  conn_state_names[c->state], conn_state_names[to]);
        abort();
    }
#endif
    log_debug(0, "store conn %d: %s -> %s", c->id, conn_state_names[c->state],
              conn_state_names[to]);
    c->state = to;
}

static void notice_cb(void *arg, const char *message)
{
    (void)arg;
    char buf[512];
    size_t n = strlen(message);
    /* libpq's notices end in a newline, which would split the log line */
    while (n > 0 && (message[n - 1] == '\n' || message[n - 1] == '\r'))
        n--;
    snprintf(buf, sizeof(buf), "%.*s", (int)n, message);
    log_debug(0, "postgres notice: %s", buf);
}

/* libpq's messages span lines ("...\n\tThis probably means..."): one line for the log. */
static const char *pg_msg(PGconn *pg, char *buf, size_t len)
{
    const char *m = pg ? PQerrorMessage(pg) : "no connection";
    size_t o = 0;
    bool space = false;
    for (; *m && o + 1 < len; m++) {
        if (*m == '\n' || *m == '\t' || *m == '\r') {
            space = o > 0;
            continue;
        }
        if (space && o + 2 < len)
            buf[o++] = ' ';
        space = false;
        buf[o++] = *m;
    }
    buf[o] = '\0';
    return buf;
}

void store_conn_params(const store_pg_t *s, const char **kw, const char **val)
{
    /* Defaults first: with expand_dbname the operator's conninfo, expanded from dbname, wins.
     * Keepalives and a TCP user timeout notice a vanished server without a FIN. */
    int i = 0;
    kw[i] = "connect_timeout", val[i++] = "5";
    kw[i] = "keepalives_idle", val[i++] = "10";
    kw[i] = "keepalives_interval", val[i++] = "5";
    kw[i] = "keepalives_count", val[i++] = "3";
    kw[i] = "tcp_user_timeout", val[i++] = "15000";
    kw[i] = "fallback_application_name", val[i++] = "idemgw";
    if (s->conninfo && s->conninfo[0])
        kw[i] = "dbname", val[i++] = s->conninfo;
    /* after dbname, so it replaces the conninfo's options (which it already contains) */
    kw[i] = "options", val[i++] = s->pg_options;
    /* Every claim is a write. With several hosts (a primary and its standbys) libpq tries
     * them in turn and keeps the first that takes writes, which after a failover is the
     * promoted standby; with one host, a server that does not is refused at connect rather
     * than failing each claim. After dbname: this wins over the conninfo and PGTARGETSESSIONATTRS
     * (config validation refuses any other value in database_url). */
    kw[i] = "target_session_attrs", val[i++] = "read-write";
    kw[i] = NULL, val[i] = NULL;
}

/* Decides what the migration transaction does after reading the database's version. On
 * STORE_OK *sql is the rest of the transaction (missing migrations, then COMMIT). */
static store_status_t migrate_plan(int db_version, bool migrate, char **sql, bool *newer, char *msg,
                                   size_t msglen)
{
    int known = store_schema_version();
    *newer = db_version > known;
    if (*newer) {
        snprintf(msg, msglen,
                 "database schema version %d is newer than this binary knows (%d); "
                 "run a newer idemgw",
                 db_version, known);
        return STORE_ERR_SCHEMA;
    }
    if (db_version < known && !migrate) {
        snprintf(msg, msglen,
                 "database schema version %d, this binary needs %d; migrations are disabled "
                 "(enable them or apply sql/ by hand)",
                 db_version, known);
        return STORE_ERR_SCHEMA;
    }
    size_t len = 16;
    for (int i = db_version; i < store_migrations_count; i++)
        len += strlen(store_migrations[i].sql) + strlen(store_migrations[i].name) + 128;
    char *out = xmalloc(len);
    size_t o = 0;
    for (int i = db_version; i < store_migrations_count; i++) {
        const store_migration_t *m = &store_migrations[i];
        /* names are checked by embed-sql.sh to be [A-Za-z0-9_.], safe inside quotes */
        o += (size_t)snprintf(out + o, len - o,
                              "%s;\nINSERT INTO schema_migrations (version, name) "
                              "VALUES (%d, '%s');\n",
                              m->sql, m->version, m->name);
    }
    snprintf(out + o, len - o, "COMMIT");
    *sql = out;
    return STORE_OK;
}

store_status_t store_migrate_sync(store_pg_t *s, char *msg, size_t msglen)
{
    const char *kw[STORE_CONN_PARAMS], *val[STORE_CONN_PARAMS];
    char err[512], *sql = NULL;
    PGresult *r = NULL;
    store_status_t st = STORE_OK;
    int db_version = 0;

    store_conn_params(s, kw, val);
    PGconn *pg = PQconnectdbParams(kw, val, 1);
    if (PQstatus(pg) != CONNECTION_OK) {
        snprintf(msg, msglen, "cannot connect to postgres: %s", pg_msg(pg, err, sizeof(err)));
        st = STORE_ERR_UNAVAILABLE;
        goto out;
    }
    PQsetNoticeProcessor(pg, notice_cb, NULL);
    r = PQexec(pg, migrate_begin_sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
        snprintf(msg, msglen, "reading schema version: %s", pg_msg(pg, err, sizeof(err)));
        st = STORE_ERR_STATEMENT;
        goto out;
    }
    db_version = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    r = NULL;
    bool newer;
    st = migrate_plan(db_version, s->migrate, &sql, &newer, msg, msglen);
    if (st != STORE_OK)
        goto out;
    r = PQexec(pg, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
        snprintf(msg, msglen, "applying migrations: %s", pg_msg(pg, err, sizeof(err)));
        st = STORE_ERR_STATEMENT;
        goto out;
    }
    if (db_version < store_schema_version())
        log_info(0, "store: schema migrated from version %d to %d", db_version,
                 store_schema_version());
out:
    /* closing the connection rolls back whatever is still open */
    PQclear(r);
    PQfinish(pg);
    free(sql);
    return st;
}

void store_conn_init(store_pg_t *s, store_conn_t *c, int id)
{
    memset(c, 0, sizeof(*c));
    c->s = s;
    c->id = id;
    c->state = STORE_CONN_DOWN;
    c->backoff_ms = BACKOFF_MIN_MS;
    c->rd_ev = event_new(s->base, -1, 0, conn_on_io, c);
    c->wr_ev = event_new(s->base, -1, 0, conn_on_io, c);
    c->retry_ev = evtimer_new(s->base, conn_on_retry, c);
    c->ready_ev = evtimer_new(s->base, conn_on_ready_deadline, c);
    c->uncork_ev = event_new(s->base, -1, 0, conn_uncork, c);
    if (!c->rd_ev || !c->wr_ev || !c->retry_ev || !c->ready_ev || !c->uncork_ev) {
        fprintf(stderr, "idemgw: out of memory creating events\n");
        abort();
    }
}

/* Points the socket events at the current socket (libpq may change it while connecting) and
 * waits for what. persistent: the steady-state read watch once connected. */
static void conn_watch(store_conn_t *c, short what, bool persistent)
{
    int fd = PQsocket(c->pg);
    event_del(c->rd_ev);
    event_del(c->wr_ev);
    event_assign(c->rd_ev, c->s->base, fd, EV_READ | (persistent ? EV_PERSIST : 0), conn_on_io, c);
    event_assign(c->wr_ev, c->s->base, fd, EV_WRITE, conn_on_io, c);
    if (what & EV_READ)
        event_add(c->rd_ev, NULL);
    if (what & EV_WRITE)
        event_add(c->wr_ev, NULL);
}

static void conn_schedule_retry(store_conn_t *c)
{
    struct timeval tv = {(time_t)(c->backoff_ms / 1000),
                         (suseconds_t)(c->backoff_ms % 1000) * 1000};
    evtimer_add(c->retry_ev, &tv);
    c->backoff_ms *= 2;
    if (c->backoff_ms > BACKOFF_MAX_MS)
        c->backoff_ms = BACKOFF_MAX_MS;
}

/* (Re)arms the deadline by which c must be ready: ms from now. */
static void conn_ready_by(store_conn_t *c, uint64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    evtimer_add(c->ready_ev, &tv);
}

/* Closes the libpq side: events off before the socket goes away with PQfinish. */
static void conn_teardown(store_conn_t *c)
{
    event_del(c->rd_ev);
    event_del(c->wr_ev);
    event_del(c->ready_ev);
    event_del(c->uncork_ev);
    c->corked = false;
    c->sent_in_pass = false;
    PQclear(c->res);
    c->res = NULL;
    if (c->pg)
        PQfinish(c->pg);
    c->pg = NULL;
    c->flushing = false;
    c->step = 0;
}

/* Detaches the list of ops in flight (oldest first) from the connection. */
static store_op_t *conn_take_inflight(store_conn_t *c)
{
    store_op_t *ops = c->fl_head;
    c->fl_head = c->fl_tail = NULL;
    c->inflight = 0;
    c->await_sync = false;
    return ops;
}

static void conn_dead(store_conn_t *c, const char *why)
{
    store_pg_t *s = c->s;
    bool was_up = c->state == STORE_CONN_IDLE || c->state == STORE_CONN_BUSY;
    store_op_t *op = conn_take_inflight(c);

    if (was_up)
        log_warn(0, "store conn %d: connection lost: %s", c->id, why);
    else
        log_info(0, "store conn %d: cannot connect: %s (retry in %llu ms)", c->id, why,
                 (unsigned long long)c->backoff_ms);
    conn_teardown(c);
    if (s->schema_refused) {
        store_conn_set_state(c, STORE_CONN_CLOSED);
    } else {
        store_conn_set_state(c, STORE_CONN_DOWN);
        conn_schedule_retry(c);
    }
    /* the statements may or may not have run: the callers decide what that means. A claim
     * that did is released once a connection is back (its call was never forwarded). */
    while (op) {
        store_op_t *next = op->next;
        store_indoubt_note(s, op);
        store_op_fail(s, op, STORE_ERR_UNAVAILABLE);
        op = next;
    }
    store_conn_lost(s);
}

/* Starts PQflush; a backlog waits for EV_WRITE. False: the connection died. */
static bool conn_flush(store_conn_t *c)
{
    int r = PQflush(c->pg);
    if (r < 0) {
        char err[256];
        conn_dead(c, pg_msg(c->pg, err, sizeof(err)));
        return false;
    }
    c->flushing = r == 1;
    if (c->flushing)
        event_add(c->wr_ev, NULL);
    return true;
}

static bool conn_send_simple(store_conn_t *c, const char *sql)
{
    if (!PQsendQuery(c->pg, sql)) {
        char err[256];
        conn_dead(c, pg_msg(c->pg, err, sizeof(err)));
        return false;
    }
    return conn_flush(c);
}

static void conn_prepare_next(store_conn_t *c)
{
    if (c->step == STORE_OP_COUNT_) {
        c->settings_sent_ms = util_wall_ms();
        (void)conn_send_simple(c, settings_sql);
        return;
    }
    if (c->step > STORE_OP_COUNT_) {
        /* every prepare has delivered its NULL, so libpq is idle, as entering requires */
        if (!PQenterPipelineMode(c->pg)) {
            char err[256];
            conn_dead(c, pg_msg(c->pg, err, sizeof(err)));
            return;
        }
        c->backoff_ms = BACKOFF_MIN_MS;
        c->s->stats.connects++;
        event_del(c->ready_ev);
        store_conn_set_state(c, STORE_CONN_IDLE);
        log_info(0, "store conn %d: ready", c->id);
        store_pump(c->s);
        store_indoubt_kick(c->s);
        return;
    }
    store_op_kind_t k = (store_op_kind_t)c->step;
    if (!PQsendPrepare(c->pg, store_stmt_name(k), store_stmt_sql(k), 0, NULL)) {
        char err[256];
        conn_dead(c, pg_msg(c->pg, err, sizeof(err)));
        return;
    }
    (void)conn_flush(c);
}

static void conn_connected(store_conn_t *c)
{
    store_pg_t *s = c->s;
    PQsetNoticeProcessor(c->pg, notice_cb, NULL);
    conn_watch(c, EV_READ, true);
    c->step = 0;
    if (s->schema_refused) {
        conn_dead(c, "schema refused");
        return;
    }
    if (!s->schema_ok) {
        conn_ready_by(c, STORE_MIGRATE_DEADLINE_MS);
        store_conn_set_state(c, STORE_CONN_MIGRATING);
        (void)conn_send_simple(c, migrate_begin_sql);
        return;
    }
    store_conn_set_state(c, STORE_CONN_PREPARING);
    conn_prepare_next(c);
}

/* A migration step's statement finished; res is owned here. */
static void conn_migrate_step(store_conn_t *c, PGresult *res)
{
    store_pg_t *s = c->s;
    char msg[512];
    char *sql = NULL;

    if (c->step == 0) {
        if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
            snprintf(msg, sizeof(msg), "reading schema version: %s", PQresultErrorMessage(res));
            conn_dead(c, msg);
            goto out;
        }
        bool newer;
        store_status_t st =
            migrate_plan(atoi(PQgetvalue(res, 0, 0)), s->migrate, &sql, &newer, msg, sizeof(msg));
        if (st != STORE_OK) {
            log_error(0, "store: %s", msg);
            /* newer schema: retrying cannot help; missing with migrations off: another
             * gateway may still apply them, so keep retrying */
            if (newer)
                s->schema_refused = true;
            conn_dead(c, "schema not usable");
            goto out;
        }
        c->step = 1;
        (void)conn_send_simple(c, sql);
        goto out;
    }
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
        snprintf(msg, sizeof(msg), "applying migrations: %s", PQresultErrorMessage(res));
        conn_dead(c, msg);
        goto out;
    }
    if (!s->schema_ok)
        log_info(0, "store: schema at version %d", store_schema_version());
    s->schema_ok = true;
    c->step = 0;
    conn_ready_by(c, s->connect_deadline_ms);
    store_conn_set_state(c, STORE_CONN_PREPARING);
    conn_prepare_next(c);
out:
    free(sql);
    PQclear(res);
}

/* Closes c for a failed result: its first message line, after prefix, says why. Takes res. */
static void conn_dead_result(store_conn_t *c, const char *prefix, PGresult *res)
{
    char msg[512];
    snprintf(msg, sizeof(msg), "%s%s", prefix, PQresultErrorMessage(res));
    msg[strcspn(msg, "\n")] = '\0';
    PQclear(res);
    conn_dead(c, msg);
}

/* A claim is only as durable as the commit that wrote it: the sessions ask for
 * synchronous_commit=on (see store_pg_new); a server that does not flush at all is worth a
 * warning, once, and so is a primary listed with standbys none of which is synchronous. A
 * server that takes no writes is no use at all. Takes res. */
static void conn_check_settings(store_conn_t *c, PGresult *res)
{
    store_pg_t *s = c->s;
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
        conn_dead_result(c, "reading settings: ", res);
        return;
    }
    if (strcmp(PQgetvalue(res, 0, 3), "on") == 0) {
        PQclear(res);
        conn_dead(c, "the server takes no writes (transaction_read_only is on: a standby, or "
                     "default_transaction_read_only)");
        return;
    }
    /* the claim's deadline is sent by the database's clock: the skew, to half a round trip */
    uint64_t now = util_wall_ms();
    int64_t server_ms = strtoll(PQgetvalue(res, 0, 2), NULL, 10);
    c->clock_offset_ms =
        server_ms - (int64_t)(c->settings_sent_ms + (now - c->settings_sent_ms) / 2);
    if (!s->settings_checked) {
        s->settings_checked = true;
        if (strcmp(PQgetvalue(res, 0, 0), "off") == 0)
            log_warn(0, "store: the Postgres server runs with fsync=off: a crash of its host can "
                        "lose claims and outcomes already acknowledged, and a retry would run "
                        "again; turn fsync on");
        if (strcmp(PQgetvalue(res, 0, 1), "on") != 0)
            log_error(0, "store: synchronous_commit is %s, not on: claims may be lost in a crash",
                      PQgetvalue(res, 0, 1));
    }
    /* A standby that is only asynchronous may miss the last claims when it is promoted. Looked
     * at on every connect: after a failover the new primary usually has no standby yet. */
    bool no_sync = s->servers > 1 && !PQgetvalue(res, 0, 4)[0];
    if (no_sync && !s->no_sync_warned)
        log_warn(0,
                 "store: database_url lists %d hosts but the primary has no synchronous "
                 "standby (synchronous_standby_names is empty): if it fails, claims it "
                 "acknowledged may be missing on the standby promoted, and those calls run "
                 "again; make the standby synchronous",
                 s->servers);
    s->no_sync_warned = no_sync;
    PQclear(res);
    c->step++;
    conn_prepare_next(c);
}

/* The statement in flight has delivered all its results; res is the one that matters. */
static void conn_statement_done(store_conn_t *c, PGresult *res)
{
    switch (c->state) {
    case STORE_CONN_MIGRATING:
        conn_migrate_step(c, res);
        break;
    case STORE_CONN_PREPARING:
        if (c->step == STORE_OP_COUNT_) {
            conn_check_settings(c, res);
            break;
        }
        if (PQresultStatus(res) != PGRES_COMMAND_OK) {
            char msg[512];
            snprintf(msg, sizeof(msg), "prepare %s: %s", store_stmt_name(c->step),
                     PQresultErrorMessage(res));
            PQclear(res);
            conn_dead(c, msg);
            break;
        }
        PQclear(res);
        c->step++;
        conn_prepare_next(c);
        break;
    default:
        PQclear(res);
        break;
    }
}

static bool conn_has_statement(const store_conn_t *c)
{
    return c->state == STORE_CONN_MIGRATING || c->state == STORE_CONN_PREPARING;
}

/* Keeps the last result of a statement, except that an error sticks (a multi-statement
 * migration stops at its first error). Takes r. */
static void conn_keep_result(store_conn_t *c, PGresult *r)
{
    if (c->res && PQresultStatus(c->res) == PGRES_FATAL_ERROR) {
        PQclear(r);
    } else {
        PQclear(c->res);
        c->res = r;
    }
}

/* The oldest op in flight has its result and its sync: hand it over. */
static void conn_op_complete(store_conn_t *c)
{
    PGresult *res = c->res;
    c->res = NULL;
    c->await_sync = false;
    if (!res) {
        conn_dead(c, "statement ended without a result");
        return;
    }
    const char *sqlstate = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    /* classes 08 (connection) and 57 (operator intervention: shutdown, terminate): the server
     * is going away, which is "unavailable" for this op and those behind it, not a failed
     * statement. 57014 (canceled: statement_timeout) is this op's deadline only. */
    if (sqlstate && (strncmp(sqlstate, "08", 2) == 0 ||
                     (strncmp(sqlstate, "57", 2) == 0 && strcmp(sqlstate, "57014") != 0))) {
        conn_dead_result(c, "", res);
        return;
    }
    /* 25006 (read_only_sql_transaction): the server turned read-only under this session
     * (default_transaction_read_only set and reloaded). Nothing was written, and nothing this
     * connection carries can be: it is dropped, its ops fail as unavailable (a claim is
     * refused as not executed), and the reconnect looks for a server that takes writes. */
    if (sqlstate && strcmp(sqlstate, "25006") == 0) {
        conn_dead_result(c, "the server takes no writes: ", res);
        return;
    }
    store_op_t *op = c->fl_head;
    c->fl_head = op->next;
    if (!c->fl_head)
        c->fl_tail = NULL;
    op->next = NULL;
    op->conn = NULL;
    c->inflight--;
    if (c->inflight == 0)
        store_conn_set_state(c, STORE_CONN_IDLE);
    /* may send more ops on this connection, or kill it */
    store_op_done(c->s, op, res);
}

/* Results arrived out of the expected order. Usually the server went away mid-pipeline (a
 * FATAL error, then the socket closed, no sync): say why rather than "out of step". Takes r. */
static void conn_out_of_step(store_conn_t *c, PGresult *r, const char *what)
{
    char msg[512];
    if (PQstatus(c->pg) == CONNECTION_BAD) {
        pg_msg(c->pg, msg, sizeof(msg));
    } else if (r && PQresultStatus(r) == PGRES_FATAL_ERROR) {
        snprintf(msg, sizeof(msg), "%s", PQresultErrorMessage(r));
        msg[strcspn(msg, "\n")] = '\0';
    } else {
        snprintf(msg, sizeof(msg), "pipeline out of step: %s", what);
    }
    PQclear(r);
    conn_dead(c, msg);
}

/* Pipeline mode: matches the results to the ops in flight, oldest first. */
static void conn_drain_pipeline(store_conn_t *c)
{
    while (c->pg && c->fl_head && !PQisBusy(c->pg)) {
        PGresult *r = PQgetResult(c->pg);
        ExecStatusType rs = r ? PQresultStatus(r) : PGRES_EMPTY_QUERY;
        if (!c->await_sync) {
            if (!r) {
                c->await_sync = true; /* the op's results are over */
            } else if (rs == PGRES_PIPELINE_SYNC) {
                conn_out_of_step(c, r, "a sync before the statement's end");
                return;
            } else {
                /* PGRES_PIPELINE_ABORTED cannot happen with one sync per op, but if it did
                 * it is kept like an error: the op fails as a query error */
                conn_keep_result(c, r);
            }
            continue;
        }
        if (!r || rs != PGRES_PIPELINE_SYNC) {
            conn_out_of_step(c, r, "expected a sync");
            return;
        }
        PQclear(r);
        conn_op_complete(c);
    }
}

/* Collects whatever results are complete. */
static void conn_drain(store_conn_t *c)
{
    while (c->pg && conn_has_statement(c) && !PQisBusy(c->pg)) {
        PGresult *r = PQgetResult(c->pg);
        if (r) {
            conn_keep_result(c, r);
            continue;
        }
        PGresult *done = c->res;
        c->res = NULL;
        if (!done) {
            conn_dead(c, "statement ended without a result");
            return;
        }
        /* may send the next statement, or kill the connection */
        conn_statement_done(c, done);
    }
    if (c->state == STORE_CONN_BUSY)
        conn_drain_pipeline(c);
    if (c->pg && PQstatus(c->pg) == CONNECTION_BAD) {
        char err[256];
        conn_dead(c, pg_msg(c->pg, err, sizeof(err)));
    }
}

static void conn_poll_connect(store_conn_t *c)
{
    char err[256];
    switch (PQconnectPoll(c->pg)) {
    case PGRES_POLLING_READING:
        conn_watch(c, EV_READ, false);
        break;
    case PGRES_POLLING_WRITING:
        conn_watch(c, EV_WRITE, false);
        break;
    case PGRES_POLLING_OK:
        conn_connected(c);
        break;
    default:
        conn_dead(c, pg_msg(c->pg, err, sizeof(err)));
        break;
    }
}

static void conn_on_io(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    store_conn_t *c = arg;
    char err[256];

    if (c->state == STORE_CONN_CONNECTING) {
        conn_poll_connect(c);
        return;
    }
    if (!c->pg)
        return;
    if ((what & EV_WRITE) && c->flushing && !conn_flush(c))
        return;
    if (what & EV_READ) {
        if (!PQconsumeInput(c->pg)) {
            conn_dead(c, pg_msg(c->pg, err, sizeof(err)));
            return;
        }
        /* the server may wait for us to read before it takes the rest of our statement */
        if (c->flushing && !conn_flush(c))
            return;
    }
    conn_drain(c);
}

void store_conn_start(store_conn_t *c)
{
    store_pg_t *s = c->s;
    const char *kw[STORE_CONN_PARAMS], *val[STORE_CONN_PARAMS];
    char err[256];

    if (s->closing || c->state == STORE_CONN_CLOSED)
        return;
    store_conn_params(s, kw, val);
    c->pg = PQconnectStartParams(kw, val, 1);
    if (!c->pg) {
        fprintf(stderr, "idemgw: out of memory starting a postgres connection\n");
        abort();
    }
    store_conn_set_state(c, STORE_CONN_CONNECTING);
    conn_ready_by(c, s->connect_deadline_ms);
    if (PQstatus(c->pg) == CONNECTION_BAD || PQsetnonblocking(c->pg, 1) != 0) {
        conn_dead(c, pg_msg(c->pg, err, sizeof(err)));
        return;
    }
    /* libpq's rule for the first step: behave as if PQconnectPoll had said "writing" */
    conn_watch(c, EV_WRITE, false);
}

bool store_conn_can_send(const store_conn_t *c)
{
    return (c->state == STORE_CONN_IDLE || c->state == STORE_CONN_BUSY) &&
           c->inflight < STORE_PIPELINE_DEPTH;
}

/* Every op goes out with its own sync, and libpq 15 flushes at each sync: one send() and, on
 * loopback, one trip through the network stack per op, which Postgres then reads one by one.
 * Corking the socket while a loop pass queues its ops sends them as one segment; the cork is
 * pulled at the end of the pass, so no op waits for another. The first op of a pass leaves at
 * once, uncorked: a lone op (one client, or ops spread over the pool's connections) then costs
 * no setsockopt pair, and only the ops behind it on the same connection are corked. */
static void conn_cork(store_conn_t *c)
{
    if (!c->sent_in_pass) {
        c->sent_in_pass = true;
        event_active(c->uncork_ev, 0, 0);
        return;
    }
    if (c->corked || c->cork_unsupported)
        return;
    int one = 1;
    if (setsockopt(PQsocket(c->pg), IPPROTO_TCP, TCP_CORK, &one, sizeof(one)) != 0) {
        c->cork_unsupported = true;
        return;
    }
    c->corked = true;
    event_active(c->uncork_ev, 0, 0);
}

static void conn_uncork(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    store_conn_t *c = arg;
    c->sent_in_pass = false;
    if (!c->corked)
        return;
    c->corked = false;
    int zero = 0;
    if (c->pg)
        (void)setsockopt(PQsocket(c->pg), IPPROTO_TCP, TCP_CORK, &zero, sizeof(zero));
}

bool store_conn_send(store_conn_t *c, store_op_t *op)
{
    store_op_bind(op, c->clock_offset_ms);
    conn_cork(c);
    /* a sync per op: its own implicit transaction, so an error aborts only this op. Without
     * the sync the statement never commits, so a failure here means it did not happen. */
    const char *const *values = (const char *const *)op->values;
    int nparams = op->nparams;
    const char *look[3];
    if (op->kind == STORE_OP_CLAIM_LOOK) {
        /* the claim's own parameters, those the look reads (all text) */
        look[0] = op->values[STORE_CLAIM_P_KEY];
        look[1] = op->values[STORE_CLAIM_P_DIGEST];
        look[2] = op->values[STORE_CLAIM_P_TAKEOVER];
        values = look;
        nparams = 3;
    }
    if (!PQsendQueryPrepared(c->pg, store_stmt_name(op->kind), nparams, values, op->lengths,
                             op->formats, 0) ||
        !PQpipelineSync(c->pg)) {
        char err[256];
        conn_dead(c, pg_msg(c->pg, err, sizeof(err)));
        return false;
    }
    op->next = NULL;
    op->conn = c;
    op->sent_us = store_delay_now_us();
    if (c->fl_tail)
        c->fl_tail->next = op;
    else
        c->fl_head = op;
    c->fl_tail = op;
    c->inflight++;
    if (c->state == STORE_CONN_IDLE)
        store_conn_set_state(c, STORE_CONN_BUSY);
    /* a flush failure kills the connection, which fails the op: sent or not, it is ours */
    (void)conn_flush(c);
    return true;
}

void store_conn_abort(store_conn_t *c, const char *why)
{
    if (c->state == STORE_CONN_IDLE || c->state == STORE_CONN_BUSY)
        conn_dead(c, why);
}

/* Not ready in time: a server that accepted and stopped answering (mid-handshake, during the
 * preparation) is dropped like a refused connect, and the retry backs off. */
static void conn_on_ready_deadline(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    store_conn_t *c = arg;
    if (c->state != STORE_CONN_CONNECTING && c->state != STORE_CONN_MIGRATING &&
        c->state != STORE_CONN_PREPARING)
        return;
    char why[160];
    snprintf(why, sizeof(why), "not ready within %llu ms (the server stopped answering while %s)",
             (unsigned long long)(c->state == STORE_CONN_MIGRATING ? STORE_MIGRATE_DEADLINE_MS
                                                                   : c->s->connect_deadline_ms),
             conn_state_names[c->state]);
    conn_dead(c, why);
}

static void conn_on_retry(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    store_conn_start(arg);
}

store_op_t *store_conn_close(store_conn_t *c)
{
    store_op_t *op = conn_take_inflight(c);
    conn_teardown(c);
    if (c->retry_ev)
        event_free(c->retry_ev);
    if (c->ready_ev)
        event_free(c->ready_ev);
    if (c->rd_ev)
        event_free(c->rd_ev);
    if (c->wr_ev)
        event_free(c->wr_ev);
    if (c->uncork_ev)
        event_free(c->uncork_ev);
    c->retry_ev = c->ready_ev = c->rd_ev = c->wr_ev = c->uncork_ev = NULL;
    store_conn_set_state(c, STORE_CONN_CLOSED);
    return op;
}
