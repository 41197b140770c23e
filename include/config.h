/* The gateway configuration: YAML file (libfyaml) plus environment overrides.
 * Unknown keys are errors; every error is reported as "file:line: message". */
#ifndef IDEMGW_CONFIG_H
#define IDEMGW_CONFIG_H

#include "policy.h"
#include "store_url.h"
#include "util.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct host_port {
    char *host;    /* numeric address or name, no brackets */
    uint16_t port; /* TCP port */
} host_port_t;

/* An http(s) URL the gateway sends to (other than the upstream): its parts, allocated. */
typedef struct http_url {
    char *url;         /* as given */
    bool tls;          /* https */
    host_port_t hp;    /* host and port (default 80 / 443) */
    char *path;        /* "/" at least */
    char *host_header; /* "host:port" */
} http_url_t;

typedef enum {
    SUBJECT_DEFAULT = 0,   /* not configured: the bearer token's SHA-256 when the request has
                              one, else the one shared subject SUBJECT_SHARED_NAME */
    SUBJECT_HEADER,        /* a trusted header set by an auth proxy in front */
    SUBJECT_BEARER_SHA256, /* sha256 of the bearer token, hex */
    SUBJECT_STATIC,        /* one fixed name, for a single-tenant sidecar */
    SUBJECT_JWT,           /* claims of a verified JWT bearer token (jwt.h) */
    SUBJECT_CLIENT_CERT,   /* the agent's verified TLS client certificate (peer_cert.h) */
} subject_kind_t;

/* The subject of every caller without a bearer token when no subject source is configured:
 * on a server without authentication its callers are all the same caller to it, too. */
#define SUBJECT_SHARED_NAME "anonymous"

/* subject: {jwt: {...}}: where the keys come from and what a token must say. */
typedef struct subject_jwt_conf {
    char *jwks_file;  /* a JWK Set file, read at start and on reload; or NULL */
    http_url_t jwks;  /* jwks_url: an https JWK Set fetched on the loop; url NULL: none */
    char *ca_file;    /* PEM CAs that verify jwks_url's server; NULL = system store */
    char *issuer;     /* iss must equal it */
    char **audiences; /* aud must name one of them */
    size_t n_audiences;
    char **claims; /* the subject is made of these claims (default iss, sub) */
    size_t n_claims;
    unsigned algorithms; /* jwt_alg_t bits (default RS256, ES256, PS256, EdDSA) */
    uint64_t leeway_ms;  /* clock skew allowed on exp and nbf (default 30s) */
    uint64_t refresh_ms; /* jwks_url is fetched again this often (default 5m) */
} subject_jwt_conf_t;

/* subject: {client_cert: ...}: which name of a client certificate names the caller
 * (peer_cert.h reads it), in the order of its names (peer_cert_source_names). */
typedef enum {
    PEER_CERT_SPIFFE = 0, /* the one URI SAN, a spiffe://trust-domain/path id */
    PEER_CERT_SAN_URI,    /* the first URI SAN */
    PEER_CERT_SAN_DNS,    /* the first DNS SAN */
    PEER_CERT_CN,         /* the subject's common name */
} peer_cert_source_t;

/* NULL-terminated, in enum order: "spiffe", "san_uri", "san_dns", "cn". */
extern const char *const peer_cert_source_names[];

typedef struct subject_conf {
    subject_kind_t kind;
    char *value; /* header name for SUBJECT_HEADER, the name for SUBJECT_STATIC, else NULL */
    subject_jwt_conf_t jwt; /* SUBJECT_JWT only */
    /* SUBJECT_CLIENT_CERT or with_cert: which name of the certificate, peer_cert_source_t */
    int client_cert;
    /* SUBJECT_JWT, _HEADER or _BEARER_SHA256 combined with the client certificate's name: a
     * workload (the certificate) acting for a user */
    bool with_cert;
} subject_conf_t;

/* Whether the subject needs the agent's client certificate (alone or combined). */
static inline bool config_subject_uses_cert(const subject_conf_t *s)
{
    return s->kind == SUBJECT_CLIENT_CERT || s->with_cert;
}

/* listen_tls: client_cert, in the order of its names. */
typedef enum {
    LISTEN_TLS_CLIENT_OPTIONAL = 0, /* asked for and verified when given */
    LISTEN_TLS_CLIENT_REQUIRED,     /* the handshake fails without one */
    LISTEN_TLS_CLIENT_NONE,         /* not asked for (no client_ca_file) */
} listen_tls_client_t;

/* listen_tls: {...}: agents connect with TLS. Every key is reloadable: a reload makes a new
 * TLS context for new connections, open ones keep theirs. */
typedef struct listen_tls_conf {
    bool enabled;         /* listen_tls is given */
    char *cert_file;      /* PEM certificate chain, the server's first */
    char *key_file;       /* PEM private key */
    char *client_ca_file; /* PEM CAs that verify client certificates; NULL: none asked for */
    int client_cert;      /* listen_tls_client_t (default REQUIRED with client_ca_file) */
    int min_version;      /* 0: TLS 1.2, 1: TLS 1.3 */
} listen_tls_conf_t;

typedef enum {
    CORS_MIRROR = 0, /* the gateway's own answers carry the CORS headers the upstream gives */
    CORS_OFF,        /* they carry none */
} cors_mode_t;

/* upstream: {command: [...]}: how sessions share the spawned server. */
typedef enum {
    STDIO_PER_SESSION = 0, /* one child per MCP session, fed that session's initialize */
    STDIO_SHARED,          /* one child for all sessions, initialized once */
} stdio_sessions_t;

/* upstream: {command: [...], ...}: the MCP server is a program the gateway spawns and speaks
 * newline-delimited JSON-RPC with on its stdin and stdout. argv NULL: the upstream is a URL. */
/* The longest idle_timeout a configuration may set; above it (the stdio wrapper's), sessions
 * live as long as the process. */
#define STDIO_IDLE_TIMEOUT_MAX_MS (7ULL * 24 * 3600 * 1000)

typedef struct stdio_conf {
    char **argv; /* the command and its arguments, NULL-terminated */
    size_t argc;
    char **env; /* "NAME=value", what the child gets besides PATH and HOME */
    size_t n_env;
    char **pass_env;  /* names of the gateway's own variables the child gets too, NULL-ended */
    char *cwd;        /* the child's working directory; NULL: the gateway's */
    int sessions;     /* stdio_sessions_t */
    int max_children; /* children alive at once (default 32) */
    uint64_t idle_timeout_ms;  /* a session without a request this long is ended (10m) */
    uint64_t grace_ms;         /* SIGTERM to SIGKILL when a child is stopped (5s) */
    uint64_t start_timeout_ms; /* from a child's start to its answer to initialize (30s) */
} stdio_conf_t;

typedef struct config {
    char *path; /* the file read, or NULL when the environment alone configured us */

    host_port_t listen;           /* agents connect here (default 127.0.0.1:8080) */
    listen_tls_conf_t listen_tls; /* TLS towards agents, when enabled */
    int workers;                  /* processes sharing listen with SO_REUSEPORT (default 1) */
    host_port_t admin_listen;     /* /healthz, /readyz, /metrics (default 127.0.0.1:8081) */

    char *upstream_url;         /* full URL as given, e.g. http://127.0.0.1:3001/mcp */
    bool upstream_tls;          /* https:// */
    char *upstream_ca_file;     /* PEM CAs that verify an https upstream; NULL = system store */
    host_port_t upstream;       /* host and port from the URL */
    char *upstream_path;        /* path from the URL; agents use the same path on listen */
    char *upstream_host_header; /* Host header value sent upstream ("host:port") */
    stdio_conf_t stdio;         /* a spawned stdio server instead (stdio.argv set): then
                                   upstream_url names the command and upstream_path is where
                                   agents connect (default /mcp) */

    char *database_url; /* libpq conninfo or URL, "sqlite:PATH" or "none"; NULL = the
                           PG* environment when it names a database, else the default
                           embedded store */
    /* Where idempotency keys are kept, from database_url and the environment
     * (store_url_parse); the backend that serves it is store_backend_for's (store_open.h). */
    store_url_kind_t store_kind;
    char *store_target;         /* what the backend opens: the file, the conninfo, or NULL */
    bool store_enabled;         /* store_kind is not STORE_URL_NONE (protected calls are refused) */
    bool migrate;               /* apply missing sql/ migrations at start (default true) */
    int store_pool;             /* Postgres connections (default 4) */
    uint64_t store_timeout_ms;  /* deadline of each store operation (default 5s) */
    uint64_t sweep_interval_ms; /* how often expired keys are deleted (default 60s) */
    int cache_entries;          /* replay cache per worker: finished results kept (100000; 0 off) */
    uint64_t cache_bytes;       /* and the bytes they may take (64 MiB) */
    bool store_group_commit;    /* Postgres: batch queued claims and finishes (on) */
    bool store_durable_finish;  /* finishes wait for the disk too, either store (off) */
    uint64_t store_commit_delay_ms; /* embedded store: a claim among others waits for company */
    bool store_peers;               /* the embedded store's file is shared with peer processes of
                                       this machine (set by idemgw stdio; no config key) */

    /* timeouts */
    uint64_t client_header_timeout_ms;    /* whole request head must arrive within (10s) */
    uint64_t client_body_timeout_ms;      /* whole body must arrive within (30s) */
    uint64_t client_idle_timeout_ms;      /* keep-alive idle before close (60s) */
    uint64_t upstream_connect_timeout_ms; /* (5s) */
    uint64_t upstream_timeout_ms;         /* request sent → response headers (60s) */
    uint64_t upstream_idle_timeout_ms;    /* max silence inside a streaming response (300s) */
    uint64_t drain_timeout_ms;            /* SIGTERM: wait this long for in-flight work (30s) */

    /* limits */
    uint64_t max_body_bytes;   /* request body (4 MiB) → 413 */
    uint64_t max_header_bytes; /* request head (16 KiB) → 431 */
    int max_connections;       /* agent connections (10000) */
    int upstream_pool;         /* idle keep-alive upstream connections kept (64) */

    /* DNS-rebinding protection, checked with config_host_allowed / config_origin_allowed.
     * Never empty after config_load: when the file gives no list, listening on loopback fills
     * in localhost, 127.0.0.1 and ::1 (so a rebound name is refused), anything else fills in
     * "*" (allow all; the operator is expected to list real names). Entries are lower case.
     * allowed_hosts: host names or addresses, IPv6 without brackets, no port (the port of the
     *   Host header is not compared: the socket already fixed it). "*" allows any.
     * allowed_origins: "*" (any); a bare host ("localhost", "::1": any http or https origin on
     *   that host, any port); a full origin "scheme://host[:port]" (exact, default ports
     *   80/443 implied); "null" (the literal Origin: null of sandboxed pages). */
    char **allowed_hosts;
    size_t n_allowed_hosts;
    char **allowed_origins;
    size_t n_allowed_origins;

    bool forward_other_paths; /* other paths than upstream_path: plain reverse proxy (true) */
    cors_mode_t cors;         /* CORS headers on answers the gateway writes (mirror) */
    bool status_tool;         /* tools/list offers idemgw_call_status, answered by the gateway */
    http_url_t otlp;          /* OTLP/HTTP traces go here (otlp_endpoint); url NULL: off */
    double otlp_sample_ratio; /* traces the gateway starts that are sampled, 0 to 1 (1) */
    uint64_t dup_harness_ms;  /* duplicates.harness_within (dupsource.h) */
    uint64_t dup_model_ms;    /* duplicates.model_within */

    int log_level; /* log_level_t */

    char *admin_token_file;    /* the operator API's bearer tokens (admin_keys.h); NULL: off */
    char *alerts_webhook_url;  /* alerts.webhook_url: POSTed when a key becomes unknown */
    int alerts_webhook_format; /* alerts.webhook_format: 0 JSON, 1 Slack-compatible */
    uint64_t alerts_webhook_timeout_ms; /* alerts.webhook_timeout: each attempt's (5 s) */

    subject_conf_t subject;
    policy_t policy;

    /* servers: {NAME: {path, upstream, tools, defaults, cors}}: several MCP servers behind one
     * gateway. Each entry is a view: a config_t whose own fields are the ones below and its
     * upstream, policy and cors, every other field the top level's (the same pointers, owned
     * by the top level and refreshed with it). n_servers 0: the top-level upstream is the one
     * server, at its own path. */
    struct config **servers;
    size_t n_servers;
    const struct config *parent; /* a view's top level; NULL at the top level */
    char *server_name;           /* a view's name (servers' key); NULL at the top level */
    char *agent_path;            /* a view's path, where agents connect; NULL: upstream_path */
    char *agent_prefix;          /* its other paths are relayed under this prefix ("" none) */
    int server_line;             /* where the view's entry is in the file */
} config_t;

/* How many servers the gateway fronts (1 without servers:). */
static inline size_t config_n_servers(const config_t *c)
{
    return c->n_servers ? c->n_servers : 1;
}

/* Server i: a view of servers:, or the top level itself without servers:. */
static inline config_t *config_server(const config_t *c, size_t i)
{
    return c->n_servers ? c->servers[i] : (config_t *)c;
}

/* Where agents reach a server's MCP endpoint. */
static inline const char *config_agent_path(const config_t *c)
{
    return c->agent_path ? c->agent_path : c->upstream_path;
}

/* Whether some server's policy needs the store (policy_needs_store). */
bool config_needs_store(const config_t *c);

/* The view named name, or NULL. */
config_t *config_server_named(const config_t *c, const char *name);

/* Error list filled by config_load: each entry is "file:line: message" (or "env NAME: ..."). */
typedef struct config_errors {
    char **msgs;
    size_t n;
} config_errors_t;

void config_errors_free(config_errors_t *e);
/* Appends one formatted message (used by the loader; exposed for --check-config output). */
void config_errors_add(config_errors_t *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Loads path (may be NULL: environment only), then applies IDEMGW_* overrides (LISTEN,
 * ADMIN_LISTEN, UPSTREAM, DATABASE_URL, LOG_LEVEL; an empty variable counts as unset). Returns
 * the config, or NULL with errs filled (errs may be NULL). File errors come in line order, then
 * environment errors. The environment is read with getenv. */
config_t *config_load(const char *path, config_errors_t *errs) MUST_CHECK;
/* Same from a string (tests); name is used in messages as the file name. */
config_t *config_load_string(const char *name, const char *yaml, config_errors_t *errs) MUST_CHECK;
void config_free(config_t *c);

/* What a reload (SIGHUP) does with a key of the file. The key tables of config_yaml.c give
 * every key one of these; test_config checks that none is left unclassified. */
typedef enum {
    CONFIG_KEY_UNCLASSIFIED = 0, /* a table entry that forgot to say: a bug */
    CONFIG_KEY_RELOADABLE,       /* the reload takes the new value */
    CONFIG_KEY_RESTART_ONLY,     /* used once at start: a reload keeps the running value */
} config_key_reload_t;

/* Calls fn for every key of the file, sections walked ("store.pool"). The per-tool keys are
 * part of the policy and appear as "defaults" and "tools". */
typedef void (*config_key_fn)(const char *name, config_key_reload_t reload, void *arg);
void config_keys_each(config_key_fn fn, void *arg);

/* Called with the name of a restart-only key a reload would have changed ("store.pool",
 * "database_url"). Only the name: a value may hold a password. */
typedef void (*config_restart_fn)(const char *name, void *arg);

/* Prepares next, a freshly loaded config, to replace running: every restart-only key whose
 * value differs is reported (report may be NULL) and gets running's value back in next, so
 * next describes what the process actually runs with. Reloadable keys keep next's values.
 * Returns how many keys were carried over. running is not changed. */
int config_reload_merge(const config_t *running, config_t *next, config_restart_fn report,
                        void *arg);

/* Parses "host:port", "[v6]:port" or ":port" (all IPv4 interfaces: host "0.0.0.0"; write
 * "[::]:port" for IPv6). Port 1-65535. 0 or -1; on success out->host is allocated (free it),
 * on failure out is untouched. */
int config_parse_host_port(const char *s, host_port_t *out);

/* Makes c's upstream the stdio server argv (NULL-terminated, copied) with the default settings,
 * replacing a URL upstream: what `idemgw stdio -- CMD ARGS` does. */
void config_set_upstream_command(config_t *c, char *const *argv);

/* Whether two stdio upstreams are the same command with the same settings. */
bool config_stdio_same(const stdio_conf_t *a, const stdio_conf_t *b);

/* Parses an http(s) URL into out (free with config_http_url_free); NULL, or what is wrong. */
const char *config_parse_http_url(const char *url, http_url_t *out);
void config_http_url_free(http_url_t *u);

/* true when host names the loopback interface: localhost, 127.0.0.0/8, ::1. */
bool config_host_is_loopback(const char *host);

/* Host header check against allowed_hosts (port ignored, case-insensitive, one trailing dot
 * ignored). NULL or malformed is refused unless "*" is listed. */
bool config_host_allowed(const config_t *c, const char *host_header);
/* Origin header check against allowed_origins. NULL (no Origin: not a browser) is allowed. */
bool config_origin_allowed(const config_t *c, const char *origin);

#endif
