/* Where a jwt subject's keys come from: a JWK Set file (read at start and on reload) and/or an
 * https URL the gateway fetches itself, on the event loop through an upstream pool of its own
 * (verified like the upstream: ca_file or the system store, the host name checked).
 *
 * The URL's set is cached and fetched again every refresh, and sooner when a token names a key
 * no set has (jwks_source_refetch), at most once per JWKS_REFETCH_MIN_MS however many such
 * tokens arrive. A fetch that fails keeps the last good set (and says so in the log); it is
 * retried after min(refresh, 30s). */
#ifndef IDEMGW_JWKS_SOURCE_H
#define IDEMGW_JWKS_SOURCE_H

#include "config.h"
#include "jwt.h"

#include <stdbool.h>
#include <stddef.h>

struct event_base;

/* Tokens naming unknown keys start a fetch at most this often. */
#define JWKS_REFETCH_MIN_MS 10000

typedef struct jwks_source jwks_source_t;

typedef struct jwks_source_opts {
    struct event_base *base;
    const subject_jwt_conf_t *conf; /* read during the call only: what is needed is copied */
    /* a fetch of the URL ended, well or not: from the loop, never inside a source call */
    void (*fetched)(void *arg);
    void *arg;
} jwks_source_opts_t;

/* Reads the file (an error when it does not give a set) and starts the first fetch of the URL
 * (which may fail later: calls are then refused unknown_key until one succeeds). NULL with msg
 * when the file or the URL's TLS context or address cannot be used. */
jwks_source_t *jwks_source_new(const jwks_source_opts_t *opts, char *msg, size_t msglen) MUST_CHECK;
/* Ends a fetch in progress without calling fetched. */
void jwks_source_free(jwks_source_t *s);

/* Whether conf names the same file, URL and CA as s: a reload can keep s (and its cache). */
bool jwks_source_same_origin(const jwks_source_t *s, const subject_jwt_conf_t *conf);
/* A reload that kept s: the file is read again (a bad one keeps the set s had, logged), the
 * refresh interval taken. */
void jwks_source_reload(jwks_source_t *s, const subject_jwt_conf_t *conf);

/* The sets to verify with now (file, URL), into out; returns how many (0-2). */
size_t jwks_source_sets(const jwks_source_t *s, const jwks_t *out[2]);

/* A token named a key no set has. true when a fetch is under way now (already, or started by
 * this call): fetched will run when it ends. false when there is no URL, or the last fetch
 * started this way is younger than JWKS_REFETCH_MIN_MS. */
bool jwks_source_refetch(jwks_source_t *s);

#endif
