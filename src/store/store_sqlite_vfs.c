/* The embedded store's write-ahead log written in one system call per transaction.
 *
 * SQLite appends each page to the -wal file as two writes, the frame's 24-byte header and then
 * the page: a commit of 7 pages is 14 pwrite() calls, which were a third of the writer
 * thread's system calls per protected call. This VFS is the system's own ("unix") with one
 * change: a -wal file's writes that follow one another are gathered in memory and written with
 * one pwrite(), at the latest when the transaction's commit frame (a frame header whose
 * database-size field is not zero) has its page. So every frame of a commit is in the file
 * before SQLite publishes the commit in the -shm index, where readers (idemgw key, report, a
 * second connection) find it; and an error of that write is the commit's error, returned from
 * the commit frame's own write.
 *
 * Anything else on the file first writes what is gathered: a read (a checkpoint, a checksum
 * rewrite), a sync, a truncation, its size, a file control, a close, and a write somewhere
 * else. Nothing is ever reordered, only delayed within one transaction. Other files (the key
 * file, -shm, journals) are the unix VFS's own objects, untouched.
 *
 * A transaction that rolls back ends without a commit frame, and may leave frames it spilled
 * gathered (a rollback that reads nothing from the log writes nothing). Once it ended, the write
 * lock is free, and another connection (an operator's `idemgw key`) appends its commits at the
 * same offsets: writing those frames then would overwrite them. So the store drops them
 * (sq_vfs_forget) as soon as its transaction is over. The gathering stays a one-writer idea:
 * the embedded store's peers (several processes serving from the file) use the unix VFS. */
#include "store_sqlite_int.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define WAL_HDR 32       /* the file's header, at offset 0 */
#define FRAME_HDR 24     /* each frame's header, before its page */
#define GATHER_MAX 65536 /* more than this is written as it comes */

typedef struct {
    sqlite3_file base;   /* pMethods: wal_methods */
    sqlite3_file *inner; /* the unix VFS's file, in the same allocation */
    unsigned char *buf;  /* gathered bytes, for the file from off */
    size_t len;
    sqlite3_int64 off;
    bool commit_page; /* the last write was a commit frame's header: its page ends the commit */
} wal_file_t;

static sqlite3_vfs *unix_vfs;
static sqlite3_vfs vfs;
static sqlite3_io_methods wal_methods;

static int gather_flush(wal_file_t *w)
{
    if (w->len == 0)
        return SQLITE_OK;
    size_t len = w->len;
    w->len = 0;
    return w->inner->pMethods->xWrite(w->inner, w->buf, (int)len, w->off);
}

static int wal_write(sqlite3_file *f, const void *data, int amt, sqlite3_int64 off)
{
    wal_file_t *w = (wal_file_t *)f;
    bool ends_commit = false;
    if (amt == FRAME_HDR && off >= WAL_HDR) {
        const unsigned char *h = data;
        /* bytes 4-7: the database's size in pages after a commit; 0 in other frames */
        w->commit_page = (h[4] | h[5] | h[6] | h[7]) != 0;
    } else {
        ends_commit = w->commit_page;
        w->commit_page = false;
    }
    if (w->len > 0 && off != w->off + (sqlite3_int64)w->len) {
        int rc = gather_flush(w);
        if (rc != SQLITE_OK)
            return rc;
    }
    if (w->len + (size_t)amt > GATHER_MAX) {
        int rc = gather_flush(w);
        if (rc != SQLITE_OK)
            return rc;
        if ((size_t)amt > GATHER_MAX)
            return w->inner->pMethods->xWrite(w->inner, data, amt, off);
    }
    if (w->len == 0)
        w->off = off;
    memcpy(w->buf + w->len, data, (size_t)amt);
    w->len += (size_t)amt;
    return ends_commit ? gather_flush(w) : SQLITE_OK;
}

static int wal_close(sqlite3_file *f)
{
    wal_file_t *w = (wal_file_t *)f;
    int rc = gather_flush(w);
    int rc2 = w->inner->pMethods->xClose(w->inner);
    free(w->buf);
    w->buf = NULL;
    return rc != SQLITE_OK ? rc : rc2;
}

/* The methods that write what is gathered first, then do the unix VFS's work. */
#define FLUSH_OR_RETURN(w)                                                                         \
    do {                                                                                           \
        int frc = gather_flush(w);                                                                 \
        if (frc != SQLITE_OK)                                                                      \
            return frc;                                                                            \
    } while (0)

static int wal_read(sqlite3_file *f, void *data, int amt, sqlite3_int64 off)
{
    wal_file_t *w = (wal_file_t *)f;
    FLUSH_OR_RETURN(w);
    return w->inner->pMethods->xRead(w->inner, data, amt, off);
}

static int wal_truncate(sqlite3_file *f, sqlite3_int64 size)
{
    wal_file_t *w = (wal_file_t *)f;
    FLUSH_OR_RETURN(w);
    return w->inner->pMethods->xTruncate(w->inner, size);
}

static int wal_sync(sqlite3_file *f, int flags)
{
    wal_file_t *w = (wal_file_t *)f;
    FLUSH_OR_RETURN(w);
    return w->inner->pMethods->xSync(w->inner, flags);
}

static int wal_file_size(sqlite3_file *f, sqlite3_int64 *size)
{
    wal_file_t *w = (wal_file_t *)f;
    FLUSH_OR_RETURN(w);
    return w->inner->pMethods->xFileSize(w->inner, size);
}

static int wal_file_control(sqlite3_file *f, int op, void *arg)
{
    wal_file_t *w = (wal_file_t *)f;
    FLUSH_OR_RETURN(w);
    return w->inner->pMethods->xFileControl(w->inner, op, arg);
}

static int wal_fetch(sqlite3_file *f, sqlite3_int64 off, int amt, void **pp)
{
    wal_file_t *w = (wal_file_t *)f;
    *pp = NULL;
    FLUSH_OR_RETURN(w);
    if (w->inner->pMethods->iVersion < 3)
        return SQLITE_OK; /* no mapping: SQLite reads instead */
    return w->inner->pMethods->xFetch(w->inner, off, amt, pp);
}

/* The rest are the unix VFS's as they are. */
static int wal_lock(sqlite3_file *f, int level)
{
    sqlite3_file *in = ((wal_file_t *)f)->inner;
    return in->pMethods->xLock(in, level);
}

static int wal_unlock(sqlite3_file *f, int level)
{
    sqlite3_file *in = ((wal_file_t *)f)->inner;
    return in->pMethods->xUnlock(in, level);
}

static int wal_check_reserved(sqlite3_file *f, int *out)
{
    sqlite3_file *in = ((wal_file_t *)f)->inner;
    return in->pMethods->xCheckReservedLock(in, out);
}

static int wal_sector_size(sqlite3_file *f)
{
    sqlite3_file *in = ((wal_file_t *)f)->inner;
    return in->pMethods->xSectorSize(in);
}

static int wal_device(sqlite3_file *f)
{
    sqlite3_file *in = ((wal_file_t *)f)->inner;
    return in->pMethods->xDeviceCharacteristics(in);
}

static int wal_shm_map(sqlite3_file *f, int pg, int pgsz, int extend, void volatile **pp)
{
    sqlite3_file *in = ((wal_file_t *)f)->inner;
    return in->pMethods->xShmMap(in, pg, pgsz, extend, pp);
}

static int wal_shm_lock(sqlite3_file *f, int offset, int n, int flags)
{
    sqlite3_file *in = ((wal_file_t *)f)->inner;
    return in->pMethods->xShmLock(in, offset, n, flags);
}

static void wal_shm_barrier(sqlite3_file *f)
{
    sqlite3_file *in = ((wal_file_t *)f)->inner;
    in->pMethods->xShmBarrier(in);
}

static int wal_shm_unmap(sqlite3_file *f, int delete_flag)
{
    sqlite3_file *in = ((wal_file_t *)f)->inner;
    return in->pMethods->xShmUnmap(in, delete_flag);
}

static int wal_unfetch(sqlite3_file *f, sqlite3_int64 off, void *p)
{
    sqlite3_file *in = ((wal_file_t *)f)->inner;
    return in->pMethods->iVersion < 3 ? SQLITE_OK : in->pMethods->xUnfetch(in, off, p);
}

/* Where the unix VFS's object starts inside ours: aligned for any of its fields. */
static size_t inner_at(void)
{
    size_t a = _Alignof(max_align_t);
    return (sizeof(wal_file_t) + a - 1) / a * a;
}

static int vfs_open(sqlite3_vfs *v, const char *name, sqlite3_file *f, int flags, int *out_flags)
{
    (void)v;
    if (!(flags & SQLITE_OPEN_WAL))
        return unix_vfs->xOpen(unix_vfs, name, f, flags, out_flags);
    wal_file_t *w = (wal_file_t *)f;
    memset(w, 0, sizeof(*w));
    w->inner = (sqlite3_file *)((char *)f + inner_at());
    w->buf = malloc(GATHER_MAX);
    if (!w->buf)
        return SQLITE_NOMEM;
    int rc = unix_vfs->xOpen(unix_vfs, name, w->inner, flags, out_flags);
    if (rc != SQLITE_OK || !w->inner->pMethods) {
        free(w->buf);
        w->buf = NULL;
        f->pMethods = NULL; /* SQLite closes only what has methods */
        return rc != SQLITE_OK ? rc : SQLITE_CANTOPEN;
    }
    f->pMethods = &wal_methods;
    return SQLITE_OK;
}

void sq_vfs_forget(sqlite3 *db)
{
    sqlite3_file *f = NULL;
    if (!sqlite3_get_autocommit(db) ||
        sqlite3_file_control(db, "main", SQLITE_FCNTL_JOURNAL_POINTER, &f) != SQLITE_OK || !f ||
        f->pMethods != &wal_methods)
        return; /* in a transaction, or no -wal of this VFS open */
    wal_file_t *w = (wal_file_t *)f;
    w->len = 0;
    w->commit_page = false;
}

static int register_result = SQLITE_ERROR;

static void register_once(void)
{
    unix_vfs = sqlite3_vfs_find("unix");
    if (!unix_vfs)
        return;
    wal_methods = (sqlite3_io_methods){
        .iVersion = 3,
        .xClose = wal_close,
        .xRead = wal_read,
        .xWrite = wal_write,
        .xTruncate = wal_truncate,
        .xSync = wal_sync,
        .xFileSize = wal_file_size,
        .xLock = wal_lock,
        .xUnlock = wal_unlock,
        .xCheckReservedLock = wal_check_reserved,
        .xFileControl = wal_file_control,
        .xSectorSize = wal_sector_size,
        .xDeviceCharacteristics = wal_device,
        .xShmMap = wal_shm_map,
        .xShmLock = wal_shm_lock,
        .xShmBarrier = wal_shm_barrier,
        .xShmUnmap = wal_shm_unmap,
        .xFetch = wal_fetch,
        .xUnfetch = wal_unfetch,
    };
    vfs = *unix_vfs; /* its pAppData too: the unix functions find their locking style there */
    vfs.zName = SQ_VFS_NAME;
    vfs.pNext = NULL;
    vfs.szOsFile = (int)(inner_at() + (size_t)unix_vfs->szOsFile);
    vfs.xOpen = vfs_open;
    register_result = sqlite3_vfs_register(&vfs, 0);
}

bool sq_vfs_register(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_once);
    return register_result == SQLITE_OK;
}
