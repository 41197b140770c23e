/* The recent attempts of each key this process saw: when they came and which client sent the
 * first, for the duplicate-source rules (dupsource.h) that need more than the key's row holds
 * (the steps between attempts, the first call's clientInfo). A fixed table, one slot per key
 * hash, a newer key taking over its slot: it only informs a diagnosis, never an answer. */
#ifndef IDEMGW_DUP_RECENT_H
#define IDEMGW_DUP_RECENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct dup_recent dup_recent_t;

/* What was known of a key before an attempt. */
typedef struct dup_recent_seen {
    int attempts;            /* attempts seen before this one (0: none, the rest is empty) */
    uint64_t last_ms;        /* the one before this */
    uint64_t before_last_ms; /* the one before that; 0 when fewer than two */
    char first_client[96];   /* the first attempt's clientInfo "name/version"; "" if none */
    bool first_unread;       /* the first attempt's caller left (or cancelled) before its answer */
} dup_recent_seen_t;

dup_recent_t *dup_recent_new(size_t slots);
void dup_recent_free(dup_recent_t *r);

/* Notes an attempt of key_hash (hex) at now_ms by client (may be NULL) and fills *before with
 * what was known until then (may be NULL). Entries older than forget_ms count as none. */
void dup_recent_note(dup_recent_t *r, const char *key_hash, uint64_t now_ms, uint64_t forget_ms,
                     const char *client, dup_recent_seen_t *before);

/* Notes that the answer of key_hash's first attempt reached nobody: its caller closed the
 * stream or cancelled before it came. A no-op when the key's slot holds another key. */
void dup_recent_unread(dup_recent_t *r, const char *key_hash);

#endif
