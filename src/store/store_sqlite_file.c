/* The embedded store's file: how a process holds it (alone, or as one of its peers), the lock
 * that says so, and its schema. The writer thread, the ops and the interface live in
 * store_sqlite.c. */
#include "store_sqlite_int.h"

#include "log.h"
#include "store_migrations.h"
#include "store_sqlite.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

bool sq_exec(sqlite3 *db, const char *sql)
{
    return sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK;
}

/* Codes that say the file, not the statement, is in trouble: "unavailable". */
store_status_t sq_status(int rc)
{
    switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_IOERR:
    case SQLITE_FULL:
    case SQLITE_CANTOPEN:
    case SQLITE_PROTOCOL:
    case SQLITE_NOMEM:
        return STORE_ERR_UNAVAILABLE;
    default:
        return STORE_ERR_STATEMENT;
    }
}

sq_plan_t sq_plan(bool shared, bool peers)
{
    if (shared) /* an operator's command: it looks beside whoever serves, makes nothing */
        return (sq_plan_t){.lock = SQ_LOCK_NONE};
    if (peers)
        /* SQLite's own VFS: the gathering one delays a transaction's writes to its commit
         * frame, which is made for one process writing the file all the time (see
         * store_sqlite_vfs.c); a peer's commits gain little from one write fewer, and SQLite's
         * VFS is the one its multi-process locking is proven with. */
        return (sq_plan_t){.lock = SQ_LOCK_SHARED, .create = true, .guard = true};
    return (sq_plan_t){
        .lock = SQ_LOCK_EXCLUSIVE, .create = true, .gather_wal = true, .guard = true};
}

/* The processes that hold the lock: a gateway alone (its pid is in the file), or peers. Asked
 * after a lock was refused; peers are told apart by a shared lock being granted now. */
static void describe_holder(int fd, const char *lock_path, char *out, size_t len)
{
    int probe = open(lock_path, O_RDONLY | O_CLOEXEC);
    bool peers = probe >= 0 && flock(probe, LOCK_SH | LOCK_NB) == 0;
    if (probe >= 0)
        close(probe); /* and with it the shared lock, if it was granted */
    if (peers) {
        snprintf(out, len, "by processes that share it (idemgw stdio: copies of one command)");
        return;
    }
    char pid[32] = "";
    ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);
    pid[n > 0 ? n : 0] = '\0';
    pid[strcspn(pid, "\n")] = '\0';
    if (pid[0])
        snprintf(out, len, "by another process (pid %s)", pid);
    else
        snprintf(out, len, "by another process");
}

/* A gateway holds an exclusive flock on PATH.lock for the store's life, and writes its pid
 * there, so a refusal can name it; peers hold a shared one (no pid: there are several, and
 * the file's pid is read only when the holder is exclusive). Each mode refuses the other. */
bool sq_lock_file(const char *path, sq_lock_t mode, int *out, char *msg, size_t msglen)
{
    *out = -1;
    if (mode == SQ_LOCK_NONE)
        return true;
    char *lock_path = xasprintf("%s.lock", path);
    int fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(msg, msglen, "cannot open the lock file %s: %s", lock_path, strerror(errno));
        free(lock_path);
        return false;
    }
    bool exclusive = mode == SQ_LOCK_EXCLUSIVE;
    if (flock(fd, (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0) {
        int err = errno;
        char holder[96];
        describe_holder(fd, lock_path, holder, sizeof(holder));
        if (err == EWOULDBLOCK && exclusive)
            snprintf(msg, msglen,
                     "the embedded store %s is in use %s, holding %s: one gateway process "
                     "per file; several replicas or workers need Postgres (database_url: "
                     "postgres://...)",
                     path, holder, lock_path);
        else if (err == EWOULDBLOCK)
            snprintf(msg, msglen,
                     "the embedded store %s is in use %s, holding %s alone: a gateway "
                     "serving from it; give this one another file (database_url: sqlite:PATH)",
                     path, holder, lock_path);
        else
            snprintf(msg, msglen, "cannot lock %s: %s", lock_path, strerror(err));
        close(fd);
        free(lock_path);
        return false;
    }
    if (exclusive) {
        char pid[32];
        int len = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
        if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len)
            log_warn(0, "store: cannot write the pid into %s", lock_path);
    }
    free(lock_path);
    *out = fd;
    return true;
}

/* Brings the schema up to date in one transaction; the same rules as Postgres (a newer schema
 * is refused, a missing one is applied only with migrate). Nothing is created when it is
 * refused: the transaction rolls back. */
store_status_t sq_migrate(sqlite3 *db, bool allow, char *msg, size_t msglen)
{
    int known = store_sqlite_schema_version(), version = -1;
    sqlite3_stmt *st = NULL;
    store_status_t rc = STORE_ERR_STATEMENT;
    if (!sq_exec(db, "BEGIN IMMEDIATE") ||
        !sq_exec(db,
                 "CREATE TABLE IF NOT EXISTS schema_migrations ("
                 " version INTEGER PRIMARY KEY,"
                 " name TEXT NOT NULL,"
                 " applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')))") ||
        sqlite3_prepare_v2(db, "SELECT coalesce(max(version), 0) FROM schema_migrations", -1, &st,
                           NULL) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW) {
        snprintf(msg, msglen, "reading the schema version: %s", sqlite3_errmsg(db));
        rc = sq_status(sqlite3_extended_errcode(db));
        goto out;
    }
    version = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    st = NULL;
    if (version > known) {
        snprintf(msg, msglen,
                 "database schema version %d is newer than this binary knows (%d); run a newer "
                 "idemgw",
                 version, known);
        rc = STORE_ERR_SCHEMA;
        goto out;
    }
    if (version < known && !allow) {
        snprintf(msg, msglen,
                 "database schema version %d, this binary needs %d; migrations are disabled "
                 "(enable them or apply sql/sqlite/ by hand)",
                 version, known);
        rc = STORE_ERR_SCHEMA;
        goto out;
    }
    for (int i = version; i < known; i++) {
        const store_migration_t *m = &store_sqlite_migrations[i];
        char *ins = xasprintf("INSERT INTO schema_migrations (version, name) VALUES (%d, '%s')",
                              m->version, m->name);
        bool ok = sq_exec(db, m->sql) && sq_exec(db, ins);
        free(ins);
        if (!ok) {
            snprintf(msg, msglen, "applying %s: %s", m->name, sqlite3_errmsg(db));
            goto out;
        }
    }
    if (!sq_exec(db, "COMMIT")) {
        snprintf(msg, msglen, "committing the migrations: %s", sqlite3_errmsg(db));
        rc = sq_status(sqlite3_extended_errcode(db));
        goto out;
    }
    if (version < known)
        log_info(0, "store: sqlite schema migrated from version %d to %d", version, known);
    return STORE_OK;
out:
    sqlite3_finalize(st);
    if (!sqlite3_get_autocommit(db))
        sq_exec(db, "ROLLBACK");
    return rc;
}
