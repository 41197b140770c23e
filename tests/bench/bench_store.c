/* Store throughput: claims/s (fresh keys, all inserts), then finish/s on the claimed keys,
 * with `inflight` calls outstanding on one event loop and a pool of `pool` connections.
 *   make build/obj/store.o build/obj/store_conn.o build/obj/gen/migrations.o build/obj/log.o \
 *        build/obj/util.o
 *   cc -std=c11 -D_GNU_SOURCE -O2 -Iinclude $(pkg-config --cflags libpq) \
 *      tests/bench/bench_store.c build/obj/{store,store_pg,store_conn,log,util}.o \
 *      build/obj/gen/migrations.o $(pkg-config --libs libevent libpq openssl) -o build/bench_store
 *   build/bench_store URL [count] [pool] [inflight]
 * Uses its own table rows (prefix "bench:<pid>:") and deletes nothing: use a scratch database. */
#include "log.h"
#include "store.h"
#include "store_pg.h"
#include "util.h"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct event_base *base;
static store_t *store;
static int total, inflight_max, issued, completed, errors;
static int64_t *fences;
static bool finishing;

static void issue(void);

static void key_of(int i, char *out, size_t len)
{
    snprintf(out, len, "bench:%ld:%d", (long)getpid(), i);
}

static void done_one(void)
{
    completed++;
    if (completed == total)
        event_base_loopbreak(base);
    else
        issue();
}

static void claim_cb(store_status_t st, const store_claim_result_t *res, void *arg)
{
    int i = (int)(intptr_t)arg;
    if (st != STORE_OK || !res->acquired)
        errors++;
    else
        fences[i] = res->fence;
    done_one();
}

static void finish_cb(store_status_t st, bool matched, void *arg)
{
    (void)arg;
    if (st != STORE_OK || !matched)
        errors++;
    done_one();
}

static void issue(void)
{
    while (issued < total && issued - completed < inflight_max) {
        char key[64];
        int i = issued++;
        key_of(i, key, sizeof(key));
        store_status_t st;
        if (!finishing) {
            store_claim_req_t req = {.key = key,
                                     .tool = "bench",
                                     .subject = "bench",
                                     .args_digest = "0123456789abcdef0123456789abcdef",
                                     .session_id = "s",
                                     .jsonrpc_id = "1",
                                     .lease_ms = 30000,
                                     .window_ms = 600000};
            st = store_claim(store, &req, claim_cb, (void *)(intptr_t)i);
        } else {
            static const char result[] = "{\"content\":[{\"type\":\"text\",\"text\":\"done\"}]}";
            store_finish_req_t fin = {.key = key,
                                      .fence = fences[i],
                                      .state = STORE_STATE_SUCCEEDED,
                                      .result = result,
                                      .result_len = sizeof(result) - 1,
                                      .window_ms = 600000};
            st = store_finish(store, &fin, finish_cb, NULL);
        }
        if (st != STORE_OK) {
            fprintf(stderr, "call refused: %s\n", store_status_str(st));
            exit(1);
        }
    }
}

static double run_phase(bool fin)
{
    finishing = fin;
    issued = completed = 0;
    uint64_t t0 = util_now_ms();
    issue();
    event_base_dispatch(base);
    return (double)(util_now_ms() - t0) / 1000.0;
}

static void tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    if (store_ready(store))
        event_base_loopbreak(arg);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s URL [count] [pool] [inflight]\n", argv[0]);
        return 2;
    }
    total = argc > 2 ? atoi(argv[2]) : 20000;
    int pool = argc > 3 ? atoi(argv[3]) : 4;
    inflight_max = argc > 4 ? atoi(argv[4]) : 64;
    log_threshold = LOG_WARN;
    base = event_base_new();
    store_options_t opt = {.migrate = true};
    store_pg_options_t pg = {.conninfo = argv[1], .pool_size = pool};
    char msg[512];
    store = store_pg_new(base, &opt, &pg, msg, sizeof(msg));
    if (!store) {
        fprintf(stderr, "%s\n", msg);
        return 1;
    }
    struct event *t = event_new(base, -1, EV_PERSIST, tick, base);
    struct timeval tv = {0, 10000};
    event_add(t, &tv);
    event_base_dispatch(base);
    event_free(t);

    fences = calloc((size_t)total, sizeof(*fences));
    double tc = run_phase(false);
    double tf = run_phase(true);
    printf("pool=%d inflight=%d count=%d claims/s=%.0f finish/s=%.0f errors=%d\n", pool,
           inflight_max, total, total / tc, total / tf, errors);
    store_free(store);
    event_base_free(base);
    free(fences);
    return errors ? 1 : 0;
}
