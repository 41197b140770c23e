/* llhttp, set up once for both directions: the agents' requests (http_conn.c) and the
 * upstream's responses (upstream_http.c). The parser collects each message's head into an
 * http_headers_t, counts the head against a limit, stops at the end of every message so the
 * bytes after it are never read as part of it, and hands the rest (target, head complete, body,
 * end) to its owner's callbacks.
 *
 * Contract: the callbacks run inside http_parse_feed / http_parse_chunk, with the owner's arg.
 * They return 0 to go on and -1 to refuse the message (the feed then reports
 * HTTP_PARSE_FAILED with error HTTP_PARSE_ERR_REFUSED; the owner keeps its own reason).
 * on_end alone may also return HTTP_PARSE_STOP: the message is over and the feed returns
 * HTTP_PARSE_END without reading further; 0 from on_end (an interim 1xx response) goes on. */
#ifndef IDEMGW_HTTP_PARSE_H
#define IDEMGW_HTTP_PARSE_H

#include "http_headers.h"

#include <llhttp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct evbuffer;

/* on_end's return value that ends the feed at the end of the message */
#define HTTP_PARSE_STOP HPE_PAUSED

typedef enum {
    HTTP_PARSE_MORE = 0, /* every byte was taken; the message is not over */
    HTTP_PARSE_END,      /* a message ended; the bytes after it were left unread */
    HTTP_PARSE_FAILED,   /* see the parser's error; the parser takes nothing more */
} http_parse_result_t;

typedef enum {
    HTTP_PARSE_ERR_NONE = 0,
    HTTP_PARSE_ERR_HEAD_TOO_LARGE,  /* target and header fields over the limit */
    HTTP_PARSE_ERR_BAD_HEADER_NAME, /* a field name is not a token ("Name : value") */
    HTTP_PARSE_ERR_REFUSED,         /* a callback of the owner returned -1 */
    HTTP_PARSE_ERR_INVALID,         /* not valid HTTP (llhttp's verdict) */
} http_parse_error_t;

const char *http_parse_error_str(http_parse_error_t e);

typedef struct http_parse_cbs {
    int (*on_begin)(void *arg); /* a message starts (set headers here); may be NULL */
    int (*on_url)(void *arg, const char *at, size_t len); /* request target piece; may be NULL */
    int (*on_head)(void *arg);                            /* the head is complete */
    int (*on_body)(void *arg, const char *at, size_t len);
    int (*on_end)(void *arg); /* the message is complete */
} http_parse_cbs_t;

typedef struct http_parser {
    llhttp_t llhttp; /* the owner reads the head's facts here (method, status, flags) */
    const http_parse_cbs_t *cbs;
    void *arg;
    http_headers_t *headers;        /* where the head's fields go; the owner may repoint it */
    const uint64_t *max_head_bytes; /* read at each piece, so a reload applies at once */
    size_t head_bytes;              /* target and header fields of this message so far */
    bool strict_names;              /* refuse a field name that is not a token */
    http_parse_error_t error;       /* why the last feed failed */
} http_parser_t;

/* Strict: no llhttp_set_lenient_*. Smuggling hides in what a lenient parser accepts (bare LF,
 * chunk extensions, Transfer-Encoding with Content-Length). type: HTTP_REQUEST or
 * HTTP_RESPONSE. headers may be NULL until on_begin sets it. */
void http_parse_init(http_parser_t *p, llhttp_type_t type, const http_parse_cbs_t *cbs, void *arg,
                     http_headers_t *headers, const uint64_t *max_head_bytes, bool strict_names);

/* For the next message on the same connection (a pooled upstream connection). */
void http_parse_reset(http_parser_t *p);

/* Parses len bytes. *used: how many belong to the current message (all of them unless END). */
http_parse_result_t http_parse_feed(http_parser_t *p, const char *data, size_t len, size_t *used);

/* Feeds the first contiguous piece of in and drains from in what the parser used. */
http_parse_result_t http_parse_chunk(http_parser_t *p, struct evbuffer *in);

/* The peer closed: false when that cuts a message short. A body delimited by the close ends
 * here (on_end runs); whether a message ended at all is the owner's to know from on_end. */
bool http_parse_finish(http_parser_t *p);

/* llhttp's name for its last error, for logs. */
const char *http_parse_errno_name(const http_parser_t *p);

#endif
