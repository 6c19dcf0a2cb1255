/*
 * landing.c - host work after a stream's work, without the stream waiting.
 *
 * A tap's copies land in pinned memory; then its record must be handed to
 * the queue.  A CUDA host function (cudaLaunchHostFunc) would do that in
 * stream order, but the stream stops at a host function until CUDA's
 * thread has run it: measured on an H100 with a scan of 4096x4096 matrix
 * products, one per step added ~90 us to every step, against nothing for
 * an event (bench/README.md, "GPU").  So the handler records an event
 * after the copies instead, and one thread per device, its lander, waits
 * for the events in the order they were recorded and runs each one's
 * function.  The stream never waits for the host; the host learns of the
 * copies a little later, which only a tap's function notices.
 *
 *   XLA's thread:  copies | event_record -> append (fn, event)
 *   the stream:    ... kernels | copies | (event) | kernels ...
 *   the lander:    event_synchronize -> fn(data) -> the next
 *
 * Events are made with blocking synchronisation (the lander sleeps in the
 * driver instead of spinning on a core) and kept for reuse, so a tap
 * creates none once the device has as many as it has taps in flight.
 *
 * What waits for a device's records so far (a barrier after the device's
 * computations, a call after the taps before it) settles the device first
 * (hcb__runtime_set_settle): it waits until the lander has run every
 * landing whose event is done, so that a record whose copies are done is
 * in the queue, as a host function would have put it there.
 */
#include <stdatomic.h>

#include "ffi/cuda.h"
#include "runtime/runtime.h"

typedef struct landing {
    struct landing *next;
    const hcb__cuda *api; /* the table the event was made with */
    void *event;
    hcb__cuda_host_fn fn;
    void *data;
} landing;

typedef struct lander {
    hcb__mutex mu;
    hcb__cond work;     /* a landing was appended, or stop */
    hcb__cond progress; /* a landing has run (settle waits for it) */
    landing *head, *tail;
    landing *current; /* popped, running */
    landing *spare;   /* run landings, with their events, for reuse */
    uint64_t appended, ran;
    bool stop;
    pthread_t thread;
} lander;

static _Atomic(lander *) landers[HCB__PINNED_DEVICES];
static hcb__mutex landers_mu = {PTHREAD_MUTEX_INITIALIZER};
static bool fork_handled; /* under landers_mu */

static void *
lander_main(void *arg)
{
    lander *l = arg;
    landing *n;

    hcb__mutex_lock(&l->mu);
    for (;;) {
        while (l->head == NULL && !l->stop)
            hcb__cond_wait(&l->work, &l->mu);
        if ((n = l->head) == NULL) /* stopped, and nothing left */
            break;
        if ((l->head = n->next) == NULL)
            l->tail = NULL;
        l->current = n;
        hcb__mutex_unlock(&l->mu);
        /* A failed wait is a failed stream (CUDA's errors are sticky there):
         * the computation fails anyway, and the function still runs, so
         * that nothing waits for a record that never comes. */
        (void)n->api->event_synchronize(n->event);
        n->fn(n->data);
        hcb__mutex_lock(&l->mu);
        l->current = NULL;
        l->ran++;
        n->next = l->spare;
        l->spare = n;
        hcb__cond_broadcast(&l->progress);
    }
    hcb__mutex_unlock(&l->mu);
    return NULL;
}

/* The runtime's settle hook: returns once device's lander has run every
 * landing whose event is done (and at once if the device has none). */
static void
settle(hcb_device device)
{
    int ordinal = HCB_DEVICE_ORDINAL(device);
    uint64_t until;
    lander *l;

    if (HCB_DEVICE_PLATFORM(device) != HCB_PLATFORM_CUDA || ordinal < 0 ||
        ordinal >= HCB__PINNED_DEVICES ||
        (l = atomic_load_explicit(&landers[ordinal], memory_order_acquire)) ==
            NULL)
        return;
    hcb__mutex_lock(&l->mu);
    until = l->appended;
    while (l->ran < until) {
        landing *next = l->current != NULL ? l->current : l->head;

        /* the next to run is not done (or failed, which the lander finds
         * at once): what follows it is not either */
        if (next->api->event_query(next->event) != 0)
            break;
        (void)hcb__cond_wait_until(&l->progress, &l->mu,
                                   hcb__now_ns() + 1000000);
    }
    hcb__mutex_unlock(&l->mu);
}

/* In a child of fork(): the parent's landers are not there (their threads,
 * perhaps a mutex held), so the child starts with none, what they hold
 * left, as the runtime leaves the parent's records (CUDA does not work in
 * such a child anyway). */
static void
forget_after_fork(void)
{
    size_t i;

    for (i = 0; i < HCB__PINNED_DEVICES; i++)
        atomic_store_explicit(&landers[i], NULL, memory_order_relaxed);
    (void)hcb__mutex_init(&landers_mu);
}

/* Device `ordinal`'s lander, started at its first use. */
static lander *
lander_of(int ordinal, hcb_error *err)
{
    lander *l;

    if (ordinal < 0 || ordinal >= HCB__PINNED_DEVICES) {
        hcb_error_set(err, HCB_EINVAL,
                      "CUDA device %d: at most %d devices are supported",
                      ordinal, HCB__PINNED_DEVICES);
        return NULL;
    }
    if ((l = atomic_load_explicit(&landers[ordinal], memory_order_acquire)) !=
        NULL)
        return l;
    hcb__mutex_lock(&landers_mu);
    if (!fork_handled)
        fork_handled = pthread_atfork(NULL, NULL, forget_after_fork) == 0;
    if ((l = atomic_load_explicit(&landers[ordinal], memory_order_relaxed)) ==
        NULL) {
        if ((l = hcb__calloc(1, sizeof *l)) == NULL) {
            hcb_error_set(err, HCB_ENOMEM, "cannot allocate a lander");
        } else if (hcb__mutex_init(&l->mu) != HCB_OK ||
                   hcb__cond_init(&l->work) != HCB_OK ||
                   hcb__cond_init(&l->progress) != HCB_OK ||
                   hcb__thread_create(&l->thread, "hcb-land", lander_main, l) !=
                       HCB_OK) {
            /* init failures leave nothing to destroy but what succeeded;
             * they do not happen on Linux short of resources */
            hcb__free(l);
            l = NULL;
            hcb_error_set(err, HCB_ESYSTEM,
                          "cannot start the thread that receives CUDA "
                          "device %d's taps",
                          ordinal);
        } else {
            hcb__runtime_set_settle(settle);
            atomic_store_explicit(&landers[ordinal], l, memory_order_release);
        }
    }
    hcb__mutex_unlock(&landers_mu);
    return l;
}

/* A landing with an event of `api`'s, made on device `ordinal`. */
static landing *
take_landing(lander *l, const hcb__cuda *api, int ordinal, hcb_error *err)
{
    landing *n;
    int previous, rc, status;

    hcb__mutex_lock(&l->mu);
    if ((n = l->spare) != NULL)
        l->spare = n->next;
    hcb__mutex_unlock(&l->mu);
    if (n != NULL && n->api == api)
        return n;
    if (n != NULL) /* made by a table since replaced (tests) */
        (void)n->api->event_destroy(n->event);
    else if ((n = hcb__malloc(sizeof *n)) == NULL) {
        hcb_error_set(err, HCB_ENOMEM, "cannot allocate a landing");
        return NULL;
    }
    n->api = api;
    /* the event must be made on its stream's device, which the thread's
     * current one may not be (a callback switched it) */
    if ((rc = hcb__cuda_switch_device(api, ordinal, &previous, err)) ==
        HCB_OK) {
        if ((status = api->event_create(
                 &n->event, HCB__CUDA_EVENT_BLOCKING_SYNC |
                                HCB__CUDA_EVENT_DISABLE_TIMING)) != 0)
            rc = hcb__cuda_fail(api, status, "creating a CUDA event", err);
        if (previous >= 0)
            (void)api->set_device(previous);
    }
    if (rc != HCB_OK) {
        hcb__free(n);
        return NULL;
    }
    return n;
}

int
hcb__cuda_after(const hcb__cuda *api, void *stream, int ordinal,
                hcb__cuda_host_fn fn, void *data, const char *what,
                hcb_error *err)
{
    lander *l;
    landing *n;
    int status;

    if ((l = lander_of(ordinal, err)) == NULL ||
        (n = take_landing(l, api, ordinal, err)) == NULL)
        return err->code;
    n->fn = fn;
    n->data = data;
    n->next = NULL;
    status = api->event_record(n->event, stream);
    hcb__mutex_lock(&l->mu);
    if (status != 0) {
        n->next = l->spare;
        l->spare = n;
    } else {
        if (l->tail != NULL)
            l->tail->next = n;
        else
            l->head = n;
        l->tail = n;
        l->appended++;
        hcb__cond_signal(&l->work);
    }
    hcb__mutex_unlock(&l->mu);
    return status != 0 ? hcb__cuda_fail(api, status, what, err) : HCB_OK;
}

void
hcb__cuda_landing_stop(void)
{
    size_t i;

    hcb__mutex_lock(&landers_mu);
    for (i = 0; i < HCB__PINNED_DEVICES; i++) {
        lander *l = atomic_load_explicit(&landers[i], memory_order_relaxed);
        landing *n;

        if (l == NULL)
            continue;
        hcb__mutex_lock(&l->mu);
        l->stop = true;
        hcb__cond_signal(&l->work);
        hcb__mutex_unlock(&l->mu);
        hcb__thread_join(l->thread); /* it runs what is queued first */
        while ((n = l->spare) != NULL) {
            l->spare = n->next;
            (void)n->api->event_destroy(n->event);
            hcb__free(n);
        }
        hcb__cond_destroy(&l->progress);
        hcb__cond_destroy(&l->work);
        hcb__mutex_destroy(&l->mu);
        hcb__free(l);
        atomic_store_explicit(&landers[i], NULL, memory_order_relaxed);
    }
    hcb__mutex_unlock(&landers_mu);
}
