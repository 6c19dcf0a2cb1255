/*
 * queue.h - a FIFO of records bounded in bytes, pushed without a lock.
 * Used by channels.c, one queue per device.  See the DESIGN comment in
 * queue.c.
 */
#ifndef HCB_QUEUE_H
#define HCB_QUEUE_H

#include "runtime/interrupt.h"
#include "runtime/record.h"

/* How long a closing consumer waits for reserved records when none
 * arrives (queue.c, "Reservations"): then it exits without them. */
#define HCB__RESERVED_WAIT_NS ((uint64_t)10000000000u)

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
    /* records whose tap function has returned, counted one by one (done
     * lags behind in batches): whether a queue moves */
    _Atomic uint64_t delivered;
    char pad2[64];

    /* Read on every push, written rarely. */
    atomic_bool consumer_sleeping; /* the consumer waits on `nonempty` */
    atomic_bool consumer_active; /* a consumer is (or is about to be) popping */
    atomic_bool closing;      /* the consumer exits once the queue is empty */
    atomic_size_t max_bytes;  /* the bound; > 0 */
    atomic_size_t high_water; /* the most `bytes` seen */
    _Atomic uint64_t waiters; /* threads waiting on `progress` */
    _Atomic uint64_t space_waiters; /* of them, producers out of space */
    /* Room reserved (hcb__queue_reserve) for records not yet pushed: the
     * consumer does not exit on close while some are on their way (for
     * `reserved_wait_ns` without one arriving, at most). */
    _Atomic uint64_t reserved;
    atomic_size_t reserved_bytes;
    _Atomic uint64_t reserved_wait_ns;
    /* What a closing consumer gave up waiting for (reserved records and
     * their bytes when it exited; hcb__queue_take_abandoned). */
    _Atomic uint64_t abandoned;
    atomic_size_t abandoned_bytes;
    char pad3[64];

    /* Sleeping and waiting. */
    hcb__mutex mu;
    hcb__cond nonempty;      /* the consumer waits for a record or `closing` */
    hcb__cond progress;      /* producers wait for space, barriers for `done` */
    uint64_t waits, wait_ns; /* under mu: producers that waited, how long */

    /* Called (no lock held) once by a producer that has waited `stall_ns`
     * for space (see hcb__queue_set_stall); NULL: none.  Set before use. */
    void (*stall_fn)(void *user, uint64_t waited_ns, uint64_t delivered);
    void *stall_user;
    uint64_t stall_ns;

    /* Under mu: the runtime's interrupt check, which a producer waiting
     * for space calls (no lock held) as it starts to wait and every poll
     * interval; nonzero ends its wait (see hcb__queue_set_check).
     * `check_device` is passed on. */
    hcb__check check;
    hcb_device check_device;

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
 * the ones in delivery are not reachable).  The bound, the stall callback
 * and the check stay. */
void hcb__queue_reset_after_fork(hcb__queue *q);

void hcb__queue_set_max_bytes(hcb__queue *q, size_t max_bytes);

/* Has a producer that has waited `after_ns` for space call `fn(user,
 * waited_ns, delivered)` once, with no lock held, and then go on waiting;
 * `delivered` counts the records delivered while it waited (none: the
 * queue does not move).  Call before the queue is used. */
void hcb__queue_set_stall(hcb__queue *q, void (*fn)(void *, uint64_t, uint64_t),
                          void *user, uint64_t after_ns);

/* The records whose tap function has returned so far, counted as each
 * returns: two readings tell whether the queue moved between them. */
uint64_t hcb__queue_delivered(hcb__queue *q);

/* Has a producer waiting for space call `check` (copied; a NULL fn: none)
 * for `device` as it starts to wait and then every poll interval, with no
 * lock held, in its own thread (interrupt.h): when it says stop the push
 * stops waiting and fails (HCB__PUSH_STOPPED).  Thread-safe; producers
 * already waiting keep the check they started with. */
void hcb__queue_set_check(hcb__queue *q, const hcb__check *check,
                          hcb_device device);

/* What hcb__queue_push did. */
typedef enum {
    HCB__PUSH_QUEUED = 0,      /* queued; a consumer is active */
    HCB__PUSH_NO_CONSUMER = 1, /* queued; the caller must start a consumer */
    HCB__PUSH_STOPPED = 2      /* not queued: the check ended the wait */
} hcb__push_result;

/* Appends `rec`, waiting while it does not fit under the bound.  Ownership
 * passes to the queue once queued; with HCB__PUSH_STOPPED (the check of
 * hcb__queue_set_check said stop; `wait` then holds the wait, with the
 * check's reason, for hcb__wait_fail) the caller keeps it.
 * `self_consumer` is true when the caller is this queue's own consumer
 * thread: it never waits (it would wait for itself).  `wait` (may be
 * NULL) is the caller's, written only when the push waits. */
hcb__push_result hcb__queue_push(hcb__queue *q, hcb_record *rec,
                                 bool self_consumer, hcb__wait *wait);

/* The same in two steps, for a producer whose record is made later on a
 * thread that must not wait (a CUDA device's lander, once the record's
 * copies have landed).  hcb__queue_reserve takes room for `size` bytes,
 * waiting for it as hcb__queue_push does (the back-pressure falls on the
 * caller; `self_consumer`, the check and `wait` as there), counts a
 * record on its way, and returns HCB__PUSH_QUEUED if a consumer is active;
 * if none is, it gives the room back and returns HCB__PUSH_NO_CONSUMER
 * (the caller starts one, after the stop that closed the queue, and
 * reserves again: queue.c, "Reservations"); HCB__PUSH_STOPPED when the
 * check ended its wait (nothing reserved).
 * hcb__queue_push_reserved then appends `rec`
 * (ownership passes to the queue; its size must be `size`) and never
 * waits; hcb__queue_unreserve gives the room back instead.  While a
 * reservation is outstanding an active consumer does not exit, even when
 * the queue is closed: the record it waits for finds it there.  Unless no
 * record arrives for `reserved_wait_ns` (a stream that never gets to the
 * copies, as after a CUDA error): then the consumer exits anyway,
 * noting what it gave up (hcb__queue_take_abandoned); a record that
 * arrives later waits in the queue for the next consumer (a barrier or
 * submit starts one). */
hcb__push_result hcb__queue_reserve(hcb__queue *q, size_t size,
                                    bool self_consumer, hcb__wait *wait);
void hcb__queue_push_reserved(hcb__queue *q, hcb_record *rec);
void hcb__queue_unreserve(hcb__queue *q, size_t size);
/* How long a closing consumer waits for reserved records while none
 * arrives (HCB__RESERVED_WAIT_NS at first).  Any thread. */
void hcb__queue_set_reserved_wait(hcb__queue *q, uint64_t ns);
/* The reserved records (and their bytes) the last closing consumer gave
 * up waiting for, set back to 0; 0 when it gave up none.  For the stop
 * that joined it. */
uint64_t hcb__queue_take_abandoned(hcb__queue *q, size_t *bytes);

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

/* Consumer lifecycle, driven by channels.c under the channel's
 * lifecycle lock. */
void hcb__queue_set_consumer_active(hcb__queue *q, bool active);
void hcb__queue_close(hcb__queue *q);
void hcb__queue_reopen(hcb__queue *q);
/* True when records wait and no consumer is active (a failed restart). */
bool hcb__queue_stranded(hcb__queue *q);

/* Adds the queue's counters to `s` (records and bytes in and out, queued,
 * reserved, high water, producer waits). */
void hcb__queue_add_stats(hcb__queue *q, hcb_stats *s);

#endif /* HCB_QUEUE_H */
