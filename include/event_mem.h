/* libevent's memory: its allocations go through malloc, with the blocks of its buffers kept
 * for reuse by the thread that runs the loops. */
#ifndef IDEMGW_EVENT_MEM_H
#define IDEMGW_EVENT_MEM_H

#include <stddef.h>

/* Installs the functions (event_set_mem_functions). Call before any other libevent call, from
 * the thread that will run the event loops: only its frees are kept for reuse. */
void event_mem_init(void);

/* A buffer of the same kind for the gateway's own use: realloc (NULL p: a new one; out of
 * memory aborts) and free, with the same blocks kept for reuse. */
void *event_mem_realloc(void *p, size_t n);
void event_mem_free(void *p);

/* Blocks kept for reuse now, and their bytes (for tests). */
size_t event_mem_kept(size_t *bytes);

#endif
