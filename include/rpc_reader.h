/* Reads the JSON-RPC response to one request out of an upstream's HTTP answer, whichever way
 * the server frames it: one JSON body or an SSE stream (other messages, such as progress
 * notifications, skipped), compressed with gzip, deflate or br or not. Feed it the head and
 * the body bytes as they arrive; at the end it has the response's result (or error) text.
 * Only observes: the bytes themselves are relayed by the caller. No I/O. */
#ifndef IDEMGW_RPC_READER_H
#define IDEMGW_RPC_READER_H

#include "decode.h"
#include "http_headers.h"
#include "mcp.h"
#include "sse.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

struct evbuffer;

typedef struct rpc_reader {
    json_t *id;       /* the request's id (a reference held) */
    size_t max_bytes; /* a larger answer is not read (too_large) */
    bool sse;         /* the answer is an event stream */
    bool unreadable;  /* not 200, an unknown coding, bad compressed bytes or too large */
    decoder_t *decoder;
    sse_parser_t parser;
    struct evbuffer *json; /* the JSON body so far */
    mcp_resp_class_t cls;  /* what the response was, once found (MCP_RESP_OTHER: not yet) */
    char *result;          /* its "result" (or "error") value, verbatim */
    size_t result_len;
} rpc_reader_t;

void rpc_reader_init(rpc_reader_t *r, const json_t *id, size_t max_bytes);
void rpc_reader_head(rpc_reader_t *r, int status, const http_headers_t *headers, bool sse);
void rpc_reader_body(rpc_reader_t *r, const char *data, size_t len);
/* At the end of the body: true when the response was found (cls and result set). */
bool rpc_reader_end(rpc_reader_t *r);
void rpc_reader_free(rpc_reader_t *r);

#endif
