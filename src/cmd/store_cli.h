/* The store for an operator's command (`idemgw key`, `idemgw report`): the one a gateway with
 * the same config would use, opened to look, not to run, on an event loop of its own.
 *
 * The store is --database-url, else the config's database_url, else IDEMGW_DATABASE_URL, else
 * libpq's PG* variables, else the embedded store's default file (store_choose), which
 * must exist: a command never creates it, nor its folders. Migrations are off (a look never
 * changes the schema), one connection, the store's timeout to get ready. The embedded store is
 * opened without the gateway's process lock (a running gateway holds it): each call is one
 * short transaction through SQLite's own locking, safe beside the gateway on a local disk.
 * While it runs, the store's log lines (warnings and errors) go to stderr: stdout is the command's
 * answer. */
#ifndef IDEMGW_STORE_CLI_H
#define IDEMGW_STORE_CLI_H

#include "config.h"
#include "store.h"

struct event_base;

#define STORE_CLI_EXIT_FAILED 2 /* no database, not reachable, or the store call failed */

typedef struct store_cli_run store_cli_run_t;
struct store_cli_run {
    const char *cmd;          /* "idemgw key", the prefix of messages */
    const char *database_url; /* --database-url, over the config's and the environment's */
    /* Makes the one store call once the store is ready; its callback prints the answer, sets
     * rc and calls store_cli_done. A status other than STORE_OK fails the command. */
    store_status_t (*call)(store_t *store, store_cli_run_t *run);
    int rc;                  /* the exit code, STORE_CLI_EXIT_FAILED until the answer sets it */
    struct event_base *base; /* set by store_cli_exec */
};

/* Runs run->call on the store cfg names (cfg NULL: the environment's); returns run->rc. */
int store_cli_exec(const config_t *cfg, store_cli_run_t *run);
/* The call's answer is in: the loop ends (call from the store callback). */
void store_cli_done(store_cli_run_t *run);
/* Says on stderr that a store call failed (st != STORE_OK) and sets rc; false when st is OK. */
bool store_cli_failed(store_cli_run_t *run, store_status_t st, const char *what);

#endif
