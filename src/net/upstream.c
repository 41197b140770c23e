/* The upstream interface: the calls every owner makes, passed to the implementation. */
#include "upstream.h"

#include <stdlib.h>

const char *upstream_result_str(upstream_result_t r)
{
    switch (r) {
    case UPSTREAM_OK:
        return "ok";
    case UPSTREAM_ERR_CONNECT:
        return "connect failed";
    case UPSTREAM_ERR_HEAD_TIMEOUT:
        return "no response in time";
    case UPSTREAM_ERR_IDLE_TIMEOUT:
        return "response stalled";
    case UPSTREAM_ERR_CLOSED:
        return "closed mid-response";
    case UPSTREAM_ERR_PROTOCOL:
        return "invalid HTTP response";
    }
    return "unknown";
}

upstream_call_t *upstream_open(upstream_t *u, const upstream_request_t *req,
                               const upstream_cbs_t *cbs, void *arg)
{
    return u->ops->open(u->state, req, cbs, arg);
}

void upstream_pause(upstream_t *u, upstream_call_t *call, bool paused)
{
    u->ops->pause(u->state, call, paused);
}

void upstream_abandon(upstream_t *u, upstream_call_t *call)
{
    u->ops->abandon(u->state, call);
}

void upstream_discard(upstream_t *u, upstream_call_t *call)
{
    u->ops->discard(u->state, call);
}

bool upstream_wants_caller(const upstream_t *u)
{
    return u && u->ops->wants_caller;
}

void upstream_free(upstream_t *u)
{
    if (!u)
        return;
    if (u->ops->free)
        u->ops->free(u->state);
    free(u);
}
