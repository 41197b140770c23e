#include "resume_guard.h"
#include "util.h"

#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>

#define N_BUCKETS 1024 /* a power of two; chains stay short for thousands of sessions */

typedef struct note {
    char *session;
    char *subject;
    uint64_t until_ms;
    struct note *next;
} note_t;

struct resume_guard {
    note_t *buckets[N_BUCKETS];
};

resume_guard_t *resume_guard_new(void)
{
    return xcalloc(1, sizeof(resume_guard_t));
}

static void note_free(note_t *n)
{
    free(n->session);
    free(n->subject);
    free(n);
}

void resume_guard_free(resume_guard_t *g)
{
    if (!g)
        return;
    for (size_t b = 0; b < N_BUCKETS; b++)
        while (g->buckets[b]) {
            note_t *n = g->buckets[b];
            g->buckets[b] = n->next;
            note_free(n);
        }
    free(g);
}

/* The bucket of session, with its expired notes dropped. */
static note_t **bucket(resume_guard_t *g, const char *session, uint64_t now_ms)
{
    note_t **head = &g->buckets[util_fnv1a64(session) & (N_BUCKETS - 1)];
    for (note_t **pp = head; *pp;) {
        note_t *n = *pp;
        if (n->until_ms <= now_ms) {
            *pp = n->next;
            note_free(n);
        } else {
            pp = &n->next;
        }
    }
    return head;
}

/* Subjects compared in constant time for equal lengths: a subject may be a token's hash. */
static bool same_subject(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    return la == lb && CRYPTO_memcmp(a, b, la) == 0;
}

void resume_guard_note(resume_guard_t *g, const char *session, const char *subject, uint64_t now_ms,
                       uint64_t until_ms)
{
    note_t **head = bucket(g, session, now_ms);
    for (note_t *n = *head; n; n = n->next)
        if (strcmp(n->session, session) == 0 && same_subject(n->subject, subject)) {
            if (until_ms > n->until_ms)
                n->until_ms = until_ms;
            return;
        }
    note_t *n = xcalloc(1, sizeof(*n));
    n->session = xstrdup(session);
    n->subject = xstrdup(subject);
    n->until_ms = until_ms;
    n->next = *head;
    *head = n;
}

bool resume_guard_knows(resume_guard_t *g, const char *session, uint64_t now_ms)
{
    for (note_t *n = *bucket(g, session, now_ms); n; n = n->next)
        if (strcmp(n->session, session) == 0)
            return true;
    return false;
}

resume_verdict_t resume_guard_check(resume_guard_t *g, const char *session, const char *subject,
                                    uint64_t now_ms)
{
    resume_verdict_t v = RESUME_UNGUARDED;
    for (note_t *n = *bucket(g, session, now_ms); n; n = n->next) {
        if (strcmp(n->session, session) != 0)
            continue;
        /* a stream of a session may carry any of its calls' results: all must be the caller's */
        if (!subject || !same_subject(n->subject, subject))
            return RESUME_FOREIGN;
        v = RESUME_ALLOWED;
    }
    return v;
}
