#include "subject.h"
#include "jwks_source.h"
#include "jwt.h"
#include "log.h"
#include "peer_cert.h"
#include "util.h"

#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* A resolve waiting for a key fetch: the token is copied, the request may be gone. */
typedef struct waiter {
    char *token;
    char *workload; /* with_cert: the certificate's name, else NULL */
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

/* The longest name of a certificate taken as a subject. */
#define CERT_NAME_MAX 1024

/* A workload acting for a user: the JSON array of the certificate's name and the user's
 * subject, or of the name and a jwt subject's claims (["spiffe://td/w","iss","sub"]). JSON
 * keeps the parts apart whatever they hold; NULL when a part is not UTF-8 text. */
static char *combined(const char *workload, const char *user, bool user_is_array)
{
    json_t *arr = user_is_array ? json_loads(user, 0, NULL) : json_array();
    if (!arr)
        return NULL;
    char *text = NULL;
    bool ok = json_is_array(arr) && json_array_insert_new(arr, 0, json_string(workload)) == 0;
    if (ok && !user_is_array)
        ok = json_array_append_new(arr, json_string(user)) == 0;
    if (ok && !(text = json_dumps(arr, JSON_COMPACT)))
        abort(); /* jansson cannot allocate: the out-of-memory policy */
    json_decref(arr);
    return text;
}

/* user is the subject a source found; workload the certificate's name when the subject
 * combines them (with_cert), else NULL. user_is_array: user is a jwt subject. */
static void accept_subject(subject_done_fn done, void *arg, const char *workload, const char *user,
                           bool user_is_array)
{
    if (!workload) {
        subject_result_t res = {.subject = user};
        done(arg, &res);
        return;
    }
    char *both = combined(workload, user, user_is_array);
    if (!both) {
        refuse(done, arg, ANSWER_BAD_SUBJECT,
               "the client certificate's name is not valid UTF-8 text");
        return;
    }
    subject_result_t res = {.subject = both};
    done(arg, &res);
    free(both);
}

static void from_header(const subject_conf_t *conf, const http_request_t *req, const char *workload,
                        subject_done_fn done, void *arg)
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
    accept_subject(done, arg, workload, v, false);
}

static bool has_bearer(const http_request_t *req)
{
    const char *v = http_headers_get(&req->headers, "authorization");
    return v && strncasecmp(v, "bearer ", 7) == 0 && v[7];
}

static void from_bearer(const http_request_t *req, const char *workload, subject_done_fn done,
                        void *arg)
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
    accept_subject(done, arg, workload, subject, false);
}

/* Another Authorization scheme (Basic, ...): the hash of the whole value tells callers apart. */
static void from_credentials(const http_request_t *req, subject_done_fn done, void *arg)
{
    const char *v = http_headers_get(&req->headers, "authorization");
    unsigned char md[32];
    util_sha256(v, strlen(v), md);
    char subject[12 + 33] = "credentials-";
    util_hex(md, 16, subject + 12);
    accept_subject(done, arg, NULL, subject, false);
}

/* --- client certificate --- */

/* The certificate's name into name (CERT_NAME_MAX + 1 bytes); false when refused (done ran). */
static bool cert_name(const subject_conf_t *conf, const http_request_t *req, char *name,
                      subject_done_fn done, void *arg)
{
    peer_cert_source_t src = (peer_cert_source_t)conf->client_cert;
    peer_cert_status_t st = peer_cert_name(req->peer_cert, src, name, CERT_NAME_MAX + 1);
    if (st == PEER_CERT_OK)
        return true;
    bool absent = st == PEER_CERT_NO_CERT || st == PEER_CERT_MISSING;
    refuse(done, arg, absent ? ANSWER_NO_SUBJECT : ANSWER_BAD_SUBJECT,
           peer_cert_status_phrase(st, src));
    return false;
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
static void resolve_token(subject_t *s, const char *token, const char *workload,
                          subject_done_fn done, void *arg, bool may_wait)
{
    char *subject = NULL;
    jwt_status_t st = verify(s, token, &subject);
    if (st == JWT_UNKNOWN_KEY && may_wait && s->keys && jwks_source_refetch(s->keys)) {
        waiter_t *w = xcalloc(1, sizeof(*w));
        w->token = xstrdup(token);
        w->workload = workload ? xstrdup(workload) : NULL;
        w->done = done;
        w->arg = arg;
        w->next = s->waiting;
        s->waiting = w;
        return;
    }
    if (st == JWT_OK)
        accept_subject(done, arg, workload, subject, true);
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

static void from_jwt(subject_t *s, const http_request_t *req, const char *workload,
                     subject_done_fn done, void *arg)
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
    resolve_token(s, token, workload, done, arg, true);
}

/* The waiters of a fetch that ended (or of a source replaced: may_wait again). */
static void run_waiters(subject_t *s, bool may_wait)
{
    waiter_t *w = s->waiting;
    s->waiting = NULL;
    while (w) {
        waiter_t *next = w->next;
        /* a call that waited under another combination has no part for the new one */
        if (s->conf->kind == SUBJECT_JWT && s->conf->with_cert == (w->workload != NULL))
            resolve_token(s, w->token, w->workload, w->done, w->arg, may_wait);
        else
            refuse(w->done, w->arg, ANSWER_NO_SUBJECT,
                   "the gateway's caller identity setting changed while the call waited");
        free(w->token);
        free(w->workload);
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
        free(w->workload);
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
    /* the workload first: a call without its certificate's name is refused before the user's
     * part is looked at (no key fetch for a caller refused anyway) */
    char name[CERT_NAME_MAX + 1];
    const char *workload = NULL;
    if (config_subject_uses_cert(conf)) {
        if (!cert_name(conf, req, name, done, arg))
            return;
        workload = name;
    }
    switch (conf->kind) {
    case SUBJECT_STATIC:
        accept_subject(done, arg, NULL, conf->value, false);
        return;
    case SUBJECT_HEADER:
        from_header(conf, req, workload, done, arg);
        return;
    case SUBJECT_BEARER_SHA256:
        from_bearer(req, workload, done, arg);
        return;
    case SUBJECT_JWT:
        from_jwt(s, req, workload, done, arg);
        return;
    case SUBJECT_CLIENT_CERT:
        accept_subject(done, arg, NULL, name, false);
        return;
    case SUBJECT_DEFAULT:
        if (has_bearer(req))
            from_bearer(req, NULL, done, arg);
        else if (http_headers_get(&req->headers, "authorization"))
            from_credentials(req, done, arg);
        else
            accept_subject(done, arg, NULL, SUBJECT_SHARED_NAME, false);
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
    if (config_subject_uses_cert(conf)) {
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

/* Without a certificate in the subject, or when both certificates give the same name (or
 * neither gives one): the workload part of a combined subject matches. */
static bool same_cert_name(const subject_conf_t *conf, const http_request_t *a,
                           const http_request_t *b)
{
    if (!conf->with_cert)
        return true;
    char na[CERT_NAME_MAX + 1], nb[CERT_NAME_MAX + 1];
    peer_cert_source_t src = (peer_cert_source_t)conf->client_cert;
    bool ok_a = peer_cert_name(a->peer_cert, src, na, sizeof(na)) == PEER_CERT_OK;
    bool ok_b = peer_cert_name(b->peer_cert, src, nb, sizeof(nb)) == PEER_CERT_OK;
    return ok_a == ok_b && (!ok_a || strcmp(na, nb) == 0);
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
    if (conf->kind == SUBJECT_JWT && same_cert_name(conf, a, b) && same_jwt_subject(s, a, b))
        return true;
    unsigned char da[32], db[32];
    caller_digest(conf, a, da);
    caller_digest(conf, b, db);
    return CRYPTO_memcmp(da, db, sizeof(da)) == 0;
}

void subject_caller_tag(const subject_t *s, const http_request_t *req,
                        char out[SUBJECT_TAG_HEX + 1])
{
    unsigned char d[32];
    caller_digest(s->conf, req, d);
    util_hex(d, sizeof(d), out);
}
