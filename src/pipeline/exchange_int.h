/* The exchange's insides: the request object's fields and the calls the router and the
 * resumption code make on it. Private to the pipeline (exchange.c, proxy.c); stages see an
 * exchange through exchange.h alone. */
#ifndef IDEMGW_EXCHANGE_INT_H
#define IDEMGW_EXCHANGE_INT_H

#include "exchange.h"
#include "proxy.h"
#include "sse.h"
#include "trace.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

/* An exchange's life. The upstream side drives it; the agent side is a pointer that becomes
 * NULL when the agent leaves (a POST is still read to its end, so its result is recorded).
 *
 *   CLASSIFYING --> CLAIMING --> FORWARDING --> STREAMING <--> HOLDING
 *        |             |             |              |             |
 *        |             |             +--------------+-------------+--> RECORDING
 *        +-------------+-------------+--------------+-------------+--------+--> DONE
 *
 * CLAIMING: a stage has the request and no upstream request is out. HOLDING: the stage keeps
 * back the bytes for the agent while the upstream still sends. RECORDING: the upstream has
 * ended and the stage holds the answer until its write is done. DONE frees the exchange. */
typedef enum {
    EX_CLASSIFYING = 0,
    EX_CLAIMING,
    EX_FORWARDING,
    EX_STREAMING,
    EX_HOLDING,
    EX_RECORDING,
    EX_DONE,
    EX_N_STATES
} ex_state_t;

typedef struct sse_mark {
    char *id;
    size_t end; /* offset in the stream just past the event */
} sse_mark_t;

struct exchange {
    proxy_t *proxy;
    ex_state_t state;
    uint64_t conn_id;    /* agent connection id, for logs */
    http_conn_t *client; /* NULL once the agent has gone or has its whole answer */
    http_request_t *req; /* owned */
    mcp_msg_t msg;       /* parsed POST body */
    bool has_msg;
    json_t *cancel_id;       /* notifications/cancelled: the requestId it names; owned */
    tool_class_t tool_class; /* of a tools/call's tool, as the router classified it */
    upstream_call_t *up;     /* while the upstream call runs */
    upstream_result_t up_result;
    bool cut;              /* the gateway ended the upstream exchange itself (a cancelled call) */
    bool discard_up;       /* the upstream connection must not be reused */
    bool paused;           /* upstream reading paused for backpressure */
    bool resp_sse;         /* the upstream answered text/event-stream */
    bool chunked;          /* agent response uses chunked framing */
    bool keep_alive;       /* agent connection may be reused afterwards */
    bool head_sent;        /* a response head was produced for the agent (maybe held) */
    bool relayed;          /* some bytes reached the agent's output, not held */
    bool answered;         /* the agent's response is complete (or was never to be) */
    bool accounted;        /* logged, traced and counted (exchange.c: account) */
    int status;            /* response status sent (or to send) to the agent */
    struct evbuffer *held; /* bytes kept back while a stage holds */
    /* a POST's response head, kept from the agent until the first byte of its body: an answer
     * cut before any of it, or found not to be the request's (a filtered JSON answer is given
     * out whole), can still be an error for the request's id, not an empty 200 or another's */
    struct evbuffer *head_wait;
    /* the gateway wrote the last event of the agent's stream: it ends whole, even when the
     * upstream's was cut */
    bool last_event_given;
    bool body_out;       /* bytes of the upstream's body went to the agent (or its hold) */
    int deferred_status; /* an error answer waiting for the hold to end */
    const char *deferred_message;
    /* the concerns watching the response, in the order they were added (exchange.h) */
    struct {
        const response_observer_t *ops;
        void *arg;
    } obs[EXCHANGE_MAX_OBSERVERS];
    int n_obs;
    const response_filter_t *filter; /* rewrites the answer before anyone reads it, or NULL */
    void *filter_arg;
    bool desync;             /* the filter found the answer not the request's */
    bool alone;              /* goes up on a connection of its own (exchange_upstream_alone) */
    struct event *desync_ev; /* ends the upstream call from the loop, out of its callbacks */
    bool ending; /* the observers' on_end are being called: their detach waits for the round */
    /* resumption: the raw SSE bytes of a POST stream and where each event id ends in them,
     * so an agent that drops the stream can pick it up again with GET + Last-Event-ID while
     * the gateway still holds the upstream stream open */
    struct evbuffer *sse_log;
    sse_parser_t sse_ids;
    sse_mark_t *marks; /* event id -> end offset in sse_log */
    size_t n_marks, cap_marks;
    size_t sse_total;  /* bytes appended to sse_log */
    size_t sse_unheld; /* of those, bytes already passed on (not held back) */
    bool sse_tracking; /* off once the stream outgrows the resumption limit */
    exchange_t *next_tracked;
    exchange_t *next_get, *prev_get;   /* GET streams, ended by a drain */
    exchange_t *next_closed;           /* on the proxy's list of ended exchanges */
    exchange_t *next_live, *prev_live; /* on the proxy's list of exchanges in flight */
    bool in_get_list;
    const char *outcome;    /* for the log line: "forwarded", "replay", ... */
    exchange_facts_t facts; /* the handlers' facts for the log line and the span */
    char *facts_kept;       /* the allocation their strings are copied into */
    uint64_t start_ms;
    uint64_t forward_ms; /* when the request went upstream (0: it did not) */
    /* tracing: the agent's request (SERVER) and the call to the upstream (CLIENT) */
    span_ctx_t span, client_span;
    uint8_t parent_span_id[8]; /* the agent's span, from its traceparent */
    bool has_parent, traced;
    uint64_t start_ns, forward_ns;
};

/* The exchanges of one router, kept by exchange.c (and by resume.c, the POST streams it
 * keeps); the router holds them (proxy_int.h) and touches none of these lists itself. */
typedef struct exchange_lists {
    exchange_t *tracked;   /* POST streams kept for resumption (the agent on them or gone) */
    exchange_t *gets;      /* GET streams in flight */
    uint64_t open;         /* exchanges in flight, and ended ones not yet freed */
    exchange_t *closed;    /* ended, freed once the loop is out of their callbacks */
    exchange_t *live;      /* not ended yet: the exit ends those a drain left */
    struct event *reap_ev; /* frees the closed ones from the loop */
} exchange_lists_t;

/* The request's Mcp-Session-Id, or NULL. */
static inline const char *exchange_session(const exchange_t *ex)
{
    return http_headers_get(&ex->req->headers, "mcp-session-id");
}
/* The agent's connection becomes ex's: its output, its drain and its leaving. */
void exchange_attach_agent(exchange_t *ex, http_conn_t *conn);
/* CORS lines for an answer the gateway writes itself, or NULL. */
char *exchange_own_cors(const exchange_t *ex);
/* A new exchange for req on conn (the request is the exchange's from now on), in CLASSIFYING. */
exchange_t *exchange_new(proxy_t *p, http_conn_t *conn, http_request_t *req);
/* Every state change goes here; a transition the table does not allow aborts. DONE logs the
 * exchange and frees it. */
void exchange_set_state(exchange_t *ex, ex_state_t to);
/* A JSON-RPC error answer written by the gateway (counted as a bad request or upstream error). */
void exchange_respond_error(exchange_t *ex, int status, int code, const char *message,
                            const char *extra);
/* Frees the ended exchanges (the loop does it after their callbacks; proxy_free at the end). */
void exchange_reap(proxy_t *p);
/* At exit: ends every exchange still in flight (its upstream call abandoned, its observers
 * detached), then frees them all and the event that reaps them. Nothing of the exchanges may
 * be used afterwards. */
void exchange_end_all(proxy_t *p);
/* A GET stream, ended by the drain. */
void exchange_track_get(exchange_t *ex);
/* A GET with Last-Event-ID for a stream this process or another worker reads: served or handed
 * over (true), else the upstream's to serve (false). */
bool exchange_resume(exchange_t *get);
/* The agent's traceparent from params._meta when the headers had none. */
void exchange_adopt_trace_meta(exchange_t *ex, const char *body, size_t len);
/* The request is a notifications/cancelled. */
bool exchange_is_cancel(const exchange_t *ex);

#endif
