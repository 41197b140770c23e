/* The store for an operator's command (see src/cmd/store_cli.h). */
#include "store_cli.h"
#include "store_url.h"

#include "log.h"
#include "store_open.h"
#include "util.h"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* The end of every "no database" message: where a store is named. */
#define STORE_CLI_HOW_TO_NAME                                                                      \
    "name the store with --database-url sqlite:PATH (the embedded store's file) or a Postgres "    \
    "URL, or database_url in -c FILE, or IDEMGW_DATABASE_URL"

/* Waiting for the store, then its one call. */
typedef struct cli_wait {
    store_cli_run_t *run;
    store_t *store;
    uint64_t timeout_ms;  /* the store's: how long to wait for it to be ready */
    uint64_t deadline_ms; /* util_now_ms() when waiting ends */
    struct event *tick;   /* polls store_ready until the call is made */
} cli_wait_t;

void store_cli_done(store_cli_run_t *run)
{
    event_base_loopbreak(run->base);
}

bool store_cli_failed(store_cli_run_t *run, store_status_t st, const char *what)
{
    if (st == STORE_OK)
        return false;
    fprintf(stderr, "%s: %s failed: store %s\n", run->cmd, what, store_status_str(st));
    run->rc = STORE_CLI_EXIT_FAILED;
    return true;
}

static void cli_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    cli_wait_t *w = arg;
    if (!store_ready(w->store)) {
        if (util_now_ms() < w->deadline_ms)
            return;
        fprintf(stderr,
                "%s: Postgres is not reachable (no connection ready within %llu ms, "
                "store.timeout)\n",
                w->run->cmd, (unsigned long long)w->timeout_ms);
        w->run->rc = STORE_CLI_EXIT_FAILED;
        store_cli_done(w->run);
        return;
    }
    event_del(w->tick);
    if (store_cli_failed(w->run, w->run->call(w->store, w->run), "the store call"))
        store_cli_done(w->run);
}

int store_cli_exec(const config_t *cfg, store_cli_run_t *run)
{
    run->rc = STORE_CLI_EXIT_FAILED;
    const char *url = run->database_url ? run->database_url
                      : cfg             ? cfg->database_url
                                        : getenv("IDEMGW_DATABASE_URL");
    if (url && !url[0])
        url = NULL;
    char why[300];
    if (url && store_url_error(url, why, sizeof(why))) {
        fprintf(stderr, "%s: database_url: %s\n", run->cmd, why);
        return run->rc;
    }
    char *path = NULL;
    const store_backend_t *backend = store_choose(url, &path);
    if (!backend) {
        fprintf(stderr, "%s: no database: database_url is none; " STORE_CLI_HOW_TO_NAME "\n",
                run->cmd);
        return run->rc;
    }
    if (backend->local_file && !path) {
        fprintf(stderr,
                "%s: no database: %s; " STORE_CLI_HOW_TO_NAME "\n", run->cmd,
                url ? "database_url names no file"
                    : "no database_url, and none of STATE_DIRECTORY, XDG_STATE_HOME, HOME is set "
                      "for the embedded store's default file");
        return run->rc;
    }
    /* never creates the embedded store: no file means no gateway ever kept a key there */
    if (backend->local_file && access(path, F_OK) != 0) {
        fprintf(stderr,
                "%s: no database: the embedded store%s %s does not exist; " STORE_CLI_HOW_TO_NAME
                "\n",
                run->cmd, url ? "" : "'s default file", path);
        free(path);
        return run->rc;
    }
    cli_wait_t w = {
        .run = run,
        .timeout_ms = cfg ? cfg->store_timeout_ms : STORE_TIMEOUT_DEFAULT_MS,
    };
    FILE *saved_stream = log_stream;
    log_level_t saved_threshold = log_threshold;
    log_stream = stderr;
    log_threshold = LOG_WARN;

    store_open_opts_t so = {
        .common = {.timeout_ms = w.timeout_ms, .migrate = false},
        .pg = {.pool_size = 1},
        .sqlite = {.shared = true},
    };
    char msg[512] = "";
    run->base = event_base_new();
    if (!run->base) {
        fprintf(stderr, "%s: cannot create an event loop\n", run->cmd);
        goto out;
    }
    w.store = store_open(backend, run->base, path, &so, msg, sizeof msg);
    if (!w.store) {
        fprintf(stderr, "%s: store: %s\n", run->cmd, msg);
        goto out;
    }
    w.deadline_ms = util_now_ms() + w.timeout_ms;
    w.tick = event_new(run->base, -1, EV_PERSIST, cli_tick, &w);
    if (!w.tick) {
        fprintf(stderr, "%s: cannot create an event\n", run->cmd);
        goto out;
    }
    struct timeval tv = {0, 10 * 1000};
    event_add(w.tick, &tv);
    event_base_dispatch(run->base); /* until the answer or the deadline breaks it */
out:
    if (w.tick)
        event_free(w.tick);
    store_free(w.store); /* out of every store callback: the loop has returned */
    if (run->base)
        event_base_free(run->base);
    run->base = NULL;
    log_stream = saved_stream;
    log_threshold = saved_threshold;
    free(path);
    return run->rc;
}
