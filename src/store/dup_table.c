/* Duplicates per key not yet written (see src/store/dup_table.h). */
#include "dup_table.h"

#include "util.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The slot holding key, or the empty slot where it goes (the table is never full). */
static dup_entry_t *slot(dup_entry_t *slots, size_t cap, const char *key)
{
    size_t i = (size_t)util_fnv1a64(key) & (cap - 1);
    while (slots[i].key && strcmp(slots[i].key, key) != 0)
        i = (i + 1) & (cap - 1);
    return &slots[i];
}

static void add_capped(int *v)
{
    if (*v < INT32_MAX)
        (*v)++;
}

/* A copy of an id, cut to STORE_DUP_ID_MAX bytes of valid UTF-8 (JSON holds nothing else). */
static char *id_copy(const char *v)
{
    if (!v)
        return NULL;
    size_t n = strlen(v);
    return xstrndup(v, util_utf8_valid_prefix(v, n > STORE_DUP_ID_MAX ? STORE_DUP_ID_MAX : n));
}

static void attempt_clear(store_dup_t *h)
{
    free((char *)h->jsonrpc_id);
    free((char *)h->session_id);
    memset(h, 0, sizeof(*h));
}

void dup_table_add(dup_table_t *t, const store_dup_t *d)
{
    if ((t->len + 1) * 2 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        dup_entry_t *slots = xcalloc(cap, sizeof(*slots));
        for (size_t i = 0; i < t->cap; i++)
            if (t->slots[i].key)
                *slot(slots, cap, t->slots[i].key) = t->slots[i];
        free(t->slots);
        t->slots = slots;
        t->cap = cap;
    }
    dup_entry_t *e = slot(t->slots, t->cap, d->key);
    if (!e->key) {
        e->key = xstrdup(d->key);
        e->p = xcalloc(1, sizeof(*e->p));
        t->len++;
    }
    dup_pending_t *p = e->p;
    if (d->answered == STORE_DUP_REPLAY)
        add_capped(&e->count);
    if ((unsigned)d->answered < STORE_DUP_ANSWERS_)
        add_capped(&p->answers[d->answered]);
    if ((unsigned)d->source < DUP_SOURCE_N)
        add_capped(&p->sources[d->source]);
    store_dup_t *h = &p->hist[p->hist_next];
    attempt_clear(h); /* the oldest goes when the ring is full */
    *h = *d;
    h->key = NULL;
    h->jsonrpc_id = id_copy(d->jsonrpc_id);
    h->session_id = id_copy(d->session_id);
    p->hist_next = (p->hist_next + 1) % STORE_DUP_HISTORY_MAX;
    if (p->hist_len < STORE_DUP_HISTORY_MAX)
        p->hist_len++;
}

int dup_table_count(const dup_table_t *t, const char *key)
{
    if (!t->len || !key)
        return 0;
    const dup_entry_t *d = slot(t->slots, t->cap, key);
    return d->key ? d->count : 0;
}

dup_entry_t *dup_table_take(dup_table_t *t, size_t *n)
{
    dup_entry_t *out = xcalloc(t->len ? t->len : 1, sizeof(*out));
    size_t k = 0;
    for (size_t i = 0; i < t->cap; i++)
        if (t->slots[i].key)
            out[k++] = t->slots[i];
    *n = k;
    /* a burst of distinct keys should not pin its table forever */
    if (t->cap > 1024) {
        free(t->slots);
        t->slots = NULL;
        t->cap = 0;
    } else if (t->slots) {
        memset(t->slots, 0, t->cap * sizeof(*t->slots));
    }
    t->len = 0;
    return out;
}

void dup_entries_free(dup_entry_t *e, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        for (int j = 0; e[i].p && j < STORE_DUP_HISTORY_MAX; j++)
            attempt_clear(&e[i].p->hist[j]);
        free(e[i].p);
        free(e[i].key);
    }
    free(e);
}

void dup_table_free(dup_table_t *t)
{
    size_t n;
    dup_entry_t *e = dup_table_take(t, &n);
    dup_entries_free(e, n);
    free(t->slots);
    memset(t, 0, sizeof(*t));
}

static json_t *text_or_null(const char *v)
{
    json_t *s = v ? json_string(v) : NULL;
    return s ? s : json_null();
}

static json_t *attempt_json(const store_dup_t *h)
{
    char at[UTIL_ISO_LEN + 1];
    util_iso_utc_ms((int64_t)h->at_ms, at);
    json_t *o = json_object();
    json_object_set_new(o, "at", json_string(at));
    json_object_set_new(o, "source", json_string(dup_source_name(h->source)));
    json_object_set_new(o, "answered", json_string(store_dup_answer_str(h->answered)));
    json_object_set_new(o, "jsonrpc_id", text_or_null(h->jsonrpc_id));
    json_object_set_new(o, "session_id", text_or_null(h->session_id));
    json_object_set_new(o, "gap_ms", json_integer((json_int_t)h->gap_ms));
    return o;
}

static json_t *history_array(const dup_entry_t *e)
{
    json_t *a = json_array();
    const dup_pending_t *p = e->p;
    for (int i = 0; p && i < p->hist_len; i++) {
        int at = (p->hist_next - p->hist_len + i + STORE_DUP_HISTORY_MAX) % STORE_DUP_HISTORY_MAX;
        json_array_append_new(a, attempt_json(&p->hist[at]));
    }
    return a;
}

static char *dump(json_t *v)
{
    char *s = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(v);
    if (!s) {
        fprintf(stderr, "idemgw: out of memory writing duplicates\n");
        abort();
    }
    return s;
}

char *dup_entry_history_json(const dup_entry_t *e)
{
    return dump(history_array(e));
}

char *dup_entries_json(const dup_entry_t *e, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) {
        static const dup_pending_t none;
        const dup_pending_t *p = e[i].p ? e[i].p : &none;
        json_t *o = json_object();
        json_object_set_new(o, "key", json_string(e[i].key));
        for (int k = 0; k < STORE_DUP_ANSWERS_; k++)
            json_object_set_new(o, store_dup_answer_str((store_dup_answer_t)k),
                                json_integer(p->answers[k]));
        for (int k = 0; k < DUP_SOURCE_N; k++)
            json_object_set_new(o, dup_source_name((dup_source_t)k), json_integer(p->sources[k]));
        json_object_set_new(o, "history", history_array(&e[i]));
        json_array_append_new(a, o);
    }
    return dump(a);
}

char *dup_history_merge(const char *old, const dup_entry_t *e)
{
    json_t *a = old ? json_loads(old, 0, NULL) : json_array();
    if (!json_is_array(a)) {
        json_decref(a);
        return NULL;
    }
    json_t *add = history_array(e);
    json_array_extend(a, add);
    json_decref(add);
    while (json_array_size(a) > STORE_DUP_HISTORY_MAX)
        json_array_remove(a, 0);
    return dump(a);
}
