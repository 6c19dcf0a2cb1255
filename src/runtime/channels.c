/*
 * channels.c - a device's channel: its bounded queue (queue.c) and the
 * consumer thread that delivers its records to their tap targets; submit,
 * barriers, stop, the queue bound, stats and the stall warning.
 *
 * The path of a record: the platform's send (platform_cpu.c, on an XLA
 * thread) calls hcb_runtime_submit (CUDA's: hcb__runtime_reserve on XLA's
 * thread, hcb__runtime_submit_reserved from the device's lander once the
 * record's bytes have landed) -> channel_get finds the device's
 * channel -> ensure_consumer starts its thread on first use ->
 * hcb__queue_push (may wait: back-pressure) -> the consumer thread
 * (consumer_main) pops it -> deliver looks up the target (registry.c) and
 * calls its tap function -> the record is released and marked done.
 *
 * Threads, locks, ordering, shutdown and stalls: see runtime.h.
 */
#include <fenv.h>
#include <stdio.h>
#include <string.h>

#include "runtime/runtime.h"

HCB__TLS channel *hcb__consumer;

static channel *
channel_new(hcb_runtime *rt, hcb_device device, hcb_error *err)
{
    channel *ch = hcb__calloc(1, sizeof *ch);

    if (ch == NULL) {
        hcb_error_set(err, HCB_ENOMEM, "cannot allocate a device channel");
        return NULL;
    }
    ch->rt = rt;
    ch->device = device;
    atomic_init(&ch->running, false);
    atomic_init(&ch->errors, 0);
    atomic_init(&ch->delivering, NULL);
    atomic_init(&ch->stall_warned_ns, 0);
    atomic_init(&ch->call_noted_ns, 0);
    atomic_init(&ch->now_records, 0);
    atomic_init(&ch->now_bytes, 0);
    if (hcb__queue_init(&ch->queue, rt->max_queue_bytes) != HCB_OK) {
        hcb__free(ch);
        hcb_error_set(err, HCB_ESYSTEM, "cannot initialise a device queue");
        return NULL;
    }
    hcb__queue_set_stall(&ch->queue, hcb__channel_stalled, ch, STALL_WARN_NS);
    hcb__queue_set_check(&ch->queue, &rt->interrupt, device); /* under mu */
    if (hcb__mutex_init(&ch->lifecycle) != HCB_OK) {
        hcb__queue_destroy(&ch->queue);
        hcb__free(ch);
        hcb_error_set(err, HCB_ESYSTEM, "cannot initialise a device channel");
        return NULL;
    }
    return ch;
}

void
hcb__channel_free(channel *ch)
{
    hcb__mutex_destroy(&ch->lifecycle);
    hcb__queue_destroy(&ch->queue);
    hcb__free(ch);
}

channel *
hcb__channel_get(hcb_runtime *rt, hcb_device device, hcb_error *err)
{
    channel *ch = hcb__channel_find(rt, device);
    size_t i;

    if (ch != NULL)
        return ch;
    hcb__mutex_lock(&rt->mu);
    ch = hcb__channel_find(rt, device); /* another producer may have won */
    if (ch == NULL && rt->nchannels >= CHANNEL_SLOTS / 2) {
        hcb_error_set(err, HCB_ESTATE, "too many devices (%zu)", rt->nchannels);
    } else if (ch == NULL && (ch = channel_new(rt, device, err)) != NULL) {
        for (i = hcb__channel_slot(device);
             atomic_load_explicit(&rt->slots[i], memory_order_relaxed) != NULL;
             i = (i + 1) & (CHANNEL_SLOTS - 1))
            ;
        atomic_store_explicit(&rt->slots[i], ch, memory_order_release);
        rt->nchannels++;
    }
    hcb__mutex_unlock(&rt->mu);
    return ch;
}

static void
deliver(channel *ch, hcb_record *rec)
{
    const target *t = hcb__target_get(ch->rt, rec->callback_id);
    hcb_error err;

    err.code = HCB_OK;
    err.message[0] = '\0';
    if (t == NULL || t->kind != TARGET_TAP) {
        hcb_error_set(&err, HCB_ENOTFOUND,
                      "record for unknown tap id %llu dropped%s",
                      (unsigned long long)rec->callback_id,
                      t != NULL ? " (the id is a call target)" : "");
    } else {
        int rc;

        atomic_store_explicit(&ch->delivering, t, memory_order_relaxed);
        rc = t->tap(t->user, rec, &err);
        atomic_store_explicit(&ch->delivering, NULL, memory_order_relaxed);
        if (rc == 0)
            return;
        if (err.code == HCB_OK)
            hcb_error_set(&err, HCB_ECALLBACK, "tap function '%s' failed",
                          t->name);
    }
    hcb_runtime_record_error(ch->rt, ch->device, &err);
}

static void *
consumer_main(void *arg)
{
    channel *ch = arg;
    hcb_record *rec, *next;

    hcb__consumer = ch;
    /* A thread inherits its creator's floating-point environment, here
     * often an XLA thread's, which flushes denormals to zero: tap functions
     * (and numpy printing for them) compute as the program's own threads
     * do, as under the removed module's receiver thread. */
    fesetenv(FE_DFL_ENV);
    while ((rec = hcb__queue_pop(&ch->queue, 0, 0)) != NULL) {
        for (; rec != NULL; rec = next) {
            size_t size = rec->size;

            next = atomic_load_explicit(&rec->next, memory_order_relaxed);
            atomic_store_explicit(&rec->next, NULL, memory_order_relaxed);
            deliver(ch, rec);
            hcb__record_delivered(rec);
            hcb_record_release(rec);
            /* each record, not each batch: a producer waiting for space
             * resumes as soon as its record fits (queue.c, "Done") */
            hcb__queue_finished(&ch->queue, size);
        }
    }
    hcb__consumer = NULL;
    return NULL;
}

/* Starts the channel's consumer unless it runs.  `recheck` skips the
 * lock-free fast path: the caller saw the queue without a consumer, which
 * can happen while a stop is joining the old one. */
int
hcb__ensure_consumer(channel *ch, bool recheck, hcb_error *err)
{
    char name[16];
    int rc = HCB_OK;

    if (!recheck && atomic_load_explicit(&ch->running, memory_order_acquire))
        return HCB_OK;
    hcb__mutex_lock(&ch->lifecycle);
    if (!atomic_load_explicit(&ch->running, memory_order_relaxed)) {
        snprintf(name, sizeof name, "hcb-%s-%d", hcb__platform_name(ch->device),
                 (int)HCB_DEVICE_ORDINAL(ch->device));
        hcb__queue_set_consumer_active(&ch->queue, true);
        rc = hcb__thread_create(&ch->thread, name, consumer_main, ch);
        if (rc == HCB_OK) {
            atomic_store_explicit(&ch->running, true, memory_order_release);
        } else {
            hcb__queue_set_consumer_active(&ch->queue, false);
            hcb_error_set(err, rc, "cannot start the consumer thread %s", name);
        }
    }
    hcb__mutex_unlock(&ch->lifecycle);
    return rc;
}

static void
stop_channel(channel *ch)
{
    uint64_t abandoned;
    size_t bytes;

    hcb__mutex_lock(&ch->lifecycle);
    if (atomic_load_explicit(&ch->running, memory_order_relaxed)) {
        hcb__queue_close(&ch->queue);
        hcb__thread_join(ch->thread);
        atomic_store_explicit(&ch->running, false, memory_order_release);
        hcb__queue_reopen(&ch->queue);
    }
    hcb__mutex_unlock(&ch->lifecycle);
    /* records on their way that never came (queue.c, "Reservations") */
    if ((abandoned = hcb__queue_take_abandoned(&ch->queue, &bytes)) > 0)
        hcb__runtime_warn(
            ch->rt,
            "device %s:%d: the stop gave up waiting for %llu tap records "
            "(%zu bytes) whose copies were enqueued on the device's stream "
            "but did not land within %.1f s (the stream stopped running: a "
            "CUDA error, or a kernel that never ends); the stop goes on "
            "without them.  If they land later, the next barrier_wait "
            "delivers them; if the process ends first, they are lost",
            hcb__platform_name(ch->device), (int)HCB_DEVICE_ORDINAL(ch->device),
            (unsigned long long)abandoned, bytes,
            (double)atomic_load(&ch->queue.reserved_wait_ns) / 1e9);
}

/* The error of a submit (or reservation) of `size` bytes whose wait for
 * room the interrupt check stopped (`w`), with the check's reason. */
static int
stopped_error(channel *ch, size_t size, const hcb__wait *w, hcb_error *err)
{
    return hcb__wait_fail(
        w, err, "; the records queued before it are still delivered",
        "tap of %zu bytes on %s:%d interrupted while waiting for room in its "
        "queue (bound %zu bytes)",
        size, hcb__platform_name(ch->device),
        (int)HCB_DEVICE_ORDINAL(ch->device), atomic_load(&ch->queue.max_bytes));
}

int
hcb_runtime_submit(hcb_runtime *rt, hcb_record *rec, hcb_error *err)
{
    hcb__wait wait;
    channel *ch;
    int rc;

    if (rec == NULL)
        return hcb_error_set(err, HCB_EINVAL, "record is NULL");
    ch = hcb__channel_get(rt, rec->device, err);
    if (ch == NULL) {
        hcb_record_release(rec);
        return err != NULL ? err->code : HCB_ENOMEM;
    }
    if ((rc = hcb__ensure_consumer(ch, false, err)) != HCB_OK) {
        hcb_record_release(rec);
        return rc;
    }
    switch (hcb__queue_push(&ch->queue, rec, hcb__consumer == ch, &wait)) {
    case HCB__PUSH_QUEUED:
        return HCB_OK;
    case HCB__PUSH_NO_CONSUMER:
        return hcb__ensure_consumer(ch, true, err);
    default: /* HCB__PUSH_STOPPED: the interrupt check ended the wait */
        break;
    }
    rc = stopped_error(ch, rec->size, &wait, err);
    hcb_record_release(rec);
    return rc;
}

int
hcb_runtime_set_interrupt(hcb_runtime *rt, uint64_t poll_ns, hcb_check_fn check,
                          void *user, hcb_error *err)
{
    hcb__check c = {check, check != NULL ? user : NULL,
                    check != NULL ? poll_ns : 0};
    size_t i;

    if (check != NULL && poll_ns == 0)
        return hcb_error_set(err, HCB_EINVAL,
                             "interrupt check interval must be positive, "
                             "got 0");
    hcb__mutex_lock(&rt->mu);
    rt->interrupt = c;
    for (i = 0; i < CHANNEL_SLOTS; i++) {
        channel *ch = atomic_load_explicit(&rt->slots[i], memory_order_relaxed);

        if (ch != NULL)
            hcb__queue_set_check(&ch->queue, &c, ch->device);
    }
    hcb__mutex_unlock(&rt->mu);
    return HCB_OK;
}

int
hcb__runtime_reserve(hcb_runtime *rt, hcb_device device, size_t bytes,
                     hcb_error *err)
{
    channel *ch = hcb__channel_get(rt, device, err);
    hcb__push_result res;
    hcb__wait wait;
    int rc;

    if (ch == NULL)
        return err != NULL ? err->code : HCB_ENOMEM;
    if ((rc = hcb__ensure_consumer(ch, false, err)) != HCB_OK)
        return rc;
    /* a consumer that exited, or is exiting, when the room was reserved:
     * the room is given back (the exiting one may wait for it: queue.c,
     * "Reservations"); another is started here, on the reserving thread,
     * which may wait for a stop's join, and the room reserved again */
    while ((res = hcb__queue_reserve(&ch->queue, bytes, hcb__consumer == ch,
                                     &wait)) != HCB__PUSH_QUEUED) {
        if (res == HCB__PUSH_STOPPED) /* the interrupt check ended the wait */
            return stopped_error(ch, bytes, &wait, err);
        if ((rc = hcb__ensure_consumer(ch, true, err)) != HCB_OK)
            return rc;
    }
    return HCB_OK;
}

static _Atomic(hcb__settle_fn) settle_hook;

void
hcb__runtime_set_settle(hcb__settle_fn fn)
{
    atomic_store_explicit(&settle_hook, fn, memory_order_release);
}

void
hcb__channel_settle(channel *ch)
{
    hcb__settle_fn fn =
        atomic_load_explicit(&settle_hook, memory_order_acquire);

    if (fn != NULL)
        fn(ch->device);
}

void
hcb__runtime_submit_reserved(hcb_runtime *rt, hcb_record *rec)
{
    /* the channel exists: the reservation made it */
    hcb__queue_push_reserved(&hcb__channel_find(rt, rec->device)->queue, rec);
}

void
hcb__runtime_unreserve(hcb_runtime *rt, hcb_device device, size_t bytes)
{
    hcb__queue_unreserve(&hcb__channel_find(rt, device)->queue, bytes);
}

/* Waits for the records submitted to `ch` so far; with a check, calls it
 * as the wait begins and every poll interval, and stops when it says so. */
static int
barrier_channel(channel *ch, const hcb__check *check, hcb_error *err)
{
    hcb__wait wait;
    uint64_t mark;
    int rc;

    if (hcb__consumer == ch)
        return hcb_error_set(err, HCB_EDEADLK,
                             "barrier called from the consumer thread of "
                             "the device it waits for");
    hcb__channel_settle(ch);
    if (hcb__queue_stranded(&ch->queue) &&
        (rc = hcb__ensure_consumer(ch, true, err)) != HCB_OK)
        return rc;
    mark = hcb__queue_mark(&ch->queue);
    hcb__wait_begin(&wait, check, ch->device);
    while (
        !hcb__queue_wait_mark(&ch->queue, mark, hcb__wait_deadline(&wait, 0)))
        if (hcb__wait_stopped(&wait))
            return hcb__wait_fail(
                &wait, err, "; the records it waited for are still delivered",
                "barrier on %s:%d interrupted by its check",
                hcb__platform_name(ch->device),
                (int)HCB_DEVICE_ORDINAL(ch->device));
    return HCB_OK;
}

int
hcb_runtime_barrier_poll(hcb_runtime *rt, hcb_device device, uint64_t poll_ns,
                         hcb_check_fn check, void *user, hcb_error *err)
{
    hcb__check c = {check, user, poll_ns};
    channel *ch;
    size_t i;
    int rc;

    if (check != NULL && poll_ns == 0)
        return hcb_error_set(err, HCB_EINVAL,
                             "barrier poll interval must be positive, got 0");
    if (device != HCB_ALL_DEVICES) {
        ch = hcb__channel_find(rt, device);
        return ch == NULL ? HCB_OK : barrier_channel(ch, &c, err);
    }
    for (i = 0; i < CHANNEL_SLOTS; i++) {
        ch = atomic_load_explicit(&rt->slots[i], memory_order_acquire);
        if (ch != NULL && (rc = barrier_channel(ch, &c, err)) != HCB_OK)
            return rc;
    }
    return HCB_OK;
}

int
hcb_runtime_barrier(hcb_runtime *rt, hcb_device device, hcb_error *err)
{
    return hcb_runtime_barrier_poll(rt, device, 0, NULL, NULL, err);
}

/* A producer of `ch` (the device's thread) has waited `waited_ns` for room
 * in the queue, while `delivered` records were delivered (queue.c calls it
 * once per wait, no lock held).  Warns, at most once a minute per device,
 * from the warning thread (runtime.h, "Stalls"), naming the backlog: if
 * records were delivered it only waits behind them; if none was, the tap
 * function running now has not returned, and if it runs a computation on
 * this device, neither can go on. */
void
hcb__channel_stalled(void *user, uint64_t waited_ns, uint64_t delivered)
{
    channel *ch = user;
    const target *t =
        atomic_load_explicit(&ch->delivering, memory_order_relaxed);
    uint64_t now = hcb__now_ns();
    uint64_t last = atomic_load(&ch->stall_warned_ns);
    uint64_t pushed = hcb__queue_mark(&ch->queue);
    uint64_t left = hcb__queue_delivered(&ch->queue);
    const char *platform = hcb__platform_name(ch->device);

    if ((last != 0 && now - last < STALL_WARN_EVERY_NS) ||
        !atomic_compare_exchange_strong(&ch->stall_warned_ns, &last, now))
        return;
    left = pushed > left ? pushed - left : 0;
    if (delivered > 0) {
        hcb__runtime_warn(
            ch->rt,
            "device %s:%d has waited %.1f s for room in its tap queue "
            "(bound %zu bytes) behind a backlog: %llu taps (%zu bytes) "
            "not yet delivered, %llu delivered meanwhile.  It goes on "
            "waiting.  A larger bound (HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE) "
            "makes the device wait less",
            platform, (int)HCB_DEVICE_ORDINAL(ch->device),
            (double)waited_ns / 1e9, atomic_load(&ch->queue.max_bytes),
            (unsigned long long)left, atomic_load(&ch->queue.bytes),
            (unsigned long long)delivered);
        return;
    }
    hcb__runtime_warn(
        ch->rt,
        "device %s:%d has waited %.1f s for room in its tap queue "
        "(bound %zu bytes) while the tap function '%s' is running, and no "
        "tap was delivered meanwhile (%llu taps, %zu bytes, not yet "
        "delivered).  It goes on waiting.  A tap function that runs a "
        "computation (e.g. JAX) on the device that issued the tap "
        "deadlocks when that device's queue is full: the device "
        "waits for the tap function, which waits for the device.  "
        "Raise the queue bound (HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE), "
        "or move that work out of the tap function (after "
        "barrier_wait, or onto another device)",
        platform, (int)HCB_DEVICE_ORDINAL(ch->device), (double)waited_ns / 1e9,
        atomic_load(&ch->queue.max_bytes), t != NULL ? t->name : "(none)",
        (unsigned long long)left, atomic_load(&ch->queue.bytes));
}

int
hcb_runtime_stop(hcb_runtime *rt, hcb_error *err)
{
    size_t i;

    if (hcb__consumer != NULL)
        return hcb_error_set(err, HCB_EDEADLK,
                             "stop called from a consumer thread");
    for (i = 0; i < CHANNEL_SLOTS; i++) {
        channel *ch = atomic_load_explicit(&rt->slots[i], memory_order_acquire);

        if (ch != NULL)
            stop_channel(ch);
    }
    hcb__runtime_warn_stop(rt);
    return HCB_OK;
}

bool
hcb_in_consumer_thread(void)
{
    return hcb__consumer != NULL;
}

int
hcb_runtime_set_max_queue_bytes(hcb_runtime *rt, size_t bytes, hcb_error *err)
{
    size_t i;

    if (bytes == 0)
        return hcb_error_set(err, HCB_EINVAL,
                             "queue bound must be positive, got 0");
    hcb__mutex_lock(&rt->mu);
    rt->max_queue_bytes = bytes;
    for (i = 0; i < CHANNEL_SLOTS; i++) {
        channel *ch = atomic_load_explicit(&rt->slots[i], memory_order_relaxed);

        if (ch != NULL)
            hcb__queue_set_max_bytes(&ch->queue, bytes);
    }
    hcb__mutex_unlock(&rt->mu);
    return HCB_OK;
}

static void
add_stats(channel *ch, hcb_stats *s)
{
    uint64_t now = atomic_load_explicit(&ch->now_records, memory_order_relaxed);
    uint64_t bytes = atomic_load_explicit(&ch->now_bytes, memory_order_relaxed);

    hcb__queue_add_stats(&ch->queue, s);
    s->records_in += now;
    s->records_out += now;
    s->bytes_in += bytes;
    s->bytes_out += bytes;
    s->errors += atomic_load_explicit(&ch->errors, memory_order_relaxed);
    s->devices++;
}

int
hcb_runtime_stats(hcb_runtime *rt, hcb_device device, hcb_stats *stats,
                  hcb_error *err)
{
    size_t size, i;
    channel *ch;

    if (stats == NULL || stats->struct_size < sizeof(size_t))
        return hcb_error_set(err, HCB_EINVAL, "stats needs struct_size");
    size =
        stats->struct_size < sizeof *stats ? stats->struct_size : sizeof *stats;
    {
        hcb_stats s = HCB_STATS_INIT;

        if (device != HCB_ALL_DEVICES) {
            ch = hcb__channel_find(rt, device);
            if (ch == NULL)
                return hcb_error_set(err, HCB_ENOTFOUND,
                                     "device %d:%d has no queue",
                                     (int)HCB_DEVICE_PLATFORM(device),
                                     (int)HCB_DEVICE_ORDINAL(device));
            add_stats(ch, &s);
        } else {
            for (i = 0; i < CHANNEL_SLOTS; i++) {
                ch = atomic_load_explicit(&rt->slots[i], memory_order_acquire);
                if (ch != NULL)
                    add_stats(ch, &s);
            }
        }
        /* Copy only the fields the caller's struct has. */
        s.struct_size = size;
        memcpy(stats, &s, size);
    }
    return HCB_OK;
}

size_t
hcb_runtime_devices(hcb_runtime *rt, hcb_device *out, size_t cap)
{
    size_t i, n = 0;

    for (i = 0; i < CHANNEL_SLOTS; i++) {
        channel *ch = atomic_load_explicit(&rt->slots[i], memory_order_acquire);

        if (ch == NULL)
            continue;
        if (n < cap && out != NULL)
            out[n] = ch->device;
        n++;
    }
    return n;
}
