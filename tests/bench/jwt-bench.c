/* The cost of verifying a JWT, per protected call: jwt_verify (signature, claims, subject)
 * with the gateway's own code, for each "ALG TOKEN" line of a file made by jwt-tokens.mjs.
 * Prints one JSON object per algorithm: {"alg":..,"verifies":N,"us_per_verify":..}.
 *   jwt-bench JWKS_FILE TOKENS_FILE N */
#include "jwt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0, r;
    do {
        cap = cap ? cap * 2 : 65536;
        buf = realloc(buf, cap + 1);
        r = fread(buf + n, 1, cap - n, f);
        n += r;
    } while (n == cap);
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: jwt-bench JWKS_FILE TOKENS_FILE N\n");
        return 2;
    }
    size_t len, tlen;
    char *jwks_text = slurp(argv[1], &len), *tokens = slurp(argv[2], &tlen);
    long n = strtol(argv[3], NULL, 10);
    char err[256] = "";
    jwks_t *set = jwks_text ? jwks_parse(jwks_text, len, err, sizeof(err)) : NULL;
    if (!set || !tokens || n <= 0) {
        fprintf(stderr, "jwt-bench: cannot load the keys or tokens: %s\n", err);
        return 1;
    }
    static const char *const auds[] = {"mcp-bench"};
    static const char *const claims[] = {"iss", "sub"};
    jwt_rules_t rules = {.issuer = "https://idp.bench",
                         .audiences = auds,
                         .n_audiences = 1,
                         .algorithms = JWT_ALGS_DEFAULT,
                         .leeway_s = 30,
                         .claims = claims,
                         .n_claims = 2};
    const jwks_t *keys[] = {set};
    int rc = 0;
    for (char *line = strtok(tokens, "\n"); line; line = strtok(NULL, "\n")) {
        char *sp = strchr(line, ' ');
        if (!sp)
            continue;
        *sp = '\0';
        const char *alg = line, *token = sp + 1;
        double t0 = now_us();
        for (long i = 0; i < n; i++) {
            char *subject = NULL;
            jwt_status_t st = jwt_verify(token, keys, 1, &rules, (int64_t)time(NULL), &subject);
            free(subject);
            if (st != JWT_OK) {
                fprintf(stderr, "jwt-bench: %s token refused: %s\n", alg, jwt_status_str(st));
                rc = 1;
                break;
            }
        }
        double per = (now_us() - t0) / (double)n;
        printf("{\"alg\":\"%s\",\"verifies\":%ld,\"us_per_verify\":%.1f}\n", alg, n, per);
    }
    jwks_free(set);
    free(jwks_text);
    free(tokens);
    return rc;
}
