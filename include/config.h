/* The gateway configuration: YAML file (libfyaml) plus environment overrides.
 * Unknown keys are errors; every error is reported as "file:line: message". */
#ifndef IDEMGW_CONFIG_H
#define IDEMGW_CONFIG_H

#include "policy.h"
#include "util.h"

#include <stdbool.h>
#include <stdint.h>

typedef enum {
    SUBJECT_NONE = 0,      /* not configured: protected calls are refused */
    SUBJECT_HEADER,        /* a trusted header set by an auth proxy in front */
    SUBJECT_BEARER_SHA256, /* sha256 of the bearer token, hex */
    SUBJECT_STATIC,        /* one fixed name, for a single-tenant sidecar */
} subject_kind_t;

typedef struct subject_conf {
    subject_kind_t kind;
    char *value; /* header name for SUBJECT_HEADER, the name for SUBJECT_STATIC, else NULL */
} subject_conf_t;

typedef struct host_port {
    char *host;    /* numeric address or name, no brackets */
    uint16_t port; /* TCP port */
} host_port_t;

typedef struct config {
    char *path; /* the file read, or NULL when the environment alone configured us */

    host_port_t listen;       /* agents connect here (default 127.0.0.1:8080) */
    host_port_t admin_listen; /* /healthz, /readyz, /metrics (default 127.0.0.1:8081) */

    char *upstream_url;        /* full URL as given, e.g. http://127.0.0.1:3001/mcp */
    bool upstream_tls;         /* https:// */
    host_port_t upstream;      /* host and port from the URL */
    char *upstream_path;       /* path from the URL; agents use the same path on listen */
    char *upstream_host_header; /* Host header value sent upstream ("host:port") */

    char *database_url; /* libpq conninfo or URL; NULL = libpq PG* environment only */
    bool store_enabled; /* false when neither database_url nor a PG* variable is given */
    bool migrate;       /* apply missing sql/ migrations at start (default true) */
    int store_pool;     /* Postgres connections (default 4) */
    uint64_t sweep_interval_ms; /* how often expired keys are deleted (default 60s) */

    /* timeouts */
    uint64_t client_header_timeout_ms; /* whole request head must arrive within (10s) */
    uint64_t client_body_timeout_ms;   /* whole body must arrive within (30s) */
    uint64_t client_idle_timeout_ms;   /* keep-alive idle before close (60s) */
    uint64_t upstream_connect_timeout_ms; /* (5s) */
    uint64_t upstream_timeout_ms;      /* request sent → response headers (60s) */
    uint64_t upstream_idle_timeout_ms; /* max silence inside a streaming response (300s) */
    uint64_t drain_timeout_ms;         /* SIGTERM: wait this long for in-flight work (30s) */

    /* limits */
    uint64_t max_body_bytes;   /* request body (4 MiB) → 413 */
    uint64_t max_header_bytes; /* request head (16 KiB) → 431 */
    int max_connections;       /* agent connections (10000) */
    int upstream_pool;         /* idle keep-alive upstream connections kept (64) */

    /* DNS-rebinding protection. Empty lists mean: loopback names when listening on
     * loopback, anything otherwise. "*" allows all. */
    char **allowed_hosts;
    size_t n_allowed_hosts;
    char **allowed_origins;
    size_t n_allowed_origins;

    int log_level; /* log_level_t */

    subject_conf_t subject;
    policy_t policy;
} config_t;

/* Error list filled by config_load: each entry is "file:line: message" (or "env NAME: ..."). */
typedef struct config_errors {
    char **msgs;
    size_t n;
} config_errors_t;

void config_errors_free(config_errors_t *e);

/* Loads path (may be NULL: environment only), then applies IDEMGW_* overrides. Returns the
 * config, or NULL with errs filled. The environment is read with getenv. */
config_t *config_load(const char *path, config_errors_t *errs) MUST_CHECK;
/* Same from a string (tests); name is used in messages as the file name. */
config_t *config_load_string(const char *name, const char *yaml, config_errors_t *errs) MUST_CHECK;
void config_free(config_t *c);

/* Settings that cannot change without a restart (listen, admin_listen, upstream, database_url,
 * store_pool): writes a short description of each difference into out (one per line) and
 * returns how many differ. */
int config_restart_only_diff(const config_t *old, const config_t *neu, char *out, size_t outlen);

/* DNS-rebinding protection: is this Host header value (port ignored) / Origin allowed?
 * A NULL origin is allowed (non-browser clients send none). */
bool config_host_allowed(const config_t *c, const char *host_header);
bool config_origin_allowed(const config_t *c, const char *origin);

/* Parses "host:port", "[v6]:port" or ":port". 0 or -1. */
int config_parse_host_port(const char *s, host_port_t *out);

#endif
