/* libFuzzer driver for the SSE observer: the events found must not depend on where the stream
 * was split into reads. */
#include "sse.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct digest {
    uint64_t h;
    int n;
} digest_t;

static int fold(const sse_event_t *ev, void *arg)
{
    digest_t *d = arg;
    const char *parts[3] = {ev->event, ev->id ? ev->id : "", ev->data};
    size_t lens[3] = {strlen(ev->event), ev->id ? strlen(ev->id) : 0, ev->data_len};
    for (int i = 0; i < 3; i++)
        for (size_t k = 0; k < lens[i]; k++)
            d->h = (d->h ^ (unsigned char)parts[i][k]) * 1099511628211u;
    d->h = (d->h ^ 0xff) * 1099511628211u;
    d->n++;
    return 0;
}

static digest_t run(const uint8_t *data, size_t size, size_t step)
{
    digest_t d = {1469598103934665603u, 0};
    sse_parser_t p;
    sse_init(&p, 256, fold, &d);
    for (size_t off = 0; off < size; off += step) {
        size_t n = size - off < step ? size - off : step;
        sse_feed(&p, (const char *)data + off, n);
    }
    sse_free(&p);
    return d;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    digest_t whole = run(data, size, size ? size : 1);
    for (size_t step = 1; step < 8; step++) {
        digest_t split = run(data, size, step);
        if (split.h != whole.h || split.n != whole.n) {
            fprintf(stderr, "events differ when fed %zu bytes at a time\n", step);
            abort();
        }
    }
    return 0;
}
