/* The stdio front end (see include/stdio_front.h): stdin lines become HTTP requests to the
 * gateway, its answers become stdout lines. */
#include "stdio_front.h"

#include "http_headers.h"
#include "http_parse.h"
#include "log.h"
#include "mcp.h"
#include "revision.h"
#include "sse.h"

#include <assert.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/util.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* POSTs in flight at once; beyond, stdin is not read until one ends. */
#define MAX_IN_FLIGHT 64
/* stdout output held before the gateway's answers stop being read, and where they resume. */
#define OUT_HIGH (1024 * 1024)
#define OUT_LOW (256 * 1024)
/* The head of an answer of the gateway. */
#define MAX_HEAD_BYTES (64 * 1024)
/* The GET stream is opened again this long after it ended, doubling while it keeps failing. */
#define STREAM_RETRY_FIRST_MS 500
#define STREAM_RETRY_MAX_MS 30000
/* The largest answer relayed, when max_line is smaller: answers (a tools/list, a resource) are
 * the server's and may well be larger than what a client sends. */
#define MIN_ANSWER_BYTES (64 * 1024 * 1024)
/* Times a request's event stream is resumed (GET with Last-Event-ID) after it ended without
 * the response, as a server that polls asks (SSE polling), before the request gets an error. */
#define MAX_RESUMES 20
/* How long the DELETE that ends the session may take before the front ends without it. */
#define DELETE_TIMEOUT_MS 5000
/* What one loop turn reads of a stdin epoll cannot watch. */
#define IN_PIECE 65536
/* Characters of an HTTP error body quoted in the error a request gets. */
#define ERROR_QUOTE 200

/* JSON-RPC error codes the front answers itself. */
#define RPC_PARSE_ERROR -32700
#define RPC_INVALID_REQUEST -32600
#define RPC_INTERNAL_ERROR -32603

typedef enum {
    FRONT_STARTING = 0, /* no session yet; while an initialize is in flight, messages wait */
    FRONT_OPEN,         /* the session is known: messages go as they come */
    FRONT_DRAINING,     /* stdin ended: what is in flight (and waiting) finishes */
    FRONT_ENDING,       /* the DELETE that ends the session is in flight */
    FRONT_FLUSHING,     /* stdout's last bytes are going out */
    FRONT_DONE,         /* done() was called */
} front_state_t;

static const char *front_state_str(front_state_t st)
{
    switch (st) {
    case FRONT_STARTING:
        return "starting";
    case FRONT_OPEN:
        return "open";
    case FRONT_DRAINING:
        return "draining";
    case FRONT_ENDING:
        return "ending";
    case FRONT_FLUSHING:
        return "flushing";
    case FRONT_DONE:
        return "done";
    }
    return "?";
}

typedef enum {
    XCHG_POST = 0, /* one message from stdin */
    XCHG_RESUME,   /* the same request's event stream, resumed after it ended early */
    XCHG_STREAM,   /* the session's GET stream */
    XCHG_DELETE,   /* the end of the session */
} xchg_kind_t;

/* Where an exchange is: each state a place the code can list, changed in xchg_set_state. */
typedef enum {
    XCHG_ASKING = 0, /* the request is written; no answer head yet */
    XCHG_ANSWERING,  /* the answer's head is read; its body is arriving */
    XCHG_ANSWERED,   /* the whole answer arrived */
    XCHG_ENDED,      /* acted upon (complete or cut short); waits for the reaper */
} xchg_state_t;

static const char *xchg_state_str(xchg_state_t st)
{
    switch (st) {
    case XCHG_ASKING:
        return "asking";
    case XCHG_ANSWERING:
        return "answering";
    case XCHG_ANSWERED:
        return "answered";
    case XCHG_ENDED:
        return "ended";
    }
    return "?";
}

/* One HTTP request to the gateway and its answer, on a connection of its own. */
typedef struct xchg {
    stdio_front_t *front;
    xchg_kind_t kind;
    xchg_state_t state;
    struct bufferevent *bev; /* our end of the socket pair */
    http_parser_t parser;
    http_headers_t headers;
    int status;            /* the answer's status, 0 before its head */
    bool sse;              /* the answer is an event stream */
    sse_parser_t events;   /* its events, when sse */
    struct evbuffer *body; /* a JSON answer so far */
    bool too_large;        /* the JSON answer passed max_line: not relayed */
    json_t *id;            /* the request's id when the message is one request, else NULL */
    char *last_event_id;   /* the id of the answer's last event that had one, or NULL */
    int resumes;           /* how many resumes came before this one (XCHG_RESUME) */
    bool initialize;       /* the message is initialize */
    bool answered;         /* a response to id went to stdout */
    uint64_t started_ms;
    struct xchg *next;
} xchg_t;

/* A message read while initialize was in flight, sent once it has answered. */
typedef struct waiting {
    char *line;
    size_t len;
    struct waiting *next;
} waiting_t;

struct stdio_front {
    stdio_front_opts_t o;
    char *path;
    char **headers;
    front_state_t state;
    struct bufferevent *in;   /* stdin, or NULL when epoll cannot watch it (a file, /dev/null) */
    struct evbuffer *in_file; /* such a stdin's bytes read so far, a piece per loop turn */
    struct event *in_turn;    /* reads its next piece */
    struct bufferevent *out;  /* stdout, or NULL when it is a file: then written at once */
    bool skipping;            /* the rest of an over-long line is being dropped */
    bool in_paused;           /* MAX_IN_FLIGHT reached */
    bool in_eof;              /* stdin has ended (what it held may still wait in its buffer) */
    bool out_full;            /* answers are not read until stdout drains */
    bool out_broken;          /* stdout failed: what would go there is dropped */
    bool init_pending;        /* an initialize without a session is in flight */
    waiting_t *waiting, **waiting_tail;
    size_t n_waiting; /* messages in waiting */
    char *session;    /* Mcp-Session-Id, once initialize answered */
    char *protocol;   /* the protocolVersion initialize answered */
    xchg_t *all;      /* every exchange not yet freed */
    size_t n_posts;   /* POSTs not yet ended */
    xchg_t *stream;   /* the GET stream, or NULL */
    uint64_t stream_retry_ms;
    struct event *reopen;  /* the GET stream's next try */
    struct event *reaper;  /* frees ended exchanges outside their callbacks */
    struct event *finish;  /* calls done() outside any callback of ours */
    struct event *give_up; /* the DELETE took too long */
    bool failed;           /* the session ended under us (the server went away) */
};

static void front_check_drained(stdio_front_t *f);
static void stream_open(stdio_front_t *f);
static void send_line(stdio_front_t *f, const char *line, size_t len);
static void in_resume(stdio_front_t *f);
static void in_reading(stdio_front_t *f, bool on);

/* Every change of the front's state; they only go forward. */
static void front_set_state(stdio_front_t *f, front_state_t st)
{
    assert(st > f->state);
    log_debug(0, "stdio front: %s -> %s", front_state_str(f->state), front_state_str(st));
    f->state = st;
}

/* --- stdout --- */

static void out_pause_answers(stdio_front_t *f, bool paused)
{
    f->out_full = paused;
    for (xchg_t *x = f->all; x; x = x->next)
        if (x->state != XCHG_ENDED) {
            if (paused)
                bufferevent_disable(x->bev, EV_READ);
            else
                bufferevent_enable(x->bev, EV_READ);
        }
}

/* One JSON-RPC message as one line. Raw line breaks in JSON text are whitespace (inside a
 * string they are escaped), so they become spaces and the message stays verbatim otherwise. */
static void emit_raw(stdio_front_t *f, const char *text, size_t len)
{
    if (f->out_broken)
        return;
    struct evbuffer *out = f->out ? bufferevent_get_output(f->out) : evbuffer_new();
    size_t start = 0;
    for (size_t i = 0; i < len; i++)
        if (text[i] == '\n' || text[i] == '\r') {
            evbuffer_add(out, text + start, i - start);
            evbuffer_add(out, " ", 1);
            start = i + 1;
        }
    evbuffer_add(out, text + start, len - start);
    evbuffer_add(out, "\n", 1);
    if (!f->out) {
        /* a file takes what is written without waiting */
        while (evbuffer_get_length(out))
            if (evbuffer_write(out, f->o.out_fd) < 0 && errno != EINTR) {
                log_warn(0, "stdio front: stdout: %s", strerror(errno));
                f->out_broken = true;
                break;
            }
        evbuffer_free(out);
        return;
    }
    if (!f->out_full && evbuffer_get_length(out) > OUT_HIGH)
        out_pause_answers(f, true);
}

static void emit_json(stdio_front_t *f, const json_t *msg)
{
    char *s = json_dumps(msg, JSON_COMPACT | JSON_ENCODE_ANY);
    if (s) {
        emit_raw(f, s, strlen(s));
        free(s);
    }
}

/* An error response the front writes itself; id NULL: null. */
static void emit_error(stdio_front_t *f, const json_t *id, int code, const char *message)
{
    char *id_text = id ? json_dumps(id, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    char *body = mcp_error_body(id_text, code, message);
    emit_raw(f, body, strlen(body));
    free(body);
    free(id_text);
}

static void on_out_written(struct bufferevent *bev, void *arg)
{
    stdio_front_t *f = arg;
    size_t left = bev ? evbuffer_get_length(bufferevent_get_output(bev)) : 0;
    if (f->out_full && left <= OUT_LOW)
        out_pause_answers(f, false);
    /* a broken stdout's buffer may not drain (libevent can leave it frozen): nothing more
     * will go there, so there is nothing to wait for */
    if (f->state == FRONT_FLUSHING && (left == 0 || f->out_broken))
        event_active(f->finish, 0, 0);
}

static void on_out_event(struct bufferevent *bev, short what, void *arg)
{
    stdio_front_t *f = arg;
    if (!(what & (BEV_EVENT_ERROR | BEV_EVENT_EOF)))
        return;
    /* the agent closed its end: nobody reads answers any more, so stop as at the end of stdin */
    log_warn(0, "stdio front: stdout closed: %s",
             evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
    f->out_broken = true;
    evbuffer_drain(bufferevent_get_output(bev), evbuffer_get_length(bufferevent_get_output(bev)));
    bufferevent_disable(bev, EV_WRITE);
    if (f->out_full)
        out_pause_answers(f, false);
    if (f->state == FRONT_FLUSHING)
        event_active(f->finish, 0, 0);
    else if (f->state < FRONT_DRAINING) {
        in_reading(f, false);
        front_set_state(f, FRONT_DRAINING);
        front_check_drained(f);
    }
}

/* --- exchanges with the gateway --- */

static void xchg_end(xchg_t *x);

/* Every change of an exchange's state; they only go forward. */
static void xchg_set_state(xchg_t *x, xchg_state_t st)
{
    assert(st > x->state);
    log_debug(0, "stdio front: exchange %s -> %s", xchg_state_str(x->state), xchg_state_str(st));
    x->state = st;
}
static xchg_t *xchg_open(stdio_front_t *f, xchg_kind_t kind, const char *method, const char *body,
                         size_t len, const char *last_event_id, const char *mirror);

/* A message of the answer (a JSON body or an event's data): to stdout, noting whether it
 * answered the request. An error the gateway wrote without an id (its own JSON-RPC errors
 * name none) gets the request's, so the client can match it. */
static void xchg_deliver(xchg_t *x, const char *text, size_t len)
{
    stdio_front_t *f = x->front;
    json_error_t jerr;
    json_t *msg = json_loadb(text, len, JSON_DECODE_ANY, &jerr);
    if (!msg) {
        log_warn(0, "stdio front: the gateway's answer is not JSON (%s): dropped", jerr.text);
        return;
    }
    json_t *id = json_is_object(msg) ? json_object_get(msg, "id") : NULL;
    bool response = json_is_object(msg) && !json_object_get(msg, "method") &&
                    (json_object_get(msg, "result") || json_object_get(msg, "error"));
    if (response && x->id && !x->answered && (!id || json_is_null(id)) &&
        json_object_get(msg, "error")) {
        json_object_set(msg, "id", x->id);
        x->answered = true;
        emit_json(f, msg);
        json_decref(msg);
        return;
    }
    if (response && x->id && id && json_equal(id, x->id)) {
        x->answered = true;
        json_t *result = json_object_get(msg, "result");
        const char *version = json_string_value(json_object_get(result, "protocolVersion"));
        if (x->initialize && version) {
            free(f->protocol);
            f->protocol = xstrdup(version);
        }
    }
    json_decref(msg);
    emit_raw(f, text, len);
}

static int on_event(const sse_event_t *ev, void *arg)
{
    xchg_t *x = arg;
    if (ev->id) {
        free(x->last_event_id);
        x->last_event_id = *ev->id ? xstrdup(ev->id) : NULL;
    }
    if (ev->data_len > 0) /* a priming event carries an id and no data */
        xchg_deliver(x, ev->data, ev->data_len);
    return 0;
}

static size_t answer_limit(const stdio_front_t *f)
{
    return f->o.max_line > MIN_ANSWER_BYTES ? f->o.max_line : MIN_ANSWER_BYTES;
}

static int on_begin(void *arg)
{
    xchg_t *x = arg;
    http_headers_reset(&x->headers);
    return 0;
}

static int on_head(void *arg)
{
    xchg_t *x = arg;
    stdio_front_t *f = x->front;
    x->status = x->parser.llhttp.status_code;
    if (x->status < 200)
        return 0;
    xchg_set_state(x, XCHG_ANSWERING);
    const char *ct = http_headers_get(&x->headers, "content-type");
    x->sse = ct && strncasecmp(ct, "text/event-stream", 17) == 0;
    if (x->sse)
        sse_init(&x->events, answer_limit(f), on_event, x);
    const char *sid = http_headers_get(&x->headers, "mcp-session-id");
    if (x->initialize && x->status == 200 && sid) {
        free(f->session);
        f->session = xstrdup(sid);
    }
    return 0;
}

static int on_body(void *arg, const char *at, size_t len)
{
    xchg_t *x = arg;
    if (x->sse) {
        sse_feed(&x->events, at, len);
        return 0;
    }
    if (evbuffer_get_length(x->body) + len > answer_limit(x->front))
        x->too_large = true;
    if (!x->too_large)
        evbuffer_add(x->body, at, len);
    return 0;
}

static int on_end(void *arg)
{
    xchg_t *x = arg;
    if (x->status < 200)
        return 0; /* an interim answer: the real one follows */
    xchg_set_state(x, XCHG_ANSWERED);
    return HTTP_PARSE_STOP;
}

static const http_parse_cbs_t answer_cbs = {
    .on_begin = on_begin,
    .on_head = on_head,
    .on_body = on_body,
    .on_end = on_end,
};

static const uint64_t max_head_bytes = MAX_HEAD_BYTES;

/* What a request that got no JSON-RPC response hears: the status and the start of the body. */
static void answer_missing(xchg_t *x, bool complete)
{
    stdio_front_t *f = x->front;
    char quote[ERROR_QUOTE + 1] = "";
    size_t n = evbuffer_copyout(x->body, quote, ERROR_QUOTE);
    quote[n] = '\0';
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)quote[i] < 0x20)
            quote[i] = ' ';
    char message[400];
    if (!complete)
        snprintf(message, sizeof(message),
                 "idemgw: the gateway's answer ended before a response (HTTP %d)", x->status);
    else if (x->too_large)
        snprintf(message, sizeof(message), "idemgw: the answer is larger than %zu bytes",
                 answer_limit(f));
    else
        snprintf(message, sizeof(message), "idemgw: HTTP %d from the gateway%s%s", x->status,
                 n ? ": " : "", quote);
    emit_error(f, x->id, RPC_INTERNAL_ERROR, message);
}

/* A session that is gone answers 404: the server exited (or was stopped), and a stdio client
 * cannot begin another session; so the front ends, as the server did. */
static void session_lost(stdio_front_t *f)
{
    if (f->failed)
        return;
    log_error(0, "stdio front: the server's session ended (the server exited?): stopping");
    f->failed = true;
    if (f->state < FRONT_DRAINING) {
        in_reading(f, false);
        front_set_state(f, FRONT_DRAINING);
    }
}

/* A request's event stream that ended before its response, with an event id: the server
 * (SSE polling) or the gateway expects the client to come back with GET and Last-Event-ID. The
 * resume takes the request's place among those in flight. */
static bool resume(xchg_t *x)
{
    stdio_front_t *f = x->front;
    if (!x->sse || x->status != 200 || !x->last_event_id || !f->session ||
        x->resumes >= MAX_RESUMES || f->state >= FRONT_ENDING)
        return false;
    xchg_t *r = xchg_open(f, XCHG_RESUME, "GET", NULL, 0, x->last_event_id, NULL);
    if (!r)
        return false;
    log_debug(0, "stdio front: resuming a request's stream after event %s", x->last_event_id);
    r->id = json_incref(x->id);
    r->resumes = x->resumes + 1;
    f->n_posts++;
    return true;
}

/* The POST's answer is over: relay a JSON body, make sure a request got a response, and let
 * what waited on it go. */
static void post_ended(xchg_t *x, bool complete)
{
    stdio_front_t *f = x->front;
    size_t len = evbuffer_get_length(x->body);
    if (!x->sse && len && !x->too_large)
        xchg_deliver(x, (const char *)evbuffer_pullup(x->body, -1), len);
    if (x->id && !x->answered && !resume(x))
        answer_missing(x, complete);
    if (x->status == 404 && f->session && !x->initialize)
        session_lost(f);
    f->n_posts--;
    if (x->initialize) {
        f->init_pending = false;
        if (f->state == FRONT_STARTING && f->session)
            front_set_state(f, FRONT_OPEN);
        if (f->state == FRONT_OPEN && f->session && !f->stream)
            stream_open(f);
        /* the messages that waited go now, in their order */
        while (f->waiting && !f->init_pending) {
            waiting_t *w = f->waiting;
            f->waiting = w->next;
            if (!f->waiting)
                f->waiting_tail = &f->waiting;
            f->n_waiting--;
            send_line(f, w->line, w->len);
            free(w->line);
            free(w);
        }
    }
    in_resume(f);
    front_check_drained(f);
}

static void on_reopen(evutil_socket_t fd, short what, void *arg)
{
    stdio_front_t *f = arg;
    if (f->state == FRONT_OPEN && !f->stream)
        stream_open(f);
}

static void stream_ended(xchg_t *x)
{
    stdio_front_t *f = x->front;
    f->stream = NULL;
    if (f->state != FRONT_OPEN)
        return;
    if (x->status == 404 && f->session) {
        session_lost(f);
        front_check_drained(f);
        return;
    }
    /* 405 (or another refusal): the server offers no stream */
    if (x->status != 200) {
        log_debug(0, "stdio front: no GET stream (HTTP %d)", x->status);
        return;
    }
    /* a stream that lasted a while starts over at once, one that ends at once backs off */
    if (util_now_ms() - x->started_ms > STREAM_RETRY_MAX_MS)
        f->stream_retry_ms = STREAM_RETRY_FIRST_MS;
    uint64_t ms = f->stream_retry_ms;
    f->stream_retry_ms = ms * 2 > STREAM_RETRY_MAX_MS ? STREAM_RETRY_MAX_MS : ms * 2;
    struct timeval tv = util_ms_to_tv(ms);
    evtimer_add(f->reopen, &tv);
}

/* The answer is over (complete or not): what it means is acted on now, the exchange itself is
 * freed by the reaper. */
static void xchg_end(xchg_t *x)
{
    if (x->state == XCHG_ENDED)
        return;
    bool complete = x->state == XCHG_ANSWERED;
    xchg_set_state(x, XCHG_ENDED);
    bufferevent_disable(x->bev, EV_READ | EV_WRITE);
    stdio_front_t *f = x->front;
    switch (x->kind) {
    case XCHG_POST:
    case XCHG_RESUME:
        post_ended(x, complete);
        break;
    case XCHG_STREAM:
        stream_ended(x);
        break;
    case XCHG_DELETE:
        log_debug(0, "stdio front: session ended (HTTP %d)", x->status);
        if (f->state == FRONT_ENDING) {
            front_set_state(f, FRONT_FLUSHING);
            on_out_written(f->out, f);
        }
        break;
    }
    event_active(f->reaper, 0, 0);
}

static void on_xchg_read(struct bufferevent *bev, void *arg)
{
    xchg_t *x = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    while (x->state != XCHG_ENDED && evbuffer_get_length(in) > 0) {
        http_parse_result_t r = http_parse_chunk(&x->parser, in);
        if (r == HTTP_PARSE_END) {
            xchg_end(x);
        } else if (r == HTTP_PARSE_FAILED) {
            log_warn(0, "stdio front: the gateway's answer is not HTTP (%s)",
                     http_parse_errno_name(&x->parser));
            x->status = x->status ? x->status : 502;
            xchg_end(x);
        }
    }
}

static void on_xchg_event(struct bufferevent *bev, short what, void *arg)
{
    xchg_t *x = arg;
    if (!(what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)))
        return;
    on_xchg_read(bev, x); /* what arrived with the close */
    if (x->state == XCHG_ANSWERING)
        http_parse_finish(&x->parser); /* a body that ends at the close ends here */
    xchg_end(x);
}

static void xchg_free(xchg_t *x)
{
    if (x->bev)
        bufferevent_free(x->bev);
    if (x->sse)
        sse_free(&x->events);
    http_headers_free(&x->headers);
    evbuffer_free(x->body);
    json_decref(x->id);
    free(x->last_event_id);
    free(x);
}

static void on_reap(evutil_socket_t fd, short what, void *arg)
{
    stdio_front_t *f = arg;
    xchg_t **pp = &f->all;
    while (*pp) {
        xchg_t *x = *pp;
        if (x->state == XCHG_ENDED) {
            *pp = x->next;
            xchg_free(x);
        } else {
            pp = &x->next;
        }
    }
}

/* A request to the gateway on a new connection; NULL when no socket could be made (said in
 * the log). body NULL: none. mirror: the header lines a 2026 request's body asks for, or NULL
 * (then the session's version, if any). */
static xchg_t *xchg_open(stdio_front_t *f, xchg_kind_t kind, const char *method, const char *body,
                         size_t len, const char *last_event_id, const char *mirror)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        log_error(0, "stdio front: socketpair: %s", strerror(errno));
        return NULL;
    }
    evutil_make_socket_nonblocking(sv[0]);
    struct bufferevent *bev = bufferevent_socket_new(f->o.base, sv[0], BEV_OPT_CLOSE_ON_FREE);
    if (!bev) {
        close(sv[0]);
        close(sv[1]);
        return NULL;
    }
    f->o.connect(f->o.arg, sv[1]);
    xchg_t *x = xcalloc(1, sizeof(*x));
    x->front = f;
    x->kind = kind;
    x->bev = bev;
    x->body = evbuffer_new();
    x->started_ms = util_now_ms();
    http_headers_init(&x->headers);
    http_parse_init(&x->parser, HTTP_RESPONSE, &answer_cbs, x, &x->headers, &max_head_bytes, false);
    struct evbuffer *out = bufferevent_get_output(bev);
    evbuffer_add_printf(out, "%s %s HTTP/1.1\r\nHost: localhost\r\n", method, f->path);
    if (kind == XCHG_POST)
        evbuffer_add_printf(out,
                            "Content-Type: application/json\r\nContent-Length: %zu\r\n"
                            "Accept: application/json, text/event-stream\r\n",
                            len);
    else
        evbuffer_add_printf(out, "Accept: text/event-stream\r\n");
    if (last_event_id)
        evbuffer_add_printf(out, "Last-Event-ID: %s\r\n", last_event_id);
    if (f->session)
        evbuffer_add_printf(out, "Mcp-Session-Id: %s\r\n", f->session);
    if (mirror)
        evbuffer_add(out, mirror, strlen(mirror));
    else if (f->protocol)
        evbuffer_add_printf(out, "MCP-Protocol-Version: %s\r\n", f->protocol);
    for (size_t i = 0; i < f->o.n_headers; i++)
        evbuffer_add_printf(out, "%s\r\n", f->headers[i]);
    evbuffer_add_printf(out, "Connection: close\r\n\r\n");
    if (body)
        evbuffer_add(out, body, len);
    bufferevent_setcb(bev, on_xchg_read, NULL, on_xchg_event, x);
    bufferevent_enable(bev, f->out_full ? EV_WRITE : EV_READ | EV_WRITE);
    x->next = f->all;
    f->all = x;
    return x;
}

static void stream_open(stdio_front_t *f)
{
    f->stream = xchg_open(f, XCHG_STREAM, "GET", NULL, 0, NULL, NULL);
}

/* --- stdin --- */

/* A message that parsed: a POST of its own (the line as it was read). */
static void send_line(stdio_front_t *f, const char *line, size_t len)
{
    json_t *msg = json_loadb(line, len, JSON_DECODE_ANY, NULL);
    json_t *id = json_is_object(msg) ? json_object_get(msg, "id") : NULL;
    const char *method =
        json_string_value(json_is_object(msg) ? json_object_get(msg, "method") : NULL);
    bool request = method && id && !json_is_null(id);
    bool initialize = method && strcmp(method, "initialize") == 0;
    char *mirror = json_is_object(msg) ? revision_mirror_headers(msg) : NULL;
    xchg_t *x = xchg_open(f, XCHG_POST, "POST", line, len, NULL, mirror);
    free(mirror);
    if (!x) {
        if (request)
            emit_error(f, id, RPC_INTERNAL_ERROR, "idemgw: cannot reach the gateway");
        json_decref(msg);
        front_check_drained(f);
        return;
    }
    if (request)
        x->id = json_incref(id);
    x->initialize = initialize;
    if (initialize && !f->session)
        f->init_pending = true;
    f->n_posts++;
    json_decref(msg);
    if (f->n_posts >= MAX_IN_FLIGHT && f->state < FRONT_DRAINING && !f->in_paused) {
        f->in_paused = true;
        in_reading(f, false);
    }
}

/* Why m is no JSON-RPC message a client may send (NULL: it is one): a request or notification
 * (a string method; an id, if any, a string, a number or null) or an answer to the server's
 * request (an id that is a string or a number, with result or error). The gateway's upstream
 * may not check this itself: a server behind HTTP can drop `{}` without a word, and an id that
 * is an object would come back as given, where JSON-RPC says the answer's id is null. */
static const char *message_invalid(const json_t *m)
{
    if (!json_is_object(m))
        return "a message is a JSON object";
    const json_t *id = json_object_get(m, "id");
    const json_t *method = json_object_get(m, "method");
    if (id && !json_is_string(id) && !json_is_number(id) && !json_is_null(id))
        return "an id is a string or a number";
    if (method)
        return json_is_string(method) ? NULL : "a method is a string";
    if (!id || json_is_null(id))
        return "neither a request, a notification nor an answer";
    if (!json_object_get(m, "result") && !json_object_get(m, "error"))
        return "an answer has a result or an error";
    return NULL;
}

/* The id an invalid request's error names: its own when it is a valid one, else null. */
static const json_t *usable_id(const json_t *m)
{
    const json_t *id = json_is_object(m) ? json_object_get(m, "id") : NULL;
    return json_is_string(id) || json_is_number(id) ? id : NULL;
}

/* Answers a message (an object or an array) that is not a valid JSON-RPC message or batch
 * with Invalid Request errors, and says true: nothing of it goes to the gateway. In a batch with
 * an invalid member every member that has a valid id hears that it was not run, so no request
 * of the client waits for an answer that never comes. */
static bool refuse_invalid(stdio_front_t *f, const json_t *msg)
{
    char message[200];
    if (json_is_object(msg)) {
        const char *why = message_invalid(msg);
        if (!why)
            return false;
        snprintf(message, sizeof(message), "Invalid Request: %s", why);
        emit_error(f, NULL, RPC_INVALID_REQUEST, message);
        return true;
    }
    if (json_array_size(msg) == 0) {
        emit_error(f, NULL, RPC_INVALID_REQUEST, "Invalid Request: an empty batch");
        return true;
    }
    size_t i, bad = 0;
    const json_t *m;
    json_array_foreach(msg, i, m) bad += message_invalid(m) != NULL;
    if (!bad)
        return false;
    json_array_foreach(msg, i, m)
    {
        const char *why = message_invalid(m);
        if (why)
            snprintf(message, sizeof(message), "Invalid Request: %s (batch member %zu)", why, i);
        else
            snprintf(message, sizeof(message),
                     "Invalid Request: not run, the batch it came in has an invalid member");
        if (why || usable_id(m))
            emit_error(f, why ? NULL : usable_id(m), RPC_INVALID_REQUEST, message);
    }
    return true;
}

static void handle_line(stdio_front_t *f, const char *line, size_t len)
{
    if (len == 0)
        return; /* an empty line (line may be NULL: no bytes were pulled up) */
    while (len && (line[len - 1] == '\r' || line[len - 1] == ' ' || line[len - 1] == '\t'))
        len--;
    size_t skip = 0;
    while (skip < len && (line[skip] == ' ' || line[skip] == '\t'))
        skip++;
    line += skip;
    len -= skip;
    if (len == 0)
        return;
    json_error_t jerr;
    json_t *msg = json_loadb(line, len, JSON_DECODE_ANY, &jerr);
    if (!msg) {
        char message[300];
        snprintf(message, sizeof(message), "Parse error: %s (at byte %d)", jerr.text,
                 jerr.position);
        emit_error(f, NULL, RPC_PARSE_ERROR, message);
        return;
    }
    bool shaped = json_is_object(msg) || json_is_array(msg);
    if (!shaped) {
        json_decref(msg);
        emit_error(f, NULL, RPC_INVALID_REQUEST,
                   "Invalid Request: a message is a JSON object (or an array of them)");
        return;
    }
    bool refused = refuse_invalid(f, msg);
    json_decref(msg);
    if (refused)
        return;
    if (f->init_pending) {
        waiting_t *w = xcalloc(1, sizeof(*w));
        w->line = xstrndup(line, len);
        w->len = len;
        *f->waiting_tail = w;
        f->waiting_tail = &w->next;
        /* a client that does not wait for initialize's answer is not read without bound */
        if (++f->n_waiting >= MAX_IN_FLIGHT && !f->in_paused) {
            f->in_paused = true;
            in_reading(f, false);
        }
        return;
    }
    send_line(f, line, len);
}

static void too_long(stdio_front_t *f)
{
    char message[200];
    snprintf(message, sizeof(message),
             "Invalid Request: the message is longer than %zu bytes (dropped)", f->o.max_line);
    emit_error(f, NULL, RPC_INVALID_REQUEST, message);
}

/* The lines in stdin's buffer, as many as may go now; once stdin has ended, the last one
 * without its newline too (still a message), then the drain. Run on new input, at the end of
 * stdin, and when a pause is over. */
static void in_process(stdio_front_t *f)
{
    struct evbuffer *in = f->in ? bufferevent_get_input(f->in) : f->in_file;
    while (!f->in_paused && f->state < FRONT_DRAINING && evbuffer_get_length(in)) {
        size_t eol_len = 0;
        struct evbuffer_ptr eol = evbuffer_search_eol(in, NULL, &eol_len, EVBUFFER_EOL_LF);
        if (f->skipping) {
            size_t n = eol.pos < 0 ? evbuffer_get_length(in) : (size_t)eol.pos + eol_len;
            evbuffer_drain(in, n);
            f->skipping = eol.pos < 0;
            continue;
        }
        if (eol.pos < 0) {
            if (evbuffer_get_length(in) > f->o.max_line) {
                too_long(f);
                evbuffer_drain(in, evbuffer_get_length(in));
                f->skipping = true;
            }
            break;
        }
        size_t n = (size_t)eol.pos;
        if (n > f->o.max_line)
            too_long(f);
        else
            handle_line(f, (const char *)evbuffer_pullup(in, (ssize_t)n), n);
        evbuffer_drain(in, n + eol_len);
    }
    if (!f->in_eof || f->in_paused || f->state >= FRONT_DRAINING)
        return;
    size_t n = evbuffer_get_length(in);
    if (n && !f->skipping) {
        if (n > f->o.max_line)
            too_long(f);
        else
            handle_line(f, (const char *)evbuffer_pullup(in, -1), n);
    }
    evbuffer_drain(in, n);
    log_info(0, "stdio front: stdin ended: finishing %zu requests in flight", f->n_posts);
    front_set_state(f, FRONT_DRAINING);
    front_check_drained(f);
}

/* Reading stopped at MAX_IN_FLIGHT; it goes on once fewer are in flight (or waiting). */
static void in_resume(stdio_front_t *f)
{
    if (!f->in_paused || f->n_posts >= MAX_IN_FLIGHT || f->n_waiting >= MAX_IN_FLIGHT ||
        f->state >= FRONT_DRAINING)
        return;
    f->in_paused = false;
    if (!f->in_eof)
        in_reading(f, true);
    in_process(f); /* what was read before the pause */
}

/* Reading stdin on or off: a watched one through its bufferevent, another a piece per turn. */
static void in_reading(stdio_front_t *f, bool on)
{
    if (f->in) {
        if (on)
            bufferevent_enable(f->in, EV_READ);
        else
            bufferevent_disable(f->in, EV_READ);
    } else if (on && !f->in_eof) {
        event_active(f->in_turn, 0, 0);
    }
}

/* A stdin epoll cannot watch is always readable: one piece per loop turn, so the gateway's
 * answers go on between them. */
static void on_in_turn(evutil_socket_t fd, short what, void *arg)
{
    stdio_front_t *f = arg;
    if (f->in_eof || f->in_paused || f->state >= FRONT_DRAINING)
        return;
    int n = evbuffer_read(f->in_file, f->o.in_fd, IN_PIECE);
    if (n < 0)
        log_warn(0, "stdio front: stdin: %s", strerror(errno));
    if (n <= 0)
        f->in_eof = true;
    in_process(f);
    if (!f->in_eof && !f->in_paused && f->state < FRONT_DRAINING)
        event_active(f->in_turn, 0, 0);
}

static void on_in_read(struct bufferevent *bev, void *arg)
{
    in_process(arg);
}

static void on_in_event(struct bufferevent *bev, short what, void *arg)
{
    stdio_front_t *f = arg;
    if (!(what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)))
        return;
    if (what & BEV_EVENT_ERROR)
        log_warn(0, "stdio front: stdin: %s", evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
    bufferevent_disable(bev, EV_READ);
    f->in_eof = true;
    in_process(f);
}

/* --- the end --- */

/* Once stdin has ended and nothing is in flight or waiting: close the stream, end the session,
 * flush stdout. */
static void front_check_drained(stdio_front_t *f)
{
    if (f->state != FRONT_DRAINING || f->n_posts || f->init_pending || f->waiting)
        return;
    evtimer_del(f->reopen);
    if (f->stream) {
        xchg_t *s = f->stream;
        f->stream = NULL;
        xchg_set_state(s, XCHG_ENDED);
        bufferevent_disable(s->bev, EV_READ | EV_WRITE);
        event_active(f->reaper, 0, 0);
    }
    if (f->session && xchg_open(f, XCHG_DELETE, "DELETE", NULL, 0, NULL, NULL)) {
        front_set_state(f, FRONT_ENDING);
        struct timeval tv = util_ms_to_tv(DELETE_TIMEOUT_MS);
        evtimer_add(f->give_up, &tv);
        return;
    }
    front_set_state(f, FRONT_FLUSHING);
    on_out_written(f->out, f);
}

static void on_give_up(evutil_socket_t fd, short what, void *arg)
{
    stdio_front_t *f = arg;
    if (f->state != FRONT_ENDING)
        return;
    log_warn(0, "stdio front: the session's DELETE got no answer in %d ms: ending without it",
             DELETE_TIMEOUT_MS);
    for (xchg_t *x = f->all; x; x = x->next)
        if (x->kind == XCHG_DELETE && x->state != XCHG_ENDED)
            xchg_end(x);
}

static void on_finish(evutil_socket_t fd, short what, void *arg)
{
    stdio_front_t *f = arg;
    if (f->state != FRONT_FLUSHING)
        return;
    front_set_state(f, FRONT_DONE);
    f->o.done(f->o.arg, f->failed);
}

/* --- making and freeing --- */

/* Whether epoll can watch fd: pipes, sockets and terminals; not a regular file or /dev/null
 * (an agent gives pipes; a person may redirect a file). */
static bool pollable(int fd)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return false;
    return S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode) || (S_ISCHR(st.st_mode) && isatty(fd));
}

/* A bufferevent on fd, or NULL for a descriptor epoll cannot watch (used another way), or
 * NULL with msg set for one that is not open. */
static struct bufferevent *fd_bev(struct event_base *base, int fd, bool *failed, char *msg,
                                  size_t msglen)
{
    struct stat st;
    *failed = false;
    if (fstat(fd, &st) != 0) {
        snprintf(msg, msglen, "descriptor %d: %s", fd, strerror(errno));
        *failed = true;
        return NULL;
    }
    if (!pollable(fd))
        return NULL;
    evutil_make_socket_nonblocking(fd);
    struct bufferevent *bev = bufferevent_socket_new(base, fd, 0);
    if (!bev) {
        snprintf(msg, msglen, "descriptor %d cannot be watched", fd);
        *failed = true;
    }
    return bev;
}

stdio_front_t *stdio_front_new(const stdio_front_opts_t *o, char *msg, size_t msglen)
{
    bool failed;
    struct bufferevent *in = fd_bev(o->base, o->in_fd, &failed, msg, msglen);
    if (failed)
        return NULL;
    struct bufferevent *out = fd_bev(o->base, o->out_fd, &failed, msg, msglen);
    if (failed) {
        if (in)
            bufferevent_free(in);
        return NULL;
    }
    stdio_front_t *f = xcalloc(1, sizeof(*f));
    f->o = *o;
    f->path = xstrdup(o->path);
    f->headers = xcalloc(o->n_headers + 1, sizeof(char *));
    for (size_t i = 0; i < o->n_headers; i++)
        f->headers[i] = xstrdup(o->headers[i]);
    f->o.headers = NULL;
    f->in = in;
    f->out = out;
    f->waiting_tail = &f->waiting;
    f->stream_retry_ms = STREAM_RETRY_FIRST_MS;
    f->reopen = evtimer_new(o->base, on_reopen, f);
    f->reaper = event_new(o->base, -1, 0, on_reap, f);
    f->finish = event_new(o->base, -1, 0, on_finish, f);
    f->give_up = evtimer_new(o->base, on_give_up, f);
    f->in_turn = event_new(o->base, -1, 0, on_in_turn, f);
    if (in) {
        bufferevent_setcb(in, on_in_read, NULL, on_in_event, f);
    } else {
        f->in_file = evbuffer_new();
        log_debug(0, "stdio front: stdin cannot be watched (a file?): read a piece per turn");
    }
    in_reading(f, true);
    if (out) {
        bufferevent_setcb(out, NULL, on_out_written, on_out_event, f);
        bufferevent_setwatermark(out, EV_WRITE, OUT_LOW, 0);
        bufferevent_enable(out, EV_WRITE);
    }
    return f;
}

void stdio_front_free(stdio_front_t *f)
{
    if (!f)
        return;
    while (f->all) {
        xchg_t *x = f->all;
        f->all = x->next;
        xchg_free(x);
    }
    while (f->waiting) {
        waiting_t *w = f->waiting;
        f->waiting = w->next;
        free(w->line);
        free(w);
    }
    /* what is still queued for stdout (a drain cut short by a signal) goes as far as the pipe
     * takes it now; never a blocking write, which a client that stopped reading would hang */
    struct evbuffer *left = f->out ? bufferevent_get_output(f->out) : NULL;
    if (left && !f->out_broken)
        while (evbuffer_get_length(left) && evbuffer_write(left, f->o.out_fd) > 0)
            ;
    if (f->in)
        bufferevent_free(f->in);
    if (f->in_file)
        evbuffer_free(f->in_file);
    event_free(f->in_turn);
    if (f->out)
        bufferevent_free(f->out);
    event_free(f->reopen);
    event_free(f->reaper);
    event_free(f->finish);
    event_free(f->give_up);
    for (size_t i = 0; i < f->o.n_headers; i++)
        free(f->headers[i]);
    free(f->headers);
    free(f->path);
    free(f->session);
    free(f->protocol);
    free(f);
}
