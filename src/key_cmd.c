/* The `idemgw key` subcommand (see include/key_cmd.h). */
#include "key_cmd.h"

#include "config.h"
#include "jcs.h"
#include "key.h"
#include "log.h"
#include "policy.h"
#include "store.h"
#include "store_pg.h"
#include "store_sqlite.h"
#include "util.h"

#include <event2/event.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KEY_CMD_EXIT_USAGE 2
#define KEY_CMD_EXIT_FAILED 2  /* no database, or the store failed */
#define KEY_CMD_EXIT_REFUSED 1 /* --show, --forget: no row; --release: nothing to release */

typedef enum {
    KEY_CMD_PRINT = 0, /* the key only */
    KEY_CMD_SHOW,      /* and its row */
    KEY_CMD_RELEASE,   /* make a held (unknown) outcome runnable again */
    KEY_CMD_FORGET,    /* delete the row, printing what it was */
} key_cmd_action_t;

typedef struct key_cmd_opts {
    const char *subject;
    const char *tool;
    const char *args;
    const char *header_key;
    const char *config;
    bool hash;               /* also print the key_hash of log lines */
    key_cmd_action_t action; /* at most one of --show, --release, --forget */
} key_cmd_opts_t;

static void usage(FILE *f)
{
    fputs("usage: idemgw key --subject S --tool T --args JSON [--header-key K] [-c FILE]\n"
          "                  [--hash] [--show | --release | --forget]\n"
          "  prints the idempotency key for a tools/call of T with arguments JSON by S;\n"
          "  -c FILE applies the tool's exclude_args and key_arg from the config\n"
          "  --hash     also prints the key's key_hash, as the gateway's log lines show it\n"
          "  --show     also prints the key's row in the store as one JSON line (with key_hash)\n"
          "  --release  lets the next identical call run after an unknown outcome (held by\n"
          "             on_ambiguous: hold); only for outcomes that are unknown\n"
          "  --forget   deletes the key's row, whatever its state, and prints it as --show\n"
          "             does (with \"forgotten\": true): the next identical call runs as new\n"
          "  the store: database_url from -c FILE, else IDEMGW_DATABASE_URL, else PG* variables,\n"
          "  else the embedded store's default file ($STATE_DIRECTORY or ./idemgw-keys.db);\n"
          "  an embedded store is used beside a running gateway through SQLite's own locking\n",
          f);
}

/* 0 when parsed, 1 when help was asked for, -1 on a usage error (already reported). */
static int parse_opts(int argc, char **argv, key_cmd_opts_t *o)
{
    enum {
        OPT_SUBJECT = 256,
        OPT_TOOL,
        OPT_ARGS,
        OPT_HEADER_KEY,
        OPT_HASH,
        OPT_SHOW,
        OPT_RELEASE,
        OPT_FORGET
    };
    static const struct option longopts[] = {
        {"subject", required_argument, NULL, OPT_SUBJECT},
        {"tool", required_argument, NULL, OPT_TOOL},
        {"args", required_argument, NULL, OPT_ARGS},
        {"header-key", required_argument, NULL, OPT_HEADER_KEY},
        {"config", required_argument, NULL, 'c'},
        {"hash", no_argument, NULL, OPT_HASH},
        {"show", no_argument, NULL, OPT_SHOW},
        {"release", no_argument, NULL, OPT_RELEASE},
        {"forget", no_argument, NULL, OPT_FORGET},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    optind = 0; /* a fresh scan: the command may run more than once in a process (tests) */
    opterr = 0; /* the messages below name the command */
    int c, actions = 0;
    while ((c = getopt_long(argc, argv, ":c:h", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_SUBJECT:
            o->subject = optarg;
            break;
        case OPT_TOOL:
            o->tool = optarg;
            break;
        case OPT_ARGS:
            o->args = optarg;
            break;
        case OPT_HEADER_KEY:
            o->header_key = optarg;
            break;
        case 'c':
            o->config = optarg;
            break;
        case OPT_HASH:
            o->hash = true;
            break;
        case OPT_SHOW:
        case OPT_RELEASE:
        case OPT_FORGET:
            o->action = c == OPT_SHOW      ? KEY_CMD_SHOW
                        : c == OPT_RELEASE ? KEY_CMD_RELEASE
                                           : KEY_CMD_FORGET;
            actions++;
            break;
        case 'h':
            return 1;
        case ':':
            fprintf(stderr, "idemgw key: %s needs a value\n", argv[optind - 1]);
            return -1;
        default:
            fprintf(stderr, "idemgw key: unexpected argument '%s'\n", argv[optind - 1]);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "idemgw key: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (!o->subject || !o->tool || !o->args) {
        fprintf(stderr, "idemgw key: --subject, --tool and --args are required\n");
        return -1;
    }
    if (!*o->subject || !*o->tool) {
        /* an empty subject would key every caller alike */
        fprintf(stderr, "idemgw key: --subject and --tool must not be empty\n");
        return -1;
    }
    if (actions > 1) {
        fprintf(stderr, "idemgw key: --show, --release and --forget exclude each other\n");
        return -1;
    }
    return 0;
}

/* ---- the key's row, through the store on a loop of its own ---- */

/* One store call, from waiting for the store to the printed answer. */
typedef struct key_run {
    struct event_base *base;
    store_t *store;
    const char *key;
    char key_hash[KEY_HASH_LOG_LEN + 1];
    key_cmd_action_t action;
    uint64_t timeout_ms;  /* the store's: how long to wait for it to be ready */
    uint64_t deadline_ms; /* util_now_ms() when waiting for it ends */
    struct event *tick;   /* polls store_ready until the call is made */
    int rc;
} key_run_t;

/* Prints o as one compact JSON line and frees it. */
static void print_json(json_t *o)
{
    char *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    printf("%s\n", line);
    free(line);
}

static json_t *text_or_null(const char *v)
{
    return v ? json_string(v) : json_null();
}

/* The row as --show has always printed it, key_hash added; more fields may follow. */
static json_t *row_json(const key_run_t *r, const store_row_t *row)
{
    json_t *o = json_object();
    json_object_set_new(o, "key", json_string(r->key));
    json_object_set_new(o, "key_hash", json_string(r->key_hash));
    json_object_set_new(o, "state", json_string(store_state_str(row->state)));
    json_object_set_new(o, "attempts", json_integer(row->attempts));
    json_object_set_new(o, "fence", json_integer(row->fence));
    json_object_set_new(o, "created_at", text_or_null(row->created_at));
    json_object_set_new(o, "finished_at", text_or_null(row->finished_at));
    json_object_set_new(o, "expires_at", text_or_null(row->expires_at));
    json_object_set_new(o, "lease_until", text_or_null(row->lease_until));
    json_object_set_new(o, "lease_expired", json_boolean(row->lease_expired));
    json_object_set_new(o, "first_session_id", text_or_null(row->first_session_id));
    json_object_set_new(o, "first_jsonrpc_id", text_or_null(row->first_jsonrpc_id));
    json_object_set_new(o, "result_bytes",
                        row->result ? json_integer((json_int_t)row->result_len) : json_null());
    json_object_set_new(o, "result_too_large", json_boolean(row->result_too_large));
    return o;
}

/* A store call failed: says which and why. */
static bool store_failed(key_run_t *r, store_status_t st, const char *what)
{
    if (st == STORE_OK)
        return false;
    fprintf(stderr, "idemgw key: %s failed: store %s\n", what, store_status_str(st));
    r->rc = KEY_CMD_EXIT_FAILED;
    return true;
}

static void on_show(store_status_t st, const store_row_t *row, void *arg)
{
    key_run_t *r = arg;
    event_base_loopbreak(r->base);
    if (store_failed(r, st, "reading the row"))
        return;
    if (!row) {
        fprintf(stderr, "idemgw key: no row for this key: never called, or expired and swept\n");
        r->rc = KEY_CMD_EXIT_REFUSED;
        return;
    }
    print_json(row_json(r, row));
    r->rc = 0;
}

static void on_forget(store_status_t st, const store_row_t *row, void *arg)
{
    key_run_t *r = arg;
    event_base_loopbreak(r->base);
    if (store_failed(r, st, "forget"))
        return;
    if (!row) {
        fprintf(stderr, "idemgw key: nothing to forget: no row for this key\n");
        r->rc = KEY_CMD_EXIT_REFUSED;
        return;
    }
    json_t *o = row_json(r, row);
    json_object_set_new(o, "forgotten", json_true());
    print_json(o);
    if (row->state == STORE_STATE_IN_PROGRESS && !row->lease_expired)
        fprintf(stderr,
                "idemgw key: warning: a call was running with this key (lease until %s); it "
                "goes on, and an identical call may now run beside it\n",
                row->lease_until);
    r->rc = 0;
}

/* Released, or why not from the row as it was. */
static void on_release(store_status_t st, bool released, const store_row_t *row, void *arg)
{
    key_run_t *r = arg;
    event_base_loopbreak(r->base);
    if (store_failed(r, st, "release"))
        return;
    r->rc = KEY_CMD_EXIT_REFUSED;
    if (!row) {
        fprintf(stderr, "idemgw key: nothing to release: no row for this key\n");
    } else if (released) {
        print_json(json_pack("{s:s, s:s, s:b, s:s}", "key", r->key, "key_hash", r->key_hash,
                             "released", 1, "was", store_state_str(row->state)));
        r->rc = 0;
    } else if (row->state == STORE_STATE_SUCCEEDED) {
        fprintf(stderr,
                "idemgw key: not released: the call succeeded and its result is replayed until "
                "%s; release is only for unknown outcomes\n",
                row->expires_at);
    } else if (row->state == STORE_STATE_FAILED) {
        fprintf(stderr, "idemgw key: nothing to release: the next identical call runs already\n");
    } else {
        fprintf(stderr,
                "idemgw key: not released: a call holds the key (lease until %s); wait for it "
                "to finish or for the lease to run out\n",
                row->lease_until);
    }
}

/* Makes the one call once the store is ready, or gives up after the store's timeout. */
static void key_run_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    key_run_t *r = arg;
    if (!store_ready(r->store)) {
        if (util_now_ms() < r->deadline_ms)
            return;
        fprintf(stderr,
                "idemgw key: Postgres is not reachable (no connection ready within %llu ms, "
                "store.timeout)\n",
                (unsigned long long)r->timeout_ms);
        r->rc = KEY_CMD_EXIT_FAILED;
        event_base_loopbreak(r->base);
        return;
    }
    event_del(r->tick);
    store_status_t st = STORE_OK;
    switch (r->action) {
    case KEY_CMD_SHOW:
        st = store_get(r->store, r->key, on_show, r);
        break;
    case KEY_CMD_RELEASE:
        st = store_release(r->store, r->key, on_release, r);
        break;
    case KEY_CMD_FORGET:
        st = store_forget(r->store, r->key, on_forget, r);
        break;
    case KEY_CMD_PRINT:
        break;
    }
    if (store_failed(r, st, "the store call"))
        event_base_loopbreak(r->base);
}

/* Runs the action on the key's row; the exit code. */
static int run_on_row(const config_t *cfg, key_cmd_action_t action, const char *key)
{
    const char *url = cfg ? cfg->database_url : getenv("IDEMGW_DATABASE_URL");
    if (url && !url[0])
        url = NULL;
    char *path = NULL;
    config_store_t kind = config_store_choose(url, &path);
    if (kind == CONFIG_STORE_NONE || (kind == CONFIG_STORE_SQLITE && !path)) {
        fprintf(stderr, "idemgw key: no database: database_url is %s\n",
                kind == CONFIG_STORE_NONE ? "none" : "sqlite: without a file");
        free(path);
        return KEY_CMD_EXIT_FAILED;
    }
    /* never creates the embedded store: no file means no gateway ever kept a key there */
    if (kind == CONFIG_STORE_SQLITE && access(path, F_OK) != 0) {
        fprintf(stderr,
                "idemgw key: no database: the embedded store %s does not exist; give "
                "database_url in -c FILE, or set IDEMGW_DATABASE_URL or PGHOST\n",
                path);
        free(path);
        return KEY_CMD_EXIT_FAILED;
    }
    key_run_t r = {
        .key = key,
        .action = action,
        .timeout_ms = cfg ? cfg->store_timeout_ms : STORE_TIMEOUT_DEFAULT_MS,
        .rc = KEY_CMD_EXIT_FAILED,
    };
    key_hash_log(key, r.key_hash);
    /* stdout is the answer: the store's log lines (warnings and errors, such as why it
     * cannot connect) go to stderr */
    FILE *saved_stream = log_stream;
    log_level_t saved_threshold = log_threshold;
    log_stream = stderr;
    log_threshold = LOG_WARN;

    store_options_t so = {
        .conninfo = url,
        .path = path,
        /* the gateway holds the embedded store's lock while it runs: this one short
         * transaction goes through SQLite's own locking beside it, and creates nothing */
        .shared = true,
        .pool_size = 1,
        .timeout_ms = r.timeout_ms,
        .migrate = false, /* an operator's look must not change the schema */
    };
    char msg[512] = "";
    r.base = event_base_new();
    if (!r.base) {
        fprintf(stderr, "idemgw key: cannot create an event loop\n");
        goto out;
    }
    r.store = kind == CONFIG_STORE_SQLITE ? store_sqlite_new(r.base, &so, msg, sizeof msg)
                                          : store_pg_new(r.base, &so, msg, sizeof msg);
    if (!r.store) {
        fprintf(stderr, "idemgw key: store: %s\n", msg);
        goto out;
    }
    r.deadline_ms = util_now_ms() + r.timeout_ms;
    r.tick = event_new(r.base, -1, EV_PERSIST, key_run_tick, &r);
    if (!r.tick) {
        fprintf(stderr, "idemgw key: cannot create an event\n");
        goto out;
    }
    struct timeval tv = {0, 10 * 1000};
    event_add(r.tick, &tv);
    event_base_dispatch(r.base); /* until a callback or the deadline breaks it */
out:
    if (r.tick)
        event_free(r.tick);
    store_free(r.store); /* out of every store callback: the loop has returned */
    if (r.base)
        event_base_free(r.base);
    log_stream = saved_stream;
    log_threshold = saved_threshold;
    free(path);
    return r.rc;
}

int key_cmd_main(int argc, char **argv)
{
    key_cmd_opts_t o = {0};
    int r = parse_opts(argc, argv, &o);
    if (r != 0) {
        usage(r > 0 ? stdout : stderr);
        return r > 0 ? 0 : KEY_CMD_EXIT_USAGE;
    }

    int rc = KEY_CMD_EXIT_USAGE;
    config_t *cfg = NULL;
    jcs_value_t *args = NULL;
    key_result_t kr = {0};
    const policy_tool_t *pt = NULL;
    char err[256];

    if (o.config) {
        config_errors_t errs = {0};
        cfg = config_load(o.config, &errs);
        if (!cfg) {
            for (size_t i = 0; i < errs.n; i++)
                fprintf(stderr, "%s\n", errs.msgs[i]);
            if (errs.n == 0)
                fprintf(stderr, "idemgw key: %s: cannot load the config\n", o.config);
            config_errors_free(&errs);
            goto out;
        }
        config_errors_free(&errs);
        pt = policy_lookup(&cfg->policy, o.tool);
    }
    jcs_status_t js = jcs_parse(o.args, strlen(o.args), &args, err, sizeof err);
    if (js != JCS_OK) {
        fprintf(stderr, "idemgw key: --args: %s: %s\n", jcs_status_str(js), err);
        goto out;
    }
    key_status_t ks = key_derive(o.subject, o.tool, args, pt, o.header_key, &kr, err, sizeof err);
    if (ks != KEY_OK) {
        fprintf(stderr, "idemgw key: %s\n", err);
        goto out;
    }
    printf("%s\n", kr.key);
    if (o.hash) {
        char h[KEY_HASH_LOG_LEN + 1];
        key_hash_log(kr.key, h);
        printf("%s\n", h);
    }
    fflush(stdout); /* before the store's lines on stderr */
    rc = o.action == KEY_CMD_PRINT ? 0 : run_on_row(cfg, o.action, kr.key);
    if (fflush(stdout) != 0 && rc == 0)
        rc = 1;
out:
    key_result_free(&kr);
    jcs_free(args);
    if (cfg)
        config_free(cfg);
    return rc;
}
