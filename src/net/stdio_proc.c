/* The stdio server's processes (stdio_int.h): started with their three pipes and nothing else
 * of the gateway's, each in a session and process group of its own, and ended with everything
 * they started.
 *
 * A server may start helpers. Those in its process group are ended with it: SIGTERM to the
 * group, SIGKILL after the grace, and that kill is kept apart from the child's record, so it
 * still comes when the leader was reaped first (a server that crashes, or that exits on SIGTERM
 * before its helpers do). A helper that left the group (setsid, a daemon) is found by a mark in
 * its environment, which every process the server starts inherits: IDEMGW_SERVER_MARK, unique
 * per child. When the leader is reaped the gateway ends every process that still carries the
 * mark. A helper that clears its environment escapes this; a cgroup per child would catch it
 * too, where the gateway may make one. */
#include "stdio_int.h"

#include "log.h"
#include "log_limit.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MARK_VAR "IDEMGW_SERVER_MARK"
#define ENVIRON_MAX (256u * 1024) /* the most of a process's environment read for the mark */
#define MARKED_MAX 64             /* processes ended for one mark at a time */

/* A SIGKILL due once the grace is out: a process group (pid its leader's), or one process. */
struct proc_kill {
    stdio_up_t *up;
    pid_t pid;
    bool group;
    struct event *ev;
    proc_kill_t *next;
};

char *upstream_stdio_resolve(const char *prog, const char *path_env)
{
    if (strchr(prog, '/'))
        return xstrdup(prog);
    const char *p = path_env;
    while (p && *p) {
        size_t n = strcspn(p, ":");
        char *cand = xasprintf("%.*s/%s", (int)(n ? n : 1), n ? p : ".", prog);
        struct stat st;
        if (stat(cand, &st) == 0 && S_ISREG(st.st_mode) && access(cand, X_OK) == 0)
            return cand;
        free(cand);
        p += n + (p[n] == ':');
    }
    return NULL;
}

/* The child's environment: what the config gives, the gateway's own variables pass_env names
 * (those set, unless env gives them too), plus PATH and HOME unless given, and the child's
 * mark. Nothing else of the gateway's own (its database password among it) reaches the server. */
static bool env_has(char *const *env, size_t n, const char *name)
{
    size_t len = strlen(name);
    for (size_t i = 0; i < n; i++)
        if (strncmp(env[i], name, len) == 0 && env[i][len] == '=')
            return true;
    return false;
}

static char **child_env(const stdio_conf_t *conf, const char *mark, const char **path_out)
{
    size_t n = conf->n_env, n_pass = 0;
    while (conf->pass_env && conf->pass_env[n_pass])
        n_pass++;
    char **env = xcalloc(n + n_pass + 4, sizeof(char *));
    for (size_t i = 0; i < n; i++)
        env[i] = conf->env[i];
    for (size_t i = 0; i < n_pass; i++) {
        const char *name = conf->pass_env[i], *v = getenv(name);
        if (v && !env_has(env, n, name))
            env[n++] = xasprintf("%s=%s", name, v);
    }
    if (!env_has(env, n, "PATH")) {
        const char *p = getenv("PATH");
        env[n++] = xasprintf("PATH=%s", p && *p ? p : "/usr/local/bin:/usr/bin:/bin");
    }
    const char *home = getenv("HOME");
    if (!env_has(env, n, "HOME") && home)
        env[n++] = xasprintf("HOME=%s", home);
    env[n++] = xasprintf(MARK_VAR "=%s", mark);
    for (size_t i = 0; i < n; i++)
        if (strncmp(env[i], "PATH=", 5) == 0)
            *path_out = env[i] + 5;
    return env;
}

static void child_env_free(const stdio_conf_t *conf, char **env)
{
    for (size_t i = conf->n_env; env[i]; i++)
        free(env[i]);
    free(env);
}

bool stdio_proc_spawn(child_t *c, int fds[3], char *why, size_t whylen)
{
    stdio_up_t *up = c->up;
    int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
    char nonce[17];
    util_nonce_hex(nonce);
    snprintf(c->mark, sizeof(c->mark), "%s-%d", nonce, (int)getpid());
    const char *path_env = NULL;
    char **env = child_env(&up->conf, c->mark, &path_env);
    char *prog = upstream_stdio_resolve(up->conf.argv[0], path_env);
    int rc = 0;
    if (!prog) {
        rc = ENOENT;
        goto fail;
    }
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
        rc = errno;
        goto fail;
    }
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err[1], 2);
    /* The server is a third party's program: it gets its three pipes and nothing else of the
     * gateway's (agents' sockets, the store's, other children's pipes), whether or not each
     * was opened close-on-exec. */
    posix_spawn_file_actions_addclosefrom_np(&fa, 3);
    if (up->conf.cwd)
        posix_spawn_file_actions_addchdir_np(&fa, up->conf.cwd);
    posix_spawnattr_init(&attr);
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setflags(&attr,
                             POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    rc = posix_spawn(&c->pid, prog, &fa, &attr, up->conf.argv, env);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (rc != 0)
        goto fail;
    close(in[0]);
    close(out[1]);
    close(err[1]);
    fds[0] = in[1];
    fds[1] = out[0];
    fds[2] = err[0];
    free(prog);
    child_env_free(&up->conf, env);
    return true;
fail:
    for (int i = 0; i < 2; i++) {
        if (in[i] >= 0)
            close(in[i]);
        if (out[i] >= 0)
            close(out[i]);
        if (err[i] >= 0)
            close(err[i]);
    }
    c->pid = 0;
    snprintf(why, whylen, "cannot start %s: %s", up->conf.argv[0], strerror(rc));
    log_error(0, "stdio upstream %s: %s", up->label, why);
    free(prog);
    child_env_free(&up->conf, env);
    return false;
}

/* --- what it says on stderr --- */

/* The end of what the child wrote on stderr, kept to say why it failed. */
static void keep_err(child_t *c, const char *line, size_t n)
{
    while (n > 0 && (line[n - 1] == '\r' || line[n - 1] == ' '))
        n--;
    if (n == 0)
        return;
    char add[ERR_TAIL_MAX];
    int len = snprintf(add, sizeof(add), "%s%.*s", c->err_tail_len ? " | " : "", (int)n, line);
    size_t a = len < 0 ? 0 : (size_t)len >= sizeof(add) ? sizeof(add) - 1 : (size_t)len;
    size_t keep = c->err_tail_len + a > ERR_TAIL_MAX - 1 ? ERR_TAIL_MAX - 1 - a : c->err_tail_len;
    memmove(c->err_tail, c->err_tail + c->err_tail_len - keep, keep);
    memcpy(c->err_tail + keep, add, a);
    c->err_tail_len = keep + a;
}

static void on_child_err(struct bufferevent *bev, void *arg)
{
    child_t *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    for (;;) {
        size_t n = 0;
        char *line = evbuffer_readln(in, &n, EVBUFFER_EOL_LF);
        if (!line) {
            size_t avail = evbuffer_get_length(in);
            if (avail < STDERR_LINE_MAX)
                return;
            line = xmalloc(STDERR_LINE_MAX + 1);
            evbuffer_remove(in, line, STDERR_LINE_MAX);
            line[STDERR_LINE_MAX] = '\0';
            n = STDERR_LINE_MAX;
        }
        if (n > STDERR_LINE_MAX)
            line[STDERR_LINE_MAX] = '\0';
        keep_err(c, line, strlen(line));
        /* a server's flood of stderr must not become the gateway's log: a burst, then a
         * steady rate, and a count of what was left out */
        uint64_t held = 0;
        if (log_limit_take(&c->err_limit, util_now_ms(), &held)) {
            char fields[96];
            snprintf(fields, sizeof(fields), "\"server_pid\":%d", (int)c->pid);
            if (held)
                LOG_AT(LOG_WARN, 0, fields, "stdio upstream %s: %llu stderr lines not logged",
                       c->up->label, (unsigned long long)held);
            LOG_AT(LOG_INFO, 0, fields, "stdio upstream %s stderr: %s", c->up->label, line);
        }
        free(line);
    }
}

/* What the child wrote on stderr and the loop has not read yet (it exited, or went silent on
 * its protocol channel): read now, so why it failed is at hand, an unended last line too. */
void stdio_proc_drain_err(child_t *c)
{
    if (!c->err)
        return;
    struct evbuffer *in = bufferevent_get_input(c->err);
    int fd = bufferevent_getfd(c->err);
    for (int i = 0; i < 64 && evbuffer_read(in, fd, 4096) > 0; i++)
        ;
    on_child_err(c->err, c);
    size_t n = evbuffer_get_length(in);
    if (n > 0) {
        keep_err(c, (const char *)evbuffer_pullup(in, (ssize_t)n), n);
        evbuffer_drain(in, n);
    }
}

static void on_child_err_event(struct bufferevent *bev, short what, void *arg)
{
    child_t *c = arg;
    if ((what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) && c->err == bev)
        stdio_proc_close_err(c);
}

void stdio_proc_close_err(child_t *c)
{
    if (!c->err)
        return;
    stdio_proc_drain_err(c);
    bufferevent_free(c->err);
    c->err = NULL;
    uint64_t held = log_limit_flush(&c->err_limit);
    if (held)
        log_warn(0, "stdio upstream %s: pid %d: %llu stderr lines not logged", c->up->label,
                 (int)c->pid, (unsigned long long)held);
}

void stdio_proc_watch_err(child_t *c)
{
    log_limit_init(&c->err_limit, ERR_LOG_RATE, ERR_LOG_BURST, util_now_ms());
    bufferevent_setcb(c->err, on_child_err, NULL, on_child_err_event, c);
    bufferevent_enable(c->err, EV_READ);
}

/* why, and the last the server wrote on stderr when it wrote anything (what a failed start
 * most often needs to be understood). */
const char *stdio_proc_why(const child_t *c, const char *why, char *out, size_t outlen)
{
    if (c->err_tail_len == 0)
        return why;
    snprintf(out, outlen, "%s; its stderr ended: %.*s", why, (int)c->err_tail_len, c->err_tail);
    return out;
}

/* --- ending processes --- */

static void kill_free(proc_kill_t *k)
{
    stdio_up_t *up = k->up;
    for (proc_kill_t **pp = &up->kills; *pp; pp = &(*pp)->next)
        if (*pp == k) {
            *pp = k->next;
            break;
        }
    event_free(k->ev);
    free(k);
}

static void on_kill_due(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    proc_kill_t *k = arg;
    if (kill(k->group ? -k->pid : k->pid, 0) == 0) {
        log_warn(0, "stdio upstream %s: %s %d still running %llus after SIGTERM, killing it",
                 k->up->label, k->group ? "process group" : "process", (int)k->pid,
                 (unsigned long long)(k->up->conf.grace_ms / 1000));
        kill(k->group ? -k->pid : k->pid, SIGKILL);
    }
    kill_free(k);
}

/* SIGTERM now, SIGKILL after the grace (unless one is due for it already). */
static void terminate(stdio_up_t *up, pid_t pid, bool group)
{
    if (kill(group ? -pid : pid, SIGTERM) != 0)
        return; /* nothing left of it */
    for (proc_kill_t *k = up->kills; k; k = k->next)
        if (k->pid == pid && k->group == group)
            return;
    proc_kill_t *k = xcalloc(1, sizeof(*k));
    k->up = up;
    k->pid = pid;
    k->group = group;
    k->ev = evtimer_new(up->base, on_kill_due, k);
    uint64_t ms = up->conf.grace_ms;
    struct timeval tv = util_ms_to_tv(ms);
    evtimer_add(k->ev, &tv);
    k->next = up->kills;
    up->kills = k;
}

void stdio_proc_stop(child_t *c)
{
    if (c->pid > 0)
        terminate(c->up, c->pid, true);
}

/* Whether the process pid carries mark in its environment. */
static bool carries_mark(long pid, const char *needle, size_t nlen)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%ld/environ", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    char *buf = xmalloc(ENVIRON_MAX);
    size_t len = 0;
    for (ssize_t n; len < ENVIRON_MAX && (n = read(fd, buf + len, ENVIRON_MAX - len)) > 0;)
        len += (size_t)n;
    close(fd);
    bool found = false;
    /* the variable whole: at the start of the block or after a NUL, and NUL-ended */
    for (const char *at = buf; !found && (at = memmem(at, len - (size_t)(at - buf), needle, nlen));
         at++)
        found = (at == buf || at[-1] == '\0') && (size_t)(at - buf) + nlen <= len;
    free(buf);
    return found;
}

/* The processes other than the gateway that carry c's mark, at most max. */
static size_t marked(const child_t *c, pid_t *out, size_t max)
{
    char needle[sizeof(c->mark) + sizeof(MARK_VAR) + 2];
    int nlen = snprintf(needle, sizeof(needle), MARK_VAR "=%s", c->mark);
    /* the NUL that ends the variable is part of what must match */
    size_t want = (size_t)nlen + 1;
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    size_t n = 0;
    pid_t self = getpid();
    for (struct dirent *e; n < max && (e = readdir(d));) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0 || pid == self)
            continue;
        if (carries_mark(pid, needle, want))
            out[n++] = (pid_t)pid;
    }
    closedir(d);
    return n;
}

void stdio_proc_leader_gone(child_t *c)
{
    if (c->pid <= 0)
        return;
    stdio_up_t *up = c->up;
    /* what is left of its group (helpers it started) goes with it */
    if (kill(-c->pid, 0) == 0) {
        log_info(0, "stdio upstream %s: pid %d is gone: ending what is left of its process group",
                 up->label, (int)c->pid);
        terminate(up, c->pid, true);
    }
    pid_t pids[MARKED_MAX];
    size_t n = marked(c, pids, MARKED_MAX);
    for (size_t i = 0; i < n; i++) {
        log_warn(0,
                 "stdio upstream %s: pid %d, started by pid %d, left its process group: "
                 "ending it",
                 up->label, (int)pids[i], (int)c->pid);
        terminate(up, pids[i], false);
    }
}

void stdio_proc_end_all(stdio_up_t *up)
{
    /* stdin closed and SIGTERM to each group; then wait out the grace, then SIGKILL */
    for (child_t *c = up->children; c; c = c->next)
        if (!c->exited && c->pid > 0) {
            if (c->in) {
                bufferevent_free(c->in);
                c->in = NULL;
            }
            kill(-c->pid, SIGTERM);
        }
    uint64_t deadline = util_now_ms() + up->conf.grace_ms;
    for (;;) {
        bool alive = false;
        for (child_t *c = up->children; c; c = c->next)
            if (!c->exited && c->pid > 0 && waitpid(c->pid, NULL, WNOHANG) != c->pid)
                alive = true;
            else
                c->exited = true;
        if (!alive)
            break;
        if (util_now_ms() >= deadline) {
            for (child_t *c = up->children; c; c = c->next)
                if (!c->exited) {
                    kill(-c->pid, SIGKILL);
                    waitpid(c->pid, NULL, 0);
                    c->exited = true;
                }
            break;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    /* the gateway is leaving: nothing any server started outlives it */
    for (child_t *c = up->children; c; c = c->next) {
        if (c->pid <= 0)
            continue;
        kill(-c->pid, SIGKILL);
        pid_t pids[MARKED_MAX];
        size_t n = marked(c, pids, MARKED_MAX);
        for (size_t i = 0; i < n; i++)
            kill(pids[i], SIGKILL);
    }
    while (up->kills) {
        proc_kill_t *k = up->kills;
        kill(k->group ? -k->pid : k->pid, SIGKILL);
        kill_free(k);
    }
}
