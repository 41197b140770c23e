/* A per-process cache of finished results, so replays need no round trip to Postgres.
 *
 * Safe because a succeeded row never changes until it expires: an entry is kept no longer
 * than the row's own window, so the cache never replays what the store would run again. Only
 * succeeded outcomes are cached; in-progress and unknown rows always go to the store, which is
 * what makes replicas agree. Bounded by entry count and bytes; the oldest entry goes first.
 * Pure: time comes from the caller. */
#ifndef IDEMGW_REPLAY_CACHE_H
#define IDEMGW_REPLAY_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct replay_cache replay_cache_t;

typedef struct replay_entry {
    const char *result; /* stored result JSON, or NULL when too large to keep */
    size_t result_len;
    const char *args_digest; /* to refuse an explicit key reused with other arguments */
    const char *created_at;  /* first seen, ISO 8601 */
    int attempts;            /* attempts known to this process, this replay included */
    const char *first_session_id; /* the first call's session and JSON-RPC id, or NULL */
    const char *first_jsonrpc_id;
} replay_entry_t;

replay_cache_t *replay_cache_new(size_t max_entries, size_t max_bytes);
void replay_cache_free(replay_cache_t *rc);

/* Adds or replaces the entry for key, valid until expires_ms (caller's clock). */
void replay_cache_put(replay_cache_t *rc, const char *key, const char *args_digest,
                      const char *result, size_t result_len, const char *created_at, int attempts,
                      uint64_t expires_ms);
/* Sets the first call's session and JSON-RPC id text (either may be NULL) on key's entry, if
 * there is one: what a duplicate's source is judged by (dupsource.h). */
void replay_cache_set_first(replay_cache_t *rc, const char *key, const char *session,
                            const char *jsonrpc_id);
/* The live entry for key, counting this lookup as one more attempt; NULL when absent or
 * expired (an expired entry is dropped). Valid until the next call on rc. */
const replay_entry_t *replay_cache_get(replay_cache_t *rc, const char *key, uint64_t now_ms);
size_t replay_cache_count(const replay_cache_t *rc);

#endif
