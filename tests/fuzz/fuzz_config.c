/* libFuzzer driver for the config loader: any bytes give either a config or at least one
 * "fuzz.yaml:LINE: message" error, never both; a loaded config is self-consistent.
 *
 * clang -std=c11 -D_GNU_SOURCE -Iinclude -g -O1 -fsanitize=fuzzer,address,undefined \
 *     $(pkg-config --cflags libfyaml) -o fuzz_config tests/fuzz/fuzz_config.c \
 *     src/core/config.c src/core/config_yaml.c src/core/policy.c src/core/util.c src/core/log.c \
 *     $(pkg-config --libs libfyaml)
 * ./fuzz_config -max_len=4096 -dict=tests/fuzz/config.dict CORPUS_COPY tests/fuzz/corpus/config */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    /* The environment must not decide the outcome of an input. */
    static const char *const vars[] = {"IDEMGW_LISTEN",    "IDEMGW_ADMIN_LISTEN",
                                       "IDEMGW_UPSTREAM",  "IDEMGW_DATABASE_URL",
                                       "IDEMGW_LOG_LEVEL", "PGHOST",
                                       "PGDATABASE",       "PGSERVICE"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
        unsetenv(vars[i]);
    return 0;
}

static void check_error(const char *msg)
{
    static const char prefix[] = "fuzz.yaml:";
    if (strncmp(msg, prefix, sizeof(prefix) - 1) != 0) {
        fprintf(stderr, "error without file prefix: %s\n", msg);
        abort();
    }
    char *end;
    long line = strtol(msg + sizeof(prefix) - 1, &end, 10);
    if (line < 1 || strncmp(end, ": ", 2) != 0 || !end[2]) {
        fprintf(stderr, "error without line: %s\n", msg);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';

    config_errors_t errs = {0};
    config_t *c = config_load_string("fuzz.yaml", text, &errs);
    if (!c == !errs.n) {
        fprintf(stderr, "config %p with %zu errors\n", (void *)c, errs.n);
        abort();
    }
    for (size_t i = 0; i < errs.n; i++)
        check_error(errs.msgs[i]);
    if (c) {
        /* A reload of the same text carries nothing over. */
        config_t *again = config_load_string("fuzz.yaml", text, NULL);
        if (!again || config_reload_merge(c, again, NULL, NULL) != 0)
            abort();
        config_free(again);
        for (size_t i = 0; i < c->policy.n_tools; i++)
            if (policy_lookup(&c->policy, c->policy.tools[i].name) != &c->policy.tools[i])
                abort();
        if (!c->n_allowed_hosts || !c->n_allowed_origins || !c->upstream_path ||
            c->upstream_path[0] != '/')
            abort();
        (void)config_host_allowed(c, text);
        (void)config_origin_allowed(c, text);
        config_free(c);
    }
    config_errors_free(&errs);
    free(text);
    return 0;
}
