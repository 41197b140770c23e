/* For unit tests of the commands: runs a command's main with its stdout and stderr captured
 * into two buffers (NUL-terminated, cut to fit). Include after cmocka.h. */
#ifndef IDEMGW_TEST_CAPTURE_H
#define IDEMGW_TEST_CAPTURE_H

#include <stdio.h>
#include <unistd.h>

static inline void capture_read(FILE *f, char *buf, size_t len)
{
    rewind(f);
    buf[fread(buf, 1, len - 1, f)] = '\0';
    fclose(f);
}

static inline int capture_run(int (*main_fn)(int, char **), int argc, char **argv, char *out,
                              size_t outlen, char *err, size_t errlen)
{
    fflush(stdout);
    fflush(stderr);
    FILE *o = tmpfile(), *e = tmpfile();
    assert_non_null(o);
    assert_non_null(e);
    int so = dup(STDOUT_FILENO), se = dup(STDERR_FILENO);
    dup2(fileno(o), STDOUT_FILENO);
    dup2(fileno(e), STDERR_FILENO);
    int rc = main_fn(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(so, STDOUT_FILENO);
    dup2(se, STDERR_FILENO);
    close(so);
    close(se);
    capture_read(o, out, outlen);
    capture_read(e, err, errlen);
    return rc;
}

#endif
