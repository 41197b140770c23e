/* The `idemgw key` subcommand: output, exit codes and messages. */
#include "key_cmd.h"

#include <stdarg.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "capture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char last_err[2048]; /* stderr of the last run_cmd */

/* Runs key_cmd_main with stdout and stderr captured; returns the exit code, stdout in out. */
static int run_cmd(char *out, size_t outlen, int argc, ...)
{
    char *argv[16];
    va_list ap;
    va_start(ap, argc);
    for (int i = 0; i < argc; i++)
        argv[i] = va_arg(ap, char *);
    va_end(ap);
    argv[argc] = NULL;
    return capture_run(key_cmd_main, argc, argv, out, outlen, last_err, sizeof last_err);
}

static void test_key_cmd(void **state)
{
    (void)state;
    char out[512];
    assert_int_equal(run_cmd(out, sizeof out, 7, "key", "--subject", "s", "--tool", "t", "--args",
                             "{\"b\":2,\"a\":1}"),
                     0);
    assert_string_equal(out, "s:t:h:43258cff783fe7036d8a43033f830adf\n");
    assert_int_equal(run_cmd(out, sizeof out, 6, "key", "--subject=s", "--tool=t", "--args={}",
                             "--header-key", "K"),
                     0);
    assert_string_equal(out, "s:t:x:K\n");
    assert_int_equal(run_cmd(out, sizeof out, 2, "key", "--help"), 0);
    assert_non_null(strstr(out, "usage:"));

    /* errors: exit 2, nothing on stdout */
    assert_int_equal(
        run_cmd(out, sizeof out, 7, "key", "--subject", "s", "--tool", "t", "--args", "{\"a\":}"),
        2);
    assert_string_equal(out, "");
    assert_non_null(strstr(last_err, "byte 5"));
    assert_int_equal(
        run_cmd(out, sizeof out, 7, "key", "--subject", "s", "--tool", "t", "--args", "[1]"), 2);
    assert_non_null(strstr(last_err, "arguments must be an object"));
    assert_int_equal(run_cmd(out, sizeof out, 5, "key", "--subject", "s", "--tool", "t"), 2);
    assert_int_equal(run_cmd(out, sizeof out, 6, "key", "--subject", "s", "--tool", "t", "--args"),
                     2);
    assert_int_equal(
        run_cmd(out, sizeof out, 7, "key", "--subject", "", "--tool", "t", "--args", "{}"), 2);
    assert_int_equal(run_cmd(out, sizeof out, 8, "key", "--subject", "s", "--tool", "t", "--args",
                             "{}", "--bogus"),
                     2);
    assert_int_equal(run_cmd(out, sizeof out, 1, "key"), 2);
    assert_string_equal(out, "");
    assert_non_null(strstr(last_err, "usage:"));
}

/* -c FILE: the named tool's exclude_args and key_arg apply, other tools get the defaults. */
static void test_key_cmd_config(void **state)
{
    (void)state;
    char path[] = "/tmp/idemgw-key-cmd-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    static const char yaml[] = "upstream: http://127.0.0.1:3001/mcp\n"
                               "subject:\n"
                               "  static: test\n"
                               "tools:\n"
                               "  issue_refund:\n"
                               "    exclude_args: [note, meta.client_ts]\n"
                               "    key_arg: ref\n";
    assert_int_equal(write(fd, yaml, sizeof yaml - 1), (ssize_t)(sizeof yaml - 1));
    close(fd);

    char out[512];
    assert_int_equal(run_cmd(out, sizeof out, 9, "key", "-c", path, "--subject", "s", "--tool",
                             "issue_refund", "--args",
                             "{\"a\":1,\"note\":\"x\",\"meta\":{\"client_ts\":5}}"),
                     0);
    assert_string_equal(out, "s:issue_refund:h:d1f7cd1de58772ef9ed7b045ed305b88\n");
    assert_int_equal(run_cmd(out, sizeof out, 9, "key", "--config", path, "--subject", "s",
                             "--tool", "issue_refund", "--args", "{\"a\":1,\"ref\":\"R\"}"),
                     0);
    assert_string_equal(out, "s:issue_refund:x:R\n");
    /* a tool not listed: nothing excluded */
    assert_int_equal(run_cmd(out, sizeof out, 9, "key", "-c", path, "--subject", "s", "--tool",
                             "other", "--args", "{\"a\":1,\"note\":\"x\"}"),
                     0);
    assert_string_equal(out, "s:other:h:039966606d9ae85415622010c89e79b2\n");
    unlink(path);

    /* a config that does not load: exit 2, message on stderr */
    assert_int_equal(run_cmd(out, sizeof out, 9, "key", "-c", path, "--subject", "s", "--tool", "t",
                             "--args", "{}"),
                     2);
    assert_string_equal(out, "");
    assert_true(strlen(last_err) > 0);
}

/* A temp file holding yaml; its path in path (a mkstemp template). */
static void write_config(char *path, const char *yaml)
{
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, yaml, strlen(yaml)), (ssize_t)strlen(yaml));
    close(fd);
}

/* servers: --server picks the server's policy and puts its name in the key, as the gateway
 * keys a call on that server; missing, unknown or (without servers:) given, exit 2. */
static void test_key_cmd_server(void **state)
{
    (void)state;
    char path[] = "/tmp/idemgw-key-cmd-XXXXXX";
    write_config(path, "subject:\n"
                       "  static: test\n"
                       "servers:\n"
                       "  billing:\n"
                       "    path: /billing/mcp\n"
                       "    upstream: http://127.0.0.1:3001/mcp\n"
                       "    tools:\n"
                       "      issue_refund:\n"
                       "        exclude_args: [note, meta.client_ts]\n"
                       "  payments:\n"
                       "    path: /payments/mcp\n"
                       "    upstream: http://127.0.0.1:3002/mcp\n");
    static const char args[] = "{\"a\":1,\"note\":\"x\",\"meta\":{\"client_ts\":5}}";
    char out[512];
    /* billing excludes what the one-upstream case of test_key_cmd_config does: the same hash */
    assert_int_equal(run_cmd(out, sizeof out, 11, "key", "-c", path, "--server", "billing",
                             "--subject", "s", "--tool", "issue_refund", "--args", args),
                     0);
    assert_string_equal(out, "s:billing/issue_refund:h:d1f7cd1de58772ef9ed7b045ed305b88\n");
    /* payments excludes nothing */
    assert_int_equal(run_cmd(out, sizeof out, 10, "key", "-c", path, "--server=payments",
                             "--subject", "s", "--tool", "issue_refund", "--args",
                             "{\"a\":1,\"note\":\"x\"}"),
                     0);
    assert_string_equal(out, "s:payments/issue_refund:h:039966606d9ae85415622010c89e79b2\n");
    /* without -c the name is taken as given, and no policy applies */
    assert_int_equal(run_cmd(out, sizeof out, 9, "key", "--server", "payments", "--subject", "s",
                             "--tool", "issue_refund", "--args", "{\"a\":1,\"note\":\"x\"}"),
                     0);
    assert_string_equal(out, "s:payments/issue_refund:h:039966606d9ae85415622010c89e79b2\n");

    assert_int_equal(run_cmd(out, sizeof out, 9, "key", "-c", path, "--subject", "s", "--tool",
                             "issue_refund", "--args", "{}"),
                     2);
    assert_string_equal(out, "");
    assert_non_null(
        strstr(last_err, "has servers:, name one with --server NAME: billing, payments"));
    assert_int_equal(run_cmd(out, sizeof out, 11, "key", "-c", path, "--server", "ledger",
                             "--subject", "s", "--tool", "issue_refund", "--args", "{}"),
                     2);
    assert_non_null(strstr(last_err, "--server ledger: "));
    assert_non_null(strstr(last_err, "has no server of that name; its servers: billing, payments"));
    assert_int_equal(run_cmd(out, sizeof out, 9, "key", "--server", "a/b", "--subject", "s",
                             "--tool", "t", "--args", "{}"),
                     2);
    assert_non_null(strstr(last_err, "--server 'a/b' is not a server name"));
    unlink(path);

    char one[] = "/tmp/idemgw-key-cmd-XXXXXX";
    write_config(one, "upstream: http://127.0.0.1:3001/mcp\n");
    assert_int_equal(run_cmd(out, sizeof out, 11, "key", "-c", one, "--server", "billing",
                             "--subject", "s", "--tool", "t", "--args", "{}"),
                     2);
    assert_string_equal(out, "");
    assert_non_null(strstr(last_err, "has no servers: (one upstream"));
    unlink(one);
}

/* Usage errors name what is wrong and exit 2; --name=value and --name value both work. */
static void test_key_cmd_usage(void **state)
{
    (void)state;
    char out[512], first[512];
    assert_int_equal(run_cmd(out, sizeof out, 5, "key", "--subject=s", "--tool=t", "--args", "{}"),
                     0);
    snprintf(first, sizeof first, "%s", out);
    assert_int_equal(
        run_cmd(out, sizeof out, 7, "key", "--subject", "s", "--tool", "t", "--args", "{}"), 0);
    assert_string_equal(first, out);
    assert_int_equal(run_cmd(out, sizeof out, 4, "key", "--subject", "s", "--tool"), 2);
    assert_non_null(strstr(last_err, "--tool needs a value"));
    assert_int_equal(run_cmd(out, sizeof out, 8, "key", "--subject", "s", "--tool", "t", "--args",
                             "{}", "stray"),
                     2);
    assert_non_null(strstr(last_err, "unexpected argument 'stray'"));
    assert_int_equal(run_cmd(out, sizeof out, 2, "key", "--nonsense"), 2);
    assert_non_null(strstr(last_err, "unexpected argument '--nonsense'"));
    assert_int_equal(run_cmd(out, sizeof out, 9, "key", "--subject", "s", "--tool", "t", "--args",
                             "{}", "--show", "--release"),
                     2);
    assert_non_null(strstr(last_err, "exclude each other"));
    /* --forget excludes the other row options too, before any database is looked for */
    static const char *const pairs[][2] = {
        {"--forget", "--release"}, {"--show", "--forget"}, {"--forget", "--show"}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        assert_int_equal(run_cmd(out, sizeof out, 9, "key", "--subject", "s", "--tool", "t",
                                 "--args", "{}", pairs[i][0], pairs[i][1]),
                         2);
        assert_string_equal(out, "");
        assert_non_null(strstr(last_err, "--show, --release and --forget exclude each other"));
    }
    assert_int_equal(run_cmd(out, sizeof out, 8, "key", "--subject", "s", "--tool", "t", "--args",
                             "{}", "--forget=yes"),
                     2);
    /* --text shapes a row: alone, or with --release (one JSON line), it is refused */
    assert_int_equal(run_cmd(out, sizeof out, 8, "key", "--subject", "s", "--tool", "t", "--args",
                             "{}", "--text"),
                     2);
    assert_non_null(strstr(last_err, "--text goes with --show or --forget"));
    assert_int_equal(run_cmd(out, sizeof out, 9, "key", "--subject", "s", "--tool", "t", "--args",
                             "{}", "--release", "--text"),
                     2);
    assert_string_equal(out, "");
    assert_int_equal(run_cmd(out, sizeof out, 2, "key", "--help"), 0);
    assert_non_null(strstr(out, "usage: idemgw key"));
    assert_non_null(strstr(out, "--forget"));
    assert_non_null(strstr(out, "--hash"));
    assert_non_null(strstr(out, "--text"));
}

/* --hash: the second line is the key_hash of the gateway's log lines, the first 16 hex
 * characters of the SHA-256 of the key (sha256("s:t:x:K") = b12407a1a95dc838...). */
static void test_key_cmd_hash(void **state)
{
    (void)state;
    char out[512];
    assert_int_equal(run_cmd(out, sizeof out, 10, "key", "--subject", "s", "--tool", "t", "--args",
                             "{}", "--header-key", "K", "--hash"),
                     0);
    assert_string_equal(out, "s:t:x:K\nb12407a1a95dc838\n");
}

/* The row options need a database: without one, exit 2 after the key and a message. With
 * nothing named, that is the embedded store's default file, which they never create. */
static void test_key_cmd_no_database(void **state)
{
    (void)state;
    static const char *const vars[] = {"IDEMGW_DATABASE_URL", "PGHOST",          "PGDATABASE",
                                       "PGSERVICE",           "STATE_DIRECTORY", "XDG_STATE_HOME"};
    char *saved[6];
    char dir[] = "/tmp/idemgw-key-cmd-state-XXXXXX";
    assert_non_null(mkdtemp(dir));
    for (int i = 0; i < 6; i++) {
        const char *v = getenv(vars[i]);
        saved[i] = v ? strdup(v) : NULL;
        unsetenv(vars[i]);
    }
    setenv("STATE_DIRECTORY", dir, 1);
    static const char *const opts[] = {"--show", "--release", "--forget"};
    char out[512];
    for (int i = 0; i < 3; i++) {
        assert_int_equal(run_cmd(out, sizeof out, 8, "key", "--subject", "s", "--tool", "t",
                                 "--args", "{}", opts[i]),
                         2);
        assert_string_equal(out, "s:t:h:44136fa355b3678a1146ad16f7e8649e\n");
        assert_non_null(strstr(last_err, "no database"));
        assert_non_null(strstr(last_err, "idemgw-keys.db does not exist"));
    }
    setenv("IDEMGW_DATABASE_URL", "none", 1);
    assert_int_equal(run_cmd(out, sizeof out, 8, "key", "--subject", "s", "--tool", "t", "--args",
                             "{}", "--show"),
                     2);
    assert_non_null(strstr(last_err, "no database: database_url is none"));
    unsetenv("STATE_DIRECTORY");
    unsetenv("IDEMGW_DATABASE_URL");
    /* --database-url names the store over the environment */
    assert_int_equal(run_cmd(out, sizeof out, 10, "key", "--subject", "s", "--tool", "t", "--args",
                             "{}", "--show", "--database-url", "none"),
                     2);
    assert_non_null(strstr(last_err, "no database: database_url is none"));
    assert_non_null(strstr(last_err, "--database-url sqlite:PATH"));
    assert_int_equal(rmdir(dir), 0); /* nothing was created in it */
    for (int i = 0; i < 6; i++) {
        if (saved[i])
            setenv(vars[i], saved[i], 1);
        free(saved[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_cmd),        cmocka_unit_test(test_key_cmd_usage),
        cmocka_unit_test(test_key_cmd_config), cmocka_unit_test(test_key_cmd_server),
        cmocka_unit_test(test_key_cmd_hash),   cmocka_unit_test(test_key_cmd_no_database),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
