#include "http_headers.h"
#include "util.h"

#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void http_headers_init(http_headers_t *h)
{
    memset(h, 0, sizeof(*h));
}

void http_headers_reset(http_headers_t *h)
{
    h->len = 0;
    h->n = 0;
    h->in_value = false;
}

void http_headers_free(http_headers_t *h)
{
    free(h->buf);
    free(h->items);
    memset(h, 0, sizeof(*h));
}

static void append(http_headers_t *h, const char *at, size_t len)
{
    if (h->len + len + 1 > h->cap) {
        size_t cap = h->cap ? h->cap : 512;
        while (cap < h->len + len + 1)
            cap *= 2;
        h->buf = xrealloc(h->buf, cap);
        h->cap = cap;
    }
    memcpy(h->buf + h->len, at, len);
    h->len += len;
}

void http_headers_add_name(http_headers_t *h, const char *at, size_t len)
{
    if (h->n == 0 || h->in_value) {
        if (h->n == h->cap_items) {
            h->cap_items = h->cap_items ? h->cap_items * 2 : 16;
            h->items = xrealloc(h->items, h->cap_items * sizeof(*h->items));
        }
        http_header_t *it = &h->items[h->n++];
        it->name_off = h->len;
        it->name_len = 0;
        it->value_off = 0;
        it->value_len = 0;
        h->in_value = false;
    }
    append(h, at, len);
    h->items[h->n - 1].name_len += len;
}

void http_headers_add_value(http_headers_t *h, const char *at, size_t len)
{
    if (h->n == 0 || !h->in_value)
        return;
    append(h, at, len);
    h->items[h->n - 1].value_len += len;
}

static void terminate(http_headers_t *h)
{
    append(h, "", 0);
    h->buf[h->len++] = '\0';
}

void http_headers_end_name(http_headers_t *h)
{
    if (h->n == 0)
        return;
    terminate(h);
    h->in_value = true;
    h->items[h->n - 1].value_off = h->len;
    h->items[h->n - 1].value_len = 0;
}

static bool is_ows(char ch)
{
    return ch == ' ' || ch == '\t';
}

/* RFC 9110 5.5: optional whitespace around a field value is not part of it. llhttp drops the
 * leading part itself and hands over the trailing part; both are removed here. */
void http_headers_end_value(http_headers_t *h)
{
    if (h->n == 0 || !h->in_value)
        return;
    http_header_t *it = &h->items[h->n - 1];
    while (it->value_len > 0 && is_ows(h->buf[it->value_off + it->value_len - 1])) {
        it->value_len--;
        h->len--;
    }
    size_t lead = 0;
    while (lead < it->value_len && is_ows(h->buf[it->value_off + lead]))
        lead++;
    if (lead) {
        memmove(h->buf + it->value_off, h->buf + it->value_off + lead, it->value_len - lead);
        it->value_len -= lead;
        h->len -= lead;
    }
    terminate(h);
}

/* RFC 9110's delimiters: visible characters that a token cannot hold. A switch, not a search
 * of a string per byte: every header name the gateway writes passes here. */
static bool is_delimiter(unsigned char c)
{
    /* clang-format off */
    switch (c) {
    case '"': case '(': case ')': case ',': case '/': case ':': case ';': case '<': case '=':
    case '>': case '?': case '@': case '[': case '\\': case ']': case '{': case '}':
        return true;
    /* clang-format on */
    default:
        return false;
    }
}

bool http_header_name_is_token(const char *name)
{
    if (!*name)
        return false;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        if (*p <= 0x20 || *p >= 0x7f || is_delimiter(*p))
            return false;
    return true;
}

size_t http_headers_countn(const http_headers_t *h, const char *name, size_t nlen)
{
    size_t n = 0;
    for (size_t i = 0; i < h->n; i++)
        if (h->items[i].name_len == nlen &&
            strncasecmp(h->buf + h->items[i].name_off, name, nlen) == 0)
            n++;
    return n;
}

void http_headers_remove(http_headers_t *h, const char *name)
{
    size_t nlen = strlen(name), keep = 0;
    for (size_t i = 0; i < h->n; i++) {
        if (h->items[i].name_len == nlen &&
            strncasecmp(h->buf + h->items[i].name_off, name, nlen) == 0)
            continue;
        h->items[keep++] = h->items[i];
    }
    h->n = keep;
}

const char *http_headers_name(const http_headers_t *h, size_t i)
{
    return h->buf + h->items[i].name_off;
}

const char *http_headers_value(const http_headers_t *h, size_t i)
{
    return h->buf + h->items[i].value_off;
}

size_t http_headers_name_len(const http_headers_t *h, size_t i)
{
    return h->items[i].name_len;
}

const char *http_headers_getn(const http_headers_t *h, const char *name, size_t nlen)
{
    for (size_t i = 0; i < h->n; i++)
        if (h->items[i].name_len == nlen &&
            strncasecmp(h->buf + h->items[i].name_off, name, nlen) == 0)
            return h->buf + h->items[i].value_off;
    return NULL;
}

static bool in_token_list(const char *list, const char *name)
{
    size_t nlen = strlen(name);
    const char *p = list;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        const char *start = p;
        while (*p && *p != ',' && *p != ' ' && *p != '\t')
            p++;
        if ((size_t)(p - start) == nlen && nlen && strncasecmp(start, name, nlen) == 0)
            return true;
    }
    return false;
}

/* name of len bytes */
static bool hop_by_hop(const char *name, size_t len, const char *connection_value)
{
    /* every header of every message passes here: names are compared only with the hop-by-hop
     * names of their own length */
    static const struct {
        const char *name;
        size_t len;
    } hop[] = {{"te", 2},
               {"upgrade", 7},
               {"trailer", 7},
               {"trailers", 8},
               {"connection", 10},
               {"keep-alive", 10},
               {"proxy-connection", 16},
               {"transfer-encoding", 17},
               {"proxy-authenticate", 18},
               {"proxy-authorization", 19}};
    for (size_t i = 0; i < ARRAY_LEN(hop) && hop[i].len <= len; i++)
        if (hop[i].len == len && strncasecmp(name, hop[i].name, len) == 0)
            return true;
    return connection_value && in_token_list(connection_value, name);
}

bool http_header_is_hop_by_hop(const char *name, const char *connection_value)
{
    return hop_by_hop(name, strlen(name), connection_value);
}

/* True when one of the "Name: value\r\n" lines of extra sets name. */
static bool set_by_extra(const char *extra, const char *name)
{
    size_t nlen = strlen(name);
    for (const char *line = extra; line && *line;) {
        const char *colon = strchr(line, ':');
        if (!colon)
            break;
        if ((size_t)(colon - line) == nlen && strncasecmp(line, name, nlen) == 0)
            return true;
        const char *eol = strchr(colon, '\n');
        line = eol ? eol + 1 : NULL;
    }
    return false;
}

/* The decimal digits of v (v >= 0) into out, which has room for 20; returns their count. */
static size_t put_digits(char *out, unsigned long long v)
{
    char rev[20];
    size_t n = 0;
    do {
        rev[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++)
        out[i] = rev[n - 1 - i];
    return n;
}

/* "NAME: VALUE" and its CRLF, one add when it fits a line on the stack: heads are written for
 * every relayed request and answer, and printf's format parsing per header was a visible part
 * of a relayed call's cost. */
static void add_field(struct evbuffer *out, const char *name, const char *value)
{
    size_t nl = strlen(name), vl = strlen(value);
    char line[512];
    if (nl + vl + 4 > sizeof(line)) {
        evbuffer_add(out, name, nl);
        evbuffer_add(out, ": ", 2);
        evbuffer_add(out, value, vl);
        evbuffer_add(out, "\r\n", 2);
        return;
    }
    memcpy(line, name, nl);
    memcpy(line + nl, ": ", 2);
    memcpy(line + nl + 2, value, vl);
    memcpy(line + nl + 2 + vl, "\r\n", 2);
    evbuffer_add(out, line, nl + vl + 4);
}

static void add_content_length(struct evbuffer *out, long long n)
{
    char line[48] = "Content-Length: ";
    size_t at = 16 + put_digits(line + 16, (unsigned long long)n);
    memcpy(line + at, "\r\n", 2);
    evbuffer_add(out, line, at + 2);
}

void http_write_request_head(struct evbuffer *out, const char *method, const char *target,
                             const http_headers_t *in, const char *host, const char *client_ip,
                             long long body_len, const char *extra)
{
    const char *conn = http_headers_get(in, "connection");
    const char *xff = NULL;
    size_t ml = strlen(method), tl = strlen(target), hl = strlen(host);
    char line[512];
    if (ml + tl + hl + 27 <= sizeof(line)) {
        char *o = line;
        memcpy(o, method, ml);
        o += ml;
        *o++ = ' ';
        memcpy(o, target, tl);
        o += tl;
        memcpy(o, " HTTP/1.1\r\nHost: ", 17);
        o += 17;
        memcpy(o, host, hl);
        o += hl;
        memcpy(o, "\r\n", 2);
        evbuffer_add(out, line, (size_t)(o + 2 - line));
    } else {
        evbuffer_add_printf(out, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, target, host);
    }
    for (size_t i = 0; i < in->n; i++) {
        const char *name = http_headers_name(in, i);
        size_t nlen = in->items[i].name_len;
        if (HTTP_NAME_IS(name, nlen, "host") || HTTP_NAME_IS(name, nlen, "content-length") ||
            hop_by_hop(name, nlen, conn) || set_by_extra(extra, name))
            continue;
        if (HTTP_NAME_IS(name, nlen, "x-forwarded-for")) {
            xff = http_headers_value(in, i);
            continue;
        }
        add_field(out, name, http_headers_value(in, i));
    }
    if (client_ip) {
        if (xff && *xff)
            evbuffer_add_printf(out, "X-Forwarded-For: %s, %s\r\n", xff, client_ip);
        else
            add_field(out, "X-Forwarded-For", client_ip);
    }
    if (body_len >= 0)
        add_content_length(out, body_len);
    if (extra)
        evbuffer_add(out, extra, strlen(extra));
    evbuffer_add(out, "\r\n", 2);
}

void http_write_response_head(struct evbuffer *out, int status, const char *content_type,
                              const http_headers_t *in, long long content_length, bool keep_alive,
                              const char *extra)
{
    if (status >= 100 && status <= 999) {
        char line[64] = "HTTP/1.1 ";
        const char *reason = http_status_reason(status);
        size_t rl = strlen(reason), at = 9 + put_digits(line + 9, (unsigned)status);
        if (at + 1 + rl + 2 <= sizeof(line)) {
            line[at++] = ' ';
            memcpy(line + at, reason, rl);
            memcpy(line + at + rl, "\r\n", 2);
            evbuffer_add(out, line, at + rl + 2);
        } else {
            evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\n", status, reason);
        }
    } else {
        evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\n", status, http_status_reason(status));
    }
    if (content_type)
        add_field(out, "Content-Type", content_type);
    if (in) {
        const char *conn = http_headers_get(in, "connection");
        for (size_t i = 0; i < in->n; i++) {
            const char *name = http_headers_name(in, i);
            size_t nlen = in->items[i].name_len;
            if (HTTP_NAME_IS(name, nlen, "content-length") || hop_by_hop(name, nlen, conn))
                continue;
            add_field(out, name, http_headers_value(in, i));
        }
    }
    if (content_length >= 0)
        add_content_length(out, content_length);
    else if (content_length == -1)
        evbuffer_add(out, "Transfer-Encoding: chunked\r\n", 28);
    if (!keep_alive)
        evbuffer_add(out, "Connection: close\r\n", 19);
    if (extra)
        evbuffer_add(out, extra, strlen(extra));
    evbuffer_add(out, "\r\n", 2);
}

bool http_head_set_length(struct evbuffer *head, long long content_length)
{
    static const char te[] = "\r\nTransfer-Encoding: chunked\r\n";
    size_t n = evbuffer_get_length(head), tlen = sizeof(te) - 1;
    char *h = n ? (char *)evbuffer_pullup(head, -1) : NULL;
    const char *at = h ? memmem(h, n, te, tlen) : NULL;
    if (!at || content_length < 0)
        return false;
    /* the line written by hand over the old one: this runs for every relayed JSON answer
     * whose id was rewritten, and the head is most often one piece of memory already */
    char line[64];
    memcpy(line, "\r\nContent-Length: ", 18);
    size_t ln = 18 + put_digits(line + 18, (unsigned long long)content_length);
    memcpy(line + ln, "\r\n", 2);
    ln += 2;
    size_t pos = (size_t)(at - h);
    if (ln <= tlen) {
        /* shorter: the bytes before it move forward by the difference, which is then dropped
         * from the front */
        size_t d = tlen - ln;
        memmove(h + d, h, pos);
        memcpy(h + d + pos, line, ln);
        evbuffer_drain(head, d);
        return true;
    }
    struct evbuffer *out = evbuffer_new();
    evbuffer_add(out, h, pos);
    evbuffer_add(out, line, ln);
    evbuffer_add(out, h + pos + tlen, n - pos - tlen);
    evbuffer_drain(head, n);
    evbuffer_add_buffer(head, out);
    evbuffer_free(out);
    return true;
}

const char *http_status_reason(int status)
{
    static const struct {
        int status;
        const char *reason;
    } reasons[] = {
        {200, "OK"},
        {201, "Created"},
        {202, "Accepted"},
        {204, "No Content"},
        {300, "Multiple Choices"},
        {301, "Moved Permanently"},
        {302, "Found"},
        {303, "See Other"},
        {304, "Not Modified"},
        {307, "Temporary Redirect"},
        {308, "Permanent Redirect"},
        {400, "Bad Request"},
        {401, "Unauthorized"},
        {403, "Forbidden"},
        {404, "Not Found"},
        {405, "Method Not Allowed"},
        {406, "Not Acceptable"},
        {408, "Request Timeout"},
        {409, "Conflict"},
        {413, "Content Too Large"},
        {415, "Unsupported Media Type"},
        {422, "Unprocessable Content"},
        {429, "Too Many Requests"},
        {431, "Request Header Fields Too Large"},
        {500, "Internal Server Error"},
        {502, "Bad Gateway"},
        {503, "Service Unavailable"},
        {504, "Gateway Timeout"},
    };
    for (size_t i = 0; i < ARRAY_LEN(reasons); i++)
        if (reasons[i].status == status)
            return reasons[i].reason;
    return "Status";
}

size_t http_chunk_line(char line[HTTP_CHUNK_LINE_MAX], size_t len)
{
    return (size_t)snprintf(line, HTTP_CHUNK_LINE_MAX, "%zx\r\n", len);
}

void http_chunk_add(struct evbuffer *out, const void *data, size_t len)
{
    char line[HTTP_CHUNK_LINE_MAX];
    evbuffer_add(out, line, http_chunk_line(line, len));
    evbuffer_add(out, data, len);
    evbuffer_add(out, "\r\n", 2);
}
