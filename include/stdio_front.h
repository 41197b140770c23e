/* The stdio front end: an MCP client speaking newline-delimited JSON-RPC on stdin and stdout
 * (a desktop agent that started `idemgw stdio`) is served by the gateway's own HTTP pipeline.
 * Each message read from stdin becomes one HTTP POST on a connection of its own (a socket
 * pair whose other end the gateway adopts as an agent connection); the JSON or event-stream
 * answer is written back as one line per JSON-RPC message. Once initialize has answered, every
 * request carries its Mcp-Session-Id and MCP-Protocol-Version, and a GET stream brings what the
 * server sends outside a request. When stdin ends, what is in flight finishes, the session is
 * ended with DELETE, stdout is flushed, and done() is called. A request's event stream that
 * ends before its response, with an event id (a server that polls), is resumed with GET and
 * Last-Event-ID, as a Streamable HTTP client would.
 *
 * stdout carries nothing but JSON-RPC lines. A line that is not JSON gets a parse error
 * (-32700), one that is not an object or array an invalid request error (-32600), one longer
 * than max_line an invalid request error too (the bytes up to the next newline are dropped);
 * none of them ends the front. A request the gateway answers without a JSON-RPC response
 * (an HTTP error, a connection that ended early) gets an error response with its id. */
#ifndef IDEMGW_STDIO_FRONT_H
#define IDEMGW_STDIO_FRONT_H

#include "util.h"

#include <stdbool.h>
#include <stddef.h>

struct event_base;

typedef struct stdio_front stdio_front_t;

typedef struct stdio_front_opts {
    struct event_base *base;
    int in_fd;  /* where messages come from (0): a pipe, socket or terminal is watched (and made
                   non-blocking), a file or /dev/null read a piece per loop turn */
    int out_fd; /* where answers go (1): the same, a file written at once */
    const char *path;           /* the MCP endpoint requests go to ("/mcp"); copied */
    const char *const *headers; /* "Name: value" lines every request carries too; copied */
    size_t n_headers;
    size_t max_line; /* the longest message read (the body limit); answers may be 64 MiB */
    /* Gives the gateway one end of a connected socket (takes fd). */
    void (*connect)(void *arg, int fd);
    /* The front has finished (stdin ended, or the server's session ended under it). failed:
     * the latter. Called once, from the loop; the front may be freed from then on. */
    void (*done)(void *arg, bool failed);
    void *arg;
} stdio_front_opts_t;

/* Starts reading in_fd. NULL with msg set when the descriptors cannot be used. */
stdio_front_t *stdio_front_new(const stdio_front_opts_t *o, char *msg, size_t msglen) MUST_CHECK;

/* Frees the front and closes its connections to the gateway (not in_fd or out_fd). Not from
 * inside done(). */
void stdio_front_free(stdio_front_t *f);

#endif
