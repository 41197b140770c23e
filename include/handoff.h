/* Several workers share the agents' port (SO_REUSEPORT), so a GET that resumes a stream with
 * Last-Event-ID can land on a worker other than the one still reading that stream. That
 * worker hands the agent's socket, with the request re-serialised, to the owner over a Unix
 * socket (SCM_RIGHTS), and the owner serves the resume from the bytes it kept.
 *
 * Which worker reads a session's streams is kept in a table in shared memory, one 64-bit word
 * a slot: the session's hash with the worker number in its low byte. A session takes the first
 * free slot of the few after its hash's own (open addressing), so sessions whose hashes meet
 * keep their own owners. A session not found makes the resume go upstream from the worker it
 * reached, which cannot map back the ids of another worker's protected calls: the answer
 * would reach the agent under the gateway's id and the key wait out its lease. A slot is
 * cleared when its worker sees the session idle, but a caller that leaves is never seen
 * again, so a long-running gateway fills the table: a session that finds every slot it may
 * take held takes the least recently noted one (each slot keeps when it was last noted). */
#ifndef IDEMGW_HANDOFF_H
#define IDEMGW_HANDOFF_H

#include <stdbool.h>
#include <stddef.h>

struct event_base;

/* In the first process, before the workers fork: the table and one socket pair a worker.
 * 0, or -1 after a message on stderr. */
int handoff_setup(int n_workers);

/* What a worker does with a socket handed to it: bytes are what the other worker had read of
 * it. Takes fd. */
typedef void (*handoff_adopt_fn)(void *arg, int fd, const char *bytes, size_t len);

/* In a worker: receive handed-over sockets from now on; each becomes a connection of its own
 * through adopt(arg, fd, bytes, len), from the loop of base. */
void handoff_start(struct event_base *base, int worker, handoff_adopt_fn adopt, void *arg);
void handoff_stop(void);

/* This worker reads (on) or no longer reads (off) a stream of session. */
void handoff_note_stream(const char *session, bool on);

/* The worker reading a stream of session, or -1 when none is known. */
int handoff_owner(const char *session);

/* Sends fd and the bytes to worker w; true when they are on their way (the caller then
 * closes its own copy of fd), false when they cannot be sent now. */
bool handoff_send(int w, int fd, const char *bytes, size_t len);

/* Largest request a handoff carries. */
#define HANDOFF_MAX_BYTES (64 * 1024)

#endif
