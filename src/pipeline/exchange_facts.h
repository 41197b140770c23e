/* An exchange's facts (exchange.h) kept and written: the copy the exchange holds, and the log
 * line's members made from it. Pure, so the unit tests' fake exchange writes the same text.
 * Private to src/pipeline/ and the fake. */
#ifndef IDEMGW_EXCHANGE_FACTS_H
#define IDEMGW_EXCHANGE_FACTS_H

#include "exchange.h"

#include <stddef.h>

/* f with its strings copied into one allocation (key_hash cut to KEY_HASH_LOG_LEN) into *kept;
 * returns that allocation, which the holder frees when it lets *kept go. */
char *exchange_facts_keep(exchange_facts_t *kept, const exchange_facts_t *f);

/* f's members as JSON ("\"key_hash\":\"...\",\"code\":\"...\"") into out, "" when none is set;
 * cut short (never mid-member) when out is too small. Returns the length written. */
size_t exchange_facts_render(const exchange_facts_t *f, char *out, size_t len);

#endif
