/* The TLS context of the agent listener (listen_tls): certificate and key, the CAs that verify
 * client certificates, the lowest version, ALPN http/1.1. A reload makes a new one; each
 * connection holds a reference to the context it was accepted with, so the old one lives on
 * until its last connection closes. */
#ifndef IDEMGW_TLS_LISTEN_H
#define IDEMGW_TLS_LISTEN_H

#include "config.h"
#include "util.h"

#include <stddef.h>

struct ssl_ctx_st;

/* NULL with msg ("listen_tls.key_file /etc/k.pem: ... does not match the certificate") when a
 * file cannot be read or used. Free with SSL_CTX_free. */
struct ssl_ctx_st *tls_listen_new(const listen_tls_conf_t *conf, char *msg,
                                  size_t msglen) MUST_CHECK;

#endif
