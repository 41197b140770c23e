/* Content-Encoding decoding: each coding round-trips, whatever the split; bad, cut and
 * oversized bodies are reported as such. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "decode.h"

#include <event2/buffer.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static const char plain[] =
    "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[{\"type\":\"text\","
    "\"text\":\"hello hello hello hello\"}]}}";

/* plain compressed with zlib's gzip (16 + bits) or zlib (bits) wrapper */
static size_t zcompress(int bits, unsigned char *out, size_t cap)
{
    z_stream z = {0};
    assert_int_equal(deflateInit2(&z, 6, Z_DEFLATED, bits, 8, Z_DEFAULT_STRATEGY), Z_OK);
    z.next_in = (Bytef *)plain;
    z.avail_in = sizeof(plain) - 1;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    assert_int_equal(deflate(&z, Z_FINISH), Z_STREAM_END);
    size_t n = cap - z.avail_out;
    deflateEnd(&z);
    return n;
}

/* plain compressed with brotli (node's zlib.brotliCompressSync) */
static const unsigned char br_plain[] = {
    0x1b, 0x5f, 0x00, 0xe8, 0x2c, 0x0e, 0xec, 0xb6, 0x1e, 0x5f, 0x38, 0x85, 0x82, 0xd5, 0x50, 0xec,
    0xce, 0x13, 0xfd, 0x11, 0x2a, 0xbd, 0x45, 0xf6, 0xb6, 0x62, 0x36, 0x8c, 0x0c, 0x59, 0x9a, 0x64,
    0x11, 0x71, 0x69, 0x9d, 0xbe, 0x2e, 0x96, 0x2d, 0x32, 0x06, 0x27, 0xd7, 0x03, 0x6e, 0xe2, 0x51,
    0xde, 0x98, 0x14, 0xd1, 0x52, 0x25, 0xbb, 0x35, 0x21, 0x61, 0xea, 0x41, 0x46, 0x3d, 0x5f, 0x70,
    0xe2, 0x18, 0x29, 0xa4, 0x94, 0xa7, 0xc7, 0x00, 0x32, 0xc9, 0x86, 0x9b, 0xea, 0x05,
};

static decode_status_t decode_split(decode_coding_t coding, const unsigned char *in, size_t len,
                                    size_t split, size_t limit, struct evbuffer *out)
{
    decoder_t *d = decoder_new(coding);
    assert_non_null(d);
    decode_status_t st = decoder_feed(d, (const char *)in, split, out, limit);
    if (st == DECODE_OK)
        st = decoder_feed(d, (const char *)in + split, len - split, out, limit);
    if (st == DECODE_OK)
        st = decoder_finish(d);
    decoder_free(d);
    return st;
}

static void round_trip(decode_coding_t coding, const unsigned char *in, size_t len)
{
    for (size_t split = 0; split <= len; split++) {
        struct evbuffer *out = evbuffer_new();
        assert_int_equal(decode_split(coding, in, len, split, 1 << 20, out), DECODE_OK);
        assert_int_equal(evbuffer_get_length(out), sizeof(plain) - 1);
        assert_memory_equal(evbuffer_pullup(out, -1), plain, sizeof(plain) - 1);
        evbuffer_free(out);
    }
    struct evbuffer *out = evbuffer_new();
    /* cut short, over the limit, followed by junk */
    assert_int_equal(decode_split(coding, in, len - 1, 0, 1 << 20, out), DECODE_ERR_TRUNCATED);
    assert_int_equal(decode_split(coding, in, len, len / 2, 10, out), DECODE_ERR_LIMIT);
    unsigned char *junk = malloc(len + 1);
    memcpy(junk, in, len);
    junk[len] = 'x';
    assert_int_equal(decode_split(coding, junk, len + 1, 0, 1 << 20, out), DECODE_ERR_DATA);
    free(junk);
    evbuffer_free(out);
}

static void test_codings(void **state)
{
    unsigned char buf[512];
    round_trip(DECODE_CODING_GZIP, buf, zcompress(16 + MAX_WBITS, buf, sizeof(buf)));
    round_trip(DECODE_CODING_DEFLATE, buf, zcompress(MAX_WBITS, buf, sizeof(buf)));
    round_trip(DECODE_CODING_BR, br_plain, sizeof(br_plain));
}

static void test_not_coded(void **state)
{
    struct evbuffer *out = evbuffer_new();
    const unsigned char text[] = "{\"not\":\"compressed\"}";
    assert_int_equal(decode_split(DECODE_CODING_GZIP, text, sizeof(text) - 1, 3, 1 << 20, out),
                     DECODE_ERR_DATA);
    assert_int_equal(decode_split(DECODE_CODING_BR, text, sizeof(text) - 1, 3, 1 << 20, out),
                     DECODE_ERR_DATA);
    evbuffer_free(out);
}

static void test_coding_names(void **state)
{
    static const struct {
        const char *value;
        decode_coding_t coding;
    } cases[] = {
        {NULL, DECODE_CODING_IDENTITY},          {"identity", DECODE_CODING_IDENTITY},
        {" gzip ", DECODE_CODING_GZIP},          {"X-GZIP", DECODE_CODING_GZIP},
        {"deflate", DECODE_CODING_DEFLATE},      {"br", DECODE_CODING_BR},
        {"gzip, br", DECODE_CODING_UNSUPPORTED}, {"zstd", DECODE_CODING_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_int_equal(decode_coding_parse(cases[i].value), cases[i].coding);
    assert_null(decoder_new(DECODE_CODING_IDENTITY));
    assert_null(decoder_new(DECODE_CODING_UNSUPPORTED));
    assert_string_equal(decode_status_str(DECODE_ERR_LIMIT), "decoded body too large");
    assert_string_equal(decode_status_str(DECODE_ERR_TRUNCATED), "coded body cut short");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codings),
        cmocka_unit_test(test_not_coded),
        cmocka_unit_test(test_coding_names),
    };
    return cmocka_run_group_tests_name("decode", tests, NULL, NULL);
}
