/* The `idemgw key` subcommand (see include/key_cmd.h). */
#include "key_cmd.h"

#include "config.h"
#include "jcs.h"
#include "key.h"
#include "log.h"
#include "policy.h"
#include "server_arg.h"
#include "store.h"
#include "store_cli.h"
#include "util.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KEY_CMD_EXIT_USAGE 2
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
    const char *server; /* --server: the server of the config's servers: the call was made on */
    const char *args;
    const char *header_key;
    const char *config;
    const char *database_url; /* --database-url: the store, over the config's */
    bool hash;                /* also print the key_hash of log lines */
    bool text;                /* --text: the row for people */
    key_cmd_action_t action;  /* at most one of --show, --release, --forget */
} key_cmd_opts_t;

static void usage(FILE *f)
{
    fputs("usage: idemgw key --subject S --tool T --args JSON [--header-key K] [-c FILE]\n"
          "                  [--server NAME] [--database-url URL] [--hash]\n"
          "                  [--show | --release | --forget] [--text]\n"
          "  prints the idempotency key for a tools/call of T with arguments JSON by S;\n"
          "  -c FILE applies the tool's exclude_args and key_arg from the config\n"
          "  --server   the server of the config's servers: the call was made on (required\n"
          "             when it has servers:, refused when it has none): its policy applies\n"
          "             and the key names it (SUBJECT:SERVER/TOOL:...), as the gateway's does\n"
          "  --hash     also prints the key's key_hash, as the gateway's log lines show it\n"
          "  --show     also prints the key's row in the store as one JSON line (with key_hash),\n"
          "             its duplicates by answer and by source, and the last 16 of them\n"
          "  --text     --show or --forget for people: the row, then one line per duplicate\n"
          "  --release  lets the next identical call run after an unknown outcome (held by\n"
          "             on_ambiguous: hold); only for outcomes that are unknown\n"
          "  --forget   deletes the key's row, whatever its state, and prints it as --show\n"
          "             does (with \"forgotten\": true): the next identical call runs as new\n"
          "  the store: --database-url (sqlite:PATH, a Postgres URL), else database_url from\n"
          "  -c FILE, else IDEMGW_DATABASE_URL, else PG* variables, else the embedded store's\n"
          "  default file ($STATE_DIRECTORY, else $XDG_STATE_HOME/idemgw, else\n"
          "  ~/.local/state/idemgw: idemgw-keys.db), as the gateway chooses it;\n"
          "  an embedded store is used beside a running gateway through SQLite's own locking\n",
          f);
}

/* 0 when parsed, 1 when help was asked for, -1 on a usage error (already reported). */
static int parse_opts(int argc, char **argv, key_cmd_opts_t *o)
{
    enum {
        OPT_SUBJECT = 256,
        OPT_TOOL,
        OPT_SERVER,
        OPT_ARGS,
        OPT_HEADER_KEY,
        OPT_HASH,
        OPT_SHOW,
        OPT_RELEASE,
        OPT_FORGET,
        OPT_TEXT,
        OPT_DATABASE_URL
    };
    static const struct option longopts[] = {
        {"subject", required_argument, NULL, OPT_SUBJECT},
        {"tool", required_argument, NULL, OPT_TOOL},
        {"server", required_argument, NULL, OPT_SERVER},
        {"args", required_argument, NULL, OPT_ARGS},
        {"header-key", required_argument, NULL, OPT_HEADER_KEY},
        {"config", required_argument, NULL, 'c'},
        {"database-url", required_argument, NULL, OPT_DATABASE_URL},
        {"hash", no_argument, NULL, OPT_HASH},
        {"show", no_argument, NULL, OPT_SHOW},
        {"release", no_argument, NULL, OPT_RELEASE},
        {"forget", no_argument, NULL, OPT_FORGET},
        {"text", no_argument, NULL, OPT_TEXT},
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
        case OPT_SERVER:
            o->server = optarg;
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
        case OPT_DATABASE_URL:
            o->database_url = optarg;
            break;
        case OPT_HASH:
            o->hash = true;
            break;
        case OPT_TEXT:
            o->text = true;
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
    if (o->server && (!*o->server || strchr(o->server, '/'))) {
        /* the key's SERVER/TOOL must split at the first '/' as the gateway's does */
        fprintf(stderr, "idemgw key: --server '%s' is not a server name\n", o->server);
        return -1;
    }
    if (actions > 1) {
        fprintf(stderr, "idemgw key: --show, --release and --forget exclude each other\n");
        return -1;
    }
    if (o->text && o->action != KEY_CMD_SHOW && o->action != KEY_CMD_FORGET) {
        fprintf(stderr, "idemgw key: --text goes with --show or --forget\n");
        return -1;
    }
    return 0;
}

/* ---- the key's row, through the store on a loop of its own ---- */

/* One store call, from waiting for the store to the printed answer. */
typedef struct key_run {
    store_cli_run_t run; /* first: the store's callbacks get it back */
    const char *key;
    char key_hash[KEY_HASH_LOG_LEN + 1];
    key_cmd_action_t action;
    bool text; /* --text: the row for people, not one JSON line */
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

static int dup_total(const store_row_t *row)
{
    int n = 0;
    for (int i = 0; i < STORE_DUP_ANSWERS_; i++)
        n += row->dup_answers[i];
    return n;
}

/* The row's history (a JSON array), or an empty array when it has none or it does not parse. */
static json_t *history_of(const store_row_t *row)
{
    json_t *h = row->dup_history ? json_loads(row->dup_history, 0, NULL) : NULL;
    if (!json_is_array(h)) {
        json_decref(h);
        h = json_array();
    }
    return h;
}

/* The row as --show has always printed it, key_hash added, then its duplicates. */
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
    json_object_set_new(o, "duplicates", json_integer(dup_total(row)));
    json_t *by_answer = json_object(), *by_source = json_object();
    for (int i = 0; i < STORE_DUP_ANSWERS_; i++)
        json_object_set_new(by_answer, store_dup_answer_str((store_dup_answer_t)i),
                            json_integer(row->dup_answers[i]));
    for (int i = 0; i < DUP_SOURCE_N; i++)
        json_object_set_new(by_source, dup_source_name((dup_source_t)i),
                            json_integer(row->dup_sources[i]));
    json_object_set_new(o, "duplicates_by_answer", by_answer);
    json_object_set_new(o, "duplicates_by_source", by_source);
    json_object_set_new(o, "history", history_of(row));
    return o;
}

static const char *field(json_t *o, const char *name)
{
    const char *v = json_string_value(json_object_get(o, name));
    return v ? v : "-";
}

/* --text: the row, its counts, then one line per duplicate kept, oldest first. */
static void print_row_text(const key_run_t *r, const store_row_t *row, const char *note)
{
    printf("key_hash    %s%s\n", r->key_hash, note ? note : "");
    printf("state       %s%s\n", store_state_str(row->state),
           row->lease_expired ? " (lease expired)" : "");
    printf("attempts    %d (calls that ran or were replayed)\n", row->attempts);
    printf("first seen  %s, session %s, JSON-RPC id %s\n", row->created_at ? row->created_at : "-",
           row->first_session_id ? row->first_session_id : "-",
           row->first_jsonrpc_id ? row->first_jsonrpc_id : "-");
    printf("finished    %s\n", row->finished_at ? row->finished_at : "-");
    printf("expires     %s\n", row->expires_at ? row->expires_at : "-");
    int total = dup_total(row);
    printf("duplicates  %d", total);
    if (total) {
        const char *sep = " (";
        for (int i = 0; i < STORE_DUP_ANSWERS_; i++) {
            if (!row->dup_answers[i])
                continue;
            printf("%s%s %d", sep, store_dup_answer_str((store_dup_answer_t)i),
                   row->dup_answers[i]);
            sep = ", ";
        }
        sep = "; by source: ";
        for (int i = 0; i < DUP_SOURCE_N; i++) {
            if (!row->dup_sources[i])
                continue;
            printf("%s%s %d", sep, dup_source_name((dup_source_t)i), row->dup_sources[i]);
            sep = ", ";
        }
        printf(")");
    }
    printf("\n");
    json_t *h = history_of(row);
    size_t n = json_array_size(h);
    if (n) {
        printf("\nthe last %zu of %d duplicates, oldest first:\n", n, total);
        printf("%-24s  %-9s  %-11s  %10s  %-20s  %s\n", "AT", "SOURCE", "ANSWERED", "GAP_MS",
               "JSONRPC_ID", "SESSION");
        size_t i;
        json_t *e;
        json_array_foreach(h, i, e)
        {
            json_int_t gap = json_integer_value(json_object_get(e, "gap_ms"));
            printf("%-24s  %-9s  %-11s  %10lld  %-20s  %s\n", field(e, "at"), field(e, "source"),
                   field(e, "answered"), (long long)gap, field(e, "jsonrpc_id"),
                   field(e, "session_id"));
        }
    }
    json_decref(h);
}

static void print_row(const key_run_t *r, const store_row_t *row, bool forgotten)
{
    if (r->text) {
        print_row_text(r, row, forgotten ? " (forgotten: the row is deleted)" : NULL);
        return;
    }
    json_t *o = row_json(r, row);
    if (forgotten)
        json_object_set_new(o, "forgotten", json_true());
    print_json(o);
}

static void on_show(store_status_t st, const store_row_t *row, void *arg)
{
    key_run_t *r = arg;
    store_cli_done(&r->run);
    if (store_cli_failed(&r->run, st, "reading the row"))
        return;
    if (!row) {
        fprintf(stderr, "idemgw key: no row for this key: never called, or expired and swept\n");
        r->run.rc = KEY_CMD_EXIT_REFUSED;
        return;
    }
    print_row(r, row, false);
    r->run.rc = 0;
}

static void on_forget(store_status_t st, const store_row_t *row, void *arg)
{
    key_run_t *r = arg;
    store_cli_done(&r->run);
    if (store_cli_failed(&r->run, st, "forget"))
        return;
    if (!row) {
        fprintf(stderr, "idemgw key: nothing to forget: no row for this key\n");
        r->run.rc = KEY_CMD_EXIT_REFUSED;
        return;
    }
    print_row(r, row, true);
    if (row->state == STORE_STATE_IN_PROGRESS && !row->lease_expired)
        fprintf(stderr,
                "idemgw key: warning: a call was running with this key (lease until %s); it "
                "goes on, and an identical call may now run beside it\n",
                row->lease_until);
    r->run.rc = 0;
}

/* Released, or why not from the row as it was. */
static void on_release(store_status_t st, bool released, const store_row_t *row, void *arg)
{
    key_run_t *r = arg;
    store_cli_done(&r->run);
    if (store_cli_failed(&r->run, st, "release"))
        return;
    r->run.rc = KEY_CMD_EXIT_REFUSED;
    if (!row) {
        fprintf(stderr, "idemgw key: nothing to release: no row for this key\n");
    } else if (released) {
        print_json(json_pack("{s:s, s:s, s:b, s:s}", "key", r->key, "key_hash", r->key_hash,
                             "released", 1, "was", store_state_str(row->state)));
        r->run.rc = 0;
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

/* The one call, once the store is ready. */
static store_status_t key_call(store_t *store, store_cli_run_t *run)
{
    key_run_t *r = (key_run_t *)run;
    switch (r->action) {
    case KEY_CMD_SHOW:
        return store_get(store, r->key, on_show, r);
    case KEY_CMD_RELEASE:
        return store_release(store, r->key, on_release, r);
    case KEY_CMD_FORGET:
        return store_forget(store, r->key, on_forget, r);
    case KEY_CMD_PRINT:
        break;
    }
    return STORE_ERR_STATEMENT;
}

/* Runs the action on the key's row; the exit code. */
static int run_on_row(const config_t *cfg, const key_cmd_opts_t *o, const char *key)
{
    key_run_t r = {
        .run = {.cmd = "idemgw key", .call = key_call, .database_url = o->database_url},
        .key = key,
        .action = o->action,
        .text = o->text,
    };
    key_hash_log(key, r.key_hash);
    return store_cli_exec(cfg, &r.run);
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
    const char *server = o.server; /* without -c, as given */
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
        config_t *view;
        if (server_arg_pick("idemgw key", cfg, o.server, false, &view) != 0)
            goto out;
        pt = policy_lookup(&view->policy, o.tool);
        server = view->server_name;
    }
    jcs_status_t js = jcs_parse(o.args, strlen(o.args), &args, err, sizeof err);
    if (js != JCS_OK) {
        fprintf(stderr, "idemgw key: --args: %s: %s\n", jcs_status_str(js), err);
        goto out;
    }
    key_call_t call = {.subject = o.subject,
                       .server = server,
                       .tool = o.tool,
                       .arguments = args,
                       .header_key = o.header_key,
                       .pt = pt};
    key_status_t ks = key_for_call(&call, &kr, err, sizeof err);
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
    rc = o.action == KEY_CMD_PRINT ? 0 : run_on_row(cfg, &o, kr.key);
    if (fflush(stdout) != 0 && rc == 0)
        rc = 1;
out:
    key_result_free(&kr);
    jcs_free(args);
    if (cfg)
        config_free(cfg);
    return rc;
}
