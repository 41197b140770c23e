/* Claims whose answer was lost. A claim is sent, commits, and the connection dies before its
 * answer arrives (the server killed, a failover, the op's deadline): the caller is told the
 * store was unavailable and the call is not forwarded, but the row holds the key in progress,
 * so every retry would be answered "in progress" and, once the lease ends, "outcome unknown",
 * though the call never ran. Each claim carries a random token (sql/004_claim_token.sql); the
 * key and token of every claim lost that way are kept here, and once a connection is ready one
 * statement releases the rows still in progress under those tokens, as `idemgw key --release`
 * does. A claim whose answer arrived is never kept, so a forwarded call is never released; a
 * newer claim of the key has another token, so it is never touched.
 *
 * An entry falls due only after its claim's own deadline (CLAIM_IN_TIME in store_pg_sql.c): a
 * backend still running the claim past it inserts and takes over nothing, so the release cannot
 * run before a late commit. The statement goes through the queue like the sweeper's, never on a
 * call's path. */
#include "store_int.h"

#include "key_hash.h"
#include "log.h"
#include "util.h"

#include <event2/event.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* After the claim's deadline by our clock: the database's clock was estimated at connect to
 * within half a round trip. */
#define INDOUBT_MARGIN_MS 500
/* A release statement that failed is sent again after this long... */
#define INDOUBT_RETRY_MS 1000
/* ...at most this many times for one entry. */
#define INDOUBT_TRIES 5

/* The rows still held by the claims listed in $1 ([{"k": key, "t": token}]) become 'failed',
 * a new fence, the lease over, as release_sql does; locked in key order first, so a batch of
 * claims on the same keys cannot deadlock with it. */
/* clang-format off */
const char store_pg_indoubt_sql[] =
    "WITH r AS (SELECT * FROM jsonb_to_recordset($1::jsonb) AS r(k text, t text)),"
    " l AS MATERIALIZED (SELECT k.key FROM idem_keys k JOIN r ON k.key = r.k"
    "  AND k.claim_token = r.t WHERE k.state = 'in_progress' ORDER BY k.key FOR UPDATE OF k)"
    " UPDATE idem_keys k SET state = 'failed', fence = k.fence + 1, lease_until = now(),"
    " updated_at = now()"
    " FROM r JOIN l ON l.key = r.k"
    " WHERE k.key = r.k AND k.claim_token = r.t AND k.state = 'in_progress'";
/* clang-format on */

static void indoubt_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    store_indoubt_kick(arg);
}

void store_indoubt_init(store_pg_t *s)
{
    s->indoubt_ev = evtimer_new(s->base, indoubt_tick, s);
    if (!s->indoubt_ev) {
        fprintf(stderr, "idemgw: out of memory creating an event\n");
        abort();
    }
}

static void indoubt_arm(store_pg_t *s, uint64_t in_ms)
{
    struct timeval tv = {(time_t)(in_ms / 1000), (suseconds_t)(in_ms % 1000) * 1000};
    evtimer_add(s->indoubt_ev, &tv);
}

static void indoubt_add(store_pg_t *s, const store_op_t *claim)
{
    const char *token = claim->values[STORE_CLAIM_P_TOKEN];
    if (!token)
        return;
    s->stats.claims_in_doubt++;
    if (s->indoubt_len >= STORE_INDOUBT_MAX) {
        s->indoubt_dropped++;
        return;
    }
    if (!s->indoubt)
        s->indoubt = xcalloc(STORE_INDOUBT_MAX, sizeof(*s->indoubt));
    store_indoubt_t *e = &s->indoubt[s->indoubt_len++];
    e->key = xstrdup(claim->values[0]);
    e->token = xstrdup(token);
    e->due_ms = claim->deadline_wall_ms + INDOUBT_MARGIN_MS;
    e->tries = 0;
    e->sending = false;
    char h[KEY_HASH_LOG_LEN + 1];
    key_hash_log(e->key, h);
    log_info(0,
             "store: the answer to the claim of key %s was lost with its connection; its call "
             "was not forwarded, and the claim is released once a connection is back",
             h);
}

void store_indoubt_note(store_pg_t *s, const store_op_t *op)
{
    if (s->closing)
        return;
    if (op->kind == STORE_OP_CLAIM) {
        indoubt_add(s, op);
    } else if (op->kind == STORE_OP_CLAIM_BATCH) {
        for (int i = 0; i < op->nmembers; i++)
            indoubt_add(s, op->members[i]);
    }
}

static void indoubt_warn_dropped(store_pg_t *s)
{
    if (!s->indoubt_dropped)
        return;
    log_warn(0,
             "store: %d claims whose answer was lost were not kept (more than %d at once): "
             "their keys stay in progress until their lease ends, then read as an unknown "
             "outcome although the calls never ran; `idemgw key --release` frees them",
             s->indoubt_dropped, STORE_INDOUBT_MAX);
    s->indoubt_dropped = 0;
}

void store_indoubt_kick(store_pg_t *s)
{
    indoubt_warn_dropped(s);
    if (s->closing || s->indoubt_releasing || s->indoubt_len == 0)
        return;
    uint64_t now = util_wall_ms(), next = UINT64_MAX;
    json_t *rows = json_array();
    int n = 0;
    for (int i = 0; i < s->indoubt_len; i++) {
        store_indoubt_t *e = &s->indoubt[i];
        if (e->due_ms > now) {
            if (e->due_ms < next)
                next = e->due_ms;
            continue;
        }
        if (json_array_append_new(rows, json_pack("{s:s, s:s}", "k", e->key, "t", e->token)))
            abort(); /* out of memory */
        e->sending = true;
        n++;
    }
    if (n > 0) {
        store_op_t *op = xcalloc(1, sizeof(*op));
        op->kind = STORE_OP_RELEASE_IN_DOUBT;
        op->values[0] = json_dumps(rows, JSON_COMPACT);
        op->nparams = 1;
        if (!op->values[0])
            abort(); /* out of memory */
        if (store_submit_internal(s, op)) {
            s->indoubt_releasing = true;
        } else {
            /* no connection: the next one to become ready kicks again */
            for (int i = 0; i < s->indoubt_len; i++)
                s->indoubt[i].sending = false;
        }
    }
    json_decref(rows);
    if (next != UINT64_MAX)
        indoubt_arm(s, next - now);
}

static void entry_free(store_indoubt_t *e)
{
    free(e->key);
    free(e->token);
}

void store_indoubt_done(store_pg_t *s, store_status_t st, long released)
{
    int sent = 0, given_up = 0, kept = 0;
    s->indoubt_releasing = false;
    for (int i = 0; i < s->indoubt_len; i++) {
        store_indoubt_t *e = &s->indoubt[i];
        if (e->sending) {
            sent++;
            e->sending = false;
            if (st == STORE_OK || ++e->tries >= INDOUBT_TRIES) {
                given_up += st != STORE_OK;
                entry_free(e);
                continue;
            }
        }
        s->indoubt[kept++] = *e;
    }
    s->indoubt_len = kept;
    if (st == STORE_OK) {
        s->stats.in_doubt_released += (uint64_t)released;
        log_info(0,
                 "store: released %ld of %d claims whose answer was lost (the others never "
                 "committed, or a newer claim holds the key)",
                 released, sent);
    } else {
        log_warn(0, "store: releasing %d claims whose answer was lost failed: %s%s", sent,
                 store_status_str(st), given_up ? "" : "; trying again");
        if (given_up)
            log_warn(0,
                     "store: gave up releasing %d claims after %d tries: their keys read as an "
                     "unknown outcome once their lease ends; `idemgw key --release` frees them",
                     given_up, INDOUBT_TRIES);
    }
    if (s->closing)
        return;
    if (st == STORE_OK)
        store_indoubt_kick(s);
    else if (s->indoubt_len > 0)
        indoubt_arm(s, INDOUBT_RETRY_MS);
}

void store_indoubt_free(store_pg_t *s)
{
    indoubt_warn_dropped(s);
    if (s->indoubt_len > 0)
        log_warn(0,
                 "store: %d claims whose answer was lost are left unreleased at close: their keys "
                 "read as an unknown outcome once their lease ends; `idemgw key --release` frees "
                 "them",
                 s->indoubt_len);
    for (int i = 0; i < s->indoubt_len; i++)
        entry_free(&s->indoubt[i]);
    free(s->indoubt);
    s->indoubt = NULL;
    s->indoubt_len = 0;
    if (s->indoubt_ev)
        event_free(s->indoubt_ev);
    s->indoubt_ev = NULL;
}
