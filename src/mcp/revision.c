/* The request's protocol revision and answers that fit it (see include/revision.h). */
#include "revision.h"

#include <ctype.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

#define BASE64_PREFIX "=?base64?"
#define BASE64_SUFFIX "?="

const char *revision_str(revision_t r)
{
    return r == REVISION_2026 ? REVISION_FIRST_2026 : "2025";
}

static bool is_date(const char *v)
{
    /* YYYY-MM-DD, as every revision is named */
    for (int i = 0; i < 10; i++) {
        bool dash = i == 4 || i == 7;
        if (dash ? v[i] != '-' : !isdigit((unsigned char)v[i]))
            return false;
    }
    return v[10] == '\0';
}

revision_t revision_of_version(const char *version)
{
    if (!version || !is_date(version))
        return REVISION_2025;
    return strcmp(version, REVISION_FIRST_2026) >= 0 ? REVISION_2026 : REVISION_2025;
}

revision_t revision_of_request(const char *header_version, const char *meta_version)
{
    if (revision_of_version(header_version) == REVISION_2026 ||
        revision_of_version(meta_version) == REVISION_2026)
        return REVISION_2026;
    return REVISION_2025;
}

/* params of a request object text, parsed (the caller frees it), or NULL. The scanner finds
 * the member without building the rest of the body; names written with escapes are not found,
 * as everywhere the gateway reads a body without parsing it. */
static json_t *params_of(const char *body, size_t len)
{
    size_t off, vlen;
    if (!body || !mcp_member_span(body, len, "params", &off, &vlen))
        return NULL;
    json_t *p = json_loadb(body + off, vlen, 0, NULL);
    if (!json_is_object(p)) {
        json_decref(p);
        return NULL;
    }
    return p;
}

char *revision_meta_version(const char *body, size_t len)
{
    size_t off, vlen, moff, mlen;
    if (!body || !mcp_member_span(body, len, "params", &off, &vlen) ||
        !mcp_member_span(body + off, vlen, "_meta", &moff, &mlen))
        return NULL;
    json_t *meta = json_loadb(body + off + moff, mlen, 0, NULL);
    const char *v = json_string_value(json_object_get(meta, REVISION_META_VERSION));
    char *out = v ? xstrdup(v) : NULL;
    json_decref(meta);
    return out;
}

char *revision_header_value(const char *value, size_t *out_len)
{
    size_t n = strlen(value), pl = strlen(BASE64_PREFIX), sl = strlen(BASE64_SUFFIX);
    if (n < pl + sl || strncmp(value, BASE64_PREFIX, pl) != 0 ||
        strcmp(value + n - sl, BASE64_SUFFIX) != 0) {
        if (out_len)
            *out_len = n;
        return xstrdup(value);
    }
    const char *b64 = value + pl;
    size_t blen = n - pl - sl;
    if (blen % 4 != 0)
        return NULL;
    for (size_t i = 0; i < blen; i++) {
        char c = b64[i];
        bool pad = c == '=' && (i == blen - 1 || (i == blen - 2 && b64[blen - 1] == '='));
        if (!isalnum((unsigned char)c) && c != '+' && c != '/' && !pad)
            return NULL;
    }
    unsigned char *out = xmalloc(blen / 4 * 3 + 1);
    int got = blen ? EVP_DecodeBlock(out, (const unsigned char *)b64, (int)blen) : 0;
    if (got < 0) {
        free(out);
        return NULL;
    }
    /* EVP_DecodeBlock counts the padding's bytes too */
    size_t dlen = (size_t)got;
    if (blen && b64[blen - 1] == '=')
        dlen--;
    if (blen > 1 && b64[blen - 2] == '=')
        dlen--;
    out[dlen] = '\0';
    if (!util_utf8_valid((const char *)out, dlen)) {
        free(out);
        return NULL;
    }
    if (out_len)
        *out_len = dlen;
    return (char *)out;
}

/* The body member Mcp-Name mirrors for method, or NULL when the method has none. */
static const char *name_member(const char *method)
{
    if (strcmp(method, "tools/call") == 0 || strcmp(method, "prompts/get") == 0)
        return "name";
    if (strcmp(method, "resources/read") == 0)
        return "uri";
    return NULL;
}

static const char *name_mismatch(const char *header, const mcp_msg_t *m, const char *body,
                                 size_t len)
{
    const char *member = name_member(m->method);
    if (!member)
        return NULL; /* no name to mirror: the header is the client's business */
    size_t hlen;
    char *want = revision_header_value(header, &hlen);
    if (!want)
        return "Mcp-Name header is not valid base64 of UTF-8 text";
    const char *why = NULL;
    json_t *params = NULL;
    const char *have = m->tool; /* tools/call: the name the gateway classified */
    if (strcmp(m->method, "tools/call") != 0) {
        params = params_of(body, len);
        have = json_string_value(json_object_get(params, member));
    }
    if (!have || strlen(have) != hlen || memcmp(have, want, hlen) != 0)
        why = strcmp(member, "uri") == 0 ? "Mcp-Name header does not match the body's uri"
                                         : "Mcp-Name header does not match the body's name";
    json_decref(params);
    free(want);
    return why;
}

const char *revision_header_mismatch(const revision_headers_t *h, const mcp_msg_t *m,
                                     const char *body, size_t len)
{
    if (m->kind == MCP_KIND_BATCH)
        return NULL; /* the headers mirror one request; a batch is 2025-03-26 only */
    if (h->method && m->method && strcmp(h->method, m->method) != 0)
        return "Mcp-Method header does not match the body's method";
    if (h->name && m->method && m->kind == MCP_KIND_REQUEST) {
        const char *why = name_mismatch(h->name, m, body, len);
        if (why)
            return why;
    }
    if (h->protocol_version && m->kind == MCP_KIND_REQUEST) {
        char *claim = revision_meta_version(body, len);
        bool differs = claim && strcmp(claim, h->protocol_version) != 0;
        free(claim);
        if (differs)
            return "MCP-Protocol-Version header does not match the body's "
                   "_meta[\"" REVISION_META_VERSION "\"]";
    }
    return NULL;
}

char *revision_fit(char *body, revision_t r)
{
    if (r != REVISION_2026 || !body)
        return body;
    size_t len = strlen(body), off, vlen, roff, rlen;
    if (!mcp_member_span(body, len, "result", &off, &vlen) || vlen == 0 || body[off] != '{')
        return body;
    /* a result that says what it is (complete, input_required, task) is left as it is; one
     * whose member name is written with escapes is not seen here, and keeps its own value, as
     * the member added below comes first and JSON parsers take the last */
    if (mcp_member_span(body + off, vlen, "resultType", &roff, &rlen))
        return body;
    size_t inner = off + 1;
    while (inner < off + vlen && strchr(" \t\r\n", body[inner]))
        inner++;
    bool empty = body[inner] == '}';
    char *out = xasprintf("%.*s\"resultType\":\"complete\"%s%s", (int)(off + 1), body,
                          empty ? "" : ",", body + off + 1);
    free(body);
    return out;
}

/* A header value as it is when plain printable ASCII without edge spaces, else in the base64
 * form; NULL when it cannot be given (too long). */
static char *header_value(const char *v)
{
    size_t len = strlen(v);
    bool plain = len > 0 && v[0] != ' ' && v[len - 1] != ' ';
    for (size_t i = 0; plain && i < len; i++)
        plain = (unsigned char)v[i] >= 0x20 && (unsigned char)v[i] < 0x7f;
    if (plain)
        return xstrdup(v);
    if (len > 4096)
        return NULL;
    unsigned char *b64 = xmalloc(4 * ((len + 2) / 3) + 1);
    EVP_EncodeBlock(b64, (const unsigned char *)v, (int)len);
    char *out = xasprintf("=?base64?%s?=", (const char *)b64);
    free(b64);
    return out;
}

char *revision_mirror_headers(const json_t *msg)
{
    json_t *params = json_object_get(msg, "params");
    const char *method = json_string_value(json_object_get(msg, "method"));
    const char *version =
        json_string_value(json_object_get(json_object_get(params, "_meta"), REVISION_META_VERSION));
    if (!method || !json_object_get(msg, "id") || revision_of_version(version) != REVISION_2026)
        return NULL;
    const char *member = strcmp(method, "resources/read") == 0 ? "uri"
                         : strcmp(method, "tools/call") == 0 || strcmp(method, "prompts/get") == 0
                             ? "name"
                             : NULL;
    const char *name = member ? json_string_value(json_object_get(params, member)) : NULL;
    char *m = header_value(method), *n = name ? header_value(name) : NULL;
    char *out = m ? xasprintf("MCP-Protocol-Version: %s\r\nMcp-Method: %s\r\n%s%s%s", version, m,
                              n ? "Mcp-Name: " : "", n ? n : "", n ? "\r\n" : "")
                  : NULL;
    free(m);
    free(n);
    return out;
}
