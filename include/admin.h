/* The admin listener: GET /healthz (process alive), GET /readyz (upstream reachable and,
 * when configured, the store connected), GET /metrics (Prometheus text). */
#ifndef IDEMGW_ADMIN_H
#define IDEMGW_ADMIN_H

#include "http_conn.h"

void admin_handle(http_conn_t *conn, http_request_t *req);

#endif
