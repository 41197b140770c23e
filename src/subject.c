#include "subject.h"
#include "util.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void refuse(subject_done_fn done, void *arg, answer_t refusal, const char *why)
{
    subject_result_t res = {.subject = NULL, .refusal = refusal, .why = why};
    done(arg, &res);
}

static void accept_subject(subject_done_fn done, void *arg, const char *subject)
{
    subject_result_t res = {.subject = subject};
    done(arg, &res);
}

static void from_header(const subject_conf_t *conf, const http_request_t *req, subject_done_fn done,
                        void *arg)
{
    char why[300];
    const char *v = http_headers_get(&req->headers, conf->value);
    if (http_headers_count(&req->headers, conf->value) > 1) {
        /* which copy is the caller? a proxy before us may have checked another one */
        snprintf(why, sizeof(why), "the caller identity header (%s) appears more than once",
                 conf->value);
        refuse(done, arg, ANSWER_NO_SUBJECT, why);
        return;
    }
    if (!v || !*v) {
        snprintf(why, sizeof(why), "the request has no caller identity header (%s)", conf->value);
        refuse(done, arg, ANSWER_NO_SUBJECT, why);
        return;
    }
    /* the subject is part of the key, stored as text */
    if (!util_utf8_valid(v, strlen(v))) {
        snprintf(why, sizeof(why),
                 "the caller identity header %s is not valid UTF-8 text (send it UTF-8 encoded)",
                 conf->value);
        refuse(done, arg, ANSWER_BAD_SUBJECT, why);
        return;
    }
    accept_subject(done, arg, v);
}

static bool has_bearer(const http_request_t *req)
{
    const char *v = http_headers_get(&req->headers, "authorization");
    return v && strncasecmp(v, "bearer ", 7) == 0 && v[7];
}

static void from_bearer(const http_request_t *req, subject_done_fn done, void *arg)
{
    if (!has_bearer(req)) {
        refuse(done, arg, ANSWER_NO_SUBJECT, "the request has no bearer token");
        return;
    }
    const char *v = http_headers_get(&req->headers, "authorization");
    unsigned char md[32];
    util_sha256(v + 7, strlen(v + 7), md);
    char subject[7 + 33] = "bearer-";
    util_hex(md, 16, subject + 7);
    accept_subject(done, arg, subject);
}

/* Another Authorization scheme (Basic, ...): the hash of the whole value tells callers apart. */
static void from_credentials(const http_request_t *req, subject_done_fn done, void *arg)
{
    const char *v = http_headers_get(&req->headers, "authorization");
    unsigned char md[32];
    util_sha256(v, strlen(v), md);
    char subject[12 + 33] = "credentials-";
    util_hex(md, 16, subject + 12);
    accept_subject(done, arg, subject);
}

void subject_resolve(const subject_conf_t *conf, const http_request_t *req, subject_done_fn done,
                     void *arg)
{
    switch (conf->kind) {
    case SUBJECT_STATIC:
        accept_subject(done, arg, conf->value);
        return;
    case SUBJECT_HEADER:
        from_header(conf, req, done, arg);
        return;
    case SUBJECT_BEARER_SHA256:
        from_bearer(req, done, arg);
        return;
    case SUBJECT_DEFAULT:
        if (has_bearer(req))
            from_bearer(req, done, arg);
        else if (http_headers_get(&req->headers, "authorization"))
            from_credentials(req, done, arg);
        else
            accept_subject(done, arg, SUBJECT_SHARED_NAME);
        return;
    }
    refuse(done, arg, ANSWER_NO_SUBJECT, "the gateway has no subject source configured");
}

static void caller_digest(const subject_conf_t *conf, const http_request_t *req,
                          unsigned char out[32])
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    /* fails only when OpenSSL cannot allocate: the out-of-memory policy applies */
    if (!md || !EVP_DigestInit_ex(md, EVP_sha256(), NULL)) {
        fprintf(stderr, "idemgw: SHA-256 failed\n");
        abort();
    }
    for (size_t i = 0; i < req->headers.n; i++) {
        const char *name = http_headers_name(&req->headers, i);
        bool subject =
            conf->kind == SUBJECT_HEADER && conf->value && strcasecmp(name, conf->value) == 0;
        if (!subject && strcasecmp(name, "authorization") != 0)
            continue;
        const char *v = http_headers_value(&req->headers, i);
        /* name and value with their terminating NULs: no two header lists hash alike */
        EVP_DigestUpdate(md, subject ? "s" : "a", 2);
        EVP_DigestUpdate(md, v, strlen(v) + 1);
    }
    unsigned int len = 0;
    EVP_DigestFinal_ex(md, out, &len);
    EVP_MD_CTX_free(md);
}

bool subject_same_caller(const subject_conf_t *conf, const http_request_t *a,
                         const http_request_t *b)
{
    unsigned char da[32], db[32];
    caller_digest(conf, a, da);
    caller_digest(conf, b, db);
    return CRYPTO_memcmp(da, db, sizeof(da)) == 0;
}
