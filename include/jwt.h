/* Verified JWT access tokens: a JSON Web Key Set (RFC 7517) and a JWS compact token (RFC 7515,
 * RFC 7519) checked against it. Pure: values in, values out, the time passed in; no I/O, so
 * subject.c fetches and schedules and this file only judges.
 *
 * What is accepted, on purpose narrowly: asymmetric signatures only (RS256/384/512,
 * PS256/384/512, ES256, ES384, EdDSA with Ed25519). "none" and every HS* are refused whatever
 * the configuration says: an HMAC "signed" with the public key as its secret is the classic
 * forgery against verifiers that take the algorithm from the token. The algorithm must also
 * fit the key: an RSA key verifies RS and PS only, a P-256 key ES256 only, and so on, and a
 * key's own "alg" member, when it has one, must be the token's. */
#ifndef IDEMGW_JWT_H
#define IDEMGW_JWT_H

#include "util.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The signature algorithms, as bits of an allowlist (jwt_rules_t.algorithms). */
typedef enum {
    JWT_ALG_RS256 = 1u << 0,
    JWT_ALG_RS384 = 1u << 1,
    JWT_ALG_RS512 = 1u << 2,
    JWT_ALG_PS256 = 1u << 3,
    JWT_ALG_PS384 = 1u << 4,
    JWT_ALG_PS512 = 1u << 5,
    JWT_ALG_ES256 = 1u << 6,
    JWT_ALG_ES384 = 1u << 7,
    JWT_ALG_EDDSA = 1u << 8,
} jwt_alg_t;

/* The allowlist when the configuration gives none. */
#define JWT_ALGS_DEFAULT (JWT_ALG_RS256 | JWT_ALG_ES256 | JWT_ALG_PS256 | JWT_ALG_EDDSA)

/* The bit of a JWS "alg" name ("RS256"), or 0 for a name this verifier never accepts. */
unsigned jwt_alg_parse(const char *name);
/* Every name jwt_alg_parse accepts, comma-separated, for messages. */
const char *jwt_alg_names(void);

/* Why a token was not accepted. The strings are the "why" of a bad_token refusal. */
typedef enum {
    JWT_OK = 0,
    JWT_MALFORMED,       /* not three base64url parts of JSON objects, or a crit header */
    JWT_ALG_NOT_ALLOWED, /* none, HS*, or an algorithm outside the allowlist */
    JWT_UNKNOWN_KEY,     /* no key with its kid (or, without kid, not exactly one fitting) */
    JWT_BAD_SIGNATURE,   /* the signature does not verify with that key */
    JWT_EXPIRED,         /* exp (plus leeway) has passed */
    JWT_NOT_YET_VALID,   /* nbf is still ahead (beyond the leeway) */
    JWT_WRONG_ISSUER,    /* iss is not the configured issuer */
    JWT_WRONG_AUDIENCE,  /* aud names none of the configured audiences */
    JWT_MISSING_CLAIM,   /* exp, or a claim the subject is made of, is absent or no string */
    JWT_N
} jwt_status_t;

/* "expired", "bad_signature", ...: snake_case, for log lines and the answer's status. */
const char *jwt_status_str(jwt_status_t s);
/* A sentence part for the agent: "the token has expired". */
const char *jwt_status_phrase(jwt_status_t s);

typedef struct jwks jwks_t;

/* Parses a JWK Set. Keys of a type this verifier does not use (kty other than RSA, EC, OKP; an
 * EC or OKP curve it does not know) and keys marked "use": "enc" are skipped; a usable key
 * with a bad member (not strict base64url, a point off its curve, an RSA modulus under 2048
 * bits, a kid that is no string...) fails the whole set: the caller keeps the set it had
 * rather than silently lose a key. A set without one usable key fails too. NULL with err. */
jwks_t *jwks_parse(const char *json, size_t len, char *err, size_t errlen) MUST_CHECK;
void jwks_free(jwks_t *k);
size_t jwks_count(const jwks_t *k);

/* What a token must satisfy besides its signature. */
typedef struct jwt_rules {
    const char *issuer;           /* iss must equal it */
    const char *const *audiences; /* aud (string or array) must name one of them */
    size_t n_audiences;
    unsigned algorithms;       /* jwt_alg_t bits */
    int64_t leeway_s;          /* clock skew allowed on exp and nbf */
    const char *const *claims; /* the subject is made of these claims, in this order */
    size_t n_claims;
} jwt_rules_t;

/* Verifies token (the compact form, as it follows "Bearer ") with keys (any may be NULL: a
 * source with no set yet) at now_s (Unix seconds). The signature is checked before any claim
 * is believed. On JWT_OK *subject is the JSON array text of the rules' claims ("[\"https://
 * idp\",\"alice\"]"), allocated; otherwise NULL. */
jwt_status_t jwt_verify(const char *token, const jwks_t *const *keys, size_t n_keys,
                        const jwt_rules_t *rules, int64_t now_s, char **subject) MUST_CHECK;

#endif
