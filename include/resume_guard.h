/* Who may resume a session's streams. A session id and a Last-Event-ID are not credentials:
 * anyone who learns them could ask for a stream again, and the server would replay what it
 * carried, a protected call's result among it. The guard remembers, per session, the subject
 * the gateway derived for each protected call it forwarded there, for as long as that call may
 * run and its result is remembered (lease + window); a GET that resumes such a session is let
 * through only for a caller with that same subject, whoever then serves the resume (the
 * gateway from its buffer, or the upstream from its event store).
 *
 * Per worker: the worker that notes a call also takes the session's slot in the hand-off
 * table (handoff.h) and keeps it while it knows the session, so a resume that another worker
 * accepts is handed here to be checked. Another gateway replica knows nothing of the call. */
#ifndef IDEMGW_RESUME_GUARD_H
#define IDEMGW_RESUME_GUARD_H

#include <stdbool.h>
#include <stdint.h>

typedef struct resume_guard resume_guard_t;

typedef enum {
    RESUME_UNGUARDED = 0, /* no protected call of the session is remembered */
    RESUME_ALLOWED,       /* every remembered call of the session is the caller's */
    RESUME_FOREIGN,       /* a remembered call of the session is another caller's */
} resume_verdict_t;

resume_guard_t *resume_guard_new(void);
void resume_guard_free(resume_guard_t *g);

/* A protected call of subject was forwarded in session at now_ms; remembered until until_ms
 * (a later note of the same pair keeps the later time). */
void resume_guard_note(resume_guard_t *g, const char *session, const char *subject, uint64_t now_ms,
                       uint64_t until_ms);
/* Whether the session has remembered calls at now_ms (expired ones are dropped first). */
bool resume_guard_knows(resume_guard_t *g, const char *session, uint64_t now_ms);
/* Whether subject (NULL: the request has none) may resume session's streams at now_ms. */
resume_verdict_t resume_guard_check(resume_guard_t *g, const char *session, const char *subject,
                                    uint64_t now_ms);

#endif
