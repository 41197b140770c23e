/* `idemgw report`: --since parsing, and the refusals that come before any store. */
#include "report_cmd.h"

#include <stdarg.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "capture.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void test_parse_since(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        int rc;
        uint64_t ms;
    } cases[] = {
        {"24h", 0, 24 * 3600 * 1000ULL},
        {"90s", 0, 90000},
        {"30m", 0, 1800000},
        {"7d", 0, 7 * 86400 * 1000ULL},
        {"250ms", 0, 250},
        {"45", 0, 45000}, /* a bare number is seconds, as everywhere in the config */
        {"all", 0, 0},
        {"0", -1, 0},
        {"0h", -1, 0},
        {"", -1, 0},
        {"-1h", -1, 0},
        {"1.5h", -1, 0},
        {"24 h", -1, 0},
        {"1w", -1, 0},
        {"ALL", -1, 0},
        {"h", -1, 0},
        {"99999999999999999999d", -1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t ms = 12345;
        char err[200] = "";
        int rc = report_cmd_parse_since(cases[i].in, &ms, err, sizeof err);
        if (rc != cases[i].rc)
            fail_msg("--since '%s': rc %d, want %d (%s)", cases[i].in, rc, cases[i].rc, err);
        if (rc == 0)
            assert_int_equal(ms, cases[i].ms);
        else
            assert_non_null(strstr(err, "--since"));
    }
    char err[200];
    uint64_t ms;
    assert_int_equal(report_cmd_parse_since(NULL, &ms, err, sizeof err), -1);
}

static char out_buf[4096], err_buf[4096];

/* report_cmd_main with stdout and stderr in out_buf and err_buf; its exit code. */
static int run_report(int argc, ...)
{
    char *argv[12];
    va_list ap;
    va_start(ap, argc);
    for (int i = 0; i < argc; i++)
        argv[i] = va_arg(ap, char *);
    va_end(ap);
    argv[argc] = NULL;
    return capture_run(report_cmd_main, argc, argv, out_buf, sizeof out_buf, err_buf,
                       sizeof err_buf);
}

/* Bad options are refused with exit 2 and a message naming them, nothing on stdout. */
static void test_usage_errors(void **state)
{
    (void)state;
    assert_int_equal(run_report(3, "report", "--since", "yesterday"), 2);
    assert_string_equal(out_buf, "");
    assert_non_null(strstr(err_buf, "--since 'yesterday' is not a duration"));
    assert_int_equal(run_report(3, "report", "--since", "0s"), 2);
    assert_non_null(strstr(err_buf, "--since must be more than zero"));
    assert_int_equal(run_report(2, "report", "--since"), 2);
    assert_non_null(strstr(err_buf, "--since needs a value"));
    assert_int_equal(run_report(2, "report", "--weekly"), 2);
    assert_non_null(strstr(err_buf, "unexpected argument '--weekly'"));
    assert_int_equal(run_report(2, "report", "stray"), 2);
    assert_non_null(strstr(err_buf, "unexpected argument 'stray'"));
    assert_int_equal(run_report(3, "report", "--top", "many"), 2);
    assert_non_null(strstr(err_buf, "--top 'many' is not a number"));
    assert_int_equal(run_report(3, "report", "-c", "/nonexistent/idemgw.yaml"), 2);
    assert_string_equal(out_buf, "");
    assert_true(strlen(err_buf) > 0);
    assert_int_equal(run_report(3, "report", "--server", "a/b"), 2);
    assert_non_null(strstr(err_buf, "--server 'a/b' is not a server name"));
    assert_int_equal(run_report(3, "report", "--server", ""), 2);
    assert_int_equal(run_report(2, "report", "--help"), 0);
    assert_non_null(strstr(out_buf, "usage: idemgw report"));
    assert_non_null(strstr(out_buf, "--since"));
    assert_non_null(strstr(out_buf, "--server NAME"));
}

/* No store: database_url none, or an embedded store file that does not exist (never made, nor
 * its folders); each message says how to name a store. --database-url decides over the
 * environment. */
static void test_no_database(void **state)
{
    (void)state;
    static const char *const vars[] = {
        "IDEMGW_DATABASE_URL", "PGHOST",         "PGDATABASE", "PGSERVICE",
        "STATE_DIRECTORY",     "XDG_STATE_HOME", "HOME"};
    char *saved[ARRAY_LEN(vars)];
    for (size_t i = 0; i < ARRAY_LEN(vars); i++) {
        const char *v = getenv(vars[i]);
        saved[i] = v ? strdup(v) : NULL;
        unsetenv(vars[i]);
    }
    setenv("IDEMGW_DATABASE_URL", "none", 1);
    assert_int_equal(run_report(1, "report"), 2);
    assert_string_equal(out_buf, "");
    assert_non_null(strstr(err_buf, "idemgw report: no database: database_url is none"));
    char dir[] = "/tmp/idemgw-report-cmd-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char url[128];
    snprintf(url, sizeof url, "sqlite:%s/keys.db", dir);
    setenv("IDEMGW_DATABASE_URL", url, 1);
    assert_int_equal(run_report(3, "report", "--since", "1h"), 2);
    assert_non_null(strstr(err_buf, "keys.db does not exist"));
    /* --database-url over the environment's none */
    setenv("IDEMGW_DATABASE_URL", "none", 1);
    assert_int_equal(run_report(3, "report", "--database-url", url), 2);
    assert_non_null(strstr(err_buf, "keys.db does not exist"));
    assert_int_equal(run_report(3, "report", "--database-url", "sqlite:"), 2);
    assert_non_null(
        strstr(err_buf, "idemgw report: database_url: sqlite: needs a file (sqlite:PATH)"));
    unsetenv("IDEMGW_DATABASE_URL");

    /* nothing named: the gateway's default file, under XDG_STATE_HOME here */
    setenv("XDG_STATE_HOME", dir, 1);
    setenv("HOME", "/nonexistent", 1);
    assert_int_equal(run_report(1, "report"), 2);
    char want[256];
    snprintf(want, sizeof want,
             "the embedded store's default file %s/idemgw/idemgw-keys.db does not exist", dir);
    assert_non_null(strstr(err_buf, want));
    assert_non_null(strstr(err_buf, "--database-url sqlite:PATH"));
    assert_non_null(strstr(err_buf, "database_url in -c FILE"));
    /* nowhere for a default file */
    unsetenv("XDG_STATE_HOME");
    unsetenv("HOME");
    assert_int_equal(run_report(1, "report"), 2);
    assert_non_null(strstr(err_buf, "none of STATE_DIRECTORY, XDG_STATE_HOME, HOME is set"));
    assert_non_null(strstr(err_buf, "--database-url sqlite:PATH"));
    assert_int_equal(rmdir(dir), 0); /* nothing was created in it */

    for (size_t i = 0; i < ARRAY_LEN(vars); i++) {
        if (saved[i])
            setenv(vars[i], saved[i], 1);
        free(saved[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_since),
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_no_database),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
