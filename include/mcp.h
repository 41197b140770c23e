/* The MCP (JSON-RPC 2.0) message view the gateway needs: what a POST body is, and the
 * responses the gateway writes itself. Pure: no I/O. */
#ifndef IDEMGW_MCP_H
#define IDEMGW_MCP_H

#include "util.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef enum {
    MCP_OK = 0,
    MCP_ERR_PARSE, /* not JSON: answered 400 with -32700, never forwarded */
    MCP_ERR_SHAPE, /* JSON, but neither an object nor an array (or an empty array) */
} mcp_status_t;

const char *mcp_status_str(mcp_status_t st);

typedef enum {
    MCP_KIND_REQUEST = 0,  /* has method and id */
    MCP_KIND_NOTIFICATION, /* has method, no id */
    MCP_KIND_RESPONSE,     /* has result or error (client answering a server request) */
    MCP_KIND_BATCH,        /* an array (2025-03-26) */
    MCP_KIND_OTHER,        /* an object that is none of the above; forwarded as is */
} mcp_kind_t;

typedef struct mcp_msg {
    json_t *root; /* the parsed body when the tree path ran; owned, else NULL */
    mcp_kind_t kind;
    const char *method;       /* borrowed from root, or NULL */
    char *id_text;            /* raw JSON text of the request id, or NULL; owned */
    size_t id_off;            /* where id_text stands in the body parsed, when id_at_known */
    bool id_at_known;         /* (the scanner's path): the id rewritten without a second walk */
    json_t *id;               /* borrowed from root, or NULL */
    const char *tool;         /* params.name of a tools/call, or NULL */
    const char **batch_tools; /* tools/call names inside a batch; owned array, borrowed names */
    size_t n_batch_tools;
    bool batch_bad_tool;  /* a tools/call in the batch has no string name */
    bool call_without_id; /* a tools/call with no id (or a null one), alone or in a batch: a
                             notification, which has no answer to replay and which a lenient
                             server runs all the same */
    char *own_method;     /* the fast path's copies behind method and tool */
    char *own_tool;
    json_t *own_id; /* the fast path's id value */
} mcp_msg_t;

/* Parses a POST body. On MCP_OK the caller owns out and frees it with mcp_msg_free. A single
 * object is validated and classified by a scanner that builds no tree; batches and the rare
 * object it cannot decide (escaped member names) go through jansson. */
mcp_status_t mcp_parse(const char *body, size_t len, mcp_msg_t *out) MUST_CHECK;
/* The jansson path alone: the reference the scanner is fuzzed against. */
mcp_status_t mcp_parse_tree(const char *body, size_t len, mcp_msg_t *out) MUST_CHECK;
/* Called with a tools/call's params.name (NULL when it is not a string) and whether it has an
 * id that is not null. */
typedef void (*mcp_call_fn)(void *arg, const char *tool, bool has_id);
/* Calls fn for every tools/call in a body, request or notification, alone or in a batch. For
 * bodies off the MCP endpoint, where what a lenient server would execute matters more than
 * what is valid. MCP_ERR_PARSE when the body is not JSON. */
mcp_status_t mcp_each_call(const char *body, size_t len, mcp_call_fn fn, void *arg) MUST_CHECK;
void mcp_msg_free(mcp_msg_t *m);

/* Finds the raw text of a top-level member of a JSON object text, without unescaping names
 * (names with escapes are not found). Returns true and the byte span. */
bool mcp_member_span(const char *text, size_t len, const char *name, size_t *off, size_t *vlen);

/* A member's value in an object text: its byte span. */
typedef struct mcp_span {
    size_t off, len;
    bool present;
} mcp_span_t;

/* mcp_member_span for several names in one walk of the text: spans[k] is where names[k] is
 * (the last one, as with mcp_member_span). False, and none present, when the text is not an
 * object of members, or when asked for more than MCP_SPANS_MAX names. */
#define MCP_SPANS_MAX 16
bool mcp_member_spans(const char *text, size_t len, const char *const names[], size_t count,
                      mcp_span_t spans[]);

/* The body of a tools/call without the member name of params.arguments, every other byte as
 * it was; NULL when there is no such member (or the body is not an object with them). The
 * length goes to out_len. */
char *mcp_without_argument(const char *body, size_t len, const char *name, size_t *out_len);

/* What a message seen on the response stream means for the request with id req_id. */
typedef enum {
    MCP_RESP_OTHER = 0,      /* not the final response for this request */
    MCP_RESP_RESULT,         /* final, a result */
    MCP_RESP_TOOL_ERROR,     /* final, a result with isError: true */
    MCP_RESP_INPUT_REQUIRED, /* final for this round, resultType "input_required": never stored */
    MCP_RESP_ERROR,          /* final, a JSON-RPC error */
    MCP_RESP_FOREIGN,        /* a response (result or error) to another id: not ours */
} mcp_resp_class_t;

const char *mcp_resp_class_str(mcp_resp_class_t c);

/* Classifies one JSON-RPC message text. On a final class, *result_off/len give the raw span of
 * the "result" (or "error") value inside text, to store verbatim. */
mcp_resp_class_t mcp_classify_response(const char *text, size_t len, const json_t *req_id,
                                       size_t *result_off, size_t *result_len);

/* Response bodies the gateway writes itself (malloc'd, compact JSON). id_text NULL → null. */
char *mcp_error_body(const char *id_text, int code, const char *message);
/* A tool result with isError: true and one text block. meta (may be NULL) is a JSON object
 * text placed under _meta["idemgw/status"]. */
char *mcp_tool_error_body(const char *id_text, const char *text, const char *status_json);
/* The same with isError only when is_error (an informative answer of the gateway's own). */
char *mcp_tool_text_body(const char *id_text, const char *text, const char *status_json,
                         bool is_error);
/* A replay: the stored result verbatim with the new id and result._meta["idemgw/replay"] set
 * to the marker object text. Returns NULL when the stored result is not a JSON object. */
char *mcp_replay_body(const char *id_text, const char *result, size_t result_len,
                      const char *marker_json);

#endif
