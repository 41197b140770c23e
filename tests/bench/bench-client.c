/* Benchmark clients that wrk cannot play. Blocking sockets, one request at a time.
 *
 *   bench-client idle PORT PATH N        open N keep-alive connections, one read-tool call on
 *                                         each, print "ready N", then sleep until killed
 *   bench-client hold PORT PATH N        open N SSE calls of the "hold" tool, wait for the first
 *                                         event on each, print "ready N", sleep until killed
 *   bench-client sse PORT PATH CALLS TOOL [SUBJECT_ARGS]
 *                                         CALLS sequential calls of TOOL (a streaming tool), read
 *                                         every progress event, and print one JSON line with the
 *                                         upstream-write -> receipt latency (us) of all events
 * Requests go to 127.0.0.1:PORT. TOOL is sent with unique arguments per call. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int port;
static const char *path;

static int dial(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        perror("bench-client: connect");
        exit(1);
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static void send_call(int fd, int id, const char *tool, const char *args)
{
    char body[512], req[1024];
    int bn = snprintf(body, sizeof(body),
                      "{\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":\"tools/call\",\"params\":{\"name\":"
                      "\"%s\",\"arguments\":%s,\"_meta\":{\"progressToken\":%d}}}",
                      id, tool, args, id);
    int n = snprintf(req, sizeof(req),
                     "POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
                     "Accept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n%s",
                     path, port, bn, body);
    if (write(fd, req, (size_t)n) != n) {
        perror("bench-client: write");
        exit(1);
    }
}

/* Reads until needle appears in what was read (a whole small response). */
static void read_until(int fd, const char *needle)
{
    char buf[8192];
    size_t len = 0;
    for (;;) {
        ssize_t r = read(fd, buf + len, sizeof(buf) - 1 - len);
        if (r <= 0) {
            fprintf(stderr, "bench-client: connection closed before '%s'\n", needle);
            exit(1);
        }
        len += (size_t)r;
        buf[len] = 0;
        if (strstr(buf, needle))
            return;
        if (len > sizeof(buf) / 2) { /* keep the tail only */
            memmove(buf, buf + len - 256, 256);
            len = 256;
        }
    }
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void wait_forever(int n)
{
    printf("ready %d\n", n);
    fflush(stdout);
    for (;;)
        pause();
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: bench-client idle|hold|sse PORT PATH N [TOOL]\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    port = atoi(argv[2]);
    path = argv[3];
    int n = atoi(argv[4]);
    if (strcmp(argv[1], "idle") == 0 || strcmp(argv[1], "hold") == 0) {
        int hold = argv[1][0] == 'h';
        char args[64];
        for (int i = 0; i < n; i++) {
            int fd = dial();
            snprintf(args, sizeof(args), "{\"q\":\"c%d-%d\"}", (int)getpid(), i);
            send_call(fd, i + 1, hold ? "hold" : "search", args);
            read_until(fd, hold ? "notifications/progress" : "\"result\"");
        }
        wait_forever(n);
    }
    if (strcmp(argv[1], "sse") != 0 || argc < 6) {
        fprintf(stderr, "bench-client: unknown mode %s\n", argv[1]);
        return 2;
    }
    const char *tool = argv[5];
    size_t cap = (size_t)n * 100, cnt = 0;
    uint64_t *lat = calloc(cap ? cap : 1, sizeof(*lat));
    char buf[65536], args[96];
    uint64_t seed = now_ns();
    for (int call = 0; call < n; call++) {
        int fd = dial();
        snprintf(args, sizeof(args), "{\"run\":\"%llx\",\"n\":%d}", (unsigned long long)seed, call);
        send_call(fd, call + 1, tool, args);
        size_t len = 0;
        int done = 0;
        while (!done) {
            ssize_t r = read(fd, buf + len, sizeof(buf) - 1 - len);
            uint64_t t = now_ns();
            if (r <= 0) {
                fprintf(stderr, "bench-client: stream ended early (call %d, %zu events)\n", call, cnt);
                return 1;
            }
            len += (size_t)r;
            buf[len] = 0;
            char *p = buf, *q;
            while ((q = strstr(p, "ts=")) != NULL) {
                char *e;
                uint64_t ts = strtoull(q + 3, &e, 10);
                if (*e != '"')
                    break; /* number cut by the read: keep it for the next one */
                if (cnt < cap)
                    lat[cnt++] = t > ts ? t - ts : 0;
                p = e;
            }
            if (strstr(p, "\"result\""))
                done = 1;
            /* keep what follows the last counted event (it may be cut), at most 32 KiB */
            size_t keep = (size_t)(buf + len - p);
            if (keep > sizeof(buf) / 2) {
                p = buf + len - 256;
                keep = 256;
            }
            memmove(buf, p, keep);
            len = keep;
            buf[len] = 0;
        }
        close(fd);
    }
    qsort(lat, cnt, sizeof(*lat), cmp_u64);
    double sum = 0;
    for (size_t i = 0; i < cnt; i++)
        sum += (double)lat[i];
#define PCT(p) (cnt ? (double)lat[(size_t)((cnt - 1) * (p) / 100.0)] / 1000.0 : 0.0)
    printf("{\"calls\":%d,\"events\":%zu,\"mean_us\":%.1f,\"p50_us\":%.1f,\"p99_us\":%.1f,"
           "\"max_us\":%.1f}\n",
           n, cnt, cnt ? sum / (double)cnt / 1000.0 : 0.0, PCT(50), PCT(99), PCT(100));
    return 0;
}
