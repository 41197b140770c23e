/* Handing a resumed stream's socket to the worker that reads the stream (see handoff.h). */
#include "handoff.h"

#include "log.h"
#include "util.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define OWNER_SLOTS 16384
#define OWNER_PROBE 16 /* slots a session may take, from its hash's own on */
#define WORKER_BITS 0xFFu

/* shared memory: the table's words, when each slot was last noted (a count of notes, so the
 * least recently noted can be told), and that count */
typedef struct owner_table {
    uint64_t owners[OWNER_SLOTS];
    uint32_t noted_at[OWNER_SLOTS];
    uint32_t notes;
} owner_table_t;

static owner_table_t *table;
static uint64_t *owners; /* table->owners */
static int (*pairs)[2];  /* per worker: [0] is written by the others, [1] read by it */
static int n_pairs;
static int self = -1;
static struct event *rx_ev;
static handoff_adopt_fn adopt_fn;
static void *adopt_arg;

/* The session's hash with the low byte cleared, where a slot keeps the worker number. FNV-1a
 * is mixed further (a 64-bit finaliser): ids that differ in a counter at their end would
 * otherwise land on neighbouring slots and crowd each other out. */
static uint64_t session_hash(const char *s)
{
    uint64_t h = util_fnv1a64(s);
    h ^= h >> 33;
    h *= UINT64_C(0xff51afd7ed558ccd);
    h ^= h >> 33;
    h *= UINT64_C(0xc4ceb9fe1a85ec53);
    h ^= h >> 33;
    return h & ~(uint64_t)WORKER_BITS;
}

int handoff_setup(int n_workers)
{
    table = mmap(NULL, sizeof(*table), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (table == MAP_FAILED) {
        table = NULL;
        fprintf(stderr, "idemgw: cannot map the stream owner table\n");
        return -1;
    }
    owners = table->owners;
    pairs = xcalloc((size_t)n_workers, sizeof(*pairs));
    for (int w = 0; w < n_workers; w++) {
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pairs[w]) != 0) {
            fprintf(stderr, "idemgw: cannot create the workers' handoff sockets: %s\n",
                    strerror(errno));
            return -1;
        }
    }
    n_pairs = n_workers;
    return 0;
}

static void on_handoff(evutil_socket_t sock, short what, void *arg)
{
    (void)what;
    (void)arg;
    static char buf[HANDOFF_MAX_BYTES];
    for (;;) {
        union {
            struct cmsghdr h;
            char space[CMSG_SPACE(sizeof(int))];
        } ctl;
        struct iovec iov = {buf, sizeof(buf)};
        struct msghdr msg = {.msg_iov = &iov,
                             .msg_iovlen = 1,
                             .msg_control = ctl.space,
                             .msg_controllen = sizeof(ctl.space)};
        ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
        if (n < 0)
            return; /* EAGAIN: all taken */
        int fd = -1;
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
            memcpy(&fd, CMSG_DATA(c), sizeof(fd));
        if (fd < 0)
            continue;
        if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
            close(fd);
            continue;
        }
        adopt_fn(adopt_arg, fd, buf, (size_t)n);
    }
}

void handoff_start(struct event_base *base, int worker, handoff_adopt_fn adopt, void *arg)
{
    if (!owners || worker >= n_pairs)
        return;
    self = worker;
    adopt_fn = adopt;
    adopt_arg = arg;
    rx_ev = event_new(base, pairs[worker][1], EV_READ | EV_PERSIST, on_handoff, NULL);
    event_add(rx_ev, NULL);
}

void handoff_stop(void)
{
    if (rx_ev)
        event_free(rx_ev);
    rx_ev = NULL;
}

/* The i-th slot a session with hash h may take. */
static size_t slot_of(uint64_t h, unsigned i)
{
    return ((h >> 8) + i) % OWNER_SLOTS;
}

static bool take_slot(size_t slot, uint64_t expect, uint64_t mine, uint32_t note)
{
    if (!__atomic_compare_exchange_n(&owners[slot], &expect, mine, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_RELAXED))
        return false;
    __atomic_store_n(&table->noted_at[slot], note, __ATOMIC_RELAXED);
    return true;
}

void handoff_note_stream(const char *session, bool on)
{
    if (!owners || self < 0 || !session)
        return;
    uint64_t h = session_hash(session);
    uint64_t mine = h | (uint64_t)(self + 1);
    if (!on) {
        /* only a slot that still says this worker reads this session */
        for (unsigned i = 0; i < OWNER_PROBE; i++) {
            uint64_t expect = mine;
            __atomic_compare_exchange_n(&owners[slot_of(h, i)], &expect, 0, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED);
        }
        return;
    }
    uint32_t note = __atomic_add_fetch(&table->notes, 1, __ATOMIC_RELAXED);
    /* the session's own slot, whichever worker it names, else a free one */
    for (unsigned i = 0; i < OWNER_PROBE; i++) {
        size_t slot = slot_of(h, i);
        uint64_t v = __atomic_load_n(&owners[slot], __ATOMIC_ACQUIRE);
        while (v != 0 && (v & ~(uint64_t)WORKER_BITS) == h) {
            if (take_slot(slot, v, mine, note))
                return;
            v = __atomic_load_n(&owners[slot], __ATOMIC_ACQUIRE);
        }
    }
    for (unsigned i = 0; i < OWNER_PROBE; i++)
        if (take_slot(slot_of(h, i), 0, mine, note))
            return;
    /* every slot it may take is another session's: the least recently noted one is taken,
     * most likely a session whose calls ended long ago (a slot is cleared only when its
     * worker sees the session idle, and a caller that leaves is never seen again) */
    size_t oldest = slot_of(h, 0);
    for (unsigned i = 1; i < OWNER_PROBE; i++) {
        size_t slot = slot_of(h, i);
        uint32_t age = note - __atomic_load_n(&table->noted_at[slot], __ATOMIC_RELAXED);
        if (age > note - __atomic_load_n(&table->noted_at[oldest], __ATOMIC_RELAXED))
            oldest = slot;
    }
    __atomic_store_n(&owners[oldest], mine, __ATOMIC_RELEASE);
    __atomic_store_n(&table->noted_at[oldest], note, __ATOMIC_RELAXED);
}

int handoff_owner(const char *session)
{
    if (!owners || !session)
        return -1;
    uint64_t h = session_hash(session);
    for (unsigned i = 0; i < OWNER_PROBE; i++) {
        uint64_t v = __atomic_load_n(&owners[slot_of(h, i)], __ATOMIC_ACQUIRE);
        if ((v & ~(uint64_t)WORKER_BITS) != h || (v & WORKER_BITS) == 0)
            continue;
        int w = (int)(v & WORKER_BITS) - 1;
        return w < n_pairs ? w : -1;
    }
    return -1;
}

bool handoff_send(int w, int fd, const char *bytes, size_t len)
{
    if (!owners || w < 0 || w >= n_pairs || len > HANDOFF_MAX_BYTES)
        return false;
    union {
        struct cmsghdr h;
        char space[CMSG_SPACE(sizeof(int))];
    } ctl;
    memset(&ctl, 0, sizeof(ctl));
    struct iovec iov = {(void *)bytes, len};
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = ctl.space,
                         .msg_controllen = sizeof(ctl.space)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(fd));
    if (sendmsg(pairs[w][0], &msg, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)len) {
        log_warn(0, "could not hand a resumed stream to worker %d: %s", w + 1, strerror(errno));
        return false;
    }
    return true;
}
