/* The `idemgw tools` subcommand (see src/cmd/tools_cmd.h). */
#include "tools_cmd.h"

#include "catalog.h"
#include "catalog_fetch.h"
#include "config.h"
#include "log.h"
#include "server_arg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOOLS_EXIT_FAILED 1
#define TOOLS_EXIT_USAGE 2

static void usage(FILE *f)
{
    fputs("usage: idemgw tools [-c FILE] [--server NAME] [-H 'Name: value']...\n"
          "  asks the upstream for its tools and prints how the gateway classifies each:\n"
          "  class, where it comes from (policy, annotation, default), window, the server's\n"
          "  hints; then the policy's tools the server does not list\n"
          "  -c FILE   the config (else IDEMGW_UPSTREAM and the other IDEMGW_* variables)\n"
          "  --server NAME  which of the config's servers: (required when it has them): that\n"
          "            server's upstream, classified by that server's policy\n"
          "  -H HEADER a header for the upstream, e.g. 'Authorization: Bearer ...' (repeatable)\n",
          f);
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

/* What a caller's cancel does to a protected call of tool; "-" for a tool that is not. */
static const char *cancel_text(const policy_t *p, const char *tool, tool_class_t cls)
{
    return cls == TOOL_CLASS_NON_IDEMPOTENT ? on_cancel_name(policy_lookup(p, tool)->on_cancel)
                                            : "-";
}

static void print_table(const catalog_t *c, const config_t *cfg)
{
    printf("%-32s %-15s %-11s %-7s %-7s %s\n", "TOOL", "CLASS", "SOURCE", "WINDOW", "CANCEL",
           "READONLY IDEMPOTENT DESTRUCTIVE");
    for (size_t i = 0; i < catalog_size(c); i++) {
        const catalog_tool_t *t = catalog_at(c, i);
        class_source_t src;
        tool_class_t cls = catalog_classify(c, t->name, &src);
        char window[32];
        window_text(&cfg->policy, t->name, cls, window, sizeof(window));
        printf("%-32s %-15s %-11s %-7s %-7s %-8s %-10s %s\n", t->name, tool_class_name(cls),
               class_source_name(src), window, cancel_text(&cfg->policy, t->name, cls),
               hint(t->read_only), hint(t->idempotent), hint(t->destructive));
    }
    for (size_t i = 0; i < cfg->policy.n_tools; i++) {
        const policy_tool_t *t = &cfg->policy.tools[i];
        if (catalog_find(c, t->name))
            continue;
        char window[32];
        window_text(&cfg->policy, t->name, t->cls, window, sizeof(window));
        printf("%-32s %-15s %-11s %-7s %-7s (in the policy, not listed by the server)\n", t->name,
               tool_class_name(t->cls), "policy", window,
               cancel_text(&cfg->policy, t->name, t->cls));
    }
}

int tools_cmd_main(int argc, char **argv)
{
    catalog_cli_t o;
    int r = catalog_cli_parse(argc, argv, "idemgw tools", false, usage, &o);
    if (r != 0)
        return r > 0 ? 0 : TOOLS_EXIT_USAGE;
    const char *path = o.config, *headers = o.headers;

    config_errors_t errs = {0};
    config_t *cfg = config_load(path, &errs);
    if (!cfg) {
        for (size_t i = 0; i < errs.n; i++)
            fprintf(stderr, "%s\n", errs.msgs[i]);
        config_errors_free(&errs);
        return TOOLS_EXIT_USAGE;
    }
    config_errors_free(&errs);
    config_t *view; /* the server asked about: its upstream and its policy */
    if (server_arg_pick("idemgw tools", cfg, o.server, false, &view) != 0) {
        config_free(cfg);
        return TOOLS_EXIT_USAGE;
    }
    log_threshold = LOG_OFF; /* the table is the output */

    int rc = TOOLS_EXIT_FAILED;
    char msg[2048] = ""; /* a stdio server's stderr lines too */
    catalog_t *catalog = catalog_new();
    catalog_set_policy(catalog, &view->policy);
    if (catalog_fetch_now(view, headers, catalog, NULL, NULL, msg, sizeof(msg)) < 0)
        goto out;
    print_table(catalog, view);
    rc = fflush(stdout) == 0 ? 0 : TOOLS_EXIT_FAILED;
out:
    if (rc != 0 && msg[0])
        fprintf(stderr, "idemgw tools: %s%s%s%s: %s\n", view->server_name ? "server " : "",
                view->server_name ? view->server_name : "", view->server_name ? ", " : "",
                view->upstream_url, msg);
    catalog_free(catalog);
    config_free(cfg);
    return rc;
}
