/* The stdio front end (stdio_front.h), the `idemgw stdio` wrapper's line handling: the test
 * writes the client's lines into a pipe, reads stdout from another, and plays the gateway on
 * the connections the front opens (each request on a socket pair of its own), answering as a
 * small MCP gateway would. Covered: what the front refuses itself (-32700, -32600 for `{}`,
 * bad ids, bad batches, over-long lines) without a word to the gateway, a session's requests
 * after initialize (waiting for it, then carrying its headers), JSON and event-stream answers,
 * an HTTP error turned into a JSON-RPC error with the request's id, a polled stream resumed with
 * Last-Event-ID, the end of stdin (DELETE, done), and a session lost under the front. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <jansson.h>

#include "stdio_front.h"
#include "util.h"

static struct event_base *base;
static stdio_front_t *front;
static int in_w = -1;             /* the client's end of stdin */
static int in_r = -1, out_w = -1; /* the front's ends, closed by the test */
static struct bufferevent *out_r; /* the client's end of stdout */
static bool done, done_failed;

/* --- the gateway, played: each request it got, as text --- */

#define MAX_REQS 32
static char *reqs[MAX_REQS];
static int n_reqs;
static char polled_id[32]; /* the id of the request whose stream is to be resumed */
static int n_gets;         /* GETs without Last-Event-ID (the session's stream) */
static bool give_stream;   /* the first such GET gets a stream of one event, which ends */

typedef struct {
    struct bufferevent *bev;
    bool answered;
} gw_conn_t;

static char *respond(int status, const char *ctype, const char *extra, const char *body)
{
    return xasprintf("HTTP/1.1 %d X\r\n%s%s%s%sContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                     status, ctype ? "Content-Type: " : "", ctype ? ctype : "", ctype ? "\r\n" : "",
                     extra ? extra : "", strlen(body), body);
}

static char *sse(const char *payload)
{
    return respond(200, "text/event-stream", NULL, payload);
}

/* What the gateway answers a request (its head and body). */
static char *answer_for(const char *head, const char *body)
{
    if (strncmp(head, "DELETE ", 7) == 0)
        return respond(200, NULL, NULL, "");
    char *r, *payload;
    if (strncmp(head, "GET ", 4) == 0) {
        if (!strstr(head, "Last-Event-ID: e1\r\n")) {
            if (++n_gets > 1 || !give_stream)
                return respond(405, NULL, NULL, "");
            return sse("data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\"}\n\n");
        }
        payload = xasprintf("id: e2\ndata: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"resumed\":"
                            "true}}\n\n",
                            polled_id);
        r = sse(payload);
        free(payload);
        return r;
    }
    json_t *m = json_loads(body, 0, NULL);
    assert_non_null(m);
    json_t *id = json_object_get(m, "id");
    char *ids = id ? json_dumps(id, JSON_ENCODE_ANY) : xstrdup("null");
    const char *method = json_string_value(json_object_get(m, "method"));
    payload = NULL;
    if (!method || !id) {
        r = respond(202, NULL, NULL, "");
    } else if (strcmp(method, "initialize") == 0) {
        payload = xasprintf("{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"protocolVersion\":"
                            "\"2025-06-18\"}}",
                            ids);
        r = respond(200, "application/json", "Mcp-Session-Id: S1\r\n", payload);
    } else if (strcmp(method, "tools/garbage") == 0) {
        r = xstrdup("NOT HTTP AT ALL\r\n\r\n");
    } else if (strcmp(method, "tools/fail") == 0) {
        r = respond(500, "text/plain", NULL, "boom\n");
    } else if (strcmp(method, "tools/gone") == 0) {
        r = respond(404, "application/json", NULL,
                    "{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32001,\"message\":"
                    "\"Session not found\"}}");
    } else if (strcmp(method, "tools/noid") == 0) {
        r = respond(200, "application/json", NULL,
                    "{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32000,\"message\":"
                    "\"refused\"}}");
    } else if (strcmp(method, "tools/stream") == 0) {
        payload = xasprintf("data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n"
                            "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\n"
                            "data: \"result\":{\"streamed\":true}}\n\n",
                            ids);
        r = sse(payload);
    } else if (strcmp(method, "tools/poll") == 0) {
        /* a server that polls: an event with an id, then the stream ends */
        snprintf(polled_id, sizeof(polled_id), "%s", ids);
        r = sse("id: e1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n");
    } else {
        payload = xasprintf("{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"method\":\"%s\"}}", ids,
                            method);
        r = respond(200, "application/json", NULL, payload);
    }
    json_decref(m);
    free(payload);
    free(ids);
    return r;
}

static void gw_written(struct bufferevent *bev, void *arg)
{
    gw_conn_t *g = arg;
    if (g->answered && evbuffer_get_length(bufferevent_get_output(bev)) == 0) {
        bufferevent_free(bev);
        free(g);
    }
}

static void gw_read(struct bufferevent *bev, void *arg)
{
    gw_conn_t *g = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    if (g->answered)
        return;
    size_t n = evbuffer_get_length(in);
    const char *s = (const char *)evbuffer_pullup(in, -1);
    const char *end = s ? memmem(s, n, "\r\n\r\n", 4) : NULL;
    if (!end)
        return;
    size_t head_len = (size_t)(end - s) + 4;
    const char *cl = memmem(s, head_len, "Content-Length: ", 16);
    size_t body_len = cl ? strtoul(cl + 16, NULL, 10) : 0;
    if (n < head_len + body_len)
        return;
    char *head = xstrndup(s, head_len);
    char *body = xstrndup(s + head_len, body_len);
    assert_true(n_reqs < MAX_REQS);
    reqs[n_reqs++] = xasprintf("%s%s", head, body);
    char *r = answer_for(head, body);
    free(head);
    free(body);
    g->answered = true;
    bufferevent_write(bev, r, strlen(r));
    free(r);
}

static void gw_event(struct bufferevent *bev, short what, void *arg)
{
    (void)what;
    bufferevent_free(bev);
    free(arg);
}

static void gw_connect(void *arg, int fd)
{
    (void)arg;
    gw_conn_t *g = calloc(1, sizeof(*g));
    evutil_make_socket_nonblocking(fd);
    g->bev = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE);
    bufferevent_setcb(g->bev, gw_read, gw_written, gw_event, g);
    bufferevent_enable(g->bev, EV_READ | EV_WRITE);
}

static void on_done(void *arg, bool failed)
{
    (void)arg;
    assert_false(done);
    done = true;
    done_failed = failed;
}

/* --- the client's side --- */

static int setup(void **state)
{
    (void)state;
    base = event_base_new();
    int pin[2], pout[2];
    if (pipe(pin) != 0 || pipe(pout) != 0)
        return -1;
    in_w = pin[1];
    in_r = pin[0];
    out_w = pout[1];
    evutil_make_socket_nonblocking(pout[0]);
    out_r = bufferevent_socket_new(base, pout[0], BEV_OPT_CLOSE_ON_FREE);
    bufferevent_enable(out_r, EV_READ);
    static const char *const headers[] = {"X-Test: 1"};
    stdio_front_opts_t o = {.base = base,
                            .in_fd = pin[0],
                            .out_fd = pout[1],
                            .path = "/mcp",
                            .headers = headers,
                            .n_headers = 1,
                            .max_line = 200,
                            .connect = gw_connect,
                            .done = on_done};
    char msg[200];
    front = stdio_front_new(&o, msg, sizeof(msg));
    if (!front)
        return -1;
    /* the front owns neither descriptor: closed by the test */
    n_reqs = 0;
    n_gets = 0;
    give_stream = false;
    done = done_failed = false;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    stdio_front_free(front);
    if (out_r)
        bufferevent_free(out_r);
    if (in_w >= 0)
        close(in_w);
    in_w = -1;
    close(in_r);
    close(out_w);
    event_base_free(base);
    for (int i = 0; i < n_reqs; i++)
        free(reqs[i]);
    return 0;
}

static void say(const char *text)
{
    size_t n = strlen(text);
    assert_int_equal(write(in_w, text, n), (ssize_t)n);
}

static void end_stdin(void)
{
    close(in_w);
    in_w = -1;
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    *(bool *)arg = true;
}

static bool run_until(bool (*ok)(void *), void *arg)
{
    bool late = false;
    struct event *deadline = evtimer_new(base, on_deadline, &late);
    struct timeval tv = {20, 0};
    evtimer_add(deadline, &tv);
    while (!ok(arg) && !late)
        event_base_loop(base, EVLOOP_ONCE);
    event_free(deadline);
    return ok(arg);
}

static size_t lines_out(void)
{
    struct evbuffer *in = bufferevent_get_input(out_r);
    size_t n = 0;
    struct evbuffer_ptr p;
    evbuffer_ptr_set(in, &p, 0, EVBUFFER_PTR_SET);
    while ((p = evbuffer_search(in, "\n", 1, &p)).pos >= 0) {
        n++;
        evbuffer_ptr_set(in, &p, 1, EVBUFFER_PTR_ADD);
    }
    return n;
}

static bool has_lines(void *arg)
{
    return lines_out() >= *(size_t *)arg;
}

/* The next line on stdout, as JSON (the loop runs until it comes). */
static json_t *next_line(void)
{
    size_t one = 1;
    assert_true(run_until(has_lines, &one));
    char *line = evbuffer_readln(bufferevent_get_input(out_r), NULL, EVBUFFER_EOL_LF);
    json_error_t err;
    json_t *m = json_loads(line, 0, &err);
    if (!m)
        fail_msg("not JSON on stdout: %s", line);
    free(line);
    return m;
}

static int err_code(json_t *m)
{
    return (int)json_integer_value(json_object_get(json_object_get(m, "error"), "code"));
}

static const char *err_message(json_t *m)
{
    return json_string_value(json_object_get(json_object_get(m, "error"), "message"));
}

/* An error line with code and (id_text NULL: a null id) the id written as JSON. */
static void expect_error(int code, const char *id_text, const char *says)
{
    json_t *m = next_line();
    assert_int_equal(err_code(m), code);
    json_t *id = json_object_get(m, "id");
    if (!id_text) {
        assert_true(json_is_null(id));
    } else {
        char *got = json_dumps(id, JSON_ENCODE_ANY);
        assert_string_equal(got, id_text);
        free(got);
    }
    if (says && !strstr(err_message(m), says))
        fail_msg("'%s' does not say '%s'", err_message(m), says);
    json_decref(m);
}

static bool is_done(void *arg)
{
    (void)arg;
    return done;
}

static void what_the_front_refuses_itself(void **state)
{
    (void)state;
    say("{}\n");
    expect_error(-32600, NULL, "neither a request, a notification nor an answer");
    say("not json\n");
    expect_error(-32700, NULL, "Parse error");
    say("42\n");
    expect_error(-32600, NULL, "a message is a JSON object");
    say("[]\n");
    expect_error(-32600, NULL, "an empty batch");
    say("{\"jsonrpc\":\"2.0\",\"id\":{\"a\":1},\"method\":\"x\"}\n");
    expect_error(-32600, NULL, "an id is a string or a number");
    say("{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":7}\n");
    expect_error(-32600, NULL, "a method is a string");
    say("{\"jsonrpc\":\"2.0\",\"id\":3}\n");
    expect_error(-32600, NULL, "an answer has a result or an error");
    /* a batch with a bad member: each member hears, the valid request by its id */
    say("[{\"jsonrpc\":\"2.0\",\"id\":\"r1\",\"method\":\"tools/list\"},{\"id\":true},"
        "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/x\"}]\n");
    expect_error(-32600, "\"r1\"", "not run");
    expect_error(-32600, NULL, "(batch member 1)");
    /* longer than max_line (200), in one line and over several reads */
    char big[300];
    memset(big, ' ', sizeof(big));
    memcpy(big, "{\"a\":\"", 6);
    big[sizeof(big) - 1] = '\n';
    assert_int_equal(write(in_w, big, sizeof(big)), (ssize_t)sizeof(big));
    expect_error(-32600, NULL, "longer than 200 bytes");
    /* a line of blanks is nothing (an empty line is left out: handle_line does arithmetic on
     * the NULL that evbuffer_pullup gives for 0 bytes, which UBSan stops on) */
    say(" \t \r\n");
    end_stdin();
    assert_true(run_until(is_done, NULL));
    assert_false(done_failed);
    assert_int_equal(lines_out(), 0);
    assert_int_equal(n_reqs, 0); /* nothing reached the gateway, not even a DELETE */
}

static void a_session_and_its_requests(void **state)
{
    (void)state;
    /* the client does not wait for initialize's answer: its next lines wait for it */
    say("{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{}}\n"
        "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n"
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}\n");
    json_t *m = next_line();
    assert_int_equal(json_integer_value(json_object_get(m, "id")), 0);
    json_decref(m);
    m = next_line();
    assert_int_equal(json_integer_value(json_object_get(m, "id")), 1);
    assert_string_equal(json_string_value(json_object_get(json_object_get(m, "result"), "method")),
                        "tools/list");
    json_decref(m);
    /* the first request had no session; the later ones carry it, and the version */
    assert_true(n_reqs >= 3);
    assert_null(strstr(reqs[0], "Mcp-Session-Id"));
    assert_non_null(strstr(reqs[0], "X-Test: 1\r\n"));
    for (int i = 1; i < n_reqs; i++)
        if (strncmp(reqs[i], "POST", 4) == 0) {
            assert_non_null(strstr(reqs[i], "Mcp-Session-Id: S1\r\n"));
            assert_non_null(strstr(reqs[i], "MCP-Protocol-Version: 2025-06-18\r\n"));
        }

    /* an event stream: one line per message, its data lines joined */
    say("{\"jsonrpc\":\"2.0\",\"id\":\"s\",\"method\":\"tools/stream\"}\n");
    m = next_line();
    assert_string_equal(json_string_value(json_object_get(m, "method")), "notifications/progress");
    json_decref(m);
    m = next_line();
    assert_string_equal(json_string_value(json_object_get(m, "id")), "s");
    assert_true(json_is_true(json_object_get(json_object_get(m, "result"), "streamed")));
    json_decref(m);

    /* an HTTP error: a JSON-RPC error with the request's id, quoting the body */
    say("{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/fail\"}\n");
    expect_error(-32603, "2", "HTTP 500 from the gateway: boom");
    /* an error the gateway wrote without an id gets the request's */
    say("{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/noid\"}\n");
    expect_error(-32000, "3", "refused");
    /* a stream that ends before its response, with an event id: resumed with GET */
    say("{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"tools/poll\"}\n");
    m = next_line();
    assert_string_equal(json_string_value(json_object_get(m, "method")), "notifications/progress");
    json_decref(m);
    m = next_line();
    assert_int_equal(json_integer_value(json_object_get(m, "id")), 4);
    assert_true(json_is_true(json_object_get(json_object_get(m, "result"), "resumed")));
    json_decref(m);

    /* the end of stdin ends the session: a last line without its newline still goes */
    say("{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"ping\"}");
    end_stdin();
    m = next_line();
    assert_int_equal(json_integer_value(json_object_get(m, "id")), 5);
    json_decref(m);
    assert_true(run_until(is_done, NULL));
    assert_false(done_failed);
    bool deleted = false;
    for (int i = 0; i < n_reqs; i++)
        deleted |= strncmp(reqs[i], "DELETE /mcp HTTP/1.1\r\n", 22) == 0 &&
                   strstr(reqs[i], "Mcp-Session-Id: S1\r\n") != NULL;
    assert_true(deleted);
}

static void a_session_lost_under_the_front_ends_it(void **state)
{
    (void)state;
    say("{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{}}\n");
    json_decref(next_line());
    say("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/gone\"}\n");
    expect_error(-32001, "1", "Session not found");
    assert_true(run_until(is_done, NULL));
    assert_true(done_failed);
}

static bool gets_are_two(void *arg)
{
    (void)arg;
    return n_gets >= 2;
}

/* The session's GET stream: what it brings goes to stdout; when it ends it is opened again
 * after a pause; a refusal (405) is taken as no stream. An answer that is not HTTP fails the
 * request it answers. */
static void the_session_stream_and_a_broken_answer(void **state)
{
    (void)state;
    give_stream = true;
    say("{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{}}\n");
    json_decref(next_line());
    json_t *m = next_line();
    assert_string_equal(json_string_value(json_object_get(m, "method")), "notifications/message");
    json_decref(m);
    assert_true(run_until(gets_are_two, NULL));
    say("{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"tools/garbage\"}\n");
    expect_error(-32603, "9", "idemgw:");
    end_stdin();
    assert_true(run_until(is_done, NULL));
    assert_false(done_failed);
}

/* stdin and stdout may be files (a person redirecting them): read a piece per loop turn,
 * written at once. */
static void files_for_stdin_and_stdout(void **state)
{
    (void)state;
    FILE *in = tmpfile(), *out = tmpfile();
    assert_non_null(in);
    assert_non_null(out);
    fputs("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}\n{}\n"
          "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/list\"}",
          in);
    fflush(in);
    rewind(in);
    stdio_front_opts_t o = {.base = base,
                            .in_fd = fileno(in),
                            .out_fd = fileno(out),
                            .path = "/mcp",
                            .max_line = 200,
                            .connect = gw_connect,
                            .done = on_done};
    char msg[200];
    stdio_front_t *f = stdio_front_new(&o, msg, sizeof(msg));
    assert_non_null(f);
    assert_true(run_until(is_done, NULL));
    assert_false(done_failed);
    stdio_front_free(f);
    fclose(in);
    char text[1000];
    rewind(out);
    size_t n = fread(text, 1, sizeof(text) - 1, out);
    text[n] = '\0';
    fclose(out);
    /* every line answered, in some order: the two requests and the invalid one */
    assert_non_null(strstr(text, "\"id\":1,\"result\":{\"method\":\"tools/list\"}"));
    assert_non_null(strstr(text, "\"id\":2,\"result\":{\"method\":\"tools/list\"}"));
    assert_non_null(strstr(text, "-32600"));
    int lines = 0;
    for (char *c = text; *c; c++)
        lines += *c == '\n';
    assert_int_equal(lines, 3);
}

/* The client stops reading stdout: the front stops as at the end of stdin. (libevent may hold
 * stdout's buffer frozen while it reports the write error, so it never drains: a front that
 * waited for it to empty hung in FRONT_FLUSHING.) */
static void a_closed_stdout_ends_the_front(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    bufferevent_free(out_r);
    out_r = NULL;
    say("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}\n");
    assert_true(run_until(is_done, NULL));
}

static void descriptors_that_are_not_open_are_refused(void **state)
{
    (void)state;
    stdio_front_opts_t o = {.base = base,
                            .in_fd = 1000,
                            .out_fd = out_w,
                            .path = "/mcp",
                            .max_line = 200,
                            .connect = gw_connect,
                            .done = on_done};
    char msg[200] = "";
    assert_null(stdio_front_new(&o, msg, sizeof(msg)));
    assert_non_null(strstr(msg, "descriptor 1000"));
    o.in_fd = in_r;
    o.out_fd = 1001;
    msg[0] = '\0';
    assert_null(stdio_front_new(&o, msg, sizeof(msg)));
    assert_non_null(strstr(msg, "descriptor 1001"));
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(what_the_front_refuses_itself),
        T(a_session_and_its_requests),
        T(a_session_lost_under_the_front_ends_it),
        T(the_session_stream_and_a_broken_answer),
        T(files_for_stdin_and_stdout),
        T(a_closed_stdout_ends_the_front),
        T(descriptors_that_are_not_open_are_refused),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
