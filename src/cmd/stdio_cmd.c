/* `idemgw stdio` (see include/stdio_cmd.h): the configuration a wrapper runs with, and the
 * front end serve.h runs in place of the listeners. */
#include "stdio_cmd.h"

#include "config.h"
#include "log.h"
#include "serve.h"
#include "stdio_args.h"
#include "stdio_front.h"
#include "store_open.h"
#include "upstream_stdio.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

#define EXIT_FAILED 1
#define EXIT_USAGE 2

/* A wrapper's session lasts as long as the wrapper: the stdio upstream's idle timeout would
 * end it (and stop the server) under a client that cannot start another. */
#define SESSION_FOREVER_MS (100ULL * 365 * 24 * 3600 * 1000)

/* The loader insists on an upstream; the command replaces this stand-in right after. */
#define UPSTREAM_STAND_IN "http://127.0.0.1:9/mcp"

/* Connections into the gateway: the front's POSTs in flight, its stream and its DELETE. */
#define WRAPPER_MAX_CONNECTIONS 128

typedef struct wrapper {
    stdio_args_t args;
    const serve_gateway_t *gw;
    stdio_front_t *front;
    bool failed; /* the server's session ended under the front */
} wrapper_t;

static void usage(FILE *f)
{
    fputs("usage: idemgw stdio [-c FILE] [-H 'Name: value']... [--log-file FILE] [-- CMD ARGS...]\n"
          "  serves a desktop agent on stdin and stdout: starts CMD (or the upstream of -c FILE)\n"
          "  and relays its JSON-RPC both ways, replaying repeated calls of non_idempotent\n"
          "  tools (the config's tools: and defaults:, else the server's annotations)\n"
          "  -c FILE        the gateway's configuration (policy, database_url, ...); its upstream\n"
          "                 is used when no CMD is given\n"
          "  -H HEADER      a header every request carries, e.g. for subject: {header: ...}\n"
          "  --log-file F   log lines go to F instead of stderr (never to stdout)\n"
          "  the store: database_url from -c FILE, else a file of this command's own,\n"
          "  $XDG_STATE_HOME/idemgw/stdio-NAME-HASH.db (else ~/.local/state/idemgw/...),\n"
          "  shared by the copies of the command running at once (agent windows)\n",
          f);
}

/* --- the configuration --- */

static config_t *load_config(const stdio_args_t *a)
{
    const char *given = getenv("IDEMGW_UPSTREAM");
    char *saved = given ? xstrdup(given) : NULL;
    if (a->command)
        setenv("IDEMGW_UPSTREAM", UPSTREAM_STAND_IN, 1);
    config_errors_t errs = {0};
    config_t *cfg = config_load(a->config, &errs);
    if (saved)
        setenv("IDEMGW_UPSTREAM", saved, 1);
    else
        unsetenv("IDEMGW_UPSTREAM");
    free(saved);
    if (!cfg) {
        for (size_t i = 0; i < errs.n; i++)
            fprintf(stderr, "idemgw stdio: %s\n", errs.msgs[i]);
        if (!a->command)
            fprintf(stderr, "idemgw stdio: give the server's command after '--', or upstream: "
                            "{command: [...]} in the config\n");
        config_errors_free(&errs);
        return NULL;
    }
    if (cfg->n_servers) {
        fprintf(stderr, "idemgw stdio: %s has servers:, and the wrapper serves one agent one "
                        "server; give it a config with upstream: {command: [...]}, or none "
                        "and the command after '--'\n",
                a->config);
        config_free(cfg);
        return NULL;
    }
    if (a->command)
        config_set_upstream_command(cfg, a->command);
    return cfg;
}

static bool env_named(char *const *env, size_t n, const char *entry)
{
    size_t len = strcspn(entry, "=");
    for (size_t i = 0; i < n; i++)
        if (strncmp(env[i], entry, len) == 0 && env[i][len] == '=')
            return true;
    return false;
}

/* The agent's environment is the server's (an agent's "env" setting is meant for it): the
 * child gets all of it, under what the config's upstream.env sets; not the gateway's own
 * IDEMGW_* settings. */
static void pass_environment(stdio_conf_t *s)
{
    size_t n_env = 0;
    while (environ[n_env])
        n_env++;
    char **env = xcalloc(s->n_env + n_env + 1, sizeof(char *));
    size_t n = 0;
    for (size_t i = 0; i < s->n_env; i++)
        env[n++] = s->env[i];
    for (size_t i = 0; i < n_env; i++)
        if (strncmp(environ[i], "IDEMGW_", 7) != 0 && strchr(environ[i], '=') &&
            !env_named(s->env, s->n_env, environ[i]))
            env[n++] = xstrdup(environ[i]);
    free(s->env);
    s->env = env;
    s->n_env = n;
}

/* The PATH the child will search: the config's, else ours. */
static const char *child_path(const stdio_conf_t *s)
{
    for (size_t i = 0; i < s->n_env; i++)
        if (strncmp(s->env[i], "PATH=", 5) == 0)
            return s->env[i] + 5;
    const char *p = getenv("PATH");
    return p && *p ? p : "/usr/local/bin:/usr/bin:/bin";
}

/* One subject for every call, the same in every run: the local user. */
static void fixed_subject(config_t *cfg)
{
    if (cfg->subject.kind != SUBJECT_DEFAULT)
        return;
    struct passwd *pw = getpwuid(getuid());
    free(cfg->subject.value);
    cfg->subject.kind = SUBJECT_STATIC;
    cfg->subject.value = pw && pw->pw_name && *pw->pw_name
                             ? xasprintf("local:%s", pw->pw_name)
                             : xasprintf("local:uid-%u", (unsigned)getuid());
}

/* An embedded store is shared by the wrapper's copies that name its file (two agent windows
 * running one command, or one -c FILE): they are its peers, so a call made in one is claimed
 * for all (store_sqlite.h). Each replays from the file, not from a cache of its own: a cache
 * would keep replaying in one window a result an operator forgot (`idemgw key --forget`) in
 * all of them, and the replays of one agent are few. */
static void share_store(config_t *cfg)
{
    if (cfg->store_kind != STORE_URL_FILE)
        return;
    cfg->store_peers = true;
    cfg->cache_entries = 0;
}

/* The command's own file of the embedded store, unless database_url names a store. The PG*
 * variables do not choose Postgres here: a desktop agent's environment is not the operator's.
 * Every copy of one command chooses the same file. */
static int choose_store(config_t *cfg)
{
    if (cfg->database_url) {
        share_store(cfg);
        return 0;
    }
    char *const url_words[] = {cfg->upstream_url, NULL};
    char *const *words = cfg->stdio.argv ? cfg->stdio.argv : url_words;
    char *def = store_default_path();
    char *file = stdio_args_store_file(def, words);
    free(def);
    if (!file) {
        fprintf(stderr, "idemgw stdio: no folder for the store (none of STATE_DIRECTORY, "
                        "XDG_STATE_HOME, HOME is set): name a file with database_url: "
                        "sqlite:PATH in -c FILE (or IDEMGW_DATABASE_URL)\n");
        return -1;
    }
    char *url = xasprintf("sqlite:%s", file);
    free(file);
    free(cfg->store_target);
    cfg->store_kind = store_url_parse(url, &cfg->store_target);
    cfg->store_enabled = cfg->store_kind != STORE_URL_NONE;
    free(url);
    share_store(cfg);
    return 0;
}

/* The front's requests name localhost; a config that lists other hosts allows it too. */
static void allow_localhost(config_t *cfg)
{
    if (config_host_allowed(cfg, "localhost"))
        return;
    cfg->allowed_hosts =
        xrealloc(cfg->allowed_hosts, (cfg->n_allowed_hosts + 1) * sizeof(*cfg->allowed_hosts));
    cfg->allowed_hosts[cfg->n_allowed_hosts++] = xstrdup("localhost");
}

/* What makes the configuration a wrapper's; -1 after saying why on stderr. */
static int prepare(config_t *cfg)
{
    cfg->workers = 1;
    /* one client: the front's connections at most (not a warning about descriptors) */
    cfg->max_connections = WRAPPER_MAX_CONNECTIONS;
    if (cfg->stdio.argv) {
        char *prog = upstream_stdio_resolve(cfg->stdio.argv[0], child_path(&cfg->stdio));
        bool runnable = prog && access(prog, X_OK) == 0;
        free(prog);
        if (!runnable) {
            fprintf(stderr, "idemgw stdio: cannot start %s: %s\n", cfg->stdio.argv[0],
                    strchr(cfg->stdio.argv[0], '/') ? "no such executable file"
                                                    : "command not found on PATH");
            return -1;
        }
        pass_environment(&cfg->stdio);
        cfg->stdio.idle_timeout_ms = SESSION_FOREVER_MS;
    }
    fixed_subject(cfg);
    allow_localhost(cfg);
    return choose_store(cfg);
}

/* --- the front end, as serve.h runs it --- */

static void front_connect(void *arg, int fd)
{
    wrapper_t *w = arg;
    w->gw->adopt(fd);
}

static void front_done(void *arg, bool failed)
{
    wrapper_t *w = arg;
    w->failed = failed;
    w->gw->drain();
}

static int front_start(void *arg, struct event_base *base, const config_t *cfg,
                       const serve_gateway_t *gw)
{
    wrapper_t *w = arg;
    w->gw = gw;
    stdio_front_opts_t o = {
        .base = base,
        .in_fd = STDIN_FILENO,
        .out_fd = STDOUT_FILENO,
        .path = cfg->upstream_path,
        .headers = w->args.headers,
        .n_headers = w->args.n_headers,
        .max_line = (size_t)cfg->max_body_bytes,
        .connect = front_connect,
        .done = front_done,
        .arg = w,
    };
    char msg[256];
    w->front = stdio_front_new(&o, msg, sizeof(msg));
    if (!w->front) {
        fprintf(stderr, "idemgw stdio: %s\n", msg);
        return -1;
    }
    return 0;
}

static void front_stop(void *arg)
{
    wrapper_t *w = arg;
    stdio_front_free(w->front);
    w->front = NULL;
}

/* A descriptor of 0, 1 and 2 the agent left closed is /dev/null: else the first file opened
 * (the store) would take its number, and be read as stdin or written as stdout. */
static void hold_standard_fds(void)
{
    for (int fd = 0; fd <= 2; fd++)
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
            int null = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
            if (null >= 0 && null != fd) {
                dup2(null, fd);
                close(null);
            }
        }
}

int stdio_cmd_main(int argc, char **argv, serve_run_fn *run_gateway)
{
    hold_standard_fds();
    /* stdout is the protocol channel: every log line goes elsewhere */
    log_stream = stderr;
    wrapper_t w = {0};
    char msg[300];
    int rc = EXIT_USAGE;
    FILE *log_file = NULL;
    config_t *cfg = NULL;
    stdio_args_result_t r = stdio_args_parse(argc, argv, &w.args, msg, sizeof(msg));
    if (r == STDIO_ARGS_HELP) {
        usage(stdout);
        rc = 0;
        goto out;
    }
    if (r != STDIO_ARGS_RUN) {
        fprintf(stderr, "idemgw stdio: %s\n", msg);
        usage(stderr);
        goto out;
    }
    rc = EXIT_FAILED;
    if (w.args.log_file) {
        log_file = fopen(w.args.log_file, "ae");
        if (!log_file) {
            fprintf(stderr, "idemgw stdio: %s: %s\n", w.args.log_file, strerror(errno));
            goto out;
        }
        setvbuf(log_file, NULL, _IOLBF, 0);
        log_stream = log_file;
    }
    cfg = load_config(&w.args);
    if (!cfg || prepare(cfg) != 0)
        goto out;
    serve_front_t fe = {.start = front_start, .stop = front_stop, .arg = &w};
    config_t *owned = cfg;
    cfg = NULL; /* the worker owns it now */
    /* a reload would read the file without the command line's part: SIGHUP does nothing */
    signal(SIGHUP, SIG_IGN);
    rc = run_gateway(owned, w.args.config, &fe);
    if (rc == 0 && w.failed)
        rc = EXIT_FAILED;
out:
    config_free(cfg);
    stdio_args_free(&w.args);
    if (log_file) {
        log_stream = stderr;
        fclose(log_file);
    }
    return rc;
}
