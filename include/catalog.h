/* The upstream's tool catalogue: what each tool's annotations say, learned from the tools/list
 * answers passing through (every page) and from the gateway's own tools/list at start
 * (catalog_fetch.h). A tool the policy does not name is classified from them when the
 * operator trusts annotations (defaults.trust_annotations, on by default): readOnlyHint →
 * read, idempotentHint → idempotent, else defaults.class. One catalogue per process, bounded. */
#ifndef IDEMGW_CATALOG_H
#define IDEMGW_CATALOG_H

#include "exchange.h"
#include "handler.h"
#include "policy.h"
#include "proxy.h"

#include <stdbool.h>
#include <stddef.h>

#define CATALOG_MAX_TOOLS 4096 /* tools (and unknown names called) remembered */

typedef enum { HINT_UNSET = 0, HINT_FALSE, HINT_TRUE } hint_t;

typedef struct catalog_tool {
    char *name;
    bool listed; /* the server listed it (else: only seen called) */
    hint_t read_only, idempotent, destructive;
    bool logged;  /* its class was logged */
    char **props; /* its inputSchema's property names (the first CATALOG_MAX_PROPS) */
    size_t n_props;
} catalog_tool_t;

#define CATALOG_MAX_PROPS 128
/* The tool the gateway adds to tools/list with status_tool: true, and answers itself. */
#define CATALOG_STATUS_TOOL "idemgw_call_status"

typedef struct catalog catalog_t;

typedef enum {
    CLASS_FROM_POLICY = 0, /* the policy names the tool */
    CLASS_FROM_ANNOTATION, /* the server's readOnlyHint / idempotentHint */
    CLASS_FROM_DEFAULT,    /* defaults.class */
} class_source_t;

const char *class_source_name(class_source_t s);

catalog_t *catalog_new(void);
void catalog_free(catalog_t *c);
/* The policy classifications follow (the running one: set again after a reload). */
void catalog_set_policy(catalog_t *c, const policy_t *p);

/* Learns the tools of one tools/list result (the "result" value's JSON text); logs each new
 * or changed tool's class once. Returns the tools it held, or -1 when the text is not a
 * tools/list result. */
int catalog_learn(catalog_t *c, const char *result, size_t len);

/* The tool's class and where it came from (source may be NULL). */
tool_class_t catalog_classify(const catalog_t *c, const char *tool, class_source_t *source);

/* Like catalog_classify, for a call: a tool neither the policy nor the server named is logged
 * once ("not in the policy nor in the server's tools/list"). */
tool_class_t catalog_classify_call(catalog_t *c, const char *tool);

const catalog_tool_t *catalog_find(const catalog_t *c, const char *tool);
/* The tools, sorted by name; i < catalog_size. */
size_t catalog_size(const catalog_t *c);
const catalog_tool_t *catalog_at(const catalog_t *c, size_t i);

/* Whether tool is a name the policy or the server's tools/list gives (a metric label may be
 * made of it). */
bool catalog_known(const catalog_t *c, const char *tool);

/* The router's classifier (proxy.h) over c: catalog_classify_call, catalog_known and
 * catalog_classify. */
proxy_classifier_t catalog_classifier(catalog_t *c);

/* Whether the server's own inputSchema of tool has the property prop. */
bool catalog_declares(const catalog_t *c, const char *tool, const char *prop);

/* What the gateway adds to the tools/list answers agents get. */
typedef struct catalog_rewrite {
    bool status_tool; /* offer CATALOG_STATUS_TOOL (on the last page) */
} catalog_rewrite_t;

/* Whether answers need rewriting at all: some tool advertises its key, or the status tool. */
bool catalog_rewrites(const catalog_t *c, const catalog_rewrite_t *rw);

/* A tools/list result as agents get it: every non_idempotent tool whose policy says
 * advertise_key gets its key_arg as an optional string argument (unless the server declares
 * it) and a sentence saying what it is for; with status_tool the last page (no nextCursor)
 * gets CATALOG_STATUS_TOOL. NULL when nothing changes. Free the result. */
char *catalog_rewrite_list(const catalog_t *c, const catalog_rewrite_t *rw, const char *result,
                           size_t len);

/* Watches the upstream's answer to a tools/list request and learns from it; when rw asks for
 * rewriting, holds the answer and gives the agent the rewritten one. */
void catalog_observe(catalog_t *c, const catalog_rewrite_t *rw, exchange_t *ex);
/* Whether tools/list answers offer CATALOG_STATUS_TOOL (the status_tool setting). */
void catalog_set_status_tool(catalog_t *c, bool offered);
/* The server's name (servers:) its "tool class" log lines carry; NULL: none. Copied. */
void catalog_set_server(catalog_t *c, const char *name);
/* The router's handler (handler.h; arg: the catalog_t): watches every tools/list answer on
 * its way to the agent (catalog_observe), rewriting it for the status tool; never takes one. */
handler_verdict_t catalog_offer(void *arg, exchange_t *ex);

#endif
