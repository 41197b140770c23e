/* Alerts (docs/operator-queue.md): a JSON POST to alerts.webhook_url when a key becomes
 * unknown, so a person learns there is something to decide.
 *
 * The worker that serves the admin listener polls the store's queue (store_queue.h) every
 * ALERTS_POLL_MS for keys held unknown since the last poll (every replica's, and the CLI's
 * view of the same rows), and posts one message per key through an HTTP pool of its own, one
 * at a time, each attempt bounded by alerts.webhook_timeout and retried ALERTS_TRIES times in
 * all with a growing pause. Nothing here runs on a call's path: a slow or dead receiver delays
 * only later alerts, and past ALERTS_QUEUE_MAX waiting ones the oldest are dropped (logged).
 * Keys that were unknown before the gateway started are not announced. */
#ifndef IDEMGW_ALERTS_H
#define IDEMGW_ALERTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct store;

#define ALERTS_POLL_MS 500
#define ALERTS_TRIES 3
#define ALERTS_QUEUE_MAX 1000

typedef enum {
    ALERTS_FORMAT_JSON = 0, /* {"event":"key_unknown","key":{ENTRY},"text":...} */
    ALERTS_FORMAT_SLACK,    /* {"text":...}: Slack's (and compatible) incoming webhooks */
} alerts_format_t;

typedef struct alerts alerts_t;

/* NULL with msg when url is not an http(s) URL or its host does not resolve. */
alerts_t *alerts_new(struct event_base *base, struct store *store, const char *url,
                     alerts_format_t format, uint64_t timeout_ms, char *msg, size_t msglen);
/* Stops polling and sending; what waits is dropped. NULL is fine. */
void alerts_free(alerts_t *a);

/* The message for one key (an ENTRY of store_queue.h, as JSON text), malloc'd: pure, for the
 * unit test. */
char *alerts_body(const char *entry_json, alerts_format_t format);

#endif
