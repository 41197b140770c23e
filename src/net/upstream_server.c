/* The upstream of one server of the configuration (see include/upstream_server.h). */
#include "upstream_server.h"
#include "upstream_stdio.h"

bool upstream_server_open(const config_t *cfg, const upstream_server_opts_t *o,
                          upstream_server_t *out, char *msg, size_t msglen)
{
    *out = (upstream_server_t){0};
    if (cfg->stdio.argv) {
        upstream_stdio_opts_t so = {
            .base = o->base,
            .conf = &cfg->stdio,
            .path = cfg->upstream_path,
            .limits = o->limits,
            .max_line = (size_t)cfg->max_body_bytes,
            .server = cfg->server_name,
        };
        out->upstream = upstream_stdio_new(&so);
        return true;
    }
    if (cfg->upstream_tls) {
        out->tls = upstream_tls_new(cfg->upstream_ca_file, "upstream_ca_file", msg, msglen);
        if (!out->tls)
            return false;
    }
    upstream_opts_t uo = {
        .base = o->base,
        .tls = out->tls,
        .host = cfg->upstream.host,
        .port = cfg->upstream.port,
        .limits = o->limits,
        .draining = o->draining,
        .tls_full = o->stats ? &o->stats->upstream_tls_full : NULL,
        .tls_resumed = o->stats ? &o->stats->upstream_tls_resumed : NULL,
        .connects = o->stats ? &o->stats->upstream_connects : NULL,
    };
    out->pool = upstream_pool_new(&uo, msg, msglen);
    if (!out->pool)
        return false;
    out->upstream = upstream_http_new(out->pool, cfg->upstream_host_header);
    return true;
}
