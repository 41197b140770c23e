/* The operator's queue on the admin listener (src/ops/admin_keys.h). */
#include "admin_keys.h"

#include "log.h"
#include "store_queue.h"
#include "util.h"

#include <event2/buffer.h>
#include <llhttp.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOKEN_FILE_MAX (64 * 1024)
#define RESOLVE_BODY_MAX (4 * 1024 * 1024)
#define API_PREFIX "/admin/v1/keys"

/* The page (admin_page.c: src/ops/admin_page.html, compiled in). */
extern const char admin_page_html[];

/* One API request waiting for the store. */
typedef struct api_call {
    http_conn_t *conn; /* NULL once the operator has gone */
    bool keep_alive;
    int ok_status; /* what a STORE_QUEUE_OK answer is sent with */
} api_call_t;

static void respond_json(http_conn_t *conn, int status, const json_t *body, const char *extra,
                         bool keep)
{
    char *t = json_dumps(body, JSON_COMPACT | JSON_PRESERVE_ORDER);
    char *line = xasprintf("%s\n", t ? t : "{}");
    http_conn_respond(conn, status, "application/json", line, strlen(line), extra, keep);
    free(line);
    free(t);
}

static void respond_error(http_conn_t *conn, int status, const char *code, const char *msg,
                          const char *extra, bool keep)
{
    json_t *b = json_pack("{s:s,s:s}", "error", code, "message", msg);
    respond_json(conn, status, b, extra, keep);
    json_decref(b);
}

/* ---- the token ---- */

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Constant time in the token's length: the comparison leaks no prefix. */
static bool same_secret(const char *a, size_t alen, const char *b, size_t blen)
{
    return alen == blen && alen > 0 && CRYPTO_memcmp(a, b, alen) == 0;
}

bool admin_keys_token_match(const char *file_text, const char *file_path, const char *authorization,
                            char *name, size_t name_len)
{
    if (!authorization || strncasecmp(authorization, "Bearer ", 7) != 0)
        return false;
    const char *given = authorization + 7;
    while (*given == ' ')
        given++;
    size_t glen = strcspn(given, " \t\r\n");
    if (glen == 0)
        return false;
    bool found = false;
    const char *p = file_text;
    while (*p) {
        size_t len = strcspn(p, "\n");
        const char *line = p, *end = p + len;
        p = *end ? end + 1 : end;
        while (line < end && (*line == ' ' || *line == '\t'))
            line++;
        while (end > line && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r'))
            end--;
        if (line == end || *line == '#')
            continue;
        const char *colon = memchr(line, ':', (size_t)(end - line));
        const char *tok = colon ? colon + 1 : line;
        /* every line is compared, so the time does not say which one matched */
        if (same_secret(tok, (size_t)(end - tok), given, glen) && !found) {
            found = true;
            if (colon)
                snprintf(name, name_len, "%.*s", (int)(colon - line), line);
            else
                snprintf(name, name_len, "%s", base_name(file_path));
        }
    }
    return found;
}

/* True when the request may use the API, with the token's name in name; else it has been
 * answered (403 without a token file, 401 without the right token). */
static bool authorized(const admin_ctx_t *ctx, http_conn_t *conn, http_request_t *req, char *name,
                       size_t name_len)
{
    bool keep = req->keep_alive;
    const char *path = ctx->token_file;
    if (!path || !path[0]) {
        respond_error(conn, 403, "forbidden",
                      "the operator API is off: set admin_token_file: PATH in the configuration "
                      "(a file of NAME:TOKEN lines) to turn it on",
                      NULL, keep);
        return false;
    }
    char err[256];
    size_t len;
    char *text = util_read_file(path, TOKEN_FILE_MAX, &len, err, sizeof(err));
    if (!text) {
        log_error(0, "admin: admin_token_file %s: %s", path, err);
        respond_error(conn, 403, "forbidden",
                      "admin_token_file cannot be read: see the gateway's log", NULL, keep);
        return false;
    }
    bool ok = admin_keys_token_match(text, path, http_headers_get(&req->headers, "authorization"),
                                     name, name_len);
    OPENSSL_cleanse(text, len);
    free(text);
    if (!ok)
        respond_error(conn, 401, "unauthorized",
                      "a bearer token from admin_token_file is needed (Authorization: Bearer "
                      "TOKEN)",
                      "WWW-Authenticate: Bearer realm=\"idemgw-admin\"\r\n", keep);
    return ok;
}

/* ---- answers from the store ---- */

static void call_gone(void *arg)
{
    ((api_call_t *)arg)->conn = NULL;
}

static void api_answered(store_status_t st, store_queue_answer_t a, const json_t *body, void *arg)
{
    api_call_t *c = arg;
    if (!c->conn) {
        free(c);
        return;
    }
    http_conn_set_observer(c->conn, NULL, NULL, NULL);
    if (st != STORE_OK) {
        char msg[200];
        snprintf(msg, sizeof(msg), "the store did not answer: %s", store_status_str(st));
        respond_error(c->conn, st == STORE_ERR_UNAVAILABLE ? 503 : 500, "store", msg, NULL,
                      c->keep_alive);
    } else {
        static const int status[] = {
            [STORE_QUEUE_OK] = 200,        [STORE_QUEUE_NOT_FOUND] = 404,
            [STORE_QUEUE_AMBIGUOUS] = 409, [STORE_QUEUE_CONFLICT] = 409,
            [STORE_QUEUE_INVALID] = 400,
        };
        respond_json(c->conn, a == STORE_QUEUE_OK ? c->ok_status : status[a], body, NULL,
                     c->keep_alive);
    }
    free(c);
}

static api_call_t *call_new(http_conn_t *conn, http_request_t *req)
{
    api_call_t *c = xcalloc(1, sizeof(*c));
    c->conn = conn;
    c->keep_alive = req->keep_alive;
    c->ok_status = 200;
    http_conn_set_observer(conn, NULL, call_gone, c);
    return c;
}

/* The store refused the call at once: answered here. */
static void call_refused(api_call_t *c, store_status_t st, const char *why)
{
    http_conn_set_observer(c->conn, NULL, NULL, NULL);
    if (st == STORE_ERR_STATEMENT && why)
        respond_error(c->conn, 400, "invalid", why, NULL, c->keep_alive);
    else
        respond_error(c->conn, 503, "store", store_status_str(st), NULL, c->keep_alive);
    free(c);
}

/* ---- the query string ---- */

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = (char)(c | 0x20);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* The value of name in query (percent-decoded, '+' a space), malloc'd, or NULL. */
static char *query_get(const char *query, const char *name)
{
    size_t nlen = strlen(name);
    for (const char *p = query; p && *p;) {
        size_t len = strcspn(p, "&");
        if (len > nlen && strncmp(p, name, nlen) == 0 && p[nlen] == '=') {
            const char *v = p + nlen + 1, *end = p + len;
            char *out = xmalloc((size_t)(end - v) + 1), *o = out;
            for (; v < end; v++) {
                if (*v == '%' && end - v >= 3 && hexval(v[1]) >= 0 && hexval(v[2]) >= 0) {
                    *o++ = (char)(hexval(v[1]) * 16 + hexval(v[2]));
                    v += 2;
                } else {
                    *o++ = *v == '+' ? ' ' : *v;
                }
            }
            *o = '\0';
            return out;
        }
        p += len;
        if (*p)
            p++;
    }
    return NULL;
}

static void keys_list(const admin_ctx_t *ctx, http_conn_t *conn, http_request_t *req,
                      const char *query)
{
    char *state = query_get(query, "state"), *server = query_get(query, "server");
    char *tool = query_get(query, "tool"), *subject = query_get(query, "subject");
    char *limit = query_get(query, "limit"), *cursor = query_get(query, "cursor");
    store_queue_filter_t f = {.server = server, .tool = tool, .subject = subject, .cursor = cursor};
    if (!store_queue_state_parse(state, &f.state)) {
        respond_error(conn, 400, "invalid",
                      "state is one of unknown, in_progress, succeeded, failed, stuck, open", NULL,
                      req->keep_alive);
        goto out;
    }
    if (limit) {
        char *end;
        long n = strtol(limit, &end, 10);
        if (*end || n < 1 || n > STORE_QUEUE_LIMIT_MAX) {
            respond_error(conn, 400, "invalid", "limit is 1 to 500", NULL, req->keep_alive);
            goto out;
        }
        f.limit = (int)n;
    }
    api_call_t *c = call_new(conn, req);
    store_status_t st = store_queue_list(ctx->store, &f, api_answered, c);
    if (st != STORE_OK)
        call_refused(c, st, "cursor is not one a list answered");
out:
    free(state);
    free(server);
    free(tool);
    free(subject);
    free(limit);
    free(cursor);
}

static void keys_show(const admin_ctx_t *ctx, http_conn_t *conn, http_request_t *req,
                      const char *hash)
{
    api_call_t *c = call_new(conn, req);
    store_status_t st = store_queue_show(ctx->store, hash, api_answered, c);
    if (st != STORE_OK)
        call_refused(c, st, NULL);
}

static void keys_resolve(const admin_ctx_t *ctx, http_conn_t *conn, http_request_t *req,
                         const char *hash, const char *who)
{
    bool keep = req->keep_alive;
    size_t n = evbuffer_get_length(req->body);
    if (n > RESOLVE_BODY_MAX) {
        respond_error(conn, 413, "invalid", "the body is over 4 MiB", NULL, keep);
        return;
    }
    json_error_t jerr;
    json_t *body = json_loadb((const char *)evbuffer_pullup(req->body, -1), n, 0, &jerr);
    const char *outcome = json_string_value(json_object_get(body, "outcome"));
    const json_t *note = json_object_get(body, "note");
    store_queue_resolve_t r = {.key_hash = hash, .actor = who};
    const char *bad = NULL;
    if (!json_is_object(body))
        bad = "the body is a JSON object: {\"outcome\": \"succeeded\" | \"failed\" | \"forget\", "
              "\"result\": {CallToolResult}, \"note\": \"...\"}";
    else if (!store_queue_outcome_parse(outcome, &r.outcome))
        bad = "outcome is one of succeeded, failed, forget";
    else if (note && !json_is_null(note) && !json_is_string(note))
        bad = "note is a string";
    else if (r.outcome == STORE_QUEUE_SUCCEEDED && !json_is_object(json_object_get(body, "result")))
        bad = "a succeeded outcome needs its result: a CallToolResult object ({\"content\": "
              "[...]}) that retries will replay";
    else if (r.outcome != STORE_QUEUE_SUCCEEDED && json_object_get(body, "result"))
        bad = "only a succeeded outcome carries a result";
    if (bad) {
        respond_error(conn, 400, "invalid", bad, NULL, keep);
        json_decref(body);
        return;
    }
    r.note = json_string_value(note);
    r.result = json_object_get(body, "result");
    api_call_t *c = call_new(conn, req);
    store_status_t st = store_queue_resolve(ctx->store, &r, api_answered, c);
    if (st != STORE_OK)
        call_refused(c, st, "the result is not a JSON object");
    json_decref(body);
}

static void page(http_conn_t *conn, bool keep)
{
    http_conn_respond(conn, 200, "text/html; charset=utf-8", admin_page_html,
                      strlen(admin_page_html),
                      "Cache-Control: no-store\r\nX-Frame-Options: DENY\r\n"
                      "Content-Security-Policy: default-src 'none'; script-src 'unsafe-inline'; "
                      "style-src 'unsafe-inline'; img-src data:; connect-src 'self'\r\n",
                      keep);
}

bool admin_keys_handle(const admin_ctx_t *ctx, http_conn_t *conn, http_request_t *req)
{
    const char *t = req->target;
    size_t plen = strcspn(t, "?");
    if (!(plen == 6 && strncmp(t, "/admin", 6) == 0) && strncmp(t, "/admin/", 7) != 0)
        return false;
    const char *query = t[plen] == '?' ? t + plen + 1 : "";
    bool keep = req->keep_alive;
    char path[300];
    snprintf(path, sizeof(path), "%.*s", (int)(plen < sizeof(path) - 1 ? plen : 0), t);
    const size_t api = strlen(API_PREFIX);
    if (strcmp(path, "/admin") == 0 || strcmp(path, "/admin/") == 0) {
        if (req->method != HTTP_GET)
            respond_error(conn, 405, "method", "GET", "Allow: GET\r\n", keep);
        else
            page(conn, keep);
        goto done;
    }
    if (strncmp(path, API_PREFIX, api) != 0 || (path[api] && path[api] != '/')) {
        respond_error(conn, 404, "not_found", "no such admin endpoint", NULL, keep);
        goto done;
    }
    char who[STORE_QUEUE_ACTOR_MAX + 1];
    if (!authorized(ctx, conn, req, who, sizeof(who)))
        goto done;
    if (!ctx->store) {
        respond_error(conn, 503, "store", "no store is configured (database_url: none)", NULL,
                      keep);
        goto done;
    }
    const char *rest = path[api] == '/' ? path + api + 1 : "";
    const char *slash = strchr(rest, '/');
    if (!rest[0]) {
        if (req->method != HTTP_GET)
            respond_error(conn, 405, "method", "GET", "Allow: GET\r\n", keep);
        else
            keys_list(ctx, conn, req, query);
    } else if (!slash) {
        if (req->method != HTTP_GET)
            respond_error(conn, 405, "method", "GET", "Allow: GET\r\n", keep);
        else
            keys_show(ctx, conn, req, rest);
    } else if (strcmp(slash, "/resolve") == 0) {
        char hash[80];
        snprintf(hash, sizeof(hash), "%.*s", (int)(slash - rest < 79 ? slash - rest : 0), rest);
        if (req->method != HTTP_POST)
            respond_error(conn, 405, "method", "POST", "Allow: POST\r\n", keep);
        else
            keys_resolve(ctx, conn, req, hash, who);
    } else {
        respond_error(conn, 404, "not_found", "no such admin endpoint", NULL, keep);
    }
done:
    http_request_free(req);
    return true;
}

/* ---- /metrics ---- */

static void label(char *out, size_t outlen, const char *v)
{
    size_t o = 0;
    for (; *v && o + 3 < outlen; v++) {
        if (*v == '\\' || *v == '"' || *v == '\n')
            out[o++] = '\\';
        out[o++] = *v == '\n' ? 'n' : *v;
    }
    out[o] = '\0';
}

void admin_keys_metrics(struct evbuffer *b, const json_t *summary)
{
    evbuffer_add_printf(
        b, "# HELP idemgw_operator_queue_keys Keys whose outcome is unknown, waiting for an "
           "operator, by server and tool (read from the store at the scrape).\n"
           "# TYPE idemgw_operator_queue_keys gauge\n");
    size_t i;
    json_t *u;
    double oldest = -1;
    json_array_foreach(json_object_get(summary, "unknown"), i, u)
    {
        const char *tool = json_string_value(json_object_get(u, "tool"));
        const char *slash = tool ? strchr(tool, '/') : NULL;
        char server[200] = "", name[400];
        if (slash)
            snprintf(server, sizeof(server), "%.*s", (int)(slash - tool), tool);
        char ls[400];
        label(ls, sizeof(ls), server);
        label(name, sizeof(name), slash ? slash + 1 : tool ? tool : "");
        evbuffer_add_printf(b, "idemgw_operator_queue_keys{server=\"%s\",tool=\"%s\"} %lld\n", ls,
                            name, (long long)json_integer_value(json_object_get(u, "keys")));
        double age = (double)json_integer_value(json_object_get(u, "oldest_ms")) / 1000.0;
        if (age > oldest)
            oldest = age;
    }
    evbuffer_add_printf(b, "# HELP idemgw_operator_queue_oldest_seconds How long the oldest "
                           "unknown outcome has waited for an operator (0: none waits).\n"
                           "# TYPE idemgw_operator_queue_oldest_seconds gauge\n");
    if (summary)
        evbuffer_add_printf(b, "idemgw_operator_queue_oldest_seconds %.3f\n",
                            oldest < 0 ? 0.0 : oldest);
    evbuffer_add_printf(b, "# HELP idemgw_operator_resolutions_total Keys operators resolved, by "
                           "outcome (every replica's, kept in the store).\n"
                           "# TYPE idemgw_operator_resolutions_total counter\n");
    static const char *const outcomes[] = {"succeeded", "failed", "forget"};
    long long counts[3] = {0}, waited[3] = {0};
    json_array_foreach(json_object_get(summary, "resolutions"), i, u)
    {
        store_queue_outcome_t o;
        if (store_queue_outcome_parse(json_string_value(json_object_get(u, "outcome")), &o)) {
            counts[o] = (long long)json_integer_value(json_object_get(u, "count"));
            waited[o] = (long long)json_integer_value(json_object_get(u, "waited_ms"));
        }
    }
    for (int o = 0; summary && o < 3; o++)
        evbuffer_add_printf(b, "idemgw_operator_resolutions_total{outcome=\"%s\"} %lld\n",
                            outcomes[o], counts[o]);
    evbuffer_add_printf(b, "# HELP idemgw_operator_resolution_seconds Time from an unknown "
                           "outcome to an operator's resolution.\n"
                           "# TYPE idemgw_operator_resolution_seconds summary\n");
    long long n = 0, sum = 0;
    for (int o = 0; o < 3; o++) {
        n += counts[o];
        sum += waited[o];
    }
    if (summary)
        evbuffer_add_printf(b,
                            "idemgw_operator_resolution_seconds_sum %.3f\n"
                            "idemgw_operator_resolution_seconds_count %lld\n",
                            (double)sum / 1000.0, n);
}
