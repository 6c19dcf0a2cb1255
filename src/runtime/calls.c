/*
 * calls.c - what runs in the computation's own thread: calls
 * (hcb_runtime_call) and records delivered now (hcb_runtime_deliver).
 *
 * The platform's call (platform_cpu.c, on an XLA thread) calls
 * hcb_runtime_call -> the device's earlier taps are delivered first
 * (deliver_earlier_taps waits for the channel's queue mark) -> the call
 * function runs in that same thread and fills the result buffers.  A tap
 * delivered now (the platform's deliver) takes the same path with a record:
 * hcb_runtime_deliver -> deliver_earlier_taps -> its tap function, in that
 * thread.  Neither uses the queue or wakes the consumer thread: when nothing
 * is queued before them (the common case) no other thread is involved.
 *
 * And the parking of failures of calls under jit over sharded operands
 * (hcb__sharded_fail/take, runtime.h).
 */
#include <fenv.h>

#include "runtime/runtime.h"

/* Logs, for a call (or a tap delivered now: `what`) that has waited
 * `waited_s` seconds for the taps its device issued before it, what it
 * waits behind: a backlog if `delivered` taps were delivered meanwhile (at
 * most once a minute per device), else that the tap function running now
 * has not returned -- the likely cause, that it runs a computation which
 * contains this call. */
static void
note_call_wait(hcb_runtime *rt, channel *ch, const char *what, const target *t,
               uint64_t mark, uint64_t waited_s, uint64_t delivered)
{
    const target *running =
        atomic_load_explicit(&ch->delivering, memory_order_relaxed);
    uint64_t now = hcb__now_ns(), last = atomic_load(&ch->call_noted_ns);
    uint64_t left = hcb__queue_delivered(&ch->queue);
    const char *platform = hcb__platform_name(ch->device);

    left = mark > left ? mark - left : 0;
    if (delivered > 0) {
        if ((last != 0 && now - last < STALL_WARN_EVERY_NS) ||
            !atomic_compare_exchange_strong(&ch->call_noted_ns, &last, now))
            return;
        hcb__runtime_warn(
            rt,
            "%s '%s' on %s:%d has waited %llu s for the taps its device "
            "issued before it: a backlog of %llu taps not yet delivered "
            "(the queue holds %zu bytes), %llu delivered meanwhile.  It "
            "goes on waiting",
            what, t->name, platform, (int)HCB_DEVICE_ORDINAL(ch->device),
            (unsigned long long)waited_s, (unsigned long long)left,
            atomic_load(&ch->queue.bytes), (unsigned long long)delivered);
        return;
    }
    hcb__runtime_warn(
        rt,
        "%s '%s' on %s:%d has waited %llu s for the taps its device "
        "issued before it (%llu not yet delivered), and none was delivered "
        "meanwhile (the tap function now running: '%s').  It goes on "
        "waiting.  If a tap function of that device runs a computation that "
        "contains this %s, they wait for each other: run that computation "
        "on another device, or outside the tap function (after "
        "barrier_wait)",
        what, t->name, platform, (int)HCB_DEVICE_ORDINAL(ch->device),
        (unsigned long long)waited_s, (unsigned long long)left,
        running != NULL ? running->name : "(none)", what);
}

/* Before a call (or a tap delivered now: `what`) on `ch`'s device:
 * delivers the taps that device issued earlier.  Every HCB_CALL_WAIT_WARN_NS it
 * says what it waits for (note_call_wait), until it has said that no tap was
 * delivered: the likely cause is then a tap function that runs this very
 * computation (it waits for the call, which waits for it), and the call waits
 * without a word more.  The runtime's interrupt check can stop the wait
 * (runtime.h, "Interrupts"): the call then fails, and its function does not
 * run. */
static int
deliver_earlier_taps(hcb_runtime *rt, channel *ch, const char *what,
                     const target *t, hcb_error *err)
{
    uint64_t mark, start, warn_at, before;
    bool noting = true;
    hcb__wait wait;
    int rc;

    hcb__channel_settle(ch);
    if (hcb__queue_idle(&ch->queue))
        return HCB_OK;
    if (hcb__queue_stranded(&ch->queue) &&
        (rc = hcb__ensure_consumer(ch, true, err)) != HCB_OK)
        return rc;
    mark = hcb__queue_mark(&ch->queue);
    start = hcb__now_ns();
    warn_at = start + HCB_CALL_WAIT_WARN_NS;
    before = hcb__queue_delivered(&ch->queue);
    hcb__runtime_wait_begin(rt, ch->device, &wait);
    for (;;) {
        uint64_t now, delivered;

        if (hcb__queue_wait_mark(
                &ch->queue, mark,
                hcb__wait_deadline(&wait, noting ? warn_at : 0)))
            return HCB_OK;
        now = hcb__now_ns();
        if (noting && now >= warn_at) {
            delivered = hcb__queue_delivered(&ch->queue) - before;
            note_call_wait(rt, ch, what, t, mark, (now - start) / 1000000000u,
                           delivered);
            noting = delivered > 0;
            before += delivered;
            warn_at = now + HCB_CALL_WAIT_WARN_NS;
        }
        if (hcb__wait_stopped(&wait)) {
            uint64_t left = hcb__queue_delivered(&ch->queue);

            return hcb__wait_fail(
                &wait, err, "",
                "%s '%s' on %s:%d interrupted while waiting for the %llu "
                "taps its device issued before it",
                what, t->name, hcb__platform_name(ch->device),
                (int)HCB_DEVICE_ORDINAL(ch->device),
                (unsigned long long)(mark > left ? mark - left : 0));
        }
    }
}

int
hcb_runtime_call(hcb_runtime *rt, uint64_t id, hcb_device device,
                 const hcb_array *args, size_t nargs, const hcb_array *results,
                 size_t nresults, hcb_error *err)
{
    const target *t = hcb__target_get(rt, id);
    channel *ch;
    hcb_error local;
    int rc;

    if (t == NULL)
        return hcb_error_set(err, HCB_ENOTFOUND, "unknown call id %llu",
                             (unsigned long long)id);
    if (t->kind != TARGET_CALL)
        return hcb_error_set(err, HCB_EINVAL,
                             "id %llu is the tap target '%s', not a call "
                             "target",
                             (unsigned long long)id, t->name);
    /* One device's callbacks reach the host in the order it issued them:
     * deliver its earlier taps first.  A consumer thread must not wait for
     * a queue (possibly its own) whose tap may be waiting for this call. */
    ch = hcb__channel_find(rt, device);
    if (ch != NULL && hcb__consumer == NULL &&
        (rc = deliver_earlier_taps(rt, ch, "call", t, err)) != HCB_OK)
        return rc;

    if (err == NULL)
        err = &local;
    err->code = HCB_OK;
    err->message[0] = '\0';
    rc = t->call(t->user, device, args, nargs, results, nresults, err);
    if (rc == HCB_OK)
        return HCB_OK;
    if (err->code == HCB_OK)
        hcb_error_set(err, rc < 0 ? rc : HCB_ECALLBACK,
                      "call function '%s' failed", t->name);
    hcb_runtime_record_error(rt, device, err);
    return err->code;
}

int
hcb_runtime_deliver(hcb_runtime *rt, hcb_record *rec, int flags, hcb_error *err)
{
    const target *t;
    hcb_device device;
    hcb_error local;
    channel *ch;
    fenv_t env;
    size_t size;
    int rc;

    if (err == NULL)
        err = &local;
    if (rec == NULL)
        return hcb_error_set(err, HCB_EINVAL, "record is NULL");
    device = rec->device;
    size = rec->size;
    t = hcb__target_get(rt, rec->callback_id);
    if (t == NULL || t->kind != TARGET_TAP) {
        rc = t == NULL
                 ? hcb_error_set(err, HCB_ENOTFOUND, "unknown tap id %llu",
                                 (unsigned long long)rec->callback_id)
                 : hcb_error_set(err, HCB_EINVAL,
                                 "id %llu is the call target '%s', not a tap "
                                 "target",
                                 (unsigned long long)rec->callback_id, t->name);
        hcb_record_release(rec);
        return rc;
    }
    /* The channel (made if need be: the statistics count deliveries);
     * then, as for a call, the device's earlier taps first. */
    if ((ch = hcb__channel_get(rt, device, err)) == NULL) {
        hcb_record_release(rec);
        return err->code;
    }
    if (hcb__consumer == NULL &&
        (rc = deliver_earlier_taps(rt, ch, "tap", t, err)) != HCB_OK) {
        hcb_record_release(rec);
        return rc;
    }
    err->code = HCB_OK;
    err->message[0] = '\0';
    /* The tap function computes as on the consumer thread (channels.c,
     * consumer_main): in the default floating-point environment, not in
     * XLA's, which flushes denormals to zero. */
    fegetenv(&env);
    fesetenv(FE_DFL_ENV);
    rc = t->tap(t->user, rec, err);
    fesetenv(&env);
    hcb__record_delivered(rec);
    hcb_record_release(rec);
    atomic_fetch_add_explicit(&ch->now_records, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&ch->now_bytes, size, memory_order_relaxed);
    if (rc == HCB_OK)
        return HCB_OK;
    if (err->code == HCB_OK)
        hcb_error_set(err, rc < 0 ? rc : HCB_ECALLBACK,
                      "tap function '%s' failed", t->name);
    hcb_runtime_record_error(rt, device, err);
    return flags == HCB_DELIVER_KEEP_ERROR ? HCB_OK : err->code;
}

int
hcb_runtime_call_parked(hcb_runtime *rt, uint64_t id, hcb_device device,
                        const hcb_array *args, size_t nargs,
                        const hcb_array *results, size_t nresults,
                        int64_t ndevices, int *parked, hcb_error *err)
{
    hcb_error local;
    int rc;

    if (err == NULL)
        err = &local;
    *parked = 0;
    rc = hcb_runtime_call(rt, id, device, args, nargs, results, nresults, err);
    if (rc != HCB_OK && ndevices > 0 &&
        hcb__sharded_fail(rt, id, ndevices, err) == HCB_OK)
        *parked = 1;
    return rc;
}

int
hcb__sharded_fail(hcb_runtime *rt, uint64_t id, int64_t ndevices,
                  const hcb_error *error)
{
    int i, slot = -1;

    hcb__mutex_lock(&rt->err_mu);
    for (i = 0; i < HCB__SHARDED_SLOTS; i++) {
        if (rt->sharded[i].id == id) { /* another run's, not all taken yet */
            slot = i;
            break;
        }
        if (rt->sharded[i].id == 0 && slot < 0)
            slot = i;
    }
    if (slot >= 0) {
        if (rt->sharded[slot].id != id) { /* a free slot */
            rt->sharded[slot].id = id;
            rt->sharded[slot].remaining = 0;
        }
        rt->sharded[slot].remaining += ndevices;
        rt->sharded[slot].error = *error;
    }
    hcb__mutex_unlock(&rt->err_mu);
    return slot >= 0 ? HCB_OK : HCB_ESTATE;
}

bool
hcb__sharded_take(hcb_runtime *rt, uint64_t id, hcb_error *error)
{
    bool found = false;
    int i;

    hcb__mutex_lock(&rt->err_mu);
    for (i = 0; i < HCB__SHARDED_SLOTS; i++) {
        if (rt->sharded[i].id == id) {
            *error = rt->sharded[i].error;
            if (--rt->sharded[i].remaining <= 0)
                rt->sharded[i].id = 0;
            found = true;
            break;
        }
    }
    hcb__mutex_unlock(&rt->err_mu);
    return found;
}
