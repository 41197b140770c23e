/* libFuzzer driver for the upstream response path: the bytes an MCP server sends back go
 * through the response head parser, body framing (chunked, Content-Length, close-delimited),
 * Content-Encoding decoding, SSE framing and final-response classification, as a protected
 * call's answer would. Nothing may crash or leak, and the framing must never hand on more
 * body than the server sent. */
#include "decode.h"
#include "mcp.h"
#include "sse.h"
#include "upstream_http.h"

#include <event2/buffer.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* upstream_http.c links against the process; the socketless parser never reaches it */

#define CAPTURE_MAX 65536

typedef struct run {
    json_t *req_id;
    int heads;
    bool sse;
    sse_parser_t events;
    decoder_t *decoder;
    struct evbuffer *json;
    size_t body; /* body bytes handed on, as sent (before decoding) */
} run_t;

static void check_final(const char *text, size_t len, const json_t *id)
{
    size_t off = 0, rlen = 0;
    mcp_resp_class_t cls = mcp_classify_response(text, len, id, &off, &rlen);
    if (cls != MCP_RESP_OTHER && cls != MCP_RESP_FOREIGN && off + rlen > len) {
        fprintf(stderr, "result span outside the message\n");
        abort();
    }
}

static int on_event(const sse_event_t *ev, void *arg)
{
    run_t *r = arg;
    check_final(ev->data, ev->data_len, r->req_id);
    return 0;
}

static void on_head(void *arg, int status, const http_headers_t *headers)
{
    run_t *r = arg;
    r->heads++;
    const char *ct = http_headers_get(headers, "content-type");
    r->sse = ct && strncasecmp(ct, "text/event-stream", 17) == 0;
    if (r->sse)
        sse_init(&r->events, 4096, on_event, r);
    decoder_free(r->decoder);
    r->decoder = decoder_new(decode_coding_parse(http_headers_get(headers, "content-encoding")));
}

static void capture(run_t *r, const char *data, size_t len)
{
    if (r->sse) {
        int rc = sse_feed(&r->events, data, len);
        (void)rc;
    } else if (evbuffer_get_length(r->json) + len <= CAPTURE_MAX) {
        evbuffer_add(r->json, data, len);
    }
}

static void on_body(void *arg, const char *data, size_t len)
{
    run_t *r = arg;
    r->body += len;
    if (!r->decoder) {
        capture(r, data, len);
        return;
    }
    struct evbuffer *plain = evbuffer_new();
    decode_status_t st = decoder_feed(r->decoder, data, len, plain, CAPTURE_MAX);
    size_t n = evbuffer_get_length(plain);
    if (n > 0)
        capture(r, (const char *)evbuffer_pullup(plain, -1), n);
    evbuffer_free(plain);
    (void)st;
}

static void on_end(void *arg, upstream_result_t res)
{
    (void)arg;
    (void)res;
}

static const upstream_cbs_t cbs = {on_head, on_body, on_end};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    run_t r = {.req_id = json_integer(1), .json = evbuffer_new()};
    size_t rest = 0;
    upstream_result_t res =
        upstream_parse_response((const char *)data, size, &cbs, &r, &rest);
    if (rest > size || r.body > size || r.heads > 1) {
        fprintf(stderr, "framing handed on more than was sent\n");
        abort();
    }
    if (res == UPSTREAM_OK && r.decoder) {
        decode_status_t st = decoder_finish(r.decoder);
        (void)st;
    }
    if (res == UPSTREAM_OK && !r.sse && evbuffer_get_length(r.json) > 0) {
        size_t n = evbuffer_get_length(r.json);
        check_final((const char *)evbuffer_pullup(r.json, -1), n, r.req_id);
    }
    (void)upstream_result_str(res);
    if (r.sse)
        sse_free(&r.events);
    decoder_free(r.decoder);
    evbuffer_free(r.json);
    json_decref(r.req_id);
    return 0;
}
