#include "mcp.h"

#include <stdlib.h>
#include <string.h>

const char *mcp_status_str(mcp_status_t st)
{
    switch (st) {
    case MCP_OK:
        return "ok";
    case MCP_ERR_PARSE:
        return "parse error";
    case MCP_ERR_SHAPE:
        return "not a JSON-RPC object or array";
    }
    return "unknown";
}

const char *mcp_resp_class_str(mcp_resp_class_t c)
{
    switch (c) {
    case MCP_RESP_OTHER:
        return "other";
    case MCP_RESP_RESULT:
        return "result";
    case MCP_RESP_TOOL_ERROR:
        return "tool_error";
    case MCP_RESP_INPUT_REQUIRED:
        return "input_required";
    case MCP_RESP_ERROR:
        return "error";
    }
    return "unknown";
}

/* --- a tiny scanner over JSON text, to keep stored results and ids byte for byte --- */

static size_t skip_ws(const char *s, size_t i, size_t n)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
        i++;
    return i;
}

/* Index just past the JSON value starting at i, or n+1 when malformed. */
static size_t skip_value(const char *s, size_t i, size_t n)
{
    if (i >= n)
        return n + 1;
    if (s[i] == '"') {
        for (i++; i < n; i++) {
            if (s[i] == '\\')
                i++;
            else if (s[i] == '"')
                return i + 1;
        }
        return n + 1;
    }
    if (s[i] == '{' || s[i] == '[') {
        int depth = 0;
        for (; i < n; i++) {
            char c = s[i];
            if (c == '"') {
                size_t j = skip_value(s, i, n);
                if (j > n)
                    return n + 1;
                i = j - 1;
            } else if (c == '{' || c == '[') {
                depth++;
            } else if (c == '}' || c == ']') {
                if (--depth == 0)
                    return i + 1;
            }
        }
        return n + 1;
    }
    while (i < n && s[i] != ',' && s[i] != '}' && s[i] != ']' && s[i] != ' ' && s[i] != '\t' &&
           s[i] != '\n' && s[i] != '\r')
        i++;
    return i;
}

bool mcp_member_span(const char *s, size_t n, const char *name, size_t *off, size_t *vlen)
{
    size_t nlen = strlen(name);
    size_t i = skip_ws(s, 0, n);
    if (i >= n || s[i] != '{')
        return false;
    i++;
    for (;;) {
        i = skip_ws(s, i, n);
        if (i >= n || s[i] != '"')
            return false;
        size_t kstart = i + 1;
        size_t kend = skip_value(s, i, n);
        if (kend > n)
            return false;
        bool match = kend - 1 - kstart == nlen && memcmp(s + kstart, name, nlen) == 0;
        i = skip_ws(s, kend, n);
        if (i >= n || s[i] != ':')
            return false;
        i = skip_ws(s, i + 1, n);
        size_t vend = skip_value(s, i, n);
        if (vend > n)
            return false;
        if (match) {
            *off = i;
            *vlen = vend - i;
            return true;
        }
        i = skip_ws(s, vend, n);
        if (i >= n || s[i] != ',')
            return false;
        i++;
    }
}

/* --- parsing a POST body --- */

static json_t *load(const char *body, size_t len)
{
    json_error_t err;
    json_t *root = json_loadb(body, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
    if (!root && strstr(err.text, "too big"))
        /* integers wider than 64 bits are valid JSON; keep going with doubles for the view */
        root =
            json_loadb(body, len, JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &err);
    return root;
}

static void classify_object(mcp_msg_t *m, json_t *obj, const char *text, size_t len)
{
    json_t *method = json_object_get(obj, "method");
    json_t *id = json_object_get(obj, "id");
    if (json_is_string(method)) {
        m->method = json_string_value(method);
        if (id && !json_is_null(id)) {
            m->kind = MCP_KIND_REQUEST;
            m->id = id;
            size_t off, vlen;
            if (text && mcp_member_span(text, len, "id", &off, &vlen))
                m->id_text = xstrndup(text + off, vlen);
            else
                m->id_text = json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT);
        } else {
            m->kind = MCP_KIND_NOTIFICATION;
        }
        if (m->kind == MCP_KIND_REQUEST && strcmp(m->method, "tools/call") == 0) {
            json_t *params = json_object_get(obj, "params");
            json_t *name = json_object_get(params, "name");
            if (json_is_string(name))
                m->tool = json_string_value(name);
            m->arguments = json_object_get(params, "arguments");
        }
    } else if (json_object_get(obj, "result") || json_object_get(obj, "error")) {
        m->kind = MCP_KIND_RESPONSE;
    } else {
        m->kind = MCP_KIND_OTHER;
    }
}

mcp_status_t mcp_parse(const char *body, size_t len, mcp_msg_t *out)
{
    memset(out, 0, sizeof(*out));
    json_t *root = load(body, len);
    if (!root)
        return MCP_ERR_PARSE;
    if (json_is_object(root)) {
        out->root = root;
        classify_object(out, root, body, len);
        return MCP_OK;
    }
    if (!json_is_array(root) || json_array_size(root) == 0) {
        json_decref(root);
        return MCP_ERR_SHAPE;
    }
    out->root = root;
    out->kind = MCP_KIND_BATCH;
    size_t i;
    json_t *el;
    json_array_foreach(root, i, el)
    {
        if (!json_is_object(el))
            continue;
        mcp_msg_t one = {0};
        classify_object(&one, el, NULL, 0);
        if (one.kind == MCP_KIND_REQUEST && strcmp(one.method, "tools/call") == 0) {
            if (!one.tool) {
                out->batch_bad_tool = true;
            } else {
                out->batch_tools =
                    xrealloc(out->batch_tools, (out->n_batch_tools + 1) * sizeof(char *));
                out->batch_tools[out->n_batch_tools++] = one.tool;
            }
        }
        free(one.id_text);
    }
    return MCP_OK;
}

void mcp_msg_free(mcp_msg_t *m)
{
    if (m->root)
        json_decref(m->root);
    free(m->id_text);
    free(m->batch_tools);
    memset(m, 0, sizeof(*m));
}

/* --- the response stream --- */

static bool ids_equal(const json_t *a, const json_t *b)
{
    if (json_is_number(a) && json_is_number(b))
        return json_number_value(a) == json_number_value(b);
    return json_equal((json_t *)a, (json_t *)b);
}

mcp_resp_class_t mcp_classify_response(const char *text, size_t len, const json_t *req_id,
                                       size_t *result_off, size_t *result_len)
{
    mcp_resp_class_t cls = MCP_RESP_OTHER;
    json_t *msg = load(text, len);
    if (!json_is_object(msg))
        goto out;
    json_t *id = json_object_get(msg, "id");
    if (!id || !req_id || !ids_equal(id, req_id) || json_object_get(msg, "method"))
        goto out;
    json_t *result = json_object_get(msg, "result");
    json_t *error = json_object_get(msg, "error");
    if (json_is_object(result)) {
        json_t *rt = json_object_get(result, "resultType");
        if (json_is_string(rt) && strcmp(json_string_value(rt), "input_required") == 0)
            cls = MCP_RESP_INPUT_REQUIRED;
        else if (json_is_true(json_object_get(result, "isError")))
            cls = MCP_RESP_TOOL_ERROR;
        else
            cls = MCP_RESP_RESULT;
        if (!mcp_member_span(text, len, "result", result_off, result_len)) {
            cls = MCP_RESP_ERROR; /* cannot keep it verbatim: treat as not storable */
        }
    } else if (error) {
        cls = MCP_RESP_ERROR;
        if (!mcp_member_span(text, len, "error", result_off, result_len))
            *result_off = *result_len = 0;
    }
out:
    if (msg)
        json_decref(msg);
    return cls;
}

/* --- bodies the gateway writes --- */

static char *json_str(const char *s)
{
    json_t *j = json_string(s);
    char *out = json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT);
    json_decref(j);
    return out;
}

char *mcp_error_body(const char *id_text, int code, const char *message)
{
    char *msg = json_str(message);
    char *out = xasprintf("{\"jsonrpc\":\"2.0\",\"id\":%s,\"error\":{\"code\":%d,\"message\":%s}}",
                          id_text ? id_text : "null", code, msg);
    free(msg);
    return out;
}

char *mcp_tool_error_body(const char *id_text, const char *text, const char *status_json)
{
    char *t = json_str(text);
    char *out;
    if (status_json)
        out =
            xasprintf("{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\","
                      "\"text\":%s}],\"isError\":true,\"_meta\":{\"idemgw/status\":%s}}}",
                      id_text ? id_text : "null", t, status_json);
    else
        out =
            xasprintf("{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\","
                      "\"text\":%s}],\"isError\":true}}",
                      id_text ? id_text : "null", t);
    free(t);
    return out;
}

char *mcp_replay_body(const char *id_text, const char *result, size_t result_len,
                      const char *marker_json)
{
    size_t i = skip_ws(result, 0, result_len);
    if (i >= result_len || result[i] != '{')
        return NULL;
    size_t off, vlen;
    if (!mcp_member_span(result, result_len, "_meta", &off, &vlen)) {
        /* common case: splice the marker in front, leaving the stored bytes untouched */
        size_t j = skip_ws(result, i + 1, result_len);
        bool empty = j < result_len && result[j] == '}';
        return xasprintf(
            "{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"_meta\":{\"idemgw/replay\":%s}%s%.*s}",
            id_text ? id_text : "null", marker_json, empty ? "" : ",", (int)(result_len - i - 1),
            result + i + 1);
    }
    /* the result has its own _meta: add our member inside it */
    size_t k = skip_ws(result, off, result_len);
    if (k >= result_len || result[k] != '{')
        return NULL;
    size_t j = skip_ws(result, k + 1, result_len);
    bool empty = j < result_len && result[j] == '}';
    return xasprintf("{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":%.*s{\"idemgw/replay\":%s%s%.*s}",
                     id_text ? id_text : "null", (int)k, result, marker_json, empty ? "" : ",",
                     (int)(result_len - k - 1), result + k + 1);
}
