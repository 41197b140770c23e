/* libFuzzer driver for the agent side of the gateway: arbitrary bytes on a real connection
 * (a socketpair on a real event loop), through llhttp, the limits and the refusals. The
 * handler answers every request, so pipelined requests are exercised too. */
#include "http_conn.h"

#include <event2/event.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static server_stats_t stats;
static const http_limits_t limits = {
    .max_header_bytes = 2048,
    .max_body_bytes = 4096,
    .header_timeout_ms = 10000,
    .body_timeout_ms = 30000,
    .idle_timeout_ms = 60000,
    .max_connections = 100,
};
static http_context_t ctx = {.limits = &limits, .stats = &stats};

static void answer(void *arg, http_conn_t *conn, http_request_t *req)
{
    http_conn_respond(conn, 200, "text/plain", "ok", 2, NULL, req->keep_alive);
    http_request_free(req);
}

static http_site_t site = {.ctx = &ctx, .handler = answer, .name = "fuzz"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!ctx.base)
        ctx.base = event_base_new();
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0)
        return 0;
    evutil_make_socket_nonblocking(fds[0]);
    http_conn_accept(NULL, fds[0], NULL, 0, &site);
    if (size && write(fds[1], data, size) < 0) {
        /* the socket buffer holds far more than -max_len allows */
    }
    shutdown(fds[1], SHUT_WR);
    for (int i = 0; i < 1000 && ctx.open > 0; i++)
        event_base_loop(ctx.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    char sink[4096];
    while (read(fds[1], sink, sizeof(sink)) > 0) {
    }
    close(fds[1]);
    for (int i = 0; i < 100 && ctx.open > 0; i++)
        event_base_loop(ctx.base, EVLOOP_ONCE);
    return 0;
}
