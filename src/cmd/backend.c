/* One MCP server behind the gateway: its upstream, catalogue, router and stages (backend.h). */
#include "backend.h"

#include "call_ids.h"
#include "catalog.h"
#include "catalog_fetch.h"
#include "catalog_watch.h"
#include "idem.h"
#include "log.h"
#include "proxy.h"
#include "status.h"
#include "tasks.h"
#include "upstream_server.h"
#include "util.h"

#include <event2/event.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FETCH_BACKOFF_FIRST_MS 1000
#define FETCH_BACKOFF_MAX_MS 60000

struct backend {
    const backend_env_t *env;
    config_t *cfg;               /* the server's configuration (a view under servers:) */
    char *name;                  /* for log lines: "server NAME: " or "" */
    struct ssl_ctx_st *tls;      /* for an https upstream, else NULL */
    struct upstream_pool *pool;  /* an HTTP upstream's keep-alive connections */
    struct upstream *upstream;   /* where requests go */
    struct proxy *proxy;         /* the router of its requests */
    catalog_t *catalog;          /* the server's tools and their annotations */
    catalog_watch_t *watch;      /* GET streams watched for tools/list_changed */
    idem_t *idem;                /* the protected call */
    call_ids_t *call_ids;        /* the ids its calls go upstream with */
    status_tool_t *status;       /* the status tool */
    task_routes_t *tasks;        /* the sessions of tasks stored or replayed here */
    task_poll_t *task_poll;      /* a task's poll, sent to its task's session */
    catalog_fetch_t *fetch;      /* the gateway's own tools/list in progress, or NULL */
    struct event *fetch_retry;   /* the next try after a failed one */
    uint64_t fetch_backoff_ms;
    bool catalog_fetched;        /* the server's tools/list was read once */
    bool fetch_again;            /* the tools changed while a fetch ran */
    bool draining;
};

/* --- the server's tool catalogue, read by the gateway --- */

static void start_fetch(evutil_socket_t fd, short what, void *arg);

static void fetched(void *arg, int n_tools, const char *error)
{
    backend_t *b = arg;
    b->fetch = NULL;
    if (!error && b->fetch_again) {
        b->fetch_again = false;
        struct timeval zero = {0, 0};
        evtimer_add(b->fetch_retry, &zero);
        return;
    }
    if (!error) {
        b->catalog_fetched = true;
        log_info(0, "%stool catalogue: %d tools listed by the upstream", b->name, n_tools);
        return;
    }
    uint64_t ms = b->fetch_backoff_ms;
    log_warn(0,
             "%stool catalogue: the upstream's tools/list could not be read (%s); tools the "
             "policy does not name get defaults.class until it is, or until an agent's "
             "tools/list passes; trying again in %llu ms",
             b->name, error, (unsigned long long)ms);
    b->fetch_backoff_ms = ms * 2 > FETCH_BACKOFF_MAX_MS ? FETCH_BACKOFF_MAX_MS : ms * 2;
    struct timeval tv = util_ms_to_tv(ms);
    evtimer_add(b->fetch_retry, &tv);
}

/* The catalogue can change what is protected only when unlisted tools default to
 * non_idempotent and their annotations are trusted: then the gateway asks for it itself
 * (tools/list answers passing through are learned in any case). */
static bool catalog_wanted(const config_t *cfg)
{
    return cfg->policy.defaults.trust_annotations &&
           cfg->policy.defaults.cls == TOOL_CLASS_NON_IDEMPOTENT;
}

static void start_fetch(evutil_socket_t fd, short what, void *arg)
{
    backend_t *b = arg;
    /* a front end's one agent lists the tools itself (its answer is learned); a fetch of our
     * own would start a second copy of a stdio server beside the agent's */
    if (b->draining || *b->env->draining || b->fetch || b->catalog_fetched ||
        !catalog_wanted(b->cfg) || !b->env->fetch_catalog)
        return;
    catalog_fetch_opts_t o = {
        .base = b->env->base,
        .upstream = b->upstream,
        .target = b->cfg->upstream_path,
        .catalog = b->catalog,
        .done = fetched,
        .arg = b,
    };
    b->fetch = catalog_fetch_start(&o);
}

void backend_start_fetch(backend_t *b)
{
    if (!evtimer_pending(b->fetch_retry, NULL))
        start_fetch(-1, 0, b);
}

/* A server said its tools changed: read them again (once at a time; a change during a fetch
 * is read by one more). */
static void tools_changed(void *arg)
{
    backend_t *b = arg;
    if (!catalog_wanted(b->cfg))
        return;
    log_info(0, "%stool catalogue: the upstream says its tools changed: reading them again",
             b->name);
    b->catalog_fetched = false;
    if (b->fetch)
        b->fetch_again = true;
    else
        backend_start_fetch(b);
}

static void stop_fetch(backend_t *b)
{
    catalog_fetch_cancel(b->fetch);
    b->fetch = NULL;
    if (b->fetch_retry)
        evtimer_del(b->fetch_retry);
}

/* --- opening --- */

/* The MCP server: a child process spoken to over stdio, or an HTTP server reached through a
 * keep-alive pool (over TLS for https). */
static bool open_upstream(backend_t *b, char *msg, size_t msglen)
{
    const backend_env_t *env = b->env;
    upstream_server_opts_t o = {
        .base = env->base,
        .limits = env->limits,
        .draining = env->draining,
        .stats = env->stats,
    };
    upstream_server_t made;
    bool ok = upstream_server_open(b->cfg, &o, &made, msg, msglen);
    b->upstream = made.upstream;
    b->pool = made.pool;
    b->tls = made.tls;
    return ok;
}

static void session_idle(void *arg, const char *session)
{
    proxy_session_maybe_idle(arg, session);
}

/* The router and the stages it hands requests to, each given what it works with. */
static void wire_stages(backend_t *b)
{
    const backend_env_t *env = b->env;
    b->tasks = task_routes_new(); /* a task is its server's: its polls go nowhere else */
    b->catalog = catalog_new();
    catalog_set_server(b->catalog, b->cfg->server_name);
    catalog_set_policy(b->catalog, &b->cfg->policy);
    catalog_set_status_tool(b->catalog, b->cfg->status_tool);
    proxy_ctx_t pc = {
        .base = env->base,
        .cfg = b->cfg,
        .upstream = b->upstream,
        .stats = env->stats,
        .classify = catalog_classifier(b->catalog),
        .subject = env->subject,
        .tracer = env->tracer,
        .worker = env->worker,
        .n_workers = env->n_workers,
        .draining = env->draining,
        .exchange_ended = env->exchange_ended,
    };
    b->proxy = proxy_new(&pc);
    idem_ctx_t ic = {
        .base = env->base,
        .cfg = b->cfg,
        .store = env->store,
        .cache = env->cache,
        .stats = env->stats,
        .catalog = b->catalog,
        .subject = env->subject,
        .guard = env->guard,
        .tasks = b->tasks,
        .session_idle = session_idle,
        .arg = b->proxy,
    };
    b->idem = idem_new(&ic);
    /* an HTTP upstream (it has a pool) may leave a stray answer on a kept-alive connection */
    b->call_ids =
        call_ids_new(&(call_ids_ctx_t){.subject = env->subject, .every_request = b->pool != NULL});
    status_ctx_t sc = {
        .cfg = b->cfg,
        .store = env->store,
        .subject = env->subject,
        .stats = env->stats,
    };
    b->status = status_new(&sc);
    b->task_poll = task_poll_new(
        &(task_poll_ctx_t){.base = env->base, .routes = b->tasks, .subject = env->subject});
    b->watch = catalog_watch_new(&(catalog_watch_ctx_t){.tools_changed = tools_changed, .arg = b});
    /* the router's handlers, asked in this order (handler.h) */
    const handler_t handlers[] = {
        {"ids of calls sent up", call_ids_offer, b->call_ids},
        {"cancel of a protected call", idem_offer_cancel, b->idem},
        {"status tool", status_offer, b->status},
        {"protected call", idem_offer_call, b->idem},
        {"task poll", task_poll_offer, b->task_poll},
        {"tools/list_changed watch", catalog_watch_offer, b->watch},
        {"stream resume check", idem_offer_stream, b->idem},
        {"tools/list watch", catalog_offer, b->catalog},
    };
    for (size_t i = 0; i < ARRAY_LEN(handlers); i++)
        proxy_add_handler(b->proxy, &handlers[i]);
    proxy_set_hooks(b->proxy, &(proxy_hooks_t){.cancelled = idem_cancelled,
                                               .session_busy = idem_session_busy,
                                               .arg = b->idem});
}

backend_t *backend_open(const backend_env_t *env, config_t *cfg, char *msg, size_t msglen)
{
    backend_t *b = xcalloc(1, sizeof(*b));
    b->env = env;
    b->cfg = cfg;
    b->name = cfg->server_name ? xasprintf("server %s: ", cfg->server_name) : xstrdup("");
    /* its request histograms exist from now on, so /metrics shows them before its first call */
    (void)stats_server(env->stats, cfg->server_name);
    if (!open_upstream(b, msg, msglen)) {
        backend_free(b);
        return NULL;
    }
    wire_stages(b);
    b->fetch_retry = evtimer_new(env->base, start_fetch, b);
    b->fetch_backoff_ms = FETCH_BACKOFF_FIRST_MS;
    return b;
}

void backend_reconfigure(backend_t *b, config_t *cfg)
{
    b->cfg = cfg;
    proxy_reconfigure(b->proxy, cfg);
    idem_reconfigure(b->idem, cfg);
    status_reconfigure(b->status, cfg);
    catalog_set_policy(b->catalog, &cfg->policy);
    catalog_set_status_tool(b->catalog, cfg->status_tool);
    backend_start_fetch(b); /* the new policy may want the catalogue */
}

static bool str_eq(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

bool backend_same_upstream(const backend_t *b, const config_t *cfg)
{
    const config_t *run = b->cfg;
    if (!str_eq(run->upstream_url, cfg->upstream_url) ||
        !str_eq(run->upstream_path, cfg->upstream_path) ||
        !str_eq(run->upstream_ca_file, cfg->upstream_ca_file))
        return false;
    if (!run->stdio.argv != !cfg->stdio.argv)
        return false;
    return !run->stdio.argv || config_stdio_same(&run->stdio, &cfg->stdio);
}

void backend_drain(backend_t *b)
{
    b->draining = true;
    stop_fetch(b);
    proxy_drain(b->proxy);
    upstream_pool_close_idle(b->pool);
}

uint64_t backend_exchanges(const backend_t *b)
{
    return b->proxy ? proxy_exchanges(b->proxy) : 0;
}

void backend_free(backend_t *b)
{
    if (!b)
        return;
    stop_fetch(b);
    if (b->fetch_retry)
        event_free(b->fetch_retry);
    /* the router first: the exchanges a drain left abandon their upstream calls and let their
     * stages' observers go, while the upstream and the stages are still there */
    proxy_free(b->proxy);
    upstream_free(b->upstream);
    upstream_pool_free(b->pool);
    idem_free(b->idem);
    call_ids_free(b->call_ids);
    status_free(b->status);
    task_poll_free(b->task_poll);
    task_routes_free(b->tasks);
    catalog_free(b->catalog);
    catalog_watch_free(b->watch);
    if (b->tls)
        SSL_CTX_free(b->tls);
    free(b->name);
    free(b);
}

const config_t *backend_config(const backend_t *b)
{
    return b->cfg;
}

struct proxy *backend_proxy(const backend_t *b)
{
    return b->proxy;
}

struct upstream_pool *backend_pool(const backend_t *b)
{
    return b->pool;
}

struct upstream *backend_upstream(const backend_t *b)
{
    return b->upstream;
}
