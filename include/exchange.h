/* What a stage sees of one agent request: the exchange. The proxy owns it (proxy.c, where its
 * state machine lives); a stage (the idempotency stage, a watcher of GET streams) gets a
 * pointer, reads the request through the accessors below, answers or forwards it, and watches
 * the upstream's response through an observer.
 *
 * A handler that took a request (handler.h) owns its next step: it must end in exactly
 * one of exchange_forward, exchange_respond_json or exchange_end. While its observer holds the
 * answer (OBSERVE_HOLD), the proxy keeps the bytes meant for the agent until the stage calls
 * exchange_release or exchange_replace_answer; the exchange lives until then. */
#ifndef IDEMGW_EXCHANGE_H
#define IDEMGW_EXCHANGE_H

#include "http_conn.h"
#include "http_headers.h"
#include "mcp.h"
#include "policy.h"
#include "upstream.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct evbuffer;

typedef struct exchange exchange_t;

typedef enum {
    OBSERVE_PASS = 0, /* relay as usual */
    OBSERVE_HOLD,     /* keep back this and everything after it for the agent, and do not end
                       * the agent's response, until exchange_release / exchange_replace_answer */
} observe_t;

/* An observer watches the upstream's response to one request. An exchange has up to
 * EXCHANGE_MAX_OBSERVERS, each added by a concern (the protected call, a pending call's
 * watch, the catalogue's watches, a span) without knowing of the others, and each is called in
 * the order they were added: on_head once, on_body per chunk (the raw bytes as the upstream
 * sent them, before they go to the agent), on_end once. Any callback may be NULL. A hold, once
 * any observer asked for it, stays until released; the callbacks after it may still say PASS.
 * detach is the last call an observer gets: the exchange has ended.
 *
 * What an observer may call:
 * - From on_head and on_body: the accessors, exchange_set_outcome and exchange_set_facts.
 *   Nothing that answers or ends: the response is still being relayed; the verdict is how an
 *   observer acts on it.
 * - From on_end: besides those, exchange_discard_upstream; and the observer that holds the
 *   agent's answer (it said OBSERVE_HOLD: the handler that took the request, or the
 *   catalogue's rewrite of a tools/list) answers, there or later from the loop (a store
 *   callback, a timer), with exactly one of exchange_release, exchange_replace_answer or
 *   exchange_respond_json, and then returns OBSERVE_PASS. At most one observer of an exchange
 *   holds; the others (a pending call's watch, the catalogue's list_changed watch, a span)
 *   only read, count and keep their own state. Every observer's on_end is called, even after
 *   an earlier one answered (exchange_agent_waiting then says false); the detaches follow once
 *   the round is over. The exchange's memory lasts until the loop is out of every callback
 *   (exchange.c frees ended exchanges from the loop), so neither the exchange nor the caller
 *   of on_end touches freed memory.
 * - From detach: nothing of the exchange's; the observer frees what it holds. */
#define EXCHANGE_MAX_OBSERVERS 4

typedef struct response_observer {
    observe_t (*on_head)(void *arg, int status, const http_headers_t *headers, bool sse);
    observe_t (*on_body)(void *arg, const char *data, size_t len);
    observe_t (*on_end)(void *arg, upstream_result_t res);
    /* true once the agent has its final answer: an agent that leaves after that is no news */
    bool (*answer_seen)(void *arg);
    void (*detach)(void *arg);
} response_observer_t;

/* A filter rewrites the upstream's answer before anything else reads it: the observers, the
 * streams kept for resumption and the agent see what it gives out (the assigned JSON-RPC id a
 * request went up with mapped back to the caller's, call_ids.h). An exchange has at most one;
 * it is set by a handler before the request is forwarded. Each callback returning false says
 * the answer is not the request's (or cannot be read to tell): the exchange then relays nothing
 * more of it, closes the upstream connection, and ends the call as UPSTREAM_ERR_PROTOCOL with
 * exchange_upstream_desync true. Unless an observer holds the answer (and answers it itself),
 * the agent then gets a JSON-RPC error with its own id: the whole answer (502) when nothing of
 * it went out yet (a JSON answer's head waits for the filter's first bytes), else a last event
 * of its stream. The headers a filter gives out (its own copy, or the ones it
 * got) and every byte it appends to out are read during the callback only.
 * - on_forward: the request goes upstream now; the filter may call exchange_replace_body.
 * - on_end: the upstream ended (complete: the whole answer arrived); the filter appends what
 *   it kept back.
 * - detach: the exchange has ended; the last call, from which nothing of it may be used.
 * - answered: asked after on_end, before detach. */
typedef struct response_filter {
    void (*on_forward)(void *arg, exchange_t *ex);
    bool (*on_head)(void *arg, int status, const http_headers_t *in, const http_headers_t **out);
    bool (*on_body)(void *arg, const char *data, size_t len, struct evbuffer *out);
    bool (*on_end)(void *arg, bool complete, struct evbuffer *out);
    void (*detach)(void *arg);
    /* optional: the request's own answer has gone through (an event stream cut after it needs
     * no error of the gateway's for the request) */
    bool (*answered)(void *arg);
} response_filter_t;

/* Sets ex's filter; a second one is a bug of the wiring and aborts. */
void exchange_set_filter(exchange_t *ex, const response_filter_t *ops, void *arg);
/* The filter found the upstream's answer out of step with the request (see above). */
bool exchange_upstream_desync(const exchange_t *ex);

const http_request_t *exchange_request(const exchange_t *ex);
/* The parsed JSON-RPC body of a POST (NULL for other methods). */
const mcp_msg_t *exchange_msg(const exchange_t *ex);
uint64_t exchange_conn_id(const exchange_t *ex);
/* The class the router gave the tool of a tools/call request (TOOL_CLASS_READ otherwise). */
tool_class_t exchange_tool_class(const exchange_t *ex);
/* The request id a notifications/cancelled names, or NULL (not a cancel). */
const json_t *exchange_cancel_id(const exchange_t *ex);
/* The agent is still connected and has no complete answer yet. */
bool exchange_agent_waiting(const exchange_t *ex);

/* Adds an observer (after those already added). More than EXCHANGE_MAX_OBSERVERS is a bug of
 * the wiring and aborts. */
void exchange_add_observer(exchange_t *ex, const response_observer_t *ops, void *arg);

/* A stage's request goes upstream, with extra_headers ("Name: v\r\n"..., may be NULL); once:
 * it is never sent a second time (a non_idempotent tool's call), not even when a kept-alive
 * connection closes before any byte of its answer. */
void exchange_forward(exchange_t *ex, const char *extra_headers, bool once);
/* Removes every copy of a request header before forwarding. */
void exchange_drop_request_header(exchange_t *ex, const char *name);
/* The answer cannot be told from a stray one by its JSON-RPC id (a batch, an id member the
 * gateway cannot replace): the request goes upstream on a connection of its own, never reused
 * (upstream.h). Before or during the forward (a filter's on_forward). */
void exchange_upstream_alone(exchange_t *ex);
/* Forwards body instead of the request's own (the parsed message stays as it was). */
void exchange_replace_body(exchange_t *ex, const char *body, size_t len);
/* Answers the agent with a complete response the gateway wrote (replays, refusals). */
void exchange_respond_json(exchange_t *ex, int status, const char *body, const char *extra);
/* The stage is done without an answer (the agent has gone). */
void exchange_end(exchange_t *ex);

/* Lets held bytes go to the agent and ends the response if the upstream has ended. */
void exchange_release(exchange_t *ex);
/* Drops the held bytes and answers with body (a JSON-RPC response) instead: as the whole
 * response when nothing reached the agent yet, else as a last event of its SSE stream. */
void exchange_replace_answer(exchange_t *ex, const char *body);
/* Gives the agent body (a JSON-RPC response) as its final answer now, while the upstream's
 * answer goes on being read and observed to its end for the stage (answer_after): as the
 * whole response when nothing reached the agent yet, else as a last event of its stream. */
void exchange_answer_early(exchange_t *ex, const char *body);
/* Ends the upstream side now, as if the upstream had closed it (the call was cancelled). */
void exchange_end_upstream(exchange_t *ex);
/* From on_end: the upstream connection carried something it should not; never reuse it. */
void exchange_discard_upstream(exchange_t *ex);

/* For the request's log line and span: what happened ("replay", "refused", ...; a static
 * string). */
void exchange_set_outcome(exchange_t *ex, const char *outcome);

/* A duplicate of an earlier call, as the log line tells it (dupsource.h judges the source). */
typedef struct exchange_dup_facts {
    const char *source;      /* duplicate_source, the layer that most likely retried; NULL: none */
    int attempt;             /* attempt: this one's number, the first call being 1 */
    const char *first_seen;  /* first_seen: when the first was claimed, as the store wrote it */
    uint64_t gap_ms;         /* gap_ms: since then */
    const char *first_state; /* first_state: the first call's state when this one came */
} exchange_dup_facts_t;

/* What the handlers know of a request beyond the exchange's own members. The exchange writes
 * each one set into the request's log line as a JSON string member of the same name, in this
 * order (the duplicate's five members where dup is, a number for attempt and gap_ms), and its
 * span reads key_hash, dup.source and code from here. NULL leaves a member out. */
typedef struct exchange_facts {
    const char *key_hash;         /* the call's key hash; its first KEY_HASH_LOG_LEN characters */
    const char *code;             /* the code of an answer the gateway wrote */
    exchange_dup_facts_t dup;     /* the call is a duplicate */
    const char *recorded;         /* the state written for the key */
    const char *why;              /* why: that state's reason, or a refusal's */
    const char *answered;         /* "still_running": answered before the call ended */
    const char *cancel;           /* "kept": the caller's cancel was not passed on */
    const char *task_session;     /* "routed": a task's poll sent to the task's session */
    const char *forbidden_header; /* a refused Host or Origin: the header, */
    const char *value;            /* its value (printable ASCII), */
    const char *setting;          /* and the setting that would allow it */
    const char *duplicate_header; /* a header sent more than once */
} exchange_facts_t;

/* Replaces the request's facts with f's (its strings are copied). */
void exchange_set_facts(exchange_t *ex, const exchange_facts_t *f);

#endif
