/* Traces: the traceparent header read and written, the ratio sampler, span ids, and the OTLP
 * export on a real loop towards a small collector listening on loopback: a batch's JSON, the
 * counts of spans taken and dropped (refused, unreachable, a full backlog, the exit deadline),
 * the flush timer, and an export still on its way when the tracer is freed. */
#include "config.h"
#include "log.h"
#include "stats.h"
#include "trace.h"
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

static struct event_base *base;
static server_stats_t stats;

/* --- the collector: reads one request, records it, answers `status` (0: never) --- */

static struct evconnlistener *listener;
static int port;
static int status_to_send;
static int requests;
static char last_target[256];
static char last_head[1024];
static json_t *last_body;        /* the last request's body, parsed */
static struct bufferevent *held; /* a connection left without an answer */
static bool held_closed;         /* its peer (the tracer) closed it */

static void col_written(struct bufferevent *bev, void *arg)
{
    bufferevent_free(bev);
}

static void col_event(struct bufferevent *bev, short what, void *arg)
{
    if (!(what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)))
        return;
    if (bev == held) {
        held_closed = true;
        held = NULL;
    }
    bufferevent_free(bev);
}

static void col_read(struct bufferevent *bev, void *arg)
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
    requests++;
    snprintf(last_head, sizeof(last_head), "%s", head);
    sscanf(head, "%*s %255s", last_target);
    free(head);
    evbuffer_drain(in, head_len);
    json_decref(last_body);
    last_body = json_loadb((const char *)evbuffer_pullup(in, (ssize_t)body_len), body_len, 0, NULL);
    evbuffer_drain(in, body_len);
    if (status_to_send == 0) {
        held = bev;
        return;
    }
    evbuffer_add_printf(bufferevent_get_output(bev),
                        "HTTP/1.1 %d X\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
                        status_to_send);
    bufferevent_setcb(bev, NULL, col_written, col_event, NULL);
}

static void col_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len,
                       void *arg)
{
    struct bufferevent *bev = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE);
    bufferevent_setcb(bev, col_read, NULL, col_event, NULL);
    bufferevent_enable(bev, EV_READ | EV_WRITE);
}

static int setup(void **state)
{
    base = event_base_new();
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    listener =
        evconnlistener_new_bind(base, col_accept, NULL, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE,
                                16, (struct sockaddr *)&sin, sizeof(sin));
    assert_non_null(listener);
    struct sockaddr_in bound;
    socklen_t bl = sizeof(bound);
    getsockname(evconnlistener_get_fd(listener), (struct sockaddr *)&bound, &bl);
    port = ntohs(bound.sin_port);
    status_to_send = 200;
    requests = 0;
    last_target[0] = last_head[0] = '\0';
    last_body = NULL;
    held = NULL;
    held_closed = false;
    memset(&stats, 0, sizeof(stats));
    return 0;
}

static int teardown(void **state)
{
    if (held)
        bufferevent_free(held);
    if (listener)
        evconnlistener_free(listener);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    json_decref(last_body);
    return 0;
}

/* A tracer sending to the collector (path: the endpoint's path). */
static tracer_t *new_tracer(const char *path, double ratio)
{
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, path);
    http_url_t u = {0};
    assert_null(config_parse_http_url(url, &u));
    char msg[256] = "";
    tracer_t *t = tracer_new(base, &u, ratio, &stats, msg, sizeof(msg));
    config_http_url_free(&u);
    assert_non_null(t);
    return t;
}

/* A sampled root span named name, made by t. */
static span_t root_span(tracer_t *t, const char *name)
{
    span_t s = {.name = name, .kind = SPAN_SERVER, .start_ns = 1000, .end_ns = 2000};
    trace_new_span(t, &s.ctx, NULL);
    return s;
}

/* --- traceparent --- */

static void traceparent_is_parsed_strictly(void **state)
{
    static const struct {
        const char *value;
        bool ok, sampled;
    } cases[] = {
        {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", true, true},
        {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00", true, false},
        /* a later version may carry more after the flags */
        {"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-more", true, true},
        /* version 00 has exactly this length */
        {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-more", false, false},
        {"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", false, false},
        {"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01", false, false},
        {"00-00000000000000000000000000000000-b7ad6b7169203331-01", false, false},
        {"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", false, false},
        {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333g-01", false, false},
        {"00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", false, false},
        {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331", false, false},
        {"", false, false},
        {NULL, false, false},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        span_ctx_t sc;
        bool ok = trace_parse_parent(cases[i].value, &sc);
        if (ok != cases[i].ok)
            fail_msg("case %zu (%s): parsed %d", i, cases[i].value ? cases[i].value : "NULL", ok);
        if (ok)
            assert_int_equal(sc.sampled, cases[i].sampled);
    }
    span_ctx_t sc;
    const char *v = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    assert_true(trace_parse_parent(v, &sc));
    assert_int_equal(sc.trace_id[0], 0x0a);
    assert_int_equal(sc.span_id[7], 0x31);
    char out[64];
    trace_format_parent(&sc, out, sizeof(out));
    assert_string_equal(out, v);
    sc.sampled = false;
    trace_format_parent(&sc, out, sizeof(out));
    assert_string_equal(out, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00");
}

/* --- ids and the sampler --- */

static void spans_get_ids_of_their_trace(void **state)
{
    tracer_t *t = new_tracer("/", 1.0);
    span_ctx_t root, child, other;
    trace_new_span(t, &root, NULL);
    trace_new_span(t, &child, &root);
    trace_new_span(t, &other, NULL);
    static const uint8_t zero[16];
    assert_true(root.sampled);
    assert_memory_not_equal(root.trace_id, zero, 16);
    assert_memory_not_equal(root.span_id, zero, 8);
    assert_memory_equal(child.trace_id, root.trace_id, 16);
    assert_memory_not_equal(child.span_id, root.span_id, 8);
    assert_memory_not_equal(other.trace_id, root.trace_id, 16);
    /* a continued trace keeps its parent's decision */
    root.sampled = false;
    trace_new_span(t, &child, &root);
    assert_false(child.sampled);
    tracer_free(t);
}

static void the_sampler_cuts_by_the_trace_ids_low_half(void **state)
{
    uint8_t id[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}; /* first half ignored */
    tracer_t *all = new_tracer("/", 1.0), *none = new_tracer("/", 0.0),
             *half = new_tracer("/", 0.5), *quarter = new_tracer("/", 0.25);
    static const struct {
        uint8_t low[8];
        bool half, quarter;
    } cases[] = {
        {{0x00, 0, 0, 0, 0, 0, 0, 0x00}, true, true},
        {{0x3f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, true, true},
        {{0x40, 0, 0, 0, 0, 0, 0, 0x00}, true, false},
        {{0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, true, false},
        {{0x80, 0, 0, 0, 0, 0, 0, 0x00}, false, false},
        {{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, false, false},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        memcpy(id + 8, cases[i].low, 8);
        assert_true(tracer_sampled(all, id));
        assert_false(tracer_sampled(none, id));
        assert_int_equal(tracer_sampled(half, id), cases[i].half);
        assert_int_equal(tracer_sampled(quarter, id), cases[i].quarter);
    }
    tracer_free(all);
    tracer_free(none);
    tracer_free(half);
    tracer_free(quarter);
}

/* --- the export --- */

/* The attribute of span s (a JSON object) with key, or NULL. */
static const char *attr(json_t *s, const char *key)
{
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(s, "attributes"), i, a)
    {
        if (strcmp(json_string_value(json_object_get(a, "key")), key) == 0)
            return json_string_value(json_object_get(json_object_get(a, "value"), "stringValue"));
    }
    return NULL;
}

static void a_batch_is_otlp_json(void **state)
{
    tracer_t *t = new_tracer("/otel/", 1.0);
    span_t server = root_span(t, "tools/call refund");
    span_attr_t attrs[] = {
        {"mcp.method.name", "tools/call"},
        {"gen_ai.tool.name", "re\"fund\n"},
        {"left.out", NULL},
        {"not.utf8", "\xff\xfe"},
    };
    server.attrs = attrs;
    server.n_attrs = ARRAY_LEN(attrs);
    span_t client = {.name = "POST \xc3\xa9", .kind = SPAN_CLIENT, .error = true};
    trace_new_span(t, &client.ctx, &server.ctx);
    client.parent_span_id = server.ctx.span_id;
    span_t bad_name = root_span(t, "bad \xc0\xaf name");
    span_t unsampled = root_span(t, "unsampled");
    unsampled.ctx.sampled = false;
    tracer_record(t, &server);
    tracer_record(t, &client);
    tracer_record(t, &bad_name);
    tracer_record(t, &unsampled); /* not recorded */
    assert_int_equal(requests, 0);

    tracer_drain(t, 5000);
    assert_int_equal(requests, 1);
    assert_string_equal(last_target, "/otel/v1/traces");
    assert_non_null(strstr(last_head, "Content-Type: application/json\r\n"));
    assert_non_null(last_body);
    json_t *rs = json_array_get(json_object_get(last_body, "resourceSpans"), 0);
    json_t *res_attr =
        json_array_get(json_object_get(json_object_get(rs, "resource"), "attributes"), 0);
    assert_string_equal(json_string_value(json_object_get(res_attr, "key")), "service.name");
    json_t *spans = json_object_get(json_array_get(json_object_get(rs, "scopeSpans"), 0), "spans");
    assert_int_equal(json_array_size(spans), 3);

    json_t *s0 = json_array_get(spans, 0), *s1 = json_array_get(spans, 1),
           *s2 = json_array_get(spans, 2);
    char tid[33], sid[17];
    util_hex(server.ctx.trace_id, 16, tid);
    util_hex(server.ctx.span_id, 8, sid);
    assert_string_equal(json_string_value(json_object_get(s0, "traceId")), tid);
    assert_string_equal(json_string_value(json_object_get(s0, "spanId")), sid);
    assert_null(json_object_get(s0, "parentSpanId"));
    assert_string_equal(json_string_value(json_object_get(s0, "name")), "tools/call refund");
    assert_int_equal(json_integer_value(json_object_get(s0, "kind")), SPAN_SERVER);
    assert_string_equal(json_string_value(json_object_get(s0, "startTimeUnixNano")), "1000");
    assert_string_equal(json_string_value(json_object_get(s0, "endTimeUnixNano")), "2000");
    assert_int_equal(json_array_size(json_object_get(s0, "attributes")), 2);
    assert_string_equal(attr(s0, "mcp.method.name"), "tools/call");
    assert_string_equal(attr(s0, "gen_ai.tool.name"), "re\"fund\n");
    assert_null(attr(s0, "left.out"));
    assert_null(attr(s0, "not.utf8"));
    assert_int_equal(json_integer_value(json_object_get(json_object_get(s0, "status"), "code")), 0);

    assert_string_equal(json_string_value(json_object_get(s1, "traceId")), tid);
    assert_string_equal(json_string_value(json_object_get(s1, "parentSpanId")), sid);
    assert_string_equal(json_string_value(json_object_get(s1, "name")), "POST \xc3\xa9");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(s1, "status"), "code")), 2);
    /* a name that is not UTF-8 cannot go into JSON: the span keeps a placeholder */
    assert_string_equal(json_string_value(json_object_get(s2, "name")), "span");

    assert_int_equal(stats.spans_exported, 3);
    assert_int_equal(stats.spans_dropped, 0);
    tracer_free(t);
}

static void a_batch_leaves_on_the_timer(void **state)
{
    tracer_t *t = new_tracer("/", 1.0);
    span_t s = root_span(t, "one");
    tracer_record(t, &s);
    for (int i = 0; i < 100 && stats.spans_exported == 0; i++)
        event_base_loop(base, EVLOOP_ONCE);
    assert_int_equal(requests, 1);
    assert_string_equal(last_target, "/v1/traces");
    assert_int_equal(stats.spans_exported, 1);
    tracer_free(t);
}

/* Spans the endpoint does not take are counted dropped and logged. */
static void a_refused_batch_is_dropped(void **state)
{
    status_to_send = 503;
    tracer_t *t = new_tracer("/", 1.0);
    span_t a = root_span(t, "a"), b = root_span(t, "b");
    tracer_record(t, &a);
    tracer_record(t, &b);
    FILE *logged = tmpfile();
    log_stream = logged;
    tracer_drain(t, 5000);
    log_stream = NULL;
    assert_int_equal(requests, 1);
    assert_int_equal(stats.spans_exported, 0);
    assert_int_equal(stats.spans_dropped, 2);
    char text[1024] = "";
    rewind(logged);
    text[fread(text, 1, sizeof(text) - 1, logged)] = '\0';
    fclose(logged);
    assert_non_null(strstr(text, "the OTLP endpoint did not take 2 spans"));
    assert_non_null(strstr(text, "HTTP 503"));
    tracer_free(t);
}

static void an_unreachable_endpoint_drops_the_batch(void **state)
{
    evconnlistener_free(listener);
    listener = NULL;
    tracer_t *t = new_tracer("/", 1.0);
    span_t a = root_span(t, "a");
    tracer_record(t, &a);
    tracer_drain(t, 5000);
    assert_int_equal(stats.spans_exported, 0);
    assert_int_equal(stats.spans_dropped, 1);
    tracer_free(t);
}

/* While a batch is on its way, new spans wait, up to TRACE_MAX_PENDING; past that they are
 * dropped at once, and the ones held leave when the batch is answered. */
static void the_backlog_is_bounded(void **state)
{
    tracer_t *t = new_tracer("/", 1.0);
    span_t s = root_span(t, "s");
    for (int i = 0; i < TRACE_BATCH; i++)
        tracer_record(t, &s); /* a full batch is sent at once */
    for (int i = 0; i < TRACE_MAX_PENDING + 5; i++)
        tracer_record(t, &s);
    assert_int_equal(stats.spans_dropped, 5);
    tracer_drain(t, 5000);
    assert_int_equal(requests, 2);
    assert_int_equal(stats.spans_exported, TRACE_BATCH + TRACE_MAX_PENDING);
    assert_int_equal(stats.spans_dropped, 5);
    tracer_free(t);
}

/* A full batch sent to an endpoint that never answers, once the endpoint holds it. */
static tracer_t *tracer_with_batch_held(void)
{
    status_to_send = 0;
    tracer_t *t = new_tracer("/", 1.0);
    span_t s = root_span(t, "s");
    for (int i = 0; i < TRACE_BATCH; i++)
        tracer_record(t, &s);
    for (int i = 0; i < 100 && !held; i++)
        event_base_loop(base, EVLOOP_ONCE);
    assert_non_null(held);
    return t;
}

/* At exit the wait for an endpoint that never answers is bounded: what is held is counted
 * dropped, once, and the request still on its way is ended. */
static void the_exit_deadline_drops_what_is_held(void **state)
{
    tracer_t *t = tracer_with_batch_held();
    span_t s = root_span(t, "s");
    tracer_record(t, &s);
    tracer_drain(t, 50);
    assert_int_equal(requests, 1);
    assert_int_equal(stats.spans_exported, 0);
    assert_int_equal(stats.spans_dropped, TRACE_BATCH + 1);
    for (int i = 0; i < 100 && !held_closed; i++)
        event_base_loop(base, EVLOOP_ONCE);
    assert_true(held_closed);
    assert_int_equal(stats.spans_dropped, TRACE_BATCH + 1);
    tracer_free(t);
}

/* Freeing the tracer ends the export on its way: its answer can no longer reach it. */
static void freeing_the_tracer_ends_its_export(void **state)
{
    tracer_t *t = tracer_with_batch_held();
    tracer_free(t);
    for (int i = 0; i < 100 && !held_closed; i++)
        event_base_loop(base, EVLOOP_ONCE);
    assert_true(held_closed);
}

static void no_endpoint_no_tracer(void **state)
{
    http_url_t none = {0};
    char msg[64] = "";
    assert_null(tracer_new(base, &none, 1.0, &stats, msg, sizeof(msg)));
    assert_string_equal(msg, "");
    span_t s = {.name = "x", .ctx = {.sampled = true}};
    tracer_record(NULL, &s); /* tracing off: nothing to do */
    tracer_drain(NULL, 10);
    tracer_free(NULL);
    /* nothing held: the drain returns without running the loop */
    tracer_t *t = new_tracer("/", 1.0);
    tracer_drain(t, 5000);
    assert_int_equal(requests, 0);
    tracer_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(traceparent_is_parsed_strictly),
        cmocka_unit_test_setup_teardown(spans_get_ids_of_their_trace, setup, teardown),
        cmocka_unit_test_setup_teardown(the_sampler_cuts_by_the_trace_ids_low_half, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(a_batch_is_otlp_json, setup, teardown),
        cmocka_unit_test_setup_teardown(a_batch_leaves_on_the_timer, setup, teardown),
        cmocka_unit_test_setup_teardown(a_refused_batch_is_dropped, setup, teardown),
        cmocka_unit_test_setup_teardown(an_unreachable_endpoint_drops_the_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(the_backlog_is_bounded, setup, teardown),
        cmocka_unit_test_setup_teardown(the_exit_deadline_drops_what_is_held, setup, teardown),
        cmocka_unit_test_setup_teardown(freeing_the_tracer_ends_its_export, setup, teardown),
        cmocka_unit_test_setup_teardown(no_endpoint_no_tracer, setup, teardown),
    };
    return cmocka_run_group_tests_name("trace", tests, NULL, NULL);
}
