/* The stdio upstream's objects, shared by its files: upstream_stdio.c (children, sessions,
 * calls) and stdio_route.c (which caller a message of the server's belongs to). Private to
 * src/net. */
#ifndef IDEMGW_STDIO_INT_H
#define IDEMGW_STDIO_INT_H

#include "http_headers.h"
#include "log_limit.h"
#include "upstream.h"
#include "upstream_stdio.h"

#include <event2/util.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct event;
struct evbuffer;
struct bufferevent;
struct event_base;

#define SESSION_BUCKETS 1024
#define STDERR_LINE_MAX 4096
#define OUT_HIGH_WATER                                                                             \
    (1u << 20)                    /* a paused call holding this much: its child stops being        \
                                   * read (one caller), or the call is cut off (shared) */
#define IN_HIGH_WATER (16u << 20) /* a child not reading its stdin: new requests get 503 */
#define LONG_LINE_KEEP 128        /* ends of an over-long line kept to find its id */
#define SESSION_ID_MAX 88 /* a session's id: 32 hex, or "caller:" (2026: "caller26:") and a tag */
#define CALLER_MAX 72     /* a caller tag (upstream_request_t.caller), cut to this */
#define SREQ_MAX 256      /* server requests awaiting their caller's answer, per child */
#define ERR_TAIL_MAX 512  /* the end of a child's stderr kept to say why it failed */
#define MARK_MAX 40       /* a child's mark (stdio_proc.c) */
#define ERR_LOG_RATE 50   /* a child's stderr lines logged a second, after a burst */
#define ERR_LOG_BURST 200
#define UNENDED_WAIT_MS 100   /* a pause after a line without its newline */
#define GONE_GRACE_MS 30000   /* a session whose agent dropped its GET stream: idle after */
#define CANCEL_GRACE_MS 5000  /* a cancelled request's answer is awaited this long, no more */
#define DISCOVER_WAIT_MS 5000 /* a server silent on server/discover this long is a 2025 one */

typedef struct stdio_up stdio_up_t;
typedef struct child child_t;
typedef struct session session_t;
typedef struct pend pend_t;
typedef struct sreq sreq_t;
typedef struct proc_kill proc_kill_t;

typedef enum { MODE_JSON, MODE_SSE, MODE_GET, MODE_FIXED } call_mode_t;

struct upstream_call {
    stdio_up_t *up;
    session_t *sess;         /* NULL: a call without a session */
    child_t *child;          /* where its requests went, NULL when none did */
    char caller[CALLER_MAX]; /* who sent it (upstream_request_t.caller), "" for the gateway */
    bool modern;             /* its requests are of the 2026 era (stdio_era.c) */
    bool cancelled;          /* its one request was cancelled: CANCEL_GRACE_MS, then it ends */
    upstream_cbs_t cb;
    void *arg;
    call_mode_t mode;
    int outstanding;                /* requests whose answers are awaited */
    json_t *answers;                /* MODE_JSON: the answers so far */
    bool batch;                     /* the body was an array */
    json_t *init_id;                /* an initialize waiting for the child's answer: its own id */
    upstream_call_t *snext, *sprev; /* in sess->calls */
    upstream_call_t *wnext;         /* in child->init_waiters or child->era_waiters */
    json_t *parked;                 /* on era_waiters: its messages, sent once the era is known */
    /* what the owner is yet to hear, handed over from kick */
    int status;
    http_headers_t headers;
    bool head_queued, head_sent;
    struct evbuffer *out;
    bool end_queued;
    upstream_result_t res;
    bool paused, full;
    struct event *kick, *timer;
};

struct pend {
    uint64_t gid;          /* the id the child saw */
    json_t *orig_id;       /* the agent's */
    json_t *orig_token;    /* the agent's progress token, or NULL */
    upstream_call_t *call; /* NULL: its call is gone, the answer is dropped */
    bool init;             /* the child's initialize */
    bool probe;            /* the child's server/discover: does it speak the 2026 era? */
    bool discover;         /* a ping standing for a caller's server/discover (bridged) */
    bool cacheable;        /* a 2026 caller's list or read on a 2025 child (bridged) */
    pend_t *next;
};

/* A request the server sent, delivered to one caller under an id of the gateway's own: only
 * an answer from that caller, naming that id, reaches the server, under the server's id. */
struct sreq {
    uint64_t gid;               /* the id the caller saw */
    json_t *server_id;          /* the id the server gave it */
    char scope[SESSION_ID_MAX]; /* the caller it went to (stdio_call_scope) */
    sreq_t *next;
};

struct session {
    char id[SESSION_ID_MAX];
    bool hidden; /* a sessionless caller's own child (per_session): never named by a header */
    stdio_up_t *up;
    child_t *child;
    upstream_call_t *get;   /* the GET stream, or NULL */
    json_t *caps;           /* the client's capabilities, from its initialize */
    json_t *subs;           /* resource URIs it subscribed to (resources/subscribe) */
    upstream_call_t *calls; /* POSTs in flight */
    struct event *idle;
    bool registered;
    uint64_t last_ms; /* its last request: the least recently used goes first at the limit */
    session_t *hnext; /* hash chain */
    session_t *cnext, *cprev; /* in child->sessions */
};

struct child {
    stdio_up_t *up;
    pid_t pid;           /* 0: not started yet (waiting for the first child to start) */
    char mark[MARK_MAX]; /* in its environment and its helpers': IDEMGW_SERVER_MARK */
    struct bufferevent *in, *out, *err;
    pend_t *pends; /* newest first */
    uint64_t next_gid;
    session_t *sessions;
    bool shared;
    bool own_init;       /* initialized by the gateway (shared, or a sessionless caller's) */
    bool for_modern;     /* opened for 2026 callers: server/discover first (stdio_era.c) */
    bool modern;         /* it answered server/discover: it speaks the 2026 era */
    bool era_known;      /* what it speaks is known (always, unless for_modern) */
    bool init_out;       /* for_modern: server/discover went unanswered, initialize is out */
    bool ready;          /* requests may be written (own_init: once initialized) */
    bool initializing;   /* own_init: the initialize is out */
    json_t *init_result; /* shared: the answer every later session gets (modern: discover's) */
    json_t *init_req;    /* own_init: its initialize, written once it has started */
    upstream_call_t *init_waiters;
    upstream_call_t *era_waiters; /* 2026 calls waiting for the answer to server/discover */
    sreq_t *sreqs;                /* its requests delivered to callers, newest first */
    int n_sreqs;
    struct evbuffer *held; /* lines waiting for ready */
    bool stopping, exited, gone;
    bool start_timed_out; /* it did not answer within start_timeout */
    int n_full;
    struct event *unended;       /* a line without its newline: taken as one after a pause */
    struct event *start_timer;   /* from its start to its initialize's answer */
    struct event *probe_timer;   /* for_modern: from its start to server/discover's answer */
    uint64_t probe_gid;          /* that request's id while it is out, else 0 */
    char err_tail[ERR_TAIL_MAX]; /* the last of what it wrote on stderr, lines joined by " | " */
    size_t err_tail_len;
    log_limit_t err_limit; /* its stderr lines in the gateway's log */
    /* an over-long stdout line being skipped: its first and last bytes */
    bool skipping;
    char head[LONG_LINE_KEEP + 1], tail[LONG_LINE_KEEP + 1];
    size_t head_len, tail_len;
    child_t *next;
};

struct stdio_up {
    struct event_base *base;
    stdio_conf_t conf;
    char *path;
    const upstream_limits_t *limits;
    size_t max_line;
    char *label; /* the program's name for logs */
    child_t *children;
    int n_children;
    child_t *shared;    /* the child sessions share (shared mode) and sessionless calls use */
    child_t *shared26;  /* shared mode: the one 2026 callers share (stdio_era.c) */
    bool legacy_only;   /* a child of the command did not speak the 2026 era */
    uint64_t next_sreq; /* the ids server requests reach callers with */
    uint64_t unrouted;  /* server messages no caller could be told apart for: dropped */
    proc_kill_t *kills; /* processes to SIGKILL once their grace is out */
    /* Until one child of the command has answered initialize, one starts at a time: several
     * `npx -y` on an empty cache at once collide. */
    bool proven;
    child_t *starting;
    session_t *buckets[SESSION_BUCKETS];
    struct event *sigchld;
};

/* upstream_stdio.c: calls and sessions */
/* A message for the agent on the call's stream (an event) or in its JSON answer. */
void stdio_call_deliver(upstream_call_t *call, json_t *msg);
/* One of the call's requests was answered; the last one ends the call (UPSTREAM_OK). */
void stdio_call_answered(upstream_call_t *call);
/* The call ends with res, from its own event. */
void stdio_call_end(upstream_call_t *call, upstream_result_t res);
/* The call no longer waits for anything: its pending requests' answers will be dropped. */
void stdio_call_detach(upstream_call_t *call);
/* The call is answered status with a JSON-RPC error (id may be NULL); returns call. */
upstream_call_t *stdio_call_error(upstream_call_t *call, int status, json_t *id, int code,
                                  const char *message);
/* A call of session s from now on (on its list until freed). */
void stdio_call_link(upstream_call_t *call, session_t *s);
/* A POST's messages to c, the era's bridge applied (stdio_era.c). */
void stdio_call_send(child_t *c, upstream_call_t *call, json_t *msgs);
void stdio_add_header(http_headers_t *h, const char *name, const char *value);
/* s, its initialize answered, lives on c and is found by its id. */
void stdio_session_register(session_t *s, child_t *c);
/* Frees a session that was never registered. */
void stdio_session_discard(session_t *s);
/* Ends a registered session: its calls end, its child may stop. */
void stdio_session_end(session_t *s);

/* stdio_child.c: children */
/* One line of JSON to the child (held until it is ready). */
void stdio_child_write(child_t *c, json_t *msg);
/* A request of call (NULL: the gateway's own) to c, under the next id of c's. */
pend_t *stdio_pend_add(child_t *c, upstream_call_t *call, json_t *orig_id);
/* A child for a session (own_init false: the client's initialize opens it) or one the gateway
 * opens (stdio_own_child); it starts now or once the command is proven. NULL with why. */
child_t *stdio_child_spawn(stdio_up_t *up, bool shared, bool own_init, char *why, size_t whylen);
/* A child the gateway opens itself: with server/discover for 2026 callers (for_modern), else
 * with initialize in version (NULL: the newest 2025 one). */
child_t *stdio_own_child(stdio_up_t *up, bool shared, const char *version, bool for_modern,
                         char *why, size_t whylen);
/* The shared child of a caller's era, started when none is. */
child_t *stdio_shared_child(stdio_up_t *up, json_t *init_params, bool modern, char *why,
                            size_t whylen);
/* Asks the child's process group to end: stdin closed, SIGTERM, SIGKILL after the grace. */
void stdio_child_stop(child_t *c, const char *why);
/* The child can serve no more: what waits on it ends. */
void stdio_child_gone(child_t *c, const char *why);
void stdio_child_free(child_t *c);
/* Children that exited are waited for, and those gone freed. */
void stdio_reap(stdio_up_t *up);
/* SIGCHLD on the loop. */
void stdio_on_sigchld(evutil_socket_t fd, short what, void *arg);
/* Where a message of the session's goes outside a call: its newest streaming call, else its
 * GET stream; NULL: nowhere. */
upstream_call_t *stdio_stream_of(session_t *s);
/* One message of the child's (an object of a line, or of a batch line), to where it goes. */
void stdio_child_message(child_t *c, json_t *msg);
/* The answer to the request the child saw as gid is lost (its line could not be read): its
 * call fails. false when no request has that id. */
bool stdio_answer_lost(child_t *c, uint64_t gid);

/* stdio_lines.c */
/* The read callback of the child's stdout. */
void stdio_lines_read(struct bufferevent *bev, void *arg);

/* stdio_proc.c */
/* Starts c's program: fds get its stdin's write end, its stdout's and its stderr's read ends.
 * false with why (logged). */
bool stdio_proc_spawn(child_t *c, int fds[3], char *why, size_t whylen);
/* Logs what c writes on stderr (a line at a time) and keeps its end for why it failed. */
void stdio_proc_watch_err(child_t *c);
/* What c wrote on stderr that the loop has not read yet, read now (it exited). */
void stdio_proc_drain_err(child_t *c);
/* What is left of c's stderr read, the pipe closed, the lines not logged counted. */
void stdio_proc_close_err(child_t *c);
/* why, with the end of c's stderr when it wrote any: out, or why itself. */
const char *stdio_proc_why(const child_t *c, const char *why, char *out, size_t outlen);
/* SIGTERM to c's process group now, SIGKILL after the grace even if its leader is reaped
 * first. */
void stdio_proc_stop(child_t *c);
/* c's leader was reaped: what is left of its group, and processes it started that left the
 * group (they carry its mark), are ended. */
void stdio_proc_leader_gone(child_t *c);
/* The gateway leaves: every child ended within the grace, waited for, and what they started
 * killed. */
void stdio_proc_end_all(stdio_up_t *up);

/* stdio_era.c */
/* version is a date of the 2026 era (2026-07-28 or later). */
bool stdio_era_modern(const char *version);
/* A POST's messages are of the 2026 era: its MCP-Protocol-Version (may be NULL) or a
 * request's params._meta names such a version. */
bool stdio_era_of_request(const char *header_version, json_t *msgs);
/* The server/discover that opens a 2026 connection, with id gid. */
json_t *stdio_era_discover(uint64_t gid);
/* The answer to that says the server speaks the 2026 era. */
bool stdio_era_discovered(const json_t *answer);
/* The 2026 era's results of method carry ttlMs and cacheScope. */
bool stdio_era_cacheable(const char *method);
/* An answer of a 2025 child (its initialize result init) made one for a 2026 caller: the
 * server/discover result when discover (the answer stood for one), else resultType added to
 * a result without one, and for a cacheable method's result ttlMs 0, cacheScope private. */
void stdio_era_bridge_answer(json_t *answer, const json_t *init, bool discover, bool cacheable);

/* stdio_route.c */
/* The caller a call is, for what may cross between callers of one child: its session's id,
 * else "caller:" and its caller tag. */
const char *stdio_call_scope(const upstream_call_t *call, char out[SESSION_ID_MAX]);
/* A message the server sent on its own (a request or a notification), to the caller it
 * belongs to, or to no one (a request then gets an error back). */
void stdio_route_from_server(child_t *c, json_t *msg);
/* Whether every response in msgs answers a request the server sent to the caller of call. */
bool stdio_answers_belong(child_t *c, const upstream_call_t *call, json_t *msgs);
/* A caller's answer to the server's request: rewritten to the server's id and written. */
void stdio_answer_to_server(child_t *c, const upstream_call_t *call, json_t *msg);
/* A session's resources/subscribe or unsubscribe, noted for resources/updated. */
void stdio_note_subscription(session_t *s, json_t *req);
/* The caller of scope is gone: the server's requests to it get an error. */
void stdio_sreqs_gone(child_t *c, const char *scope);
void stdio_sreqs_free(child_t *c);

#endif
