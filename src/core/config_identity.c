/* The config's identity keys, read by the YAML walker of config_yaml.c: `listen_tls` (TLS
 * towards agents) and `subject` (who calls: a header, the bearer token, a static name, a
 * verified JWT, a client certificate, or a certificate with one of the others). */
#include "config_yaml_int.h"
#include "jwt.h"
#include "util.h"

#include <errno.h>
#include <libfyaml.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *const peer_cert_source_names[] = {"spiffe", "san_uri", "san_dns", "cn", NULL};

static bool header_token_valid(const char *s)
{
    if (!*s)
        return false;
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
              strchr("!#$%&'*+-.^_`|~", ch)))
            return false;
    }
    return true;
}

/* ---- listen_tls: {...} ---- */

static const char *const client_cert_names[] = {"optional", "required", NULL};
static const char *const tls_version_names[] = {"1.2", "1.3", NULL};

#define TLS_CONF(f) offsetof(listen_tls_conf_t, f)
/* Reload: listen_tls is replaced whole (the key "listen_tls" is reloadable). */
static const key_spec_t listen_tls_keys[] = {
    {.name = "cert_file",
     .kind = K_STR,
     .off = TLS_CONF(cert_file),
     .reload = CONFIG_KEY_RELOADABLE},
    {.name = "key_file", .kind = K_STR, .off = TLS_CONF(key_file), .reload = CONFIG_KEY_RELOADABLE},
    {.name = "client_ca_file",
     .kind = K_STR,
     .off = TLS_CONF(client_ca_file),
     .reload = CONFIG_KEY_RELOADABLE},
    {.name = "client_cert",
     .kind = K_ENUM,
     .off = TLS_CONF(client_cert),
     .names = client_cert_names,
     .reload = CONFIG_KEY_RELOADABLE},
    {.name = "min_version",
     .kind = K_ENUM,
     .off = TLS_CONF(min_version),
     .names = tls_version_names,
     .reload = CONFIG_KEY_RELOADABLE},
};
#undef TLS_CONF

static void readable(ctx_t *cx, int line, const char *path, const char *key, const char *file)
{
    if (file && access(file, R_OK) != 0)
        cy_err_at(cx, line, "%s.%s: cannot read '%.200s': %s", path, key, file, strerror(errno));
}

void cy_fn_listen_tls(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    config_t *c = base;
    listen_tls_conf_t *t = &c->listen_tls;
    config_listen_tls_free(t);
    if (fy_node_is_alias(v) || cy_node_is_null(v) || !fy_node_is_mapping(v)) {
        cy_err_at(cx, line, "%s: expected a mapping (cert_file, key_file, client_ca_file, ...)",
                  path);
        return;
    }
    t->client_cert = -1;
    size_t before = cx->n_errs;
    cy_walk_map(cx, v, line, path, listen_tls_keys, ARRAY_LEN(listen_tls_keys), t, -1);
    if (t->client_cert < 0)
        t->client_cert = t->client_ca_file ? LISTEN_TLS_CLIENT_REQUIRED : LISTEN_TLS_CLIENT_NONE;
    if (cx->n_errs > before)
        return;
    if (!t->cert_file || !t->key_file) {
        cy_err_at(cx, line, "%s: cert_file and key_file are required", path);
        return;
    }
    if (!t->client_ca_file && t->client_cert != LISTEN_TLS_CLIENT_NONE) {
        cy_err_at(cx, line, "%s: client_cert needs client_ca_file (the CAs that verify them)",
                  path);
        return;
    }
    readable(cx, line, path, "cert_file", t->cert_file);
    readable(cx, line, path, "key_file", t->key_file);
    readable(cx, line, path, "client_ca_file", t->client_ca_file);
    t->enabled = cx->n_errs == before;
}

/* ---- subject: {jwt: {...}} ---- */

/* A JWK Set is small; a file this large is a mistake. */
#define JWKS_MAX_FILE_BYTES (1024u * 1024)

static void fn_jwt_jwks_file(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    subject_jwt_conf_t *j = base;
    const char *s = cy_scalar(cx, v, line, path, "a file name");
    if (!s)
        return;
    char err[300];
    size_t len = 0;
    char *text = *s ? util_read_file(s, JWKS_MAX_FILE_BYTES, &len, err, sizeof(err)) : NULL;
    if (!*s) {
        cy_err_at(cx, line, "%s: must not be empty", path);
        return;
    }
    if (!text) {
        cy_err_at(cx, line, "%s: %s", path, err);
        return;
    }
    /* a set that will not parse is refused now, not at the first call */
    jwks_t *keys = jwks_parse(text, len, err, sizeof(err));
    free(text);
    if (!keys) {
        cy_err_at(cx, line, "%s: '%.200s' is not a usable JWK Set: %s", path, s, err);
        return;
    }
    jwks_free(keys);
    cy_set_string(&j->jwks_file, s);
}

static void fn_jwt_jwks_url(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    const char *s = cy_scalar(cx, v, line, path, "a URL");
    if (!s)
        return;
    const char *err = config_set_jwks_url(base, s);
    if (err)
        cy_err_at(cx, line, "%s: bad URL '%.200s': %s", path, s, err);
}

static void fn_jwt_ca_file(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    subject_jwt_conf_t *j = base;
    const char *s = cy_scalar(cx, v, line, path, "a file name");
    if (!s)
        return;
    if (!*s)
        cy_err_at(cx, line, "%s: must not be empty", path);
    else if (access(s, R_OK) != 0)
        cy_err_at(cx, line, "%s: cannot read '%.200s': %s", path, s, strerror(errno));
    else
        cy_set_string(&j->ca_file, s);
}

static void audience_entry(ctx_t *cx, const char *s, int line, const char *path, void *base)
{
    subject_jwt_conf_t *j = base;
    if (!*s)
        cy_err_at(cx, line, "%s: must not be empty", path);
    else
        cy_strv_push(&j->audiences, &j->n_audiences, xstrdup(s));
}

/* A string or a list of strings. */
static void fn_jwt_audience(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    subject_jwt_conf_t *j = base;
    util_strv_free(j->audiences, j->n_audiences);
    j->audiences = NULL;
    j->n_audiences = 0;
    if (v && !fy_node_is_alias(v) && fy_node_is_sequence(v)) {
        cy_walk_list(cx, v, line, path, base, false, audience_entry);
        return;
    }
    const char *s = cy_scalar(cx, v, line, path, "a string or a list of strings");
    if (s)
        audience_entry(cx, s, line, path, base);
}

static void claim_entry(ctx_t *cx, const char *s, int line, const char *path, void *base)
{
    subject_jwt_conf_t *j = base;
    if (!*s)
        cy_err_at(cx, line, "%s: must not be empty", path);
    else
        cy_strv_push(&j->claims, &j->n_claims, xstrdup(s));
}

static void fn_jwt_claims(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    subject_jwt_conf_t *j = base;
    util_strv_free(j->claims, j->n_claims);
    j->claims = NULL;
    j->n_claims = 0;
    cy_walk_list(cx, v, line, path, base, false, claim_entry);
}

static void algorithm_entry(ctx_t *cx, const char *s, int line, const char *path, void *base)
{
    subject_jwt_conf_t *j = base;
    unsigned bit = jwt_alg_parse(s);
    if (!bit)
        cy_err_at(cx, line, "%s: '%.64s' is not allowed (allowed: %s; none and HS* never are)",
                  path, s, jwt_alg_names());
    j->algorithms |= bit;
}

static void fn_jwt_algorithms(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    subject_jwt_conf_t *j = base;
    j->algorithms = 0;
    cy_walk_list(cx, v, line, path, base, false, algorithm_entry);
    if (!j->algorithms)
        j->algorithms = JWT_ALGS_DEFAULT; /* the error is reported; keep a sane value */
}

#define JWT_CONF(f) offsetof(subject_jwt_conf_t, f)
/* Reload: subject is replaced whole (the key "subject" is reloadable). */
static const key_spec_t jwt_keys[] = {
    {.name = "jwks_file", .kind = K_FN, .fn = fn_jwt_jwks_file, .reload = CONFIG_KEY_RELOADABLE},
    {.name = "jwks_url", .kind = K_FN, .fn = fn_jwt_jwks_url, .reload = CONFIG_KEY_RELOADABLE},
    {.name = "ca_file", .kind = K_FN, .fn = fn_jwt_ca_file, .reload = CONFIG_KEY_RELOADABLE},
    {.name = "issuer", .kind = K_STR, .off = JWT_CONF(issuer), .reload = CONFIG_KEY_RELOADABLE},
    {.name = "audience", .kind = K_FN, .fn = fn_jwt_audience, .reload = CONFIG_KEY_RELOADABLE},
    {.name = "claims", .kind = K_FN, .fn = fn_jwt_claims, .reload = CONFIG_KEY_RELOADABLE},
    {.name = "algorithms", .kind = K_FN, .fn = fn_jwt_algorithms, .reload = CONFIG_KEY_RELOADABLE},
    {.name = "leeway",
     .kind = K_DUR,
     .off = JWT_CONF(leeway_ms),
     .min = 0,
     .max = 10 * 60 * MS_S,
     .reload = CONFIG_KEY_RELOADABLE},
    {.name = "refresh",
     .kind = K_DUR,
     .off = JWT_CONF(refresh_ms),
     .min = 10 * MS_S,
     .max = MS_D,
     .reload = CONFIG_KEY_RELOADABLE},
};
#undef JWT_CONF

static void subject_jwt(ctx_t *cx, struct fy_node *v, int line, const char *path, config_t *c)
{
    subject_jwt_conf_t *j = &c->subject.jwt;
    config_subject_jwt_free(j);
    if (fy_node_is_alias(v) || cy_node_is_null(v) || !fy_node_is_mapping(v)) {
        cy_err_at(cx, line, "%s: expected a mapping (jwks_url or jwks_file, issuer, audience, ...)",
                  path);
        return;
    }
    j->algorithms = JWT_ALGS_DEFAULT;
    j->leeway_ms = 30 * MS_S;
    j->refresh_ms = 5 * 60 * MS_S;
    size_t before = cx->n_errs;
    cy_walk_map(cx, v, line, path, jwt_keys, ARRAY_LEN(jwt_keys), j, -1);
    if (!j->n_claims) {
        cy_strv_push(&j->claims, &j->n_claims, xstrdup("iss"));
        cy_strv_push(&j->claims, &j->n_claims, xstrdup("sub"));
    }
    if (cx->n_errs > before)
        return; /* a missing key may only be a bad one, already reported */
    /* the keys say a token is genuine; issuer and audience say it is meant for this server,
     * not a token the same identity provider issued to another service */
    if (!j->jwks_file && !j->jwks.url)
        cy_err_at(cx, line, "%s: give jwks_url or jwks_file (where the issuer's keys are)", path);
    else if (!j->issuer)
        cy_err_at(cx, line, "%s: issuer is required (the iss every token must have)", path);
    else if (!j->n_audiences)
        cy_err_at(cx, line, "%s: audience is required (the aud naming this server)", path);
    else if (j->ca_file && !j->jwks.url)
        cy_err_at(cx, line, "%s: ca_file is only used with jwks_url", path);
    else
        c->subject.kind = SUBJECT_JWT;
}

/* subject: one source names the caller, or client_cert (the workload) with one of jwt, header,
 * bearer (the user it acts for). static with client_cert adds nothing; two of the others
 * would be two answers to "which user". */
void cy_fn_subject(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base)
{
    config_t *c = base;
    void *it = NULL;
    struct fy_node_pair *pair;
    bool any = false, user_seen = false, static_seen = false, cert_seen = false;
    int cert = -1, cert_line = line;
    if (fy_node_is_alias(v) || cy_node_is_null(v) || !fy_node_is_mapping(v)) {
        cy_err_at(
            cx, line,
            "%s: expected a mapping with one of header, bearer, static, jwt, client_cert, got %s",
            path, cy_node_kind(v));
        return;
    }
    c->subject.with_cert = false;
    while ((pair = fy_node_mapping_iterate(v, &it))) {
        struct fy_node *kn = fy_node_pair_key(pair), *vn = fy_node_pair_value(pair);
        int kline = cy_node_line(kn, line);
        int vline = cy_node_line(vn, kline);
        char cpath[PATH_MAX_LEN];
        const char *key = cy_scalar(cx, kn, kline, path, "a key");
        if (!key)
            continue;
        any = true;
        cy_child_path(cpath, path, key);
        bool known = !strcmp(key, "header") || !strcmp(key, "bearer") || !strcmp(key, "static") ||
                     !strcmp(key, "jwt") || !strcmp(key, "client_cert");
        if (!known) {
            cy_err_at(
                cx, kline,
                "unknown key '%.64s' in %s (allowed: header, bearer, static, jwt, client_cert)",
                key, path);
            continue;
        }
        bool is_cert = !strcmp(key, "client_cert"), is_static = !strcmp(key, "static");
        if (!is_cert && user_seen) {
            cy_err_at(cx, kline,
                      "%s: give only one of header, bearer, static, jwt (client_cert may be added "
                      "to jwt, header or bearer)",
                      path);
            continue;
        }
        if ((is_cert && static_seen) || (is_static && cert_seen)) {
            cy_err_at(
                cx, kline,
                "%s: static cannot be combined with client_cert (a fixed name adds nothing to "
                "the certificate's; combine client_cert with jwt, header or bearer)",
                path);
            continue;
        }
        if (is_cert)
            cert_seen = true;
        else
            user_seen = true;
        static_seen = static_seen || is_static;
        if (!strcmp(key, "jwt")) {
            subject_jwt(cx, vn, kline, cpath, c);
            continue;
        }
        const char *s = cy_scalar(cx, vn, vline, cpath, "a string");
        if (!s)
            continue;
        if (is_cert) {
            int i = 0;
            while (peer_cert_source_names[i] && strcmp(s, peer_cert_source_names[i]) != 0)
                i++;
            if (!peer_cert_source_names[i]) {
                cy_err_at(cx, vline,
                          "%s: unknown value '%.64s' (allowed: spiffe, san_uri, san_dns, cn)",
                          cpath, s);
            } else {
                cert = i;
                cert_line = kline;
            }
        } else if (!strcmp(key, "header")) {
            if (!header_token_valid(s)) {
                cy_err_at(cx, vline, "%s: '%.64s' is not a valid header name", cpath, s);
            } else if (!strcasecmp(s, "authorization") || !strcasecmp(s, "proxy-authorization") ||
                       !strcasecmp(s, "cookie")) {
                /* The subject is stored in every key: it must never be a raw credential. */
                cy_err_at(cx, vline, "%s: %s carries a credential; use 'bearer: sha256' instead",
                          cpath, s);
            } else {
                c->subject.kind = SUBJECT_HEADER;
                cy_set_string(&c->subject.value, s);
            }
        } else if (!strcmp(key, "bearer")) {
            if (strcmp(s, "sha256") != 0) {
                cy_err_at(cx, vline, "%s: unknown value '%.64s' (allowed: sha256)", cpath, s);
            } else {
                c->subject.kind = SUBJECT_BEARER_SHA256;
                free(c->subject.value);
                c->subject.value = NULL;
            }
        } else {
            bool ok = *s && strlen(s) <= MAX_NAME;
            for (const char *q = s; ok && *q; q++)
                ok = (unsigned char)*q > 0x20 && (unsigned char)*q < 0x7f;
            if (!ok) {
                cy_err_at(cx, vline, "%s: must be 1-%d printable ASCII characters without spaces",
                          cpath, MAX_NAME);
            } else {
                c->subject.kind = SUBJECT_STATIC;
                cy_set_string(&c->subject.value, s);
            }
        }
    }
    if (!any) {
        cy_err_at(cx, line, "%s: give one of header, bearer, static, jwt, client_cert", path);
        return;
    }
    if (cert < 0)
        return;
    if (!c->listen_tls.client_ca_file)
        cy_err_at(cx, cert_line,
                  "%s.client_cert: needs listen_tls with client_ca_file (the CAs that verify the "
                  "agents' certificates)",
                  path);
    c->subject.client_cert = cert;
    if (!user_seen) {
        c->subject.kind = SUBJECT_CLIENT_CERT;
        free(c->subject.value);
        c->subject.value = NULL;
    } else {
        /* a user source with an error left the kind alone; the error fails the load */
        c->subject.with_cert = c->subject.kind == SUBJECT_JWT ||
                               c->subject.kind == SUBJECT_HEADER ||
                               c->subject.kind == SUBJECT_BEARER_SHA256;
    }
}
