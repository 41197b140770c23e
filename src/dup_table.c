/* Duplicate counts per key (see include/dup_table.h). */
#include "dup_table.h"

#include "util.h"

#include <stdint.h>
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

void dup_table_add(dup_table_t *t, const char *key)
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
    dup_entry_t *d = slot(t->slots, t->cap, key);
    if (!d->key) {
        d->key = xstrdup(key);
        t->len++;
    }
    if (d->count < INT32_MAX)
        d->count++;
}

int dup_table_count(const dup_table_t *t, const char *key)
{
    if (!t->len || !key)
        return 0;
    const dup_entry_t *d = slot(t->slots, t->cap, key);
    return d->key ? d->count : 0;
}

void dup_table_take(dup_table_t *t, char ***keys_out, int **counts_out)
{
    char **keys = keys_out ? xcalloc(t->len ? t->len : 1, sizeof(*keys)) : NULL;
    int *counts = keys_out ? xcalloc(t->len ? t->len : 1, sizeof(*counts)) : NULL;
    size_t n = 0;
    for (size_t i = 0; i < t->cap; i++) {
        if (!t->slots[i].key)
            continue;
        if (keys) {
            keys[n] = t->slots[i].key;
            counts[n++] = t->slots[i].count;
        } else {
            free(t->slots[i].key);
        }
    }
    if (keys_out) {
        *keys_out = keys;
        *counts_out = counts;
    }
    /* a burst of distinct keys should not pin its table forever */
    if (t->cap > 1024) {
        free(t->slots);
        t->slots = NULL;
        t->cap = 0;
    } else if (t->slots) {
        memset(t->slots, 0, t->cap * sizeof(*t->slots));
    }
    t->len = 0;
}

void dup_table_free(dup_table_t *t)
{
    dup_table_take(t, NULL, NULL);
    free(t->slots);
    memset(t, 0, sizeof(*t));
}
