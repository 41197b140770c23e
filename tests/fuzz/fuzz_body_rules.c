/* libFuzzer driver for the body rules: any Content-Type and body bytes, no crash, and the
 * verdicts agree with what they promise: a body relayed as text is valid UTF-8 without NULs
 * unless its type is one relayed as bytes, and one that opens with a UTF-16/32 byte order
 * mark is never relayed. Input: the Content-Type, a NUL byte, then the body (no NUL: none). */
#include "body_rules.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, '\0', size);
    char *ct = NULL;
    const char *body = (const char *)data;
    size_t len = size;
    if (nul) {
        ct = strndup((const char *)data, (size_t)(nul - data));
        body = (const char *)nul + 1;
        len = size - (size_t)(nul - data) - 1;
    }
    body_rules_status_t enc = body_rules_encoding(ct, body, len);
    const unsigned char *b = (const unsigned char *)body;
    if (enc == BODY_RULES_OK && len >= 2 &&
        ((b[0] == 0xFF && b[1] == 0xFE) || (b[0] == 0xFE && b[1] == 0xFF)))
        abort();
    body_rules_status_t text = body_rules_text(ct, body, len);
    if (text == BODY_RULES_OK && !body_rules_binary_type(ct) && !util_utf8_valid(body, len))
        abort();
    if (text != BODY_RULES_OK && text != BODY_RULES_ERR_NUL && text != BODY_RULES_ERR_UTF8)
        abort();
    (void)body_rules_method((int)size % 40, ct, nul ? "chunked" : NULL, len);
    free(ct);
    return 0;
}
