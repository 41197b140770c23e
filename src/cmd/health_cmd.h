/* `idemgw health [HOST:PORT]`: asks a running gateway's admin listener for /healthz, for a
 * container's HEALTHCHECK (the image carries no HTTP client of its own). */
#ifndef IDEMGW_HEALTH_CMD_H
#define IDEMGW_HEALTH_CMD_H

/* argv[0] is "health". The address defaults to IDEMGW_ADMIN_LISTEN, else 127.0.0.1:8081; an
 * address listening on every interface (0.0.0.0, ::) is asked on loopback. Returns 0 when the
 * answer is 200 within 3 s, 1 otherwise (the reason on stderr), 2 on a usage error. */
int health_cmd_main(int argc, char **argv);

#endif
