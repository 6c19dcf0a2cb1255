/*
 * queue.c - a FIFO of records bounded in bytes, pushed without a lock.
 *
 * DESIGN
 *
 * Threads.  Any number of producers (XLA threads running the tap handler,
 * or C callers of hcb_runtime_submit) push; one consumer thread pops; any
 * number of barrier callers wait.
 *
 * The list.  Records are linked by `next` from `head` (the consumer's) to
 * `tail` (the producers'), a multi-producer single-consumer list after
 * D. Vyukov's: a producer swaps itself in as `tail` (one atomic exchange)
 * and then links the record it replaced to itself.  Until that link is
 * made the consumer sees the list end early and waits for it (a few
 * instructions, unless the producer is descheduled in between).  A `stub`
 * record stands in the list when it is empty, so that there is always a
 * tail to link after; the consumer puts it back behind the last record so
 * that the last record can leave.  The consumer takes every record it can
 * reach at once (hcb__queue_pop), calls the tap functions with no lock
 * held, and marks them all done with its next pop.
 *
 * Counts.  `pushed` is taken by each push *before* it swaps the tail, and
 * the consumer counts `done` in list order.  So once `done` reaches a
 * value of `pushed`, every record whose push had returned when `pushed`
 * was read is done (hcb__queue_mark/wait_mark: the barriers): the records
 * linked before it all took their count before it did.
 *
 * Done.  The consumer counts records done (`done`, `bytes`) in batches:
 * when it has DONE_BATCH finished, when it has been idle for a moment
 * (DONE_SPINS), before it sleeps, and at its next pop whenever someone
 * waits (`waiters`): a barrier, a call behind taps.  A producer out of
 * space (`space_waiters`) is served per record: hcb__queue_finished counts
 * each record done as soon as it is finished, so the producer resumes once
 * its record fits, not once the whole batch in hand is delivered.  A
 * producer that starts to wait first counts done itself what the consumer
 * has finished and not yet counted (count_done takes `finished` and
 * `finished_bytes` by exchange, so either side may): the consumer adds to
 * `finished` and then reads `space_waiters`, the producer adds to
 * `space_waiters` and then takes `finished`, both sequentially consistent,
 * so a record finished just before the producer began to wait is never
 * left uncounted while the consumer is busy in the next tap function.
 * Counting each record as it finishes in every case would move the
 * counters' cache line between the producer's core and the consumer's for
 * every record while the consumer keeps up.
 *
 * Sleeping.  An idle consumer polls `pushed` for a few microseconds
 * (POP_SPINS): taps streaming out of a loop arrive closer together than
 * that, and a futex sleep and wake-up per record would cost more than the
 * tap itself.  It yields the processor now and then while it polls: where
 * cores are few, the thread it would keep waiting is often the one about
 * to push (JAX dispatching the next call).  Then it sets `consumer_sleeping`,
 * checks `pushed` once more and waits on `nonempty` under `mu`; a producer,
 * after its count, reads `consumer_sleeping` and only then signals (under
 * `mu`).  Both sides are sequentially consistent, so at least one sees the
 * other: a record is never left with the consumer asleep.  Barrier callers and
 * producers waiting for space count themselves in `waiters` the same way, and
 * the consumer broadcasts `progress` only when someone waits.
 *
 * Bound.  `bytes` counts records from push until done, so the memory held
 * by queued and in-flight records stays under the bound, plus at most one
 * record larger than the bound: a record that does not fit waits until the
 * queue is empty (bytes == 0) and then passes alone.  A producer reserves
 * its bytes with a compare-and-swap, so concurrent producers never
 * overshoot together.  Waiting is what makes a full queue slow the device
 * down (back-pressure); nothing is dropped.  A producer that has waited
 * `stall_ns` calls `stall_fn` once (channels.c warns: a tap function that
 * runs a computation on the waiting device deadlocks), with `mu` released,
 * and waits on.  A waiting producer also calls the queue's check (the
 * runtime's interrupt check, interrupt.h) as it starts to wait and every
 * poll interval, with `mu` released (Python's Ctrl-C:
 * hcb_runtime_set_interrupt); when the check says stop, the producer
 * reserves nothing and the push fails, leaving the record to the
 * caller.
 *
 * Reservations.  A producer that cannot wait where its record is made (a
 * CUDA device's lander, ffi/landing.c) reserves the record's bytes first, on a
 * thread that may wait (hcb__queue_reserve: the same `reserve` as a push, then
 * `reserved` counted), and pushes it later without waiting
 * (hcb__queue_push_reserved: `pushed` counted, linked, then `reserved`
 * uncounted).  A closing consumer exits only once `reserved` is 0 and
 * nothing more is pushed; until then it sleeps on `nonempty`, which a
 * reserved push or an unreserve signals.  The reserver counts `reserved`
 * and then reads `consumer_active`; the consumer clears `consumer_active`
 * and then reads `reserved` (both sequentially consistent): a reserver
 * that sees the consumer active has it stay for the record.  One that
 * does not may still have been seen (the consumer read `reserved` after
 * the count and stayed), while the stop that closed the queue waits to
 * join that consumer: it gives the room back at once, so that the
 * consumer can exit, and then starts another (channels.c, after the
 * stop) and reserves again.  Were the room kept while the reserver waits
 * for the stop, the stop would wait for the consumer, the consumer for
 * the record, and the record for the reserver.  A closing consumer waits
 * for reserved records only while they keep coming: after
 * `reserved_wait_ns` without one (the stream whose copies the lander
 * waits for stopped, e.g. a CUDA error that broke the context) it exits anyway,
 * so that a stop never hangs, and notes how many it gave up (`abandoned`),
 * which the stop reports (channels.c).  They stay counted in `reserved`:
 * one that lands later is pushed into the queue, where the next consumer
 * (started by a barrier, a submit or a reservation) delivers it.
 * `reserved_bytes` counts the room reserved apart from `bytes`, so that
 * the stats tell queued records from reserved ones.
 *
 * Ordering.  Records leave in the order they were linked: for one producer
 * thread, the order it pushed them; reserved records in the order they
 * are pushed, not reserved.
 *
 * Shutdown.  close sets `closing`; the consumer keeps popping until the
 * queue is empty, then marks itself inactive, checks `pushed` once more
 * (a record that came in the meantime is drained first) and returns NULL.
 * A producer reads `consumer_active` after its count: one that sees it
 * false has channels.c start a new consumer, after the stop that closed the
 * queue has joined the old one (the channel's lifecycle lock).
 *
 * Fork.  A child has none of the threads: runtime.c resets its queues
 * (hcb__queue_reset_after_fork) to empty, consumer-less and unlocked; the
 * parent's records stay the parent's.
 *
 * Locks.  `mu` guards only sleeping and waiting; no other lock is taken
 * while holding it (channels.c takes the lifecycle lock *before* it), and no
 * callback (`stall_fn`, the check) is called while holding it.
 */
#include <sched.h>

#include "runtime/queue.h"

/* How long an idle consumer polls before it sleeps, in pauses: 5 us to
 * 100 us, as a pause takes 1 to 26 ns depending on the processor. */
#define POP_SPINS 4000
/* Polls after which an idle consumer counts its finished records done
 * (about 1 us), and the most it keeps finished and uncounted. */
#define DONE_SPINS 64
#define DONE_BATCH 256
/* Polls between two yields of the processor while polling. */
#define YIELD_SPINS 256

int
hcb__queue_init(hcb__queue *q, size_t max_bytes)
{
    int rc;

    *q = (hcb__queue){.head = NULL};
    atomic_init(&q->stub.next, NULL);
    atomic_init(&q->tail, &q->stub);
    q->head = &q->stub;
    atomic_init(&q->max_bytes, max_bytes);
    atomic_init(&q->reserved_wait_ns, HCB__RESERVED_WAIT_NS);
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
hcb__queue_reset_after_fork(hcb__queue *q)
{
    size_t max_bytes = atomic_load(&q->max_bytes);
    void (*stall_fn)(void *, uint64_t, uint64_t) = q->stall_fn;
    void *stall_user = q->stall_user;
    uint64_t stall_ns = q->stall_ns;
    uint64_t reserved_wait_ns = atomic_load(&q->reserved_wait_ns);
    hcb__check check = q->check;
    hcb_device check_device = q->check_device;

    /* a failure leaves the old (unlocked-looking) memory: nothing better
     * can be done in a child, and glibc's init does not fail */
    (void)hcb__queue_init(q, max_bytes);
    hcb__queue_set_stall(q, stall_fn, stall_user, stall_ns);
    hcb__queue_set_reserved_wait(q, reserved_wait_ns);
    q->check = check;
    q->check_device = check_device;
}

/* Wakes the threads waiting on `progress`, if any.  Called after a change
 * they wait for, made sequentially consistent (see Sleeping). */
static void
wake_waiters(hcb__queue *q)
{
    if (atomic_load(&q->waiters) > 0) {
        hcb__mutex_lock(&q->mu);
        hcb__cond_broadcast(&q->progress);
        hcb__mutex_unlock(&q->mu);
    }
}

void
hcb__queue_set_max_bytes(hcb__queue *q, size_t max_bytes)
{
    atomic_store(&q->max_bytes, max_bytes);
    wake_waiters(q);
}

static void count_done(hcb__queue *q);

void
hcb__queue_set_stall(hcb__queue *q, void (*fn)(void *, uint64_t, uint64_t),
                     void *user, uint64_t after_ns)
{
    q->stall_fn = fn;
    q->stall_user = user;
    q->stall_ns = after_ns;
}

static bool
fits(const hcb__queue *q, size_t bytes, size_t size)
{
    size_t max = atomic_load(&q->max_bytes);

    if (bytes == 0)
        return true; /* a record larger than the bound passes alone */
    return bytes <= max && size <= max - bytes;
}

void
hcb__queue_set_check(hcb__queue *q, const hcb__check *check, hcb_device device)
{
    hcb__mutex_lock(&q->mu);
    q->check = *check;
    q->check_device = device;
    hcb__mutex_unlock(&q->mu);
}

/* Calls the wait's check if it is due, with `mu` released; true when it
 * says stop. */
static bool
check_says_stop(hcb__queue *q, hcb__wait *w)
{
    bool stop;

    hcb__mutex_unlock(&q->mu);
    stop = hcb__wait_stopped(w);
    hcb__mutex_lock(&q->mu);
    return stop;
}

/* Waits, with `mu` held and the caller counted in `waiters` and
 * `space_waiters`, until `size` bytes fit; calls the stall callback once
 * after `stall_ns`, and the queue's check (begun in `w`) as it starts and
 * every poll interval, each with `mu` released.  Returns false when the
 * check ended the wait. */
static bool
wait_for_space(hcb__queue *q, size_t size, hcb__wait *w)
{
    uint64_t t0 = hcb__now_ns(), delivered = hcb__queue_delivered(q);
    bool stalled = q->stall_fn == NULL;
    bool checked = q->check.fn != NULL, stopped;
    hcb__wait local;

    if (w == NULL)
        w = &local;
    hcb__wait_begin(w, &q->check, q->check_device);
    stopped = checked && check_says_stop(q, w);
    while (!stopped && !fits(q, atomic_load(&q->bytes), size)) {
        uint64_t deadline =
            hcb__wait_deadline(w, stalled ? 0 : t0 + q->stall_ns);
        uint64_t now = 0;

        if (deadline == 0) {
            hcb__cond_wait(&q->progress, &q->mu);
            continue;
        }
        if (hcb__cond_wait_until(&q->progress, &q->mu, deadline) ||
            (now = hcb__now_ns()) < deadline)
            continue; /* woken: `fits` is checked again */
        /* still counted in `waiters`: the consumer keeps broadcasting, and
         * `fits` is checked again below */
        if (!stalled && now >= t0 + q->stall_ns) {
            stalled = true;
            hcb__mutex_unlock(&q->mu);
            q->stall_fn(q->stall_user, now - t0,
                        hcb__queue_delivered(q) - delivered);
            hcb__mutex_lock(&q->mu);
        }
        if (hcb__wait_due(w, now))
            stopped = check_says_stop(q, w);
    }
    q->waits++;
    q->wait_ns += hcb__now_ns() - t0;
    return !stopped;
}

/* Reserves `size` bytes under the bound, waiting for space unless the
 * caller is the consumer itself (it would wait for itself).  Returns false
 * when the queue's check ended the wait (nothing reserved). */
static bool
reserve(hcb__queue *q, size_t size, bool self_consumer, hcb__wait *w)
{
    size_t bytes = atomic_load_explicit(&q->bytes, memory_order_relaxed);
    size_t high;

    for (;;) {
        bool waited;

        if (self_consumer || fits(q, bytes, size)) {
            if (atomic_compare_exchange_weak(&q->bytes, &bytes, bytes + size))
                break;
            continue; /* `bytes` was reloaded */
        }
        /* counted first, then what is finished is counted done (see Done) */
        atomic_fetch_add(&q->space_waiters, 1);
        count_done(q);
        hcb__mutex_lock(&q->mu);
        atomic_fetch_add(&q->waiters, 1);
        waited = wait_for_space(q, size, w);
        atomic_fetch_sub(&q->waiters, 1);
        atomic_fetch_sub(&q->space_waiters, 1);
        hcb__mutex_unlock(&q->mu);
        if (!waited)
            return false;
        bytes = atomic_load_explicit(&q->bytes, memory_order_relaxed);
    }
    high = atomic_load_explicit(&q->high_water, memory_order_relaxed);
    while (bytes + size > high &&
           !atomic_compare_exchange_weak_explicit(
               &q->high_water, &high, bytes + size, memory_order_relaxed,
               memory_order_relaxed))
        ;
    return true;
}

/* Puts `rec` last in the list: the swap orders it, the link publishes it
 * (release: the consumer reads the record after it sees the link). */
static void
link_last(hcb__queue *q, hcb_record *rec)
{
    hcb_record *prev;

    atomic_store_explicit(&rec->next, NULL, memory_order_relaxed);
    prev = atomic_exchange_explicit(&q->tail, rec, memory_order_acq_rel);
    atomic_store_explicit(&prev->next, rec, memory_order_release);
}

/* Wakes the consumer if it sleeps.  Called after a change it waits for,
 * made sequentially consistent (see Sleeping). */
static void
wake_consumer(hcb__queue *q)
{
    if (atomic_load(&q->consumer_sleeping)) {
        hcb__mutex_lock(&q->mu);
        hcb__cond_signal(&q->nonempty);
        hcb__mutex_unlock(&q->mu);
    }
}

hcb__push_result
hcb__queue_push(hcb__queue *q, hcb_record *rec, bool self_consumer,
                hcb__wait *wait)
{
    if (!reserve(q, rec->size, self_consumer, wait))
        return HCB__PUSH_STOPPED;
    atomic_fetch_add(&q->pushed, 1); /* before the link: see Counts */
    link_last(q, rec);
    wake_consumer(q);
    return atomic_load(&q->consumer_active) ? HCB__PUSH_QUEUED
                                            : HCB__PUSH_NO_CONSUMER;
}

hcb__push_result
hcb__queue_reserve(hcb__queue *q, size_t size, bool self_consumer,
                   hcb__wait *wait)
{
    if (!reserve(q, size, self_consumer, wait))
        return HCB__PUSH_STOPPED;
    atomic_fetch_add(&q->reserved_bytes, size);
    atomic_fetch_add(&q->reserved, 1); /* before the read: see Reservations */
    if (atomic_load(&q->consumer_active))
        return HCB__PUSH_QUEUED;
    hcb__queue_unreserve(q, size); /* a closing consumer may wait for it */
    return HCB__PUSH_NO_CONSUMER;
}

void
hcb__queue_push_reserved(hcb__queue *q, hcb_record *rec)
{
    size_t size = rec->size; /* `rec` may be gone once linked */

    atomic_fetch_add(&q->pushed, 1); /* counted before `reserved` drops */
    link_last(q, rec);
    atomic_fetch_sub(&q->reserved_bytes, size);
    atomic_fetch_sub(&q->reserved, 1);
    wake_consumer(q);
}

void
hcb__queue_unreserve(hcb__queue *q, size_t size)
{
    atomic_fetch_sub(&q->bytes, size);
    atomic_fetch_sub(&q->reserved_bytes, size);
    atomic_fetch_sub(&q->reserved, 1);
    wake_waiters(q);
    wake_consumer(q);
}

void
hcb__queue_set_reserved_wait(hcb__queue *q, uint64_t ns)
{
    atomic_store(&q->reserved_wait_ns, ns);
}

uint64_t
hcb__queue_take_abandoned(hcb__queue *q, size_t *bytes)
{
    *bytes = atomic_exchange(&q->abandoned_bytes, 0);
    return atomic_exchange(&q->abandoned, 0);
}

/* The oldest record, or NULL when none can be taken yet (the list is
 * empty, or a producer has swapped the tail and not yet linked).  Only the
 * consumer calls it. */
static hcb_record *
take_one(hcb__queue *q)
{
    hcb_record *head = q->head;
    hcb_record *next = atomic_load_explicit(&head->next, memory_order_acquire);

    if (head == &q->stub) {
        if (next == NULL)
            return NULL;
        q->head = head = next; /* step over the stub */
        next = atomic_load_explicit(&head->next, memory_order_acquire);
    }
    if (next == NULL) {
        /* `head` is the last record linked: put the stub behind it, so
         * that it has a successor to hand `head` to, unless a producer is
         * already linking one */
        if (head != atomic_load_explicit(&q->tail, memory_order_acquire))
            return NULL;
        link_last(q, &q->stub);
        next = atomic_load_explicit(&head->next, memory_order_acquire);
        if (next == NULL)
            return NULL; /* a producer swapped in before the stub */
    }
    q->head = next;
    return head;
}

/* Takes every record that can be taken, oldest first, linked by `next`. */
static hcb_record *
take_all(hcb__queue *q)
{
    hcb_record *first = NULL, *last = NULL, *rec;

    while ((rec = take_one(q)) != NULL) {
        /* no producer writes `rec->next` any more: it had a successor */
        atomic_store_explicit(&rec->next, NULL, memory_order_relaxed);
        if (last != NULL)
            atomic_store_explicit(&last->next, rec, memory_order_relaxed);
        else
            first = rec;
        last = rec;
        q->taken++;
    }
    return first;
}

static bool
nothing_pushed(hcb__queue *q)
{
    return atomic_load(&q->pushed) == q->taken;
}

/* Counts the consumer's finished records done.  The consumer calls it, and
 * a producer about to wait for space (see Done); no lock held. */
static void
count_done(hcb__queue *q)
{
    uint64_t records;
    size_t bytes;

    if (atomic_load(&q->finished) == 0 && atomic_load(&q->finished_bytes) == 0)
        return;
    /* the two are taken apart: a record's count and its bytes may be
     * counted done by different calls, each only once it is finished */
    bytes = atomic_exchange(&q->finished_bytes, 0);
    records = atomic_exchange(&q->finished, 0);
    if (records > 0 || bytes > 0)
        hcb__queue_done(q, records, bytes);
}

uint64_t
hcb__queue_delivered(hcb__queue *q)
{
    return atomic_load(&q->delivered);
}

void
hcb__queue_finished(hcb__queue *q, size_t bytes)
{
    uint64_t n;

    atomic_fetch_add_explicit(&q->delivered, 1, memory_order_relaxed);
    atomic_fetch_add(&q->finished_bytes, bytes);
    n = atomic_fetch_add(&q->finished, 1) + 1;
    if (n >= DONE_BATCH || atomic_load(&q->space_waiters) > 0)
        count_done(q);
}

hcb_record *
hcb__queue_pop(hcb__queue *q, uint64_t done_records, size_t done_bytes)
{
    hcb_record *chain;
    int spin, linking = 0;
    /* closing: when it stops waiting for reserved records (0: not yet
     * waiting), and whether it has */
    uint64_t give_up_at = 0;
    bool gave_up = false;

    if (done_bytes > 0)
        atomic_fetch_add(&q->finished_bytes, done_bytes);
    if (done_records > 0)
        atomic_fetch_add(&q->finished, done_records);
    if (atomic_load(&q->finished) >= DONE_BATCH || atomic_load(&q->waiters) > 0)
        count_done(q);
    for (;;) {
        if ((chain = take_all(q)) != NULL)
            return chain;
        if (!nothing_pushed(q)) {
            /* a producer is between its count and its link: a few
             * instructions, unless it was descheduled there */
            if (++linking % 64 == 0)
                sched_yield();
            else
                hcb__cpu_relax();
            continue;
        }
        if (atomic_load(&q->closing) &&
            (gave_up || atomic_load(&q->reserved) == 0)) {
            count_done(q);
            atomic_store(&q->consumer_active, false);
            if (nothing_pushed(q) &&
                (gave_up || atomic_load(&q->reserved) == 0)) {
                if (gave_up) { /* see Reservations */
                    atomic_store(&q->abandoned_bytes,
                                 atomic_load(&q->reserved_bytes));
                    atomic_store(&q->abandoned, atomic_load(&q->reserved));
                }
                return NULL; /* closing and drained */
            }
            atomic_store(&q->consumer_active, true);
            continue;
        }
        for (spin = 0; spin < POP_SPINS && nothing_pushed(q); spin++) {
            if (spin == DONE_SPINS ||
                (atomic_load_explicit(&q->finished, memory_order_relaxed) > 0 &&
                 atomic_load(&q->waiters) > 0))
                count_done(q);
            if (spin % YIELD_SPINS == YIELD_SPINS - 1)
                sched_yield(); /* see Sleeping */
            else
                hcb__cpu_relax();
        }
        if (!nothing_pushed(q))
            continue;
        count_done(q);
        hcb__mutex_lock(&q->mu);
        atomic_store(&q->consumer_sleeping, true);
        /* closing, it waits only for the records reserved, and only while
         * they keep coming (see Reservations) */
        while (nothing_pushed(q) &&
               (!atomic_load(&q->closing) || atomic_load(&q->reserved) > 0)) {
            if (!atomic_load(&q->closing)) {
                hcb__cond_wait(&q->nonempty, &q->mu);
                continue;
            }
            if (give_up_at == 0)
                give_up_at = hcb__now_ns() + atomic_load(&q->reserved_wait_ns);
            if (!hcb__cond_wait_until(&q->nonempty, &q->mu, give_up_at) &&
                hcb__now_ns() >= give_up_at) {
                gave_up = true;
                break;
            }
        }
        atomic_store(&q->consumer_sleeping, false);
        hcb__mutex_unlock(&q->mu);
    }
}

void
hcb__queue_done(hcb__queue *q, uint64_t records, size_t bytes)
{
    atomic_fetch_add_explicit(&q->bytes_out, bytes, memory_order_relaxed);
    atomic_fetch_sub(&q->bytes, bytes);
    atomic_fetch_add(&q->done, records);
    wake_waiters(q);
}

bool
hcb__queue_idle(hcb__queue *q)
{
    /* pushed first: what this thread pushed is in it (program order); done
     * after, with acquire, pairing with the consumer's update. */
    uint64_t pushed = atomic_load_explicit(&q->pushed, memory_order_relaxed);

    return atomic_load_explicit(&q->done, memory_order_acquire) >= pushed;
}

void
hcb__queue_wait_done(hcb__queue *q)
{
    hcb__queue_wait_mark(q, hcb__queue_mark(q), 0);
}

uint64_t
hcb__queue_mark(hcb__queue *q)
{
    return atomic_load(&q->pushed);
}

bool
hcb__queue_wait_mark(hcb__queue *q, uint64_t mark, uint64_t deadline_ns)
{
    bool reached;
    int spin;

    if (atomic_load(&q->done) >= mark)
        return true;
    /* counted in `waiters` from here: the consumer counts what it has
     * finished at once, and that is often all this waits for */
    atomic_fetch_add(&q->waiters, 1);
    for (spin = 0; spin < POP_SPINS && atomic_load(&q->done) < mark; spin++)
        hcb__cpu_relax();
    hcb__mutex_lock(&q->mu);
    while (atomic_load(&q->done) < mark) {
        if (deadline_ns == 0)
            hcb__cond_wait(&q->progress, &q->mu);
        else if (!hcb__cond_wait_until(&q->progress, &q->mu, deadline_ns) &&
                 hcb__now_ns() >= deadline_ns)
            break;
    }
    reached = atomic_load(&q->done) >= mark;
    hcb__mutex_unlock(&q->mu);
    atomic_fetch_sub(&q->waiters, 1);
    return reached;
}

void
hcb__queue_set_consumer_active(hcb__queue *q, bool active)
{
    atomic_store(&q->consumer_active, active);
}

void
hcb__queue_close(hcb__queue *q)
{
    hcb__mutex_lock(&q->mu);
    atomic_store(&q->closing, true);
    hcb__cond_broadcast(&q->nonempty);
    hcb__mutex_unlock(&q->mu);
}

void
hcb__queue_reopen(hcb__queue *q)
{
    atomic_store(&q->closing, false);
}

bool
hcb__queue_stranded(hcb__queue *q)
{
    return atomic_load(&q->pushed) > atomic_load(&q->done) &&
           !atomic_load(&q->consumer_active);
}

void
hcb__queue_add_stats(hcb__queue *q, hcb_stats *s)
{
    uint64_t done = atomic_load(&q->done), pushed = atomic_load(&q->pushed);
    uint64_t out = atomic_load(&q->bytes_out);
    uint64_t reserved = atomic_load(&q->reserved);
    size_t reserved_bytes = atomic_load(&q->reserved_bytes);
    size_t bytes = atomic_load(&q->bytes), high = atomic_load(&q->high_water);
    /* `bytes` holds the room reserved too: queued is what was pushed (the
     * counters move apart, so a snapshot may be short by a record) */
    size_t queued = bytes > reserved_bytes ? bytes - reserved_bytes : 0;

    s->records_in += pushed;
    s->bytes_in += out + queued;
    s->records_out += done;
    s->bytes_out += out;
    s->queued_records += pushed > done ? pushed - done : 0;
    s->queued_bytes += queued;
    s->reserved_records += reserved;
    s->reserved_bytes += reserved_bytes;
    if (high > s->high_water_bytes)
        s->high_water_bytes = high;
    hcb__mutex_lock(&q->mu);
    s->producer_waits += q->waits;
    s->producer_wait_ns += q->wait_ns;
    hcb__mutex_unlock(&q->mu);
}
