/* Where a jwt subject's keys come from: the JWK Set file (read at start, read again on
 * reload, a bad one keeping the keys read before) and the JWK Set URL, fetched on a real loop
 * over verified TLS from a small key server on loopback with a certificate made here: the first
 * fetch, each way a fetch fails (the last good set kept), the debounced refetch a token with an
 * unknown key asks for, and the errors an operator's bad file or CA file gets. */
#include "config.h"
#include "jwks_source.h"
#include "jwt.h"
#include "log.h"
#include "util.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

static struct event_base *base;
static char dir[64];
static char keys_path[128], ca_path[128], other_ca_path[128], junk_path[128];
static char *set_one, *set_two; /* JWK Sets of one key (k1) and of two (k1, k2) */

/* --- the key server: HTTPS, one answer per request, as scripted --- */

static SSL_CTX *server_tls;
static struct evconnlistener *listener;
static int port;
static int answer_status;
static const char *answer_body;
static bool answer_huge; /* a body past the 1 MiB a key set may have */
static int requests;
static char last_head[1024];

static void srv_written(struct bufferevent *bev, void *arg)
{
    bufferevent_free(bev);
}

static void srv_event(struct bufferevent *bev, short what, void *arg)
{
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
        bufferevent_free(bev);
}

static void srv_read(struct bufferevent *bev, void *arg)
{
    struct evbuffer *in = bufferevent_get_input(bev);
    struct evbuffer_ptr end = evbuffer_search(in, "\r\n\r\n", 4, NULL);
    if (end.pos < 0)
        return;
    requests++;
    size_t n = (size_t)end.pos < sizeof(last_head) - 1 ? (size_t)end.pos : sizeof(last_head) - 1;
    evbuffer_copyout(in, last_head, n);
    last_head[n] = '\0';
    evbuffer_drain(in, evbuffer_get_length(in));
    struct evbuffer *out = bufferevent_get_output(bev);
    size_t len = answer_huge ? 1100 * 1024 : strlen(answer_body);
    evbuffer_add_printf(out,
                        "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                        "Connection: close\r\n\r\n",
                        answer_status, len);
    if (answer_huge) {
        char *spaces = xmalloc(len);
        memset(spaces, ' ', len);
        evbuffer_add(out, spaces, len);
        free(spaces);
    } else {
        evbuffer_add(out, answer_body, len);
    }
    bufferevent_setcb(bev, NULL, srv_written, srv_event, NULL);
}

static void srv_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len,
                       void *arg)
{
    struct bufferevent *bev = bufferevent_openssl_socket_new(
        base, fd, SSL_new(server_tls), BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE);
    bufferevent_setcb(bev, srv_read, NULL, srv_event, NULL);
    bufferevent_enable(bev, EV_READ | EV_WRITE);
}

/* --- keys and certificates made here --- */

static char *b64url(const unsigned char *in, size_t n)
{
    char *out = xmalloc(4 * ((n + 2) / 3) + 1);
    int len = EVP_EncodeBlock((unsigned char *)out, in, (int)n);
    while (len > 0 && out[len - 1] == '=')
        len--;
    out[len] = '\0';
    for (char *p = out; *p; p++)
        *p = *p == '+' ? '-' : *p == '/' ? '_' : *p;
    return out;
}

/* The public JWK of a new Ed25519 key, named kid. */
static char *new_jwk(const char *kid)
{
    EVP_PKEY *k = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
    assert_non_null(k);
    unsigned char raw[32];
    size_t n = sizeof(raw);
    assert_int_equal(EVP_PKEY_get_raw_public_key(k, raw, &n), 1);
    EVP_PKEY_free(k);
    char *x = b64url(raw, n);
    char *jwk =
        xasprintf("{\"kty\":\"OKP\",\"crv\":\"Ed25519\",\"kid\":\"%s\",\"x\":\"%s\"}", kid, x);
    free(x);
    return jwk;
}

/* A self-signed certificate for 127.0.0.1 with key k, written as PEM to path. */
static X509 *new_cert(EVP_PKEY *k, const char *path)
{
    X509 *x = X509_new();
    assert_non_null(x);
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), -60);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600);
    X509_NAME *name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)"jwks test", -1, -1,
                               0);
    X509_set_issuer_name(x, name);
    X509_set_pubkey(x, k);
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, x, x, NULL, NULL, 0);
    X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &ctx, NID_subject_alt_name, "IP:127.0.0.1");
    assert_non_null(ext);
    X509_add_ext(x, ext, -1);
    X509_EXTENSION_free(ext);
    assert_true(X509_sign(x, k, EVP_sha256()) > 0);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(PEM_write_X509(f, x), 1);
    fclose(f);
    return x;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int group_setup(void **state)
{
    snprintf(dir, sizeof(dir), "/tmp/idemgw-jwks-XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    snprintf(keys_path, sizeof(keys_path), "%s/keys.json", dir);
    snprintf(ca_path, sizeof(ca_path), "%s/ca.pem", dir);
    snprintf(other_ca_path, sizeof(other_ca_path), "%s/other.pem", dir);
    snprintf(junk_path, sizeof(junk_path), "%s/junk.pem", dir);
    char *k1 = new_jwk("k1"), *k2 = new_jwk("k2");
    set_one = xasprintf("{\"keys\":[%s]}", k1);
    set_two = xasprintf("{\"keys\":[%s,%s]}", k1, k2);
    free(k1);
    free(k2);

    EVP_PKEY *key = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
    EVP_PKEY *other = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
    assert_non_null(key);
    assert_non_null(other);
    X509 *cert = new_cert(key, ca_path);
    X509_free(new_cert(other, other_ca_path)); /* a CA that did not sign the server's */
    write_file(junk_path, "not a certificate\n");
    server_tls = SSL_CTX_new(TLS_server_method());
    assert_non_null(server_tls);
    assert_int_equal(SSL_CTX_use_certificate(server_tls, cert), 1);
    assert_int_equal(SSL_CTX_use_PrivateKey(server_tls, key), 1);
    X509_free(cert);
    EVP_PKEY_free(key);
    EVP_PKEY_free(other);
    return 0;
}

static int group_teardown(void **state)
{
    SSL_CTX_free(server_tls);
    free(set_one);
    free(set_two);
    unlink(keys_path);
    unlink(ca_path);
    unlink(other_ca_path);
    unlink(junk_path);
    rmdir(dir);
    return 0;
}

static int setup(void **state)
{
    base = event_base_new();
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    listener =
        evconnlistener_new_bind(base, srv_accept, NULL, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE,
                                16, (struct sockaddr *)&sin, sizeof(sin));
    assert_non_null(listener);
    struct sockaddr_in bound;
    socklen_t bl = sizeof(bound);
    getsockname(evconnlistener_get_fd(listener), (struct sockaddr *)&bound, &bl);
    port = ntohs(bound.sin_port);
    answer_status = 200;
    answer_body = set_one;
    answer_huge = false;
    requests = 0;
    last_head[0] = '\0';
    write_file(keys_path, set_one);
    return 0;
}

static int teardown(void **state)
{
    evconnlistener_free(listener);
    for (int i = 0; i < 10; i++)
        event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    return 0;
}

/* --- sources --- */

static int fetched;

static void on_fetched(void *arg)
{
    assert_ptr_equal(arg, &fetched);
    fetched++;
}

/* A configuration: the file (or NULL), the URL on the key server (or not), the CA file. */
static subject_jwt_conf_t conf_of(const char *file, bool url, const char *ca)
{
    subject_jwt_conf_t c = {.refresh_ms = 300000};
    c.jwks_file = file ? xstrdup(file) : NULL;
    c.ca_file = ca ? xstrdup(ca) : NULL;
    if (url) {
        char u[128];
        snprintf(u, sizeof(u), "https://127.0.0.1:%d/keys", port);
        assert_null(config_parse_http_url(u, &c.jwks));
    }
    return c;
}

static void conf_free(subject_jwt_conf_t *c)
{
    free(c->jwks_file);
    free(c->ca_file);
    config_http_url_free(&c->jwks);
}

static jwks_source_t *new_source(const subject_jwt_conf_t *c, char *msg, size_t msglen)
{
    fetched = 0;
    jwks_source_opts_t o = {.base = base, .conf = c, .fetched = on_fetched, .arg = &fetched};
    return jwks_source_new(&o, msg, msglen);
}

static void run_until_fetched(int n)
{
    for (int i = 0; i < 1000 && fetched < n; i++)
        event_base_loop(base, EVLOOP_ONCE);
    assert_int_equal(fetched, n);
}

/* The keys of s now: how many sets, and the keys in each. */
static void expect_sets(const jwks_source_t *s, size_t n, size_t keys0, size_t keys1)
{
    const jwks_t *sets[2] = {NULL, NULL};
    assert_int_equal(jwks_source_sets(s, sets), n);
    if (n > 0)
        assert_int_equal(jwks_count(sets[0]), keys0);
    if (n > 1)
        assert_int_equal(jwks_count(sets[1]), keys1);
}

/* Log lines go to a temporary file until logged() reads them back into text. */
static FILE *capture_log(void)
{
    FILE *f = tmpfile();
    assert_non_null(f);
    log_stream = f;
    return f;
}

static void logged(FILE *f, char *text, size_t len)
{
    log_stream = NULL;
    rewind(f);
    text[fread(text, 1, len - 1, f)] = '\0';
    fclose(f);
}

static void the_file_is_read_and_read_again(void **state)
{
    subject_jwt_conf_t c = conf_of(keys_path, false, NULL);
    char msg[300] = "";
    jwks_source_t *s = new_source(&c, msg, sizeof(msg));
    assert_non_null(s);
    expect_sets(s, 1, 1, 0);
    assert_false(jwks_source_refetch(s)); /* no URL to fetch */
    assert_true(jwks_source_same_origin(s, &c));

    write_file(keys_path, set_two);
    jwks_source_reload(s, &c);
    expect_sets(s, 1, 2, 0);

    /* a bad file on reload keeps the keys read before, and says so */
    write_file(keys_path, "{\"keys\":[]}");
    FILE *f = capture_log();
    jwks_source_reload(s, &c);
    char text[1024];
    logged(f, text, sizeof(text));
    expect_sets(s, 1, 2, 0);
    assert_non_null(strstr(text, "reload: jwks_file "));
    assert_non_null(strstr(text, "keeping the keys read before"));
    assert_int_equal(fetched, 0);

    subject_jwt_conf_t other = conf_of(junk_path, false, NULL);
    assert_false(jwks_source_same_origin(s, &other));
    conf_free(&other);
    jwks_source_free(s);
    conf_free(&c);
}

/* An operator's file that gives no key set is refused at start, naming the file. */
static void a_bad_file_is_refused(void **state)
{
    char missing[160];
    snprintf(missing, sizeof(missing), "%s/none.json", dir);
    subject_jwt_conf_t c = conf_of(missing, false, NULL);
    char msg[300] = "";
    assert_null(new_source(&c, msg, sizeof(msg)));
    char want[300];
    snprintf(want, sizeof(want), "jwks_file: cannot open %s: ", missing);
    assert_memory_equal(msg, want, strlen(want));
    conf_free(&c);

    write_file(keys_path, "{\"keys\": not json");
    c = conf_of(keys_path, false, NULL);
    assert_null(new_source(&c, msg, sizeof(msg)));
    snprintf(want, sizeof(want), "jwks_file %s: ", keys_path);
    assert_memory_equal(msg, want, strlen(want));
    conf_free(&c);
}

static void the_url_is_fetched(void **state)
{
    subject_jwt_conf_t c = conf_of(keys_path, true, ca_path);
    char msg[300] = "";
    jwks_source_t *s = new_source(&c, msg, sizeof(msg));
    if (!s)
        fail_msg("%s", msg);
    expect_sets(s, 1, 1, 0); /* the file's, until the URL answers */
    assert_int_equal(fetched, 0);
    answer_body = set_two;
    run_until_fetched(1);
    expect_sets(s, 2, 1, 2); /* the file's, then the URL's */
    assert_int_equal(requests, 1);
    assert_non_null(strstr(last_head, "GET /keys HTTP/1.1\r\n"));
    assert_non_null(strstr(last_head, "\r\nAccept: application/jwk-set+json, application/json"));
    char host[64];
    snprintf(host, sizeof(host), "\r\nHost: 127.0.0.1:%d", port);
    assert_non_null(strstr(last_head, host));
    assert_true(jwks_source_same_origin(s, &c));
    jwks_source_free(s);
    conf_free(&c);
}

/* Each way a first fetch fails: no set from the URL yet, and the log says why. */
static void a_failed_fetch_is_logged(void **state)
{
    static const struct {
        int status;
        const char *body;
        bool huge;
        bool other_ca;
        const char *why;
    } cases[] = {
        {500, "{}", false, false, "(HTTP 500)"},
        {200, "{\"keys\":[]}", false, false, "no key set from it yet"},
        {200, "", true, false, "the answer is larger than 1048576 bytes"},
        {200, "{}", false, true, "no key set from it yet"}, /* a server the CA did not sign */
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        answer_status = cases[i].status;
        answer_body = cases[i].body;
        answer_huge = cases[i].huge;
        int before = requests;
        subject_jwt_conf_t c = conf_of(NULL, true, cases[i].other_ca ? other_ca_path : ca_path);
        char msg[300] = "";
        FILE *f = capture_log();
        jwks_source_t *s = new_source(&c, msg, sizeof(msg));
        assert_non_null(s);
        run_until_fetched(1);
        char text[2048];
        logged(f, text, sizeof(text));
        expect_sets(s, 0, 0, 0);
        if (!strstr(text, "jwks: fetching https://127.0.0.1:") || !strstr(text, cases[i].why))
            fail_msg("case %zu: logged %s", i, text);
        /* an untrusted server is never asked */
        assert_int_equal(requests, before + (cases[i].other_ca ? 0 : 1));
        jwks_source_free(s);
        conf_free(&c);
    }
}

/* A token with an unknown key fetches again, at once, but not again and again. A failed
 * fetch keeps the last good set. */
static void refetches_are_debounced(void **state)
{
    subject_jwt_conf_t c = conf_of(NULL, true, ca_path);
    char msg[300] = "";
    jwks_source_t *s = new_source(&c, msg, sizeof(msg));
    assert_non_null(s);
    run_until_fetched(1);
    expect_sets(s, 1, 1, 0);

    answer_status = 503;
    assert_true(jwks_source_refetch(s));
    assert_true(jwks_source_refetch(s)); /* under way: the caller waits for the same fetch */
    FILE *f = capture_log();
    run_until_fetched(2);
    char text[1024];
    logged(f, text, sizeof(text));
    assert_int_equal(requests, 2);
    expect_sets(s, 1, 1, 0);
    assert_non_null(strstr(text, "(HTTP 503); keeping the last good key set"));

    /* the next token with an unknown key, right after: no fetch */
    assert_false(jwks_source_refetch(s));
    for (int i = 0; i < 5; i++)
        event_base_loop(base, EVLOOP_NONBLOCK);
    assert_int_equal(requests, 2);
    assert_int_equal(fetched, 2);
    jwks_source_free(s);
    conf_free(&c);
}

/* A source freed with its fetch under way calls nobody. */
static void a_source_freed_mid_fetch_is_silent(void **state)
{
    subject_jwt_conf_t c = conf_of(NULL, true, ca_path);
    char msg[300] = "";
    jwks_source_t *s = new_source(&c, msg, sizeof(msg));
    assert_non_null(s);
    jwks_source_free(s);
    for (int i = 0; i < 20; i++)
        event_base_loop(base, EVLOOP_NONBLOCK);
    assert_int_equal(fetched, 0);
    conf_free(&c);
}

/* A CA file without a certificate is refused at start, naming the setting and the file. */
static void a_bad_ca_file_is_refused(void **state)
{
    subject_jwt_conf_t c = conf_of(NULL, true, junk_path);
    char msg[300] = "";
    assert_null(new_source(&c, msg, sizeof(msg)));
    char want[300];
    snprintf(want, sizeof(want), "jwks_url: ca_file %s: no usable certificate in it", junk_path);
    assert_string_equal(msg, want);
    assert_int_equal(requests, 0);
    conf_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(the_file_is_read_and_read_again, setup, teardown),
        cmocka_unit_test_setup_teardown(a_bad_file_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(the_url_is_fetched, setup, teardown),
        cmocka_unit_test_setup_teardown(a_failed_fetch_is_logged, setup, teardown),
        cmocka_unit_test_setup_teardown(refetches_are_debounced, setup, teardown),
        cmocka_unit_test_setup_teardown(a_source_freed_mid_fetch_is_silent, setup, teardown),
        cmocka_unit_test_setup_teardown(a_bad_ca_file_is_refused, setup, teardown),
    };
    return cmocka_run_group_tests_name("jwks_source", tests, group_setup, group_teardown);
}
