/* libevent's memory: its allocations go through malloc, with the blocks of its buffers kept
 * for reuse by the thread that runs the loops. */
#ifndef IDEMGW_EVENT_MEM_H
#define IDEMGW_EVENT_MEM_H

#include <stddef.h>

/* Installs the functions (event_set_mem_functions). Call before any other libevent call, from
 * the thread that will run the event loops: only its frees are kept for reuse. */
void event_mem_init(void);

/* Blocks kept for reuse now, and their bytes (for tests). */
size_t event_mem_kept(size_t *bytes);

#endif
