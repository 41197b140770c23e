/* The answers the idempotency layer's handlers write themselves (the protected call in idem.c,
 * the status tool in status.c): one way to count, log, fit to the caller's protocol era and
 * send them, so a refusal or a replay reads the same whichever handler wrote it. Private to
 * src/idem/. */
#ifndef IDEMGW_REPLY_H
#define IDEMGW_REPLY_H

#include "answers.h"
#include "exchange.h"
#include "revision.h"
#include "stats.h"
#include "store.h"

#include <stdbool.h>
#include <stddef.h>

/* Where an answer goes and what it says besides its text. Every pointer is read only during
 * the call it is passed to. */
typedef struct reply {
    exchange_t *ex;
    server_stats_t *stats; /* refused, in_progress and unknown count the answers */
    revision_t revision;   /* the caller's era (reply_revision) */
    bool status_tool;      /* answers about a call that may still run point at the status tool */
    const char *key_hash;  /* NULL until the call's key is derived */
    const exchange_dup_facts_t *dup; /* the call is a duplicate (with key_hash); may be NULL */
} reply_t;

/* The era of the request: its MCP-Protocol-Version header and its body's _meta claim. */
revision_t reply_revision(const exchange_t *ex);

/* The status tool's sentence for an answer about a call that may still run, in buf; NULL when
 * there is none (the tool is off, or the answer is final). */
const char *reply_status_hint(bool status_tool, answer_t a, char *buf, size_t len);

/* Answers with a, counted and logged with its code; why (may be NULL): a short reason for the
 * log line ("expired"). The handler must not touch the exchange afterwards: it may have ended. */
void reply_answer(const reply_t *r, answer_t a, const char *detail, const char *detail2,
                  const char *why);

/* A store call failed (st != STORE_OK) and nothing will be forwarded: the answer says whether
 * the store is down, shutting down, or refused the statement (logged, with tool). */
void reply_store_failed(const reply_t *r, store_status_t st, const char *tool);

/* The replay of row (a succeeded row, or one whose result was too large to keep) for the
 * request id_text, with marker as its _meta member; NULL if the stored result is unusable. */
char *reply_replay_body(const char *id_text, const store_row_t *row, const char *marker);

/* Sends body (a complete JSON-RPC response, freed here) fitted to the caller's era, with
 * extra response headers (may be NULL). */
void reply_send(const reply_t *r, char *body, const char *extra);

#endif
