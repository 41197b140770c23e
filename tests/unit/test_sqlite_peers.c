/* The embedded store's peers (store_sqlite.h): several stores on one file, as the copies of
 * `idemgw stdio` for one command are, each with its own connection and writer thread. How the
 * options hold the file (sq_plan) is a table; then two peers on one file: a claim made by one
 * is the other's duplicate, claims raced from both take each key once, leases and takeovers
 * hold across them, and a gateway that wants the file alone and the peers refuse each other. */
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
#include <event2/event.h>

#include "../../src/store/store_sqlite_int.h"
#include "store.h"
#include "store_sqlite.h"
#include "util.h"

static struct event_base *base;
static char dir[] = "/tmp/idemgw-peers-XXXXXX";
static char path[256];
static int file_n;

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
}

static bool wait_for(bool (*pred)(void *), void *arg, uint64_t timeout_ms)
{
    uint64_t deadline = util_now_ms() + timeout_ms;
    struct event *tick = event_new(base, -1, EV_PERSIST, tick_cb, NULL);
    struct timeval tv = {0, 10000};
    event_add(tick, &tv);
    while (!pred(arg) && util_now_ms() < deadline)
        event_base_loop(base, EVLOOP_ONCE);
    event_free(tick);
    return pred(arg);
}

static bool flag_set(void *arg)
{
    return *(bool *)arg;
}

static int setup(void **state)
{
    (void)state;
    base = event_base_new();
    return base && mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    event_base_free(base);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* A new file for each test. */
static void fresh(void)
{
    snprintf(path, sizeof(path), "%s/keys-%d.db", dir, ++file_n);
}

/* A store on path; NULL with msg set when refused. */
static store_t *open_as(bool peers, char *msg, size_t msglen)
{
    store_options_t o = {.migrate = true, .timeout_ms = 5000};
    store_sqlite_options_t sq = {.path = path, .peers = peers};
    return store_sqlite_new(base, &o, &sq, msg, msglen);
}

static store_t *open_peer(void)
{
    char msg[512] = "";
    store_t *s = open_as(true, msg, sizeof(msg));
    if (!s)
        fail_msg("a peer refused: %s", msg);
    return s;
}

typedef struct {
    bool done;
    store_status_t st;
    bool acquired, lease_expired;
    int64_t fence;
    store_state_t state;
    char result[64];
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
    o->lease_expired = res->row.lease_expired;
    snprintf(o->result, sizeof(o->result), "%.*s", (int)res->row.result_len,
             res->row.result ? res->row.result : "");
}

static store_claim_req_t req_for(const char *key, uint64_t lease_ms, bool takeover)
{
    return (store_claim_req_t){.key = key,
                               .tool = "refund",
                               .subject = "local:u",
                               .args_digest = "d1",
                               .session_id = "s",
                               .jsonrpc_id = "1",
                               .lease_ms = lease_ms,
                               .window_ms = 600000,
                               .takeover_lease_expired = takeover};
}

static claim_out_t claim(store_t *s, const char *key, uint64_t lease_ms, bool takeover)
{
    claim_out_t o = {0};
    store_claim_req_t r = req_for(key, lease_ms, takeover);
    assert_int_equal(store_claim(s, &r, claim_cb, &o), STORE_OK);
    assert_true(wait_for(flag_set, &o.done, 10000));
    assert_int_equal(o.st, STORE_OK);
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

static bool finish(store_t *s, const char *key, int64_t fence, const char *result)
{
    finish_out_t o = {0};
    store_finish_req_t f = {.key = key,
                            .fence = fence,
                            .state = STORE_STATE_SUCCEEDED,
                            .result = result,
                            .result_len = strlen(result),
                            .window_ms = 600000};
    assert_int_equal(store_finish(s, &f, finish_cb, &o), STORE_OK);
    assert_true(wait_for(flag_set, &o.done, 10000));
    assert_int_equal(o.st, STORE_OK);
    return o.matched;
}

/* How each kind of opener holds the file. */
static void plans(void **state)
{
    (void)state;
    static const struct {
        bool shared, peers;
        sq_plan_t want;
    } cases[] = {
        /* the gateway (idemgw serve): alone, the gathering VFS, watched */
        {false, false, {SQ_LOCK_EXCLUSIVE, true, true, true}},
        /* idemgw stdio's copies: together, SQLite's VFS, watched */
        {false, true, {SQ_LOCK_SHARED, true, false, true}},
        /* idemgw key: no lock of its own, nothing made, not watched; beside either */
        {true, false, {SQ_LOCK_NONE, false, false, false}},
        {true, true, {SQ_LOCK_NONE, false, false, false}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        sq_plan_t p = sq_plan(cases[i].shared, cases[i].peers);
        if (p.lock != cases[i].want.lock || p.create != cases[i].want.create ||
            p.gather_wal != cases[i].want.gather_wal || p.guard != cases[i].want.guard)
            fail_msg("case %zu: lock %d create %d gather %d guard %d", i, p.lock, p.create,
                     p.gather_wal, p.guard);
    }
}

/* A claim made through one peer is a duplicate through the other, in progress and then
 * replayed with the first one's result. */
static void a_claim_is_seen_by_the_other_peer(void **state)
{
    (void)state;
    fresh();
    store_t *a = open_peer(), *b = open_peer();
    claim_out_t first = claim(a, "k1", 30000, false);
    assert_true(first.acquired);
    claim_out_t dup = claim(b, "k1", 30000, true);
    assert_false(dup.acquired);
    assert_int_equal(dup.state, STORE_STATE_IN_PROGRESS);
    assert_false(dup.lease_expired);
    assert_true(finish(a, "k1", first.fence, "{\"ok\":1}"));
    claim_out_t replay = claim(b, "k1", 30000, true);
    assert_false(replay.acquired);
    assert_int_equal(replay.state, STORE_STATE_SUCCEEDED);
    assert_string_equal(replay.result, "{\"ok\":1}");
    store_free(a);
    /* the other one goes on alone, and a new peer beside it reads the same rows */
    store_t *c = open_peer();
    assert_int_equal(claim(c, "k1", 30000, false).state, STORE_STATE_SUCCEEDED);
    assert_true(claim(b, "k2", 30000, false).acquired);
    assert_false(claim(c, "k2", 30000, false).acquired);
    store_free(b);
    store_free(c);
}

#define RACE_KEYS 200

typedef struct {
    claim_out_t out[2][RACE_KEYS];
    int left;
} race_t;

static bool race_done(void *arg)
{
    race_t *r = arg;
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < RACE_KEYS; k++)
            if (!r->out[p][k].done)
                return false;
    return true;
}

/* Both peers' writer threads claim the same keys at once: each key is taken exactly once. */
static void raced_claims_take_each_key_once(void **state)
{
    (void)state;
    fresh();
    store_t *peer[2] = {open_peer(), open_peer()};
    race_t *r = xcalloc(1, sizeof(*r));
    char keys[RACE_KEYS][16];
    for (int k = 0; k < RACE_KEYS; k++) {
        snprintf(keys[k], sizeof(keys[k]), "race-%d", k);
        for (int p = 0; p < 2; p++) {
            store_claim_req_t q = req_for(keys[k], 30000, true);
            assert_int_equal(store_claim(peer[p], &q, claim_cb, &r->out[p][k]), STORE_OK);
        }
    }
    assert_true(wait_for(race_done, r, 30000));
    for (int k = 0; k < RACE_KEYS; k++) {
        assert_int_equal(r->out[0][k].st, STORE_OK);
        assert_int_equal(r->out[1][k].st, STORE_OK);
        if (r->out[0][k].acquired == r->out[1][k].acquired)
            fail_msg("key %d: acquired by %s", k, r->out[0][k].acquired ? "both" : "neither");
    }
    free(r);
    store_free(peer[0]);
    store_free(peer[1]);
}

/* A claim whose lease ran out under one peer (its process died mid-call) is unknown to the
 * other, or taken over with a new fence when the caller allows it; the first one's late
 * finish then writes nothing. */
static void leases_and_takeovers_hold_across_peers(void **state)
{
    (void)state;
    fresh();
    store_t *a = open_peer(), *b = open_peer();
    claim_out_t first = claim(a, "lease", 1, false);
    assert_true(first.acquired);
    claim_out_t later = {0};
    for (uint64_t until = util_now_ms() + 5000; util_now_ms() < until;) {
        later = claim(b, "lease", 30000, false);
        if (later.lease_expired)
            break;
    }
    assert_false(later.acquired); /* no takeover asked: held, never run again */
    assert_int_equal(later.state, STORE_STATE_IN_PROGRESS);
    assert_true(later.lease_expired);
    claim_out_t taken = claim(b, "lease", 30000, true);
    assert_true(taken.acquired);
    assert_true(taken.fence > first.fence);
    assert_false(finish(a, "lease", first.fence, "{\"late\":1}"));
    assert_true(finish(b, "lease", taken.fence, "{\"new\":1}"));
    assert_string_equal(claim(a, "lease", 30000, false).result, "{\"new\":1}");
    store_free(a);
    store_free(b);
}

/* The gateway's file is its own: peers are refused while it runs, and it is refused while
 * peers run; each refusal says who holds the file. */
static void a_gateway_and_peers_refuse_each_other(void **state)
{
    (void)state;
    fresh();
    char msg[512] = "";
    store_t *gw = open_as(false, msg, sizeof(msg));
    assert_non_null(gw);
    assert_null(open_as(true, msg, sizeof(msg)));
    char pid[64];
    snprintf(pid, sizeof(pid), "in use by another process (pid %ld)", (long)getpid());
    if (!strstr(msg, pid) || !strstr(msg, "alone"))
        fail_msg("the refusal of a peer: %s", msg);
    store_free(gw);

    store_t *p1 = open_peer(), *p2 = open_peer();
    msg[0] = '\0';
    assert_null(open_as(false, msg, sizeof(msg)));
    if (!strstr(msg, "in use by processes that share it"))
        fail_msg("the refusal of a gateway: %s", msg);
    store_free(p1);
    assert_null(open_as(false, msg, sizeof(msg))); /* one peer is enough */
    store_free(p2);
    gw = open_as(false, msg, sizeof(msg)); /* none left: the file is free again */
    assert_non_null(gw);
    store_free(gw);
}

/* Two processes opening one new file at the same moment both get it: the switch to WAL mode,
 * which SQLite may answer BUSY at once while the other holds the file, is tried again. */
static void peers_open_a_new_file_at_once(void **state)
{
    (void)state;
    for (int round = 0; round < 20; round++) {
        fresh();
        int go[2];
        assert_int_equal(pipe(go), 0);
        pid_t pid = fork();
        if (pid == 0) {
            close(go[1]);
            char c;
            if (read(go[0], &c, 1) != 1)
                _exit(3);
            struct event_base *b = event_base_new();
            store_options_t o = {.migrate = true, .timeout_ms = 5000};
            store_sqlite_options_t sq = {.path = path, .peers = true};
            char msg[512] = "";
            store_t *s = store_sqlite_new(b, &o, &sq, msg, sizeof(msg));
            if (!s) {
                fprintf(stderr, "the other peer: %s\n", msg);
                _exit(1);
            }
            store_free(s);
            event_base_free(b);
            _exit(0);
        }
        close(go[0]);
        assert_int_equal(write(go[1], "x", 1), 1);
        close(go[1]);
        store_t *s = open_peer();
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fail_msg("round %d: the other peer could not open the new file", round);
        store_free(s);
    }
}

/* A gateway alone on its file orders a finish before every later call: a claim of the key
 * queued right after the finish, before its callback ran, reads the outcome (so its answer
 * need not wait). Peers do not promise it (another process may claim first), nor does a store
 * whose finishes wait for the disk. */
static void a_store_alone_orders_its_finishes(void **state)
{
    (void)state;
    fresh();
    char msg[512] = "";
    store_t *alone = open_as(false, msg, sizeof(msg));
    assert_non_null(alone);
    assert_true(store_orders_finishes(alone));
    claim_out_t first = claim(alone, "k1", 30000, false);
    assert_true(first.acquired);
    finish_out_t fin = {0};
    store_finish_req_t f = {.key = "k1",
                            .fence = first.fence,
                            .state = STORE_STATE_SUCCEEDED,
                            .result = "{\"ok\":2}",
                            .result_len = 8,
                            .window_ms = 600000};
    assert_int_equal(store_finish(alone, &f, finish_cb, &fin), STORE_OK);
    claim_out_t retry = {0};
    store_claim_req_t r = req_for("k1", 30000, true);
    assert_int_equal(store_claim(alone, &r, claim_cb, &retry), STORE_OK);
    assert_true(wait_for(flag_set, &retry.done, 10000));
    assert_true(fin.done); /* answered in the order they were queued */
    assert_false(retry.acquired);
    assert_int_equal(retry.state, STORE_STATE_SUCCEEDED);
    assert_string_equal(retry.result, "{\"ok\":2}");
    store_free(alone);

    fresh();
    store_t *peer = open_peer();
    assert_false(store_orders_finishes(peer));
    store_free(peer);

    fresh();
    store_options_t o = {.migrate = true, .timeout_ms = 5000};
    store_sqlite_options_t sq = {.path = path, .durable_finish = true};
    store_t *durable = store_sqlite_new(base, &o, &sq, msg, sizeof(msg));
    assert_non_null(durable);
    assert_false(store_orders_finishes(durable));
    store_free(durable);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(plans),
        cmocka_unit_test(a_claim_is_seen_by_the_other_peer),
        cmocka_unit_test(raced_claims_take_each_key_once),
        cmocka_unit_test(leases_and_takeovers_hold_across_peers),
        cmocka_unit_test(a_gateway_and_peers_refuse_each_other),
        cmocka_unit_test(peers_open_a_new_file_at_once),
        cmocka_unit_test(a_store_alone_orders_its_finishes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
