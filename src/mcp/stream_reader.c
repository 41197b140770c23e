#include "stream_reader.h"
#include "log.h"

#include <event2/buffer.h>

void stream_reader_head(stream_reader_t *r, int status, const http_headers_t *headers, bool sse,
                        size_t max_event, sse_event_cb on_event, void *arg)
{
    if (status != 200 || !sse || r->reading)
        return;
    decode_coding_t coding = decode_coding_parse(http_headers_get(headers, "content-encoding"));
    if (coding == DECODE_CODING_UNSUPPORTED) {
        log_warn(r->conn_id, "%s in an unreadable coding", r->what);
        return;
    }
    r->decoder = decoder_new(coding);
    r->reading = true;
    sse_init(&r->sse, max_event, on_event, arg);
}

void stream_reader_body(stream_reader_t *r, const char *data, size_t len)
{
    if (!r->reading)
        return;
    if (!r->decoder) {
        sse_feed(&r->sse, data, len);
        return;
    }
    /* each read bounded; its events are bounded by the SSE parser */
    struct evbuffer *plain = evbuffer_new();
    decode_status_t st = decoder_feed(r->decoder, data, len, plain,
                                      decoder_produced(r->decoder) + SSE_DECODED_PER_READ);
    size_t n = evbuffer_get_length(plain);
    if (n > 0)
        sse_feed(&r->sse, (const char *)evbuffer_pullup(plain, -1), n);
    evbuffer_free(plain);
    if (st != DECODE_OK) {
        log_warn(r->conn_id, "%s: compressed stream unreadable: %s", r->what,
                 decode_status_str(st));
        stream_reader_free(r);
    }
}

void stream_reader_free(stream_reader_t *r)
{
    if (r->reading)
        sse_free(&r->sse);
    decoder_free(r->decoder);
    r->decoder = NULL;
    r->reading = false;
}
