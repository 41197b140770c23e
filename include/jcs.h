/* RFC 8785 JSON Canonicalization Scheme over a small DOM of our own.
 *
 * Our own parser, not jansson, because the key must keep exact number literals: an integer
 * literal that a double cannot hold exactly keeps its exact digits (normalised: no leading
 * zeros, no "+", "-0" → "0"), so two different large ids never share a key, and integers wider
 * than 64 bits are neither rejected nor mis-hashed. Every other number is printed in ECMAScript
 * Number.prototype.toString form, as RFC 8785 says. Pure: no I/O. */
#ifndef IDEMGW_JCS_H
#define IDEMGW_JCS_H

#include "util.h"

#include <stdbool.h>
#include <stddef.h>

typedef enum {
    JCS_NULL = 0,
    JCS_FALSE,
    JCS_TRUE,
    JCS_NUMBER,
    JCS_STRING,
    JCS_ARRAY,
    JCS_OBJECT,
} jcs_type_t;

typedef struct jcs_value jcs_value_t;

typedef enum {
    JCS_OK = 0,
    JCS_ERR_SYNTAX,    /* not JSON */
    JCS_ERR_DEPTH,     /* nested deeper than JCS_MAX_DEPTH */
    JCS_ERR_NUMBER,    /* a non-integer number that is not finite as a double (1e400) */
    JCS_ERR_UTF8,      /* invalid UTF-8 or a lone surrogate escape */
    JCS_ERR_DUPLICATE, /* an object has the same name twice */
} jcs_status_t;

#define JCS_MAX_DEPTH 128

const char *jcs_status_str(jcs_status_t st);

/* Parses len bytes of JSON text. On error *out is NULL and, when err is not NULL, a message
 * with the byte offset is written into err. */
jcs_status_t jcs_parse(const char *text, size_t len, jcs_value_t **out, char *err,
                       size_t errlen) MUST_CHECK;
void jcs_free(jcs_value_t *v);

jcs_type_t jcs_type(const jcs_value_t *v);
/* Member of an object by name, or NULL (also when v is not an object). */
jcs_value_t *jcs_object_get(const jcs_value_t *v, const char *name);
/* Removes and frees a member; returns true when it was there. */
bool jcs_object_remove(jcs_value_t *v, const char *name);
/* Removes the member at a dotted path ("a.b.c"); returns true when it was there. */
bool jcs_remove_path(jcs_value_t *root, const char *dotted_path);
/* The string value (NUL-terminated, may contain NUL: see len), or NULL when not a string. */
const char *jcs_string(const jcs_value_t *v, size_t *len);

/* Canonical form of v, malloc'd and NUL-terminated; *len set when len is not NULL. */
char *jcs_serialize(const jcs_value_t *v, size_t *len);

/* ECMAScript Number::toString of d into out (at least 32 bytes). d must be finite. */
void jcs_format_double(double d, char *out);

#endif
