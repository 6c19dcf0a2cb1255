/*
 * textbuf.h - the growable text buffer the printer writes into.
 *
 * A zeroed textbuf is empty and valid.  `p` holds `len` bytes of text (no
 * NUL) in `cap` bytes from hcb__malloc; it may be NULL while `len` is 0.
 * An allocation that fails sets `oom` and makes every later write a no-op,
 * so a formatter writes on and checks once, at the end
 * (hcb__textbuf_finish).  The buffer owns `p`: hcb__textbuf_finish frees
 * it; a caller that stops earlier frees it with hcb__free.
 */
#ifndef HCB_TEXTBUF_H
#define HCB_TEXTBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "hcb/hcb.h"

typedef struct textbuf {
    char *p;
    size_t len, cap;
    bool oom;
} textbuf;

/* Makes room for `extra` more bytes, or sets `oom` (textbuf.c). */
void hcb__textbuf_grow(textbuf *s, size_t extra);

/* The writes below are inline: the printer makes one per element and
 * separator.  Each returns early for n == 0 (s->p may still be NULL, and
 * NULL + 0 is undefined in C). */
static inline bool
hcb__textbuf_room(textbuf *s, size_t n)
{
    if (!s->oom && s->len + n > s->cap)
        hcb__textbuf_grow(s, n);
    return !s->oom;
}

/* Append `n` bytes of `t` (t may be NULL when n is 0). */
static inline void
hcb__textbuf_put(textbuf *s, const char *t, size_t n)
{
    if (n == 0 || !hcb__textbuf_room(s, n))
        return;
    memcpy(s->p + s->len, t, n);
    s->len += n;
}

/* Append one character. */
static inline void
hcb__textbuf_putc(textbuf *s, char c)
{
    if (hcb__textbuf_room(s, 1))
        s->p[s->len++] = c;
}

/* Append `n` copies of `c`. */
static inline void
hcb__textbuf_fill(textbuf *s, char c, size_t n)
{
    if (n == 0 || !hcb__textbuf_room(s, n))
        return;
    memset(s->p + s->len, c, n);
    s->len += n;
}

/* Hands out the text with snprintf's contract (at most `cap` bytes into
 * `buf`, NUL included; *len, if not NULL, gets the whole length) and frees
 * the buffer.  HCB_ENOMEM if a write ran out of memory. */
int hcb__textbuf_finish(textbuf *s, char *buf, size_t cap, size_t *len,
                        hcb_error *err);

#endif /* HCB_TEXTBUF_H */
