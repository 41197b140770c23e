/* The idempotency key of a tool call:
 *   SUBJECT ":" TOOL ":h:" HEX32(SHA-256(JCS(arguments - exclude_args - key_arg)))
 *   SUBJECT ":" TOOL ":x:" EXPLICIT_KEY
 * Absent or null arguments hash as {}. Pure: no I/O. */
#ifndef IDEMGW_KEY_H
#define IDEMGW_KEY_H

#include "jcs.h"
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
    bool explicit_key;    /* the key came from the client (argument or header) */
} key_result_t;

/* Derives the key. args may be NULL (absent). args is modified: excluded paths and the
 * key_arg member are removed. header_key is the Idempotency-Key request header or NULL; when
 * both the header and the key_arg argument are present, the header wins. pt may be NULL (no
 * exclusions, key_arg "idempotency_key"). On error, msg (when not NULL) gets a message. */
key_status_t key_derive(const char *subject, const char *tool, jcs_value_t *args,
                        const policy_tool_t *pt, const char *header_key, key_result_t *out,
                        char *msg, size_t msglen) MUST_CHECK;

/* The member of a tools/call's params that carries an explicit key (the shape SEP-3182
 * proposes), outside the arguments and so never hashed. */
#define KEY_PARAM "idempotencyKey"

/* The same from a tools/call's whole params object (may be NULL): its arguments (modified as
 * above) and its idempotencyKey. The sources of an explicit key, first found wins: the header,
 * params.idempotencyKey, the key_arg argument. A params.idempotencyKey that is not a usable key
 * (empty, too long, not a string or number) is refused, as the others are. */
key_status_t key_derive_params(const char *subject, const char *tool, jcs_value_t *params,
                               const policy_tool_t *pt, const char *header_key, key_result_t *out,
                               char *msg, size_t msglen) MUST_CHECK;
void key_result_free(key_result_t *r);

/* Hex SHA-256 of the key, for the Idempotency-Key sent upstream, the replay marker and log
 * lines. */
void key_hash_hex(const char *key, char out[65]);
/* Characters of key_hash_hex that log lines show as "key_hash" (and `idemgw key` prints):
 * enough to find a key's lines, without the key (it carries the subject). */
#define KEY_HASH_LOG_LEN 16
/* key_hash_hex cut to what log lines show. */
void key_hash_log(const char *key, char out[KEY_HASH_LOG_LEN + 1]);

#endif
