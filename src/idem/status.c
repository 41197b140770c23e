#include "status.h"
#include "answers.h"
#include "catalog.h"
#include "jcs.h"
#include "key.h"
#include "log.h"
#include "policy.h"
#include "reply.h"
#include "store.h"
#include "subject.h"
#include "util.h"

#include <event2/buffer.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct status_tool {
    status_ctx_t ctx;
};

/* One query, owned by its exchange: freed when the exchange lets its observer go, which cannot
 * happen while the subject or the store is still to answer (the exchange waits for the
 * handler's one step). */
typedef struct query {
    status_tool_t *st;
    exchange_t *ex;
    revision_t revision;
    char *subject;
    char *key;
    char key_hash[65];
    char *target; /* the tool asked about */
} query_t;

static void query_detach(void *arg)
{
    query_t *q = arg;
    free(q->subject);
    free(q->key);
    free(q->target);
    free(q);
}

static const response_observer_t query_ops = {.detach = query_detach};

static reply_t reply_of(const query_t *q)
{
    return (reply_t){
        .ex = q->ex,
        .stats = q->st->ctx.stats,
        .revision = q->revision,
        .status_tool = true,
        .key_hash = q->key ? q->key_hash : NULL,
    };
}

/* Last use of q. */
static void refuse(query_t *q, answer_t a, const char *detail, const char *detail2, const char *why)
{
    reply_t r = reply_of(q);
    reply_answer(&r, a, detail, detail2, why);
}

static void store_failed(query_t *q, store_status_t st)
{
    reply_t r = reply_of(q);
    reply_store_failed(&r, st, CATALOG_STATUS_TOOL);
}

/* A tool result whose text the model reads and whose _meta status a program can. Last use
 * of q. */
static void tell(query_t *q, bool is_error, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void tell(query_t *q, bool is_error, const char *code, const char *fmt, ...)
{
    char text[1200], status[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    if (q->key) {
        snprintf(status, sizeof(status), "{\"code\":\"%s\",\"key_hash\":\"%s\"}", code,
                 q->key_hash);
    } else {
        snprintf(status, sizeof(status), "{\"code\":\"%s\"}", code);
    }
    char *body = mcp_tool_text_body(exchange_msg(q->ex)->id_text, text, status, is_error);
    exchange_set_facts(q->ex,
                       &(exchange_facts_t){.key_hash = q->key ? q->key_hash : NULL, .code = code});
    exchange_set_outcome(q->ex, "status");
    reply_t r = reply_of(q);
    reply_send(&r, body, NULL);
}

static void give_result(query_t *q, const store_row_t *row, const char *when)
{
    char marker[400];
    snprintf(marker, sizeof(marker),
             "{\"replayed\":true,\"status_query\":true,\"first_seen\":\"%s\",\"attempts\":%d,"
             "\"key_hash\":\"%s\"}",
             when, row->attempts, q->key_hash);
    char *body = reply_replay_body(exchange_msg(q->ex)->id_text, row, marker);
    if (!body) {
        refuse(q, ANSWER_REPLAY_FAILED, NULL, NULL, NULL);
        return;
    }
    exchange_set_outcome(q->ex, "status");
    reply_t r = reply_of(q);
    reply_send(&r, body, "Idempotent-Replayed: true\r\n");
}

static void on_row(store_status_t st, const store_row_t *row, void *arg)
{
    query_t *q = arg;
    if (!exchange_agent_waiting(q->ex)) {
        exchange_end(q->ex);
        return;
    }
    if (st != STORE_OK) {
        store_failed(q, st);
        return;
    }
    const char *tool = q->target, *when = row && row->created_at ? row->created_at : "";
    if (!row) {
        tell(q, false, "not_found",
             "No call of %s with these arguments by you is known to the gateway: it did not run "
             "through it, or its record has expired. Nothing was executed now.",
             tool);
        return;
    }
    switch (row->state) {
    case STORE_STATE_SUCCEEDED:
        give_result(q, row, when);
        return;
    case STORE_STATE_IN_PROGRESS:
        if (!row->lease_expired) {
            tell(q, false, "running",
                 "That call of %s is running: it started at %s and has not finished. It was not "
                 "executed again. Do not repeat it; ask again later for its result.",
                 tool, when);
            return;
        }
        break;
    case STORE_STATE_FAILED:
        tell(q, false, "failed",
             "That call of %s (started at %s) ran and failed, or was refused; its answer was not "
             "kept. Repeating it will execute it again.",
             tool, when);
        return;
    case STORE_STATE_UNKNOWN:
        break;
    }
    tell(q, false, "outcome_unknown",
         "That call of %s started at %s, but its outcome is unknown: the upstream server did not "
         "answer completely. It will not be executed again until the idempotency window ends. "
         "Check whether it took effect (for example with a read tool) before doing anything "
         "else.",
         tool, when);
}

/* The caller is known: the key the call asked about had for it, then its row. */
static void lookup(query_t *q)
{
    const config_t *cfg = q->st->ctx.cfg;
    struct evbuffer *buf = exchange_request(q->ex)->body;
    jcs_value_t *root = NULL;
    char err[160];
    if (jcs_parse((const char *)evbuffer_pullup(buf, -1), evbuffer_get_length(buf), &root, err,
                  sizeof(err)) != JCS_OK) {
        refuse(q, ANSWER_BAD_ARGUMENTS, err, NULL, NULL);
        return;
    }
    jcs_value_t *args = jcs_object_get(jcs_object_get(root, "params"), "arguments");
    const char *tool = jcs_string(jcs_object_get(args, "tool"), NULL);
    jcs_value_t *key_v = jcs_object_get(args, POLICY_KEY_ARG_DEFAULT);
    const char *explicit = jcs_string(key_v, NULL);
    if (!tool || !*tool || (key_v && !explicit)) {
        jcs_free(root);
        tell(q, true, "bad_request",
             "%s needs the name of the tool that was called (tool), and its arguments "
             "(arguments) or the idempotency key given to it (" POLICY_KEY_ARG_DEFAULT
             ", a string).",
             CATALOG_STATUS_TOOL);
        return;
    }
    q->target = xstrdup(tool);
    key_call_t call = {.subject = q->subject,
                       .server = cfg->server_name,
                       .tool = tool,
                       .arguments = jcs_object_get(args, "arguments"),
                       .header_key = explicit,
                       .pt = policy_lookup(&cfg->policy, tool)};
    key_result_t kr = {0};
    char msg[200] = "";
    key_status_t ks = key_for_call(&call, &kr, msg, sizeof(msg));
    jcs_free(root);
    if (ks != KEY_OK) {
        refuse(q, ANSWER_BAD_KEY, key_status_str(ks), msg, NULL);
        return;
    }
    q->key = kr.key;
    kr.key = NULL;
    memcpy(q->key_hash, kr.key_hash, sizeof(q->key_hash));
    key_result_free(&kr);
    if (!q->st->ctx.store) {
        refuse(q, ANSWER_NO_STORE, NULL, NULL, NULL);
        return;
    }
    store_status_t st = store_get(q->st->ctx.store, q->key, on_row, q);
    if (st != STORE_OK)
        store_failed(q, st);
}

static void on_subject(void *arg, const subject_result_t *res)
{
    query_t *q = arg;
    if (!res->subject) {
        refuse(q, res->refusal, res->why, NULL, res->reason);
        return;
    }
    q->subject = xstrdup(res->subject);
    lookup(q);
}

handler_verdict_t status_offer(void *arg, exchange_t *ex)
{
    status_tool_t *s = arg;
    const mcp_msg_t *m = exchange_msg(ex);
    if (!s->ctx.cfg->status_tool || !m || m->kind != MCP_KIND_REQUEST || !m->tool ||
        strcmp(m->tool, CATALOG_STATUS_TOOL) != 0)
        return HANDLER_PASS;
    s->ctx.stats->protected_calls++;
    query_t *q = xcalloc(1, sizeof(*q));
    q->st = s;
    q->ex = ex;
    q->revision = reply_revision(ex);
    exchange_add_observer(ex, &query_ops, q);
    subject_resolve(s->ctx.subject, exchange_request(ex), on_subject, q);
    return HANDLER_TAKEN;
}

status_tool_t *status_new(const status_ctx_t *ctx)
{
    status_tool_t *s = xcalloc(1, sizeof(*s));
    s->ctx = *ctx;
    return s;
}

void status_free(status_tool_t *s)
{
    free(s);
}

void status_reconfigure(status_tool_t *s, const config_t *cfg)
{
    s->ctx.cfg = cfg;
}
