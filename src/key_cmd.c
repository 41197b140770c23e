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

/* Matches "--name VALUE" and "--name=VALUE" (and the short form, if any, as "-c VALUE").
 * Returns 1 when argv[*i] is this option (advancing *i past its value), 0 when it is not,
 * -1 when the value is missing. */
static int take_opt(int argc, char **argv, int *i, const char *lng, const char *shrt,
                    const char **val)
{
    const char *a = argv[*i];
    size_t n = strlen(lng);
    if (strncmp(a, lng, n) == 0 && a[n] == '=') {
        *val = a + n + 1;
        return 1;
    }
    if (strcmp(a, lng) != 0 && !(shrt && strcmp(a, shrt) == 0))
        return 0;
    if (*i + 1 >= argc)
        return -1;
    *val = argv[++*i];
    return 1;
}

/* 0 when parsed, 1 when help was asked for, -1 on a usage error (already reported). */
static int parse_opts(int argc, char **argv, key_cmd_opts_t *o)
{
    static const struct {
        const char *lng;
        const char *shrt;
        size_t off;
    } table[] = {
        {"--subject", NULL, offsetof(key_cmd_opts_t, subject)},
        {"--tool", NULL, offsetof(key_cmd_opts_t, tool)},
        {"--args", NULL, offsetof(key_cmd_opts_t, args)},
        {"--header-key", NULL, offsetof(key_cmd_opts_t, header_key)},
        {"--config", "-c", offsetof(key_cmd_opts_t, config)},
    };
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
            return 1;
        if (strcmp(argv[i], "--show") == 0 || strcmp(argv[i], "--release") == 0) {
            *(argv[i][2] == 's' ? &o->show : &o->release) = true;
            continue;
        }
        int r = 0;
        for (size_t t = 0; t < sizeof table / sizeof table[0] && r == 0; t++) {
            const char **slot = (const char **)((char *)o + table[t].off);
            r = take_opt(argc, argv, &i, table[t].lng, table[t].shrt, slot);
            if (r < 0) {
                fprintf(stderr, "idemgw key: %s needs a value\n", table[t].lng);
                return -1;
            }
        }
        if (r == 0) {
            fprintf(stderr, "idemgw key: unexpected argument '%s'\n", argv[i]);
            return -1;
        }
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
    "SELECT state, attempts, fence, " TS("created_at") ", " TS("finished_at") ", " TS(
        "expires_at") ", " TS("lease_until") ", first_session_id, first_jsonrpc_id,"
                                             " octet_length(result), result_too_large,"
                                             " (state = 'in_progress' AND lease_until <= now())"
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
    " RETURNING old.state";

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

static json_t *text_or_null(const PGresult *r, int col)
{
    return PQgetisnull(r, 0, col) ? json_null() : json_string(PQgetvalue(r, 0, col));
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
    bool lease_over = strcmp(PQgetvalue(r, 0, 11), "t") == 0;
    json_t *o = json_object();
    json_object_set_new(o, "key", json_string(key));
    json_object_set_new(o, "state", json_string(PQgetvalue(r, 0, 0)));
    json_object_set_new(o, "attempts", json_integer(strtoll(PQgetvalue(r, 0, 1), NULL, 10)));
    json_object_set_new(o, "fence", json_integer(strtoll(PQgetvalue(r, 0, 2), NULL, 10)));
    json_object_set_new(o, "created_at", text_or_null(r, 3));
    json_object_set_new(o, "finished_at", text_or_null(r, 4));
    json_object_set_new(o, "expires_at", text_or_null(r, 5));
    json_object_set_new(o, "lease_until", text_or_null(r, 6));
    json_object_set_new(o, "lease_expired", json_boolean(lease_over));
    json_object_set_new(o, "first_session_id", text_or_null(r, 7));
    json_object_set_new(o, "first_jsonrpc_id", text_or_null(r, 8));
    json_object_set_new(
        o, "result_bytes",
        PQgetisnull(r, 0, 9) ? json_null() : json_integer(strtoll(PQgetvalue(r, 0, 9), NULL, 10)));
    json_object_set_new(o, "result_too_large",
                        json_boolean(strcmp(PQgetvalue(r, 0, 10), "t") == 0));
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
            json_pack("{s:s, s:b, s:s}", "key", key, "released", 1, "was", PQgetvalue(r, 0, 0));
        PQclear(r);
        print_json(o);
        return 0;
    }
    PQclear(r);
    /* say why: read what is there */
    r = query_key(pg, show_sql, key, "reading the row");
    if (!r)
        return KEY_CMD_EXIT_USAGE;
    const char *state = PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : NULL;
    if (!state)
        fprintf(stderr, "idemgw key: nothing to release: no row for this key\n");
    else if (strcmp(state, "succeeded") == 0)
        fprintf(stderr,
                "idemgw key: not released: the call succeeded and its result is replayed until "
                "%s; release is only for unknown outcomes\n",
                PQgetvalue(r, 0, 5));
    else if (strcmp(state, "failed") == 0)
        fprintf(stderr, "idemgw key: nothing to release: the next identical call runs already\n");
    else
        fprintf(stderr,
                "idemgw key: not released: a call holds the key (lease until %s); wait for it "
                "to finish or for the lease to run out\n",
                PQgetvalue(r, 0, 6));
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
