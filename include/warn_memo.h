/* Warnings about the configuration, said once per change. A reload (SIGHUP) checks the whole
 * file again, and a warning that still holds (a restart-only setting changed, max_connections
 * above what the open file limit allows) would be logged again on every reload, burying what
 * the reload did change. The memo keeps the texts of one load's warnings: the next load logs
 * only those that the previous one did not, so a warning that goes away and comes back is
 * said again. One memo per process, owned by main. */
#ifndef IDEMGW_WARN_MEMO_H
#define IDEMGW_WARN_MEMO_H

#include <stdbool.h>

typedef struct warn_memo warn_memo_t;

warn_memo_t *warn_memo_new(void);
void warn_memo_free(warn_memo_t *m);

/* A new load begins: the warnings of the one before are what the next warn_memo_fresh
 * compares with. */
void warn_memo_begin(warn_memo_t *m);
/* Notes text as a warning of this load; true when the previous load did not have it (log
 * it), false when it did (it was said already). */
bool warn_memo_fresh(warn_memo_t *m, const char *text);

#endif
