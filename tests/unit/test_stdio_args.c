/* `idemgw stdio`'s command line and the store file a wrapped command gets. */
#include "stdio_args.h"

#include <stdarg.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#define MAX_ARGS 16

typedef struct parse_case {
    const char *argv[MAX_ARGS]; /* NULL-terminated */
    stdio_args_result_t want;
    const char *config;   /* -c, when RUN */
    size_t n_headers;     /* -H given, when RUN */
    const char *command0; /* the command's first word, or NULL for none */
    size_t command_words; /* words of the command */
    const char *msg_has;  /* a piece of the message, when BAD */
} parse_case_t;

static const parse_case_t parse_cases[] = {
    {{"stdio", "--", "node", "server.mjs", NULL}, STDIO_ARGS_RUN, NULL, 0, "node", 2, NULL},
    /* the command's own options stay its own, with or without "--" */
    {{"stdio", "--", "npx", "-y", "pkg", "-c", "x", NULL}, STDIO_ARGS_RUN, NULL, 0, "npx", 5, NULL},
    {{"stdio", "npx", "-y", "pkg", NULL}, STDIO_ARGS_RUN, NULL, 0, "npx", 3, NULL},
    {{"stdio", "-c", "gw.yaml", "-H", "X-User: ann", "--header", "X-Team: t", "--", "srv", NULL},
     STDIO_ARGS_RUN,
     "gw.yaml",
     2,
     "srv",
     1,
     NULL},
    /* the config's upstream alone */
    {{"stdio", "-c", "gw.yaml", NULL}, STDIO_ARGS_RUN, "gw.yaml", 0, NULL, 0, NULL},
    {{"stdio", "--log-file", "/tmp/l", "--", "srv", NULL}, STDIO_ARGS_RUN, NULL, 0, "srv", 1, NULL},
    {{"stdio", "--help", NULL}, STDIO_ARGS_HELP, NULL, 0, NULL, 0, NULL},
    {{"stdio", "-h", "--", "srv", NULL}, STDIO_ARGS_HELP, NULL, 0, NULL, 0, NULL},
    {{"stdio", NULL}, STDIO_ARGS_BAD, NULL, 0, NULL, 0, "no server to wrap"},
    {{"stdio", "--", NULL}, STDIO_ARGS_BAD, NULL, 0, NULL, 0, "no command after '--'"},
    {{"stdio", "-c", NULL}, STDIO_ARGS_BAD, NULL, 0, NULL, 0, "needs a value"},
    {{"stdio", "--bogus", "--", "srv", NULL}, STDIO_ARGS_BAD, NULL, 0, NULL, 0, "--bogus"},
    {{"stdio", "-x", "--", "srv", NULL}, STDIO_ARGS_BAD, NULL, 0, NULL, 0, "-x"},
    {{"stdio", "-H", "no colon", "--", "srv", NULL},
     STDIO_ARGS_BAD,
     NULL,
     0,
     NULL,
     0,
     "is not 'Name: value'"},
    {{"stdio", "-H", ": empty name", "--", "srv", NULL},
     STDIO_ARGS_BAD,
     NULL,
     0,
     NULL,
     0,
     "is not 'Name: value'"},
    {{"stdio", "-H", "X-A: b\r\nX-B: c", "--", "srv", NULL},
     STDIO_ARGS_BAD,
     NULL,
     0,
     NULL,
     0,
     "line break"},
    {{"stdio", "-H", "mcp-session-id: s", "--", "srv", NULL},
     STDIO_ARGS_BAD,
     NULL,
     0,
     NULL,
     0,
     "sets itself"},
    {{"stdio", "-H", "Content-Length: 3", "--", "srv", NULL},
     STDIO_ARGS_BAD,
     NULL,
     0,
     NULL,
     0,
     "sets itself"},
};

static void test_parse(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(parse_cases); i++) {
        const parse_case_t *c = &parse_cases[i];
        char *argv[MAX_ARGS];
        int argc = 0;
        while (c->argv[argc]) {
            argv[argc] = (char *)c->argv[argc];
            argc++;
        }
        argv[argc] = NULL;
        stdio_args_t a;
        char msg[200];
        stdio_args_result_t r = stdio_args_parse(argc, argv, &a, msg, sizeof(msg));
        if (r != c->want)
            fail_msg("case %zu: %s, want %s (%s)", i, stdio_args_result_str(r),
                     stdio_args_result_str(c->want), msg);
        if (r == STDIO_ARGS_RUN) {
            if (c->config)
                assert_string_equal(a.config, c->config);
            else
                assert_null(a.config);
            assert_int_equal(a.n_headers, c->n_headers);
            if (c->command0) {
                assert_non_null(a.command);
                assert_string_equal(a.command[0], c->command0);
                size_t n = 0;
                while (a.command[n])
                    n++;
                assert_int_equal(n, c->command_words);
            } else {
                assert_null(a.command);
            }
        }
        if (r == STDIO_ARGS_BAD && !strstr(msg, c->msg_has))
            fail_msg("case %zu: message '%s' lacks '%s'", i, msg, c->msg_has);
        stdio_args_free(&a);
    }
}

static void test_parse_keeps_headers(void **state)
{
    (void)state;
    char *argv[] = {"stdio", "-H", "Authorization: Bearer t", "-H", "X-User: ann", "--", "s", NULL};
    stdio_args_t a;
    char msg[200];
    assert_int_equal(stdio_args_parse(7, argv, &a, msg, sizeof(msg)), STDIO_ARGS_RUN);
    assert_int_equal(a.n_headers, 2);
    assert_string_equal(a.headers[0], "Authorization: Bearer t");
    assert_string_equal(a.headers[1], "X-User: ann");
    stdio_args_free(&a);
}

typedef struct file_case {
    const char *words[MAX_ARGS];
    const char *prefix; /* the name up to the hash */
} file_case_t;

static const file_case_t file_cases[] = {
    {{"node", "/srv/ledger-stdio.mjs", NULL}, "/state/idemgw/stdio-ledger-stdio-"},
    {{"npx", "-y", "@modelcontextprotocol/server-memory", NULL},
     "/state/idemgw/stdio-server-memory-"},
    {{"uvx", "mcp-server-fetch", "--ignore-robots-txt", NULL},
     "/state/idemgw/stdio-mcp-server-fetch-"},
    {{"/opt/bin/my server", NULL}, "/state/idemgw/stdio-my_server-"},
    {{"python", "-m", "pkg.server@1", NULL}, "/state/idemgw/stdio-pkg.server_1-"},
    {{"./run.sh", NULL}, "/state/idemgw/stdio-run-"},
    {{"node", ".mjs", NULL}, "/state/idemgw/stdio-server-"},
    {{"http://127.0.0.1:3001/mcp", NULL}, "/state/idemgw/stdio-mcp-"},
};

static void test_store_file(void **state)
{
    (void)state;
    const char *def = "/state/idemgw/idemgw-keys.db";
    for (size_t i = 0; i < ARRAY_LEN(file_cases); i++) {
        char *f = stdio_args_store_file(def, (char *const *)file_cases[i].words);
        assert_non_null(f);
        size_t n = strlen(file_cases[i].prefix);
        if (strncmp(f, file_cases[i].prefix, n) != 0)
            fail_msg("case %zu: %s does not start with %s", i, f, file_cases[i].prefix);
        /* 16 hex digits, then .db */
        assert_int_equal(strlen(f), n + 16 + 3);
        assert_int_equal(strspn(f + n, "0123456789abcdef"), 16);
        assert_string_equal(f + n + 16, ".db");
        free(f);
    }
}

static void test_store_file_per_command(void **state)
{
    (void)state;
    const char *def = "/home/u/.local/state/idemgw/idemgw-keys.db";
    char *a[] = {"node", "server.mjs", NULL};
    char *a_again[] = {"node", "server.mjs", NULL};
    char *b[] = {"node", "server.mjs", "--other", NULL};
    char *joined[] = {"node server.mjs", NULL};
    char *fa = stdio_args_store_file(def, a);
    char *fa2 = stdio_args_store_file(def, a_again);
    char *fb = stdio_args_store_file(def, b);
    char *fj = stdio_args_store_file(def, joined);
    /* every copy of one command (two agent windows, two runs) has the one file it shares */
    assert_string_equal(fa, fa2);
    assert_string_not_equal(fa, fb);
    assert_string_not_equal(fa, fj); /* word boundaries count */
    assert_int_equal(strncmp(fa, "/home/u/.local/state/idemgw/stdio-server-", 41), 0);
    free(fa);
    free(fa2);
    free(fb);
    free(fj);
    /* no folder, no command: none */
    assert_null(stdio_args_store_file(NULL, a));
    char *none[] = {NULL};
    assert_null(stdio_args_store_file(def, none));
}

static void test_result_str(void **state)
{
    (void)state;
    assert_string_equal(stdio_args_result_str(STDIO_ARGS_RUN), "run");
    assert_string_equal(stdio_args_result_str(STDIO_ARGS_HELP), "help");
    assert_string_equal(stdio_args_result_str(STDIO_ARGS_BAD), "bad");
    assert_string_equal(stdio_args_result_str((stdio_args_result_t)99), "?");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_result_str),
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_parse_keeps_headers),
        cmocka_unit_test(test_store_file),
        cmocka_unit_test(test_store_file_per_command),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
