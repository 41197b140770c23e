/* Private to the config module: the YAML reader (config_yaml.c) and the pieces of config.c it
 * shares. Not for other modules: they use config.h. */
#ifndef IDEMGW_CONFIG_YAML_H
#define IDEMGW_CONFIG_YAML_H

#include "config.h"

#include <stddef.h>

/* What config.c needs to know about the file beyond the settings it held. */
typedef struct config_yaml_result {
    bool readable;      /* the document parsed and its top level is a mapping */
    bool upstream_seen; /* an upstream key was present, valid or not */
    bool servers_seen;  /* a servers key was present, valid or not */
    int workers_line;   /* the workers key's line, 0 when it is not in the file */
} config_yaml_result_t;

/* Applies the YAML text to c, which already holds the built-in defaults. Errors go to errs as
 * "name:line: message", in line order. */
config_yaml_result_t config_yaml_apply(config_t *c, const char *name, const char *text, size_t len,
                                       config_errors_t *errs);

/* Parses an upstream URL into c's upstream fields (replacing earlier ones). NULL on success,
 * else a static message saying what is wrong; c is then unchanged. */
const char *config_set_upstream(config_t *c, const char *url);
/* config_stdio.c: the stdio upstream's settings copied, compared and freed (zeroed after). */
void config_stdio_copy(stdio_conf_t *dst, const stdio_conf_t *src);
void config_stdio_free(stdio_conf_t *s);
/* config_servers.c: each server view gets the top level's current values again (after the
 * top level is complete, and after a reload merge replaced some of them); and a view freed. */
void config_views_refresh(config_t *c);
void config_view_free(config_t *v);
/* The same for subject.jwt.jwks_url, which must be https. */
const char *config_set_jwks_url(subject_jwt_conf_t *j, const char *url);
/* Frees what a jwt subject setting holds and zeroes it. */
void config_subject_jwt_free(subject_jwt_conf_t *j);
void config_listen_tls_free(listen_tls_conf_t *t);

/* Checks one allowed_hosts / allowed_origins entry. Returns the normalised copy to store, or
 * NULL with *err set to a static message. */
char *config_host_entry_norm(const char *s, const char **err);
char *config_origin_entry_norm(const char *s, const char **err);

#endif
