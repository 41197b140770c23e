/* CORS on the answers the gateway writes itself (replays, refusals, in-progress answers).
 *
 * The upstream's answers pass through with its own CORS headers. An answer the gateway writes
 * must be as readable to a browser page as the upstream's would be, or a page sees its replay
 * as a network error. So the gateway mirrors the upstream: it remembers, per Origin, the
 * Access-Control-Allow-Origin / -Allow-Credentials / -Expose-Headers the upstream last sent,
 * and gives its own answers the same, with the headers a page needs to read added to the
 * exposed list (Mcp-Session-Id, Idempotent-Replayed). An origin the upstream has given no
 * CORS headers (it serves no browsers, or this process has not seen its answer to that origin
 * yet) gets none from the gateway either: passing allowed_origins (DNS-rebinding protection)
 * is no permission for a page to read answers. Pure: one table per process. */
#ifndef IDEMGW_CORS_H
#define IDEMGW_CORS_H

#include "http_headers.h"

#include <stdbool.h>
#include <stddef.h>

#define CORS_ORIGINS 32 /* origins remembered; the least recently learned is replaced */

typedef struct cors_origin {
    char *origin;       /* the request's Origin */
    char *allow_origin; /* what the upstream answered it: the origin itself or "*" */
    char *expose;       /* its Access-Control-Expose-Headers, or NULL */
    bool credentials;   /* it sent Access-Control-Allow-Credentials: true */
} cors_origin_t;

typedef struct cors_table {
    cors_origin_t seen[CORS_ORIGINS];
    size_t next; /* the slot a new origin takes */
} cors_table_t;

/* Notes the CORS headers of an upstream answer to a request from origin (NULL: no Origin,
 * nothing to learn). An answer without Access-Control-Allow-Origin teaches nothing: a
 * preflight or an error may lack it while the upstream's real answers have it. */
void cors_learn(cors_table_t *t, const char *origin, const http_headers_t *upstream_headers);

/* The header lines ("Name: value\r\n"...) for an answer the gateway writes to a request from
 * origin; NULL when origin is NULL or the upstream gave it no CORS. Free the result. */
char *cors_headers(const cors_table_t *t, const char *origin);

/* For a preflight answer passing through: when the page asked to send Idempotency-Key and
 * the upstream did not allow it (nor "*"), the header line that does; else NULL. Free it. */
char *cors_preflight_extra(const char *requested_headers, const http_headers_t *upstream_headers);

void cors_table_free(cors_table_t *t);

#endif
