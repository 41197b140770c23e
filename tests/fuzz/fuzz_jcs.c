/* libFuzzer driver for the canonical JSON parser: whatever parses must serialize to text that
 * parses again and serializes to the same bytes (canonical form is a fixed point).
 *
 * clang -std=c11 -D_GNU_SOURCE -Iinclude -g -O1 -fsanitize=fuzzer,address,undefined \
 *     -o fuzz_jcs tests/fuzz/fuzz_jcs.c src/mcp/jcs.c src/core/util.c src/core/log.c
 * ./fuzz_jcs -max_len=4096 CORPUS_COPY tests/fuzz/corpus/jcs */
#include "jcs.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    jcs_value_t *v;
    char err[128];
    if (jcs_parse((const char *)data, size, &v, err, sizeof err) != JCS_OK) {
        if (strncmp(err, "byte ", 5) != 0)
            abort(); /* every error carries its offset */
        return 0;
    }
    size_t len1, len2;
    char *c1 = jcs_serialize(v, &len1);
    jcs_free(v);
    jcs_status_t st = jcs_parse(c1, len1, &v, err, sizeof err);
    if (st != JCS_OK) {
        fprintf(stderr, "canonical form does not reparse: %s\n", err);
        abort();
    }
    char *c2 = jcs_serialize(v, &len2);
    jcs_free(v);
    if (len1 != len2 || memcmp(c1, c2, len1) != 0) {
        fprintf(stderr, "canonical form is not stable\n");
        abort();
    }
    free(c1);
    free(c2);
    return 0;
}
