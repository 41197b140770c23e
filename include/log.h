/* Leveled JSON log lines on stdout (or log_stream), one object per line.
 *
 * The macros skip all formatting when the level is off. Never pass a bearer token, a stored
 * result or raw arguments: log hashes. */
#ifndef IDEMGW_LOG_H
#define IDEMGW_LOG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_OFF } log_level_t;

extern log_level_t log_threshold;
/* 1-based worker number added to every line when several workers run; 0 = none. */
extern int log_worker;
/* Where lines go; NULL = stdout. A command whose stdout is its answer (idemgw key) sends them
 * to stderr. */
extern FILE *log_stream;

const char *log_level_name(log_level_t level);
/* Parses "debug", "info", "warn", "error", "off"; returns -1 when unknown. */
int log_level_parse(const char *s);

/* Extra fields: a NULL-terminated list of key, value string pairs is awkward in C, so callers
 * pass a preformatted JSON fragment ("\"k\":\"v\",...", no braces) or NULL. conn is the
 * connection id (0 for none). */
void log_emit(log_level_t level, uint64_t conn, const char *fields, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define LOG_AT(level, conn, fields, ...)                                                           \
    do {                                                                                           \
        if ((level) >= log_threshold)                                                              \
            log_emit((level), (conn), (fields), __VA_ARGS__);                                      \
    } while (0)

#define log_debug(conn, ...) LOG_AT(LOG_DEBUG, conn, NULL, __VA_ARGS__)
#define log_info(conn, ...) LOG_AT(LOG_INFO, conn, NULL, __VA_ARGS__)
#define log_warn(conn, ...) LOG_AT(LOG_WARN, conn, NULL, __VA_ARGS__)
#define log_error(conn, ...) LOG_AT(LOG_ERROR, conn, NULL, __VA_ARGS__)

/* A tap sees each line that reaches log_emit (its level at or above log_threshold): the level,
 * the fields fragment (may be NULL) and the formatted message, valid during the call. While a
 * tap is set only lines at write_level or above are written too. For a command whose output is
 * its answer and which logs nothing, yet wants what led to a failure (a stdio server's stderr
 * lines): it lowers log_threshold, sets a tap and keeps write_level at the threshold it had.
 * fn NULL removes the tap. */
typedef void (*log_tap_fn)(void *arg, log_level_t level, const char *fields, const char *msg);
void log_set_tap(log_tap_fn fn, void *arg, log_level_t write_level);

/* Appends a JSON string literal (with quotes) of s to a caller buffer; used to build fields. */
void log_json_string(char *out, size_t outlen, const char *s);

#endif
