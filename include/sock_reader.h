/* A plain socket's reads into its bufferevent's input, made here instead of by libevent.
 *
 * libevent's socket bufferevent asks the kernel how many bytes wait (ioctl FIONREAD) before
 * every read, and reads at most 4 KiB at a time: two system calls where one does, on both sides
 * of every relayed request. The reader is an event of its own on the socket; it reads up to
 * SOCK_READER_CHUNK bytes with one readv into the bufferevent's input and then calls the
 * bufferevent's own read callback, or its event callback with BEV_EVENT_READING and
 * BEV_EVENT_EOF or BEV_EVENT_ERROR (errno as the read left it), as the bufferevent would. The
 * bufferevent's own reading must stay disabled while a reader is attached, and its read
 * watermarks unset: the reader keeps the high watermark itself. Writing, connecting and TLS stay
 * the bufferevent's (a TLS bufferevent has no reader: only it can decrypt).
 *
 * Callback contract: the read and event callbacks may free the reader and the bufferevent (free
 * the reader first); the reader touches neither after calling them. */
#ifndef IDEMGW_SOCK_READER_H
#define IDEMGW_SOCK_READER_H

#include <stdbool.h>
#include <stddef.h>

struct bufferevent;

/* The most one read takes. */
#define SOCK_READER_CHUNK 16384

typedef struct sock_reader sock_reader_t;

/* A reader for bev's socket, disabled. bev must have its socket already (after
 * bufferevent_socket_connect for an outgoing one). */
sock_reader_t *sock_reader_new(struct bufferevent *bev);

/* Reading on or off (the bufferevent's EV_READ, for its socket). */
void sock_reader_enable(sock_reader_t *r, bool on);
bool sock_reader_enabled(const sock_reader_t *r);

/* Stops reading while the input holds at least high bytes, and starts again when it holds
 * fewer (0: no limit). */
void sock_reader_set_high(sock_reader_t *r, size_t high);

/* Before the bufferevent is freed (its socket closes with it). NULL is ignored. */
void sock_reader_free(sock_reader_t *r);

/* Reading on or off for a connection that has a reader (r) or reads through its bufferevent
 * (r NULL: a TLS one): the one switch the connection code uses. */
void sock_reading(struct bufferevent *bev, sock_reader_t *r, bool on);
bool sock_is_reading(struct bufferevent *bev, const sock_reader_t *r);
/* The high watermark of reading, the same way. */
void sock_read_high(struct bufferevent *bev, sock_reader_t *r, size_t high);

#endif
