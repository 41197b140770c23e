/* The two protocol eras over stdio. A stdio connection speaks one era for its whole life, the
 * one its first message chose: `initialize` opens a 2025 connection, `server/discover` with
 * the per-request envelope a 2026-07-28 one (a server of both eras refuses the other's
 * requests on it). So the gateway keeps children apart by era:
 *
 * - a 2025 caller (an initialize, or a request that names no 2026 version) is served by a
 *   child opened with initialize, as ever;
 * - a 2026 caller is served by a child the gateway opens with server/discover. A server that
 *   answers it with a result naming a 2026 version speaks the era: the caller's requests go to
 *   it as they are. Any other answer (a 2025 server's "method not found"), or none within
 *   DISCOVER_WAIT_MS, and the same child is opened with initialize instead; the gateway then
 *   bridges: it answers server/discover itself from the initialize result, gives every result
 *   its resultType, and refuses the server's own requests (the 2026 era has none).
 *
 * Pure: messages in, messages out. */

#include "stdio_int.h"

#include <ctype.h>
#include <string.h>

/* The newest version of the era the gateway speaks to a server over stdio. */
#define ERA_VERSION "2026-07-28"
#define META_VERSION "io.modelcontextprotocol/protocolVersion"
#define META_CLIENT "io.modelcontextprotocol/clientInfo"
#define META_CAPS "io.modelcontextprotocol/clientCapabilities"
#define META_SERVER "io.modelcontextprotocol/serverInfo"

bool stdio_era_modern(const char *version)
{
    if (!version || strlen(version) != 10)
        return false;
    for (int i = 0; i < 10; i++)
        if (i == 4 || i == 7 ? version[i] != '-' : !isdigit((unsigned char)version[i]))
            return false;
    return strcmp(version, ERA_VERSION) >= 0;
}

bool stdio_era_of_request(const char *header_version, json_t *msgs)
{
    if (stdio_era_modern(header_version))
        return true;
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m)
    {
        json_t *meta = json_object_get(json_object_get(m, "params"), "_meta");
        if (stdio_era_modern(json_string_value(json_object_get(meta, META_VERSION))))
            return true;
    }
    return false;
}

json_t *stdio_era_discover(uint64_t gid)
{
    return json_pack("{s:s, s:I, s:s, s:{s:{s:s, s:{s:s, s:s}, s:{}}}}", "jsonrpc", "2.0", "id",
                     (json_int_t)gid, "method", "server/discover", "params", "_meta", META_VERSION,
                     ERA_VERSION, META_CLIENT, "name", "idemgw", "version", "0.1.0", META_CAPS);
}

bool stdio_era_discovered(const json_t *answer)
{
    json_t *versions = json_object_get(json_object_get(answer, "result"), "supportedVersions");
    size_t i;
    json_t *v;
    json_array_foreach(versions, i, v) if (stdio_era_modern(json_string_value(v))) return true;
    return false;
}

/* A 2025 server's initialize result told as the 2026 era's server/discover result. */
static json_t *discover_result(const json_t *init)
{
    json_t *caps = json_object_get(init, "capabilities");
    json_t *r = json_pack("{s:[s], s:o, s:i, s:s, s:s}", "supportedVersions", ERA_VERSION,
                          "capabilities", json_is_object(caps) ? json_incref(caps) : json_object(),
                          "ttlMs", 0, "cacheScope", "private", "resultType", "complete");
    json_t *instructions = json_object_get(init, "instructions");
    if (json_is_string(instructions))
        json_object_set(r, "instructions", instructions);
    json_t *info = json_object_get(init, "serverInfo");
    if (json_is_object(info))
        json_object_set_new(r, "_meta", json_pack("{s:O}", META_SERVER, info));
    return r;
}

bool stdio_era_cacheable(const char *method)
{
    static const char *const cacheable[] = {"tools/list", "prompts/list", "resources/list",
                                            "resources/templates/list", "resources/read"};
    for (size_t i = 0; method && i < sizeof(cacheable) / sizeof(cacheable[0]); i++)
        if (strcmp(method, cacheable[i]) == 0)
            return true;
    return false;
}

void stdio_era_bridge_answer(json_t *answer, const json_t *init, bool discover, bool cacheable)
{
    if (discover) { /* the child answered the ping that stood for it: it is up */
        json_object_del(answer, "error");
        json_object_set_new(answer, "result", discover_result(init));
        return;
    }
    json_t *result = json_object_get(answer, "result");
    if (!json_is_object(result))
        return;
    if (!json_object_get(result, "resultType"))
        json_object_set_new(result, "resultType", json_string("complete"));
    /* a 2025 server says nothing of caching: not to be kept, for this client only */
    if (cacheable && !json_object_get(result, "ttlMs"))
        json_object_set_new(result, "ttlMs", json_integer(0));
    if (cacheable && !json_object_get(result, "cacheScope"))
        json_object_set_new(result, "cacheScope", json_string("private"));
}
