/* Duplicates per key not yet written to the store: both backends record a duplicate in memory
 * (store_record_duplicate) and write every key's in one batch every half second. An
 * open-addressing hash table of key -> what was recorded: replays (added to attempts), counts
 * by answer and by source, and the last STORE_DUP_HISTORY_MAX duplicates themselves. Not
 * thread-safe: the loop owns it. */
#ifndef IDEMGW_DUP_TABLE_H
#define IDEMGW_DUP_TABLE_H

#include "store.h"

#include <stddef.h>

/* What one key's duplicates added since the last write. */
typedef struct dup_pending {
    int answers[STORE_DUP_ANSWERS_];
    int sources[DUP_SOURCE_N];
    /* a ring of the last ones (copies: key unused, ids owned); hist_len of them, the oldest
     * at (hist_next - hist_len) mod STORE_DUP_HISTORY_MAX */
    store_dup_t hist[STORE_DUP_HISTORY_MAX];
    int hist_len, hist_next;
} dup_pending_t;

typedef struct dup_entry {
    char *key; /* NULL: an empty slot */
    int count; /* replays: what attempts grows by */
    dup_pending_t *p;
} dup_entry_t;

typedef struct dup_table {
    dup_entry_t *slots; /* cap slots, a power of two, never more than half full */
    size_t cap;
    size_t len; /* keys in the table */
} dup_table_t;

/* Records one more duplicate of d->key. */
void dup_table_add(dup_table_t *t, const store_dup_t *d);
/* The replays of key recorded and not written (0 when absent). */
int dup_table_count(const dup_table_t *t, const char *key);
/* Empties the table; the entries (len of them, in *n) move to the caller, who frees them with
 * dup_entries_free. A table grown large by a burst is released. */
dup_entry_t *dup_table_take(dup_table_t *t, size_t *n);
void dup_entries_free(dup_entry_t *e, size_t n);
void dup_table_free(dup_table_t *t);

/* An entry's history as a JSON array, oldest first (the row's dup_history form, store.h). */
char *dup_entry_history_json(const dup_entry_t *e);
/* The entries as the Postgres write takes them: a JSON array of {"key", "replay",
 * "in_progress", "unknown", "reconnect", ..., "late", "history"}. */
char *dup_entries_json(const dup_entry_t *e, size_t n);
/* old (a row's dup_history, or NULL) with e's history after it, keeping the last
 * STORE_DUP_HISTORY_MAX; the embedded store's write. NULL when old is not a JSON array. */
char *dup_history_merge(const char *old, const dup_entry_t *e);

#endif
