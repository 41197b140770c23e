/* The gateway as an MCP client of its upstream, for one purpose: reading the tool catalogue.
 * initialize, notifications/initialized, tools/list (every page), then DELETE of the session,
 * on the event loop through the upstream (upstream.h). Used at start (retried until the upstream
 * answers) and by `idemgw tools`. */
#ifndef IDEMGW_CATALOG_FETCH_H
#define IDEMGW_CATALOG_FETCH_H

#include "catalog.h"
#include "upstream.h"

#include <stdint.h>
#include <stdio.h>

typedef struct catalog_fetch catalog_fetch_t;

/* n_tools >= 0 when the catalogue was read; else error says why (valid during the call). The
 * fetch is finished when this runs; it frees itself after. */
typedef void (*catalog_fetch_done_fn)(void *arg, int n_tools, const char *error);

typedef struct catalog_fetch_opts {
    struct event_base *base;
    upstream_t *upstream; /* outlives the fetch */
    const char *target;   /* the MCP endpoint's path (copied, as headers) */
    const char *headers; /* extra request header lines ("Name: v\r\n"...), may be NULL */
    catalog_t *catalog;  /* learns every page */
    /* each page's result JSON text as it arrives (may be NULL), with page_arg */
    void (*on_page)(void *page_arg, const char *result, size_t len);
    void *page_arg;
    catalog_fetch_done_fn done;
    void *arg;
    /* the client capabilities initialize declares, a JSON object's text (copied); NULL: none.
     * A server may list some tools only to a client that can answer its questions. */
    const char *capabilities;
} catalog_fetch_opts_t;

catalog_fetch_t *catalog_fetch_start(const catalog_fetch_opts_t *opts);
/* Stops a fetch in progress; done is not called. */
void catalog_fetch_cancel(catalog_fetch_t *f);

struct config;
/* For the command line: reads cfg's upstream's catalogue into catalog (with its own event
 * loop, TLS as the gateway would), headers as in the options, declaring what an agent's client
 * can do (elicitation, sampling, roots), so the tools are those an agent is shown. Returns the
 * tools read, or -1 with the reason in err; for a stdio server, on further lines, its last stderr
 * lines and what its environment holds (err of a couple of KiB holds them). */
int catalog_fetch_now(const struct config *cfg, const char *headers, catalog_t *catalog,
                      void (*on_page)(void *arg, const char *result, size_t len), void *arg,
                      char *err, size_t errlen);

/* The options of the commands that read a catalogue (idemgw tools, idemgw policy):
 * -c FILE, --upstream URL (when the command takes it), --server NAME, -H 'Name: value'
 * (repeatable, checked: one header on one line), -h. */
typedef struct catalog_cli {
    const char *config;   /* -c, or NULL */
    const char *upstream; /* --upstream, or NULL */
    const char *server;   /* --server: a server of the config's servers:, or NULL */
    char **command;       /* after --: a stdio server's program and arguments, or NULL */
    int n_command;
    char headers[8192];   /* the -H headers as request header lines */
} catalog_cli_t;

/* Parses argv (argv[0] is the command's name, cmd the name for messages); with takes_upstream,
 * --upstream URL or, after --, a stdio server's command. 0: parsed; 1: help printed with usage;
 * -1: a usage error, reported on stderr. */
int catalog_cli_parse(int argc, char **argv, const char *cmd, bool takes_upstream,
                      void (*usage)(FILE *), catalog_cli_t *out);

#endif
