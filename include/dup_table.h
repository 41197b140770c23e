/* Duplicate counts per key not yet written to the store: both backends count a replay's
 * duplicate in memory and write the counts in one batch every half second. An open-addressing
 * hash table of key -> count. Not thread-safe: the loop owns it. */
#ifndef IDEMGW_DUP_TABLE_H
#define IDEMGW_DUP_TABLE_H

#include <stddef.h>

typedef struct dup_entry {
    char *key; /* NULL: an empty slot */
    int count;
} dup_entry_t;

typedef struct dup_table {
    dup_entry_t *slots; /* cap slots, a power of two, never more than half full */
    size_t cap;
    size_t len; /* keys in the table */
} dup_table_t;

/* Counts one more duplicate of key. */
void dup_table_add(dup_table_t *t, const char *key);
/* The count of key (0 when absent). */
int dup_table_count(const dup_table_t *t, const char *key);
/* Empties the table; keys_out (when not NULL) gets the keys' ownership, in slot order, with
 * counts_out their counts (both arrays of len entries, allocated; the caller frees them),
 * else the keys are freed. A table grown large by a burst is released. */
void dup_table_take(dup_table_t *t, char ***keys_out, int **counts_out);
void dup_table_free(dup_table_t *t);

#endif
