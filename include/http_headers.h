/* HTTP header lists as llhttp delivers them, and the rules for what crosses the proxy.
 * Pure: no sockets. */
#ifndef IDEMGW_HTTP_HEADERS_H
#define IDEMGW_HTTP_HEADERS_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>
#include <strings.h>

struct evbuffer;

typedef struct http_header {
    size_t name_off, name_len; /* into buf; NUL-terminated once complete */
    size_t value_off, value_len;
} http_header_t;

typedef struct http_headers {
    char *buf; /* names and values, each followed by a NUL */
    size_t len, cap;
    http_header_t *items;
    size_t n, cap_items;
    bool in_value; /* the last piece appended was part of a value */
} http_headers_t;

void http_headers_init(http_headers_t *h);
void http_headers_reset(http_headers_t *h);
void http_headers_free(http_headers_t *h);

/* Pieces as llhttp hands them over; a name piece after a value starts a new header. */
void http_headers_add_name(http_headers_t *h, const char *at, size_t len);
void http_headers_add_value(http_headers_t *h, const char *at, size_t len);
/* Ends the current name / value (NUL-terminates it); llhttp's *_complete callbacks. A value
 * loses its leading and trailing spaces and tabs (RFC 9110 optional whitespace). */
void http_headers_end_name(http_headers_t *h);
void http_headers_end_value(http_headers_t *h);

const char *http_headers_name(const http_headers_t *h, size_t i);
const char *http_headers_value(const http_headers_t *h, size_t i);
/* The length of the i-th name. */
size_t http_headers_name_len(const http_headers_t *h, size_t i);
/* First value of a header by case-insensitive name of nlen bytes, or NULL. */
const char *http_headers_getn(const http_headers_t *h, const char *name, size_t nlen);
/* How many copies of a header a message carries (case-insensitive name of nlen bytes). */
size_t http_headers_countn(const http_headers_t *h, const char *name, size_t nlen);

/* The same by a NUL-terminated name: inline, so a literal's length is known when compiled
 * (headers are looked up by name a dozen times per request). */
static inline const char *http_headers_get(const http_headers_t *h, const char *name)
{
    return http_headers_getn(h, name, strlen(name));
}

static inline size_t http_headers_count(const http_headers_t *h, const char *name)
{
    return http_headers_countn(h, name, strlen(name));
}

/* True when a name of nlen bytes is lit, a lower-case literal, in any case. */
#define HTTP_NAME_IS(name, nlen, lit)                                                              \
    ((nlen) == sizeof(lit) - 1 && strncasecmp((name), (lit), sizeof(lit) - 1) == 0)
/* Drops every copy of a header; the remaining ones keep their order. */
void http_headers_remove(http_headers_t *h, const char *name);
/* A field name is an RFC 9110 token: no whitespace (as in "Name : v"), no separators. */
bool http_header_name_is_token(const char *name);

/* Hop-by-hop: Connection, Keep-Alive, Proxy-*, TE, Trailer(s), Transfer-Encoding, Upgrade, and
 * any name listed in the message's Connection header (connection_value, may be NULL). */
bool http_header_is_hop_by_hop(const char *name, const char *connection_value);

/* Writes the upstream request head: request line, end-to-end headers except Host,
 * Content-Length and X-Forwarded-For (which it sets itself), then the extra header lines
 * (each "Name: value\r\n", may be NULL), which replace the request's headers of the same
 * names. body_len < 0 means no body. */
void http_write_request_head(struct evbuffer *out, const char *method, const char *target,
                             const http_headers_t *in, const char *host, const char *client_ip,
                             long long body_len, const char *extra);

/* The one writer of a response head to the agent, in this order: the status line (HTTP/1.1),
 * Content-Type when content_type is not NULL, the end-to-end headers of in (an upstream's
 * response head being relayed; NULL for an answer of the gateway's own) except its
 * Content-Length, the framing the gateway chose (Content-Length when content_length >= 0,
 * Transfer-Encoding: chunked when -1, nothing when -2, for a bodiless status or a body that
 * ends at the close), Connection: close when keep_alive is false, then extra as above. */
/* Chunked framing (RFC 9112 7.1), written here only. HTTP_CHUNK_LAST ends a chunked body. */
#define HTTP_CHUNK_LINE_MAX 24
#define HTTP_CHUNK_LAST "0\r\n\r\n"
/* The size line of a chunk of len bytes ("1a\r\n") into line; returns its length. */
size_t http_chunk_line(char line[HTTP_CHUNK_LINE_MAX], size_t len);
/* One whole chunk: its size line, the bytes, CRLF. */
void http_chunk_add(struct evbuffer *out, const void *data, size_t len);

void http_write_response_head(struct evbuffer *out, int status, const char *content_type,
                              const http_headers_t *in, long long content_length, bool keep_alive,
                              const char *extra);

/* A response head written chunked, made to carry content_length instead (the whole body is
 * known before any of it goes out); false when head is not chunked. */
bool http_head_set_length(struct evbuffer *head, long long content_length);
const char *http_status_reason(int status);

#endif
