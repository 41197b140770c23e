/* Assigned JSON-RPC ids: the request and cancel rewritten, the answer mapped back (rpc_id.h). */
#include "rpc_id.h"
#include "mcp.h"
#include "event_mem.h"

#include <event2/buffer.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *rpc_id_status_str(rpc_id_status_t st)
{
    switch (st) {
    case RPC_ID_OK:
        return "ok";
    case RPC_ID_DESYNC:
        return "desync";
    case RPC_ID_TOO_LARGE:
        return "too_large";
    case RPC_ID_UNREADABLE:
        return "unreadable";
    }
    return "?";
}

void rpc_id_format(char out[RPC_ID_TEXT_MAX], const char *nonce, uint64_t n)
{
    /* written by hand: snprintf's format machinery was a visible part of what a relayed
     * request costs the gateway */
    char digits[20];
    size_t nd = 0;
    do {
        digits[nd++] = (char)('0' + n % 10);
        n /= 10;
    } while (n);
    size_t hex = strnlen(nonce, 16);
    char *p = out;
    memcpy(p, "\"idemgw-", 8);
    p += 8;
    memcpy(p, nonce, hex);
    p += hex;
    *p++ = '-';
    while (nd)
        *p++ = digits[--nd];
    *p++ = '"';
    *p = '\0';
}

/* A member's value, parsed (integers as reals: every valid number loads, and 1 is 1.0). */
static json_t *value_at(const char *text, size_t off, size_t vlen)
{
    return json_loadb(text + off, vlen, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, NULL);
}

bool rpc_id_same(const char *a, size_t alen, const char *b, size_t blen)
{
    if (alen == blen && memcmp(a, b, alen) == 0)
        return true;
    /* two strings without escapes are the same only byte for byte: an answer to another
     * request, the common way to differ, is told without parsing */
    if (alen && blen && a[0] == '"' && b[0] == '"' && !memchr(a, '\\', alen) &&
        !memchr(b, '\\', blen))
        return false;
    json_t *x = value_at(a, 0, alen), *y = value_at(b, 0, blen);
    bool same = x && y && json_equal(x, y);
    json_decref(x);
    json_decref(y);
    return same;
}

/* text with the span [off, off + vlen) replaced by value. */
static char *splice(const char *text, size_t len, size_t off, size_t vlen, const char *value,
                    size_t *out_len)
{
    size_t n = strlen(value);
    *out_len = len - vlen + n;
    char *out = xmalloc(*out_len + 1);
    memcpy(out, text, off);
    memcpy(out + off, value, n);
    memcpy(out + off + n, text + off + vlen, len - off - vlen);
    out[*out_len] = '\0';
    return out;
}

char *rpc_id_set_request_id(const char *body, size_t len, const char *id_text, size_t *out_len)
{
    size_t off, vlen;
    if (!mcp_member_span(body, len, "id", &off, &vlen))
        return NULL;
    return splice(body, len, off, vlen, id_text, out_len);
}

static void free_spliced(const void *data, size_t len, void *arg)
{
    (void)len;
    (void)arg;
    free((void *)data);
}

/* Most bytes before a request's id (and the id) rewritten on the stack: an id most often
 * comes first or second in a request. */
#define PUT_HEAD_MAX 256

/* Where the parse found the id, when it says and the bytes there are still the id it read. */
static bool parsed_span(const mcp_msg_t *parsed, const char *text, size_t len, size_t *off,
                        size_t *vlen)
{
    if (!parsed || !parsed->id_at_known || !parsed->id_text)
        return false;
    size_t n = strlen(parsed->id_text);
    if (parsed->id_off > len || n > len - parsed->id_off ||
        memcmp(text + parsed->id_off, parsed->id_text, n) != 0)
        return false;
    *off = parsed->id_off;
    *vlen = n;
    return true;
}

bool rpc_id_put_request_id(struct evbuffer *body, const char *id_text, const mcp_msg_t *parsed)
{
    size_t len = evbuffer_get_length(body), off, vlen, n = strlen(id_text);
    char *text = len ? (char *)evbuffer_pullup(body, -1) : NULL;
    if (!text || (!parsed_span(parsed, text, len, &off, &vlen) &&
                  !mcp_member_span(text, len, "id", &off, &vlen)))
        return false;
    if (n == vlen) {
        memcpy(text + off, id_text, n);
        return true;
    }
    if (off + n <= PUT_HEAD_MAX) {
        /* the bytes up to the id go again, the new id after them, in front of the rest:
         * the body's other bytes are not copied */
        char head[PUT_HEAD_MAX];
        memcpy(head, text, off);
        memcpy(head + off, id_text, n);
        evbuffer_drain(body, off + vlen);
        evbuffer_prepend(body, head, off + n);
        return true;
    }
    size_t out_len;
    char *out = splice(text, len, off, vlen, id_text, &out_len);
    evbuffer_drain(body, len);
    evbuffer_add_reference(body, out, out_len, free_spliced, NULL);
    return true;
}

char *rpc_id_set_cancel_id(const char *body, size_t len, const char *id_text, size_t *out_len)
{
    size_t poff, plen, roff, rlen;
    if (!mcp_member_span(body, len, "params", &poff, &plen) ||
        !mcp_member_span(body + poff, plen, "requestId", &roff, &rlen))
        return NULL;
    return splice(body, len, poff + roff, rlen, id_text, out_len);
}

static bool is_response(const json_t *m)
{
    return json_is_object(m) && !json_object_get(m, "method") &&
           (json_object_get(m, "result") || json_object_get(m, "error"));
}

/* A batch never answers the one request forwarded: one holding a response is a stray. */
static rpc_msg_verdict_t map_batch(const char *text, size_t len, bool strict)
{
    json_t *m = json_loadb(text, len, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, NULL);
    rpc_msg_verdict_t v = RPC_MSG_PASS;
    size_t i;
    json_t *el;
    json_array_foreach(m, i, el)
    {
        if (strict && is_response(el))
            v = RPC_MSG_DESYNC;
    }
    json_decref(m);
    return v;
}

/* Where a mapped message's id is, and the caller's id that replaces it. */
typedef struct mapping {
    size_t off, vlen;
    const char *caller;
} mapping_t;

/* rpc_id_map_message without the copy: with RPC_MSG_MAPPED, *at says what to replace. */
static rpc_msg_verdict_t map_find(const char *text, size_t len, rpc_id_lookup_fn lookup, void *arg,
                                  bool strict, mapping_t *at)
{
    /* a lenient map reads a GET stream, most of whose events answer no call of the gateway's:
     * an id it assigned holds its prefix as written, so without it there is nothing to read */
    if (!strict && !memmem(text, len, "\"idemgw-", 8))
        return RPC_MSG_PASS;
    size_t i = 0;
    while (i < len && (text[i] == ' ' || text[i] == '\t' || text[i] == '\r' || text[i] == '\n'))
        i++;
    if (i < len && text[i] == '[')
        return map_batch(text, len, strict);
    if (i == len || text[i] != '{')
        return RPC_MSG_PASS; /* not JSON-RPC: an error page, say */
    /* the members are found in one walk by the scanner that finds them for the stage (an
     * answer may be megabytes: no tree of it is built); text the agent cannot parse answers
     * it nothing */
    enum { M_METHOD, M_RESULT, M_ERROR, M_ID, M_PARAMS, M_COUNT };
    static const char *const names[M_COUNT] = {"method", "result", "error", "id", "params"};
    mcp_span_t m[M_COUNT];
    mcp_member_spans(text, len, names, M_COUNT, m);
    if (!m[M_METHOD].present && (m[M_RESULT].present || m[M_ERROR].present)) {
        /* a response without an id is looked up as a null one (a server that refuses a request
         * it did not parse may leave it out): nothing to map if it is the request's */
        bool has_id = m[M_ID].present;
        const char *caller =
            lookup(arg, has_id ? text + m[M_ID].off : NULL, has_id ? m[M_ID].len : 0, true);
        if (caller && !has_id)
            return RPC_MSG_PASS;
        if (caller) {
            *at = (mapping_t){m[M_ID].off, m[M_ID].len, caller};
            return RPC_MSG_MAPPED;
        }
        return strict ? RPC_MSG_DESYNC : RPC_MSG_PASS;
    }
    /* a notification or request from the server naming the call (a cancel, say) */
    size_t poff = m[M_PARAMS].off, off, vlen;
    if (!m[M_METHOD].present || !m[M_PARAMS].present ||
        !mcp_member_span(text + poff, m[M_PARAMS].len, "requestId", &off, &vlen))
        return RPC_MSG_PASS;
    const char *caller = lookup(arg, text + poff + off, vlen, false);
    if (!caller)
        return RPC_MSG_PASS;
    *at = (mapping_t){poff + off, vlen, caller};
    return RPC_MSG_MAPPED;
}

rpc_msg_verdict_t rpc_id_map_message(const char *text, size_t len, rpc_id_lookup_fn lookup,
                                     void *arg, bool strict, char **out, size_t *out_len)
{
    mapping_t at;
    rpc_msg_verdict_t v = map_find(text, len, lookup, arg, strict, &at);
    if (v == RPC_MSG_MAPPED)
        *out = splice(text, len, at.off, at.vlen, at.caller, out_len);
    return v;
}

/* --- the answer as it streams --- */

struct rpc_id_rewriter {
    rpc_body_t kind;
    size_t limit;
    rpc_id_lookup_fn lookup;
    void *arg;
    bool strict;
    decoder_t *decoder;
    bool unreadable;        /* the coding is not one the decoder reads */
    rpc_id_status_t failed; /* once not OK, nothing more is taken */
    /* a JSON body so far, or the SSE event being read: a plain array, grown by doubling, so a
     * large answer arriving in many reads is neither copied nor searched again per read */
    char *kept;
    size_t kept_len, kept_cap;
    size_t scanned;   /* SSE: bytes of kept already split into lines */
    size_t looked;    /* SSE: bytes of kept searched for the end of the line being read */
    bool first_event; /* SSE: the event being read opens the stream (a BOM may lead it) */
    bool has_data;    /* SSE: the event being read has a data line */
};

rpc_id_rewriter_t *rpc_id_rewriter_new(rpc_body_t kind, decode_coding_t coding, size_t limit,
                                       rpc_id_lookup_fn lookup, void *arg, bool strict)
{
    rpc_id_rewriter_t *r = xcalloc(1, sizeof(*r));
    r->kind = kind;
    r->limit = limit;
    r->lookup = lookup;
    r->arg = arg;
    r->strict = strict;
    r->first_event = true;
    if (coding == DECODE_CODING_UNSUPPORTED)
        r->unreadable = true;
    else
        r->decoder = decoder_new(coding);
    return r;
}

void rpc_id_rewriter_free(rpc_id_rewriter_t *r)
{
    if (!r)
        return;
    decoder_free(r->decoder);
    event_mem_free(r->kept);
    free(r);
}

/* Length of the line terminator at p[i] (\n, \r\n or \r), 0 when there is none, -1 when a
 * lone \r ends the bytes read so far (a \n may follow in the next read). */
static int eol_at(const char *p, size_t i, size_t n, bool at_end)
{
    if (p[i] == '\n')
        return 1;
    if (p[i] != '\r')
        return 0;
    if (i + 1 < n)
        return p[i + 1] == '\n' ? 2 : 1;
    return at_end ? 1 : -1;
}

/* A data line ("data" alone, or "data:" and its value, one leading space not part of it);
 * *voff: where its value starts. */
static bool line_is_data(const char *line, size_t n, size_t *voff)
{
    if (n < 4 || memcmp(line, "data", 4) != 0)
        return false;
    if (n == 4) {
        *voff = 4;
        return true;
    }
    if (line[4] != ':')
        return false;
    *voff = n > 5 && line[5] == ' ' ? 6 : 5;
    return true;
}

/* A complete event (ev, its raw lines with their terminators): relayed as it came, or with
 * its data replaced by the mapped message, one data line per line of it. */
static rpc_id_status_t emit_event(rpc_id_rewriter_t *r, const char *ev, size_t n,
                                  struct evbuffer *out)
{
    if (!r->has_data) {
        evbuffer_add(out, ev, n);
        return RPC_ID_OK;
    }
    /* the data lines joined with \n, as a client reads them */
    struct evbuffer *data = evbuffer_new();
    size_t first_data = SIZE_MAX;
    bool bom = n >= 3 && memcmp(ev, "\xEF\xBB\xBF", 3) == 0 && r->first_event;
    for (size_t start = bom ? 3 : 0; start < n;) {
        size_t end = start;
        int t = 0;
        while (end < n && (t = eol_at(ev, end, n, true)) == 0)
            end++;
        size_t voff;
        if (line_is_data(ev + start, end - start, &voff)) {
            if (first_data == SIZE_MAX)
                first_data = start;
            else
                evbuffer_add(data, "\n", 1);
            evbuffer_add(data, ev + start + voff, end - start - voff);
        }
        start = end + (size_t)(t > 0 ? t : 1);
    }
    size_t dlen = evbuffer_get_length(data);
    const char *text = dlen ? (const char *)evbuffer_pullup(data, -1) : "";
    char *mapped = NULL;
    size_t mlen = 0;
    rpc_msg_verdict_t v =
        rpc_id_map_message(text, dlen, r->lookup, r->arg, r->strict, &mapped, &mlen);
    evbuffer_free(data);
    if (v == RPC_MSG_DESYNC)
        return RPC_ID_DESYNC;
    if (v == RPC_MSG_PASS) {
        evbuffer_add(out, ev, n);
        return RPC_ID_OK;
    }
    /* the lines before the first data line, the mapped data, the other lines but data */
    evbuffer_add(out, ev, first_data);
    for (size_t s = 0; s <= mlen;) {
        const char *nl = memchr(mapped + s, '\n', mlen - s);
        size_t e = nl ? (size_t)(nl - mapped) : mlen;
        evbuffer_add(out, "data: ", 6);
        evbuffer_add(out, mapped + s, e - s);
        evbuffer_add(out, "\n", 1);
        s = e + 1;
    }
    free(mapped);
    for (size_t start = first_data; start < n;) {
        size_t end = start;
        int t = 0;
        while (end < n && (t = eol_at(ev, end, n, true)) == 0)
            end++;
        size_t next = end + (size_t)(t > 0 ? t : 1), voff;
        if (!line_is_data(ev + start, end - start, &voff))
            evbuffer_add(out, ev + start, (next < n ? next : n) - start);
        start = next;
    }
    return RPC_ID_OK;
}

/* Splits what was kept into lines; each blank line ends an event, which goes out. An event is
 * bounded by its bytes, not by where reads split them: once it ends, and while it is unended
 * whenever the scan stops for more, whether it stopped inside a line or after a whole one. */
static rpc_id_status_t sse_scan(rpc_id_rewriter_t *r, bool at_end, struct evbuffer *out)
{
    for (;;) {
        size_t n = r->kept_len;
        if (r->scanned >= n)
            break;
        const char *p = r->kept;
        size_t line = r->scanned, i = r->looked > line ? r->looked : line;
        int t = 0;
        while (i < n && (t = eol_at(p, i, n, at_end)) == 0)
            i++;
        if (i == n || t < 0) {
            r->looked = i; /* a lone \r at the end is looked at again with what follows */
            break;         /* the line is not whole yet */
        }
        size_t content = line, voff;
        if (r->first_event && line == 0 && i - line >= 3 &&
            memcmp(p + line, "\xEF\xBB\xBF", 3) == 0)
            content += 3;
        bool blank = i == content;
        if (line_is_data(p + content, i - content, &voff))
            r->has_data = true;
        r->scanned = r->looked = i + (size_t)t;
        if (!blank)
            continue;
        size_t evlen = r->scanned;
        if (evlen > r->limit)
            return RPC_ID_TOO_LARGE;
        rpc_id_status_t st = emit_event(r, r->kept, evlen, out);
        memmove(r->kept, r->kept + evlen, r->kept_len - evlen);
        r->kept_len -= evlen;
        r->scanned = r->looked = 0;
        r->has_data = false;
        r->first_event = false;
        if (st != RPC_ID_OK)
            return st;
    }
    /* what is kept is the unended event (every ended one went out) */
    return r->kept_len > r->limit ? RPC_ID_TOO_LARGE : RPC_ID_OK;
}

/* Plain (decoded) bytes of the answer. */
static rpc_id_status_t take(rpc_id_rewriter_t *r, const char *data, size_t len,
                            struct evbuffer *out)
{
    if (r->kept_len + len > r->kept_cap) {
        size_t cap = r->kept_cap ? r->kept_cap : 4096;
        while (cap < r->kept_len + len)
            cap *= 2;
        r->kept = event_mem_realloc(r->kept, cap);
        r->kept_cap = cap;
    }
    memcpy(r->kept + r->kept_len, data, len);
    r->kept_len += len;
    if (r->kind == RPC_BODY_SSE)
        return sse_scan(r, false, out);
    return r->kept_len > r->limit ? RPC_ID_TOO_LARGE : RPC_ID_OK;
}

rpc_id_status_t rpc_id_rewriter_feed(rpc_id_rewriter_t *r, const char *data, size_t len,
                                     struct evbuffer *out)
{
    if (r->failed != RPC_ID_OK)
        return r->failed;
    if (r->unreadable) {
        r->failed = RPC_ID_UNREADABLE;
        return r->failed;
    }
    if (!r->decoder) {
        r->failed = take(r, data, len, out);
        return r->failed;
    }
    /* a JSON answer is bounded as a whole, a stream per read (its events by the limit) */
    size_t limit = r->kind == RPC_BODY_JSON ? r->limit + 1
                                            : decoder_produced(r->decoder) + SSE_DECODED_PER_READ;
    struct evbuffer *plain = evbuffer_new();
    decode_status_t ds = decoder_feed(r->decoder, data, len, plain, limit);
    size_t n = evbuffer_get_length(plain);
    rpc_id_status_t st = RPC_ID_OK;
    if (n > 0)
        st = take(r, (const char *)evbuffer_pullup(plain, -1), n, out);
    evbuffer_free(plain);
    if (st == RPC_ID_OK && ds != DECODE_OK)
        st = ds == DECODE_ERR_LIMIT ? RPC_ID_TOO_LARGE : RPC_ID_UNREADABLE;
    r->failed = st;
    return st;
}

rpc_id_status_t rpc_id_rewriter_finish(rpc_id_rewriter_t *r, bool complete, struct evbuffer *out)
{
    if (r->failed != RPC_ID_OK)
        return r->failed;
    if (!complete) {
        r->kept_len = 0;
        return RPC_ID_OK;
    }
    if (r->unreadable) {
        r->failed = RPC_ID_UNREADABLE;
        return r->failed;
    }
    if (r->decoder && decoder_finish(r->decoder) != DECODE_OK) {
        r->failed = RPC_ID_UNREADABLE;
        return r->failed;
    }
    size_t n = r->kept_len;
    if (r->kind == RPC_BODY_SSE) {
        r->failed = sse_scan(r, true, out);
        /* an event the stream did not end: a client drops it, so it is passed as it came */
        if (r->failed == RPC_ID_OK)
            evbuffer_add(out, r->kept, r->kept_len);
        r->kept_len = 0;
        return r->failed;
    }
    const char *text = n ? r->kept : "";
    mapping_t at;
    rpc_msg_verdict_t v = map_find(text, n, r->lookup, r->arg, r->strict, &at);
    if (v == RPC_MSG_DESYNC) {
        r->failed = RPC_ID_DESYNC;
        return r->failed;
    }
    if (v == RPC_MSG_MAPPED) {
        /* the answer around its id, and the caller's id, straight into out: one piece of
         * memory, so whoever reads out whole does not copy it again */
        size_t clen = strlen(at.caller);
        evbuffer_expand(out, n - at.vlen + clen);
        evbuffer_add(out, text, at.off);
        evbuffer_add(out, at.caller, clen);
        evbuffer_add(out, text + at.off + at.vlen, n - at.off - at.vlen);
    } else {
        evbuffer_add(out, r->kept, n);
    }
    r->kept_len = 0;
    return RPC_ID_OK;
}
