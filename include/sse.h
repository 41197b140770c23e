/* Incremental parser for text/event-stream, used to watch a relayed stream for the final
 * JSON-RPC response of a protected call. The bytes themselves are relayed untouched by the
 * caller; this only observes them. Pure: no I/O. */
#ifndef IDEMGW_SSE_H
#define IDEMGW_SSE_H

#include <stdbool.h>
#include <stddef.h>

typedef struct sse_event {
    const char *event; /* "event:" field, "" when absent */
    const char *id;    /* "id:" field, NULL when absent */
    const char *data;  /* data lines joined with \n */
    size_t data_len;
} sse_event_t;

/* Called for each complete event; return non-zero to stop parsing (sse_feed returns it). */
typedef int (*sse_event_cb)(const sse_event_t *ev, void *arg);

typedef struct sse_parser {
    char *line; /* current partial line */
    size_t line_len, line_cap;
    char *data; /* accumulated data of the current event */
    size_t data_len, data_cap;
    char event[64];       /* current event type */
    char *id;             /* current event id */
    bool has_data;        /* a data: line was seen in this event */
    bool last_cr;         /* previous chunk ended in \r: a following \n belongs to it */
    size_t max_event;     /* events larger than this are skipped (data dropped), 0 = no limit */
    bool overflow;        /* current event exceeded max_event */
    bool line_too_long;   /* the partial line exceeded max_event: dropped */
    size_t consumed;      /* during a callback: bytes of the current feed up to the event's end */
    unsigned bom_matched; /* bytes of a leading byte order mark seen so far */
    bool bom_done;        /* past the point where a byte order mark may appear */
    sse_event_cb cb;
    void *arg;
} sse_parser_t;

void sse_init(sse_parser_t *p, size_t max_event, sse_event_cb cb, void *arg);
/* Feeds bytes; returns 0, or what a callback returned to stop. */
int sse_feed(sse_parser_t *p, const char *buf, size_t len);
void sse_free(sse_parser_t *p);

#endif
