/* The gateway as an MCP client of its upstream, on a real loop towards a small MCP server on
 * loopback that the test scripts: initialize, notifications/initialized, every tools/list
 * page, the session's DELETE; then each way the server can fail it, named in the error the
 * caller gets. Also the commands' options (catalog_cli_parse) and catalog_fetch_now against
 * an upstream that is not there. */
#include "catalog.h"
#include "catalog_fetch.h"
#include "config.h"
#include "upstream_http.h"
#include "util.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <jansson.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "capture.h"

static struct event_base *base;
static struct evconnlistener *listener;
static int port;
static upstream_limits_t up_limits = {1000, 2000, 2000, 1};
static upstream_pool_t *pool;
static upstream_t *upstream; /* over pool */
static config_t *cfg;
static catalog_t *catalog;

/* --- the server: one answer per request, by the JSON-RPC method it carries --- */

#define MAX_SEEN 8
static struct {
    /* the script */
    int init_status;         /* HTTP status of initialize's answer */
    const char *init_json;   /* its JSON-RPC response with %d for the id, or NULL: a good one */
    bool no_session;         /* no Mcp-Session-Id */
    int initialized_status;  /* the notification's answer */
    bool endless;            /* every page has a next cursor */
    bool sse;                /* tools/list answered as an event stream */
    const char *list_result; /* a page's result instead of the script's pages */
    /* what it saw */
    int n;
    char heads[MAX_SEEN][1024];
    char methods[MAX_SEEN][64]; /* JSON-RPC method, or the HTTP method when no body */
    char last_method[64];
    char cursors[MAX_SEEN][32];
} srv;

static void srv_written(struct bufferevent *bev, void *arg)
{
    bufferevent_free(bev);
}

static void srv_event(struct bufferevent *bev, short what, void *arg)
{
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
        bufferevent_free(bev);
}

static void answer(struct bufferevent *bev, int status, const char *extra, const char *type,
                   const char *body)
{
    evbuffer_add_printf(bufferevent_get_output(bev),
                        "HTTP/1.1 %d X\r\n%sContent-Type: %s\r\nContent-Length: %zu\r\n"
                        "Connection: close\r\n\r\n%s",
                        status, extra, type, strlen(body), body);
    bufferevent_setcb(bev, NULL, srv_written, srv_event, NULL);
}

static void srv_read(struct bufferevent *bev, void *arg)
{
    struct evbuffer *in = bufferevent_get_input(bev);
    struct evbuffer_ptr end = evbuffer_search(in, "\r\n\r\n", 4, NULL);
    if (end.pos < 0)
        return;
    size_t head_len = (size_t)end.pos + 4;
    char *head = xstrndup((const char *)evbuffer_pullup(in, (ssize_t)head_len), head_len);
    const char *cl = strcasestr(head, "\r\nContent-Length: ");
    size_t body_len = cl ? strtoul(cl + 18, NULL, 10) : 0;
    if (evbuffer_get_length(in) < head_len + body_len) {
        free(head);
        return;
    }
    evbuffer_drain(in, head_len);
    json_t *req =
        json_loadb((const char *)evbuffer_pullup(in, (ssize_t)body_len), body_len, 0, NULL);
    evbuffer_drain(in, body_len);
    char method[64] = "";
    const char *rpc_method = json_string_value(json_object_get(req, "method"));
    if (rpc_method)
        snprintf(method, sizeof(method), "%s", rpc_method);
    else
        sscanf(head, "%63s", method);
    const char *cursor =
        json_string_value(json_object_get(json_object_get(req, "params"), "cursor"));
    int i = srv.n++;
    snprintf(srv.last_method, sizeof(srv.last_method), "%s", method);
    if (i < MAX_SEEN) { /* the first requests are kept, every one is counted */
        snprintf(srv.heads[i], sizeof(srv.heads[i]), "%s", head);
        snprintf(srv.methods[i], sizeof(srv.methods[i]), "%s", method);
        snprintf(srv.cursors[i], sizeof(srv.cursors[i]), "%s", cursor ? cursor : "");
    }
    free(head);
    bool first_page = cursor == NULL;
    int id = (int)json_integer_value(json_object_get(req, "id"));
    json_decref(req);

    char body[1024];
    if (strcmp(method, "initialize") == 0) {
        snprintf(body, sizeof(body),
                 srv.init_json ? srv.init_json
                               : "{\"jsonrpc\":\"2.0\",\"id\":%d,\"result\":{\"protocolVersion\":"
                                 "\"2025-03-26\",\"capabilities\":{\"tools\":{}}}}",
                 id);
        answer(bev, srv.init_status, srv.no_session ? "" : "Mcp-Session-Id: sess-1\r\n",
               "application/json", body);
    } else if (strcmp(method, "notifications/initialized") == 0) {
        answer(bev, srv.initialized_status, "", "application/json", "");
    } else if (strcmp(method, "tools/list") == 0) {
        const char *result =
            srv.list_result ? srv.list_result
            : srv.endless   ? "{\"tools\":[],\"nextCursor\":\"again\"}"
            : first_page ? "{\"tools\":[{\"name\":\"a\"},{\"name\":\"b\"}],\"nextCursor\":\"p2\"}"
                         : "{\"tools\":[{\"name\":\"c\",\"annotations\":{\"readOnlyHint\":true}}]}";
        int n = snprintf(body, sizeof(body), "{\"jsonrpc\":\"2.0\",\"id\":%d,\"result\":%s}", id,
                         result);
        if (srv.sse) {
            char sse[1200];
            snprintf(sse, sizeof(sse), "event: message\ndata: %.*s\n\n", n, body);
            answer(bev, 200, "", "text/event-stream", sse);
        } else {
            answer(bev, 200, "", "application/json", body);
        }
    } else {
        answer(bev, 200, "", "application/json", ""); /* DELETE */
    }
}

static void srv_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len,
                       void *arg)
{
    struct bufferevent *bev = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE);
    bufferevent_setcb(bev, srv_read, NULL, srv_event, NULL);
    bufferevent_enable(bev, EV_READ | EV_WRITE);
}

/* --- set-up --- */

static int setup(void **state)
{
    base = event_base_new();
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    listener =
        evconnlistener_new_bind(base, srv_accept, NULL, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE,
                                16, (struct sockaddr *)&sin, sizeof(sin));
    assert_non_null(listener);
    struct sockaddr_in bound;
    socklen_t bl = sizeof(bound);
    getsockname(evconnlistener_get_fd(listener), (struct sockaddr *)&bound, &bl);
    port = ntohs(bound.sin_port);
    upstream_opts_t uo = {
        .base = base, .host = "127.0.0.1", .port = (unsigned)port, .limits = &up_limits};
    char msg[200];
    pool = upstream_pool_new(&uo, msg, sizeof(msg));
    assert_non_null(pool);
    upstream = upstream_http_new(pool, "127.0.0.1:1");
    config_errors_t errs = {0};
    cfg = config_load_string("t.yaml", "upstream: http://127.0.0.1:9/mcp\n", &errs);
    assert_non_null(cfg);
    catalog = catalog_new();
    catalog_set_policy(catalog, &cfg->policy);
    memset(&srv, 0, sizeof(srv));
    srv.init_status = 200;
    srv.initialized_status = 202;
    return 0;
}

static int teardown(void **state)
{
    catalog_free(catalog);
    upstream_free(upstream);
    upstream_pool_free(pool);
    if (listener)
        evconnlistener_free(listener);
    for (int i = 0; i < 10; i++)
        event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    config_free(cfg);
    return 0;
}

/* --- a fetch, run to its end --- */

typedef struct outcome {
    bool done;
    int n_tools;
    char error[256];
    int pages;
    char page[2][256]; /* the first pages' result texts */
} outcome_t;

static void on_done(void *arg, int n_tools, const char *error)
{
    outcome_t *o = arg;
    assert_false(o->done);
    o->done = true;
    o->n_tools = n_tools;
    snprintf(o->error, sizeof(o->error), "%s", error ? error : "");
}

static void on_page(void *arg, const char *result, size_t len)
{
    outcome_t *o = arg;
    if (o->pages < 2)
        snprintf(o->page[o->pages], sizeof(o->page[0]), "%.*s", (int)len, result);
    o->pages++;
}

static outcome_t fetch(const char *headers)
{
    outcome_t o = {0};
    catalog_fetch_opts_t fo = {
        .base = base,
        .upstream = upstream,
        .target = "/mcp",
        .headers = headers,
        .catalog = catalog,
        .on_page = on_page,
        .page_arg = &o,
        .done = on_done,
        .arg = &o,
    };
    catalog_fetch_start(&fo);
    for (int i = 0; i < 5000 && !o.done; i++)
        event_base_loop(base, EVLOOP_ONCE);
    assert_true(o.done);
    return o;
}

static void the_catalogue_is_read_page_by_page(void **state)
{
    outcome_t o = fetch("Authorization: Bearer t0k\r\n");
    assert_string_equal(o.error, "");
    assert_int_equal(o.n_tools, 3);
    assert_int_equal(o.pages, 2);
    assert_non_null(strstr(o.page[0], "\"nextCursor\":\"p2\""));
    assert_non_null(strstr(o.page[1], "\"name\":\"c\""));
    assert_int_equal(catalog_size(catalog), 3);
    assert_non_null(catalog_find(catalog, "a"));
    assert_int_equal(catalog_find(catalog, "c")->read_only, HINT_TRUE);

    assert_int_equal(srv.n, 5);
    static const char *const want[] = {"initialize", "notifications/initialized", "tools/list",
                                       "tools/list", "DELETE"};
    for (int i = 0; i < 5; i++) {
        assert_string_equal(srv.methods[i], want[i]);
        assert_non_null(strstr(srv.heads[i], " /mcp HTTP/1.1\r\n"));
        assert_non_null(strstr(srv.heads[i], "\r\nAuthorization: Bearer t0k\r\n"));
        assert_non_null(
            strstr(srv.heads[i], "\r\nAccept: application/json, text/event-stream\r\n"));
    }
    /* the session and the version the server chose ride on every request after initialize */
    assert_null(strstr(srv.heads[0], "Mcp-Session-Id"));
    assert_null(strstr(srv.heads[0], "MCP-Protocol-Version"));
    for (int i = 1; i < 5; i++) {
        assert_non_null(strstr(srv.heads[i], "\r\nMcp-Session-Id: sess-1\r\n"));
        assert_non_null(strstr(srv.heads[i], "\r\nMCP-Protocol-Version: 2025-03-26\r\n"));
    }
    assert_string_equal(srv.cursors[2], "");
    assert_string_equal(srv.cursors[3], "p2");
}

/* Without a session there is nothing to end; an event-stream answer is read as well. */
static void no_session_no_delete_and_sse_answers(void **state)
{
    srv.no_session = true;
    srv.sse = true;
    outcome_t o = fetch(NULL);
    assert_string_equal(o.error, "");
    assert_int_equal(o.n_tools, 3);
    assert_int_equal(srv.n, 4);
    assert_string_equal(srv.methods[3], "tools/list");
    assert_null(strstr(srv.heads[1], "Mcp-Session-Id"));
}

/* Each way the server can fail the fetch, with the error the caller logs. */
static void failures_are_named(void **state)
{
    static const struct {
        int init_status;
        const char *init_json;
        int initialized_status;
        const char *list_result;
        bool endless;
        const char *error; /* a prefix of the error */
        int requests;
    } cases[] = {
        {401, NULL, 202, NULL, false, "initialize: HTTP 401", 1},
        {200, "{\"jsonrpc\":\"2.0\",\"id\":%d,\"error\":{\"code\":-32602,\"message\":\"no\"}}", 202,
         NULL, false, "initialize: the server answered with an error: {\"code\":-32602", 2},
        {200, "{\"jsonrpc\":\"2.0\",\"id\":99,\"result\":{}}", 202, NULL, false,
         "initialize: no JSON-RPC response in the answer", 2},
        {200, "not json %d", 202, NULL, false, "initialize: no JSON-RPC response in the answer", 2},
        {200, "{\"jsonrpc\":\"2.0\",\"id\":%d,\"result\":{\"capabilities\":{}}}", 202, NULL, false,
         "the server declares no tools capability", 2},
        {200, NULL, 400, NULL, false, "notifications/initialized: refused", 3},
        {200, NULL, 202, "{\"resources\":[]}", false, "tools/list: the result has no tools array",
         4},
        {200, NULL, 202, NULL, true, "tools/list: more than 100 pages", 2 + 100 + 1},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        memset(&srv, 0, sizeof(srv));
        srv.init_status = cases[i].init_status;
        srv.init_json = cases[i].init_json;
        srv.initialized_status = cases[i].initialized_status;
        srv.list_result = cases[i].list_result;
        srv.endless = cases[i].endless;
        outcome_t o = fetch(NULL);
        if (strncmp(o.error, cases[i].error, strlen(cases[i].error)) != 0)
            fail_msg("case %zu: error '%s', want '%s'", i, o.error, cases[i].error);
        assert_int_equal(o.n_tools, -1);
        if (srv.n != cases[i].requests)
            fail_msg("case %zu: %d requests, want %d", i, srv.n, cases[i].requests);
        /* a session the server began is ended however the fetch failed (a stdio server keeps a
         * child for it); a refused initialize began none */
        bool began = cases[i].init_status == 200;
        if (began != (strcmp(srv.last_method, "DELETE") == 0))
            fail_msg("case %zu: last request %s", i, srv.last_method);
    }
}

static void an_unreachable_upstream_is_named(void **state)
{
    evconnlistener_free(listener);
    listener = NULL;
    outcome_t o = fetch(NULL);
    assert_int_equal(o.n_tools, -1);
    char want[128];
    snprintf(want, sizeof(want), "initialize: %s", upstream_result_str(UPSTREAM_ERR_CONNECT));
    assert_string_equal(o.error, want);
}

/* A cancelled fetch calls nobody back, even with its answer on the way. */
static void a_cancelled_fetch_is_silent(void **state)
{
    outcome_t o = {0};
    catalog_fetch_opts_t fo = {.base = base,
                               .upstream = upstream,
                               .target = "/mcp",
                               .catalog = catalog,
                               .done = on_done,
                               .arg = &o};
    catalog_fetch_t *f = catalog_fetch_start(&fo);
    for (int i = 0; i < 1000 && srv.n == 0; i++)
        event_base_loop(base, EVLOOP_ONCE);
    assert_int_equal(srv.n, 1);
    catalog_fetch_cancel(f);
    for (int i = 0; i < 20; i++)
        event_base_loop(base, EVLOOP_NONBLOCK);
    assert_false(o.done);
    assert_int_equal(srv.n, 1);
}

/* `idemgw tools` against an upstream that is not there says why. */
static void fetch_now_names_the_failure(void **state)
{
    evconnlistener_free(listener);
    listener = NULL;
    char yaml[128];
    snprintf(yaml, sizeof(yaml), "upstream: http://127.0.0.1:%d/mcp\n", port);
    config_errors_t errs = {0};
    config_t *c = config_load_string("t.yaml", yaml, &errs);
    assert_non_null(c);
    char err[256];
    int n = catalog_fetch_now(c, NULL, catalog, NULL, NULL, err, sizeof(err));
    assert_int_equal(n, -1);
    char want[128];
    snprintf(want, sizeof(want), "initialize: %s", upstream_result_str(UPSTREAM_ERR_CONNECT));
    assert_string_equal(err, want);
    config_free(c);
}

/* --- the commands' options --- */

static void usage(FILE *f)
{
    fprintf(f, "usage: idemgw tools [-c FILE] [--upstream URL] [-H 'Name: value']\n");
}

static catalog_cli_t cli;
static int cli_rc;

static int run_parse(int argc, char **argv)
{
    return catalog_cli_parse(argc, argv, "idemgw tools", true, usage, &cli);
}

static int run_parse_no_upstream(int argc, char **argv)
{
    return catalog_cli_parse(argc, argv, "idemgw policy", false, usage, &cli);
}

static void parse(int (*fn)(int, char **), char *err, size_t errlen, int argc, ...)
{
    static char *argv[16];
    va_list ap;
    va_start(ap, argc);
    for (int i = 0; i < argc; i++)
        argv[i] = va_arg(ap, char *);
    va_end(ap);
    argv[argc] = NULL;
    char out[512];
    cli_rc = capture_run(fn, argc, argv, out, sizeof(out), err, errlen);
}

static void command_options(void **state)
{
    char err[512];
    parse(run_parse, err, sizeof(err), 7, "tools", "-c", "g.yaml", "--upstream", "http://h:1/mcp",
          "-H", "Authorization: Bearer x");
    assert_int_equal(cli_rc, 0);
    assert_string_equal(cli.config, "g.yaml");
    assert_string_equal(cli.upstream, "http://h:1/mcp");
    assert_string_equal(cli.headers, "Authorization: Bearer x\r\n");
    assert_string_equal(err, "");

    parse(run_parse, err, sizeof(err), 5, "tools", "-H", "A: 1", "-H", "B: 2");
    assert_int_equal(cli_rc, 0);
    assert_string_equal(cli.headers, "A: 1\r\nB: 2\r\n");

    static const char *const bad_headers[] = {"no colon", ": empty name", "Two Words: v",
                                              "A: 1\r\nB: 2"};
    for (size_t i = 0; i < ARRAY_LEN(bad_headers); i++) {
        parse(run_parse, err, sizeof(err), 3, "tools", "-H", bad_headers[i]);
        assert_int_equal(cli_rc, -1);
        assert_non_null(strstr(err, "expected 'Name: value' on one line"));
    }

    parse(run_parse, err, sizeof(err), 2, "tools", "--nope");
    assert_int_equal(cli_rc, -1);
    assert_non_null(strstr(err, "idemgw tools: unknown or incomplete option --nope"));
    assert_non_null(strstr(err, "usage: idemgw tools"));

    parse(run_parse, err, sizeof(err), 2, "tools", "-c");
    assert_int_equal(cli_rc, -1);
    assert_non_null(strstr(err, "unknown or incomplete option -c"));

    parse(run_parse, err, sizeof(err), 4, "tools", "-c", "g.yaml", "extra");
    assert_int_equal(cli_rc, -1);
    assert_non_null(strstr(err, "unexpected argument extra"));

    /* a command without --upstream refuses it, naming the option rather than its value */
    parse(run_parse_no_upstream, err, sizeof(err), 3, "policy", "--upstream", "http://h:1/");
    assert_int_equal(cli_rc, -1);
    assert_non_null(strstr(err, "idemgw policy: unknown or incomplete option --upstream\n"));
    assert_null(strstr(err, "option http://"));

    char out[512];
    char *help[] = {"tools", "-h", NULL};
    assert_int_equal(capture_run(run_parse, 2, help, out, sizeof(out), err, sizeof(err)), 1);
    assert_non_null(strstr(out, "usage: idemgw tools"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(the_catalogue_is_read_page_by_page, setup, teardown),
        cmocka_unit_test_setup_teardown(no_session_no_delete_and_sse_answers, setup, teardown),
        cmocka_unit_test_setup_teardown(failures_are_named, setup, teardown),
        cmocka_unit_test_setup_teardown(an_unreachable_upstream_is_named, setup, teardown),
        cmocka_unit_test_setup_teardown(a_cancelled_fetch_is_silent, setup, teardown),
        cmocka_unit_test_setup_teardown(fetch_now_names_the_failure, setup, teardown),
        cmocka_unit_test(command_options),
    };
    return cmocka_run_group_tests_name("catalog_fetch", tests, NULL, NULL);
}
