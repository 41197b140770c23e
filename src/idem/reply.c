#include "reply.h"
#include "catalog.h"
#include "key.h"
#include "log.h"
#include "mcp.h"

#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

revision_t reply_revision(const exchange_t *ex)
{
    const http_request_t *req = exchange_request(ex);
    size_t len = evbuffer_get_length(req->body);
    const char *body = (const char *)evbuffer_pullup(req->body, -1);
    char *claim = revision_meta_version(body, len);
    revision_t r =
        revision_of_request(http_headers_get(&req->headers, "mcp-protocol-version"), claim);
    free(claim);
    return r;
}

const char *reply_status_hint(bool status_tool, answer_t a, char *buf, size_t len)
{
    if (!status_tool || !answer_has_later(a))
        return NULL;
    snprintf(buf, len,
             "To learn what became of it, call the tool %s with this call's tool name and "
             "arguments.",
             CATALOG_STATUS_TOOL);
    return buf;
}

void reply_send(const reply_t *r, char *body, const char *extra)
{
    body = revision_fit(body, r->revision);
    exchange_respond_json(r->ex, 200, body, extra);
    free(body);
}

void reply_answer(const reply_t *r, answer_t a, const char *detail, const char *detail2,
                  const char *why)
{
    if (strcmp(answer_outcome(a), "refused") == 0)
        r->stats->refused++;
    else if (a == ANSWER_IN_PROGRESS)
        r->stats->in_progress++;
    else
        r->stats->unknown++;
    char hint[300];
    char *body = answer_body(a, exchange_msg(r->ex)->id_text, r->key_hash, detail, detail2,
                             reply_status_hint(r->status_tool, a, hint, sizeof(hint)));
    /* the log line says why (in at most 40 characters), with the code the agent got */
    char why_short[41];
    exchange_facts_t f = {.key_hash = r->key_hash, .code = answer_code(a)};
    if (r->key_hash && r->dup)
        f.dup = *r->dup;
    if (why) {
        snprintf(why_short, sizeof(why_short), "%s", why);
        f.why = why_short;
    }
    exchange_set_facts(r->ex, &f);
    exchange_set_outcome(r->ex, answer_outcome(a));
    reply_send(r, body, NULL);
}

/* Only a store that does not answer (no connection, or past its deadline) is "down"; a
 * statement the store rejected says nothing about its availability. */
void reply_store_failed(const reply_t *r, store_status_t st, const char *tool)
{
    if (st == STORE_ERR_UNAVAILABLE) {
        reply_answer(r, ANSWER_STORE_DOWN, NULL, NULL, NULL);
        return;
    }
    if (st == STORE_ERR_SHUTDOWN) {
        reply_answer(r, ANSWER_SHUTTING_DOWN, NULL, NULL, NULL);
        return;
    }
    log_error(exchange_conn_id(r->ex), "store refused the call to %s (key %.*s): %s; not forwarded",
              tool, KEY_HASH_LOG_LEN, r->key_hash ? r->key_hash : "", store_status_str(st));
    reply_answer(r, ANSWER_STORE_ERROR, NULL, NULL, NULL);
}

char *reply_replay_body(const char *id_text, const store_row_t *row, const char *marker)
{
    if (row->result_too_large || !row->result)
        return answer_replay_too_large(id_text, marker, row->created_at);
    return mcp_replay_body(id_text, row->result, row->result_len, marker);
}
