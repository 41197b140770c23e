/* JWK Sets and JWS tokens, judged with OpenSSL 3's EVP interface (see include/jwt.h). */
#include "jwt.h"

#include <jansson.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/param_build.h>
#include <openssl/rsa.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Longer than any access token an identity provider hands out; bounds the work per request. */
#define JWT_MAX_LEN 16384
#define RSA_MIN_BITS 2048
#define RSA_ALGS                                                                                   \
    (JWT_ALG_RS256 | JWT_ALG_RS384 | JWT_ALG_RS512 | JWT_ALG_PS256 | JWT_ALG_PS384 | JWT_ALG_PS512)

static const struct {
    const char *name;
    jwt_alg_t bit;
} algs[] = {
    {"RS256", JWT_ALG_RS256}, {"RS384", JWT_ALG_RS384}, {"RS512", JWT_ALG_RS512},
    {"PS256", JWT_ALG_PS256}, {"PS384", JWT_ALG_PS384}, {"PS512", JWT_ALG_PS512},
    {"ES256", JWT_ALG_ES256}, {"ES384", JWT_ALG_ES384}, {"EdDSA", JWT_ALG_EDDSA},
};

unsigned jwt_alg_parse(const char *name)
{
    for (size_t i = 0; name && i < ARRAY_LEN(algs); i++)
        if (strcmp(name, algs[i].name) == 0)
            return algs[i].bit;
    return 0;
}

const char *jwt_alg_names(void)
{
    return "RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA";
}

static const struct {
    const char *str, *phrase;
} statuses[JWT_N] = {
    [JWT_OK] = {"ok", "the token is valid"},
    [JWT_MALFORMED] = {"malformed", "the bearer token is not a well-formed signed JWT"},
    [JWT_ALG_NOT_ALLOWED] = {"alg_not_allowed", "the token's signature algorithm is not allowed"},
    [JWT_UNKNOWN_KEY] = {"unknown_key", "the token is signed with a key the gateway does not know"},
    [JWT_BAD_SIGNATURE] = {"bad_signature", "the token's signature does not verify"},
    [JWT_EXPIRED] = {"expired", "the token has expired"},
    [JWT_NOT_YET_VALID] = {"not_yet_valid", "the token is not valid yet (nbf)"},
    [JWT_WRONG_ISSUER] = {"wrong_issuer", "the token comes from another issuer"},
    [JWT_WRONG_AUDIENCE] = {"wrong_audience", "the token is meant for another audience"},
    [JWT_MISSING_CLAIM] = {"missing_claim", "the token lacks a claim that names the caller"},
};

const char *jwt_status_str(jwt_status_t s)
{
    return s < JWT_N ? statuses[s].str : "unknown";
}

const char *jwt_status_phrase(jwt_status_t s)
{
    return s < JWT_N ? statuses[s].phrase : "the token was not accepted";
}

/* --- base64url (RFC 4648 section 5), strict: no padding, no other bytes, no stray bits --- */

static int b64_val(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '-')
        return 62;
    if (c == '_')
        return 63;
    return -1;
}

/* Decodes n characters of s into a new buffer (*out, *out_len); false when they are not the
 * one canonical encoding of some bytes. */
static bool b64url_decode(const char *s, size_t n, unsigned char **out, size_t *out_len)
{
    if (n % 4 == 1)
        return false;
    unsigned char *buf = xmalloc(n * 3 / 4 + 1);
    size_t len = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = b64_val((unsigned char)s[i]);
        if (v < 0) {
            free(buf);
            return false;
        }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            buf[len++] = (unsigned char)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    /* the bits left over must be zero, or two texts would decode alike */
    if (acc != 0) {
        free(buf);
        return false;
    }
    *out = buf;
    *out_len = len;
    return true;
}

/* --- keys --- */

typedef struct jwk {
    char *kid;      /* NULL when the key has none */
    unsigned algs;  /* the algorithms the key may verify: its type's, narrowed by its "alg" */
    EVP_PKEY *pkey; /* the public key */
} jwk_t;

struct jwks {
    jwk_t *keys;
    size_t n;
};

void jwks_free(jwks_t *k)
{
    if (!k)
        return;
    for (size_t i = 0; i < k->n; i++) {
        free(k->keys[i].kid);
        EVP_PKEY_free(k->keys[i].pkey);
    }
    free(k->keys);
    free(k);
}

size_t jwks_count(const jwks_t *k)
{
    return k ? k->n : 0;
}

/* A base64url member of a key: false when absent, not a string or not strict base64url. */
static bool member_bytes(json_t *key, const char *name, unsigned char **out, size_t *len)
{
    const char *s = json_string_value(json_object_get(key, name));
    return s && *s && b64url_decode(s, strlen(s), out, len);
}

static EVP_PKEY *from_params(const char *type, OSSL_PARAM_BLD *bld)
{
    EVP_PKEY *pkey = NULL;
    OSSL_PARAM *params = OSSL_PARAM_BLD_to_param(bld);
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_name(NULL, type, NULL);
    if (!params || !ctx || EVP_PKEY_fromdata_init(ctx) <= 0 ||
        EVP_PKEY_fromdata(ctx, &pkey, EVP_PKEY_PUBLIC_KEY, params) <= 0)
        pkey = NULL;
    EVP_PKEY_CTX_free(ctx);
    OSSL_PARAM_free(params);
    return pkey;
}

static EVP_PKEY *rsa_key(json_t *key, char *err, size_t errlen)
{
    unsigned char *n = NULL, *e = NULL;
    size_t nlen = 0, elen = 0;
    EVP_PKEY *pkey = NULL;
    BIGNUM *bn = NULL, *be = NULL;
    OSSL_PARAM_BLD *bld = NULL;
    if (!member_bytes(key, "n", &n, &nlen) || !member_bytes(key, "e", &e, &elen)) {
        snprintf(err, errlen, "n and e must be base64url strings");
        goto out;
    }
    bn = BN_bin2bn(n, (int)nlen, NULL);
    be = BN_bin2bn(e, (int)elen, NULL);
    if (!bn || !be || BN_num_bits(bn) < RSA_MIN_BITS) {
        snprintf(err, errlen, "the modulus is shorter than %d bits", RSA_MIN_BITS);
        goto out;
    }
    if (elen > 8 || !BN_is_odd(be) || BN_is_one(be)) {
        snprintf(err, errlen, "e is not a usable public exponent");
        goto out;
    }
    bld = OSSL_PARAM_BLD_new();
    if (!bld || !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_N, bn) ||
        !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_E, be) ||
        !(pkey = from_params("RSA", bld)))
        snprintf(err, errlen, "OpenSSL does not take it as an RSA key");
out:
    OSSL_PARAM_BLD_free(bld);
    BN_free(bn);
    BN_free(be);
    free(n);
    free(e);
    return pkey;
}

static EVP_PKEY *ec_key(json_t *key, const char *group, size_t coord, char *err, size_t errlen)
{
    unsigned char *x = NULL, *y = NULL, point[1 + 2 * 66];
    size_t xlen = 0, ylen = 0;
    EVP_PKEY *pkey = NULL;
    OSSL_PARAM_BLD *bld = NULL;
    EVP_PKEY_CTX *check = NULL;
    if (!member_bytes(key, "x", &x, &xlen) || !member_bytes(key, "y", &y, &ylen) || xlen != coord ||
        ylen != coord) {
        snprintf(err, errlen, "x and y must be base64url strings of %zu bytes", coord);
        goto out;
    }
    /* the uncompressed point: 0x04 || x || y */
    point[0] = 0x04;
    memcpy(point + 1, x, coord);
    memcpy(point + 1 + coord, y, coord);
    bld = OSSL_PARAM_BLD_new();
    if (!bld || !OSSL_PARAM_BLD_push_utf8_string(bld, OSSL_PKEY_PARAM_GROUP_NAME, group, 0) ||
        !OSSL_PARAM_BLD_push_octet_string(bld, OSSL_PKEY_PARAM_PUB_KEY, point, 1 + 2 * coord) ||
        !(pkey = from_params("EC", bld))) {
        snprintf(err, errlen, "x and y are not a point of the curve");
        goto out;
    }
    check = EVP_PKEY_CTX_new_from_pkey(NULL, pkey, NULL);
    if (!check || EVP_PKEY_public_check(check) != 1) {
        snprintf(err, errlen, "x and y are not a point of the curve");
        EVP_PKEY_free(pkey);
        pkey = NULL;
    }
out:
    EVP_PKEY_CTX_free(check);
    OSSL_PARAM_BLD_free(bld);
    free(x);
    free(y);
    return pkey;
}

static EVP_PKEY *ed25519_key(json_t *key, char *err, size_t errlen)
{
    unsigned char *x = NULL;
    size_t xlen = 0;
    EVP_PKEY *pkey = NULL;
    if (!member_bytes(key, "x", &x, &xlen) || xlen != 32)
        snprintf(err, errlen, "x must be a base64url string of 32 bytes");
    else if (!(pkey = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, x, xlen)))
        snprintf(err, errlen, "OpenSSL does not take it as an Ed25519 key");
    free(x);
    return pkey;
}

typedef enum { KEY_USE, KEY_SKIP, KEY_BAD } key_verdict_t;

/* One member of "keys": a usable key into *k, one to skip, or a bad one (err). */
static key_verdict_t parse_key(json_t *key, jwk_t *k, char *err, size_t errlen)
{
    if (!json_is_object(key)) {
        snprintf(err, errlen, "not an object");
        return KEY_BAD;
    }
    json_t *kty = json_object_get(key, "kty"), *use = json_object_get(key, "use");
    json_t *kid = json_object_get(key, "kid"), *alg = json_object_get(key, "alg");
    json_t *crv = json_object_get(key, "crv");
    if (!json_is_string(kty) || (use && !json_is_string(use)) || (kid && !json_is_string(kid)) ||
        (alg && !json_is_string(alg)) || (crv && !json_is_string(crv))) {
        snprintf(err, errlen, "kty must be a string, and use, kid, alg and crv strings if given");
        return KEY_BAD;
    }
    if (use && strcmp(json_string_value(use), "sig") != 0)
        return KEY_SKIP; /* an encryption key */
    /* a private part published by mistake: the issuer's keys are compromised, use none */
    if (json_object_get(key, "d")) {
        snprintf(err, errlen, "it holds a private key (d)");
        return KEY_BAD;
    }
    unsigned only = alg ? jwt_alg_parse(json_string_value(alg)) : ~0u;
    if (!only)
        return KEY_SKIP; /* meant for an algorithm this verifier never uses */
    const char *type = json_string_value(kty), *curve = crv ? json_string_value(crv) : "";
    EVP_PKEY *pkey = NULL;
    if (strcmp(type, "RSA") == 0) {
        k->algs = RSA_ALGS;
        pkey = rsa_key(key, err, errlen);
    } else if (strcmp(type, "EC") == 0 && strcmp(curve, "P-256") == 0) {
        k->algs = JWT_ALG_ES256;
        pkey = ec_key(key, "P-256", 32, err, errlen);
    } else if (strcmp(type, "EC") == 0 && strcmp(curve, "P-384") == 0) {
        k->algs = JWT_ALG_ES384;
        pkey = ec_key(key, "P-384", 48, err, errlen);
    } else if (strcmp(type, "OKP") == 0 && strcmp(curve, "Ed25519") == 0) {
        k->algs = JWT_ALG_EDDSA;
        pkey = ed25519_key(key, err, errlen);
    } else {
        return KEY_SKIP; /* oct (a shared secret), P-521, X25519, ... */
    }
    if (!pkey)
        return KEY_BAD;
    k->algs &= only;
    if (!k->algs) {
        EVP_PKEY_free(pkey);
        snprintf(err, errlen, "its alg does not fit its key type");
        return KEY_BAD;
    }
    k->pkey = pkey;
    k->kid = kid ? xstrdup(json_string_value(kid)) : NULL;
    return KEY_USE;
}

jwks_t *jwks_parse(const char *json, size_t len, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        snprintf(err, errlen, "not JSON: %s (line %d)", je.text, je.line);
        return NULL;
    }
    json_t *keys = json_object_get(root, "keys");
    if (!json_is_array(keys)) {
        snprintf(err, errlen, "not a JWK Set: no \"keys\" array");
        json_decref(root);
        return NULL;
    }
    jwks_t *set = xcalloc(1, sizeof(*set));
    set->keys = xcalloc(json_array_size(keys) + 1, sizeof(jwk_t));
    for (size_t i = 0; i < json_array_size(keys); i++) {
        char why[160] = "";
        json_t *key = json_array_get(keys, i);
        jwk_t k = {0};
        key_verdict_t v = parse_key(key, &k, why, sizeof(why));
        if (v == KEY_SKIP)
            continue;
        if (v == KEY_BAD) {
            const char *kid = json_string_value(json_object_get(key, "kid"));
            snprintf(err, errlen, "key %zu%s%.64s%s: %s", i + 1, kid ? " (kid " : "",
                     kid ? kid : "", kid ? ")" : "", why);
            json_decref(root);
            jwks_free(set);
            return NULL;
        }
        set->keys[set->n++] = k;
    }
    json_decref(root);
    if (set->n == 0) {
        snprintf(err, errlen, "no usable signing key (RSA, EC P-256/P-384, OKP Ed25519)");
        jwks_free(set);
        return NULL;
    }
    return set;
}

/* --- tokens --- */

static const EVP_MD *alg_md(unsigned alg)
{
    if (alg & (JWT_ALG_RS256 | JWT_ALG_PS256 | JWT_ALG_ES256))
        return EVP_sha256();
    if (alg & (JWT_ALG_RS384 | JWT_ALG_PS384 | JWT_ALG_ES384))
        return EVP_sha384();
    if (alg & (JWT_ALG_RS512 | JWT_ALG_PS512))
        return EVP_sha512();
    return NULL; /* EdDSA hashes inside */
}

/* A JWS ECDSA signature is r || s, each exactly coord bytes; EVP wants DER. NULL when the
 * length is wrong. */
static unsigned char *ecdsa_der(const unsigned char *sig, size_t len, size_t coord, size_t *der_len)
{
    if (len != 2 * coord)
        return NULL;
    ECDSA_SIG *es = ECDSA_SIG_new();
    BIGNUM *r = BN_bin2bn(sig, (int)coord, NULL), *s = BN_bin2bn(sig + coord, (int)coord, NULL);
    unsigned char *der = NULL;
    if (es && r && s && ECDSA_SIG_set0(es, r, s)) {
        r = s = NULL; /* es owns them now */
        int n = i2d_ECDSA_SIG(es, NULL);
        unsigned char *p = n > 0 ? xmalloc((size_t)n) : NULL;
        der = p;
        if (p && i2d_ECDSA_SIG(es, &p) == n) {
            *der_len = (size_t)n;
        } else {
            free(der);
            der = NULL;
        }
    }
    BN_free(r);
    BN_free(s);
    ECDSA_SIG_free(es);
    return der;
}

static bool signature_ok(const jwk_t *k, unsigned alg, const char *input, size_t input_len,
                         const unsigned char *sig, size_t sig_len)
{
    unsigned char *der = NULL;
    if (alg & (JWT_ALG_ES256 | JWT_ALG_ES384)) {
        der = ecdsa_der(sig, sig_len, alg == JWT_ALG_ES256 ? 32 : 48, &sig_len);
        if (!der)
            return false;
        sig = der;
    }
    const EVP_MD *md = alg_md(alg);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    EVP_PKEY_CTX *pctx = NULL;
    bool ok = ctx && EVP_DigestVerifyInit(ctx, &pctx, md, NULL, k->pkey) == 1;
    if (ok && (alg & (JWT_ALG_PS256 | JWT_ALG_PS384 | JWT_ALG_PS512)))
        /* RFC 7518 3.5: MGF1 with the same hash, salt as long as the hash */
        ok = EVP_PKEY_CTX_set_rsa_padding(pctx, RSA_PKCS1_PSS_PADDING) > 0 &&
             EVP_PKEY_CTX_set_rsa_mgf1_md(pctx, md) > 0 &&
             EVP_PKEY_CTX_set_rsa_pss_saltlen(pctx, RSA_PSS_SALTLEN_DIGEST) > 0;
    ok = ok && EVP_DigestVerify(ctx, sig, sig_len, (const unsigned char *)input, input_len) == 1;
    EVP_MD_CTX_free(ctx);
    free(der);
    return ok;
}

/* The key for a token's kid and alg; *status says why there is none. */
static const jwk_t *find_key(const jwks_t *const *keys, size_t n_keys, const char *kid,
                             unsigned alg, jwt_status_t *status)
{
    const jwk_t *found = NULL;
    size_t fitting = 0;
    *status = JWT_UNKNOWN_KEY;
    for (size_t s = 0; s < n_keys; s++) {
        for (size_t i = 0; keys[s] && i < keys[s]->n; i++) {
            const jwk_t *k = &keys[s]->keys[i];
            if (kid) {
                if (!k->kid || strcmp(k->kid, kid) != 0)
                    continue;
                if (!(k->algs & alg)) {
                    /* the key exists but not for this algorithm: an RS key offered as ES */
                    *status = JWT_ALG_NOT_ALLOWED;
                    continue;
                }
                return k;
            }
            if (k->algs & alg) {
                found = k;
                fitting++;
            }
        }
    }
    /* without a kid only an unambiguous key will do */
    return fitting == 1 ? found : NULL;
}

/* A JSON object from a base64url part, or NULL. */
static json_t *decode_part(const char *s, size_t n)
{
    unsigned char *bytes;
    size_t len;
    if (n == 0 || !b64url_decode(s, n, &bytes, &len))
        return NULL;
    json_t *j = json_loadb((const char *)bytes, len, JSON_REJECT_DUPLICATES, NULL);
    free(bytes);
    if (j && !json_is_object(j)) {
        json_decref(j);
        j = NULL;
    }
    return j;
}

static jwt_status_t check_claims(json_t *claims, const jwt_rules_t *rules, int64_t now_s)
{
    json_t *exp = json_object_get(claims, "exp"), *nbf = json_object_get(claims, "nbf");
    if (!exp)
        return JWT_MISSING_CLAIM; /* an access token without an end is never one to trust */
    if (!json_is_number(exp) || (nbf && !json_is_number(nbf)))
        return JWT_MALFORMED;
    /* RFC 7519 4.1.4: the token is valid only before exp */
    if ((double)now_s >= json_number_value(exp) + (double)rules->leeway_s)
        return JWT_EXPIRED;
    if (nbf && (double)now_s + (double)rules->leeway_s < json_number_value(nbf))
        return JWT_NOT_YET_VALID;
    const char *iss = json_string_value(json_object_get(claims, "iss"));
    if (!iss || !rules->issuer || strcmp(iss, rules->issuer) != 0)
        return JWT_WRONG_ISSUER;
    json_t *aud = json_object_get(claims, "aud");
    bool aud_ok = false;
    for (size_t i = 0; i < rules->n_audiences && !aud_ok; i++) {
        if (json_is_string(aud)) {
            aud_ok = strcmp(json_string_value(aud), rules->audiences[i]) == 0;
            continue;
        }
        size_t j;
        json_t *a;
        json_array_foreach(aud, j, a)
        {
            if (json_is_string(a) && strcmp(json_string_value(a), rules->audiences[i]) == 0)
                aud_ok = true;
        }
    }
    return aud_ok ? JWT_OK : JWT_WRONG_AUDIENCE;
}

static char *subject_of(json_t *claims, const jwt_rules_t *rules)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < rules->n_claims; i++) {
        json_t *v = json_object_get(claims, rules->claims[i]);
        if (!json_is_string(v) || json_string_length(v) == 0) {
            json_decref(arr);
            return NULL;
        }
        json_array_append(arr, v);
    }
    char *text = json_dumps(arr, JSON_COMPACT);
    json_decref(arr);
    if (!text)
        abort(); /* jansson cannot allocate: the out-of-memory policy */
    return text;
}

jwt_status_t jwt_verify(const char *token, const jwks_t *const *keys, size_t n_keys,
                        const jwt_rules_t *rules, int64_t now_s, char **subject)
{
    *subject = NULL;
    size_t len = token ? strnlen(token, JWT_MAX_LEN + 1) : 0;
    const char *dot1 = len && len <= JWT_MAX_LEN ? memchr(token, '.', len) : NULL;
    const char *dot2 = dot1 ? memchr(dot1 + 1, '.', len - (size_t)(dot1 + 1 - token)) : NULL;
    if (!dot2 || memchr(dot2 + 1, '.', len - (size_t)(dot2 + 1 - token)))
        return JWT_MALFORMED;
    jwt_status_t st = JWT_MALFORMED;
    json_t *header = decode_part(token, (size_t)(dot1 - token)), *claims = NULL;
    unsigned char *sig = NULL;
    size_t sig_len = 0;
    if (!header)
        goto out;
    json_t *alg_j = json_object_get(header, "alg"), *kid_j = json_object_get(header, "kid");
    /* an extension the issuer says must be understood, which this verifier does not */
    if (!json_is_string(alg_j) || (kid_j && !json_is_string(kid_j)) ||
        json_object_get(header, "crit"))
        goto out;
    /* none and HS* parse to 0: refused before anything else is looked at */
    unsigned alg = jwt_alg_parse(json_string_value(alg_j));
    if (!(alg & rules->algorithms)) {
        st = JWT_ALG_NOT_ALLOWED;
        goto out;
    }
    claims = decode_part(dot1 + 1, (size_t)(dot2 - dot1 - 1));
    size_t sig_chars = len - (size_t)(dot2 + 1 - token);
    if (!claims || sig_chars == 0 || !b64url_decode(dot2 + 1, sig_chars, &sig, &sig_len))
        goto out;
    const jwk_t *key = find_key(keys, n_keys, json_string_value(kid_j), alg, &st);
    if (!key)
        goto out;
    if (!signature_ok(key, alg, token, (size_t)(dot2 - token), sig, sig_len)) {
        st = JWT_BAD_SIGNATURE;
        goto out;
    }
    st = check_claims(claims, rules, now_s);
    if (st == JWT_OK && !(*subject = subject_of(claims, rules)))
        st = JWT_MISSING_CLAIM;
out:
    json_decref(header);
    json_decref(claims);
    free(sig);
    return st;
}
