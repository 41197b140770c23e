/* OpenTelemetry traces as OTLP/HTTP JSON (see include/trace.h). */
#include "trace.h"

#include "log.h"
#include "upstream_http.h"
#include "util.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct tracer {
    struct event_base *base;
    struct ssl_ctx_st *tls;
    upstream_pool_t *pool;
    upstream_limits_t limits;
    char *target, *host;
    struct evbuffer *pending; /* serialized spans, comma-separated */
    size_t n_pending;
    upstream_conn_t *up; /* the batch on its way, or NULL */
    bool sending;
    int status;
    struct event *timer;
    server_stats_t *stats; /* spans_exported, spans_dropped */
    uint64_t in_flight;
    uint64_t sample_below; /* a new trace is sampled when its id's last 8 bytes are below */
    bool sample_all;
    bool draining;   /* tracer_drain: send until nothing is held, then stop the loop */
    uint64_t rng[4]; /* xoshiro256** state for trace and span ids */
};

static const upstream_cbs_t export_cbs;

uint64_t trace_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Trace and span ids need to be unpredictable enough not to collide, not secret: a xoshiro256**
 * generator per tracer (made in its worker, after any fork), seeded from OpenSSL's, costs a few
 * nanoseconds where RAND_bytes cost about a microsecond on every request. */
static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(uint64_t *r)
{
    uint64_t out = rotl(r[1] * 5, 7) * 9, t = r[1] << 17;
    r[2] ^= r[0];
    r[3] ^= r[1];
    r[1] ^= r[2];
    r[0] ^= r[3];
    r[2] ^= t;
    r[3] = rotl(r[3], 45);
    return out;
}

static void random_bytes(tracer_t *t, uint8_t *out, size_t n)
{
    do {
        for (size_t i = 0; i < n; i += 8) {
            uint64_t v = rng_next(t->rng);
            memcpy(out + i, &v, n - i < 8 ? n - i : 8);
        }
        /* all-zero ids are invalid in W3C trace context */
    } while (memcmp(out, "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0", n) == 0);
}

void trace_new_span(tracer_t *t, span_ctx_t *out, const span_ctx_t *parent)
{
    if (parent) {
        memcpy(out->trace_id, parent->trace_id, sizeof(out->trace_id));
        out->sampled = parent->sampled;
    } else {
        random_bytes(t, out->trace_id, sizeof(out->trace_id));
        out->sampled = true;
    }
    random_bytes(t, out->span_id, sizeof(out->span_id));
}

static bool unhex(const char *s, size_t n, uint8_t *out)
{
    for (size_t i = 0; i < n; i++) {
        int hi = util_hexval(s[2 * i]), lo = util_hexval(s[2 * i + 1]);
        if (hi < 0 || lo < 0 || (s[2 * i] >= 'A' && s[2 * i] <= 'F') ||
            (s[2 * i + 1] >= 'A' && s[2 * i + 1] <= 'F'))
            return false; /* lower-case hex only */
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return true;
}

static bool all_zero(const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return false;
    return true;
}

bool trace_parse_parent(const char *v, span_ctx_t *out)
{
    uint8_t version, flags;
    if (!v || strlen(v) < 55 || v[2] != '-' || v[35] != '-' || v[52] != '-' ||
        !unhex(v, 1, &version) || version == 0xff || (version == 0 && strlen(v) != 55) ||
        !unhex(v + 3, 16, out->trace_id) || !unhex(v + 36, 8, out->span_id) ||
        !unhex(v + 53, 1, &flags) || all_zero(out->trace_id, 16) || all_zero(out->span_id, 8))
        return false;
    out->sampled = flags & 1;
    return true;
}

void trace_format_parent(const span_ctx_t *sc, char *out, size_t outlen)
{
    char t[33], s[17];
    util_hex(sc->trace_id, 16, t);
    util_hex(sc->span_id, 8, s);
    snprintf(out, outlen, "00-%s-%s-%s", t, s, sc->sampled ? "01" : "00");
}

/* A JSON string of text into b (quotes, backslashes and control characters escaped); false
 * (nothing added) when text is not UTF-8. Spans are serialized as they end, on the loop:
 * this costs a fraction of building them with jansson. */
static bool add_json_string(struct evbuffer *b, const char *text)
{
    size_t n = strlen(text);
    if (!util_utf8_valid(text, n))
        return false;
    evbuffer_add(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        evbuffer_add(b, text + run, i - run);
        if (c == '"' || c == '\\')
            evbuffer_add_printf(b, "\\%c", c);
        else
            evbuffer_add_printf(b, "\\u%04x", c);
        run = i + 1;
    }
    evbuffer_add(b, text + run, n - run);
    evbuffer_add(b, "\"", 1);
    return true;
}

/* --- export --- */

static void send_batch(tracer_t *t)
{
    if (t->sending || t->n_pending == 0)
        return;
    struct evbuffer *body = evbuffer_new();
    evbuffer_add_printf(body, "{\"resourceSpans\":[{\"resource\":{\"attributes\":[{\"key\":"
                              "\"service.name\",\"value\":{\"stringValue\":\"idemgw\"}}]},"
                              "\"scopeSpans\":[{\"scope\":{\"name\":\"idemgw\"},\"spans\":[");
    evbuffer_add_buffer(body, t->pending);
    evbuffer_add(body, "]}]}]}", 6);
    t->in_flight = t->n_pending;
    t->n_pending = 0;
    http_headers_t none;
    http_headers_init(&none);
    struct evbuffer *req = evbuffer_new();
    http_write_request_head(req, "POST", t->target, &none, t->host, NULL,
                            (long long)evbuffer_get_length(body),
                            "Content-Type: application/json\r\n");
    evbuffer_add_buffer(req, body);
    http_headers_free(&none);
    evbuffer_free(body);
    t->sending = true;
    t->status = 0;
    t->up = upstream_http_send(t->pool, req, false, &export_cbs, t);
    evbuffer_free(req);
}

static void on_export_head(void *arg, int status, const http_headers_t *h)
{
    ((tracer_t *)arg)->status = status;
}

static void on_export_body(void *arg, const char *data, size_t len)
{
}

static void on_export_end(void *arg, upstream_result_t res)
{
    tracer_t *t = arg;
    t->up = NULL;
    t->sending = false;
    if (res == UPSTREAM_OK && t->status >= 200 && t->status < 300) {
        t->stats->spans_exported += t->in_flight;
    } else {
        t->stats->spans_dropped += t->in_flight;
        log_warn(0, "traces: the OTLP endpoint did not take %llu spans (%s, HTTP %d)",
                 (unsigned long long)t->in_flight, upstream_result_str(res), t->status);
    }
    t->in_flight = 0;
    if (t->draining && t->n_pending == 0)
        event_base_loopexit(t->base, NULL);
    else if (t->n_pending >= TRACE_BATCH || t->draining)
        send_batch(t);
}

static const upstream_cbs_t export_cbs = {on_export_head, on_export_body, on_export_end};

static void flush_tick(evutil_socket_t fd, short what, void *arg)
{
    send_batch(arg);
}

bool tracer_sampled(const tracer_t *t, const uint8_t trace_id[16])
{
    if (t->sample_all)
        return true;
    uint64_t v = 0;
    for (int i = 8; i < 16; i++)
        v = v << 8 | trace_id[i];
    return v < t->sample_below;
}

static void drain_deadline(evutil_socket_t fd, short what, void *arg)
{
    event_base_loopexit(((tracer_t *)arg)->base, NULL);
}

void tracer_drain(tracer_t *t, uint64_t within_ms)
{
    if (!t || (t->n_pending == 0 && !t->sending))
        return;
    t->draining = true;
    evtimer_del(t->timer);
    struct event *deadline = evtimer_new(t->base, drain_deadline, t);
    struct timeval tv = {(time_t)(within_ms / 1000), (suseconds_t)(within_ms % 1000) * 1000};
    evtimer_add(deadline, &tv);
    send_batch(t); /* when a batch is on its way, the rest leaves when it is answered */
    event_base_dispatch(t->base);
    event_free(deadline);
    uint64_t lost = t->n_pending + (t->sending ? t->in_flight : 0);
    /* what missed the deadline is counted dropped here, once: the batch still on its way is
     * ended, so no late answer counts it again or reaches a freed tracer */
    if (t->up)
        upstream_http_abandon(t->up);
    t->up = NULL;
    t->sending = false;
    t->in_flight = 0;
    evbuffer_drain(t->pending, evbuffer_get_length(t->pending));
    t->n_pending = 0;
    if (lost) {
        t->stats->spans_dropped += lost;
        log_warn(0, "traces: %llu spans not sent within %llu ms at exit", (unsigned long long)lost,
                 (unsigned long long)within_ms);
    } else {
        log_info(0, "traces: every span sent before exit");
    }
    t->draining = false;
}

tracer_t *tracer_new(struct event_base *base, const http_url_t *url, double sample_ratio,
                     server_stats_t *stats, char *msg, size_t msglen)
{
    if (!url->url)
        return NULL;
    tracer_t *t = xcalloc(1, sizeof(*t));
    t->base = base;
    t->stats = stats;
    do {
        if (RAND_bytes((unsigned char *)t->rng, sizeof(t->rng)) != 1) {
            snprintf(msg, msglen, "RAND_bytes failed");
            free(t);
            return NULL;
        }
    } while (!(t->rng[0] | t->rng[1] | t->rng[2] | t->rng[3]));
    t->sample_all = sample_ratio >= 1.0;
    /* 2^64 * ratio, below 2^64 since ratio < 1 here */
    t->sample_below = sample_ratio > 0.0 && !t->sample_all
                          ? (uint64_t)(sample_ratio * 18446744073709551616.0)
                          : 0;
    t->limits = (upstream_limits_t){.connect_timeout_ms = 2000, .timeout_ms = 5000,
                                    .idle_timeout_ms = 5000, .pool = 1};
    if (url->tls && !(t->tls = upstream_tls_new(NULL, NULL, msg, msglen))) {
        free(t);
        return NULL;
    }
    upstream_opts_t uo = {.base = base, .tls = t->tls, .host = url->hp.host, .port = url->hp.port,
                          .limits = &t->limits};
    if (!(t->pool = upstream_pool_new(&uo, msg, msglen))) {
        if (t->tls)
            SSL_CTX_free(t->tls);
        free(t);
        return NULL;
    }
    size_t plen = strlen(url->path);
    t->target = xasprintf("%.*s/v1/traces", (int)(plen && url->path[plen - 1] == '/' ? plen - 1 : plen),
                          url->path);
    t->host = xstrdup(url->host_header);
    t->pending = evbuffer_new();
    t->timer = event_new(base, -1, EV_PERSIST, flush_tick, t);
    struct timeval tv = {TRACE_FLUSH_MS / 1000, (TRACE_FLUSH_MS % 1000) * 1000};
    evtimer_add(t->timer, &tv);
    return t;
}

void tracer_free(tracer_t *t)
{
    if (!t)
        return;
    event_free(t->timer);
    if (t->up)
        upstream_http_abandon(t->up);
    upstream_pool_free(t->pool);
    if (t->tls)
        SSL_CTX_free(t->tls);
    evbuffer_free(t->pending);
    free(t->target);
    free(t->host);
    free(t);
}

void tracer_record(tracer_t *t, const span_t *s)
{
    if (!t || !s->ctx.sampled)
        return;
    if (t->n_pending >= TRACE_MAX_PENDING) {
        t->stats->spans_dropped++;
        return;
    }
    char tid[33], sid[17], pid[17];
    util_hex(s->ctx.trace_id, 16, tid);
    util_hex(s->ctx.span_id, 8, sid);
    if (s->parent_span_id)
        util_hex(s->parent_span_id, 8, pid);
    struct evbuffer *b = t->pending;
    evbuffer_add_printf(
        b, "%s{\"traceId\":\"%s\",\"spanId\":\"%s\"%s%s%s,\"name\":", t->n_pending ? "," : "", tid,
        sid, s->parent_span_id ? ",\"parentSpanId\":\"" : "", s->parent_span_id ? pid : "",
        s->parent_span_id ? "\"" : "");
    if (!add_json_string(b, s->name))
        evbuffer_add(b, "\"span\"", strlen("\"span\""));
    evbuffer_add_printf(b,
                        ",\"kind\":%d,\"startTimeUnixNano\":\"%llu\",\"endTimeUnixNano\":\"%llu\","
                        "\"attributes\":[",
                        s->kind, (unsigned long long)s->start_ns, (unsigned long long)s->end_ns);
    bool first = true;
    for (size_t i = 0; i < s->n_attrs; i++) {
        const char *v = s->attrs[i].value;
        if (!v || !util_utf8_valid(v, strlen(v)))
            continue; /* left out: JSON carries only UTF-8 */
        evbuffer_add_printf(b, "%s{\"key\":", first ? "" : ",");
        (void)add_json_string(b, s->attrs[i].key);
        static const char mid[] = ",\"value\":{\"stringValue\":";
        evbuffer_add(b, mid, sizeof(mid) - 1);
        (void)add_json_string(b, v);
        evbuffer_add(b, "}}", 2);
        first = false;
    }
    evbuffer_add_printf(b, "],\"status\":{\"code\":%d}}", s->error ? 2 : 0);
    t->n_pending++;
    if (t->n_pending >= TRACE_BATCH)
        send_batch(t);
}
