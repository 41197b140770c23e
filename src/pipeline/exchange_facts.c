/* The facts of an exchange: copied once when a handler sets them, written into the log line
 * when the exchange ends. The order of the members is the log line's, which operators and
 * tests read. */
#include "exchange_facts.h"

#include "key_hash.h"
#include "log.h"
#include "util.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define N_STRINGS 14

/* Where each string member of f is, so the copy walks them in one loop. */
static void string_slots(exchange_facts_t *f, const char **slot[N_STRINGS])
{
    const char **s[N_STRINGS] = {
        &f->key_hash,         &f->code,  &f->dup.source, &f->dup.first_seen,   &f->dup.first_state,
        &f->recorded,         &f->why,   &f->answered,   &f->cancel,           &f->task_session,
        &f->forbidden_header, &f->value, &f->setting,    &f->duplicate_header,
    };
    memcpy(slot, s, sizeof(s));
}

char *exchange_facts_keep(exchange_facts_t *kept, const exchange_facts_t *f)
{
    *kept = *f;
    const char **slot[N_STRINGS];
    string_slots(kept, slot);
    size_t need = 1;
    for (size_t i = 0; i < N_STRINGS; i++)
        if (*slot[i])
            need += strlen(*slot[i]) + 1;
    char *block = xmalloc(need), *p = block;
    for (size_t i = 0; i < N_STRINGS; i++) {
        if (!*slot[i])
            continue;
        size_t n = strlen(*slot[i]);
        if (slot[i] == &kept->key_hash && n > KEY_HASH_LOG_LEN)
            n = KEY_HASH_LOG_LEN; /* the log's form of it, all that is shown */
        memcpy(p, *slot[i], n);
        p[n] = '\0';
        *slot[i] = p;
        p += n + 1;
    }
    return block;
}

typedef struct text {
    char *out;
    size_t len, n;
    bool full; /* a member did not fit: none after it is written */
} text_t;

static void add(text_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(text_t *t, const char *fmt, ...)
{
    if (t->full)
        return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(t->out + t->n, t->len - t->n, fmt, ap);
    va_end(ap);
    if (w < 0 || (size_t)w >= t->len - t->n) {
        t->out[t->n] = '\0';
        t->full = true;
        return;
    }
    t->n += (size_t)w;
}

static void add_str(text_t *t, const char *name, const char *v)
{
    if (!v)
        return;
    char esc[300];
    log_json_string(esc, sizeof(esc), v);
    add(t, "%s\"%s\":%s", t->n ? "," : "", name, esc);
}

static void add_int(text_t *t, const char *name, int v)
{
    add(t, "%s\"%s\":%d", t->n ? "," : "", name, v);
}

static void add_u64(text_t *t, const char *name, uint64_t v)
{
    add(t, "%s\"%s\":%llu", t->n ? "," : "", name, (unsigned long long)v);
}

size_t exchange_facts_render(const exchange_facts_t *f, char *out, size_t len)
{
    if (!len)
        return 0;
    text_t t = {.out = out, .len = len};
    out[0] = '\0';
    add_str(&t, "key_hash", f->key_hash);
    add_str(&t, "code", f->code);
    if (f->dup.source) {
        add_str(&t, "duplicate_source", f->dup.source);
        add_int(&t, "attempt", f->dup.attempt);
        add_str(&t, "first_seen", f->dup.first_seen ? f->dup.first_seen : "");
        add_u64(&t, "gap_ms", f->dup.gap_ms);
        add_str(&t, "first_state", f->dup.first_state ? f->dup.first_state : "");
    }
    add_str(&t, "recorded", f->recorded);
    add_str(&t, "why", f->why);
    add_str(&t, "answered", f->answered);
    add_str(&t, "cancel", f->cancel);
    add_str(&t, "task_session", f->task_session);
    add_str(&t, "forbidden_header", f->forbidden_header);
    add_str(&t, "value", f->value);
    add_str(&t, "setting", f->setting);
    add_str(&t, "duplicate_header", f->duplicate_header);
    return t.n;
}
