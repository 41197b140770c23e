/* Each simulated gateway's store: a store_ops_t over the gateway's real SQLite store that holds
 * every operation in one queue shared by all gateways and hands them to the real stores one at
 * a time, in the order they were asked. So each operation is one transaction of its own, its
 * writer thread runs alone, and the run is the same whatever the threads' timing: the order
 * is the simulator's, chosen by its PRNG. Before each operation the PRNG may arm a disk fault
 * for it (sim_vfs.c) or kill its gateway, before the operation or after it committed (the
 * gateway never hears the answer).
 *
 * Duplicate counts and lease renewals are answered here without the real store: the counts
 * are written by a timer of the real store's own (500 ms of real time), and renewals come from
 * real-time timers of the stage, both at points no seed decides. */
#include "sim.h"

#include "util.h"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { G_CLAIM = 0, G_FINISH, G_GET, G_RELEASE, G_LOCAL } gop_kind_t;

typedef struct gop {
    struct gop *next;
    sim_gate_t *g;
    gop_kind_t kind;
    store_claim_req_t claim; /* strings owned */
    store_finish_req_t fin;  /* key and result owned */
    char *key;
    store_cb_t cb;
    void *arg;
    struct sim_attempt *att;
    void (*rel_done)(void *arg, bool released, bool had_row, store_state_t was);
    bool die_after; /* the gateway dies once this op committed, before it hears */
} gop_t;

struct sim_gate {
    int gw;
    store_t *real;
    bool dead;
    int disk_streak; /* faults fired in a row on this store: kept under its down threshold */
};

static gop_t *q_head, *q_tail;
static int q_len;
static gop_t *inflight;
static store_t *to_free[64];
static int n_to_free;

static void push(gop_t *op)
{
    op->next = NULL;
    if (q_tail)
        q_tail->next = op;
    else
        q_head = op;
    q_tail = op;
    q_len++;
}

static gop_t *gop_new(sim_gate_t *g, gop_kind_t kind, void *arg)
{
    gop_t *op = xcalloc(1, sizeof(*op));
    op->g = g;
    op->kind = kind;
    op->arg = arg;
    op->att = sim_swap_current(NULL);
    sim_swap_current(op->att);
    return op;
}

static void gop_free(gop_t *op)
{
    free((char *)op->claim.key);
    free((char *)op->claim.tool);
    free((char *)op->claim.subject);
    free((char *)op->claim.args_digest);
    free((char *)op->claim.session_id);
    free((char *)op->claim.jsonrpc_id);
    free((char *)op->fin.key);
    free((char *)op->fin.result);
    free(op->key);
    free(op);
}

static char *dup_s(const char *s)
{
    return s ? xstrdup(s) : NULL;
}

/* ---- the real store's answers ---- */

/* The op ended: whether its gateway still hears it. */
static bool heard(gop_t *op)
{
    inflight = NULL;
    bool fired = sim_vfs_disarm();
    if (fired) {
        op->g->disk_streak++;
        sim_count_fault("disk");
    } else {
        op->g->disk_streak = 0;
    }
    if (op->die_after && !op->g->dead) {
        sim_count_fault("kill");
        sim_gateway_dies(op->g->gw);
    }
    return !op->g->dead;
}

static void on_claim(store_status_t st, const store_claim_result_t *res, void *arg)
{
    gop_t *op = arg;
    if (st == STORE_OK)
        sim_on_claim(op->att, op->claim.key, res->acquired, res->fence);
    if (heard(op)) {
        struct sim_attempt *was = sim_swap_current(op->att);
        op->cb.claim(st, res, op->arg);
        sim_swap_current(was);
    }
    gop_free(op);
}

static void on_finish(store_status_t st, bool matched, void *arg)
{
    gop_t *op = arg;
    if (st == STORE_OK)
        sim_on_finish(op->att, op->fin.key, op->fin.fence, op->fin.state, matched,
                      op->fin.window_ms);
    if (heard(op) && op->cb.finish) {
        struct sim_attempt *was = sim_swap_current(op->att);
        op->cb.finish(st, matched, op->arg);
        sim_swap_current(was);
    }
    gop_free(op);
}

static void on_get(store_status_t st, const store_row_t *row, void *arg)
{
    gop_t *op = arg;
    if (heard(op)) {
        struct sim_attempt *was = sim_swap_current(op->att);
        op->cb.get(st, row, op->arg);
        sim_swap_current(was);
    }
    gop_free(op);
}

static void on_release(store_status_t st, bool released, const store_row_t *row, void *arg)
{
    gop_t *op = arg;
    bool ok = st == STORE_OK;
    heard(op);
    /* the operator's command, not the gateway's: it hears even when the gateway died */
    op->rel_done(op->arg, ok && released, ok && row, ok && row ? row->state : STORE_STATE_FAILED);
    gop_free(op);
}

/* The op could not be sent: its caller hears st, from the loop. */
static void fail_now(gop_t *op, store_status_t st)
{
    switch (op->kind) {
    case G_CLAIM:
        on_claim(st, NULL, op);
        break;
    case G_FINISH:
        on_finish(st, false, op);
        break;
    case G_GET:
        on_get(st, NULL, op);
        break;
    case G_RELEASE:
        on_release(st, false, NULL, op);
        break;
    case G_LOCAL:
        break;
    }
}

static void submit(gop_t *op)
{
    sim_gate_t *g = op->g;
    if (op->kind == G_LOCAL) {
        struct sim_attempt *was = sim_swap_current(op->att);
        if (op->cb.finish)
            op->cb.finish(STORE_OK, true, op->arg);
        sim_swap_current(was);
        gop_free(op);
        return;
    }
    /* the gateway may die now, before the op leaves, or once it committed */
    if (op->kind != G_RELEASE && sim_chance(1, 3000)) {
        sim_count_fault("kill");
        sim_gateway_dies(g->gw);
        gop_free(op);
        return;
    }
    op->die_after = op->kind != G_RELEASE && sim_chance(1, 3000);
    if (g->disk_streak < 2 && sim_chance(1, 25)) {
        static const sim_fault_t kinds[] = {SIM_FAULT_WRITE, SIM_FAULT_SYNC, SIM_FAULT_TORN};
        sim_vfs_arm(kinds[sim_below(3)]);
    }
    inflight = op;
    store_status_t st = STORE_ERR_STATEMENT;
    switch (op->kind) {
    case G_CLAIM:
        st = store_claim(g->real, &op->claim, on_claim, op);
        break;
    case G_FINISH:
        st = store_finish(g->real, &op->fin, on_finish, op);
        break;
    case G_GET:
        st = store_get(g->real, op->key, on_get, op);
        break;
    case G_RELEASE:
        st = store_release(g->real, op->key, on_release, op);
        break;
    case G_LOCAL:
        break;
    }
    if (st != STORE_OK)
        fail_now(op, st);
}

int sim_gates_queued(void)
{
    return q_len + (inflight != NULL);
}

void sim_gates_settle(struct event_base *base)
{
    for (;;) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        for (int i = 0; i < n_to_free; i++)
            store_free(to_free[i]);
        n_to_free = 0;
        if (!q_head)
            break;
        gop_t *op = q_head;
        q_head = op->next;
        if (!q_head)
            q_tail = NULL;
        q_len--;
        if (op->g->dead) {
            gop_free(op);
            continue;
        }
        submit(op);
        while (inflight)
            event_base_loop(base, EVLOOP_ONCE);
    }
}

void sim_gate_kill(sim_gate_t *g)
{
    if (g->dead)
        return;
    g->dead = true;
    /* freed from the settle loop: never from inside one of its own callbacks */
    if (n_to_free == (int)(sizeof(to_free) / sizeof(to_free[0]))) {
        fprintf(stderr, "sim: too many stores to free\n");
        abort();
    }
    to_free[n_to_free++] = g->real;
    g->real = NULL;
}

void sim_gate_release(sim_gate_t *g, const char *key,
                      void (*done)(void *arg, bool released, bool had_row, store_state_t was),
                      void *arg)
{
    gop_t *op = gop_new(g, G_RELEASE, arg);
    op->att = NULL;
    op->key = xstrdup(key);
    op->rel_done = done;
    push(op);
}

/* ---- the table ---- */

static store_status_t g_claim(void *impl, const store_claim_req_t *req, store_claim_cb cb,
                              void *arg)
{
    sim_gate_t *g = impl;
    if (g->dead)
        return STORE_ERR_SHUTDOWN;
    gop_t *op = gop_new(g, G_CLAIM, arg);
    op->claim = *req;
    op->claim.key = dup_s(req->key);
    op->claim.tool = dup_s(req->tool);
    op->claim.subject = dup_s(req->subject);
    op->claim.args_digest = dup_s(req->args_digest);
    op->claim.session_id = dup_s(req->session_id);
    op->claim.jsonrpc_id = dup_s(req->jsonrpc_id);
    op->cb.claim = cb;
    push(op);
    return STORE_OK;
}

static store_status_t g_finish(void *impl, const store_finish_req_t *req, store_finish_cb cb,
                               void *arg)
{
    sim_gate_t *g = impl;
    if (g->dead)
        return STORE_ERR_SHUTDOWN;
    gop_t *op = gop_new(g, G_FINISH, arg);
    op->fin = *req;
    op->fin.key = dup_s(req->key);
    op->fin.result = req->result ? xstrndup(req->result, req->result_len) : NULL;
    op->cb.finish = cb;
    push(op);
    return STORE_OK;
}

static store_status_t g_get(void *impl, const char *key, store_get_cb cb, void *arg)
{
    sim_gate_t *g = impl;
    if (g->dead)
        return STORE_ERR_SHUTDOWN;
    gop_t *op = gop_new(g, G_GET, arg);
    op->key = xstrdup(key);
    op->cb.get = cb;
    push(op);
    return STORE_OK;
}

static store_status_t g_local(sim_gate_t *g, store_finish_cb cb, void *arg)
{
    if (g->dead)
        return STORE_ERR_SHUTDOWN;
    if (!cb)
        return STORE_OK;
    gop_t *op = gop_new(g, G_LOCAL, arg);
    op->cb.finish = cb;
    push(op);
    return STORE_OK;
}

static store_status_t g_record_duplicate(void *impl, const store_dup_t *dup, store_finish_cb cb,
                                         void *arg)
{
    return g_local(impl, cb, arg);
}

static int g_pending_duplicates(const void *impl, const char *key)
{
    return 0;
}

static store_status_t g_extend_lease(void *impl, const char *key, int64_t fence, uint64_t lease_ms,
                                     store_finish_cb cb, void *arg)
{
    return g_local(impl, cb, arg);
}

static store_status_t g_refused(void)
{
    return STORE_ERR_STATEMENT;
}

static store_status_t g_sweep_now(void *impl, store_finish_cb cb, void *arg)
{
    return g_refused();
}

static store_status_t g_release(void *impl, const char *key, store_release_cb cb, void *arg)
{
    return g_refused();
}

static store_status_t g_forget(void *impl, const char *key, store_get_cb cb, void *arg)
{
    return g_refused();
}

static store_status_t g_report(void *impl, uint64_t since_ms, int top, const char *tool_prefix,
                               store_report_cb cb, void *arg)
{
    return g_refused();
}

static bool g_ready(const void *impl)
{
    const sim_gate_t *g = impl;
    return !g->dead;
}

static void g_get_stats(const void *impl, store_stats_t *out)
{
    memset(out, 0, sizeof(*out));
}

static void g_free(void *impl)
{
    sim_gate_t *g = impl;
    if (g->real)
        store_free(g->real);
    free(g);
}

static const store_ops_t gate_ops = {
    .name = "sim",
    .claim = g_claim,
    .finish = g_finish,
    .get = g_get,
    .record_duplicate = g_record_duplicate,
    .pending_duplicates = g_pending_duplicates,
    .extend_lease = g_extend_lease,
    .sweep_now = g_sweep_now,
    .release = g_release,
    .forget = g_forget,
    .report = g_report,
    .ready = g_ready,
    .get_stats = g_get_stats,
    .free = g_free,
};

store_t *sim_gate_new(int gw, store_t *real, sim_gate_t **out)
{
    sim_gate_t *g = xcalloc(1, sizeof(*g));
    g->gw = gw;
    g->real = real;
    *out = g;
    return store_from_ops(&gate_ops, g);
}
