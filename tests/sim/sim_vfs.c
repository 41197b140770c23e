/* Faults below SQLite: a VFS registered as "unix" over the system's own, so every file of the
 * store (the key file, its -wal; the project's gathering VFS too, which finds "unix") goes
 * through it. One fault is armed at a time, for one store operation: the next write fails, the
 * next fsync fails, or the next write lands half and fails.
 *
 * A power loss: every write since a file's last fsync is remembered with what it overwrote.
 * After sim_vfs_power_off nothing reaches the files (SQLite's closing checkpoint included);
 * sim_vfs_reboot then keeps a prefix of each file's unsynced writes, in order, tears the next
 * one in half or not, and undoes the rest, as a disk that wrote them in order and stopped. */
#include "sim.h"

#include "util.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    sqlite3_int64 off;
    unsigned char *old; /* the bytes [off, off + old_len) held before */
    size_t old_len;
    unsigned char *new_; /* what the write wrote (NULL for a truncation) */
    size_t new_len;
    sqlite3_int64 size_before; /* the file's size before */
} undo_t;

typedef struct track {
    struct track *next;
    char *path;
    undo_t *undo; /* unsynced changes, oldest first */
    size_t n, cap;
} track_t;

typedef struct {
    sqlite3_file base;
    sqlite3_file *real;
    track_t *t; /* NULL: a file without a name */
} ffile_t;

static sqlite3_vfs *sys;
static sqlite3_vfs fvfs;
static sqlite3_io_methods fmethods;
static track_t *tracks;
static int armed; /* sim_fault_t, read by the writer threads */
static int fired; /* the armed fault hit */
static int powered_off;

static track_t *track_of(const char *path)
{
    for (track_t *t = tracks; t; t = t->next)
        if (strcmp(t->path, path) == 0)
            return t;
    track_t *t = xcalloc(1, sizeof(*t));
    t->path = xstrdup(path);
    t->next = tracks;
    tracks = t;
    return t;
}

static void track_clear(track_t *t)
{
    for (size_t i = 0; i < t->n; i++) {
        free(t->undo[i].old);
        free(t->undo[i].new_);
    }
    t->n = 0;
}

/* Takes the armed fault if it is of kind f (one thread at a time runs an operation). */
static bool take_fault(sim_fault_t f)
{
    int want = (int)f;
    if (__atomic_load_n(&armed, __ATOMIC_ACQUIRE) != want)
        return false;
    __atomic_store_n(&armed, SIM_FAULT_NONE, __ATOMIC_RELEASE);
    __atomic_store_n(&fired, 1, __ATOMIC_RELEASE);
    return true;
}

/* Remembers what [off, off + len) of f holds now, before a change. */
static undo_t *remember(ffile_t *f, sqlite3_int64 off, size_t len)
{
    track_t *t = f->t;
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 16;
        t->undo = xrealloc(t->undo, t->cap * sizeof(*t->undo));
    }
    undo_t *u = &t->undo[t->n++];
    memset(u, 0, sizeof(*u));
    sqlite3_int64 size = 0;
    f->real->pMethods->xFileSize(f->real, &size);
    u->off = off;
    u->size_before = size;
    if (off < size) {
        size_t have = (size_t)(size - off) < len ? (size_t)(size - off) : len;
        u->old = xmalloc(have ? have : 1);
        if (f->real->pMethods->xRead(f->real, u->old, (int)have, off) != SQLITE_OK)
            memset(u->old, 0, have);
        u->old_len = have;
    }
    return u;
}

static int f_close(sqlite3_file *file)
{
    ffile_t *f = (ffile_t *)file;
    return f->real->pMethods->xClose(f->real);
}

static int f_read(sqlite3_file *file, void *buf, int amt, sqlite3_int64 off)
{
    ffile_t *f = (ffile_t *)file;
    return f->real->pMethods->xRead(f->real, buf, amt, off);
}

static int f_write(sqlite3_file *file, const void *buf, int amt, sqlite3_int64 off)
{
    ffile_t *f = (ffile_t *)file;
    if (__atomic_load_n(&powered_off, __ATOMIC_ACQUIRE))
        return SQLITE_OK;
    if (take_fault(SIM_FAULT_WRITE))
        return SQLITE_IOERR_WRITE;
    bool torn = take_fault(SIM_FAULT_TORN);
    int n = torn ? amt / 2 : amt;
    if (f->t && n > 0) {
        undo_t *u = remember(f, off, (size_t)n);
        u->new_ = xmalloc((size_t)n);
        memcpy(u->new_, buf, (size_t)n);
        u->new_len = (size_t)n;
    }
    int rc = n > 0 ? f->real->pMethods->xWrite(f->real, buf, n, off) : SQLITE_OK;
    return torn ? SQLITE_IOERR_WRITE : rc;
}

static int f_truncate(sqlite3_file *file, sqlite3_int64 size)
{
    ffile_t *f = (ffile_t *)file;
    if (__atomic_load_n(&powered_off, __ATOMIC_ACQUIRE))
        return SQLITE_OK;
    if (f->t) {
        sqlite3_int64 cur = 0;
        f->real->pMethods->xFileSize(f->real, &cur);
        if (cur > size)
            remember(f, size, (size_t)(cur - size));
    }
    return f->real->pMethods->xTruncate(f->real, size);
}

static int f_sync(sqlite3_file *file, int flags)
{
    ffile_t *f = (ffile_t *)file;
    if (__atomic_load_n(&powered_off, __ATOMIC_ACQUIRE))
        return SQLITE_OK;
    if (take_fault(SIM_FAULT_SYNC))
        return SQLITE_IOERR_FSYNC;
    int rc = f->real->pMethods->xSync(f->real, flags);
    if (rc == SQLITE_OK && f->t)
        track_clear(f->t);
    return rc;
}

static int f_file_size(sqlite3_file *file, sqlite3_int64 *size)
{
    ffile_t *f = (ffile_t *)file;
    return f->real->pMethods->xFileSize(f->real, size);
}

static int f_lock(sqlite3_file *file, int l)
{
    ffile_t *f = (ffile_t *)file;
    return f->real->pMethods->xLock(f->real, l);
}

static int f_unlock(sqlite3_file *file, int l)
{
    ffile_t *f = (ffile_t *)file;
    return f->real->pMethods->xUnlock(f->real, l);
}

static int f_check_reserved(sqlite3_file *file, int *out)
{
    ffile_t *f = (ffile_t *)file;
    return f->real->pMethods->xCheckReservedLock(f->real, out);
}

static int f_file_control(sqlite3_file *file, int op, void *arg)
{
    ffile_t *f = (ffile_t *)file;
    return f->real->pMethods->xFileControl(f->real, op, arg);
}

static int f_sector_size(sqlite3_file *file)
{
    ffile_t *f = (ffile_t *)file;
    return f->real->pMethods->xSectorSize(f->real);
}

static int f_device_characteristics(sqlite3_file *file)
{
    ffile_t *f = (ffile_t *)file;
    return f->real->pMethods->xDeviceCharacteristics(f->real);
}

static int f_shm_map(sqlite3_file *file, int pg, int pgsz, int extend, void volatile **pp)
{
    ffile_t *f = (ffile_t *)file;
    return f->real->pMethods->xShmMap(f->real, pg, pgsz, extend, pp);
}

static int f_shm_lock(sqlite3_file *file, int offset, int n, int flags)
{
    ffile_t *f = (ffile_t *)file;
    return f->real->pMethods->xShmLock(f->real, offset, n, flags);
}

static void f_shm_barrier(sqlite3_file *file)
{
    ffile_t *f = (ffile_t *)file;
    f->real->pMethods->xShmBarrier(f->real);
}

static int f_shm_unmap(sqlite3_file *file, int del)
{
    ffile_t *f = (ffile_t *)file;
    return f->real->pMethods->xShmUnmap(f->real, del);
}

static int f_fetch(sqlite3_file *file, sqlite3_int64 off, int amt, void **pp)
{
    *pp = NULL; /* no memory map: every read and write goes through here */
    return SQLITE_OK;
}

static int f_unfetch(sqlite3_file *file, sqlite3_int64 off, void *p)
{
    return SQLITE_OK;
}

static int v_open(sqlite3_vfs *v, const char *name, sqlite3_file *file, int flags, int *out)
{
    ffile_t *f = (ffile_t *)file;
    memset(f, 0, sizeof(*f));
    f->real = (sqlite3_file *)(f + 1);
    int rc = sys->xOpen(sys, name, f->real, flags, out);
    if (!f->real->pMethods)
        return rc;
    f->t = name ? track_of(name) : NULL;
    f->base.pMethods = &fmethods;
    return rc;
}

static int v_delete(sqlite3_vfs *v, const char *name, int sync_dir)
{
    if (__atomic_load_n(&powered_off, __ATOMIC_ACQUIRE))
        return SQLITE_OK;
    track_clear(track_of(name));
    return sys->xDelete(sys, name, sync_dir);
}

static int v_access(sqlite3_vfs *v, const char *name, int flags, int *out)
{
    return sys->xAccess(sys, name, flags, out);
}

static int v_full_pathname(sqlite3_vfs *v, const char *name, int n, char *out)
{
    return sys->xFullPathname(sys, name, n, out);
}

static void *v_dl_open(sqlite3_vfs *v, const char *name)
{
    return sys->xDlOpen(sys, name);
}

static void v_dl_error(sqlite3_vfs *v, int n, char *msg)
{
    sys->xDlError(sys, n, msg);
}

static void (*v_dl_sym(sqlite3_vfs *v, void *h, const char *sym))(void)
{
    return sys->xDlSym(sys, h, sym);
}

static void v_dl_close(sqlite3_vfs *v, void *h)
{
    sys->xDlClose(sys, h);
}

static int v_randomness(sqlite3_vfs *v, int n, char *out)
{
    /* the simulator's: a run is the same from its seed */
    for (int i = 0; i < n; i++)
        out[i] = (char)sim_rand();
    return n;
}

static int v_sleep(sqlite3_vfs *v, int us)
{
    return sys->xSleep(sys, us);
}

static int v_current_time(sqlite3_vfs *v, double *out)
{
    *out = 2440587.5 + (double)sim_wall_ms() / 86400000.0;
    return SQLITE_OK;
}

static int v_get_last_error(sqlite3_vfs *v, int n, char *out)
{
    return sys->xGetLastError(sys, n, out);
}

static int v_current_time_int64(sqlite3_vfs *v, sqlite3_int64 *out)
{
    *out = (sqlite3_int64)(210866760000000LL + (sqlite3_int64)sim_wall_ms());
    return SQLITE_OK;
}

void sim_vfs_install(void)
{
    sys = sqlite3_vfs_find("unix");
    if (!sys) {
        fprintf(stderr, "sim: no unix VFS\n");
        abort();
    }
    fmethods = (sqlite3_io_methods){
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
        .xDeviceCharacteristics = f_device_characteristics,
        .xShmMap = f_shm_map,
        .xShmLock = f_shm_lock,
        .xShmBarrier = f_shm_barrier,
        .xShmUnmap = f_shm_unmap,
        .xFetch = f_fetch,
        .xUnfetch = f_unfetch,
    };
    fvfs = (sqlite3_vfs){
        .iVersion = 2,
        .szOsFile = (int)sizeof(ffile_t) + sys->szOsFile,
        .mxPathname = sys->mxPathname,
        .zName = "unix",
        .xOpen = v_open,
        .xDelete = v_delete,
        .xAccess = v_access,
        .xFullPathname = v_full_pathname,
        .xDlOpen = v_dl_open,
        .xDlError = v_dl_error,
        .xDlSym = v_dl_sym,
        .xDlClose = v_dl_close,
        .xRandomness = v_randomness,
        .xSleep = v_sleep,
        .xCurrentTime = v_current_time,
        .xGetLastError = v_get_last_error,
        .xCurrentTimeInt64 = v_current_time_int64,
    };
    sqlite3_vfs_unregister(sys);
    if (sqlite3_vfs_register(&fvfs, 1) != SQLITE_OK) {
        fprintf(stderr, "sim: cannot register the fault VFS\n");
        abort();
    }
}

void sim_vfs_arm(sim_fault_t f)
{
    __atomic_store_n(&fired, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&armed, (int)f, __ATOMIC_RELEASE);
}

bool sim_vfs_disarm(void)
{
    __atomic_store_n(&armed, SIM_FAULT_NONE, __ATOMIC_RELEASE);
    bool hit = __atomic_load_n(&fired, __ATOMIC_ACQUIRE) != 0;
    __atomic_store_n(&fired, 0, __ATOMIC_RELEASE);
    return hit;
}

void sim_vfs_power_off(void)
{
    __atomic_store_n(&powered_off, 1, __ATOMIC_RELEASE);
}

/* Puts back what u changed: the bytes it overwrote and the size before it. */
static void undo_one(int fd, const undo_t *u)
{
    if (u->old_len && pwrite(fd, u->old, u->old_len, u->off) != (ssize_t)u->old_len)
        fprintf(stderr, "sim: undo write failed\n");
    if (ftruncate(fd, u->size_before) != 0)
        fprintf(stderr, "sim: undo truncate failed\n");
}

void sim_vfs_reboot(void)
{
    for (track_t *t = tracks; t; t = t->next) {
        if (t->n == 0)
            continue;
        int fd = open(t->path, O_RDWR | O_CLOEXEC);
        if (fd < 0) {
            track_clear(t);
            continue;
        }
        size_t keep = (size_t)sim_below(t->n + 1);
        bool tear = keep < t->n && sim_chance(1, 3);
        for (size_t i = t->n; i-- > keep;) {
            undo_one(fd, &t->undo[i]);
            if (i == keep && tear && t->undo[i].new_) {
                size_t half = t->undo[i].new_len / 2;
                if (half && pwrite(fd, t->undo[i].new_, half, t->undo[i].off) != (ssize_t)half)
                    fprintf(stderr, "sim: torn write failed\n");
            }
        }
        close(fd);
        track_clear(t);
    }
    __atomic_store_n(&powered_off, 0, __ATOMIC_RELEASE);
}
