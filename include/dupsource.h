/* Which layer retried: a duplicate's most likely source, from the facts the gateway holds
 * about it and about the first call with its key. Duplicates come from four layers, and only
 * the first two are visible inside an agent framework:
 *
 *   | facts                                        | source      | what retried                   |
 *   |----------------------------------------------|-------------|--------------------------------|
 *   | another session than the first call's        | reconnect   | the client reconnected (or     |
 *   |                                              |             | restarted) and re-sent         |
 *   | same session, same JSON-RPC id               | transport   | a proxy or HTTP library below  |
 *   |                                              |             | the client re-sent the request |
 *   | same session, new id, within harness_within  | harness     | the agent harness's retry      |
 *   | same session, new id, within model_within    | model       | the model re-issued the call   |
 *   | same session, new id, later                  | late        | a deliberate repeat, most      |
 *   |                                              |             | likely                         |
 *
 * A server without sessions gives no session to compare: then the id and the gap decide. The
 * rules are this table, in dup_source(), and a table test (tests/unit/test_dupsource.c). Pure. */
#ifndef IDEMGW_DUPSOURCE_H
#define IDEMGW_DUPSOURCE_H

#include <stdint.h>

typedef enum {
    DUP_RECONNECT = 0,
    DUP_TRANSPORT,
    DUP_HARNESS,
    DUP_MODEL,
    DUP_LATE,
    DUP_SOURCE_N
} dup_source_t;

typedef struct dup_facts {
    const char *first_session; /* the first call's Mcp-Session-Id, or NULL */
    const char *session;       /* this request's, or NULL */
    const char *first_id;      /* the first call's JSON-RPC id, as JSON text, or NULL */
    const char *id;            /* this request's */
    uint64_t gap_ms;           /* since the first call was seen */
} dup_facts_t;

typedef struct dup_thresholds {
    uint64_t harness_ms; /* a new id this soon is a harness retry (default 2 s) */
    uint64_t model_ms;   /* this soon, a model re-issue; later, a deliberate repeat (10 min) */
} dup_thresholds_t;

#define DUP_HARNESS_DEFAULT_MS 2000
#define DUP_MODEL_DEFAULT_MS (10 * 60 * 1000)

dup_source_t dup_source(const dup_facts_t *f, const dup_thresholds_t *t);
const char *dup_source_name(dup_source_t s);

/* Milliseconds since the epoch of an ISO 8601 UTC time as the store writes it
 * ("2026-12-04T04:29:09.123Z", the fraction optional); 0 when it does not parse. */
uint64_t dup_parse_time_ms(const char *iso);

#endif
