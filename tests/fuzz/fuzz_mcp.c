/* libFuzzer driver for JSON-RPC extraction and response classification: any bytes, no crash,
 * and spans found always lie inside the input. */
#include "mcp.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    mcp_msg_t m;
    if (mcp_parse(text, size, &m) == MCP_OK) {
        if (m.id) {
            size_t off = 0, len = 0;
            mcp_resp_class_t c = mcp_classify_response(text, size, m.id, &off, &len);
            if (c != MCP_RESP_OTHER && off + len > size)
                abort();
            if (c == MCP_RESP_RESULT) {
                char *b = mcp_replay_body(m.id_text, text + off, len, "{}");
                free(b);
            }
        }
        mcp_msg_free(&m);
    }
    size_t off, len;
    if (mcp_member_span(text, size, "result", &off, &len) && off + len > size)
        abort();
    return 0;
}
