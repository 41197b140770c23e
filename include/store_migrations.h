/* Schema migrations embedded at build time (scripts/embed-sql.sh over the numbered files in sql/).
 * Ordered by version, which starts at 1 and has no gaps. */
#ifndef IDEMGW_STORE_MIGRATIONS_H
#define IDEMGW_STORE_MIGRATIONS_H

typedef struct store_migration {
    int version;      /* the file's number prefix */
    const char *name; /* file name, recorded in schema_migrations for operators */
    const char *sql;  /* one or more statements, run inside the migration transaction */
} store_migration_t;

extern const store_migration_t store_migrations[];
extern const int store_migrations_count;

/* The embedded store's own (sql/sqlite/), numbered the same way. */
extern const store_migration_t store_sqlite_migrations[];
extern const int store_sqlite_migrations_count;

#endif
