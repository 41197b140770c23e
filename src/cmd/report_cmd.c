/* The `idemgw report` subcommand (see include/report_cmd.h). */
#include "report_cmd.h"

#include "config.h"
#include "key.h"
#include "policy.h"
#include "server_arg.h"
#include "store.h"
#include "store_cli.h"
#include "util.h"

#include <getopt.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REPORT_EXIT_USAGE 2
#define REPORT_SINCE_DEFAULT "24h"
#define REPORT_TOP_DEFAULT 10
#define REPORT_TOP_MAX 1000

typedef struct report_opts {
    const char *config;
    const char *database_url; /* --database-url: the store, over the config's */
    const char *since_text;   /* as given, for the heading */
    uint64_t since_ms;        /* 0: every row */
    int top;
    bool json;
    const char *server; /* --server: only that server's rows */
} report_opts_t;

int report_cmd_parse_since(const char *s, uint64_t *ms, char *err, size_t errlen)
{
    if (s && strcmp(s, "all") == 0) {
        *ms = 0;
        return 0;
    }
    uint64_t v;
    if (!s || policy_parse_duration(s, &v) != 0) {
        snprintf(err, errlen,
                 "--since '%s' is not a duration: a whole number and a unit, such as 90s, 30m, "
                 "24h or 7d (or 'all')",
                 s ? s : "");
        return -1;
    }
    if (v == 0) {
        snprintf(err, errlen, "--since must be more than zero (or 'all')");
        return -1;
    }
    *ms = v;
    return 0;
}

static void usage(FILE *f)
{
    fputs("usage: idemgw report [-c FILE] [--database-url URL] [--since DURATION | --since all]\n"
          "                     [--top N] [--server NAME] [--json]\n"
          "  per tool, from the store: keys, calls, runs, duplicates by answer and by source\n"
          "  (the rows updated in the last DURATION, default " REPORT_SINCE_DEFAULT
          "); then the N keys\n"
          "  (default 10) with the most calls, as key hashes (idemgw key --hash)\n"
          "  with a config that has servers:, each tool's server in a column of its own\n"
          "  (\"server\" in JSON, and each server's sums in \"servers\")\n"
          "  --server NAME  only that server's rows (their tool column starts with NAME/);\n"
          "           one of the config's servers, or, without -c, any name\n"
          "  --json   one JSON object instead of the tables\n"
          "  the store: as idemgw key (--database-url, database_url from -c FILE,\n"
          "  IDEMGW_DATABASE_URL, PG*, the embedded store's default file); it keeps a key only\n"
          "  for its window, then sweeps it\n",
          f);
}

/* 0 when parsed, 1 when help was asked for, -1 on a usage error (already reported). */
static int parse_opts(int argc, char **argv, report_opts_t *o)
{
    enum { OPT_SINCE = 256, OPT_TOP, OPT_JSON, OPT_DATABASE_URL, OPT_SERVER };
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},
        {"since", required_argument, NULL, OPT_SINCE},
        {"top", required_argument, NULL, OPT_TOP},
        {"json", no_argument, NULL, OPT_JSON},
        {"server", required_argument, NULL, OPT_SERVER},
        {"database-url", required_argument, NULL, OPT_DATABASE_URL},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    o->since_text = REPORT_SINCE_DEFAULT;
    o->top = REPORT_TOP_DEFAULT;
    optind = 0; /* a fresh scan: the command may run more than once in a process (tests) */
    opterr = 0;
    int c;
    char err[200];
    while ((c = getopt_long(argc, argv, ":c:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'c':
            o->config = optarg;
            break;
        case OPT_DATABASE_URL:
            o->database_url = optarg;
            break;
        case OPT_SINCE:
            o->since_text = optarg;
            break;
        case OPT_TOP: {
            char *end;
            long n = strtol(optarg, &end, 10);
            if (!*optarg || *end || n < 0 || n > REPORT_TOP_MAX) {
                fprintf(stderr, "idemgw report: --top '%s' is not a number from 0 to %d\n", optarg,
                        REPORT_TOP_MAX);
                return -1;
            }
            o->top = (int)n;
            break;
        }
        case OPT_JSON:
            o->json = true;
            break;
        case OPT_SERVER:
            if (!*optarg || strchr(optarg, '/')) {
                fprintf(stderr, "idemgw report: --server '%s' is not a server name\n", optarg);
                return -1;
            }
            o->server = optarg;
            break;
        case 'h':
            return 1;
        case ':':
            fprintf(stderr, "idemgw report: %s needs a value\n", argv[optind - 1]);
            return -1;
        default:
            fprintf(stderr, "idemgw report: unexpected argument '%s'\n", argv[optind - 1]);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "idemgw report: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (report_cmd_parse_since(o->since_text, &o->since_ms, err, sizeof(err)) != 0) {
        fprintf(stderr, "idemgw report: %s\n", err);
        return -1;
    }
    return 0;
}

/* ---- printing ---- */

typedef struct report_run {
    store_cli_run_t run; /* first: the store's callback gets it back */
    const report_opts_t *o;
    const char *backend;
    const config_t *cfg; /* the config given, or NULL */
    /* a server column: the config has servers:, or --server named one */
    bool grouped;
    char *prefix; /* --server NAME: "NAME/", the rows' tool prefix; else NULL */
} report_run_t;

/* A tool's line: its counts, and the server its rows are on. */
typedef struct report_line {
    const char *server;    /* NULL: none (one upstream, or a name the config does not have) */
    store_report_tool_t t; /* t.tool: the tool without its server */
} report_line_t;

/* One of the keys with the most calls, its tool split the same way. */
typedef struct report_top {
    const char *server;
    store_report_key_t k;
} report_top_t;

/* The server of a stored tool and the tool without it. Split only where the answer is
 * certain: at --server's prefix (the store chose those rows by it), or at the first '/' when
 * what comes before it names one of the config's servers (server names hold no '/'; a tool's
 * own name may, so a row of the one-upstream form, or of a server since removed, keeps its
 * stored name and no server). */
static const char *split_tool(const report_run_t *r, const char *stored, const char **tool)
{
    *tool = stored;
    if (!r->grouped)
        return NULL;
    if (r->prefix) {
        *tool = stored + strlen(r->prefix);
        return r->o->server;
    }
    const char *slash = strchr(stored, '/');
    if (!slash || !r->cfg)
        return NULL;
    for (size_t i = 0; i < r->cfg->n_servers; i++) {
        const char *name = r->cfg->servers[i]->server_name;
        if (strlen(name) == (size_t)(slash - stored) && strncmp(stored, name, strlen(name)) == 0) {
            *tool = slash + 1;
            return name;
        }
    }
    return NULL;
}

/* NULL (no server) after every name. */
static int server_cmp(const char *a, const char *b)
{
    if (!a || !b)
        return !a - !b;
    return strcmp(a, b);
}

static int by_server_tool(const void *a, const void *b)
{
    const report_line_t *x = a, *y = b;
    int c = server_cmp(x->server, y->server);
    return c ? c : strcmp(x->t.tool, y->t.tool);
}

static int by_calls(const void *a, const void *b)
{
    const report_top_t *x = a, *y = b;
    if (x->k.calls != y->k.calls)
        return x->k.calls > y->k.calls ? -1 : 1;
    return strcmp(x->k.key, y->k.key);
}

/* Adds t's counts to sum. */
static void add_counts(store_report_tool_t *sum, const store_report_tool_t *t)
{
    sum->keys += t->keys;
    sum->calls += t->calls;
    sum->runs += t->runs;
    for (int a = 0; a < STORE_DUP_ANSWERS_; a++)
        sum->dup_answers[a] += t->dup_answers[a];
    for (int s = 0; s < DUP_SOURCE_N; s++)
        sum->dup_sources[s] += t->dup_sources[s];
    for (int s = 0; s < STORE_STATES; s++)
        sum->states[s] += t->states[s];
}

/* A tool's (or with name "server", a server's) counts; grouped: "server" first, null for a
 * tool of no server. */
static json_t *counts_json(const char *name, const char *value, bool grouped, const char *server,
                           const store_report_tool_t *t)
{
    json_t *o = json_object(), *src = json_object(), *states = json_object();
    int64_t dups = 0;
    if (grouped && strcmp(name, "server") != 0)
        json_object_set_new(o, "server", server ? json_string(server) : json_null());
    json_object_set_new(o, name, json_string(value));
    json_object_set_new(o, "keys", json_integer(t->keys));
    json_object_set_new(o, "calls", json_integer(t->calls));
    json_object_set_new(o, "runs", json_integer(t->runs));
    for (int i = 0; i < STORE_DUP_ANSWERS_; i++) {
        json_object_set_new(o, store_dup_answer_str((store_dup_answer_t)i),
                            json_integer(t->dup_answers[i]));
        dups += t->dup_answers[i];
    }
    json_object_set_new(o, "duplicates", json_integer(dups));
    for (int i = 0; i < DUP_SOURCE_N; i++)
        json_object_set_new(src, dup_source_name((dup_source_t)i), json_integer(t->dup_sources[i]));
    json_object_set_new(o, "duplicates_by_source", src);
    for (int i = 0; i < STORE_STATES; i++)
        json_object_set_new(states, store_state_str((store_state_t)i), json_integer(t->states[i]));
    json_object_set_new(o, "states", states);
    return o;
}

/* grouped: each server's counts over its tools, in the lines' order (by server). */
static json_t *servers_json(const report_line_t *lines, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n;) {
        store_report_tool_t sum = {0};
        size_t j = i;
        for (; j < n && server_cmp(lines[j].server, lines[i].server) == 0; j++)
            add_counts(&sum, &lines[j].t);
        if (lines[i].server)
            json_array_append_new(a, counts_json("server", lines[i].server, true, NULL, &sum));
        i = j;
    }
    return a;
}

static void print_json(const report_run_t *r, const store_report_t *rep, const report_line_t *lines,
                       const report_top_t *top)
{
    json_t *o = json_object(), *ts = json_array(), *ks = json_array();
    json_object_set_new(o, "now", json_string(rep->now ? rep->now : ""));
    json_object_set_new(o, "since", json_string(r->o->since_text));
    json_object_set_new(o, "since_ms", json_integer((json_int_t)r->o->since_ms));
    json_object_set_new(o, "store", json_string(r->backend));
    if (r->o->server)
        json_object_set_new(o, "server", json_string(r->o->server));
    for (size_t i = 0; i < rep->n_tools; i++)
        json_array_append_new(
            ts, counts_json("tool", lines[i].t.tool, r->grouped, lines[i].server, &lines[i].t));
    json_object_set_new(o, "tools", ts);
    if (r->grouped)
        json_object_set_new(o, "servers", servers_json(lines, rep->n_tools));
    for (size_t i = 0; i < rep->n_top; i++) {
        const store_report_key_t *k = &top[i].k;
        char h[KEY_HASH_LOG_LEN + 1];
        key_hash_log(k->key, h);
        json_t *e = json_pack("{s:s}", "key_hash", h);
        if (r->grouped)
            json_object_set_new(e, "server",
                                top[i].server ? json_string(top[i].server) : json_null());
        json_t *rest =
            json_pack("{s:s, s:i, s:i, s:i, s:s, s:s}", "tool", k->tool, "calls", k->calls,
                      "attempts", k->attempts, "duplicates", k->duplicates, "state",
                      store_state_str(k->state), "first_seen", k->created_at ? k->created_at : "");
        json_object_update(e, rest);
        json_decref(rest);
        json_array_append_new(ks, e);
    }
    json_object_set_new(o, "top_keys", ks);
    char *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    printf("%s\n", line);
    free(line);
}

/* The width of the widest name, at least min. */
static int name_width(const char *const *names, size_t n, int min)
{
    int w = min;
    for (size_t i = 0; i < n; i++) {
        int len = names[i] ? (int)strlen(names[i]) : 1;
        if (len > w)
            w = len;
    }
    return w > 40 ? 40 : w;
}

/* The SERVER column's cell (grouped only; sw its width), then the counts of one line: the tool
 * in w columns, cut at prec characters. */
static void print_counts(int sw, const char *server, int w, int prec, const char *tool,
                         const store_report_tool_t *t)
{
    if (sw)
        printf("%-*.*s ", sw, sw, server ? server : "-");
    printf("%-*.*s %6lld %7lld %6lld %8lld %11lld %8lld", w, prec, tool, (long long)t->keys,
           (long long)t->calls, (long long)t->runs, (long long)t->dup_answers[STORE_DUP_REPLAY],
           (long long)t->dup_answers[STORE_DUP_IN_PROGRESS],
           (long long)t->dup_answers[STORE_DUP_UNKNOWN]);
    for (int s = 0; s < DUP_SOURCE_N; s++)
        printf(" %9lld", (long long)t->dup_sources[s]);
    printf("\n");
}

static void print_tables(const report_run_t *r, const store_report_t *rep,
                         const report_line_t *lines, const report_top_t *top)
{
    char on[100] = "";
    if (r->o->server)
        snprintf(on, sizeof(on), "server %s: ", r->o->server);
    if (r->o->since_ms)
        printf("idemgw report: %srows updated in the last %s, %s store, at %s\n", on,
               r->o->since_text, r->backend, rep->now ? rep->now : "-");
    else
        printf("idemgw report: %severy row, %s store, at %s\n", on, r->backend,
               rep->now ? rep->now : "-");
    printf("(the store keeps a key for its window, then sweeps it: older calls are not here)\n\n");
    if (!rep->n_tools) {
        printf("no protected calls%s%s\n", r->o->server ? " on server " : "",
               r->o->server ? r->o->server : "");
        return;
    }
    size_t n = rep->n_tools > rep->n_top ? rep->n_tools : rep->n_top;
    const char **names = xcalloc(n + 1, sizeof(*names)), **servers = xcalloc(n + 1, sizeof(*names));
    for (size_t i = 0; i < rep->n_tools; i++) {
        names[i] = lines[i].t.tool;
        servers[i] = lines[i].server;
    }
    int w = name_width(names, rep->n_tools, 4);
    int sw = r->grouped ? name_width(servers, rep->n_tools, 6) : 0;
    if (sw)
        printf("%-*s ", sw, "SERVER");
    printf("%-*s %6s %7s %6s %8s %11s %8s", w, "TOOL", "KEYS", "CALLS", "RUNS", "REPLAYS",
           "IN_PROGRESS", "UNKNOWN");
    for (int s = 0; s < DUP_SOURCE_N; s++) {
        char up[16];
        const char *nm = dup_source_name((dup_source_t)s);
        size_t k = 0;
        for (; nm[k] && k < sizeof(up) - 1; k++)
            up[k] = (char)(nm[k] - 'a' + 'A');
        up[k] = '\0';
        printf(" %9s", up);
    }
    printf("\n");
    store_report_tool_t sum = {0};
    bool several = rep->n_tools > 1 && server_cmp(lines[0].server, lines[rep->n_tools - 1].server);
    for (size_t i = 0; i < rep->n_tools;) {
        /* one server's lines; with several servers shown, their sum when there is more than one */
        store_report_tool_t server_sum = {0};
        size_t j = i;
        for (; j < rep->n_tools && server_cmp(lines[j].server, lines[i].server) == 0; j++) {
            print_counts(sw, lines[j].server, w, w, lines[j].t.tool, &lines[j].t);
            add_counts(&server_sum, &lines[j].t);
        }
        if (several && lines[i].server && j - i > 1)
            print_counts(sw, lines[i].server, w, w, "(all)", &server_sum);
        add_counts(&sum, &server_sum);
        i = j;
    }
    if (rep->n_tools > 1) {
        if (sw)
            printf("%-*s ", sw, "total");
        print_counts(0, NULL, w, 40, sw ? "" : "total", &sum);
    }
    if (rep->n_top) {
        for (size_t i = 0; i < rep->n_top; i++) {
            names[i] = top[i].k.tool;
            servers[i] = top[i].server;
        }
        w = name_width(names, rep->n_top, 4);
        sw = r->grouped ? name_width(servers, rep->n_top, 6) : 0;
        printf("\nthe %zu key%s with the most calls:\n", rep->n_top, rep->n_top == 1 ? "" : "s");
        printf("%-16s  ", "KEY_HASH");
        if (sw)
            printf("%-*s ", sw, "SERVER");
        printf("%-*s %7s %9s %11s  %-11s  %s\n", w, "TOOL", "CALLS", "ATTEMPTS", "DUPLICATES",
               "STATE", "FIRST_SEEN");
        for (size_t i = 0; i < rep->n_top; i++) {
            const store_report_key_t *k = &top[i].k;
            char h[KEY_HASH_LOG_LEN + 1];
            key_hash_log(k->key, h);
            printf("%-16s  ", h);
            if (sw)
                printf("%-*.*s ", sw, sw, top[i].server ? top[i].server : "-");
            printf("%-*.*s %7d %9d %11d  %-11s  %s\n", w, w, k->tool, k->calls, k->attempts,
                   k->duplicates, store_state_str(k->state), k->created_at ? k->created_at : "-");
        }
    }
    free(names);
    free(servers);
}

static void on_report(store_status_t st, const store_report_t *rep, void *arg)
{
    report_run_t *r = arg;
    store_cli_done(&r->run);
    if (store_cli_failed(&r->run, st, "the report"))
        return;
    /* split by server and sorted here, whatever order the backend returned */
    report_line_t *lines = xcalloc(rep->n_tools + 1, sizeof(*lines));
    report_top_t *top = xcalloc(rep->n_top + 1, sizeof(*top));
    for (size_t i = 0; i < rep->n_tools; i++) {
        lines[i].t = rep->tools[i];
        lines[i].server = split_tool(r, rep->tools[i].tool, &lines[i].t.tool);
    }
    for (size_t i = 0; i < rep->n_top; i++) {
        top[i].k = rep->top[i];
        top[i].server = split_tool(r, rep->top[i].tool, &top[i].k.tool);
    }
    qsort(lines, rep->n_tools, sizeof(*lines), by_server_tool);
    qsort(top, rep->n_top, sizeof(*top), by_calls);
    if (r->o->json)
        print_json(r, rep, lines, top);
    else
        print_tables(r, rep, lines, top);
    free(lines);
    free(top);
    r->run.rc = fflush(stdout) == 0 ? 0 : STORE_CLI_EXIT_FAILED;
}

static store_status_t report_call(store_t *store, store_cli_run_t *run)
{
    report_run_t *r = (report_run_t *)run;
    r->backend = store_backend_name(store);
    return store_report(store, r->o->since_ms, r->o->top, r->prefix, on_report, r);
}

int report_cmd_main(int argc, char **argv)
{
    report_opts_t o = {0};
    int p = parse_opts(argc, argv, &o);
    if (p != 0) {
        usage(p > 0 ? stdout : stderr);
        return p > 0 ? 0 : REPORT_EXIT_USAGE;
    }
    config_t *cfg = NULL;
    if (o.config) {
        config_errors_t errs = {0};
        cfg = config_load(o.config, &errs);
        for (size_t i = 0; !cfg && i < errs.n; i++)
            fprintf(stderr, "%s\n", errs.msgs[i]);
        if (!cfg && errs.n == 0)
            fprintf(stderr, "idemgw report: %s: cannot load the config\n", o.config);
        config_errors_free(&errs);
        if (!cfg)
            return REPORT_EXIT_USAGE;
    }
    config_t *view = NULL;
    if (cfg && server_arg_pick("idemgw report", cfg, o.server, true, &view) != 0) {
        config_free(cfg);
        return REPORT_EXIT_USAGE;
    }
    report_run_t r = {
        .run = {.cmd = "idemgw report", .call = report_call, .database_url = o.database_url},
        .o = &o,
        .cfg = cfg,
        .grouped = o.server || (cfg && cfg->n_servers),
        /* the store keeps a server's rows under SERVER/TOOL (key_scoped_tool) */
        .prefix = o.server ? key_scoped_tool(o.server, "") : NULL,
    };
    int rc = store_cli_exec(cfg, &r.run);
    free(r.prefix);
    if (cfg)
        config_free(cfg);
    return rc;
}
