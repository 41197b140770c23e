/* A key's hash (see include/key_hash.h). */
#include "key_hash.h"
#include "util.h"

#include <string.h>

void key_hash_hex(const char *key, char out[65])
{
    util_sha256_hex(key, strlen(key), out);
}

void key_hash_log(const char *key, char out[KEY_HASH_LOG_LEN + 1])
{
    char hex[65];
    key_hash_hex(key, hex);
    memcpy(out, hex, KEY_HASH_LOG_LEN);
    out[KEY_HASH_LOG_LEN] = '\0';
}

char *key_scoped_tool(const char *server, const char *tool)
{
    return server && *server ? xasprintf("%s/%s", server, tool) : xstrdup(tool);
}
