#include "log.h"

#include "util.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

log_level_t log_threshold = LOG_INFO;
int log_worker;
FILE *log_stream;

static log_tap_fn tap;
static void *tap_arg;
static log_level_t tap_write_level;

static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};

const char *log_level_name(log_level_t level)
{
    if ((unsigned)level >= sizeof(level_names) / sizeof(level_names[0]))
        return "unknown";
    return level_names[level];
}

int log_level_parse(const char *s)
{
    for (unsigned i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++)
        if (strcasecmp(s, level_names[i]) == 0)
            return (int)i;
    if (strcasecmp(s, "warning") == 0)
        return LOG_WARN;
    return -1;
}

void log_json_string(char *out, size_t outlen, const char *s)
{
    size_t o = 0;
    if (outlen < 3)
        return;
    out[o++] = '"';
    for (; *s && o + 8 < outlen; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            out[o++] = '\\';
            out[o++] = (char)c;
        } else if (c < 0x20) {
            o += (size_t)snprintf(out + o, outlen - o, "\\u%04x", c);
        } else {
            out[o++] = (char)c;
        }
    }
    out[o++] = '"';
    out[o] = '\0';
}

void log_set_tap(log_tap_fn fn, void *arg, log_level_t write_level)
{
    tap = fn;
    tap_arg = arg;
    tap_write_level = write_level;
}

void log_emit(log_level_t level, uint64_t conn, const char *fields, const char *fmt, ...)
{
    char msg[1024], esc[2100], ts[UTIL_ISO_LEN + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (tap) {
        tap(tap_arg, level, fields, msg);
        if (level < tap_write_level)
            return;
    }
    log_json_string(esc, sizeof(esc), msg);

    util_iso_utc_ms((int64_t)util_wall_ms(), ts);

    char connf[64] = "";
    int n2 = 0;
    if (log_worker)
        n2 = snprintf(connf, sizeof(connf), ",\"worker\":%d", log_worker);
    if (conn)
        snprintf(connf + n2, sizeof(connf) - (size_t)n2, ",\"conn\":%llu",
                 (unsigned long long)conn);
    FILE *out = log_stream ? log_stream : stdout;
    fprintf(out, "{\"time\":\"%s\",\"level\":\"%s\"%s,\"msg\":%s%s%s}\n", ts, log_level_name(level),
            connf, esc, fields && *fields ? "," : "", fields ? fields : "");
    fflush(out);
}
