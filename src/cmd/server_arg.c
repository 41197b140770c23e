/* --server NAME for the operator's commands (see src/cmd/server_arg.h). */
#include "server_arg.h"

#include <stdio.h>

/* Where the configuration came from, for messages. */
static const char *config_name(const config_t *cfg)
{
    return cfg->path ? cfg->path : "the configuration";
}

/* ": billing, payments" on stderr, then a newline. */
static void list_names(const config_t *cfg)
{
    for (size_t i = 0; i < cfg->n_servers; i++)
        fprintf(stderr, "%s%s", i ? ", " : ": ", cfg->servers[i]->server_name);
    fputc('\n', stderr);
}

int server_arg_pick(const char *cmd, const config_t *cfg, const char *name, bool optional,
                    config_t **out)
{
    *out = NULL;
    if (!cfg->n_servers) {
        if (name) {
            fprintf(stderr,
                    "%s: --server %s: %s has no servers: (one upstream, whose keys and tools "
                    "name no server); leave --server out\n",
                    cmd, name, config_name(cfg));
            return -1;
        }
        *out = (config_t *)cfg;
        return 0;
    }
    if (!name) {
        if (optional) {
            *out = (config_t *)cfg;
            return 0;
        }
        fprintf(stderr, "%s: %s has servers:, name one with --server NAME", cmd, config_name(cfg));
        list_names(cfg);
        return -1;
    }
    config_t *view = config_server_named(cfg, name);
    if (!view) {
        fprintf(stderr, "%s: --server %s: %s has no server of that name; its servers", cmd, name,
                config_name(cfg));
        list_names(cfg);
        return -1;
    }
    *out = view;
    return 0;
}
