/* Tool policy: defaults, lookup, and the duration / size syntax shared with the config file. */
#include "policy.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MS_PER_S 1000ULL
/* Added to the upstream timeout when no lease is configured: the claim must outlive the slowest
 * legitimate call, or a retry would take it over while the first attempt is still running. */
#define LEASE_MARGIN_MS (30 * MS_PER_S)

static const char *const class_names[] = {
    [TOOL_CLASS_READ] = "read",
    [TOOL_CLASS_IDEMPOTENT] = "idempotent",
    [TOOL_CLASS_NON_IDEMPOTENT] = "non_idempotent",
};

void policy_defaults_init(policy_tool_t *out)
{
    memset(out, 0, sizeof(*out));
    out->name = NULL;
    /* MCP says an unannotated tool is non-idempotent: protect unless told otherwise. */
    out->cls = TOOL_CLASS_NON_IDEMPOTENT;
    out->window_ms = 10 * 60 * MS_PER_S;
    out->key_arg = xstrdup(POLICY_KEY_ARG_DEFAULT);
    out->on_tool_error = ON_TOOL_ERROR_RELEASE;
    out->on_ambiguous = ON_AMBIGUOUS_HOLD;
    out->wait_ms = 0;
    out->lease_ms = 0;
    out->max_stored_bytes = 1024 * 1024;
    out->forward_key = false;
    out->on_store_down = ON_STORE_DOWN_REJECT;
    /* a half-cancelled side effect is the one outcome nobody can act on */
    out->on_cancel = ON_CANCEL_FINISH;
    out->trust_annotations = true;
    out->line = 0;
}

static int tool_cmp(const void *a, const void *b)
{
    const policy_tool_t *x = a, *y = b;
    return strcmp(x->name, y->name);
}

void policy_sort(policy_t *p)
{
    if (p->n_tools > 1)
        qsort(p->tools, p->n_tools, sizeof(p->tools[0]), tool_cmp);
}

const policy_tool_t *policy_lookup(const policy_t *p, const char *tool)
{
    const policy_tool_t *t = policy_find(p, tool);
    return t ? t : &p->defaults;
}

const policy_tool_t *policy_find(const policy_t *p, const char *tool)
{
    if (!tool)
        return NULL;
    /* Hot path (every tools/call): binary search over the names sorted at parse time. */
    size_t lo = 0, hi = p->n_tools;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(tool, p->tools[mid].name);
        if (c == 0)
            return &p->tools[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

static bool needs_store(const policy_tool_t *t)
{
    return t->cls == TOOL_CLASS_NON_IDEMPOTENT && t->on_store_down == ON_STORE_DOWN_REJECT;
}

bool policy_needs_store(const policy_t *p)
{
    if (needs_store(&p->defaults))
        return true;
    for (size_t i = 0; i < p->n_tools; i++)
        if (needs_store(&p->tools[i]))
            return true;
    return false;
}

uint64_t policy_lease_ms(const policy_tool_t *t, uint64_t upstream_timeout_ms)
{
    if (t->lease_ms)
        return t->lease_ms;
    if (upstream_timeout_ms > UINT64_MAX - LEASE_MARGIN_MS)
        return UINT64_MAX;
    return upstream_timeout_ms + LEASE_MARGIN_MS;
}

policy_rules_t policy_rules(const policy_tool_t *t, uint64_t upstream_timeout_ms)
{
    return (policy_rules_t){
        .window_ms = t->window_ms,
        .lease_ms = policy_lease_ms(t, upstream_timeout_ms),
        .wait_ms = t->wait_ms,
        .max_stored_bytes = t->max_stored_bytes,
        .on_tool_error = t->on_tool_error,
        .on_ambiguous = t->on_ambiguous,
        .on_store_down = t->on_store_down,
        .on_cancel = t->on_cancel,
        .forward_key = t->forward_key,
        .advertise_key = t->advertise_key,
        .answer_after_ms = t->answer_after_ms,
    };
}

const char *tool_class_name(tool_class_t c)
{
    if ((unsigned)c >= ARRAY_LEN(class_names))
        return "unknown";
    return class_names[c];
}

const char *on_cancel_name(on_cancel_t c)
{
    return c == ON_CANCEL_FORWARD ? "forward" : "finish";
}

int tool_class_parse(const char *s, tool_class_t *out)
{
    for (size_t i = 0; i < ARRAY_LEN(class_names); i++) {
        if (strcmp(s, class_names[i]) == 0) {
            *out = (tool_class_t)i;
            return 0;
        }
    }
    return -1;
}

/* Reads the leading decimal digits of s into *out; returns the first byte after them, or NULL
 * when there are none or the value does not fit. */
static const char *parse_digits(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    const char *p = s;
    for (; *p >= '0' && *p <= '9'; p++) {
        uint64_t d = (uint64_t)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return NULL;
        v = v * 10 + d;
    }
    if (p == s)
        return NULL;
    *out = v;
    return p;
}

static int scale(uint64_t v, uint64_t mult, uint64_t *out)
{
    if (mult && v > UINT64_MAX / mult)
        return -1;
    *out = v * mult;
    return 0;
}

typedef struct unit {
    const char *name;
    uint64_t mult;
} unit_t;

/* A whole number followed by one of the units (compared with cmp), scaled. 0 or -1. */
static int parse_with_units(const char *s, const unit_t *units, size_t n,
                            int (*cmp)(const char *, const char *), uint64_t *out)
{
    uint64_t v;
    const char *rest = s ? parse_digits(s, &v) : NULL;
    if (!rest)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (cmp(rest, units[i].name) == 0)
            return scale(v, units[i].mult, out);
    return -1;
}

int policy_parse_duration(const char *s, uint64_t *out_ms)
{
    static const unit_t units[] = {
        {"", MS_PER_S}, /* a bare number is seconds, like most operators expect */
        {"ms", 1},
        {"s", MS_PER_S},
        {"m", 60 * MS_PER_S},
        {"h", 3600 * MS_PER_S},
        {"d", 86400 * MS_PER_S},
    };
    return parse_with_units(s, units, ARRAY_LEN(units), strcmp, out_ms);
}

int policy_parse_size(const char *s, uint64_t *out_bytes)
{
    /* Every suffix is a power of 1024: "1MB" meaning 1,000,000 bytes is never what anyone
     * sizing a buffer meant, and two meanings for one spelling is worse. */
    static const unit_t units[] = {
        {"", 1},
        {"b", 1},
        {"k", 1ULL << 10},
        {"kb", 1ULL << 10},
        {"kib", 1ULL << 10},
        {"m", 1ULL << 20},
        {"mb", 1ULL << 20},
        {"mib", 1ULL << 20},
        {"g", 1ULL << 30},
        {"gb", 1ULL << 30},
        {"gib", 1ULL << 30},
    };
    return parse_with_units(s, units, ARRAY_LEN(units), strcasecmp, out_bytes);
}

void policy_tool_free(policy_tool_t *t)
{
    if (!t)
        return;
    free(t->name);
    util_strv_free(t->exclude_args, t->n_exclude_args);
    free(t->key_arg);
    t->name = NULL;
    t->exclude_args = NULL;
    t->n_exclude_args = 0;
    t->key_arg = NULL;
}

void policy_free(policy_t *p)
{
    if (!p)
        return;
    policy_tool_free(&p->defaults);
    for (size_t i = 0; i < p->n_tools; i++)
        policy_tool_free(&p->tools[i]);
    free(p->tools);
    p->tools = NULL;
    p->n_tools = 0;
}

void policy_tool_copy(policy_tool_t *dst, const policy_tool_t *src)
{
    *dst = *src;
    dst->name = src->name ? xstrdup(src->name) : NULL;
    dst->key_arg = src->key_arg ? xstrdup(src->key_arg) : NULL;
    dst->exclude_args = NULL;
    if (src->n_exclude_args) {
        dst->exclude_args = xcalloc(src->n_exclude_args, sizeof(char *));
        for (size_t i = 0; i < src->n_exclude_args; i++)
            dst->exclude_args[i] = xstrdup(src->exclude_args[i]);
    }
}

void policy_copy(policy_t *dst, const policy_t *src)
{
    policy_tool_copy(&dst->defaults, &src->defaults);
    dst->n_tools = src->n_tools;
    dst->tools = NULL;
    if (src->n_tools) {
        dst->tools = xcalloc(src->n_tools, sizeof(policy_tool_t));
        for (size_t i = 0; i < src->n_tools; i++)
            policy_tool_copy(&dst->tools[i], &src->tools[i]);
    }
}
