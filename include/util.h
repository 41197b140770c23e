/* Small helpers shared by every module.
 *
 * Out-of-memory policy: allocation failure is not recoverable in a proxy that must not lose
 * track of a claimed key half way, so the x* wrappers log and abort(). Everything else that can
 * fail returns a status. */
#ifndef IDEMGW_UTIL_H
#define IDEMGW_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/time.h>
#include <sys/types.h>

#define MUST_CHECK __attribute__((warn_unused_result))
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Out of memory: says how much was asked for on stderr and aborts. */
_Noreturn void util_oom(size_t n);
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
/* NULL but in the simulator (tests/sim), whose clock both read instead: wall says which. */
extern uint64_t (*util_clock_hook)(bool wall);

/* Epoch milliseconds as ISO 8601 UTC with milliseconds (2025-01-01T00:00:00.000Z): the one
 * form the gateway prints times in (log lines, stored rows, answers to agents). */
#define UTIL_ISO_LEN 24
void util_iso_utc_ms(int64_t ms, char out[UTIL_ISO_LEN + 1]);

/* Lower-case hex of n bytes into out (2n+1 bytes, NUL-terminated). */
void util_hex(const unsigned char *in, size_t n, char *out);
/* 16 hex digits and a NUL, random per call (RAND_bytes; should it fail, the pid and the clock
 * in nanoseconds): a prefix that tells ids a process makes from another live process's. Not a
 * secret. */
void util_nonce_hex(char out[17]);

/* The value of one hex digit, or -1. */
int util_hexval(char c);

/* How many bytes at the start of s[0..n) are plain JSON string bytes: printable ASCII other
 * than the quote and the backslash, which a string holds as they are. Eight bytes are tested
 * at a time; bodies are mostly such text, in long strings. */
size_t util_json_plain_len(const char *s, size_t n);

/* ASCII case-insensitive comparison of a length-delimited name with a C string. */
int util_strncaseeq(const char *a, size_t alen, const char *b);

/* The project's one UTF-8 validator: strict (no overlong forms, no surrogates, nothing past
 * U+10FFFF), the rules Postgres applies to text. */
/* Decodes one sequence at s into *cp; returns its length, or 0 when the bytes are not valid
 * UTF-8 (or avail is 0). A NUL byte decodes as U+0000 of length 1. */
size_t util_utf8_decode(const unsigned char *s, size_t avail, uint32_t *cp);
/* Length of the longest prefix of s that is valid UTF-8 text without NUL bytes (what a
 * Postgres text value or a YAML file may hold). */
size_t util_utf8_valid_prefix(const char *s, size_t n);
/* Whether all n bytes of s are valid UTF-8 text without NUL bytes. */
bool util_utf8_valid(const char *s, size_t n);

/* Milliseconds as a struct timeval, for libevent timers. */
struct timeval util_ms_to_tv(uint64_t ms);

/* 64-bit FNV-1a of a NUL-terminated string: the hash of the in-memory tables (not for
 * anything an attacker could steer into collisions at will to gain more than a slower lookup). */
uint64_t util_fnv1a64(const char *s);

/* SHA-256 of n bytes into out (32 bytes). OpenSSL fails only when it cannot allocate: the
 * out-of-memory policy applies. */
void util_sha256(const void *data, size_t n, unsigned char out[32]);
/* The same as lower-case hex (65 bytes with the NUL). */
void util_sha256_hex(const void *data, size_t n, char out[65]);

/* Reads a whole file of at most max bytes into a NUL-terminated buffer (free it), its length in
 * *len; NULL with err ("cannot open ...: reason", "larger than N bytes"). */
char *util_read_file(const char *path, size_t max, size_t *len, char *err, size_t errlen);

/* Makes the missing folders on the way to file (not file itself), each with mode (less the
 * umask): 0 when they all exist then; -1 with err naming the folder that could not be made and
 * why. */
int util_mkdir_parents(const char *file, mode_t mode, char *err, size_t errlen);

/* Frees n strings and the array holding them. */
void util_strv_free(char **v, size_t n);

#endif
