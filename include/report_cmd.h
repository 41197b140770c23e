/* `idemgw report`: what the store says about protected calls, per tool, for operators. */
#ifndef IDEMGW_REPORT_CMD_H
#define IDEMGW_REPORT_CMD_H

#include <stddef.h>
#include <stdint.h>

/* argv[0] is "report". Usage:
 *   idemgw report [-c FILE] [--since DURATION | --since all] [--top N] [--server NAME] [--json]
 * Reads the rows updated in the last DURATION (default 24h) from the store the config names
 * (store_cli.h: the same choice as `idemgw key`), one read-only statement, and prints per
 * tool: keys, calls, runs, duplicates by answer (replay, in progress, unknown) and by source,
 * rows by state; then the N keys (default 10) with the most calls, as key hashes
 * (`idemgw key --hash`). A table for people, or one JSON object with --json. Returns 0; 2
 * after a message on stderr for a bad option, a config that does not load, no database, a
 * store that does not answer or a failed statement. The store keeps a key only for its
 * window (then sweeps it), so older calls are not in the report.
 * A config with servers: adds each tool's server (a SERVER column; "server" in JSON, null for
 * a row of no server the config names, and each server's sums under "servers"); --server NAME
 * reads only that server's rows, those whose tool column starts with "NAME/", chosen by the
 * store so the top keys are that server's too. The one-upstream form prints as it always did,
 * and refuses --server (server_arg.h). */
int report_cmd_main(int argc, char **argv);

/* --since: a duration (policy_parse_duration: "90s", "24h", "7d"; a bare number is seconds),
 * more than zero, or "all" (*ms = 0). 0, or -1 with err filled. */
int report_cmd_parse_since(const char *s, uint64_t *ms, char *err, size_t errlen);

#endif
