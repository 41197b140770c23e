/* libevent's memory (event_mem.c): buffers' blocks kept and handed out again, the data
 * intact through it. */
#include "event_mem.h"

#include <stdarg.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <event2/buffer.h>
#include <stdlib.h>
#include <string.h>

/* A buffer holding one body of n bytes, freed: its chain (a block of 1 KiB or more) is kept. */
static void add_and_free(size_t n)
{
    struct evbuffer *b = evbuffer_new();
    assert_non_null(b);
    char *data = malloc(n);
    assert_non_null(data);
    memset(data, 'x', n);
    assert_int_equal(evbuffer_add(b, data, n), 0);
    free(data);
    evbuffer_free(b);
}

static void test_large_chains_kept_and_reused(void **state)
{
    (void)state;
    size_t before = event_mem_kept(NULL);
    add_and_free(3000);
    size_t bytes = 0, after = event_mem_kept(&bytes);
    assert_int_equal(after, before + 1);
    assert_true(bytes >= 3000);
    /* the next body of that size takes the block back */
    struct evbuffer *b = evbuffer_new();
    char data[3000];
    memset(data, 'y', sizeof(data));
    assert_int_equal(evbuffer_add(b, data, sizeof(data)), 0);
    assert_int_equal(event_mem_kept(NULL), before);
    evbuffer_free(b);
    assert_int_equal(event_mem_kept(NULL), before + 1);
}

/* libevent's smallest chain is a 1 KiB block: kept too (glibc serves a 1 KiB request from its
 * slow path whenever its cache of that size is empty) */
static void test_smallest_chain_kept(void **state)
{
    (void)state;
    size_t before = event_mem_kept(NULL);
    add_and_free(100);
    size_t bytes = 0;
    assert_int_equal(event_mem_kept(&bytes), before + 1);
    assert_true(bytes >= 1024);
}

static void test_small_and_huge_not_kept(void **state)
{
    (void)state;
    size_t before = event_mem_kept(NULL);
    struct evbuffer *b = evbuffer_new(); /* the buffer itself: malloc's own cache */
    assert_non_null(b);
    evbuffer_free(b);
    add_and_free((size_t)1 << 20); /* a megabyte: back to malloc at once */
    assert_int_equal(event_mem_kept(NULL), before);
}

/* A buffer of the gateway's own made from nothing takes a kept block of its size. */
static void test_own_buffer_takes_kept_block(void **state)
{
    (void)state;
    add_and_free(3000); /* a 4 KiB block kept */
    size_t before = event_mem_kept(NULL);
    void *p = event_mem_realloc(NULL, 4000);
    assert_non_null(p);
    assert_int_equal(event_mem_kept(NULL), before - 1);
    memset(p, 'q', 4000);
    event_mem_free(p);
    assert_int_equal(event_mem_kept(NULL), before);
}

static void test_kept_blocks_bounded(void **state)
{
    (void)state;
    enum { N = 100 };
    struct evbuffer *bs[N];
    char data[5000];
    memset(data, 'z', sizeof(data));
    for (int i = 0; i < N; i++) {
        bs[i] = evbuffer_new();
        assert_int_equal(evbuffer_add(bs[i], data, sizeof(data)), 0);
    }
    for (int i = 0; i < N; i++)
        evbuffer_free(bs[i]);
    size_t bytes = 0, kept = event_mem_kept(&bytes);
    /* sixteen blocks per size, six sizes at most: never the hundred freed */
    assert_true(kept <= 96);
    assert_true(bytes <= (size_t)16 * (1 + 2 + 4 + 8 + 16 + 64) * 1024);
}

/* Random bodies added, partly drained and read back through reused blocks: each byte comes out
 * as it went in (a block handed out twice, or one too small, would show here or under ASan). */
static void test_data_intact_through_reuse(void **state)
{
    (void)state;
    srand(7);
    enum { BUFS = 8, ROUNDS = 2000, MAXLEN = 20000 };
    struct evbuffer *bs[BUFS];
    unsigned char *model[BUFS];
    size_t len[BUFS];
    for (int i = 0; i < BUFS; i++) {
        bs[i] = evbuffer_new();
        model[i] = malloc(8 * MAXLEN);
        len[i] = 0;
    }
    unsigned char chunk[MAXLEN], out[8 * MAXLEN];
    for (int r = 0; r < ROUNDS; r++) {
        int i = rand() % BUFS;
        int what = rand() % 3;
        if (what == 0 && len[i] + MAXLEN <= 8 * MAXLEN) {
            size_t n = 1 + (size_t)rand() % MAXLEN;
            for (size_t k = 0; k < n; k++)
                chunk[k] = (unsigned char)(r + k * 31);
            assert_int_equal(evbuffer_add(bs[i], chunk, n), 0);
            memcpy(model[i] + len[i], chunk, n);
            len[i] += n;
        } else if (what == 1 && len[i] > 0) {
            size_t n = 1 + (size_t)rand() % len[i];
            assert_int_equal(evbuffer_remove(bs[i], out, n), (int)n);
            assert_memory_equal(out, model[i], n);
            memmove(model[i], model[i] + n, len[i] - n);
            len[i] -= n;
        } else {
            evbuffer_free(bs[i]);
            bs[i] = evbuffer_new();
            len[i] = 0;
        }
        assert_int_equal(evbuffer_get_length(bs[i]), len[i]);
    }
    for (int i = 0; i < BUFS; i++) {
        assert_int_equal(evbuffer_remove(bs[i], out, len[i]), (int)len[i]);
        assert_memory_equal(out, model[i], len[i]);
        evbuffer_free(bs[i]);
        free(model[i]);
    }
}

int main(void)
{
    event_mem_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_large_chains_kept_and_reused),
        cmocka_unit_test(test_smallest_chain_kept),
        cmocka_unit_test(test_small_and_huge_not_kept),
        cmocka_unit_test(test_own_buffer_takes_kept_block),
        cmocka_unit_test(test_kept_blocks_bounded),
        cmocka_unit_test(test_data_intact_through_reuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
