/* --server NAME, for the operator's commands (key, report, tools, policy): which server of a
 * config's servers: a command works on, as the view (config.h) the gateway serves it with, so
 * the command reads that server's upstream and policy and keys its calls as the gateway does.
 *
 * The one-upstream form has no server names: --server is refused there rather than ignored,
 * since a name the config does not have means the wrong config or a mistyped flag, and a key
 * or a catalogue computed without the server would look right and match nothing. */
#ifndef IDEMGW_SERVER_ARG_H
#define IDEMGW_SERVER_ARG_H

#include "config.h"
#include "util.h"

#include <stdbool.h>

/* Picks the server cmd ("idemgw key", the prefix of messages) works on.
 *   cfg with servers: name must be one of them (*out: its view); with optional, name NULL is
 *     every server (*out: cfg itself).
 *   cfg without servers: name must be NULL (*out: cfg).
 * Returns 0, or -1 after saying on stderr what is wrong and, when a name is wanted, listing the
 * config's server names: a usage error (exit 2). */
int server_arg_pick(const char *cmd, const config_t *cfg, const char *name, bool optional,
                    config_t **out) MUST_CHECK;

#endif
