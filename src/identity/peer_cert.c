#include "peer_cert.h"

#include <openssl/asn1.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <string.h>
#include <strings.h>

const char *peer_cert_status_str(peer_cert_status_t st)
{
    switch (st) {
    case PEER_CERT_OK:
        return "ok";
    case PEER_CERT_NO_CERT:
        return "no_cert";
    case PEER_CERT_MISSING:
        return "missing";
    case PEER_CERT_SEVERAL:
        return "several";
    case PEER_CERT_NOT_SPIFFE:
        return "not_spiffe";
    case PEER_CERT_BAD_TEXT:
        return "bad_text";
    }
    return "unknown";
}

const char *peer_cert_status_phrase(peer_cert_status_t st, peer_cert_source_t src)
{
    switch (st) {
    case PEER_CERT_OK:
        return "ok";
    case PEER_CERT_NO_CERT:
        return "the connection has no verified client certificate";
    case PEER_CERT_MISSING:
        return src == PEER_CERT_SAN_DNS
                   ? "the client certificate has no DNS subject alternative name"
               : src == PEER_CERT_CN ? "the client certificate's subject has no common name"
                                     : "the client certificate has no URI subject alternative "
                                       "name";
    case PEER_CERT_SEVERAL:
        return "the client certificate has more than one URI subject alternative name (a SPIFFE "
               "certificate has exactly one)";
    case PEER_CERT_NOT_SPIFFE:
        return "the client certificate's URI is not a SPIFFE id (spiffe://trust-domain/path, "
               "lower-case scheme and trust domain, no empty, '.' or '..' path segments)";
    case PEER_CERT_BAD_TEXT:
        return "the client certificate's name is empty, too long or not printable text";
    }
    return "the client certificate names no caller";
}

/* A name stored in every key: printable ASCII without spaces (URI and DNS names are IA5). */
static bool ascii_name(const unsigned char *s, int len)
{
    if (len <= 0)
        return false;
    for (int i = 0; i < len; i++)
        if (s[i] < 0x21 || s[i] > 0x7e)
            return false;
    return true;
}

static peer_cert_status_t copy_name(const unsigned char *s, int len, char *out, size_t outlen)
{
    if (!ascii_name(s, len) || (size_t)len >= outlen)
        return PEER_CERT_BAD_TEXT;
    memcpy(out, s, (size_t)len);
    out[len] = '\0';
    return PEER_CERT_OK;
}

/* A SPIFFE id as the SPIFFE ID standard writes it (section 2): the scheme "spiffe" in lower
 * case, a trust domain of [a-z0-9._-] (so no upper case, port or user), then a workload path of
 * one or more segments of [a-zA-Z0-9._-], none empty, "." or ".." (no trailing slash, query or
 * fragment), 2048 bytes at most. Anything looser would let two spellings name one workload, or
 * one spelling name two. */
static bool spiffe_id(const char *s)
{
    static const char scheme[] = "spiffe://";
    if (strlen(s) > 2048 || strncmp(s, scheme, sizeof(scheme) - 1) != 0)
        return false;
    const char *p = s + sizeof(scheme) - 1;
    const char *td = p;
    while ((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '.' || *p == '-' ||
           *p == '_')
        p++;
    if (p == td || *p != '/')
        return false;
    while (*p == '/') {
        const char *seg = ++p;
        while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
               *p == '.' || *p == '-' || *p == '_')
            p++;
        size_t n = (size_t)(p - seg);
        if (n == 0 || (n == 1 && seg[0] == '.') || (n == 2 && seg[0] == '.' && seg[1] == '.'))
            return false;
    }
    return *p == '\0';
}

/* A copy of the first SAN of type (GEN_URI or GEN_DNS), or NULL; *count how many there are. */
static ASN1_IA5STRING *san(const X509 *cert, int type, int *count)
{
    GENERAL_NAMES *names = X509_get_ext_d2i(cert, NID_subject_alt_name, NULL, NULL);
    const ASN1_IA5STRING *first = NULL;
    *count = 0;
    for (int i = 0; names && i < sk_GENERAL_NAME_num(names); i++) {
        const GENERAL_NAME *g = sk_GENERAL_NAME_value(names, i);
        if (g->type != type)
            continue;
        if (!(*count)++)
            first = type == GEN_URI ? g->d.uniformResourceIdentifier : g->d.dNSName;
    }
    ASN1_IA5STRING *copy = first ? ASN1_STRING_dup(first) : NULL;
    GENERAL_NAMES_free(names);
    return copy;
}

static peer_cert_status_t from_san(const X509 *cert, peer_cert_source_t src, char *out,
                                   size_t outlen)
{
    int count;
    ASN1_IA5STRING *s = san(cert, src == PEER_CERT_SAN_DNS ? GEN_DNS : GEN_URI, &count);
    peer_cert_status_t st;
    if (!s)
        st = PEER_CERT_MISSING;
    else if (src == PEER_CERT_SPIFFE && count > 1)
        st = PEER_CERT_SEVERAL;
    else
        st = copy_name(ASN1_STRING_get0_data(s), ASN1_STRING_length(s), out, outlen);
    if (st == PEER_CERT_OK && src == PEER_CERT_SPIFFE && !spiffe_id(out))
        st = PEER_CERT_NOT_SPIFFE;
    ASN1_STRING_free(s);
    return st;
}

static peer_cert_status_t from_cn(const X509 *cert, char *out, size_t outlen)
{
    const X509_NAME *name = X509_get_subject_name(cert);
    int i = X509_NAME_get_index_by_NID(name, NID_commonName, -1);
    if (i < 0)
        return PEER_CERT_MISSING;
    unsigned char *utf8 = NULL;
    int len = ASN1_STRING_to_UTF8(&utf8, X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, i)));
    if (len < 0)
        return PEER_CERT_BAD_TEXT;
    /* a common name may hold spaces and non-ASCII letters; never control characters */
    peer_cert_status_t st = len > 0 && (size_t)len < outlen ? PEER_CERT_OK : PEER_CERT_BAD_TEXT;
    for (int k = 0; st == PEER_CERT_OK && k < len; k++)
        if (utf8[k] < 0x20 || utf8[k] == 0x7f)
            st = PEER_CERT_BAD_TEXT;
    if (st == PEER_CERT_OK && !util_utf8_valid((const char *)utf8, (size_t)len))
        st = PEER_CERT_BAD_TEXT;
    if (st == PEER_CERT_OK) {
        memcpy(out, utf8, (size_t)len);
        out[len] = '\0';
    }
    OPENSSL_free(utf8);
    return st;
}

peer_cert_status_t peer_cert_name(const struct x509_st *cert, peer_cert_source_t src, char *out,
                                  size_t outlen)
{
    if (outlen)
        out[0] = '\0';
    if (!cert)
        return PEER_CERT_NO_CERT;
    peer_cert_status_t st =
        src == PEER_CERT_CN ? from_cn(cert, out, outlen) : from_san(cert, src, out, outlen);
    if (st != PEER_CERT_OK && outlen)
        out[0] = '\0'; /* a name that failed a check is not handed on */
    return st;
}
