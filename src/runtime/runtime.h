/*
 * runtime.h - the runtime's state and the interface between its files.
 * Not installed: users see hcb_runtime as opaque (hcb.h).
 *
 * A runtime (struct hcb_runtime) holds all of its state: one channel per
 * device (channels.c: a bounded queue, queue.c, and a consumer thread), the
 * registry of tap and call targets (registry.c), the recorded errors and
 * the failures parked for sharded calls (runtime.c, calls.c).  XLA calls
 * the handlers with no context of ours, so they use the default runtime
 * (hcb_runtime_default); tests make their own.
 *
 * Threads.  One consumer thread per channel, named "hcb-cpu-N", started by
 * the first submit for that device and after every stop.  Producers are
 * any threads.  Barrier and stop callers are any threads except consumers
 * of the runtime (which get HCB_EDEADLK: they would wait for themselves).
 *
 * Locks, in the order they may be taken (every mutex of libhcb is here):
 *   0. runtimes_mu         (runtime.c) the list of runtimes, for fork;
 *                          taken alone, or before 5 and 6 at fork
 *   1. channel->lifecycle  starting and joining that channel's thread
 *   2. rt->mu              channel table inserts, target registry appends,
 *                          the queue bound, the log sink
 *   3. queue->mu           (queue.c) the FIFO
 *   4. rt->err_mu          the recorded errors (a leaf)
 *   5. arena_free.mu       (record.c) the free arenas (a leaf)
 *   6. large.mu            (record.c) the kept large blocks (a leaf)
 * The extension's own (python/_hcb) are listed in hcbpy.h; none is held
 * while it calls into libhcb.
 * Lookups of channels and targets take no lock: both tables are append-only
 * and entries are published with release stores.  No lock is held while a
 * tap function, a call function, the log sink, a barrier's check or the
 * queue's stall callback (hcb__channel_stalled) runs.
 *
 * Process-wide state (everything else lives in a runtime):
 *   - the allocation hook (base.c): every allocation site reaches it
 *     without a context;
 *   - the default runtime (runtime.c): the handlers' runtime;
 *   - the list of runtimes and the fork handlers (runtime.c);
 *   - the record pools (record.c): free arenas and large blocks, and each
 *     thread's current arena (thread-local);
 *   - hcb__consumer (channels.c, thread-local): the channel whose consumer
 *     this thread is.
 *
 * Ordering.  Records of one device are consumed one at a time in submit
 * order; a call first waits for the taps its device issued before it.
 * Devices are independent: records of different devices may interleave in
 * any way.
 *
 * Shutdown.  hcb_runtime_stop closes each queue; its consumer drains what
 * is queued, then exits; stop joins it under the channel's lifecycle lock.
 * A submit that races with the stop pushes into the queue, sees no active
 * consumer and starts a new one after the stop released the lifecycle lock,
 * so no record is left behind.  Nothing is cancelled.
 *
 * Fork.  A pthread_atfork child handler resets every runtime in the child:
 * its locks are made new (a thread the child does not have may have held
 * them), every channel is marked without a consumer and its queue emptied,
 * errors and stats start at zero.  The child's first submit starts its own
 * consumers.  Records pending at the fork are the parent's: the parent
 * delivers them, the child never does (they are not freed in the child
 * either: the batch in delivery is not reachable).  The targets stay:
 * compiled programs carry their ids.  The prepare handler takes only
 * `runtimes_mu` and the record pools' locks (held for a few instructions),
 * never a runtime's lock: a stop may hold a lifecycle lock for as long as a
 * tap function runs.  Forking from inside a tap function is not supported
 * (the child's thread would be a consumer).
 *
 * Stalls.  A producer that has waited STALL_WARN_NS for room in its queue
 * calls hcb__channel_stalled (no lock held), which logs the likely cause,
 * naming the tap function running now (`delivering`): a tap function that
 * runs a computation on its own device while that device waits for room.
 * At most once a minute per device; the producer goes on waiting.
 *
 * Barriers that must react while they wait (Python's Ctrl-C) use
 * hcb_runtime_barrier_poll: the wait wakes every poll interval and calls
 * the caller's check, with no lock held.  A computation's thread that
 * waits at its end for its device's records (hcb_runtime_flush) calls the
 * runtime's interrupt check (hcb_runtime_set_interrupt) the same way.
 */
#ifndef HCB_RUNTIME_H
#define HCB_RUNTIME_H

#include "runtime/queue.h"

/* Calls under jit over sharded operands run on one device, and every
 * device continues into the collectives that spread the result: a failure
 * raised on that one device alone would leave the others waiting forever.
 * Instead the failure is parked here and raised by every device, after the
 * collective, by the "hcb_sharded_check" handler (handlers.c). */
#define HCB__SHARDED_SLOTS 32

#define CHANNEL_SLOTS 4096 /* power of two; XLA allows 2048 CPU devices */
#define TARGET_CHUNK  256
#define TARGET_CHUNKS 4096
#define NAME_SIZE     (HCB_NAME_MAX + 1)
/* A producer that has waited this long for room in its queue warns (once a
 * minute per device at most): see hcb__channel_stalled. */
#define STALL_WARN_NS       ((uint64_t)2000000000u)
#define STALL_WARN_EVERY_NS ((uint64_t)60000000000u)

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
    /* Asked while a computation's thread waits (hcb_runtime_flush). */
    hcb_check_fn interrupt_fn; /* under mu */
    void *interrupt_user;      /* under mu */

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

/* The channel whose consumer this thread is, or NULL (channels.c). */
extern HCB__TLS channel *hcb__consumer;

/* ---- lookups, on every record and call: here, to be inlined ----------- */

/* The first slot to probe for `device`'s channel (open addressing). */
static inline size_t
hcb__channel_slot(hcb_device device)
{
    return (size_t)(((uint64_t)device * 0x9E3779B97F4A7C15u) >> 52) &
           (CHANNEL_SLOTS - 1);
}

/* The channel of `device`, or NULL; no lock (channels are published with
 * release stores and never removed before the runtime is destroyed). */
static inline channel *
hcb__channel_find(hcb_runtime *rt, hcb_device device)
{
    size_t i = hcb__channel_slot(device), n;

    for (n = 0; n < CHANNEL_SLOTS; n++, i = (i + 1) & (CHANNEL_SLOTS - 1)) {
        channel *ch = atomic_load_explicit(&rt->slots[i], memory_order_acquire);

        if (ch == NULL || ch->device == device)
            return ch;
    }
    return NULL;
}

/* The target of `id`, or NULL; no lock (registry.c appends and publishes
 * ids with release stores). */
static inline const target *
hcb__target_get(hcb_runtime *rt, uint64_t id)
{
    uint64_t n = atomic_load_explicit(&rt->ntargets, memory_order_acquire);
    target *chunk;

    if (id == 0 || id > n)
        return NULL;
    chunk = atomic_load_explicit(&rt->chunks[(id - 1) / TARGET_CHUNK],
                                 memory_order_acquire);
    return &chunk[(id - 1) % TARGET_CHUNK];
}

/* The ordinal of the process's only CPU device, or -1 (see
 * hcb_runtime_set_only_cpu_device). */
static inline int32_t
hcb__runtime_only_cpu_ordinal(hcb_runtime *rt)
{
    return atomic_load_explicit(&rt->only_cpu_ordinal, memory_order_relaxed);
}

/* channels.c */
void hcb__channel_free(channel *ch);
/* Starts the channel's consumer unless it runs.  `recheck` skips the
 * lock-free fast path: the caller saw the queue without a consumer, which
 * can happen while a stop is joining the old one. */
int hcb__ensure_consumer(channel *ch, bool recheck, hcb_error *err);
/* queue.c's stall callback: see "Stalls" above. */
void hcb__channel_stalled(void *user, uint64_t waited_ns);

/* runtime.c */
/* Logs a warning through the runtime's sink (hcb_runtime_set_log), or to
 * stderr without one. */
void hcb__runtime_log(hcb_runtime *rt, const char *fmt, ...) HCB_PRINTF(2, 3);
/* Calls the runtime's interrupt check (hcb_runtime_set_interrupt), if any,
 * with no lock held: whether it asks to stop waiting. */
bool hcb__runtime_interrupted(hcb_runtime *rt);

/* calls.c */
/* Parks `error` for call `id` until `ndevices` devices have taken it;
 * HCB_ESTATE when every slot is busy. */
int hcb__sharded_fail(hcb_runtime *rt, uint64_t id, int64_t ndevices,
                      const hcb_error *error);
/* Takes (a copy of) the failure parked for `id`, if any. */
bool hcb__sharded_take(hcb_runtime *rt, uint64_t id, hcb_error *error);

#endif /* HCB_RUNTIME_H */
