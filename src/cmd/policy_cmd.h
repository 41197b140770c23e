/* `idemgw policy`: a policy from the server's own catalogue, and the difference between a
 * policy and the server.
 *
 *   idemgw policy init --upstream URL [-H 'Name: value']...
 *     prints a commented starter config: the upstream, and every tool the server lists with
 *     the class its annotations suggest, its description and annotations as comments.
 *     Returns 0, 1 when the server could not be read, 2 on a usage error.
 *   idemgw policy init -c FILE --server NAME [-H 'Name: value']...
 *     the same for the server NAME of FILE's servers:, read from its upstream (a URL or its
 *     stdio command): the tools: of its entry, indented to go under servers: NAME:.
 *   idemgw policy diff [-c FILE] [--server NAME] [-H 'Name: value']...
 *     lists tools in the policy the server does not list, tools the server lists the policy
 *     does not name (with the class they get), and policy classes the server's annotations
 *     contradict (a tool marked read that the server says writes or destroys). Returns 0 when
 *     there is nothing to report, 1 when there is (or the server could not be read), 2 on a
 *     usage or config error. With servers:, of the server --server names, against its own
 *     policy (required then, refused without servers: as server_arg.h says). */
#ifndef IDEMGW_POLICY_CMD_H
#define IDEMGW_POLICY_CMD_H

/* argv[0] is "policy". */
int policy_cmd_main(int argc, char **argv);

#endif
