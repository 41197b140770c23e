/* Streams kept for resumption (resume.c): part of the pipeline, private to it. */
#ifndef IDEMGW_RESUME_H
#define IDEMGW_RESUME_H

#include "exchange_int.h"

#include <stdbool.h>
#include <stddef.h>

/* A POST's SSE stream of a session: keep its bytes from now on. */
void resume_start(exchange_t *ex);
/* Bytes of a kept stream, before they are passed on; past the limit the stream is let go. */
void resume_feed(exchange_t *ex, const char *data, size_t len);
/* The stream is no longer kept (its exchange ends, or it outgrew the limit). */
void resume_stop(exchange_t *ex);
/* A GET with Last-Event-ID: served from a kept stream of the same caller, or handed to the
 * worker that reads it (true); else false, and the upstream serves it. */
bool resume_serve(exchange_t *get);

#endif
