/* The proxy: one exchange per agent request, relaying it to the upstream and the response
 * back as it arrives, with backpressure both ways. Protected tool calls pass through the
 * idempotency stage (idem.c), which uses the exchange fields below; nothing else should.
 *
 * Lifetime: an exchange lives until the upstream response has ended, any store write for it
 * has finished, and the agent has its answer or has gone. The agent leaving does not end a
 * POST exchange: the upstream response is read to the end so a protected result is stored. */
#ifndef IDEMGW_PROXY_H
#define IDEMGW_PROXY_H

#include "http_conn.h"
#include "mcp.h"
#include "sse.h"
#include "upstream.h"

#include <stdbool.h>
#include <stdint.h>

struct idem_call;

typedef struct exchange {
    uint64_t conn_id;    /* agent connection id, for logs */
    http_conn_t *client; /* NULL once the agent has gone */
    http_request_t *req; /* owned */
    mcp_msg_t msg;       /* parsed POST body */
    bool has_msg;
    upstream_conn_t *up; /* while the upstream exchange runs */
    bool fresh_upstream; /* forward on a new connection: no earlier response can reach it */

    int status;      /* response status sent (or to send) to the agent */
    bool head_sent;  /* response head written to the agent */
    bool relayed;    /* some upstream bytes already went out to the agent, not held */
    bool chunked;    /* agent response uses chunked framing */
    bool keep_alive; /* agent connection may be reused afterwards */
    bool resp_sse;   /* the upstream answered text/event-stream */
    bool up_done;    /* upstream exchange ended (or never started) */
    upstream_result_t up_result;
    bool client_done;  /* agent response complete */
    bool paused;       /* upstream reading paused for backpressure */
    bool cut;          /* the gateway ended the upstream exchange itself (a cancelled call) */
    json_t *cancel_id; /* notifications/cancelled: the requestId it names; owned */

    struct idem_call *call; /* the idempotency stage's state, protected calls only */
    bool holding;           /* bytes for the agent are held back until the store write ends */
    struct evbuffer *held;  /* those bytes */
    /* resumption: the raw SSE bytes of a POST stream and where each event id ends in them,
     * so an agent that drops the stream can pick it up again with GET + Last-Event-ID while
     * the gateway still holds the upstream stream open */
    struct evbuffer *sse_log;
    sse_parser_t sse_ids;
    struct sse_mark *marks; /* event id -> end offset in sse_log */
    size_t n_marks, cap_marks;
    size_t sse_total;                     /* bytes appended to sse_log */
    size_t sse_unheld;                    /* of those, bytes already passed on (not held back) */
    bool sse_tracking;                    /* off once the stream outgrows the resumption limit */
    struct exchange *next_tracked;        /* in the list of streams kept for resumption */
    struct exchange *next_get, *prev_get; /* in the list of GET streams, ended by a drain */
    bool in_get_list;
    int deferred_status; /* an error answer waiting for the outcome to be recorded */
    const char *deferred_message;
    const char *outcome;   /* for the log line: "forwarded", "replay", ... */
    const char *extra_log; /* extra detail for the log line */
    char log_detail[400];  /* storage for a detail the proxy itself adds to the log line */
    uint64_t start_ms;
} exchange_t;

/* Drain: ends every GET stream (they carry no call and never end by themselves; the agent
 * reconnects elsewhere). POST streams are left to finish. */
void proxy_drain(void);

/* The request handler of the MCP listener. */
void proxy_handle(http_conn_t *conn, http_request_t *req);

/* Forwards the request upstream; extra_headers ("Name: v\r\n"...) may be NULL. */
void proxy_forward(exchange_t *ex, const char *extra_headers);
/* Ends the upstream side now, as if the upstream had closed it (the call was cancelled). */
void proxy_end_upstream(exchange_t *ex);
/* Answers the agent with a complete JSON response the gateway wrote (replays, refusals). */
void proxy_respond_json(exchange_t *ex, int status, const char *body, const char *extra_headers);
/* Releases bytes held for the store write and finishes the response if the upstream ended. */
void proxy_release_held(exchange_t *ex);
/* Drops the held bytes and answers with body (a JSON-RPC response) instead: as the whole
 * response when nothing reached the agent yet, else as a last event of its SSE stream. */
void proxy_replace_answer(exchange_t *ex, const char *body);
/* The idempotency stage is done with the exchange; it may now be freed. */
void proxy_maybe_free(exchange_t *ex);

/* Several workers: once this worker reads no stream of session and waits for no result on
 * one, resumes of that session are no longer sent here (handoff.h). */
void proxy_session_maybe_idle(const char *session);

#endif
