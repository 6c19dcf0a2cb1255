/*
 * interrupt.c - stopping a wait with its check: see interrupt.h.
 */
#include <stdarg.h>
#include <stdio.h>

#include "runtime/interrupt.h"

void
hcb__wait_begin(hcb__wait *w, const hcb__check *check, hcb_device device)
{
    if (check != NULL && check->fn != NULL) {
        w->check = *check;
    } else {
        w->check.fn = NULL;
        w->check.user = NULL;
        w->check.poll_ns = 0;
    }
    w->device = device;
    w->state = 0;
    w->next_ns = 0;
    w->reason.code = HCB_OK;
    w->reason.message[0] = '\0';
}

uint64_t
hcb__wait_deadline(const hcb__wait *w, uint64_t deadline_ns)
{
    /* due at once: a deadline already past (0 would mean none) */
    uint64_t next = w->next_ns != 0 ? w->next_ns : 1;

    if (w->check.fn == NULL)
        return deadline_ns;
    return deadline_ns == 0 || next < deadline_ns ? next : deadline_ns;
}

bool
hcb__wait_stopped(hcb__wait *w)
{
    bool stop;

    if (!hcb__wait_due(w, hcb__now_ns()))
        return false;
    w->reason.code = HCB_OK;
    w->reason.message[0] = '\0';
    stop = w->check.fn(w->check.user, w->device, &w->state, &w->reason) != 0;
    w->next_ns = hcb__now_ns() + w->check.poll_ns;
    return stop;
}

int
hcb__wait_fail(const hcb__wait *w, hcb_error *err, const char *tail,
               const char *fmt, ...)
{
    char what[HCB_ERROR_MESSAGE_SIZE];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return hcb_error_set(err, HCB_ECALLBACK, "%s%s%s%s", what,
                         w->reason.message[0] != '\0' ? ": " : "",
                         w->reason.message, tail);
}
