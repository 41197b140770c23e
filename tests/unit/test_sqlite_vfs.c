/* The embedded store's VFS (src/store/store_sqlite_vfs.c), which gathers a -wal file's writes
 * into one per transaction: every commit is in the file when it returns, for another
 * connection reading beside it and for a process that dies right after (a child ending with
 * _exit, no close), through transactions that spill pages before they commit or roll back (and
 * then leave nothing to be written over another writer's commits), a checkpoint and the log's
 * restart. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

/* The store's own (store_sqlite_int.h is private to the store's files). */
bool sq_vfs_register(void);
void sq_vfs_forget(sqlite3 *db);
#define VFS "idemgw-unix"

static char dir[] = "/tmp/idemgw-vfs-XXXXXX";
static char path[256];

static int setup(void **state)
{
    if (!mkdtemp(dir))
        return -1;
    snprintf(path, sizeof(path), "%s/t.db", dir);
    return sq_vfs_register() ? 0 : -1;
}

static int teardown(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void exec_ok(sqlite3 *db, const char *sql)
{
    char *err = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &err);
    if (rc != SQLITE_OK)
        fail_msg("%s: %s", sql, err ? err : sqlite3_errmsg(db));
}

static sqlite3 *open_db(const char *vfs)
{
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, vfs),
                     SQLITE_OK);
    exec_ok(db, "PRAGMA journal_mode = WAL");
    return db;
}

static int64_t one_int(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int64_t v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

/* Rows of about 3 KiB, a few pages a transaction; content fixed by n, so a reader checks it. */
static void insert_rows(sqlite3 *db, int from, int count)
{
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db, "INSERT INTO t (n, body) VALUES (?, ?)", -1, &st, NULL),
                     SQLITE_OK);
    char body[3000];
    for (int n = from; n < from + count; n++) {
        memset(body, 'a' + n % 26, sizeof(body));
        sqlite3_bind_int(st, 1, n);
        sqlite3_bind_blob(st, 2, body, sizeof(body), SQLITE_STATIC);
        assert_int_equal(sqlite3_step(st), SQLITE_DONE);
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
}

/* What a reader sees: the rows 0..n-1, each with its content. */
static void assert_rows(sqlite3 *db, int n)
{
    assert_int_equal(one_int(db, "SELECT count(*) FROM t"), n);
    assert_int_equal(one_int(db, "SELECT count(*) FROM t WHERE length(body) = 3000 AND "
                                 "hex(substr(body, 1, 1)) = hex(char(97 + n % 26)) AND "
                                 "hex(substr(body, 3000, 1)) = hex(char(97 + n % 26))"),
                     n);
}

static void fresh(void)
{
    static const char *const suffixes[] = {"", "-wal", "-shm"};
    char p[300];
    for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++) {
        snprintf(p, sizeof(p), "%s%s", path, suffixes[i]);
        unlink(p);
    }
}

/* A connection of SQLite's own reads every commit as it returns: synced (FULL) or not
 * (NORMAL), through a checkpoint and the log starting over. */
static void every_commit_is_read_beside_it(void **state)
{
    fresh();
    sqlite3 *w = open_db(VFS);
    sqlite3 *r = open_db(NULL);
    exec_ok(w, "CREATE TABLE t (n INTEGER PRIMARY KEY, body BLOB)");
    int n = 0;
    for (int tx = 0; tx < 300; tx++) {
        exec_ok(w, tx % 2 ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL");
        exec_ok(w, "BEGIN IMMEDIATE");
        insert_rows(w, n, 1 + tx % 5);
        exec_ok(w, "COMMIT");
        n += 1 + tx % 5;
        assert_rows(r, n);
        if (tx == 150) /* the log starts over after a whole checkpoint */
            exec_ok(w, "PRAGMA wal_checkpoint(TRUNCATE)");
    }
    assert_int_equal(
        one_int(r, "SELECT count(*) FROM pragma_integrity_check WHERE integrity_check = 'ok'"), 1);
    sqlite3_close(r);
    sqlite3_close(w);
}

/* A page cache of a few pages makes a transaction write frames before its commit (a spill);
 * one rolled back leaves nothing, one committed leaves everything, including pages written a
 * second time into frames of the same transaction. */
static void spilled_transactions_commit_or_roll_back_whole(void **state)
{
    fresh();
    sqlite3 *w = open_db(VFS);
    sqlite3 *r = open_db(NULL);
    exec_ok(w, "PRAGMA cache_size = 2");
    exec_ok(w, "CREATE TABLE t (n INTEGER PRIMARY KEY, body BLOB)");
    exec_ok(w, "BEGIN IMMEDIATE");
    insert_rows(w, 0, 50);
    exec_ok(w, "ROLLBACK");
    assert_rows(r, 0);
    exec_ok(w, "BEGIN IMMEDIATE");
    insert_rows(w, 0, 50);
    exec_ok(w, "UPDATE t SET body = body WHERE n % 7 = 0"); /* pages again, same transaction */
    exec_ok(w, "COMMIT");
    assert_rows(r, 50);
    assert_int_equal(
        one_int(r, "SELECT count(*) FROM pragma_integrity_check WHERE integrity_check = 'ok'"), 1);
    sqlite3_close(r);
    sqlite3_close(w);
}

/* A transaction that spilled frames and rolled back leaves no write behind for later: once it
 * ended, another connection (another process: `idemgw key` beside the gateway) takes the write
 * lock and commits frames at the same offsets of the -wal, which a late write of the rolled-back
 * frames would overwrite. With the log checkpointed first, the rollback reads nothing from it,
 * so nothing writes the gathered frames before it ends. A fresh reader checks the other
 * connection's commits. */
static void rolled_back_frames_never_overwrite_another_writer(void **state)
{
    fresh();
    sqlite3 *w = open_db(VFS);
    sqlite3 *other = open_db(NULL);
    exec_ok(w, "CREATE TABLE t (n INTEGER PRIMARY KEY, body BLOB)");
    exec_ok(w, "PRAGMA cache_size = 2");
    for (int round = 0; round < 8; round++) {
        /* every commit in the database file: the rolled-back frames are the log's first */
        exec_ok(w, "PRAGMA wal_checkpoint(TRUNCATE)");
        exec_ok(w, "BEGIN IMMEDIATE");
        insert_rows(w, 1000 + round * 20, 5 + round);
        exec_ok(w, "ROLLBACK");
        sq_vfs_forget(w); /* as the store's writer does after every batch */
        exec_ok(other, "BEGIN IMMEDIATE");
        insert_rows(other, round * 20, 20);
        exec_ok(other, "COMMIT");
        /* the first connection goes on: a read, and its next transaction */
        assert_int_equal(one_int(w, "SELECT count(*) FROM t WHERE n < 1000"), (round + 1) * 20);
        exec_ok(w, "BEGIN IMMEDIATE");
        exec_ok(w, "UPDATE t SET body = body WHERE n = 0");
        exec_ok(w, "COMMIT");
        sqlite3 *r = open_db(NULL);
        assert_rows(r, (round + 1) * 20);
        assert_int_equal(
            one_int(r, "SELECT count(*) FROM pragma_integrity_check WHERE integrity_check = 'ok'"),
            1);
        sqlite3_close(r);
    }
    sqlite3_close(other);
    sqlite3_close(w);
}

/* A process that dies right after its commits (no close, nothing flushed on the way out)
 * leaves every one of them in the files. */
static void commits_survive_the_process(void **state)
{
    fresh();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        sqlite3 *w = open_db(VFS);
        exec_ok(w, "PRAGMA synchronous = NORMAL");
        exec_ok(w, "CREATE TABLE t (n INTEGER PRIMARY KEY, body BLOB)");
        for (int tx = 0; tx < 40; tx++) {
            exec_ok(w, "BEGIN IMMEDIATE");
            insert_rows(w, tx * 3, 3);
            exec_ok(w, "COMMIT");
        }
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    sqlite3 *r = open_db(NULL);
    assert_rows(r, 120);
    sqlite3_close(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_commit_is_read_beside_it),
        cmocka_unit_test(spilled_transactions_commit_or_roll_back_whole),
        cmocka_unit_test(rolled_back_frames_never_overwrite_another_writer),
        cmocka_unit_test(commits_survive_the_process),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
