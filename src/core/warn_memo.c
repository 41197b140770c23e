#include "warn_memo.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

struct warn_memo {
    char **before, **now; /* the previous load's warnings, this load's */
    size_t n_before, n_now;
};

warn_memo_t *warn_memo_new(void)
{
    return xcalloc(1, sizeof(warn_memo_t));
}

void warn_memo_free(warn_memo_t *m)
{
    if (!m)
        return;
    util_strv_free(m->before, m->n_before);
    util_strv_free(m->now, m->n_now);
    free(m);
}

void warn_memo_begin(warn_memo_t *m)
{
    util_strv_free(m->before, m->n_before);
    m->before = m->now;
    m->n_before = m->n_now;
    m->now = NULL;
    m->n_now = 0;
}

static bool has(char *const *v, size_t n, const char *text)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i], text) == 0)
            return true;
    return false;
}

bool warn_memo_fresh(warn_memo_t *m, const char *text)
{
    if (!has(m->now, m->n_now, text)) {
        m->now = xrealloc(m->now, (m->n_now + 1) * sizeof(*m->now));
        m->now[m->n_now++] = xstrdup(text);
    }
    return !has(m->before, m->n_before, text);
}
