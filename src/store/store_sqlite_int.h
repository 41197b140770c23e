/* Shared by the embedded store's two files: store_sqlite.c (the writer thread, the ops, the
 * interface) and store_sqlite_file.c (the file's lock and schema). */
#ifndef IDEMGW_STORE_SQLITE_INT_H
#define IDEMGW_STORE_SQLITE_INT_H

#include "store.h"

#include <sqlite3.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Runs sql, which returns no rows; true on success (the error is in sqlite3_errmsg). */
bool sq_exec(sqlite3 *db, const char *sql);
/* STORE_ERR_UNAVAILABLE for codes that say the file is in trouble, else STORE_ERR_STATEMENT. */
store_status_t sq_status(int rc);
/* How a process holds the file (sq_plan's answer for its options). */
typedef enum {
    SQ_LOCK_NONE = 0,  /* an operator's look (`idemgw key`): SQLite's own locks only */
    SQ_LOCK_SHARED,    /* a peer: beside other peers, never beside an exclusive holder */
    SQ_LOCK_EXCLUSIVE, /* the gateway alone */
} sq_lock_t;

typedef struct {
    sq_lock_t lock;  /* what it takes on PATH.lock for its life */
    bool create;     /* the file and its schema may be made */
    bool gather_wal; /* the -wal written through SQ_VFS_NAME (one process writes the file) */
    bool guard;      /* the files are watched: they are this process's (it holds their lock) */
} sq_plan_t;

/* What the options make of the file: pure, so the rules are unit tested as a table. */
sq_plan_t sq_plan(bool shared, bool peers);

/* Takes PATH.lock for the process's life, in mode: true with *fd its descriptor (-1 for
 * SQ_LOCK_NONE, which takes nothing), or false with msg saying why (held in the other mode: an
 * exclusive holder named by its pid). */
bool sq_lock_file(const char *path, sq_lock_t mode, int *fd, char *msg, size_t msglen);
/* Brings db's schema up to date (only with allow), in one transaction; a newer one is refused. */
store_status_t sq_migrate(sqlite3 *db, bool allow, char *msg, size_t msglen);

/* The VFS the store opens its file with (store_sqlite_vfs.c): the unix VFS, with a -wal file's
 * writes gathered into one per transaction. sq_vfs_register makes it known once per process;
 * false if it cannot be (the store then opens with SQLite's default). */
#define SQ_VFS_NAME "idemgw-unix"
bool sq_vfs_register(void);
/* Drops what db's -wal has gathered when db is outside a transaction: then it can only be frames
 * of one that rolled back, which nobody may write any more (another connection has the write
 * lock, or will, and appends at the same offsets). The writer calls it after every batch. */
void sq_vfs_forget(sqlite3 *db);

/* The files the store opened (store_sqlite_guard.c): the key file, -wal, -shm, the lock. */
#define SQ_GUARD_FILES 4
typedef struct {
    char *path;
    dev_t dev;
    ino_t ino;
    bool known; /* it existed when the store opened */
} sq_guard_file_t;
typedef struct {
    sq_guard_file_t files[SQ_GUARD_FILES];
    int lock_fd;  /* the held lock's descriptor */
    int watch_fd; /* inotify on the files (-1: none); read by sq_guard_quick alone */
} sq_guard_t;

/* Records which files path (the key file) and its companions are now, and the lock held. */
void sq_guard_init(sq_guard_t *g, const char *path, int lock_fd);
/* True while every file at its path is the one recorded; else false, and why says which was
 * deleted or replaced. Only stat()s: safe from any thread. */
bool sq_guard_check(const sq_guard_t *g, char *why, size_t len);
/* The same answer for one system call when nothing happened to the files: their inotify events
 * are read, and only when there are some (or no watch) are the files compared. One thread
 * only (the writer): the events it reads are no one else's. */
bool sq_guard_quick(sq_guard_t *g, char *why, size_t len);
void sq_guard_free(sq_guard_t *g);

/* store_sqlite_queue.c: the operator's queue (store_queue.h), run by the writer on its
 * connection inside the op's savepoint; sets q->out. */
struct store_queue_op;
store_status_t sq_queue_run(sqlite3 *db, struct store_queue_op *q, int64_t now);

#endif
