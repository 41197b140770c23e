/* The recent attempts of each key (see include/dup_recent.h). */
#include "dup_recent.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct slot {
    char key_hash[65];
    dup_recent_seen_t seen; /* as of the last attempt noted, that attempt included */
} slot_t;

struct dup_recent {
    slot_t *slots;
    size_t n;
};

dup_recent_t *dup_recent_new(size_t slots)
{
    dup_recent_t *r = xcalloc(1, sizeof(*r));
    r->n = slots ? slots : 1;
    r->slots = xcalloc(r->n, sizeof(*r->slots));
    return r;
}

void dup_recent_free(dup_recent_t *r)
{
    if (!r)
        return;
    free(r->slots);
    free(r);
}

/* The key hash is SHA-256 hex: its first 16 digits spread keys evenly. */
static size_t slot_of(const dup_recent_t *r, const char *key_hash)
{
    char head[17] = {0};
    strncpy(head, key_hash, 16);
    return (size_t)(strtoull(head, NULL, 16) % r->n);
}

void dup_recent_note(dup_recent_t *r, const char *key_hash, uint64_t now_ms, uint64_t forget_ms,
                     const char *client, dup_recent_seen_t *before)
{
    slot_t *s = &r->slots[slot_of(r, key_hash)];
    bool same = strcmp(s->key_hash, key_hash) == 0 && s->seen.attempts > 0 &&
                now_ms >= s->seen.last_ms && now_ms - s->seen.last_ms < forget_ms;
    if (!same) {
        memset(s, 0, sizeof(*s));
        snprintf(s->key_hash, sizeof(s->key_hash), "%s", key_hash);
    }
    if (before)
        *before = s->seen;
    if (!same && client)
        snprintf(s->seen.first_client, sizeof(s->seen.first_client), "%s", client);
    s->seen.attempts++;
    s->seen.before_last_ms = s->seen.attempts > 1 ? s->seen.last_ms : 0;
    s->seen.last_ms = now_ms;
}

void dup_recent_unread(dup_recent_t *r, const char *key_hash)
{
    slot_t *s = &r->slots[slot_of(r, key_hash)];
    if (strcmp(s->key_hash, key_hash) == 0 && s->seen.attempts > 0)
        s->seen.first_unread = true;
}
