/* CORS on the gateway's own answers (see src/pipeline/cors.h). */
#include "cors.h"

#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Headers a page must be able to read on an answer the gateway writes. */
static const char *const exposed[] = {"Mcp-Session-Id", "Idempotent-Replayed"};

/* name is one of the comma-separated tokens of list (case-insensitive), or list is "*". */
static bool list_has(const char *list, const char *name)
{
    if (!list)
        return false;
    const char *p = list;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        const char *start = p;
        while (*p && *p != ',')
            p++;
        const char *end = p;
        while (end > start && (end[-1] == ' ' || end[-1] == '\t'))
            end--;
        size_t n = (size_t)(end - start);
        if ((n == 1 && *start == '*') || util_strncaseeq(start, n, name))
            return true;
    }
    return false;
}

static void origin_clear(cors_origin_t *o)
{
    free(o->origin);
    free(o->allow_origin);
    free(o->expose);
    memset(o, 0, sizeof(*o));
}

static const cors_origin_t *find(const cors_table_t *t, const char *origin)
{
    for (size_t i = 0; i < CORS_ORIGINS; i++)
        if (t->seen[i].origin && strcmp(t->seen[i].origin, origin) == 0)
            return &t->seen[i];
    return NULL;
}

void cors_learn(cors_table_t *t, const char *origin, const http_headers_t *h)
{
    const char *allow = http_headers_get(h, "access-control-allow-origin");
    if (!origin || !allow)
        return;
    cors_origin_t *o = (cors_origin_t *)find(t, origin);
    if (!o) {
        o = &t->seen[t->next];
        t->next = (t->next + 1) % CORS_ORIGINS;
    }
    origin_clear(o);
    const char *expose = http_headers_get(h, "access-control-expose-headers");
    const char *cred = http_headers_get(h, "access-control-allow-credentials");
    o->origin = xstrdup(origin);
    o->allow_origin = xstrdup(allow);
    o->expose = expose ? xstrdup(expose) : NULL;
    o->credentials = cred && strcasecmp(cred, "true") == 0;
}

char *cors_headers(const cors_table_t *t, const char *origin)
{
    const cors_origin_t *o = origin ? find(t, origin) : NULL;
    if (!o)
        return NULL; /* the upstream gave this origin no CORS (or not yet): nor does the gateway */
    const char *allow = o->allow_origin;
    const char *learned = o->expose;
    /* the learned list, then what it lacks of ours */
    char expose[512];
    snprintf(expose, sizeof(expose), "%s", learned && strlen(learned) < 256 ? learned : "");
    for (size_t i = 0; i < ARRAY_LEN(exposed); i++) {
        if (list_has(expose, exposed[i]))
            continue;
        size_t n = strlen(expose);
        snprintf(expose + n, sizeof(expose) - n, "%s%s", n ? ", " : "", exposed[i]);
    }
    bool credentials = o->credentials && strcmp(allow, "*") != 0;
    return xasprintf("Access-Control-Allow-Origin: %s\r\n%s%s"
                     "Access-Control-Expose-Headers: %s\r\n",
                     allow, strcmp(allow, "*") != 0 ? "Vary: Origin\r\n" : "",
                     credentials ? "Access-Control-Allow-Credentials: true\r\n" : "", expose);
}

char *cors_preflight_extra(const char *requested, const http_headers_t *h)
{
    if (!list_has(requested, "Idempotency-Key"))
        return NULL;
    const char *allowed = http_headers_get(h, "access-control-allow-headers");
    if (!allowed || list_has(allowed, "Idempotency-Key"))
        return NULL; /* no CORS from the upstream at all, or already allowed */
    return xstrdup("Access-Control-Allow-Headers: Idempotency-Key\r\n");
}

void cors_table_free(cors_table_t *t)
{
    for (size_t i = 0; i < CORS_ORIGINS; i++)
        origin_clear(&t->seen[i]);
}
