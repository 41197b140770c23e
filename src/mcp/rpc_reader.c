/* The JSON-RPC response to one request, out of a JSON or SSE answer (see rpc_reader.h). */
#include "rpc_reader.h"

#include "util.h"

#include <event2/buffer.h>
#include <stdlib.h>
#include <string.h>

static void take(rpc_reader_t *r, const char *text, size_t len)
{
    size_t off = 0, rlen = 0;
    mcp_resp_class_t cls = mcp_classify_response(text, len, r->id, &off, &rlen);
    if (cls == MCP_RESP_OTHER || cls == MCP_RESP_FOREIGN)
        return;
    r->cls = cls;
    r->result = xstrndup(text + off, rlen);
    r->result_len = rlen;
}

static int on_event(const sse_event_t *ev, void *arg)
{
    rpc_reader_t *r = arg;
    if (ev->data_len > 0)
        take(r, ev->data, ev->data_len);
    return r->result ? 1 : 0;
}

void rpc_reader_init(rpc_reader_t *r, const json_t *id, size_t max_bytes)
{
    memset(r, 0, sizeof(*r));
    r->id = json_incref((json_t *)id);
    r->max_bytes = max_bytes;
}

void rpc_reader_head(rpc_reader_t *r, int status, const http_headers_t *headers, bool sse)
{
    decode_coding_t coding = decode_coding_parse(http_headers_get(headers, "content-encoding"));
    if (status != 200 || coding == DECODE_CODING_UNSUPPORTED) {
        r->unreadable = true;
        return;
    }
    r->decoder = decoder_new(coding);
    r->sse = sse;
    if (sse)
        sse_init(&r->parser, r->max_bytes, on_event, r);
    else
        r->json = evbuffer_new();
}

static void plain(rpc_reader_t *r, const char *data, size_t len)
{
    if (r->sse) {
        (void)sse_feed(&r->parser, data, len);
    } else if (evbuffer_get_length(r->json) + len > r->max_bytes) {
        r->unreadable = true;
    } else {
        evbuffer_add(r->json, data, len);
    }
}

void rpc_reader_body(rpc_reader_t *r, const char *data, size_t len)
{
    if (r->unreadable || r->result || (!r->sse && !r->json))
        return;
    if (!r->decoder) {
        plain(r, data, len);
        return;
    }
    struct evbuffer *out = evbuffer_new();
    size_t limit = decoder_produced(r->decoder) + (r->sse ? SSE_DECODED_PER_READ : r->max_bytes);
    if (decoder_feed(r->decoder, data, len, out, limit) != DECODE_OK)
        r->unreadable = true;
    size_t n = evbuffer_get_length(out);
    if (n > 0 && !r->unreadable)
        plain(r, (const char *)evbuffer_pullup(out, -1), n);
    evbuffer_free(out);
}

bool rpc_reader_end(rpc_reader_t *r)
{
    if (!r->result && !r->unreadable && r->json) {
        size_t n = evbuffer_get_length(r->json);
        take(r, n ? (const char *)evbuffer_pullup(r->json, -1) : "", n);
    }
    return r->result != NULL;
}

void rpc_reader_free(rpc_reader_t *r)
{
    json_decref(r->id);
    decoder_free(r->decoder);
    if (r->sse)
        sse_free(&r->parser);
    if (r->json)
        evbuffer_free(r->json);
    free(r->result);
    memset(r, 0, sizeof(*r));
}
