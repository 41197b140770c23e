/* libFuzzer driver for the stdio front end: what an agent writes on stdin, and what the gateway
 * answers on each connection the front opens. The input is the stdin bytes, then "\n\0\n", then
 * the answer every connection gets before it is closed. The front must end (done) without a
 * crash, a leak or a hang, whatever both sides send. */
#include "log.h"
#include "stdio_front.h"

#include <event2/event.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The longest line the front takes: small, so the over-long path is reached too. */
#define FUZZ_MAX_LINE 512

typedef struct run {
    struct event_base *base;
    const uint8_t *answer;
    size_t answer_len;
    bool done;
} run_t;

/* The gateway's side of a connection: the answer, then the close. */
static void gateway_connect(void *arg, int fd)
{
    run_t *r = arg;
    size_t off = 0;
    while (off < r->answer_len) {
        ssize_t n = write(fd, r->answer + off, r->answer_len - off);
        if (n <= 0)
            break;
        off += (size_t)n;
    }
    close(fd);
}

static void front_done(void *arg, bool failed)
{
    run_t *r = arg;
    (void)failed;
    r->done = true;
    event_base_loopbreak(r->base);
}

/* stdout's bytes are read and dropped, so the front never waits on a full pipe. */
static void drain_out(evutil_socket_t fd, short what, void *arg)
{
    char buf[4096];
    while (read(fd, buf, sizeof(buf)) > 0)
        ;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char sep[] = "\n\0\n";
    log_threshold = LOG_OFF;
    signal(SIGPIPE, SIG_IGN);
    size_t in_len = size;
    const uint8_t *answer = NULL;
    size_t answer_len = 0;
    for (size_t i = 0; i + 3 <= size; i++)
        if (memcmp(data + i, sep, 3) == 0) {
            in_len = i;
            answer = data + i + 3;
            answer_len = size - i - 3;
            break;
        }
    /* the pipe must take stdin's bytes whole: they are written before the loop runs */
    if (in_len > 60000)
        return 0;
    int in[2], out[2];
    if (pipe(in) != 0)
        return 0;
    if (pipe(out) != 0) {
        close(in[0]);
        close(in[1]);
        return 0;
    }
    if (in_len && write(in[1], data, in_len) < 0) {
        /* nothing: the front reads what is there */
    }
    close(in[1]);
    run_t r = {.base = event_base_new(), .answer = answer, .answer_len = answer_len};
    evutil_make_socket_nonblocking(out[0]);
    struct event *reader = event_new(r.base, out[0], EV_READ | EV_PERSIST, drain_out, NULL);
    event_add(reader, NULL);
    stdio_front_opts_t o = {
        .base = r.base,
        .in_fd = in[0],
        .out_fd = out[1],
        .path = "/mcp",
        .max_line = FUZZ_MAX_LINE,
        .connect = gateway_connect,
        .done = front_done,
        .arg = &r,
    };
    char msg[200];
    stdio_front_t *f = stdio_front_new(&o, msg, sizeof(msg));
    if (f) {
        struct timeval limit = {5, 0};
        event_base_loopexit(r.base, &limit);
        event_base_dispatch(r.base);
        if (!r.done)
            __builtin_trap(); /* the front hung */
        stdio_front_free(f);
    }
    event_free(reader);
    event_base_free(r.base);
    close(in[0]);
    close(out[0]);
    close(out[1]);
    return 0;
}
