/* Which caller a message the stdio server sends on its own reaches (src/net/stdio_route.c).
 * The calls, sessions and children are built by hand; what upstream_stdio.c would do with a
 * delivery or a line for the child is faked here and recorded: a request goes to the one
 * caller it can belong to under an id of the gateway's, only that caller's answer reaches the
 * server (under the server's id), and what no caller can be told apart for is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "stdio_int.h"

/* --- upstream_stdio.c, faked --- */

#define MAX_REC 300
typedef struct {
    upstream_call_t *call; /* delivered to; NULL: written to the child */
    char *text;
} rec_t;
static rec_t recs[MAX_REC];
static int n_recs;

static void record(upstream_call_t *call, json_t *msg)
{
    assert_true(n_recs < MAX_REC);
    recs[n_recs].call = call;
    recs[n_recs].text = json_dumps(msg, JSON_COMPACT | JSON_SORT_KEYS);
    n_recs++;
}

void stdio_call_deliver(upstream_call_t *call, json_t *msg)
{
    record(call, msg);
}

void stdio_child_write(child_t *c, json_t *msg)
{
    (void)c;
    record(NULL, msg);
}

upstream_call_t *stdio_stream_of(session_t *s)
{
    for (upstream_call_t *call = s ? s->calls : NULL; call; call = call->snext)
        if (call->mode == MODE_SSE && !call->end_queued)
            return call;
    return s ? s->get : NULL;
}

/* --- the world: one child, its sessions, calls and the requests it has in flight --- */

static stdio_up_t up;
static child_t child;
static session_t sess[3];
static upstream_call_t calls[6];
static pend_t pends[6];

static int setup(void **state)
{
    (void)state;
    memset(&up, 0, sizeof(up));
    memset(&child, 0, sizeof(child));
    memset(sess, 0, sizeof(sess));
    memset(calls, 0, sizeof(calls));
    memset(pends, 0, sizeof(pends));
    up.label = "t";
    child.up = &up;
    child.pid = 7;
    n_recs = 0;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    stdio_sreqs_free(&child);
    for (size_t i = 0; i < 3; i++)
        json_decref(sess[i].subs);
    for (size_t i = 0; i < 6; i++)
        json_decref(pends[i].orig_token);
    for (int i = 0; i < n_recs; i++)
        free(recs[i].text);
    return 0;
}

static session_t *add_session(int i, const char *id)
{
    session_t *s = &sess[i];
    snprintf(s->id, sizeof(s->id), "%s", id);
    s->up = &up;
    s->child = &child;
    s->cnext = child.sessions;
    child.sessions = s;
    return s;
}

/* A call of session s (or, s NULL, of the sessionless caller tag) in the given mode. */
static upstream_call_t *add_call(int i, session_t *s, const char *caller, call_mode_t mode)
{
    upstream_call_t *c = &calls[i];
    c->up = &up;
    c->sess = s;
    c->child = &child;
    c->mode = mode;
    snprintf(c->caller, sizeof(c->caller), "%s", caller ? caller : "");
    if (s && mode != MODE_GET) {
        c->snext = s->calls;
        s->calls = c;
    }
    if (s && mode == MODE_GET)
        s->get = c;
    return c;
}

/* A request of call in flight on the child, as the child saw it (gid). */
static pend_t *add_pend(int i, upstream_call_t *call, uint64_t gid)
{
    pend_t *p = &pends[i];
    p->gid = gid;
    p->call = call;
    p->next = child.pends;
    child.pends = p;
    return p;
}

static void route(const char *text)
{
    json_t *m = json_loads(text, 0, NULL);
    assert_non_null(m);
    stdio_route_from_server(&child, m);
    json_decref(m);
}

static bool belongs(upstream_call_t *call, const char *text)
{
    json_t *m = json_loads(text, 0, NULL);
    assert_non_null(m);
    bool ok = stdio_answers_belong(&child, call, m);
    json_decref(m);
    return ok;
}

static void answer(upstream_call_t *call, const char *text)
{
    json_t *m = json_loads(text, 0, NULL);
    assert_non_null(m);
    stdio_answer_to_server(&child, call, m);
    json_decref(m);
}

static void rec_is(int i, upstream_call_t *call, const char *text)
{
    assert_true(i < n_recs);
    assert_ptr_equal(recs[i].call, call);
    assert_string_equal(recs[i].text, text);
}

/* The error the child gets for its request id (a string here), whatever the reason. */
static void refused(int i, const char *server_id)
{
    assert_true(i < n_recs);
    assert_null(recs[i].call);
    json_t *m = json_loads(recs[i].text, 0, NULL);
    assert_non_null(m);
    assert_string_equal(json_string_value(json_object_get(m, "id")), server_id);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(m, "error"), "code")),
                     -32603);
    json_decref(m);
}

static void a_request_reaches_the_one_caller_and_only_its_answer_goes_back(void **state)
{
    (void)state;
    session_t *a = add_session(0, "A");
    session_t *b = add_session(1, "B");
    upstream_call_t *ca = add_call(0, a, NULL, MODE_SSE);
    upstream_call_t *cb = add_call(1, b, NULL, MODE_SSE);
    add_pend(0, ca, 1);
    route("{\"jsonrpc\":\"2.0\",\"id\":\"s-1\",\"method\":\"sampling/createMessage\"}");
    assert_int_equal(n_recs, 1);
    rec_is(0, ca, "{\"id\":1,\"jsonrpc\":\"2.0\",\"method\":\"sampling/createMessage\"}");
    assert_int_equal(child.n_sreqs, 1);

    const char *reply = "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"ok\":true}}";
    /* another session, a sessionless caller, a wrong id: not theirs to answer */
    assert_false(belongs(cb, "[{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}]"));
    upstream_call_t *stranger = add_call(2, NULL, "A", MODE_SSE);
    assert_false(belongs(stranger, "[{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}]"));
    assert_false(belongs(ca, "[{\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{}}]"));
    assert_false(belongs(ca, "[{\"jsonrpc\":\"2.0\",\"id\":\"1\",\"result\":{}}]"));
    /* the caller's own, beside a notification; but not beside something that is neither */
    assert_true(belongs(ca, "[{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}},"
                            "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/x\"}]"));
    assert_false(belongs(ca, "[{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}},{\"id\":3}]"));

    answer(cb, reply); /* refused by belongs first; this writes nothing either */
    assert_int_equal(n_recs, 1);
    answer(ca, reply);
    assert_int_equal(n_recs, 2);
    rec_is(1, NULL, "{\"id\":\"s-1\",\"jsonrpc\":\"2.0\",\"result\":{\"ok\":true}}");
    assert_int_equal(child.n_sreqs, 0);
    /* answered once: the same answer again names nothing */
    assert_false(belongs(ca, "[{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}]"));
    answer(ca, reply);
    assert_int_equal(n_recs, 2);
}

static void sessionless_callers_are_told_apart_by_their_tag(void **state)
{
    (void)state;
    child.shared = true;
    upstream_call_t *x = add_call(0, NULL, "tag-x", MODE_SSE);
    upstream_call_t *y = add_call(1, NULL, "tag-y", MODE_SSE);
    add_pend(0, x, 1);
    route("{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"elicitation/create\"}");
    rec_is(0, x, "{\"id\":1,\"jsonrpc\":\"2.0\",\"method\":\"elicitation/create\"}");
    assert_false(belongs(y, "[{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}]"));
    assert_true(belongs(x, "[{\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":1}}]"));
    char scope[SESSION_ID_MAX];
    assert_string_equal(stdio_call_scope(x, scope), "caller:tag-x");
}

static void calls_of_two_callers_in_flight_route_nothing(void **state)
{
    (void)state;
    child.shared = true;
    session_t *a = add_session(0, "A");
    session_t *b = add_session(1, "B");
    add_pend(0, add_call(0, a, NULL, MODE_SSE), 1);
    add_pend(1, add_call(1, b, NULL, MODE_SSE), 2);
    route("{\"jsonrpc\":\"2.0\",\"id\":\"q\",\"method\":\"roots/list\"}");
    assert_int_equal(n_recs, 1);
    refused(0, "q");
    assert_non_null(strstr(recs[0].text, "cannot tell which"));
    route("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\"}");
    assert_int_equal(n_recs, 1); /* dropped, and counted */
    assert_int_equal(up.unrouted, 2);
    assert_int_equal(child.n_sreqs, 0);
}

static void an_idle_shared_child_has_no_one_to_ask(void **state)
{
    (void)state;
    child.shared = true;
    session_t *a = add_session(0, "A");
    add_call(0, a, NULL, MODE_GET);
    route("{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"roots/list\"}");
    assert_int_equal(n_recs, 1);
    assert_null(recs[0].call);
    assert_non_null(strstr(recs[0].text, "no client is connected"));
}

static void a_child_of_one_session_speaks_to_its_get_stream(void **state)
{
    (void)state;
    session_t *a = add_session(0, "A");
    upstream_call_t *get = add_call(0, a, NULL, MODE_GET);
    route("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/"
          "message\",\"params\":{\"level\":\"info\"}}");
    route("{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ping\"}");
    assert_int_equal(n_recs, 2);
    rec_is(0, get,
           "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":"
           "\"info\"}}");
    rec_is(1, get, "{\"id\":1,\"jsonrpc\":\"2.0\",\"method\":\"ping\"}");
}

static void a_json_call_in_flight_sends_news_to_the_session_stream(void **state)
{
    (void)state;
    session_t *a = add_session(0, "A");
    upstream_call_t *json = add_call(0, a, NULL, MODE_JSON);
    upstream_call_t *get = add_call(1, a, NULL, MODE_GET);
    add_pend(0, json, 1);
    route("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\"}");
    assert_int_equal(n_recs, 1);
    assert_ptr_equal(recs[0].call, get);
}

static void progress_goes_to_the_call_whose_token_it_names(void **state)
{
    (void)state;
    child.shared = true;
    session_t *a = add_session(0, "A");
    session_t *b = add_session(1, "B");
    upstream_call_t *ca = add_call(0, a, NULL, MODE_SSE);
    upstream_call_t *cb = add_call(1, b, NULL, MODE_JSON);
    pend_t *pa = add_pend(0, ca, 11);
    pa->orig_token = json_string("tok-a");
    pend_t *pb = add_pend(1, cb, 12);
    pb->orig_token = json_integer(5);
    route("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\","
          "\"params\":{\"progressToken\":11,\"progress\":1}}");
    assert_int_equal(n_recs, 1);
    rec_is(0, ca,
           "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\","
           "\"params\":{\"progress\":1,\"progressToken\":\"tok-a\"}}");
    /* a call answered as JSON has no stream for it; an unknown token names no one */
    route("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\","
          "\"params\":{\"progressToken\":12,\"progress\":1}}");
    route("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\","
          "\"params\":{\"progressToken\":99,\"progress\":1}}");
    assert_int_equal(n_recs, 1);
    assert_int_equal(up.unrouted, 0);
}

static void list_changes_reach_every_session_and_updates_the_subscribers(void **state)
{
    (void)state;
    child.shared = true;
    session_t *a = add_session(0, "A");
    session_t *b = add_session(1, "B");
    session_t *c = add_session(2, "C"); /* no stream: hears nothing */
    upstream_call_t *ga = add_call(0, a, NULL, MODE_GET);
    upstream_call_t *gb = add_call(1, b, NULL, MODE_GET);
    route("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}");
    assert_int_equal(n_recs, 2);
    assert_true((recs[0].call == ga && recs[1].call == gb) ||
                (recs[0].call == gb && recs[1].call == ga));

    json_t *sub =
        json_loads("{\"method\":\"resources/subscribe\",\"params\":{\"uri\":\"f://1\"}}", 0, NULL);
    json_t *unsub = json_loads(
        "{\"method\":\"resources/unsubscribe\",\"params\":{\"uri\":\"f://1\"}}", 0, NULL);
    json_t *other =
        json_loads("{\"method\":\"tools/call\",\"params\":{\"uri\":\"f://1\"}}", 0, NULL);
    stdio_note_subscription(b, sub);
    stdio_note_subscription(c, sub);
    stdio_note_subscription(a, other);
    stdio_note_subscription(NULL, sub);
    const char *updated =
        "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/resources/updated\",\"params\":{\"uri\":"
        "\"f://1\"}}";
    route(updated);
    assert_int_equal(n_recs, 3);
    assert_ptr_equal(recs[2].call, gb);
    stdio_note_subscription(b, unsub);
    route(updated);
    assert_int_equal(n_recs, 3);
    json_decref(sub);
    json_decref(unsub);
    json_decref(other);
}

static void a_caller_that_goes_leaves_its_questions_refused(void **state)
{
    (void)state;
    child.shared = true;
    session_t *a = add_session(0, "A");
    session_t *b = add_session(1, "B");
    pend_t *pa = add_pend(0, add_call(0, a, NULL, MODE_SSE), 1);
    route("{\"jsonrpc\":\"2.0\",\"id\":\"a1\",\"method\":\"roots/list\"}");
    pa->call = NULL;
    pend_t *pb = add_pend(1, add_call(1, b, NULL, MODE_SSE), 2);
    route("{\"jsonrpc\":\"2.0\",\"id\":\"b1\",\"method\":\"roots/list\"}");
    pb->call = NULL;
    assert_int_equal(child.n_sreqs, 2);
    assert_int_equal(n_recs, 2);
    stdio_sreqs_gone(&child, "A");
    assert_int_equal(n_recs, 3);
    refused(2, "a1");
    assert_non_null(strstr(recs[2].text, "has gone"));
    assert_int_equal(child.n_sreqs, 1);
    stdio_sreqs_gone(&child, "nobody");
    assert_int_equal(n_recs, 3);
}

static void the_oldest_unanswered_question_makes_room(void **state)
{
    (void)state;
    session_t *a = add_session(0, "A");
    add_pend(0, add_call(0, a, NULL, MODE_SSE), 1);
    char msg[100];
    for (int i = 0; i <= SREQ_MAX; i++) {
        snprintf(msg, sizeof(msg), "{\"jsonrpc\":\"2.0\",\"id\":\"q%d\",\"method\":\"ping\"}", i);
        route(msg);
    }
    assert_int_equal(child.n_sreqs, SREQ_MAX);
    /* SREQ_MAX + 1 deliveries, and the first question refused to make room for the last */
    assert_int_equal(n_recs, SREQ_MAX + 2);
    refused(SREQ_MAX, "q0");
    assert_non_null(strstr(recs[SREQ_MAX].text, "did not answer in time"));
}

static void a_method_that_is_not_a_string_is_dropped(void **state)
{
    (void)state;
    session_t *a = add_session(0, "A");
    add_call(0, a, NULL, MODE_GET);
    route("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":42}");
    assert_int_equal(n_recs, 0);
    assert_int_equal(child.n_sreqs, 0);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(a_request_reaches_the_one_caller_and_only_its_answer_goes_back),
        T(sessionless_callers_are_told_apart_by_their_tag),
        T(calls_of_two_callers_in_flight_route_nothing),
        T(an_idle_shared_child_has_no_one_to_ask),
        T(a_child_of_one_session_speaks_to_its_get_stream),
        T(a_json_call_in_flight_sends_news_to_the_session_stream),
        T(progress_goes_to_the_call_whose_token_it_names),
        T(list_changes_reach_every_session_and_updates_the_subscribers),
        T(a_caller_that_goes_leaves_its_questions_refused),
        T(the_oldest_unanswered_question_makes_room),
        T(a_method_that_is_not_a_string_is_dropped),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
