/*
 * runtime.c - per-device channels (a bounded queue and a consumer thread),
 * the registry of tap and call targets, synchronous calls, barriers,
 * stop/restart, errors and stats.
 *
 * DESIGN
 *
 * The path of a record: a producer (the FFI tap handler in ffi_tap.c, on an
 * XLA thread) calls hcb_runtime_submit -> channel_get finds the device's
 * channel -> ensure_consumer starts its thread on first use ->
 * hcb__queue_push (may wait: back-pressure) -> the consumer thread
 * (consumer_main) pops it -> deliver looks up the target by callback id and
 * calls target->fn -> the record is released and marked done.
 *
 * The path of a call: the FFI call handler (ffi_call.c, on an XLA thread)
 * calls hcb_runtime_call -> the device's earlier taps are delivered first
 * (hcb__queue_wait_done) -> the call function runs in that same thread and
 * fills the output buffers.  Calls use no queue and no consumer thread.
 *
 * Threads.  One consumer thread per channel, named "hcb-cpu-N", started by
 * the first submit for that device and after every stop.  Producers are
 * any threads.  Barrier and stop callers are any threads except consumers
 * of the runtime (which get HCB_EDEADLK: they would wait for themselves).
 *
 * Locks, in the order they may be taken:
 *   0. runtimes_mu         the list of runtimes (fork); taken alone
 *   1. channel->lifecycle  starting and joining that channel's thread
 *   2. rt->mu              channel table inserts, target registry appends,
 *                          the queue bound, the log sink
 *   3. queue->mu           (queue.c) the FIFO
 *   4. rt->err_mu          the recorded errors (a leaf)
 * Lookups of channels and targets take no lock: both tables are append-only
 * and entries are published with release stores.  No lock is held while a
 * tap function, the log sink, a barrier's check or the queue's stall
 * callback (channel_stalled) runs.
 *
 * Ordering.  Records of one device are consumed one at a time in submit
 * order.  Devices are independent: records of different devices may
 * interleave in any way.
 *
 * Shutdown.  hcb_runtime_stop closes each queue; its consumer drains what
 * is queued, then exits; stop joins it under the channel's lifecycle lock.
 * A submit that races with the stop pushes into the queue, sees no active
 * consumer and starts a new one after the stop released the lifecycle lock,
 * so no record is left behind.  Nothing is cancelled.
 *
 * Fork.  Every runtime is on a list (`runtimes`), and a pthread_atfork
 * child handler resets each one in the child: its locks are made new (a
 * thread the child does not have may have held them), every channel is
 * marked without a consumer and its queue emptied, errors and stats start
 * at zero.  The child's first submit starts its own consumers.  Records
 * pending at the fork are the parent's: the parent delivers them, the
 * child never does (they are not freed in the child either: the batch in
 * delivery is not reachable).  The targets stay: compiled programs carry
 * their ids.  The prepare handler takes only `runtimes_mu` (to keep the
 * list whole) and the record pools' locks (record.c; held for a few
 * instructions), never a runtime's lock: a stop may hold a lifecycle lock
 * for as long as a tap function runs.  Forking from inside a tap function
 * is not supported (the child's thread would be a consumer).
 *
 * Stalls.  A producer that has waited STALL_WARN_NS for room in its queue
 * calls channel_stalled (queue.c's stall callback, no lock held), which
 * logs the likely cause, naming the tap function running now
 * (`delivering`, set around each tap function): a tap function that runs a
 * computation on its own device while that device waits for room.  At most
 * once a minute per device; the producer goes on waiting.
 *
 * Barriers that must react while they wait (Python's Ctrl-C) use
 * hcb_runtime_barrier_poll: the wait wakes every poll interval and calls
 * the caller's check, with no lock held.
 */
#include <fenv.h>
#include <stdio.h>
#include <string.h>

#include "queue.h"
#include "runtime.h"

#define CHANNEL_SLOTS 4096 /* power of two; XLA allows 2048 CPU devices */
#define TARGET_CHUNK  256
#define TARGET_CHUNKS 4096
#define NAME_SIZE     (HCB_NAME_MAX + 1)

typedef enum { TARGET_TAP = 1, TARGET_CALL = 2 } target_kind;

typedef struct target {
    target_kind kind;
    hcb_tap_fn tap;   /* TARGET_TAP */
    hcb_call_fn call; /* TARGET_CALL */
    void *user;
    char name[NAME_SIZE];
} target;

typedef struct channel {
    /* Read on every submit, written rarely. */
    hcb_runtime *rt;
    hcb_device device;
    atomic_bool running; /* written under lifecycle */
    /* Keeps them off the cache lines of the queue, which the producers and
     * the consumer write for every record. */
    char pad[64];
    hcb__queue queue;
    hcb__mutex lifecycle;
    pthread_t thread; /* valid while running */
    atomic_uint_fast64_t errors;
    /* The target whose tap function the consumer runs now, or NULL; for
     * the stall warning. */
    _Atomic(const target *) delivering;
    _Atomic uint64_t stall_warned_ns; /* when it last warned; 0: never */
} channel;

struct hcb_runtime {
    hcb_runtime *next_runtime; /* the list of runtimes, under runtimes_mu */
    hcb__mutex mu;
    size_t max_queue_bytes; /* under mu */
    size_t nchannels;       /* under mu */
    _Atomic(channel *) slots[CHANNEL_SLOTS];
    _Atomic(target *) chunks[TARGET_CHUNKS];
    atomic_uint_fast64_t ntargets;
    /* The ordinal of the process's only CPU device, or -1: several, or not
     * known (hcb_runtime_set_only_cpu_device). */
    atomic_int only_cpu_ordinal;

    hcb_log_fn log_fn; /* under mu */
    void *log_user;    /* under mu */

    hcb__mutex err_mu;
    uint64_t pending_errors; /* under err_mu */
    hcb_error last_error;    /* under err_mu */
    /* Failures of calls under jit over sharded operands, to be raised by
     * every device of the computation (see hcb__sharded_fail). */
    struct {
        uint64_t id;       /* 0: free */
        int64_t remaining; /* devices that have not raised it yet */
        hcb_error error;
    } sharded[HCB__SHARDED_SLOTS]; /* under err_mu */
};

/* The channel whose consumer this thread is, or NULL. */
static HCB__TLS channel *current_consumer;

/* A producer that has waited this long for room in its queue warns (once a
 * minute per device at most): see channel_stalled. */
#define STALL_WARN_NS       ((uint64_t)2000000000u)
#define STALL_WARN_EVERY_NS ((uint64_t)60000000000u)

static void channel_stalled(void *user, uint64_t waited_ns);

/* ---- channels ----------------------------------------------------------- */

static size_t
slot_of(hcb_device device)
{
    return (size_t)(((uint64_t)device * 0x9E3779B97F4A7C15u) >> 52) &
           (CHANNEL_SLOTS - 1);
}

static channel *
channel_find(hcb_runtime *rt, hcb_device device)
{
    size_t i = slot_of(device), n;

    for (n = 0; n < CHANNEL_SLOTS; n++, i = (i + 1) & (CHANNEL_SLOTS - 1)) {
        channel *ch = atomic_load_explicit(&rt->slots[i], memory_order_acquire);

        if (ch == NULL || ch->device == device)
            return ch;
    }
    return NULL;
}

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
    if (hcb__queue_init(&ch->queue, rt->max_queue_bytes) != HCB_OK) {
        hcb__free(ch);
        hcb_error_set(err, HCB_ESYSTEM, "cannot initialise a device queue");
        return NULL;
    }
    hcb__queue_set_stall(&ch->queue, channel_stalled, ch, STALL_WARN_NS);
    if (hcb__mutex_init(&ch->lifecycle) != HCB_OK) {
        hcb__queue_destroy(&ch->queue);
        hcb__free(ch);
        hcb_error_set(err, HCB_ESYSTEM, "cannot initialise a device channel");
        return NULL;
    }
    return ch;
}

static void
channel_free(channel *ch)
{
    hcb__mutex_destroy(&ch->lifecycle);
    hcb__queue_destroy(&ch->queue);
    hcb__free(ch);
}

/* Finds or creates the channel of `device`. */
static channel *
channel_get(hcb_runtime *rt, hcb_device device, hcb_error *err)
{
    channel *ch = channel_find(rt, device);
    size_t i;

    if (ch != NULL)
        return ch;
    hcb__mutex_lock(&rt->mu);
    ch = channel_find(rt, device); /* another producer may have won */
    if (ch == NULL && rt->nchannels >= CHANNEL_SLOTS / 2) {
        hcb_error_set(err, HCB_ESTATE, "too many devices (%zu)", rt->nchannels);
    } else if (ch == NULL && (ch = channel_new(rt, device, err)) != NULL) {
        for (i = slot_of(device);
             atomic_load_explicit(&rt->slots[i], memory_order_relaxed) != NULL;
             i = (i + 1) & (CHANNEL_SLOTS - 1))
            ;
        atomic_store_explicit(&rt->slots[i], ch, memory_order_release);
        rt->nchannels++;
    }
    hcb__mutex_unlock(&rt->mu);
    return ch;
}

/* ---- the target registry ------------------------------------------------ */

static const target *
target_get(hcb_runtime *rt, uint64_t id)
{
    uint64_t n = atomic_load_explicit(&rt->ntargets, memory_order_acquire);
    target *chunk;

    if (id == 0 || id > n)
        return NULL;
    chunk = atomic_load_explicit(&rt->chunks[(id - 1) / TARGET_CHUNK],
                                 memory_order_acquire);
    return &chunk[(id - 1) % TARGET_CHUNK];
}

/* Appends a target and publishes it; returns its id through `id`. */
static int
target_add(hcb_runtime *rt, const target *t, uint64_t *id, hcb_error *err)
{
    target *chunk;
    uint64_t n;

    hcb__mutex_lock(&rt->mu);
    n = atomic_load_explicit(&rt->ntargets, memory_order_relaxed);
    if (n >= (uint64_t)TARGET_CHUNK * TARGET_CHUNKS) {
        hcb__mutex_unlock(&rt->mu);
        return hcb_error_set(err, HCB_ESTATE,
                             "target registry is full (%llu targets)",
                             (unsigned long long)n);
    }
    chunk = atomic_load_explicit(&rt->chunks[n / TARGET_CHUNK],
                                 memory_order_relaxed);
    if (chunk == NULL) {
        chunk = hcb__calloc(TARGET_CHUNK, sizeof *chunk);
        if (chunk == NULL) {
            hcb__mutex_unlock(&rt->mu);
            return hcb_error_set(err, HCB_ENOMEM,
                                 "cannot grow the target registry");
        }
        atomic_store_explicit(&rt->chunks[n / TARGET_CHUNK], chunk,
                              memory_order_release);
    }
    chunk[n % TARGET_CHUNK] = *t;
    atomic_store_explicit(&rt->ntargets, n + 1, memory_order_release);
    hcb__mutex_unlock(&rt->mu);
    *id = n + 1;
    return HCB_OK;
}

static void
target_name(target *t, const char *name, size_t len)
{
    if (name == NULL)
        len = 0;
    if (len >= NAME_SIZE)
        len = NAME_SIZE - 1;
    if (len > 0)
        memcpy(t->name, name, len);
    t->name[len] = '\0';
}

int
hcb_runtime_register_tap(hcb_runtime *rt, const hcb_tap_target *t, uint64_t *id,
                         hcb_error *err)
{
    target slot = {TARGET_TAP, NULL, NULL, NULL, ""};

    if (t == NULL || t->struct_size < sizeof(hcb_tap_target) || t->fn == NULL ||
        id == NULL)
        return hcb_error_set(err, HCB_EINVAL,
                             "tap target needs struct_size, fn and an id "
                             "pointer");
    slot.tap = t->fn;
    slot.user = t->user;
    target_name(&slot, t->name, t->name_len);
    return target_add(rt, &slot, id, err);
}

int
hcb_runtime_register_call(hcb_runtime *rt, const hcb_call_target *t,
                          uint64_t *id, hcb_error *err)
{
    target slot = {TARGET_CALL, NULL, NULL, NULL, ""};

    if (t == NULL || t->struct_size < sizeof(hcb_call_target) ||
        t->fn == NULL || id == NULL)
        return hcb_error_set(err, HCB_EINVAL,
                             "call target needs struct_size, fn and an id "
                             "pointer");
    slot.call = t->fn;
    slot.user = t->user;
    target_name(&slot, t->name, t->name_len);
    return target_add(rt, &slot, id, err);
}

/* ---- errors ------------------------------------------------------------- */

void
hcb_runtime_record_error(hcb_runtime *rt, hcb_device device,
                         const hcb_error *error)
{
    channel *ch = channel_find(rt, device);

    if (ch != NULL)
        atomic_fetch_add_explicit(&ch->errors, 1, memory_order_relaxed);
    hcb__mutex_lock(&rt->err_mu);
    rt->pending_errors++;
    rt->last_error = *error;
    hcb__mutex_unlock(&rt->err_mu);
}

int
hcb__sharded_fail(hcb_runtime *rt, uint64_t id, int64_t ndevices,
                  const hcb_error *error)
{
    int i, rc = HCB_ESTATE;

    hcb__mutex_lock(&rt->err_mu);
    for (i = 0; i < HCB__SHARDED_SLOTS; i++) {
        if (rt->sharded[i].id == 0 || rt->sharded[i].id == id) {
            rt->sharded[i].id = id;
            rt->sharded[i].remaining = ndevices;
            rt->sharded[i].error = *error;
            rc = HCB_OK;
            break;
        }
    }
    hcb__mutex_unlock(&rt->err_mu);
    return rc;
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

uint64_t
hcb_runtime_take_error(hcb_runtime *rt, hcb_error *last)
{
    uint64_t n;

    hcb__mutex_lock(&rt->err_mu);
    n = rt->pending_errors;
    if (n > 0 && last != NULL)
        *last = rt->last_error;
    rt->pending_errors = 0;
    hcb__mutex_unlock(&rt->err_mu);
    return n;
}

/* ---- the consumer ------------------------------------------------------- */

static void
deliver(channel *ch, hcb_record *rec)
{
    const target *t = target_get(ch->rt, rec->callback_id);
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

    current_consumer = ch;
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
            hcb_record_release(rec);
            /* each record, not each batch: a producer waiting for space
             * resumes as soon as its record fits (queue.c, "Done") */
            hcb__queue_finished(&ch->queue, size);
        }
    }
    current_consumer = NULL;
    return NULL;
}

/* Starts the channel's consumer unless it runs.  `recheck` skips the
 * lock-free fast path: the caller saw the queue without a consumer, which
 * can happen while a stop is joining the old one. */
static int
ensure_consumer(channel *ch, bool recheck, hcb_error *err)
{
    char name[16];
    int rc = HCB_OK;

    if (!recheck && atomic_load_explicit(&ch->running, memory_order_acquire))
        return HCB_OK;
    hcb__mutex_lock(&ch->lifecycle);
    if (!atomic_load_explicit(&ch->running, memory_order_relaxed)) {
        snprintf(name, sizeof name, "hcb-%s-%d",
                 HCB_DEVICE_PLATFORM(ch->device) == HCB_PLATFORM_CPU ? "cpu"
                                                                     : "gpu",
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
    hcb__mutex_lock(&ch->lifecycle);
    if (atomic_load_explicit(&ch->running, memory_order_relaxed)) {
        hcb__queue_close(&ch->queue);
        hcb__thread_join(ch->thread);
        atomic_store_explicit(&ch->running, false, memory_order_release);
        hcb__queue_reopen(&ch->queue);
    }
    hcb__mutex_unlock(&ch->lifecycle);
}

/* ---- public operations -------------------------------------------------- */

int
hcb_runtime_submit(hcb_runtime *rt, hcb_record *rec, hcb_error *err)
{
    channel *ch;
    int rc;

    if (rec == NULL)
        return hcb_error_set(err, HCB_EINVAL, "record is NULL");
    ch = channel_get(rt, rec->device, err);
    if (ch == NULL) {
        hcb_record_release(rec);
        return err != NULL ? err->code : HCB_ENOMEM;
    }
    if ((rc = ensure_consumer(ch, false, err)) != HCB_OK) {
        hcb_record_release(rec);
        return rc;
    }
    if (!hcb__queue_push(&ch->queue, rec, current_consumer == ch))
        return ensure_consumer(ch, true, err);
    return HCB_OK;
}

/* Waits for the records submitted to `ch` so far; with `check`, wakes every
 * `poll_ns` to call it and stops when it returns nonzero. */
static int
barrier_channel(channel *ch, uint64_t poll_ns, hcb_check_fn check, void *user,
                hcb_error *err)
{
    uint64_t mark;
    int rc;

    if (current_consumer == ch)
        return hcb_error_set(err, HCB_EDEADLK,
                             "barrier called from the consumer thread of "
                             "the device it waits for");
    if (hcb__queue_stranded(&ch->queue) &&
        (rc = ensure_consumer(ch, true, err)) != HCB_OK)
        return rc;
    mark = hcb__queue_mark(&ch->queue);
    if (check == NULL) {
        hcb__queue_wait_mark(&ch->queue, mark, 0);
        return HCB_OK;
    }
    while (!hcb__queue_wait_mark(&ch->queue, mark, hcb__now_ns() + poll_ns))
        if (check(user) != 0)
            return hcb_error_set(err, HCB_ECALLBACK,
                                 "barrier interrupted by its check function");
    return HCB_OK;
}

int
hcb_runtime_barrier_poll(hcb_runtime *rt, hcb_device device, uint64_t poll_ns,
                         hcb_check_fn check, void *user, hcb_error *err)
{
    channel *ch;
    size_t i;
    int rc;

    if (check != NULL && poll_ns == 0)
        return hcb_error_set(err, HCB_EINVAL,
                             "barrier poll interval must be positive, got 0");
    if (device != HCB_ALL_DEVICES) {
        ch = channel_find(rt, device);
        return ch == NULL ? HCB_OK
                          : barrier_channel(ch, poll_ns, check, user, err);
    }
    for (i = 0; i < CHANNEL_SLOTS; i++) {
        ch = atomic_load_explicit(&rt->slots[i], memory_order_acquire);
        if (ch != NULL &&
            (rc = barrier_channel(ch, poll_ns, check, user, err)) != HCB_OK)
            return rc;
    }
    return HCB_OK;
}

int
hcb_runtime_barrier(hcb_runtime *rt, hcb_device device, hcb_error *err)
{
    return hcb_runtime_barrier_poll(rt, device, 0, NULL, NULL, err);
}

void
hcb_runtime_set_log(hcb_runtime *rt, hcb_log_fn fn, void *user)
{
    hcb__mutex_lock(&rt->mu);
    rt->log_fn = fn;
    rt->log_user = user;
    hcb__mutex_unlock(&rt->mu);
}

static void runtime_log(hcb_runtime *rt, const char *fmt, ...) HCB_PRINTF(2, 3);

static void
runtime_log(hcb_runtime *rt, const char *fmt, ...)
{
    char msg[HCB_ERROR_MESSAGE_SIZE];
    hcb_log_fn fn;
    void *user;
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    hcb__mutex_lock(&rt->mu);
    fn = rt->log_fn;
    user = rt->log_user;
    hcb__mutex_unlock(&rt->mu);
    if (fn != NULL)
        fn(user, msg);
    else
        fprintf(stderr, "hcb: warning: %s\n", msg);
}

/* A producer of `ch` (the device's thread) has waited `waited_ns` for room
 * in the queue (queue.c calls it once per wait, no lock held).  Warns, at
 * most once a minute per device: if the tap function running now runs a
 * computation on this device, neither can go on. */
static void
channel_stalled(void *user, uint64_t waited_ns)
{
    channel *ch = user;
    const target *t =
        atomic_load_explicit(&ch->delivering, memory_order_relaxed);
    uint64_t now = hcb__now_ns();
    uint64_t last = atomic_load(&ch->stall_warned_ns);

    if ((last != 0 && now - last < STALL_WARN_EVERY_NS) ||
        !atomic_compare_exchange_strong(&ch->stall_warned_ns, &last, now))
        return;
    runtime_log(
        ch->rt,
        "device %s:%d has waited %.1f s for room in its tap queue "
        "(bound %zu bytes) while the tap function '%s' is running.  "
        "It goes on waiting.  A tap function that runs a "
        "computation (e.g. JAX) on the device that issued the tap "
        "deadlocks when that device's queue is full: the device "
        "waits for the tap function, which waits for the device.  "
        "Raise the queue bound (HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE), "
        "or move that work out of the tap function (after "
        "barrier_wait, or onto another device)",
        HCB_DEVICE_PLATFORM(ch->device) == HCB_PLATFORM_CPU ? "cpu" : "gpu",
        (int)HCB_DEVICE_ORDINAL(ch->device), (double)waited_ns / 1e9,
        atomic_load(&ch->queue.max_bytes), t != NULL ? t->name : "(none)");
}

/* Before a call on `ch`'s device: delivers the taps that device issued
 * earlier.  Warns when that takes long: the likely cause is a tap function
 * that runs this very computation (it waits for the call, which waits for
 * it). */
static int
deliver_earlier_taps(hcb_runtime *rt, channel *ch, const target *t,
                     hcb_error *err)
{
    const target *running;
    uint64_t mark;
    int rc;

    if (hcb__queue_idle(&ch->queue))
        return HCB_OK;
    if (hcb__queue_stranded(&ch->queue) &&
        (rc = ensure_consumer(ch, true, err)) != HCB_OK)
        return rc;
    mark = hcb__queue_mark(&ch->queue);
    if (hcb__queue_wait_mark(&ch->queue, mark,
                             hcb__now_ns() + HCB_CALL_WAIT_WARN_NS))
        return HCB_OK;
    running = atomic_load_explicit(&ch->delivering, memory_order_relaxed);
    runtime_log(rt,
                "call '%s' on %s:%d has waited %llu s for the taps its "
                "device issued before it (the tap function now running: "
                "'%s').  It goes on waiting.  If a tap function of that "
                "device runs a computation that contains this call, they "
                "wait for each other: run that computation on another "
                "device, or outside the tap function (after barrier_wait)",
                t->name,
                HCB_DEVICE_PLATFORM(ch->device) == HCB_PLATFORM_CPU ? "cpu"
                                                                    : "gpu",
                (int)HCB_DEVICE_ORDINAL(ch->device),
                (unsigned long long)(HCB_CALL_WAIT_WARN_NS / 1000000000u),
                running != NULL ? running->name : "(none)");
    hcb__queue_wait_mark(&ch->queue, mark, 0);
    return HCB_OK;
}

int
hcb_runtime_call(hcb_runtime *rt, uint64_t id, hcb_device device,
                 const hcb_array *args, size_t nargs, const hcb_array *results,
                 size_t nresults, hcb_error *err)
{
    const target *t = target_get(rt, id);
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
    ch = channel_find(rt, device);
    if (ch != NULL && current_consumer == NULL &&
        (rc = deliver_earlier_taps(rt, ch, t, err)) != HCB_OK)
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
hcb_runtime_call_shared(hcb_runtime *rt, uint64_t id, hcb_device device,
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
hcb_runtime_stop(hcb_runtime *rt, hcb_error *err)
{
    size_t i;

    if (current_consumer != NULL)
        return hcb_error_set(err, HCB_EDEADLK,
                             "stop called from a consumer thread");
    for (i = 0; i < CHANNEL_SLOTS; i++) {
        channel *ch = atomic_load_explicit(&rt->slots[i], memory_order_acquire);

        if (ch != NULL)
            stop_channel(ch);
    }
    return HCB_OK;
}

void
hcb_runtime_set_only_cpu_device(hcb_runtime *rt, int32_t ordinal)
{
    atomic_store_explicit(&rt->only_cpu_ordinal, ordinal < 0 ? -1 : ordinal,
                          memory_order_relaxed);
}

int
hcb__ffi_ordinal(hcb_runtime *rt, const XLA_FFI_CallFrame *frame,
                 int32_t *ordinal, hcb_error *err)
{
    int only =
        atomic_load_explicit(&rt->only_cpu_ordinal, memory_order_relaxed);

    if (only >= 0) {
        *ordinal = only;
        return HCB_OK;
    }
    return hcb_ffi_device_ordinal(frame, ordinal, err);
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
    hcb__queue_add_stats(&ch->queue, s);
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
            ch = channel_find(rt, device);
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

/* ---- fork --------------------------------------------------------------- */

/* Every live runtime, for the fork handler.  A plain mutex: the prepare
 * handler holds it across fork, so the child's only thread owns it. */
static pthread_mutex_t runtimes_mu = PTHREAD_MUTEX_INITIALIZER;
static hcb_runtime *runtimes;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void
reset_channel_after_fork(channel *ch)
{
    (void)hcb__mutex_init(&ch->lifecycle);
    atomic_store(&ch->running, false);
    atomic_store(&ch->errors, 0);
    atomic_store(&ch->delivering, NULL);
    atomic_store(&ch->stall_warned_ns, 0);
    hcb__queue_reset_after_fork(&ch->queue);
}

static void
reset_after_fork(hcb_runtime *rt)
{
    size_t i;

    (void)hcb__mutex_init(&rt->mu);
    (void)hcb__mutex_init(&rt->err_mu);
    rt->pending_errors = 0;
    memset(rt->sharded, 0, sizeof rt->sharded);
    for (i = 0; i < CHANNEL_SLOTS; i++) {
        channel *ch = atomic_load_explicit(&rt->slots[i], memory_order_relaxed);

        if (ch != NULL)
            reset_channel_after_fork(ch);
    }
}

static void
atfork_prepare(void)
{
    pthread_mutex_lock(&runtimes_mu);
}

static void
atfork_parent(void)
{
    pthread_mutex_unlock(&runtimes_mu);
}

static void
atfork_child(void)
{
    hcb_runtime *rt;

    current_consumer = NULL;
    for (rt = runtimes; rt != NULL; rt = rt->next_runtime)
        reset_after_fork(rt);
    pthread_mutex_unlock(&runtimes_mu);
}

static void
install_atfork(void)
{
    /* failure (ENOMEM) leaves fork children without a runtime reset, as
     * before: nothing to report it to.  The record pools' handlers first:
     * prepare handlers run in the reverse order, so runtimes_mu is taken
     * before the pools' locks, and released after them. */
    (void)pthread_atfork(hcb__record_fork_prepare, hcb__record_fork_parent,
                         hcb__record_fork_child);
    (void)pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

static void
runtimes_add(hcb_runtime *rt)
{
    pthread_once(&atfork_once, install_atfork);
    pthread_mutex_lock(&runtimes_mu);
    rt->next_runtime = runtimes;
    runtimes = rt;
    pthread_mutex_unlock(&runtimes_mu);
}

static void
runtimes_remove(hcb_runtime *rt)
{
    hcb_runtime **p;

    pthread_mutex_lock(&runtimes_mu);
    for (p = &runtimes; *p != NULL; p = &(*p)->next_runtime)
        if (*p == rt) {
            *p = rt->next_runtime;
            break;
        }
    pthread_mutex_unlock(&runtimes_mu);
}

/* ---- creation and destruction ------------------------------------------- */

int
hcb_runtime_create(const hcb_runtime_options *options, hcb_runtime **out,
                   hcb_error *err)
{
    hcb_runtime_options opts = HCB_RUNTIME_OPTIONS_INIT;
    hcb_runtime *rt;
    size_t i;

    *out = NULL;
    if (options != NULL) {
        if (options->struct_size < sizeof opts)
            return hcb_error_set(err, HCB_EINVAL,
                                 "runtime options have struct_size %zu, "
                                 "expected at least %zu",
                                 options->struct_size, sizeof opts);
        opts = *options;
    }
    if (opts.max_queue_bytes == 0)
        return hcb_error_set(err, HCB_EINVAL,
                             "max_queue_bytes must be positive, got 0");
    rt = hcb__calloc(1, sizeof *rt);
    if (rt == NULL)
        return hcb_error_set(err, HCB_ENOMEM, "cannot allocate a runtime");
    rt->max_queue_bytes = opts.max_queue_bytes;
    for (i = 0; i < CHANNEL_SLOTS; i++)
        atomic_init(&rt->slots[i], NULL);
    for (i = 0; i < TARGET_CHUNKS; i++)
        atomic_init(&rt->chunks[i], NULL);
    atomic_init(&rt->ntargets, 0);
    atomic_init(&rt->only_cpu_ordinal, -1);
    if (hcb__mutex_init(&rt->mu) != HCB_OK) {
        hcb__free(rt);
        return hcb_error_set(err, HCB_ESYSTEM, "cannot create a mutex");
    }
    if (hcb__mutex_init(&rt->err_mu) != HCB_OK) {
        hcb__mutex_destroy(&rt->mu);
        hcb__free(rt);
        return hcb_error_set(err, HCB_ESYSTEM, "cannot create a mutex");
    }
    runtimes_add(rt);
    *out = rt;
    return HCB_OK;
}

void
hcb_runtime_destroy(hcb_runtime *rt)
{
    size_t i;

    if (rt == NULL)
        return;
    runtimes_remove(rt);
    hcb_runtime_stop(rt, NULL);
    for (i = 0; i < CHANNEL_SLOTS; i++) {
        channel *ch = atomic_load_explicit(&rt->slots[i], memory_order_relaxed);

        if (ch != NULL)
            channel_free(ch);
    }
    for (i = 0; i < TARGET_CHUNKS; i++)
        hcb__free(atomic_load_explicit(&rt->chunks[i], memory_order_relaxed));
    hcb__mutex_destroy(&rt->err_mu);
    hcb__mutex_destroy(&rt->mu);
    hcb__free(rt);
}

/* The default runtime is the one piece of process state the FFI handlers
 * need: XLA calls them with no context of ours. */
static hcb_runtime *default_runtime;
static pthread_once_t default_once = PTHREAD_ONCE_INIT;
/* default_runtime once created: every tap reads it, one load instead of a
 * pthread_once call. */
static _Atomic(hcb_runtime *) default_ready;

static void
create_default(void)
{
    if (hcb_runtime_create(NULL, &default_runtime, NULL) != HCB_OK)
        default_runtime = NULL;
    atomic_store_explicit(&default_ready, default_runtime,
                          memory_order_release);
}

hcb_runtime *
hcb_runtime_default(void)
{
    hcb_runtime *rt =
        atomic_load_explicit(&default_ready, memory_order_acquire);

    if (rt != NULL)
        return rt;
    pthread_once(&default_once, create_default);
    return default_runtime;
}
