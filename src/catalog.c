/* The upstream's tool catalogue (see include/catalog.h). */
#include "catalog.h"

#include "log.h"
#include "rpc_reader.h"
#include "util.h"

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

void catalog_free(catalog_t *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n; i++)
        free(c->tools[i].name);
    free(c->tools);
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
    char name[300], fields[600];
    log_json_string(name, sizeof(name), k->name);
    snprintf(fields, sizeof(fields),
             "\"tool\":%s,\"class\":\"%s\",\"class_source\":\"%s\",\"listed\":%s,"
             "\"read_only_hint\":\"%s\",\"idempotent_hint\":\"%s\",\"destructive_hint\":\"%s\"",
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

/* --- watching a tools/list answer --- */

typedef struct list_watch {
    catalog_t *catalog;
    rpc_reader_t reader;
    bool learned;
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
    return OBSERVE_PASS;
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
    if (res == UPSTREAM_OK && rpc_reader_end(&w->reader))
        learn_once(w);
    return OBSERVE_PASS;
}

static void watch_detach(void *arg)
{
    list_watch_t *w = arg;
    rpc_reader_free(&w->reader);
    free(w);
}

static const response_observer_t watch_ops = {
    .on_head = watch_head,
    .on_body = watch_body,
    .on_end = watch_end,
    .detach = watch_detach,
};

void catalog_observe(catalog_t *c, exchange_t *ex)
{
    const mcp_msg_t *m = exchange_msg(ex);
    if (!m || !m->id)
        return;
    list_watch_t *w = xcalloc(1, sizeof(*w));
    w->catalog = c;
    rpc_reader_init(&w->reader, m->id, CATALOG_MAX_ANSWER);
    exchange_set_observer(ex, &watch_ops, w);
}
