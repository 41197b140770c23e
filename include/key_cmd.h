/* `idemgw key`: prints the idempotency key the gateway would derive for a call, so operators
 * and tests can compute keys without running the gateway. */
#ifndef IDEMGW_KEY_CMD_H
#define IDEMGW_KEY_CMD_H

/* argv[0] is "key". Usage:
 *   idemgw key --subject S --tool T --args JSON [--header-key K] [-c FILE] [--server NAME]
 *              [--hash] [--show | --release | --forget] [--text]
 * Prints the key and a newline on stdout and returns 0; --hash adds a second line, the key's
 * key_hash as the gateway's log lines show it (key_hash_log). Returns 2 after a message on
 * stderr for missing or unknown options, invalid JSON, arguments that are not an object, a
 * bad explicit key or a config that does not load. With -c FILE the tool's exclude_args and
 * key_arg from the config apply; without it, none are excluded and key_arg is
 * "idempotency_key". A config with servers: needs --server NAME, one of them: that server's
 * policy applies and the key names it (key_call_t.server), as the gateway keys a call on that
 * server; a config without servers: refuses --server (server_arg.h); without -c, --server
 * names the server as given. Exit 2 when the name is missing or unknown.
 * The row options go through the store as store_cli.h opens it (the config's, migrations off,
 * one connection, waiting at most the store's timeout); exit 2 when there is no database or the
 * store fails. Each prints one JSON line after the key, with key_hash. --show prints the key's
 * row (exit 1: no row) with its duplicates: the exact counts by answer and by source and the
 * last STORE_DUP_HISTORY_MAX of them (history, oldest first). --text prints --show's or
 * --forget's row for people instead: the row, then one line per duplicate kept. --release turns
 * an unknown outcome (or a claim whose lease ran out) into a released one, so the next identical
 * call runs; it refuses, with exit 1 and the reason, anything else. --forget deletes the row
 * whatever its state and prints it as --show does, with "forgotten": true (exit 1: no row);
 * gateways that cached a success may still replay it until its window ends. */
int key_cmd_main(int argc, char **argv);

#endif
