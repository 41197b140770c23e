/* The gateway run in this process behind a front end of its own instead of listeners: what
 * `idemgw stdio` does. main.c builds the worker (store, upstream, proxy, stages) as for a
 * server; the front end gets its event loop and two ways into the gateway. */
#ifndef IDEMGW_SERVE_H
#define IDEMGW_SERVE_H

#include "config.h"

struct event_base;

/* What a front end may do to the gateway. */
typedef struct serve_gateway {
    /* Gives the gateway fd (one end of a connected socket) as an agent connection; takes it. */
    void (*adopt)(int fd);
    /* As SIGTERM: no new requests, what is in flight finishes, then the loop ends. */
    void (*drain)(void);
} serve_gateway_t;

/* Contract: start runs once the gateway is wired, before the loop; a non-zero return stops
 * the worker (start has said why on stderr). stop runs after the loop, while the event base
 * and the gateway still exist: the front frees what it holds there. gw outlives both. */
typedef struct serve_front {
    int (*start)(void *arg, struct event_base *base, const config_t *cfg,
                 const serve_gateway_t *gw);
    void (*stop)(void *arg);
    void *arg;
} serve_front_t;

/* Runs one worker on cfg (taken) with front in place of the listeners; path is the config
 * file a SIGHUP reloads (NULL: the environment). Returns the process's exit status. main.c's
 * serve_front_run is one; a command that runs a front end is given it. */
typedef int serve_run_fn(config_t *cfg, const char *path, const serve_front_t *front);
serve_run_fn serve_front_run;

#endif
