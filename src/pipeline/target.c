/* The request target's normal form (see target.h). */
#include "target.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

static bool unreserved(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '.' || c == '_' || c == '~';
}

/* The path with escapes of unreserved characters decoded, the others upper-cased, and '\'
 * read as '/'. NULL on a broken escape, and on an escaped '/' or '\': the gateway routes on
 * segments it sees, while a server that decodes %2F before its own routing (or a proxy in
 * front of it) sees other segments, so /ab/..%2Fa/mcp would be server ab's path here and
 * server a's endpoint there. No client of MCP needs one. */
static char *decode_path(const char *p, size_t n, target_status_t *st)
{
    static const char hex[] = "0123456789ABCDEF";
    char *out = xmalloc(n + 1), *w = out;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '\\') {
            *w++ = '/';
        } else if (c != '%') {
            *w++ = (char)c;
        } else {
            int hi = i + 1 < n ? util_hexval(p[i + 1]) : -1;
            int lo = i + 2 < n ? util_hexval(p[i + 2]) : -1;
            if (hi < 0 || lo < 0) {
                free(out);
                *st = TARGET_ERR_ESCAPE;
                return NULL;
            }
            unsigned char v = (unsigned char)(hi << 4 | lo);
            if (v == '/' || v == '\\') {
                free(out);
                *st = TARGET_ERR_ENCODED_SLASH;
                return NULL;
            }
            if (unreserved(v)) {
                *w++ = (char)v;
            } else {
                *w++ = '%';
                *w++ = hex[hi];
                *w++ = hex[lo];
            }
            i += 2;
        }
    }
    *w = '\0';
    return out;
}

/* RFC 3986 5.2.4 on a path that starts with '/', dropping empty segments too. */
static char *resolve_dots(const char *in)
{
    size_t n = strlen(in);
    char *out = xmalloc(n + 2);
    size_t len = 0;   /* out holds "/seg/seg", without a trailing '/' */
    bool dir = false; /* the result ends in '/' */
    for (const char *s = in; *s;) {
        if (*s == '/') {
            s++;
            continue;
        }
        size_t sl = strcspn(s, "/");
        if (sl == 1 && s[0] == '.') {
            dir = true;
        } else if (sl == 2 && s[0] == '.' && s[1] == '.') {
            while (len > 0 && out[len - 1] != '/')
                len--;
            if (len > 0)
                len--;
            dir = true;
        } else {
            out[len++] = '/';
            memcpy(out + len, s, sl);
            len += sl;
            dir = false;
        }
        s += sl;
    }
    if (n > 0 && in[n - 1] == '/')
        dir = true;
    if (len == 0 || dir)
        out[len++] = '/';
    out[len] = '\0';
    return out;
}

target_status_t target_normalize(const char *raw, target_t *out)
{
    memset(out, 0, sizeof(*out));
    if (strchr(raw, '#'))
        return TARGET_ERR_FRAGMENT;
    if (strcmp(raw, "*") == 0) {
        out->path = xstrdup("*");
        return TARGET_OK;
    }
    const char *rest = raw;
    if (strncasecmp(raw, "http://", 7) == 0 || strncasecmp(raw, "https://", 8) == 0) {
        const char *a = strstr(raw, "://") + 3;
        size_t alen = strcspn(a, "/?\\");
        if (memchr(a, '@', alen))
            return TARGET_ERR_USERINFO;
        if (alen == 0)
            return TARGET_ERR_FORM;
        out->authority = xstrndup(a, alen);
        rest = a + alen;
    } else if (raw[0] != '/' && raw[0] != '\\') {
        return TARGET_ERR_FORM;
    }
    const char *q = strchr(rest, '?');
    size_t plen = q ? (size_t)(q - rest) : strlen(rest);
    if (q)
        out->query = xstrdup(q + 1);
    target_status_t st = TARGET_OK;
    char *decoded = decode_path(plen ? rest : "/", plen ? plen : 1, &st);
    if (!decoded)
        return st;
    if (decoded[0] != '/') {
        free(decoded);
        return TARGET_ERR_FORM;
    }
    out->path = resolve_dots(decoded);
    free(decoded);
    return TARGET_OK;
}

void target_free(target_t *t)
{
    free(t->path);
    free(t->query);
    free(t->authority);
    memset(t, 0, sizeof(*t));
}

const char *target_status_str(target_status_t st)
{
    switch (st) {
    case TARGET_OK:
        return "ok";
    case TARGET_ERR_FORM:
        return "the request target is neither a path nor an http(s) URL";
    case TARGET_ERR_FRAGMENT:
        return "the request target holds a fragment ('#'); send the path without it";
    case TARGET_ERR_ESCAPE:
        return "the request target holds a '%' not followed by two hex digits";
    case TARGET_ERR_USERINFO:
        return "the request target's authority holds user information ('@')";
    case TARGET_ERR_ENCODED_SLASH:
        return "the request target's path holds an escaped '/' or '\\' (%2F or %5C), which servers "
               "split into segments differently; send the path unescaped";
    }
    return "unknown";
}

/* The next segment of a path for comparison: [*s, end) without ";parameters". */
static size_t next_segment(const char **s, const char **seg)
{
    while (**s == '/')
        (*s)++;
    *seg = *s;
    size_t n = strcspn(*s, "/");
    *s += n;
    return strcspn(*seg, ";/") < n ? strcspn(*seg, ";/") : n;
}

bool target_is_endpoint(const char *path, const char *endpoint)
{
    const char *a = path, *b = endpoint;
    for (;;) {
        const char *sa, *sb;
        size_t na = next_segment(&a, &sa), nb = next_segment(&b, &sb);
        bool enda = na == 0 && *a == '\0', endb = nb == 0 && *b == '\0';
        if (enda || endb)
            return enda && endb;
        if (na != nb || strncasecmp(sa, sb, na) != 0)
            return false;
    }
}

char *target_origin_form(const char *path, const char *query)
{
    return query ? xasprintf("%s?%s", path, query) : xstrdup(path);
}
