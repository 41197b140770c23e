/* The ids calls go upstream with: a call's body rewritten when it is forwarded and its answer
 * mapped back, a cancel of it by its own caller naming the assigned id (and no other caller's),
 * a GET stream of its session mapping the answer its POST stream did not carry, nothing kept for
 * calls that were never forwarded or were answered, and, for an HTTP upstream, every request
 * with an id sent up the same way. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "call_ids.h"
#include "fake_exchange.h"
#include "subject.h"

#define REFUND(id)                                                                                 \
    "{\"jsonrpc\":\"2.0\",\"id\":" id ",\"method\":\"tools/call\","                                \
    "\"params\":{\"name\":\"refund\",\"arguments\":{\"order\":1}}}"
#define CANCEL(id)                                                                                 \
    "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":" id "}}"
#define LOOKUP(id)                                                                                 \
    "{\"jsonrpc\":\"2.0\",\"id\":" id ",\"method\":\"tools/call\","                                \
    "\"params\":{\"name\":\"lookup\",\"arguments\":{\"order\":1}}}"

/* Callers are told apart by the X-Subject header, as a trusted front end would set it. */
static subject_conf_t subject_conf = {.kind = SUBJECT_HEADER, .value = "X-Subject"};
static subject_t *subject;
static call_ids_t *ids;

static int start(bool every_request)
{
    char msg[200];
    subject = subject_new(NULL, &subject_conf, msg, sizeof(msg));
    ids = call_ids_new(&(call_ids_ctx_t){.subject = subject, .every_request = every_request});
    return subject ? 0 : -1;
}

/* A stdio upstream: only protected calls get ids here. */
static int setup(void **state)
{
    return start(false);
}

/* An HTTP upstream: every request with an id does. */
static int setup_http(void **state)
{
    return start(true);
}

static int teardown(void **state)
{
    call_ids_free(ids);
    subject_free(subject);
    return 0;
}

static exchange_t *post(const char *body, const char *session)
{
    exchange_t *ex = fake_exchange_new(body);
    if (session)
        fake_header(&ex->req.headers, "Mcp-Session-Id", session);
    return ex;
}

/* A POST by a named caller. */
static exchange_t *post_by(const char *caller, const char *body, const char *session)
{
    exchange_t *ex = post(body, session);
    fake_header(&ex->req.headers, "X-Subject", caller);
    return ex;
}

/* A caller's cancel naming requestId (JSON text id) in session (NULL: none). */
static exchange_t *cancel_by(const char *caller, const char *body, const char *id,
                             const char *session)
{
    exchange_t *ex = post_by(caller, body, session);
    ex->cancel_id = json_loadb(id, strlen(id), JSON_DECODE_ANY, NULL);
    return ex;
}

static void cancel_free(exchange_t *ex)
{
    json_decref(ex->cancel_id);
    fake_exchange_free(ex);
}

static char *body_of(exchange_t *ex)
{
    size_t n = evbuffer_get_length(ex->req.body);
    return xstrndup((const char *)evbuffer_pullup(ex->req.body, -1), n);
}

/* The assigned id in a forwarded body, as JSON text. */
static void assigned_of(exchange_t *ex, char *out, size_t len)
{
    char *body = body_of(ex);
    const char *at = strstr(body, "\"idemgw-");
    assert_non_null(at);
    const char *end = strchr(at + 1, '"');
    snprintf(out, len, "%.*s", (int)(end + 1 - at), at);
    free(body);
}

/* The filter's answer: head (SSE or JSON), then body, then the end; its output, or NULL when
 * it found the answer out of step. */
static char *play_status(exchange_t *ex, int status, bool sse, const char *body)
{
    http_headers_t h;
    http_headers_init(&h);
    fake_header(&h, "Content-Type", sse ? "text/event-stream" : "application/json");
    fake_header(&h, "Content-Length", "99");
    const http_headers_t *head = &h;
    bool ok = ex->filter->on_head(ex->filter_arg, status, &h, &head);
    assert_null(http_headers_get(head, "content-length")); /* the length changes */
    assert_non_null(http_headers_get(head, "content-type"));
    struct evbuffer *out = evbuffer_new();
    ok = ok && ex->filter->on_body(ex->filter_arg, body, strlen(body), out);
    ok = ok && ex->filter->on_end(ex->filter_arg, true, out);
    http_headers_free(&h);
    char *text = NULL;
    if (ok)
        text = xstrndup((const char *)evbuffer_pullup(out, -1), evbuffer_get_length(out));
    evbuffer_free(out);
    return text;
}

static char *play(exchange_t *ex, bool sse, const char *body)
{
    return play_status(ex, 200, sse, body);
}

/* A server that refuses the request before reading it (the SDKs' 404 "Session not found")
 * answers with a null id: that refusal is the call's own. A null id on a success is not. */
static void a_refusal_with_a_null_id_is_the_calls_own(void **state)
{
    const char *refusal = "{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32001,\"message\":"
                          "\"Session not found\"}}";
    exchange_t *ex = post(REFUND("5"), "S1");
    call_ids_offer(ids, ex);
    exchange_forward(ex, NULL, true);
    char *out = play_status(ex, 404, false, refusal);
    assert_non_null(out);
    assert_string_equal(out, refusal);
    free(out);
    fake_exchange_free(ex);
    exchange_t *ok = post(REFUND("6"), "S1");
    call_ids_offer(ids, ok);
    exchange_forward(ok, NULL, true);
    assert_null(play_status(ok, 200, false, "{\"jsonrpc\":\"2.0\",\"id\":null,\"result\":{}}"));
    fake_exchange_free(ok);
}

static void a_protected_call_goes_up_with_an_assigned_id(void **state)
{
    exchange_t *ex = post(REFUND("7"), "S1");
    assert_int_equal(call_ids_offer(ids, ex), HANDLER_PASS);
    assert_non_null(ex->filter);
    char before[256];
    snprintf(before, sizeof(before), "%s", REFUND("7"));
    char *b = body_of(ex);
    assert_string_equal(b, before); /* rewritten only when it goes up */
    free(b);
    exchange_forward(ex, NULL, true);
    char assigned[64], answer[256];
    assigned_of(ex, assigned, sizeof(assigned));
    b = body_of(ex);
    assert_null(strstr(b, "\"id\":7"));
    assert_non_null(strstr(b, "\"arguments\":{\"order\":1}"));
    free(b);
    snprintf(answer, sizeof(answer), "{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{}}", assigned);
    char *out = play(ex, false, answer);
    assert_string_equal(out, "{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}");
    free(out);
    fake_exchange_free(ex);
    assert_int_equal(call_ids_tracked(ids), 0); /* answered: nothing kept */

    /* the next call gets another id */
    exchange_t *ex2 = post(REFUND("7"), "S1");
    call_ids_offer(ids, ex2);
    exchange_forward(ex2, NULL, true);
    char second[64];
    assigned_of(ex2, second, sizeof(second));
    assert_string_not_equal(second, assigned);
    /* an answer with the caller's own id (a stray of an earlier request) is out of step */
    assert_null(play(ex2, true, "data: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}\n\n"));
    fake_exchange_free(ex2);
}

static void reads_and_calls_never_forwarded_leave_nothing(void **state)
{
    exchange_t *read = post(REFUND("1"), NULL);
    read->cls = TOOL_CLASS_READ;
    call_ids_offer(ids, read);
    assert_null(read->filter);
    fake_exchange_free(read);
    exchange_t *replayed = post(REFUND("1"), "S1");
    call_ids_offer(ids, replayed);
    assert_int_equal(call_ids_tracked(ids), 1);
    exchange_respond_json(replayed, 200, "{}", NULL); /* answered from the store */
    assert_int_equal(call_ids_tracked(ids), 0);
    fake_exchange_free(replayed);
}

static void a_cancel_names_the_assigned_id(void **state)
{
    exchange_t *call = post(REFUND("\"c-1\""), "S1");
    call_ids_offer(ids, call);
    exchange_forward(call, NULL, true);
    char assigned[64], want[256];
    assigned_of(call, assigned, sizeof(assigned));

    exchange_t *cancel = post(CANCEL("\"c-1\""), "S1");
    cancel->cancel_id = json_string("c-1");
    assert_int_equal(call_ids_offer(ids, cancel), HANDLER_PASS);
    assert_null(cancel->filter);
    char *b = body_of(cancel);
    snprintf(want, sizeof(want),
             "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{"
             "\"requestId\":%s}}",
             assigned);
    assert_string_equal(b, want);
    free(b);
    json_decref(cancel->cancel_id);
    fake_exchange_free(cancel);

    /* another session's cancel, or one naming another id, is left as it is */
    static const struct {
        const char *session, *body, *id;
    } others[] = {{"S2", CANCEL("\"c-1\""), "c-1"}, {"S1", CANCEL("\"c-2\""), "c-2"}};
    for (size_t i = 0; i < 2; i++) {
        exchange_t *c = post(others[i].body, others[i].session);
        c->cancel_id = json_string(others[i].id);
        call_ids_offer(ids, c);
        b = body_of(c);
        assert_string_equal(b, others[i].body);
        free(b);
        json_decref(c->cancel_id);
        fake_exchange_free(c);
    }
    fake_exchange_free(call);
}

/* A POST stream that ends before the answer: the answer comes on the session's GET stream
 * with the assigned id, and is mapped there; the stream's other answers pass as they are. */
static void an_answer_on_the_get_stream_is_mapped(void **state)
{
    exchange_t *call = post(REFUND("5"), "S1");
    call_ids_offer(ids, call);
    exchange_forward(call, NULL, true);
    char assigned[64], event[256];
    assigned_of(call, assigned, sizeof(assigned));
    char *out = play(call, true, "data: {\"method\":\"notifications/progress\"}\n\n");
    free(out);
    fake_exchange_free(call);
    assert_int_equal(call_ids_tracked(ids), 1); /* kept for the GET stream */

    snprintf(event, sizeof(event), "data: {\"id\":%s,\"result\":{\"ok\":1}}\n\n", assigned);
    exchange_t *other = post(NULL, "S2"); /* another session's stream: nothing of it mapped */
    other->req.method = HTTP_GET;
    call_ids_offer(ids, other);
    out = play(other, true, event);
    assert_string_equal(out, event);
    free(out);
    fake_exchange_free(other);

    exchange_t *get = post(NULL, "S1");
    get->req.method = HTTP_GET;
    call_ids_offer(ids, get);
    assert_non_null(get->filter);
    snprintf(event, sizeof(event),
             "data: {\"id\":9,\"result\":{}}\n\ndata: {\"id\":%s,\"result\":{\"ok\":1}}\n\n",
             assigned);
    out = play(get, true, event);
    assert_string_equal(
        out, "data: {\"id\":9,\"result\":{}}\n\ndata: {\"id\":5,\"result\":{\"ok\":1}}\n\n");
    free(out);
    fake_exchange_free(get);
    assert_int_equal(call_ids_tracked(ids), 0);
}

/* The agent's GET stream was open before the call: the answer is mapped there too. */
static void a_get_stream_opened_before_the_call_maps_its_answer(void **state)
{
    exchange_t *get = post(NULL, "S1");
    get->req.method = HTTP_GET;
    call_ids_offer(ids, get);
    exchange_t *call = post(REFUND("\"r\""), "S1");
    call_ids_offer(ids, call);
    exchange_forward(call, NULL, true);
    char assigned[64], event[256];
    assigned_of(call, assigned, sizeof(assigned));
    snprintf(event, sizeof(event), "data: {\"id\":%s,\"result\":{}}\n\n", assigned);
    char *out = play(get, true, event);
    assert_string_equal(out, "data: {\"id\":\"r\",\"result\":{}}\n\n");
    free(out);
    fake_exchange_free(call);
    fake_exchange_free(get);
    assert_int_equal(call_ids_tracked(ids), 0);
}

/* What a forwarded cancel names: the requestId in its body. */
static void assert_cancel_names(exchange_t *cancel, const char *id_text)
{
    char want[256];
    snprintf(want, sizeof(want),
             "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{"
             "\"requestId\":%s}}",
             id_text);
    char *b = body_of(cancel);
    assert_string_equal(b, want);
    free(b);
}

/* Without a session an id says nothing of whose call it is: Mallory's cancel naming the id
 * Alice's running call has is not rewritten to Alice's assigned id, and (every request going up
 * with an assigned id) it names nothing of Mallory's, so it stays here; Alice's own is. */
static void a_sessionless_cancel_reaches_only_its_own_callers_call(void **state)
{
    exchange_t *call = post_by("alice", REFUND("1"), NULL);
    call_ids_offer(ids, call);
    exchange_forward(call, NULL, true);
    char assigned[64];
    assigned_of(call, assigned, sizeof(assigned));

    exchange_t *mallory = cancel_by("mallory", CANCEL("1"), "1", NULL);
    assert_int_equal(call_ids_offer(ids, mallory), HANDLER_TAKEN);
    assert_cancel_names(mallory, "1");
    assert_int_equal(mallory->status, 202);
    assert_string_equal(mallory->outcome, "cancel_unmatched");
    assert_int_equal(mallory->forwards, 0);
    cancel_free(mallory);

    exchange_t *alice = cancel_by("alice", CANCEL("1"), "1", NULL);
    assert_int_equal(call_ids_offer(ids, alice), HANDLER_PASS);
    assert_cancel_names(alice, assigned);
    cancel_free(alice);
    fake_exchange_free(call);
}

/* A stdio upstream gives its children their own ids: a sessionless cancel naming no call of its
 * caller here is not Alice's either, and passes as it came. */
static void a_sessionless_cancel_of_another_caller_passes_unrewritten_to_stdio(void **state)
{
    exchange_t *call = post_by("alice", REFUND("1"), NULL);
    call_ids_offer(ids, call);
    exchange_forward(call, NULL, true);
    exchange_t *mallory = cancel_by("mallory", CANCEL("1"), "1", NULL);
    assert_int_equal(call_ids_offer(ids, mallory), HANDLER_PASS);
    assert_cancel_names(mallory, "1");
    cancel_free(mallory);
    fake_exchange_free(call);
}

/* A session id is no proof of the caller: another caller who sends Alice's session id has its
 * cancel left as it came while her call's exchange runs. */
static void a_session_cancel_from_another_caller_is_not_rewritten(void **state)
{
    exchange_t *call = post_by("alice", REFUND("\"c-1\""), "S1");
    call_ids_offer(ids, call);
    exchange_forward(call, NULL, true);
    char assigned[64];
    assigned_of(call, assigned, sizeof(assigned));

    exchange_t *mallory = cancel_by("mallory", CANCEL("\"c-1\""), "\"c-1\"", "S1");
    assert_int_equal(call_ids_offer(ids, mallory), HANDLER_PASS);
    assert_cancel_names(mallory, "\"c-1\"");
    cancel_free(mallory);

    exchange_t *alice = cancel_by("alice", CANCEL("\"c-1\""), "\"c-1\"", "S1");
    assert_int_equal(call_ids_offer(ids, alice), HANDLER_PASS);
    assert_cancel_names(alice, assigned);
    cancel_free(alice);
    fake_exchange_free(call);
}

/* On an HTTP upstream a read goes up with an assigned id too: its answer is mapped back, an
 * answer with another id (a stray of another caller's request, the same small id) is not its
 * own, and its caller's cancel names the id it went up with. */
static void a_read_goes_up_with_an_assigned_id(void **state)
{
    exchange_t *read = post_by("alice", LOOKUP("1"), NULL);
    read->cls = TOOL_CLASS_READ;
    call_ids_offer(ids, read);
    assert_non_null(read->filter);
    exchange_forward(read, NULL, false);
    assert_false(read->alone);
    char assigned[64], answer[256];
    assigned_of(read, assigned, sizeof(assigned));

    exchange_t *alice = cancel_by("alice", CANCEL("1"), "1", NULL);
    assert_int_equal(call_ids_offer(ids, alice), HANDLER_PASS);
    assert_cancel_names(alice, assigned);
    cancel_free(alice);

    snprintf(answer, sizeof(answer), "{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{}}", assigned);
    char *out = play(read, false, answer);
    assert_string_equal(out, "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}");
    free(out);
    fake_exchange_free(read);
    assert_int_equal(call_ids_tracked(ids), 0);

    exchange_t *next = post_by("mallory", LOOKUP("1"), NULL);
    next->cls = TOOL_CLASS_READ;
    call_ids_offer(ids, next);
    exchange_forward(next, NULL, false);
    assert_null(play(next, false, "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"alice\":1}}"));
    assert_null(play(next, false, answer)); /* the earlier read's, late */
    fake_exchange_free(next);
}

/* A batch's answer has many ids: it goes up as it came, alone. A notification has no answer to
 * tell (its POST gets 202). */
static void a_batch_goes_up_alone(void **state)
{
    static const char batch[] = "[" LOOKUP("1") "," LOOKUP("2") "]";
    exchange_t *b = post_by("alice", batch, NULL);
    assert_int_equal(call_ids_offer(ids, b), HANDLER_PASS);
    assert_null(b->filter);
    assert_true(b->alone);
    fake_exchange_free(b);

    exchange_t *n =
        post_by("alice", "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}", NULL);
    call_ids_offer(ids, n);
    exchange_forward(n, NULL, false);
    assert_false(n->alone);
    fake_exchange_free(n);
}

/* An agent that left a read's POST stream may resume it (Last-Event-ID), and a server that
 * replays the stream sends the answer with the id it went up with again: mapped on the
 * session's GET stream though the call was answered. An agent that stayed has nothing to
 * resume: nothing is kept for it. */
static void a_stream_its_agent_left_is_mapped_when_replayed(void **state)
{
    exchange_t *read = post_by("alice", LOOKUP("4"), "S1");
    read->cls = TOOL_CLASS_READ;
    call_ids_offer(ids, read);
    exchange_forward(read, NULL, false);
    char assigned[64], event[256];
    assigned_of(read, assigned, sizeof(assigned));
    snprintf(event, sizeof(event), "id: e1\ndata: {\"id\":%s,\"result\":{}}\n\n", assigned);
    read->waiting = false; /* the agent dropped the stream; the gateway reads it to its end */
    free(play(read, true, event));
    fake_exchange_free(read);
    assert_int_equal(call_ids_tracked(ids), 1);

    exchange_t *resume = post_by("alice", NULL, "S1");
    call_ids_offer(ids, resume);
    char *out = play(resume, true, event);
    assert_string_equal(out, "id: e1\ndata: {\"id\":4,\"result\":{}}\n\n");
    free(out);
    fake_exchange_free(resume);

    exchange_t *stayed = post_by("alice", LOOKUP("5"), "S1");
    stayed->cls = TOOL_CLASS_READ;
    call_ids_offer(ids, stayed);
    exchange_forward(stayed, NULL, false);
    assigned_of(stayed, assigned, sizeof(assigned));
    snprintf(event, sizeof(event), "data: {\"id\":%s,\"result\":{}}\n\n", assigned);
    free(play(stayed, true, event));
    fake_exchange_free(stayed);
    assert_int_equal(call_ids_tracked(ids), 1); /* the left one's, until it expires */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(a_refusal_with_a_null_id_is_the_calls_own, setup, teardown),
        cmocka_unit_test_setup_teardown(a_protected_call_goes_up_with_an_assigned_id, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(reads_and_calls_never_forwarded_leave_nothing, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(a_cancel_names_the_assigned_id, setup, teardown),
        cmocka_unit_test_setup_teardown(an_answer_on_the_get_stream_is_mapped, setup, teardown),
        cmocka_unit_test_setup_teardown(a_get_stream_opened_before_the_call_maps_its_answer, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(a_sessionless_cancel_reaches_only_its_own_callers_call,
                                        setup_http, teardown),
        cmocka_unit_test_setup_teardown(
            a_sessionless_cancel_of_another_caller_passes_unrewritten_to_stdio, setup, teardown),
        cmocka_unit_test_setup_teardown(a_session_cancel_from_another_caller_is_not_rewritten,
                                        setup_http, teardown),
        cmocka_unit_test_setup_teardown(a_read_goes_up_with_an_assigned_id, setup_http, teardown),
        cmocka_unit_test_setup_teardown(a_batch_goes_up_alone, setup_http, teardown),
        cmocka_unit_test_setup_teardown(a_stream_its_agent_left_is_mapped_when_replayed, setup_http,
                                        teardown),
    };
    return cmocka_run_group_tests_name("call_ids", tests, NULL, NULL);
}
