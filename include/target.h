/* The request target, normalised once: every routing decision (is this the MCP endpoint, is
 * the path forwarded at all) and the target sent upstream come from the normal form, so no
 * spelling that a server framework would route to the MCP endpoint can reach it unprotected.
 *
 * Pure: takes the target as received and returns the normal form, no I/O. */
#ifndef IDEMGW_TARGET_H
#define IDEMGW_TARGET_H

#include <stdbool.h>

#include "util.h"

typedef enum {
    TARGET_OK = 0,
    TARGET_ERR_FORM,     /* neither origin form (/path), absolute form (http://host/path) nor * */
    TARGET_ERR_FRAGMENT, /* a '#': a client never sends one, and servers disagree on it */
    TARGET_ERR_ESCAPE,   /* a '%' not followed by two hex digits */
    TARGET_ERR_USERINFO, /* user@ in an absolute form's authority */
    TARGET_ERR_ENCODED_SLASH, /* %2F or %5C in the path: one server's segment, another's two */
} target_status_t;

typedef struct target {
    char *path;      /* normalised: starts with '/', no dot segments, no "//"; owned */
    char *query;     /* after the '?', as received, or NULL; owned */
    char *authority; /* the absolute form's host[:port], or NULL for the origin form; owned */
} target_t;

/* Normalises raw into out (caller frees it with target_free, also after an error):
 *   - absolute form: the authority kept apart (the caller checks it as it checks Host), the
 *     rest read as the origin form; "*" (OPTIONS) is kept as the path "*";
 *   - '\' read as '/', as WHATWG URL parsers (Node, browsers) read it in http URLs;
 *   - percent-escapes of unreserved characters (RFC 3986 2.3) decoded, others upper-cased;
 *     an escaped '/' or '\' (%2F, %5C, any case) in the path refused, in the query kept;
 *   - "." and ".." segments resolved and empty segments dropped (RFC 3986 5.2.4), a trailing
 *     '/' kept. */
target_status_t target_normalize(const char *raw, target_t *out) MUST_CHECK;
void target_free(target_t *t);
const char *target_status_str(target_status_t st);

/* Whether a normalised path is what a common server framework routes to the endpoint path:
 * compared without ASCII case (Express's default), with or without one trailing '/', and
 * without ";parameters" in a segment (servlet containers strip them). */
bool target_is_endpoint(const char *path, const char *endpoint);

/* The normal form as one origin-form target: path, then '?' and the query when there is one.
 * Allocated. */
char *target_origin_form(const char *path, const char *query);

#endif
