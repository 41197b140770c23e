/* The `idemgw key` subcommand (see include/key_cmd.h). */
#include "key_cmd.h"

#include "config.h"
#include "jcs.h"
#include "key.h"
#include "policy.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY_CMD_EXIT_USAGE 2

typedef struct key_cmd_opts {
    const char *subject;
    const char *tool;
    const char *args;
    const char *header_key;
    const char *config;
} key_cmd_opts_t;

static void usage(FILE *f)
{
    fputs("usage: idemgw key --subject S --tool T --args JSON [--header-key K] [-c FILE]\n"
          "  prints the idempotency key for a tools/call of T with arguments JSON by S;\n"
          "  -c FILE applies the tool's exclude_args and key_arg from the config\n",
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
    return 0;
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
    rc = fflush(stdout) == 0 ? 0 : 1;
out:
    key_result_free(&kr);
    jcs_free(args);
    if (cfg)
        config_free(cfg);
    return rc;
}
