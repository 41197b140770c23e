/* JWK Sets and token verification. Every key is made here with OpenSSL and every token signed
 * here with EVP, so the verifier is checked against an independent signer: the JWS encodings
 * (r || s for ECDSA, PSS with a digest-long salt) are produced by this file, not by jwt.c. */
#include "jwt.h"

#include <stdarg.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/x509.h>
#include <openssl/rsa.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOW 1700000000LL

static EVP_PKEY *rsa_a, *rsa_b, *rsa_small, *ec256, *ec384, *ed;

static int setup(void **state)
{
    (void)state;
    rsa_a = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)2048);
    rsa_b = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)2048);
    rsa_small = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)1024);
    ec256 = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
    ec384 = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-384");
    ed = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
    return rsa_a && rsa_b && rsa_small && ec256 && ec384 && ed ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    EVP_PKEY_free(rsa_a);
    EVP_PKEY_free(rsa_b);
    EVP_PKEY_free(rsa_small);
    EVP_PKEY_free(ec256);
    EVP_PKEY_free(ec384);
    EVP_PKEY_free(ed);
    return 0;
}

/* --- encoding, independent of jwt.c --- */

static char *b64url(const unsigned char *in, size_t n)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    char *out = malloc(n * 4 / 3 + 4), *p = out;
    size_t i = 0;
    for (; i + 2 < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        *p++ = abc[v >> 18];
        *p++ = abc[(v >> 12) & 63];
        *p++ = abc[(v >> 6) & 63];
        *p++ = abc[v & 63];
    }
    if (n - i == 1) {
        *p++ = abc[in[i] >> 2];
        *p++ = abc[(in[i] & 3) << 4];
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)in[i] << 8 | in[i + 1];
        *p++ = abc[v >> 10];
        *p++ = abc[(v >> 4) & 63];
        *p++ = abc[(v & 15) << 2];
    }
    *p = 0;
    return out;
}

static char *b64url_str(const char *s)
{
    return b64url((const unsigned char *)s, strlen(s));
}

static char *bn_param(EVP_PKEY *k, const char *name, size_t pad)
{
    BIGNUM *bn = NULL;
    assert_int_equal(EVP_PKEY_get_bn_param(k, name, &bn), 1);
    size_t n = pad ? pad : (size_t)BN_num_bytes(bn);
    unsigned char buf[1024];
    assert_true(BN_bn2binpad(bn, buf, (int)n) == (int)n);
    BN_free(bn);
    return b64url(buf, n);
}

/* The public JWK of k, as JSON text (caller frees); extra members (",\"alg\":...") may be "". */
static char *jwk_of(EVP_PKEY *k, const char *kid, const char *extra)
{
    char *a = NULL, *b = NULL, *out;
    char kidm[80] = "";
    if (kid)
        snprintf(kidm, sizeof(kidm), ",\"kid\":\"%s\"", kid);
    if (EVP_PKEY_is_a(k, "RSA")) {
        a = bn_param(k, OSSL_PKEY_PARAM_RSA_N, 0);
        b = bn_param(k, OSSL_PKEY_PARAM_RSA_E, 0);
        assert_true(asprintf(&out, "{\"kty\":\"RSA\",\"n\":\"%s\",\"e\":\"%s\"%s%s}", a, b, kidm,
                             extra) > 0);
    } else if (EVP_PKEY_is_a(k, "EC")) {
        size_t coord = EVP_PKEY_get_bits(k) == 256 ? 32 : 48;
        a = bn_param(k, OSSL_PKEY_PARAM_EC_PUB_X, coord);
        b = bn_param(k, OSSL_PKEY_PARAM_EC_PUB_Y, coord);
        assert_true(asprintf(&out, "{\"kty\":\"EC\",\"crv\":\"%s\",\"x\":\"%s\",\"y\":\"%s\"%s%s}",
                             coord == 32 ? "P-256" : "P-384", a, b, kidm, extra) > 0);
    } else {
        unsigned char raw[32];
        size_t n = sizeof(raw);
        assert_int_equal(EVP_PKEY_get_raw_public_key(k, raw, &n), 1);
        a = b64url(raw, n);
        assert_true(asprintf(&out, "{\"kty\":\"OKP\",\"crv\":\"Ed25519\",\"x\":\"%s\"%s%s}", a,
                             kidm, extra) > 0);
    }
    free(a);
    free(b);
    return out;
}

static jwks_t *parse_ok(const char *json)
{
    char err[256] = "";
    jwks_t *k = jwks_parse(json, strlen(json), err, sizeof(err));
    if (!k)
        fail_msg("jwks_parse refused %s: %s", json, err);
    return k;
}

/* A set of the given JWKs (NULL-terminated), each freed. */
static jwks_t *set_of(char *first, ...)
{
    char *text = strdup("{\"keys\":[");
    va_list ap;
    va_start(ap, first);
    for (char *k = first; k; k = va_arg(ap, char *)) {
        char *t;
        assert_true(asprintf(&t, "%s%s%s", text, text[9] ? "," : "", k) > 0);
        free(text);
        free(k);
        text = t;
    }
    va_end(ap);
    char *t;
    assert_true(asprintf(&t, "%s]}", text) > 0);
    free(text);
    jwks_t *set = parse_ok(t);
    free(t);
    return set;
}

/* The JWS signature of input as the JWS spec encodes it. */
static char *sign(EVP_PKEY *k, const char *alg, const char *input)
{
    const EVP_MD *md = NULL;
    if (strstr(alg, "256") && strcmp(alg, "EdDSA") != 0)
        md = EVP_sha256();
    else if (strstr(alg, "384"))
        md = EVP_sha384();
    else if (strstr(alg, "512"))
        md = EVP_sha512();
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    EVP_PKEY_CTX *pctx = NULL;
    assert_int_equal(EVP_DigestSignInit(ctx, &pctx, md, NULL, k), 1);
    if (alg[0] == 'P') {
        assert_true(EVP_PKEY_CTX_set_rsa_padding(pctx, RSA_PKCS1_PSS_PADDING) > 0);
        assert_true(EVP_PKEY_CTX_set_rsa_pss_saltlen(pctx, RSA_PSS_SALTLEN_DIGEST) > 0);
    }
    unsigned char sig[1024];
    size_t n = sizeof(sig);
    assert_int_equal(EVP_DigestSign(ctx, sig, &n, (const unsigned char *)input, strlen(input)), 1);
    EVP_MD_CTX_free(ctx);
    if (alg[0] == 'E' && alg[1] == 'S') {
        /* DER to r || s */
        size_t coord = strstr(alg, "256") ? 32 : 48;
        const unsigned char *p = sig;
        ECDSA_SIG *es = d2i_ECDSA_SIG(NULL, &p, (long)n);
        assert_non_null(es);
        unsigned char rs[96];
        BN_bn2binpad(ECDSA_SIG_get0_r(es), rs, (int)coord);
        BN_bn2binpad(ECDSA_SIG_get0_s(es), rs + coord, (int)coord);
        ECDSA_SIG_free(es);
        return b64url(rs, 2 * coord);
    }
    return b64url(sig, n);
}

/* header.payload.signature; header is the JSON text given (alg and kid in it). */
static char *token_raw(EVP_PKEY *k, const char *alg, const char *header, const char *payload)
{
    char *h = b64url_str(header), *p = b64url_str(payload), *input, *out;
    assert_true(asprintf(&input, "%s.%s", h, p) > 0);
    char *s = k ? sign(k, alg, input) : strdup("");
    assert_true(asprintf(&out, "%s.%s", input, s) > 0);
    free(h);
    free(p);
    free(input);
    free(s);
    return out;
}

static char *token(EVP_PKEY *k, const char *alg, const char *kid, const char *payload)
{
    char header[160];
    if (kid)
        snprintf(header, sizeof(header), "{\"alg\":\"%s\",\"typ\":\"JWT\",\"kid\":\"%s\"}", alg,
                 kid);
    else
        snprintf(header, sizeof(header), "{\"alg\":\"%s\",\"typ\":\"JWT\"}", alg);
    return token_raw(k, alg, header, payload);
}

static const char *const auds[] = {"mcp-refunds", "mcp-other"};
static const char *const claim_names[] = {"iss", "sub"};

static jwt_rules_t rules(void)
{
    return (jwt_rules_t){
        .issuer = "https://idp.example",
        .audiences = auds,
        .n_audiences = 1,
        .algorithms = JWT_ALGS_DEFAULT,
        .leeway_s = 30,
        .claims = claim_names,
        .n_claims = 2,
    };
}

#define GOOD_CLAIMS                                                                                \
    "{\"iss\":\"https://"                                                                          \
    "idp.example\",\"sub\":\"alice\",\"aud\":\"mcp-refunds\",\"exp\":1700000600}"

/* Verifies tok (freed) against set with r; returns the status, checks the subject on OK. */
static jwt_status_t check(jwks_t *set, char *tok, const jwt_rules_t *r)
{
    const jwks_t *sets[] = {set};
    char *subject = NULL;
    jwt_status_t st = jwt_verify(tok, sets, 1, r, NOW, &subject);
    if (st == JWT_OK) {
        assert_non_null(subject);
        assert_string_equal(subject, "[\"https://idp.example\",\"alice\"]");
    } else {
        assert_null(subject);
    }
    free(subject);
    free(tok);
    return st;
}

/* --- JWK Sets --- */

static void test_jwks_parse_types(void **state)
{
    (void)state;
    jwks_t *set = set_of(jwk_of(rsa_a, "r1", ""), jwk_of(ec256, "e1", ""), jwk_of(ec384, "e2", ""),
                         jwk_of(ed, "o1", ",\"use\":\"sig\",\"alg\":\"EdDSA\""), NULL);
    assert_int_equal(jwks_count(set), 4);
    jwks_free(set);

    /* skipped, not refused: encryption keys, shared secrets, curves not used, other algs */
    char *rsa = jwk_of(rsa_a, "r1", "");
    char *enc = jwk_of(rsa_b, "enc", ",\"use\":\"enc\"");
    char *oaep = jwk_of(rsa_b, "oaep", ",\"alg\":\"RSA-OAEP\"");
    char *text;
    assert_true(asprintf(&text,
                         "{\"keys\":[%s,%s,%s,{\"kty\":\"oct\",\"k\":\"c2VjcmV0\"},"
                         "{\"kty\":\"EC\",\"crv\":\"P-521\",\"x\":\"AA\",\"y\":\"AA\"},"
                         "{\"kty\":\"OKP\",\"crv\":\"X25519\",\"x\":\"AA\"}],\"extra\":1}",
                         rsa, enc, oaep) > 0);
    set = parse_ok(text);
    assert_int_equal(jwks_count(set), 1);
    jwks_free(set);
    free(text);
    free(rsa);
    free(enc);
    free(oaep);
}

static void expect_refused(const char *json, const char *why)
{
    char err[256] = "";
    jwks_t *k = jwks_parse(json, strlen(json), err, sizeof(err));
    if (k)
        fail_msg("jwks_parse accepted %s", json);
    if (!strstr(err, why))
        fail_msg("error '%s' does not say '%s'", err, why);
}

static void test_jwks_parse_refused(void **state)
{
    (void)state;
    expect_refused("", "not JSON");
    expect_refused("[]", "no \"keys\" array");
    expect_refused("{\"keys\":{}}", "no \"keys\" array");
    expect_refused("{\"keys\":[]}", "no usable signing key");
    expect_refused("{\"keys\":[{\"kty\":\"oct\",\"k\":\"AA\"}]}", "no usable signing key");
    expect_refused("{\"keys\":[],\"keys\":[]}", "not JSON");
    expect_refused("{\"keys\":[1]}", "key 1: not an object");
    expect_refused("{\"keys\":[{\"kty\":1}]}", "kty must be a string");

    char *good = jwk_of(rsa_a, "r1", ""), *text, *p;
    /* a bad member of one key fails the whole set, named by its place and kid */
    const struct {
        const char *from, *to, *why;
    } edits[] = {
        {"\"kid\":\"r1\"", "\"kid\":7", "kid"},
        {"\"e\":\"AQAB\"", "\"e\":\"AQAB=\"", "n and e"},
        {"\"e\":\"AQAB\"", "\"e\":\"AQ+B\"", "n and e"},
        {"\"e\":\"AQAB\"", "\"e\":\"AQAC\"", "exponent"},
        {"\"e\":\"AQAB\"", "\"e\":\"AQAB\",\"d\":\"AQAB\"", "private"},
        {"\"e\":\"AQAB\"", "\"e\":\"AQAB\",\"alg\":\"ES256\"", "alg does not fit"},
    };
    for (size_t i = 0; i < ARRAY_LEN(edits); i++) {
        p = strstr(good, edits[i].from);
        assert_non_null(p);
        assert_true(asprintf(&text, "{\"keys\":[{\"kty\":\"oct\",\"k\":\"AA\"},%.*s%s%s]}",
                             (int)(p - good), good, edits[i].to, p + strlen(edits[i].from)) > 0);
        expect_refused(text, edits[i].why);
        assert_non_null(strstr(text, "kty\":\"oct"));
        free(text);
    }
    free(good);

    good = jwk_of(rsa_small, "small", "");
    assert_true(asprintf(&text, "{\"keys\":[%s]}", good) > 0);
    expect_refused(text, "shorter than 2048");
    free(text);
    free(good);

    good = jwk_of(ec256, "e1", "");
    p = strstr(good, "\"x\":\"");
    assert_true(asprintf(&text, "{\"keys\":[%.*s\"x\":\"AAAA%s]}", (int)(p - good), good, p + 5) >
                0);
    expect_refused(text, "x and y");
    free(text);
    /* a point off the curve: x changed in its first character */
    char *x = strdup(p + 5);
    x[0] = x[0] == 'A' ? 'B' : 'A';
    assert_true(asprintf(&text, "{\"keys\":[%.*s\"x\":\"%s]}", (int)(p - good), good, x) > 0);
    expect_refused(text, "not a point");
    free(text);
    free(x);
    free(good);

    /* "AR" carries bits past the one byte it encodes: not the canonical text of any bytes */
    expect_refused("{\"keys\":[{\"kty\":\"OKP\",\"crv\":\"Ed25519\",\"x\":\"AR\"}]}", "x must");
    expect_refused("{\"keys\":[{\"kty\":\"OKP\",\"crv\":\"Ed25519\",\"x\":\"AA==\"}]}", "x must");
}

/* --- tokens --- */

static void test_verify_algorithms(void **state)
{
    (void)state;
    jwks_t *set = set_of(jwk_of(rsa_a, "r1", ""), jwk_of(ec256, "e1", ""), jwk_of(ec384, "e2", ""),
                         jwk_of(ed, "o1", ""), NULL);
    jwt_rules_t r = rules();
    assert_int_equal(check(set, token(rsa_a, "RS256", "r1", GOOD_CLAIMS), &r), JWT_OK);
    assert_int_equal(check(set, token(rsa_a, "PS256", "r1", GOOD_CLAIMS), &r), JWT_OK);
    assert_int_equal(check(set, token(ec256, "ES256", "e1", GOOD_CLAIMS), &r), JWT_OK);
    assert_int_equal(check(set, token(ed, "EdDSA", "o1", GOOD_CLAIMS), &r), JWT_OK);
    /* outside the default allowlist until listed */
    assert_int_equal(check(set, token(ec384, "ES384", "e2", GOOD_CLAIMS), &r), JWT_ALG_NOT_ALLOWED);
    assert_int_equal(check(set, token(rsa_a, "RS512", "r1", GOOD_CLAIMS), &r), JWT_ALG_NOT_ALLOWED);
    r.algorithms |= JWT_ALG_ES384 | JWT_ALG_RS512 | JWT_ALG_PS384;
    assert_int_equal(check(set, token(ec384, "ES384", "e2", GOOD_CLAIMS), &r), JWT_OK);
    assert_int_equal(check(set, token(rsa_a, "RS512", "r1", GOOD_CLAIMS), &r), JWT_OK);
    assert_int_equal(check(set, token(rsa_a, "PS384", "r1", GOOD_CLAIMS), &r), JWT_OK);
    /* only what is listed */
    r.algorithms = JWT_ALG_EDDSA;
    assert_int_equal(check(set, token(rsa_a, "RS256", "r1", GOOD_CLAIMS), &r), JWT_ALG_NOT_ALLOWED);
    assert_int_equal(check(set, token(ed, "EdDSA", "o1", GOOD_CLAIMS), &r), JWT_OK);
    jwks_free(set);
}

static void test_verify_forgeries(void **state)
{
    (void)state;
    char *pub = jwk_of(rsa_a, "r1", "");
    jwks_t *set = set_of(strdup(pub), jwk_of(ec256, "e1", ""), NULL);
    jwt_rules_t r = rules();
    r.algorithms = ~0u; /* even an allowlist of everything never takes these */

    /* alg none, with and without a signature part */
    assert_int_equal(check(set, token(NULL, "none", "r1", GOOD_CLAIMS), &r), JWT_ALG_NOT_ALLOWED);
    char *t = token(NULL, "none", NULL, GOOD_CLAIMS), *t2;
    assert_true(asprintf(&t2, "%sAAAA", t) > 0);
    free(t);
    assert_int_equal(check(set, t2, &r), JWT_ALG_NOT_ALLOWED);
    assert_int_equal(check(set, token(NULL, "None", NULL, GOOD_CLAIMS), &r), JWT_ALG_NOT_ALLOWED);

    /* HS256 keyed with the public key, as the JWK text and as the PEM a naive verifier uses */
    char *h = b64url_str("{\"alg\":\"HS256\",\"kid\":\"r1\"}"), *p = b64url_str(GOOD_CLAIMS);
    char *input;
    assert_true(asprintf(&input, "%s.%s", h, p) > 0);
    unsigned char mac[32];
    unsigned int maclen = 0;
    HMAC(EVP_sha256(), pub, (int)strlen(pub), (const unsigned char *)input, strlen(input), mac,
         &maclen);
    char *s = b64url(mac, maclen);
    assert_true(asprintf(&t, "%s.%s", input, s) > 0);
    assert_int_equal(check(set, t, &r), JWT_ALG_NOT_ALLOWED);
    free(s);
    unsigned char *der = NULL;
    int derlen = i2d_PUBKEY(rsa_a, &der);
    HMAC(EVP_sha256(), der, derlen, (const unsigned char *)input, strlen(input), mac, &maclen);
    OPENSSL_free(der);
    s = b64url(mac, maclen);
    assert_true(asprintf(&t, "%s.%s", input, s) > 0);
    assert_int_equal(check(set, t, &r), JWT_ALG_NOT_ALLOWED);
    free(s);
    free(input);
    free(h);
    free(p);
    assert_int_equal(check(set, token(rsa_a, "HS512", "r1", GOOD_CLAIMS), &r), JWT_ALG_NOT_ALLOWED);

    /* an algorithm the key is not for: the RSA key's kid on an ES256 token */
    assert_int_equal(check(set, token(ec256, "ES256", "r1", GOOD_CLAIMS), &r), JWT_ALG_NOT_ALLOWED);

    /* signed by another key under a known kid */
    assert_int_equal(check(set, token(rsa_b, "RS256", "r1", GOOD_CLAIMS), &r), JWT_BAD_SIGNATURE);
    /* claims changed after signing */
    t = token(rsa_a, "RS256", "r1", GOOD_CLAIMS);
    char *dot = strchr(t, '.');
    char *forged = b64url_str("{\"iss\":\"https://idp.example\",\"sub\":\"mallory\","
                              "\"aud\":\"mcp-refunds\",\"exp\":1700000600}");
    char *rest = strchr(dot + 1, '.');
    assert_true(asprintf(&t2, "%.*s%s%s", (int)(dot + 1 - t), t, forged, rest) > 0);
    free(t);
    free(forged);
    assert_int_equal(check(set, t2, &r), JWT_BAD_SIGNATURE);
    /* an ECDSA signature of the wrong length: one byte short, one byte long */
    t = token(ec256, "ES256", "e1", GOOD_CLAIMS);
    size_t n = strlen(t);
    t[n - 2] = 0; /* 86 characters -> 84: 63 bytes */
    assert_int_equal(check(set, t, &r), JWT_BAD_SIGNATURE);
    t = token(ec256, "ES256", "e1", GOOD_CLAIMS);
    assert_true(asprintf(&t2, "%sAA", t) > 0); /* 88 characters: 66 bytes */
    free(t);
    assert_int_equal(check(set, t2, &r), JWT_BAD_SIGNATURE);
    /* the signature bytes of another algorithm: PS256 verified as RS256 */
    t = token(rsa_a, "PS256", "r1", GOOD_CLAIMS);
    char *h256 = b64url_str("{\"alg\":\"RS256\",\"kid\":\"r1\"}");
    dot = strchr(t, '.');
    assert_true(asprintf(&t2, "%s%s", h256, dot) > 0);
    free(t);
    free(h256);
    assert_int_equal(check(set, t2, &r), JWT_BAD_SIGNATURE);
    free(pub);
    jwks_free(set);
}

static void test_verify_keys(void **state)
{
    (void)state;
    jwks_t *one = set_of(jwk_of(rsa_a, "r1", ""), NULL);
    jwks_t *two = set_of(jwk_of(rsa_a, "r1", ""), jwk_of(rsa_b, "r2", ""), NULL);
    jwt_rules_t r = rules();
    assert_int_equal(check(one, token(rsa_a, "RS256", "r9", GOOD_CLAIMS), &r), JWT_UNKNOWN_KEY);
    /* without a kid: the only key of a fitting type, never a guess among several */
    assert_int_equal(check(one, token(rsa_a, "RS256", NULL, GOOD_CLAIMS), &r), JWT_OK);
    assert_int_equal(check(two, token(rsa_a, "RS256", NULL, GOOD_CLAIMS), &r), JWT_UNKNOWN_KEY);
    assert_int_equal(check(two, token(rsa_b, "RS256", "r2", GOOD_CLAIMS), &r), JWT_OK);
    /* no set at all yet */
    char *subject = NULL;
    char *t = token(rsa_a, "RS256", "r1", GOOD_CLAIMS);
    assert_int_equal(jwt_verify(t, NULL, 0, &r, NOW, &subject), JWT_UNKNOWN_KEY);
    free(t);
    /* several sources (a file and a URL): a kid is looked up in all */
    jwks_t *ed_set = set_of(jwk_of(ed, "o1", ""), NULL);
    const jwks_t *sets[] = {NULL, one, ed_set};
    t = token(ed, "EdDSA", "o1", GOOD_CLAIMS);
    assert_int_equal(jwt_verify(t, sets, 3, &r, NOW, &subject), JWT_OK);
    free(subject);
    free(t);
    t = token(rsa_a, "RS256", "r1", GOOD_CLAIMS);
    assert_int_equal(jwt_verify(t, sets, 3, &r, NOW, &subject), JWT_OK);
    free(subject);
    free(t);
    jwks_free(ed_set);
    jwks_free(one);
    jwks_free(two);
}

static char *claims(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *claims(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s;
    assert_true(vasprintf(&s, fmt, ap) > 0);
    va_end(ap);
    return s;
}

static jwt_status_t with_claims(jwks_t *set, const jwt_rules_t *r, char *c)
{
    jwt_status_t st = check(set, token(ed, "EdDSA", "o1", c), r);
    free(c);
    return st;
}

#define BASE "\"iss\":\"https://idp.example\",\"sub\":\"alice\",\"aud\":\"mcp-refunds\""

static void test_verify_times(void **state)
{
    (void)state;
    jwks_t *set = set_of(jwk_of(ed, "o1", ""), NULL);
    jwt_rules_t r = rules();
    /* exp: valid strictly before exp + leeway */
    assert_int_equal(with_claims(set, &r, claims("{" BASE ",\"exp\":%lld}", NOW - 29)), JWT_OK);
    assert_int_equal(with_claims(set, &r, claims("{" BASE ",\"exp\":%lld}", NOW - 30)),
                     JWT_EXPIRED);
    assert_int_equal(with_claims(set, &r, claims("{" BASE ",\"exp\":%lld}", NOW - 3600)),
                     JWT_EXPIRED);
    assert_int_equal(with_claims(set, &r, claims("{" BASE ",\"exp\":%lld.5}", NOW - 30)), JWT_OK);
    /* nbf: valid from nbf - leeway */
    assert_int_equal(
        with_claims(set, &r, claims("{" BASE ",\"exp\":%lld,\"nbf\":%lld}", NOW + 600, NOW + 30)),
        JWT_OK);
    assert_int_equal(
        with_claims(set, &r, claims("{" BASE ",\"exp\":%lld,\"nbf\":%lld}", NOW + 600, NOW + 31)),
        JWT_NOT_YET_VALID);
    r.leeway_s = 0;
    assert_int_equal(with_claims(set, &r, claims("{" BASE ",\"exp\":%lld}", NOW)), JWT_EXPIRED);
    assert_int_equal(with_claims(set, &r, claims("{" BASE ",\"exp\":%lld}", NOW + 1)), JWT_OK);
    assert_int_equal(
        with_claims(set, &r, claims("{" BASE ",\"exp\":%lld,\"nbf\":%lld}", NOW + 600, NOW + 1)),
        JWT_NOT_YET_VALID);
    /* exp is required, and numbers only */
    assert_int_equal(with_claims(set, &r, claims("{" BASE "}")), JWT_MISSING_CLAIM);
    assert_int_equal(with_claims(set, &r, claims("{" BASE ",\"exp\":\"%lld\"}", NOW + 60)),
                     JWT_MALFORMED);
    assert_int_equal(
        with_claims(set, &r, claims("{" BASE ",\"exp\":%lld,\"nbf\":null}", NOW + 600)),
        JWT_MALFORMED);
    jwks_free(set);
}

static void test_verify_issuer_audience_claims(void **state)
{
    (void)state;
    jwks_t *set = set_of(jwk_of(ed, "o1", ""), NULL);
    jwt_rules_t r = rules();
#define EXP ",\"exp\":1700000600"
#define SUB "\"iss\":\"https://idp.example\",\"sub\":\"alice\""
    assert_int_equal(with_claims(set, &r, claims("{" SUB ",\"aud\":\"mcp-refunds\"" EXP "}")),
                     JWT_OK);
    assert_int_equal(
        with_claims(set, &r, claims("{" SUB ",\"aud\":[\"x\",\"mcp-refunds\"]" EXP "}")), JWT_OK);
    assert_int_equal(with_claims(set, &r, claims("{" SUB ",\"aud\":[\"x\",\"y\"]" EXP "}")),
                     JWT_WRONG_AUDIENCE);
    assert_int_equal(with_claims(set, &r, claims("{" SUB ",\"aud\":\"mcp-other\"" EXP "}")),
                     JWT_WRONG_AUDIENCE);
    assert_int_equal(with_claims(set, &r, claims("{" SUB ",\"aud\":[]" EXP "}")),
                     JWT_WRONG_AUDIENCE);
    assert_int_equal(with_claims(set, &r, claims("{" SUB EXP "}")), JWT_WRONG_AUDIENCE);
    assert_int_equal(with_claims(set, &r, claims("{" SUB ",\"aud\":[7]" EXP "}")),
                     JWT_WRONG_AUDIENCE);
    r.n_audiences = 2; /* either configured audience will do */
    assert_int_equal(with_claims(set, &r, claims("{" SUB ",\"aud\":\"mcp-other\"" EXP "}")),
                     JWT_OK);
    assert_int_equal(with_claims(set, &r, claims("{" SUB ",\"aud\":[\"z\",\"mcp-other\"]" EXP "}")),
                     JWT_OK);
    r.n_audiences = 1;
#define AUD ",\"aud\":\"mcp-refunds\""
    assert_int_equal(
        with_claims(set, &r,
                    claims("{\"iss\":\"https://idp.example/\",\"sub\":\"alice\"" AUD EXP "}")),
        JWT_WRONG_ISSUER);
    assert_int_equal(with_claims(set, &r, claims("{\"sub\":\"alice\"" AUD EXP "}")),
                     JWT_WRONG_ISSUER);
    assert_int_equal(with_claims(set, &r, claims("{\"iss\":\"https://idp.example\"" AUD EXP "}")),
                     JWT_MISSING_CLAIM);
    assert_int_equal(
        with_claims(set, &r, claims("{\"iss\":\"https://idp.example\",\"sub\":42" AUD EXP "}")),
        JWT_MISSING_CLAIM);
    assert_int_equal(
        with_claims(set, &r, claims("{\"iss\":\"https://idp.example\",\"sub\":\"\"" AUD EXP "}")),
        JWT_MISSING_CLAIM);

    /* the subject is the listed claims' values as a JSON array, in the listed order */
    static const char *const three[] = {"sub", "tenant", "iss"};
    r.claims = three;
    r.n_claims = 3;
    const jwks_t *sets[] = {set};
    char *subject = NULL;
    char *t = token(ed, "EdDSA", "o1", "{" SUB AUD EXP ",\"tenant\":\"t-\\\"1\\u00e9\"}");
    assert_int_equal(jwt_verify(t, sets, 1, &r, NOW, &subject), JWT_OK);
    assert_string_equal(subject, "[\"alice\",\"t-\\\"1\xc3\xa9\",\"https://idp.example\"]");
    free(subject);
    free(t);
    t = token(ed, "EdDSA", "o1", "{" SUB AUD EXP "}");
    assert_int_equal(jwt_verify(t, sets, 1, &r, NOW, &subject), JWT_MISSING_CLAIM);
    assert_null(subject);
    free(t);
    jwks_free(set);
#undef EXP
#undef SUB
#undef AUD
}

static void test_verify_malformed(void **state)
{
    (void)state;
    jwks_t *set = set_of(jwk_of(rsa_a, "r1", ""), NULL);
    jwt_rules_t r = rules();
    const char *bad[] = {
        "",
        "abc",
        "a.b",
        "a.b.c.d",
        "..",
        "eyJhbGciOiJSUzI1NiJ9..AAAA",                       /* empty payload */
        "eyJhbGciOiJSUzI1NiJ9.e30.",                        /* empty signature */
        "eyJhbGciOiJSUzI1NiJ9.e30.AA==",                    /* padding */
        "eyJhbGciOiJSUzI1NiJ9.e30.A",                       /* impossible length */
        "eyJhbGciOiJSUzI1NiJ9.e30.A+A/",                    /* standard alphabet */
        "eyJhbGciOiJSUzI1NiJ9=.e30.AAAA",                   /* padding in the header */
        "W10.e30.AAAA",                                     /* header [] */
        "bm90IGpzb24.e30.AAAA",                             /* header not JSON */
        "e30.e30.AAAA",                                     /* no alg */
        "eyJhbGciOjF9.e30.AAAA",                            /* alg 1 */
        "eyJhbGciOiJSUzI1NiIsImtpZCI6MX0.e30.AAAA",         /* kid 1 */
        "eyJhbGciOiJSUzI1NiIsImNyaXQiOlsiYiJdfQ.e30.AAAA",  /* crit */
        "eyJhbGciOiJSUzI1NiIsImFsZyI6IlJTMjU2In0.e30.AAAA", /* alg twice */
        "eyJhbGciOiJSUzI1NiJ9.W10.AAAA",                    /* payload [] */
        "eyJhbGciOiJSUzI1NiJ9.e30.AAB",                     /* stray bits */
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        const jwks_t *sets[] = {set};
        char *subject = NULL;
        jwt_status_t st = jwt_verify(bad[i], sets, 1, &r, NOW, &subject);
        if (st != JWT_MALFORMED)
            fail_msg("'%s': %s, expected malformed", bad[i], jwt_status_str(st));
        assert_null(subject);
    }
    /* too long to look at */
    size_t n = 20000;
    char *big = malloc(n + 1);
    memset(big, 'A', n);
    memcpy(big, "eyJhbGciOiJSUzI1NiJ9.", 21);
    big[100] = '.';
    big[n] = 0;
    const jwks_t *sets[] = {set};
    char *subject = NULL;
    assert_int_equal(jwt_verify(big, sets, 1, &r, NOW, &subject), JWT_MALFORMED);
    assert_int_equal(jwt_verify(NULL, sets, 1, &r, NOW, &subject), JWT_MALFORMED);
    free(big);
    jwks_free(set);
}

static void test_names(void **state)
{
    (void)state;
    assert_int_equal(jwt_alg_parse("RS256"), JWT_ALG_RS256);
    assert_int_equal(jwt_alg_parse("EdDSA"), JWT_ALG_EDDSA);
    assert_int_equal(jwt_alg_parse("none"), 0);
    assert_int_equal(jwt_alg_parse("HS256"), 0);
    assert_int_equal(jwt_alg_parse("rs256"), 0);
    assert_int_equal(jwt_alg_parse(NULL), 0);
    assert_string_equal(jwt_status_str(JWT_EXPIRED), "expired");
    assert_string_equal(jwt_status_str(JWT_BAD_SIGNATURE), "bad_signature");
    assert_string_equal(jwt_status_str((jwt_status_t)99), "unknown");
    for (int i = 0; i < JWT_N; i++) {
        assert_non_null(jwt_status_str((jwt_status_t)i));
        assert_non_null(jwt_status_phrase((jwt_status_t)i));
        for (int j = 0; j < i; j++)
            assert_string_not_equal(jwt_status_str((jwt_status_t)i),
                                    jwt_status_str((jwt_status_t)j));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_jwks_parse_types),
        cmocka_unit_test(test_jwks_parse_refused),
        cmocka_unit_test(test_verify_algorithms),
        cmocka_unit_test(test_verify_forgeries),
        cmocka_unit_test(test_verify_keys),
        cmocka_unit_test(test_verify_times),
        cmocka_unit_test(test_verify_issuer_audience_claims),
        cmocka_unit_test(test_verify_malformed),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
