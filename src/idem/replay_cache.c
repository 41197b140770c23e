#include "replay_cache.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

typedef struct node {
    char *key;
    uint64_t hash;
    uint64_t expires_ms;
    size_t bytes; /* memory charged to this entry */
    replay_entry_t e;
    struct node *chain;         /* next in the hash bucket */
    struct node *older, *newer; /* insertion order, for eviction */
} node_t;

struct replay_cache {
    node_t **buckets;
    size_t n_buckets; /* power of two */
    size_t count, bytes;
    size_t max_entries, max_bytes;
    node_t *oldest, *newest;
};

replay_cache_t *replay_cache_new(size_t max_entries, size_t max_bytes)
{
    replay_cache_t *rc = xcalloc(1, sizeof(*rc));
    rc->n_buckets = 64;
    while (rc->n_buckets < max_entries && rc->n_buckets < (1u << 20))
        rc->n_buckets *= 2;
    rc->buckets = xcalloc(rc->n_buckets, sizeof(node_t *));
    rc->max_entries = max_entries;
    rc->max_bytes = max_bytes;
    return rc;
}

static void node_free(node_t *n)
{
    free(n->key);
    free((char *)n->e.result);
    free((char *)n->e.args_digest);
    free((char *)n->e.created_at);
    free((char *)n->e.first_session_id);
    free((char *)n->e.first_jsonrpc_id);
    free(n);
}

static void unlink_node(replay_cache_t *rc, node_t *n)
{
    node_t **pp = &rc->buckets[n->hash & (rc->n_buckets - 1)];
    while (*pp != n)
        pp = &(*pp)->chain;
    *pp = n->chain;
    if (n->older)
        n->older->newer = n->newer;
    else
        rc->oldest = n->newer;
    if (n->newer)
        n->newer->older = n->older;
    else
        rc->newest = n->older;
    rc->count--;
    rc->bytes -= n->bytes;
    node_free(n);
}

void replay_cache_free(replay_cache_t *rc)
{
    if (!rc)
        return;
    while (rc->oldest)
        unlink_node(rc, rc->oldest);
    free(rc->buckets);
    free(rc);
}

static node_t *find(const replay_cache_t *rc, const char *key, uint64_t h)
{
    for (node_t *n = rc->buckets[h & (rc->n_buckets - 1)]; n; n = n->chain)
        if (n->hash == h && strcmp(n->key, key) == 0)
            return n;
    return NULL;
}

void replay_cache_put(replay_cache_t *rc, const char *key, const char *args_digest,
                      const char *result, size_t result_len, const char *created_at, int attempts,
                      uint64_t expires_ms)
{
    uint64_t h = util_fnv1a64(key);
    node_t *old = find(rc, key, h);
    if (old)
        unlink_node(rc, old);
    size_t bytes = sizeof(node_t) + strlen(key) + result_len + 128;
    if (rc->max_entries == 0 || bytes > rc->max_bytes)
        return;
    while (rc->oldest && (rc->count >= rc->max_entries || rc->bytes + bytes > rc->max_bytes))
        unlink_node(rc, rc->oldest);
    node_t *n = xcalloc(1, sizeof(*n));
    n->key = xstrdup(key);
    n->hash = h;
    n->expires_ms = expires_ms;
    n->bytes = bytes;
    n->e.result = result ? xstrndup(result, result_len) : NULL;
    n->e.result_len = result ? result_len : 0;
    n->e.args_digest = xstrdup(args_digest ? args_digest : "");
    n->e.created_at = xstrdup(created_at ? created_at : "");
    n->e.attempts = attempts;
    size_t b = h & (rc->n_buckets - 1);
    n->chain = rc->buckets[b];
    rc->buckets[b] = n;
    n->older = rc->newest;
    if (rc->newest)
        rc->newest->newer = n;
    else
        rc->oldest = n;
    rc->newest = n;
    rc->count++;
    rc->bytes += bytes;
}

void replay_cache_set_first(replay_cache_t *rc, const char *key, const char *session,
                            const char *jsonrpc_id)
{
    node_t *n = find(rc, key, util_fnv1a64(key));
    if (!n)
        return;
    free((char *)n->e.first_session_id);
    free((char *)n->e.first_jsonrpc_id);
    n->e.first_session_id = session ? xstrdup(session) : NULL;
    n->e.first_jsonrpc_id = jsonrpc_id ? xstrdup(jsonrpc_id) : NULL;
}

const replay_entry_t *replay_cache_get(replay_cache_t *rc, const char *key, uint64_t now_ms)
{
    node_t *n = find(rc, key, util_fnv1a64(key));
    if (!n)
        return NULL;
    if (n->expires_ms <= now_ms) {
        unlink_node(rc, n);
        return NULL;
    }
    n->e.attempts++;
    return &n->e;
}

size_t replay_cache_count(const replay_cache_t *rc)
{
    return rc->count;
}
