/* llhttp for requests and responses alike (see http_parse.h). */
#include "http_parse.h"

#include <event2/buffer.h>

const char *http_parse_error_str(http_parse_error_t e)
{
    switch (e) {
    case HTTP_PARSE_ERR_NONE:
        return "none";
    case HTTP_PARSE_ERR_HEAD_TOO_LARGE:
        return "head too large";
    case HTTP_PARSE_ERR_BAD_HEADER_NAME:
        return "header name not a token";
    case HTTP_PARSE_ERR_REFUSED:
        return "refused";
    case HTTP_PARSE_ERR_INVALID:
        return "invalid HTTP";
    }
    return "unknown";
}

static http_parser_t *of(llhttp_t *l)
{
    return l->data;
}

/* An owner's verdict: -1 is remembered as a refusal; anything else passes through. */
static int owner(http_parser_t *p, int rc)
{
    if (rc == -1)
        p->error = HTTP_PARSE_ERR_REFUSED;
    return rc;
}

static int head_piece(http_parser_t *p, size_t len)
{
    p->head_bytes += len;
    if (p->max_head_bytes && p->head_bytes > *p->max_head_bytes) {
        p->error = HTTP_PARSE_ERR_HEAD_TOO_LARGE;
        return -1;
    }
    return 0;
}

static int on_message_begin(llhttp_t *l)
{
    http_parser_t *p = of(l);
    p->head_bytes = 0;
    return p->cbs->on_begin ? owner(p, p->cbs->on_begin(p->arg)) : 0;
}

static int on_url(llhttp_t *l, const char *at, size_t len)
{
    http_parser_t *p = of(l);
    if (head_piece(p, len))
        return -1;
    return p->cbs->on_url ? owner(p, p->cbs->on_url(p->arg, at, len)) : 0;
}

static int on_header_field(llhttp_t *l, const char *at, size_t len)
{
    http_parser_t *p = of(l);
    if (head_piece(p, len))
        return -1;
    http_headers_add_name(p->headers, at, len);
    return 0;
}

static int on_header_value(llhttp_t *l, const char *at, size_t len)
{
    http_parser_t *p = of(l);
    if (head_piece(p, len))
        return -1;
    http_headers_add_value(p->headers, at, len);
    return 0;
}

static int on_header_field_complete(llhttp_t *l)
{
    http_parser_t *p = of(l);
    http_headers_t *h = p->headers;
    http_headers_end_name(h);
    /* llhttp takes "Name : value" with the space in the name; RFC 9112 5.1 says refuse it */
    if (p->strict_names && h->n && !http_header_name_is_token(http_headers_name(h, h->n - 1))) {
        p->error = HTTP_PARSE_ERR_BAD_HEADER_NAME;
        return -1;
    }
    return 0;
}

static int on_header_value_complete(llhttp_t *l)
{
    http_headers_end_value(of(l)->headers);
    return 0;
}

static int on_headers_complete(llhttp_t *l)
{
    http_parser_t *p = of(l);
    return owner(p, p->cbs->on_head(p->arg));
}

static int on_body(llhttp_t *l, const char *at, size_t len)
{
    http_parser_t *p = of(l);
    return owner(p, p->cbs->on_body(p->arg, at, len));
}

static int on_message_complete(llhttp_t *l)
{
    http_parser_t *p = of(l);
    return owner(p, p->cbs->on_end(p->arg));
}

static const llhttp_settings_t settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_header_field_complete = on_header_field_complete,
    .on_header_value_complete = on_header_value_complete,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

void http_parse_init(http_parser_t *p, llhttp_type_t type, const http_parse_cbs_t *cbs, void *arg,
                     http_headers_t *headers, const uint64_t *max_head_bytes, bool strict_names)
{
    *p = (http_parser_t){
        .cbs = cbs,
        .arg = arg,
        .headers = headers,
        .max_head_bytes = max_head_bytes,
        .strict_names = strict_names,
    };
    llhttp_init(&p->llhttp, type, &settings);
    p->llhttp.data = p;
}

void http_parse_reset(http_parser_t *p)
{
    llhttp_reset(&p->llhttp);
    p->head_bytes = 0;
    p->error = HTTP_PARSE_ERR_NONE;
}

http_parse_result_t http_parse_feed(http_parser_t *p, const char *data, size_t len, size_t *used)
{
    enum llhttp_errno err = llhttp_execute(&p->llhttp, data, len);
    *used = len;
    if (err == HPE_PAUSED) {
        /* on_end stopped the parser at the message's last byte */
        *used = (size_t)(llhttp_get_error_pos(&p->llhttp) - data);
        llhttp_resume(&p->llhttp);
        return HTTP_PARSE_END;
    }
    if (err != HPE_OK) {
        if (p->error == HTTP_PARSE_ERR_NONE)
            p->error = HTTP_PARSE_ERR_INVALID;
        return HTTP_PARSE_FAILED;
    }
    return HTTP_PARSE_MORE;
}

http_parse_result_t http_parse_chunk(http_parser_t *p, struct evbuffer *in)
{
    size_t len = evbuffer_get_contiguous_space(in), used = 0;
    const char *data = (const char *)evbuffer_pullup(in, (ev_ssize_t)len);
    http_parse_result_t r = http_parse_feed(p, data, len, &used);
    evbuffer_drain(in, used);
    return r;
}

bool http_parse_finish(http_parser_t *p)
{
    enum llhttp_errno err = llhttp_finish(&p->llhttp);
    /* a message the close ended was stopped by on_end, so llhttp reports it paused */
    return err == HPE_OK || err == HPE_PAUSED;
}

const char *http_parse_errno_name(const http_parser_t *p)
{
    return llhttp_errno_name(llhttp_get_errno(&p->llhttp));
}
