/* make sim: the idempotency stage of several gateways, each over its own handle of one real
 * SQLite store file, driven by agents and upstreams the simulator plays, under a simulated clock,
 * with every choice taken from one seeded PRNG, so a run is replayed exactly from its seed.
 *
 * Each step is one event of a time-ordered queue: an agent sends a protected call to a
 * gateway, an upstream answers (or fails, dies, times out, answers twice), an agent gives up
 * waiting, a gateway restarts, the machine loses power, the wall clock jumps, an operator
 * releases a key. After each step the stores' operations run one at a time (sim_store.c), with
 * faults below SQLite (sim_vfs.c), and the invariants are checked:
 *   - an upstream execution only under a claim its call acquired, and that claim taken only
 *     when the key allowed it (new, expired, released, failed; or, for a tool with
 *     on_ambiguous: release, past its lease): at most one execution per key in its window;
 *   - a finish lands only on the claim it was made for (the fence);
 *   - every answer carries its own caller's JSON-RPC id and, when it carries a result, the
 *     result of its own call; a replay carries the result recorded last for its key;
 *   - the operator's release frees only a key held unknown or past its lease;
 *   - every call a live gateway took ends with an answer (or its agent left).
 * A violation prints the seed and the step and ends the run. */
#include "sim.h"

#include "config.h"
#include "exchange.h"
#include "idem.h"
#include "log.h"
#include "policy.h"
#include "replay_cache.h"
#include "stats.h"
#include "store.h"
#include "store_sqlite.h"
#include "subject.h"
#include "tasks.h"
#include "upstream.h"
#include "util.h"

#include <event2/event.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define GATEWAYS 3
#define AGENTS 48
#define SUBJECTS 4
#define AMOUNTS 1500      /* arguments per subject: keys come back after their window */
#define EXPLICIT_KEYS 300 /* Idempotency-Key values per subject */
#define MAX_ATTEMPTS 6    /* per logical call */
#define AGENT_TIMEOUT_MS 10000
#define UPSTREAM_TIMEOUT_MS 15000
#define MODEL_BUCKETS 65536

/* ---- PRNG and clock ---- */

static uint64_t rng_state;
static uint64_t seed;

uint64_t sim_rand(void)
{
    /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t sim_below(uint64_t n)
{
    return n ? sim_rand() % n : 0;
}

bool sim_chance(uint64_t num, uint64_t den)
{
    return sim_below(den) < num;
}

static uint64_t mono_ms = 1000000;            /* never jumps */
static int64_t wall_offset = 1780000000000LL; /* wall = mono + offset; jumps */

uint64_t sim_wall_ms(void)
{
    return (uint64_t)((int64_t)__atomic_load_n(&mono_ms, __ATOMIC_ACQUIRE) +
                      __atomic_load_n(&wall_offset, __ATOMIC_ACQUIRE));
}

static uint64_t clock_hook(bool wall)
{
    return wall ? sim_wall_ms() : __atomic_load_n(&mono_ms, __ATOMIC_ACQUIRE);
}

/* ---- counts ---- */

static uint64_t step, calls, faults, violations;
static uint64_t n_kills, n_disk, n_crashes, n_jumps, n_releases, n_upstream_faults;
static uint64_t n_execs, n_replays, n_answers;
static uint64_t n_forward_jumps, n_stale_after_jump, back_jumps_ms;
static uint64_t digest = 1469598103934665603ULL; /* FNV-1a of every answer, in order */

void sim_count_fault(const char *what)
{
    faults++;
    if (strcmp(what, "kill") == 0)
        n_kills++;
    else if (strcmp(what, "disk") == 0)
        n_disk++;
}

static void violation(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stdout, "sim: VIOLATION at step %" PRIu64 " (seed %" PRIu64 "): ", step, seed);
    vfprintf(stdout, fmt, ap);
    fprintf(stdout, "\nsim: replay it with: make sim SIM_SEED=%" PRIu64 "\n", seed);
    va_end(ap);
    violations++;
}

/* SIM_TRACE=KEY prints what happens to one model key (the one a violation names). */
static const char *trace_mk;

static void trace(const char *mk, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void trace(const char *mk, const char *fmt, ...)
{
    if (!trace_mk || strcmp(trace_mk, mk) != 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    printf("trace: step %" PRIu64 " wall %" PRIu64 ": ", step, sim_wall_ms());
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

/* ---- the model: what each key allows, by the promise ---- */

#define OLDER_MAX 8

typedef struct model {
    struct model *next;
    char *mk;             /* subject and arguments or explicit key */
    bool release_mode;    /* its tool says on_ambiguous: release */
    bool allowed;         /* a claim may be taken now: new, failed or released */
    uint64_t exp;         /* wall: the row's end, as its last committed write set it */
    uint64_t claim_exp;   /* wall: the end the last claim set (what a lost finish leaves) */
    uint64_t lease_until; /* wall: the last claim's lease while no finish landed; 0: none */
    uint64_t claim_lease; /* wall: the last claim's lease, finished or not */
    uint64_t cur_claim;   /* the attempt holding the newest claim; 0: none (released) */
    char *recorded_tok;   /* the result recorded last (succeeded) */
    uint64_t rec_mono, rec_jumps, rec_back;
    /* the results recorded before it, newest at (n_older - 1) % OLDER_MAX: each with when it
     * was recorded (monotonic), the forward clock jumps by then, the sum of the backward ones */
    struct {
        char *tok;
        uint64_t mono, jumps, back;
    } older[OLDER_MAX];
    unsigned n_older;
    char *store_key; /* the store's key, for the operator's release */
    uint64_t execs;
} model_t;

static model_t *models[MODEL_BUCKETS];
static model_t **model_list;
static size_t n_models, cap_models;

static model_t *model_of(const char *mk, bool release_mode)
{
    uint64_t h = util_fnv1a64(mk) % MODEL_BUCKETS;
    for (model_t *m = models[h]; m; m = m->next)
        if (strcmp(m->mk, mk) == 0)
            return m;
    model_t *m = xcalloc(1, sizeof(*m));
    m->mk = xstrdup(mk);
    m->release_mode = release_mode;
    m->allowed = true;
    m->next = models[h];
    models[h] = m;
    if (n_models == cap_models) {
        cap_models = cap_models ? cap_models * 2 : 1024;
        model_list = xrealloc(model_list, cap_models * sizeof(*model_list));
    }
    model_list[n_models++] = m;
    return m;
}

/* ---- gateways ---- */

typedef struct gateway {
    bool alive;
    bool restarting; /* its restart is scheduled */
    int life;        /* restarts so far */
    store_t *store;
    sim_gate_t *gate;
    replay_cache_t *cache;
    subject_t *subject;
    task_routes_t *tasks;
    idem_t *idem;
    server_stats_t stats;
} gateway_t;

static struct event_base *base;
static config_t *cfg;
static gateway_t gws[GATEWAYS];
static char store_path[512];
static uint64_t lease_ms, lease_release_ms, window_ms;
/* Between two power losses the file is served either by every gateway as peers (SQLite's own
 * VFS) or by gateway 0 alone, holding it exclusively, whose -wal goes through the gathering VFS
 * (store_sqlite_vfs.c); each reboot picks one. */
static bool exclusive;
static uint64_t n_exclusive_lives;

/* ---- agents, calls, attempts ---- */

typedef struct lcall {
    int agent;
    int subject;
    bool release_tool;
    int amount;
    int ekey; /* -1: no explicit key */
    char mk[96];
    model_t *m;
    int attempts; /* made so far */
    int open;     /* attempts not over, and retries to come: the call is done at 0 */
    int refs;     /* attempts not freed, and retries to come: freed at 0, once done */
    bool done;
    bool again; /* after its success, the agent sends it once more (a replay is expected) */
} lcall_t;

typedef struct sim_attempt {
    uint64_t id; /* its JSON-RPC id, unique in the run */
    lcall_t *lc;
    int gw, life;
    exchange_t *ex;
    int refs; /* events that point at it */
    bool claimed, claim_legit, up_pending, over, gw_died, left;
    int64_t fence;
    int up_kind;   /* up_kind_t of its upstream's answer, once forwarded */
    char tok[128]; /* the result its execution produced */
} sim_attempt_t;

/* The attempt a gateway is handling right now: the one whose request, upstream answer or
 * store answer runs (sim_store.c sets it around the answers it delivers). */
static sim_attempt_t *current;

struct sim_attempt *sim_swap_current(struct sim_attempt *a)
{
    sim_attempt_t *was = current;
    current = a;
    return was;
}

/* ---- the event queue ---- */

typedef enum {
    EV_AGENT_NEXT = 0, /* an agent starts its next logical call */
    EV_ATTEMPT,        /* a logical call sends an attempt */
    EV_UPSTREAM,       /* an upstream answers an attempt */
    EV_AGENT_TIMEOUT,  /* an attempt's agent stops waiting */
    EV_GW_RESTART,
    EV_CRASH,
    EV_CLOCK_JUMP,
    EV_RELEASE,
} ev_kind_t;

typedef enum {
    UP_OK = 0,
    UP_TOOL_ERROR,
    UP_RPC_ERROR,
    UP_CONNECT,
    UP_CLOSED_MID,
    UP_TIMEOUT,
    UP_TWICE,
    UP_KINDS
} up_kind_t;

typedef struct ev {
    uint64_t t, seq;
    ev_kind_t kind;
    void *p;
    int a;
} ev_t;

static ev_t *heap;
static size_t heap_n, heap_cap;
static uint64_t ev_seq;

static bool ev_less(const ev_t *x, const ev_t *y)
{
    return x->t < y->t || (x->t == y->t && x->seq < y->seq);
}

static void schedule(uint64_t delay, ev_kind_t kind, void *p, int a)
{
    if (heap_n == heap_cap) {
        heap_cap = heap_cap ? heap_cap * 2 : 1024;
        heap = xrealloc(heap, heap_cap * sizeof(*heap));
    }
    ev_t e = {.t = mono_ms + delay, .seq = ev_seq++, .kind = kind, .p = p, .a = a};
    size_t i = heap_n++;
    while (i > 0 && ev_less(&e, &heap[(i - 1) / 2])) {
        heap[i] = heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    heap[i] = e;
}

static ev_t unschedule(void)
{
    ev_t top = heap[0];
    ev_t last = heap[--heap_n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const ev_t *best = &last;
        if (l < heap_n && ev_less(&heap[l], best)) {
            m = l;
            best = &heap[l];
        }
        if (r < heap_n && ev_less(&heap[r], best))
            m = r;
        if (m == i)
            break;
        heap[i] = heap[m];
        i = m;
    }
    heap[i] = last;
    return top;
}

/* ---- gateways' lives ---- */

static void gw_start(int g)
{
    gateway_t *gw = &gws[g];
    memset(&gw->stats, 0, sizeof(gw->stats));
    store_options_t so = {.timeout_ms = 600000, .migrate = true};
    store_sqlite_options_t sq = {.path = store_path, .peers = !exclusive};
    char msg[300];
    store_t *real = store_sqlite_new(base, &so, &sq, msg, sizeof(msg));
    if (!real) {
        fprintf(stderr, "sim: gateway %d cannot open the store: %s\n", g, msg);
        exit(2);
    }
    gw->store = sim_gate_new(g, real, &gw->gate);
    gw->cache = replay_cache_new((size_t)cfg->cache_entries, (size_t)cfg->cache_bytes);
    gw->subject = subject_new(base, &cfg->subject, msg, sizeof(msg));
    if (!gw->subject) {
        fprintf(stderr, "sim: subject: %s\n", msg);
        exit(2);
    }
    gw->tasks = task_routes_new();
    idem_ctx_t ctx = {
        .base = base,
        .cfg = cfg,
        .store = gw->store,
        .cache = gw->cache,
        .stats = &gw->stats,
        .subject = gw->subject,
        .tasks = gw->tasks,
    };
    gw->idem = idem_new(&ctx);
    gw->alive = true;
}

static sim_attempt_t **live_atts;
static size_t n_live, cap_live;

static void attempt_retry_later(lcall_t *lc, uint64_t delay);
static void att_over(sim_attempt_t *a);

void sim_gateway_dies(int g)
{
    gateway_t *gw = &gws[g];
    if (!gw->alive)
        return;
    gw->alive = false;
    gw->life++;
    sim_gate_kill(gw->gate);
    /* what the dead process held is gone with it: its calls (each ended by its exchange's
     * last call, as nothing of a killed process runs again), its stage, its cache */
    for (size_t i = 0; i < n_live; i++)
        if (live_atts[i]->gw == g && !live_atts[i]->gw_died)
            sim_exchange_detach(live_atts[i]->ex);
    idem_free(gw->idem);
    gw->idem = NULL;
    replay_cache_free(gw->cache);
    subject_free(gw->subject);
    task_routes_free(gw->tasks);
    gw->cache = NULL;
    gw->subject = NULL;
    gw->tasks = NULL;
    for (size_t i = 0; i < n_live; i++) {
        sim_attempt_t *a = live_atts[i];
        if (a->gw == g && !a->gw_died) {
            a->gw_died = true;
            if (!a->over) {
                attempt_retry_later(a->lc, sim_below(2000)); /* the connection broke */
                att_over(a);
            }
        }
    }
    gw->restarting = true;
    schedule(100 + sim_below(3000), EV_GW_RESTART, NULL, g);
}

static int pick_gateway(void)
{
    int start = (int)sim_below(GATEWAYS);
    for (int i = 0; i < GATEWAYS; i++)
        if (gws[(start + i) % GATEWAYS].alive)
            return (start + i) % GATEWAYS;
    return -1;
}

/* ---- attempts ---- */

static void att_track(sim_attempt_t *a)
{
    if (n_live == cap_live) {
        cap_live = cap_live ? cap_live * 2 : 256;
        live_atts = xrealloc(live_atts, cap_live * sizeof(*live_atts));
    }
    live_atts[n_live++] = a;
}

static void lcall_maybe_done(lcall_t *lc);

/* The attempt is over for the simulator: its agent got what it gets. */
static void att_over(sim_attempt_t *a)
{
    if (a->over)
        return;
    a->over = true;
    a->lc->open--;
    lcall_maybe_done(a->lc);
}

static void lcall_unref(lcall_t *lc)
{
    if (--lc->refs == 0 && lc->done)
        free(lc);
}

/* Frees the attempts that are over and that no event points at. */
static void reap_attempts(void)
{
    size_t j = 0;
    for (size_t i = 0; i < n_live; i++) {
        sim_attempt_t *a = live_atts[i];
        if (a->over && a->refs == 0) {
            sim_exchange_free(a->ex);
            lcall_unref(a->lc);
            free(a);
            continue;
        }
        live_atts[j++] = a;
    }
    n_live = j;
}

static void send_attempt(lcall_t *lc)
{
    if (lc->done)
        return;
    int g = pick_gateway();
    if (g < 0) {
        attempt_retry_later(lc, 200 + sim_below(1000));
        return;
    }
    static uint64_t next_id = 1;
    sim_attempt_t *a = xcalloc(1, sizeof(*a));
    a->id = next_id++;
    a->lc = lc;
    a->gw = g;
    a->life = gws[g].life;
    lc->attempts++;
    lc->open++;
    lc->refs++;
    calls++;
    att_track(a);
    char body[300];
    snprintf(body, sizeof(body),
             "{\"jsonrpc\":\"2.0\",\"id\":%" PRIu64 ",\"method\":\"tools/call\",\"params\":"
             "{\"name\":\"%s\",\"arguments\":{\"amount\":%d,\"to\":\"acct\"}}}",
             a->id, lc->release_tool ? "refund_release" : "refund", lc->amount);
    char subj[16], ek[32];
    snprintf(subj, sizeof(subj), "user%d", lc->subject);
    snprintf(ek, sizeof(ek), "order-%d", lc->ekey);
    const char *hdrs[] = {"X-Subject", subj, lc->ekey >= 0 ? "Idempotency-Key" : NULL, ek, NULL};
    a->ex = sim_exchange_new(a, body, hdrs);
    a->refs++;
    schedule(AGENT_TIMEOUT_MS, EV_AGENT_TIMEOUT, a, 0);
    current = a;
    idem_call(gws[g].idem, a->ex);
    current = NULL;
}

static void attempt_retry_later(lcall_t *lc, uint64_t delay)
{
    if (lc->done || lc->attempts >= MAX_ATTEMPTS)
        return;
    lc->open++; /* the retry to come keeps the call open */
    lc->refs++;
    schedule(delay, EV_ATTEMPT, lc, 1);
}

static void lcall_maybe_done(lcall_t *lc)
{
    if (lc->open > 0)
        return;
    if (!lc->done) {
        lc->done = true;
        /* the agent goes on with its next call after a pause */
        schedule(sim_below(200), EV_AGENT_NEXT, NULL, lc->agent);
    }
    if (lc->refs == 0)
        free(lc);
}

static void start_lcall(int agent)
{
    lcall_t *lc = xcalloc(1, sizeof(*lc));
    lc->agent = agent;
    lc->subject = (int)sim_below(SUBJECTS);
    lc->release_tool = sim_chance(1, 5);
    lc->ekey = sim_chance(1, 5) ? (int)sim_below(EXPLICIT_KEYS) : -1;
    /* with an explicit key, few argument sets: the same key is reused with others */
    lc->amount = lc->ekey >= 0 ? (int)sim_below(3) : (int)sim_below(AMOUNTS);
    if (lc->ekey >= 0)
        snprintf(lc->mk, sizeof(lc->mk), "%c,user%d,key=order-%d", lc->release_tool ? 'R' : 'H',
                 lc->subject, lc->ekey);
    else
        snprintf(lc->mk, sizeof(lc->mk), "%c,user%d,amount=%d", lc->release_tool ? 'R' : 'H',
                 lc->subject, lc->amount);
    lc->m = model_of(lc->mk, lc->release_tool);
    lc->again = sim_chance(1, 8);
    lc->open++; /* held while it starts */
    send_attempt(lc);
    /* a duplicate sent at once beside it: a client that retries concurrently */
    if (sim_chance(1, 6))
        attempt_retry_later(lc, sim_below(10));
    lc->open--;
    lcall_maybe_done(lc);
}

/* ---- what the shim and the exchange tell ---- */

void sim_on_claim(struct sim_attempt *a, const char *key, bool acquired, int64_t fence)
{
    if (!a)
        return;
    model_t *m = a->lc->m;
    trace(m->mk,
          "attempt %" PRIu64 " gw %d claim %s fence %" PRId64 " (allowed %d exp %" PRIu64
          " lease_until %" PRIu64 ")",
          a->id, a->gw, acquired ? "acquired" : "not acquired", fence, m->allowed, m->exp,
          m->lease_until);
    if (!acquired)
        return;
    uint64_t now = sim_wall_ms();
    uint64_t lease = m->release_mode ? lease_release_ms : lease_ms;
    bool past_lease = m->release_mode && m->lease_until && now >= m->lease_until;
    a->claimed = true;
    a->claim_legit = m->allowed || now >= m->exp || past_lease;
    a->fence = fence;
    m->allowed = false;
    m->exp = m->claim_exp = now + (lease > window_ms ? lease : window_ms);
    m->lease_until = m->claim_lease = now + lease;
    m->cur_claim = a->id;
    if (!m->store_key || strcmp(m->store_key, key) != 0) {
        free(m->store_key);
        m->store_key = xstrdup(key);
    }
}

void sim_on_finish(struct sim_attempt *a, const char *key, int64_t fence, store_state_t state,
                   bool matched, uint64_t window)
{
    if (!a)
        return;
    model_t *m = a->lc->m;
    trace(m->mk, "attempt %" PRIu64 " gw %d finish %s fence %" PRId64 " %s", a->id, a->gw,
          store_state_str(state), fence, matched ? "matched" : "not matched");
    if (!matched)
        return;
    if (m->cur_claim != a->id) {
        violation("key %s: the finish of attempt %" PRIu64 " (fence %" PRId64
                  ") landed on a claim it does not hold (held by attempt %" PRIu64 ")",
                  m->mk, a->id, fence, m->cur_claim);
        return;
    }
    /* an upstream that ran the call and said so, or may have run it, leaves the key held,
     * unless its tool chose on_ambiguous: release (a tool error is released by policy) */
    if (state == STORE_STATE_FAILED && a->claimed && a->tok[0] &&
        (a->up_kind == UP_OK ||
         (!m->release_mode && (a->up_kind == UP_CLOSED_MID || a->up_kind == UP_TIMEOUT))))
        violation("key %s: attempt %" PRIu64 " ran upstream (%s) and its key was released", m->mk,
                  a->id, a->up_kind == UP_OK ? "a result" : "an ambiguous end");
    m->exp = sim_wall_ms() + window;
    m->lease_until = 0;
    if (state == STORE_STATE_FAILED)
        m->allowed = true;
    if (state == STORE_STATE_SUCCEEDED && a->tok[0]) {
        if (m->recorded_tok) {
            unsigned i = m->n_older++ % OLDER_MAX;
            free(m->older[i].tok);
            m->older[i].tok = m->recorded_tok;
            m->older[i].mono = m->rec_mono;
            m->older[i].jumps = m->rec_jumps;
            m->older[i].back = m->rec_back;
        }
        m->recorded_tok = xstrdup(a->tok);
        m->rec_mono = mono_ms;
        m->rec_jumps = n_forward_jumps;
        m->rec_back = back_jumps_ms;
    }
}

void sim_on_forward(exchange_t *ex)
{
    sim_attempt_t *a = sim_exchange_attempt(ex);
    model_t *m = a->lc->m;
    a->up_pending = true;
    trace(m->mk, "attempt %" PRIu64 " gw %d forwarded", a->id, a->gw);
    if (!a->claimed)
        violation("key %s: attempt %" PRIu64 " went upstream without a claim", m->mk, a->id);
    else if (!a->claim_legit)
        violation("key %s: executed again within its window (attempt %" PRIu64 ", %" PRIu64
                  " executions before)",
                  m->mk, a->id, m->execs);
    m->execs++;
    n_execs++;
    snprintf(a->tok, sizeof(a->tok), "tok/%s/%d/%" PRIu64 "/", m->mk, a->lc->amount, m->execs);
    uint64_t delay = 1 + sim_below(300);
    up_kind_t kind = UP_OK;
    uint64_t r = sim_below(100);
    if (r < 6)
        kind = UP_TOOL_ERROR;
    else if (r < 11)
        kind = UP_RPC_ERROR;
    else if (r < 14)
        kind = UP_CONNECT;
    else if (r < 17)
        kind = UP_CLOSED_MID;
    else if (r < 20)
        kind = UP_TIMEOUT;
    else if (r < 23)
        kind = UP_TWICE;
    else if (r < 30)
        delay = 2000 + sim_below(UPSTREAM_TIMEOUT_MS - 2000); /* slow: past the agent's wait */
    if (kind != UP_OK)
        n_upstream_faults++;
    if (kind == UP_TIMEOUT)
        delay = UPSTREAM_TIMEOUT_MS;
    a->up_kind = (int)kind;
    a->refs++;
    schedule(delay, EV_UPSTREAM, a, (int)kind);
}

/* The JSON-RPC id an answer carries is its caller's: "id":N not followed by a digit. */
static bool has_own_id(const char *body, uint64_t id)
{
    char want[40];
    int n = snprintf(want, sizeof(want), "\"id\":%" PRIu64, id);
    for (const char *p = strstr(body, want); p; p = strstr(p + 1, want))
        if (p[n] < '0' || p[n] > '9')
            return true;
    return false;
}

void sim_on_answer(exchange_t *ex)
{
    sim_attempt_t *a = sim_exchange_attempt(ex);
    bool ended;
    const char *body = sim_exchange_answer(ex, &ended);
    lcall_t *lc = a->lc;
    model_t *m = lc->m;
    n_answers++;
    trace(m->mk, "attempt %" PRIu64 " gw %d answered: %.200s", a->id, a->gw, body);
    for (const char *q = body; *q; q++)
        digest = (digest ^ (unsigned char)*q) * 1099511628211ULL;
    if (!has_own_id(body, a->id))
        violation("attempt %" PRIu64 " (key %s) got an answer without its own id: %.300s", a->id,
                  m->mk, body);
    const char *t = strstr(body, "tok/");
    bool replay = strstr(body, "\"replayed\":true") != NULL;
    if (t) {
        char own[128];
        snprintf(own, sizeof(own), "tok/%s/%d/", m->mk, lc->amount);
        if (strncmp(t, own, strlen(own)) != 0)
            violation("attempt %" PRIu64 " (key %s, amount %d) got another call's result: %.120s",
                      a->id, m->mk, lc->amount, t);
        else if (replay) {
            n_replays++;
            size_t n = m->recorded_tok ? strlen(m->recorded_tok) : 0;
            /* Known: a gateway's replay cache keeps a result for the window by the monotonic
             * clock, the row by the wall clock. After the wall clock jumps forward the row may
             * expire, and the call run again, while another gateway still replays the first
             * result until its own window ends: at the latest the window after the result was
             * recorded, lengthened by the backward jumps since (a cache filled from the row
             * later measures what was left of it by the wall clock). Counted, and not taken
             * for a violation. */
            bool known = false;
            for (unsigned i = 0; i < OLDER_MAX && i < m->n_older && !known; i++) {
                size_t on = strlen(m->older[i].tok);
                known = strncmp(t, m->older[i].tok, on) == 0 &&
                        n_forward_jumps > m->older[i].jumps &&
                        mono_ms < m->older[i].mono + window_ms + (back_jumps_ms - m->older[i].back);
            }
            if (m->recorded_tok && strncmp(t, m->recorded_tok, n) == 0)
                ;
            else if (known)
                n_stale_after_jump++;
            else
                violation("attempt %" PRIu64 " (key %s): a replay of %.80s, but the result "
                          "recorded is %s",
                          a->id, m->mk, t, m->recorded_tok ? m->recorded_tok : "none");
        }
    }
    /* what the agent does next: done with a result; else, now and then, it tries again */
    if (!t && !lc->done && sim_chance(1, 2))
        attempt_retry_later(lc, 500 + sim_below(4000));
    else if (t && lc->again && !lc->done) {
        lc->again = false;
        attempt_retry_later(lc, sim_below(30000));
    }
    att_over(a);
}

/* ---- the steps ---- */

static void upstream_answers(sim_attempt_t *a, up_kind_t kind)
{
    exchange_t *ex = a->ex;
    char body[512];
    const char *ct = "application/json";
    switch (kind) {
    case UP_OK:
    case UP_TWICE:
        snprintf(body, sizeof(body),
                 "{\"jsonrpc\":\"2.0\",\"id\":%" PRIu64 ",\"result\":{\"content\":[{\"type\":"
                 "\"text\",\"text\":\"%s\"}]}}",
                 a->id, a->tok);
        sim_exchange_head(ex, 200, ct);
        sim_exchange_body(ex, body, strlen(body));
        if (kind == UP_TWICE)
            sim_exchange_body(ex, body, strlen(body));
        sim_exchange_end(ex, UPSTREAM_OK);
        break;
    case UP_TOOL_ERROR:
        snprintf(body, sizeof(body),
                 "{\"jsonrpc\":\"2.0\",\"id\":%" PRIu64 ",\"result\":{\"isError\":true,"
                 "\"content\":[{\"type\":\"text\",\"text\":\"%s declined\"}]}}",
                 a->id, a->tok);
        sim_exchange_head(ex, 200, ct);
        sim_exchange_body(ex, body, strlen(body));
        sim_exchange_end(ex, UPSTREAM_OK);
        break;
    case UP_RPC_ERROR:
        snprintf(body, sizeof(body),
                 "{\"jsonrpc\":\"2.0\",\"id\":%" PRIu64 ",\"error\":{\"code\":-32000,"
                 "\"message\":\"busy\"}}",
                 a->id);
        sim_exchange_head(ex, 200, ct);
        sim_exchange_body(ex, body, strlen(body));
        sim_exchange_end(ex, UPSTREAM_OK);
        break;
    case UP_CONNECT:
        sim_exchange_end(ex, UPSTREAM_ERR_CONNECT);
        break;
    case UP_CLOSED_MID:
        snprintf(body, sizeof(body), "{\"jsonrpc\":\"2.0\",\"id\":%" PRIu64 ",\"res", a->id);
        sim_exchange_head(ex, 200, ct);
        sim_exchange_body(ex, body, strlen(body));
        sim_exchange_end(ex, UPSTREAM_ERR_CLOSED);
        break;
    case UP_TIMEOUT:
        sim_exchange_end(ex, UPSTREAM_ERR_HEAD_TIMEOUT);
        break;
    case UP_KINDS:
        break;
    }
}

static void crash(void)
{
    n_crashes++;
    if (trace_mk)
        printf("trace: step %" PRIu64 ": power loss\n", step);
    faults++;
    sim_vfs_power_off();
    for (int g = 0; g < GATEWAYS; g++)
        sim_gateway_dies(g);
    sim_gates_settle(base); /* closes the stores: nothing reaches the disk */
    sim_vfs_reboot();
    exclusive = sim_chance(1, 3);
    n_exclusive_lives += exclusive;
    for (int g = 0; g < GATEWAYS; g++) {
        if (!gws[g].restarting) {
            gws[g].restarting = true;
            schedule(100 + sim_below(3000), EV_GW_RESTART, NULL, g);
        }
    }
    /* a finish that never reached the disk leaves its claim: the row ends when the claim said */
    for (size_t i = 0; i < n_models; i++) {
        model_t *m = model_list[i];
        if (m->claim_exp && m->exp > m->claim_exp)
            m->exp = m->claim_exp;
        if (m->cur_claim && !m->lease_until)
            m->lease_until = m->claim_lease;
    }
}

static void on_released(void *arg, bool released, bool had_row, store_state_t was)
{
    model_t *m = arg;
    if (!released)
        return;
    n_releases++;
    trace(m->mk, "released by the operator (was %s)", store_state_str(was));
    if (was != STORE_STATE_UNKNOWN && was != STORE_STATE_IN_PROGRESS)
        violation("key %s: the operator's release freed a row in state %s", m->mk,
                  store_state_str(was));
    m->allowed = true;
    m->cur_claim = 0;
    m->lease_until = m->claim_lease = 0;
}

static void run_step(const ev_t *e)
{
    switch (e->kind) {
    case EV_AGENT_NEXT:
        start_lcall(e->a);
        break;
    case EV_ATTEMPT: {
        lcall_t *lc = e->p;
        lc->refs--; /* held by the open count until it is sent */
        send_attempt(lc);
        lc->open--;
        lcall_maybe_done(lc);
        break;
    }
    case EV_UPSTREAM: {
        sim_attempt_t *a = e->p;
        a->refs--;
        a->up_pending = false;
        if (!a->gw_died) {
            current = a;
            upstream_answers(a, (up_kind_t)e->a);
            current = NULL;
        }
        break;
    }
    case EV_AGENT_TIMEOUT: {
        sim_attempt_t *a = e->p;
        a->refs--;
        if (a->over || a->gw_died)
            break;
        bool ended;
        if (sim_exchange_answer(a->ex, &ended) || ended)
            break;
        a->left = true;
        sim_exchange_leave(a->ex);
        attempt_retry_later(a->lc, sim_below(3000));
        att_over(a);
        break;
    }
    case EV_GW_RESTART:
        gws[e->a].restarting = false;
        if (!gws[e->a].alive && (!exclusive || e->a == 0))
            gw_start(e->a);
        break;
    case EV_CRASH:
        crash();
        schedule(60000 + sim_below(120000), EV_CRASH, NULL, 0);
        break;
    case EV_CLOCK_JUMP: {
        n_jumps++;
        faults++;
        int64_t d = (int64_t)sim_below(60000) - 20000; /* -20 s .. +40 s */
        if (trace_mk)
            printf("trace: step %" PRIu64 ": wall clock jumps %+" PRId64 " ms\n", step, d);
        __atomic_store_n(&wall_offset, wall_offset + d, __ATOMIC_RELEASE);
        n_forward_jumps += d > 0;
        back_jumps_ms += d < 0 ? (uint64_t)-d : 0;
        schedule(5000 + sim_below(20000), EV_CLOCK_JUMP, NULL, 0);
        break;
    }
    case EV_RELEASE: {
        schedule(500 + sim_below(3000), EV_RELEASE, NULL, 0);
        int g = pick_gateway();
        if (g < 0 || n_models == 0)
            break;
        model_t *m = model_list[sim_below(n_models)];
        if (m->store_key)
            sim_gate_release(gws[g].gate, m->store_key, on_released, m);
        break;
    }
    }
}

/* After a step: every attempt of a live gateway that is not waiting on its upstream has ended. */
static void check_ended(void)
{
    for (size_t i = 0; i < n_live; i++) {
        sim_attempt_t *a = live_atts[i];
        if (a->over || a->gw_died || a->left)
            continue;
        bool ended;
        const char *ans = sim_exchange_answer(a->ex, &ended);
        if (ans)
            continue;
        if (ended) {
            att_over(a);
            continue;
        }
        if (a->up_pending)
            continue; /* its upstream has not answered yet */
        violation("attempt %" PRIu64 " (key %s) on gateway %d ended without an answer", a->id,
                  a->lc->m->mk, a->gw);
        att_over(a);
    }
}

static const char YAML[] = "upstream: http://127.0.0.1:9/mcp\n"
                           "subject:\n  header: X-Subject\n"
                           "timeouts:\n  upstream: 15s\n"
                           "tools:\n"
                           "  refund:\n    class: non_idempotent\n    window: 60s\n"
                           "  refund_release:\n    class: non_idempotent\n    window: 60s\n"
                           "    on_ambiguous: release\n    lease: 15s\n";

int main(int argc, char **argv)
{
    uint64_t want_calls = 1000000;
    seed = (uint64_t)time(NULL);
    const char *dir = getenv("SIM_DIR") ? getenv("SIM_DIR") : "/dev/shm";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--calls") == 0 && i + 1 < argc)
            want_calls = strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: sim [--seed N] [--calls N]\n");
            return 2;
        }
    }
    rng_state = seed;
    log_threshold = LOG_OFF;
    trace_mk = getenv("SIM_TRACE");
    util_clock_hook = clock_hook;
    sim_vfs_install();

    snprintf(store_path, sizeof(store_path), "%s/idemgw-sim-%d.db", dir, (int)getpid());
    const char *suffixes[] = {"", "-wal", "-shm", ".lock"};
    char p[600];
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof(p), "%s%s", store_path, suffixes[i]);
        unlink(p);
    }

    config_errors_t errs = {0};
    cfg = config_load_string("sim.yaml", YAML, &errs);
    if (!cfg) {
        for (size_t i = 0; i < errs.n; i++)
            fprintf(stderr, "sim: config: %s\n", errs.msgs[i]);
        return 2;
    }
    policy_rules_t rules =
        policy_rules(policy_lookup(&cfg->policy, "refund"), cfg->upstream_timeout_ms);
    lease_ms = rules.lease_ms;
    window_ms = rules.window_ms;
    lease_release_ms =
        policy_rules(policy_lookup(&cfg->policy, "refund_release"), cfg->upstream_timeout_ms)
            .lease_ms;

    base = event_base_new();
    for (int g = 0; g < GATEWAYS; g++)
        gw_start(g);
    for (int a = 0; a < AGENTS; a++)
        schedule(sim_below(100), EV_AGENT_NEXT, NULL, a);
    schedule(60000 + sim_below(120000), EV_CRASH, NULL, 0);
    schedule(5000 + sim_below(20000), EV_CLOCK_JUMP, NULL, 0);
    schedule(1000, EV_RELEASE, NULL, 0);

    printf("sim: seed=%" PRIu64 " gateways=%d agents=%d store=%s\n", seed, GATEWAYS, AGENTS,
           store_path);
    fflush(stdout);
    time_t started = time(NULL);
    while (heap_n > 0 && violations == 0) {
        ev_t e = unschedule();
        /* once the budget is spent, agents start nothing new and the rest drains */
        if (e.kind == EV_AGENT_NEXT && calls >= want_calls)
            continue;
        if (calls >= want_calls &&
            (e.kind == EV_CRASH || e.kind == EV_CLOCK_JUMP || e.kind == EV_RELEASE))
            continue;
        step++;
        __atomic_store_n(&mono_ms, e.t, __ATOMIC_RELEASE);
        run_step(&e);
        sim_gates_settle(base);
        check_ended();
        reap_attempts();
        if (step % 200000 == 0) {
            printf("sim: step %" PRIu64 ": calls=%" PRIu64 " faults=%" PRIu64 " (%lds)\n", step,
                   calls, faults, (long)(time(NULL) - started));
            fflush(stdout);
        }
    }
    faults += n_upstream_faults;
    printf("sim: %" PRIu64 " s simulated, %" PRIu64 " steps, %" PRIu64 " executions, %" PRIu64
           " replays checked, %" PRIu64 " answers; faults: %" PRIu64 " gateway kills, %" PRIu64
           " disk, %" PRIu64 " power losses (%" PRIu64
           " then served by one gateway alone), %" PRIu64 " clock jumps, %" PRIu64
           " upstream; %" PRIu64 " operator releases; %" PRIu64
           " stale replays after a forward clock jump (known);"
           " answers digest %016" PRIx64 "; %lds\n",
           (mono_ms - 1000000) / 1000, step, n_execs, n_replays, n_answers, n_kills, n_disk,
           n_crashes, n_exclusive_lives, n_jumps, n_upstream_faults, n_releases, n_stale_after_jump,
           digest, (long)(time(NULL) - started));
    printf("sim: seed=%" PRIu64 " calls=%" PRIu64 " faults=%" PRIu64 " violations=%" PRIu64 "\n",
           seed, calls, faults, violations);
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof(p), "%s%s", store_path, suffixes[i]);
        unlink(p);
    }
    return violations ? 1 : 0;
}
