#include "mcp.h"
#include "util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

const char *mcp_status_str(mcp_status_t st)
{
    switch (st) {
    case MCP_OK:
        return "ok";
    case MCP_ERR_PARSE:
        return "parse error";
    case MCP_ERR_SHAPE:
        return "not a JSON-RPC object or array";
    }
    return "unknown";
}

const char *mcp_resp_class_str(mcp_resp_class_t c)
{
    switch (c) {
    case MCP_RESP_OTHER:
        return "other";
    case MCP_RESP_RESULT:
        return "result";
    case MCP_RESP_TOOL_ERROR:
        return "tool_error";
    case MCP_RESP_INPUT_REQUIRED:
        return "input_required";
    case MCP_RESP_ERROR:
        return "error";
    case MCP_RESP_FOREIGN:
        return "foreign";
    }
    return "unknown";
}

/* --- a tiny scanner over JSON text, to keep stored results and ids byte for byte --- */

static size_t skip_ws(const char *s, size_t i, size_t n)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
        i++;
    return i;
}

/* Index just past the JSON value starting at i, or n+1 when malformed. */
static size_t skip_value(const char *s, size_t i, size_t n)
{
    if (i >= n)
        return n + 1;
    if (s[i] == '"') {
        /* the next quote not escaped: memchr for the quotes, then the backslashes before one
         * counted (an odd run escapes it). A long string argument is most of a body, and this
         * runs over every body the gateway rewrites or looks into. */
        for (i++; i < n;) {
            const char *q = memchr(s + i, '"', n - i);
            if (!q)
                return n + 1;
            size_t at = (size_t)(q - s), k = at;
            while (k > i && s[k - 1] == '\\')
                k--;
            if ((at - k) % 2 == 0)
                return at + 1;
            i = at + 1;
        }
        return n + 1;
    }
    if (s[i] == '{' || s[i] == '[') {
        int depth = 0;
        for (; i < n; i++) {
            char c = s[i];
            if (c == '"') {
                size_t j = skip_value(s, i, n);
                if (j > n)
                    return n + 1;
                i = j - 1;
            } else if (c == '{' || c == '[') {
                depth++;
            } else if (c == '}' || c == ']') {
                if (--depth == 0)
                    return i + 1;
            }
        }
        return n + 1;
    }
    while (i < n && s[i] != ',' && s[i] != '}' && s[i] != ']' && s[i] != ' ' && s[i] != '\t' &&
           s[i] != '\n' && s[i] != '\r')
        i++;
    return i;
}

/* Where the last member name of an object text is: its name's opening quote, its value,
 * and the span that cutting it out takes (widened by one separating comma: the one after it,
 * else the one before it). */
typedef struct member_pos {
    size_t value, value_end, cut_from, cut_to;
} member_pos_t;

/* Walks the members of the object text s[0..n); false when name is not there or the text is
 * not an object of members (names with escapes are not found). The last one wins, as in
 * jansson and JSON.parse. */
/* The member name s[mstart, kend) (a JSON string, quotes included) is name once unescaped:
 * "idempotency_k\u0065y" is idempotency_key, as every JSON parser downstream reads it. */
static bool name_is(const char *s, size_t mstart, size_t kend, const char *name, size_t nlen)
{
    size_t raw = kend - mstart - 2;
    const char *key = s + mstart + 1;
    /* an escape is longer than the character it stands for: a key shorter than name cannot
     * be it, and one of the same length is it only byte for byte (unless name itself holds a
     * backslash). Most keys are told apart here, without looking for a backslash. */
    if (raw < nlen)
        return false;
    if (raw == nlen && !memchr(name, '\\', nlen))
        return memcmp(key, name, nlen) == 0;
    if (!memchr(key, '\\', raw))
        return raw == nlen && memcmp(key, name, nlen) == 0;
    json_t *j = json_loadb(s + mstart, kend - mstart, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    bool same = j && json_is_string(j) && json_string_length(j) == nlen &&
                memcmp(json_string_value(j), name, nlen) == 0;
    json_decref(j);
    return same;
}

static bool member_find(const char *s, size_t n, const char *name, member_pos_t *pos)
{
    size_t nlen = strlen(name), prev_end = 0;
    bool found = false, first = true;
    size_t i = skip_ws(s, 0, n);
    if (i >= n || s[i] != '{')
        return false;
    i++;
    for (;;) {
        i = skip_ws(s, i, n);
        if (i >= n || s[i] != '"')
            return false;
        size_t mstart = i;
        size_t kend = skip_value(s, i, n);
        if (kend > n)
            return false;
        bool match = name_is(s, mstart, kend, name, nlen);
        i = skip_ws(s, kend, n);
        if (i >= n || s[i] != ':')
            return false;
        size_t vstart = skip_ws(s, i + 1, n);
        size_t vend = skip_value(s, vstart, n);
        if (vend > n)
            return false;
        i = skip_ws(s, vend, n);
        bool more = i < n && s[i] == ',';
        if (match) {
            found = true;
            pos->value = vstart;
            pos->value_end = vend;
            pos->cut_from = more || first ? mstart : prev_end;
            pos->cut_to = more ? skip_ws(s, i + 1, n) : vend;
        }
        if (i < n && s[i] == '}')
            return found;
        if (!more)
            return false;
        prev_end = vend;
        first = false;
        i++;
    }
}

bool mcp_member_span(const char *s, size_t n, const char *name, size_t *off, size_t *vlen)
{
    member_pos_t pos;
    if (!member_find(s, n, name, &pos))
        return false;
    *off = pos.value;
    *vlen = pos.value_end - pos.value;
    return true;
}

bool mcp_member_spans(const char *s, size_t n, const char *const names[], size_t count,
                      mcp_span_t spans[])
{
    for (size_t k = 0; k < count; k++)
        spans[k] = (mcp_span_t){0, 0, false};
    if (count > MCP_SPANS_MAX)
        return false;
    size_t nlens[MCP_SPANS_MAX];
    for (size_t k = 0; k < count; k++)
        nlens[k] = strlen(names[k]);
    size_t i = skip_ws(s, 0, n);
    if (i >= n || s[i] != '{')
        return false;
    i = skip_ws(s, i + 1, n);
    if (i < n && s[i] == '}')
        return true; /* no members */
    for (;;) {
        i = skip_ws(s, i, n);
        if (i >= n || s[i] != '"')
            break;
        size_t mstart = i, kend = skip_value(s, i, n);
        if (kend > n)
            break;
        i = skip_ws(s, kend, n);
        if (i >= n || s[i] != ':')
            break;
        size_t vstart = skip_ws(s, i + 1, n), vend = skip_value(s, vstart, n);
        if (vend > n)
            break;
        /* a name without escapes (nearly all) is compared byte for byte with the names of its
         * length; name_is unescapes the others */
        size_t raw = kend - mstart - 2;
        bool plain = !memchr(s + mstart + 1, '\\', raw);
        for (size_t k = 0; k < count; k++)
            if (plain ? raw == nlens[k] && memcmp(s + mstart + 1, names[k], raw) == 0
                      : name_is(s, mstart, kend, names[k], nlens[k]))
                spans[k] = (mcp_span_t){vstart, vend - vstart, true};
        i = skip_ws(s, vend, n);
        if (i < n && s[i] == '}')
            return true;
        if (i >= n || s[i] != ',')
            break;
        i++;
    }
    for (size_t k = 0; k < count; k++)
        spans[k].present = false;
    return false;
}

char *mcp_without_argument(const char *body, size_t len, const char *name, size_t *out_len)
{
    size_t poff, plen, aoff, alen;
    member_pos_t pos;
    if (!mcp_member_span(body, len, "params", &poff, &plen) ||
        !mcp_member_span(body + poff, plen, "arguments", &aoff, &alen) ||
        !member_find(body + poff + aoff, alen, name, &pos))
        return NULL;
    size_t from = poff + aoff + pos.cut_from, to = poff + aoff + pos.cut_to;
    *out_len = len - (to - from);
    char *out = xmalloc(*out_len + 1);
    memcpy(out, body, from);
    memcpy(out + from, body + to, len - to);
    out[*out_len] = '\0';
    return out;
}

/* --- parsing a POST body --- */

static json_t *load(const char *body, size_t len)
{
    json_error_t err;
    json_t *root = json_loadb(body, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
    if (!root && strstr(err.text, "too big"))
        /* integers wider than 64 bits are valid JSON; keep going with doubles for the view */
        root =
            json_loadb(body, len, JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &err);
    return root;
}

/* --- the fast path: validate and pick out the few members the gateway reads --- */

/* Every POST body is checked to be JSON and classified. Building a jansson tree of it (with a
 * copy of every argument string) cost more than anything else the gateway does per request;
 * this scanner validates the text in one pass without allocating and records where the
 * members it needs are. Batches and member names with escapes take the tree path. */

#define SCAN_MAX_DEPTH 2048

typedef struct span {
    size_t off, len;
    bool present;
} span_t;

typedef struct scan {
    const char *s;
    size_t n;
    bool bail; /* valid so far, but let the tree path decide */
    /* a number with an exponent or of more than 15 characters: one jansson may refuse as out
     * of a double's range, so a classification leaves it to the tree path */
    bool wide_number;
    span_t method, id, params, result, error, name;
} scan_t;

static size_t scan_value(scan_t *sc, size_t i, int depth, int role);

static long scan_u4(const char *s, size_t i, size_t n)
{
    if (i + 4 > n)
        return -1;
    long v = 0;
    for (int k = 0; k < 4; k++) {
        int h = util_hexval(s[i + k]);
        if (h < 0)
            return -1;
        v = v * 16 + h;
    }
    return v;
}

/* Index past the string starting at s[i] == '"', or 0 when invalid. *esc: it had escapes. */
static size_t scan_string(const scan_t *sc, size_t i, bool *esc)
{
    const unsigned char *s = (const unsigned char *)sc->s;
    size_t n = sc->n;
    *esc = false;
    for (i++; i < n;) {
        i += util_json_plain_len(sc->s + i, n - i);
        if (i >= n)
            break;
        unsigned char c = s[i];
        if (c == '"')
            return i + 1;
        if (c < 0x20)
            return 0;
        if (c == '\\') {
            *esc = true;
            if (i + 1 >= n)
                return 0;
            char e = (char)s[i + 1];
            if (e == 'u') {
                long u = scan_u4(sc->s, i + 2, n);
                if (u < 0 || (u >= 0xDC00 && u <= 0xDFFF))
                    return 0;
                i += 6;
                if (u >= 0xD800 && u <= 0xDBFF) {
                    if (i + 1 >= n || s[i] != '\\' || s[i + 1] != 'u')
                        return 0;
                    long lo = scan_u4(sc->s, i + 2, n);
                    if (lo < 0xDC00 || lo > 0xDFFF)
                        return 0;
                    i += 6;
                }
                continue;
            }
            if (!strchr("\"\\/bfnrt", e) || e == '\0')
                return 0;
            i += 2;
            continue;
        }
        if (c < 0x80) {
            i++;
            continue;
        }
        /* UTF-8: shortest form, no surrogates, at most U+10FFFF */
        int extra;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) {
            extra = 1;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            extra = 2;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            extra = 3;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if (i + (size_t)extra >= n)
            return 0;
        for (int k = 1; k <= extra; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((extra == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (extra == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return 0;
        i += (size_t)extra + 1;
    }
    return 0;
}

static size_t scan_number(scan_t *sc, size_t i)
{
    const char *s = sc->s;
    size_t n = sc->n, start = i;
    if (i < n && s[i] == '-')
        i++;
    if (i >= n)
        return 0;
    if (s[i] == '0') {
        i++;
    } else if (s[i] >= '1' && s[i] <= '9') {
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
    } else {
        return 0;
    }
    if (i < n && s[i] == '.') {
        i++;
        if (i >= n || s[i] < '0' || s[i] > '9')
            return 0;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        if (i >= n || s[i] < '0' || s[i] > '9')
            return 0;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        sc->wide_number = true;
    }
    if (i - start > 15)
        sc->wide_number = true;
    return i;
}

static bool key_is(const scan_t *sc, size_t kstart, size_t kend, const char *name)
{
    size_t len = kend - kstart - 2; /* without the quotes */
    return strlen(name) == len && memcmp(sc->s + kstart + 1, name, len) == 0;
}

/* role 1: the top-level object; role 2: its params object; 0: anything else */
static size_t scan_object(scan_t *sc, size_t i, int depth, int role)
{
    i = skip_ws(sc->s, i + 1, sc->n);
    if (i < sc->n && sc->s[i] == '}')
        return i + 1;
    for (;;) {
        if (i >= sc->n || sc->s[i] != '"')
            return 0;
        bool esc;
        size_t kend = scan_string(sc, i, &esc);
        if (!kend)
            return 0;
        if (esc && role)
            sc->bail = true; /* a name we might need to compare is escaped */
        size_t kstart = i;
        i = skip_ws(sc->s, kend, sc->n);
        if (i >= sc->n || sc->s[i] != ':')
            return 0;
        i = skip_ws(sc->s, i + 1, sc->n);
        span_t *slot = NULL;
        int sub = 0;
        if (role == 1) {
            if (key_is(sc, kstart, kend, "method"))
                slot = &sc->method;
            else if (key_is(sc, kstart, kend, "id"))
                slot = &sc->id;
            else if (key_is(sc, kstart, kend, "params"))
                slot = &sc->params, sub = 2;
            else if (key_is(sc, kstart, kend, "result"))
                slot = &sc->result;
            else if (key_is(sc, kstart, kend, "error"))
                slot = &sc->error;
        } else if (role == 2 && key_is(sc, kstart, kend, "name")) {
            slot = &sc->name;
        }
        if (sub && slot && slot->present)
            sc->name.present = false; /* a later params replaces the earlier one */
        size_t vend = scan_value(sc, i, depth + 1, sub && i < sc->n && sc->s[i] == '{' ? sub : 0);
        if (!vend)
            return 0;
        if (slot)
            *slot = (span_t){i, vend - i, true};
        i = skip_ws(sc->s, vend, sc->n);
        if (i < sc->n && sc->s[i] == '}')
            return i + 1;
        if (i >= sc->n || sc->s[i] != ',')
            return 0;
        i = skip_ws(sc->s, i + 1, sc->n);
    }
}

static size_t scan_value(scan_t *sc, size_t i, int depth, int role)
{
    const char *s = sc->s;
    size_t n = sc->n;
    if (i >= n || depth > SCAN_MAX_DEPTH)
        return 0;
    switch (s[i]) {
    case '{':
        return scan_object(sc, i, depth, role);
    case '[':
        i = skip_ws(s, i + 1, n);
        if (i < n && s[i] == ']')
            return i + 1;
        for (;;) {
            i = scan_value(sc, i, depth + 1, 0);
            if (!i)
                return 0;
            i = skip_ws(s, i, n);
            if (i < n && s[i] == ']')
                return i + 1;
            if (i >= n || s[i] != ',')
                return 0;
            i = skip_ws(s, i + 1, n);
        }
    case '"': {
        bool esc;
        return scan_string(sc, i, &esc);
    }
    case 't':
        return n - i >= 4 && memcmp(s + i, "true", 4) == 0 ? i + 4 : 0;
    case 'f':
        return n - i >= 5 && memcmp(s + i, "false", 5) == 0 ? i + 5 : 0;
    case 'n':
        return n - i >= 4 && memcmp(s + i, "null", 4) == 0 ? i + 4 : 0;
    default:
        return scan_number(sc, i);
    }
}

/* A string member's text, or NULL when absent, not a string, or escaped (*bail set). */
static char *span_string(const scan_t *sc, const span_t *sp, bool *bail)
{
    if (!sp->present || sc->s[sp->off] != '"')
        return NULL;
    if (memchr(sc->s + sp->off, '\\', sp->len)) {
        *bail = true;
        return NULL;
    }
    return xstrndup(sc->s + sp->off + 1, sp->len - 2);
}

/* A request id the scanner has validated, as a value. The usual ones, an integer that fits
 * and a string without escapes, are made directly: the parser costs more than the rest of
 * the id's handling together (about 1,200 instructions of a relayed read). */
static json_t *id_value(const char *text, size_t len)
{
    size_t i = text[0] == '-' ? 1 : 0;
    if (len > i && len - i <= 18) {
        size_t d = i;
        while (d < len && text[d] >= '0' && text[d] <= '9')
            d++;
        if (d == len) {
            long long v = 0;
            for (size_t k = i; k < len; k++)
                v = v * 10 + (text[k] - '0');
            return json_integer(i ? -v : v);
        }
    }
    if (len >= 2 && text[0] == '"' && !memchr(text, '\\', len))
        return json_stringn(text + 1, len - 2);
    return load(text, len);
}

/* MCP_OK with out filled, MCP_ERR_PARSE, or -1: not decided here (use the tree path). */
static int parse_fast(const char *body, size_t len, mcp_msg_t *out)
{
    scan_t sc = {.s = body, .n = len};
    size_t i = skip_ws(body, 0, len);
    if (i >= len || body[i] != '{')
        return -1;
    size_t end = scan_value(&sc, i, 1, 1);
    if (!end || skip_ws(body, end, len) != len)
        return sc.bail ? -1 : MCP_ERR_PARSE;
    if (sc.bail)
        return -1;
    bool bail = false;
    char *method = span_string(&sc, &sc.method, &bail);
    char *tool = NULL;
    if (!bail && method && strcmp(method, "tools/call") == 0)
        tool = span_string(&sc, &sc.name, &bail);
    if (bail) {
        free(method);
        free(tool);
        return -1;
    }
    out->own_method = method;
    out->method = method;
    if (method) {
        bool has_id =
            sc.id.present && !(sc.id.len == 4 && memcmp(body + sc.id.off, "null", 4) == 0);
        out->kind = has_id ? MCP_KIND_REQUEST : MCP_KIND_NOTIFICATION;
        out->call_without_id = !has_id && strcmp(method, "tools/call") == 0;
        if (has_id) {
            out->id_text = xstrndup(body + sc.id.off, sc.id.len);
            out->id_off = sc.id.off;
            out->id_at_known = true;
            out->id = id_value(out->id_text, sc.id.len);
            out->own_id = out->id;
        }
        if (has_id && tool) {
            out->own_tool = tool;
            out->tool = tool;
        } else {
            free(tool);
        }
    } else {
        out->kind = sc.result.present || sc.error.present ? MCP_KIND_RESPONSE : MCP_KIND_OTHER;
    }
    return MCP_OK;
}

static void classify_object(mcp_msg_t *m, json_t *obj, const char *text, size_t len)
{
    json_t *method = json_object_get(obj, "method");
    json_t *id = json_object_get(obj, "id");
    if (json_is_string(method)) {
        m->method = json_string_value(method);
        if (id && !json_is_null(id)) {
            m->kind = MCP_KIND_REQUEST;
            m->id = id;
            size_t off, vlen;
            if (text && mcp_member_span(text, len, "id", &off, &vlen))
                m->id_text = xstrndup(text + off, vlen);
            else
                m->id_text = json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT);
        } else {
            m->kind = MCP_KIND_NOTIFICATION;
            m->call_without_id = strcmp(m->method, "tools/call") == 0;
        }
        if (m->kind == MCP_KIND_REQUEST && strcmp(m->method, "tools/call") == 0) {
            json_t *params = json_object_get(obj, "params");
            json_t *name = json_object_get(params, "name");
            if (json_is_string(name))
                m->tool = json_string_value(name);
        }
    } else if (json_object_get(obj, "result") || json_object_get(obj, "error")) {
        m->kind = MCP_KIND_RESPONSE;
    } else {
        m->kind = MCP_KIND_OTHER;
    }
}

mcp_status_t mcp_parse(const char *body, size_t len, mcp_msg_t *out)
{
    memset(out, 0, sizeof(*out));
    int rc = parse_fast(body, len, out);
    if (rc >= 0)
        return (mcp_status_t)rc;
    mcp_msg_free(out);
    return mcp_parse_tree(body, len, out);
}

mcp_status_t mcp_parse_tree(const char *body, size_t len, mcp_msg_t *out)
{
    memset(out, 0, sizeof(*out));
    json_t *root = load(body, len);
    if (!root)
        return MCP_ERR_PARSE;
    if (json_is_object(root)) {
        out->root = root;
        classify_object(out, root, body, len);
        return MCP_OK;
    }
    if (!json_is_array(root) || json_array_size(root) == 0) {
        json_decref(root);
        return MCP_ERR_SHAPE;
    }
    out->root = root;
    out->kind = MCP_KIND_BATCH;
    size_t i;
    json_t *el;
    json_array_foreach(root, i, el)
    {
        if (!json_is_object(el))
            continue;
        mcp_msg_t one = {0};
        classify_object(&one, el, NULL, 0);
        out->call_without_id |= one.call_without_id;
        if (one.kind == MCP_KIND_REQUEST && strcmp(one.method, "tools/call") == 0) {
            if (!one.tool) {
                out->batch_bad_tool = true;
            } else {
                out->batch_tools =
                    xrealloc(out->batch_tools, (out->n_batch_tools + 1) * sizeof(char *));
                out->batch_tools[out->n_batch_tools++] = one.tool;
            }
        }
        free(one.id_text);
    }
    return MCP_OK;
}

static void each_call_in(json_t *obj, mcp_call_fn fn, void *arg)
{
    json_t *method = json_object_get(obj, "method");
    if (!json_is_string(method) || strcmp(json_string_value(method), "tools/call") != 0)
        return;
    json_t *name = json_object_get(json_object_get(obj, "params"), "name");
    json_t *id = json_object_get(obj, "id");
    fn(arg, json_is_string(name) ? json_string_value(name) : NULL, id && !json_is_null(id));
}

mcp_status_t mcp_each_call(const char *body, size_t len, mcp_call_fn fn, void *arg)
{
    json_t *root = load(body, len);
    if (!root)
        return MCP_ERR_PARSE;
    if (json_is_object(root)) {
        each_call_in(root, fn, arg);
    } else if (json_is_array(root)) {
        size_t i;
        json_t *el;
        json_array_foreach(root, i, el) each_call_in(el, fn, arg);
    }
    json_decref(root);
    return MCP_OK;
}

void mcp_msg_free(mcp_msg_t *m)
{
    if (m->root)
        json_decref(m->root);
    if (m->own_id)
        json_decref(m->own_id);
    free(m->own_method);
    free(m->own_tool);
    free(m->id_text);
    free(m->batch_tools);
    memset(m, 0, sizeof(*m));
}

/* --- the response stream --- */

static bool ids_equal(const json_t *a, const json_t *b)
{
    if (json_is_number(a) && json_is_number(b))
        return json_number_value(a) == json_number_value(b);
    return json_equal((json_t *)a, (json_t *)b);
}

/* Whether text is one JSON value that jansson loads too, told by the scanner without building
 * a tree; false also when it has a number jansson might refuse (the tree path then decides). */
static bool scan_plain(const char *text, size_t len)
{
    scan_t sc = {.s = text, .n = len};
    size_t end = scan_value(&sc, skip_ws(text, 0, len), 1, 0);
    return end && skip_ws(text, end, len) == len && !sc.wide_number;
}

/* A member value's text is the JSON string want (escaped or not). */
static bool span_is_string(const char *text, const mcp_span_t *sp, const char *want)
{
    size_t n = strlen(want);
    if (!sp->present || sp->len < 2 || text[sp->off] != '"')
        return false;
    if (!memchr(text + sp->off, '\\', sp->len))
        return sp->len == n + 2 && memcmp(text + sp->off + 1, want, n) == 0;
    json_t *j = json_loadb(text + sp->off, sp->len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    bool same = json_is_string(j) && json_string_length(j) == n &&
                memcmp(json_string_value(j), want, n) == 0;
    json_decref(j);
    return same;
}

/* mcp_classify_response on a text the scanner validated: the members read where they are,
 * only the id parsed. Every answer of a protected call is classified, and loading it into a
 * tree cost more than the rest of its recording. */
static mcp_resp_class_t classify_spans(const char *text, size_t len, const json_t *req_id,
                                       size_t *result_off, size_t *result_len)
{
    enum { T_ID, T_METHOD, T_RESULT, T_ERROR, T_COUNT };
    static const char *const top[T_COUNT] = {"id", "method", "result", "error"};
    mcp_span_t m[T_COUNT];
    if (!mcp_member_spans(text, len, top, T_COUNT, m) || !m[T_ID].present || !req_id ||
        m[T_METHOD].present)
        return MCP_RESP_OTHER;
    json_t *id = load(text + m[T_ID].off, m[T_ID].len);
    bool same = id && ids_equal(id, req_id);
    json_decref(id);
    if (!same)
        /* the gateway rewrites no id: a response carrying another one answers someone else */
        return m[T_RESULT].present || m[T_ERROR].present ? MCP_RESP_FOREIGN : MCP_RESP_OTHER;
    if (m[T_RESULT].present && text[m[T_RESULT].off] == '{') {
        enum { R_TYPE, R_IS_ERROR, R_COUNT };
        static const char *const inner[R_COUNT] = {"resultType", "isError"};
        mcp_span_t r[R_COUNT];
        mcp_member_spans(text + m[T_RESULT].off, m[T_RESULT].len, inner, R_COUNT, r);
        mcp_resp_class_t cls = MCP_RESP_RESULT;
        if (span_is_string(text + m[T_RESULT].off, &r[R_TYPE], "input_required"))
            cls = MCP_RESP_INPUT_REQUIRED;
        else if (r[R_IS_ERROR].present && r[R_IS_ERROR].len == 4 &&
                 memcmp(text + m[T_RESULT].off + r[R_IS_ERROR].off, "true", 4) == 0)
            cls = MCP_RESP_TOOL_ERROR;
        *result_off = m[T_RESULT].off;
        *result_len = m[T_RESULT].len;
        return cls;
    }
    if (m[T_ERROR].present) {
        *result_off = m[T_ERROR].off;
        *result_len = m[T_ERROR].len;
        return MCP_RESP_ERROR;
    }
    return MCP_RESP_OTHER;
}

mcp_resp_class_t mcp_classify_response(const char *text, size_t len, const json_t *req_id,
                                       size_t *result_off, size_t *result_len)
{
    if (scan_plain(text, len))
        return classify_spans(text, len, req_id, result_off, result_len);
    mcp_resp_class_t cls = MCP_RESP_OTHER;
    json_t *msg = load(text, len);
    if (!json_is_object(msg))
        goto out;
    json_t *id = json_object_get(msg, "id");
    if (!id || !req_id || json_object_get(msg, "method"))
        goto out;
    json_t *result = json_object_get(msg, "result");
    json_t *error = json_object_get(msg, "error");
    if (!ids_equal(id, req_id)) {
        /* the gateway rewrites no id: a response carrying another one answers someone else */
        if (result || error)
            cls = MCP_RESP_FOREIGN;
        goto out;
    }
    if (json_is_object(result)) {
        json_t *rt = json_object_get(result, "resultType");
        if (json_is_string(rt) && strcmp(json_string_value(rt), "input_required") == 0)
            cls = MCP_RESP_INPUT_REQUIRED;
        else if (json_is_true(json_object_get(result, "isError")))
            cls = MCP_RESP_TOOL_ERROR;
        else
            cls = MCP_RESP_RESULT;
        if (!mcp_member_span(text, len, "result", result_off, result_len)) {
            cls = MCP_RESP_ERROR; /* cannot keep it verbatim: treat as not storable */
        }
    } else if (error) {
        cls = MCP_RESP_ERROR;
        if (!mcp_member_span(text, len, "error", result_off, result_len))
            *result_off = *result_len = 0;
    }
out:
    if (msg)
        json_decref(msg);
    return cls;
}

/* --- bodies the gateway writes --- */

static char *json_str(const char *s)
{
    json_t *j = json_string(s);
    char *out = json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT);
    json_decref(j);
    return out;
}

char *mcp_error_body(const char *id_text, int code, const char *message)
{
    char *msg = json_str(message);
    char *out = xasprintf("{\"jsonrpc\":\"2.0\",\"id\":%s,\"error\":{\"code\":%d,\"message\":%s}}",
                          id_text ? id_text : "null", code, msg);
    free(msg);
    return out;
}

char *mcp_tool_text_body(const char *id_text, const char *text, const char *status_json,
                         bool is_error)
{
    char *t = json_str(text);
    char *meta = status_json ? xasprintf(",\"_meta\":{\"idemgw/status\":%s}", status_json) : NULL;
    char *out = xasprintf("{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":"
                          "\"text\",\"text\":%s}]%s%s}}",
                          id_text ? id_text : "null", t, is_error ? ",\"isError\":true" : "",
                          meta ? meta : "");
    free(meta);
    free(t);
    return out;
}

char *mcp_tool_error_body(const char *id_text, const char *text, const char *status_json)
{
    return mcp_tool_text_body(id_text, text, status_json, true);
}

char *mcp_replay_body(const char *id_text, const char *result, size_t result_len,
                      const char *marker_json)
{
    size_t i = skip_ws(result, 0, result_len);
    if (i >= result_len || result[i] != '{')
        return NULL;
    size_t off, vlen;
    if (!mcp_member_span(result, result_len, "_meta", &off, &vlen)) {
        /* common case: splice the marker in front, leaving the stored bytes untouched */
        size_t j = skip_ws(result, i + 1, result_len);
        bool empty = j < result_len && result[j] == '}';
        return xasprintf(
            "{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"_meta\":{\"idemgw/replay\":%s}%s%.*s}",
            id_text ? id_text : "null", marker_json, empty ? "" : ",", (int)(result_len - i - 1),
            result + i + 1);
    }
    /* the result has its own _meta: add our member inside it */
    size_t k = skip_ws(result, off, result_len);
    if (k >= result_len || result[k] != '{')
        return NULL;
    size_t j = skip_ws(result, k + 1, result_len);
    bool empty = j < result_len && result[j] == '}';
    return xasprintf("{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":%.*s{\"idemgw/replay\":%s%s%.*s}",
                     id_text ? id_text : "null", (int)k, result, marker_json, empty ? "" : ",",
                     (int)(result_len - k - 1), result + k + 1);
}
