/* MCP Tasks across sessions. A task-augmented tools/call (2025-11-25 params.task, or the 2026
 * flat resultType "task") answers with a CreateTaskResult, which the gateway stores and
 * replays like any result: a retry gets the same task id. But servers bind a task to the
 * session that created it (server-everything answers another session "Task not found"), and a
 * retry usually comes from a new session. So the gateway remembers, per task id it stored or
 * replayed, the caller and the first session, and sends that caller's tasks/get, tasks/result
 * and tasks/cancel for the task to that session. When the session has ended the server
 * answers 404 (or 400), and the caller is told the task lived in a session that ended. */
#ifndef IDEMGW_TASKS_H
#define IDEMGW_TASKS_H

#include "exchange.h"
#include "handler.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TASK_ROUTES_MAX 4096 /* tasks remembered; the oldest goes first */

typedef struct task_routes task_routes_t;
struct subject;

task_routes_t *task_routes_new(void);
void task_routes_free(task_routes_t *r);

/* Whether result (a tools/call result's JSON text) is a CreateTaskResult; its task id (a copy
 * for the caller to free, may be NULL) and ttl in milliseconds (0: none given). */
bool task_result_of(const char *result, size_t len, char **task_id, uint64_t *ttl_ms);

/* Remembers the task of result, if it is one, as subject's, living in session until
 * expires_ms (the caller's clock: util_now_ms). */
void task_routes_note(task_routes_t *r, const char *result, size_t len, const char *subject,
                      const char *session, uint64_t expires_ms);

/* The session of subject's task task_id, or NULL (unknown, expired, or another caller's). */
const char *task_routes_session(const task_routes_t *r, const char *task_id, const char *subject,
                                uint64_t now_ms);

/* The task id a tasks/get, tasks/result or tasks/cancel body names (free it), or NULL. */
char *task_request_id(const char *body, size_t len);

/* Forwards ex (a tasks/... request of subject) to session, the task's own; answers the caller
 * with a JSON-RPC error when the server says that session has ended. */
void task_forward_to(exchange_t *ex, struct event_base *base, const char *task_id,
                     const char *session);

/* The router's handler for a task's poll (handler.h): a tasks/get, tasks/result or
 * tasks/cancel is taken, its caller resolved (subject.h), and sent to the session of the task
 * if the routes know it as this caller's (task_forward_to), else forwarded as it came. */
typedef struct task_poll task_poll_t;

typedef struct task_poll_ctx {
    struct event_base *base;
    task_routes_t *routes; /* the idempotency stage notes them (idem.h): lives longer */
    struct subject *subject;
} task_poll_ctx_t;

task_poll_t *task_poll_new(const task_poll_ctx_t *ctx);
void task_poll_free(task_poll_t *p);
handler_verdict_t task_poll_offer(void *arg, exchange_t *ex);

#endif
