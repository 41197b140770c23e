/* Who is calling: the subject that starts every idempotency key, from the subject setting
 * (a fixed value, a header a trusted front end sets, or a hash of the bearer token).
 *
 * subject_resolve calls done exactly once: before it returns for the sources that need no
 * I/O, or later from the event loop for a source that must fetch something first. req must
 * stay valid until done runs. */
#ifndef IDEMGW_SUBJECT_H
#define IDEMGW_SUBJECT_H

#include "answers.h"
#include "config.h"
#include "http_conn.h"

#include <stdbool.h>

typedef struct subject_result {
    const char *subject; /* the caller, or NULL when it cannot be established */
    answer_t refusal;    /* when NULL: ANSWER_NO_SUBJECT or ANSWER_BAD_SUBJECT */
    const char *why;     /* when NULL: a phrase for the refusal ("the request has no ...") */
} subject_result_t;

/* The result's strings are valid during the call only. */
typedef void (*subject_done_fn)(void *arg, const subject_result_t *res);

void subject_resolve(const subject_conf_t *conf, const http_request_t *req, subject_done_fn done,
                     void *arg);

/* Whether two requests come from the same caller as far as the gateway can tell (the subject
 * header, every copy, and Authorization), compared in constant time. */
bool subject_same_caller(const subject_conf_t *conf, const http_request_t *a,
                         const http_request_t *b);

#endif
