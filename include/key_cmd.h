/* `idemgw key`: prints the idempotency key the gateway would derive for a call, so operators
 * and tests can compute keys without running the gateway. */
#ifndef IDEMGW_KEY_CMD_H
#define IDEMGW_KEY_CMD_H

/* argv[0] is "key". Usage:
 *   idemgw key --subject S --tool T --args JSON [--header-key K] [-c FILE] [--hash]
 *              [--show | --release | --forget]
 * Prints the key and a newline on stdout and returns 0; --hash adds a second line, the key's
 * key_hash as the gateway's log lines show it (key_hash_log). Returns 2 after a message on
 * stderr for missing or unknown options, invalid JSON, arguments that are not an object, a
 * bad explicit key or a config that does not load. With -c FILE the tool's exclude_args and
 * key_arg from the config apply; without it, none are excluded and key_arg is
 * "idempotency_key".
 * The row options go through the store (store_pg_new or store_sqlite_new, migrations off, one
 * connection) on an event loop of their own, waiting at most the store's timeout for a
 * connection; exit 2 when there is no database or the store fails. Each prints one JSON line after
 * the key, with key_hash. --show prints the key's row (exit 1: no row). --release turns an unknown
 * outcome (or a claim whose lease ran out) into a released one, so the next identical call runs; it
 * refuses, with exit 1 and the reason, anything else. --forget deletes the row whatever its
 * state and prints it as --show does, with "forgotten": true (exit 1: no row); gateways that
 * cached a success may still replay it until its window ends. The store is the config's
 * database_url, else IDEMGW_DATABASE_URL, else libpq's PG* variables, else the embedded store's
 * default file (config_store_choose), which must exist. The embedded store is opened without
 * the gateway's process lock (a running gateway holds it): each option is one short
 * transaction through SQLite's own locking, safe beside the gateway on a local disk. */
int key_cmd_main(int argc, char **argv);

#endif
