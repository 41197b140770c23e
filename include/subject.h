/* Who is calling: the subject that starts every idempotency key, from the subject setting
 * (a fixed value, a header a trusted front end sets, a hash of the bearer token, the claims
 * of a verified JWT bearer token, or a name in the agent's verified TLS client certificate),
 * or a workload acting for a user: the certificate's name combined with the subject of a jwt,
 * header or bearer source, as the JSON array ["spiffe://td/w","alice"] (a jwt subject's
 * claims are its elements: ["spiffe://td/w","https://idp","alice"]). A combined call missing
 * either part is refused as that source alone refuses it, the certificate looked at first.
 *
 * The subject is an object made by main with the event base, because the jwt source keeps
 * state there: the JWK Sets it verifies with (jwks_source.h), fetched on the loop.
 *
 * subject_resolve calls done exactly once: before it returns for the sources that need no
 * I/O, or later from the event loop when a token names a key the gateway must fetch first.
 * req is read during the call only (what a later answer needs is copied); arg must stay
 * valid until done runs. */
#ifndef IDEMGW_SUBJECT_H
#define IDEMGW_SUBJECT_H

#include "answers.h"
#include "config.h"
#include "http_conn.h"
#include "util.h"

#include <stdbool.h>

struct event_base;

typedef struct subject subject_t;

typedef struct subject_result {
    const char *subject; /* the caller, or NULL when it cannot be established */
    answer_t refusal;    /* when NULL: ANSWER_NO_SUBJECT, ANSWER_BAD_SUBJECT or ANSWER_BAD_TOKEN */
    const char *why;     /* when NULL: a phrase for the refusal ("the request has no ...") */
    const char *reason;  /* ANSWER_BAD_TOKEN: the short reason for the log ("expired"), else NULL */
} subject_result_t;

/* The result's strings are valid during the call only. */
typedef void (*subject_done_fn)(void *arg, const subject_result_t *res);

/* conf is read at each resolve: it must live until the next subject_reconfigure (main's
 * config does). NULL with msg when a jwt source cannot start (unreadable jwks_file, a CA file
 * without certificates, a jwks_url host that does not resolve). */
subject_t *subject_new(struct event_base *base, const subject_conf_t *conf, char *msg,
                       size_t msglen) MUST_CHECK;
/* Resolves still waiting for a key fetch are dropped without done: free the subject after
 * the stages that asked (shutdown). */
void subject_free(subject_t *s);
/* A reload (SIGHUP). The jwt source is kept when its file, URL and CA are the same (the file
 * is read again); else a new one is made, and calls waiting on the old one's fetch wait on
 * the new one's. When the new one cannot start, the old one stays, logged. */
void subject_reconfigure(subject_t *s, const subject_conf_t *conf);

void subject_resolve(subject_t *s, const http_request_t *req, subject_done_fn done, void *arg);

/* Whether two requests come from the same caller as far as the gateway can tell (the subject
 * header, every copy, and Authorization; with a client_cert subject, the name the client
 * certificate gives too), compared in constant time. With a jwt subject two
 * tokens that verify now to the same subject are the same caller too (a refreshed token),
 * when a combined subject's certificates give the same name. */
bool subject_same_caller(const subject_t *s, const http_request_t *a, const http_request_t *b);

/* Hex characters of a caller tag. */
#define SUBJECT_TAG_HEX 64

/* A tag that names the caller of req as subject_same_caller compares callers (the subject
 * header, Authorization, the client certificate's name): equal tags, same caller. For what
 * one caller may reach of another's that shares a resource with it (a stdio child) without a
 * resolve: a refreshed JWT makes a new tag. out gets SUBJECT_TAG_HEX characters and a NUL. */
void subject_caller_tag(const subject_t *s, const http_request_t *req,
                        char out[SUBJECT_TAG_HEX + 1]);

#endif
