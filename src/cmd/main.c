/* idemgw: the process. Command line, configuration, listeners, signals, drain and reload. */
#include "admin.h"
#include "backend.h"
#include "catalog.h"
#include "catalog_fetch.h"
#include "catalog_watch.h"
#include "config.h"
#include "event_mem.h"
#include "http_conn.h"
#include "idem.h"
#include "handoff.h"
#include "health_cmd.h"
#include "key_cmd.h"
#include "keys_cmd.h"
#include "alerts.h"
#include "policy_cmd.h"
#include "report_cmd.h"
#include "serve.h"
#include "stdio_cmd.h"
#include "tools_cmd.h"
#include "tls_listen.h"
#include "log.h"
#include "mcp.h"
#include "proxy.h"
#include "replay_cache.h"
#include "resume_guard.h"
#include "routes.h"
#include "stats.h"
#include "status.h"
#include "store.h"
#include "store_open.h"
#include "subject.h"
#include "tasks.h"
#include "trace.h"
#include "upstream_http.h"
#include "upstream_stdio.h"
#include "util.h"
#include "warn_memo.h"

#include <arpa/inet.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <getopt.h>
#include <netdb.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <event2/util.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef IDEMGW_VERSION
#define IDEMGW_VERSION "0.1.0"
#endif

/* The worker's runtime state: the event loop, the live configuration, the store, the upstream
 * pool and the counters /metrics reports. Only main sees it whole; every module gets what it
 * needs from it when it is made. */
/* A backend a reload removed or replaced, and the configuration its requests still read (freed
 * with the last backend that reads it). */
typedef struct retired {
    backend_t *backend;
    config_t *cfg;
} retired_t;

typedef struct server {
    struct event_base *base;
    config_t *cfg;              /* live config; replaced on SIGHUP */
    struct store *store;        /* NULL when no store is configured (database_url: none) */
    backend_env_t env;          /* what every MCP server behind the gateway shares */
    backend_t **backends;       /* one per server (config_server), in the config's order */
    size_t n_backends;
    retired_t *retired;         /* servers a reload removed, serving their last requests */
    size_t n_retired;
    struct event *reap_retired; /* frees those done, from the loop: not inside their callbacks */
    routes_t *routes;           /* which backend a request goes to */
    tracer_t *tracer;           /* OpenTelemetry spans, or NULL */
    alerts_t *alerts;           /* alerts.webhook_url, in the admin's worker; or NULL */
    struct subject *subject;    /* who is calling: its jwt keys live on this loop */
    struct replay_cache *cache; /* finished results, so replays skip the store */
    struct resume_guard *guard; /* who may resume a session's streams */
    struct evconnlistener *listener;
    struct evconnlistener *admin_listener;
    admin_server_t *admin_servers; /* the backends as /readyz and /metrics see them */
    admin_server_t *admin_retired; /* the retired ones, for the children gauge */
    struct ssl_ctx_st *listen_tls; /* agents' TLS (listen_tls), else NULL; mcp_site.tls */
    bool draining;                 /* SIGTERM seen: no new connections or requests */
    server_stats_t *stats;         /* this worker's counters (a slot of all_stats) */
    server_stats_t *all_stats;     /* every worker's counters, shared memory; /metrics sums them */
    int worker;                    /* 0-based worker number */
    int n_workers;
    uint64_t started_ms;
} server_t;

static server_t *server;

/* Agent requests the worker's backends still serve, removed ones included. */
static uint64_t server_exchanges(const server_t *s)
{
    uint64_t n = 0;
    for (size_t i = 0; i < s->n_backends; i++)
        n += backend_exchanges(s->backends[i]);
    for (size_t i = 0; i < s->n_retired; i++)
        n += backend_exchanges(s->retired[i].backend);
    return n;
}

/* The front end that replaces the listeners (idemgw stdio), or NULL. */
static const serve_front_t *worker_front;

/* Called whenever in-flight work ends; finishes a drain when nothing is left. */
static void server_check_drained(void);

/* Finished results kept in memory for replays; bounded both ways. */

/* A worker's exit status when it could not listen: the supervisor gives up, not retries. */
#define WORKER_START_FAILED 3

/* Admin connections open at once (probes and scrapers), apart from max_connections. */
#define ADMIN_MAX_CONNECTIONS 16

/* The listeners' sites; their handler contexts are set once the worker has made them. The
 * admin listener has connections of its own, so agents at max_connections never lock out a
 * health check, and /metrics counts agents only. */
static http_limits_t http_limits, admin_limits;
static http_context_t conns, admin_conns;
static server_stats_t admin_stats; /* the admin connections' counters, reported nowhere */

static void conn_closed(void *arg)
{
    server_check_drained();
}

/* Errors the MCP listener's connections answer themselves are JSON-RPC errors. */
static char *mcp_error_writer(const char *message)
{
    return mcp_error_body(NULL, -32600, message);
}

static http_site_t mcp_site = {
    .ctx = &conns,
    .handler = routes_handle,
    .name = "mcp",
    .error_body = mcp_error_writer,
    .error_type = "application/json",
};

/* A connection another worker handed over (arg: the site it belongs to). */
static void adopt_conn(void *arg, int fd, const char *bytes, size_t len)
{
    http_conn_adopt(fd, arg, bytes, len);
}
static admin_ctx_t admin_ctx;
static http_site_t admin_site = {
    .ctx = &admin_conns,
    .handler = admin_handle,
    .arg = &admin_ctx,
    .name = "admin",
};
static struct event *drain_timer;

/* Descriptors a worker needs besides agent and upstream connections: stdio, epoll, signal and
 * timer plumbing, the listeners, handoff sockets, a few admin requests. */
#define FD_FIXED_RESERVE 32
/* How long accepting pauses when the process or the system is out of descriptors. */
#define ACCEPT_PAUSE_MS 100

/* The open file limit after raising it (0: unknown, no clamp). */
static rlim_t fd_limit;
static struct event *accept_resume;
static bool accept_paused; /* an EMFILE/ENFILE episode is on: logged once */

/* The soft descriptor limit goes up to the hard one: a proxy holds two per request. */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    rlim_t want = rl.rlim_max == RLIM_INFINITY ? (rlim_t)1 << 20 : rl.rlim_max;
    if (rl.rlim_cur < want) {
        struct rlimit up = {want, rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &up) == 0)
            rl.rlim_cur = want;
    }
    fd_limit = rl.rlim_cur;
}

/* The warnings of the configuration loaded last, so a reload says only what is new. */
static warn_memo_t *config_warnings;

static void config_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A warning about the configuration: logged once per change, not on every reload. */
static void config_warn(const char *fmt, ...)
{
    char text[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    if (!config_warnings || warn_memo_fresh(config_warnings, text))
        log_warn(0, "%s", text);
}

/* Every agent connection may hold an upstream connection too; the store's connections, the
 * idle upstream pool and the fixed reserve come first. What is left, halved, is how many agent
 * connections the descriptors allow. */
static void clamp_connections(config_t *cfg, bool say)
{
    if (!fd_limit)
        return;
    /* the embedded store: the file, its -wal and -shm, the lock, the eventfd */
    const store_backend_t *backend = store_backend_for(cfg->store_kind);
    int store_fds = backend ? backend->fds(cfg->store_pool) : 0;
    long long reserve = FD_FIXED_RESERVE + store_fds + cfg->upstream_pool;
    long long allowed = ((long long)fd_limit - reserve) / 2;
    if (allowed < 1)
        allowed = 1;
    if (cfg->max_connections <= allowed)
        return;
    if (say)
        config_warn(
            "max_connections lowered from %d to %lld: the open file limit is %llu, %lld kept "
            "for the store, the upstream pool and the gateway, and each agent connection "
            "may need an upstream one (raise the limit with ulimit -n or LimitNOFILE)",
            cfg->max_connections, allowed, (unsigned long long)fd_limit, reserve);
    cfg->max_connections = (int)allowed;
}

static void resume_accepting(evutil_socket_t fd, short what, void *arg)
{
    if (server->draining)
        return;
    if (server->listener)
        evconnlistener_enable(server->listener);
    if (server->admin_listener)
        evconnlistener_enable(server->admin_listener);
}

/* accept() failed. Out of descriptors, libevent would retry at once, forever: pause
 * accepting briefly instead (the connections waiting stay in the backlog), log the episode
 * once. */
static void on_accept_error(struct evconnlistener *l, void *arg)
{
    int err = EVUTIL_SOCKET_ERROR();
    if (err != EMFILE && err != ENFILE && err != ENOBUFS && err != ENOMEM) {
        log_warn(0, "accept: %s", evutil_socket_error_to_string(err));
        return;
    }
    if (!accept_paused)
        log_warn(0,
                 "out of file descriptors (%s): pausing new connections; %llu agent connections "
                 "open, open file limit %llu",
                 evutil_socket_error_to_string(err), (unsigned long long)conns.open,
                 (unsigned long long)fd_limit);
    accept_paused = true;
    evconnlistener_disable(l);
    struct timeval tv = {0, ACCEPT_PAUSE_MS * 1000};
    evtimer_add(accept_resume, &tv);
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                      int socklen, void *arg)
{
    if (accept_paused)
        log_debug(0, "descriptors available again: accepting");
    accept_paused = false;
    http_conn_accept(l, fd, sa, socklen, arg);
}

/* libevent's own messages, as our log lines rather than bare lines on stderr. */
static void on_libevent_log(int severity, const char *msg)
{
    log_level_t level = severity == EVENT_LOG_DEBUG  ? LOG_DEBUG
                        : severity == EVENT_LOG_MSG  ? LOG_INFO
                        : severity == EVENT_LOG_WARN ? LOG_WARN
                                                     : LOG_ERROR;
    LOG_AT(level, 0, NULL, "libevent: %s", msg);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: idemgw [-c FILE]                 run the gateway\n"
            "       idemgw --check-config -c FILE    validate the configuration and exit\n"
            "       idemgw key --subject S --tool T --args JSON [--header-key K] [-c FILE]\n"
            "                  [--server NAME]       print the idempotency key of a call\n"
            "       idemgw keys list [--state unknown] [--server NAME] [--json] | keys show HASH\n"
            "       idemgw keys resolve HASH --succeeded --result-file F | --failed | --forget\n"
            "                  [--note TEXT]         the outcomes waiting for an operator\n"
            "       idemgw tools [-c FILE] [--server NAME] [-H 'Name: value']...\n"
            "                                        the upstream's tools and their classes\n"
            "       idemgw policy init --upstream URL | policy diff [-c FILE]\n"
            "       idemgw policy init|diff -c FILE --server NAME\n"
            "                                        a policy from the server; its drift\n"
            "       idemgw health [HOST:PORT]            is the gateway there? (GET /healthz)\n"
            "       idemgw report [-c FILE] [--since 24h] [--top N] [--server NAME] [--json]\n"
            "                                        protected calls and duplicates per tool\n"
            "       idemgw stdio [-c FILE] [-H 'Name: value']... [--log-file F] [-- CMD ARGS...]\n"
            "                                        wrap a stdio server for a desktop agent\n"
            "       idemgw --version | --help\n"
            "\n"
            "A config file is optional when IDEMGW_UPSTREAM is set. Environment overrides:\n"
            "IDEMGW_LISTEN, IDEMGW_ADMIN_LISTEN, IDEMGW_UPSTREAM, IDEMGW_DATABASE_URL,\n"
            "IDEMGW_LOG_LEVEL; libpq's PG* variables also apply to the database.\n");
}

static void print_errors(const config_errors_t *errs)
{
    for (size_t i = 0; i < errs->n; i++)
        fprintf(stderr, "%s\n", errs->msgs[i]);
}

static void server_check_drained(void)
{
    /* a call finished from a GET stream is written after its exchange ended: wait for it */
    if (server->draining && server_exchanges(server) == 0 && conns.open == 0 &&
        admin_conns.open == 0 && store_outstanding(server->store) == 0) {
        log_info(0, "drained: exiting");
        event_base_loopexit(server->base, NULL);
    }
}

static void store_settled(void *arg)
{
    server_check_drained();
}

static void drain_timeout(evutil_socket_t fd, short what, void *arg)
{
    log_warn(0, "drain timeout: %llu requests still in flight, exiting",
             (unsigned long long)server_exchanges(server));
    event_base_loopexit(server->base, NULL);
}

static void server_drain(const char *why)
{
    if (server->draining)
        return;
    log_info(0, "%s: draining (up to %llu ms)", why,
             (unsigned long long)server->cfg->drain_timeout_ms);
    server->draining = true;
    /* Close both ports at once, so a replacement process can bind them and new connections
     * go there, not into a backlog nobody serves; a readiness probe now fails. Connections
     * already open are served to their end. */
    if (server->listener) {
        evconnlistener_free(server->listener);
        server->listener = NULL;
        log_info(0, "stopped listening on %s:%u", server->cfg->listen.host,
                 server->cfg->listen.port);
    }
    if (server->admin_listener) {
        evconnlistener_free(server->admin_listener);
        server->admin_listener = NULL;
    }
    http_conn_close_idle(&conns);
    http_conn_close_idle(&admin_conns);
    for (size_t i = 0; i < server->n_backends; i++)
        backend_drain(server->backends[i]);
    uint64_t ms = server->cfg->drain_timeout_ms;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
    drain_timer = evtimer_new(server->base, drain_timeout, NULL);
    evtimer_add(drain_timer, &tv);
    server_check_drained();
}

static void on_sigterm(evutil_socket_t sig, short what, void *arg)
{
    char why[32];
    snprintf(why, sizeof(why), "signal %d", (int)sig);
    server_drain(why);
}

/* What a front end may do to the gateway (serve.h). */
static void front_adopt(int fd)
{
    http_conn_adopt(fd, &mcp_site, NULL, 0);
}

static void front_drain(void)
{
    server_drain("the front end ended");
}

static const serve_gateway_t front_gateway = {.adopt = front_adopt, .drain = front_drain};

static void report_restart_key(const char *name, void *arg)
{
    config_warn("reload: %s needs a restart; the running value stays", name);
}

/* What the upstream pool reads at each use; refreshed by a reload. */
static upstream_limits_t upstream_limits;

static void apply_http_limits(const config_t *cfg)
{
    http_limits = (http_limits_t){
        .max_header_bytes = cfg->max_header_bytes,
        .max_body_bytes = cfg->max_body_bytes,
        .header_timeout_ms = cfg->client_header_timeout_ms,
        .body_timeout_ms = cfg->client_body_timeout_ms,
        .idle_timeout_ms = cfg->client_idle_timeout_ms,
        .max_connections = cfg->max_connections,
    };
    admin_limits = http_limits;
    admin_limits.max_connections = ADMIN_MAX_CONNECTIONS;
}

static void apply_upstream_limits(const config_t *cfg)
{
    upstream_limits = (upstream_limits_t){
        .connect_timeout_ms = cfg->upstream_connect_timeout_ms,
        .timeout_ms = cfg->upstream_timeout_ms,
        .idle_timeout_ms = cfg->upstream_idle_timeout_ms,
        .pool = cfg->upstream_pool,
    };
}

/* A reload's listen_tls: a new context for new connections (open ones keep theirs). One that
 * cannot be made keeps the running one. */
static void reload_listen_tls(const config_t *neu)
{
    if (!neu->listen_tls.enabled) {
        if (server->listen_tls)
            log_warn(0, "reload: listen_tls removed: new agent connections are plain HTTP");
        SSL_CTX_free(server->listen_tls);
        server->listen_tls = NULL;
        mcp_site.tls = NULL;
        return;
    }
    char msg[512];
    struct ssl_ctx_st *tls = tls_listen_new(&neu->listen_tls, msg, sizeof(msg));
    if (!tls) {
        log_error(0, "reload: %s; %s", msg,
                  server->listen_tls ? "keeping the running certificate"
                                     : "agent connections stay plain HTTP");
        return;
    }
    SSL_CTX_free(server->listen_tls);
    server->listen_tls = tls;
    mcp_site.tls = tls;
    log_info(0, "reload: listen_tls certificate loaded from %s", neu->listen_tls.cert_file);
}

/* The routes to the backends, from their configurations. */
static void set_routes(server_t *s)
{
    route_t *rt = xcalloc(s->n_backends, sizeof(*rt));
    for (size_t i = 0; i < s->n_backends; i++) {
        const config_t *c = backend_config(s->backends[i]);
        rt[i] = (route_t){.name = c->server_name,
                          .agent_path = c->agent_path,
                          .prefix = c->agent_prefix ? c->agent_prefix : "",
                          .upstream_path = c->upstream_path,
                          .proxy = backend_proxy(s->backends[i])};
    }
    routes_set(s->routes, rt, s->n_backends);
    free(rt);
}

/* What /readyz probes and /metrics reports of the upstreams: every backend's, named as its
 * server (the names are the running configuration's, which outlives the array). */
static admin_server_t admin_server_of(const backend_t *b)
{
    return (admin_server_t){.name = backend_config(b)->server_name,
                            .pool = backend_pool(b),
                            .upstream = backend_upstream(b)};
}

static void set_admin_upstreams(server_t *s)
{
    admin_server_t *v = xcalloc(s->n_backends ? s->n_backends : 1, sizeof(*v));
    for (size_t i = 0; i < s->n_backends; i++)
        v[i] = admin_server_of(s->backends[i]);
    free(s->admin_servers);
    s->admin_servers = v;
    admin_ctx.servers = v;
    admin_ctx.n_servers = s->n_backends;
    admin_server_t *r = xcalloc(s->n_retired ? s->n_retired : 1, sizeof(*r));
    for (size_t i = 0; i < s->n_retired; i++)
        r[i] = admin_server_of(s->retired[i].backend);
    free(s->admin_retired);
    s->admin_retired = r;
    admin_ctx.retired = r;
    admin_ctx.n_retired = s->n_retired;
}

/* Frees the removed backends that have served their last request, and a configuration no
 * backend reads any more. */
static void reap_retired(server_t *s)
{
    size_t before = s->n_retired;
    for (size_t i = 0; i < s->n_retired;) {
        retired_t r = s->retired[i];
        if (backend_exchanges(r.backend) > 0) {
            i++;
            continue;
        }
        log_info(0, "server %s removed by a reload: its last request has ended",
                 backend_config(r.backend)->server_name ? backend_config(r.backend)->server_name
                                                        : "(the upstream)");
        backend_free(r.backend);
        s->retired[i] = s->retired[--s->n_retired];
        bool still_read = r.cfg == s->cfg;
        for (size_t j = 0; j < s->n_retired; j++)
            still_read |= s->retired[j].cfg == r.cfg;
        if (!still_read)
            config_free(r.cfg);
    }
    if (s->n_retired != before)
        set_admin_upstreams(s); /* /metrics no longer counts the freed ones' children */
}

/* The backend of the running configuration for server view neu: the one of that name, or the
 * only one without servers:. */
static backend_t *running_backend(const server_t *s, const config_t *neu)
{
    for (size_t i = 0; i < s->n_backends; i++) {
        const char *name = backend_config(s->backends[i])->server_name;
        if ((!name && !neu->server_name) ||
            (name && neu->server_name && strcmp(name, neu->server_name) == 0))
            return s->backends[i];
    }
    return NULL;
}

/* A reload's servers: a server whose upstream stays keeps its backend (connections, children,
 * catalogue) with the new policy; a new or changed one gets a backend of its own; a removed or
 * replaced one serves its requests in flight, then is freed. Every new backend is opened
 * before anything changes: false (nothing changed) when one cannot be. */
static bool reload_servers(server_t *s, config_t *neu, config_t *old)
{
    size_t n = config_n_servers(neu);
    backend_t **next = xcalloc(n, sizeof(*next));
    bool *reused = xcalloc(s->n_backends + 1, sizeof(*reused));
    char msg[512];
    for (size_t i = 0; i < n; i++) {
        config_t *view = config_server(neu, i);
        backend_t *b = running_backend(s, view);
        if (b && backend_same_upstream(b, view)) {
            next[i] = b;
            continue;
        }
        if (!(next[i] = backend_open(&s->env, view, msg, sizeof(msg)))) {
            log_error(0, "reload: server %s: %s", view->server_name ? view->server_name : "",
                      msg);
            for (size_t j = 0; j < i; j++)
                if (!running_backend(s, config_server(neu, j)) ||
                    next[j] != running_backend(s, config_server(neu, j)))
                    backend_free(next[j]);
            free(next);
            free(reused);
            return false;
        }
        log_info(0, "reload: server %s: %s upstream %s",
                 view->server_name ? view->server_name : "(the only one)",
                 b ? "new" : "added, with", view->upstream_url);
    }
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < s->n_backends; j++)
            if (next[i] == s->backends[j]) {
                reused[j] = true;
                backend_reconfigure(next[i], config_server(neu, i));
            }
    for (size_t j = 0; j < s->n_backends; j++) {
        if (reused[j])
            continue;
        backend_t *b = s->backends[j];
        const char *name = backend_config(b)->server_name;
        log_info(0, "reload: server %s %s: %llu requests in flight finish on it",
                 name ? name : "(the only one)",
                 name && config_server_named(neu, name) ? "changed its upstream" : "removed",
                 (unsigned long long)backend_exchanges(b));
        backend_drain(b);
        s->retired = xrealloc(s->retired, (s->n_retired + 1) * sizeof(*s->retired));
        s->retired[s->n_retired++] = (retired_t){b, old};
    }
    free(s->backends);
    free(reused);
    s->backends = next;
    s->n_backends = n;
    set_routes(s);
    set_admin_upstreams(s);
    for (size_t i = 0; i < n; i++)
        backend_start_fetch(s->backends[i]);
    return true;
}

static void on_sighup(evutil_socket_t sig, short what, void *arg)
{
    const char *path = arg;
    config_errors_t errs = {0};
    config_t *neu = config_load(path, &errs);
    if (!neu) {
        for (size_t i = 0; i < errs.n; i++)
            log_error(0, "reload: %s", errs.msgs[i]);
        log_error(0, "reload failed: keeping the running configuration");
        config_errors_free(&errs);
        return;
    }
    if (!server->cfg->n_servers != !neu->n_servers) {
        log_error(0, "reload failed: a change between one upstream and servers: needs a "
                     "restart; keeping the running configuration");
        config_free(neu);
        return;
    }
    warn_memo_begin(config_warnings);
    /* settings that need a restart are named and keep their running values */
    config_reload_merge(server->cfg, neu, report_restart_key, NULL);
    config_t *old = server->cfg;
    if (!reload_servers(server, neu, old)) {
        log_error(0, "reload failed: keeping the running configuration");
        config_free(neu);
        return;
    }
    clamp_connections(neu, true);
    server->cfg = neu;
    apply_upstream_limits(neu);
    apply_http_limits(neu);
    subject_reconfigure(server->subject, &neu->subject);
    reload_listen_tls(neu);
    admin_ctx.store_missing = !server->store && config_needs_store(neu);
    admin_ctx.token_file = neu->admin_token_file;
    log_threshold = (log_level_t)neu->log_level;
    bool still_read = false;
    for (size_t j = 0; j < server->n_retired; j++)
        still_read |= server->retired[j].cfg == old;
    if (!still_read)
        config_free(old);
    reap_retired(server);
    log_info(0, "configuration reloaded from %s", path ? path : "the environment");
}

static void on_reap_retired(evutil_socket_t fd, short what, void *arg)
{
    reap_retired(arg);
    server_check_drained();
}

static void exchange_ended(void *arg)
{
    /* a removed server's last exchange ends inside its own router's callback: the backend is
     * freed on the next turn of the loop */
    if (server->n_retired) {
        struct timeval now = {0, 0};
        evtimer_add(server->reap_retired, &now);
    }
    server_check_drained();
}

/* The MCP servers behind the gateway, each a backend with its upstream and stages, and the
 * routes to them. */
static bool open_servers(server_t *s)
{
    apply_upstream_limits(s->cfg);
    s->env = (backend_env_t){
        .base = s->base,
        .store = s->store,
        .cache = s->cache,
        .subject = s->subject,
        .guard = s->guard,
        .tracer = s->tracer,
        .stats = s->stats,
        .limits = &upstream_limits,
        .worker = s->worker,
        .n_workers = s->n_workers,
        .draining = &s->draining,
        .fetch_catalog = !worker_front,
        .exchange_ended = exchange_ended,
    };
    s->routes = routes_new();
    s->reap_retired = evtimer_new(s->base, on_reap_retired, s);
    size_t n = config_n_servers(s->cfg);
    s->backends = xcalloc(n, sizeof(*s->backends));
    for (size_t i = 0; i < n; i++) {
        config_t *view = config_server(s->cfg, i);
        char msg[512] = "";
        backend_t *b = backend_open(&s->env, view, msg, sizeof(msg));
        if (!b) {
            fprintf(stderr, "idemgw: %s%s%s%s\n", view->server_name ? "server " : "",
                    view->server_name ? view->server_name : "", view->server_name ? ": " : "",
                    msg);
            return false;
        }
        s->backends[s->n_backends++] = b;
    }
    set_routes(s);
    return true;
}

/* shared: SO_REUSEPORT, for the workers of one gateway on its agent port. Never otherwise:
 * a second gateway started on a port by mistake must fail, not silently take half of its
 * connections. (A replacement binds once this process has closed its ports at SIGTERM.) */
static struct evconnlistener *listen_on(const host_port_t *hp, http_site_t *site, bool shared)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    char port[8];
    snprintf(port, sizeof(port), "%u", hp->port);
    int rc = getaddrinfo(hp->host && *hp->host ? hp->host : NULL, port, &hints, &res);
    if (rc != 0) {
        fprintf(stderr, "idemgw: cannot resolve %s: %s\n", hp->host, gai_strerror(rc));
        return NULL;
    }
    struct evconnlistener *l = evconnlistener_new_bind(server->base, on_accept, site,
                                                       LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC |
                                                           (shared ? LEV_OPT_REUSEABLE_PORT : 0),
                                                       1024, res->ai_addr, (int)res->ai_addrlen);
    freeaddrinfo(res);
    if (l)
        evconnlistener_set_error_cb(l, on_accept_error);
    if (!l)
        fprintf(stderr, "idemgw: cannot listen on %s:%u (%s): %s\n", hp->host, hp->port, site->name,
                evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
    return l;
}

/* A worker's server: its event loop and the caches that need no configuration check.
 * Takes ownership of cfg. */
static server_t *server_new(config_t *cfg, int worker, int n_workers, server_stats_t *all_stats)
{
    server_t *s = xcalloc(1, sizeof(*s));
    s->cfg = cfg;
    s->worker = worker;
    s->n_workers = n_workers;
    s->all_stats = all_stats;
    s->stats = &all_stats[worker];
    if (n_workers > 1)
        log_worker = worker + 1;
    /* the changelist folds the enable/disable pairs of a request's writes into one epoll_ctl */
    struct event_config *ec = event_config_new();
    event_config_set_flag(ec, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
    s->base = event_base_new_with_config(ec);
    event_config_free(ec);
    s->started_ms = util_now_ms();
    accept_resume = evtimer_new(s->base, resume_accepting, NULL);
    config_warnings = warn_memo_new();
    clamp_connections(cfg, true);
    s->cache = replay_cache_new((size_t)cfg->cache_entries, (size_t)cfg->cache_bytes);
    s->guard = resume_guard_new();
    return s;
}

/* The key store database_url names (store_open.h), or none: then only a policy that needs no
 * store works, which is said once here. */
static bool open_store(server_t *s)
{
    config_t *cfg = s->cfg;
    char msg[512] = "";
    if (!cfg->store_enabled) {
        if (config_needs_store(cfg))
            log_warn(0, "no database configured (database_url: none): calls to non_idempotent "
                        "tools are refused (store_not_configured) and /readyz says not ready; "
                        "remove database_url: none for the embedded store, set it to Postgres, "
                        "or set on_store_down: passthrough to forward them unprotected");
        else
            log_info(0, "no database configured (database_url: none): no tool needs it (none "
                        "is non_idempotent with on_store_down: reject)");
        return true;
    }
    store_open_opts_t so = {
        .common = {.timeout_ms = cfg->store_timeout_ms,
                   .migrate = cfg->migrate,
                   .sweep_interval_ms = cfg->sweep_interval_ms,
                   .sweep_batch = 1000},
        .pg = {.pool_size = cfg->store_pool,
               .group_commit = cfg->store_group_commit,
               .durable_finish = cfg->store_durable_finish,
               .commit_delay_us = cfg->store_commit_delay_ms * 1000},
        .sqlite = {.durable_finish = cfg->store_durable_finish,
                   .peers = cfg->store_peers,
                   .commit_delay_us = cfg->store_commit_delay_ms * 1000},
    };
    /* the default file's folders (~/.local/state/idemgw, ...) may not exist yet; a file the
     * operator named is theirs to place */
    const store_backend_t *backend = store_backend_for(cfg->store_kind);
    if (backend->local_file && !cfg->database_url &&
        util_mkdir_parents(cfg->store_target, 0700, msg, sizeof(msg)) != 0) {
        fprintf(stderr,
                "idemgw: store: %s, for the embedded store's default file %s; name another "
                "file with database_url: sqlite:PATH (or IDEMGW_DATABASE_URL)\n",
                msg, cfg->store_target);
        return false;
    }
    s->store = store_open(backend, s->base, cfg->store_target, &so, msg, sizeof(msg));
    if (!s->store) {
        fprintf(stderr, "idemgw: store: %s\n", msg);
        return false;
    }
    backend->opened(cfg->store_target, cfg->database_url != NULL, &so);
    store_observe(s->store, s->stats, s->base);
    store_on_settled(s->store, store_settled, NULL);
    return true;
}

/* Who calls (subject.h), where spans go (OTLP), and the agents' TLS (listen_tls). */
static bool open_callers_side(server_t *s)
{
    const config_t *cfg = s->cfg;
    char msg[512] = "";
    s->subject = subject_new(s->base, &cfg->subject, msg, sizeof(msg));
    if (!s->subject) {
        fprintf(stderr, "idemgw: subject: %s\n", msg);
        return false;
    }
    if (cfg->otlp.url) {
        s->tracer =
            tracer_new(s->base, &cfg->otlp, cfg->otlp_sample_ratio, s->stats, msg, sizeof(msg));
        if (!s->tracer) {
            fprintf(stderr, "idemgw: otlp_endpoint: %s\n", msg);
            return false;
        }
        log_info(0, "traces: OTLP/HTTP JSON to %s", cfg->otlp.url);
    }
    if (cfg->listen_tls.enabled) {
        s->listen_tls = tls_listen_new(&cfg->listen_tls, msg, sizeof(msg));
        if (!s->listen_tls) {
            fprintf(stderr, "idemgw: %s\n", msg);
            return false;
        }
        mcp_site.tls = s->listen_tls;
        if (s->n_workers > 1 && s->worker == 0)
            log_info(0,
                     "listen_tls with %d workers: a TLS connection cannot move between "
                     "workers, so a stream resume (Last-Event-ID) is served only when it "
                     "reaches the worker reading that stream; elsewhere it goes to the "
                     "upstream as when no hand-off is possible",
                     s->n_workers);
    }
    return true;
}

/* The listeners' connection contexts and the admin endpoints' view of the worker. */
static void wire_sites(server_t *s)
{
    mcp_site.arg = s->routes;
    apply_http_limits(s->cfg);
    conns = (http_context_t){
        .base = s->base,
        .limits = &http_limits,
        .stats = s->stats,
        .draining = &s->draining,
        .on_close = conn_closed,
    };
    admin_conns = (http_context_t){
        .base = s->base,
        .limits = &admin_limits,
        .stats = &admin_stats,
        .draining = &s->draining,
        .serve_while_draining = true,
        .on_close = conn_closed,
    };
    admin_ctx = (admin_ctx_t){
        .store = s->store,
        .all_stats = s->all_stats,
        .n_workers = s->n_workers,
        .draining = &s->draining,
        .store_missing = !s->store && config_needs_store(s->cfg),
        .token_file = s->cfg->admin_token_file,
    };
    set_admin_upstreams(s);
}

/* The agents' port (shared by the workers, which hand connections to each other) and, in the
 * first worker only, the admin port. */
static bool open_listeners(server_t *s)
{
    const config_t *cfg = s->cfg;
    s->listener = listen_on(&cfg->listen, &mcp_site, s->n_workers > 1);
    if (s->n_workers > 1)
        handoff_start(s->base, s->worker, adopt_conn, &mcp_site);
    /* one admin endpoint; /metrics sums every worker's counters from shared memory */
    if (s->worker == 0)
        s->admin_listener = listen_on(&cfg->admin_listen, &admin_site, false);
    return s->listener && (s->worker != 0 || s->admin_listener);
}

/* Signals, the first catalogue fetch, then the loop until the worker has drained. */
static void run_loop(server_t *s, const char *path)
{
    const config_t *cfg = s->cfg;
    struct event *ev_term = evsignal_new(s->base, SIGTERM, on_sigterm, NULL);
    struct event *ev_int = evsignal_new(s->base, SIGINT, on_sigterm, NULL);
    struct event *ev_hup = evsignal_new(s->base, SIGHUP, on_sighup, (void *)path);
    evsignal_add(ev_term, NULL);
    evsignal_add(ev_int, NULL);
    if (!worker_front) /* a front end's config is the file and more: the file alone cannot replace
                          it */
        evsignal_add(ev_hup, NULL);
    for (size_t i = 0; i < s->n_backends; i++)
        backend_start_fetch(s->backends[i]);

    if (cfg->subject.kind == SUBJECT_DEFAULT && !worker_front)
        log_info(0, "subject not configured: callers are told apart by the SHA-256 of their "
                    "Authorization header (a bearer token's, as subject bearer-...); requests "
                    "without one share the subject \"" SUBJECT_SHARED_NAME "\". Configure "
                    "subject when an auth proxy in front names the caller");
    if (worker_front)
        log_info(0, "idemgw %s serving stdin and stdout, upstream %s, store %s", IDEMGW_VERSION,
                 cfg->upstream_url, s->store ? store_backend_name(s->store) : "not configured");
    else if (!cfg->n_servers)
        log_info(0, "idemgw %s listening on %s:%u%s (admin %s:%u), upstream %s, store %s",
                 IDEMGW_VERSION, cfg->listen.host, cfg->listen.port,
                 s->listen_tls ? " with TLS" : "", cfg->admin_listen.host, cfg->admin_listen.port,
                 cfg->upstream_url, s->store ? store_backend_name(s->store) : "not configured");
    else
        log_info(0, "idemgw %s listening on %s:%u%s (admin %s:%u), %zu servers, store %s",
                 IDEMGW_VERSION, cfg->listen.host, cfg->listen.port,
                 s->listen_tls ? " with TLS" : "", cfg->admin_listen.host, cfg->admin_listen.port,
                 cfg->n_servers, s->store ? store_backend_name(s->store) : "not configured");
    for (size_t i = 0; i < cfg->n_servers; i++)
        log_info(0, "server %s at %s: upstream %s", cfg->servers[i]->server_name,
                 cfg->servers[i]->agent_path, cfg->servers[i]->upstream_url);
    event_base_dispatch(s->base);
    /* the spans of the last requests are still held: send them, within a short deadline */
    tracer_drain(s->tracer, TRACE_EXIT_MS);

    event_free(ev_term);
    event_free(ev_int);
    event_free(ev_hup);
}

/* Everything the worker opened, in an order where nothing is freed before its users. */
static void server_free(server_t *s)
{
    if (worker_front)
        worker_front->stop(worker_front->arg);
    if (drain_timer)
        event_free(drain_timer);
    event_free(accept_resume);
    if (s->listener)
        evconnlistener_free(s->listener);
    if (s->admin_listener)
        evconnlistener_free(s->admin_listener);
    if (s->store)
        store_free(s->store);
    for (size_t i = 0; i < s->n_backends; i++)
        backend_free(s->backends[i]);
    free(s->backends);
    admin_ctx.servers = NULL;
    admin_ctx.n_servers = 0;
    admin_ctx.retired = NULL;
    admin_ctx.n_retired = 0;
    free(s->admin_servers);
    free(s->admin_retired);
    for (size_t i = 0; i < s->n_retired; i++) {
        backend_free(s->retired[i].backend);
        bool later = false; /* a configuration several removed backends read is freed once */
        for (size_t j = i + 1; j < s->n_retired; j++)
            later |= s->retired[j].cfg == s->retired[i].cfg;
        if (!later && s->retired[i].cfg != s->cfg)
            config_free(s->retired[i].cfg);
    }
    free(s->retired);
    if (s->reap_retired)
        event_free(s->reap_retired);
    routes_free(s->routes);
    subject_free(s->subject);
    alerts_free(s->alerts);
    tracer_free(s->tracer);
    replay_cache_free(s->cache);
    resume_guard_free(s->guard);
    warn_memo_free(config_warnings);
    config_warnings = NULL;
    /* open connections hold references of their own */
    SSL_CTX_free(s->listen_tls);
    mcp_site.tls = NULL;
    /* give deferred frees scheduled during shutdown a last turn */
    event_base_loop(s->base, EVLOOP_NONBLOCK);
    handoff_stop();
    event_base_free(s->base);
    config_free(s->cfg);
    free(s);
}

/* The webhook of alerts.webhook_url, polled by the worker that serves the admin listener. */
static bool open_alerts(server_t *s)
{
    const config_t *cfg = s->cfg;
    if (!cfg->alerts_webhook_url || s->worker != 0)
        return true;
    if (!s->store) {
        log_warn(0, "alerts: alerts.webhook_url is set but there is no store: no alerts");
        return true;
    }
    char msg[512] = "";
    s->alerts = alerts_new(s->base, s->store, cfg->alerts_webhook_url,
                           (alerts_format_t)cfg->alerts_webhook_format,
                           cfg->alerts_webhook_timeout_ms, msg, sizeof(msg));
    if (!s->alerts) {
        fprintf(stderr, "idemgw: %s\n", msg);
        return false;
    }
    log_info(0, "alerts: keys that become unknown are posted to the webhook");
    return true;
}

/* One worker: its own event loop, listener, upstream pool, store connections and caches.
 * Takes ownership of cfg. 0 once drained; 1 when something could not be opened;
 * WORKER_START_FAILED when a port could not be bound. */
static int run_worker(config_t *cfg, const char *path, int worker, int n_workers,
                      server_stats_t *all_stats)
{
    server = server_new(cfg, worker, n_workers, all_stats);
    int rc = 1;
    if (!open_store(server) || !open_callers_side(server) || !open_servers(server))
        goto out;
    wire_sites(server);
    if (worker_front) {
        /* no listeners: the front end's connections are the only agent */
        if (worker_front->start(worker_front->arg, server->base, server->cfg, &front_gateway) != 0)
            goto out;
    } else if (!open_listeners(server)) {
        rc = WORKER_START_FAILED;
        goto out;
    } else if (!open_alerts(server)) {
        goto out;
    }
    run_loop(server, path);
    rc = 0;
out:
    server_free(server);
    server = NULL;
    return rc;
}

/* --- several workers: a supervisor process and its children --- */

static pid_t spawn_worker(config_t *cfg, const char *path, int w, int n, server_stats_t *stats,
                          const sigset_t *orig)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    sigprocmask(SIG_SETMASK, orig, NULL);
    _exit(run_worker(cfg, path, w, n, stats));
}

/* Starts cfg->workers workers, forwards SIGTERM / SIGINT / SIGHUP to them, restarts one that
 * dies, and exits when they have all drained. A worker that cannot start stops everything. */
static int supervise(config_t *cfg, const char *path, server_stats_t *stats)
{
    int n = cfg->workers;
    pid_t *pids = xcalloc((size_t)n, sizeof(pid_t));
    uint64_t *started = xcalloc((size_t)n, sizeof(uint64_t));
    sigset_t set, orig;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGCHLD);
    sigprocmask(SIG_BLOCK, &set, &orig);
    for (int w = 0; w < n; w++) {
        pids[w] = spawn_worker(cfg, path, w, n, stats, &orig);
        started[w] = util_now_ms();
    }
    log_info(0, "supervisor: %d workers started", n);
    bool draining = false;
    int rc = 0, alive = n;
    while (alive > 0) {
        int sig = 0;
        if (sigwait(&set, &sig) != 0)
            continue;
        if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP) {
            draining = draining || sig != SIGHUP;
            for (int w = 0; w < n; w++)
                if (pids[w] > 0)
                    kill(pids[w], sig);
            continue;
        }
        int status;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
            int w = 0;
            while (w < n && pids[w] != pid)
                w++;
            if (w == n)
                continue;
            bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
            bool failed_start = WIFEXITED(status) && WEXITSTATUS(status) == WORKER_START_FAILED;
            pids[w] = 0;
            alive--;
            if (draining) {
                if (!clean)
                    rc = 1;
                continue;
            }
            if (failed_start || util_now_ms() - started[w] < 1000) {
                log_error(0, "supervisor: worker %d could not start; stopping", w + 1);
                draining = true;
                rc = 1;
                for (int k = 0; k < n; k++)
                    if (pids[k] > 0)
                        kill(pids[k], SIGTERM);
                continue;
            }
            log_error(0, "supervisor: worker %d ended (%s %d); starting a new one", w + 1,
                      WIFSIGNALED(status) ? "signal" : "status",
                      WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
            memset(&stats[w], 0, sizeof(stats[w]));
            pids[w] = spawn_worker(cfg, path, w, n, stats, &orig);
            started[w] = util_now_ms();
            alive++;
        }
    }
    log_info(0, "supervisor: all workers stopped");
    free(pids);
    free(started);
    config_free(cfg);
    return rc;
}

/* The configuration, or NULL after printing every error as file:line: message. */
static config_t *load_config(const char *path)
{
    config_errors_t errs = {0};
    config_t *cfg = config_load(path, &errs);
    if (!cfg) {
        print_errors(&errs);
        config_errors_free(&errs);
    }
    return cfg;
}

static int run(const char *path)
{
    config_t *cfg = load_config(path);
    if (!cfg)
        return 1;
    log_threshold = (log_level_t)cfg->log_level;
    signal(SIGPIPE, SIG_IGN);
    event_set_log_callback(on_libevent_log);
    raise_fd_limit();
    size_t bytes = sizeof(server_stats_t) * (size_t)cfg->workers;
    server_stats_t *stats =
        mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (stats == MAP_FAILED) {
        fprintf(stderr, "idemgw: cannot map shared counters\n");
        config_free(cfg);
        return 1;
    }
    if (cfg->workers > 1 && handoff_setup(cfg->workers) != 0) {
        munmap(stats, bytes);
        config_free(cfg);
        return 1;
    }
    int rc = cfg->workers == 1 ? run_worker(cfg, path, 0, 1, stats) : supervise(cfg, path, stats);
    munmap(stats, bytes);
    return rc == WORKER_START_FAILED ? 1 : rc;
}

int serve_front_run(config_t *cfg, const char *path, const serve_front_t *f)
{
    static server_stats_t stats;
    log_threshold = (log_level_t)cfg->log_level;
    signal(SIGPIPE, SIG_IGN);
    event_set_log_callback(on_libevent_log);
    raise_fd_limit();
    worker_front = f;
    int rc = run_worker(cfg, path, 0, 1, &stats);
    worker_front = NULL;
    return rc;
}

/* --check-config's line for a config that loads: the tools of each server's policy (its own
 * and those it takes from the top level), since with servers: the top level's alone say little
 * (none at all when every server names its own). */
static void print_check(const config_t *cfg, const char *path)
{
    const char *what = path ? path : "environment";
    if (!cfg->n_servers) {
        printf("%s: configuration ok (%zu tools)\n", what, cfg->policy.n_tools);
        return;
    }
    printf("%s: configuration ok (%zu server%s; tools in each server's policy, its own and the "
           "top level's:",
           what, cfg->n_servers, cfg->n_servers == 1 ? "" : "s");
    for (size_t i = 0; i < cfg->n_servers; i++) {
        const config_t *sv = config_server(cfg, i);
        printf("%s %s %zu", i ? "," : "", sv->server_name, sv->policy.n_tools);
    }
    printf(")\n");
}

int main(int argc, char **argv)
{
    event_mem_init(); /* before any other libevent call */
    if (argc > 1 && strcmp(argv[1], "key") == 0)
        return key_cmd_main(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "keys") == 0)
        return keys_cmd_main(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "tools") == 0)
        return tools_cmd_main(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "policy") == 0)
        return policy_cmd_main(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "health") == 0)
        return health_cmd_main(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "report") == 0)
        return report_cmd_main(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "stdio") == 0)
        return stdio_cmd_main(argc - 1, argv + 1, serve_front_run);

    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"check-config", no_argument, NULL, 'k'},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *path = NULL;
    bool check = false;
    int c;
    while ((c = getopt_long(argc, argv, "c:hV", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            path = optarg;
            break;
        case 'k':
            check = true;
            break;
        case 'V':
            printf("idemgw %s\n", IDEMGW_VERSION);
            return 0;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "idemgw: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (check) {
        config_t *cfg = load_config(path);
        if (!cfg)
            return 1;
        print_check(cfg, path);
        config_free(cfg);
        return 0;
    }
    return run(path);
}
