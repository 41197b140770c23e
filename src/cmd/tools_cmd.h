/* `idemgw tools`: asks the upstream for its tools (initialize + tools/list, every page) and
 * prints how the gateway classifies each one, and why. */
#ifndef IDEMGW_TOOLS_CMD_H
#define IDEMGW_TOOLS_CMD_H

/* argv[0] is "tools". Usage: idemgw tools [-c FILE] [--server NAME] [-H 'Name: value']...
 * The upstream and the policy come from the config (or IDEMGW_UPSTREAM); with servers:, from
 * the server --server names (required then; refused without servers:); -H adds a request
 * header (an Authorization for a protected server). Prints a table, one tool per line: name,
 * class, where the class comes from (policy, annotation, default), the window of a protected
 * tool and the server's hints; then the policy's tools the server does not list. Returns 0; 1
 * when the upstream could not be read (the reason on stderr); 2 on a usage or config error. */
int tools_cmd_main(int argc, char **argv);

#endif
