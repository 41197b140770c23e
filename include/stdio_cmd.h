/* `idemgw stdio [-c FILE] [-H 'Name: value']... [--log-file FILE] [-- CMD ARGS...]`: the
 * gateway as a desktop agent's stdio MCP server. It starts CMD (or the config's upstream),
 * relays newline-delimited JSON-RPC between its own stdin/stdout and the server through the
 * whole gateway pipeline (stdio_front.h), and protects tools/call by the policy with the
 * embedded store in a file of the command's own under the user's state folder
 * (stdio_args.h), unless the config names database_url. Callers are one fixed subject, the
 * local user, so a restarted wrapper finds its keys. Logs go to stderr (or --log-file), never
 * stdout. */
#ifndef IDEMGW_STDIO_CMD_H
#define IDEMGW_STDIO_CMD_H

struct serve_front;
struct config;

/* argv[0] is "stdio"; run_gateway runs the worker behind the wrapper's front end (main.c's
 * serve_front_run). Returns 0 when stdin ended and everything finished, 1 when the server
 * could not start or its session ended under the wrapper, 2 on a usage error. */
int stdio_cmd_main(int argc, char **argv,
                   int (*run_gateway)(struct config *cfg, const char *path,
                                      const struct serve_front *front));

#endif
