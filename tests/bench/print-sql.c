/* Prints the claim and finish statements exactly as the gateway prepares them, so the bench
 * script can check that its pgbench copy (scripts/bench/claim-finish.sql) has not drifted. */
#include "store_int.h"

#include <stdio.h>

int main(void)
{
    printf("%s\n%s\n", store_stmt_sql(STORE_OP_CLAIM), store_stmt_sql(STORE_OP_FINISH));
    return 0;
}
