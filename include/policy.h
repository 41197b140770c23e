/* Tool policy: which class each tool is in and how its calls are protected.
 * Pure data and lookup; parsed from the YAML config by config.c. */
#ifndef IDEMGW_POLICY_H
#define IDEMGW_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    TOOL_CLASS_READ = 0,       /* no side effects: forwarded untouched */
    TOOL_CLASS_IDEMPOTENT,     /* naturally idempotent writes: forwarded untouched */
    TOOL_CLASS_NON_IDEMPOTENT, /* claimed, forwarded once, replayed */
} tool_class_t;

typedef enum { ON_TOOL_ERROR_RELEASE = 0, ON_TOOL_ERROR_STORE } on_tool_error_t;
typedef enum { ON_AMBIGUOUS_HOLD = 0, ON_AMBIGUOUS_RELEASE } on_ambiguous_t;
typedef enum { ON_STORE_DOWN_REJECT = 0, ON_STORE_DOWN_PASSTHROUGH } on_store_down_t;
/* The caller cancels a protected call (notifications/cancelled, or closing a 2026-07-28
 * request's stream). finish: the cancel stays at the gateway, the call runs to its end and is
 * recorded; forward: the upstream is told, and the outcome is what on_ambiguous says. */
typedef enum { ON_CANCEL_FINISH = 0, ON_CANCEL_FORWARD } on_cancel_t;

typedef struct policy_tool {
    char *name;                    /* tool name; NULL for the defaults entry */
    tool_class_t cls;              /* class of the tool */
    uint64_t window_ms;            /* how long a finished call is remembered (default 10m) */
    char **exclude_args;           /* dotted argument paths left out of the hash ("meta.ts") */
    size_t n_exclude_args;         /* entries in exclude_args */
    char *key_arg;                 /* argument carrying an explicit key (default idempotency_key) */
    on_tool_error_t on_tool_error; /* isError:true results: release (default) or store */
    on_ambiguous_t on_ambiguous;   /* outcome unknown: hold (default) or release */
    uint64_t wait_ms;              /* in_progress: 0 = reject, else wait up to this long */
    uint64_t lease_ms;             /* in-progress claim validity; 0 = upstream timeout + margin */
    uint64_t max_stored_bytes;     /* larger results are not stored (default 1 MiB) */
    bool forward_key;              /* send Idempotency-Key: sha256(key) upstream */
    on_store_down_t on_store_down; /* Postgres unreachable: reject (default) or passthrough */
    on_cancel_t on_cancel;         /* the caller cancels: finish (default) or forward */
    bool advertise_key;            /* tools/list shows key_arg as an optional argument */
    uint64_t answer_after_ms;      /* still running after this: the agent is answered
                                      still_running, the result is kept; 0 = never */
    bool trust_annotations;        /* defaults only: classify unlisted tools from the server's
                                      annotations (default true) */
    int line;                      /* line in the config file, for messages; 0 when built in */
} policy_tool_t;

typedef struct policy {
    policy_tool_t defaults; /* applies to tools not named in tools */
    policy_tool_t *tools;   /* named tools, settings merged over defaults at parse time */
    size_t n_tools;
} policy_t;

/* The argument that carries an explicit key unless a tool's key_arg says otherwise; also the
 * status tool's argument for it. The one place this name is spelled. */
#define POLICY_KEY_ARG_DEFAULT "idempotency_key"

/* Built-in defaults: class non_idempotent, window 10m, key_arg idempotency_key, release,
 * hold, reject, lease 0 (derived), max_stored_bytes 1 MiB, no forward_key, reject, finish. */
void policy_defaults_init(policy_tool_t *out);

/* Sorts tools by name so policy_lookup can binary-search; config.c calls it after parsing.
 * Anyone building a policy_t by hand must call it too. */
void policy_sort(policy_t *p);

/* The entry naming tool, or NULL when the policy does not name it. */
const policy_tool_t *policy_find(const policy_t *p, const char *tool);

/* The policy for tool name (never NULL: falls back to the defaults entry; NULL name too). */
const policy_tool_t *policy_lookup(const policy_t *p, const char *tool);

/* The effective lease: lease_ms, or upstream_timeout_ms + 30s when lease_ms is 0. */
uint64_t policy_lease_ms(const policy_tool_t *t, uint64_t upstream_timeout_ms);

/* What a protected call needs of its tool's entry, by value: a reload may free the policy
 * while the call runs. */
typedef struct policy_rules {
    uint64_t window_ms, lease_ms, wait_ms, max_stored_bytes, answer_after_ms;
    on_tool_error_t on_tool_error;
    on_ambiguous_t on_ambiguous;
    on_store_down_t on_store_down;
    on_cancel_t on_cancel;
    bool forward_key;
    bool advertise_key;
} policy_rules_t;

policy_rules_t policy_rules(const policy_tool_t *t, uint64_t upstream_timeout_ms);

/* Whether some call could need the store and be refused without it: the defaults or a named
 * tool is non_idempotent with on_store_down: reject. */
bool policy_needs_store(const policy_t *p);

const char *tool_class_name(tool_class_t c);
const char *on_cancel_name(on_cancel_t c);
/* Returns 0 and sets *out, or -1 for an unknown name. */
int tool_class_parse(const char *s, tool_class_t *out);

/* Durations "250ms", "90s", "10m", "2h", "1d" (a bare integer is seconds). 0 or -1 (empty,
 * sign, space, fraction, unknown unit, or more than UINT64_MAX milliseconds). */
int policy_parse_duration(const char *s, uint64_t *out_ms);
/* Sizes "512", "64KiB", "1MiB", "1GiB" (also B, KB/MB/GB, k/M/G, any letter case; all powers
 * of 1024). 0 or -1 (same rejections as durations). */
int policy_parse_size(const char *s, uint64_t *out_bytes);

void policy_tool_free(policy_tool_t *t);
void policy_free(policy_t *p);
/* Deep copy (for reload comparisons and tests). */
void policy_tool_copy(policy_tool_t *dst, const policy_tool_t *src);
/* Deep copy of a whole policy (tools stay sorted); free dst with policy_free. */
void policy_copy(policy_t *dst, const policy_t *src);

#endif
