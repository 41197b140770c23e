/* OpenTelemetry traces: spans in the MCP semantic conventions, exported as OTLP/HTTP JSON
 * (POST {otlp_endpoint}/v1/traces), batched off the hot path: a finished span is serialized
 * into the pending batch at once, a timer (or a full batch) sends it; while a batch is on the
 * way, new spans wait, and past TRACE_MAX_PENDING they are dropped and counted. There is no
 * OpenTelemetry C SDK in Debian; this is the little of one the gateway needs. */
#ifndef IDEMGW_TRACE_H
#define IDEMGW_TRACE_H

#include "config.h"
#include "stats.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TRACE_MAX_PENDING 4096 /* spans waiting to be sent, at most */
#define TRACE_BATCH 512        /* spans per request */
#define TRACE_FLUSH_MS 1000    /* a batch leaves at least this often */
#define TRACE_EXIT_MS 2000     /* at exit, what is held is sent within this, or dropped */

struct event_base;
typedef struct tracer tracer_t;

/* A span's identity (W3C trace context). */
typedef struct span_ctx {
    uint8_t trace_id[16];
    uint8_t span_id[8];
    bool sampled;
} span_ctx_t;

enum { SPAN_SERVER = 2, SPAN_CLIENT = 3 }; /* OTLP span kinds */

typedef struct span_attr {
    const char *key;
    const char *value; /* NULL: the attribute is left out */
} span_attr_t;

typedef struct span {
    const char *name;
    int kind;
    span_ctx_t ctx;
    const uint8_t *parent_span_id; /* NULL: a root span */
    uint64_t start_ns, end_ns;     /* Unix time */
    const span_attr_t *attrs;
    size_t n_attrs;
    bool error; /* status ERROR */
} span_t;

/* NULL (tracing off) when url has no endpoint; NULL with msg when it cannot be used.
 * sample_ratio: the share of the traces the gateway starts (no traceparent from the agent)
 * that are sampled; a continued trace keeps its parent's sampled flag. */
tracer_t *tracer_new(struct event_base *base, const http_url_t *url, double sample_ratio,
                     server_stats_t *stats, char *msg, size_t msglen);
void tracer_free(tracer_t *t);

/* Whether a trace the gateway starts with trace_id is sampled (by the trace id, so every
 * replica decides alike). */
bool tracer_sampled(const tracer_t *t, const uint8_t trace_id[16]);

/* At exit, once the loop has stopped: sends every span still held and runs the loop until the
 * endpoint has answered, for at most within_ms; what is left then is counted dropped. */
void tracer_drain(tracer_t *t, uint64_t within_ms);

/* A finished span into the pending batch. */
void tracer_record(tracer_t *t, const span_t *s);

/* Parses a traceparent header value ("00-<32 hex>-<16 hex>-<2 hex>"); false when it is not
 * one (then a new trace starts). */
bool trace_parse_parent(const char *value, span_ctx_t *out);
/* "00-<trace>-<span>-<flags>" of sc, into out (at least 56 bytes). */
void trace_format_parent(const span_ctx_t *sc, char *out, size_t outlen);
/* A new span: in parent's trace when parent is not NULL, else in a new trace (sampled; see
 * tracer_sampled). Ids come from t's generator. */
void trace_new_span(tracer_t *t, span_ctx_t *out, const span_ctx_t *parent);
/* Now, in Unix nanoseconds. */
uint64_t trace_now_ns(void);

#endif
