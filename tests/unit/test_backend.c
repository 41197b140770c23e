/* One MCP server behind the gateway (src/cmd/backend.c) and the streams it keeps for
 * resumption (src/pipeline/resume.c), on a real loop: an agent on a socket pair through a real
 * http_conn into the backend's router. The server is a stdio child
 * (tests/fixtures/unit-stdio.sh) or a small HTTP upstream in the same loop, whose event stream
 * the test holds open. Covered: opening either kind, a request through each, whether a reload's
 * config keeps the upstream, a reconfigure, a CA file that does not load, drain and free; and
 * a POST's event stream dropped by the agent and picked up with GET + Last-Event-ID, served
 * from the bytes the gateway kept while the upstream still writes. */
#include "backend.h"
#include "config.h"
#include "http_conn.h"
#include "proxy.h"
#include "replay_cache.h"
#include "resume_guard.h"
#include "subject.h"
#include "upstream.h"
#include "upstream_stdio.h"
#include "util.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

static struct event_base *base;
static server_stats_t stats;
static upstream_limits_t up_limits = {1000, 5000, 5000, 4};
static http_limits_t limits = {16384, 65536, 5000, 5000, 5000, 100};
static http_context_t conns;
static bool draining;
static subject_t *subject;
static replay_cache_t *cache;
static resume_guard_t *guard;
static backend_env_t env;
static config_t *subject_cfg; /* the subject keeps its settings: freed after it */

/* --- the HTTP upstream: JSON answers, and one event stream held open --- */

static struct evconnlistener *up_listener;
static int up_port;
static struct bufferevent *held; /* the event stream the test ends */
static int up_gets;              /* GETs that reached the upstream */
static char held_id[64];         /* the id the held stream's request went up with */

static void up_written(struct bufferevent *bev, void *arg)
{
    bufferevent_free(bev);
}

static void up_event(struct bufferevent *bev, short what, void *arg)
{
    if (!(what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)))
        return;
    if (bev == held)
        held = NULL;
    bufferevent_free(bev);
}

static void up_chunk(struct bufferevent *bev, const char *data)
{
    evbuffer_add_printf(bufferevent_get_output(bev), "%zx\r\n%s\r\n", strlen(data), data);
}

static void up_read(struct bufferevent *bev, void *arg)
{
    struct evbuffer *in = bufferevent_get_input(bev);
    size_t n = evbuffer_get_length(in);
    const char *s = (const char *)evbuffer_pullup(in, -1);
    const char *end = s ? memmem(s, n, "\r\n\r\n", 4) : NULL;
    if (!end)
        return;
    size_t head_len = (size_t)(end - s) + 4;
    const char *cl = memmem(s, head_len, "Content-Length: ", 16);
    size_t body_len = cl && cl < end ? strtoul(cl + 16, NULL, 10) : 0;
    if (n < head_len + body_len)
        return;
    char *body = xstrndup(s + head_len, body_len);
    bool get = strncmp(s, "GET ", 4) == 0;
    evbuffer_drain(in, n);
    /* the gateway sends calls up with ids of its own: the answer names the one it got */
    json_t *m = json_loads(body, 0, NULL);
    char *id = m && json_object_get(m, "id") ? json_dumps(json_object_get(m, "id"), JSON_ENCODE_ANY)
                                             : xstrdup("null");
    json_decref(m);
    struct evbuffer *out = bufferevent_get_output(bev);
    if (get) {
        up_gets++;
        evbuffer_add_printf(out, "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n"
                                 "Connection: close\r\n\r\n");
    } else if (strstr(body, "\"initialize\"")) {
        char *a = xasprintf("{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"protocolVersion\":"
                            "\"2025-06-18\",\"capabilities\":{},\"serverInfo\":{\"name\":\"up\","
                            "\"version\":\"1\"}}}",
                            id);
        evbuffer_add_printf(out,
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nMcp-Session-Id: "
                            "S1\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                            strlen(a), a);
        free(a);
    } else if (strstr(body, "\"name\":\"stream\"")) {
        evbuffer_add_printf(out, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                 "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
        up_chunk(bev, "id: e1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\","
                      "\"params\":{\"progressToken\":1,\"progress\":1}}\n\n");
        held = bev;
        snprintf(held_id, sizeof(held_id), "%s", id);
        free(id);
        free(body);
        return;
    } else {
        char *a = xasprintf("{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":"
                            "\"text\",\"text\":\"from-http\"}]}}",
                            id);
        evbuffer_add_printf(out,
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                            "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                            strlen(a), a);
        free(a);
    }
    free(id);
    free(body);
    bufferevent_setcb(bev, NULL, up_written, up_event, NULL); /* closes once it is sent */
}

static void up_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len,
                      void *arg)
{
    struct bufferevent *bev = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE);
    bufferevent_setcb(bev, up_read, NULL, up_event, NULL);
    bufferevent_enable(bev, EV_READ | EV_WRITE);
}

/* --- configs --- */

static config_t *load(const char *upstream_yaml)
{
    char *yaml = xasprintf("upstream: %s\n"
                           "database_url: none\n"
                           "subject: {static: me}\n"
                           "tools:\n  echo: {class: read}\n  stream: {class: read}\n",
                           upstream_yaml);
    config_errors_t errs = {0};
    config_t *c = config_load_string("t.yaml", yaml, &errs);
    free(yaml);
    if (!c)
        for (size_t i = 0; i < errs.n; i++)
            fprintf(stderr, "%s\n", errs.msgs[i]);
    config_errors_free(&errs);
    assert_non_null(c);
    return c;
}

static config_t *load_http(void)
{
    char u[100];
    snprintf(u, sizeof(u), "http://127.0.0.1:%d/mcp", up_port);
    return load(u);
}

static config_t *load_stdio(const char *arg)
{
    char u[200];
    snprintf(u, sizeof(u), "{command: [tests/fixtures/unit-stdio.sh%s%s]}", arg ? ", " : "",
             arg ? arg : "");
    return load(u);
}

static int setup(void **state)
{
    base = event_base_new();
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    up_listener =
        evconnlistener_new_bind(base, up_accept, NULL, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE,
                                16, (struct sockaddr *)&sin, sizeof(sin));
    if (!up_listener)
        return -1;
    struct sockaddr_in bound;
    socklen_t bl = sizeof(bound);
    getsockname(evconnlistener_get_fd(up_listener), (struct sockaddr *)&bound, &bl);
    up_port = ntohs(bound.sin_port);
    subject_cfg = load("http://127.0.0.1:1/mcp");
    char msg[200];
    subject = subject_new(base, &subject_cfg->subject, msg, sizeof(msg));
    if (!subject)
        return -1;
    cache = replay_cache_new(100, 1 << 20);
    guard = resume_guard_new();
    memset(&stats, 0, sizeof(stats));
    draining = false;
    env = (backend_env_t){.base = base,
                          .cache = cache,
                          .subject = subject,
                          .guard = guard,
                          .stats = &stats,
                          .limits = &up_limits,
                          .worker = 0,
                          .n_workers = 1,
                          .draining = &draining};
    conns = (http_context_t){.base = base, .limits = &limits, .stats = &stats};
    held = NULL;
    up_gets = 0;
    return 0;
}

static int teardown(void **state)
{
    if (held)
        bufferevent_free(held);
    for (int i = 0; i < 200 && conns.open > 0; i++)
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    evconnlistener_free(up_listener);
    subject_free(subject);
    config_free(subject_cfg);
    replay_cache_free(cache);
    resume_guard_free(guard);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    return 0;
}

/* --- the agent --- */

static http_site_t site;

/* An agent connection to b with one request written; its socket. */
static int agent_send(backend_t *b, const char *method, const char *extra, const char *body)
{
    site = (http_site_t){
        .ctx = &conns, .handler = proxy_handle, .arg = backend_proxy(b), .name = "mcp"};
    int fds[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    evutil_make_socket_nonblocking(fds[0]);
    evutil_make_socket_nonblocking(fds[1]);
    http_conn_accept(NULL, fds[0], NULL, 0, &site);
    char *req =
        xasprintf("%s /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  "Accept: application/json, text/event-stream\r\n%sContent-Length: %zu\r\n"
                  "\r\n%s",
                  method, extra ? extra : "", body ? strlen(body) : 0, body ? body : "");
    assert_int_equal(write(fds[1], req, strlen(req)), (ssize_t)strlen(req));
    free(req);
    return fds[1];
}

typedef struct {
    int fd;
    struct evbuffer *got;
    const char *needle; /* NULL: until the connection closes */
    bool closed;
} reader_t;

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    *(bool *)arg = true;
}

/* Reads fd until needle has come (or the close); what came so far, allocated. */
static char *agent_read_until(int fd, const char *needle)
{
    struct evbuffer *got = evbuffer_new();
    bool late = false;
    struct event *deadline = evtimer_new(base, on_deadline, &late);
    struct timeval tv = {20, 0};
    evtimer_add(deadline, &tv);
    for (;;) {
        char buf[4096];
        ssize_t r = read(fd, buf, sizeof(buf));
        if (r > 0) {
            evbuffer_add(got, buf, (size_t)r);
            size_t n = evbuffer_get_length(got);
            if (needle && memmem(evbuffer_pullup(got, -1), n, needle, strlen(needle)))
                break;
            continue;
        }
        if (r == 0 || late)
            break;
        event_base_loop(base, EVLOOP_ONCE);
    }
    event_free(deadline);
    size_t n = evbuffer_get_length(got);
    char *out = n ? xstrndup((const char *)evbuffer_pullup(got, -1), n) : xstrdup("");
    evbuffer_free(got);
    return out;
}

static char *agent_exchange(backend_t *b, const char *method, const char *extra, const char *body)
{
    char *hdr = xasprintf("Connection: close\r\n%s", extra ? extra : "");
    int fd = agent_send(b, method, hdr, body);
    free(hdr);
    char *out = agent_read_until(fd, NULL);
    close(fd);
    return out;
}

static const char *init_body =
    "{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{\"protocolVersion\":"
    "\"2025-06-18\",\"capabilities\":{},\"clientInfo\":{\"name\":\"t\",\"version\":\"1\"}}}";

/* The session id of an initialize's answer, allocated. */
static char *session_of(const char *resp)
{
    const char *h = strcasestr(resp, "\r\nmcp-session-id: ");
    assert_non_null(h);
    h += 18;
    return xstrndup(h, strcspn(h, "\r\n"));
}

static void wait_idle(backend_t *b)
{
    for (int i = 0; i < 500 && backend_exchanges(b) > 0; i++)
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    assert_int_equal(backend_exchanges(b), 0);
}

/* --- tests --- */

static void a_stdio_server_serves_a_session(void **state)
{
    config_t *c = load_stdio(NULL);
    char msg[200] = "";
    backend_t *b = backend_open(&env, c, msg, sizeof(msg));
    assert_non_null(b);
    assert_null(backend_pool(b));
    assert_ptr_equal(backend_config(b), c);
    assert_non_null(backend_proxy(b));
    upstream_t *u = backend_upstream(b);
    assert_non_null(u);
    assert_int_equal(upstream_stdio_children(u), 0);

    char *r = agent_exchange(b, "POST", NULL, init_body);
    assert_non_null(strstr(r, "HTTP/1.1 200"));
    assert_non_null(strstr(r, "\"name\":\"unit\""));
    char *sid = session_of(r);
    free(r);
    assert_int_equal(upstream_stdio_children(u), 1);
    char *h = xasprintf("Mcp-Session-Id: %s\r\nMCP-Protocol-Version: 2025-06-18\r\n", sid);
    r = agent_exchange(b, "POST", h,
                       "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{"
                       "\"name\":\"echo\",\"arguments\":{\"text\":\"through-the-backend\"}}}");
    assert_non_null(strstr(r, "HTTP/1.1 200"));
    assert_non_null(strstr(r, "through-the-backend"));
    free(r);
    free(h);
    free(sid);
    wait_idle(b);

    /* a reload: the same command keeps the child, another or a URL does not */
    config_t *same = load_stdio(NULL), *other = load_stdio("mute"), *http = load_http();
    assert_true(backend_same_upstream(b, same));
    assert_false(backend_same_upstream(b, other));
    assert_false(backend_same_upstream(b, http));
    backend_reconfigure(b, same);
    assert_ptr_equal(backend_config(b), same);
    backend_drain(b);
    backend_free(b);
    config_free(c);
    config_free(same);
    config_free(other);
    config_free(http);
}

static void an_http_server_serves_and_a_reload_keeps_it(void **state)
{
    config_t *c = load_http();
    char msg[200] = "";
    backend_t *b = backend_open(&env, c, msg, sizeof(msg));
    assert_non_null(b);
    assert_non_null(backend_pool(b));
    char *r = agent_exchange(b, "POST", NULL,
                             "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{"
                             "\"name\":\"echo\",\"arguments\":{}}}");
    assert_non_null(strstr(r, "HTTP/1.1 200"));
    assert_non_null(strstr(r, "from-http"));
    free(r);
    wait_idle(b);

    config_t *same = load_http(), *other = load("http://127.0.0.1:2/mcp"),
             *stdio = load_stdio(NULL);
    assert_true(backend_same_upstream(b, same));
    assert_false(backend_same_upstream(b, other));
    assert_false(backend_same_upstream(b, stdio));
    backend_reconfigure(b, same);
    r = agent_exchange(b, "POST", NULL,
                       "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{"
                       "\"name\":\"echo\",\"arguments\":{}}}");
    assert_non_null(strstr(r, "from-http"));
    free(r);
    wait_idle(b);
    backend_drain(b);
    backend_free(b);
    config_free(c);
    config_free(same);
    config_free(other);
    config_free(stdio);
}

static void a_ca_file_that_does_not_load_refuses_the_server(void **state)
{
    char ca[] = "/tmp/idemgw-backend-ca-XXXXXX";
    int fd = mkstemp(ca);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "not a certificate\n", 18), 18);
    close(fd);
    char *u = xasprintf("https://127.0.0.1:%d/mcp\nupstream_ca_file: %s", up_port, ca);
    config_t *c = load(u);
    free(u);
    unlink(ca);
    char msg[300] = "";
    assert_null(backend_open(&env, c, msg, sizeof(msg)));
    assert_non_null(strstr(msg, "upstream_ca_file"));
    config_free(c);
}

/* The agent drops a POST's event stream; its GET with Last-Event-ID is served by the gateway
 * from what it kept (the upstream would refuse a second reader), then live. */
static void a_dropped_stream_is_resumed_from_the_gateway(void **state)
{
    config_t *c = load_http();
    char msg[200] = "";
    backend_t *b = backend_open(&env, c, msg, sizeof(msg));
    assert_non_null(b);
    char *r = agent_exchange(b, "POST", NULL, init_body);
    char *sid = session_of(r);
    free(r);
    char *h = xasprintf("Mcp-Session-Id: %s\r\n", sid);
    int post = agent_send(b, "POST", h,
                          "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{"
                          "\"name\":\"stream\",\"arguments\":{}}}");
    r = agent_read_until(post, "id: e1");
    assert_non_null(strstr(r, "text/event-stream"));
    free(r);
    assert_non_null(held);
    /* the upstream writes on while the agent is away */
    up_chunk(held, "id: e1b\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\","
                   "\"params\":{\"progressToken\":1,\"progress\":2}}\n\n");

    char *gh = xasprintf("Mcp-Session-Id: %s\r\nLast-Event-ID: e1\r\n", sid);
    int get = agent_send(b, "GET", gh, NULL);
    free(gh);
    r = agent_read_until(get, "id: e1b");
    assert_non_null(strstr(r, "HTTP/1.1 200"));
    assert_non_null(strstr(r, "\"progress\":2"));
    assert_null(strstr(r, "\"progress\":1}")); /* from after e1 only */
    free(r);
    /* the old connection is let go */
    char *rest = agent_read_until(post, NULL);
    free(rest);
    close(post);
    /* and the rest comes live on the resumed one */
    char *last = xasprintf("id: e2\ndata: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":"
                           "[]}}\n\n",
                           held_id);
    up_chunk(held, last);
    free(last);
    evbuffer_add_printf(bufferevent_get_output(held), "0\r\n\r\n");
    r = agent_read_until(get, "id: e2");
    assert_non_null(strstr(r, "\"result\""));
    free(r);
    close(get);
    assert_int_equal(up_gets, 0); /* the upstream never saw the resume */

    /* an event id the gateway never kept goes to the upstream, which refuses it */
    gh = xasprintf("Mcp-Session-Id: %s\r\nLast-Event-ID: nope\r\nConnection: close\r\n", sid);
    int get2 = agent_send(b, "GET", gh, NULL);
    free(gh);
    r = agent_read_until(get2, NULL);
    close(get2);
    assert_non_null(strstr(r, "HTTP/1.1 405"));
    free(r);
    assert_int_equal(up_gets, 1);
    free(h);
    free(sid);
    wait_idle(b);
    backend_free(b);
    config_free(c);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(a_stdio_server_serves_a_session),
        T(an_http_server_serves_and_a_reload_keeps_it),
        T(a_ca_file_that_does_not_load_refuses_the_server),
        T(a_dropped_stream_is_resumed_from_the_gateway),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
