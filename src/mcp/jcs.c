/* RFC 8785 canonical JSON: a strict RFC 8259 parser into a small DOM, and the serializer.
 *
 * Objects keep their members sorted in canonical order (UTF-16 code units of the names) from
 * the moment they are parsed, which also makes duplicate names adjacent and cheap to find.
 * Numbers are reduced to their canonical text at parse time, so serializing cannot fail and
 * a number that cannot be canonicalised is reported with its byte offset. */
#include "jcs.h"
#include "util.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct jcs_member {
    char *name;      /* unescaped UTF-8, NUL-terminated (may contain NUL: see name_len) */
    size_t name_len; /* bytes in name */
    size_t offset;   /* where the name started in the text, for the duplicate message */
    jcs_value_t *value;
} jcs_member_t;

struct jcs_value {
    jcs_type_t type;
    union {
        struct {
            char *s;    /* string: unescaped UTF-8; number: canonical text */
            size_t len; /* bytes in s */
        } str;
        struct {
            jcs_value_t **items;
            size_t n;
        } arr;
        struct {
            jcs_member_t *m; /* sorted by jcs_name_cmp */
            size_t n;
        } obj;
    } u;
};

const char *jcs_status_str(jcs_status_t st)
{
    switch (st) {
    case JCS_OK:
        return "ok";
    case JCS_ERR_SYNTAX:
        return "syntax error";
    case JCS_ERR_DEPTH:
        return "nested too deeply";
    case JCS_ERR_NUMBER:
        return "number out of range";
    case JCS_ERR_UTF8:
        return "invalid UTF-8 or lone surrogate";
    case JCS_ERR_DUPLICATE:
        return "duplicate object member name";
    }
    return "unknown jcs status";
}

/* ---- growable byte buffer ------------------------------------------------------------------ */

typedef struct jcs_buf {
    char *p;
    size_t len;
    size_t cap;
} jcs_buf_t;

static void buf_reserve(jcs_buf_t *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1)
        cap *= 2;
    b->p = xrealloc(b->p, cap);
    b->cap = cap;
}

static void buf_put(jcs_buf_t *b, const char *s, size_t n)
{
    buf_reserve(b, n);
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void buf_putc(jcs_buf_t *b, char c)
{
    buf_put(b, &c, 1);
}

/* ---- UTF-8 -------------------------------------------------------------------------------- */

static void utf8_encode(jcs_buf_t *b, uint32_t cp)
{
    char t[4];
    size_t n;
    if (cp < 0x80) {
        t[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        t[0] = (char)(0xC0 | (cp >> 6));
        t[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        t[0] = (char)(0xE0 | (cp >> 12));
        t[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        t[0] = (char)(0xF0 | (cp >> 18));
        t[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    buf_put(b, t, n);
}

/* First UTF-16 code unit of cp, scaled so that comparing two results orders code points the
 * way their UTF-16 encodings order: every supplementary character starts with a high surrogate
 * (0xD800..0xDBFF), so it sorts below U+E000..U+FFFF although its code point is larger. */
static uint32_t utf16_order(uint32_t cp)
{
    if (cp < 0x10000)
        return cp << 10;
    uint32_t v = cp - 0x10000;
    uint32_t hi = 0xD800 + (v >> 10), lo = 0xDC00 + (v & 0x3FF);
    return (hi << 10) | (lo - 0xDC00);
}

/* Orders two names by their UTF-16 code units (RFC 8785 section 3.2.3). Names were validated
 * by the parser; a decoding failure (only possible for names set by hand) falls back to bytes. */
static int jcs_name_cmp(const char *a, size_t alen, const char *b, size_t blen)
{
    const unsigned char *pa = (const unsigned char *)a, *pb = (const unsigned char *)b;
    size_t i = 0, j = 0;
    while (i < alen && j < blen) {
        uint32_t ca, cb;
        size_t na = util_utf8_decode(pa + i, alen - i, &ca);
        size_t nb = util_utf8_decode(pb + j, blen - j, &cb);
        if (na == 0 || nb == 0) {
            ca = pa[i];
            cb = pb[j];
            na = nb = 1;
        }
        if (ca != cb) {
            uint32_t oa = utf16_order(ca), ob = utf16_order(cb);
            return oa < ob ? -1 : 1;
        }
        i += na;
        j += nb;
    }
    if (i < alen)
        return 1;
    if (j < blen)
        return -1;
    return 0;
}

static int member_cmp(const void *x, const void *y)
{
    const jcs_member_t *a = x, *b = y;
    int c = jcs_name_cmp(a->name, a->name_len, b->name, b->name_len);
    if (c != 0)
        return c;
    /* equal names: keep text order so the duplicate reported is the later one */
    return a->offset < b->offset ? -1 : (a->offset > b->offset);
}

/* ---- numbers ------------------------------------------------------------------------------ */

/* Tries the decimal mantissa m (k digits) times 10^e10 as a candidate for d. */
static bool roundtrips(uint64_t m, int e10, double d)
{
    char t[48];
    snprintf(t, sizeof t, "%llue%d", (unsigned long long)m, e10);
    return strtod(t, NULL) == d;
}

static int count_digits(uint64_t m)
{
    int k = 1;
    while (m >= 10) {
        m /= 10;
        k++;
    }
    return k;
}

/* Shortest decimal digits of d (d > 0, finite): *m holds the digits, the value is
 * m * 10^(*e10). The correctly rounded p-digit form is usually the shortest, but next to a
 * power of two the rounding interval is lopsided and a neighbour may round-trip while the
 * nearest does not, so both neighbours are tried before asking for another digit. */
static void shortest_digits(double d, uint64_t *m, int *e10)
{
    for (int p = 1; p <= 17; p++) {
        char t[48];
        snprintf(t, sizeof t, "%.*e", p - 1, d);
        /* t is "D.DDDDe[+-]XX" (or "De[+-]XX" when p == 1) */
        uint64_t v = 0;
        const char *s = t;
        for (; *s && *s != 'e'; s++)
            if (*s >= '0' && *s <= '9')
                v = v * 10 + (uint64_t)(*s - '0');
        int exp10 = atoi(s + 1) - (p - 1);
        if (roundtrips(v, exp10, d)) {
            *m = v;
            *e10 = exp10;
            break;
        }
        double best = INFINITY;
        uint64_t cand[2] = {v - 1, v + 1};
        bool found = false;
        for (int i = 0; i < 2; i++) {
            if (count_digits(cand[i]) != p || !roundtrips(cand[i], exp10, d))
                continue;
            char u[48];
            snprintf(u, sizeof u, "%llue%d", (unsigned long long)cand[i], exp10);
            double dist = fabs(strtod(u, NULL) - d);
            if (!found || dist < best) {
                best = dist;
                *m = cand[i];
                *e10 = exp10;
                found = true;
            }
        }
        if (found)
            break;
        if (p == 17) { /* 17 digits always round-trip; unreachable in practice */
            *m = v;
            *e10 = exp10;
        }
    }
    while (*m != 0 && *m % 10 == 0) {
        *m /= 10;
        (*e10)++;
    }
}

void jcs_format_double(double d, char *out)
{
    if (!isfinite(d)) { /* the contract forbids it; print something harmless */
        strcpy(out, "null");
        return;
    }
    if (d == 0) { /* covers -0, which ECMAScript prints as "0" */
        strcpy(out, "0");
        return;
    }
    char *o = out;
    if (d < 0) {
        *o++ = '-';
        d = -d;
    }
    uint64_t m;
    int e10;
    shortest_digits(d, &m, &e10);
    char dig[24];
    int k = snprintf(dig, sizeof dig, "%llu", (unsigned long long)m);
    int n = k + e10; /* ECMAScript's n: the value is 0.DIGITS * 10^n */

    if (k <= n && n <= 21) {
        memcpy(o, dig, (size_t)k);
        o += k;
        for (int i = 0; i < n - k; i++)
            *o++ = '0';
    } else if (0 < n && n <= 21) {
        memcpy(o, dig, (size_t)n);
        o += n;
        *o++ = '.';
        memcpy(o, dig + n, (size_t)(k - n));
        o += k - n;
    } else if (-6 < n && n <= 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -n; i++)
            *o++ = '0';
        memcpy(o, dig, (size_t)k);
        o += k;
    } else {
        *o++ = dig[0];
        if (k > 1) {
            *o++ = '.';
            memcpy(o, dig + 1, (size_t)(k - 1));
            o += k - 1;
        }
        o += sprintf(o, "e%c%d", n - 1 < 0 ? '-' : '+', abs(n - 1));
    }
    *o = '\0';
}

/* Does the double nearest the integer literal lit (digits only, no sign) equal it exactly?
 * %.0f prints a double's exact integer value, so comparing the digits decides it. */
static bool integer_fits_double(const char *lit, size_t len, double d)
{
    if (len <= 15) /* every integer below 10^15 < 2^53 is exact */
        return true;
    if (!isfinite(d))
        return false;
    char t[400];
    int n = snprintf(t, sizeof t, "%.0f", fabs(d));
    return n > 0 && (size_t)n == len && memcmp(t, lit, len) == 0;
}

/* ---- parser ------------------------------------------------------------------------------- */

typedef struct jcs_parser {
    const char *s;
    size_t len;
    size_t pos;
    char *err;
    size_t errlen;
} jcs_parser_t;

static jcs_status_t fail(jcs_parser_t *p, jcs_status_t st, size_t at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static jcs_status_t fail(jcs_parser_t *p, jcs_status_t st, size_t at, const char *fmt, ...)
{
    if (p->err && p->errlen) {
        int n = snprintf(p->err, p->errlen, "byte %zu: ", at);
        if (n >= 0 && (size_t)n < p->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return st;
}

static void skip_ws(jcs_parser_t *p)
{
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        p->pos++;
    }
}

static jcs_value_t *new_value(jcs_type_t t)
{
    jcs_value_t *v = xcalloc(1, sizeof *v);
    v->type = t;
    return v;
}

static int hex4(const char *s)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= c - '0';
        else if (c >= 'a' && c <= 'f')
            v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            v |= c - 'A' + 10;
        else
            return -1;
    }
    return v;
}

/* Parses a string starting at the opening quote into b (unescaped UTF-8). */
static jcs_status_t parse_string(jcs_parser_t *p, jcs_buf_t *b)
{
    size_t start = p->pos;
    p->pos++; /* opening quote */
    /* most strings are plain text to their closing quote: copied at once, one allocation,
     * where the byte loop below grows the buffer by doubling from 64 bytes */
    size_t run = util_json_plain_len(p->s + p->pos, p->len - p->pos);
    if (p->pos + run < p->len && p->s[p->pos + run] == '"') {
        buf_put(b, p->s + p->pos, run);
        p->pos += run + 1;
        return JCS_OK;
    }
    buf_reserve(b, 0);
    b->p[0] = '\0';
    for (;;) {
        if (p->pos >= p->len)
            return fail(p, JCS_ERR_SYNTAX, start, "unterminated string");
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c == '"') {
            p->pos++;
            return JCS_OK;
        }
        if (c < 0x20)
            return fail(p, JCS_ERR_SYNTAX, p->pos, "unescaped control character in string");
        if (c < 0x80 && c != '\\') {
            /* a run of plain ASCII is copied in one go */
            size_t end = p->pos + util_json_plain_len(p->s + p->pos, p->len - p->pos);
            buf_put(b, p->s + p->pos, end - p->pos);
            p->pos = end;
            continue;
        }
        if (c != '\\') {
            uint32_t cp;
            size_t n = util_utf8_decode((const unsigned char *)p->s + p->pos, p->len - p->pos, &cp);
            if (n == 0)
                return fail(p, JCS_ERR_UTF8, p->pos, "invalid UTF-8 in string");
            buf_put(b, p->s + p->pos, n);
            p->pos += n;
            continue;
        }
        size_t esc = p->pos;
        if (p->pos + 1 >= p->len)
            return fail(p, JCS_ERR_SYNTAX, esc, "unterminated escape");
        char e = p->s[p->pos + 1];
        p->pos += 2;
        /* the two-character escapes, and what each stands for */
        static const char esc_from[] = "\"\\/bfnrt", esc_to[] = "\"\\/\b\f\n\r\t";
        const char *hit = e ? strchr(esc_from, e) : NULL;
        if (hit) {
            buf_putc(b, esc_to[hit - esc_from]);
            continue;
        }
        if (e != 'u')
            return fail(p, JCS_ERR_SYNTAX, esc, "invalid escape character 0x%02x",
                        (unsigned char)e);
        if (p->len - p->pos < 4 || hex4(p->s + p->pos) < 0)
            return fail(p, JCS_ERR_SYNTAX, esc, "invalid \\u escape");
        uint32_t cp = (uint32_t)hex4(p->s + p->pos);
        p->pos += 4;
        if (cp >= 0xDC00 && cp <= 0xDFFF)
            return fail(p, JCS_ERR_UTF8, esc, "lone low surrogate \\u%04x", cp);
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            int lo = -1;
            if (p->len - p->pos >= 6 && p->s[p->pos] == '\\' && p->s[p->pos + 1] == 'u')
                lo = hex4(p->s + p->pos + 2);
            if (lo < 0xDC00 || lo > 0xDFFF)
                return fail(p, JCS_ERR_UTF8, esc, "lone high surrogate \\u%04x", cp);
            cp = 0x10000 + ((cp - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
            p->pos += 6;
        }
        utf8_encode(b, cp);
    }
}

static jcs_status_t parse_number(jcs_parser_t *p, jcs_value_t **out)
{
    size_t start = p->pos, i = p->pos;
    const char *s = p->s;
    bool neg = false, integer = true;
    if (i < p->len && s[i] == '-') {
        neg = true;
        i++;
    }
    size_t int_start = i;
    if (i < p->len && s[i] == '0') {
        i++;
    } else if (i < p->len && s[i] >= '1' && s[i] <= '9') {
        while (i < p->len && s[i] >= '0' && s[i] <= '9')
            i++;
    } else {
        return fail(p, JCS_ERR_SYNTAX, start, "invalid number");
    }
    size_t int_end = i;
    if (i < p->len && s[i] == '.') {
        integer = false;
        i++;
        if (i >= p->len || s[i] < '0' || s[i] > '9')
            return fail(p, JCS_ERR_SYNTAX, i, "digit expected after decimal point");
        while (i < p->len && s[i] >= '0' && s[i] <= '9')
            i++;
    }
    if (i < p->len && (s[i] == 'e' || s[i] == 'E')) {
        integer = false;
        i++;
        if (i < p->len && (s[i] == '+' || s[i] == '-'))
            i++;
        if (i >= p->len || s[i] < '0' || s[i] > '9')
            return fail(p, JCS_ERR_SYNTAX, i, "digit expected in exponent");
        while (i < p->len && s[i] >= '0' && s[i] <= '9')
            i++;
    }
    p->pos = i;

    jcs_value_t *v = new_value(JCS_NUMBER);
    size_t ilen = int_end - int_start;
    if (integer && ilen <= 15) {
        /* an integer of at most 15 digits is exact in a double, and ECMAScript writes an
         * integer below 10^21 as its digits: the literal is its own canonical form (JSON has
         * no leading zeros), but for -0, which is 0. The common case (a JSON-RPC id, a count)
         * skips strtod and the search for the shortest digits. */
        bool zero = ilen == 1 && s[int_start] == '0';
        size_t from = zero ? int_start : start;
        v->u.str.len = i - from;
        v->u.str.s = xstrndup(s + from, v->u.str.len);
        *out = v;
        return JCS_OK;
    }
    char *lit = xstrndup(s + start, i - start);
    double d = strtod(lit, NULL);
    free(lit);
    if (integer && !(ilen == 1 && s[int_start] == '0') &&
        !integer_fits_double(s + int_start, ilen, d)) {
        /* the deliberate departure: keep exact digits of a wide integer */
        v->u.str.len = ilen + (neg ? 1 : 0);
        v->u.str.s = xmalloc(v->u.str.len + 1);
        char *o = v->u.str.s;
        if (neg)
            *o++ = '-';
        memcpy(o, s + int_start, ilen);
        o[ilen] = '\0';
    } else {
        if (!isfinite(d)) {
            free(v);
            return fail(p, JCS_ERR_NUMBER, start, "number does not fit a double");
        }
        char t[32];
        jcs_format_double(d, t);
        v->u.str.len = strlen(t);
        v->u.str.s = xstrndup(t, v->u.str.len);
    }
    *out = v;
    return JCS_OK;
}

static jcs_status_t parse_value(jcs_parser_t *p, int depth, jcs_value_t **out);

static jcs_status_t parse_array(jcs_parser_t *p, int depth, jcs_value_t **out)
{
    jcs_value_t *v = new_value(JCS_ARRAY);
    size_t cap = 0;
    jcs_status_t st = JCS_OK;
    p->pos++; /* [ */
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == ']') {
        p->pos++;
        *out = v;
        return JCS_OK;
    }
    for (;;) {
        jcs_value_t *item;
        st = parse_value(p, depth, &item);
        if (st != JCS_OK)
            goto fail;
        if (v->u.arr.n == cap) {
            cap = cap ? cap * 2 : 4;
            v->u.arr.items = xrealloc(v->u.arr.items, cap * sizeof *v->u.arr.items);
        }
        v->u.arr.items[v->u.arr.n++] = item;
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->pos < p->len && p->s[p->pos] == ']') {
            p->pos++;
            *out = v;
            return JCS_OK;
        }
        st = fail(p, JCS_ERR_SYNTAX, p->pos, "',' or ']' expected");
        goto fail;
    }
fail:
    jcs_free(v);
    return st;
}

static jcs_status_t parse_object(jcs_parser_t *p, int depth, jcs_value_t **out)
{
    jcs_value_t *v = new_value(JCS_OBJECT);
    size_t cap = 0;
    jcs_buf_t name = {0};
    jcs_status_t st = JCS_OK;
    p->pos++; /* { */
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == '}') {
        p->pos++;
        goto done;
    }
    for (;;) {
        skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != '"') {
            st = fail(p, JCS_ERR_SYNTAX, p->pos, "member name expected");
            goto fail;
        }
        size_t name_at = p->pos;
        name.len = 0;
        st = parse_string(p, &name);
        if (st != JCS_OK)
            goto fail;
        skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != ':') {
            st = fail(p, JCS_ERR_SYNTAX, p->pos, "':' expected");
            goto fail;
        }
        p->pos++;
        jcs_value_t *item;
        st = parse_value(p, depth, &item);
        if (st != JCS_OK)
            goto fail;
        if (v->u.obj.n == cap) {
            cap = cap ? cap * 2 : 4;
            v->u.obj.m = xrealloc(v->u.obj.m, cap * sizeof *v->u.obj.m);
        }
        jcs_member_t *m = &v->u.obj.m[v->u.obj.n++];
        m->name = xstrndup(name.p, name.len);
        m->name_len = name.len;
        m->offset = name_at;
        m->value = item;
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->pos < p->len && p->s[p->pos] == '}') {
            p->pos++;
            break;
        }
        st = fail(p, JCS_ERR_SYNTAX, p->pos, "',' or '}' expected");
        goto fail;
    }
    qsort(v->u.obj.m, v->u.obj.n, sizeof *v->u.obj.m, member_cmp);
    for (size_t i = 1; i < v->u.obj.n; i++) {
        jcs_member_t *a = &v->u.obj.m[i - 1], *b = &v->u.obj.m[i];
        if (a->name_len == b->name_len && memcmp(a->name, b->name, a->name_len) == 0) {
            st = fail(p, JCS_ERR_DUPLICATE, b->offset, "duplicate member name");
            goto fail;
        }
    }
done:
    free(name.p);
    *out = v;
    return JCS_OK;
fail:
    free(name.p);
    jcs_free(v);
    return st;
}

static bool match_literal(jcs_parser_t *p, const char *lit)
{
    size_t n = strlen(lit);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, lit, n) != 0)
        return false;
    p->pos += n;
    return true;
}

static jcs_status_t parse_value(jcs_parser_t *p, int depth, jcs_value_t **out)
{
    skip_ws(p);
    if (p->pos >= p->len)
        return fail(p, JCS_ERR_SYNTAX, p->pos, "value expected");
    char c = p->s[p->pos];
    switch (c) {
    case '{':
    case '[':
        if (depth >= JCS_MAX_DEPTH)
            return fail(p, JCS_ERR_DEPTH, p->pos, "nested deeper than %d", JCS_MAX_DEPTH);
        return c == '{' ? parse_object(p, depth + 1, out) : parse_array(p, depth + 1, out);
    case '"': {
        jcs_buf_t b = {0};
        jcs_status_t st = parse_string(p, &b);
        if (st != JCS_OK) {
            free(b.p);
            return st;
        }
        jcs_value_t *v = new_value(JCS_STRING);
        v->u.str.s = b.p;
        v->u.str.len = b.len;
        *out = v;
        return JCS_OK;
    }
    case 't':
        if (match_literal(p, "true")) {
            *out = new_value(JCS_TRUE);
            return JCS_OK;
        }
        break;
    case 'f':
        if (match_literal(p, "false")) {
            *out = new_value(JCS_FALSE);
            return JCS_OK;
        }
        break;
    case 'n':
        if (match_literal(p, "null")) {
            *out = new_value(JCS_NULL);
            return JCS_OK;
        }
        break;
    default:
        if (c == '-' || (c >= '0' && c <= '9'))
            return parse_number(p, out);
        break;
    }
    return fail(p, JCS_ERR_SYNTAX, p->pos, "unexpected character");
}

jcs_status_t jcs_parse(const char *text, size_t len, jcs_value_t **out, char *err, size_t errlen)
{
    jcs_parser_t p = {.s = text, .len = len, .err = err, .errlen = errlen};
    *out = NULL;
    if (err && errlen)
        err[0] = '\0';
    jcs_value_t *v;
    jcs_status_t st = parse_value(&p, 0, &v);
    if (st != JCS_OK)
        return st;
    skip_ws(&p);
    if (p.pos != len) {
        jcs_free(v);
        return fail(&p, JCS_ERR_SYNTAX, p.pos, "trailing characters after the value");
    }
    *out = v;
    return JCS_OK;
}

void jcs_free(jcs_value_t *v)
{
    if (!v)
        return;
    switch (v->type) {
    case JCS_STRING:
    case JCS_NUMBER:
        free(v->u.str.s);
        break;
    case JCS_ARRAY:
        for (size_t i = 0; i < v->u.arr.n; i++)
            jcs_free(v->u.arr.items[i]);
        free(v->u.arr.items);
        break;
    case JCS_OBJECT:
        for (size_t i = 0; i < v->u.obj.n; i++) {
            free(v->u.obj.m[i].name);
            jcs_free(v->u.obj.m[i].value);
        }
        free(v->u.obj.m);
        break;
    default:
        break;
    }
    free(v);
}

/* ---- access ------------------------------------------------------------------------------- */

jcs_type_t jcs_type(const jcs_value_t *v)
{
    return v->type;
}

static jcs_member_t *find_member(const jcs_value_t *v, const char *name, size_t len)
{
    if (!v || v->type != JCS_OBJECT)
        return NULL;
    for (size_t i = 0; i < v->u.obj.n; i++) {
        jcs_member_t *m = &v->u.obj.m[i];
        if (m->name_len == len && memcmp(m->name, name, len) == 0)
            return m;
    }
    return NULL;
}

jcs_value_t *jcs_object_get(const jcs_value_t *v, const char *name)
{
    jcs_member_t *m = find_member(v, name, strlen(name));
    return m ? m->value : NULL;
}

static bool remove_member(jcs_value_t *v, const char *name, size_t len)
{
    jcs_member_t *m = find_member(v, name, len);
    if (!m)
        return false;
    free(m->name);
    jcs_free(m->value);
    size_t i = (size_t)(m - v->u.obj.m);
    /* memmove keeps the canonical order of the rest */
    memmove(m, m + 1, (v->u.obj.n - i - 1) * sizeof *m);
    v->u.obj.n--;
    return true;
}

bool jcs_object_remove(jcs_value_t *v, const char *name)
{
    return remove_member(v, name, strlen(name));
}

/* Names containing a dot cannot be addressed: the path syntax has no escape, which is fine for
 * the argument names tools use. Arrays are not traversed: a path names object members only. */
bool jcs_remove_path(jcs_value_t *root, const char *dotted_path)
{
    jcs_value_t *cur = root;
    const char *seg = dotted_path;
    for (;;) {
        const char *dot = strchr(seg, '.');
        size_t n = dot ? (size_t)(dot - seg) : strlen(seg);
        if (!dot)
            return remove_member(cur, seg, n);
        jcs_member_t *m = find_member(cur, seg, n);
        if (!m)
            return false;
        cur = m->value;
        seg = dot + 1;
    }
}

const char *jcs_string(const jcs_value_t *v, size_t *len)
{
    if (!v || v->type != JCS_STRING)
        return NULL;
    if (len)
        *len = v->u.str.len;
    return v->u.str.s;
}

/* ---- serializer --------------------------------------------------------------------------- */

static void put_string(jcs_buf_t *b, const char *s, size_t len)
{
    buf_putc(b, '"');
    size_t run = 0; /* bytes copied verbatim in one go */
    for (size_t i = 0; i < len; i++) {
        i += util_json_plain_len(s + i, len - i);
        if (i >= len)
            break;
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        buf_put(b, s + run, i - run);
        run = i + 1;
        /* RFC 8785 3.2.2.2: short escapes where JSON has them, \u00xx for other controls */
        static const char short_from[] = "\"\\\b\f\n\r\t", short_to[] = "\"\\bfnrt";
        const char *hit = c ? strchr(short_from, c) : NULL;
        char esc[8];
        if (hit)
            snprintf(esc, sizeof esc, "\\%c", short_to[hit - short_from]);
        else
            snprintf(esc, sizeof esc, "\\u%04x", c);
        buf_put(b, esc, strlen(esc));
    }
    buf_put(b, s + run, len - run);
    buf_putc(b, '"');
}

static void put_value(jcs_buf_t *b, const jcs_value_t *v)
{
    switch (v->type) {
    case JCS_NULL:
        buf_put(b, "null", 4);
        break;
    case JCS_FALSE:
        buf_put(b, "false", 5);
        break;
    case JCS_TRUE:
        buf_put(b, "true", 4);
        break;
    case JCS_NUMBER:
        buf_put(b, v->u.str.s, v->u.str.len);
        break;
    case JCS_STRING:
        put_string(b, v->u.str.s, v->u.str.len);
        break;
    case JCS_ARRAY:
        buf_putc(b, '[');
        for (size_t i = 0; i < v->u.arr.n; i++) {
            if (i)
                buf_putc(b, ',');
            put_value(b, v->u.arr.items[i]);
        }
        buf_putc(b, ']');
        break;
    case JCS_OBJECT:
        buf_putc(b, '{');
        for (size_t i = 0; i < v->u.obj.n; i++) {
            if (i)
                buf_putc(b, ',');
            put_string(b, v->u.obj.m[i].name, v->u.obj.m[i].name_len);
            buf_putc(b, ':');
            put_value(b, v->u.obj.m[i].value);
        }
        buf_putc(b, '}');
        break;
    }
}

/* The serialized length of v when no string needs an escape (a lower bound otherwise): the
 * output buffer is sized once instead of doubling from 64 bytes. */
static size_t plain_size(const jcs_value_t *v)
{
    size_t n = 0;
    switch (v->type) {
    case JCS_STRING:
        return v->u.str.len + 2;
    case JCS_NUMBER:
        return v->u.str.len;
    case JCS_ARRAY:
        for (size_t i = 0; i < v->u.arr.n; i++)
            n += plain_size(v->u.arr.items[i]) + 1;
        return n + 2;
    case JCS_OBJECT:
        for (size_t i = 0; i < v->u.obj.n; i++)
            n += v->u.obj.m[i].name_len + 4 + plain_size(v->u.obj.m[i].value);
        return n + 2;
    default:
        return 5; /* true, false, null */
    }
}

char *jcs_serialize(const jcs_value_t *v, size_t *len)
{
    jcs_buf_t b = {0};
    buf_reserve(&b, plain_size(v));
    b.p[0] = '\0';
    put_value(&b, v);
    if (len)
        *len = b.len;
    return b.p;
}
