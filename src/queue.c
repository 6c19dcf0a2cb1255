/*
 * queue.c - a FIFO of records bounded in bytes.
 *
 * DESIGN
 *
 * Threads.  Any number of producers (XLA threads running the tap handler,
 * or C callers of hcb_runtime_submit) push; one consumer thread pops; any
 * number of barrier callers wait.
 *
 * Locks.  One mutex, `mu`, protects every field.  No other lock is ever
 * taken while holding it, and no user code runs under it: the consumer
 * takes every queued record at once (hcb__queue_pop), calls the tap
 * function on each with `mu` released, and then marks them all done
 * (hcb__queue_done): two lock round trips per batch, not per record. (runtime.c
 * takes its lifecycle lock *before* `mu`, never after.)
 *
 * Condvars.  `nonempty` wakes the consumer (push, close).  Before it
 * sleeps on it, an idle consumer polls `pushed_hint` for a few
 * microseconds: taps streaming out of a loop arrive closer together than
 * that, and a futex sleep and wake-up per record would cost more than the
 * tap itself.  `progress` is
 * broadcast whenever a record is done or the bound changes: it wakes the
 * producers waiting for space and the barrier callers waiting for `done`.
 *
 * Bound.  `bytes` counts records from push until done, so the memory held
 * by queued and in-flight records stays under the bound, plus at most one
 * record larger than the bound: a record that does not fit waits until the
 * queue is empty (bytes == 0) and then passes alone.  Waiting is what makes
 * a full queue slow the device down (back-pressure); nothing is dropped.
 *
 * Ordering.  Records leave in the order they entered.  Producers for one
 * device that push concurrently are ordered by who takes `mu` first.
 *
 * Shutdown.  close sets `closing`; the consumer keeps popping until the
 * queue is empty, then marks itself inactive and returns NULL.  A producer
 * that pushes after that learns from the return value that no consumer is
 * active and has runtime.c start a new one.
 */
#include "queue.h"

/* How long an idle consumer polls before it sleeps: about 5-20 us. */
#define POP_SPINS 4000

int
hcb__queue_init(hcb__queue *q, size_t max_bytes)
{
    int rc;

    *q = (hcb__queue){0};
    q->max_bytes = max_bytes;
    if ((rc = hcb__mutex_init(&q->mu)) != HCB_OK)
        return rc;
    if ((rc = hcb__cond_init(&q->nonempty)) != HCB_OK) {
        hcb__mutex_destroy(&q->mu);
        return rc;
    }
    if ((rc = hcb__cond_init(&q->progress)) != HCB_OK) {
        hcb__cond_destroy(&q->nonempty);
        hcb__mutex_destroy(&q->mu);
        return rc;
    }
    return HCB_OK;
}

void
hcb__queue_destroy(hcb__queue *q)
{
    hcb__cond_destroy(&q->progress);
    hcb__cond_destroy(&q->nonempty);
    hcb__mutex_destroy(&q->mu);
}

void
hcb__queue_set_max_bytes(hcb__queue *q, size_t max_bytes)
{
    hcb__mutex_lock(&q->mu);
    q->max_bytes = max_bytes;
    hcb__cond_broadcast(&q->progress);
    hcb__mutex_unlock(&q->mu);
}

static bool
fits(const hcb__queue *q, size_t size)
{
    if (q->bytes == 0)
        return true; /* a record larger than the bound passes alone */
    return q->bytes <= q->max_bytes && size <= q->max_bytes - q->bytes;
}

bool
hcb__queue_push(hcb__queue *q, hcb_record *rec, bool self_consumer)
{
    bool active;

    rec->next = NULL;
    hcb__mutex_lock(&q->mu);
    if (!self_consumer && !fits(q, rec->size)) {
        uint64_t t0 = hcb__now_ns();

        while (!fits(q, rec->size))
            hcb__cond_wait(&q->progress, &q->mu);
        q->waits++;
        q->wait_ns += hcb__now_ns() - t0;
    }
    if (q->tail != NULL)
        q->tail->next = rec;
    else
        q->head = rec;
    q->tail = rec;
    q->bytes += rec->size;
    q->pushed++;
    atomic_store_explicit(&q->pushed_hint, q->pushed, memory_order_relaxed);
    q->bytes_in += rec->size;
    if (q->bytes > q->high_water)
        q->high_water = q->bytes;
    active = q->consumer_active;
    hcb__cond_signal(&q->nonempty);
    hcb__mutex_unlock(&q->mu);
    return active;
}

hcb_record *
hcb__queue_pop(hcb__queue *q)
{
    hcb_record *chain;
    uint64_t seen;
    int spin;

    hcb__mutex_lock(&q->mu);
    if (q->head == NULL && !q->closing) {
        seen = q->pushed;
        hcb__mutex_unlock(&q->mu);
        for (spin = 0; spin < POP_SPINS &&
                       atomic_load_explicit(&q->pushed_hint,
                                            memory_order_relaxed) == seen;
             spin++)
            hcb__cpu_relax();
        hcb__mutex_lock(&q->mu);
    }
    while (q->head == NULL && !q->closing)
        hcb__cond_wait(&q->nonempty, &q->mu);
    chain = q->head;
    if (chain != NULL)
        q->head = q->tail = NULL;
    else
        q->consumer_active = false; /* closing and drained */
    hcb__mutex_unlock(&q->mu);
    return chain;
}

void
hcb__queue_done(hcb__queue *q, uint64_t records, size_t bytes)
{
    hcb__mutex_lock(&q->mu);
    q->bytes -= bytes;
    q->done += records;
    atomic_store_explicit(&q->done_hint, q->done, memory_order_release);
    q->bytes_out += bytes;
    hcb__cond_broadcast(&q->progress);
    hcb__mutex_unlock(&q->mu);
}

bool
hcb__queue_idle(hcb__queue *q)
{
    /* pushed first: what this thread pushed is in it (program order); done
     * after, with acquire, pairing with the release in hcb__queue_done. */
    uint64_t pushed =
        atomic_load_explicit(&q->pushed_hint, memory_order_relaxed);

    return atomic_load_explicit(&q->done_hint, memory_order_acquire) >= pushed;
}

void
hcb__queue_wait_done(hcb__queue *q)
{
    hcb__queue_wait_mark(q, hcb__queue_mark(q), 0);
}

uint64_t
hcb__queue_mark(hcb__queue *q)
{
    uint64_t mark;

    hcb__mutex_lock(&q->mu);
    mark = q->pushed;
    hcb__mutex_unlock(&q->mu);
    return mark;
}

bool
hcb__queue_wait_mark(hcb__queue *q, uint64_t mark, uint64_t deadline_ns)
{
    bool reached;

    hcb__mutex_lock(&q->mu);
    while (q->done < mark) {
        if (deadline_ns == 0)
            hcb__cond_wait(&q->progress, &q->mu);
        else if (!hcb__cond_wait_until(&q->progress, &q->mu, deadline_ns) &&
                 hcb__now_ns() >= deadline_ns)
            break;
    }
    reached = q->done >= mark;
    hcb__mutex_unlock(&q->mu);
    return reached;
}

void
hcb__queue_set_consumer_active(hcb__queue *q, bool active)
{
    hcb__mutex_lock(&q->mu);
    q->consumer_active = active;
    hcb__mutex_unlock(&q->mu);
}

void
hcb__queue_close(hcb__queue *q)
{
    hcb__mutex_lock(&q->mu);
    q->closing = true;
    hcb__cond_broadcast(&q->nonempty);
    hcb__mutex_unlock(&q->mu);
}

void
hcb__queue_reopen(hcb__queue *q)
{
    hcb__mutex_lock(&q->mu);
    q->closing = false;
    hcb__mutex_unlock(&q->mu);
}

bool
hcb__queue_stranded(hcb__queue *q)
{
    bool stranded;

    hcb__mutex_lock(&q->mu);
    stranded = q->head != NULL && !q->consumer_active;
    hcb__mutex_unlock(&q->mu);
    return stranded;
}
