/* The `idemgw key` subcommand (see include/key_cmd.h). */
#include "key_cmd.h"

#include "config.h"
#include "jcs.h"
#include "key.h"
#include "policy.h"

#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY_CMD_EXIT_USAGE 2
#define KEY_CMD_EXIT_REFUSED 1 /* --show: no row; --release: nothing to release */

typedef struct key_cmd_opts {
    const char *subject;
    const char *tool;
    const char *args;
    const char *header_key;
    const char *config;
    bool show;    /* print the key's row from Postgres */
    bool release; /* make a held (unknown) outcome runnable again */
} key_cmd_opts_t;

static void usage(FILE *f)
{
    fputs("usage: idemgw key --subject S --tool T --args JSON [--header-key K] [-c FILE]\n"
          "                  [--show | --release]\n"
          "  prints the idempotency key for a tools/call of T with arguments JSON by S;\n"
          "  -c FILE applies the tool's exclude_args and key_arg from the config\n"
          "  --show     also prints the key's row in Postgres as one JSON line\n"
          "  --release  lets the next identical call run after an unknown outcome (held by\n"
          "             on_ambiguous: hold); only for outcomes that are unknown\n"
          "  Postgres: database_url from -c FILE, else IDEMGW_DATABASE_URL, else PG* variables\n",
          f);
}

/* 0 when parsed, 1 when help was asked for, -1 on a usage error (already reported). */
static int parse_opts(int argc, char **argv, key_cmd_opts_t *o)
{
    enum { OPT_SUBJECT = 256, OPT_TOOL, OPT_ARGS, OPT_HEADER_KEY, OPT_SHOW, OPT_RELEASE };
    static const struct option longopts[] = {
        {"subject", required_argument, NULL, OPT_SUBJECT},
        {"tool", required_argument, NULL, OPT_TOOL},
        {"args", required_argument, NULL, OPT_ARGS},
        {"header-key", required_argument, NULL, OPT_HEADER_KEY},
        {"config", required_argument, NULL, 'c'},
        {"show", no_argument, NULL, OPT_SHOW},
        {"release", no_argument, NULL, OPT_RELEASE},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    optind = 0; /* a fresh scan: the command may run more than once in a process (tests) */
    opterr = 0; /* the messages below name the command */
    int c;
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
        case OPT_SHOW:
            o->show = true;
            break;
        case OPT_RELEASE:
            o->release = true;
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
    if (o->show && o->release) {
        fprintf(stderr, "idemgw key: --show and --release exclude each other\n");
        return -1;
    }
    return 0;
}

/* ---- the key's row in Postgres (blocking libpq: this is a one-shot command) ---- */

#define TS(col) "to_char(" col " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"

static const char show_sql[] =
    "SELECT state, attempts, fence, " TS("created_at") " AS created_at, " TS("finished_at")
    " AS finished_at, " TS("expires_at") " AS expires_at, " TS("lease_until")
    " AS lease_until, first_session_id, first_jsonrpc_id, octet_length(result) AS result_bytes,"
    " result_too_large, (state = 'in_progress' AND lease_until <= now()) AS lease_expired"
    " FROM idem_keys WHERE key = $1";

/* An unknown outcome, or a claim whose lease ran out (a gateway died holding it), becomes
 * 'failed': the next identical call takes it over and runs. The fence moves on, so a finish
 * still on its way from the old claim cannot land. */
static const char release_sql[] =
    "WITH old AS (SELECT key, state FROM idem_keys WHERE key = $1 FOR UPDATE)"
    " UPDATE idem_keys k SET state = 'failed', fence = k.fence + 1, lease_until = now(),"
    "  updated_at = now()"
    " FROM old WHERE k.key = old.key"
    "  AND (k.state = 'unknown' OR (k.state = 'in_progress' AND k.lease_until <= now()))"
    " RETURNING old.state AS was";

static PGconn *db_connect(const config_t *cfg, bool have_config)
{
    const char *conninfo = have_config ? cfg->database_url : getenv("IDEMGW_DATABASE_URL");
    if (!conninfo && !getenv("PGHOST") && !getenv("PGDATABASE") && !getenv("PGSERVICE")) {
        fprintf(stderr, "idemgw key: no database: give database_url in -c FILE, or set "
                        "IDEMGW_DATABASE_URL or PGHOST\n");
        return NULL;
    }
    PGconn *pg = PQconnectdb(conninfo ? conninfo : "");
    if (PQstatus(pg) != CONNECTION_OK) {
        fprintf(stderr, "idemgw key: cannot connect to Postgres: %s", PQerrorMessage(pg));
        PQfinish(pg);
        return NULL;
    }
    return pg;
}

/* Runs sql with the key as $1; NULL after a message when it fails. */
static PGresult *query_key(PGconn *pg, const char *sql, const char *key, const char *what)
{
    const char *params[1] = {key};
    PGresult *r = PQexecParams(pg, sql, 1, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(r) == PGRES_TUPLES_OK)
        return r;
    fprintf(stderr, "idemgw key: %s failed: %s", what, PQresultErrorMessage(r));
    PQclear(r);
    return NULL;
}

/* Prints o as one compact JSON line and frees it. */
static void print_json(json_t *o)
{
    char *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    printf("%s\n", line);
    free(line);
}

/* Column name of the row's first tuple; every name asked for is in the statement. */
static const char *col(const PGresult *r, const char *name)
{
    int c = PQfnumber(r, name);
    return c < 0 || PQgetisnull(r, 0, c) ? NULL : PQgetvalue(r, 0, c);
}

static json_t *text_or_null(const PGresult *r, const char *name)
{
    const char *v = col(r, name);
    return v ? json_string(v) : json_null();
}

static json_t *int_or_null(const PGresult *r, const char *name)
{
    const char *v = col(r, name);
    return v ? json_integer(strtoll(v, NULL, 10)) : json_null();
}

static bool col_true(const PGresult *r, const char *name)
{
    const char *v = col(r, name);
    return v && strcmp(v, "t") == 0;
}

/* The row as one JSON line; KEY_CMD_EXIT_REFUSED when there is none. */
static int show_row(PGconn *pg, const char *key)
{
    PGresult *r = query_key(pg, show_sql, key, "reading the row");
    if (!r)
        return KEY_CMD_EXIT_USAGE;
    if (PQntuples(r) == 0) {
        fprintf(stderr, "idemgw key: no row for this key: never called, or expired and swept\n");
        PQclear(r);
        return KEY_CMD_EXIT_REFUSED;
    }
    json_t *o = json_object();
    json_object_set_new(o, "key", json_string(key));
    json_object_set_new(o, "state", text_or_null(r, "state"));
    json_object_set_new(o, "attempts", int_or_null(r, "attempts"));
    json_object_set_new(o, "fence", int_or_null(r, "fence"));
    json_object_set_new(o, "created_at", text_or_null(r, "created_at"));
    json_object_set_new(o, "finished_at", text_or_null(r, "finished_at"));
    json_object_set_new(o, "expires_at", text_or_null(r, "expires_at"));
    json_object_set_new(o, "lease_until", text_or_null(r, "lease_until"));
    json_object_set_new(o, "lease_expired", json_boolean(col_true(r, "lease_expired")));
    json_object_set_new(o, "first_session_id", text_or_null(r, "first_session_id"));
    json_object_set_new(o, "first_jsonrpc_id", text_or_null(r, "first_jsonrpc_id"));
    json_object_set_new(o, "result_bytes", int_or_null(r, "result_bytes"));
    json_object_set_new(o, "result_too_large", json_boolean(col_true(r, "result_too_large")));
    PQclear(r);
    print_json(o);
    return 0;
}

/* Releases a held outcome, or says why there is nothing to release. */
static int release_row(PGconn *pg, const char *key)
{
    PGresult *r = query_key(pg, release_sql, key, "release");
    if (!r)
        return KEY_CMD_EXIT_USAGE;
    if (PQntuples(r) == 1) {
        json_t *o =
            json_pack("{s:s, s:b, s:s}", "key", key, "released", 1, "was", col(r, "was"));
        PQclear(r);
        print_json(o);
        return 0;
    }
    PQclear(r);
    /* say why: read what is there */
    r = query_key(pg, show_sql, key, "reading the row");
    if (!r)
        return KEY_CMD_EXIT_USAGE;
    const char *state = PQntuples(r) == 1 ? col(r, "state") : NULL;
    if (!state)
        fprintf(stderr, "idemgw key: nothing to release: no row for this key\n");
    else if (strcmp(state, "succeeded") == 0)
        fprintf(stderr,
                "idemgw key: not released: the call succeeded and its result is replayed until "
                "%s; release is only for unknown outcomes\n",
                col(r, "expires_at"));
    else if (strcmp(state, "failed") == 0)
        fprintf(stderr, "idemgw key: nothing to release: the next identical call runs already\n");
    else
        fprintf(stderr,
                "idemgw key: not released: a call holds the key (lease until %s); wait for it "
                "to finish or for the lease to run out\n",
                col(r, "lease_until"));
    PQclear(r);
    return KEY_CMD_EXIT_REFUSED;
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
    rc = 0;
    if (o.show || o.release) {
        PGconn *pg = db_connect(cfg, o.config != NULL);
        if (!pg) {
            rc = KEY_CMD_EXIT_USAGE;
            goto out;
        }
        rc = o.show ? show_row(pg, kr.key) : release_row(pg, kr.key);
        PQfinish(pg);
    }
    if (fflush(stdout) != 0 && rc == 0)
        rc = 1;
out:
    key_result_free(&kr);
    jcs_free(args);
    if (cfg)
        config_free(cfg);
    return rc;
}
