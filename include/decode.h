/* Content-Encoding decoding of upstream response bodies (gzip, deflate, br), so a protected
 * call's result can be read even when the upstream compressed it. Streaming: bytes are fed as
 * they arrive, decoded bytes go to the caller's buffer. No I/O. */
#ifndef IDEMGW_DECODE_H
#define IDEMGW_DECODE_H

#include "util.h"

#include <stdbool.h>
#include <stddef.h>

struct evbuffer;

/* Most decoded bytes one read of a compressed SSE answer may expand to (a stream's events are
 * bounded by the SSE parser, not its whole length). */
#define SSE_DECODED_PER_READ (16 * 1024 * 1024)

typedef enum {
    DECODE_CODING_IDENTITY = 0, /* no Content-Encoding, or identity */
    DECODE_CODING_GZIP,
    DECODE_CODING_DEFLATE, /* zlib-wrapped, as RFC 9110 defines it */
    DECODE_CODING_BR,
    DECODE_CODING_UNSUPPORTED, /* anything else, or several codings stacked */
} decode_coding_t;

typedef enum {
    DECODE_OK = 0,
    DECODE_ERR_DATA,      /* the bytes are not valid for the coding */
    DECODE_ERR_LIMIT,     /* the decoded body outgrew the caller's limit */
    DECODE_ERR_TRUNCATED, /* the body ended before the coded stream did */
} decode_status_t;

const char *decode_status_str(decode_status_t st);

/* The coding a Content-Encoding header value names (NULL: identity). */
decode_coding_t decode_coding_parse(const char *value);

typedef struct decoder decoder_t;

/* A decoder for gzip, deflate or br; NULL for identity or unsupported. */
decoder_t *decoder_new(decode_coding_t coding);
/* Decodes len bytes, appending to out; fails once more than limit bytes were produced in all.
 * After a failure the decoder takes nothing more. */
decode_status_t decoder_feed(decoder_t *d, const char *in, size_t len, struct evbuffer *out,
                             size_t limit) MUST_CHECK;
/* Decoded bytes produced so far. */
size_t decoder_produced(const decoder_t *d);
/* At the end of the body: OK only when the coded stream ended too. */
decode_status_t decoder_finish(decoder_t *d) MUST_CHECK;
void decoder_free(decoder_t *d);

#endif
