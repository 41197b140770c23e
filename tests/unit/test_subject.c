/* subject_resolve and subject_same_caller for the subjects that need no I/O: the client
 * certificate's name alone and combined with a header or a bearer token (a workload acting
 * for a user). Certificates are made here with OpenSSL; the configuration is built by hand. */
#include "subject.h"
#include "peer_cert.h"

#include <stdarg.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <openssl/evp.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdlib.h>
#include <string.h>

static EVP_PKEY *key;

/* A self-signed certificate with subject CN cn and subjectAltName san (NULL: none). */
static X509 *cert_with(const char *cn, const char *san)
{
    X509 *x = X509_new();
    assert_non_null(x);
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 7);
    X509_gmtime_adj(X509_getm_notBefore(x), 0);
    X509_gmtime_adj(X509_getm_notAfter(x), 600);
    X509_NAME *subj = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(subj, "CN", MBSTRING_UTF8, (const unsigned char *)cn, -1, -1, 0);
    X509_set_issuer_name(x, subj);
    X509_set_pubkey(x, key);
    if (san) {
        X509V3_CTX v3;
        X509V3_set_ctx_nodb(&v3);
        X509V3_set_ctx(&v3, x, x, NULL, NULL, 0);
        X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &v3, NID_subject_alt_name, san);
        assert_non_null(ext);
        X509_add_ext(x, ext, -1);
        X509_EXTENSION_free(ext);
    }
    assert_true(X509_sign(x, key, EVP_sha256()) > 0);
    return x;
}

/* A request with cert (taken: the request owns it), and the header name: value when given. */
static http_request_t *request(X509 *cert, const char *name, const char *value)
{
    http_request_t *r = calloc(1, sizeof(*r));
    assert_non_null(r);
    http_headers_init(&r->headers);
    if (name) {
        http_headers_add_name(&r->headers, name, strlen(name));
        http_headers_end_name(&r->headers);
        http_headers_add_value(&r->headers, value, strlen(value));
        http_headers_end_value(&r->headers);
    }
    r->peer_cert = cert;
    return r;
}

static void request_free(http_request_t *r)
{
    http_headers_free(&r->headers);
    X509_free(r->peer_cert);
    free(r);
}

typedef struct {
    int calls;
    char *subject; /* NULL: refused */
    answer_t refusal;
    char *why;
} got_t;

static void on_done(void *arg, const subject_result_t *res)
{
    got_t *g = arg;
    g->calls++;
    g->subject = res->subject ? strdup(res->subject) : NULL;
    g->refusal = res->refusal;
    g->why = res->why ? strdup(res->why) : NULL;
}

/* Resolves req with conf; done must run before subject_resolve returns. */
static got_t resolve(const subject_conf_t *conf, const http_request_t *req)
{
    char msg[200];
    subject_t *s = subject_new(NULL, conf, msg, sizeof(msg));
    assert_non_null(s);
    got_t g = {0};
    subject_resolve(s, req, on_done, &g);
    assert_int_equal(g.calls, 1);
    subject_free(s);
    return g;
}

static void got_free(got_t *g)
{
    free(g->subject);
    free(g->why);
}

static void expect_subject(const subject_conf_t *conf, X509 *cert, const char *hname,
                           const char *hvalue, const char *want)
{
    http_request_t *r = request(cert, hname, hvalue);
    got_t g = resolve(conf, r);
    if (!g.subject)
        fail_msg("refused (%s), want %s", g.why ? g.why : "?", want);
    assert_string_equal(g.subject, want);
    got_free(&g);
    request_free(r);
}

static void expect_refused(const subject_conf_t *conf, X509 *cert, const char *hname,
                           const char *hvalue, answer_t refusal, const char *why)
{
    http_request_t *r = request(cert, hname, hvalue);
    got_t g = resolve(conf, r);
    if (g.subject)
        fail_msg("accepted as %s, want refused: %s", g.subject, why);
    assert_int_equal(g.refusal, refusal);
    assert_string_equal(g.why, why);
    got_free(&g);
    request_free(r);
}

static const subject_conf_t workload_and_header = {
    .kind = SUBJECT_HEADER,
    .value = "X-User",
    .client_cert = PEER_CERT_SPIFFE,
    .with_cert = true,
};

static void test_combined_header(void **state)
{
    (void)state;
    const subject_conf_t *c = &workload_and_header;
    expect_subject(c, cert_with("a", "URI:spiffe://td/billing"), "X-User", "alice",
                   "[\"spiffe://td/billing\",\"alice\"]");
    /* text that would blur a joined string stays apart in JSON */
    expect_subject(c, cert_with("a", "URI:spiffe://td/billing"), "X-User", "al\"ice\\,\"x",
                   "[\"spiffe://td/billing\",\"al\\\"ice\\\\,\\\"x\"]");
    expect_subject(c, cert_with("a", "URI:spiffe://td/billing"), "X-User", "Zoë",
                   "[\"spiffe://td/billing\",\"Zoë\"]");

    /* a missing part is refused as the single source refuses it */
    expect_refused(c, NULL, "X-User", "alice", ANSWER_NO_SUBJECT,
                   peer_cert_status_phrase(PEER_CERT_NO_CERT, PEER_CERT_SPIFFE));
    expect_refused(c, cert_with("a", "DNS:a.example"), "X-User", "alice", ANSWER_NO_SUBJECT,
                   peer_cert_status_phrase(PEER_CERT_MISSING, PEER_CERT_SPIFFE));
    expect_refused(c, cert_with("a", "URI:spiffe://td/a,URI:spiffe://td/b"), "X-User", "alice",
                   ANSWER_BAD_SUBJECT,
                   peer_cert_status_phrase(PEER_CERT_SEVERAL, PEER_CERT_SPIFFE));
    expect_refused(c, cert_with("a", "URI:spiffe://td/billing"), NULL, NULL, ANSWER_NO_SUBJECT,
                   "the request has no caller identity header (X-User)");
    expect_refused(c, cert_with("a", "URI:spiffe://td/billing"), "X-User", "", ANSWER_NO_SUBJECT,
                   "the request has no caller identity header (X-User)");
}

static void test_combined_names(void **state)
{
    (void)state;
    /* cn as the workload: a name with quotes and commas cannot pass for two parts */
    subject_conf_t c = workload_and_header;
    c.client_cert = PEER_CERT_CN;
    expect_subject(&c, cert_with("a\",\"b", NULL), "X-User", "c", "[\"a\\\",\\\"b\",\"c\"]");
    expect_subject(&c, cert_with("a", NULL), "X-User", "b\",\"c", "[\"a\",\"b\\\",\\\"c\"]");

    /* bearer: the token's hash is the user part */
    subject_conf_t b = {
        .kind = SUBJECT_BEARER_SHA256, .client_cert = PEER_CERT_SAN_DNS, .with_cert = true};
    http_request_t *r = request(cert_with("a", "DNS:agent.example"), "Authorization", "Bearer t1");
    got_t g = resolve(&b, r);
    assert_non_null(g.subject);
    assert_true(strncmp(g.subject, "[\"agent.example\",\"bearer-", 25) == 0);
    assert_int_equal(strlen(g.subject), 25 + 32 + 2);
    got_free(&g);
    request_free(r);
    expect_refused(&b, cert_with("a", "DNS:agent.example"), NULL, NULL, ANSWER_NO_SUBJECT,
                   "the request has no bearer token");

    /* alone, the certificate's name is the subject as it is */
    subject_conf_t alone = {.kind = SUBJECT_CLIENT_CERT, .client_cert = PEER_CERT_SAN_URI};
    expect_subject(&alone, cert_with("a", "URI:https://agents.example/7"), "X-User", "alice",
                   "https://agents.example/7");
}

static void test_same_caller(void **state)
{
    (void)state;
    char msg[200];
    subject_t *s = subject_new(NULL, &workload_and_header, msg, sizeof(msg));
    assert_non_null(s);
    http_request_t *a1 = request(cert_with("x", "URI:spiffe://td/a"), "X-User", "alice");
    http_request_t *a2 = request(cert_with("y", "URI:spiffe://td/a"), "X-User", "alice");
    http_request_t *b = request(cert_with("x", "URI:spiffe://td/b"), "X-User", "alice");
    http_request_t *bob = request(cert_with("x", "URI:spiffe://td/a"), "X-User", "bob");
    assert_true(subject_same_caller(s, a1, a2));   /* another certificate, the same name */
    assert_false(subject_same_caller(s, a1, b));   /* the same user through another workload */
    assert_false(subject_same_caller(s, a1, bob)); /* another user through the same workload */
    request_free(a1);
    request_free(a2);
    request_free(b);
    request_free(bob);
    subject_free(s);
}

int main(void)
{
    if (!(key = EVP_EC_gen("P-256")))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_combined_header),
        cmocka_unit_test(test_combined_names),
        cmocka_unit_test(test_same_caller),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    EVP_PKEY_free(key);
    return rc;
}
