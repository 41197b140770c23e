#include "decode.h"

#include <brotli/decode.h>
#include <event2/buffer.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zlib.h>

struct decoder {
    decode_coding_t coding;
    z_stream z;             /* gzip and deflate */
    BrotliDecoderState *br; /* br */
    size_t produced;        /* decoded bytes so far, against the caller's limit */
    bool ended;             /* the coded stream reached its end */
    decode_status_t failed; /* sticky: once wrong, always wrong */
};

const char *decode_status_str(decode_status_t st)
{
    switch (st) {
    case DECODE_OK:
        return "ok";
    case DECODE_ERR_DATA:
        return "invalid coded data";
    case DECODE_ERR_LIMIT:
        return "decoded body too large";
    case DECODE_ERR_TRUNCATED:
        return "coded body cut short";
    }
    return "unknown";
}

decode_coding_t decode_coding_parse(const char *value)
{
    if (!value)
        return DECODE_CODING_IDENTITY;
    while (*value == ' ' || *value == '\t')
        value++;
    size_t n = strcspn(value, " \t,");
    const char *after = value + n;
    while (*after == ' ' || *after == '\t')
        after++;
    if (*after)
        return DECODE_CODING_UNSUPPORTED; /* stacked codings: not worth the risk */
    static const struct {
        const char *name;
        decode_coding_t coding;
    } names[] = {
        {"", DECODE_CODING_IDENTITY},       {"identity", DECODE_CODING_IDENTITY},
        {"gzip", DECODE_CODING_GZIP},       {"x-gzip", DECODE_CODING_GZIP},
        {"deflate", DECODE_CODING_DEFLATE}, {"br", DECODE_CODING_BR},
    };
    for (size_t i = 0; i < ARRAY_LEN(names); i++)
        if (strlen(names[i].name) == n && strncasecmp(value, names[i].name, n) == 0)
            return names[i].coding;
    return DECODE_CODING_UNSUPPORTED;
}

decoder_t *decoder_new(decode_coding_t coding)
{
    if (coding != DECODE_CODING_GZIP && coding != DECODE_CODING_DEFLATE &&
        coding != DECODE_CODING_BR)
        return NULL;
    decoder_t *d = xcalloc(1, sizeof(*d));
    d->coding = coding;
    if (coding == DECODE_CODING_BR) {
        d->br = BrotliDecoderCreateInstance(NULL, NULL, NULL);
        if (!d->br)
            abort(); /* allocation failure: see util.h */
        return d;
    }
    /* 16 + MAX_WBITS reads a gzip wrapper, MAX_WBITS a zlib one */
    int bits = coding == DECODE_CODING_GZIP ? 16 + MAX_WBITS : MAX_WBITS;
    if (inflateInit2(&d->z, bits) != Z_OK)
        abort();
    return d;
}

void decoder_free(decoder_t *d)
{
    if (!d)
        return;
    if (d->br)
        BrotliDecoderDestroyInstance(d->br);
    else
        inflateEnd(&d->z);
    free(d);
}

static decode_status_t emit(decoder_t *d, const unsigned char *buf, size_t n, struct evbuffer *out,
                            size_t limit)
{
    d->produced += n;
    if (d->produced > limit)
        return DECODE_ERR_LIMIT;
    evbuffer_add(out, buf, n);
    return DECODE_OK;
}

static decode_status_t feed_zlib(decoder_t *d, const char *in, size_t len, struct evbuffer *out,
                                 size_t limit)
{
    unsigned char buf[16384];
    d->z.next_in = (Bytef *)in;
    d->z.avail_in = (uInt)len;
    while (d->z.avail_in > 0 && !d->ended) {
        d->z.next_out = buf;
        d->z.avail_out = sizeof(buf);
        int rc = inflate(&d->z, Z_NO_FLUSH);
        if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR)
            return DECODE_ERR_DATA;
        decode_status_t st = emit(d, buf, sizeof(buf) - d->z.avail_out, out, limit);
        if (st != DECODE_OK)
            return st;
        if (rc == Z_STREAM_END)
            d->ended = true;
        else if (rc == Z_BUF_ERROR && d->z.avail_out > 0)
            return DECODE_ERR_DATA; /* no progress possible with input left */
    }
    return d->z.avail_in > 0 ? DECODE_ERR_DATA : DECODE_OK; /* bytes after the end */
}

static decode_status_t feed_br(decoder_t *d, const char *in, size_t len, struct evbuffer *out,
                               size_t limit)
{
    const uint8_t *next_in = (const uint8_t *)in;
    size_t avail_in = len;
    for (;;) {
        uint8_t buf[16384];
        uint8_t *next_out = buf;
        size_t avail_out = sizeof(buf);
        BrotliDecoderResult rc =
            BrotliDecoderDecompressStream(d->br, &avail_in, &next_in, &avail_out, &next_out, NULL);
        if (rc == BROTLI_DECODER_RESULT_ERROR)
            return DECODE_ERR_DATA;
        decode_status_t st = emit(d, buf, sizeof(buf) - avail_out, out, limit);
        if (st != DECODE_OK)
            return st;
        if (rc == BROTLI_DECODER_RESULT_SUCCESS) {
            d->ended = true;
            return avail_in > 0 ? DECODE_ERR_DATA : DECODE_OK;
        }
        if (rc == BROTLI_DECODER_RESULT_NEEDS_MORE_INPUT)
            return DECODE_OK;
    }
}

decode_status_t decoder_feed(decoder_t *d, const char *in, size_t len, struct evbuffer *out,
                             size_t limit)
{
    if (d->failed != DECODE_OK)
        return d->failed;
    if (len == 0)
        return DECODE_OK;
    if (d->ended) {
        d->failed = DECODE_ERR_DATA;
        return d->failed;
    }
    d->failed = d->br ? feed_br(d, in, len, out, limit) : feed_zlib(d, in, len, out, limit);
    return d->failed;
}

size_t decoder_produced(const decoder_t *d)
{
    return d->produced;
}

decode_status_t decoder_finish(decoder_t *d)
{
    if (d->failed != DECODE_OK)
        return d->failed;
    return d->ended ? DECODE_OK : DECODE_ERR_TRUNCATED;
}
