#include "tls_listen.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <string.h>

/* The oldest OpenSSL error, as words ("no such file", "key values mismatch"). */
static const char *ssl_error(void)
{
    static char buf[256];
    unsigned long e = ERR_peek_error();
    if (!e)
        return "unknown error";
    ERR_error_string_n(e, buf, sizeof(buf));
    ERR_clear_error();
    const char *reason = ERR_reason_error_string(e);
    return reason ? reason : buf;
}

/* Agents speak HTTP/1.1: an agent offering ALPN without it is refused at the handshake. */
static int select_alpn(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                       const unsigned char *in, unsigned int inlen, void *arg)
{
    static const unsigned char http11[] = "\x08http/1.1";
    unsigned char *chosen = NULL;
    if (SSL_select_next_proto(&chosen, outlen, http11, sizeof(http11) - 1, in, inlen) !=
        OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_ALERT_FATAL;
    *out = chosen;
    return SSL_TLSEXT_ERR_OK;
}

struct ssl_ctx_st *tls_listen_new(const listen_tls_conf_t *conf, char *msg, size_t msglen)
{
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        snprintf(msg, msglen, "listen_tls: cannot make a TLS context: %s", ssl_error());
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, conf->min_version == 1 ? TLS1_3_VERSION : TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    SSL_CTX_set_alpn_select_cb(ctx, select_alpn, NULL);
    /* sessions resumed with a client certificate need a context id */
    static const unsigned char sid[] = "idemgw";
    SSL_CTX_set_session_id_context(ctx, sid, sizeof(sid) - 1);
    if (SSL_CTX_use_certificate_chain_file(ctx, conf->cert_file) != 1) {
        snprintf(msg, msglen, "listen_tls.cert_file %s: %s", conf->cert_file, ssl_error());
        goto fail;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, conf->key_file, SSL_FILETYPE_PEM) != 1) {
        snprintf(msg, msglen, "listen_tls.key_file %s: %s", conf->key_file, ssl_error());
        goto fail;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        snprintf(msg, msglen, "listen_tls.key_file %s: does not match the certificate (%s)",
                 conf->key_file, ssl_error());
        goto fail;
    }
    if (conf->client_ca_file && conf->client_cert != LISTEN_TLS_CLIENT_NONE) {
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(conf->client_ca_file);
        if (!names || SSL_CTX_load_verify_locations(ctx, conf->client_ca_file, NULL) != 1) {
            sk_X509_NAME_pop_free(names, X509_NAME_free);
            snprintf(msg, msglen,
                     "listen_tls.client_ca_file %s: no CA certificate could be read (%s)",
                     conf->client_ca_file, ssl_error());
            goto fail;
        }
        SSL_CTX_set_client_CA_list(ctx, names);
        int mode = SSL_VERIFY_PEER;
        if (conf->client_cert == LISTEN_TLS_CLIENT_REQUIRED)
            mode |= SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
        SSL_CTX_set_verify(ctx, mode, NULL);
    }
    return ctx;
fail:
    SSL_CTX_free(ctx);
    return NULL;
}
