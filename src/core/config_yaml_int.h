/* Shared by the YAML walker (config_yaml.c) and the key handlers kept in files of their own
 * (config_identity.c): the walk's context, the key tables, and the helpers a handler uses. */
#ifndef IDEMGW_CONFIG_YAML_INT_H
#define IDEMGW_CONFIG_YAML_INT_H

#include "config.h"
#include "config_yaml.h"

#include <libfyaml.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MS_S 1000ULL
#define MS_H (3600 * MS_S)
#define MS_D (24 * MS_H)
#define MAX_NAME 256
#define PATH_MAX_LEN 320

typedef struct yerr {
    int line;
    size_t seq; /* insertion order, so equal lines keep their order after sorting */
    char *msg;  /* without the "file:line: " prefix */
} yerr_t;

typedef struct ctx {
    const char *name; /* file name used in messages */
    config_t *c;
    config_yaml_result_t res;
    yerr_t *errs;
    size_t n_errs;
} ctx_t;

typedef enum {
    K_STR,     /* char *, non-empty */
    K_BOOL,    /* bool */
    K_INT,     /* int in [min, max] */
    K_DUR,     /* uint64_t milliseconds in [min, max] */
    K_SIZE,    /* uint64_t bytes in [min, max] */
    K_ADDR,    /* host_port_t */
    K_ENUM,    /* int-sized enum, value = index in names */
    K_SECTION, /* nested mapping described by sub */
    K_FN,      /* custom handler */
} kind_t;

typedef struct key_spec key_spec_t;
typedef void (*key_fn)(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base);

struct key_spec {
    const char *name;
    kind_t kind;
    size_t off;
    uint64_t min, max;
    const char *const *names; /* K_ENUM: NULL-terminated, in enum order */
    key_fn fn;                /* K_FN */
    const key_spec_t *sub;    /* K_SECTION */
    size_t n_sub;
    int order; /* top level only: sections handled in passes 0 to 3 (see walk_root) */
    /* Every key but a section says what a reload does with it (config_reload_merge). */
    config_key_reload_t reload;
    /* restart-only K_FN keys: whether two configs agree, and running's value into next (the
     * other kinds are compared and copied through kind and off) */
    bool (*same)(const config_t *a, const config_t *b);
    void (*carry)(config_t *next, const config_t *running);
};

/* A handler of one entry of a list (walk_list). */
typedef void (*entry_fn)(ctx_t *cx, const char *s, int line, const char *path, void *base);

/* An error at line, "file:line: " added when the errors are written out; all are kept. */
void cy_err_at(ctx_t *cx, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The node's line (1-based), or fallback. */
int cy_node_line(struct fy_node *n, int fallback);
bool cy_node_is_null(struct fy_node *n);
/* "a mapping", "a list", "a scalar": for messages. */
const char *cy_node_kind(struct fy_node *n);
/* v's text when it is a scalar; else NULL, with an error saying what was expected. */
const char *cy_scalar(ctx_t *cx, struct fy_node *v, int line, const char *path, const char *what);
/* path + "." + key, cut to PATH_MAX_LEN. */
void cy_child_path(char *out, const char *path, const char *key);
void cy_set_string(char **dst, const char *s);
void cy_strv_push(char ***v, size_t *n, char *s);
/* Walks a mapping against a table of keys (order >= 0: only the keys of that pass). */
void cy_walk_map(ctx_t *cx, struct fy_node *map, int line, const char *path,
                 const key_spec_t *specs, size_t n, void *base, int order);
/* Calls each for every scalar of a list (a lone scalar counts as a list of one). */
void cy_walk_list(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base,
                  bool allow_empty, entry_fn each);

/* config_identity.c: the top-level listen_tls and subject keys. */
void cy_fn_listen_tls(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base);
void cy_fn_subject(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base);

/* config_yaml.c: upstream (a URL or a command), defaults and tools, into a config_t (the top
 * level or a server's view). */
void cy_fn_upstream(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base);
void cy_fn_defaults(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base);
void cy_fn_tools(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base);
/* config_servers.c: servers, a mapping of names to {path, upstream, ...}. */
void cy_fn_servers(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base);
/* config_stdio.c: upstream given as a mapping, {command: [...], ...}. */
void cy_upstream_command(ctx_t *cx, struct fy_node *v, int line, const char *path, void *base);

#endif
