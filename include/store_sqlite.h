/* The embedded backend of the store (store.h): one SQLite file for one gateway process, with
 * the semantics of the Postgres backend (the one-step claim, the fence, leases, windows,
 * sweeper, batched duplicate counts), its own schema (sql/sqlite/, compiled in).
 *
 * SQLite blocks, so a writer thread owns the connection: the loop queues operations, the
 * thread runs every operation waiting when it is free in one transaction (one fsync), and
 * hands the results back through an eventfd watched on the loop, where the callbacks run.
 * WAL with synchronous=FULL: a result, a claim above all, is delivered only after the
 * transaction carrying it committed to disk. A batch of finishes alone commits with
 * synchronous=NORMAL unless durable_finish (as Postgres's finish skips the WAL flush): lost in a
 * crash of the machine, a finish leaves its claim, and the retry hears "unknown".
 *
 * One process per file: the store holds an exclusive lock (flock on PATH.lock) for its life,
 * and a second opener is refused. Several replicas need Postgres.
 *
 * Or several processes of one machine per file, as peers (sq->peers: `idemgw stdio`, whose
 * copies of one command, one per agent window, share their command's file). Nothing a claim
 * decides is kept in a process: every op already runs inside a BEGIN IMMEDIATE transaction,
 * which in WAL mode holds the file's one write lock and reads the newest commit, so a claim sees
 * every claim any process committed before it, and leases, takeovers, fences and the sweeper
 * judge the same rows by the same clock. What assumed one process is changed for peers (see
 * sq_plan in store_sqlite_file.c): the lock on PATH.lock is shared (peers run together; a
 * gateway that wants the file alone, and the peers, refuse each other), and the -wal is written
 * by SQLite's own VFS (the gathering one delays writes, which is sound only while one process
 * writes the file). A peer's writer waits for another's transaction through the busy timeout;
 * an op that cannot have the lock before its deadline is answered unavailable and never runs,
 * so in doubt the call is refused, never executed. */
#ifndef IDEMGW_STORE_SQLITE_H
#define IDEMGW_STORE_SQLITE_H

#include "store.h"

#include <stdbool.h>
#include <stddef.h>

struct event_base;

extern const store_ops_t store_sqlite_ops;

/* The embedded backend's own options. */
typedef struct store_sqlite_options {
    const char *path; /* the database file */
    bool shared;      /* for `idemgw key`: no process lock, and the file and its schema must
                         exist (never created) */
    bool peers;       /* one of several processes on this machine that serve from the file at once
                         (idemgw stdio): a shared process lock, SQLite's own VFS */
    bool durable_finish;      /* finishes wait for the disk too; else only claims and the rest do */
    uint64_t commit_delay_us; /* store.commit_delay: a claim's transaction, with others open,
                                 waits this long for company (0: never) */
} store_sqlite_options_t;

/* Opens sq->path (created when missing, unless sq->shared), takes the process lock, applies
 * missing migrations (opt->migrate) and starts the writer thread; the store is ready when this
 * returns. Returns NULL with msg set when the file cannot be opened or locked (another process
 * holds it), or the schema is newer than known or missing with migrations off.
 * sq->shared (for `idemgw key`): no process lock and nothing created; writes go through
 * SQLite's own locking, beside a gateway that may be running. */
store_t *store_sqlite_new(struct event_base *base, const store_options_t *opt,
                          const store_sqlite_options_t *sq, char *msg, size_t msglen);

/* The newest migration number of sql/sqlite/ this binary knows. */
int store_sqlite_schema_version(void);

#endif
