/* Which layer retried: a duplicate's most likely source, from the facts the gateway holds
 * about it and about the first call with its key. Duplicates come from four layers, and only
 * the first two are visible inside an agent framework:
 *
 *   | facts (the first rule that holds decides)   | source      | what retried                   |
 *   |----------------------------------------------|-------------|--------------------------------|
 *   | another session than the first call's        | reconnect   | the client reconnected (or     |
 *   |                                              |             | restarted) and re-sent         |
 *   | another clientInfo (2026-07-28 _meta)        | reconnect   | another client, or a new       |
 *   |                                              |             | version of it, re-sent         |
 *   | same id, no sessions, harness_within or more | reconnect   | a restarted client: its ids    |
 *   |                                              |             | began again                    |
 *   | same id                                      | transport   | a proxy or HTTP library below  |
 *   |                                              |             | the client re-sent the request |
 *   | new id, the first call still running, or its | harness     | its retry after a timeout or a |
 *   | caller left before its answer came           |             | 5xx: no answer to read yet     |
 *   | new id, within harness_within of the first   | harness     | the agent harness's retry      |
 *   | or of the attempt before                     |             |                                |
 *   | new id, the steps between attempts fixed or  | harness     | a retry policy with backoff    |
 *   | growing (the last 2/3 to 4 times the one     |             |                                |
 *   | before)                                      |             |                                |
 *   | new id, within model_within                  | model       | the model re-issued the call   |
 *   |                                              |             | after reading an answer        |
 *   | new id, later                                | late        | a deliberate repeat, most      |
 *   |                                              |             | likely                         |
 *
 * The 2026-07-28 revision has no sessions: there clientInfo, the id and the gaps decide. The
 * rules are this table, in dup_source(), and a table test (tests/unit/test_dupsource.c). Pure. */
#ifndef IDEMGW_DUPSOURCE_H
#define IDEMGW_DUPSOURCE_H

#include <stdbool.h>
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
    bool first_running;        /* the first call was in progress (and its lease alive) */
    bool first_unread;         /* the first call's answer reached nobody: its caller left first */
    const char *first_client;  /* the first call's clientInfo "name/version", or NULL */
    const char *client;        /* this request's, or NULL */
    uint64_t last_gap_ms;      /* since the attempt before this one; 0: not known */
    uint64_t step_ms;          /* between the two attempts before this one; 0: not known */
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
