/* Which request bodies the router relays without reading them as MCP (see body_rules.h). */
#include "body_rules.h"

#include <llhttp.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

body_rules_status_t body_rules_method(int method, const char *content_length,
                                      const char *transfer_encoding, size_t body_len)
{
    if (method != HTTP_GET && method != HTTP_HEAD && method != HTTP_DELETE && method != HTTP_TRACE)
        return BODY_RULES_OK;
    /* llhttp has checked Content-Length's digits; any digit but 0 is a body */
    bool declared = content_length && strspn(content_length, "0 \t") != strlen(content_length);
    return body_len > 0 || declared || transfer_encoding ? BODY_RULES_ERR_METHOD : BODY_RULES_OK;
}

static bool is_ows(char c)
{
    return c == ' ' || c == '\t';
}

/* The media type's "type/subtype" of a Content-Type value: its start and length, parameters
 * and surrounding whitespace left out. */
static size_t media_type(const char *ct, const char **start)
{
    while (is_ows(*ct))
        ct++;
    size_t n = strcspn(ct, ";");
    while (n > 0 && is_ows(ct[n - 1]))
        n--;
    *start = ct;
    return n;
}

/* Whether a charset parameter names UTF-8 or a subset of it. */
static bool utf8_charset(const char *v, size_t n)
{
    if (n >= 2 && v[0] == '"' && v[n - 1] == '"') {
        v++;
        n -= 2;
    }
    return util_strncaseeq(v, n, "utf-8") || util_strncaseeq(v, n, "us-ascii");
}

/* Whether every charset parameter of a Content-Type value names UTF-8: a server that honours
 * another (body-parser decodes UTF-16 and UTF-7 through iconv-lite) reads other characters
 * from the bytes than the gateway's scan did. */
static bool charset_ok(const char *ct)
{
    for (const char *p = strchr(ct, ';'); p; p = strchr(p, ';')) {
        p++;
        while (is_ows(*p))
            p++;
        size_t name = strcspn(p, "=;");
        if (p[name] != '=')
            continue;
        const char *v = p + name + 1;
        size_t vlen = strcspn(v, ";");
        while (vlen > 0 && is_ows(v[vlen - 1]))
            vlen--;
        while (name > 0 && is_ows(p[name - 1]))
            name--;
        if (util_strncaseeq(p, name, "charset") && !utf8_charset(v, vlen))
            return false;
    }
    return true;
}

/* One code unit of w bytes (2 or 4) at s. */
static uint32_t unit_at(const unsigned char *s, size_t w, bool big_endian)
{
    uint32_t v = 0;
    for (size_t i = 0; i < w; i++)
        v = v << 8 | s[big_endian ? i : w - 1 - i];
    return v;
}

/* Whether the bytes, read as code units of w bytes, are an optional byte order mark and JSON
 * whitespace, then '{' or '[': the start of a JSON text in UTF-16 or UTF-32, with or without
 * its BOM, as Python's json.loads detects one from the NULs of its first four bytes. A JSON
 * text opens with an ASCII character, so no other start is one. */
static bool wide_json(const unsigned char *s, size_t len, size_t w, bool big_endian)
{
    size_t i = len >= w && unit_at(s, w, big_endian) == 0xFEFF ? w : 0;
    for (; i + w <= len; i += w) {
        uint32_t c = unit_at(s + i, w, big_endian);
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            return c == '{' || c == '[';
    }
    return false;
}

/* A UTF-16 (FF FE, FE FF) or UTF-32 (FF FE 00 00, 00 00 FE FF) byte order mark. */
static bool wide_bom(const unsigned char *s, size_t len)
{
    if (len >= 2 && ((s[0] == 0xFF && s[1] == 0xFE) || (s[0] == 0xFE && s[1] == 0xFF)))
        return true;
    return len >= 4 && s[0] == 0 && s[1] == 0 && s[2] == 0xFE && s[3] == 0xFF;
}

body_rules_status_t body_rules_encoding(const char *content_type, const char *body, size_t len)
{
    if (content_type && !charset_ok(content_type))
        return BODY_RULES_ERR_CHARSET;
    const unsigned char *s = (const unsigned char *)body;
    if (wide_bom(s, len))
        return BODY_RULES_ERR_WIDE;
    for (size_t w = 2; w <= 4; w += 2)
        if (wide_json(s, len, w, true) || wide_json(s, len, w, false))
            return BODY_RULES_ERR_WIDE;
    return BODY_RULES_OK;
}

/* The media types relayed as bytes, not required to be UTF-8 text. Each is safe for the same
 * two reasons: a framework that honours the media type does not read them as text (Express's
 * json, text and urlencoded parsers and the MCP SDKs' transports, which answer 415 to anything
 * but application/json, skip them; body-parser's raw() hands over a Buffer, whose toString()
 * is UTF-8), and a framework that ignores the media type (Python's json.loads on the bytes, as
 * Starlette's request.json() and Flask's get_json(force=True) do) reads UTF-16 or UTF-32 only
 * from a BOM or the NULs of the first bytes, which body_rules_encoding refuses on every body,
 * and UTF-8 JSON, which the router scans on every body that opens like JSON. Uploads of
 * pictures, sound, video and opaque files are what such a body is; text types (text/..., JSON,
 * XML, forms, multipart) are not on the list, as a server may decode them by a charset or a
 * guess. */
static const char *const binary_prefixes[] = {"image/", "audio/", "video/"};
static const char *const binary_types[] = {"application/octet-stream"};

bool body_rules_binary_type(const char *content_type)
{
    if (!content_type)
        return false;
    const char *t;
    size_t n = media_type(content_type, &t);
    for (size_t i = 0; i < ARRAY_LEN(binary_types); i++)
        if (util_strncaseeq(t, n, binary_types[i]))
            return true;
    for (size_t i = 0; i < ARRAY_LEN(binary_prefixes); i++) {
        size_t pl = strlen(binary_prefixes[i]);
        if (n > pl && strncasecmp(t, binary_prefixes[i], pl) == 0)
            return true;
    }
    return false;
}

body_rules_status_t body_rules_text(const char *content_type, const char *body, size_t len)
{
    if (body_rules_binary_type(content_type))
        return BODY_RULES_OK;
    size_t valid = util_utf8_valid_prefix(body, len);
    if (valid == len)
        return BODY_RULES_OK;
    return body[valid] == '\0' ? BODY_RULES_ERR_NUL : BODY_RULES_ERR_UTF8;
}

const char *body_rules_status_str(body_rules_status_t st)
{
    switch (st) {
    case BODY_RULES_OK:
        return "ok";
    case BODY_RULES_ERR_METHOD:
        return "a GET, HEAD, DELETE or TRACE request carries no body (a Content-Length above 0 "
               "or a Transfer-Encoding), since a server may read one and run the call in it; "
               "send MCP messages as a POST";
    case BODY_RULES_ERR_CHARSET:
        return "off the MCP endpoint a body is relayed only as UTF-8: the Content-Type names "
               "another charset";
    case BODY_RULES_ERR_WIDE:
        return "off the MCP endpoint a body is relayed only as UTF-8: this one is UTF-16 or "
               "UTF-32 (a byte order mark, or JSON in wide characters), which a server may "
               "decode into a call the gateway did not see";
    case BODY_RULES_ERR_NUL:
        return "off the MCP endpoint a body is relayed only as UTF-8 text, or as bytes with an "
               "image/, audio/, video/ or application/octet-stream Content-Type: this one holds "
               "a NUL byte";
    case BODY_RULES_ERR_UTF8:
        return "off the MCP endpoint a body is relayed only as UTF-8 text, or as bytes with an "
               "image/, audio/, video/ or application/octet-stream Content-Type: this one is not "
               "valid UTF-8";
    }
    return "unknown";
}
