/* The log's tap: what a command that writes no log keeps of it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "log.h"

#include <stdio.h>
#include <string.h>

typedef struct seen {
    int n;
    log_level_t level;
    char fields[64];
    char msg[64];
} seen_t;

static void keep(void *arg, log_level_t level, const char *fields, const char *msg)
{
    seen_t *s = arg;
    s->n++;
    s->level = level;
    snprintf(s->fields, sizeof(s->fields), "%s", fields ? fields : "");
    snprintf(s->msg, sizeof(s->msg), "%s", msg);
}

/* The lines written while the test runs, from a temporary stream. */
static void written(FILE *f, char *out, size_t len)
{
    fflush(f);
    rewind(f);
    out[fread(out, 1, len - 1, f)] = '\0';
}

static void test_tap_sees_lines_written_or_not(void **state)
{
    (void)state;
    FILE *f = tmpfile();
    assert_non_null(f);
    log_stream = f;
    log_threshold = LOG_INFO;
    seen_t s = {0};
    /* a command that writes warnings only, yet keeps the info lines it is given */
    log_set_tap(keep, &s, LOG_WARN);
    LOG_AT(LOG_INFO, 0, "\"server_pid\":42", "child said %s", "boom");
    assert_int_equal(s.n, 1);
    assert_int_equal(s.level, LOG_INFO);
    assert_string_equal(s.fields, "\"server_pid\":42");
    assert_string_equal(s.msg, "child said boom");
    LOG_AT(LOG_WARN, 0, NULL, "a warning");
    assert_int_equal(s.n, 2);
    assert_string_equal(s.fields, "");
    /* below the threshold nothing is formatted, so the tap does not see it either */
    log_debug(0, "not seen");
    assert_int_equal(s.n, 2);
    char out[2048];
    written(f, out, sizeof(out));
    assert_null(strstr(out, "child said"));
    assert_non_null(strstr(out, "\"msg\":\"a warning\""));

    /* without the tap every line at the threshold is written again */
    log_set_tap(NULL, NULL, LOG_DEBUG);
    log_info(0, "after the tap");
    assert_int_equal(s.n, 2);
    written(f, out, sizeof(out));
    assert_non_null(strstr(out, "after the tap"));
    log_stream = NULL;
    fclose(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tap_sees_lines_written_or_not),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
