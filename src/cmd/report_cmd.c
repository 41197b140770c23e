/* The `idemgw report` subcommand (see include/report_cmd.h). */
#include "report_cmd.h"

#include "config.h"
#include "key.h"
#include "policy.h"
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
    const char *since_text; /* as given, for the heading */
    uint64_t since_ms;      /* 0: every row */
    int top;
    bool json;
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
          "                     [--top N] [--json]\n"
          "  per tool, from the store: keys, calls, runs, duplicates by answer and by source\n"
          "  (the rows updated in the last DURATION, default " REPORT_SINCE_DEFAULT
          "); then the N keys\n"
          "  (default 10) with the most calls, as key hashes (idemgw key --hash)\n"
          "  --json   one JSON object instead of the tables\n"
          "  the store: as idemgw key (--database-url, database_url from -c FILE,\n"
          "  IDEMGW_DATABASE_URL, PG*, the embedded store's default file); it keeps a key only\n"
          "  for its window, then sweeps it\n",
          f);
}

/* 0 when parsed, 1 when help was asked for, -1 on a usage error (already reported). */
static int parse_opts(int argc, char **argv, report_opts_t *o)
{
    enum { OPT_SINCE = 256, OPT_TOP, OPT_JSON, OPT_DATABASE_URL };
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},
        {"since", required_argument, NULL, OPT_SINCE},
        {"top", required_argument, NULL, OPT_TOP},
        {"json", no_argument, NULL, OPT_JSON},
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
} report_run_t;

static int by_tool(const void *a, const void *b)
{
    return strcmp(((const store_report_tool_t *)a)->tool, ((const store_report_tool_t *)b)->tool);
}

static int by_calls(const void *a, const void *b)
{
    const store_report_key_t *x = a, *y = b;
    if (x->calls != y->calls)
        return x->calls > y->calls ? -1 : 1;
    return strcmp(x->key, y->key);
}

static json_t *tool_json(const store_report_tool_t *t)
{
    json_t *o = json_object(), *src = json_object(), *states = json_object();
    int64_t dups = 0;
    json_object_set_new(o, "tool", json_string(t->tool));
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

static void print_json(const report_run_t *r, const store_report_t *rep,
                       const store_report_tool_t *tools, const store_report_key_t *top)
{
    json_t *o = json_object(), *ts = json_array(), *ks = json_array();
    json_object_set_new(o, "now", json_string(rep->now ? rep->now : ""));
    json_object_set_new(o, "since", json_string(r->o->since_text));
    json_object_set_new(o, "since_ms", json_integer((json_int_t)r->o->since_ms));
    json_object_set_new(o, "store", json_string(r->backend));
    for (size_t i = 0; i < rep->n_tools; i++)
        json_array_append_new(ts, tool_json(&tools[i]));
    json_object_set_new(o, "tools", ts);
    for (size_t i = 0; i < rep->n_top; i++) {
        char h[KEY_HASH_LOG_LEN + 1];
        key_hash_log(top[i].key, h);
        json_array_append_new(ks, json_pack("{s:s, s:s, s:i, s:i, s:i, s:s, s:s}", "key_hash", h,
                                            "tool", top[i].tool, "calls", top[i].calls, "attempts",
                                            top[i].attempts, "duplicates", top[i].duplicates,
                                            "state", store_state_str(top[i].state), "first_seen",
                                            top[i].created_at ? top[i].created_at : ""));
    }
    json_object_set_new(o, "top_keys", ks);
    char *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    printf("%s\n", line);
    free(line);
}

/* The width of the widest tool name, at least min. */
static int tool_width(const char *const *names, size_t n, int min)
{
    int w = min;
    for (size_t i = 0; i < n; i++) {
        int len = (int)strlen(names[i]);
        if (len > w)
            w = len;
    }
    return w > 40 ? 40 : w;
}

static void print_tables(const report_run_t *r, const store_report_t *rep,
                         const store_report_tool_t *tools, const store_report_key_t *top)
{
    if (r->o->since_ms)
        printf("idemgw report: rows updated in the last %s, %s store, at %s\n", r->o->since_text,
               r->backend, rep->now ? rep->now : "-");
    else
        printf("idemgw report: every row, %s store, at %s\n", r->backend,
               rep->now ? rep->now : "-");
    printf("(the store keeps a key for its window, then sweeps it: older calls are not here)\n\n");
    if (!rep->n_tools) {
        printf("no protected calls\n");
        return;
    }
    const char **names = xcalloc(rep->n_tools + rep->n_top + 1, sizeof(*names));
    for (size_t i = 0; i < rep->n_tools; i++)
        names[i] = tools[i].tool;
    int w = tool_width(names, rep->n_tools, 4);
    printf("%-*s %6s %7s %6s %8s %11s %8s", w, "TOOL", "KEYS", "CALLS", "RUNS", "REPLAYS",
           "IN_PROGRESS", "UNKNOWN");
    for (int s = 0; s < DUP_SOURCE_N; s++) {
        char up[16];
        const char *n = dup_source_name((dup_source_t)s);
        size_t k = 0;
        for (; n[k] && k < sizeof(up) - 1; k++)
            up[k] = (char)(n[k] - 'a' + 'A');
        up[k] = '\0';
        printf(" %9s", up);
    }
    printf("\n");
    store_report_tool_t sum = {.tool = "total"};
    for (size_t i = 0; i < rep->n_tools; i++) {
        const store_report_tool_t *t = &tools[i];
        printf("%-*.*s %6lld %7lld %6lld %8lld %11lld %8lld", w, w, t->tool, (long long)t->keys,
               (long long)t->calls, (long long)t->runs, (long long)t->dup_answers[STORE_DUP_REPLAY],
               (long long)t->dup_answers[STORE_DUP_IN_PROGRESS],
               (long long)t->dup_answers[STORE_DUP_UNKNOWN]);
        for (int s = 0; s < DUP_SOURCE_N; s++)
            printf(" %9lld", (long long)t->dup_sources[s]);
        printf("\n");
        sum.keys += t->keys;
        sum.calls += t->calls;
        sum.runs += t->runs;
        for (int a = 0; a < STORE_DUP_ANSWERS_; a++)
            sum.dup_answers[a] += t->dup_answers[a];
        for (int s = 0; s < DUP_SOURCE_N; s++)
            sum.dup_sources[s] += t->dup_sources[s];
    }
    if (rep->n_tools > 1) {
        printf("%-*s %6lld %7lld %6lld %8lld %11lld %8lld", w, sum.tool, (long long)sum.keys,
               (long long)sum.calls, (long long)sum.runs,
               (long long)sum.dup_answers[STORE_DUP_REPLAY],
               (long long)sum.dup_answers[STORE_DUP_IN_PROGRESS],
               (long long)sum.dup_answers[STORE_DUP_UNKNOWN]);
        for (int s = 0; s < DUP_SOURCE_N; s++)
            printf(" %9lld", (long long)sum.dup_sources[s]);
        printf("\n");
    }
    if (rep->n_top) {
        for (size_t i = 0; i < rep->n_top; i++)
            names[i] = top[i].tool;
        w = tool_width(names, rep->n_top, 4);
        printf("\nthe %zu key%s with the most calls:\n", rep->n_top, rep->n_top == 1 ? "" : "s");
        printf("%-16s  %-*s %7s %9s %11s  %-11s  %s\n", "KEY_HASH", w, "TOOL", "CALLS", "ATTEMPTS",
               "DUPLICATES", "STATE", "FIRST_SEEN");
        for (size_t i = 0; i < rep->n_top; i++) {
            char h[KEY_HASH_LOG_LEN + 1];
            key_hash_log(top[i].key, h);
            printf("%-16s  %-*.*s %7d %9d %11d  %-11s  %s\n", h, w, w, top[i].tool, top[i].calls,
                   top[i].attempts, top[i].duplicates, store_state_str(top[i].state),
                   top[i].created_at ? top[i].created_at : "-");
        }
    }
    free(names);
}

static void on_report(store_status_t st, const store_report_t *rep, void *arg)
{
    report_run_t *r = arg;
    store_cli_done(&r->run);
    if (store_cli_failed(&r->run, st, "the report"))
        return;
    /* sorted here, whatever order the backend returned */
    store_report_tool_t *tools = xcalloc(rep->n_tools + 1, sizeof(*tools));
    store_report_key_t *top = xcalloc(rep->n_top + 1, sizeof(*top));
    if (rep->n_tools)
        memcpy(tools, rep->tools, rep->n_tools * sizeof(*tools));
    if (rep->n_top)
        memcpy(top, rep->top, rep->n_top * sizeof(*top));
    qsort(tools, rep->n_tools, sizeof(*tools), by_tool);
    qsort(top, rep->n_top, sizeof(*top), by_calls);
    if (r->o->json)
        print_json(r, rep, tools, top);
    else
        print_tables(r, rep, tools, top);
    free(tools);
    free(top);
    r->run.rc = fflush(stdout) == 0 ? 0 : STORE_CLI_EXIT_FAILED;
}

static store_status_t report_call(store_t *store, store_cli_run_t *run)
{
    report_run_t *r = (report_run_t *)run;
    r->backend = store_backend_name(store);
    return store_report(store, r->o->since_ms, r->o->top, on_report, r);
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
    report_run_t r = {
        .run = {.cmd = "idemgw report", .call = report_call, .database_url = o.database_url},
        .o = &o,
    };
    int rc = store_cli_exec(cfg, &r.run);
    if (cfg)
        config_free(cfg);
    return rc;
}
