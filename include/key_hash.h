/* A key's hash: what leaves the gateway, and what log lines show, in place of the key (which
 * carries the subject). Below the key's derivation (key.h) so the store can log keys too. */
#ifndef IDEMGW_KEY_HASH_H
#define IDEMGW_KEY_HASH_H

/* Hex SHA-256 of the key, for the Idempotency-Key sent upstream, the replay marker and log
 * lines. */
void key_hash_hex(const char *key, char out[65]);
/* Characters of key_hash_hex that log lines show as "key_hash" (and `idemgw key` prints):
 * enough to find a key's lines, without the key (it carries the subject). */
#define KEY_HASH_LOG_LEN 16
/* key_hash_hex cut to what log lines show. */
void key_hash_log(const char *key, char out[KEY_HASH_LOG_LEN + 1]);

/* The tool as keys and the store name it: SERVER "/" TOOL for a named server (whose names hold
 * no '/'), else TOOL. Allocated. */
char *key_scoped_tool(const char *server, const char *tool);

#endif
