/*
 * interrupt.h - the one way to stop a thread that waits in libhcb: a check
 * (hcb_check_fn, hcb.h) that the wait calls as it begins and then every
 * poll interval, with no lock held.
 *
 * Every wait of a device's thread uses the runtime's check
 * (hcb_runtime_set_interrupt): a submit or a GPU tap's reservation that
 * waits for room in a full queue (queue.c), a call that waits for the taps
 * its device issued before it (calls.c), a computation that waits at its
 * end for its callbacks (hcb_runtime_flush, channels.c) and a GPU device
 * that waits for room in its pinned pool (src/ffi/pinned.c).  A barrier
 * that polls uses its caller's check the same way
 * (hcb_runtime_barrier_poll).  A wait that its check stops fails with
 * HCB_ECALLBACK; what it waited for goes on as if it had not waited.
 */
#ifndef HCB_INTERRUPT_H
#define HCB_INTERRUPT_H

#include "base/common.h"

/* A check as it was set: `fn` NULL for none. */
typedef struct hcb__check {
    hcb_check_fn fn;
    void *user; /* borrowed: the setter keeps it alive */
    uint64_t poll_ns;
} hcb__check;

/* One wait's view of its check, taken as the wait begins and kept to its
 * end (a check set meanwhile applies to the next wait).  On the waiting
 * thread's stack. */
typedef struct hcb__wait {
    hcb__check check;
    hcb_device device;
    uint64_t state;   /* the check's wait_state, 0 at its first call */
    uint64_t next_ns; /* when the check is due next; 0: at once */
    hcb_error reason; /* what the check said when it stopped the wait */
} hcb__wait;

/* Begins a wait of `device` with `check` (copied; NULL or a NULL fn: a
 * wait nothing stops).  The check is due at once. */
void hcb__wait_begin(hcb__wait *w, const hcb__check *check, hcb_device device);

/* The earlier of `deadline_ns` (hcb__now_ns clock; 0: none) and the
 * check's next call (none without a check; already past while the check
 * is due at once): when a wait that must call its check should stop
 * waiting to call it. */
uint64_t hcb__wait_deadline(const hcb__wait *w, uint64_t deadline_ns);

/* Whether a check is set and due at `now` (hcb__now_ns clock). */
static inline bool
hcb__wait_due(const hcb__wait *w, uint64_t now)
{
    return w->check.fn != NULL && now >= w->next_ns;
}

/* Calls the check if one is set and due, with no lock held by the caller;
 * true when it says stop (its reason, if it gave one, in w->reason). */
bool hcb__wait_stopped(hcb__wait *w);

/* Fills `err` (may be NULL) for a wait its check stopped: HCB_ECALLBACK,
 * the message `fmt` (what waited, and for what), then ": " and the check's
 * reason if it gave one, then `tail` ("" for none).  Returns
 * HCB_ECALLBACK. */
int hcb__wait_fail(const hcb__wait *w, hcb_error *err, const char *tail,
                   const char *fmt, ...) HCB_PRINTF(4, 5);

#endif /* HCB_INTERRUPT_H */
