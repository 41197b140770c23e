/* The caller named by a verified TLS client certificate: its SPIFFE id, first URI or DNS
 * subject alternative name, or subject common name. Pure: a certificate in, a name out. */
#ifndef IDEMGW_PEER_CERT_H
#define IDEMGW_PEER_CERT_H

#include "config.h"
#include "util.h"

#include <stddef.h>

struct x509_st;

typedef enum {
    PEER_CERT_OK = 0,
    PEER_CERT_NO_CERT,    /* the connection has no verified client certificate */
    PEER_CERT_MISSING,    /* the certificate has no such name */
    PEER_CERT_SEVERAL,    /* spiffe: more than one URI SAN (which is the caller?) */
    PEER_CERT_NOT_SPIFFE, /* spiffe: the URI is not spiffe://trust-domain/path */
    PEER_CERT_BAD_TEXT,   /* the name is empty, too long, or not printable ASCII */
} peer_cert_status_t;

const char *peer_cert_status_str(peer_cert_status_t st);

/* Why a call is refused, for the agent ("the client certificate has no URI SAN"). */
const char *peer_cert_status_phrase(peer_cert_status_t st, peer_cert_source_t src);

/* Writes the caller's name from cert (NULL: no certificate) to out, NUL-terminated; out is
 * empty unless PEER_CERT_OK. A name that does not fit in outlen is PEER_CERT_BAD_TEXT. */
peer_cert_status_t peer_cert_name(const struct x509_st *cert, peer_cert_source_t src, char *out,
                                  size_t outlen) MUST_CHECK;

#endif
