/* A jwt subject's keys: the JWK Set file and the JWK Set URL (see include/jwks_source.h). */
#include "jwks_source.h"

#include "http_headers.h"
#include "log.h"
#include "upstream_http.h"
#include "util.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An identity provider's key set is a few KiB; more is not a key set. */
#define JWKS_MAX_BYTES (1024u * 1024)
/* After a failed fetch, the next try comes this soon (or at refresh, when sooner). */
#define JWKS_RETRY_MS 30000

struct jwks_source {
    jwks_source_opts_t o;
    char *file;        /* the JWK Set file, or NULL */
    jwks_t *file_keys; /* its set */

    char *url;                /* the JWK Set URL, or NULL (then no pool, no timers) */
    char *path, *host_header; /* the request's target and Host */
    char *ca_file;            /* as configured: compared by a reload */
    struct ssl_ctx_st *tls;
    upstream_limits_t limits; /* the pool reads them at each use */
    upstream_pool_t *pool;
    jwks_t *url_keys;            /* the last good set from the URL, or NULL */
    uint64_t refresh_ms;         /* fetch again this often */
    struct event *refresh_timer; /* the next scheduled fetch */
    struct event *report;        /* calls fetched from the loop once a fetch ended */

    /* the fetch in progress */
    upstream_conn_t *up;      /* non-NULL while the request runs */
    bool fetching;            /* from the send until fetched is scheduled */
    int status;               /* its HTTP status */
    struct evbuffer *body;    /* its body so far */
    bool too_large;           /* more than JWKS_MAX_BYTES */
    uint64_t last_refetch_ms; /* when a token's unknown key last started a fetch (0: never) */
};

static void start_fetch(jwks_source_t *s);

static void on_refresh(evutil_socket_t fd, short what, void *arg)
{
    start_fetch(arg);
}

static void on_report(evutil_socket_t fd, short what, void *arg)
{
    jwks_source_t *s = arg;
    if (s->o.fetched)
        s->o.fetched(s->o.arg);
}

static void on_head(void *arg, int status, const http_headers_t *headers)
{
    jwks_source_t *s = arg;
    s->status = status;
}

static void on_body(void *arg, const char *data, size_t len)
{
    jwks_source_t *s = arg;
    if (s->too_large || evbuffer_get_length(s->body) + len > JWKS_MAX_BYTES) {
        s->too_large = true;
        return;
    }
    evbuffer_add(s->body, data, len);
}

/* The fetched set, or NULL with why not. */
static jwks_t *fetched_set(jwks_source_t *s, upstream_result_t res, char *err, size_t errlen)
{
    if (res != UPSTREAM_OK) {
        snprintf(err, errlen, "%s", upstream_result_str(res));
        return NULL;
    }
    if (s->status != 200) {
        snprintf(err, errlen, "HTTP %d", s->status);
        return NULL;
    }
    if (s->too_large) {
        snprintf(err, errlen, "the answer is larger than %u bytes", JWKS_MAX_BYTES);
        return NULL;
    }
    size_t len = evbuffer_get_length(s->body);
    return jwks_parse((const char *)evbuffer_pullup(s->body, -1), len, err, errlen);
}

static void on_end(void *arg, upstream_result_t res)
{
    jwks_source_t *s = arg;
    s->up = NULL;
    char err[300] = "";
    jwks_t *set = fetched_set(s, res, err, sizeof(err));
    uint64_t next = s->refresh_ms;
    if (set) {
        log_info(0, "jwks: %zu keys from %s", jwks_count(set), s->url);
        jwks_free(s->url_keys);
        s->url_keys = set;
    } else {
        if (next > JWKS_RETRY_MS)
            next = JWKS_RETRY_MS;
        log_warn(0, "jwks: fetching %s failed (%s); %s", s->url, err,
                 s->url_keys ? "keeping the last good key set" : "no key set from it yet");
    }
    evbuffer_drain(s->body, evbuffer_get_length(s->body));
    struct timeval tv = util_ms_to_tv(next);
    evtimer_add(s->refresh_timer, &tv);
    s->fetching = false;
    struct timeval zero = {0, 0};
    evtimer_add(s->report, &zero);
}

static const upstream_cbs_t fetch_cbs = {on_head, on_body, on_end};

static void start_fetch(jwks_source_t *s)
{
    if (s->fetching)
        return;
    evtimer_del(s->refresh_timer);
    s->fetching = true;
    s->status = 0;
    s->too_large = false;
    http_headers_t none;
    http_headers_init(&none);
    struct evbuffer *out = evbuffer_new();
    http_write_request_head(out, "GET", s->path, &none, s->host_header, NULL, -1,
                            "Accept: application/jwk-set+json, application/json\r\n");
    http_headers_free(&none);
    s->up = upstream_http_send(s->pool, out, false, &fetch_cbs, s);
    evbuffer_free(out);
}

static jwks_t *read_file(const char *path, char *msg, size_t msglen)
{
    char err[300];
    size_t len = 0;
    char *text = util_read_file(path, JWKS_MAX_BYTES, &len, err, sizeof(err));
    if (!text) {
        snprintf(msg, msglen, "jwks_file: %s", err);
        return NULL;
    }
    jwks_t *set = jwks_parse(text, len, err, sizeof(err));
    free(text);
    if (!set)
        snprintf(msg, msglen, "jwks_file %s: %s", path, err);
    return set;
}

static bool str_same(const char *a, const char *b)
{
    return a == b || (a && b && strcmp(a, b) == 0);
}

jwks_source_t *jwks_source_new(const jwks_source_opts_t *opts, char *msg, size_t msglen)
{
    const subject_jwt_conf_t *c = opts->conf;
    jwks_source_t *s = xcalloc(1, sizeof(*s));
    s->o = *opts;
    s->o.conf = NULL;
    s->refresh_ms = c->refresh_ms;
    if (c->jwks_file) {
        s->file = xstrdup(c->jwks_file);
        if (!(s->file_keys = read_file(s->file, msg, msglen)))
            goto fail;
    }
    if (!c->jwks.url)
        return s;
    s->url = xstrdup(c->jwks.url);
    s->path = xstrdup(c->jwks.path);
    s->host_header = xstrdup(c->jwks.host_header);
    s->ca_file = c->ca_file ? xstrdup(c->ca_file) : NULL;
    char err[256];
    if (!(s->tls = upstream_tls_new(c->ca_file, "ca_file", err, sizeof(err)))) {
        snprintf(msg, msglen, "jwks_url: %s", err);
        goto fail;
    }
    /* a key server that is slow to answer holds up the calls waiting for it */
    s->limits = (upstream_limits_t){
        .connect_timeout_ms = 5000,
        .timeout_ms = 10000,
        .idle_timeout_ms = 10000,
        .pool = 1,
    };
    upstream_opts_t uo = {
        .base = opts->base,
        .tls = s->tls,
        .host = c->jwks.hp.host,
        .port = c->jwks.hp.port,
        .limits = &s->limits,
    };
    if (!(s->pool = upstream_pool_new(&uo, err, sizeof(err)))) {
        snprintf(msg, msglen, "jwks_url: %s", err);
        goto fail;
    }
    s->body = evbuffer_new();
    s->refresh_timer = evtimer_new(opts->base, on_refresh, s);
    s->report = evtimer_new(opts->base, on_report, s);
    start_fetch(s);
    return s;
fail:
    jwks_source_free(s);
    return NULL;
}

void jwks_source_free(jwks_source_t *s)
{
    if (!s)
        return;
    if (s->up)
        upstream_http_abandon(s->up);
    if (s->refresh_timer)
        event_free(s->refresh_timer);
    if (s->report)
        event_free(s->report);
    if (s->body)
        evbuffer_free(s->body);
    upstream_pool_free(s->pool);
    if (s->tls)
        SSL_CTX_free(s->tls);
    jwks_free(s->file_keys);
    jwks_free(s->url_keys);
    free(s->file);
    free(s->url);
    free(s->path);
    free(s->host_header);
    free(s->ca_file);
    free(s);
}

bool jwks_source_same_origin(const jwks_source_t *s, const subject_jwt_conf_t *conf)
{
    return str_same(s->file, conf->jwks_file) && str_same(s->url, conf->jwks.url) &&
           str_same(s->ca_file, conf->ca_file);
}

void jwks_source_reload(jwks_source_t *s, const subject_jwt_conf_t *conf)
{
    s->refresh_ms = conf->refresh_ms;
    if (!s->file)
        return;
    char msg[400];
    jwks_t *set = read_file(s->file, msg, sizeof(msg));
    if (!set) {
        log_error(0, "reload: %s; keeping the keys read before", msg);
        return;
    }
    log_info(0, "jwks: %zu keys from %s", jwks_count(set), s->file);
    jwks_free(s->file_keys);
    s->file_keys = set;
}

size_t jwks_source_sets(const jwks_source_t *s, const jwks_t *out[2])
{
    size_t n = 0;
    if (s->file_keys)
        out[n++] = s->file_keys;
    if (s->url_keys)
        out[n++] = s->url_keys;
    return n;
}

bool jwks_source_refetch(jwks_source_t *s)
{
    if (!s->url)
        return false;
    if (s->fetching)
        return true;
    uint64_t now = util_now_ms();
    if (s->last_refetch_ms && now - s->last_refetch_ms < JWKS_REFETCH_MIN_MS)
        return false;
    s->last_refetch_ms = now;
    log_info(0, "jwks: a token names a key not in the set; fetching %s again", s->url);
    start_fetch(s);
    return true;
}
