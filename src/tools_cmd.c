/* The `idemgw tools` subcommand (see include/tools_cmd.h). */
#include "tools_cmd.h"

#include "catalog.h"
#include "catalog_fetch.h"
#include "config.h"
#include "log.h"
#include "upstream.h"
#include "util.h"

#include <event2/event.h>
#include <getopt.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOOLS_EXIT_FAILED 1
#define TOOLS_EXIT_USAGE 2
#define MAX_HEADERS_BYTES 8192

static void usage(FILE *f)
{
    fputs("usage: idemgw tools [-c FILE] [-H 'Name: value']...\n"
          "  asks the upstream for its tools and prints how the gateway classifies each:\n"
          "  class, where it comes from (policy, annotation, default), window, the server's\n"
          "  hints; then the policy's tools the server does not list\n"
          "  -c FILE   the config (else IDEMGW_UPSTREAM and the other IDEMGW_* variables)\n"
          "  -H HEADER a header for the upstream, e.g. 'Authorization: Bearer ...' (repeatable)\n",
          f);
}

typedef struct tools_run {
    struct event_base *base;
    int n_tools;
    char error[300];
} tools_run_t;

static void fetched(void *arg, int n_tools, const char *error)
{
    tools_run_t *r = arg;
    r->n_tools = n_tools;
    if (error)
        snprintf(r->error, sizeof(r->error), "%s", error);
    event_base_loopbreak(r->base);
}

/* A header line the upstream may get: "Name: value", no line breaks. */
static bool header_ok(const char *h)
{
    const char *colon = strchr(h, ':');
    return colon && colon > h && !strpbrk(h, "\r\n") && !memchr(h, ' ', (size_t)(colon - h));
}

static const char *hint(hint_t h)
{
    return h == HINT_TRUE ? "true" : h == HINT_FALSE ? "false" : "-";
}

static void window_text(const policy_t *p, const char *tool, tool_class_t cls, char *out,
                        size_t outlen)
{
    if (cls != TOOL_CLASS_NON_IDEMPOTENT) {
        snprintf(out, outlen, "-");
        return;
    }
    uint64_t ms = policy_lookup(p, tool)->window_ms;
    if (ms % 1000 != 0)
        snprintf(out, outlen, "%llums", (unsigned long long)ms);
    else if (ms % 3600000 == 0)
        snprintf(out, outlen, "%lluh", (unsigned long long)(ms / 3600000));
    else if (ms % 60000 == 0)
        snprintf(out, outlen, "%llum", (unsigned long long)(ms / 60000));
    else
        snprintf(out, outlen, "%llus", (unsigned long long)(ms / 1000));
}

static void print_table(const catalog_t *c, const config_t *cfg)
{
    printf("%-32s %-15s %-11s %-7s %s\n", "TOOL", "CLASS", "SOURCE", "WINDOW",
           "READONLY IDEMPOTENT DESTRUCTIVE");
    for (size_t i = 0; i < catalog_size(c); i++) {
        const catalog_tool_t *t = catalog_at(c, i);
        class_source_t src;
        tool_class_t cls = catalog_classify(c, t->name, &src);
        char window[32];
        window_text(&cfg->policy, t->name, cls, window, sizeof(window));
        printf("%-32s %-15s %-11s %-7s %-8s %-10s %s\n", t->name, tool_class_name(cls),
               class_source_name(src), window, hint(t->read_only), hint(t->idempotent),
               hint(t->destructive));
    }
    for (size_t i = 0; i < cfg->policy.n_tools; i++) {
        const policy_tool_t *t = &cfg->policy.tools[i];
        if (catalog_find(c, t->name))
            continue;
        char window[32];
        window_text(&cfg->policy, t->name, t->cls, window, sizeof(window));
        printf("%-32s %-15s %-11s %-7s (in the policy, not listed by the server)\n", t->name,
               tool_class_name(t->cls), "policy", window);
    }
}

int tools_cmd_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},
        {"header", required_argument, NULL, 'H'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *path = NULL;
    char headers[MAX_HEADERS_BYTES] = "";
    optind = 0;
    opterr = 0;
    int opt;
    while ((opt = getopt_long(argc, argv, "c:H:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'c':
            path = optarg;
            break;
        case 'H': {
            size_t used = strlen(headers);
            if (!header_ok(optarg) || used + strlen(optarg) + 3 > sizeof(headers)) {
                fprintf(stderr, "idemgw tools: -H %s: expected 'Name: value' on one line\n",
                        optarg);
                return TOOLS_EXIT_USAGE;
            }
            snprintf(headers + used, sizeof(headers) - used, "%s\r\n", optarg);
            break;
        }
        case 'h':
            usage(stdout);
            return 0;
        default:
            fprintf(stderr, "idemgw tools: unknown or incomplete option %s\n", argv[optind - 1]);
            usage(stderr);
            return TOOLS_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "idemgw tools: unexpected argument %s\n", argv[optind]);
        usage(stderr);
        return TOOLS_EXIT_USAGE;
    }

    config_errors_t errs = {0};
    config_t *cfg = config_load(path, &errs);
    if (!cfg) {
        for (size_t i = 0; i < errs.n; i++)
            fprintf(stderr, "%s\n", errs.msgs[i]);
        config_errors_free(&errs);
        return TOOLS_EXIT_USAGE;
    }
    config_errors_free(&errs);
    log_threshold = LOG_OFF; /* the table is the output */

    int rc = TOOLS_EXIT_FAILED;
    char msg[300] = "";
    tools_run_t run = {.base = event_base_new(), .n_tools = -1};
    SSL_CTX *tls = NULL;
    upstream_pool_t *pool = NULL;
    catalog_t *catalog = catalog_new();
    catalog_set_policy(catalog, &cfg->policy);
    upstream_limits_t limits = {
        .connect_timeout_ms = cfg->upstream_connect_timeout_ms,
        .timeout_ms = cfg->upstream_timeout_ms,
        .idle_timeout_ms = cfg->upstream_idle_timeout_ms,
        .pool = 1,
    };
    if (cfg->upstream_tls && !(tls = upstream_tls_new(cfg->upstream_ca_file, msg, sizeof(msg))))
        goto out;
    upstream_opts_t uo = {
        .base = run.base,
        .tls = tls,
        .host = cfg->upstream.host,
        .port = cfg->upstream.port,
        .limits = &limits,
    };
    if (!(pool = upstream_pool_new(&uo, msg, sizeof(msg))))
        goto out;
    catalog_fetch_opts_t fo = {
        .base = run.base,
        .pool = pool,
        .target = cfg->upstream_path,
        .host = cfg->upstream_host_header,
        .headers = headers[0] ? headers : NULL,
        .catalog = catalog,
        .done = fetched,
        .arg = &run,
    };
    catalog_fetch_start(&fo);
    event_base_dispatch(run.base);
    if (run.n_tools < 0) {
        snprintf(msg, sizeof(msg), "%s", run.error[0] ? run.error : "no answer");
        goto out;
    }
    print_table(catalog, cfg);
    rc = fflush(stdout) == 0 ? 0 : TOOLS_EXIT_FAILED;
out:
    if (rc != 0 && msg[0])
        fprintf(stderr, "idemgw tools: %s: %s\n", cfg->upstream_url, msg);
    catalog_free(catalog);
    if (pool)
        upstream_pool_free(pool);
    event_base_loop(run.base, EVLOOP_NONBLOCK);
    event_base_free(run.base);
    if (tls)
        SSL_CTX_free(tls);
    config_free(cfg);
    return rc;
}
