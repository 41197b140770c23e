/* The embedded store (store_sqlite.h): one SQLite file, one writer thread, batched commits.
 *
 * Threads: the loop thread makes ops and queues them (q_head, under mu); the writer thread
 * takes every op waiting when it is free (up to BATCH_MAX), runs them in one BEGIN IMMEDIATE
 * transaction, each inside its own savepoint so a failing op rolls back only itself, commits,
 * and only then moves the batch to the done list (under mu) and wakes the loop through the
 * eventfd. The loop runs the callbacks. An op is owned by the queue, then by the writer, then
 * by the done list; the loop frees it after its callback.
 *
 * Deadlines (store.timeout): a timer on the loop per op. An op still queued at its deadline is
 * taken out and fails STORE_ERR_UNAVAILABLE; one the writer holds is answered
 * STORE_ERR_UNAVAILABLE at once and marked answered, so its late result calls nobody. The
 * writer does not start an op past its deadline, so a claim the caller was told failed never
 * takes the key afterwards (Postgres's claim carries its deadline for the same reason).
 *
 * Clock: each op reads the wall clock when the writer starts it; leases, windows and expiry are
 * compared with that, as Postgres compares with now().
 *
 * Duplicates are recorded in memory (dup_table.h) and written every DUP_FLUSH_MS as one op, as
 * the Postgres backend does; store_free writes what is left before it returns. */
#include "store_sqlite.h"
#include "store_sqlite_int.h"

#include "dup_table.h"

#include "key_hash.h"
#include "log.h"
#include "stats.h"
#include "store_migrations.h"
#include "store_queue.h"
#include "util.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define QUEUE_MAX 10000
#define DUP_FLUSH_MS 500
#define DUP_FLUSH_KEYS 4096
/* Durations are clamped so that now + duration stays far inside int64 milliseconds. */
#define DURATION_MAX_MS INT64_C(1000000000000)
/* How often the files are compared with the ones opened when nothing else writes, and a disk
 * that failed writes is probed. */
#define GUARD_CHECK_MS 1000

int store_sqlite_schema_version(void)
{
    return store_sqlite_migrations_count;
}

static struct event *must_event(struct event *ev)
{
    if (!ev) {
        fprintf(stderr, "idemgw: out of memory creating an event\n");
        abort();
    }
    return ev;
}

static int64_t clamp_ms(uint64_t ms)
{
    return (int64_t)(ms > (uint64_t)DURATION_MAX_MS ? (uint64_t)DURATION_MAX_MS : ms);
}

static char *dup_or_null(const char *s)
{
    return s ? xstrdup(s) : NULL;
}

/* ---- ops ---- */

static void op_free(sq_op_t *op)
{
    if (!op)
        return;
    free(op->key);
    free(op->tool);
    free(op->subject);
    free(op->digest);
    free(op->session);
    free(op->jsonrpc);
    free(op->result);
    dup_entries_free(op->dups, op->n_dups);
    for (size_t i = 0; i < op->n_rep_tools; i++)
        free((char *)op->rep_tools[i].tool);
    for (size_t i = 0; i < op->n_rep_top; i++) {
        free((char *)op->rep_top[i].tool);
        free((char *)op->rep_top[i].key);
        free((char *)op->rep_top[i].created_at);
    }
    free(op->rep_tools);
    free(op->rep_top);
    if (op->queue_work)
        store_queue_op_free(op->queue_work);
    sq_row_free(&op->row);
    if (op->deadline_ev)
        event_free(op->deadline_ev);
    free(op);
}

static sq_op_t *op_new(sq_kind_t kind, const char *key)
{
    sq_op_t *op = xcalloc(1, sizeof(*op));
    op->kind = kind;
    op->key = dup_or_null(key);
    return op;
}

/* ---- the loop side: delivering results ---- */

/* The row as store.h hands it out: times formatted, lease and expiry judged by the clock the
 * op ran with. iso holds the four formatted times. */
static void row_view(const sq_row_t *r, int64_t now, store_row_t *out, char iso[4][SQ_ISO_LEN + 1])
{
    memset(out, 0, sizeof(*out));
    out->state = r->state;
    out->fence = r->fence;
    out->attempts = r->attempts;
    out->args_digest = r->digest;
    out->result = r->result;
    out->result_len = r->result_len;
    out->result_too_large = r->too_large;
    out->lease_expired = r->state == STORE_STATE_IN_PROGRESS && r->lease_until <= now;
    sq_iso_utc(r->created_at, iso[0]);
    out->created_at = iso[0];
    if (r->finished_at >= 0) {
        sq_iso_utc(r->finished_at, iso[1]);
        out->finished_at = iso[1];
    }
    sq_iso_utc(r->lease_until, iso[2]);
    out->lease_until = iso[2];
    sq_iso_utc(r->expires_at, iso[3]);
    out->expires_at = iso[3];
    out->first_session_id = r->session;
    out->first_jsonrpc_id = r->jsonrpc;
    out->expires_in_ms = r->expires_at > now ? r->expires_at - now : 0;
    memcpy(out->dup_answers, r->dup_answers, sizeof(out->dup_answers));
    memcpy(out->dup_sources, r->dup_sources, sizeof(out->dup_sources));
    out->dup_history = r->dup_history;
}

/* Calls op's callback with st and, when st is STORE_OK, its results. */
static void op_callback(store_sqlite_t *s, sq_op_t *op, store_status_t st)
{
    if (st == STORE_ERR_UNAVAILABLE)
        s->stats.unavailable++;
    if (op->internal && op->kind == SQ_PROBE) {
        s->probing = false;
        return;
    }
    if (op->internal) {
        if (s->timing)
            stats_observe_store_since(s->timing,
                                      op->kind == SQ_SWEEP ? STATS_STORE_SWEEP : STATS_STORE_DUP,
                                      op->start_us);
        if (op->kind == SQ_SWEEP) {
            s->sweeping = false;
            if (st == STORE_OK) {
                s->stats.swept += (uint64_t)op->rows;
                /* a full batch means more may wait: continue after the loop has run once */
                if (op->rows >= op->batch && !s->closing) {
                    struct timeval zero = {0, 0};
                    evtimer_add(s->sweep_more_ev, &zero);
                }
            }
        } else if (st != STORE_OK) {
            log_warn(0, "store: duplicate counts of %zu keys lost: %s", op->n_dups,
                     store_status_str(st));
        }
        return;
    }
    store_row_t row;
    char iso[4][SQ_ISO_LEN + 1];
    bool ok = st == STORE_OK;
    if (ok && op->has_row)
        row_view(&op->row, op->now_ms, &row, iso);
    switch (op->kind) {
    case SQ_CLAIM: {
        if (!ok) {
            op->cb.claim(st, NULL, op->arg);
            break;
        }
        store_claim_result_t cr;
        memset(&cr, 0, sizeof(cr));
        s->stats.claims++;
        cr.row = row;
        cr.acquired = op->acquired;
        cr.fence = row.fence;
        cr.attempts = row.attempts;
        /* every takeover increments the fence; only a fresh insert has fence 1 */
        cr.taken_over = cr.acquired && cr.fence > 1;
        op->cb.claim(STORE_OK, &cr, op->arg);
        break;
    }
    case SQ_GET:
    case SQ_FORGET:
        op->cb.get(st, ok && op->has_row ? &row : NULL, op->arg);
        break;
    case SQ_RELEASE:
        op->cb.release(st, ok && op->acquired, ok && op->has_row ? &row : NULL, op->arg);
        break;
    case SQ_COUNT_UNKNOWN:
        op->cb.count(st, ok ? op->rows : 0, op->arg);
        break;
    case SQ_QUEUE:
        if (ok) {
            op->queue->out = op->queue_work->out;
            op->queue_work->out = NULL;
        }
        store_queue_done(op->queue, st);
        break;
    case SQ_REPORT: {
        char now[SQ_ISO_LEN + 1];
        sq_iso_utc(op->now_ms, now);
        store_report_t rep = {.now = now,
                              .tools = op->rep_tools,
                              .n_tools = op->n_rep_tools,
                              .top = op->rep_top,
                              .n_top = op->n_rep_top};
        op->cb.report(st, ok ? &rep : NULL, op->arg);
        break;
    }
    case SQ_SWEEP:
        if (ok)
            s->stats.swept += (uint64_t)op->rows;
        /* fall through */
    default:
        if (op->cb.finish)
            op->cb.finish(st, ok && (op->kind == SQ_DUP || op->matched), op->arg);
        break;
    }
}

static sq_op_t *take_done(store_sqlite_t *s)
{
    pthread_mutex_lock(&s->mu);
    sq_op_t *list = s->done_head;
    s->done_head = s->done_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    return list;
}

/* Delivers a list of ops: with their own results, or with force (store_free) instead. */
static void deliver(store_sqlite_t *s, sq_op_t *list, bool force, store_status_t forced)
{
    while (list) {
        sq_op_t *op = list;
        list = op->next;
        op->next = NULL;
        if (op->deadline_ev)
            event_del(op->deadline_ev);
        if (!op->answered)
            op_callback(s, op, force && !op->internal ? forced : op->status);
        op_free(op);
    }
}

static void on_done(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    store_sqlite_t *s = arg;
    uint64_t n;
    ssize_t r = read(fd, &n, sizeof(n));
    (void)r;
    deliver(s, take_done(s), false, STORE_OK);
}

/* The op missed store.timeout: out of the queue if it is still there, else its late result is
 * dropped when it comes. Either way the caller hears "unavailable" now, once. */
static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sq_op_t *op = arg;
    store_sqlite_t *s = op->store;
    bool queued = false;
    pthread_mutex_lock(&s->mu);
    if (op->where == SQ_QUEUED) {
        sq_op_t **pp = &s->q_head, *prev = NULL;
        while (*pp && *pp != op) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        if (*pp) {
            *pp = op->next;
            if (s->q_tail == op)
                s->q_tail = prev;
            s->q_len--;
            op->next = NULL;
            queued = true;
        }
    }
    pthread_mutex_unlock(&s->mu);
    char h[KEY_HASH_LOG_LEN + 1] = "-";
    if (op->key)
        key_hash_log(op->key, h);
    log_warn(0, "store: %s of key %s got no answer within %llu ms%s", sq_kind_names[op->kind], h,
             (unsigned long long)s->timeout_ms, queued ? " (still queued)" : "");
    op_callback(s, op, STORE_ERR_UNAVAILABLE);
    if (queued)
        op_free(op);
    else
        op->answered = true;
}

/* ---- queueing ---- */

/* Whether a public call is accepted now. */
static store_status_t admit(store_sqlite_t *s)
{
    store_status_t st = STORE_OK;
    pthread_mutex_lock(&s->mu);
    int q = s->q_len;
    pthread_mutex_unlock(&s->mu);
    if (s->closing)
        st = STORE_ERR_SHUTDOWN;
    else if (q >= QUEUE_MAX)
        st = STORE_ERR_UNAVAILABLE;
    if (st == STORE_ERR_UNAVAILABLE)
        s->stats.unavailable++;
    return st;
}

static void enqueue(store_sqlite_t *s, sq_op_t *op)
{
    op->store = s;
    op->where = SQ_QUEUED;
    op->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->q_tail)
        s->q_tail->next = op;
    else
        s->q_head = op;
    s->q_tail = op;
    s->q_len++;
    bool wake = sq_delay_wakes(s);
    pthread_mutex_unlock(&s->mu);
    /* after the unlock: a writer woken while the loop still held the mutex would block on it at
     * once, and need a second wake-up (the writer checks the queue under the mutex anyway) */
    if (wake)
        pthread_cond_signal(&s->cv);
}

/* Accepts an op from a public call, or frees it when refused. */
static store_status_t submit(store_sqlite_t *s, sq_op_t *op)
{
    store_status_t st = admit(s);
    if (st != STORE_OK) {
        op_free(op);
        return st;
    }
    if (!op->internal) {
        op->deadline_wall_ms = util_wall_ms() + s->timeout_ms;
        op->deadline_ev = must_event(evtimer_new(s->base, on_deadline, op));
        struct timeval tv = util_ms_to_tv(s->timeout_ms);
        evtimer_add(op->deadline_ev, &tv);
    }
    enqueue(s, op);
    return STORE_OK;
}

/* ---- duplicates counted in memory ---- */

/* The counts as one internal op (the table is emptied), or NULL when there are none. */
static sq_op_t *dup_take(store_sqlite_t *s)
{
    if (s->dups.len == 0)
        return NULL;
    sq_op_t *op = op_new(SQ_DUP, NULL);
    op->internal = true;
    op->start_us = stats_now_us();
    op->dups = dup_table_take(&s->dups, &op->n_dups); /* the entries move into the op */
    return op;
}

static void dup_flush(store_sqlite_t *s)
{
    if (s->closing || s->dups.len == 0)
        return;
    sq_op_t *op = dup_take(s);
    if (submit(s, op) != STORE_OK)
        log_warn(0, "store: duplicate counts lost: the queue is full");
}

static void dup_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    dup_flush(arg);
}

/* ---- sweeper ---- */

static sq_op_t *sweep_op(const store_sqlite_t *s)
{
    sq_op_t *op = op_new(SQ_SWEEP, NULL);
    op->batch = s->sweep_batch;
    return op;
}

static void sweep_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    store_sqlite_t *s = arg;
    if (s->sweeping || s->closing)
        return;
    sq_op_t *op = sweep_op(s);
    op->internal = true;
    op->start_us = stats_now_us();
    s->sweeping = true;
    if (submit(s, op) != STORE_OK)
        s->sweeping = false;
}

/* The files, looked at when nothing else writes; and while the disk fails writes, one probe
 * write at a time, so /readyz comes back without waiting for a call. */
static void guard_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    store_sqlite_t *s = arg;
    if (s->closing || !sq_files_intact(s, false))
        return;
    pthread_mutex_lock(&s->mu);
    bool failing = s->disk_failures >= DISK_FAILURES_DOWN;
    pthread_mutex_unlock(&s->mu);
    if (!failing || s->probing)
        return;
    sq_op_t *op = op_new(SQ_PROBE, NULL);
    op->internal = true;
    s->probing = true;
    if (submit(s, op) != STORE_OK)
        s->probing = false;
}

/* ---- opening: the lock, the file, the schema ---- */

/* Opens the file in WAL mode with synchronous=FULL: a commit is on disk when it returns. */
static store_status_t open_db(store_sqlite_t *s, sq_plan_t plan, bool allow_migrate, char *msg,
                              size_t msglen)
{
    if (plan.create) {
        /* created here, not by SQLite, so the keys (subjects, results) are the owner's only;
         * SQLite gives its -wal and -shm files the same mode */
        int fd = open(s->path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0) {
            snprintf(msg, msglen, "cannot open %s: %s", s->path, strerror(errno));
            return STORE_ERR_UNAVAILABLE;
        }
        close(fd);
    }
    int rc = sqlite3_open_v2(s->path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX,
                             plan.gather_wal && sq_vfs_register() ? SQ_VFS_NAME : NULL);
    if (rc != SQLITE_OK) {
        snprintf(msg, msglen, "cannot open %s: %s", s->path,
                 s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc));
        return STORE_ERR_UNAVAILABLE;
    }
    sqlite3_extended_result_codes(s->db, 1);
    /* a lock held by another connection (an operator's `idemgw key`, a sqlite3 shell) is waited
     * for a little longer than the ops' deadline: ops past it are not started anyway */
    sqlite3_busy_timeout(s->db, (int)(s->timeout_ms + s->timeout_ms / 2));
    /* Going to WAL takes the file's exclusive lock. A peer opening the same new file at the
     * same moment may hold a lock SQLite answers BUSY for at once, without its busy handler (a
     * read lock that cannot wait for a write lock): tried again until the same deadline. */
    bool wal = false;
    uint64_t deadline = util_now_ms() + s->timeout_ms + s->timeout_ms / 2;
    for (;;) {
        sqlite3_stmt *st = NULL;
        int prc = sqlite3_prepare_v2(s->db, "PRAGMA journal_mode = WAL", -1, &st, NULL);
        int src = prc == SQLITE_OK ? sqlite3_step(st) : prc;
        wal = src == SQLITE_ROW && strcmp((const char *)sqlite3_column_text(st, 0), "wal") == 0;
        sqlite3_finalize(st);
        if (wal || (src & 0xff) != SQLITE_BUSY || util_now_ms() >= deadline)
            break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (!wal || !sq_exec(s->db, "PRAGMA synchronous = FULL")) {
        snprintf(msg, msglen, "%s: cannot use write-ahead logging with synchronous=FULL: %s",
                 s->path, sqlite3_errmsg(s->db));
        return STORE_ERR_UNAVAILABLE;
    }
    store_status_t mst = sq_migrate(s->db, allow_migrate, msg, msglen);
    if (mst != STORE_OK)
        return mst;
    for (int i = 0; i < STMT_COUNT_; i++) {
        if (sqlite3_prepare_v3(s->db, sq_stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &s->stmts[i],
                               NULL) != SQLITE_OK) {
            snprintf(msg, msglen, "preparing a statement: %s", sqlite3_errmsg(s->db));
            return STORE_ERR_STATEMENT;
        }
    }
    return STORE_OK;
}

/* ---- life ---- */

static void sq_free(store_sqlite_t *s)
{
    if (!s)
        return;
    s->closing = true;
    sq_op_t *failed = NULL;
    if (s->thread_started) {
        /* queued calls fail; the outcomes of calls already made (finishes: their agents may
         * have had the answer already, store_orders_finishes) and the counts still in memory
         * are written before the thread ends. A finish lost here would leave its claim in
         * progress, then unknown, for a call that succeeded. */
        sq_op_t *dups = dup_take(s);
        pthread_mutex_lock(&s->mu);
        sq_op_t *keep = NULL, **keep_tail = &keep, **fail_tail = &failed;
        int kept = 0;
        for (sq_op_t *op = s->q_head, *next; op; op = next) {
            next = op->next;
            op->next = NULL;
            if (op->kind == SQ_FINISH) {
                *keep_tail = op;
                keep_tail = &op->next;
                kept++;
            } else {
                *fail_tail = op;
                fail_tail = &op->next;
            }
        }
        if (dups) {
            dups->store = s;
            dups->where = SQ_QUEUED;
            *keep_tail = dups;
            kept++;
        }
        s->q_head = keep;
        s->q_tail = NULL;
        for (sq_op_t *op = keep; op; op = op->next)
            s->q_tail = op;
        s->q_len = kept;
        s->stopping = true;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    /* the contract's one exception: these callbacks run before store_free returns. What the
     * writer had already taken fails the same way: its caller is going away. */
    deliver(s, failed, true, STORE_ERR_SHUTDOWN);
    deliver(s, take_done(s), true, STORE_ERR_SHUTDOWN);
    for (int i = 0; i < STMT_COUNT_; i++)
        sqlite3_finalize(s->stmts[i]);
    if (s->db && sqlite3_close(s->db) != SQLITE_OK)
        log_warn(0, "store: closing %s: %s", s->path, sqlite3_errmsg(s->db));
    if (s->lock_fd >= 0)
        close(s->lock_fd); /* the lock goes with it; the file stays, so no race on its name */
    if (s->done_ev)
        event_free(s->done_ev);
    if (s->sweep_ev)
        event_free(s->sweep_ev);
    if (s->sweep_more_ev)
        event_free(s->sweep_more_ev);
    if (s->dup_ev)
        event_free(s->dup_ev);
    if (s->guard_ev)
        event_free(s->guard_ev);
    if (s->guarded)
        sq_guard_free(&s->guard);
    free(s->lost);
    if (s->efd >= 0)
        close(s->efd);
    dup_table_free(&s->dups);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->path);
    free(s);
}

static store_sqlite_t *sq_open(struct event_base *base, const store_options_t *opt,
                               const store_sqlite_options_t *sq, char *msg, size_t msglen)
{
    if (!sq->path || !sq->path[0]) {
        snprintf(msg, msglen, "no file named for the embedded store");
        return NULL;
    }
    store_sqlite_t *s = xcalloc(1, sizeof(*s));
    s->base = base;
    s->path = xstrdup(sq->path);
    s->durable_finish = sq->durable_finish;
    s->lock_fd = -1;
    s->efd = -1;
    s->timeout_ms = opt->timeout_ms > 0 ? opt->timeout_ms : STORE_TIMEOUT_DEFAULT_MS;
    s->sweep_interval_ms = opt->sweep_interval_ms;
    s->sweep_batch = opt->sweep_batch > 0 ? opt->sweep_batch : 1000;
    s->commit_delay_us = store_delay_cap_us(sq->commit_delay_us, s->timeout_ms);
    pthread_mutex_init(&s->mu, NULL);
    /* the commit delay's deadline is on the monotonic clock */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);

    sq_plan_t plan = sq_plan(sq->shared, sq->peers);
    if (!sq_lock_file(s->path, plan.lock, &s->lock_fd, msg, msglen))
        goto fail;
    s->alone = plan.lock == SQ_LOCK_EXCLUSIVE;
    if (open_db(s, plan, opt->migrate && plan.create, msg, msglen) != STORE_OK)
        goto fail;
    s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->efd < 0) {
        snprintf(msg, msglen, "eventfd: %s", strerror(errno));
        goto fail;
    }
    s->done_ev = must_event(event_new(base, s->efd, EV_READ | EV_PERSIST, on_done, s));
    s->sweep_ev = must_event(event_new(base, -1, EV_PERSIST, sweep_tick, s));
    s->sweep_more_ev = must_event(evtimer_new(base, sweep_tick, s));
    s->dup_ev = must_event(event_new(base, -1, EV_PERSIST, dup_tick, s));
    event_add(s->done_ev, NULL);
    if (s->sweep_interval_ms > 0) {
        struct timeval tv = util_ms_to_tv(s->sweep_interval_ms);
        event_add(s->sweep_ev, &tv);
    }
    struct timeval dup_tv = util_ms_to_tv(DUP_FLUSH_MS);
    event_add(s->dup_ev, &dup_tv);
    if (plan.guard) {
        sq_guard_init(&s->guard, s->path, s->lock_fd);
        s->guarded = true;
        s->guard_ev = must_event(event_new(base, -1, EV_PERSIST, guard_tick, s));
        struct timeval guard_tv = util_ms_to_tv(GUARD_CHECK_MS);
        event_add(s->guard_ev, &guard_tv);
    }
    int prc = pthread_create(&s->thread, NULL, sq_writer_main, s);
    if (prc != 0) {
        snprintf(msg, msglen, "cannot start the writer thread: %s", strerror(prc));
        goto fail;
    }
    s->thread_started = true;
    s->stats.connects = 1;
    return s;
fail:
    sq_free(s);
    return NULL;
}

/* ---- the store interface ---- */

static store_status_t ops_claim(void *impl, const store_claim_req_t *req, store_claim_cb cb,
                                void *arg)
{
    sq_op_t *op = op_new(SQ_CLAIM, req->key);
    op->tool = dup_or_null(req->tool);
    op->subject = dup_or_null(req->subject);
    op->digest = dup_or_null(req->args_digest);
    op->session = dup_or_null(req->session_id);
    op->jsonrpc = dup_or_null(req->jsonrpc_id);
    op->explicit_key = req->explicit_key;
    op->takeover = req->takeover_lease_expired;
    op->lease_ms = clamp_ms(req->lease_ms);
    op->window_ms = clamp_ms(req->window_ms);
    op->cb.claim = cb;
    op->arg = arg;
    if (!req->key || !req->tool || !req->subject || !req->args_digest) {
        op_free(op);
        return STORE_ERR_STATEMENT;
    }
    return submit(impl, op);
}

static store_status_t ops_finish(void *impl, const store_finish_req_t *req, store_finish_cb cb,
                                 void *arg)
{
    /* finishing back into in_progress would hold the key with no lease owner */
    if (!req->key || req->state == STORE_STATE_IN_PROGRESS || !store_state_valid(req->state) ||
        req->result_len > INT32_MAX)
        return STORE_ERR_STATEMENT;
    sq_op_t *op = op_new(SQ_FINISH, req->key);
    op->fence = req->fence;
    op->state = req->state;
    if (req->result) {
        op->result = xmalloc(req->result_len ? req->result_len : 1);
        memcpy(op->result, req->result, req->result_len);
        op->result_len = req->result_len;
    }
    op->too_large = req->too_large;
    op->window_ms = clamp_ms(req->window_ms);
    op->cb.finish = cb;
    op->arg = arg;
    return submit(impl, op);
}

/* An op that carries only its key and its callback (get, release, forget). */
static store_status_t submit_keyed(void *impl, sq_kind_t kind, const char *key, store_cb_t cb,
                                   void *arg)
{
    if (!key)
        return STORE_ERR_STATEMENT;
    sq_op_t *op = op_new(kind, key);
    op->cb = cb;
    op->arg = arg;
    return submit(impl, op);
}

static store_status_t ops_get(void *impl, const char *key, store_get_cb cb, void *arg)
{
    return submit_keyed(impl, SQ_GET, key, (store_cb_t){.get = cb}, arg);
}

static store_status_t ops_record_duplicate(void *impl, const store_dup_t *dup, store_finish_cb cb,
                                           void *arg)
{
    store_sqlite_t *s = impl;
    store_status_t st = admit(s);
    if (st != STORE_OK)
        return st;
    dup_table_add(&s->dups, dup);
    if (s->dups.len >= DUP_FLUSH_KEYS)
        dup_flush(s);
    if (cb) {
        /* accepted once counted in memory: answered by the writer's next batch, never from
         * inside this call */
        sq_op_t *op = op_new(SQ_DUP, NULL);
        op->cb.finish = cb;
        op->arg = arg;
        return submit(s, op);
    }
    return STORE_OK;
}

static int ops_pending_duplicates(const void *impl, const char *key)
{
    return dup_table_count(&((const store_sqlite_t *)impl)->dups, key);
}

static store_status_t ops_extend_lease(void *impl, const char *key, int64_t fence,
                                       uint64_t lease_ms, store_finish_cb cb, void *arg)
{
    if (!key)
        return STORE_ERR_STATEMENT;
    sq_op_t *op = op_new(SQ_EXTEND, key);
    op->fence = fence;
    op->lease_ms = clamp_ms(lease_ms);
    op->cb.finish = cb;
    op->arg = arg;
    return submit(impl, op);
}

static store_status_t ops_sweep_now(void *impl, store_finish_cb cb, void *arg)
{
    sq_op_t *op = sweep_op(impl);
    op->cb.finish = cb;
    op->arg = arg;
    return submit(impl, op);
}

static store_status_t ops_release(void *impl, const char *key, store_release_cb cb, void *arg)
{
    return submit_keyed(impl, SQ_RELEASE, key, (store_cb_t){.release = cb}, arg);
}

static store_status_t ops_forget(void *impl, const char *key, store_get_cb cb, void *arg)
{
    return submit_keyed(impl, SQ_FORGET, key, (store_cb_t){.get = cb}, arg);
}

static store_status_t ops_queue(void *impl, store_queue_op_t *q)
{
    sq_op_t *op = op_new(SQ_QUEUE, NULL);
    op->queue = q;
    op->queue_work = store_queue_op_clone(q);
    return submit(impl, op);
}

static store_status_t ops_count_unknown(void *impl, store_count_cb cb, void *arg)
{
    sq_op_t *op = op_new(SQ_COUNT_UNKNOWN, NULL);
    op->cb.count = cb;
    op->arg = arg;
    return submit(impl, op);
}

static store_status_t ops_report(void *impl, uint64_t since_ms, int top, const char *tool_prefix,
                                 store_report_cb cb, void *arg)
{
    sq_op_t *op = op_new(SQ_REPORT, NULL);
    op->tool = xstrdup(tool_prefix); /* the rows' tool prefix ("": every row) */
    op->since_ms = clamp_ms(since_ms);
    op->top = top;
    op->cb.report = cb;
    op->arg = arg;
    return submit(impl, op);
}

/* Not while the files are lost, nor while the disk fails every write. */
static bool ops_ready(const void *impl)
{
    store_sqlite_t *s = (store_sqlite_t *)impl; /* the mutex, not the state, changes */
    if (!s || s->closing || !s->thread_started)
        return false;
    pthread_mutex_lock(&s->mu);
    bool ok = !s->lost && s->disk_failures < DISK_FAILURES_DOWN;
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* The files lost, or the disk failing writes: named with the path, which the operator fixes. */
static void ops_down_reason(const void *impl, char *buf, size_t len)
{
    store_sqlite_t *s = (store_sqlite_t *)impl; /* the mutex, not the state, changes */
    pthread_mutex_lock(&s->mu);
    if (s->lost)
        snprintf(buf, len, "the embedded store is lost until a restart: %s", s->lost);
    else if (s->disk_failures >= DISK_FAILURES_DOWN)
        snprintf(buf, len,
                 "the disk of %s fails writes (full, or I/O errors): %d write transactions in "
                 "a row failed",
                 s->path, s->disk_failures);
    pthread_mutex_unlock(&s->mu);
}

static void ops_get_stats(const void *impl, store_stats_t *out)
{
    store_sqlite_t *s = (store_sqlite_t *)impl; /* the mutex, not the state, changes */
    *out = s->stats;
    pthread_mutex_lock(&s->mu);
    out->queued = s->q_len;
    out->transactions = s->transactions;
    out->lazy_transactions = s->lazy_transactions;
    out->delayed_transactions = s->delayed_transactions;
    out->batched_ops = s->batched_ops;
    pthread_mutex_unlock(&s->mu);
    out->connections_up = ops_ready(s) ? 1 : 0;
    out->connections_wanted = 1; /* the writer's */
}

static void ops_observe(void *impl, struct server_stats *stats)
{
    ((store_sqlite_t *)impl)->timing = stats;
}

static void ops_free(void *impl)
{
    sq_free(impl);
}

/* The writer thread takes the queue in order, a batch in one transaction and the ops of a batch
 * in turn: a call queued after a finish reads its commit. Another process writing the file (a
 * peer) could read the row before that commit; a durable finish is answered after its fsync. */
static bool ops_orders_finishes(const void *impl)
{
    const store_sqlite_t *s = impl;
    return s->alone && !s->durable_finish;
}

const store_ops_t store_sqlite_ops = {
    .name = "sqlite",
    .claim = ops_claim,
    .finish = ops_finish,
    .get = ops_get,
    .record_duplicate = ops_record_duplicate,
    .pending_duplicates = ops_pending_duplicates,
    .extend_lease = ops_extend_lease,
    .sweep_now = ops_sweep_now,
    .release = ops_release,
    .forget = ops_forget,
    .count_unknown = ops_count_unknown,
    .report = ops_report,
    .queue = ops_queue,
    .ready = ops_ready,
    .orders_finishes = ops_orders_finishes,
    .down_reason = ops_down_reason,
    .get_stats = ops_get_stats,
    .observe = ops_observe,
    .free = ops_free,
};

store_t *store_sqlite_new(struct event_base *base, const store_options_t *opt,
                          const store_sqlite_options_t *sq, char *msg, size_t msglen)
{
    store_sqlite_t *s = sq_open(base, opt, sq, msg, msglen);
    return s ? store_from_ops(&store_sqlite_ops, s) : NULL;
}
