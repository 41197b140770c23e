/* peer_cert_name: the caller's name from a client certificate, for each source, with
 * certificates made here with OpenSSL (a key, a subject CN, subjectAltName as openssl's
 * configuration syntax). */
#include "peer_cert.h"

#include <stdarg.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <openssl/evp.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <string.h>

static EVP_PKEY *key;

/* A self-signed certificate with subject CN cn (NULL: none) and subjectAltName san (NULL:
 * none), e.g. "URI:spiffe://example.org/a,DNS:agent.example". */
static X509 *make_cert(const char *cn, const char *san)
{
    X509 *x = X509_new();
    assert_non_null(x);
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), 0);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600);
    X509_NAME *name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, (const unsigned char *)"idemgw test", -1,
                               -1, 0);
    if (cn)
        X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, (const unsigned char *)cn, -1, -1, 0);
    X509_set_issuer_name(x, name);
    X509_set_pubkey(x, key);
    if (san) {
        X509V3_CTX ctx;
        X509V3_set_ctx_nodb(&ctx);
        X509V3_set_ctx(&ctx, x, x, NULL, NULL, 0);
        X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &ctx, NID_subject_alt_name, san);
        assert_non_null(ext);
        X509_add_ext(x, ext, -1);
        X509_EXTENSION_free(ext);
    }
    assert_true(X509_sign(x, key, EVP_sha256()) > 0);
    return x;
}

typedef struct {
    const char *cn, *san;
    peer_cert_source_t src;
    peer_cert_status_t want;
    const char *name; /* when PEER_CERT_OK */
} name_case_t;

static void test_names(void **state)
{
    (void)state;
    static const name_case_t cases[] = {
        {"a", "URI:spiffe://example.org/ns/a/sa/b", PEER_CERT_SPIFFE, PEER_CERT_OK,
         "spiffe://example.org/ns/a/sa/b"},
        {"a", "DNS:x.example,URI:spiffe://td/w", PEER_CERT_SPIFFE, PEER_CERT_OK, "spiffe://td/w"},
        {"a", "URI:spiffe://td/a,URI:spiffe://td/b", PEER_CERT_SPIFFE, PEER_CERT_SEVERAL, NULL},
        {"a", "URI:https://td/a,URI:spiffe://td/b", PEER_CERT_SPIFFE, PEER_CERT_SEVERAL, NULL},
        {"a", "URI:https://example.org/a", PEER_CERT_SPIFFE, PEER_CERT_NOT_SPIFFE, NULL},
        {"a", "URI:spiffe://example.org", PEER_CERT_SPIFFE, PEER_CERT_NOT_SPIFFE, NULL},
        {"a", "URI:spiffe://example.org/", PEER_CERT_SPIFFE, PEER_CERT_NOT_SPIFFE, NULL},
        {"a", "URI:spiffe:///path", PEER_CERT_SPIFFE, PEER_CERT_NOT_SPIFFE, NULL},
        {"a", "URI:spiffe://td:443/path", PEER_CERT_SPIFFE, PEER_CERT_NOT_SPIFFE, NULL},
        {"a", "URI:spiffe://td/path?q=1", PEER_CERT_SPIFFE, PEER_CERT_NOT_SPIFFE, NULL},
        /* the SPIFFE ID standard: lower-case scheme and trust domain, clean path segments */
        {"a", "URI:SPIFFE://td/w", PEER_CERT_SPIFFE, PEER_CERT_NOT_SPIFFE, NULL},
        {"a", "URI:Spiffe://td/w", PEER_CERT_SPIFFE, PEER_CERT_NOT_SPIFFE, NULL},
        {"a", "URI:spiffe://TD/w", PEER_CERT_SPIFFE, PEER_CERT_NOT_SPIFFE, NULL},
        {"a", "URI:spiffe://td/./w", PEER_CERT_SPIFFE, PEER_CERT_NOT_SPIFFE, NULL},
        {"a", "URI:spiffe://td/a/../w", PEER_CERT_SPIFFE, PEER_CERT_NOT_SPIFFE, NULL},
        {"a", "URI:spiffe://td/w/..", PEER_CERT_SPIFFE, PEER_CERT_NOT_SPIFFE, NULL},
        {"a", "URI:spiffe://td/a//w", PEER_CERT_SPIFFE, PEER_CERT_NOT_SPIFFE, NULL},
        {"a", "URI:spiffe://td/w/", PEER_CERT_SPIFFE, PEER_CERT_NOT_SPIFFE, NULL},
        {"a", "URI:spiffe://td/w%41", PEER_CERT_SPIFFE, PEER_CERT_NOT_SPIFFE, NULL},
        {"a", "URI:spiffe://us%65r@td/w", PEER_CERT_SPIFFE, PEER_CERT_NOT_SPIFFE, NULL},
        {"a", "URI:spiffe://td/w#f", PEER_CERT_SPIFFE, PEER_CERT_NOT_SPIFFE, NULL},
        {"a", "URI:spiffe://my-td.example_1/Ns/a.b/sa/c-d_e/...", PEER_CERT_SPIFFE, PEER_CERT_OK,
         "spiffe://my-td.example_1/Ns/a.b/sa/c-d_e/..."},
        {"a", "DNS:x.example", PEER_CERT_SPIFFE, PEER_CERT_MISSING, NULL},
        {"a", NULL, PEER_CERT_SPIFFE, PEER_CERT_MISSING, NULL},
        {"a", "URI:https://td/a,URI:urn:b", PEER_CERT_SAN_URI, PEER_CERT_OK, "https://td/a"},
        {"a", "DNS:one.example,DNS:two.example", PEER_CERT_SAN_DNS, PEER_CERT_OK, "one.example"},
        {"a", "URI:https://td/a", PEER_CERT_SAN_DNS, PEER_CERT_MISSING, NULL},
        {"agent-7", "DNS:x.example", PEER_CERT_CN, PEER_CERT_OK, "agent-7"},
        {"Agent Zoë", NULL, PEER_CERT_CN, PEER_CERT_OK, "Agent Zoë"},
        {"bad\nname", NULL, PEER_CERT_CN, PEER_CERT_BAD_TEXT, NULL},
        {NULL, "DNS:x.example", PEER_CERT_CN, PEER_CERT_MISSING, NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const name_case_t *c = &cases[i];
        X509 *x = make_cert(c->cn, c->san);
        char out[256];
        peer_cert_status_t st = peer_cert_name(x, c->src, out, sizeof(out));
        if (st != c->want)
            fail_msg("case %zu (%s, %s): %s, want %s", i, c->san ? c->san : "-",
                     peer_cert_source_names[c->src], peer_cert_status_str(st),
                     peer_cert_status_str(c->want));
        if (c->name)
            assert_string_equal(out, c->name);
        else
            assert_string_equal(out, "");
        X509_free(x);
    }
}

static void test_no_cert_and_short_buffer(void **state)
{
    (void)state;
    char out[16] = "x";
    assert_int_equal(peer_cert_name(NULL, PEER_CERT_SPIFFE, out, sizeof(out)), PEER_CERT_NO_CERT);
    assert_string_equal(out, "");
    X509 *x = make_cert("a", "URI:spiffe://example.org/a/long/path");
    assert_int_equal(peer_cert_name(x, PEER_CERT_SPIFFE, out, sizeof(out)), PEER_CERT_BAD_TEXT);
    X509_free(x);
}

static void test_status_words(void **state)
{
    (void)state;
    for (int s = PEER_CERT_OK; s <= PEER_CERT_BAD_TEXT; s++) {
        const char *w = peer_cert_status_str((peer_cert_status_t)s);
        assert_true(strlen(w) > 0);
        assert_string_not_equal(w, "unknown");
        for (int t = PEER_CERT_OK; t < s; t++)
            assert_string_not_equal(w, peer_cert_status_str((peer_cert_status_t)t));
        assert_true(strlen(peer_cert_status_phrase((peer_cert_status_t)s, PEER_CERT_SPIFFE)) > 0);
    }
    assert_string_equal(peer_cert_status_str((peer_cert_status_t)99), "unknown");
    assert_string_equal(peer_cert_source_names[PEER_CERT_CN], "cn");
    assert_null(peer_cert_source_names[PEER_CERT_CN + 1]);
}

static int setup(void **state)
{
    (void)state;
    key = EVP_EC_gen("P-256");
    return key ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    EVP_PKEY_free(key);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_no_cert_and_short_buffer),
        cmocka_unit_test(test_status_words),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
