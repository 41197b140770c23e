/* Unit tests for config.c / config_yaml.c: the reference file, good and bad files under
 * tests/data/config/, environment overrides, addresses, URLs, Host / Origin checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "config.h"
#include "store_open.h"
#include "jwt.h"
#include "log.h"
#include "peer_cert.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const env_vars[] = {
    "IDEMGW_LISTEN",       "IDEMGW_ADMIN_LISTEN", "IDEMGW_UPSTREAM",
    "IDEMGW_DATABASE_URL", "IDEMGW_LOG_LEVEL",    "PGHOST",
    "PGDATABASE",          "PGSERVICE",           "STATE_DIRECTORY",
    "XDG_STATE_HOME",
};

/* HOME in every test: the embedded store's default file is under it. */
#define TEST_HOME "/home/tester"
#define TEST_HOME_DEFAULT_FILE TEST_HOME "/.local/state/idemgw/idemgw-keys.db"

/* Every test starts from a clean environment so the developer's own PG* variables do not leak
 * into the results. */
static int clear_env(void **state)
{
    for (size_t i = 0; i < ARRAY_LEN(env_vars); i++)
        unsetenv(env_vars[i]);
    setenv("HOME", TEST_HOME, 1);
    return 0;
}

static void print_errs(const config_errors_t *e)
{
    for (size_t i = 0; i < e->n; i++)
        print_message("  error: %s\n", e->msgs[i]);
}

static config_t *must_load(const char *path)
{
    config_errors_t errs = {0};
    config_t *c = config_load(path, &errs);
    if (!c) {
        print_errs(&errs);
        fail_msg("%s did not load", path);
    }
    assert_int_equal(errs.n, 0);
    config_errors_free(&errs);
    return c;
}

static config_t *must_load_str(const char *yaml)
{
    config_errors_t errs = {0};
    config_t *c = config_load_string("t.yaml", yaml, &errs);
    if (!c) {
        print_errs(&errs);
        fail_msg("string did not load:\n%s", yaml);
    }
    config_errors_free(&errs);
    return c;
}

/* Loads yaml expecting exactly one error equal to want. */
static void expect_one_error(const char *yaml, const char *want)
{
    config_errors_t errs = {0};
    config_t *c = config_load_string("t.yaml", yaml, &errs);
    if (c || errs.n != 1 || strcmp(errs.msgs[0], want) != 0) {
        print_errs(&errs);
        fail_msg("want exactly: %s", want);
    }
    config_errors_free(&errs);
}

static void test_reference_conf(void **state)
{
    config_t *c = must_load("conf/idemgw.yaml");
    assert_string_equal(c->path, "conf/idemgw.yaml");
    assert_string_equal(c->listen.host, "127.0.0.1");
    assert_int_equal(c->listen.port, 8080);
    assert_string_equal(c->admin_listen.host, "127.0.0.1");
    assert_int_equal(c->admin_listen.port, 8081);
    assert_string_equal(c->upstream_url, "http://127.0.0.1:3001/mcp");
    assert_false(c->upstream_tls);
    assert_string_equal(c->upstream.host, "127.0.0.1");
    assert_int_equal(c->upstream.port, 3001);
    assert_string_equal(c->upstream_path, "/mcp");
    assert_string_equal(c->upstream_host_header, "127.0.0.1:3001");
    assert_null(c->database_url);
    /* nothing names a database: the embedded store, under HOME (never the working directory) */
    assert_true(c->store_enabled);
    assert_string_equal(store_backend_for(c->store_kind)->name, "sqlite");
    assert_string_equal(c->store_target, TEST_HOME_DEFAULT_FILE);
    assert_true(c->migrate);
    assert_int_equal(c->store_pool, 4);
    assert_int_equal(c->sweep_interval_ms, 60000);
    assert_int_equal(c->cache_entries, 100000);
    assert_int_equal(c->cache_bytes, 64u << 20);
    assert_int_equal(c->client_header_timeout_ms, 10000);
    assert_int_equal(c->client_body_timeout_ms, 30000);
    assert_int_equal(c->client_idle_timeout_ms, 60000);
    assert_int_equal(c->upstream_connect_timeout_ms, 5000);
    assert_int_equal(c->upstream_timeout_ms, 60000);
    assert_int_equal(c->upstream_idle_timeout_ms, 300000);
    assert_int_equal(c->drain_timeout_ms, 30000);
    assert_int_equal(c->max_body_bytes, 4 << 20);
    assert_int_equal(c->max_header_bytes, 16 << 10);
    assert_int_equal(c->max_connections, 10000);
    assert_int_equal(c->upstream_pool, 64);
    assert_int_equal(c->n_allowed_hosts, 3);
    assert_string_equal(c->allowed_hosts[2], "::1");
    assert_int_equal(c->n_allowed_origins, 3);
    assert_int_equal(c->log_level, LOG_INFO);
    assert_int_equal(c->subject.kind, SUBJECT_HEADER);
    assert_string_equal(c->subject.value, "X-Subject");

    /* The defaults section repeats the built-in values. */
    policy_tool_t builtin;
    policy_defaults_init(&builtin);
    const policy_tool_t *d = &c->policy.defaults;
    assert_int_equal(d->cls, builtin.cls);
    assert_int_equal(d->window_ms, builtin.window_ms);
    assert_string_equal(d->key_arg, builtin.key_arg);
    assert_int_equal(d->n_exclude_args, 0);
    assert_int_equal(d->lease_ms, builtin.lease_ms);
    assert_int_equal(d->max_stored_bytes, builtin.max_stored_bytes);
    assert_int_equal(d->on_cancel, builtin.on_cancel);
    policy_tool_free(&builtin);

    assert_int_equal(c->policy.n_tools, 3);
    assert_int_equal(policy_lookup(&c->policy, "search_orders")->cls, TOOL_CLASS_READ);
    assert_int_equal(policy_lookup(&c->policy, "set_shipping_address")->cls, TOOL_CLASS_IDEMPOTENT);
    const policy_tool_t *t = policy_lookup(&c->policy, "issue_refund");
    assert_string_equal(t->name, "issue_refund");
    assert_int_equal(t->cls, TOOL_CLASS_NON_IDEMPOTENT);
    assert_int_equal(t->window_ms, 3600000);
    assert_int_equal(t->n_exclude_args, 2);
    assert_string_equal(t->exclude_args[0], "note");
    assert_string_equal(t->exclude_args[1], "meta.client_ts");
    assert_int_equal(t->wait_ms, 5000);
    assert_int_equal(t->lease_ms, 90000);
    assert_true(t->forward_key);
    assert_true(t->line > 0);
    assert_ptr_equal(policy_lookup(&c->policy, "not_listed"), &c->policy.defaults);
    config_free(c);
}

static void test_minimal(void **state)
{
    config_t *c = must_load("tests/data/config/good/minimal.yaml");
    assert_string_equal(c->listen.host, "127.0.0.1");
    assert_int_equal(c->listen.port, 8080);
    assert_int_equal(c->subject.kind, SUBJECT_DEFAULT);
    assert_null(c->subject.value);
    assert_int_equal(c->policy.n_tools, 0);
    assert_int_equal(c->policy.defaults.cls, TOOL_CLASS_NON_IDEMPOTENT);
    assert_int_equal(c->store_commit_delay_ms, 0); /* off unless asked for */
    assert_true(config_host_allowed(c, "localhost:8080"));
    assert_false(config_host_allowed(c, "evil.example.com"));
    config_free(c);
}

static void test_flow_json(void **state)
{
    config_t *c = must_load("tests/data/config/good/flow.json");
    assert_string_equal(c->listen.host, "::1");
    assert_int_equal(c->listen.port, 9000);
    assert_true(c->upstream_tls);
    assert_string_equal(c->upstream.host, "mcp.example.com");
    assert_int_equal(c->upstream.port, 443);
    assert_string_equal(c->upstream_path, "/");
    assert_string_equal(c->upstream_host_header, "mcp.example.com:443");
    assert_string_equal(c->database_url, "postgresql://idemgw@db/idemgw");
    assert_true(c->store_enabled);
    assert_false(c->migrate);
    assert_int_equal(c->store_pool, 8);
    assert_int_equal(c->sweep_interval_ms, 300000);
    assert_int_equal(c->cache_entries, 0);
    assert_int_equal(c->cache_bytes, 1u << 20);
    assert_int_equal(c->upstream_timeout_ms, 120000);
    assert_int_equal(c->drain_timeout_ms, 60000);
    assert_int_equal(c->client_idle_timeout_ms, 60000); /* untouched default */
    assert_int_equal(c->max_body_bytes, 1 << 20);
    assert_int_equal(c->max_header_bytes, 8 << 10);
    assert_int_equal(c->max_connections, 100);
    assert_int_equal(c->upstream_pool, 0);
    assert_int_equal(c->log_level, LOG_DEBUG);
    assert_int_equal(c->subject.kind, SUBJECT_BEARER_SHA256);
    assert_null(c->subject.value);
    assert_int_equal(c->policy.defaults.cls, TOOL_CLASS_READ);
    const policy_tool_t *t = policy_lookup(&c->policy, "charge");
    assert_int_equal(t->cls, TOOL_CLASS_NON_IDEMPOTENT);
    assert_int_equal(t->wait_ms, 250);
    /* ::1 is loopback: the lists default to the loopback names. */
    assert_true(config_host_allowed(c, "[::1]:9000"));
    assert_false(config_host_allowed(c, "example.com"));
    config_free(c);
}

static void test_inherit(void **state)
{
    config_t *c = must_load("tests/data/config/good/inherit.yaml");
    const policy_tool_t *d = &c->policy.defaults;
    assert_int_equal(d->window_ms, 1800000);
    assert_int_equal(d->line, 14);
    assert_int_equal(d->on_cancel, ON_CANCEL_FORWARD);
    assert_int_equal(c->policy.n_tools, 4);

    const policy_tool_t *t = policy_lookup(&c->policy, "send_email");
    assert_int_equal(t->line, 5);
    assert_int_equal(t->window_ms, 3600000); /* own */
    assert_int_equal(t->n_exclude_args, 2);  /* inherited */
    assert_string_equal(t->exclude_args[0], "meta.client_ts");
    assert_int_equal(t->on_tool_error, ON_TOOL_ERROR_STORE);
    assert_true(t->forward_key);
    assert_int_equal(t->lease_ms, 300000);
    assert_int_equal(t->wait_ms, 10000);
    assert_string_equal(t->key_arg, "idempotency_key");
    assert_int_equal(t->on_cancel, ON_CANCEL_FORWARD); /* inherited */

    t = policy_lookup(&c->policy, "create_ticket");
    assert_int_equal(t->on_cancel, ON_CANCEL_FINISH); /* own */
    assert_int_equal(t->window_ms, 1800000);
    assert_int_equal(t->n_exclude_args, 0); /* replaced by [] */
    assert_int_equal(t->on_tool_error, ON_TOOL_ERROR_RELEASE);

    t = policy_lookup(&c->policy, "search");
    assert_int_equal(t->cls, TOOL_CLASS_READ);
    assert_int_equal(t->window_ms, 1800000);

    t = policy_lookup(&c->policy, "empty_tool");
    assert_string_equal(t->name, "empty_tool");
    assert_int_equal(t->window_ms, 1800000);

    assert_int_equal(c->subject.kind, SUBJECT_STATIC);
    assert_string_equal(c->subject.value, "tenant-a");
    config_free(c);
}

static void test_public_and_lists(void **state)
{
    config_t *c = must_load("tests/data/config/good/public.yaml");
    assert_string_equal(c->listen.host, "0.0.0.0");
    assert_int_equal(c->listen.port, 8080);
    assert_int_equal(c->n_allowed_hosts, 1);
    assert_string_equal(c->allowed_hosts[0], "*");
    assert_string_equal(c->allowed_origins[0], "*");
    assert_true(config_host_allowed(c, "anything.example:1"));
    assert_true(config_host_allowed(c, NULL));
    assert_true(config_origin_allowed(c, "https://evil.example"));
    assert_string_equal(c->upstream_host_header, "mcp:3001");
    config_free(c);

    c = must_load("tests/data/config/good/lists.yaml");
    assert_int_equal(c->n_allowed_hosts, 4);
    assert_string_equal(c->allowed_hosts[0], "gateway.example.com");
    assert_string_equal(c->allowed_hosts[1], "2001:db8::1");
    assert_string_equal(c->upstream_host_header, "10.0.0.5:80");
    config_free(c);
}

static const struct bad_case {
    const char *name;
    int line;
    const char *msg; /* substring of the message after "file:line: "; "" = any */
} bad_cases[] = {
    {"unknown_key_top", 3, "unknown key 'foo' (allowed: listen, admin_listen,"},
    {"unknown_key_tool", 6, "unknown key 'foo' in tools.bar (allowed: class, window,"},
    {"unknown_key_section", 4, "unknown key 'upstrem' in timeouts (allowed: client_header,"},
    {"unknown_key_defaults", 4, "unknown key 'clas' in defaults"},
    {"bad_duration", 4,
     "timeouts.client_idle: bad duration '5x' (a whole number with unit ms, s, m, h or d"},
    {"duration_negative", 4, "defaults.window: bad duration '-5s'"},
    {"duration_overflow", 4, "defaults.window: bad duration '99999999999999999999d'"},
    {"duration_fraction", 4, "timeouts.drain: bad duration '1.5s'"},
    {"duration_zero", 4, "timeouts.upstream: 0s is out of range (1ms to 1d)"},
    {"duration_empty", 4, "timeouts.drain: bad duration ''"},
    {"bad_size", 4, "limits.max_body: bad size '4XB'"},
    {"size_range", 4, "limits.max_header: 10 is out of range (1KiB to 1MiB)"},
    {"size_overflow", 5, "tools.t.max_stored_bytes: bad size '99999999999GiB'"},
    {"bad_class", 5,
     "tools.refund.class: unknown value 'readonly' (allowed: read, idempotent, non_idempotent)"},
    {"bad_on_tool_error", 4,
     "defaults.on_tool_error: unknown value 'keep' (allowed: release, store)"},
    {"bad_on_ambiguous", 5, "tools.t.on_ambiguous: unknown value 'retry' (allowed: hold, release)"},
    {"bad_on_cancel", 5, "tools.t.on_cancel: unknown value 'abort' (allowed: finish, forward)"},
    {"bad_on_store_down", 5,
     "tools.t.on_store_down: unknown value 'allow' (allowed: reject, passthrough)"},
    {"bad_in_progress", 5,
     "tools.t.in_progress: unknown value 'wait' (allowed: reject, {wait: DURATION})"},
    {"bad_in_progress_key", 5, "unknown key 'wiat' in tools.t.in_progress (allowed: wait)"},
    {"bad_in_progress_wait", 6, "tools.t.in_progress.wait: 2h is out of range (1ms to 1h)"},
    {"lease_short", 7, "tools.t.lease: 10s is shorter than timeouts.upstream (1m)"},
    {"lease_short_defaults_first", 4, "defaults.lease: 2m is shorter than timeouts.upstream (5m)"},
    {"bad_bool", 3, "migrate: expected true or false, got 'yes'"},
    {"bad_int", 4, "store.pool: expected an integer from 1 to 256, got 'four'"},
    {"int_range", 4, "store.pool: expected an integer from 1 to 256, got '0'"},
    {"int_negative", 4, "limits.upstream_pool: expected an integer from 0 to 100000, got '-1'"},
    {"section_not_map", 3, "timeouts: expected a mapping, got a scalar"},
    {"list_not_list", 3, "allowed_hosts: expected a list, got a scalar"},
    {"scalar_got_list", 3, "listen: expected host:port, got a list"},
    {"scalar_got_null", 3, "admin_listen: expected host:port, got nothing"},
    {"bad_listen", 3, "listen: bad address '127.0.0.1' (expected host:port, [v6]:port or :port)"},
    {"bad_port", 3, "admin_listen: bad address '127.0.0.1:70000'"},
    {"bad_v6_listen", 3, "listen: bad address '::1:8080'"},
    {"upstream_scheme", 2,
     "upstream: bad URL 'ftp://127.0.0.1/mcp': must start with http:// or https://"},
    {"upstream_no_path", 2, "upstream: bad URL 'http://127.0.0.1:3001': needs a path"},
    {"upstream_query", 2, "query strings and fragments are not supported"},
    {"upstream_userinfo", 2, "credentials in the URL are not supported"},
    {"upstream_port", 2, "port must be 1-65535"},
    {"upstream_missing", 1, "upstream is required"},
    {"subject_two_keys", 6,
     "subject: give only one of header, bearer, static, jwt (client_cert may be added to jwt, "
     "header or bearer)"},
    {"subject_bearer", 3, "subject.bearer: unknown value 'md5' (allowed: sha256)"},
    {"subject_header_bad", 4, "subject.header: 'X Subject' is not a valid header name"},
    {"subject_authorization", 4,
     "subject.header: Authorization carries a credential; use 'bearer: sha256' instead"},
    {"subject_empty", 3, "subject: give one of header, bearer, static, jwt"},
    {"subject_unknown", 4,
     "unknown key 'mtls' in subject (allowed: header, bearer, static, jwt, client_cert)"},
    {"subject_static_space", 4,
     "subject.static: must be 1-256 printable ASCII characters without spaces"},
    {"allowed_host_port", 5, "allowed_hosts[1]: 'localhost:8080': give the host without a port"},
    {"allowed_hosts_empty", 3,
     "allowed_hosts: the list is empty (leave the key out for the default)"},
    {"allowed_host_bad", 3, "allowed_hosts[0]: 'exa mple.com': not a host name or address"},
    {"allowed_origin_path", 4, "allowed_origins[0]: 'http://localhost:8080/app': not an origin"},
    {"allowed_origin_scheme", 3, "allowed_origins[0]: 'ftp://localhost': not an origin"},
    {"log_level", 4, "log.level: unknown value 'verbose' (allowed: debug, info, warn, error, off)"},
    {"exclude_bad", 5, "tools.t.exclude_args[1]: 'a..b' is not a dotted argument path"},
    {"exclude_not_string", 6, "defaults.exclude_args[1]: expected a string, got a mapping"},
    {"key_arg_empty", 4, "defaults.key_arg: must not be empty"},
    {"tool_not_map", 4, "tools.t: expected a mapping, got a scalar"},
    {"tools_not_map", 3, "tools: expected a mapping of tool names, got a list"},
    {"tool_name_space", 4, "tools: 'issue refund' is not a tool name"},
    {"alias", 5, "timeouts.drain: anchors and aliases are not supported"},
    {"merge_key", 7, "unknown key '<<' in tools.t"},
    {"nul_byte", 3, "database_url: contains a NUL byte"},
    {"syntax_bracket", 5, "flow sequence without a closing bracket"},
    {"duplicate_key", 4, "duplicate key"},
    {"two_documents", 4, "only one YAML document is allowed"},
    {"top_level_list", 2, "top level must be a mapping of settings, got a list"},
    {"key_not_scalar", 3, "top level: expected a key, got a list"},
    {"invalid_utf8", 3, "invalid UTF-8 (byte 0x90): the file must be UTF-8 text"},
    {"nul_in_file", 3, "NUL byte (byte 0x00): the file must be UTF-8 text"},
    {"tab_indent", 4, ""},
};

static void test_bad_files(void **state)
{
    char path[256], prefix[300];
    for (size_t i = 0; i < ARRAY_LEN(bad_cases); i++) {
        const struct bad_case *b = &bad_cases[i];
        config_errors_t errs = {0};
        snprintf(path, sizeof(path), "tests/data/config/bad/%s.yaml", b->name);
        snprintf(prefix, sizeof(prefix), "%s:%d: ", path, b->line);
        config_t *c = config_load(path, &errs);
        bool ok = !c && errs.n == 1 && strncmp(errs.msgs[0], prefix, strlen(prefix)) == 0 &&
                  strstr(errs.msgs[0] + strlen(prefix), b->msg);
        if (!ok) {
            print_errs(&errs);
            config_free(c);
            fail_msg("%s: want one error '%s%s'", b->name, prefix, b->msg);
        }
        config_errors_free(&errs);
    }
}

static void test_exact_messages(void **state)
{
    expect_one_error("upstream: http://h/mcp\ntools:\n  bar:\n    foo: 1\n",
                     "t.yaml:4: unknown key 'foo' in tools.bar (allowed: class, window, "
                     "exclude_args, key_arg, on_tool_error, on_ambiguous, in_progress, lease, "
                     "max_stored_bytes, forward_key, on_store_down, on_cancel, advertise_key, "
                     "answer_after)");
    expect_one_error("upstream: http://h/mcp\ntimeouts: {upstream: 10x}\n",
                     "t.yaml:2: timeouts.upstream: bad duration '10x' (a whole number with unit "
                     "ms, s, m, h or d, e.g. 250ms, 90s, 10m)");
    expect_one_error("upstream: http://h/mcp\nstore: {commit_delay: 1s}\n",
                     "t.yaml:2: store.commit_delay: 1s is out of range (0ms to 100ms)");
    expect_one_error("upstream: http://h/mcp\nlimits:\n  max_body: 2GiB\n",
                     "t.yaml:3: limits.max_body: 2GiB is out of range (1KiB to 1GiB)");
    expect_one_error("upstream: http://h/mcp\ndefaults: {class: write}\n",
                     "t.yaml:2: defaults.class: unknown value 'write' (allowed: read, "
                     "idempotent, non_idempotent)");
    expect_one_error("upstream: http://h/mcp\nmigrate: 1\n",
                     "t.yaml:2: migrate: expected true or false, got '1'");
    expect_one_error("upstream: http://h/mcp\notlp_sample_ratio: 1.5\n",
                     "t.yaml:2: otlp_sample_ratio: '1.5' is not a number from 0 to 1");
    expect_one_error("upstream: http://h/mcp\notlp_sample_ratio: half\n",
                     "t.yaml:2: otlp_sample_ratio: 'half' is not a number from 0 to 1");
    expect_one_error("listen: 127.0.0.1:1\n",
                     "t.yaml:1: upstream is required (or set IDEMGW_UPSTREAM)");
    expect_one_error("", "t.yaml:1: upstream is required (or set IDEMGW_UPSTREAM)");
    /* listen_tls: what a working TLS listener needs, said before anything starts */
    expect_one_error("upstream: http://h/mcp\nlisten_tls: {cert_file: conf/idemgw.yaml}\n",
                     "t.yaml:2: listen_tls: cert_file and key_file are required");
    expect_one_error("upstream: http://h/mcp\nlisten_tls: {cert_file: conf/idemgw.yaml, "
                     "key_file: conf/idemgw.yaml, client_cert: required}\n",
                     "t.yaml:2: listen_tls: client_cert needs client_ca_file (the CAs that verify "
                     "them)");
    expect_one_error("upstream: http://h/mcp\nsubject: {client_cert: spiffe}\n",
                     "t.yaml:2: subject.client_cert: needs listen_tls with client_ca_file (the "
                     "CAs that verify the agents' certificates)");
    /* listen_tls read after subject in the file: the same */
    expect_one_error("upstream: http://h/mcp\nsubject:\n  client_cert: cn\nlisten_tls: "
                     "{cert_file: conf/idemgw.yaml, key_file: conf/idemgw.yaml}\n",
                     "t.yaml:3: subject.client_cert: needs listen_tls with client_ca_file (the "
                     "CAs that verify the agents' certificates)");
    expect_one_error("upstream: http://h/mcp\nlisten_tls: on\n",
                     "t.yaml:2: listen_tls: expected a mapping (cert_file, key_file, "
                     "client_ca_file, ...)");
}

/* Errors are all collected, and reported in line order even though sections are read in
 * dependency order (timeouts, then defaults, then tools). */
static void test_many_errors(void **state)
{
    const char *yaml = "tools:\n"                   /* 1 */
                       "  a: {class: x}\n"          /* 2 */
                       "defaults:\n"                /* 3 */
                       "  window: 0s\n"             /* 4 */
                       "upstream: ftp://x/\n"       /* 5 */
                       "timeouts: {drain: never}\n" /* 6 */
                       "bogus: 1\n";                /* 7 */
    config_errors_t errs = {0};
    setenv("IDEMGW_LOG_LEVEL", "loud", 1);
    config_t *c = config_load_string("m.yaml", yaml, &errs);
    assert_null(c);
    if (errs.n != 6)
        print_errs(&errs);
    assert_int_equal(errs.n, 6);
    assert_true(strncmp(errs.msgs[0], "m.yaml:2: tools.a.class:", 24) == 0);
    assert_true(strncmp(errs.msgs[1], "m.yaml:4: defaults.window: 0s is out of range", 45) == 0);
    assert_true(strncmp(errs.msgs[2], "m.yaml:5: upstream: bad URL", 27) == 0);
    assert_true(strncmp(errs.msgs[3], "m.yaml:6: timeouts.drain: bad duration", 38) == 0);
    assert_true(strncmp(errs.msgs[4], "m.yaml:7: unknown key 'bogus'", 29) == 0);
    assert_string_equal(errs.msgs[5], "env IDEMGW_LOG_LEVEL: unknown level 'loud' (allowed: "
                                      "debug, info, warn, error, off)");
    config_errors_free(&errs);
    config_errors_free(&errs);
    /* A NULL error list is allowed. */
    assert_null(config_load_string("m.yaml", yaml, NULL));
}

static void test_env_overrides(void **state)
{
    setenv("IDEMGW_LISTEN", "0.0.0.0:9999", 1);
    setenv("IDEMGW_ADMIN_LISTEN", "[::1]:9998", 1);
    setenv("IDEMGW_UPSTREAM", "https://[fe80::1%eth0]:8443/x/mcp", 1);
    setenv("IDEMGW_DATABASE_URL", "postgresql:///idemgw", 1);
    setenv("IDEMGW_LOG_LEVEL", "warn", 1);
    config_t *c = must_load("conf/idemgw.yaml");
    assert_string_equal(c->listen.host, "0.0.0.0");
    assert_int_equal(c->listen.port, 9999);
    assert_string_equal(c->admin_listen.host, "::1");
    assert_int_equal(c->admin_listen.port, 9998);
    assert_true(c->upstream_tls);
    assert_string_equal(c->upstream.host, "fe80::1%eth0");
    assert_int_equal(c->upstream.port, 8443);
    assert_string_equal(c->upstream_path, "/x/mcp");
    assert_string_equal(c->upstream_host_header, "[fe80::1%eth0]:8443");
    assert_string_equal(c->database_url, "postgresql:///idemgw");
    assert_true(c->store_enabled);
    assert_int_equal(c->log_level, LOG_WARN);
    /* The file lists allowed_hosts, so the non-loopback listen does not widen them. */
    assert_int_equal(c->n_allowed_hosts, 3);
    config_free(c);

    /* An empty variable counts as unset. */
    clear_env(NULL);
    setenv("IDEMGW_LISTEN", "", 1);
    c = must_load("conf/idemgw.yaml");
    assert_int_equal(c->listen.port, 8080);
    config_free(c);
}

static void test_env_only(void **state)
{
    config_errors_t errs = {0};
    assert_null(config_load(NULL, &errs));
    assert_int_equal(errs.n, 1);
    assert_string_equal(errs.msgs[0], "upstream is required");
    config_errors_free(&errs);

    setenv("IDEMGW_UPSTREAM", "http://127.0.0.1:3001/mcp", 1);
    config_t *c = must_load(NULL);
    assert_null(c->path);
    assert_string_equal(c->upstream_path, "/mcp");
    assert_string_equal(store_backend_for(c->store_kind)->name, "sqlite");
    assert_int_equal(c->subject.kind, SUBJECT_DEFAULT);
    assert_int_equal(c->n_allowed_hosts, 3);
    config_free(c);

    setenv("IDEMGW_UPSTREAM", "127.0.0.1:3001", 1);
    setenv("IDEMGW_LISTEN", "localhost", 1);
    setenv("IDEMGW_ADMIN_LISTEN", "[::1:9", 1);
    assert_null(config_load(NULL, &errs));
    if (errs.n != 3)
        print_errs(&errs);
    assert_int_equal(errs.n, 3);
    assert_string_equal(errs.msgs[0], "env IDEMGW_LISTEN: bad address 'localhost' (expected "
                                      "host:port, [v6]:port or :port)");
    assert_string_equal(errs.msgs[1], "env IDEMGW_ADMIN_LISTEN: bad address '[::1:9' "
                                      "(expected host:port, [v6]:port or :port)");
    assert_string_equal(errs.msgs[2], "env IDEMGW_UPSTREAM: bad URL '127.0.0.1:3001': must "
                                      "start with http:// or https://");
    config_errors_free(&errs);
}

static void test_store_enabled(void **state)
{
    static const char *const vars[] = {"PGHOST", "PGDATABASE", "PGSERVICE"};
    for (size_t i = 0; i < ARRAY_LEN(vars); i++) {
        clear_env(NULL);
        setenv(vars[i], "x", 1);
        config_t *c = must_load_str("upstream: http://h/mcp\n");
        assert_true(c->store_enabled);
        assert_string_equal(store_backend_for(c->store_kind)->name, "postgres");
        assert_null(c->database_url);
        config_free(c);
    }
    clear_env(NULL);
    setenv("PGUSER", "x", 1); /* not enough to mean "a database is configured" */
    config_t *c = must_load_str("upstream: http://h/mcp\n");
    assert_string_equal(store_backend_for(c->store_kind)->name, "sqlite");
    assert_string_equal(c->store_target, TEST_HOME_DEFAULT_FILE);
    assert_true(c->otlp_sample_ratio == 1.0); /* every trace, unless told otherwise */
    config_free(c);
    unsetenv("PGUSER");
    c = must_load_str("upstream: http://h/mcp\notlp_sample_ratio: 0.25\n");
    assert_true(c->otlp_sample_ratio == 0.25);
    config_free(c);
    c = must_load_str("upstream: http://h/mcp\ndatabase_url: 'host=/tmp dbname=x'\n");
    assert_true(c->store_enabled);
    assert_string_equal(store_backend_for(c->store_kind)->name, "postgres");
    assert_string_equal(c->database_url, "host=/tmp dbname=x");
    config_free(c);
}

/* sqlite:PATH and none name the store; with nothing named, systemd's STATE_DIRECTORY holds the
 * default file. One process per file: several workers need Postgres. */
static void test_store_kinds(void **state)
{
    config_t *c = must_load_str("upstream: http://h/mcp\ndatabase_url: sqlite:/var/lib/k.db\n");
    assert_string_equal(store_backend_for(c->store_kind)->name, "sqlite");
    assert_string_equal(c->store_target, "/var/lib/k.db");
    config_free(c);
    c = must_load_str("upstream: http://h/mcp\ndatabase_url: none\n");
    assert_int_equal(c->store_kind, STORE_URL_NONE);
    assert_false(c->store_enabled);
    assert_null(c->store_target);
    config_free(c);
    /* none wins over the PG* environment too */
    setenv("PGHOST", "db", 1);
    c = must_load_str("upstream: http://h/mcp\ndatabase_url: none\n");
    assert_false(c->store_enabled);
    config_free(c);
    unsetenv("PGHOST");

    setenv("STATE_DIRECTORY", "/var/lib/idemgw:/var/lib/other", 1);
    c = must_load_str("upstream: http://h/mcp\n");
    assert_string_equal(c->store_target, "/var/lib/idemgw/idemgw-keys.db");
    config_free(c);
    setenv("IDEMGW_DATABASE_URL", "sqlite:keys.db", 1);
    c = must_load_str("upstream: http://h/mcp\n");
    assert_string_equal(c->store_target, "keys.db");
    config_free(c);
    unsetenv("IDEMGW_DATABASE_URL");
    unsetenv("STATE_DIRECTORY");

    config_errors_t errs = {0};
    assert_null(config_load_string("w.yaml", "upstream: http://h/mcp\nworkers: 4\n", &errs));
    assert_int_equal(errs.n, 1);
    assert_non_null(strstr(
        errs.msgs[0], "w.yaml:2: workers: 4 with the embedded store (" TEST_HOME_DEFAULT_FILE ")"));
    assert_non_null(strstr(errs.msgs[0], "Postgres"));
    config_errors_free(&errs);
    assert_null(
        config_load_string("s.yaml", "upstream: http://h/mcp\ndatabase_url: 'sqlite:'\n", &errs));
    assert_int_equal(errs.n, 1);
    assert_string_equal(errs.msgs[0], "s.yaml:2: database_url: sqlite: needs a file (sqlite:PATH)");
    config_errors_free(&errs);
    c = must_load_str("upstream: http://h/mcp\nworkers: 4\ndatabase_url: none\n");
    assert_int_equal(c->workers, 4);
    config_free(c);
    c = must_load_str("upstream: http://h/mcp\nworkers: 4\ndatabase_url: postgresql:///x\n");
    assert_string_equal(store_backend_for(c->store_kind)->name, "postgres");
    config_free(c);
}

/* The embedded store's default file for each environment: systemd's STATE_DIRECTORY (its first
 * folder), else an absolute XDG_STATE_HOME, else HOME; never the working directory. With none
 * of them, the start is refused, saying how to name a file. */
static void test_store_default_path(void **state)
{
    static const struct {
        const char *state_dir, *xdg, *home; /* NULL: unset */
        const char *want;                   /* NULL: no default */
    } cases[] = {
        {"/var/lib/idemgw", "/x", "/h", "/var/lib/idemgw/idemgw-keys.db"},
        {"/var/lib/a:/var/lib/b", NULL, NULL, "/var/lib/a/idemgw-keys.db"},
        {"", "/x/state", "/h", "/x/state/idemgw/idemgw-keys.db"},
        {NULL, "/x/state", NULL, "/x/state/idemgw/idemgw-keys.db"},
        {NULL, "relative/state", "/h", "/h/.local/state/idemgw/idemgw-keys.db"},
        {NULL, "", "/h", "/h/.local/state/idemgw/idemgw-keys.db"},
        {NULL, NULL, "/h", "/h/.local/state/idemgw/idemgw-keys.db"},
        {NULL, NULL, NULL, NULL},
        {"", "", "", NULL},
    };
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        const char *names[] = {"STATE_DIRECTORY", "XDG_STATE_HOME", "HOME"};
        const char *vals[] = {cases[i].state_dir, cases[i].xdg, cases[i].home};
        for (size_t v = 0; v < ARRAY_LEN(names); v++) {
            if (vals[v])
                setenv(names[v], vals[v], 1);
            else
                unsetenv(names[v]);
        }
        char *got = store_default_path();
        print_message("case %zu: %s\n", i, got ? got : "(none)");
        if (cases[i].want)
            assert_string_equal(got, cases[i].want);
        else
            assert_null(got);
        /* the gateway's choice is this one */
        char *path = NULL;
        assert_string_equal(store_choose(NULL, &path)->name, "sqlite");
        if (cases[i].want)
            assert_string_equal(path, cases[i].want);
        else
            assert_null(path);
        free(path);
        free(got);
    }

    unsetenv("STATE_DIRECTORY");
    unsetenv("XDG_STATE_HOME");
    unsetenv("HOME");
    config_errors_t errs = {0};
    assert_null(config_load_string("n.yaml", "upstream: http://h/mcp\n", &errs));
    assert_int_equal(errs.n, 1);
    assert_non_null(strstr(errs.msgs[0], "none of STATE_DIRECTORY, XDG_STATE_HOME, HOME is set"));
    assert_non_null(strstr(errs.msgs[0], "database_url: sqlite:PATH"));
    config_errors_free(&errs);
    /* a named file needs no default folder */
    config_t *c = must_load_str("upstream: http://h/mcp\ndatabase_url: sqlite:/k.db\n");
    assert_string_equal(c->store_target, "/k.db");
    config_free(c);
    setenv("HOME", TEST_HOME, 1);
}

/* store_choose: the table of backends, by database_url and the environment. */
static void test_store_choose(void **state)
{
    static const struct {
        const char *url;
        const char *backend; /* NULL: none */
        const char *target;
    } cases[] = {
        {"none", NULL, NULL},
        {"sqlite:/var/k.db", "sqlite", "/var/k.db"},
        {"sqlite:", "sqlite", NULL},
        {"postgresql:///x", "postgres", "postgresql:///x"},
        {"host=/tmp dbname=x", "postgres", "host=/tmp dbname=x"},
        {NULL, "sqlite", TEST_HOME_DEFAULT_FILE},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        char *target = (char *)"unset";
        const store_backend_t *b = store_choose(cases[i].url, &target);
        if (!cases[i].backend)
            assert_null(b);
        else
            assert_string_equal(b->name, cases[i].backend);
        if (!cases[i].target)
            assert_null(target);
        else
            assert_string_equal(target, cases[i].target);
        free(target);
    }
    setenv("PGSERVICE", "x", 1);
    char *target = NULL;
    const store_backend_t *b = store_choose(NULL, &target);
    assert_string_equal(b->name, "postgres");
    assert_null(target);
    unsetenv("PGSERVICE");
}

/* A Postgres database_url is read as libpq will read it: several hosts (a primary and its
 * standby) in either form, their ports paired up, and never a session that may be read-only. */
static void test_database_url_hosts(void **state)
{
    static const char *const good[] = {
        "postgresql://idemgw@db1:5432,db2:5433/idemgw?target_session_attrs=read-write",
        "postgresql://idemgw@db1,db2/idemgw",
        "postgresql://idemgw@db1:5432,db2/idemgw",
        "host=db1,db2 port=5432,5433 dbname=idemgw target_session_attrs=read-write",
        "host=db1,db2,db3 port=5432 dbname=idemgw",
        "host=db1,db2 hostaddr=10.0.0.1,10.0.0.2 dbname=idemgw",
        "dbname=idemgw",
    };
    char yaml[300];
    for (size_t i = 0; i < ARRAY_LEN(good); i++) {
        snprintf(yaml, sizeof(yaml), "upstream: http://h/mcp\ndatabase_url: '%s'\n", good[i]);
        config_t *c = must_load_str(yaml);
        assert_string_equal(store_backend_for(c->store_kind)->name, "postgres");
        assert_string_equal(c->database_url, good[i]);
        config_free(c);
    }
    expect_one_error("upstream: http://h/mcp\ndatabase_url: 'host=db1,db2 port=1,2,3'\n",
                     "t.yaml:2: database_url: 2 hosts and 3 ports: give one port for each host, or "
                     "a single port for all");
    expect_one_error("upstream: http://h/mcp\ndatabase_url: 'host=db1,db2 hostaddr=10.0.0.1'\n",
                     "t.yaml:2: database_url: 2 hosts and 1 hostaddr values: give one address for "
                     "each host");
    /* a session that may be read-only (a standby) would refuse every claim */
    expect_one_error(
        "upstream: http://h/mcp\n"
        "database_url: postgresql://db1,db2/idemgw?target_session_attrs=any\n",
        "t.yaml:2: database_url: target_session_attrs=any: the gateway writes every claim, so it "
        "only uses a server that accepts writes; leave it out or set read-write");
    expect_one_error("upstream: http://h/mcp\n"
                     "database_url: 'host=db1,db2 target_session_attrs=prefer-standby'\n",
                     "t.yaml:2: database_url: target_session_attrs=prefer-standby: the gateway "
                     "writes every claim, so it only uses a server that accepts writes; leave it "
                     "out or set read-write");
    /* what libpq cannot parse: a misspelt key is named, a value never quoted */
    expect_one_error("upstream: http://h/mcp\ndatabase_url: 'hots=db1,db2 dbname=idemgw'\n",
                     "t.yaml:2: database_url: not a libpq connection string (host=... dbname=...) "
                     "or URL (postgresql://...): invalid connection option \"hots\"");
    expect_one_error("upstream: http://h/mcp\n"
                     "database_url: postgresql://db1,db2/x?target_sesion_attrs=read-write\n",
                     "t.yaml:2: database_url: not a libpq connection string (host=... dbname=...) "
                     "or URL (postgresql://...): invalid URI query parameter: "
                     "\"target_sesion_attrs\"");
    expect_one_error("upstream: http://h/mcp\ndatabase_url: postgresql://u:s3cr%zz@db1,db2/x\n",
                     "t.yaml:2: database_url: not a libpq connection string (host=... dbname=...) "
                     "or URL (postgresql://...)");
    /* the environment's URL is checked the same way */
    setenv("IDEMGW_DATABASE_URL", "host=db1,db2 port=1,2,3", 1);
    expect_one_error(
        "upstream: http://h/mcp\n",
        "env IDEMGW_DATABASE_URL: 2 hosts and 3 ports: give one port for each host, or "
        "a single port for all");
    unsetenv("IDEMGW_DATABASE_URL");
}

static void test_missing_file(void **state)
{
    config_errors_t errs = {0};
    assert_null(config_load("tests/data/config/does-not-exist.yaml", &errs));
    assert_int_equal(errs.n, 1);
    assert_string_equal(errs.msgs[0],
                        "tests/data/config/does-not-exist.yaml: cannot open: No such file or "
                        "directory");
    config_errors_free(&errs);
    assert_null(config_load("tests/data/config", &errs)); /* a directory */
    assert_int_equal(errs.n, 1);
    config_errors_free(&errs);
}

static void test_parse_host_port(void **state)
{
    static const struct {
        const char *in;
        int rc;
        const char *host;
        int port;
    } cases[] = {
        {"127.0.0.1:8080", 0, "127.0.0.1", 8080},
        {"localhost:1", 0, "localhost", 1},
        {"[::1]:65535", 0, "::1", 65535},
        {"[::]:80", 0, "::", 80},
        {":8080", 0, "0.0.0.0", 8080},
        {"my-host.internal:443", 0, "my-host.internal", 443},
        {"[fe80::1%eth0]:9", 0, "fe80::1%eth0", 9},
        {"127.0.0.1", -1, NULL, 0},
        {"127.0.0.1:", -1, NULL, 0},
        {"127.0.0.1:0", -1, NULL, 0},
        {"127.0.0.1:65536", -1, NULL, 0},
        {"127.0.0.1:123456", -1, NULL, 0},
        {"127.0.0.1:80a", -1, NULL, 0},
        {"127.0.0.1:-1", -1, NULL, 0},
        {"::1:8080", -1, NULL, 0},
        {"[::1]", -1, NULL, 0},
        {"[::1]8080", -1, NULL, 0},
        {"[nothex]:80", -1, NULL, 0},
        {"[::1:80", -1, NULL, 0},
        {":", -1, NULL, 0},
        {":0", -1, NULL, 0},
        {"", -1, NULL, 0},
        {"ho st:80", -1, NULL, 0},
        {"a..b:80", -1, NULL, 0},
        {".a:80", -1, NULL, 0},
        {"http://h:80", -1, NULL, 0},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        host_port_t hp = {.host = NULL, .port = 7};
        int rc = config_parse_host_port(cases[i].in, &hp);
        if (rc != cases[i].rc)
            fail_msg("'%s': rc %d, want %d", cases[i].in, rc, cases[i].rc);
        if (rc == 0) {
            assert_string_equal(hp.host, cases[i].host);
            assert_int_equal(hp.port, cases[i].port);
            free(hp.host);
        } else {
            assert_null(hp.host);
            assert_int_equal(hp.port, 7);
        }
    }
    host_port_t hp = {0};
    assert_int_equal(config_parse_host_port(NULL, &hp), -1);
}

static void test_upstream_urls(void **state)
{
    static const struct {
        const char *url;
        bool tls;
        const char *host;
        int port;
        const char *path;
        const char *host_header;
    } good[] = {
        {"http://127.0.0.1:3001/mcp", false, "127.0.0.1", 3001, "/mcp", "127.0.0.1:3001"},
        {"HTTPS://Example.com/", true, "Example.com", 443, "/", "Example.com:443"},
        {"http://example.com/a/b%20c", false, "example.com", 80, "/a/b%20c", "example.com:80"},
        {"https://[::1]:8443/mcp", true, "::1", 8443, "/mcp", "[::1]:8443"},
    };
    char yaml[300];
    for (size_t i = 0; i < ARRAY_LEN(good); i++) {
        snprintf(yaml, sizeof(yaml), "upstream: '%s'\n", good[i].url);
        config_t *c = must_load_str(yaml);
        assert_string_equal(c->upstream_url, good[i].url);
        assert_int_equal(c->upstream_tls, good[i].tls);
        assert_string_equal(c->upstream.host, good[i].host);
        assert_int_equal(c->upstream.port, good[i].port);
        assert_string_equal(c->upstream_path, good[i].path);
        assert_string_equal(c->upstream_host_header, good[i].host_header);
        config_free(c);
    }
    static const char *const bad[] = {
        "http:/x/mcp", "http:///mcp",  "http://h:99999/mcp", "http://h:/mcp",
        "http://h",    "http://h?x=1", "http://h/m#f",       "http://u@h/mcp",
        "ws://h/mcp",  "http://h/a b", "http://[::1/mcp",    "mcp",
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        config_errors_t errs = {0};
        snprintf(yaml, sizeof(yaml), "upstream: '%s'\n", bad[i]);
        config_t *c = config_load_string("u.yaml", yaml, &errs);
        if (c || errs.n != 1 || !strstr(errs.msgs[0], "u.yaml:1: upstream: bad URL")) {
            print_errs(&errs);
            config_free(c);
            fail_msg("upstream '%s' should be refused", bad[i]);
        }
        config_errors_free(&errs);
    }
}

static void test_loopback(void **state)
{
    static const struct {
        const char *host;
        bool lo;
    } cases[] = {
        {"127.0.0.1", true},
        {"127.255.0.9", true},
        {"localhost", true},
        {"LocalHost", true},
        {"::1", true},
        {"::ffff:127.0.0.1", true},
        {"0.0.0.0", false},
        {"::", false},
        {"128.0.0.1", false},
        {"10.0.0.1", false},
        {"localhost.com", false},
        {"", false},
        {NULL, false},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++)
        if (config_host_is_loopback(cases[i].host) != cases[i].lo)
            fail_msg("'%s' loopback should be %d", cases[i].host ? cases[i].host : "(null)",
                     cases[i].lo);
}

static void test_host_allowed(void **state)
{
    config_t *lo = must_load_str("upstream: http://h/mcp\n");
    config_t *lists = must_load("tests/data/config/good/lists.yaml");
    static const struct {
        const char *host;
        bool lo, lists;
    } cases[] = {
        {"localhost", true, false},
        {"localhost:8080", true, false},
        {"LOCALHOST:1", true, false},
        {"localhost.:8080", true, false},
        {"127.0.0.1:8080", true, false},
        {"[::1]:8080", true, true},
        {"[::1]", true, true},
        {"127.0.0.2:8080", false, false},
        {"evil.example.com", false, false},
        {"localhost.evil.com", false, false},
        {"gateway.example.com", false, true},
        {"Gateway.Example.com:443", false, true},
        {"gateway.example.com.", false, true},
        {"[2001:db8::1]:80", false, true},
        {"[2001:DB8::1]", false, true},
        {"10.0.0.7", false, true},
        {"10.0.0.7:", false, false},
        {"10.0.0.70", false, false},
        {"::1", false, false}, /* unbracketed v6 in a Host header is malformed */
        {"", false, false},
        {"localhost:8080:1", false, false},
        {"local host", false, false},
        {NULL, false, false},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        const char *h = cases[i].host ? cases[i].host : "(null)";
        if (config_host_allowed(lo, cases[i].host) != cases[i].lo)
            fail_msg("loopback config, Host '%s': want %d", h, cases[i].lo);
        if (config_host_allowed(lists, cases[i].host) != cases[i].lists)
            fail_msg("lists config, Host '%s': want %d", h, cases[i].lists);
    }
    config_free(lo);
    config_free(lists);
}

static void test_origin_allowed(void **state)
{
    config_t *lo = must_load_str("upstream: http://h/mcp\n");
    config_t *lists = must_load("tests/data/config/good/lists.yaml");
    static const struct {
        const char *origin;
        bool lo, lists;
    } cases[] = {
        {NULL, true, true},
        {"http://localhost:8080", true, false},
        {"https://localhost", true, false},
        {"http://LOCALHOST:3000", true, true},
        {"http://127.0.0.1:5173", true, false},
        {"http://[::1]:3000", true, false},
        {"http://localhost:80", true, false},
        {"http://evil.example.com", false, false},
        {"http://localhost.evil.com", false, false},
        {"https://app.example.com", false, true},
        {"https://app.example.com:443", false, true},
        {"https://APP.example.com", false, true},
        {"https://app.example.com:8443", false, false},
        {"http://app.example.com", false, false},
        {"http://localhost:3000", true, true},
        {"https://localhost:3000", true, false},
        {"http://dev.example.com:1234", false, true},
        {"https://dev.example.com", false, true},
        {"null", false, true},
        {"NULL", false, true},
        {"", false, false},
        {"localhost", false, false},
        {"file://localhost", false, false},
        {"http://localhost:8080/path", false, false},
        {"http://", false, false},
        {"http://localhost:0", false, false},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        const char *o = cases[i].origin ? cases[i].origin : "(null)";
        if (config_origin_allowed(lo, cases[i].origin) != cases[i].lo)
            fail_msg("loopback config, Origin '%s': want %d", o, cases[i].lo);
        if (config_origin_allowed(lists, cases[i].origin) != cases[i].lists)
            fail_msg("lists config, Origin '%s': want %d", o, cases[i].lists);
    }
    config_free(lo);
    config_free(lists);
}

/* ---- reload ---- */

typedef struct key_list {
    char names[64][64];
    config_key_reload_t reload[64];
    size_t n;
} key_list_t;

static void collect_key(const char *name, config_key_reload_t reload, void *arg)
{
    key_list_t *l = arg;
    assert_true(l->n < ARRAY_LEN(l->names));
    assert_true(strlen(name) < sizeof(l->names[0]));
    strcpy(l->names[l->n], name);
    l->reload[l->n++] = reload;
}

static config_key_reload_t key_reload(const key_list_t *l, const char *name)
{
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->names[i], name) == 0)
            return l->reload[i];
    fail_msg("key %s is not in the table", name);
    return CONFIG_KEY_UNCLASSIFIED;
}

/* Every key says what a reload does with it: none may be silently ignored. */
static void test_keys_classified(void **state)
{
    static const char *const restart_only[] = {
        "listen",
        "admin_listen",
        "workers",
        "upstream",
        "upstream_ca_file",
        "database_url",
        "migrate",
        "store.pool",
        "store.timeout",
        "store.sweep_interval",
        "store.cache_entries",
        "store.cache_bytes",
        "store.group_commit",
        "store.durable_finish",
        "store.commit_delay",
        "otlp_endpoint",
        "otlp_sample_ratio",
        "alerts.webhook_url",
        "alerts.webhook_format",
        "alerts.webhook_timeout",
    };
    static const char *const reloadable[] = {
        "timeouts.client_header",
        "timeouts.upstream",
        "timeouts.drain",
        "limits.max_body",
        "limits.max_connections",
        "limits.upstream_pool",
        "allowed_hosts",
        "allowed_origins",
        "log.level",
        "admin_token_file",
        "subject",
        "defaults",
        "tools",
    };
    key_list_t l = {0};
    config_keys_each(collect_key, &l);
    assert_true(l.n >= ARRAY_LEN(restart_only) + ARRAY_LEN(reloadable));
    size_t n_restart = 0;
    for (size_t i = 0; i < l.n; i++) {
        if (l.reload[i] != CONFIG_KEY_RELOADABLE && l.reload[i] != CONFIG_KEY_RESTART_ONLY)
            fail_msg("key %s does not say whether a reload may change it", l.names[i]);
        for (size_t j = 0; j < i; j++)
            if (strcmp(l.names[i], l.names[j]) == 0)
                fail_msg("key %s is listed twice", l.names[i]);
        n_restart += l.reload[i] == CONFIG_KEY_RESTART_ONLY;
    }
    for (size_t i = 0; i < ARRAY_LEN(restart_only); i++)
        if (key_reload(&l, restart_only[i]) != CONFIG_KEY_RESTART_ONLY)
            fail_msg("%s should be restart-only", restart_only[i]);
    for (size_t i = 0; i < ARRAY_LEN(reloadable); i++)
        if (key_reload(&l, reloadable[i]) != CONFIG_KEY_RELOADABLE)
            fail_msg("%s should be reloadable", reloadable[i]);
    /* A new restart-only key belongs in the list above, and in the merge test below. */
    assert_int_equal(n_restart, ARRAY_LEN(restart_only));
}

typedef struct reported {
    char text[512]; /* the names, one per line */
} reported_t;

static void report_key(const char *name, void *arg)
{
    reported_t *r = arg;
    size_t used = strlen(r->text);
    snprintf(r->text + used, sizeof(r->text) - used, "%s\n", name);
}

static void test_reload_merge(void **state)
{
    config_t *running = must_load("conf/idemgw.yaml");
    config_t *next = must_load("conf/idemgw.yaml");
    reported_t r = {""};
    assert_int_equal(config_reload_merge(running, next, report_key, &r), 0);
    assert_string_equal(r.text, "");
    config_free(next);

    /* Restart-only keys are named and carried; reloadable ones (a timeout, the policy, the
     * subject, the log level) are taken. */
    next = must_load_str("upstream: http://127.0.0.1:3001/mcp\n"
                         "database_url: postgresql://u:secret@db/x\nmigrate: false\n"
                         "store: {sweep_interval: 5s}\n"
                         "timeouts: {upstream: 5m}\nsubject: {static: x}\nlog: {level: debug}\n"
                         "defaults: {class: read}\ntools: {t: {class: idempotent}}\n");
    assert_true(next->store_enabled);
    assert_int_equal(config_reload_merge(running, next, report_key, &r), 3);
    assert_string_equal(r.text, "database_url\nmigrate\nstore.sweep_interval\n");
    assert_null(strstr(r.text, "secret"));
    assert_null(next->database_url);
    assert_int_equal(next->store_kind, running->store_kind);
    assert_string_equal(next->store_target, running->store_target);
    assert_true(next->migrate);
    assert_int_equal(next->sweep_interval_ms, 60 * 1000);
    assert_int_equal(next->upstream_timeout_ms, 5 * 60 * 1000);
    assert_int_equal(next->subject.kind, SUBJECT_STATIC);
    assert_int_equal(next->log_level, LOG_DEBUG);
    assert_int_equal(next->policy.defaults.cls, TOOL_CLASS_READ);
    assert_int_equal(next->policy.n_tools, 1);
    assert_int_equal(policy_lookup(&next->policy, "t")->cls, TOOL_CLASS_IDEMPOTENT);
    /* Merging again finds nothing left to carry. */
    r.text[0] = '\0';
    assert_int_equal(config_reload_merge(running, next, NULL, NULL), 0);
    config_free(next);

    /* Every other restart-only key, in table order; the upstream goes with all it derives.
     * (PGHOST: several workers need Postgres, the embedded store takes one process.) */
    setenv("PGHOST", "db", 1);
    next = must_load_str("listen: '[::1]:9000'\nadmin_listen: 127.0.0.1:9001\nworkers: 3\n"
                         "upstream: https://other:8443/x\nupstream_ca_file: conf/idemgw.yaml\n"
                         "store: {pool: 9, timeout: 1s, cache_entries: 5, cache_bytes: 1MiB,"
                         " commit_delay: 5ms}\n"
                         "otlp_endpoint: http://collector:4318\n"
                         "alerts: {webhook_url: 'http://hooks:9/x', webhook_format: slack,"
                         " webhook_timeout: 2s}\n");
    unsetenv("PGHOST");
    assert_int_equal(config_reload_merge(running, next, report_key, &r), 14);
    assert_string_equal(r.text, "listen\nadmin_listen\nworkers\nupstream\nupstream_ca_file\n"
                                "store.pool\nstore.timeout\nstore.cache_entries\n"
                                "store.cache_bytes\nstore.commit_delay\notlp_endpoint\n"
                                "alerts.webhook_url\n"
                                "alerts.webhook_format\nalerts.webhook_timeout\n");
    assert_null(next->otlp.url);
    assert_null(next->alerts_webhook_url);
    assert_int_equal(next->alerts_webhook_format, 0);
    assert_int_equal(next->alerts_webhook_timeout_ms, 5000);
    assert_string_equal(next->listen.host, "127.0.0.1");
    assert_int_equal(next->listen.port, 8080);
    assert_int_equal(next->admin_listen.port, 8081);
    assert_int_equal(next->workers, 1);
    assert_string_equal(next->upstream_url, "http://127.0.0.1:3001/mcp");
    assert_false(next->upstream_tls);
    assert_string_equal(next->upstream.host, "127.0.0.1");
    assert_int_equal(next->upstream.port, 3001);
    assert_string_equal(next->upstream_path, "/mcp");
    assert_string_equal(next->upstream_host_header, "127.0.0.1:3001");
    assert_null(next->upstream_ca_file);
    assert_int_equal(next->store_pool, 4);
    assert_int_equal(next->store_timeout_ms, 5000);
    assert_int_equal(next->cache_entries, 100000);
    assert_int_equal(next->cache_bytes, 64u << 20);
    assert_int_equal(next->store_commit_delay_ms, 0);
    config_free(next);
    config_free(running);
}

static void test_subject_jwt(void **state)
{
    config_t *c = must_load_str("upstream: http://h/mcp\n"
                                "subject:\n"
                                "  jwt:\n"
                                "    jwks_url: https://idp.example:8443/keys\n"
                                "    jwks_file: tests/data/jwks/ed25519.json\n"
                                "    issuer: https://idp.example\n"
                                "    audience: mcp-refunds\n");
    const subject_jwt_conf_t *j = &c->subject.jwt;
    assert_int_equal(c->subject.kind, SUBJECT_JWT);
    assert_string_equal(j->jwks.hp.host, "idp.example");
    assert_int_equal(j->jwks.hp.port, 8443);
    assert_string_equal(j->jwks.path, "/keys");
    assert_string_equal(j->jwks.host_header, "idp.example:8443");
    assert_null(j->ca_file);
    assert_int_equal(j->n_audiences, 1);
    assert_string_equal(j->audiences[0], "mcp-refunds");
    /* the defaults */
    assert_int_equal(j->n_claims, 2);
    assert_string_equal(j->claims[0], "iss");
    assert_string_equal(j->claims[1], "sub");
    assert_int_equal(j->algorithms, JWT_ALGS_DEFAULT);
    assert_int_equal(j->leeway_ms, 30000);
    assert_int_equal(j->refresh_ms, 300000);
    config_free(c);

    c = must_load_str("upstream: http://h/mcp\n"
                      "subject:\n"
                      "  jwt:\n"
                      "    jwks_url: https://idp.example/keys\n"
                      "    ca_file: tests/data/jwks/ed25519.json\n"
                      "    issuer: https://idp.example\n"
                      "    audience: [a, b]\n"
                      "    claims: [sub, tenant]\n"
                      "    algorithms: [ES384, EdDSA]\n"
                      "    leeway: 0s\n"
                      "    refresh: 1h\n");
    j = &c->subject.jwt;
    assert_int_equal(j->jwks.hp.port, 443);
    assert_int_equal(j->n_audiences, 2);
    assert_string_equal(j->audiences[1], "b");
    assert_string_equal(j->claims[1], "tenant");
    assert_int_equal(j->algorithms, JWT_ALG_ES384 | JWT_ALG_EDDSA);
    assert_int_equal(j->leeway_ms, 0);
    assert_int_equal(j->refresh_ms, 3600000);
    config_free(c);

#define JWT_HEAD "upstream: http://h/mcp\nsubject:\n  jwt:\n"
    expect_one_error(JWT_HEAD "    issuer: i\n    audience: a\n",
                     "t.yaml:3: subject.jwt: give jwks_url or jwks_file (where the issuer's keys "
                     "are)");
    expect_one_error(JWT_HEAD "    jwks_url: https://i/k\n    audience: a\n",
                     "t.yaml:3: subject.jwt: issuer is required (the iss every token must have)");
    expect_one_error(JWT_HEAD "    jwks_url: https://i/k\n    issuer: i\n",
                     "t.yaml:3: subject.jwt: audience is required (the aud naming this server)");
    expect_one_error(JWT_HEAD "    jwks_url: http://i/k\n    issuer: i\n    audience: a\n",
                     "t.yaml:4: subject.jwt.jwks_url: bad URL 'http://i/k': must be https://");
    expect_one_error(JWT_HEAD "    jwks_url: https://i/k\n    issuer: i\n    audience: a\n"
                              "    algorithms: [RS256, HS256]\n",
                     "t.yaml:7: subject.jwt.algorithms[1]: 'HS256' is not allowed (allowed: "
                     "RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA; none and HS* "
                     "never are)");
    expect_one_error(JWT_HEAD "    jwks_url: https://i/k\n    issuer: i\n    audience: a\n"
                              "    algorithms: [none]\n",
                     "t.yaml:7: subject.jwt.algorithms[0]: 'none' is not allowed (allowed: "
                     "RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA; none and HS* "
                     "never are)");
    expect_one_error(JWT_HEAD "    jwks_file: tests/data/jwks/bad.json\n    issuer: i\n"
                              "    audience: a\n",
                     "t.yaml:4: subject.jwt.jwks_file: 'tests/data/jwks/bad.json' is not a usable "
                     "JWK Set: key 1: x must be a base64url string of 32 bytes");
    expect_one_error(JWT_HEAD "    jwks_file: /nonexistent.json\n    issuer: i\n    audience: a\n",
                     "t.yaml:4: subject.jwt.jwks_file: cannot open /nonexistent.json: No such "
                     "file or directory");
    expect_one_error(JWT_HEAD "    jwks_file: tests/data/jwks/ed25519.json\n    issuer: i\n"
                              "    audience: a\n    ca_file: tests/data/jwks/ed25519.json\n",
                     "t.yaml:3: subject.jwt: ca_file is only used with jwks_url");
    expect_one_error(JWT_HEAD "    jwks_url: https://i/k\n    issuer: i\n    audience: []\n",
                     "t.yaml:6: subject.jwt.audience: the list is empty (leave the key out for "
                     "the default)");
    expect_one_error(JWT_HEAD "    jwks_url: https://i/k\n    issuer: i\n    audience: a\n"
                              "    refresh: 1s\n",
                     "t.yaml:7: subject.jwt.refresh: 1s is out of range (10s to 1d)");
    expect_one_error(JWT_HEAD "    jwks_url: https://i/k\n    issuer: i\n    audience: a\n"
                              "    kid: x\n",
                     "t.yaml:7: unknown key 'kid' in subject.jwt (allowed: jwks_file, jwks_url, "
                     "ca_file, issuer, audience, claims, algorithms, leeway, refresh)");
    expect_one_error(JWT_HEAD "    jwks_url: https://i/k\n    issuer: i\n    audience: a\n"
                              "    claims: []\n",
                     "t.yaml:7: subject.jwt.claims: the list is empty (leave the key out for the "
                     "default)");
    expect_one_error("upstream: http://h/mcp\nsubject:\n  jwt: yes\n",
                     "t.yaml:3: subject.jwt: expected a mapping (jwks_url or jwks_file, issuer, "
                     "audience, ...)");
#undef JWT_HEAD
}

/* client_cert with jwt, header or bearer: a workload acting for a user; the other pairs are
 * refused, word for word. */
static void test_subject_combined(void **state)
{
#define MTLS                                                                                       \
    "upstream: http://h/mcp\nlisten_tls: {cert_file: conf/idemgw.yaml, key_file: "                 \
    "conf/idemgw.yaml, client_ca_file: conf/idemgw.yaml}\n"
    config_t *c = must_load_str(MTLS "subject:\n"
                                     "  client_cert: spiffe\n"
                                     "  jwt: {jwks_file: tests/data/jwks/ed25519.json, issuer: i, "
                                     "audience: a}\n");
    assert_int_equal(c->subject.kind, SUBJECT_JWT);
    assert_true(c->subject.with_cert);
    assert_int_equal(c->subject.client_cert, PEER_CERT_SPIFFE);
    assert_true(config_subject_uses_cert(&c->subject));
    assert_string_equal(c->subject.jwt.issuer, "i");
    config_free(c);

    /* either order */
    c = must_load_str(MTLS "subject: {header: X-User, client_cert: cn}\n");
    assert_int_equal(c->subject.kind, SUBJECT_HEADER);
    assert_string_equal(c->subject.value, "X-User");
    assert_true(c->subject.with_cert);
    assert_int_equal(c->subject.client_cert, PEER_CERT_CN);
    config_free(c);

    c = must_load_str(MTLS "subject: {bearer: sha256, client_cert: san_dns}\n");
    assert_int_equal(c->subject.kind, SUBJECT_BEARER_SHA256);
    assert_true(c->subject.with_cert);
    assert_int_equal(c->subject.client_cert, PEER_CERT_SAN_DNS);
    config_free(c);

    /* listen_tls after subject in the file: read first all the same */
    c = must_load_str("upstream: http://h/mcp\nsubject: {client_cert: cn, bearer: sha256}\n"
                      "listen_tls: {cert_file: conf/idemgw.yaml, key_file: conf/idemgw.yaml, "
                      "client_ca_file: conf/idemgw.yaml}\n");
    assert_true(c->subject.with_cert);
    config_free(c);

    /* alone, client_cert is its own kind, not a combination */
    c = must_load_str(MTLS "subject: {client_cert: san_uri}\n");
    assert_int_equal(c->subject.kind, SUBJECT_CLIENT_CERT);
    assert_false(c->subject.with_cert);
    assert_int_equal(c->subject.client_cert, PEER_CERT_SAN_URI);
    config_free(c);
    c = must_load_str(MTLS "subject: {header: X-User}\n");
    assert_false(c->subject.with_cert);
    assert_false(config_subject_uses_cert(&c->subject));
    config_free(c);

    expect_one_error(MTLS "subject:\n  client_cert: spiffe\n  static: tenant-a\n",
                     "t.yaml:5: subject: static cannot be combined with client_cert (a fixed "
                     "name adds nothing to the certificate's; combine client_cert with jwt, "
                     "header or bearer)");
    expect_one_error(MTLS "subject:\n  static: tenant-a\n  client_cert: spiffe\n",
                     "t.yaml:5: subject: static cannot be combined with client_cert (a fixed "
                     "name adds nothing to the certificate's; combine client_cert with jwt, "
                     "header or bearer)");
    expect_one_error(MTLS "subject:\n  client_cert: spiffe\n  header: X-User\n  bearer: "
                          "sha256\n",
                     "t.yaml:6: subject: give only one of header, bearer, static, jwt "
                     "(client_cert may be added to jwt, header or bearer)");
    expect_one_error(MTLS "subject:\n  jwt: {jwks_file: tests/data/jwks/ed25519.json, issuer: "
                          "i, audience: a}\n  bearer: sha256\n",
                     "t.yaml:5: subject: give only one of header, bearer, static, jwt "
                     "(client_cert may be added to jwt, header or bearer)");
    expect_one_error(MTLS "subject: {client_cert: dns, header: X-User}\n",
                     "t.yaml:3: subject.client_cert: unknown value 'dns' (allowed: spiffe, "
                     "san_uri, san_dns, cn)");
    /* combined, the certificate is still needed: mutual TLS */
    expect_one_error("upstream: http://h/mcp\nsubject: {client_cert: spiffe, header: X-User}\n",
                     "t.yaml:2: subject.client_cert: needs listen_tls with client_ca_file (the "
                     "CAs that verify the agents' certificates)");
#undef MTLS
}

/* ---- servers ---- */

/* Each server is a view: its own path, upstream, policy and cors; the rest the top level's. */
static void test_servers_views(void **state)
{
    (void)state;
    config_t *c = must_load_str("database_url: none\n"
                                "cors: off\n"
                                "upstream_ca_file: /etc/passwd\n"
                                "defaults: {window: 5m}\n"
                                "tools:\n"
                                "  get_ledger: {class: read}\n"
                                "  issue_refund: {class: read}\n"
                                "servers:\n"
                                "  billing:\n"
                                "    path: /billing/mcp\n"
                                "    upstream: https://pay.internal/api/mcp\n"
                                "    cors: mirror\n"
                                "    defaults: {on_cancel: forward}\n"
                                "    tools:\n"
                                "      issue_refund: {class: non_idempotent}\n"
                                "  files:\n"
                                "    path: /files/mcp\n"
                                "    upstream: {command: [server-filesystem, /srv]}\n");
    assert_int_equal(config_n_servers(c), 2);
    config_t *b = config_server(c, 0), *f = config_server_named(c, "files");
    assert_ptr_equal(f, config_server(c, 1));
    assert_null(config_server_named(c, "nope"));
    assert_string_equal(b->server_name, "billing");
    assert_string_equal(config_agent_path(b), "/billing/mcp");
    assert_string_equal(b->agent_prefix, "/billing");
    assert_string_equal(b->upstream_path, "/api/mcp");
    assert_true(b->upstream_tls);
    assert_string_equal(b->upstream_ca_file, "/etc/passwd"); /* the top level's */
    assert_int_equal(b->cors, CORS_MIRROR);
    assert_int_equal(f->cors, CORS_OFF); /* not given: the top level's */
    /* the server's defaults start from the top level's; its tools override, others inherit */
    assert_int_equal(b->policy.defaults.window_ms, 5 * 60 * 1000);
    assert_int_equal(b->policy.defaults.on_cancel, ON_CANCEL_FORWARD);
    assert_int_equal(policy_lookup(&b->policy, "issue_refund")->cls, TOOL_CLASS_NON_IDEMPOTENT);
    assert_int_equal(policy_lookup(&b->policy, "get_ledger")->cls, TOOL_CLASS_READ);
    assert_int_equal(policy_lookup(&f->policy, "issue_refund")->cls, TOOL_CLASS_READ);
    assert_int_equal(c->policy.defaults.on_cancel, ON_CANCEL_FINISH);
    assert_non_null(f->stdio.argv);
    assert_string_equal(f->upstream_path, "/mcp");
    assert_string_equal(f->agent_prefix, "/files");
    /* the top level names no server; without servers: the top level is the one server */
    assert_null(c->server_name);
    assert_true(config_needs_store(c));
    config_free(c);
    config_t *one = must_load_str("upstream: http://h/mcp\ndatabase_url: none\n");
    assert_int_equal(config_n_servers(one), 1);
    assert_ptr_equal(config_server(one, 0), one);
    assert_string_equal(config_agent_path(one), "/mcp");
    config_free(one);
}

/* A reload merge replaces top-level values the views alias: they must see the new ones. */
static void test_servers_refresh_after_merge(void **state)
{
    (void)state;
    const char *y = "database_url: none\nworkers: 1\n"
                    "servers:\n  a: {path: /a/mcp, upstream: \"http://h/mcp\"}\n";
    config_t *run = must_load_str(y);
    config_t *next = must_load_str("database_url: none\nworkers: 3\n"
                                   "servers:\n  a: {path: /a/mcp, upstream: \"http://h/mcp\"}\n");
    config_reload_merge(run, next, NULL, NULL);
    assert_int_equal(next->workers, 1);
    assert_int_equal(config_server(next, 0)->workers, 1);
    assert_ptr_equal(config_server(next, 0)->store_target, next->store_target);
    assert_ptr_equal(config_server(next, 0)->parent, next);
    config_free(run);
    config_free(next);
}

static void test_servers_errors(void **state)
{
    (void)state;
    expect_one_error("database_url: none\nservers:\n  a: {path: mcp, upstream: \"http://h/mcp\"}\n",
                     "t.yaml:3: servers.a.path: 'mcp' must start with '/'");
    expect_one_error("database_url: none\nservers:\n  a: {path: /a/../mcp, upstream: \"http://h/mcp\"}\n",
                     "t.yaml:3: servers.a.path: '/a/../mcp' must not hold . or .. segments");
    expect_one_error("database_url: none\nservers:\n  a: {path: /a/mcp/, upstream: \"http://h/mcp\"}\n",
                     "t.yaml:3: servers.a.path: '/a/mcp/' must not end with '/'");
    expect_one_error("database_url: none\nservers:\n  a: {path: \"/a/m cp\", upstream: \"http://h/mcp\"}\n",
                     "t.yaml:3: servers.a.path: '/a/m cp' may hold letters, digits and / - . _ ~ only");
    expect_one_error("database_url: none\nservers:\n  a: {upstream: \"http://h/mcp\"}\n",
                     "t.yaml:3: servers.a: path is required (where agents connect, e.g. /a/mcp)");
    expect_one_error("database_url: none\nservers:\n  a: {path: /a/mcp}\n",
                     "t.yaml:3: servers.a: upstream is required (a URL, or {command: [...]})");
    expect_one_error("database_url: none\nservers: {}\n",
                     "t.yaml:2: servers: expected a mapping of server names to {path, upstream, "
                     "...}, got an empty mapping");
    expect_one_error("database_url: none\nservers:\n  a: {path: /a/mcp, upstream: \"http://h/mcp\", "
                     "workers: 2}\n",
                     "t.yaml:3: unknown key 'workers' in servers.a (allowed: path, upstream, cors, "
                     "defaults, tools)");
    expect_one_error("database_url: none\nservers:\n"
                     "  a: {path: /a/mcp, upstream: \"http://h/mcp\"}\n"
                     "  b: {path: /a/other, upstream: \"http://h/mcp\"}\n",
                     "t.yaml:4: servers.b.path: /a/other is in /a/, as server a's path is (line "
                     "3): their other paths could not be told apart; give each server a folder "
                     "of its own");
    expect_one_error("database_url: none\nupstream: http://h/mcp\nservers:\n"
                     "  a: {path: /a/mcp, upstream: \"http://h/mcp\"}\n",
                     "t.yaml: upstream and servers are both given: with servers, each server "
                     "names its own upstream; remove the top-level one");
    expect_one_error("database_url: none\nworkers: 2\nservers:\n"
                     "  a: {path: /a/mcp, upstream: \"http://h/mcp\"}\n"
                     "  b: {path: /b/mcp, upstream: {command: [x]}}\n",
                     "t.yaml:2: workers: 2 with a stdio upstream in server b: each worker is a "
                     "process with children of its own, and the kernel gives a session's next "
                     "connection to any worker, which would not have that session's child; set "
                     "workers: 1");
    expect_one_error("database_url: none\nservers:\n  _other: {path: /o/mcp, upstream: \"http://h/mcp\"}\n",
                     "t.yaml:3: servers: '_other' is reserved: /metrics counts the servers past "
                     "its limit under it");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_reference_conf, clear_env),
        cmocka_unit_test_setup(test_minimal, clear_env),
        cmocka_unit_test_setup(test_flow_json, clear_env),
        cmocka_unit_test_setup(test_inherit, clear_env),
        cmocka_unit_test_setup(test_public_and_lists, clear_env),
        cmocka_unit_test_setup(test_bad_files, clear_env),
        cmocka_unit_test_setup(test_exact_messages, clear_env),
        cmocka_unit_test_setup(test_many_errors, clear_env),
        cmocka_unit_test_setup(test_env_overrides, clear_env),
        cmocka_unit_test_setup(test_env_only, clear_env),
        cmocka_unit_test_setup(test_store_enabled, clear_env),
        cmocka_unit_test_setup(test_store_kinds, clear_env),
        cmocka_unit_test_setup(test_store_default_path, clear_env),
        cmocka_unit_test_setup(test_store_choose, clear_env),
        cmocka_unit_test_setup(test_database_url_hosts, clear_env),
        cmocka_unit_test_setup(test_missing_file, clear_env),
        cmocka_unit_test_setup(test_parse_host_port, clear_env),
        cmocka_unit_test_setup(test_upstream_urls, clear_env),
        cmocka_unit_test_setup(test_loopback, clear_env),
        cmocka_unit_test_setup(test_host_allowed, clear_env),
        cmocka_unit_test_setup(test_origin_allowed, clear_env),
        cmocka_unit_test_setup(test_keys_classified, clear_env),
        cmocka_unit_test_setup(test_reload_merge, clear_env),
        cmocka_unit_test_setup(test_subject_jwt, clear_env),
        cmocka_unit_test_setup(test_subject_combined, clear_env),
        cmocka_unit_test_setup(test_servers_views, clear_env),
        cmocka_unit_test_setup(test_servers_refresh_after_merge, clear_env),
        cmocka_unit_test_setup(test_servers_errors, clear_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
