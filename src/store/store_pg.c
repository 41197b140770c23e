/* The key store: public calls, the FIFO of waiting calls, result parsing and the sweeper. The
 * connections themselves live in store_conn.c, the statements in store_pg_sql.c.
 *
 * Deadlines: every session runs with statement_timeout and lock_timeout = store.timeout, so a
 * statement stuck behind a lock is cancelled by the server (rolled back: a claim that missed
 * its deadline holds nothing) and fails as STORE_ERR_UNAVAILABLE. A server that does not
 * answer at all is caught by a client-side timer per op, 1.5 times that: the connection
 * carrying the op is closed and its ops fail as unavailable; an op still queued is failed.
 *
 * Failure policy: when no connection is up, calls are refused at once with
 * STORE_ERR_UNAVAILABLE (an operator wants "store down" answers immediately, not a queue that
 * drains minutes later). Calls already queued when the last connection goes down fail the same
 * way; a call in flight on a connection that dies fails with STORE_ERR_UNAVAILABLE, whether or
 * not its statement ran. A claim that did commit is released later by its token
 * (store_pg_indoubt.c): its caller never forwarded the call.
 *
 * Duplicates are recorded in memory (dup_table.h: per key, the counts and the last ones) and
 * written every DUP_FLUSH_MS in one statement (store_pg_dups.c): under many replays of one key,
 * an UPDATE per replay would queue up on that row's lock. What was recorded is lost if the
 * gateway dies before the flush; attempts and the history are statistics, not part of the
 * protocol. */
#include "stats.h"
#include "store_int.h"
#include "store_pg.h"

#include "config.h"
#include "store_url.h"
#include "key_hash.h"
#include "log.h"
#include "store_migrations.h"
#include "util.h"

#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QUEUE_MAX 10000
#define DUP_FLUSH_MS 500
#define DUP_FLUSH_KEYS 4096 /* a flush starts early when this many keys wait */
#define CLAIM_RETRIES 5
/* Durations are clamped so now() + interval stays inside timestamptz (~30 years). */
#define DURATION_MAX_MS UINT64_C(1000000000000)

/* The columns of ROW_COLS (store_pg_sql.c), in its order: parse_row() reads them. */
enum {
    COL_ACQUIRED = 0,
    COL_STALE,
    COL_STATE,
    COL_FENCE,
    COL_ATTEMPTS,
    COL_DIGEST,
    COL_RESULT,
    COL_TOO_LARGE,
    COL_LEASE_EXPIRED,
    COL_CREATED,
    COL_SESSION,
    COL_JSONRPC,
    COL_EXPIRES_IN,
    COL_FINISHED,
    COL_LEASE_UNTIL,
    COL_EXPIRES_AT,
    COL_COUNT_
};

static bool pg_ready(const store_pg_t *s);
static void pg_free(store_pg_t *s);

int store_schema_version(void)
{
    return store_migrations_count;
}

static struct event *must_event(struct event *ev);
static void op_deadline(evutil_socket_t fd, short what, void *arg);

/* ---- ops ---- */

static store_op_t *op_new(store_op_kind_t kind)
{
    store_op_t *op = xcalloc(1, sizeof(*op));
    op->kind = kind;
    return op;
}

static void op_text(store_op_t *op, const char *v)
{
    op->values[op->nparams++] = v ? xstrdup(v) : NULL;
}

/* v's decimal text, malloc'd: by hand, as a protected call binds half a dozen of them and
 * vasprintf's two passes over its format showed in the gateway's profile. */
static char *int_text(int64_t v)
{
    char rev[20], *out = xmalloc(22), *o = out;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    size_t n = 0;
    do {
        rev[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *o++ = '-';
    while (n)
        *o++ = rev[--n];
    *o = '\0';
    return out;
}

static void op_int(store_op_t *op, int64_t v)
{
    op->values[op->nparams++] = int_text(v);
}

static void op_bool(store_op_t *op, bool v)
{
    op_text(op, v ? "t" : "f");
}

static void op_bytes(store_op_t *op, const char *v, size_t len)
{
    int i = op->nparams++;
    if (!v)
        return;
    op->values[i] = xmalloc(len ? len : 1);
    memcpy(op->values[i], v, len);
    op->lengths[i] = (int)len;
    op->formats[i] = 1;
}

static int64_t clamp_ms(uint64_t ms)
{
    return (int64_t)(ms > DURATION_MAX_MS ? DURATION_MAX_MS : ms);
}

/* Which slots an op's kind uses: 0 claims, 1 finishes, -1 none. */
static int batch_class(store_op_kind_t kind)
{
    if (kind == STORE_OP_CLAIM || kind == STORE_OP_CLAIM_BATCH)
        return 0;
    if (kind == STORE_OP_FINISH || kind == STORE_OP_FINISH_BATCH || kind == STORE_OP_FINISH_ASYNC)
        return 1;
    return -1;
}

/* The op's statement is over (answered or failed): its slot is free for the next batch. */
static void op_release_slot(store_op_t *op)
{
    if (!op->slot)
        return;
    op->slot = false;
    op->store->batch_inflight[batch_class(op->kind)]--;
}

/* Frees op; a batch's members are freed by whoever delivered them. */
static void op_free(store_op_t *op)
{
    op_release_slot(op);
    free(op->members);
    for (int i = 0; i < op->nparams; i++)
        free(op->values[i]);
    if (op->deadline_ev)
        event_free(op->deadline_ev);
    free(op);
}

/* The key as log lines show it (key.h): keys carry the subject, which logs must not. */
static void key_hash(const char *key, char out[KEY_HASH_LOG_LEN + 1])
{
    if (key)
        key_hash_log(key, out);
    else
        snprintf(out, KEY_HASH_LOG_LEN + 1, "-");
}

/* ---- queue and delivery ---- */

static void queue_push(store_pg_t *s, store_op_t *op, bool front)
{
    op->next = NULL;
    if (front) {
        op->next = s->q_head;
        s->q_head = op;
        if (!s->q_tail)
            s->q_tail = op;
    } else {
        if (s->q_tail)
            s->q_tail->next = op;
        else
            s->q_head = op;
        s->q_tail = op;
    }
    s->q_len++;
}

static store_op_t *queue_pop(store_pg_t *s)
{
    store_op_t *op = s->q_head;
    if (!op)
        return NULL;
    s->q_head = op->next;
    if (!s->q_head)
        s->q_tail = NULL;
    s->q_len--;
    op->next = NULL;
    return op;
}

/* An internal op ended (done or failed): its duration, for /metrics. */
static void internal_done(const store_pg_t *s, const store_op_t *op)
{
    if (s->timing && (op->kind == STORE_OP_SWEEP || op->kind == STORE_OP_DUP))
        stats_observe_store_since(s->timing,
                                  op->kind == STORE_OP_SWEEP ? STATS_STORE_SWEEP : STATS_STORE_DUP,
                                  op->start_us);
}

static void op_callback(store_pg_t *s, store_op_t *op, store_status_t st)
{
    if (op->nmembers) {
        /* a batch that failed as a whole: each call it carried fails the same way */
        for (int i = 0; i < op->nmembers; i++) {
            op_callback(s, op->members[i], st);
            op_free(op->members[i]);
        }
        op->nmembers = 0;
        return;
    }
    if (st == STORE_ERR_UNAVAILABLE)
        s->stats.unavailable++;
    if (op->internal) {
        internal_done(s, op);
        if (op->kind == STORE_OP_SWEEP)
            s->sweeping = false;
        else if (op->kind == STORE_OP_RELEASE_IN_DOUBT)
            store_indoubt_done(s, st, 0);
        else if (st != STORE_OK)
            log_warn(0, "store: duplicate counts of %d keys lost: %s", op->dup_keys,
                     store_status_str(st));
        return;
    }
    if (store_pg_queue_kind(op->kind)) {
        store_pg_queue_done(op, NULL, st);
        return;
    }
    switch (op->kind) {
    case STORE_OP_CLAIM:
    case STORE_OP_CLAIM_LOOK:
        op->cb.claim(st, NULL, op->arg);
        break;
    case STORE_OP_GET:
    case STORE_OP_FORGET:
        op->cb.get(st, NULL, op->arg);
        break;
    case STORE_OP_RELEASE:
        op->cb.release(st, false, NULL, op->arg);
        break;
    case STORE_OP_COUNT_UNKNOWN:
        op->cb.count(st, 0, op->arg);
        break;
    case STORE_OP_REPORT:
        op->cb.report(st, NULL, op->arg);
        break;
    default:
        /* a duplicate is reported once it is counted in memory: matched means accepted */
        if (op->cb.finish)
            op->cb.finish(st, st == STORE_OK && op->kind == STORE_OP_DUP, op->arg);
        break;
    }
}

/* Never call back from inside a store call: parks op for deliver_cb, which calls back with st. */
static void deliver_later(store_pg_t *s, store_op_t *op, store_status_t st)
{
    op->fail_status = st;
    op->next = NULL;
    if (s->dl_tail)
        s->dl_tail->next = op;
    else
        s->dl_head = op;
    s->dl_tail = op;
    event_active(s->deliver_ev, 0, 0);
}

void store_op_fail(store_pg_t *s, store_op_t *op, store_status_t st)
{
    if (op->deadline_ev)
        event_del(op->deadline_ev);
    op->conn = NULL;
    op_release_slot(op);
    for (int i = 0; i < (op->nmembers ? op->nmembers : 1); i++) {
        const store_op_t *f = op->nmembers ? op->members[i] : op;
        if (f->kind == STORE_OP_FINISH || f->kind == STORE_OP_FINISH_ASYNC) {
            char h[KEY_HASH_LOG_LEN + 1];
            key_hash(f->values[0], h);
            log_warn(0, "store: finish of key %s fence %s lost: %s", h, f->values[1],
                     store_status_str(st));
        }
    }
    deliver_later(s, op, st);
}

static void deliver_all(store_pg_t *s)
{
    while (s->dl_head) {
        store_op_t *op = s->dl_head;
        s->dl_head = op->next;
        if (!s->dl_head)
            s->dl_tail = NULL;
        op_callback(s, op, op->fail_status);
        op_free(op);
    }
    /* the failed statements' slots are free: a blocked batch may leave now */
    if (!s->closing)
        store_pump(s);
}

static void deliver_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    deliver_all(arg);
}

int store_up_count(const store_pg_t *s)
{
    int n = 0;
    for (int i = 0; i < s->pool_size; i++)
        if (s->conns[i].state == STORE_CONN_IDLE || s->conns[i].state == STORE_CONN_BUSY)
            n++;
    return n;
}

void store_conn_lost(store_pg_t *s)
{
    if (store_up_count(s) > 0)
        return;
    store_op_t *op;
    while ((op = queue_pop(s)))
        store_op_fail(s, op, STORE_ERR_UNAVAILABLE);
}

static bool key_among(store_op_t *const *ops, int n, const char *key)
{
    for (int i = 0; i < n; i++)
        if (strcmp(ops[i]->values[0], key) == 0)
            return true;
    return false;
}

/* A text array literal of parameter param of each op ({"a",NULL,"b"}); a binary parameter (a
 * bytea) goes as its hex text form. */
static char *array_literal(store_op_t *const *ops, int n, int param)
{
    size_t len = 3;
    for (int i = 0; i < n; i++) {
        const store_op_t *o = ops[i];
        if (!o->values[param])
            len += 5;
        else if (o->formats[param])
            len += 2 * (size_t)o->lengths[param] + 6;
        else
            len += 2 * strlen(o->values[param]) + 3;
    }
    char *out = xmalloc(len), *p = out;
    *p++ = '{';
    for (int i = 0; i < n; i++) {
        const store_op_t *o = ops[i];
        const char *v = o->values[param];
        if (i)
            *p++ = ',';
        if (!v) {
            memcpy(p, "NULL", 4);
            p += 4;
            continue;
        }
        *p++ = '"';
        if (o->formats[param]) {
            static const char hex[] = "0123456789abcdef";
            *p++ = '\\';
            *p++ = '\\';
            *p++ = 'x';
            for (int j = 0; j < o->lengths[param]; j++) {
                *p++ = hex[(unsigned char)v[j] >> 4];
                *p++ = hex[(unsigned char)v[j] & 15];
            }
        } else {
            /* a backslash before each double quote and backslash */
            for (; *v; v++) {
                if (*v == '"' || *v == '\\')
                    *p++ = '\\';
                *p++ = *v;
            }
        }
        *p++ = '"';
    }
    *p++ = '}';
    *p = '\0';
    return out;
}

void store_op_bind(store_op_t *op, int64_t clock_offset_ms)
{
    if (op->kind == STORE_OP_CLAIM) {
        /* the op's deadline by this connection's server clock */
        free(op->values[STORE_CLAIM_P_DEADLINE]);
        op->values[STORE_CLAIM_P_DEADLINE] =
            int_text((int64_t)op->deadline_wall_ms + clock_offset_ms);
    } else if (op->kind == STORE_OP_CLAIM_BATCH) {
        /* each claim keeps its own deadline */
        char *d = xmalloc((size_t)op->nmembers * 22 + 3), *p = d;
        *p++ = '{';
        for (int i = 0; i < op->nmembers; i++)
            p += sprintf(p, "%s%lld", i ? "," : "",
                         (long long)((int64_t)op->members[i]->deadline_wall_ms + clock_offset_ms));
        *p++ = '}';
        *p = '\0';
        free(op->values[STORE_CLAIM_P_DEADLINE]);
        op->values[STORE_CLAIM_P_DEADLINE] = d;
    }
}

/* Arms op's client-side deadline for the wall-clock time at (already past: at once). */
static void op_arm_deadline(store_op_t *op, uint64_t at)
{
    uint64_t now = util_wall_ms(), left = at > now ? at - now : 0;
    struct timeval tv = {(time_t)(left / 1000), (suseconds_t)(left % 1000) * 1000};
    op->deadline_wall_ms = at;
    evtimer_add(op->deadline_ev, &tv);
}

/* first (a claim or a finish, just taken from the queue) and the calls of the same kind queued
 * behind it, up to STORE_BATCH_MAX with distinct keys, as one op. A call whose key is used by an
 * op left in the queue before it stays, so each key's calls still run in the order made. */
static store_op_t *batch_gather(store_pg_t *s, store_op_t *first)
{
    enum { SCAN = 4 * STORE_BATCH_MAX };
    store_op_t *ms[STORE_BATCH_MAX], *left[SCAN];
    int n = 0, nleft = 0;
    ms[n++] = first;
    store_op_t **pp = &s->q_head, *prev = NULL;
    while (*pp && n < STORE_BATCH_MAX && nleft < SCAN) {
        store_op_t *o = *pp;
        bool keyed = o->nparams > 0 && o->values[0] && !o->formats[0] && !o->nmembers;
        if (o->kind == first->kind && !o->slot && keyed && !key_among(ms, n, o->values[0]) &&
            !key_among(left, nleft, o->values[0])) {
            *pp = o->next;
            if (s->q_tail == o)
                s->q_tail = prev;
            s->q_len--;
            o->next = NULL;
            ms[n++] = o;
            continue;
        }
        if (keyed)
            left[nleft++] = o;
        prev = o;
        pp = &o->next;
    }
    if (n == 1)
        return first;

    bool claim = first->kind == STORE_OP_CLAIM;
    store_op_t *b = op_new(claim ? STORE_OP_CLAIM_BATCH : STORE_OP_FINISH_BATCH);
    b->members = xmalloc((size_t)n * sizeof(*b->members));
    b->nmembers = n;
    b->store = s;
    uint64_t at = UINT64_MAX;
    for (int i = 0; i < n; i++) {
        b->members[i] = ms[i];
        /* the batch carries the nearest deadline; each claim's own goes to the database */
        if (ms[i]->deadline_wall_ms < at)
            at = ms[i]->deadline_wall_ms;
        event_del(ms[i]->deadline_ev);
    }
    b->nparams = first->nparams;
    for (int i = 0; i < b->nparams; i++)
        b->values[i] = claim && i == STORE_CLAIM_P_DEADLINE ? NULL : array_literal(ms, n, i);
    b->deadline_ev = must_event(evtimer_new(s->base, op_deadline, b));
    op_arm_deadline(b, at);
    if (claim) {
        s->stats.claim_batches++;
        s->stats.claims_batched += (uint64_t)n;
    } else {
        s->stats.finish_batches++;
        s->stats.finishes_batched += (uint64_t)n;
    }
    return b;
}

static void hold_over(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    store_pump(arg);
}

/* store.commit_delay with group commit: the claim at the head, among many calls open and with
 * no claim statement in flight, waits once for others to join its batch, as long as
 * store_delay.h allows; the queue behind it waits too (each key's calls keep their order).
 * True while a hold is on. */
static bool hold_claim(store_pg_t *s)
{
    if (s->commit_delay_us == 0)
        return false;
    if (evtimer_pending(s->hold_ev, NULL))
        return true;
    /* with a claim statement in flight, the claims queued meanwhile go together anyway */
    if (s->q_head->held || s->batch_inflight[0] > 0)
        return false;
    s->q_head->held = true;
    uint64_t w =
        store_delay_wait_us(s->commit_delay_us, s->pace.open_claims, s->pace.finishes_per_us);
    if (w == 0)
        return false;
    struct timeval tv = {(time_t)(w / 1000000u), (suseconds_t)(w % 1000000u)};
    evtimer_add(s->hold_ev, &tv);
    s->stats.delayed_transactions++;
    return true;
}

/* The claims open and the calls closed, for the commit delay's policy. */
static void pace_note(store_pg_t *s, int opened, int closed)
{
    if (s->commit_delay_us > 0)
        store_pace_note(&s->pace, opened, closed, store_delay_now_us());
}

/* Whether c has group commit statements in flight (claims or finishes in a slot) and nothing
 * else: a batch sent behind them waits for no sweep or operator's query. */
static bool carries_batches_only(const store_conn_t *c)
{
    for (const store_op_t *o = c->fl_head; o; o = o->next)
        if (!o->slot)
            return false;
    return c->fl_head != NULL;
}

/* The connection to send the next op to: the one with the fewest in flight; under group commit
 * a claim or finish goes where the other kind's statement already is (and nothing else), so
 * one backend takes both in turn and one wake-up often serves both (the pipeline sends them
 * together), while the other connections stay free for everything else. Spread over the pool,
 * the two kinds cost Postgres about a third more per call. NULL: no connection can take an op
 * now. */
static store_conn_t *pick_conn(store_pg_t *s, bool batch)
{
    store_conn_t *c = NULL;
    for (int i = 0; i < s->pool_size; i++) {
        store_conn_t *k = &s->conns[i];
        if (!store_conn_can_send(k))
            continue;
        if (batch && carries_batches_only(k))
            return k;
        if (!c || k->inflight < c->inflight)
            c = k;
    }
    return c;
}

/* Sends queued ops, each to the connection pick_conn chooses, until every connection's
 * pipeline is full or the queue is empty. Under group commit a claim or finish waits at the head
 * while its kind's statement is in flight (the queue behind it waits too, so each key's calls
 * keep their order); when that comes back, it leaves together with the calls of its kind queued
 * behind. */
void store_pump(store_pg_t *s)
{
    while (s->q_head) {
        int cls = s->group_commit ? batch_class(s->q_head->kind) : -1;
        if (cls == 1 && s->durable_finish)
            cls = -1; /* the batch statement does not wait for the flush: finishes go alone */
        if (cls >= 0 && !s->q_head->slot && s->batch_inflight[cls] >= s->batch_slots)
            return;
        if (cls == 0 && !s->q_head->slot && hold_claim(s))
            return;
        store_conn_t *c = pick_conn(s, cls >= 0);
        if (!c)
            return;
        store_op_t *op = queue_pop(s);
        if (cls >= 0 && !op->slot) {
            op = batch_gather(s, op);
            op->slot = true;
            s->batch_inflight[cls]++;
        }
        if (!store_conn_send(c, op)) {
            /* not sent; the connection is gone. Another one may take it, else it fails. */
            if (store_up_count(s) > 0)
                queue_push(s, op, true);
            else
                store_op_fail(s, op, STORE_ERR_UNAVAILABLE);
        }
    }
}

/* Takes op out of the queue; false when it is not there. */
static bool queue_remove(store_pg_t *s, store_op_t *op)
{
    store_op_t **pp = &s->q_head, *prev = NULL;
    while (*pp && *pp != op) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp)
        return false;
    *pp = op->next;
    if (s->q_tail == op)
        s->q_tail = prev;
    s->q_len--;
    op->next = NULL;
    return true;
}

/* An op missed its client-side deadline. Queued: nothing was sent, it fails. In flight: the
 * connection has not answered for the whole deadline although the server cancels statements
 * sooner, so it is treated as gone (closed, its ops failed, reconnected later). */
static void op_deadline(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    store_op_t *op = arg;
    store_conn_t *c = op->conn;
    char h[KEY_HASH_LOG_LEN + 1];
    key_hash(op->nparams > 0 && !op->nmembers ? op->values[0] : NULL, h);
    log_warn(0, "store: %s of key %s got no answer within %llu ms", store_stmt_name(op->kind), h,
             (unsigned long long)op->store->op_deadline_ms);
    if (c) {
        store_conn_abort(c, "an operation missed its deadline");
    } else if (queue_remove(op->store, op)) {
        store_op_fail(op->store, op, STORE_ERR_UNAVAILABLE);
    }
}

/* Whether a public call is accepted now: refused at once when nothing can run it. */
static store_status_t admit(store_pg_t *s)
{
    store_status_t st = STORE_OK;
    if (s->closing)
        st = STORE_ERR_SHUTDOWN;
    else if (s->schema_refused)
        st = STORE_ERR_SCHEMA;
    else if (store_up_count(s) == 0 || s->q_len >= QUEUE_MAX)
        st = STORE_ERR_UNAVAILABLE;
    if (st == STORE_ERR_UNAVAILABLE)
        s->stats.unavailable++;
    return st;
}

/* Accepts an op from a public call, or frees it when refused. */
static store_status_t submit(store_pg_t *s, store_op_t *op)
{
    store_status_t st = admit(s);
    if (st != STORE_OK) {
        op_free(op);
        return st;
    }
    op->store = s;
    op->deadline_wall_ms = util_wall_ms() + s->op_deadline_ms;
    op->deadline_ev = must_event(evtimer_new(s->base, op_deadline, op));
    struct timeval tv = {(time_t)(s->op_deadline_ms / 1000),
                         (suseconds_t)(s->op_deadline_ms % 1000) * 1000};
    evtimer_add(op->deadline_ev, &tv);
    queue_push(s, op, false);
    store_pump(s);
    return STORE_OK;
}

store_status_t store_pg_submit(store_pg_t *s, store_op_t *op)
{
    return submit(s, op);
}

bool store_submit_internal(store_pg_t *s, store_op_t *op)
{
    /* the conditions of admit(), without counting a refusal nobody asked for */
    if (s->closing || s->schema_refused || store_up_count(s) == 0 || s->q_len >= QUEUE_MAX) {
        op_free(op);
        return false;
    }
    op->internal = true;
    (void)submit(s, op);
    return true;
}

/* ---- results ---- */

/* bytea in text form ("\\x" + hex since 9.0), as a NUL-terminated copy: callers treat the
 * result as JSON text. */
static bool decode_bytea(const char *txt, char **out, size_t *outlen)
{
    size_t len = 0;
    unsigned char *raw = PQunescapeBytea((const unsigned char *)txt, &len);
    if (!raw)
        return false;
    char *buf = xmalloc(len + 1);
    memcpy(buf, raw, len);
    buf[len] = '\0';
    PQfreemem(raw);
    *out = buf;
    *outlen = len;
    return true;
}

static const char *nullable(const PGresult *r, int t, int col)
{
    return PQgetisnull(r, t, col) ? NULL : PQgetvalue(r, t, col);
}

static bool col_bool_at(const PGresult *r, int t, int col)
{
    return !PQgetisnull(r, t, col) && PQgetvalue(r, t, col)[0] == 't';
}

static bool col_bool(const PGresult *r, int col)
{
    return col_bool_at(r, 0, col);
}

/* Fills row from tuple t (a batch's results have more columns after the row's). *buf
 * receives the decoded result (freed by the caller). */
static bool parse_row_at(const PGresult *r, int t, store_row_t *row, char **buf)
{
    memset(row, 0, sizeof(*row));
    *buf = NULL;
    if (PQnfields(r) < COL_COUNT_ || !store_state_parse(PQgetvalue(r, t, COL_STATE), &row->state))
        return false;
    row->fence = strtoll(PQgetvalue(r, t, COL_FENCE), NULL, 10);
    row->attempts = atoi(PQgetvalue(r, t, COL_ATTEMPTS));
    row->args_digest = PQgetvalue(r, t, COL_DIGEST);
    if (!PQgetisnull(r, t, COL_RESULT)) {
        if (!decode_bytea(PQgetvalue(r, t, COL_RESULT), buf, &row->result_len))
            return false;
        row->result = *buf;
    }
    row->result_too_large = col_bool_at(r, t, COL_TOO_LARGE);
    row->lease_expired = col_bool_at(r, t, COL_LEASE_EXPIRED);
    row->created_at = PQgetvalue(r, t, COL_CREATED);
    row->first_session_id = nullable(r, t, COL_SESSION);
    row->first_jsonrpc_id = nullable(r, t, COL_JSONRPC);
    row->expires_in_ms = strtoll(PQgetvalue(r, t, COL_EXPIRES_IN), NULL, 10);
    row->finished_at = nullable(r, t, COL_FINISHED);
    row->lease_until = PQgetvalue(r, t, COL_LEASE_UNTIL);
    row->expires_at = PQgetvalue(r, t, COL_EXPIRES_AT);
    return true;
}

/* A row of get, release or forget: the row's columns, then its duplicates'. */
static bool parse_row(const PGresult *r, store_row_t *row, char **buf)
{
    if (PQnfields(r) != COL_COUNT_ + STORE_PG_DUP_NCOLS || !parse_row_at(r, 0, row, buf))
        return false;
    store_pg_parse_dups(r, 0, COL_COUNT_, row);
    return true;
}

/* Gives a claim its row (tuple t of res): acquired or the existing one. */
static void claim_deliver(store_pg_t *s, store_op_t *op, const PGresult *res, int t)
{
    store_claim_result_t cr;
    char *buf = NULL;
    memset(&cr, 0, sizeof(cr));
    if (!parse_row_at(res, t, &cr.row, &buf)) {
        log_error(0, "store: claim returned an unexpected row");
        op_callback(s, op, STORE_ERR_STATEMENT);
        free(buf);
        return;
    }
    s->stats.claims++;
    cr.acquired = col_bool_at(res, t, COL_ACQUIRED);
    cr.fence = cr.row.fence;
    cr.attempts = cr.row.attempts;
    /* every takeover increments the fence; only a fresh insert has fence 1 */
    cr.taken_over = cr.acquired && cr.fence > 1;
    pace_note(s, cr.acquired, 0);
    op->cb.claim(STORE_OK, &cr, op->arg);
    free(buf);
}

/* The READ COMMITTED corner (no row, or a stale one): the claim goes again at the head of the
 * queue with a fresh snapshot. False when it has run out of tries (the caller fails it). */
static bool claim_retry(store_pg_t *s, store_op_t *op)
{
    if (op->retries++ >= CLAIM_RETRIES) {
        char h[KEY_HASH_LOG_LEN + 1];
        key_hash(op->values[0], h);
        log_error(0, "store: claim of key %s found no stable row after %d tries", h,
                  CLAIM_RETRIES + 1);
        return false;
    }
    s->stats.claim_retries++;
    queue_push(s, op, true);
    return true;
}

static bool claim_stale(const PGresult *res, int t)
{
    return t < 0 || (!col_bool_at(res, t, COL_ACQUIRED) && col_bool_at(res, t, COL_STALE));
}

/* A batch of claims answered: each gets its own row, found by its position in the arrays. */
static void claim_batch_done(store_pg_t *s, store_op_t *b, PGresult *res)
{
    int n = b->nmembers;
    int *tup = xmalloc((size_t)n * sizeof(*tup));
    for (int i = 0; i < n; i++)
        tup[i] = -1;
    for (int t = 0; PQnfields(res) == COL_COUNT_ + 2 && t < PQntuples(res); t++) {
        long i = strtol(PQgetvalue(res, t, COL_COUNT_ + 1), NULL, 10) - 1;
        if (i >= 0 && i < n)
            tup[i] = t;
    }
    /* the retries first, in their order at the head of the queue, then the answers */
    for (int i = n - 1; i >= 0; i--) {
        store_op_t *m = b->members[i];
        if (claim_stale(res, tup[i]) && claim_retry(s, m)) {
            op_arm_deadline(m, m->deadline_wall_ms);
            b->members[i] = NULL;
        }
    }
    store_pump(s);
    for (int i = 0; i < n; i++) {
        store_op_t *m = b->members[i];
        if (!m)
            continue;
        if (claim_stale(res, tup[i]))
            op_callback(s, m, STORE_ERR_STATEMENT);
        else
            claim_deliver(s, m, res, tup[i]);
        op_free(m);
    }
    b->nmembers = 0;
    free(tup);
}

/* A batch of finishes answered: the positions whose fence matched came back. */
static void finish_batch_done(store_pg_t *s, store_op_t *b, PGresult *res)
{
    int n = b->nmembers;
    bool *matched = xcalloc((size_t)n, sizeof(*matched));
    for (int t = 0; t < PQntuples(res); t++) {
        long i = strtol(PQgetvalue(res, t, 0), NULL, 10) - 1;
        if (i >= 0 && i < n)
            matched[i] = true;
    }
    store_pump(s);
    for (int i = 0; i < n; i++) {
        store_op_t *m = b->members[i];
        if (m->cb.finish)
            m->cb.finish(STORE_OK, matched[i], m->arg);
        op_free(m);
    }
    b->nmembers = 0;
    free(matched);
}

/* A claim that wrote its row: claim_sql returns its fence, attempts and first-seen time. */
static void claim_acquired(store_pg_t *s, store_op_t *op, const PGresult *res)
{
    if (PQnfields(res) != 3 || PQntuples(res) != 1) {
        log_error(0, "store: claim returned an unexpected row");
        op_callback(s, op, STORE_ERR_STATEMENT);
        return;
    }
    store_claim_result_t cr;
    memset(&cr, 0, sizeof(cr));
    s->stats.claims++;
    cr.acquired = true;
    cr.fence = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
    cr.attempts = atoi(PQgetvalue(res, 0, 1));
    cr.taken_over = cr.fence > 1;
    cr.row.state = STORE_STATE_IN_PROGRESS;
    cr.row.fence = cr.fence;
    cr.row.attempts = cr.attempts;
    cr.row.args_digest = op->values[STORE_CLAIM_P_DIGEST];
    cr.row.created_at = PQgetvalue(res, 0, 2);
    pace_note(s, 1, 0);
    op->cb.claim(STORE_OK, &cr, op->arg);
}

/* A claim answered: acquired, or nothing written, which sends the look for the row it met
 * (ahead of the queue, as the same call's next step). The look answered: the row, or the
 * claim again when the row could be taken over now or is gone. */
static void claim_done(store_pg_t *s, store_op_t *op, PGresult *res)
{
    if (op->kind == STORE_OP_CLAIM && PQntuples(res) == 0) {
        op->kind = STORE_OP_CLAIM_LOOK;
        queue_push(s, op, true);
        store_pump(s);
        return;
    }
    if (op->kind == STORE_OP_CLAIM) {
        store_pump(s);
        claim_acquired(s, op, res);
    } else if (claim_stale(res, PQntuples(res) > 0 ? 0 : -1)) {
        op->kind = STORE_OP_CLAIM;
        bool again = claim_retry(s, op);
        store_pump(s);
        if (again)
            return;
        op_callback(s, op, STORE_ERR_STATEMENT);
    } else {
        store_pump(s);
        claim_deliver(s, op, res, 0);
    }
    op_free(op);
}

void store_op_done(store_pg_t *s, store_op_t *op, PGresult *res)
{
    ExecStatusType rs = PQresultStatus(res);
    bool ok = rs == PGRES_TUPLES_OK || rs == PGRES_COMMAND_OK;
    op_release_slot(op);

    const char *sqlstate = ok ? NULL : PQresultErrorField(res, PG_DIAG_SQLSTATE);
    /* 57014: statement_timeout; 55P03: lock_timeout. The statement was rolled back; the
     * store did not answer in time, which is "unavailable", not a statement error. */
    if (sqlstate && (strcmp(sqlstate, "57014") == 0 || strcmp(sqlstate, "55P03") == 0)) {
        char h[KEY_HASH_LOG_LEN + 1];
        key_hash(op->nparams > 0 ? op->values[0] : NULL, h);
        log_warn(0, "store: %s of key %s missed its deadline (%llu ms, SQLSTATE %s)",
                 store_stmt_name(op->kind), h, (unsigned long long)s->timeout_ms, sqlstate);
        PQclear(res);
        store_pump(s);
        op_callback(s, op, STORE_ERR_UNAVAILABLE);
        op_free(op);
        return;
    }
    if (!ok) {
        char msg[512];
        snprintf(msg, sizeof(msg), "%s",
                 rs == PGRES_PIPELINE_ABORTED ? "skipped after an earlier error in the pipeline"
                                              : PQresultErrorMessage(res));
        msg[strcspn(msg, "\n")] = '\0';
        log_error(0, "store: %s failed: SQLSTATE %s: %s", store_stmt_name(op->kind),
                  sqlstate ? sqlstate : "-", msg);
        PQclear(res);
        /* queued work may use the connection before this callback runs */
        store_pump(s);
        op_callback(s, op, STORE_ERR_STATEMENT);
        op_free(op);
        return;
    }
    if (op->kind == STORE_OP_CLAIM || op->kind == STORE_OP_CLAIM_BATCH) {
        uint64_t now = store_delay_now_us();
        store_slots_note(s, now - op->sent_us, now);
    }
    if (op->kind == STORE_OP_CLAIM || op->kind == STORE_OP_CLAIM_LOOK ||
        op->kind == STORE_OP_CLAIM_BATCH || op->kind == STORE_OP_FINISH_BATCH) {
        if (op->kind == STORE_OP_CLAIM || op->kind == STORE_OP_CLAIM_LOOK) {
            claim_done(s, op, res); /* frees op, or queues it again */
        } else {
            if (op->kind == STORE_OP_CLAIM_BATCH)
                claim_batch_done(s, op, res);
            else
                finish_batch_done(s, op, res);
            op_free(op);
        }
        PQclear(res);
        return;
    }

    store_pump(s);
    if (store_pg_queue_kind(op->kind)) {
        store_pg_queue_done(op, res, STORE_OK);
    } else if (op->kind == STORE_OP_RELEASE_IN_DOUBT) {
        store_indoubt_done(s, STORE_OK, strtol(PQcmdTuples(res), NULL, 10));
    } else if (op->kind == STORE_OP_REPORT) {
        store_pg_report_deliver(res, op->cb.report, op->arg);
    } else if (op->kind == STORE_OP_GET || op->kind == STORE_OP_FORGET) {
        store_row_t row;
        char *buf = NULL;
        if (PQntuples(res) == 0) {
            op->cb.get(STORE_OK, NULL, op->arg);
        } else if (parse_row(res, &row, &buf)) {
            op->cb.get(STORE_OK, &row, op->arg);
        } else {
            log_error(0, "store: %s returned an unexpected row", store_stmt_name(op->kind));
            op->cb.get(STORE_ERR_STATEMENT, NULL, op->arg);
        }
        free(buf);
    } else if (op->kind == STORE_OP_RELEASE) {
        store_row_t row;
        char *buf = NULL;
        if (PQntuples(res) == 0) {
            op->cb.release(STORE_OK, false, NULL, op->arg);
        } else if (parse_row(res, &row, &buf)) {
            op->cb.release(STORE_OK, col_bool(res, COL_ACQUIRED), &row, op->arg);
        } else {
            log_error(0, "store: release returned an unexpected row");
            op->cb.release(STORE_ERR_STATEMENT, false, NULL, op->arg);
        }
        free(buf);
    } else if (op->kind == STORE_OP_COUNT_UNKNOWN) {
        bool one = PQntuples(res) == 1;
        op->cb.count(one ? STORE_OK : STORE_ERR_STATEMENT,
                     one ? strtoll(PQgetvalue(res, 0, 0), NULL, 10) : 0, op->arg);
    } else {
        long rows = strtol(PQcmdTuples(res), NULL, 10);
        if (op->kind == STORE_OP_SWEEP) {
            s->stats.swept += (uint64_t)rows;
            if (rows > 0)
                log_debug(0, "store: swept %ld expired keys", rows);
        }
        if (op->internal)
            internal_done(s, op);
        if (op->internal && op->kind == STORE_OP_DUP) {
            log_debug(0, "store: duplicate counts of %d keys written (%ld rows)", op->dup_keys,
                      rows);
        } else if (op->internal) {
            s->sweeping = false;
            /* a full batch means more may wait: continue after the loop has run once */
            if (rows >= s->sweep_batch) {
                struct timeval zero = {0, 0};
                evtimer_add(s->sweep_more_ev, &zero);
            }
        } else if (op->cb.finish) {
            op->cb.finish(STORE_OK, rows > 0, op->arg);
        }
    }
    PQclear(res);
    op_free(op);
}

/* ---- sweeper ---- */

static store_op_t *sweep_op(const store_pg_t *s)
{
    store_op_t *op = op_new(STORE_OP_SWEEP);
    op_int(op, s->sweep_batch);
    return op;
}

static void sweep_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    store_pg_t *s = arg;
    if (s->sweeping || !pg_ready(s))
        return;
    store_op_t *op = sweep_op(s);
    op->internal = true;
    op->start_us = stats_now_us();
    s->sweeping = true;
    if (submit(s, op) != STORE_OK)
        s->sweeping = false;
}

/* ---- duplicates counted in memory ---- */

/* What the table holds, taken (the table is emptied), as the write's one parameter. */
static char *dup_param(store_pg_t *s)
{
    size_t n;
    dup_entry_t *e = dup_table_take(&s->dups, &n);
    char *json = dup_entries_json(e, n);
    dup_entries_free(e, n);
    return json;
}

/* Hands the counts to a connection as one statement. When the store cannot take it now, the
 * counts stay for the next tick. */
static void dup_flush(store_pg_t *s)
{
    /* the conditions of admit(), without counting a refusal nobody asked for */
    if (s->dups.len == 0 || s->closing || s->schema_refused || store_up_count(s) == 0 ||
        s->q_len >= QUEUE_MAX)
        return;
    store_op_t *op = op_new(STORE_OP_DUP);
    op->dup_keys = (int)s->dups.len;
    op->values[0] = dup_param(s);
    op->nparams = 1;
    op->internal = true;
    op->start_us = stats_now_us();
    (void)submit(s, op); /* admitted above: cannot be refused */
}

static void dup_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    dup_flush(arg);
}

/* store_free cannot run the loop to wait for a pipelined flush: the last counts go over a
 * short blocking connection, only while the database was reachable a moment ago. */
static void dup_flush_sync(store_pg_t *s)
{
    if (s->dups.len == 0 || !s->schema_ok || store_up_count(s) == 0)
        return;
    const char *kw[STORE_CONN_PARAMS], *val[STORE_CONN_PARAMS];
    char *values[1];
    size_t n = s->dups.len;
    values[0] = dup_param(s);
    store_conn_params(s, kw, val);
    PGconn *pg = PQconnectdbParams(kw, val, 1);
    PGresult *r = NULL;
    if (PQstatus(pg) == CONNECTION_OK)
        r = PQexecParams(pg, store_pg_dup_sql, 1, NULL, (const char *const *)values, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
        char msg[256];
        snprintf(msg, sizeof(msg), "%s", PQerrorMessage(pg));
        msg[strcspn(msg, "\n")] = '\0';
        log_warn(0, "store: duplicate counts of %zu keys lost at close: %s", n, msg);
    }
    PQclear(r);
    PQfinish(pg);
    free(values[0]);
}

/* ---- public calls ---- */

/* The libpq "options" of every session: the operator's own (from the conninfo, else
 * PGOPTIONS), then the settings the gateway relies on, which win because a later -c does.
 * synchronous_commit=on: a claim acknowledged to the caller survives a crash of Postgres,
 * whatever the server's default. The timeouts: no statement waits without bound (a locked
 * table, a stalled server). plan_cache_mode: every statement the gateway prepares has one
 * plan whatever its values (a key looked up, arrays unnested, a bounded scan), but for the
 * batch statements Postgres prices a generic plan above a custom one (a custom plan knows the
 * arrays' lengths) and so plans them afresh on every execution, which cost more than the
 * statement saved: a batch of two claims and two finishes 224 us of Postgres's CPU per call,
 * with the generic plan 104 (pgbench, 4 clients). */
static char *session_options(const char *conninfo, uint64_t timeout_ms)
{
    char *theirs = NULL;
    if (conninfo) {
        PQconninfoOption *opts = PQconninfoParse(conninfo, NULL);
        for (PQconninfoOption *o = opts; o && o->keyword; o++)
            if (strcmp(o->keyword, "options") == 0 && o->val && o->val[0])
                theirs = xstrdup(o->val);
        PQconninfoFree(opts);
    }
    if (!theirs && getenv("PGOPTIONS") && getenv("PGOPTIONS")[0])
        theirs = xstrdup(getenv("PGOPTIONS"));
    char *out = xasprintf("%s%s-c synchronous_commit=on -c statement_timeout=%llu "
                          "-c lock_timeout=%llu -c plan_cache_mode=force_generic_plan",
                          theirs ? theirs : "", theirs ? " " : "", (unsigned long long)timeout_ms,
                          (unsigned long long)timeout_ms);
    free(theirs);
    return out;
}

static struct event *must_event(struct event *ev)
{
    if (!ev) {
        fprintf(stderr, "idemgw: out of memory creating an event\n");
        abort();
    }
    return ev;
}

static store_pg_t *pg_open(struct event_base *base, const store_options_t *opt,
                           const store_pg_options_t *pg, char *msg, size_t msglen)
{
    store_pg_t *s = xcalloc(1, sizeof(*s));
    s->base = base;
    s->conninfo = pg->conninfo && pg->conninfo[0] ? xstrdup(pg->conninfo) : NULL;
    s->servers = store_url_servers(s->conninfo);
    s->pool_size = pg->pool_size > 0 ? pg->pool_size : 4;
    s->batch_slots = 1;
    s->timeout_ms = opt->timeout_ms > 0 ? opt->timeout_ms : STORE_TIMEOUT_DEFAULT_MS;
    s->op_deadline_ms = s->timeout_ms + s->timeout_ms / 2;
    s->connect_deadline_ms = 2 * s->timeout_ms;
    if (s->connect_deadline_ms < STORE_CONNECT_DEADLINE_MIN_MS)
        s->connect_deadline_ms = STORE_CONNECT_DEADLINE_MIN_MS;
    s->pg_options = session_options(s->conninfo, s->timeout_ms);
    util_nonce_hex(s->token_prefix);
    s->migrate = opt->migrate;
    s->group_commit = pg->group_commit;
    s->durable_finish = pg->durable_finish;
    s->commit_delay_us =
        pg->group_commit ? store_delay_cap_us(pg->commit_delay_us, s->timeout_ms) : 0;
    if (pg->commit_delay_us > 0 && !pg->group_commit)
        log_warn(0, "store: commit_delay holds a claim for a batch statement, and Postgres "
                    "batches claims only with store.group_commit: true; without it the delay "
                    "does nothing");
    s->sweep_interval_ms = opt->sweep_interval_ms;
    s->sweep_batch = opt->sweep_batch > 0 ? opt->sweep_batch : 1000;
    s->deliver_ev = must_event(event_new(base, -1, 0, deliver_cb, s));
    s->sweep_ev = must_event(event_new(base, -1, EV_PERSIST, sweep_tick, s));
    s->sweep_more_ev = must_event(evtimer_new(base, sweep_tick, s));
    s->dup_ev = must_event(event_new(base, -1, EV_PERSIST, dup_tick, s));
    s->hold_ev = must_event(evtimer_new(base, hold_over, s));
    store_indoubt_init(s);
    s->conns = xcalloc((size_t)s->pool_size, sizeof(*s->conns));
    for (int i = 0; i < s->pool_size; i++)
        store_conn_init(s, &s->conns[i], i + 1);

    char err[512] = "";
    store_status_t st = store_migrate_sync(s, err, sizeof(err));
    if (st == STORE_OK) {
        s->schema_ok = true;
    } else if (st == STORE_ERR_UNAVAILABLE) {
        /* not fatal: the pool keeps trying and migrates on its first connection */
        log_warn(0, "store: %s; retrying in the background", err);
    } else {
        log_error(0, "store: %s", err);
        snprintf(msg, msglen, "%s", err);
        pg_free(s);
        return NULL;
    }

    for (int i = 0; i < s->pool_size; i++)
        store_conn_start(&s->conns[i]);
    if (s->sweep_interval_ms > 0) {
        struct timeval tv = {(time_t)(s->sweep_interval_ms / 1000),
                             (suseconds_t)(s->sweep_interval_ms % 1000) * 1000};
        event_add(s->sweep_ev, &tv);
    }
    struct timeval dup_tv = {DUP_FLUSH_MS / 1000, (DUP_FLUSH_MS % 1000) * 1000};
    event_add(s->dup_ev, &dup_tv);
    return s;
}

static void pg_free(store_pg_t *s)
{
    if (!s)
        return;
    if (s->stats.claim_batches || s->stats.finish_batches)
        log_info(0,
                 "store: group commit: %llu claims in %llu batches, %llu finishes in %llu "
                 "batches",
                 (unsigned long long)s->stats.claims_batched,
                 (unsigned long long)s->stats.claim_batches,
                 (unsigned long long)s->stats.finishes_batched,
                 (unsigned long long)s->stats.finish_batches);
    dup_flush_sync(s);
    s->closing = true;
    for (int i = 0; i < s->pool_size; i++) {
        store_op_t *op = store_conn_close(&s->conns[i]);
        while (op) {
            store_op_t *next = op->next;
            store_op_fail(s, op, STORE_ERR_SHUTDOWN);
            op = next;
        }
    }
    store_op_t *op;
    while ((op = queue_pop(s)))
        store_op_fail(s, op, STORE_ERR_SHUTDOWN);
    /* the contract's one exception: these callbacks run before store_free returns */
    deliver_all(s);
    event_free(s->deliver_ev);
    event_free(s->sweep_ev);
    event_free(s->sweep_more_ev);
    event_free(s->dup_ev);
    event_free(s->hold_ev);
    store_indoubt_free(s);
    dup_table_free(&s->dups);
    free(s->conns);
    free(s->conninfo);
    free(s->pg_options);
    free(s);
}

static bool pg_ready(const store_pg_t *s)
{
    return s && !s->closing && s->schema_ok && !s->schema_refused && store_up_count(s) > 0;
}

static void pg_get_stats(const store_pg_t *s, store_stats_t *out)
{
    *out = s->stats;
    out->queued = s->q_len;
    out->connections_up = store_up_count(s);
    out->connections_wanted = s->pool_size;
    out->batch_slots = s->group_commit ? s->batch_slots : 0;
    out->in_doubt_pending = s->indoubt_len;
    for (int i = 0; i < s->pool_size; i++)
        out->connections_busy += s->conns[i].state == STORE_CONN_BUSY;
}

static store_status_t pg_claim(store_pg_t *s, const store_claim_req_t *req, store_claim_cb cb,
                               void *arg)
{
    store_op_t *op = op_new(STORE_OP_CLAIM);
    op_text(op, req->key);
    op_text(op, req->tool);
    op_text(op, req->subject);
    op_text(op, req->args_digest);
    op_bool(op, req->explicit_key);
    op_text(op, req->session_id);
    op_text(op, req->jsonrpc_id);
    op_int(op, clamp_ms(req->lease_ms));
    op_int(op, clamp_ms(req->window_ms));
    op_bool(op, req->takeover_lease_expired);
    op_text(op, NULL); /* the deadline, by the database's clock: set when sent */
    /* the token tells this claim from any later one of the key, should its answer be lost: the
     * store's random prefix and a count (RAND_bytes per claim cost a getpid() each) */
    char token[sizeof(s->token_prefix) + 16];
    snprintf(token, sizeof(token), "%s%016llx", s->token_prefix,
             (unsigned long long)++s->token_next);
    op_text(op, token);
    op->cb.claim = cb;
    op->arg = arg;
    return submit(s, op);
}

static store_status_t pg_finish(store_pg_t *s, const store_finish_req_t *req, store_finish_cb cb,
                                void *arg)
{
    /* finishing back into in_progress would hold the key with no lease owner */
    if (req->state == STORE_STATE_IN_PROGRESS || !store_state_valid(req->state) ||
        req->result_len > INT32_MAX)
        return STORE_ERR_STATEMENT;
    /* The claim was durable before the call went out; the finish need not be: lost in a crash
     * of Postgres, it leaves the claim, which blocks a second execution and reads as an
     * unknown outcome once its lease ends. Not waiting for the flush saves the second fsync of
     * every first execution. store.durable_finish makes it wait (a replay after a crash). */
    pace_note(s, 0, 1);
    store_op_t *op = op_new(s->durable_finish ? STORE_OP_FINISH : STORE_OP_FINISH_ASYNC);
    op_text(op, req->key);
    op_int(op, req->fence);
    op_text(op, store_state_str(req->state));
    op_bytes(op, req->result, req->result_len);
    op_bool(op, req->too_large);
    op_int(op, clamp_ms(req->window_ms));
    op->cb.finish = cb;
    op->arg = arg;
    return submit(s, op);
}

static store_status_t pg_get(store_pg_t *s, const char *key, store_get_cb cb, void *arg)
{
    store_op_t *op = op_new(STORE_OP_GET);
    op_text(op, key);
    op->cb.get = cb;
    op->arg = arg;
    return submit(s, op);
}

static store_status_t pg_record_duplicate(store_pg_t *s, const store_dup_t *dup, store_finish_cb cb,
                                          void *arg)
{
    store_status_t st = admit(s);
    if (st != STORE_OK)
        return st;
    dup_table_add(&s->dups, dup);
    if (s->dups.len >= DUP_FLUSH_KEYS)
        dup_flush(s);
    if (cb) {
        store_op_t *op = op_new(STORE_OP_DUP);
        op->cb.finish = cb;
        op->arg = arg;
        deliver_later(s, op, STORE_OK);
    }
    return STORE_OK;
}

static store_status_t pg_extend_lease(store_pg_t *s, const char *key, int64_t fence,
                                      uint64_t lease_ms, store_finish_cb cb, void *arg)
{
    store_op_t *op = op_new(STORE_OP_EXTEND);
    op_text(op, key);
    op_int(op, fence);
    op_int(op, clamp_ms(lease_ms));
    op->cb.finish = cb;
    op->arg = arg;
    return submit(s, op);
}

static store_status_t pg_release(store_pg_t *s, const char *key, store_release_cb cb, void *arg)
{
    pace_note(s, 0, 1);
    store_op_t *op = op_new(STORE_OP_RELEASE);
    op_text(op, key);
    op->cb.release = cb;
    op->arg = arg;
    return submit(s, op);
}

static store_status_t pg_forget(store_pg_t *s, const char *key, store_get_cb cb, void *arg)
{
    store_op_t *op = op_new(STORE_OP_FORGET);
    op_text(op, key);
    op->cb.get = cb;
    op->arg = arg;
    return submit(s, op);
}

static store_status_t pg_report(store_pg_t *s, uint64_t since_ms, int top, const char *tool_prefix,
                                store_report_cb cb, void *arg)
{
    store_op_t *op = op_new(STORE_OP_REPORT);
    op_int(op, clamp_ms(since_ms));
    op_int(op, top);
    op_text(op, tool_prefix);
    op->cb.report = cb;
    op->arg = arg;
    return submit(s, op);
}

static store_status_t pg_sweep_now(store_pg_t *s, store_finish_cb cb, void *arg)
{
    store_op_t *op = sweep_op(s);
    op->cb.finish = cb;
    op->arg = arg;
    return submit(s, op);
}

static store_status_t pg_count_unknown(store_pg_t *s, store_count_cb cb, void *arg)
{
    store_op_t *op = op_new(STORE_OP_COUNT_UNKNOWN);
    op->cb.count = cb;
    op->arg = arg;
    return submit(s, op);
}

/* --- the store interface --- */

static store_status_t ops_claim(void *impl, const store_claim_req_t *req, store_claim_cb cb,
                                void *arg)
{
    return pg_claim(impl, req, cb, arg);
}

static store_status_t ops_finish(void *impl, const store_finish_req_t *req, store_finish_cb cb,
                                 void *arg)
{
    return pg_finish(impl, req, cb, arg);
}

static store_status_t ops_get(void *impl, const char *key, store_get_cb cb, void *arg)
{
    return pg_get(impl, key, cb, arg);
}

static store_status_t ops_record_duplicate(void *impl, const store_dup_t *dup, store_finish_cb cb,
                                           void *arg)
{
    return pg_record_duplicate(impl, dup, cb, arg);
}

static int ops_pending_duplicates(const void *impl, const char *key)
{
    return dup_table_count(&((const store_pg_t *)impl)->dups, key);
}

static store_status_t ops_extend_lease(void *impl, const char *key, int64_t fence,
                                       uint64_t lease_ms, store_finish_cb cb, void *arg)
{
    return pg_extend_lease(impl, key, fence, lease_ms, cb, arg);
}

static store_status_t ops_sweep_now(void *impl, store_finish_cb cb, void *arg)
{
    return pg_sweep_now(impl, cb, arg);
}

static store_status_t ops_release(void *impl, const char *key, store_release_cb cb, void *arg)
{
    return pg_release(impl, key, cb, arg);
}

static store_status_t ops_forget(void *impl, const char *key, store_get_cb cb, void *arg)
{
    return pg_forget(impl, key, cb, arg);
}

static store_status_t ops_count_unknown(void *impl, store_count_cb cb, void *arg)
{
    return pg_count_unknown(impl, cb, arg);
}

static store_status_t ops_report(void *impl, uint64_t since_ms, int top, const char *tool_prefix,
                                 store_report_cb cb, void *arg)
{
    return pg_report(impl, since_ms, top, tool_prefix, cb, arg);
}

static bool ops_ready(const void *impl)
{
    return pg_ready(impl);
}

static void ops_get_stats(const void *impl, store_stats_t *out)
{
    pg_get_stats(impl, out);
}

static void ops_observe(void *impl, struct server_stats *stats)
{
    ((store_pg_t *)impl)->timing = stats;
}

static void ops_free(void *impl)
{
    pg_free(impl);
}

const store_ops_t store_pg_ops = {
    .name = "postgres",
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
    .queue = store_pg_queue,
    .ready = ops_ready,
    .get_stats = ops_get_stats,
    .observe = ops_observe,
    .free = ops_free,
};

store_t *store_pg_new(struct event_base *base, const store_options_t *opt,
                      const store_pg_options_t *pg, char *msg, size_t msglen)
{
    store_pg_t *s = pg_open(base, opt, pg, msg, msglen);
    return s ? store_from_ops(&store_pg_ops, s) : NULL;
}
