/* `idemgw key`: prints the idempotency key the gateway would derive for a call, so operators
 * and tests can compute keys without running the gateway. */
#ifndef IDEMGW_KEY_CMD_H
#define IDEMGW_KEY_CMD_H

/* argv[0] is "key". Usage:
 *   idemgw key --subject S --tool T --args JSON [--header-key K] [-c FILE]
 * Prints the key and a newline on stdout and returns 0. Returns 2 after a message on stderr
 * for missing or unknown options, invalid JSON, arguments that are not an object, a bad
 * explicit key or a config that does not load. With -c FILE the tool's exclude_args and
 * key_arg from the config apply; without it, none are excluded and key_arg is
 * "idempotency_key". */
int key_cmd_main(int argc, char **argv);

#endif
