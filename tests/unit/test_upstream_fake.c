/* The exchange against an upstream that is not HTTP: a second implementation of upstream.h
 * in this file, with no socket and no HTTP behind it, which the test drives by hand through
 * head, body and end. The agent is real (a socketpair through http_conn); the exchange must
 * relay, answer failures and let go of its call through the interface alone. */
#include "call_ids.h"
#include "config.h"
#include "exchange.h"
#include "http_conn.h"
#include "proxy.h"
#include "subject.h"
#include "upstream.h"
#include "util.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

/* --- the fake upstream: it records the request and waits for the test to answer --- */

struct upstream_call {
    char method[16];
    char target[256];
    char body[1024];
    char extra[512];
    bool has_body, once, alone;
    const upstream_cbs_t *cbs;
    void *arg;
    bool paused, abandoned, discarded;
    int pauses, resumes;
};

typedef struct fake {
    struct upstream_call call; /* one request at a time */
    int opened;
    int wrong_use; /* calls on a handle that was no longer the owner's */
    bool ended;    /* on_end ran: the handle is the fake's again */
} fake_t;

static upstream_call_t *fake_open(void *state, const upstream_request_t *req,
                                  const upstream_cbs_t *cbs, void *arg)
{
    fake_t *f = state;
    upstream_call_t *c = &f->call;
    memset(c, 0, sizeof(*c));
    snprintf(c->method, sizeof(c->method), "%s", req->method);
    snprintf(c->target, sizeof(c->target), "%s", req->target);
    snprintf(c->extra, sizeof(c->extra), "%s", req->extra_headers ? req->extra_headers : "");
    if (req->body) {
        size_t n = evbuffer_get_length(req->body);
        assert_true(n < sizeof(c->body));
        evbuffer_remove(req->body, c->body, n);
    }
    c->has_body = req->has_body;
    c->once = req->once;
    c->alone = req->alone;
    c->cbs = cbs;
    c->arg = arg;
    f->opened++;
    f->ended = false;
    return c;
}

static void fake_pause(void *state, upstream_call_t *call, bool paused)
{
    fake_t *f = state;
    f->wrong_use += f->ended;
    call->paused = paused;
    if (paused)
        call->pauses++;
    else
        call->resumes++;
}

static void fake_abandon(void *state, upstream_call_t *call)
{
    fake_t *f = state;
    f->wrong_use += f->ended;
    call->abandoned = true;
}

static void fake_discard(void *state, upstream_call_t *call)
{
    call->discarded = true; /* allowed during on_end too */
}

static const upstream_ops_t fake_ops = {
    .name = "fake",
    .open = fake_open,
    .pause = fake_pause,
    .abandon = fake_abandon,
    .discard = fake_discard,
};

/* The fake's answer, as a transport without HTTP would make it up. */
static void fake_head(fake_t *f, int status, const char *content_type)
{
    http_headers_t h;
    http_headers_init(&h);
    http_headers_add_name(&h, "Content-Type", 12);
    http_headers_end_name(&h);
    http_headers_add_value(&h, content_type, strlen(content_type));
    http_headers_end_value(&h);
    f->call.cbs->on_head(f->call.arg, status, &h);
    http_headers_free(&h); /* the headers were the fake's: the exchange copied what it kept */
}

static void fake_body(fake_t *f, const char *text)
{
    char copy[1024];
    size_t n = strlen(text);
    memcpy(copy, text, n);
    f->call.cbs->on_body(f->call.arg, copy, n);
    memset(copy, 'x', n); /* so are the bytes */
}

static void fake_end(fake_t *f, upstream_result_t res)
{
    f->call.cbs->on_end(f->call.arg, res);
    f->ended = true;
}

/* --- the gateway around it --- */

static struct event_base *base;
static config_t *cfg;
static server_stats_t stats;
static fake_t fake;
static upstream_t upstream = {&fake_ops, &fake};
static proxy_t *proxy;
static subject_t *subject;
static http_limits_t limits = {16384, 65536, 2000, 2000, 2000, 100};
static http_context_t conns;
static http_site_t site;
static call_ids_t *ids;              /* with setup_ids: protected calls go up with assigned ids */
static bool with_ids, every_request; /* what setup makes ids for */

/* Forwards the protected calls itself, as the idempotency stage does once it has the key. */
static handler_verdict_t stage_call(void *arg, exchange_t *ex)
{
    (void)arg;
    if (exchange_tool_class(ex) != TOOL_CLASS_NON_IDEMPOTENT)
        return HANDLER_PASS;
    exchange_forward(ex, "Idempotency-Key: k1\r\n", true);
    return HANDLER_TAKEN;
}

static int setup(void **state)
{
    base = event_base_new();
    config_errors_t errs = {0};
    cfg = config_load_string("t.yaml",
                             "upstream: http://127.0.0.1:1/mcp\n"
                             "subject: {static: me}\n"
                             "tools:\n  refund:\n    class: non_idempotent\n"
                             "  lookup:\n    class: read\n",
                             &errs);
    assert_non_null(cfg);
    char msg[200];
    subject = subject_new(base, &cfg->subject, msg, sizeof(msg));
    assert_non_null(subject);
    if (with_ids)
        ids = call_ids_new(&(call_ids_ctx_t){.subject = subject, .every_request = every_request});
    memset(&fake, 0, sizeof(fake));
    memset(&stats, 0, sizeof(stats));
    proxy_ctx_t pc = {.base = base,
                      .cfg = cfg,
                      .upstream = &upstream,
                      .stats = &stats,
                      .subject = subject,
                      .n_workers = 1};
    proxy = proxy_new(&pc);
    if (ids)
        proxy_add_handler(proxy, &(handler_t){"ids of protected calls", call_ids_offer, ids});
    proxy_add_handler(proxy, &(handler_t){"protected call", stage_call, NULL});
    conns = (http_context_t){.base = base, .limits = &limits, .stats = &stats};
    site = (http_site_t){.ctx = &conns, .handler = proxy_handle, .arg = proxy, .name = "mcp"};
    return 0;
}

static int teardown(void **state)
{
    for (int i = 0; i < 200 && (conns.open > 0 || proxy_exchanges(proxy) > 0); i++)
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    assert_int_equal(proxy_exchanges(proxy), 0);
    proxy_free(proxy);
    call_ids_free(ids); /* after the proxy: its exchanges' filters were the module's */
    ids = NULL;
    with_ids = every_request = false;
    subject_free(subject);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    config_free(cfg);
    return 0;
}

static int setup_ids(void **state)
{
    with_ids = true;
    return setup(state);
}

/* As for an HTTP upstream: every request with an id goes up with an assigned one. */
static int setup_every_request(void **state)
{
    with_ids = every_request = true;
    return setup(state);
}

/* An agent sends one request; returns its end of the socketpair once the request is in. */
static int agent_send(const char *method, const char *body)
{
    int fds[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    evutil_make_socket_nonblocking(fds[0]);
    evutil_make_socket_nonblocking(fds[1]);
    http_conn_accept(NULL, fds[0], NULL, 0, &site);
    char req[2048];
    int n = snprintf(req, sizeof(req),
                     "%s /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                     "Accept: application/json, text/event-stream\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     method, body ? strlen(body) : 0, body ? body : "");
    assert_int_equal(write(fds[1], req, (size_t)n), n);
    for (int i = 0; i < 200 && fake.opened == 0; i++)
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    return fds[1];
}

/* Everything the agent gets until the gateway closes. */
static char *agent_read(int fd)
{
    struct evbuffer *got = evbuffer_new();
    for (int i = 0; i < 5000; i++) {
        char buf[4096];
        ssize_t r = read(fd, buf, sizeof(buf));
        if (r == 0)
            break;
        if (r > 0) {
            evbuffer_add(got, buf, (size_t)r);
            continue;
        }
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    }
    close(fd);
    size_t len = evbuffer_get_length(got);
    char *out = xstrndup((const char *)evbuffer_pullup(got, -1), len);
    evbuffer_free(got);
    return out;
}

#define LOOKUP                                                                                     \
    "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\","                                     \
    "\"params\":{\"name\":\"lookup\",\"arguments\":{}}}"

static void head_body_and_end_reach_the_agent(void **state)
{
    int fd = agent_send("POST", LOOKUP);
    assert_int_equal(fake.opened, 1);
    /* the request as the interface carries it: no HTTP bytes */
    assert_string_equal(fake.call.method, "POST");
    assert_string_equal(fake.call.target, "/mcp");
    assert_string_equal(fake.call.body, LOOKUP);
    assert_true(fake.call.has_body);
    assert_false(fake.call.once);
    assert_string_equal(fake.call.extra, "");
    fake_head(&fake, 200, "application/json");
    fake_body(&fake, "{\"jsonrpc\":\"2.0\",\"id\":1,");
    fake_body(&fake, "\"result\":{\"from\":\"fake\"}}");
    fake_end(&fake, UPSTREAM_OK);
    char *r = agent_read(fd);
    assert_non_null(strstr(r, "HTTP/1.1 200"));
    assert_non_null(strstr(r, "application/json"));
    /* no length in the head: chunked to the agent, one chunk per piece, then the last one */
    assert_non_null(strstr(r, "chunked"));
    assert_non_null(strstr(r, "{\"jsonrpc\":\"2.0\",\"id\":1,"));
    assert_non_null(strstr(r, "\"result\":{\"from\":\"fake\"}}"));
    assert_non_null(strstr(r, "\r\n0\r\n\r\n"));
    free(r);
    assert_false(fake.call.abandoned);
    assert_false(fake.call.discarded);
    assert_int_equal(fake.wrong_use, 0);
    assert_int_equal(stats.forwarded, 1);
}

static void a_stage_forwards_through_the_same_interface(void **state)
{
    int fd = agent_send("POST", "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/call\","
                                "\"params\":{\"name\":\"refund\",\"arguments\":{}}}");
    assert_int_equal(fake.opened, 1);
    assert_non_null(strstr(fake.call.extra, "Idempotency-Key: k1\r\n"));
    assert_true(fake.call.once);
    fake_head(&fake, 200, "application/json");
    fake_body(&fake, "{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}");
    fake_end(&fake, UPSTREAM_OK);
    char *r = agent_read(fd);
    assert_non_null(strstr(r, "\"id\":7,\"result\":{}"));
    free(r);
    assert_int_equal(fake.wrong_use, 0);
}

static void an_end_before_any_head_is_a_502(void **state)
{
    int fd = agent_send("POST", LOOKUP);
    fake_end(&fake, UPSTREAM_ERR_CONNECT);
    char *r = agent_read(fd);
    assert_non_null(strstr(r, "HTTP/1.1 502"));
    assert_non_null(strstr(r, "upstream MCP server unreachable"));
    free(r);
    assert_int_equal(stats.upstream_errors, 1);
    assert_int_equal(fake.wrong_use, 0);
}

static void a_slow_agent_pauses_the_call(void **state)
{
    int fd = agent_send("POST", LOOKUP);
    fake_head(&fake, 200, "application/json");
    static char piece[16 * 1024];
    memset(piece, ' ', sizeof(piece));
    /* the agent reads nothing yet: its output grows until the exchange asks for a pause */
    for (int i = 0; i < 64 && !fake.call.paused; i++)
        fake.call.cbs->on_body(fake.call.arg, piece, sizeof(piece));
    assert_true(fake.call.paused);
    assert_int_equal(fake.call.pauses, 1);
    /* as the agent reads, its output drains and the call resumes */
    char buf[65536];
    for (int i = 0; i < 5000 && fake.call.paused; i++) {
        if (read(fd, buf, sizeof(buf)) <= 0)
            event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    }
    assert_false(fake.call.paused);
    assert_int_equal(fake.call.resumes, 1);
    fake_end(&fake, UPSTREAM_OK);
    free(agent_read(fd));
    assert_int_equal(fake.wrong_use, 0);
}

static void an_agent_leaving_a_get_stream_abandons_the_call(void **state)
{
    int fd = agent_send("GET", NULL);
    assert_string_equal(fake.call.method, "GET");
    assert_false(fake.call.has_body);
    fake_head(&fake, 200, "text/event-stream");
    fake_body(&fake, "event: message\ndata: {}\n\n");
    close(fd);
    for (int i = 0; i < 200 && !fake.call.abandoned; i++)
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    assert_true(fake.call.abandoned); /* and no on_end is owed: the exchange is gone */
    assert_int_equal(fake.wrong_use, 0);
}

#define REFUND7                                                                                    \
    "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/call\","                                     \
    "\"params\":{\"name\":\"refund\",\"arguments\":{}}}"

/* The id the protected call went up with, as JSON text. */
static void assigned_of(char *out, size_t len)
{
    const char *at = strstr(fake.call.body, "\"id\":\"idemgw-");
    assert_non_null(at);
    at += 5;
    const char *end = strchr(at + 1, '"');
    snprintf(out, len, "%.*s", (int)(end + 1 - at), at);
}

static void a_protected_call_goes_up_with_an_assigned_id(void **state)
{
    int fd = agent_send("POST", REFUND7);
    assert_true(fake.call.once); /* any clean connection, but never sent twice */
    char assigned[64], answer[256];
    assigned_of(assigned, sizeof(assigned));
    assert_null(strstr(fake.call.body, "\"id\":7"));
    assert_int_equal(call_ids_tracked(ids), 1);
    fake_head(&fake, 200, "application/json");
    snprintf(answer, sizeof(answer), "{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"ok\":1}}",
             assigned);
    fake_body(&fake, "  ");
    fake_body(&fake, answer);
    fake_end(&fake, UPSTREAM_OK);
    char *r = agent_read(fd);
    assert_non_null(strstr(r, "HTTP/1.1 200"));
    assert_non_null(strstr(r, "  {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"ok\":1}}"));
    assert_null(strstr(r, "idemgw-"));
    free(r);
    assert_false(fake.call.discarded);
    assert_int_equal(fake.wrong_use, 0);
    assert_int_equal(call_ids_tracked(ids), 0);
}

/* An answer with the caller's own id is another request's (it went up with the assigned one):
 * never relayed, and its connection is not used again. */
static void a_json_answer_with_another_id_is_a_desync(void **state)
{
    int fd = agent_send("POST", REFUND7);
    fake_head(&fake, 200, "application/json");
    fake_body(&fake, "{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"stray\":1}}");
    fake_end(&fake, UPSTREAM_OK);
    char *r = agent_read(fd);
    assert_null(strstr(r, "stray"));
    /* with nothing holding it, the agent gets an error of its own id in its place, whole */
    assert_non_null(strstr(r, "HTTP/1.1 502"));
    assert_non_null(strstr(r, "{\"jsonrpc\":\"2.0\",\"id\":7,\"error\":{\"code\":-32603"));
    free(r);
    assert_true(fake.call.discarded);
    assert_int_equal(fake.wrong_use, 0);
}

/* A read goes up with an assigned id too: its own answer is mapped back; another request's
 * answer (the same small id, another caller's) is never relayed, the agent gets an error with
 * its own id in its place, and the connection is not used again. */
static void a_read_answered_with_another_id_gets_its_own_error(void **state)
{
    int fd = agent_send("POST", LOOKUP);
    char assigned[64], answer[256];
    assigned_of(assigned, sizeof(assigned));
    assert_false(fake.call.alone);
    fake_head(&fake, 200, "application/json");
    snprintf(answer, sizeof(answer), "{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"own\":1}}",
             assigned);
    fake_body(&fake, answer);
    fake_end(&fake, UPSTREAM_OK);
    char *r = agent_read(fd);
    assert_non_null(strstr(r, "HTTP/1.1 200"));
    assert_non_null(strstr(r, "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"own\":1}}"));
    free(r);
    assert_false(fake.call.discarded);

    fake.opened = 0;
    fd = agent_send("POST", LOOKUP);
    fake_head(&fake, 200, "application/json");
    fake_body(&fake, "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"someone\":\"else\"}}");
    fake_end(&fake, UPSTREAM_OK);
    r = agent_read(fd);
    assert_null(strstr(r, "someone"));
    assert_non_null(strstr(r, "HTTP/1.1 502"));
    assert_non_null(strstr(r, "{\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":-32603"));
    free(r);
    assert_true(fake.call.discarded);
    assert_int_equal(fake.wrong_use, 0);
}

/* A batch's answer holds many ids: it goes up as it came, on a connection of its own. */
static void a_batch_goes_up_alone(void **state)
{
    int fd = agent_send("POST", "[" LOOKUP "]");
    assert_true(fake.call.alone);
    assert_string_equal(fake.call.body, "[" LOOKUP "]");
    fake_head(&fake, 200, "application/json");
    fake_body(&fake, "[{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}]");
    fake_end(&fake, UPSTREAM_OK);
    char *r = agent_read(fd);
    assert_non_null(strstr(r, "[{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}]"));
    free(r);
    assert_int_equal(fake.wrong_use, 0);
}

/* In a stream: what came before goes on, the call is ended at the stray, from the loop. */
static void an_sse_answer_with_another_id_ends_the_call(void **state)
{
    int fd = agent_send("POST", REFUND7);
    fake_head(&fake, 200, "text/event-stream");
    fake_body(&fake, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":"
                     "\"notifications/progress\",\"params\":{\"progressToken\":1}}\n\n");
    fake_body(&fake, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"stray\":1}}"
                     "\n\n");
    assert_false(fake.call.abandoned); /* never from inside the call's own callback */
    char *r = agent_read(fd);
    assert_true(fake.call.abandoned);
    assert_non_null(strstr(r, "notifications/progress"));
    assert_null(strstr(r, "stray"));
    /* the stream's last event is an error with the agent's own id */
    assert_non_null(strstr(r, "data: {\"jsonrpc\":\"2.0\",\"id\":7,\"error\":{\"code\":-32603"));
    free(r);
    assert_int_equal(fake.wrong_use, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(head_body_and_end_reach_the_agent, setup, teardown),
        cmocka_unit_test_setup_teardown(a_stage_forwards_through_the_same_interface, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(an_end_before_any_head_is_a_502, setup, teardown),
        cmocka_unit_test_setup_teardown(a_slow_agent_pauses_the_call, setup, teardown),
        cmocka_unit_test_setup_teardown(an_agent_leaving_a_get_stream_abandons_the_call, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(a_protected_call_goes_up_with_an_assigned_id, setup_ids,
                                        teardown),
        cmocka_unit_test_setup_teardown(a_json_answer_with_another_id_is_a_desync, setup_ids,
                                        teardown),
        cmocka_unit_test_setup_teardown(an_sse_answer_with_another_id_ends_the_call, setup_ids,
                                        teardown),
        cmocka_unit_test_setup_teardown(a_read_answered_with_another_id_gets_its_own_error,
                                        setup_every_request, teardown),
        cmocka_unit_test_setup_teardown(a_batch_goes_up_alone, setup_every_request, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
