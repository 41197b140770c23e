/* Which request bodies the router relays without reading them as MCP: the rules that keep a
 * lenient server from finding a call in bytes the gateway read as something else.
 *
 *   - GET, HEAD, DELETE and TRACE carry no body (RFC 9110 9.3): a framework that reads one
 *     anyway (Express's body parsers read any method's) would run a call the router never
 *     classified, since it reads JSON-RPC only from a POST.
 *   - Off the MCP endpoint a body is relayed only when the gateway reads it as a server
 *     would: UTF-8 with no other charset named, never UTF-16 or UTF-32 (which json.loads in
 *     Python and charset-aware decoders read, and a UTF-8 scan sees no call in), and text
 *     unless its media type is one no server decodes as text (body_rules_text).
 *
 * Pure: takes the head's values and the body, returns a verdict, no I/O. */
#ifndef IDEMGW_BODY_RULES_H
#define IDEMGW_BODY_RULES_H

#include <stdbool.h>
#include <stddef.h>

#include "util.h"

typedef enum {
    BODY_RULES_OK = 0,
    BODY_RULES_ERR_METHOD,  /* a body (or chunked framing) on GET, HEAD, DELETE or TRACE */
    BODY_RULES_ERR_CHARSET, /* the media type names a charset other than UTF-8 (or US-ASCII) */
    BODY_RULES_ERR_WIDE,    /* UTF-16 or UTF-32: a byte order mark, or JSON in wide code units */
    BODY_RULES_ERR_NUL,     /* a NUL byte in a body relayed as text */
    BODY_RULES_ERR_UTF8,    /* a body relayed as text that is not valid UTF-8 */
} body_rules_status_t;

/* BODY_RULES_ERR_METHOD when a method that has no body (method is an llhttp_method_t)
 * carries one: body_len bytes, a Content-Length above 0, or any Transfer-Encoding (chunked
 * framing, even of nothing). content_length and transfer_encoding are the header values, or
 * NULL. */
body_rules_status_t body_rules_method(int method, const char *content_length,
                                      const char *transfer_encoding, size_t body_len) MUST_CHECK;

/* The checks every body off the endpoint passes, whatever its media type (content_type is the
 * header's value, or NULL): no charset but UTF-8 named, no UTF-16/32 byte order mark, and no
 * JSON object or array spelled in UTF-16 or UTF-32 code units. */
body_rules_status_t body_rules_encoding(const char *content_type, const char *body,
                                        size_t len) MUST_CHECK;

/* A body that is read as text unless its media type is on the short list of types relayed as
 * bytes: valid UTF-8 without NUL bytes, else BODY_RULES_ERR_NUL or BODY_RULES_ERR_UTF8. */
body_rules_status_t body_rules_text(const char *content_type, const char *body,
                                    size_t len) MUST_CHECK;

/* Whether the media type is one relayed as bytes (see body_rules.c for why each is safe). */
bool body_rules_binary_type(const char *content_type);

/* What the rule is, for the refusal's message: "...; nothing was forwarded" follows it. */
const char *body_rules_status_str(body_rules_status_t st);

#endif
