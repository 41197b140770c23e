/* The events of an upstream's SSE stream, as a response observer (exchange.h) sees its raw
 * bytes: decoded first when the upstream compressed it (decode.h), then cut into events
 * (sse.h). Each watcher of a GET stream (the pending calls', the catalogue's list_changed)
 * reads it through one of its own. Only observes; no I/O. */
#ifndef IDEMGW_STREAM_READER_H
#define IDEMGW_STREAM_READER_H

#include "decode.h"
#include "http_headers.h"
#include "sse.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct stream_reader {
    bool reading;       /* a 200 event stream in a coding this can read, not failed since */
    decoder_t *decoder; /* the upstream's Content-Encoding, undone */
    sse_parser_t sse;
    uint64_t conn_id; /* for the warnings */
    const char *what; /* for the warnings: whose stream it is ("pending calls' GET stream") */
} stream_reader_t;

/* The response's head: reading starts for a 200 event stream whose coding is known (an
 * unknown one is warned of); on_event then gets each event whole, up to max_event bytes. */
void stream_reader_head(stream_reader_t *r, int status, const http_headers_t *headers, bool sse,
                        size_t max_event, sse_event_cb on_event, void *arg);
/* Raw bytes of the body; a coding that turns out unreadable ends the reading, warned of. */
void stream_reader_body(stream_reader_t *r, const char *data, size_t len);
void stream_reader_free(stream_reader_t *r);

#endif
