/* libFuzzer driver for the JWT verifier's parsers: the same bytes as a JWK Set and as a bearer
 * token (verified against a fixed set and against the set they parse to, when they do). No
 * input may crash, leak, or verify: the fuzzer holds no private key. */
#include "jwt.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char FIXED[] = "{\"keys\":[{\"kty\":\"OKP\",\"crv\":\"Ed25519\",\"kid\":\"test-ed\","
                            "\"x\":\"pIM0V09pW9HZX7WNiCMIOAIR9m8znOcXklhHpm0upzY\"}]}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static jwks_t *fixed;
    char err[256];
    if (!fixed && !(fixed = jwks_parse(FIXED, strlen(FIXED), err, sizeof(err))))
        abort();
    jwks_t *parsed = jwks_parse((const char *)data, size, err, sizeof(err));
    char *token = malloc(size + 1);
    memcpy(token, data, size);
    token[size] = '\0';
    static const char *const auds[] = {"a"};
    static const char *const claims[] = {"iss", "sub"};
    jwt_rules_t rules = {.issuer = "i",
                         .audiences = auds,
                         .n_audiences = 1,
                         .algorithms = ~0u,
                         .leeway_s = 30,
                         .claims = claims,
                         .n_claims = 2};
    const jwks_t *sets[] = {fixed, parsed};
    char *subject = NULL;
    if (jwt_verify(token, sets, 2, &rules, 1700000000, &subject) == JWT_OK)
        abort(); /* a forgery */
    free(subject);
    free(token);
    jwks_free(parsed);
    return 0;
}
