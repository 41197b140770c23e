/* Faults under the embedded store's VFS (src/store/store_sqlite_vfs.c), which gathers a -wal
 * file's writes into one per transaction. A fault layer stands in for SQLite's "unix" VFS
 * (registered under that name before the store's VFS looks it up, so the store's VFS wraps
 * it), and makes the -wal file's writes fail, write only half, its fsync fail, or its reads
 * fail. Each time the commit must fail whole: no reader sees any of it, a process that dies
 * right after leaves a file whose recovery holds none of it, and the next commit works. Then
 * the same through the store itself: a claim whose commit fails is answered unavailable and
 * leaves no claim behind. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/event.h>
#include <sqlite3.h>

#include "store.h"
#include "store_sqlite.h"
#include "store_sqlite_int.h"
#include "util.h"

/* --- the fault layer: SQLite's unix VFS, with faults on -wal files when armed --- */

typedef enum { FAULT_NONE = 0, FAULT_WRITE, FAULT_SHORT_WRITE, FAULT_SYNC, FAULT_READ } fault_t;

static _Atomic int armed;       /* fault_t */
static _Atomic int faults_made; /* how many operations it failed */
static _Atomic int wal_syncs;   /* fsyncs of -wal files */

typedef struct {
    sqlite3_file base;
    sqlite3_file *inner;
    bool wal;
} ffile_t;

static sqlite3_vfs *real_unix;
static sqlite3_vfs fault_vfs;
static sqlite3_io_methods fault_methods;

#define INNER(f) (((ffile_t *)(f))->inner)
#define IS_WAL(f) (((ffile_t *)(f))->wal)

static bool fault_now(sqlite3_file *f, fault_t kind)
{
    if (!IS_WAL(f) || atomic_load(&armed) != (int)kind)
        return false;
    atomic_fetch_add(&faults_made, 1);
    return true;
}

static int f_close(sqlite3_file *f)
{
    return INNER(f)->pMethods->xClose(INNER(f));
}

static int f_read(sqlite3_file *f, void *p, int amt, sqlite3_int64 off)
{
    if (fault_now(f, FAULT_READ))
        return SQLITE_IOERR_READ;
    return INNER(f)->pMethods->xRead(INNER(f), p, amt, off);
}

static int f_write(sqlite3_file *f, const void *p, int amt, sqlite3_int64 off)
{
    if (fault_now(f, FAULT_WRITE))
        return SQLITE_IOERR_WRITE;
    if (fault_now(f, FAULT_SHORT_WRITE)) {
        /* the first half reaches the file, as a write cut off by a full disk would */
        INNER(f)->pMethods->xWrite(INNER(f), p, amt / 2, off);
        return SQLITE_FULL;
    }
    return INNER(f)->pMethods->xWrite(INNER(f), p, amt, off);
}

static int f_truncate(sqlite3_file *f, sqlite3_int64 size)
{
    return INNER(f)->pMethods->xTruncate(INNER(f), size);
}

static int f_sync(sqlite3_file *f, int flags)
{
    if (IS_WAL(f))
        atomic_fetch_add(&wal_syncs, 1);
    if (fault_now(f, FAULT_SYNC))
        return SQLITE_IOERR_FSYNC;
    return INNER(f)->pMethods->xSync(INNER(f), flags);
}

static int f_file_size(sqlite3_file *f, sqlite3_int64 *size)
{
    return INNER(f)->pMethods->xFileSize(INNER(f), size);
}

static int f_lock(sqlite3_file *f, int level)
{
    return INNER(f)->pMethods->xLock(INNER(f), level);
}

static int f_unlock(sqlite3_file *f, int level)
{
    return INNER(f)->pMethods->xUnlock(INNER(f), level);
}

static int f_check_reserved(sqlite3_file *f, int *out)
{
    return INNER(f)->pMethods->xCheckReservedLock(INNER(f), out);
}

static int f_file_control(sqlite3_file *f, int op, void *arg)
{
    return INNER(f)->pMethods->xFileControl(INNER(f), op, arg);
}

static int f_sector_size(sqlite3_file *f)
{
    return INNER(f)->pMethods->xSectorSize(INNER(f));
}

static int f_device(sqlite3_file *f)
{
    return INNER(f)->pMethods->xDeviceCharacteristics(INNER(f));
}

static int f_shm_map(sqlite3_file *f, int pg, int pgsz, int extend, void volatile **pp)
{
    return INNER(f)->pMethods->xShmMap(INNER(f), pg, pgsz, extend, pp);
}

static int f_shm_lock(sqlite3_file *f, int offset, int n, int flags)
{
    return INNER(f)->pMethods->xShmLock(INNER(f), offset, n, flags);
}

static void f_shm_barrier(sqlite3_file *f)
{
    INNER(f)->pMethods->xShmBarrier(INNER(f));
}

static int f_shm_unmap(sqlite3_file *f, int delete_flag)
{
    return INNER(f)->pMethods->xShmUnmap(INNER(f), delete_flag);
}

static int f_fetch(sqlite3_file *f, sqlite3_int64 off, int amt, void **pp)
{
    *pp = NULL;
    if (INNER(f)->pMethods->iVersion < 3)
        return SQLITE_OK;
    return INNER(f)->pMethods->xFetch(INNER(f), off, amt, pp);
}

static int f_unfetch(sqlite3_file *f, sqlite3_int64 off, void *p)
{
    if (INNER(f)->pMethods->iVersion < 3)
        return SQLITE_OK;
    return INNER(f)->pMethods->xUnfetch(INNER(f), off, p);
}

static size_t inner_at(void)
{
    size_t a = _Alignof(max_align_t);
    return (sizeof(ffile_t) + a - 1) / a * a;
}

static int f_open(sqlite3_vfs *v, const char *name, sqlite3_file *f, int flags, int *out_flags)
{
    (void)v;
    ffile_t *ff = (ffile_t *)f;
    memset(ff, 0, sizeof(*ff));
    ff->inner = (sqlite3_file *)((char *)f + inner_at());
    ff->wal = (flags & SQLITE_OPEN_WAL) != 0;
    int rc = real_unix->xOpen(real_unix, name, ff->inner, flags, out_flags);
    if (rc != SQLITE_OK || !ff->inner->pMethods) {
        f->pMethods = NULL;
        return rc != SQLITE_OK ? rc : SQLITE_CANTOPEN;
    }
    f->pMethods = &fault_methods;
    return SQLITE_OK;
}

/* The fault layer becomes "unix" (and the default) before the store's VFS is made. */
static bool fault_vfs_install(void)
{
    real_unix = sqlite3_vfs_find("unix");
    if (!real_unix)
        return false;
    fault_methods = (sqlite3_io_methods){
        .iVersion = 3,
        .xClose = f_close,
        .xRead = f_read,
        .xWrite = f_write,
        .xTruncate = f_truncate,
        .xSync = f_sync,
        .xFileSize = f_file_size,
        .xLock = f_lock,
        .xUnlock = f_unlock,
        .xCheckReservedLock = f_check_reserved,
        .xFileControl = f_file_control,
        .xSectorSize = f_sector_size,
        .xDeviceCharacteristics = f_device,
        .xShmMap = f_shm_map,
        .xShmLock = f_shm_lock,
        .xShmBarrier = f_shm_barrier,
        .xShmUnmap = f_shm_unmap,
        .xFetch = f_fetch,
        .xUnfetch = f_unfetch,
    };
    fault_vfs = *real_unix;
    fault_vfs.pNext = NULL;
    fault_vfs.szOsFile = (int)(inner_at() + (size_t)real_unix->szOsFile);
    fault_vfs.xOpen = f_open;
    return sqlite3_vfs_register(&fault_vfs, 1) == SQLITE_OK &&
           sqlite3_vfs_find("unix") == &fault_vfs;
}

static void arm(fault_t kind)
{
    atomic_store(&faults_made, 0);
    atomic_store(&armed, (int)kind);
}

static int disarm(void)
{
    atomic_store(&armed, FAULT_NONE);
    return atomic_load(&faults_made);
}

/* --- a database through the store's VFS --- */

static char dir[] = "/tmp/idemgw-vfsfault-XXXXXX";
static char path[256];
static int file_n;
static struct event_base *base;

static int group_setup(void **state)
{
    (void)state;
    if (!mkdtemp(dir) || !fault_vfs_install() || !sq_vfs_register())
        return -1;
    base = event_base_new();
    return base ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    event_base_free(base);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void fresh(void)
{
    snprintf(path, sizeof(path), "%s/t-%d.db", dir, ++file_n);
}

static void exec_ok(sqlite3 *db, const char *sql)
{
    char *err = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK)
        fail_msg("%s: %s", sql, err ? err : sqlite3_errmsg(db));
}

/* vfs NULL: the default, which is the fault layer alone (as a reader beside the store) */
static sqlite3 *open_db(const char *vfs)
{
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, vfs),
                     SQLITE_OK);
    exec_ok(db, "PRAGMA journal_mode = WAL");
    exec_ok(db, "PRAGMA synchronous = FULL");
    exec_ok(db, "PRAGMA wal_autocheckpoint = 0"); /* the commits stay in the -wal */
    return db;
}

static int64_t count(sqlite3 *db)
{
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT count(*) FROM t", -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int64_t v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

static void integrity_ok(sqlite3 *db)
{
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(st, 0), "ok");
    sqlite3_finalize(st);
}

/* count rows of about 3 KiB each in one transaction; the commit's result code */
static int insert_rows(sqlite3 *db, int from, int n)
{
    exec_ok(db, "BEGIN IMMEDIATE");
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db, "INSERT INTO t (n, body) VALUES (?, ?)", -1, &st, NULL),
                     SQLITE_OK);
    char body[3000];
    for (int i = from; i < from + n; i++) {
        memset(body, 'a' + i % 26, sizeof(body));
        sqlite3_bind_int(st, 1, i);
        sqlite3_bind_blob(st, 2, body, sizeof(body), SQLITE_STATIC);
        assert_int_equal(sqlite3_step(st), SQLITE_DONE);
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    int rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    if (rc != SQLITE_OK && !sqlite3_get_autocommit(db))
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    sq_vfs_forget(db); /* what the store does once a transaction is over */
    return rc;
}

/* A database of 10 committed rows, through the store's VFS */
static sqlite3 *ten_rows(void)
{
    fresh();
    sqlite3 *db = open_db(SQ_VFS_NAME);
    exec_ok(db, "CREATE TABLE t (n INTEGER PRIMARY KEY, body BLOB)");
    assert_int_equal(insert_rows(db, 0, 10), SQLITE_OK);
    return db;
}

/* A commit of n rows failed by kind: it fails, no reader sees any of it, the database is
 * whole, and the next commit works. */
static void commit_fails_whole(fault_t kind, int n)
{
    sqlite3 *db = ten_rows();
    sqlite3 *reader = open_db(NULL);
    assert_int_equal(count(reader), 10);
    arm(kind);
    int rc = insert_rows(db, 10, n);
    assert_true(disarm() > 0);
    assert_int_not_equal(rc, SQLITE_OK);
    assert_true(sqlite3_get_autocommit(db));
    assert_int_equal(count(reader), 10);
    assert_int_equal(count(db), 10);
    integrity_ok(reader);
    /* the store's next commit goes where the failed one would have */
    assert_int_equal(insert_rows(db, 100, 3), SQLITE_OK);
    assert_int_equal(count(reader), 13);
    sqlite3_close(reader);
    sqlite3_close(db);
    reader = open_db(NULL);
    assert_int_equal(count(reader), 13);
    integrity_ok(reader);
    sqlite3_close(reader);
}

static void a_failing_write_of_the_commit(void **state)
{
    (void)state;
    commit_fails_whole(FAULT_WRITE, 5); /* gathered, written with the commit frame */
}

static void a_failing_write_of_a_large_commit(void **state)
{
    (void)state;
    commit_fails_whole(FAULT_WRITE, 60); /* past the gathering limit: written before the end */
}

static void a_short_write_of_the_commit(void **state)
{
    (void)state;
    commit_fails_whole(FAULT_SHORT_WRITE, 5);
}

static void a_failing_fsync_of_the_commit(void **state)
{
    (void)state;
    commit_fails_whole(FAULT_SYNC, 5);
}

/* A process that dies right after a commit failed half-written: what it left in the -wal is
 * read back on recovery, and holds none of that commit. */
static void recovery_after_a_short_write_holds_none_of_it(void **state)
{
    (void)state;
    sqlite3 *db = ten_rows();
    sqlite3_close(db);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        sqlite3 *c = open_db(SQ_VFS_NAME);
        assert_int_equal(insert_rows(c, 10, 3), SQLITE_OK); /* in the -wal, not checkpointed */
        arm(FAULT_SHORT_WRITE);
        int rc = insert_rows(c, 20, 40);
        _exit(disarm() > 0 && rc != SQLITE_OK ? 0 : 1);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char wal[300];
    snprintf(wal, sizeof(wal), "%s-wal", path);
    assert_int_equal(access(wal, F_OK), 0); /* nobody checkpointed it away */
    db = open_db(SQ_VFS_NAME);
    assert_int_equal(count(db), 13);
    integrity_ok(db);
    sqlite3_close(db);
}

static void a_failing_read_of_the_log(void **state)
{
    (void)state;
    sqlite3 *db = ten_rows();
    sqlite3 *reader = open_db(NULL);
    arm(FAULT_READ);
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(reader, "SELECT count(*), sum(length(body)) FROM t", -1, &st, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    sqlite3_finalize(st);
    /* and a checkpoint, which reads the log to copy it into the database */
    int crc = sqlite3_wal_checkpoint_v2(db, NULL, SQLITE_CHECKPOINT_TRUNCATE, NULL, NULL);
    assert_true(disarm() > 0);
    assert_int_not_equal(rc, SQLITE_ROW);
    assert_int_not_equal(crc, SQLITE_OK);
    assert_int_equal(count(reader), 10);
    assert_int_equal(sqlite3_wal_checkpoint_v2(db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL),
                     SQLITE_OK);
    assert_int_equal(insert_rows(db, 10, 2), SQLITE_OK);
    assert_int_equal(count(reader), 12);
    integrity_ok(reader);
    sqlite3_close(reader);
    sqlite3_close(db);
}

/* --- through the store --- */

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
}

static bool wait_flag(bool *flag)
{
    uint64_t deadline = util_now_ms() + 10000;
    struct event *tick = event_new(base, -1, EV_PERSIST, tick_cb, NULL);
    struct timeval tv = {0, 10000};
    event_add(tick, &tv);
    while (!*flag && util_now_ms() < deadline)
        event_base_loop(base, EVLOOP_ONCE);
    event_free(tick);
    return *flag;
}

typedef struct {
    bool done;
    store_status_t st;
    bool acquired;
    int64_t fence;
    store_state_t state;
} claim_out_t;

static void claim_cb(store_status_t st, const store_claim_result_t *res, void *arg)
{
    claim_out_t *o = arg;
    o->done = true;
    o->st = st;
    if (st != STORE_OK)
        return;
    o->acquired = res->acquired;
    o->fence = res->fence;
    o->state = res->row.state;
}

static claim_out_t claim(store_t *s, const char *key)
{
    claim_out_t o = {0};
    store_claim_req_t r = {.key = key,
                           .tool = "refund",
                           .subject = "local:u",
                           .args_digest = "d1",
                           .session_id = "s",
                           .jsonrpc_id = "1",
                           .lease_ms = 60000,
                           .window_ms = 600000};
    assert_int_equal(store_claim(s, &r, claim_cb, &o), STORE_OK);
    assert_true(wait_flag(&o.done));
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

static finish_out_t finish(store_t *s, const char *key, int64_t fence)
{
    finish_out_t o = {0};
    store_finish_req_t f = {.key = key,
                            .fence = fence,
                            .state = STORE_STATE_SUCCEEDED,
                            .result = "{\"ok\":1}",
                            .result_len = 8,
                            .window_ms = 600000};
    assert_int_equal(store_finish(s, &f, finish_cb, &o), STORE_OK);
    assert_true(wait_flag(&o.done));
    return o;
}

static void a_claim_whose_commit_fails_leaves_no_claim(void **state)
{
    (void)state;
    fresh();
    store_options_t o = {.migrate = true, .timeout_ms = 5000};
    store_sqlite_options_t sq = {.path = path};
    char msg[300] = "";
    store_t *s = store_sqlite_new(base, &o, &sq, msg, sizeof(msg));
    if (!s)
        fail_msg("store: %s", msg);
    claim_out_t a = claim(s, "k-before");
    assert_int_equal(a.st, STORE_OK);
    assert_true(a.acquired);

    static const fault_t kinds[] = {FAULT_WRITE, FAULT_SHORT_WRITE};
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        char key[32];
        snprintf(key, sizeof(key), "k-%zu", i);
        arm(kinds[i]);
        claim_out_t failed = claim(s, key);
        assert_true(disarm() > 0);
        assert_int_equal(failed.st, STORE_ERR_UNAVAILABLE);
        /* nothing of it holds: the same key is a new claim, not a duplicate */
        claim_out_t again = claim(s, key);
        assert_int_equal(again.st, STORE_OK);
        assert_true(again.acquired);
    }

    /* a finish whose commit fails leaves the claim in progress */
    arm(FAULT_WRITE);
    finish_out_t f = finish(s, "k-before", a.fence);
    assert_true(disarm() > 0);
    assert_int_not_equal(f.st, STORE_OK);
    claim_out_t dup = claim(s, "k-before");
    assert_int_equal(dup.st, STORE_OK);
    assert_false(dup.acquired);
    assert_int_equal(dup.state, STORE_STATE_IN_PROGRESS);
    f = finish(s, "k-before", a.fence);
    assert_int_equal(f.st, STORE_OK);
    assert_true(f.matched);
    store_free(s);
}

/* A claim is answered only once its commit is on disk: the -wal is synced, and a sync that
 * fails fails the claim, leaving none. ("PRAGMA synchronous = X" takes effect when it is
 * prepared, not when it is stepped: a store that prepared its two levels once at open ran at
 * the last one, NORMAL, and failed this.) */
static void a_claim_waits_for_its_fsync(void **state)
{
    (void)state;
    fresh();
    store_options_t o = {.migrate = true, .timeout_ms = 5000};
    store_sqlite_options_t sq = {.path = path};
    char msg[300] = "";
    store_t *s = store_sqlite_new(base, &o, &sq, msg, sizeof(msg));
    if (!s)
        fail_msg("store: %s", msg);
    int before = atomic_load(&wal_syncs);
    claim_out_t a = claim(s, "k-1");
    assert_int_equal(a.st, STORE_OK);
    assert_true(atomic_load(&wal_syncs) > before);
    arm(FAULT_SYNC);
    claim_out_t failed = claim(s, "k-2");
    assert_true(disarm() > 0);
    assert_int_equal(failed.st, STORE_ERR_UNAVAILABLE);
    claim_out_t again = claim(s, "k-2");
    assert_int_equal(again.st, STORE_OK);
    assert_true(again.acquired);
    store_free(s);
}

/* --- the -wal file's methods, called as SQLite calls them --- */

/* A -wal file opened through the store's VFS beside an empty database file. */
static sqlite3_file *open_wal(char *name, size_t len)
{
    fresh();
    FILE *db = fopen(path, "w");
    assert_non_null(db);
    fclose(db);
    snprintf(name, len, "%s-wal", path);
    sqlite3_vfs *v = sqlite3_vfs_find(SQ_VFS_NAME);
    assert_non_null(v);
    sqlite3_file *f = calloc(1, (size_t)v->szOsFile);
    int out = 0;
    assert_int_equal(
        v->xOpen(v, name, f, SQLITE_OPEN_WAL | SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, &out),
        SQLITE_OK);
    return f;
}

static void close_wal(sqlite3_file *f)
{
    assert_int_equal(f->pMethods->xClose(f), SQLITE_OK);
    free(f);
}

static void read_back(sqlite3_file *f, sqlite3_int64 off, const char *want, int n)
{
    char got[64];
    assert_true(n <= (int)sizeof(got));
    assert_int_equal(f->pMethods->xRead(f, got, n, off), SQLITE_OK);
    assert_memory_equal(got, want, (size_t)n);
}

/* Writes that do not follow one another are not merged: what is gathered goes first, so an
 * overlapping later write wins, as it would without the gathering. */
static void a_write_elsewhere_writes_what_is_gathered_first(void **state)
{
    (void)state;
    char name[300];
    sqlite3_file *f = open_wal(name, sizeof(name));
    const sqlite3_io_methods *m = f->pMethods;
    assert_int_equal(m->xWrite(f, "AAAA", 4, 0), SQLITE_OK);
    assert_int_equal(m->xWrite(f, "BB", 2, 2), SQLITE_OK);
    assert_int_equal(m->xWrite(f, "CC", 2, 4), SQLITE_OK); /* follows BB: gathered with it */
    read_back(f, 0, "AABBCC", 6);
    /* a write larger than the gathering goes at once */
    size_t big = 70000;
    char *bytes = malloc(big);
    memset(bytes, 'z', big);
    assert_int_equal(m->xWrite(f, "DD", 2, 6), SQLITE_OK);
    assert_int_equal(m->xWrite(f, bytes, (int)big, 8), SQLITE_OK);
    sqlite3_int64 size = 0;
    assert_int_equal(m->xFileSize(f, &size), SQLITE_OK);
    assert_int_equal(size, 8 + (sqlite3_int64)big);
    read_back(f, 4, "CCDDzz", 6);
    free(bytes);
    close_wal(f);
}

/* Every other method of the file writes what is gathered before doing its own work. */
static void every_method_writes_what_is_gathered_first(void **state)
{
    (void)state;
    char name[300];
    sqlite3_file *f = open_wal(name, sizeof(name));
    const sqlite3_io_methods *m = f->pMethods;
    sqlite3_int64 size = -1;
    assert_int_equal(m->xWrite(f, "0123456789", 10, 0), SQLITE_OK);
    assert_int_equal(m->xFileSize(f, &size), SQLITE_OK);
    assert_int_equal(size, 10);
    assert_int_equal(m->xWrite(f, "abc", 3, 10), SQLITE_OK);
    assert_int_equal(m->xSync(f, SQLITE_SYNC_NORMAL), SQLITE_OK);
    assert_int_equal(m->xWrite(f, "def", 3, 13), SQLITE_OK);
    int lock = -1;
    assert_int_equal(m->xFileControl(f, SQLITE_FCNTL_LOCKSTATE, &lock), SQLITE_OK);
    assert_int_equal(m->xWrite(f, "ghi", 3, 16), SQLITE_OK);
    assert_int_equal(m->xTruncate(f, 18), SQLITE_OK); /* the gathered bytes first, then cut */
    assert_int_equal(m->xFileSize(f, &size), SQLITE_OK);
    assert_int_equal(size, 18);
    read_back(f, 8, "89abcdefgh", 10);
    assert_int_equal(m->xWrite(f, "jk", 2, 18), SQLITE_OK);
    void *map = (void *)1;
    assert_int_equal(m->xFetch(f, 0, 20, &map), SQLITE_OK);
    if (map)
        assert_int_equal(m->xUnfetch(f, 0, map), SQLITE_OK);
    assert_int_equal(m->xFileSize(f, &size), SQLITE_OK);
    assert_int_equal(size, 20);
    /* the rest are the unix file's own */
    assert_true(m->xSectorSize(f) > 0);
    (void)m->xDeviceCharacteristics(f);
    assert_int_equal(m->xLock(f, SQLITE_LOCK_SHARED), SQLITE_OK);
    int reserved = -1;
    assert_int_equal(m->xCheckReservedLock(f, &reserved), SQLITE_OK);
    assert_int_equal(reserved, 0);
    assert_int_equal(m->xUnlock(f, SQLITE_LOCK_NONE), SQLITE_OK);
    /* what is gathered at the close is written too */
    assert_int_equal(m->xWrite(f, "lm", 2, 20), SQLITE_OK);
    close_wal(f);
    FILE *in = fopen(name, "r");
    assert_non_null(in);
    char all[32] = "";
    assert_int_equal(fread(all, 1, sizeof(all), in), 22);
    fclose(in);
    assert_memory_equal(all, "0123456789abcdefghjklm", 22);
}

/* A write of what is gathered that fails is the error of the method that wrote it; nothing of
 * it is written again later. */
static void a_failing_flush_is_the_methods_error(void **state)
{
    (void)state;
    char name[300];
    sqlite3_file *f = open_wal(name, sizeof(name));
    const sqlite3_io_methods *m = f->pMethods;
    sqlite3_int64 size = -1;
    int lock = 0;
    char buf[4];
    struct {
        const char *what;
        int rc;
    } got[6];
    arm(FAULT_WRITE);
    assert_int_equal(m->xWrite(f, "xx", 2, 0), SQLITE_OK); /* only gathered */
    got[0].what = "size", got[0].rc = m->xFileSize(f, &size);
    assert_int_equal(m->xWrite(f, "xx", 2, 0), SQLITE_OK);
    got[1].what = "sync", got[1].rc = m->xSync(f, SQLITE_SYNC_NORMAL);
    assert_int_equal(m->xWrite(f, "xx", 2, 0), SQLITE_OK);
    got[2].what = "read", got[2].rc = m->xRead(f, buf, 2, 0);
    assert_int_equal(m->xWrite(f, "xx", 2, 0), SQLITE_OK);
    got[3].what = "truncate", got[3].rc = m->xTruncate(f, 0);
    assert_int_equal(m->xWrite(f, "xx", 2, 0), SQLITE_OK);
    got[4].what = "file control", got[4].rc = m->xFileControl(f, SQLITE_FCNTL_LOCKSTATE, &lock);
    assert_int_equal(m->xWrite(f, "xx", 2, 0), SQLITE_OK);
    got[5].what = "write elsewhere", got[5].rc = m->xWrite(f, "yy", 2, 100);
    int made = disarm();
    for (size_t i = 0; i < 6; i++)
        if (got[i].rc != SQLITE_IOERR_WRITE)
            fail_msg("%s: %d", got[i].what, got[i].rc);
    assert_int_equal(made, 6);
    assert_int_equal(m->xFileSize(f, &size), SQLITE_OK);
    assert_int_equal(size, 0); /* the failed bytes were dropped, not kept for later */
    arm(FAULT_WRITE);
    assert_int_equal(m->xWrite(f, "zz", 2, 0), SQLITE_OK);
    assert_int_equal(f->pMethods->xClose(f), SQLITE_IOERR_WRITE);
    disarm();
    free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_failing_write_of_the_commit),
        cmocka_unit_test(a_failing_write_of_a_large_commit),
        cmocka_unit_test(a_short_write_of_the_commit),
        cmocka_unit_test(a_failing_fsync_of_the_commit),
        cmocka_unit_test(recovery_after_a_short_write_holds_none_of_it),
        cmocka_unit_test(a_failing_read_of_the_log),
        cmocka_unit_test(a_claim_whose_commit_fails_leaves_no_claim),
        cmocka_unit_test(a_claim_waits_for_its_fsync),
        cmocka_unit_test(a_write_elsewhere_writes_what_is_gathered_first),
        cmocka_unit_test(every_method_writes_what_is_gathered_first),
        cmocka_unit_test(a_failing_flush_is_the_methods_error),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
