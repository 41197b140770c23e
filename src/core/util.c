#include "util.h"
#include "log.h"
#include <errno.h>
#include <pthread.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <openssl/evp.h>
#include <openssl/rand.h>

void util_oom(size_t n)
{
    fprintf(stderr, "idemgw: out of memory allocating %zu bytes\n", n);
    abort();
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        util_oom(n);
    return p;
}

/* Blocks up to this size come from malloc and are cleared here: glibc's calloc never takes a
 * block from the thread's cache of freed ones (tcache), where malloc does, and the small
 * objects a request makes and frees were a tenth of a relayed read's instructions. */
#define XCALLOC_CACHED 1024

void *xcalloc(size_t n, size_t size)
{
    void *p;
    if (n && size && n <= XCALLOC_CACHED / size) {
        p = malloc(n * size);
        if (p)
            memset(p, 0, n * size);
    } else {
        p = calloc(n ? n : 1, size ? size : 1);
    }
    if (!p)
        util_oom(n * size);
    return p;
}

void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        util_oom(n);
    return q;
}

char *xstrdup(const char *s)
{
    return xstrndup(s, strlen(s));
}

char *xstrndup(const char *s, size_t n)
{
    char *p = xmalloc(n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *xvasprintf(const char *fmt, va_list ap)
{
    char *out = NULL;
    if (vasprintf(&out, fmt, ap) < 0)
        util_oom(strlen(fmt));
    return out;
}

char *xasprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *out = xvasprintf(fmt, ap);
    va_end(ap);
    return out;
}

uint64_t (*util_clock_hook)(bool wall);

uint64_t util_now_ms(void)
{
    if (util_clock_hook)
        return util_clock_hook(false);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t util_wall_ms(void)
{
    if (util_clock_hook)
        return util_clock_hook(true);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void util_iso_utc_ms(int64_t ms, char out[UTIL_ISO_LEN + 1])
{
    time_t sec = (time_t)(ms / 1000);
    int frac = (int)(ms % 1000);
    if (frac < 0) {
        frac += 1000;
        sec--;
    }
    struct tm tm;
    gmtime_r(&sec, &tm);
    int year = tm.tm_year + 1900;
    if (year < 0 || year > 9999) {
        char head[32];
        strftime(head, sizeof(head), "%Y-%m-%dT%H:%M:%S", &tm);
        snprintf(out, UTIL_ISO_LEN + 1, "%.19s.%03dZ", head, frac);
        return;
    }
    /* by hand: the store writes a few of these per call, and strftime and snprintf cost more
     * than the rest of the row */
    const int parts[] = {year / 100, year % 100, tm.tm_mon + 1, tm.tm_mday,
                         tm.tm_hour, tm.tm_min,  tm.tm_sec};
    static const char before[] = {0, 0, '-', '-', 'T', ':', ':'}; /* each part's separator */
    char *o = out;
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
        if (before[i])
            *o++ = before[i];
        *o++ = (char)('0' + parts[i] / 10);
        *o++ = (char)('0' + parts[i] % 10);
    }
    *o++ = '.';
    *o++ = (char)('0' + frac / 100);
    *o++ = (char)('0' + frac / 10 % 10);
    *o++ = (char)('0' + frac % 10);
    *o++ = 'Z';
    *o = '\0';
}

void util_hex(const unsigned char *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = '\0';
}

void util_nonce_hex(char out[17])
{
    unsigned char raw[8];
    if (RAND_bytes(raw, sizeof(raw)) != 1) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t v = ((uint64_t)getpid() << 40) ^ ((uint64_t)ts.tv_sec * 1000000000u + ts.tv_nsec);
        memcpy(raw, &v, sizeof(raw));
    }
    util_hex(raw, sizeof(raw), out);
}

int util_hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int util_strncaseeq(const char *a, size_t alen, const char *b)
{
    return strlen(b) == alen && strncasecmp(a, b, alen) == 0;
}

size_t util_utf8_decode(const unsigned char *s, size_t avail, uint32_t *cp)
{
    if (avail == 0)
        return 0;
    unsigned char c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t n;
    uint32_t v, min;
    /* 0xC0, 0xC1 and 0xF5..0xFF can only start overlong or out-of-range forms */
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2, v = c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3, v = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4, v = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (avail < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return 0;
    *cp = v;
    return n;
}

size_t util_utf8_valid_prefix(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t len = util_utf8_decode(u + i, n - i, &cp);
        if (len == 0 || cp == 0)
            return i;
        i += len;
    }
    return n;
}

bool util_utf8_valid(const char *s, size_t n)
{
    return util_utf8_valid_prefix(s, n) == n;
}

struct timeval util_ms_to_tv(uint64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
    return tv;
}

uint64_t util_fnv1a64(const char *s)
{
    uint64_t h = UINT64_C(14695981039346656037);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        h = (h ^ *p) * UINT64_C(1099511628211);
    return h;
}

/* SHA-256 fetched from the provider once: EVP_sha256() makes EVP_Digest fetch it again on
 * every call, a lookup that cost as much as hashing a key's input. */
static EVP_MD *sha256_md;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;

static void sha256_fetch(void)
{
    sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
}

void util_sha256(const void *data, size_t n, unsigned char out[32])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    pthread_once(&sha256_once, sha256_fetch);
    if (!EVP_Digest(data, n, md, &len, sha256_md ? sha256_md : EVP_sha256(), NULL) || len != 32) {
        fprintf(stderr, "idemgw: SHA-256 failed\n");
        abort();
    }
    memcpy(out, md, 32);
}

void util_sha256_hex(const void *data, size_t n, char out[65])
{
    unsigned char md[32];
    util_sha256(data, n, md);
    util_hex(md, 32, out);
}

void util_strv_free(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

char *util_read_file(const char *path, size_t max, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rbe");
    if (!f) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = xmalloc(max + 1);
    size_t n = fread(buf, 1, max + 1, f);
    bool failed = ferror(f);
    int e = errno;
    fclose(f);
    if (failed || n > max) {
        if (failed)
            snprintf(err, errlen, "cannot read %s: %s", path, strerror(e));
        else
            snprintf(err, errlen, "%s is larger than %zu bytes", path, max);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

int util_mkdir_parents(const char *file, mode_t mode, char *err, size_t errlen)
{
    char *dir = xstrdup(file);
    char *slash = strrchr(dir, '/');
    int rc = 0;
    if (!slash || slash == dir) /* the working directory, or the root: nothing to make */
        goto out;
    *slash = '\0';
    /* each prefix that ends before a '/', then the whole folder */
    for (char *p = dir + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char saved = *p;
        *p = '\0';
        struct stat st;
        const char *why = NULL;
        if (mkdir(dir, mode) != 0) {
            if (errno != EEXIST)
                why = strerror(errno);
            else if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
                why = "it exists and is not a folder";
        }
        if (why) {
            snprintf(err, errlen, "cannot create the folder %s: %s", dir, why);
            rc = -1;
            goto out;
        }
        *p = saved;
        if (saved == '\0')
            break;
    }
out:
    free(dir);
    return rc;
}

size_t util_json_plain_len(const char *s, size_t n)
{
    const uint64_t ones = UINT64_C(0x0101010101010101), highs = UINT64_C(0x8080808080808080);
    size_t i = 0;
#if defined(__SSE2__)
    /* sixteen bytes at a time, and the first special one found by its bit in the mask. As
     * signed bytes, 0x80 and up are negative: "less than 0x20" holds for them and the controls */
    const __m128i quote = _mm_set1_epi8('"'), slash = _mm_set1_epi8('\\'),
                  space = _mm_set1_epi8(0x20);
    for (; i + 16 <= n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(s + i));
        __m128i special =
            _mm_or_si128(_mm_cmplt_epi8(v, space),
                         _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, slash)));
        unsigned mask = (unsigned)_mm_movemask_epi8(special);
        if (mask)
            return i + (size_t)__builtin_ctz(mask);
    }
#endif
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, sizeof(w));
        uint64_t quote = w ^ (ones * '"'), slash = w ^ (ones * '\\');
        /* a byte below 0x20, or a zero byte of quote or slash, sets its high bit in the
         * subtraction (a borrow only ever leaves a byte that is itself special); a byte with
         * the high bit already set is caught by w itself */
        if (((w - ones * 0x20) | (quote - ones) | (slash - ones) | w) & highs)
            break;
    }
    for (; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c >= 0x80 || c == '"' || c == '\\')
            break;
    }
    return i;
}
