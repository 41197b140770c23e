/* database_url, a value of the configuration: which kind of store it names (the grammar: "none",
 * "sqlite:PATH", else a libpq conninfo or URL), checked where the configuration is read; and,
 * for a Postgres one, the servers it lists, counted where the Postgres store sizes its pool.
 * Which backend serves each kind, and opening it, is the store's (store_open.h). */
#ifndef IDEMGW_STORE_URL_H
#define IDEMGW_STORE_URL_H

#include <stddef.h>

typedef enum {
    STORE_URL_NONE = 0, /* "none": no store, protected calls are refused */
    STORE_URL_FILE,     /* the embedded store in a local file */
    STORE_URL_SERVER,   /* a Postgres server: a conninfo or URL, or the PG* environment */
} store_url_kind_t;

/* The prefix that names the embedded store's file. */
#define STORE_URL_FILE_PREFIX "sqlite:"
/* The file name of the embedded store when the config names none (store_default_path says in
 * which folder). */
#define STORE_URL_DEFAULT_FILE "idemgw-keys.db"

/* The kind of store database_url (NULL: unset) names, and in *target what it opens (allocated,
 * free it, or NULL): "none": NONE, NULL; "sqlite:PATH": FILE, the file (NULL when empty); a
 * conninfo or URL, or unset with PGHOST, PGDATABASE or PGSERVICE set: SERVER, the conninfo
 * (NULL: the PG* environment); unset otherwise: FILE at store_default_path() (NULL when there
 * is none). Reads the environment. The configuration, the gateway's store and the commands
 * that open the store all read database_url here, so they agree on the file. */
store_url_kind_t store_url_parse(const char *database_url, char **target);
/* The embedded store's default file, allocated: $STATE_DIRECTORY/idemgw-keys.db (systemd's
 * StateDirectory=; the first of several ':'-separated folders), else
 * $XDG_STATE_HOME/idemgw/idemgw-keys.db (an absolute XDG_STATE_HOME only, as the XDG spec
 * says), else $HOME/.local/state/idemgw/idemgw-keys.db; NULL when none of them is set. Never
 * the working directory: a gateway started in a checkout would leave its keys there. The
 * folders may not exist yet: the gateway makes them (util_mkdir_parents), the commands never. */
char *store_default_path(void);

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
