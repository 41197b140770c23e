/* `idemgw keys`: the operator's queue (store_queue.h) from the command line, on the store
 * directly, as `idemgw key` reaches it beside a running gateway (store_cli.h).
 *
 *   idemgw keys list [--state S] [--server NAME] [--tool T] [--subject S] [--limit N]
 *                    [--cursor C] [--json] [-c FILE] [--database-url URL]
 *   idemgw keys show HASH [-c FILE] [--database-url URL]
 *   idemgw keys resolve HASH (--succeeded --result-file F | --failed | --forget)
 *                    [--note TEXT] [--by NAME] [-c FILE] [--database-url URL]
 *
 * list prints one line per key (key_hash, state, server/tool, subject, first seen, attempts),
 * or with --json the API's answer; show and resolve print the API's JSON answer. The actions a
 * resolve records name --by, else $USER, else "operator". Exit 0 on success, 1 when the key is
 * not found, ambiguous or cannot be resolved in its state (409), 2 on a usage error or a
 * store that fails. */
#ifndef IDEMGW_KEYS_CMD_H
#define IDEMGW_KEYS_CMD_H

/* argv[0] is "keys". */
int keys_cmd_main(int argc, char **argv);

#endif
