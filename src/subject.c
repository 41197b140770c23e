#include "subject.h"
#include "jwks_source.h"
#include "jwt.h"
#include "log.h"
#include "peer_cert.h"
#include "util.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* A resolve waiting for a key fetch: the token is copied, the request may be gone. */
typedef struct waiter {
    char *token;
    subject_done_fn done;
    void *arg;
    struct waiter *next;
} waiter_t;

struct subject {
    struct event_base *base;
    const subject_conf_t *conf; /* main's config: replaced by subject_reconfigure */
    jwks_source_t *keys;        /* SUBJECT_JWT: where its keys come from, else NULL */
    waiter_t *waiting;          /* resolves waiting for the fetch in progress */
};

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

/* --- client certificate --- */

/* The longest name of a certificate taken as a subject. */
#define CERT_NAME_MAX 1024

static void from_client_cert(const subject_conf_t *conf, const http_request_t *req,
                             subject_done_fn done, void *arg)
{
    char name[CERT_NAME_MAX + 1];
    peer_cert_source_t src = (peer_cert_source_t)conf->client_cert;
    peer_cert_status_t st = peer_cert_name(req->peer_cert, src, name, sizeof(name));
    if (st == PEER_CERT_OK) {
        accept_subject(done, arg, name);
        return;
    }
    bool absent = st == PEER_CERT_NO_CERT || st == PEER_CERT_MISSING;
    refuse(done, arg, absent ? ANSWER_NO_SUBJECT : ANSWER_BAD_SUBJECT,
           peer_cert_status_phrase(st, src));
}

/* --- jwt --- */

static void refuse_token(subject_done_fn done, void *arg, jwt_status_t st)
{
    subject_result_t res = {.subject = NULL,
                            .refusal = ANSWER_BAD_TOKEN,
                            .why = jwt_status_phrase(st),
                            .reason = jwt_status_str(st)};
    done(arg, &res);
}

static jwt_status_t verify(const subject_t *s, const char *token, char **subject)
{
    const subject_jwt_conf_t *j = &s->conf->jwt;
    jwt_rules_t rules = {
        .issuer = j->issuer,
        .audiences = (const char *const *)j->audiences,
        .n_audiences = j->n_audiences,
        .algorithms = j->algorithms,
        .leeway_s = (int64_t)(j->leeway_ms / 1000),
        .claims = (const char *const *)j->claims,
        .n_claims = j->n_claims,
    };
    const jwks_t *sets[2];
    size_t n = s->keys ? jwks_source_sets(s->keys, sets) : 0;
    return jwt_verify(token, sets, n, &rules, (int64_t)(util_wall_ms() / 1000), subject);
}

/* may_wait: a token naming an unknown key may wait for a fetch of the key set (once). */
static void resolve_token(subject_t *s, const char *token, subject_done_fn done, void *arg,
                          bool may_wait)
{
    char *subject = NULL;
    jwt_status_t st = verify(s, token, &subject);
    if (st == JWT_UNKNOWN_KEY && may_wait && s->keys && jwks_source_refetch(s->keys)) {
        waiter_t *w = xcalloc(1, sizeof(*w));
        w->token = xstrdup(token);
        w->done = done;
        w->arg = arg;
        w->next = s->waiting;
        s->waiting = w;
        return;
    }
    if (st == JWT_OK)
        accept_subject(done, arg, subject);
    else
        refuse_token(done, arg, st);
    free(subject);
}

/* The bearer token of req, or NULL; *several when Authorization appears more than once. */
static const char *bearer_token(const http_request_t *req, bool *several)
{
    *several = http_headers_count(&req->headers, "authorization") > 1;
    if (!has_bearer(req))
        return NULL;
    const char *t = http_headers_get(&req->headers, "authorization") + 7;
    while (*t == ' ')
        t++;
    return t;
}

static void from_jwt(subject_t *s, const http_request_t *req, subject_done_fn done, void *arg)
{
    bool several;
    const char *token = bearer_token(req, &several);
    if (several) {
        /* which copy is the caller's? a proxy before us may have checked another one */
        refuse_token(done, arg, JWT_MALFORMED);
        return;
    }
    if (!token) {
        refuse(done, arg, ANSWER_NO_SUBJECT, "the request has no bearer token");
        return;
    }
    resolve_token(s, token, done, arg, true);
}

/* The waiters of a fetch that ended (or of a source replaced: may_wait again). */
static void run_waiters(subject_t *s, bool may_wait)
{
    waiter_t *w = s->waiting;
    s->waiting = NULL;
    while (w) {
        waiter_t *next = w->next;
        if (s->conf->kind == SUBJECT_JWT)
            resolve_token(s, w->token, w->done, w->arg, may_wait);
        else
            refuse(w->done, w->arg, ANSWER_NO_SUBJECT,
                   "the gateway's caller identity setting changed while the call waited");
        free(w->token);
        free(w);
        w = next;
    }
}

static void on_keys_fetched(void *arg)
{
    run_waiters(arg, false);
}

static jwks_source_t *keys_new(subject_t *s, const subject_conf_t *conf, char *msg, size_t msglen)
{
    jwks_source_opts_t o = {
        .base = s->base,
        .conf = &conf->jwt,
        .fetched = on_keys_fetched,
        .arg = s,
    };
    return jwks_source_new(&o, msg, msglen);
}

subject_t *subject_new(struct event_base *base, const subject_conf_t *conf, char *msg,
                       size_t msglen)
{
    subject_t *s = xcalloc(1, sizeof(*s));
    s->base = base;
    s->conf = conf;
    if (conf->kind == SUBJECT_JWT && !(s->keys = keys_new(s, conf, msg, msglen))) {
        free(s);
        return NULL;
    }
    return s;
}

void subject_free(subject_t *s)
{
    if (!s)
        return;
    for (waiter_t *w = s->waiting, *next; w; w = next) {
        next = w->next;
        free(w->token);
        free(w);
    }
    jwks_source_free(s->keys);
    free(s);
}

void subject_reconfigure(subject_t *s, const subject_conf_t *conf)
{
    s->conf = conf;
    if (conf->kind != SUBJECT_JWT) {
        jwks_source_free(s->keys);
        s->keys = NULL;
        run_waiters(s, false);
        return;
    }
    if (s->keys && jwks_source_same_origin(s->keys, &conf->jwt)) {
        jwks_source_reload(s->keys, &conf->jwt);
        return;
    }
    char msg[400];
    jwks_source_t *keys = keys_new(s, conf, msg, sizeof(msg));
    if (!keys) {
        log_error(0, "reload: subject.jwt: %s; %s", msg,
                  s->keys ? "keeping the keys of the running configuration"
                          : "protected calls are refused unknown_key");
        return;
    }
    jwks_source_free(s->keys);
    s->keys = keys;
    run_waiters(s, true);
}

void subject_resolve(subject_t *s, const http_request_t *req, subject_done_fn done, void *arg)
{
    const subject_conf_t *conf = s->conf;
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
    case SUBJECT_JWT:
        from_jwt(s, req, done, arg);
        return;
    case SUBJECT_CLIENT_CERT:
        from_client_cert(conf, req, done, arg);
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
    if (conf->kind == SUBJECT_CLIENT_CERT) {
        /* the caller the certificate names; no name (or no certificate) hashes as none */
        char name[CERT_NAME_MAX + 1];
        bool named = peer_cert_name(req->peer_cert, (peer_cert_source_t)conf->client_cert, name,
                                    sizeof(name)) == PEER_CERT_OK;
        EVP_DigestUpdate(md, named ? "c" : "n", 2);
        if (named)
            EVP_DigestUpdate(md, name, strlen(name) + 1);
    }
    unsigned int len = 0;
    EVP_DigestFinal_ex(md, out, &len);
    EVP_MD_CTX_free(md);
}

/* Two bearer tokens that verify now (no fetch) to one subject: a token and its refresh. */
static bool same_jwt_subject(const subject_t *s, const http_request_t *a, const http_request_t *b)
{
    bool several_a, several_b;
    const char *ta = bearer_token(a, &several_a), *tb = bearer_token(b, &several_b);
    if (!ta || !tb || several_a || several_b)
        return false;
    char *sa = NULL, *sb = NULL;
    bool same = verify(s, ta, &sa) == JWT_OK && verify(s, tb, &sb) == JWT_OK && strcmp(sa, sb) == 0;
    free(sa);
    free(sb);
    return same;
}

bool subject_same_caller(const subject_t *s, const http_request_t *a, const http_request_t *b)
{
    const subject_conf_t *conf = s->conf;
    if (conf->kind == SUBJECT_JWT && same_jwt_subject(s, a, b))
        return true;
    unsigned char da[32], db[32];
    caller_digest(conf, a, da);
    caller_digest(conf, b, db);
    return CRYPTO_memcmp(da, db, sizeof(da)) == 0;
}
