/* The `idemgw health` subcommand (see src/cmd/health_cmd.h). */
#include "health_cmd.h"

#include "config.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define HEALTH_TIMEOUT_MS 3000

/* Waits for fd to be ready for events; false on timeout or error. */
static bool wait_for(int fd, short events)
{
    struct pollfd p = {.fd = fd, .events = events};
    return poll(&p, 1, HEALTH_TIMEOUT_MS) == 1 && !(p.revents & (POLLERR | POLLNVAL));
}

int health_cmd_main(int argc, char **argv)
{
    if (argc > 2) {
        fprintf(stderr, "usage: idemgw health [HOST:PORT]\n");
        return 2;
    }
    const char *addr = argc == 2 ? argv[1] : getenv("IDEMGW_ADMIN_LISTEN");
    host_port_t hp;
    if (config_parse_host_port(addr && *addr ? addr : "127.0.0.1:8081", &hp) != 0) {
        fprintf(stderr, "idemgw health: %s is not HOST:PORT\n", addr);
        return 2;
    }
    const char *host = hp.host;
    if (strcmp(host, "0.0.0.0") == 0)
        host = "127.0.0.1";
    else if (strcmp(host, "::") == 0)
        host = "::1";
    char port[8];
    snprintf(port, sizeof(port), "%u", hp.port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = 1;
    int fd = -1;
    if (getaddrinfo(host, port, &hints, &res) != 0 || !res) {
        fprintf(stderr, "idemgw health: cannot resolve %s\n", host);
        goto out;
    }
    fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 || (connect(fd, res->ai_addr, res->ai_addrlen) != 0 && errno != EINPROGRESS) ||
        !wait_for(fd, POLLOUT)) {
        fprintf(stderr, "idemgw health: %s:%s: cannot connect\n", host, port);
        goto out;
    }
    static const char req[] = "GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n";
    if (send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL) != (ssize_t)sizeof(req) - 1 ||
        !wait_for(fd, POLLIN)) {
        fprintf(stderr, "idemgw health: %s:%s: no answer\n", host, port);
        goto out;
    }
    char buf[64] = "";
    ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    if (strncmp(buf, "HTTP/1.1 200 ", 13) == 0 || strncmp(buf, "HTTP/1.0 200 ", 13) == 0)
        rc = 0;
    else
        fprintf(stderr, "idemgw health: %s:%s: not healthy: %.40s\n", host, port, buf);
out:
    if (fd >= 0)
        close(fd);
    if (res)
        freeaddrinfo(res);
    free(hp.host);
    return rc;
}
