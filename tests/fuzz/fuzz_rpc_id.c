/* libFuzzer driver for the rewriting of a protected call's answer (rpc_id.h): the first byte
 * picks a JSON or SSE body, strict or lenient; what comes out, and whether the answer is found
 * out of step, must not depend on where the body was split into reads. */
#include "rpc_id.h"

#include <event2/buffer.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define ASSIGNED "\"idemgw-0123456789abcdef-1\""

static const char *lookup(void *arg, const char *id, size_t len, bool response)
{
    (void)arg;
    (void)response;
    return id && rpc_id_same(id, len, ASSIGNED, sizeof(ASSIGNED) - 1) ? "42" : NULL;
}

typedef struct result {
    rpc_id_status_t st;
    struct evbuffer *out;
} result_t;

static result_t run(rpc_body_t kind, bool strict, const uint8_t *data, size_t size, size_t step)
{
    result_t r = {RPC_ID_OK, evbuffer_new()};
    rpc_id_rewriter_t *w =
        rpc_id_rewriter_new(kind, DECODE_CODING_IDENTITY, 1024, lookup, NULL, strict);
    for (size_t off = 0; off < size && r.st == RPC_ID_OK; off += step) {
        size_t n = size - off < step ? size - off : step;
        r.st = rpc_id_rewriter_feed(w, (const char *)data + off, n, r.out);
    }
    if (r.st == RPC_ID_OK)
        r.st = rpc_id_rewriter_finish(w, true, r.out);
    rpc_id_rewriter_free(w);
    return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    rpc_body_t kind = data[0] & 1 ? RPC_BODY_SSE : RPC_BODY_JSON;
    bool strict = data[0] & 2;
    data++;
    size--;
    result_t whole = run(kind, strict, data, size, size ? size : 1);
    for (size_t step = 1; step < 6; step++) {
        result_t split = run(kind, strict, data, size, step);
        size_t a = evbuffer_get_length(whole.out), b = evbuffer_get_length(split.out);
        /* a failure ends the answer: what came out before it is not compared. An empty
         * buffer pulls up to NULL, which memcmp must not be given even for no bytes. */
        bool same = split.st == whole.st &&
                    (whole.st != RPC_ID_OK ||
                     (a == b && (a == 0 || memcmp(evbuffer_pullup(whole.out, -1),
                                                  evbuffer_pullup(split.out, -1), a) == 0)));
        evbuffer_free(split.out);
        if (!same) {
            fprintf(stderr, "the answer differs when fed %zu bytes at a time\n", step);
            abort();
        }
    }
    evbuffer_free(whole.out);
    return 0;
}
