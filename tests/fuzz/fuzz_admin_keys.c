/* libFuzzer driver for what the operator queue reads from an operator: the admin token file
 * with a request's Authorization header, and a key's entry turned into the webhook's message.
 * No crash, and a match always names someone. Input: the file's text, a NUL byte, then the
 * header (no NUL: no header). */
#include "../../src/ops/admin_keys.h"
#include "alerts.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, '\0', size);
    size_t flen = nul ? (size_t)(nul - data) : size;
    char *file = strndup((const char *)data, flen);
    char *auth = nul ? strndup((const char *)nul + 1, size - flen - 1) : NULL;
    char name[128];
    if (admin_keys_token_match(file, "/etc/idemgw/tokens", auth, name, sizeof(name)) &&
        name[0] == '\0' && !strchr(file, ':'))
        abort(); /* a bare token is named after the file */
    free(alerts_body(file, size % 2 ? ALERTS_FORMAT_SLACK : ALERTS_FORMAT_JSON));
    free(file);
    free(auth);
    return 0;
}
