/* libFuzzer driver for the agent side of the gateway: arbitrary bytes on a real connection
 * (a socketpair on a real event loop), through llhttp, the limits and the refusals. The
 * handler answers every request, so pipelined requests are exercised too. */
#include "config.h"
#include "http_conn.h"
#include "server.h"

#include <event2/event.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

server_t *server;

void server_check_drained(void)
{
}

static void answer(void *arg, http_conn_t *conn, http_request_t *req)
{
    http_conn_respond(conn, 200, "text/plain", "ok", 2, NULL, req->keep_alive);
    http_request_free(req);
}

static http_site_t site = {answer, NULL, "fuzz"};

static void setup(void)
{
    config_errors_t errs = {0};
    server = calloc(1, sizeof(*server));
    server->base = event_base_new();
    server->stats = calloc(1, sizeof(*server->stats));
    server->all_stats = server->stats;
    server->n_workers = 1;
    server->cfg = config_load_string("fuzz.yaml",
                                     "upstream: http://127.0.0.1:9/mcp\n"
                                     "limits: {max_body: 4KiB, max_header: 2KiB}\n",
                                     &errs);
    if (!server->cfg)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!server)
        setup();
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0)
        return 0;
    evutil_make_socket_nonblocking(fds[0]);
    http_conn_accept(NULL, fds[0], NULL, 0, &site);
    if (size && write(fds[1], data, size) < 0) {
        /* the socket buffer holds far more than -max_len allows */
    }
    shutdown(fds[1], SHUT_WR);
    for (int i = 0; i < 1000 && server->open_conns > 0; i++)
        event_base_loop(server->base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    char sink[4096];
    while (read(fds[1], sink, sizeof(sink)) > 0) {
    }
    close(fds[1]);
    for (int i = 0; i < 100 && server->open_conns > 0; i++)
        event_base_loop(server->base, EVLOOP_ONCE);
    return 0;
}
