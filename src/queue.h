/*
 * queue.h - a FIFO of records bounded in bytes: one mutex, two condvars.
 * Used by runtime.c, one queue per device.  See the DESIGN comment in
 * queue.c.
 */
#ifndef HCB_QUEUE_H
#define HCB_QUEUE_H

#include "record.h"

typedef struct hcb__queue {
    hcb__mutex mu;
    hcb__cond nonempty; /* signalled on push and on close */
    hcb__cond progress; /* broadcast when a record is done or the bound grows */

    /* Everything below is protected by `mu`. */
    hcb_record *head, *tail; /* records pushed, not yet popped */
    size_t max_bytes;        /* the bound; > 0 */
    size_t bytes;            /* bytes pushed and not yet done */
    uint64_t pushed;         /* records ever pushed */
    uint64_t done;           /* records ever done */
    uint64_t bytes_in, bytes_out, high_water;
    uint64_t waits, wait_ns; /* producers that waited, and for how long */
    bool closing;            /* the consumer exits once the queue is empty */
    bool consumer_active;    /* a consumer is (or is about to be) popping */

    /* `pushed`, readable without `mu`, for the consumer's short poll
     * before it sleeps (see hcb__queue_pop). */
    _Atomic uint64_t pushed_hint;
    /* `done`, readable without `mu`: a call checks with it that its device
     * has no earlier tap pending (hcb__queue_idle) without the lock. */
    _Atomic uint64_t done_hint;
} hcb__queue;

int hcb__queue_init(hcb__queue *q, size_t max_bytes);
/* The queue must be empty and have no consumer. */
void hcb__queue_destroy(hcb__queue *q);

void hcb__queue_set_max_bytes(hcb__queue *q, size_t max_bytes);

/* Appends `rec` (ownership passes to the queue), waiting while it does not
 * fit under the bound.  Returns whether a consumer is active; if not, the
 * caller must start one.  `self_consumer` is true when the caller is this
 * queue's own consumer thread: it never waits (it would wait for itself). */
bool hcb__queue_push(hcb__queue *q, hcb_record *rec, bool self_consumer);

/* Removes every queued record, waiting for one, and returns them oldest
 * first, linked by `next`.  Returns NULL, and marks the consumer inactive,
 * once the queue is closing and empty.  The caller owns the records and
 * must call hcb__queue_done for them (count and total size) when
 * finished. */
hcb_record *hcb__queue_pop(hcb__queue *q);

/* Marks `records` popped records of `bytes` in all finished: frees their
 * bytes against the bound and wakes producers and barriers. */
void hcb__queue_done(hcb__queue *q, uint64_t records, size_t bytes);

/* True when every record pushed so far (by this thread, at least) is
 * done, the effects of their tap functions visible to the caller.  No
 * lock: the common case of a call with nothing queued before it. */
bool hcb__queue_idle(hcb__queue *q);
/* Waits until every record pushed before the call is done. */
void hcb__queue_wait_done(hcb__queue *q);
/* The same in two steps: the mark is the number of records pushed so far;
 * waiting for it stops at `deadline_ns` (hcb__now_ns clock; 0: never) and
 * returns whether those records are done. */
uint64_t hcb__queue_mark(hcb__queue *q);
bool hcb__queue_wait_mark(hcb__queue *q, uint64_t mark, uint64_t deadline_ns);

/* Consumer lifecycle, driven by runtime.c under its lifecycle lock. */
void hcb__queue_set_consumer_active(hcb__queue *q, bool active);
void hcb__queue_close(hcb__queue *q);
void hcb__queue_reopen(hcb__queue *q);
/* True when records wait and no consumer is active (a failed restart). */
bool hcb__queue_stranded(hcb__queue *q);

#endif /* HCB_QUEUE_H */
