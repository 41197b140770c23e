/* `idemgw stdio`'s command line and the store file it picks. Pure: no I/O, no environment (the
 * caller passes store_default_path()'s answer), so both are unit tested with tables. */
#ifndef IDEMGW_STDIO_ARGS_H
#define IDEMGW_STDIO_ARGS_H

#include "util.h"

#include <stddef.h>

typedef enum {
    STDIO_ARGS_RUN = 0, /* wrap the command (or the config's upstream) */
    STDIO_ARGS_HELP,    /* --help: print the usage, exit 0 */
    STDIO_ARGS_BAD,     /* a usage error, said in msg: exit 2 */
} stdio_args_result_t;

const char *stdio_args_result_str(stdio_args_result_t r);

typedef struct stdio_args {
    const char *config;   /* -c FILE, or NULL */
    const char *log_file; /* --log-file FILE: log lines go there instead of stderr, or NULL */
    const char **headers; /* -H values, "Name: value", pointing into argv (the array is ours) */
    size_t n_headers;
    char **command; /* CMD ARGS, NULL-terminated, pointing into argv; NULL: none given */
} stdio_args_t;

/* Parses argv (argv[0] is "stdio"): options, then the command after "--" (or after the first
 * word that is not an option). A header must be "Name: value" with a token name, no CR or
 * LF, and not one the wrapper writes itself (Host, Content-Type, Content-Length, Accept,
 * Connection, Transfer-Encoding, Mcp-Session-Id, MCP-Protocol-Version). On STDIO_ARGS_BAD
 * msg says why; free out with stdio_args_free whatever the result. */
stdio_args_result_t stdio_args_parse(int argc, char **argv, stdio_args_t *out, char *msg,
                                     size_t msglen) MUST_CHECK;
void stdio_args_free(stdio_args_t *a);

/* The wrapped server's own store file, allocated: in the folder of default_file (the embedded
 * store's default, store_default_path()) a name made of the server's last word that is not an
 * option (cut to letters, digits, '.', '_' and '-', a script's extension dropped) and 16 hex
 * digits of the SHA-256 of every word, so one command keeps its file across runs and another
 * command gets another: "stdio-server-memory-1f2e3d4c5b6a7988.db". Copies of one command
 * running at the same time (two agent windows) get the same file, which they share (the
 * embedded store's peers), so a call made in one window is replayed in the other: the name
 * holds nothing of a run. NULL when default_file is NULL or words is empty. */
char *stdio_args_store_file(const char *default_file, char *const *words);

#endif
