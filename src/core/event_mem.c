/* libevent's memory.
 *
 * Every request passes through a handful of evbuffers, and each gets chains of 1 KiB (libevent's
 * smallest: a response head, a rewritten id) or of 2, 4 or 8 KiB for a body (libevent rounds a
 * chain up to a power of two). glibc keeps freed blocks for quick reuse only up to about 1 KiB
 * (its per-thread cache, seven of each size); larger ones, and a 1 KiB one whenever that cache
 * is empty, go through its slow path, which also merges its small free blocks first (the
 * consolidation that showed in a relayed read's profile), and its calloc never uses that cache
 * at all. About a tenth of a read's instructions were malloc and free.
 *
 * So libevent allocates through malloc (its calloc clears what malloc gave), and blocks of a
 * chain's sizes, from just over 512 bytes to 32 KiB, are rounded up to a power of two and kept
 * on a short list per size when the loop's thread frees them, to be handed out again as they
 * are. A freed block is filed by its usable size, so any block that holds a size serves it.
 * Other threads allocate and free as usual; a block one of them frees is not kept. The
 * gateway's own per-request buffers of such sizes (an answer kept whole to rewrite its id)
 * use the same lists through event_mem_realloc and event_mem_free, a new one taking a kept
 * block as libevent's do. */
#include "event_mem.h"
#include "util.h"

#include <event2/event.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdlib.h>

#define CLASS_MIN_SHIFT 10 /* 1 KiB: libevent's smallest chain */
#define CLASSES 6          /* 1, 2, 4, 8, 16 and 32 KiB (a socket read takes 32 KiB) */
#define KEEP 16            /* blocks kept per size: a few requests' worth */
#define SMALL_MAX 512      /* up to this, malloc's own cache is quick */

static __thread bool loop_thread;
static __thread void *kept[CLASSES][KEEP];
static __thread int nkept[CLASSES];

/* The size class for an allocation of n bytes, or -1 when n is not one of a chain's sizes. */
static int class_for(size_t n)
{
    if (n <= SMALL_MAX || n > ((size_t)1 << (CLASS_MIN_SHIFT + CLASSES - 1)))
        return -1;
    int c = 0;
    while (((size_t)1 << (CLASS_MIN_SHIFT + c)) < n)
        c++;
    return c;
}

static size_t class_size(int c)
{
    return (size_t)1 << (CLASS_MIN_SHIFT + c);
}

static void *mem_malloc(size_t n)
{
    int c = class_for(n);
    if (c < 0)
        return malloc(n);
    if (loop_thread && nkept[c] > 0)
        return kept[c][--nkept[c]];
    return malloc(class_size(c));
}

static void *mem_realloc(void *p, size_t n)
{
    if (!p)
        return mem_malloc(n);
    int c = class_for(n);
    if (c >= 0 && malloc_usable_size(p) >= n)
        return p;
    return realloc(p, c < 0 ? n : class_size(c));
}

static void mem_free(void *p)
{
    if (!p)
        return;
    if (loop_thread) {
        size_t u = malloc_usable_size(p);
        /* the largest class the block can serve */
        int c = -1;
        while (c + 1 < CLASSES && u >= class_size(c + 1))
            c++;
        if (c >= 0 && u < 2 * class_size(CLASSES - 1) && nkept[c] < KEEP) {
            kept[c][nkept[c]++] = p;
            return;
        }
    }
    free(p);
}

void *event_mem_realloc(void *p, size_t n)
{
    void *q = mem_realloc(p, n ? n : 1);
    if (!q)
        util_oom(n);
    return q;
}

void event_mem_free(void *p)
{
    mem_free(p);
}

void event_mem_init(void)
{
    loop_thread = true;
    event_set_mem_functions(mem_malloc, mem_realloc, mem_free);
}

size_t event_mem_kept(size_t *bytes)
{
    size_t n = 0, b = 0;
    for (int c = 0; c < CLASSES; c++) {
        n += (size_t)nkept[c];
        for (int i = 0; i < nkept[c]; i++)
            b += malloc_usable_size(kept[c][i]);
    }
    if (bytes)
        *bytes = b;
    return n;
}
