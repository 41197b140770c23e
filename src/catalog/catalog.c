/* The upstream's tool catalogue (see include/catalog.h). */
#include "catalog.h"

#include "log.h"
#include "rpc_reader.h"
#include "util.h"

#include <event2/event.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A tools/list answer larger than this is not read (its tools stay unknown: default class). */
#define CATALOG_MAX_ANSWER (8u * 1024 * 1024)
/* Names called but never listed that are remembered (to log each once): an agent's made-up
 * names must not crowd the server's tools out of the catalogue. */
#define CATALOG_MAX_UNLISTED 256

struct catalog {
    catalog_tool_t *tools; /* sorted by name */
    size_t n, cap;
    const policy_t *policy;
    size_t n_unlisted; /* entries only seen called */
    bool full_logged;  /* CATALOG_MAX_TOOLS reached: said once */
    bool status_tool;  /* tools/list answers offer CATALOG_STATUS_TOOL */
    char *server;      /* the server's name under servers:, on its log lines; or NULL */
};

static const char *const source_names[] = {"policy", "annotation", "default"};

const char *class_source_name(class_source_t s)
{
    return (size_t)s < ARRAY_LEN(source_names) ? source_names[s] : "?";
}

catalog_t *catalog_new(void)
{
    return xcalloc(1, sizeof(catalog_t));
}

static void props_free(catalog_tool_t *k)
{
    for (size_t i = 0; i < k->n_props; i++)
        free(k->props[i]);
    free(k->props);
    k->props = NULL;
    k->n_props = 0;
}

void catalog_free(catalog_t *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n; i++) {
        free(c->tools[i].name);
        props_free(&c->tools[i]);
    }
    free(c->tools);
    free(c->server);
    free(c);
}

void catalog_set_policy(catalog_t *c, const policy_t *p)
{
    c->policy = p;
}

/* The index of tool, or where it would go (*found false). */
static size_t position(const catalog_t *c, const char *tool, bool *found)
{
    size_t lo = 0, hi = c->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int r = strcmp(tool, c->tools[mid].name);
        if (r == 0) {
            *found = true;
            return mid;
        }
        if (r < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    *found = false;
    return lo;
}

const catalog_tool_t *catalog_find(const catalog_t *c, const char *tool)
{
    bool found;
    size_t i = position(c, tool, &found);
    return found ? &c->tools[i] : NULL;
}

size_t catalog_size(const catalog_t *c)
{
    return c->n;
}

const catalog_tool_t *catalog_at(const catalog_t *c, size_t i)
{
    return &c->tools[i];
}

/* The entry for tool, added when new; NULL when the catalogue is full. */
static catalog_tool_t *entry(catalog_t *c, const char *tool)
{
    bool found;
    size_t i = position(c, tool, &found);
    if (found)
        return &c->tools[i];
    if (c->n >= CATALOG_MAX_TOOLS) {
        if (!c->full_logged)
            log_warn(0, "tool catalogue full (%d tools): further tools get the default class",
                     CATALOG_MAX_TOOLS);
        c->full_logged = true;
        return NULL;
    }
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 32;
        c->tools = xrealloc(c->tools, c->cap * sizeof(*c->tools));
    }
    memmove(&c->tools[i + 1], &c->tools[i], (c->n - i) * sizeof(*c->tools));
    c->n++;
    c->tools[i] = (catalog_tool_t){.name = xstrdup(tool)};
    return &c->tools[i];
}

tool_class_t catalog_classify(const catalog_t *c, const char *tool, class_source_t *source)
{
    class_source_t dummy;
    if (!source)
        source = &dummy;
    const policy_tool_t *t = policy_find(c->policy, tool);
    if (t) {
        *source = CLASS_FROM_POLICY;
        return t->cls;
    }
    const catalog_tool_t *k = tool ? catalog_find(c, tool) : NULL;
    if (k && c->policy->defaults.trust_annotations) {
        if (k->read_only == HINT_TRUE) {
            *source = CLASS_FROM_ANNOTATION;
            return TOOL_CLASS_READ;
        }
        if (k->idempotent == HINT_TRUE) {
            *source = CLASS_FROM_ANNOTATION;
            return TOOL_CLASS_IDEMPOTENT;
        }
    }
    *source = CLASS_FROM_DEFAULT;
    return c->policy->defaults.cls;
}

static const char *hint_text(hint_t h)
{
    return h == HINT_TRUE ? "true" : h == HINT_FALSE ? "false" : "unset";
}

static void log_class(catalog_t *c, catalog_tool_t *k)
{
    class_source_t src;
    tool_class_t cls = catalog_classify(c, k->name, &src);
    char name[300], fields[700];
    log_json_string(name, sizeof(name), k->name);
    snprintf(fields, sizeof(fields),
             "%s%s%s\"tool\":%s,\"class\":\"%s\",\"class_source\":\"%s\",\"listed\":%s,"
             "\"read_only_hint\":\"%s\",\"idempotent_hint\":\"%s\",\"destructive_hint\":\"%s\"",
             c->server ? "\"server\":\"" : "", c->server ? c->server : "", c->server ? "\"," : "",
             name, tool_class_name(cls), class_source_name(src), k->listed ? "true" : "false",
             hint_text(k->read_only), hint_text(k->idempotent), hint_text(k->destructive));
    if (k->listed)
        LOG_AT(LOG_INFO, 0, fields, "tool class");
    else
        LOG_AT(LOG_WARN, 0, fields,
               "tool class: a tool neither the policy nor the server's tools/list names");
    k->logged = true;
}

tool_class_t catalog_classify_call(catalog_t *c, const char *tool)
{
    if (tool && !policy_find(c->policy, tool) && !catalog_find(c, tool) &&
        c->n_unlisted < CATALOG_MAX_UNLISTED) {
        catalog_tool_t *k = entry(c, tool);
        if (k) {
            c->n_unlisted++;
            log_class(c, k);
        }
    }
    return catalog_classify(c, tool, NULL);
}

static hint_t hint_of(const json_t *annotations, const char *name)
{
    const json_t *v = json_object_get(annotations, name);
    return json_is_true(v) ? HINT_TRUE : json_is_false(v) ? HINT_FALSE : HINT_UNSET;
}

int catalog_learn(catalog_t *c, const char *result, size_t len)
{
    json_t *root = json_loadb(result, len, JSON_DECODE_ANY, NULL);
    const json_t *tools = json_object_get(root, "tools");
    if (!json_is_array(tools)) {
        json_decref(root);
        return -1;
    }
    int n = 0;
    size_t i;
    const json_t *tool;
    json_array_foreach(tools, i, tool)
    {
        const char *name = json_string_value(json_object_get(tool, "name"));
        if (!name || !*name)
            continue;
        const json_t *ann = json_object_get(tool, "annotations");
        hint_t ro = hint_of(ann, "readOnlyHint"), idem = hint_of(ann, "idempotentHint"),
               destr = hint_of(ann, "destructiveHint");
        catalog_tool_t *k = entry(c, name);
        if (!k)
            break;
        n++;
        props_free(k);
        const json_t *props = json_object_get(json_object_get(tool, "inputSchema"), "properties");
        const char *prop;
        const json_t *pv;
        if (json_is_object(props))
            k->props = xcalloc(CATALOG_MAX_PROPS, sizeof(char *));
        json_object_foreach((json_t *)props, prop, pv)
        {
            if (k->n_props == CATALOG_MAX_PROPS)
                break;
            k->props[k->n_props++] = xstrdup(prop);
        }
        if (k->listed && k->read_only == ro && k->idempotent == idem && k->destructive == destr)
            continue;
        if (!k->listed && k->logged)
            c->n_unlisted--; /* called before the server listed it */
        k->listed = true;
        k->read_only = ro;
        k->idempotent = idem;
        k->destructive = destr;
        log_class(c, k);
    }
    json_decref(root);
    return n;
}

bool catalog_known(const catalog_t *c, const char *tool)
{
    const catalog_tool_t *k = tool ? catalog_find(c, tool) : NULL;
    return tool && (policy_find(c->policy, tool) || (k && k->listed));
}

static tool_class_t classifier_call_class(void *arg, const char *tool)
{
    return catalog_classify_call(arg, tool);
}

static bool classifier_known(void *arg, const char *tool)
{
    return catalog_known(arg, tool);
}

static tool_class_t classifier_tool_class(void *arg, const char *tool)
{
    return catalog_classify(arg, tool, NULL);
}

proxy_classifier_t catalog_classifier(catalog_t *c)
{
    return (proxy_classifier_t){
        .call_class = classifier_call_class,
        .known = classifier_known,
        .tool_class = classifier_tool_class,
        .arg = c,
    };
}

bool catalog_declares(const catalog_t *c, const char *tool, const char *prop)
{
    const catalog_tool_t *k = tool ? catalog_find(c, tool) : NULL;
    for (size_t i = 0; k && i < k->n_props; i++)
        if (strcmp(k->props[i], prop) == 0)
            return true;
    return false;
}

/* --- what agents see of tools/list --- */

static bool advertises(const policy_tool_t *t)
{
    return t->advertise_key && t->key_arg && *t->key_arg;
}

bool catalog_rewrites(const catalog_t *c, const catalog_rewrite_t *rw)
{
    if (rw->status_tool || advertises(&c->policy->defaults))
        return true;
    for (size_t i = 0; i < c->policy->n_tools; i++)
        if (advertises(&c->policy->tools[i]))
            return true;
    return false;
}

static json_t *status_tool_definition(void)
{
    return json_pack(
        "{s:s, s:s, s:s, s:{s:s, s:{s:{s:s, s:s}, s:{s:s, s:s}, s:{s:s, s:s}}, s:[s]}, "
        "s:{s:b, s:b}}",
        "name", CATALOG_STATUS_TOOL, "title", "Status of an earlier tool call", "description",
        "Tells whether an earlier call of another tool already ran, for you only: not found, "
        "running (since when), succeeded (with its stored result), failed, or outcome unknown. "
        "Give the tool name and the exact arguments of that call, or the idempotency key you "
        "gave it. Use it instead of repeating a call whose answer you did not get. It never "
        "runs anything.",
        "inputSchema", "type", "object", "properties", "tool", "type", "string", "description",
        "the name of the tool that was called", "arguments", "type", "object", "description",
        "the arguments of that call, exactly as sent", POLICY_KEY_ARG_DEFAULT, "type", "string",
        "description", "the idempotency key given to that call, if it had one", "required", "tool",
        "annotations", "readOnlyHint", 1, "idempotentHint", 1);
}

/* Adds the key argument to one tool's definition; true when it changed. */
static bool advertise_key(const catalog_t *c, json_t *tool, const char *name)
{
    const policy_tool_t *pt = policy_lookup(c->policy, name);
    if (!advertises(pt) || catalog_classify(c, name, NULL) != TOOL_CLASS_NON_IDEMPOTENT)
        return false;
    json_t *schema = json_object_get(tool, "inputSchema");
    if (!json_is_object(schema)) {
        schema = json_pack("{s:s}", "type", "object");
        json_object_set_new(tool, "inputSchema", schema);
    }
    json_t *props = json_object_get(schema, "properties");
    if (!json_is_object(props)) {
        props = json_object();
        json_object_set_new(schema, "properties", props);
    }
    if (json_object_get(props, pt->key_arg))
        return false; /* the server's own argument: its meaning is the server's */
    char text[400];
    snprintf(text, sizeof(text),
             "Optional: a string you choose for this one operation. If you repeat the call "
             "(after a timeout or an error), pass the same %s and it will not be executed twice.",
             pt->key_arg);
    json_object_set_new(props, pt->key_arg,
                        json_pack("{s:s, s:s}", "type", "string", "description", text));
    const char *desc = json_string_value(json_object_get(tool, "description"));
    snprintf(text, sizeof(text),
             "%s%sPass an %s of your choosing, the same when you repeat this call, so that a "
             "repeat is never executed twice.",
             desc ? desc : "", desc && *desc ? " " : "", pt->key_arg);
    json_object_set_new(tool, "description", json_string(text));
    return true;
}

char *catalog_rewrite_list(const catalog_t *c, const catalog_rewrite_t *rw, const char *result,
                           size_t len)
{
    json_t *root = json_loadb(result, len, 0, NULL);
    json_t *tools = json_object_get(root, "tools");
    if (!json_is_array(tools)) {
        json_decref(root);
        return NULL;
    }
    bool changed = false, has_status = false;
    size_t i;
    json_t *tool;
    json_array_foreach(tools, i, tool)
    {
        const char *name = json_string_value(json_object_get(tool, "name"));
        if (!name)
            continue;
        has_status = has_status || strcmp(name, CATALOG_STATUS_TOOL) == 0;
        changed = advertise_key(c, tool, name) || changed;
    }
    if (rw->status_tool && !has_status && !json_object_get(root, "nextCursor")) {
        json_array_append_new(tools, status_tool_definition());
        changed = true;
    }
    char *out = changed ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return out;
}

/* --- watching a tools/list answer --- */

typedef struct list_watch {
    catalog_t *catalog;
    exchange_t *ex;
    rpc_reader_t reader;
    bool learned;
    catalog_rewrite_t rw;
    bool rewriting;      /* the answer is held for the rewritten one */
    char *id_text;       /* the request's id, for the rewritten answer */
    char *answer;        /* the rewritten response, or NULL: release the held one */
} list_watch_t;

/* Learns as soon as the answer is known: for a stream, in the same turn of the loop as its
 * event goes to the agent, so a tools/call the agent sends next is classified by it. */
static void learn_once(list_watch_t *w)
{
    if (w->learned || !w->reader.result || w->reader.cls != MCP_RESP_RESULT)
        return;
    w->learned = true;
    (void)catalog_learn(w->catalog, w->reader.result, w->reader.result_len);
}

static observe_t watch_head(void *arg, int status, const http_headers_t *headers, bool sse)
{
    list_watch_t *w = arg;
    rpc_reader_head(&w->reader, status, headers, sse);
    w->rewriting = w->rewriting && status == 200;
    return w->rewriting ? OBSERVE_HOLD : OBSERVE_PASS;
}

static observe_t watch_body(void *arg, const char *data, size_t len)
{
    list_watch_t *w = arg;
    rpc_reader_body(&w->reader, data, len);
    learn_once(w);
    return OBSERVE_PASS;
}

static observe_t watch_end(void *arg, upstream_result_t res)
{
    list_watch_t *w = arg;
    bool found = res == UPSTREAM_OK && rpc_reader_end(&w->reader);
    if (found)
        learn_once(w);
    if (!w->rewriting)
        return OBSERVE_PASS;
    char *result = found && w->reader.cls == MCP_RESP_RESULT
                       ? catalog_rewrite_list(w->catalog, &w->rw, w->reader.result,
                                              w->reader.result_len)
                       : NULL;
    if (result) {
        w->answer = xasprintf("{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":%s}", w->id_text, result);
        free(result);
    }
    /* answered from here (exchange.h): w is gone once this returns to the exchange */
    exchange_t *ex = w->ex;
    if (w->answer)
        exchange_replace_answer(ex, w->answer);
    else
        exchange_release(ex);
    return OBSERVE_PASS;
}

static void watch_detach(void *arg)
{
    list_watch_t *w = arg;
    rpc_reader_free(&w->reader);
    free(w->id_text);
    free(w->answer);
    free(w);
}

static const response_observer_t watch_ops = {
    .on_head = watch_head,
    .on_body = watch_body,
    .on_end = watch_end,
    .detach = watch_detach,
};

void catalog_observe(catalog_t *c, const catalog_rewrite_t *rw, exchange_t *ex)
{
    const mcp_msg_t *m = exchange_msg(ex);
    if (!m || !m->id || !m->id_text)
        return;
    list_watch_t *w = xcalloc(1, sizeof(*w));
    w->catalog = c;
    w->ex = ex;
    w->rw = *rw;
    w->rewriting = catalog_rewrites(c, rw);
    if (w->rewriting) {
        w->id_text = xstrdup(m->id_text);
    }
    rpc_reader_init(&w->reader, m->id, CATALOG_MAX_ANSWER);
    exchange_add_observer(ex, &watch_ops, w);
}

void catalog_set_server(catalog_t *c, const char *name)
{
    free(c->server);
    c->server = name ? xstrdup(name) : NULL;
}

void catalog_set_status_tool(catalog_t *c, bool offered)
{
    c->status_tool = offered;
}

handler_verdict_t catalog_offer(void *arg, exchange_t *ex)
{
    catalog_t *c = arg;
    const mcp_msg_t *m = exchange_msg(ex);
    if (m && m->kind == MCP_KIND_REQUEST && m->method && strcmp(m->method, "tools/list") == 0)
        catalog_observe(c, &(catalog_rewrite_t){.status_tool = c->status_tool}, ex);
    return HANDLER_PASS;
}
