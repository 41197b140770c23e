/* The counters' slot tables: a tool's slot keyed by server and name, its server's _other for
 * names no one lists, the caps; a server's request histograms beside the totals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "stats.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static server_stats_t *fresh(void)
{
    return calloc(1, sizeof(server_stats_t));
}

/* Which slot each lookup gives, in order on one table: the same (server, tool) twice is the
 * same slot, a server or a name apart is another. */
static void tool_slots_by_server_and_name(void **state)
{
    static const struct {
        const char *server, *tool;
        bool known;
        const char *want_server, *want_tool;
        int same_as; /* the row whose slot this must be, or -1 for a new one */
    } rows[] = {
        /* 0 */ {"billing", "refund", true, "billing", "refund", -1},
        /* 1 */ {"crm", "refund", true, "crm", "refund", -1},
        /* 2 */ {"billing", "refund", true, "billing", "refund", 0},
        /* 3: a name the server does not list: its server's _other */
        {"billing", "mystery", false, "billing", "_other", -1},
        /* 4: another unknown name of the same server: the same slot */
        {"billing", "other_mystery", false, "billing", "_other", 3},
        /* 5: another server's unknown: a slot of its own */
        {"crm", "mystery", false, "crm", "_other", -1},
        /* 6: a name too long for a label slot counts as unknown */
        {"crm", "a_tool_name_longer_than_the_sixty_three_characters_a_slot_holds_x", true, "crm",
         "_other", 5},
        /* 7: the one upstream (no server) beside them: no server */
        {NULL, "refund", true, "", "refund", -1},
        {"", "refund", true, "", "refund", 7},
    };
    server_stats_t *s = fresh();
    stats_tool_t *got[sizeof(rows) / sizeof(rows[0])];
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        got[i] = stats_tool(s, rows[i].server, rows[i].tool, rows[i].known);
        assert_non_null(got[i]);
        assert_string_equal(got[i]->server, rows[i].want_server);
        assert_string_equal(got[i]->name, rows[i].want_tool);
        if (rows[i].same_as >= 0)
            assert_ptr_equal(got[i], got[rows[i].same_as]);
        else
            for (size_t j = 0; j < i; j++)
                if (got[j] == got[i])
                    fail_msg("row %zu got row %zu's slot", i, j);
    }
    free(s);
}

/* Without servers: an unknown name goes to the last slot as it always did, so the known
 * tools keep STATS_TOOLS - 1 slots of their own. */
static void one_upstream_unknown_names_share_the_last_slot(void **state)
{
    server_stats_t *s = fresh();
    stats_tool_t *t = stats_tool(s, NULL, "mystery", false);
    assert_ptr_equal(t, &s->tools[STATS_TOOLS - 1]);
    assert_string_equal(t->name, STATS_OTHER_TOOL);
    assert_string_equal(t->server, "");
    for (int i = 0; i < STATS_TOOLS - 1; i++) {
        char name[32];
        snprintf(name, sizeof(name), "tool%d", i);
        assert_ptr_equal(stats_tool(s, NULL, name, true), &s->tools[i]);
    }
    /* past the cap: the last slot too */
    assert_ptr_equal(stats_tool(s, NULL, "one_too_many", true), t);
    free(s);
}

/* Under servers: past the cap every name shares the last slot, labelled server _other and
 * tool _other (one bounded series, whatever server it came from). */
static void servers_past_the_cap_share_the_last_slot(void **state)
{
    server_stats_t *s = fresh();
    for (int i = 0; i < STATS_TOOLS - 1; i++) {
        char name[32];
        snprintf(name, sizeof(name), "tool%d", i);
        assert_ptr_equal(stats_tool(s, i % 2 ? "a" : "b", name, true), &s->tools[i]);
    }
    stats_tool_t *last = &s->tools[STATS_TOOLS - 1];
    assert_ptr_equal(stats_tool(s, "a", "one_too_many", true), last);
    assert_string_equal(last->server, STATS_OTHER_SERVER);
    assert_string_equal(last->name, STATS_OTHER_TOOL);
    assert_ptr_equal(stats_tool(s, "c", "mystery", false), last);
    /* the slots already made still answer */
    assert_ptr_equal(stats_tool(s, "b", "tool0", true), &s->tools[0]);
    free(s);
}

/* A server's request histograms and upstream errors, beside the totals every request is
 * filed in. */
static void requests_by_server(void **state)
{
    server_stats_t *s = fresh();
    assert_null(stats_server(s, NULL));
    assert_null(stats_server(s, ""));
    stats_server_t *billing = stats_server(s, "billing");
    assert_ptr_equal(billing, &s->servers[0]);
    assert_string_equal(billing->name, "billing");
    assert_ptr_equal(stats_server(s, "billing"), billing);

    stats_observe_request(s, "billing", "replay", 7);
    stats_observe_request(s, "crm", "executed", 30000);
    stats_observe_request(s, NULL, "forwarded", 1);
    stats_server_t *crm = stats_server(s, "crm");
    assert_ptr_equal(crm, &s->servers[1]);
    assert_int_equal(billing->request_count[STATS_OUT_REPLAY], 1);
    assert_int_equal(billing->request_ms[STATS_OUT_REPLAY], 7);
    assert_int_equal(billing->request_buckets[STATS_OUT_REPLAY][1], 1); /* 5 < 7 <= 10 */
    assert_int_equal(crm->request_buckets[STATS_OUT_EXECUTED][STATS_BUCKETS - 1], 1); /* +Inf */
    /* the totals hold all three; no server's slot holds the one upstream's */
    assert_int_equal(s->request_count[STATS_OUT_REPLAY], 1);
    assert_int_equal(s->request_count[STATS_OUT_EXECUTED], 1);
    assert_int_equal(s->request_count[STATS_OUT_FORWARDED], 1);
    assert_int_equal(billing->request_count[STATS_OUT_FORWARDED], 0);
    assert_int_equal(crm->request_count[STATS_OUT_FORWARDED], 0);
    stats_upstream_error(s, "crm");
    stats_upstream_error(s, NULL);
    assert_int_equal(crm->upstream_errors, 1);
    assert_int_equal(billing->upstream_errors, 0);
    assert_int_equal(s->upstream_errors, 2);

    /* past the cap: the last slot, named _other */
    for (int i = 2; i < STATS_SERVERS - 1; i++) {
        char name[32];
        snprintf(name, sizeof(name), "s%d", i);
        assert_ptr_equal(stats_server(s, name), &s->servers[i]);
    }
    stats_server_t *other = stats_server(s, "one_too_many");
    assert_ptr_equal(other, &s->servers[STATS_SERVERS - 1]);
    assert_string_equal(other->name, STATS_OTHER_SERVER);
    assert_ptr_equal(stats_server(s, "another"), other);
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tool_slots_by_server_and_name),
        cmocka_unit_test(one_upstream_unknown_names_share_the_last_slot),
        cmocka_unit_test(servers_past_the_cap_share_the_last_slot),
        cmocka_unit_test(requests_by_server),
    };
    return cmocka_run_group_tests_name("stats", tests, NULL, NULL);
}
