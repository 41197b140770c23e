/* Small helpers shared by every module.
 *
 * Out-of-memory policy: allocation failure is not recoverable in a proxy that must not lose
 * track of a claimed key half way, so the x* wrappers log and abort(). Everything else that can
 * fail returns a status. */
#ifndef IDEMGW_UTIL_H
#define IDEMGW_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#define MUST_CHECK __attribute__((warn_unused_result))
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
char *xvasprintf(const char *fmt, va_list ap) __attribute__((format(printf, 1, 0)));

/* Monotonic milliseconds, for durations. */
uint64_t util_now_ms(void);
/* Wall clock in milliseconds since the epoch, for log lines and stored times. */
uint64_t util_wall_ms(void);

/* Lower-case hex of n bytes into out (2n+1 bytes, NUL-terminated). */
void util_hex(const unsigned char *in, size_t n, char *out);

/* The value of one hex digit, or -1. */
int util_hexval(char c);

/* ASCII case-insensitive comparison of a length-delimited name with a C string. */
int util_strncaseeq(const char *a, size_t alen, const char *b);

#endif
