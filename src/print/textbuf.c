/*
 * textbuf.c - the growable text buffer the printer writes into (textbuf.h).
 */
#include <string.h>

#include "base/common.h"
#include "print/textbuf.h"

static void
reserve(textbuf *s, size_t extra)
{
    size_t cap;
    char *p;

    if (s->oom || s->len + extra <= s->cap)
        return;
    cap = s->cap < 256 ? 256 : s->cap;
    while (cap < s->len + extra)
        cap *= 2;
    p = hcb__malloc(cap);
    if (p == NULL) {
        s->oom = true;
        return;
    }
    if (s->len > 0)
        memcpy(p, s->p, s->len);
    hcb__free(s->p);
    s->p = p;
    s->cap = cap;
}

/* Both return early for n == 0: s->p may still be NULL, and NULL + 0 is
 * undefined in C. */
void
hcb__textbuf_put(textbuf *s, const char *t, size_t n)
{
    if (n == 0)
        return;
    reserve(s, n);
    if (s->oom)
        return;
    memcpy(s->p + s->len, t, n);
    s->len += n;
}

void
hcb__textbuf_putc(textbuf *s, char c)
{
    hcb__textbuf_put(s, &c, 1);
}

void
hcb__textbuf_fill(textbuf *s, char c, size_t n)
{
    if (n == 0)
        return;
    reserve(s, n);
    if (s->oom)
        return;
    memset(s->p + s->len, c, n);
    s->len += n;
}

/* Hands out the text with snprintf's contract. */
int
hcb__textbuf_finish(textbuf *s, char *buf, size_t cap, size_t *len,
                    hcb_error *err)
{
    if (s->oom) {
        hcb__free(s->p);
        return hcb_error_set(err, HCB_ENOMEM, "out of memory formatting");
    }
    if (cap > 0) {
        size_t n = s->len < cap - 1 ? s->len : cap - 1;

        if (n > 0)
            memcpy(buf, s->p, n);
        buf[n] = '\0';
    }
    if (len != NULL)
        *len = s->len;
    hcb__free(s->p);
    return HCB_OK;
}
