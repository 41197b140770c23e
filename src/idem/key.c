/* Idempotency key derivation (see include/key.h).
 *
 * Two choices beyond the header:
 * - ':' and '%' in the subject and the tool name are percent-encoded ("%3A", "%25"). Without
 *   it subject "alice" calling tool "x:t" and subject "alice:x" calling tool "t" would share a
 *   key, and so each other's stored results. Names without those characters are unchanged.
 * - An explicit key in the key_arg argument may be a string or a number; a number is used in
 *   its canonical text ("idempotency_key": 42 is the key "42"), because clients that number
 *   their requests should not be refused. A null key_arg counts as absent. Other types are
 *   KEY_ERR_BAD_EXPLICIT unless the header supplies the key. */
#include "key.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY_EXPLICIT_MAX 255

const char *key_status_str(key_status_t st)
{
    switch (st) {
    case KEY_OK:
        return "ok";
    case KEY_ERR_ARGS_NOT_OBJECT:
        return "arguments are not an object";
    case KEY_ERR_BAD_EXPLICIT:
        return "bad explicit idempotency key";
    }
    return "unknown key status";
}

static key_status_t key_fail(key_status_t st, char *msg, size_t msglen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static key_status_t key_fail(key_status_t st, char *msg, size_t msglen, const char *fmt, ...)
{
    if (msg && msglen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, msglen, fmt, ap);
        va_end(ap);
    }
    return st;
}

/* Appends s with ':' and '%' percent-encoded, so the separators stay unambiguous. */
static size_t put_escaped(char *o, const char *s)
{
    size_t n = 0;
    for (; *s; s++) {
        if (*s == ':' || *s == '%') {
            n += (size_t)sprintf(o + n, "%%%02X", (unsigned char)*s);
        } else {
            o[n++] = *s;
        }
    }
    return n;
}

static char *build_key(const char *subject, const char *tool, const char *kind, const char *tail,
                       size_t tail_len)
{
    /* worst case every subject/tool byte triples */
    size_t cap = 3 * (strlen(subject) + strlen(tool)) + strlen(kind) + tail_len + 4;
    char *k = xmalloc(cap);
    size_t n = put_escaped(k, subject);
    k[n++] = ':';
    n += put_escaped(k + n, tool);
    k[n++] = ':';
    memcpy(k + n, kind, strlen(kind));
    n += strlen(kind);
    k[n++] = ':';
    memcpy(k + n, tail, tail_len);
    n += tail_len;
    k[n] = '\0';
    return k;
}

static key_status_t check_explicit(const char *k, size_t len, const char *from, char *msg,
                                   size_t msglen)
{
    if (len == 0)
        return key_fail(KEY_ERR_BAD_EXPLICIT, msg, msglen, "%s: idempotency key is empty", from);
    if (len > KEY_EXPLICIT_MAX)
        return key_fail(KEY_ERR_BAD_EXPLICIT, msg, msglen,
                        "%s: idempotency key is longer than %d bytes", from, KEY_EXPLICIT_MAX);
    if (memchr(k, '\0', len))
        return key_fail(KEY_ERR_BAD_EXPLICIT, msg, msglen,
                        "%s: idempotency key contains a NUL character", from);
    /* the key is stored as Postgres text: bytes that are not UTF-8 would fail the claim */
    if (!util_utf8_valid(k, len))
        return key_fail(KEY_ERR_BAD_EXPLICIT, msg, msglen, "%s: idempotency key is not valid UTF-8",
                        from);
    return KEY_OK;
}

/* Takes the explicit key out of the key_arg member, if usable. *out stays NULL when the member
 * is absent or null. */
static key_status_t arg_explicit(const jcs_value_t *member, const char *key_arg, const char *where,
                                 char **out, char *msg, size_t msglen)
{
    *out = NULL;
    if (!member || jcs_type(member) == JCS_NULL)
        return KEY_OK;
    char *text;
    size_t len;
    if (jcs_type(member) == JCS_STRING) {
        const char *s = jcs_string(member, &len);
        text = xstrndup(s, len);
    } else if (jcs_type(member) == JCS_NUMBER) {
        text = jcs_serialize(member, &len);
    } else {
        return key_fail(KEY_ERR_BAD_EXPLICIT, msg, msglen,
                        "%s%s: idempotency key must be a string or a number", where, key_arg);
    }
    char from[160];
    snprintf(from, sizeof from, "%s%s", where, key_arg);
    key_status_t st = check_explicit(text, len, from, msg, msglen);
    if (st != KEY_OK) {
        free(text);
        return st;
    }
    *out = text;
    return KEY_OK;
}

/* param_key: the params.idempotencyKey member, or NULL. */
static key_status_t derive(const char *subject, const char *tool, jcs_value_t *args,
                           const jcs_value_t *param_key, const policy_tool_t *pt,
                           const char *header_key, key_result_t *out, char *msg, size_t msglen)
{
    memset(out, 0, sizeof *out);
    if (msg && msglen)
        msg[0] = '\0';
    bool absent = !args || jcs_type(args) == JCS_NULL;
    if (!absent && jcs_type(args) != JCS_OBJECT)
        return key_fail(KEY_ERR_ARGS_NOT_OBJECT, msg, msglen, "arguments must be an object");

    /* a policy without key_arg (NULL or "") disables explicit keys in arguments */
    const char *key_arg = pt ? pt->key_arg : POLICY_KEY_ARG_DEFAULT;
    if (key_arg && !*key_arg)
        key_arg = NULL;

    char *explicit_key = NULL;
    key_status_t st = KEY_OK;
    if (header_key) {
        size_t hlen = strlen(header_key);
        st = check_explicit(header_key, hlen, "Idempotency-Key header", msg, msglen);
        if (st != KEY_OK)
            return st;
        explicit_key = xstrndup(header_key, hlen);
    } else if (param_key && jcs_type(param_key) != JCS_NULL) {
        st = arg_explicit(param_key, KEY_PARAM, "params.", &explicit_key, msg, msglen);
        if (st != KEY_OK)
            return st;
    } else if (!absent && key_arg) {
        st = arg_explicit(jcs_object_get(args, key_arg), key_arg, "argument ", &explicit_key, msg,
                          msglen);
        if (st != KEY_OK)
            return st;
    }

    char *canon;
    size_t canon_len;
    if (absent) {
        canon = xstrdup("{}");
        canon_len = 2;
    } else {
        for (size_t i = 0; pt && i < pt->n_exclude_args; i++)
            (void)jcs_remove_path(args, pt->exclude_args[i]);
        if (key_arg)
            (void)jcs_object_remove(args, key_arg);
        canon = jcs_serialize(args, &canon_len);
    }
    util_sha256_hex(canon, canon_len, out->args_digest);
    free(canon);

    if (explicit_key) {
        out->key = build_key(subject, tool, "x", explicit_key, strlen(explicit_key));
        out->explicit_key = true;
        free(explicit_key);
    } else {
        out->key = build_key(subject, tool, "h", out->args_digest, 32);
    }
    return KEY_OK;
}

key_status_t key_for_call(const key_call_t *call, key_result_t *out, char *msg, size_t msglen)
{
    jcs_value_t *args = call->arguments;
    const jcs_value_t *param_key = NULL;
    if (call->params) {
        args = jcs_object_get(call->params, "arguments");
        param_key = jcs_object_get(call->params, KEY_PARAM);
    }
    char *tool = key_scoped_tool(call->server, call->tool);
    key_status_t st =
        derive(call->subject, tool, args, param_key, call->pt, call->header_key, out, msg, msglen);
    free(tool);
    if (st == KEY_OK)
        key_hash_hex(out->key, out->key_hash);
    return st;
}

void key_result_free(key_result_t *r)
{
    if (!r)
        return;
    free(r->key);
    r->key = NULL;
}
