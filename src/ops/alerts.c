/* Alerts on keys that become unknown (include/alerts.h). */
#include "alerts.h"

#include "config.h"
#include "http_headers.h"
#include "log.h"
#include "store.h"
#include "store_queue.h"
#include "upstream_http.h"
#include "util.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <jansson.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Keys already announced, by key_hash and the time their outcome became unknown, so a poll
 * that overlaps the last one announces nothing twice. */
#define SEEN_MAX 4096

typedef struct pending_alert {
    struct pending_alert *next;
    char *body;
    int tries; /* attempts made */
} pending_alert_t;

struct alerts {
    struct event_base *base;
    struct store *store;
    alerts_format_t format;
    http_url_t url;
    struct ssl_ctx_st *tls;
    upstream_limits_t limits;
    upstream_pool_t *pool;
    struct event *poll_ev;  /* every ALERTS_POLL_MS */
    struct event *retry_ev; /* the pause before the next attempt */
    struct poll_call *poll; /* the list on its way, or NULL */
    bool started;           /* the first poll found where to start from */
    int64_t since_ms;       /* the newest update seen: the next poll asks from it */
    char *seen[SEEN_MAX];   /* "HASH FINISHED_AT", a ring */
    size_t seen_next;
    pending_alert_t *head, *tail;
    size_t queued;
    upstream_conn_t *up; /* the attempt on its way */
    int status;
};

static const upstream_cbs_t send_cbs;

char *alerts_body(const char *entry_json, alerts_format_t format)
{
    json_t *e = json_loads(entry_json, 0, NULL);
    if (!json_is_object(e)) {
        json_decref(e);
        return NULL;
    }
    const char *server = json_string_value(json_object_get(e, "server"));
    const char *tool = json_string_value(json_object_get(e, "tool"));
    const char *hash = json_string_value(json_object_get(e, "key_hash"));
    const char *since = json_string_value(json_object_get(e, "finished_at"));
    char text[600];
    snprintf(text, sizeof(text),
             "idemgw: the outcome of a call to %s%s%s is unknown (key %.16s, since %s). Its "
             "retries are refused until someone checks what it did and resolves it: "
             "`idemgw keys show %.16s`, or the admin page at /admin/.",
             server ? server : "", server ? "/" : "", tool ? tool : "?", hash ? hash : "?",
             since ? since : "now", hash ? hash : "?");
    json_t *msg = format == ALERTS_FORMAT_SLACK
                      ? json_pack("{s:s}", "text", text)
                      : json_pack("{s:s,s:O,s:s}", "event", "key_unknown", "key", e, "text", text);
    char *out = json_dumps(msg, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(msg);
    json_decref(e);
    return out;
}

/* ---- sending ---- */

static void send_next(alerts_t *a);

static void retry_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    send_next(arg);
}

static void send_next(alerts_t *a)
{
    if (a->up || !a->head || evtimer_pending(a->retry_ev, NULL))
        return;
    pending_alert_t *p = a->head;
    http_headers_t none;
    http_headers_init(&none);
    struct evbuffer *req = evbuffer_new();
    http_write_request_head(req, "POST", a->url.path, &none, a->url.host_header, NULL,
                            (long long)strlen(p->body), "Content-Type: application/json\r\n");
    evbuffer_add(req, p->body, strlen(p->body));
    http_headers_free(&none);
    p->tries++;
    a->status = 0;
    a->up = upstream_http_send(a->pool, req, false, &send_cbs, a);
    evbuffer_free(req);
}

static void pop_head(alerts_t *a)
{
    pending_alert_t *p = a->head;
    a->head = p->next;
    if (!a->head)
        a->tail = NULL;
    a->queued--;
    free(p->body);
    free(p);
}

static void on_send_head(void *arg, int status, const http_headers_t *h)
{
    (void)h;
    ((alerts_t *)arg)->status = status;
}

static void on_send_body(void *arg, const char *data, size_t len)
{
    (void)arg;
    (void)data;
    (void)len;
}

static void on_send_end(void *arg, upstream_result_t res)
{
    alerts_t *a = arg;
    a->up = NULL;
    pending_alert_t *p = a->head;
    if (!p)
        return;
    if (res == UPSTREAM_OK && a->status >= 200 && a->status < 300) {
        pop_head(a);
    } else if (p->tries >= ALERTS_TRIES) {
        log_warn(0,
                 "alerts: the webhook did not take an alert after %d attempts (%s, HTTP %d); "
                 "dropped",
                 p->tries, upstream_result_str(res), a->status);
        pop_head(a);
    } else {
        log_info(0, "alerts: the webhook did not take an alert (%s, HTTP %d); retrying",
                 upstream_result_str(res), a->status);
        struct timeval tv = util_ms_to_tv((uint64_t)p->tries * 1000);
        evtimer_add(a->retry_ev, &tv);
        return;
    }
    send_next(a);
}

static const upstream_cbs_t send_cbs = {on_send_head, on_send_body, on_send_end};

static void enqueue(alerts_t *a, char *body)
{
    if (a->queued >= ALERTS_QUEUE_MAX) {
        log_warn(0, "alerts: %d alerts wait for the webhook already; the oldest is dropped",
                 ALERTS_QUEUE_MAX);
        if (a->up) {
            /* the head is on its way: drop the one after it */
            pending_alert_t *second = a->head->next;
            if (second) {
                a->head->next = second->next;
                if (a->tail == second)
                    a->tail = a->head;
                free(second->body);
                free(second);
                a->queued--;
            }
        } else {
            pop_head(a);
        }
    }
    pending_alert_t *p = xcalloc(1, sizeof(*p));
    p->body = body;
    if (a->tail)
        a->tail->next = p;
    else
        a->head = p;
    a->tail = p;
    a->queued++;
    send_next(a);
}

/* ---- polling ---- */

/* ms since the epoch of an ISO 8601 UTC time as store_queue.h writes it, or -1. */
static int64_t iso_ms(const char *s)
{
    struct tm tm = {0};
    int ms = 0;
    if (!s || sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                     &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms) != 7)
        return -1;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return (int64_t)timegm(&tm) * 1000 + ms;
}

static bool seen_before(alerts_t *a, const char *id)
{
    for (size_t i = 0; i < SEEN_MAX; i++)
        if (a->seen[i] && strcmp(a->seen[i], id) == 0)
            return true;
    free(a->seen[a->seen_next]);
    a->seen[a->seen_next] = xstrdup(id);
    a->seen_next = (a->seen_next + 1) % SEEN_MAX;
    return false;
}

/* A list on its way: alerts_free clears a, so its answer finds the alerts gone. */
typedef struct poll_call {
    alerts_t *a;
} poll_call_t;

static void poll_answered(store_status_t st, store_queue_answer_t ans, const json_t *body,
                          void *arg)
{
    poll_call_t *pc = arg;
    alerts_t *a = pc->a;
    free(pc);
    if (!a)
        return;
    a->poll = NULL;
    if (st != STORE_OK || ans != STORE_QUEUE_OK)
        return; /* the next poll asks again from the same time */
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(body, "keys"), i, e)
    {
        int64_t upd = iso_ms(json_string_value(json_object_get(e, "updated")));
        if (upd > a->since_ms)
            a->since_ms = upd;
        if (!a->started)
            continue;
        char id[160];
        const char *fin = json_string_value(json_object_get(e, "finished_at"));
        snprintf(id, sizeof(id), "%s %s", json_string_value(json_object_get(e, "key_hash")),
                 fin ? fin : "-");
        if (seen_before(a, id))
            continue;
        char *entry = json_dumps(e, JSON_COMPACT | JSON_PRESERVE_ORDER);
        char *msg = entry ? alerts_body(entry, a->format) : NULL;
        free(entry);
        if (msg)
            enqueue(a, msg);
    }
    if (!a->started) {
        a->started = true;
        if (a->since_ms < 0)
            a->since_ms = (int64_t)util_wall_ms();
    }
}

static void poll_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    alerts_t *a = arg;
    if (a->poll || !store_ready(a->store))
        return;
    /* the first poll finds the newest update (keys unknown before the start are not
     * announced); the next ones ask for every key updated since, oldest first */
    store_queue_filter_t f = {.state = STORE_QUEUE_STATE_UNKNOWN,
                              .limit = a->started ? STORE_QUEUE_LIMIT_MAX : 1,
                              .updated_since_ms =
                                  a->started ? (a->since_ms > 0 ? a->since_ms : 1) : 0};
    poll_call_t *pc = xcalloc(1, sizeof(*pc));
    pc->a = a;
    if (store_queue_list(a->store, &f, poll_answered, pc) != STORE_OK) {
        free(pc);
        return;
    }
    a->poll = pc;
}

alerts_t *alerts_new(struct event_base *base, struct store *store, const char *url,
                     alerts_format_t format, uint64_t timeout_ms, char *msg, size_t msglen)
{
    alerts_t *a = xcalloc(1, sizeof(*a));
    a->base = base;
    a->store = store;
    a->format = format;
    a->since_ms = -1;
    const char *bad = config_parse_http_url(url, &a->url);
    if (bad) {
        snprintf(msg, msglen, "alerts.webhook_url: %s", bad);
        free(a);
        return NULL;
    }
    a->limits = (upstream_limits_t){.connect_timeout_ms = timeout_ms,
                                    .timeout_ms = timeout_ms,
                                    .idle_timeout_ms = timeout_ms,
                                    .pool = 1};
    if (a->url.tls && !(a->tls = upstream_tls_new(NULL, NULL, msg, msglen)))
        goto fail;
    upstream_opts_t uo = {.base = base,
                          .tls = a->tls,
                          .host = a->url.hp.host,
                          .port = a->url.hp.port,
                          .limits = &a->limits};
    if (!(a->pool = upstream_pool_new(&uo, msg, msglen)))
        goto fail;
    a->retry_ev = evtimer_new(base, retry_tick, a);
    a->poll_ev = event_new(base, -1, EV_PERSIST, poll_tick, a);
    if (!a->retry_ev || !a->poll_ev) {
        snprintf(msg, msglen, "cannot create an event");
        goto fail;
    }
    struct timeval tv = util_ms_to_tv(ALERTS_POLL_MS);
    evtimer_add(a->poll_ev, &tv);
    return a;
fail:
    alerts_free(a);
    return NULL;
}

void alerts_free(alerts_t *a)
{
    if (!a)
        return;
    if (a->poll)
        a->poll->a = NULL;
    if (a->poll_ev)
        event_free(a->poll_ev);
    if (a->retry_ev)
        event_free(a->retry_ev);
    if (a->up)
        upstream_http_abandon(a->up);
    if (a->pool)
        upstream_pool_free(a->pool);
    if (a->tls)
        SSL_CTX_free(a->tls);
    while (a->head)
        pop_head(a);
    for (size_t i = 0; i < SEEN_MAX; i++)
        free(a->seen[i]);
    config_http_url_free(&a->url);
    free(a);
}
