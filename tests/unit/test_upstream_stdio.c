/* The stdio upstream (upstream_stdio.h) driving a real child: tests/fixtures/unit-stdio.sh, a
 * small sh server whose tools echo, ask the client a question, die or hang. Requests go in as
 * the exchange would send them (upstream_open) and the answers are read from the callbacks,
 * on a libevent loop of the test's: sessions per child and shared, a call answered as JSON and
 * as an event stream, a server's request answered by its caller only, a child that dies with a
 * call in flight, a child that never answers initialize, one that cannot start, and the
 * requests refused before any child hears of them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <jansson.h>

#include "http_headers.h"
#include "upstream.h"
#include "upstream_stdio.h"
#include "util.h"

#define SERVER "tests/fixtures/unit-stdio.sh"

static struct event_base *base;
static upstream_limits_t limits = {.timeout_ms = 10000, .idle_timeout_ms = 10000};

/* --- one call's answer, as the owner hears it --- */

typedef struct {
    int status;
    int heads;
    char session[128];
    char retry_after[16];
    char content_type[64];
    struct evbuffer *body;
    bool ended;
    upstream_result_t res;
    upstream_call_t *call;
    char *text;
} answer_t;

static void on_head(void *arg, int status, const http_headers_t *h)
{
    answer_t *a = arg;
    a->status = status;
    a->heads++;
    const char *v = http_headers_get(h, "mcp-session-id");
    snprintf(a->session, sizeof(a->session), "%s", v ? v : "");
    v = http_headers_get(h, "retry-after");
    snprintf(a->retry_after, sizeof(a->retry_after), "%s", v ? v : "");
    v = http_headers_get(h, "content-type");
    snprintf(a->content_type, sizeof(a->content_type), "%s", v ? v : "");
}

static void on_body(void *arg, const char *data, size_t len)
{
    answer_t *a = arg;
    assert_int_equal(a->heads, 1);
    evbuffer_add(a->body, data, len);
}

static void on_end(void *arg, upstream_result_t res)
{
    answer_t *a = arg;
    assert_false(a->ended);
    a->ended = true;
    a->res = res;
}

static const upstream_cbs_t cbs = {on_head, on_body, on_end};

static answer_t *answer_new(void)
{
    answer_t *a = calloc(1, sizeof(*a));
    a->body = evbuffer_new();
    return a;
}

static void answer_free(answer_t *a)
{
    evbuffer_free(a->body);
    free(a->text);
    free(a);
}

/* The body so far as a string (valid until the next call). */
static const char *body_of(answer_t *a)
{
    size_t n = evbuffer_get_length(a->body);
    free(a->text);
    a->text = malloc(n + 1);
    evbuffer_copyout(a->body, a->text, n);
    a->text[n] = '\0';
    return a->text;
}

/* Sends a request; session NULL: none; sse: the agent accepts an event stream. */
static answer_t *send_req(upstream_t *u, const char *method, const char *target,
                          const char *session, const char *caller, bool sse, const char *body)
{
    answer_t *a = answer_new();
    char extra[300];
    snprintf(extra, sizeof(extra), "Accept: %s\r\n%s%s%s",
             sse ? "application/json, text/event-stream" : "application/json",
             session ? "Mcp-Session-Id: " : "", session ? session : "", session ? "\r\n" : "");
    struct evbuffer *b = evbuffer_new();
    if (body)
        evbuffer_add(b, body, strlen(body));
    upstream_request_t req = {.method = method,
                              .target = target,
                              .extra_headers = extra,
                              .body = b,
                              .has_body = body != NULL,
                              .caller = caller};
    a->call = upstream_open(u, &req, &cbs, a);
    assert_non_null(a->call);
    assert_false(a->ended); /* never from inside open */
    assert_int_equal(evbuffer_get_length(b), 0);
    evbuffer_free(b);
    return a;
}

static answer_t *post(upstream_t *u, const char *session, bool sse, const char *body)
{
    return send_req(u, "POST", "/mcp", session, NULL, sse, body);
}

/* --- the loop, run until what a test waits for has happened --- */

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    *(bool *)arg = true;
}

static bool run_until(bool (*done)(void *), void *arg)
{
    bool late = false;
    struct event *deadline = evtimer_new(base, on_deadline, &late);
    struct timeval tv = {20, 0};
    evtimer_add(deadline, &tv);
    while (!done(arg) && !late)
        event_base_loop(base, EVLOOP_ONCE);
    event_free(deadline);
    return done(arg);
}

static bool is_ended(void *arg)
{
    return ((answer_t *)arg)->ended;
}

static void wait_end(answer_t *a)
{
    assert_true(run_until(is_ended, a));
}

typedef struct {
    answer_t *a;
    const char *needle;
} seek_t;

static bool body_has(void *arg)
{
    seek_t *s = arg;
    return strstr(body_of(s->a), s->needle) != NULL;
}

static void wait_body(answer_t *a, const char *needle)
{
    seek_t s = {a, needle};
    assert_true(run_until(body_has, &s));
}

typedef struct {
    upstream_t *u;
    int n;
} kids_t;

static bool kids_are(void *arg)
{
    kids_t *k = arg;
    return upstream_stdio_children(k->u) == k->n;
}

static void wait_children(upstream_t *u, int n)
{
    kids_t k = {u, n};
    assert_true(run_until(kids_are, &k));
}

/* --- the upstream --- */

static upstream_t *open_up(const char *arg, int sessions, uint64_t start_timeout_ms)
{
    char *argv[] = {SERVER, (char *)arg, NULL};
    stdio_conf_t conf = {.argv = argv,
                         .argc = arg ? 2 : 1,
                         .sessions = sessions,
                         .max_children = 4,
                         .idle_timeout_ms = 600000,
                         .grace_ms = 2000,
                         .start_timeout_ms = start_timeout_ms};
    upstream_stdio_opts_t o = {.base = base,
                               .conf = &conf,
                               .path = "/mcp",
                               .limits = &limits,
                               .max_line = 65536,
                               .server = "unit"};
    upstream_t *u = upstream_stdio_new(&o);
    assert_non_null(u);
    assert_true(upstream_wants_caller(u));
    return u;
}

static const char *init_body =
    "{\"jsonrpc\":\"2.0\",\"id\":\"init-1\",\"method\":\"initialize\",\"params\":{"
    "\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},\"clientInfo\":{\"name\":\"t\","
    "\"version\":\"1\"}}}";

/* initialize answered 200 with a session: its id, copied into sid */
static void initialize(upstream_t *u, char *sid, size_t sidlen)
{
    answer_t *a = post(u, NULL, true, init_body);
    wait_end(a);
    assert_int_equal(a->res, UPSTREAM_OK);
    assert_int_equal(a->status, 200);
    assert_string_equal(a->content_type, "application/json");
    json_t *m = json_loads(body_of(a), 0, NULL);
    assert_non_null(m);
    assert_string_equal(json_string_value(json_object_get(m, "id")), "init-1");
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_object_get(m, "result"), "serverInfo"), "name")),
                        "unit");
    json_decref(m);
    assert_true(strlen(a->session) > 0);
    snprintf(sid, sidlen, "%s", a->session);
    answer_free(a);
}

static char *call_body(const char *id, const char *tool, const char *text)
{
    return xasprintf("{\"jsonrpc\":\"2.0\",\"id\":%s,\"method\":\"tools/call\",\"params\":{"
                     "\"name\":\"%s\",\"arguments\":{\"text\":\"%s\"}}}",
                     id, tool, text);
}

static int setup(void **state)
{
    (void)state;
    base = event_base_new();
    return base ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    event_base_free(base);
    return 0;
}

static void a_session_calls_as_json_and_as_a_stream_then_ends(void **state)
{
    (void)state;
    upstream_t *u = open_up(NULL, STDIO_PER_SESSION, 10000);
    char sid[128];
    initialize(u, sid, sizeof(sid));
    assert_int_equal(upstream_stdio_children(u), 1);

    char *b = call_body("7", "echo", "hello");
    answer_t *a = post(u, sid, false, b);
    free(b);
    wait_end(a);
    assert_int_equal(a->res, UPSTREAM_OK);
    assert_int_equal(a->status, 200);
    assert_string_equal(a->session, sid);
    assert_string_equal(body_of(a), "{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"content\":[{"
                                    "\"type\":\"text\",\"text\":\"hello\"}]}}");
    answer_free(a);

    /* the agent's id is its own even when it is a string the child never saw */
    b = call_body("\"x-1\"", "echo", "again");
    a = post(u, sid, true, b);
    free(b);
    wait_end(a);
    assert_int_equal(a->res, UPSTREAM_OK);
    assert_string_equal(a->content_type, "text/event-stream");
    assert_non_null(
        strstr(body_of(a), "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":\"x-1\","));
    assert_non_null(strstr(body_of(a), "\"text\":\"again\""));
    answer_free(a);

    /* notifications alone: 202 */
    a = post(u, sid, true, "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}");
    wait_end(a);
    assert_int_equal(a->status, 202);
    answer_free(a);

    a = send_req(u, "DELETE", "/mcp", sid, NULL, true, NULL);
    wait_end(a);
    assert_int_equal(a->status, 200);
    answer_free(a);
    wait_children(u, 0);

    b = call_body("8", "echo", "late");
    a = post(u, sid, false, b);
    free(b);
    wait_end(a);
    assert_int_equal(a->status, 404);
    answer_free(a);
    upstream_free(u);
}

static void a_child_that_dies_ends_its_call_in_flight_and_its_session(void **state)
{
    (void)state;
    upstream_t *u = open_up(NULL, STDIO_PER_SESSION, 10000);
    char sid[128];
    initialize(u, sid, sizeof(sid));
    char *b = call_body("1", "die", "");
    answer_t *a = post(u, sid, true, b);
    free(b);
    wait_end(a);
    assert_int_equal(a->res, UPSTREAM_ERR_CLOSED);
    answer_free(a);
    wait_children(u, 0);

    b = call_body("2", "echo", "x");
    a = post(u, sid, false, b);
    free(b);
    wait_end(a);
    assert_int_equal(a->status, 404);
    answer_free(a);
    upstream_free(u);
}

static void a_child_silent_at_start_is_given_up_with_503(void **state)
{
    (void)state;
    upstream_t *u = open_up("mute", STDIO_PER_SESSION, 300);
    answer_t *a = post(u, NULL, true, init_body);
    wait_end(a);
    assert_int_equal(a->res, UPSTREAM_OK);
    assert_int_equal(a->status, 503);
    assert_string_equal(a->retry_after, "5");
    assert_string_equal(a->session, "");
    json_t *m = json_loads(body_of(a), 0, NULL);
    assert_non_null(m);
    assert_string_equal(json_string_value(json_object_get(m, "id")), "init-1");
    const char *msg = json_string_value(json_object_get(json_object_get(m, "error"), "message"));
    assert_non_null(strstr(msg, "no answer to initialize"));
    /* what it wrote on stderr says more */
    assert_non_null(strstr(msg, "unit-stdio: started"));
    json_decref(m);
    answer_free(a);
    wait_children(u, 0);
    upstream_free(u);
}

static void a_program_that_cannot_start_answers_503(void **state)
{
    (void)state;
    char *argv[] = {"/nonexistent/idemgw-unit-server", NULL};
    stdio_conf_t conf = {.argv = argv,
                         .argc = 1,
                         .max_children = 2,
                         .grace_ms = 1000,
                         .idle_timeout_ms = 600000,
                         .start_timeout_ms = 5000};
    upstream_stdio_opts_t o = {.base = base, .conf = &conf, .limits = &limits};
    upstream_t *u = upstream_stdio_new(&o);
    answer_t *a = post(u, NULL, true, init_body);
    wait_end(a);
    assert_int_equal(a->status, 503);
    assert_non_null(strstr(body_of(a), "cannot start"));
    answer_free(a);
    assert_int_equal(upstream_stdio_children(u), 0);
    upstream_free(u);
}

static void the_server_asks_and_only_the_caller_asked_may_answer(void **state)
{
    (void)state;
    upstream_t *u = open_up(NULL, STDIO_SHARED, 10000);
    char sa[128], sb[128];
    initialize(u, sa, sizeof(sa));
    initialize(u, sb, sizeof(sb));
    assert_string_not_equal(sa, sb);
    assert_int_equal(upstream_stdio_children(u), 1); /* one child for both */

    char *b = call_body("3", "ask", "");
    answer_t *asking = post(u, sa, true, b);
    free(b);
    wait_body(asking, "roots/list");
    const char *want = "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"roots/list\"}";
    assert_non_null(strstr(body_of(asking), want));
    assert_false(asking->ended);

    const char *reply = "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"roots\":[]}}";
    answer_t *a = post(u, sb, true, reply); /* the other session: refused */
    wait_end(a);
    assert_int_equal(a->status, 400);
    assert_non_null(strstr(body_of(a), "-32600"));
    answer_free(a);

    a = post(u, sa, true, reply);
    wait_end(a);
    assert_int_equal(a->status, 202);
    answer_free(a);
    wait_end(asking);
    assert_int_equal(asking->res, UPSTREAM_OK);
    assert_non_null(strstr(body_of(asking), "\"id\":3,\"result\":{\"content\":[{\"type\":\"text\","
                                            "\"text\":\"asked\"}]}"));
    answer_free(asking);

    /* a caller without a session uses the shared child */
    b = call_body("4", "echo", "nosession");
    a = send_req(u, "POST", "/mcp", NULL, "caller-tag", false, b);
    free(b);
    wait_end(a);
    assert_int_equal(a->status, 200);
    assert_non_null(strstr(body_of(a), "nosession"));
    assert_string_equal(a->session, "");
    answer_free(a);
    assert_int_equal(upstream_stdio_children(u), 1);
    upstream_free(u);
}

static void a_sessionless_caller_gets_a_child_of_its_own(void **state)
{
    (void)state;
    upstream_t *u = open_up(NULL, STDIO_PER_SESSION, 10000);
    char *b = call_body("1", "echo", "mine");
    answer_t *a = send_req(u, "POST", "/mcp", NULL, "tag-a", false, b);
    free(b);
    wait_end(a);
    assert_int_equal(a->status, 200);
    assert_string_equal(a->session, ""); /* its session is named by no header */
    assert_non_null(strstr(body_of(a), "\"id\":1,"));
    assert_non_null(strstr(body_of(a), "mine"));
    answer_free(a);
    assert_int_equal(upstream_stdio_children(u), 1);
    b = call_body("2", "echo", "theirs");
    a = send_req(u, "POST", "/mcp", NULL, "tag-b", false, b);
    free(b);
    wait_end(a);
    assert_int_equal(a->status, 200);
    answer_free(a);
    assert_int_equal(upstream_stdio_children(u), 2);
    upstream_free(u);
}

static void an_abandoned_call_hears_nothing_more(void **state)
{
    (void)state;
    upstream_t *u = open_up(NULL, STDIO_PER_SESSION, 10000);
    char sid[128];
    initialize(u, sid, sizeof(sid));
    char *b = call_body("1", "hang", "");
    answer_t *a = post(u, sid, true, b);
    free(b);
    /* the stream's head comes at once; the answer never does */
    answer_t *probe = post(u, sid, false, "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/x\"}");
    wait_end(probe);
    answer_free(probe);
    assert_int_equal(a->heads, 1);
    upstream_abandon(u, a->call);
    /* the child dies now: nothing reaches the abandoned call */
    b = call_body("2", "die", "");
    answer_t *d = post(u, sid, false, b);
    free(b);
    wait_end(d);
    assert_int_equal(d->res, UPSTREAM_ERR_CLOSED);
    answer_free(d);
    assert_false(a->ended);
    answer_free(a);
    upstream_free(u);
}

static void requests_refused_before_any_child_hears_them(void **state)
{
    (void)state;
    upstream_t *u = open_up(NULL, STDIO_PER_SESSION, 10000);
    static const struct {
        const char *method, *target, *session, *body;
        int status;
        const char *says;
    } cases[] = {
        {"POST", "/other", NULL, "{}", 404, "Not Found"},
        {"PUT", "/mcp", NULL, NULL, 405, "Method Not Allowed"},
        {"GET", "/mcp", NULL, NULL, 405, "no session"},
        {"GET", "/mcp", "nope", NULL, 404, "Session not found"},
        {"DELETE", "/mcp", "nope", NULL, 404, "Session not found"},
        {"POST", "/mcp", NULL, "not json", 400, "-32700"},
        {"POST", "/mcp", NULL, "[]", 400, "-32700"},
        {"POST", "/mcp", NULL, "{}", 400, "-32600"},
        {"POST", "/mcp", NULL, "{\"jsonrpc\":\"2.0\",\"method\":5}", 400, "-32600"},
        {"POST", "/mcp", NULL,
         "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\"},{\"jsonrpc\":\"2.0\","
         "\"method\":\"notifications/x\"}]",
         400, "initialize must be sent alone"},
        {"POST", "/mcp", "nope", "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}", 404,
         "Session not found"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        answer_t *a = send_req(u, cases[i].method, cases[i].target, cases[i].session, NULL, true,
                               cases[i].body);
        wait_end(a);
        if (a->status != cases[i].status || !strstr(body_of(a), cases[i].says))
            fail_msg("case %zu: %d %s", i, a->status, body_of(a));
        answer_free(a);
    }
    assert_int_equal(upstream_stdio_children(u), 0);
    upstream_free(u);
}

static void a_get_stream_carries_the_session_news_and_a_second_replaces_it(void **state)
{
    (void)state;
    upstream_t *u = open_up(NULL, STDIO_PER_SESSION, 10000);
    char sid[128];
    initialize(u, sid, sizeof(sid));
    answer_t *g1 = send_req(u, "GET", "/mcp", sid, NULL, true, NULL);
    answer_t *g2 = send_req(u, "GET", "/mcp", sid, NULL, true, NULL);
    wait_end(g1); /* replaced: ended cleanly */
    assert_int_equal(g1->res, UPSTREAM_OK);
    assert_false(g2->ended);
    assert_int_equal(g2->status, 200);
    assert_string_equal(g2->content_type, "text/event-stream");
    /* the session ends: its stream with it */
    answer_t *d = send_req(u, "DELETE", "/mcp", sid, NULL, true, NULL);
    wait_end(d);
    wait_end(g2);
    answer_free(d);
    answer_free(g1);
    answer_free(g2);
    upstream_free(u);
}

/* The agent cancels a call: the child hears of it under the id it saw, and its answer (an
 * error here) reaches the call under the agent's id. Another session's cancel names nothing. */
static void a_cancel_reaches_the_child_under_its_own_id(void **state)
{
    (void)state;
    upstream_t *u = open_up(NULL, STDIO_SHARED, 10000);
    char sa[128], sb[128];
    initialize(u, sa, sizeof(sa));
    initialize(u, sb, sizeof(sb));
    char *b = call_body("\"mine\"", "hang", "");
    answer_t *a = post(u, sa, true, b);
    free(b);
    const char *cancel = "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{"
                         "\"requestId\":\"mine\"}}";
    answer_t *other = post(u, sb, true, cancel);
    wait_end(other);
    assert_int_equal(other->status, 202);
    answer_free(other);
    assert_false(a->ended);
    answer_t *c = post(u, sa, true, cancel);
    wait_end(c);
    assert_int_equal(c->status, 202);
    answer_free(c);
    wait_end(a);
    assert_int_equal(a->res, UPSTREAM_OK);
    assert_non_null(strstr(body_of(a), "\"id\":\"mine\",\"error\":{\"code\":-32800"));
    answer_free(a);
    upstream_free(u);
}

static void progress_comes_under_the_agents_token(void **state)
{
    (void)state;
    upstream_t *u = open_up(NULL, STDIO_PER_SESSION, 10000);
    char sid[128];
    initialize(u, sid, sizeof(sid));
    answer_t *a = post(u, sid, true,
                       "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/call\",\"params\":{"
                       "\"name\":\"progress\",\"arguments\":{},\"_meta\":{\"progressToken\":"
                       "\"tok-9\"}}}");
    wait_end(a);
    assert_int_equal(a->res, UPSTREAM_OK);
    const char *got = body_of(a);
    const char *p = strstr(got, "\"progressToken\":\"tok-9\"");
    const char *r = strstr(got, "\"id\":5,\"result\"");
    assert_non_null(p);
    assert_non_null(r);
    assert_true(p < r);
    answer_free(a);
    upstream_free(u);
}

static void a_refused_initialize_leaves_no_session(void **state)
{
    (void)state;
    upstream_t *u = open_up("refuse", STDIO_PER_SESSION, 10000);
    answer_t *a = post(u, NULL, true, init_body);
    wait_end(a);
    assert_int_equal(a->status, 200);
    assert_string_equal(a->session, "");
    assert_non_null(strstr(body_of(a), "\"id\":\"init-1\",\"error\""));
    answer_free(a);
    wait_children(u, 0);
    upstream_free(u);
}

static void a_silent_answer_times_out(void **state)
{
    (void)state;
    upstream_t *u = open_up(NULL, STDIO_PER_SESSION, 10000);
    char sid[128];
    initialize(u, sid, sizeof(sid));
    limits.idle_timeout_ms = 200;
    char *b = call_body("1", "hang", "");
    answer_t *json = post(u, sid, false, b);
    answer_t *sse = post(u, sid, true, b);
    free(b);
    wait_end(json);
    wait_end(sse);
    limits.idle_timeout_ms = 10000;
    assert_int_equal(json->res, UPSTREAM_ERR_HEAD_TIMEOUT);
    assert_int_equal(json->heads, 0);
    assert_int_equal(sse->res, UPSTREAM_ERR_IDLE_TIMEOUT);
    assert_int_equal(sse->heads, 1);
    answer_free(json);
    answer_free(sse);
    upstream_free(u);
}

/* At max_children, a new session ends the idle session of longest standing. */
static void the_oldest_idle_session_makes_room(void **state)
{
    (void)state;
    char *argv[] = {SERVER, NULL};
    stdio_conf_t conf = {.argv = argv,
                         .argc = 1,
                         .max_children = 1,
                         .idle_timeout_ms = 600000,
                         .grace_ms = 2000,
                         .start_timeout_ms = 10000};
    upstream_stdio_opts_t o = {.base = base, .conf = &conf, .limits = &limits};
    upstream_t *u = upstream_stdio_new(&o);
    char sa[128], sb[128];
    initialize(u, sa, sizeof(sa));
    initialize(u, sb, sizeof(sb));
    char *b = call_body("1", "echo", "x");
    answer_t *a = post(u, sa, false, b);
    wait_end(a);
    assert_int_equal(a->status, 404);
    answer_free(a);
    a = post(u, sb, false, b);
    wait_end(a);
    assert_int_equal(a->status, 200);
    answer_free(a);
    free(b);
    upstream_free(u);
}

static void an_idle_session_is_ended(void **state)
{
    (void)state;
    char *argv[] = {SERVER, NULL};
    stdio_conf_t conf = {.argv = argv,
                         .argc = 1,
                         .max_children = 2,
                         .idle_timeout_ms = 300,
                         .grace_ms = 2000,
                         .start_timeout_ms = 10000};
    upstream_stdio_opts_t o = {.base = base, .conf = &conf, .limits = &limits};
    upstream_t *u = upstream_stdio_new(&o);
    char sid[128];
    initialize(u, sid, sizeof(sid));
    assert_int_equal(upstream_stdio_children(u), 1);
    wait_children(u, 0);
    char *b = call_body("1", "echo", "x");
    answer_t *a = post(u, sid, false, b);
    free(b);
    wait_end(a);
    assert_int_equal(a->status, 404);
    answer_free(a);
    upstream_free(u);
}

/* A paused call hears nothing until it is resumed, then all of it. */
static void a_paused_call_waits_for_its_owner(void **state)
{
    (void)state;
    upstream_t *u = open_up(NULL, STDIO_PER_SESSION, 10000);
    char sid[128];
    initialize(u, sid, sizeof(sid));
    char *b = call_body("1", "echo", "held");
    answer_t *a = post(u, sid, true, b);
    free(b);
    upstream_pause(u, a->call, true);
    /* the child answers in order: once the next call is answered, so was this one */
    b = call_body("2", "echo", "next");
    answer_t *n = post(u, sid, true, b);
    free(b);
    wait_end(n);
    answer_free(n);
    assert_int_equal(a->heads, 0);
    assert_false(a->ended);
    upstream_pause(u, a->call, false);
    wait_end(a);
    assert_int_equal(a->heads, 1);
    assert_non_null(strstr(body_of(a), "held"));
    answer_free(a);
    upstream_free(u);
}

/* A batch of requests is answered as one JSON array. */
static void a_batch_is_answered_as_an_array(void **state)
{
    (void)state;
    upstream_t *u = open_up(NULL, STDIO_PER_SESSION, 10000);
    char sid[128];
    initialize(u, sid, sizeof(sid));
    char *b1 = call_body("1", "echo", "one"), *b2 = call_body("2", "echo", "two");
    char *batch = xasprintf("[%s,%s]", b1, b2);
    answer_t *a = post(u, sid, false, batch);
    free(b1);
    free(b2);
    free(batch);
    wait_end(a);
    json_t *m = json_loads(body_of(a), 0, NULL);
    assert_true(json_is_array(m));
    assert_int_equal(json_array_size(m), 2);
    json_decref(m);
    answer_free(a);
    upstream_free(u);
}

static void a_program_is_found_on_path(void **state)
{
    (void)state;
    char *p = upstream_stdio_resolve("sh", "/nonexistent:/usr/bin:/bin");
    assert_non_null(p);
    assert_true(strlen(p) > 3 && strcmp(p + strlen(p) - 3, "/sh") == 0);
    free(p);
    assert_null(upstream_stdio_resolve("idemgw-no-such-program", "/usr/bin:/bin"));
    p = upstream_stdio_resolve("./x/y", "/usr/bin");
    assert_string_equal(p, "./x/y");
    free(p);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(a_session_calls_as_json_and_as_a_stream_then_ends),
        T(a_child_that_dies_ends_its_call_in_flight_and_its_session),
        T(a_child_silent_at_start_is_given_up_with_503),
        T(a_program_that_cannot_start_answers_503),
        T(the_server_asks_and_only_the_caller_asked_may_answer),
        T(a_sessionless_caller_gets_a_child_of_its_own),
        T(an_abandoned_call_hears_nothing_more),
        T(requests_refused_before_any_child_hears_them),
        T(a_get_stream_carries_the_session_news_and_a_second_replaces_it),
        T(a_cancel_reaches_the_child_under_its_own_id),
        T(progress_comes_under_the_agents_token),
        T(a_refused_initialize_leaves_no_session),
        T(a_silent_answer_times_out),
        T(the_oldest_idle_session_makes_room),
        T(an_idle_session_is_ended),
        T(a_paused_call_waits_for_its_owner),
        T(a_batch_is_answered_as_an_array),
        T(a_program_is_found_on_path),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
