/* The protocol revision a request speaks, and what that asks of the answers the gateway writes
 * itself. Two eras: the 2025 revisions (2025-03-26, 2025-06-18, 2025-11-25: sessions,
 * initialize) and 2026-07-28 and later (no session, the version in every request's
 * params._meta, resultType required on every result, Mcp-Method / Mcp-Name mirrored in
 * headers). This is the one place that decides both: which era a request is in, and how a
 * result is made to fit it. Pure: no I/O. */
#ifndef IDEMGW_REVISION_H
#define IDEMGW_REVISION_H

#include "mcp.h"
#include "util.h"

#include <stdbool.h>
#include <stddef.h>

typedef enum {
    REVISION_2025 = 0, /* 2025-11-25 and older, and a request that names no version */
    REVISION_2026,     /* 2026-07-28 and later: resultType required */
    REVISION_N
} revision_t;

/* "2025" or "2026-07-28", for logs and tests. */
const char *revision_str(revision_t r);

/* The first version of the 2026 era, the _meta member that carries a request's version. */
#define REVISION_FIRST_2026 "2026-07-28"
#define REVISION_META_VERSION "io.modelcontextprotocol/protocolVersion"

/* The era of a version string: 2026 for a date (YYYY-MM-DD) on or after 2026-07-28; 2025 for
 * an older date, anything that is not a date, and NULL. */
revision_t revision_of_version(const char *version);

/* The version a request body claims in params._meta["io.modelcontextprotocol/protocolVersion"]
 * (a copy to free), or NULL when it claims none (or the body is not a request object). */
char *revision_meta_version(const char *body, size_t len);

/* The request's era from its MCP-Protocol-Version header and its body's claim (either may be
 * NULL). Either one naming the 2026 era makes it 2026: a result that carries resultType is
 * still one a 2025 client accepts, one without it is refused by a 2026 client. The gateway
 * keeps no per-session version: every 2025 client from 2025-06-18 on sends the header on each
 * request, and a 2025-03-26 client's answers need nothing. */
revision_t revision_of_request(const char *header_version, const char *meta_version);

/* What the mirrored headers of a request (SEP-2243) say, each NULL when absent. */
typedef struct revision_headers {
    const char *protocol_version; /* MCP-Protocol-Version */
    const char *method;           /* Mcp-Method */
    const char *name;             /* Mcp-Name, plain or =?base64?...?= */
} revision_headers_t;

/* Why the headers disagree with the body (a static sentence for the -32020 answer), or NULL
 * when they agree or are absent. m is the parsed body, body its text (for the name of a
 * resources/read or prompts/get and the _meta version claim). An Mcp-Name in the base64 form
 * is decoded first; one that does not decode is a mismatch. */
const char *revision_header_mismatch(const revision_headers_t *h, const mcp_msg_t *m,
                                     const char *body, size_t len);

/* Decodes an Mcp-Name / Mcp-Param value: a plain value is copied, "=?base64?B?=" is decoded
 * (standard alphabet, padded). NULL when the base64 form does not decode to text without NUL
 * bytes. The length goes to out_len (may be NULL). */
char *revision_header_value(const char *value, size_t *out_len);

/* The header lines (each "Name: value\r\n") a 2026 request mirrors from its body (SEP-2243):
 * MCP-Protocol-Version, Mcp-Method, and Mcp-Name for tools/call, prompts/get (its name) and
 * resources/read (its uri), a value that is not plain printable ASCII in the base64 form.
 * NULL when msg is not a request claiming a 2026 version in params._meta. For a client that
 * writes bodies only (stdio) and a gateway that speaks HTTP for it. */
char *revision_mirror_headers(const json_t *msg);

/* Makes a complete JSON-RPC response body the gateway sends fit revision r: for 2026, a
 * "result" object without resultType gains "resultType":"complete" as its first member, every
 * other byte as it was. Takes body (malloc'd) and returns the body to send, which may be the
 * same pointer. An error response, a result that has its own resultType, and anything for a
 * 2025 caller are returned unchanged. */
char *revision_fit(char *body, revision_t r) MUST_CHECK;

#endif
