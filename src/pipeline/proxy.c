/* The router: validates each agent request (target, head, body), classifies it by the policy
 * and hands it to a stage or relays it. The request object it makes is exchange.c's. */
#include "proxy.h"
#include "exchange_int.h"
#include "proxy_int.h"
#include "body_rules.h"
#include "cors.h"
#include "log.h"
#include "policy.h"
#include "revision.h"
#include "subject.h"
#include "target.h"
#include "upstream.h"
#include "util.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <llhttp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* --- request validation and classification --- */

/* The mirrored headers of SEP-2243 (Mcp-Method, Mcp-Name, MCP-Protocol-Version) against the
 * body: revision.c decides. */
static const char *header_mismatch(const http_request_t *req, const mcp_msg_t *m, const char *body,
                                   size_t len)
{
    const revision_headers_t h = {
        .protocol_version = http_headers_get(&req->headers, "mcp-protocol-version"),
        .method = http_headers_get(&req->headers, "mcp-method"),
        .name = http_headers_get(&req->headers, "mcp-name"),
    };
    return revision_header_mismatch(&h, m, body, len);
}

/* Headers whose copies a proxy cannot merge safely (RFC 9110 5.3): one copy checked, another
 * acted on, as Host, Origin, credentials, keys and sessions would be. */
static const char *duplicated_header(const http_headers_t *h)
{
    static const char *const once[] = {
        "Host",           "Origin",     "Authorization", "Idempotency-Key",
        "Mcp-Session-Id", "Mcp-Method", "Mcp-Name",      "MCP-Protocol-Version"};
    for (size_t i = 0; i < ARRAY_LEN(once); i++)
        if (http_headers_count(h, once[i]) > 1)
            return once[i];
    return NULL;
}

static void refuse(exchange_t *ex, int status, int code, const char *message, const char *extra)
{
    ex->outcome = "refused";
    exchange_respond_error(ex, status, code, message, extra);
}

/* A 403 for Host or Origin names the header, the value refused and the setting that would
 * allow it, in the log and in the answer. */
static void forbid(exchange_t *ex, const char *header, const char *value, const char *setting)
{
    char shown[200];
    snprintf(shown, sizeof(shown), "%s", value ? value : "");
    for (char *s = shown; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f || *s == '"' || *s == '\\')
            *s = '?';
    exchange_set_facts(
        ex, &(exchange_facts_t){.forbidden_header = header, .value = shown, .setting = setting});
    char msg[400];
    snprintf(msg, sizeof(msg),
             "forbidden: %s \"%s\" is not allowed by this gateway; add it to the %s setting to "
             "allow it",
             header, value ? shown : "(missing)", setting);
    refuse(ex, 403, -32000, msg, NULL);
}

/* The target in its normal form (target.h), which replaces the one received: the routing
 * below and the upstream see one spelling. The MCP endpoint, however spelled, goes up as the
 * endpoint's own path. False when refused. */
static bool normalize_target(exchange_t *ex, bool *mcp_path)
{
    const config_t *cfg = ex->proxy->ctx.cfg;
    http_request_t *req = ex->req;
    if (req->method == HTTP_CONNECT)
        return true; /* an authority alone: refused next, by method */
    target_t t;
    target_status_t st = target_normalize(req->target, &t);
    if (st != TARGET_OK) {
        char msg[200];
        snprintf(msg, sizeof(msg), "bad request: %s; nothing was forwarded", target_status_str(st));
        target_free(&t);
        refuse(ex, 400, -32600, msg, NULL);
        return false;
    }
    if (t.authority && !config_host_allowed(cfg, t.authority)) {
        forbid(ex, "request target authority", t.authority, "allowed_hosts");
        target_free(&t);
        return false;
    }
    *mcp_path = target_is_endpoint(t.path, cfg->upstream_path);
    free(req->target);
    req->target = target_origin_form(*mcp_path ? cfg->upstream_path : t.path, t.query);
    target_free(&t);
    return true;
}

/* The request's head: method, path, header copies, Host and Origin. False when refused. */
static bool head_acceptable(exchange_t *ex, bool mcp_path)
{
    const config_t *cfg = ex->proxy->ctx.cfg;
    const http_request_t *req = ex->req;
    if (req->method == HTTP_CONNECT) {
        refuse(ex, 405, -32600, "method not allowed: CONNECT is not proxied", NULL);
        return false;
    }
    if (!mcp_path && !cfg->forward_other_paths) {
        refuse(ex, 404, -32600,
               "not found: the MCP endpoint is elsewhere (forward_other_paths is off)", NULL);
        return false;
    }
    const char *dup = duplicated_header(&req->headers);
    if (dup) {
        char msg[160];
        snprintf(msg, sizeof(msg),
                 "bad request: the %s header appears more than once; send it once. Nothing was "
                 "forwarded.",
                 dup);
        exchange_set_facts(ex, &(exchange_facts_t){.duplicate_header = dup});
        refuse(ex, 400, -32600, msg, NULL);
        return false;
    }
    const char *host = http_headers_get(&req->headers, "host");
    const char *origin = http_headers_get(&req->headers, "origin");
    bool host_ok = config_host_allowed(cfg, host);
    if (!host_ok || !config_origin_allowed(cfg, origin)) {
        forbid(ex, host_ok ? "Origin" : "Host", host_ok ? origin : host,
               host_ok ? "allowed_origins" : "allowed_hosts");
        return false;
    }
    return true;
}

/* A tool's class: from the catalogue (the policy, then the server's annotations), else the
 * policy alone. */
static tool_class_t classify_tool(proxy_t *p, const char *tool)
{
    if (p->ctx.classify.call_class)
        return p->ctx.classify.call_class(p->ctx.classify.arg, tool);
    return policy_lookup(&p->ctx.cfg->policy, tool)->cls;
}

/* A tools/call request's tool: its class, for the handlers and the span. */
static void classify_call(exchange_t *ex)
{
    const char *tool = ex->msg.tool;
    if (ex->msg.kind != MCP_KIND_REQUEST || !tool)
        return;
    ex->tool_class = classify_tool(ex->proxy, tool);
}

/* A tools/call as it ends, by tool, class and outcome, for /metrics: the catalogue is asked
 * then, since the upstream's tools/list may have come in while the call ran. */
static void count_tool_call(const exchange_t *ex)
{
    const proxy_t *p = ex->proxy;
    const proxy_classifier_t *c = &p->ctx.classify;
    if (!ex->has_msg || ex->msg.kind != MCP_KIND_REQUEST || !ex->msg.tool || !c->call_class)
        return;
    const char *tool = ex->msg.tool;
    stats_tool_t *t =
        stats_tool(p->ctx.stats, p->ctx.cfg->server_name, tool, c->known(c->arg, tool));
    t->cls = (uint32_t)c->tool_class(c->arg, tool);
    stats_outcome_t o = stats_outcome_of(ex->outcome ? ex->outcome : "forwarded");
    t->calls[o]++;
}

static bool protected_tool(proxy_t *p, const char *tool)
{
    return classify_tool(p, tool) == TOOL_CLASS_NON_IDEMPOTENT;
}

/* The request's Content-Encoding when it is one the gateway would have to decode to read the
 * body (it decodes none), else NULL. */
static const char *encoded_body(const http_request_t *req)
{
    const char *ce = http_headers_get(&req->headers, "content-encoding");
    if (!ce || evbuffer_get_length(req->body) == 0)
        return NULL;
    while (*ce == ' ' || *ce == '\t')
        ce++;
    return *ce == '\0' || strcasecmp(ce, "identity") == 0 ? NULL : ce;
}

static void refuse_encoded(exchange_t *ex, const char *coding)
{
    char msg[300], shown[64];
    snprintf(shown, sizeof(shown), "%s", coding);
    for (char *c = shown; *c; c++)
        if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f || *c == '"' || *c == '\\')
            *c = '?';
    snprintf(msg, sizeof(msg),
             "bad request: the body has Content-Encoding %s, which the gateway does not decode; "
             "send it uncompressed. Nothing was forwarded.",
             shown);
    refuse(ex, 400, -32600, msg, NULL);
}

/* A tools/call without an id is a notification: the server owes no answer, so none could be
 * recorded or replayed, and a lenient server runs it all the same. Refused wherever it is,
 * whatever its tool. */
static void refuse_call_without_id(exchange_t *ex)
{
    refuse(ex, 400, -32600,
           "invalid request: a tools/call needs an id (sent as a notification, alone or in a "
           "batch, it has no answer to record or replay); nothing was executed",
           NULL);
}

/* The POST body: JSON-RPC, headers that agree with it, no protected call inside a batch. False
 * when refused. */
static bool body_acceptable(exchange_t *ex)
{
    const char *coding = encoded_body(ex->req);
    if (coding) {
        refuse_encoded(ex, coding);
        return false;
    }
    size_t blen = evbuffer_get_length(ex->req->body);
    const char *body = (const char *)evbuffer_pullup(ex->req->body, -1);
    mcp_status_t st = mcp_parse(body ? body : "", blen, &ex->msg);
    if (st == MCP_ERR_PARSE) {
        refuse(ex, 400, -32700, "parse error: the body is not JSON", NULL);
        return false;
    }
    if (st != MCP_OK) {
        refuse(ex, 400, -32600, "invalid request: expected a JSON-RPC object or array", NULL);
        return false;
    }
    ex->has_msg = true;
    classify_call(ex);
    if (ex->traced)
        exchange_adopt_trace_meta(ex, body ? body : "", blen);
    const char *mismatch = header_mismatch(ex->req, &ex->msg, body, blen);
    if (mismatch) {
        refuse(ex, 400, -32020, mismatch, NULL);
        return false;
    }
    if (ex->msg.call_without_id) {
        refuse_call_without_id(ex);
        return false;
    }
    if (ex->msg.kind == MCP_KIND_BATCH) {
        bool protected_inside = ex->msg.batch_bad_tool;
        for (size_t i = 0; i < ex->msg.n_batch_tools && !protected_inside; i++)
            protected_inside = protected_tool(ex->proxy, ex->msg.batch_tools[i]);
        if (protected_inside) {
            refuse(ex, 400, -32600,
                   "a batch may not contain a non-idempotent tools/call: send each protected call "
                   "in its own request; nothing was executed",
                   NULL);
            return false;
        }
    }
    if (exchange_is_cancel(ex)) {
        /* the request id it names, kept for when the upstream has taken the cancel (the body
         * itself goes up) */
        json_t *root = json_loadb(body, blen, 0, NULL);
        ex->cancel_id = json_incref(json_object_get(json_object_get(root, "params"), "requestId"));
        json_decref(root);
    }
    return true;
}

/* Whether a body must be read as JSON: a JSON media type, or a first byte (after a BOM and
 * whitespace, which lenient parsers skip) that opens an object or an array. */
static bool looks_like_json(const http_request_t *req, const char *body, size_t len)
{
    const char *ct = http_headers_get(&req->headers, "content-type");
    if (ct && strcasestr(ct, "json"))
        return true;
    size_t i = 0;
    if (len >= 3 && memcmp(body, "\xEF\xBB\xBF", 3) == 0)
        i = 3;
    while (i < len && (body[i] == ' ' || body[i] == '\t' || body[i] == '\r' || body[i] == '\n'))
        i++;
    return i < len && (body[i] == '{' || body[i] == '[');
}

typedef struct call_scan {
    proxy_t *proxy;
    bool protected_inside; /* a protected tools/call, or one whose name is not a string */
    bool without_id;       /* a tools/call sent as a notification */
} call_scan_t;

static void scan_one_call(void *arg, const char *tool, bool has_id)
{
    call_scan_t *sc = arg;
    if (!tool || protected_tool(sc->proxy, tool))
        sc->protected_inside = true;
    if (!has_id)
        sc->without_id = true;
}

/* A body refused by one of body_rules.h's rules: 415 for what its encoding or media type
 * makes it, 400 for a body the method may not have. */
static void refuse_body(exchange_t *ex, body_rules_status_t st)
{
    char msg[400];
    snprintf(msg, sizeof(msg), "%s: %s; nothing was forwarded",
             st == BODY_RULES_ERR_METHOD ? "bad request" : "unsupported media type",
             body_rules_status_str(st));
    refuse(ex, st == BODY_RULES_ERR_METHOD ? 400 : 415, -32600, msg, NULL);
}

/* A GET, HEAD, DELETE or TRACE with a body, on the endpoint or off it: the router reads
 * JSON-RPC only from a POST, and a framework that reads the body of any method would run what
 * it holds. False when refused. */
static bool method_body_acceptable(exchange_t *ex)
{
    const http_request_t *req = ex->req;
    body_rules_status_t st = body_rules_method(
        req->method, http_headers_get(&req->headers, "content-length"),
        http_headers_get(&req->headers, "transfer-encoding"), evbuffer_get_length(req->body));
    if (st != BODY_RULES_OK) {
        refuse_body(ex, st);
        return false;
    }
    return true;
}

/* A request the MCP rules do not apply to (another path: OAuth metadata, health, a legacy
 * SSE stream; or OPTIONS, PUT...): relayed as a plain reverse proxy would, but only once the
 * gateway has seen that its body holds no protected call, since some server would execute one
 * sent here (one that serves MCP on every path, the legacy HTTP+SSE transport's message
 * path). A body it cannot read (compressed, UTF-16 or UTF-32, text that is not UTF-8, or JSON
 * it cannot parse) is refused, and so is one holding a protected tools/call or a tools/call
 * without an id: forwarding either could execute it unprotected. */
static void forward_plain(exchange_t *ex)
{
    const config_t *cfg = ex->proxy->ctx.cfg;
    size_t blen = evbuffer_get_length(ex->req->body);
    if (blen > 0) {
        const char *coding = encoded_body(ex->req);
        if (coding) {
            refuse_encoded(ex, coding);
            return;
        }
        const char *body = (const char *)evbuffer_pullup(ex->req->body, -1);
        const char *ctype = http_headers_get(&ex->req->headers, "content-type");
        /* first what the bytes are, so the refusal names UTF-16 rather than a parse error */
        body_rules_status_t enc = body_rules_encoding(ctype, body, blen);
        if (enc != BODY_RULES_OK) {
            refuse_body(ex, enc);
            return;
        }
        if (mcp_parse(body, blen, &ex->msg) == MCP_OK) {
            ex->has_msg = true; /* the log line and a refusal name the method, id and tool */
            classify_call(ex);
        }
        call_scan_t sc = {.proxy = ex->proxy};
        if (looks_like_json(ex->req, body, blen) &&
            mcp_each_call(body, blen, scan_one_call, &sc) != MCP_OK) {
            refuse(ex, 400, -32700,
                   "parse error: the body is not JSON the gateway can read (invalid UTF-8, a "
                   "lone surrogate, a byte order mark or nesting too deep); nothing was forwarded",
                   NULL);
            return;
        }
        if (sc.protected_inside) {
            char msg[400];
            snprintf(msg, sizeof(msg),
                     "a non-idempotent tools/call is only accepted as a POST to the MCP "
                     "endpoint %s (Streamable HTTP), where it is protected; nothing was "
                     "executed",
                     cfg->upstream_path);
            refuse(ex, 400, -32600, msg, NULL);
            return;
        }
        if (sc.without_id) {
            refuse_call_without_id(ex);
            return;
        }
        /* after the JSON scan, which answers a JSON body that is not UTF-8 as a parse error */
        body_rules_status_t text = body_rules_text(ctype, body, blen);
        if (text != BODY_RULES_OK) {
            refuse_body(ex, text);
            return;
        }
    }
    if (ex->req->method == HTTP_GET)
        exchange_track_get(ex); /* a stream (legacy SSE): the drain ends it */
    exchange_forward(ex, NULL, false);
}

/* An MCP request that passed validation goes to the first handler that takes it, else
 * upstream. */
static void offer(proxy_t *p, exchange_t *ex)
{
    exchange_set_state(ex, EX_CLAIMING);
    for (size_t i = 0; i < p->n_handlers; i++)
        if (p->handlers[i].offer(p->handlers[i].arg, ex) == HANDLER_TAKEN)
            return;
    exchange_forward(ex, NULL, false);
}

void proxy_handle(void *arg, http_conn_t *conn, http_request_t *req)
{
    proxy_t *p = arg;
    exchange_t *ex = exchange_new(p, conn, req);

    bool mcp_path = false;
    if (!normalize_target(ex, &mcp_path) || !head_acceptable(ex, mcp_path) ||
        !method_body_acceptable(ex))
        return;
    if (!mcp_path || (req->method != HTTP_GET && req->method != HTTP_POST)) {
        forward_plain(ex);
        return;
    }
    if (req->method == HTTP_GET) {
        if (exchange_resume(ex))
            return;
        exchange_track_get(ex);
    } else if (!body_acceptable(ex)) {
        return;
    }
    offer(p, ex);
}

/* --- the proxy --- */

proxy_t *proxy_new(const proxy_ctx_t *ctx)
{
    proxy_t *p = xcalloc(1, sizeof(*p));
    p->ctx = *ctx;
    p->on_closed = count_tool_call;
    return p;
}

void proxy_free(proxy_t *p)
{
    /* NULL when the worker failed before wiring its stages (the store refused to open) */
    if (!p)
        return;
    p->ctx.exchange_ended = NULL; /* nothing is left to tell */
    exchange_end_all(p);
    cors_table_free(&p->cors);
    free(p);
}

void proxy_set_hooks(proxy_t *p, const proxy_hooks_t *hooks)
{
    p->hooks = *hooks;
}

void proxy_add_handler(proxy_t *p, const handler_t *h)
{
    if (p->n_handlers == PROXY_MAX_HANDLERS) {
        log_error(0, "proxy: more than %d handlers (raise PROXY_MAX_HANDLERS)", PROXY_MAX_HANDLERS);
        abort();
    }
    p->handlers[p->n_handlers++] = *h;
}

void proxy_reconfigure(proxy_t *p, const config_t *cfg)
{
    p->ctx.cfg = cfg;
}
