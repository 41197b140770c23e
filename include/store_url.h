/* database_url as libpq reads it: checked where the configuration is read, and the servers
 * it lists counted where the Postgres store sizes its pool. */
#ifndef IDEMGW_STORE_URL_H
#define IDEMGW_STORE_URL_H

#include <stddef.h>

/* What is wrong with a Postgres database_url as libpq will read it, or NULL (also for "none"
 * and "sqlite:..."): checked at load so a mistake stops the start instead of failing every
 * reconnect. It parses (libpq's message is quoted only when it names a key, never a value,
 * which may be a password); its hosts and ports pair up (one port for all hosts, or one per
 * host); target_session_attrs, when given, is read-write, which the gateway connects with
 * anyway (every claim is a write; with several hosts only the one that takes writes is of use).
 * The message goes into buf. */
const char *store_url_error(const char *url, char *buf, size_t len);
/* How many servers a Postgres database_url lists (1 when it names none, or cannot be read). */
int store_url_servers(const char *url);

#endif
