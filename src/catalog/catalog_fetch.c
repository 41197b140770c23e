/* Reading the upstream's tool catalogue as an MCP client (see include/catalog_fetch.h). */
#include "catalog_fetch.h"

#include "config.h"

#include "http_headers.h"
#include "log.h"
#include "rpc_reader.h"
#include "upstream_server.h"
#include "util.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <getopt.h>
#include <openssl/ssl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define FETCH_MAX_ANSWER (8u * 1024 * 1024)
#define FETCH_MAX_PAGES 100 /* a server whose cursor never ends */
#define FETCH_PROTOCOL "2025-06-18"

typedef enum { STEP_INITIALIZE, STEP_INITIALIZED, STEP_LIST, STEP_DELETE } step_t;

struct catalog_fetch {
    catalog_fetch_opts_t o; /* its strings point to the copies below */
    char *target, *headers, *capabilities;
    step_t step;
    upstream_call_t *up;
    rpc_reader_t reader;
    int status;
    char *session;  /* Mcp-Session-Id the server gave, or NULL */
    char *protocol; /* the version it chose */
    char *cursor;   /* the next page's */
    int pages, tools;
    int next_id;
    struct event *later; /* ends the fetch from the loop, never inside a callback chain */
    char refusal[200];   /* the start of a non-200 answer's body, for the error */
    size_t refusal_len;
    char error[256];
    bool finished;
};

static void send_step(catalog_fetch_t *f);

static void finish_cb(evutil_socket_t fd, short what, void *arg)
{
    catalog_fetch_t *f = arg;
    if (f->o.done)
        f->o.done(f->o.arg, f->error[0] ? -1 : f->tools, f->error[0] ? f->error : NULL);
    catalog_fetch_cancel(f);
}

/* Ends the fetch: with error (printf-style) unless fmt is NULL. */
static void finish(catalog_fetch_t *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void finish(catalog_fetch_t *f, const char *fmt, ...)
{
    if (f->finished)
        return;
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(f->error, sizeof(f->error), fmt, ap);
        va_end(ap);
    }
    /* A session the server gave is ended whatever went wrong after it began: a stdio server
     * keeps a child per session. Only between calls (on_end): never cutting one off. */
    if (f->session && f->step != STEP_DELETE && !f->up) {
        f->step = STEP_DELETE;
        send_step(f);
        return;
    }
    f->finished = true;
    struct timeval zero = {0, 0};
    evtimer_add(f->later, &zero);
}

static void on_head(void *arg, int status, const http_headers_t *headers)
{
    catalog_fetch_t *f = arg;
    f->status = status;
    const char *session = http_headers_get(headers, "mcp-session-id");
    /* a refused initialize began no session, whatever header came with it */
    if (f->step == STEP_INITIALIZE && session && status >= 200 && status < 300) {
        free(f->session);
        f->session = xstrdup(session);
    }
    const char *ct = http_headers_get(headers, "content-type");
    bool sse = ct && strncasecmp(ct, "text/event-stream", 17) == 0;
    if (f->step == STEP_INITIALIZE || f->step == STEP_LIST)
        rpc_reader_head(&f->reader, status, headers, sse);
}

static void on_body(void *arg, const char *data, size_t len)
{
    catalog_fetch_t *f = arg;
    if (f->status != 200 && f->refusal_len < sizeof(f->refusal) - 1) {
        size_t n = len < sizeof(f->refusal) - 1 - f->refusal_len
                       ? len
                       : sizeof(f->refusal) - 1 - f->refusal_len;
        for (size_t i = 0; i < n; i++) /* one line, whatever the body held */
            f->refusal[f->refusal_len + i] = (unsigned char)data[i] < 0x20 ? ' ' : data[i];
        f->refusal_len += n;
        f->refusal[f->refusal_len] = '\0';
    }
    if (f->step == STEP_INITIALIZE || f->step == STEP_LIST)
        rpc_reader_body(&f->reader, data, len);
}

/* The result of this step's request, or NULL after finishing with why not. */
static json_t *step_result(catalog_fetch_t *f, upstream_result_t res, const char *what)
{
    if (res != UPSTREAM_OK) {
        finish(f, "%s: %s", what, upstream_result_str(res));
        return NULL;
    }
    if (f->status != 200) {
        /* the refusal's own words: a JSON-RPC error's message (a stdio server that could not
         * start says why), else the start of the body */
        json_t *body = json_loads(f->refusal, 0, NULL);
        const char *msg =
            json_string_value(json_object_get(json_object_get(body, "error"), "message"));
        if (!msg && f->refusal_len && !body)
            msg = f->refusal;
        if (msg)
            finish(f, "%s: HTTP %d: %.160s", what, f->status, msg);
        else
            finish(f, "%s: HTTP %d", what, f->status);
        json_decref(body);
        return NULL;
    }
    if (!rpc_reader_end(&f->reader)) {
        finish(f, "%s: no JSON-RPC response in the answer", what);
        return NULL;
    }
    if (f->reader.cls != MCP_RESP_RESULT) {
        finish(f, "%s: the server answered with an error: %.120s", what, f->reader.result);
        return NULL;
    }
    json_t *r = json_loadb(f->reader.result, f->reader.result_len, 0, NULL);
    if (!r)
        finish(f, "%s: the result is not a JSON object", what);
    return r;
}

static void on_end(void *arg, upstream_result_t res)
{
    catalog_fetch_t *f = arg;
    f->up = NULL;
    switch (f->step) {
    case STEP_INITIALIZE: {
        json_t *r = step_result(f, res, "initialize");
        if (!r)
            return;
        const char *v = json_string_value(json_object_get(r, "protocolVersion"));
        f->protocol = xstrdup(v ? v : FETCH_PROTOCOL);
        bool has_tools = json_object_get(json_object_get(r, "capabilities"), "tools") != NULL;
        json_decref(r);
        if (!has_tools) {
            finish(f, "the server declares no tools capability");
            return;
        }
        f->step = STEP_INITIALIZED;
        break;
    }
    case STEP_INITIALIZED:
        if (res != UPSTREAM_OK || f->status < 200 || f->status >= 300) {
            finish(f, "notifications/initialized: %s",
                   res != UPSTREAM_OK ? upstream_result_str(res) : "refused");
            return;
        }
        f->step = STEP_LIST;
        break;
    case STEP_LIST: {
        json_t *r = step_result(f, res, "tools/list");
        if (!r)
            return;
        if (f->o.on_page)
            f->o.on_page(f->o.page_arg, f->reader.result, f->reader.result_len);
        int n = catalog_learn(f->o.catalog, f->reader.result, f->reader.result_len);
        const char *next = json_string_value(json_object_get(r, "nextCursor"));
        free(f->cursor);
        f->cursor = next && *next ? xstrdup(next) : NULL;
        json_decref(r);
        if (n < 0) {
            finish(f, "tools/list: the result has no tools array");
            return;
        }
        f->tools += n;
        f->pages++;
        if (f->cursor && f->pages >= FETCH_MAX_PAGES) {
            finish(f, "tools/list: more than %d pages", FETCH_MAX_PAGES);
            return;
        }
        if (!f->cursor)
            f->step = STEP_DELETE;
        if (!f->cursor && !f->session) {
            finish(f, NULL);
            return;
        }
        break;
    }
    case STEP_DELETE:
        finish(f, NULL); /* the session's end is a courtesy: its answer does not matter */
        return;
    }
    send_step(f);
}

static const upstream_cbs_t fetch_cbs = {on_head, on_body, on_end};

static void send_step(catalog_fetch_t *f)
{
    char body[1024] = "";
    const char *method = "POST";
    switch (f->step) {
    case STEP_INITIALIZE:
        snprintf(body, sizeof(body),
                 "{\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":\"initialize\",\"params\":{"
                 "\"protocolVersion\":\"" FETCH_PROTOCOL "\",\"capabilities\":%s,"
                 "\"clientInfo\":{\"name\":\"idemgw\",\"version\":\"catalogue\"}}}",
                 ++f->next_id, f->capabilities ? f->capabilities : "{}");
        break;
    case STEP_INITIALIZED:
        snprintf(body, sizeof(body),
                 "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}");
        break;
    case STEP_LIST: {
        json_t *params = json_object();
        if (f->cursor)
            json_object_set_new(params, "cursor", json_string(f->cursor));
        json_t *req = json_pack("{s:s, s:i, s:s, s:o}", "jsonrpc", "2.0", "id", ++f->next_id,
                                "method", "tools/list", "params", params);
        char *text = json_dumps(req, JSON_COMPACT);
        json_decref(req);
        if (!text || strlen(text) >= sizeof(body)) {
            free(text);
            finish(f, "tools/list: the server's cursor is too long");
            return;
        }
        snprintf(body, sizeof(body), "%s", text);
        free(text);
        break;
    }
    case STEP_DELETE:
        method = "DELETE";
        break;
    }
    rpc_reader_free(&f->reader);
    json_t *id = json_integer(f->next_id);
    rpc_reader_init(&f->reader, id, FETCH_MAX_ANSWER);
    json_decref(id);
    f->status = 0;
    f->refusal_len = 0;

    char *session = f->session ? xasprintf("Mcp-Session-Id: %s\r\n", f->session) : NULL;
    char *version = f->protocol ? xasprintf("MCP-Protocol-Version: %s\r\n", f->protocol) : NULL;
    char *extra =
        xasprintf("%sAccept: application/json, text/event-stream\r\n%s%s%s",
                  body[0] ? "Content-Type: application/json\r\n" : "", session ? session : "",
                  version ? version : "", f->o.headers ? f->o.headers : "");
    free(session);
    free(version);
    struct evbuffer *out = evbuffer_new();
    evbuffer_add(out, body, strlen(body));
    upstream_request_t r = {
        .method = method,
        .target = f->o.target,
        .extra_headers = extra,
        .body = out,
        .has_body = body[0] != '\0',
    };
    f->up = upstream_open(f->o.upstream, &r, &fetch_cbs, f);
    evbuffer_free(out);
    free(extra);
}

catalog_fetch_t *catalog_fetch_start(const catalog_fetch_opts_t *opts)
{
    catalog_fetch_t *f = xcalloc(1, sizeof(*f));
    f->o = *opts;
    /* the caller's strings may go before the fetch ends (a reload frees the old config) */
    f->o.target = f->target = xstrdup(opts->target);
    f->o.headers = f->headers = opts->headers ? xstrdup(opts->headers) : NULL;
    /* only an object that fits the initialize body: else none, rather than a broken request */
    json_t *caps = opts->capabilities ? json_loads(opts->capabilities, 0, NULL) : NULL;
    if (json_is_object(caps) && strlen(opts->capabilities) < 600)
        f->o.capabilities = f->capabilities = json_dumps(caps, JSON_COMPACT);
    else
        f->o.capabilities = NULL;
    json_decref(caps);
    f->later = evtimer_new(opts->base, finish_cb, f);
    f->step = STEP_INITIALIZE;
    send_step(f);
    return f;
}

void catalog_fetch_cancel(catalog_fetch_t *f)
{
    if (!f)
        return;
    if (f->up)
        upstream_abandon(f->o.upstream, f->up);
    rpc_reader_free(&f->reader);
    event_free(f->later);
    free(f->session);
    free(f->protocol);
    free(f->cursor);
    free(f->target);
    free(f->headers);
    free(f->capabilities);
    free(f);
}

/* --- from the command line --- */

#define TAIL_LINES 8  /* the stdio server's last stderr lines kept, for a failure */
#define TAIL_LINE 200 /* bytes of each */

/* The last stderr lines of a stdio server, from the lines the stdio upstream logs for them
 * (those carrying "server_pid"): a command logs nothing, yet a server that fails to start
 * mostly says why there (a missing variable, a bad argument). */
typedef struct stderr_tail {
    char lines[TAIL_LINES][TAIL_LINE];
    unsigned n; /* lines seen; the newest is lines[(n - 1) % TAIL_LINES] */
} stderr_tail_t;

static void keep_stderr(void *arg, log_level_t level, const char *fields, const char *msg)
{
    (void)level;
    stderr_tail_t *t = arg;
    static const char mark[] = " stderr: ";
    const char *line = strstr(msg, mark);
    if (!fields || !strstr(fields, "\"server_pid\"") || !line)
        return;
    snprintf(t->lines[t->n++ % TAIL_LINES], TAIL_LINE, "%s", line + sizeof(mark) - 1);
}

/* Appends to err what a failed stdio server leaves to go on: its stderr's last lines, and the
 * environment it had, which is not this shell's. */
static void explain_stdio(const stderr_tail_t *t, char *err, size_t errlen)
{
    size_t n = strlen(err);
    unsigned first = t->n > TAIL_LINES ? t->n - TAIL_LINES : 0;
    if (t->n && n < errlen)
        n += (size_t)snprintf(err + n, errlen - n,
                              "\n  the server's stderr%s:", first ? ", its last lines" : "");
    for (unsigned i = first; i < t->n && n < errlen; i++)
        n += (size_t)snprintf(err + n, errlen - n, "\n    %s", t->lines[i % TAIL_LINES]);
    if (n < errlen)
        snprintf(err + n, errlen - n,
                 "\n  (the server gets PATH, HOME, its upstream's env and the variables its "
                 "pass_env names: no other variable of this environment reaches it)");
}

typedef struct fetch_run {
    struct event_base *base;
    int n_tools;
    char *err;
    size_t errlen;
} fetch_run_t;

static void run_done(void *arg, int n_tools, const char *error)
{
    fetch_run_t *r = arg;
    r->n_tools = n_tools;
    if (error)
        snprintf(r->err, r->errlen, "%s", error);
    event_base_loopbreak(r->base);
}

int catalog_fetch_now(const config_t *cfg, const char *headers, catalog_t *catalog,
                      void (*on_page)(void *arg, const char *result, size_t len), void *arg,
                      char *err, size_t errlen)
{
    fetch_run_t run = {.base = event_base_new(), .n_tools = -1, .err = err, .errlen = errlen};
    stderr_tail_t tail = {.n = 0};
    log_level_t threshold = log_threshold;
    snprintf(err, errlen, "no answer");
    struct ssl_ctx_st *tls = NULL;
    upstream_pool_t *pool = NULL;
    upstream_t *upstream = NULL;
    upstream_limits_t limits = {
        .connect_timeout_ms = cfg->upstream_connect_timeout_ms,
        .timeout_ms = cfg->upstream_timeout_ms,
        .idle_timeout_ms = cfg->upstream_idle_timeout_ms,
        .pool = 1,
    };
    upstream_server_t made;
    bool opened = upstream_server_open(
        cfg, &(upstream_server_opts_t){.base = run.base, .limits = &limits}, &made, err, errlen);
    upstream = made.upstream;
    pool = made.pool;
    tls = made.tls;
    if (!opened)
        goto out;
    catalog_fetch_opts_t fo = {
        .base = run.base,
        .upstream = upstream,
        .target = cfg->upstream_path,
        .headers = headers && *headers ? headers : NULL,
        .catalog = catalog,
        .on_page = on_page,
        .page_arg = arg,
        .done = run_done,
        .arg = &run,
        /* as a desktop agent's client does (2025-06-18 forms): a server that offers some tools
         * only to clients able to answer its questions shows them to the policy too */
        .capabilities = "{\"elicitation\":{},\"sampling\":{},\"roots\":{\"listChanged\":false}}",
    };
    if (cfg->stdio.argv) {
        /* the stderr lines are logged at info: seen by the tap, written only as before */
        if (log_threshold > LOG_INFO)
            log_threshold = LOG_INFO;
        log_set_tap(keep_stderr, &tail, threshold);
    }
    catalog_fetch_start(&fo);
    event_base_dispatch(run.base);
    /* the fetch's end breaks the loop at once: stderr a failed server wrote before its stdout
     * closed may wait, read, on the loop still */
    for (int i = 0; cfg->stdio.argv && run.n_tools < 0 && i < 4; i++)
        event_base_loop(run.base, EVLOOP_NONBLOCK);
    if (run.n_tools < 0 && cfg->stdio.argv &&
        (strstr(err, "initialize: no response in time") ||
         strstr(err, "no answer to initialize within"))) {
        size_t n = strlen(err);
        snprintf(err + n, errlen - n,
                 " (a command that fetches its package first, as npx -y and uvx do, waits for "
                 "a registry it cannot reach when the proxy or CA variables it needs are not "
                 "in pass_env)");
    }
out:
    upstream_free(upstream);
    if (pool)
        upstream_pool_free(pool);
    event_base_loop(run.base, EVLOOP_NONBLOCK);
    if (cfg->stdio.argv) {
        /* after the child is gone: its last words are in */
        log_set_tap(NULL, NULL, LOG_DEBUG);
        log_threshold = threshold;
        if (run.n_tools < 0)
            explain_stdio(&tail, err, errlen);
    }
    event_base_free(run.base);
    if (tls)
        SSL_CTX_free(tls);
    return run.n_tools;
}

/* Appends -H 'Name: value' as a header line; false when it is not one header on one line or
 * does not fit. */
static bool add_header(char *headers, size_t size, const char *arg)
{
    const char *colon = strchr(arg, ':');
    if (!colon || colon == arg || strpbrk(arg, "\r\n") || memchr(arg, ' ', (size_t)(colon - arg)))
        return false;
    size_t used = strlen(headers);
    if (used + strlen(arg) + 3 > size)
        return false;
    snprintf(headers + used, size - used, "%s\r\n", arg);
    return true;
}

int catalog_cli_parse(int argc, char **argv, const char *cmd, bool takes_upstream,
                      void (*usage)(FILE *), catalog_cli_t *out)
{
    static const struct option longopts[] = {
        {"upstream", required_argument, NULL, 'u'},
        {"config", required_argument, NULL, 'c'},
        {"header", required_argument, NULL, 'H'},
        {"server", required_argument, NULL, 's'}, /* long only */
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    memset(out, 0, sizeof(*out));
    optind = 0; /* a fresh scan: tests run commands more than once in a process */
    opterr = 0;
    int opt;
    while ((opt = getopt_long(argc, argv, takes_upstream ? "u:c:H:h" : "c:H:h", longopts, NULL)) !=
           -1) {
        if (opt == 'u' && takes_upstream) {
            out->upstream = optarg;
        } else if (opt == 'c') {
            out->config = optarg;
        } else if (opt == 's') {
            out->server = optarg;
        } else if (opt == 'H') {
            if (!add_header(out->headers, sizeof(out->headers), optarg)) {
                fprintf(stderr, "%s: -H %s: expected 'Name: value' on one line\n", cmd, optarg);
                return -1;
            }
        } else if (opt == 'h') {
            usage(stdout);
            return 1;
        } else if (opt == 'u') {
            /* a command without it: argv[optind - 1] is the option's value, not its name */
            fprintf(stderr, "%s: unknown or incomplete option --upstream\n", cmd);
            usage(stderr);
            return -1;
        } else {
            fprintf(stderr, "%s: unknown or incomplete option %s\n", cmd, argv[optind - 1]);
            usage(stderr);
            return -1;
        }
    }
    if (takes_upstream && optind < argc && optind > 1 && strcmp(argv[optind - 1], "--") == 0) {
        out->command = argv + optind;
        out->n_command = argc - optind;
        return 0;
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument %s\n", cmd, argv[optind]);
        usage(stderr);
        return -1;
    }
    return 0;
}
