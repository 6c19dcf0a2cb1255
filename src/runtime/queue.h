/*
 * queue.h - a FIFO of records bounded in bytes, pushed without a lock.
 * Used by channels.c, one queue per device.  See the DESIGN comment in
 * queue.c.
 */
#ifndef HCB_QUEUE_H
#define HCB_QUEUE_H

#include "runtime/record.h"

/* The fields are grouped by who writes them, each group on cache lines
 * of its own (the pads), so that a producer and the consumer share a line
 * only where they must. */
typedef struct hcb__queue {
    /* Written by producers, once per record. */
    _Atomic(hcb_record *) tail; /* the last record linked (or &stub) */
    _Atomic uint64_t pushed;    /* records ever pushed (each takes one) */
    char pad0[64];

    /* Written by both: producers add, the consumer subtracts per batch. */
    atomic_size_t bytes; /* bytes pushed and not yet done */
    char pad1[64];

    /* Written by the consumer. */
    hcb_record *head;             /* the next record to take (or &stub) */
    uint64_t taken;               /* records ever taken */
    _Atomic uint64_t finished;    /* records finished, not yet counted done */
    atomic_size_t finished_bytes; /* their bytes */
    _Atomic uint64_t done;        /* records ever done */
    _Atomic uint64_t bytes_out;   /* their bytes */
    /* Records the consumer pushed to this queue itself (a tap function
     * that runs a computation of its device in the consumer's thread). */
    _Atomic uint64_t self_pushed;
    char pad2[64];

    /* Read on every push, written rarely. */
    atomic_bool consumer_sleeping; /* the consumer waits on `nonempty` */
    atomic_bool consumer_active; /* a consumer is (or is about to be) popping */
    atomic_bool closing;      /* the consumer exits once the queue is empty */
    atomic_size_t max_bytes;  /* the bound; > 0 */
    atomic_size_t high_water; /* the most `bytes` seen */
    _Atomic uint64_t waiters; /* threads waiting on `progress` */
    _Atomic uint64_t space_waiters; /* of them, producers out of space */
    char pad3[64];

    /* Sleeping and waiting. */
    hcb__mutex mu;
    hcb__cond nonempty;      /* the consumer waits for a record or `closing` */
    hcb__cond progress;      /* producers wait for space, barriers for `done` */
    uint64_t waits, wait_ns; /* under mu: producers that waited, how long */

    /* Called (no lock held) once by a producer that has waited `stall_ns`
     * for space (see hcb__queue_set_stall); NULL: none.  Set before use. */
    void (*stall_fn)(void *user, uint64_t waited_ns);
    void *stall_user;
    uint64_t stall_ns;

    /* Never a record: it stands in the list when the queue is empty, so
     * that a producer always has a `tail` to link after. */
    hcb_record stub;
} hcb__queue;

int hcb__queue_init(hcb__queue *q, size_t max_bytes);
/* The queue must be empty and have no consumer. */
void hcb__queue_destroy(hcb__queue *q);
/* In the child of a fork: makes the queue empty, with no consumer and no
 * waiter, and its lock and conditions new (their holders and waiters are
 * threads the child does not have).  The records queued or in delivery at
 * the fork are the parent's to deliver: they are left alone (not freed:
 * the ones in delivery are not reachable).  The bound and the stall
 * callback stay. */
void hcb__queue_reset_after_fork(hcb__queue *q);

void hcb__queue_set_max_bytes(hcb__queue *q, size_t max_bytes);

/* Has a producer that has waited `after_ns` for space call `fn(user,
 * waited_ns)` once, with no lock held, and then go on waiting.  Call before
 * the queue is used. */
void hcb__queue_set_stall(hcb__queue *q, void (*fn)(void *, uint64_t),
                          void *user, uint64_t after_ns);

/* Appends `rec` (ownership passes to the queue), waiting while it does not
 * fit under the bound.  Returns whether a consumer is active; if not, the
 * caller must start one.  `self_consumer` is true when the caller is this
 * queue's own consumer thread: it never waits (it would wait for itself). */
bool hcb__queue_push(hcb__queue *q, hcb_record *rec, bool self_consumer);

/* Takes note that `done_records` popped records of `done_bytes` in all
 * are finished (0, 0: none); they are counted done in batches, at once if
 * someone waits (see "Done" in queue.c).  Then removes every queued
 * record, waiting for one, and returns them oldest first, linked by
 * `next`.  Returns NULL, with everything finished counted done and the
 * consumer marked inactive, once the queue is closing and empty.  The
 * caller owns the records and must report them finished, with its next
 * pop or hcb__queue_done. */
hcb_record *hcb__queue_pop(hcb__queue *q, uint64_t done_records,
                           size_t done_bytes);

/* The consumer's note that one popped record of `bytes` is finished: it
 * is counted done at once if a producer waits for space (so that the
 * producer resumes as soon as its record fits), else with the others of
 * its batch.  Only the consumer calls it. */
void hcb__queue_finished(hcb__queue *q, size_t bytes);

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
/* How many records the consumer has pushed to its own queue so far (each
 * counted before it is linked, so before the record being delivered when
 * it was pushed is done). */
uint64_t hcb__queue_self_pushed(hcb__queue *q);

/* Consumer lifecycle, driven by channels.c under the channel's
 * lifecycle lock. */
void hcb__queue_set_consumer_active(hcb__queue *q, bool active);
void hcb__queue_close(hcb__queue *q);
void hcb__queue_reopen(hcb__queue *q);
/* True when records wait and no consumer is active (a failed restart). */
bool hcb__queue_stranded(hcb__queue *q);

/* Adds the queue's counters to `s` (records and bytes in and out, queued,
 * high water, producer waits). */
void hcb__queue_add_stats(hcb__queue *q, hcb_stats *s);

#endif /* HCB_QUEUE_H */
