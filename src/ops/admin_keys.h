/* The operator's queue on the admin listener (docs/operator-queue.md): the page at /admin/ and
 * the API under /admin/v1/keys, behind a bearer token read from admin_token_file.
 *
 * The token file holds one token per line, "NAME:TOKEN" (the name is who the actions record)
 * or a bare "TOKEN" (named after the file's base name); blank lines and lines starting with
 * '#' are skipped. It is read on every request, so a changed file applies at once. */
#ifndef IDEMGW_ADMIN_KEYS_H
#define IDEMGW_ADMIN_KEYS_H

#include "admin.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

struct evbuffer;

/* Takes the request (and frees it) when its path is /admin or under /admin/; else false and
 * the request is still the caller's. */
bool admin_keys_handle(const admin_ctx_t *ctx, http_conn_t *conn, http_request_t *req);

/* The token named by authorization ("Bearer TOKEN") in the file's text: true with its name
 * in name. Pure, for the unit test. */
bool admin_keys_token_match(const char *file_text, const char *file_path, const char *authorization,
                            char *name, size_t name_len);

/* The queue's series for /metrics, from store_queue_summary's answer (NULL: not read, only
 * the HELP and TYPE lines). */
void admin_keys_metrics(struct evbuffer *b, const json_t *summary);

#endif
