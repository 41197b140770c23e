/* Streams kept for resumption (resume.c): part of the pipeline, private to it. */
#ifndef IDEMGW_RESUME_H
#define IDEMGW_RESUME_H

#include "exchange_int.h"

struct evbuffer;

#include <stdbool.h>
#include <stddef.h>

/* A POST's SSE stream of a session: keep its bytes from now on. */
void resume_start(exchange_t *ex);
/* Bytes of a kept stream, before they are passed on; past the limit the stream is let go. */
void resume_feed(exchange_t *ex, const char *data, size_t len);
/* The stream is no longer kept (its exchange ends, or it outgrew the limit). */
void resume_stop(exchange_t *ex);
/* The kept stream a GET with Last-Event-ID resumes: of session, of the GET's own caller, with
 * an event last among its marks; in *from where the bytes after that event begin. NULL when
 * there is none (a stream of another caller ends the search: the upstream judges that resume).
 * The serving is the exchange's (exchange_resume). */
exchange_t *resume_find(const exchange_t *get, const char *session, const char *last, size_t *from);
/* Writes, as chunks to out, the kept bytes of ex from offset from up to what was passed on. */
void resume_replay(const exchange_t *ex, size_t from, struct evbuffer *out);

#endif
