/* The operator's queue, above the backends (include/store_queue.h). */
#include "store_queue.h"

#include "key_hash.h"
#include "log.h"
#include "util.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const state_filters[] = {
    [STORE_QUEUE_STATE_ANY] = "",
    [STORE_QUEUE_STATE_UNKNOWN] = "unknown",
    [STORE_QUEUE_STATE_IN_PROGRESS] = "in_progress",
    [STORE_QUEUE_STATE_SUCCEEDED] = "succeeded",
    [STORE_QUEUE_STATE_FAILED] = "failed",
    [STORE_QUEUE_STATE_STUCK] = "stuck",
    [STORE_QUEUE_STATE_OPEN] = "open",
};

bool store_queue_state_parse(const char *name, store_queue_state_t *out)
{
    for (size_t i = 0; i < sizeof(state_filters) / sizeof(state_filters[0]); i++)
        if (strcmp(name ? name : "", state_filters[i]) == 0) {
            *out = (store_queue_state_t)i;
            return true;
        }
    return false;
}

static const char *const outcomes[] = {"succeeded", "failed", "forget"};

const char *store_queue_outcome_str(store_queue_outcome_t o)
{
    return (unsigned)o < 3 ? outcomes[o] : "?";
}

bool store_queue_outcome_parse(const char *name, store_queue_outcome_t *out)
{
    for (int i = 0; name && i < 3; i++)
        if (strcmp(name, outcomes[i]) == 0) {
            *out = (store_queue_outcome_t)i;
            return true;
        }
    return false;
}

const char *store_queue_answer_str(store_queue_answer_t a)
{
    switch (a) {
    case STORE_QUEUE_OK:
        return "ok";
    case STORE_QUEUE_NOT_FOUND:
        return "not_found";
    case STORE_QUEUE_AMBIGUOUS:
        return "ambiguous";
    case STORE_QUEUE_CONFLICT:
        return "conflict";
    case STORE_QUEUE_INVALID:
        return "invalid";
    }
    return "?";
}

static void iso_member(json_t *o, const char *name, int64_t ms)
{
    if (ms < 0) {
        json_object_set_new(o, name, json_null());
        return;
    }
    char iso[UTIL_ISO_LEN + 1];
    util_iso_utc_ms(ms, iso);
    json_object_set_new(o, name, json_string(iso));
}

json_t *store_queue_row(const char *key, const char *tool, const char *subject, const char *state,
                        int attempts, int64_t created_ms, int64_t updated_ms,
                        int64_t lease_until_ms, int64_t expires_ms, int64_t finished_ms,
                        bool lease_expired, bool too_large)
{
    return json_pack("{s:s,s:s,s:s,s:s,s:i,s:I,s:I,s:I,s:I,s:o,s:b,s:b}", "key", key, "tool", tool,
                     "subject", subject, "state", state, "attempts", attempts, "created_ms",
                     (json_int_t)created_ms, "updated_ms", (json_int_t)updated_ms, "lease_until_ms",
                     (json_int_t)lease_until_ms, "expires_ms", (json_int_t)expires_ms,
                     "finished_ms", finished_ms < 0 ? json_null() : json_integer(finished_ms),
                     "lease_expired", lease_expired, "result_too_large", too_large);
}

static int64_t row_ms(const json_t *row, const char *name)
{
    const json_t *v = json_object_get(row, name);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
}

/* A backend's ROW as the answers show it: the key replaced by its hash, the tool split into
 * server and tool, times in ISO 8601. */
static json_t *entry_of(const json_t *row)
{
    const char *key = json_string_value(json_object_get(row, "key"));
    const char *tool = json_string_value(json_object_get(row, "tool"));
    char hash[65];
    key_hash_hex(key ? key : "", hash);
    json_t *e = json_object();
    json_object_set_new(e, "key_hash", json_string(hash));
    const char *slash = tool ? strchr(tool, '/') : NULL;
    if (slash) {
        json_object_set_new(e, "server", json_stringn(tool, (size_t)(slash - tool)));
        json_object_set_new(e, "tool", json_string(slash + 1));
    } else {
        json_object_set_new(e, "server", json_null());
        json_object_set_new(e, "tool", json_string(tool ? tool : ""));
    }
    json_object_set(e, "subject", json_object_get(row, "subject"));
    json_object_set(e, "state", json_object_get(row, "state"));
    json_object_set(e, "attempts", json_object_get(row, "attempts"));
    iso_member(e, "first_seen", row_ms(row, "created_ms"));
    iso_member(e, "updated", row_ms(row, "updated_ms"));
    iso_member(e, "lease_until", row_ms(row, "lease_until_ms"));
    iso_member(e, "expires_at", row_ms(row, "expires_ms"));
    iso_member(e, "finished_at", row_ms(row, "finished_ms"));
    json_object_set(e, "lease_expired", json_object_get(row, "lease_expired"));
    json_object_set(e, "result_too_large", json_object_get(row, "result_too_large"));
    return e;
}

/* The record SHOW answers: the entry, its duplicates, history, actions and stored result. */
static json_t *record_of(const json_t *row)
{
    json_t *e = entry_of(row);
    json_object_set_new(e, "duplicates",
                        json_pack("{s:O,s:O,s:O}", "replay", json_object_get(row, "dup_replay"),
                                  "in_progress", json_object_get(row, "dup_in_progress"), "unknown",
                                  json_object_get(row, "dup_unknown")));
    const char *hist = json_string_value(json_object_get(row, "history"));
    json_t *h = hist ? json_loads(hist, 0, NULL) : NULL;
    json_object_set_new(e, "history", h ? h : json_array());
    json_t *acts = json_array();
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(row, "actions"), i, a)
    {
        json_t *o = json_pack("{s:O,s:O,s:O,s:O,s:O}", "outcome", json_object_get(a, "outcome"),
                              "previous_state", json_object_get(a, "previous_state"), "by",
                              json_object_get(a, "actor"), "note", json_object_get(a, "note"),
                              "waited_ms", json_object_get(a, "waited_ms"));
        if (o) {
            iso_member(o, "at", row_ms(a, "at_ms"));
            json_array_append_new(acts, o);
        }
    }
    json_object_set_new(e, "actions", acts);
    const char *res = json_string_value(json_object_get(row, "result"));
    json_t *r = res ? json_loads(res, 0, NULL) : NULL;
    json_object_set_new(e, "result", r ? r : json_null());
    return e;
}

static void answer(store_queue_op_t *op, store_status_t st, store_queue_answer_t a, json_t *body)
{
    op->cb(st, a, st == STORE_OK ? body : NULL, op->arg);
    json_decref(body);
}

static json_t *error_body(store_queue_answer_t a, const char *msg)
{
    return json_pack("{s:s,s:s}", "error", store_queue_answer_str(a), "message", msg);
}

void store_queue_op_free(store_queue_op_t *op)
{
    free(op->tool_exact);
    free(op->tool_prefix);
    free(op->subject);
    free(op->key);
    free(op->result);
    free(op->actor);
    free(op->note);
    json_decref(op->out);
    free(op);
}

static char *dup_or_null(const char *s)
{
    return s ? xstrdup(s) : NULL;
}

store_queue_op_t *store_queue_op_clone(const store_queue_op_t *op)
{
    store_queue_op_t *c = xcalloc(1, sizeof(*c));
    *c = *op;
    c->tool_exact = dup_or_null(op->tool_exact);
    c->tool_prefix = dup_or_null(op->tool_prefix);
    c->subject = dup_or_null(op->subject);
    c->key = dup_or_null(op->key);
    c->actor = dup_or_null(op->actor);
    c->note = dup_or_null(op->note);
    c->result = NULL;
    if (op->result) {
        c->result = xmalloc(op->result_len + 1);
        memcpy(c->result, op->result, op->result_len);
        c->result[op->result_len] = '\0';
    }
    c->out = NULL;
    c->store = NULL;
    c->cb = NULL;
    c->arg = NULL;
    return c;
}

static store_queue_op_t *op_new(store_t *s, store_queue_kind_t kind, store_queue_cb cb, void *arg)
{
    store_queue_op_t *op = xcalloc(1, sizeof(*op));
    op->kind = kind;
    op->store = s;
    op->cb = cb;
    op->arg = arg;
    op->cursor_ms = -1;
    return op;
}

/* Lowercase hex of STORE_QUEUE_PREFIX_MIN to 64 characters, into out. */
static bool prefix_ok(const char *p, char out[65])
{
    size_t n = p ? strlen(p) : 0;
    if (n < STORE_QUEUE_PREFIX_MIN || n > 64)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (!isxdigit((unsigned char)p[i]))
            return false;
        out[i] = (char)tolower((unsigned char)p[i]);
    }
    out[n] = '\0';
    return true;
}

/* The cursor is "MS.HASH": the last entry's first_seen in ms and its key_hash. */
static bool cursor_parse(const char *c, int64_t *ms, char hash[65])
{
    char *end;
    long long v = strtoll(c, &end, 10);
    if (end == c || *end != '.' || v < 0 || strlen(end + 1) != 64 || !prefix_ok(end + 1, hash))
        return false;
    *ms = v;
    return true;
}

static store_status_t submit(store_queue_op_t *op)
{
    store_status_t st = store_queue_submit(op->store, op);
    if (st != STORE_OK)
        store_queue_op_free(op);
    return st;
}

store_status_t store_queue_list(store_t *s, const store_queue_filter_t *f, store_queue_cb cb,
                                void *arg)
{
    store_queue_op_t *op = op_new(s, STORE_QUEUE_LIST, cb, arg);
    op->state = f->state;
    if (f->server && f->server[0] && f->tool && f->tool[0])
        op->tool_exact = key_scoped_tool(f->server, f->tool);
    else if (f->server && f->server[0])
        op->tool_prefix = xasprintf("%s/", f->server);
    else if (f->tool && f->tool[0])
        op->tool_exact = xstrdup(f->tool);
    op->subject = f->subject && f->subject[0] ? xstrdup(f->subject) : NULL;
    op->limit = f->limit <= 0                      ? STORE_QUEUE_LIMIT_DEFAULT
                : f->limit > STORE_QUEUE_LIMIT_MAX ? STORE_QUEUE_LIMIT_MAX
                                                   : f->limit;
    op->updated_since_ms = f->updated_since_ms > 0 ? f->updated_since_ms : 0;
    if (!op->updated_since_ms && f->cursor && f->cursor[0] &&
        !cursor_parse(f->cursor, &op->cursor_ms, op->cursor_hash)) {
        store_queue_op_free(op);
        return STORE_ERR_STATEMENT;
    }
    return submit(op);
}

store_status_t store_queue_show(store_t *s, const char *key_hash, store_queue_cb cb, void *arg)
{
    store_queue_op_t *op = op_new(s, STORE_QUEUE_SHOW, cb, arg);
    if (!prefix_ok(key_hash, op->prefix)) {
        /* answered from the loop like any other: through the backend, with no prefix match */
        op->prefix[0] = '\0';
    }
    return submit(op);
}

store_status_t store_queue_summary(store_t *s, store_queue_cb cb, void *arg)
{
    return submit(op_new(s, STORE_QUEUE_SUMMARY, cb, arg));
}

/* The operator's result as stored: their object with _meta[STORE_QUEUE_META_OPERATOR]. */
static char *operator_result(const json_t *result, const char *actor, const char *note, size_t *len)
{
    json_t *r = json_deep_copy(result);
    json_t *meta = json_object_get(r, "_meta");
    if (!json_is_object(meta)) {
        meta = json_object();
        json_object_set_new(r, "_meta", meta);
    }
    char iso[UTIL_ISO_LEN + 1];
    util_iso_utc_ms((int64_t)util_now_ms(), iso);
    json_object_set_new(meta, STORE_QUEUE_META_OPERATOR,
                        json_pack("{s:s,s:s,s:o}", "by", actor, "at", iso, "note",
                                  note ? json_string(note) : json_null()));
    char *out = json_dumps(r, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(r);
    *len = out ? strlen(out) : 0;
    return out;
}

static char *cut(const char *s, size_t max)
{
    if (!s)
        return NULL;
    size_t n = strlen(s);
    if (n > max) {
        n = max;
        /* not inside a UTF-8 sequence */
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
            n--;
    }
    char *c = xmalloc(n + 1);
    memcpy(c, s, n);
    c[n] = '\0';
    return c;
}

store_status_t store_queue_resolve(store_t *s, const store_queue_resolve_t *r, store_queue_cb cb,
                                   void *arg)
{
    store_queue_op_t *op = op_new(s, STORE_QUEUE_SHOW, cb, arg);
    if (!prefix_ok(r->key_hash, op->prefix))
        op->prefix[0] = '\0';
    op->outcome = r->outcome;
    op->actor = cut(r->actor && r->actor[0] ? r->actor : "operator", STORE_QUEUE_ACTOR_MAX);
    op->note = r->note && r->note[0] ? cut(r->note, STORE_QUEUE_NOTE_MAX) : NULL;
    op->resolving = true;
    if (r->outcome == STORE_QUEUE_SUCCEEDED) {
        if (!json_is_object(r->result)) {
            store_queue_op_free(op);
            return STORE_ERR_STATEMENT;
        }
        op->result = operator_result(r->result, op->actor, op->note, &op->result_len);
        if (!op->result) {
            store_queue_op_free(op);
            return STORE_ERR_STATEMENT;
        }
    }
    return submit(op);
}

static void list_done(store_queue_op_t *op)
{
    json_t *keys = json_array();
    size_t i;
    json_t *row;
    const json_t *rows = json_object_get(op->out, "rows");
    json_array_foreach(rows, i, row) json_array_append_new(keys, entry_of(row));
    json_t *next = json_null();
    if (!op->updated_since_ms && json_array_size(keys) == (size_t)op->limit) {
        const json_t *last = json_array_get(rows, json_array_size(rows) - 1);
        const json_t *le = json_array_get(keys, json_array_size(keys) - 1);
        next = json_sprintf("%" PRId64 ".%s", row_ms(last, "created_ms"),
                            json_string_value(json_object_get(le, "key_hash")));
    }
    answer(op, STORE_OK, STORE_QUEUE_OK, json_pack("{s:o,s:o}", "keys", keys, "next", next));
}

/* A resolve's first step found its key: the second changes the row. */
static void resolve_found(store_queue_op_t *op, const json_t *row)
{
    const char *key = json_string_value(json_object_get(row, "key"));
    op->kind = STORE_QUEUE_RESOLVE;
    op->key = xstrdup(key ? key : "");
    key_hash_hex(op->key, op->key_hash);
    json_decref(op->out);
    op->out = NULL;
    store_status_t st = store_queue_submit(op->store, op);
    if (st != STORE_OK)
        store_queue_done(op, st);
}

static void resolve_done(store_queue_op_t *op)
{
    const json_t *state = json_object_get(op->out, "state");
    if (!json_is_string(state)) {
        answer(op, STORE_OK, STORE_QUEUE_NOT_FOUND,
               error_body(STORE_QUEUE_NOT_FOUND, "the key is gone (expired or forgotten)"));
        return;
    }
    if (!json_is_true(json_object_get(op->out, "done"))) {
        json_t *b = error_body(STORE_QUEUE_CONFLICT,
                               "only a key whose outcome is unknown, or in progress past its "
                               "lease, can be resolved");
        json_object_set_new(b, "state", json_string(json_string_value(state)));
        answer(op, STORE_OK, STORE_QUEUE_CONFLICT, b);
        return;
    }
    char hash[KEY_HASH_LOG_LEN + 1];
    memcpy(hash, op->key_hash, KEY_HASH_LOG_LEN);
    hash[KEY_HASH_LOG_LEN] = '\0';
    log_info(0, "operator queue: key %s resolved as %s (it was %s) by %s", hash,
             store_queue_outcome_str(op->outcome), json_string_value(state), op->actor);
    json_t *b = json_pack("{s:s,s:s,s:O,s:s,s:o,s:O}", "key_hash", op->key_hash, "outcome",
                          store_queue_outcome_str(op->outcome), "previous_state", state, "by",
                          op->actor, "note", op->note ? json_string(op->note) : json_null(),
                          "waited_ms", json_object_get(op->out, "waited_ms"));
    iso_member(b, "at", row_ms(op->out, "at_ms"));
    answer(op, STORE_OK, STORE_QUEUE_OK, b);
}

void store_queue_done(store_queue_op_t *op, store_status_t st)
{
    if (st != STORE_OK) {
        op->cb(st, STORE_QUEUE_OK, NULL, op->arg);
        store_queue_op_free(op);
        return;
    }
    switch (op->kind) {
    case STORE_QUEUE_LIST:
        list_done(op);
        break;
    case STORE_QUEUE_SHOW: {
        const json_t *rows = json_object_get(op->out, "rows");
        size_t n = json_array_size(rows);
        if (!op->prefix[0])
            answer(op, STORE_OK, STORE_QUEUE_INVALID,
                   error_body(STORE_QUEUE_INVALID, "a key_hash is 6 to 64 hex digits"));
        else if (n == 0)
            answer(op, STORE_OK, STORE_QUEUE_NOT_FOUND,
                   error_body(STORE_QUEUE_NOT_FOUND, "no key has this key_hash"));
        else if (n > 1)
            answer(op, STORE_OK, STORE_QUEUE_AMBIGUOUS,
                   error_body(STORE_QUEUE_AMBIGUOUS,
                              "this key_hash prefix names several keys: give more of it"));
        else if (op->resolving) {
            resolve_found(op, json_array_get(rows, 0));
            return; /* op lives on */
        } else
            answer(op, STORE_OK, STORE_QUEUE_OK, record_of(json_array_get(rows, 0)));
        break;
    }
    case STORE_QUEUE_RESOLVE:
        resolve_done(op);
        break;
    case STORE_QUEUE_SUMMARY:
        answer(op, STORE_OK, STORE_QUEUE_OK, json_incref(op->out));
        break;
    case STORE_QUEUE_KINDS_:
        break;
    }
    store_queue_op_free(op);
}
