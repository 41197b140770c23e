/* libFuzzer driver for JSON-RPC extraction and response classification: any bytes, no crash,
 * spans found always lie inside the input, and the fast scanner agrees with the jansson tree
 * on every body (differential: the tree path is the reference). The revision's readers run on
 * the same bytes: the mirrored headers checked against the body, the _meta version claim, and
 * a replay made to fit 2026-07-28, which stays JSON whenever the replay was. */
#include "mcp.h"
#include "revision.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool same(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* jansson refuses some valid JSON (a real that overflows a double, very deep nesting) */
static bool tree_limit(const char *text, size_t size)
{
    json_error_t err;
    json_t *j = json_loadb(text, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
    if (j) {
        json_decref(j);
        return false;
    }
    return strstr(err.text, "overflow") || strstr(err.text, "too big") || strstr(err.text, "depth");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    mcp_msg_t m, t;
    mcp_status_t sf = mcp_parse(text, size, &m);
    mcp_status_t st = mcp_parse_tree(text, size, &t);
    /* jansson takes a raw NUL byte between tokens for a separator; JSON does not */
    bool raw_nul = memchr(text, '\0', size) != NULL;
    if (sf != st && !(sf == MCP_OK && st == MCP_ERR_PARSE && tree_limit(text, size)) &&
        !(sf == MCP_ERR_PARSE && st == MCP_OK && raw_nul)) {
        fprintf(stderr, "scanner says %s, tree says %s\n", mcp_status_str(sf), mcp_status_str(st));
        abort();
    }
    if (sf == MCP_OK && st == MCP_OK && !raw_nul &&
        (m.kind != t.kind || !same(m.method, t.method) || !same(m.tool, t.tool) ||
         !same(m.id_text, t.id_text) || m.call_without_id != t.call_without_id)) {
        fprintf(stderr, "scanner and tree disagree on the message\n");
        abort();
    }
    if (st == MCP_OK)
        mcp_msg_free(&t);
    if (sf == MCP_OK) {
        if (m.id) {
            size_t off = 0, len = 0;
            mcp_resp_class_t c = mcp_classify_response(text, size, m.id, &off, &len);
            if (c != MCP_RESP_OTHER && off + len > size)
                abort();
            if (c == MCP_RESP_RESULT) {
                char *b = mcp_replay_body(m.id_text, text + off, len, "{}");
                json_t *before = b ? json_loads(b, 0, NULL) : NULL;
                b = revision_fit(b, REVISION_2026);
                json_t *after = b ? json_loads(b, 0, NULL) : NULL;
                if (before && (!json_is_object(after) ||
                               !json_is_string(json_object_get(json_object_get(after, "result"),
                                                               "resultType"))))
                    abort();
                json_decref(before);
                json_decref(after);
                free(b);
            }
        }
        /* the body's own bytes as the header values it is checked against */
        char *hv = strndup(text, size < 64 ? size : 64);
        revision_headers_t h = {.protocol_version = hv, .method = hv, .name = hv};
        (void)revision_header_mismatch(&h, &m, text, size);
        free(revision_meta_version(text, size));
        free(revision_header_value(hv, NULL));
        free(hv);
        mcp_msg_free(&m);
    }
    size_t off, len;
    if (mcp_member_span(text, size, "result", &off, &len) && off + len > size)
        abort();
    /* the key argument's removal (names compared unescaped) only ever shortens the body */
    size_t out_len = 0;
    char *cut = mcp_without_argument(text, size, "idempotency_key", &out_len);
    if (cut && out_len >= size)
        abort();
    free(cut);
    return 0;
}
