/* The idempotency key of a tool call:
 *   SUBJECT ":" TOOL ":h:" HEX32(SHA-256(JCS(arguments - exclude_args - key_arg)))
 *   SUBJECT ":" TOOL ":x:" EXPLICIT_KEY
 * where TOOL is SERVER "/" TOOL for a server of servers: (key_scoped_tool), so the same call on
 * two servers is two calls.
 * Absent or null arguments hash as {}. Pure: no I/O. */
#ifndef IDEMGW_KEY_H
#define IDEMGW_KEY_H

#include "jcs.h"
#include "key_hash.h"
#include "policy.h"
#include "util.h"

#include <stdbool.h>

typedef enum {
    KEY_OK = 0,
    KEY_ERR_ARGS_NOT_OBJECT, /* arguments present but not an object */
    KEY_ERR_BAD_EXPLICIT,    /* explicit key empty, too long (>255), not UTF-8 or not a string */
} key_status_t;

const char *key_status_str(key_status_t st);

typedef struct key_result {
    char *key;            /* the key string, malloc'd */
    char args_digest[65]; /* hex SHA-256 of the canonical arguments (without the explicit key) */
    char key_hash[65];    /* key_hash_hex of key: what leaves the gateway in place of the key */
    bool explicit_key;    /* the key came from the client (header, params or argument) */
} key_result_t;

/* The member of a tools/call's params that carries an explicit key (the shape SEP-3182
 * proposes), outside the arguments and so never hashed. */
#define KEY_PARAM "idempotencyKey"

/* One call, as far as its key goes. The arguments are parsed with the canonical parser (jcs.h)
 * so numbers keep their exact text. */
typedef struct key_call {
    const char *subject; /* who calls (subject.h) */
    const char *server;  /* the server's name under servers:, else NULL */
    const char *tool;
    /* The tools/call's params (may be NULL): its arguments and its idempotencyKey. */
    jcs_value_t *params;
    /* Used only when params is NULL: the arguments alone, with no params.idempotencyKey (the
     * status tool names a call this way). May be NULL (absent). */
    jcs_value_t *arguments;
    const char *header_key;  /* the Idempotency-Key request header, or NULL */
    const policy_tool_t *pt; /* the tool's policy; NULL: no exclusions, key_arg
                                "idempotency_key" */
} key_call_t;

/* Derives the key of a call and its hash. The sources of an explicit key, first found wins:
 * the header, params.idempotencyKey, the key_arg argument; a present one that is not a usable
 * key (empty, too long (>255), not UTF-8, not a string or number) is refused. Without one the
 * key hashes the canonical arguments. The arguments are modified: excluded paths and the
 * key_arg member are removed. On error, msg (when not NULL) gets a message and out holds no
 * key. */
key_status_t key_for_call(const key_call_t *call, key_result_t *out, char *msg,
                          size_t msglen) MUST_CHECK;
void key_result_free(key_result_t *r);

#endif
