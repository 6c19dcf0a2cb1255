/*
 * textbuf.c - the growable text buffer the printer writes into (textbuf.h).
 */
#include <string.h>

#include "base/common.h"
#include "print/textbuf.h"

void
hcb__textbuf_grow(textbuf *s, size_t extra)
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
