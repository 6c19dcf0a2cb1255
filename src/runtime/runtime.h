/*
 * runtime.h - the runtime's state and the interface between its files.
 * Not installed: users see hcb_runtime as opaque (hcb.h).
 *
 * A runtime (struct hcb_runtime) holds all of its state: one channel per
 * device (channels.c: a bounded queue, queue.c, and a consumer thread), the
 * registry of tap and call targets (registry.c), the recorded errors, the
 * meetings of shared calls (shared.c) and the failures parked for calls
 * shared through JAX's callback (runtime.c, calls.c).  XLA calls
 * the handlers with no context of ours, so they use the default runtime
 * (hcb_runtime_default); tests make their own.
 *
 * Threads.  One consumer thread per channel, named "hcb-cpu-N" (or
 * "hcb-gpu-N"), started by the first submit for that device and after every
 * stop; one warning thread, "hcb-warn", started by the first warning of a
 * waiting thread (see "Stalls").  Producers are any threads.  Barrier and stop
 * callers are any threads except consumers of the runtime (which get
 * HCB_EDEADLK: they would wait for themselves).
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
 *   7. rt->warn_mu         the warning thread's messages (a leaf)
 *   8. pool->mu            (src/ffi/pinned.c) a device's pinned pool, and
 *                          pools.mu, the table of pools (leaves: taken by
 *                          the CUDA platform with none of the above held)
 *   9. rt->meet_mu         the meetings of shared calls (shared.c; a leaf,
 *                          taken with none of the above held)
 * The extension's own (python/_hcb) are listed in hcbpy.h; none is held
 * while it calls into libhcb.
 * Lookups of channels and targets take no lock: both tables are append-only
 * and entries are published with release stores.  No lock is held while a
 * tap function, a call function, the log sink, an interrupt or barrier
 * check or the queue's stall callback (hcb__channel_stalled) runs.
 *
 * Process-wide state (everything else lives in a runtime):
 *   - the allocation hook (base.c): every allocation site reaches it
 *     without a context;
 *   - the default runtime (runtime.c): the handlers' runtime;
 *   - the list of runtimes and the fork handlers (runtime.c);
 *   - the record pools (record.c): free arenas and large blocks, and each
 *     thread's current arena (thread-local);
 *   - hcb__consumer (channels.c, thread-local): the channel whose consumer
 *     this thread is;
 *   - in the CUDA platform (src/ffi): the CUDA runtime's table (cuda.c),
 *     loaded once, and the pinned pools, one per CUDA device (pinned.c),
 *     made at the device's first GPU callback and kept for the process;
 *     XLA calls the CUDA handlers with no context of ours either.
 *
 * Ordering.  Records of one device are consumed one at a time in submit
 * order; a call, and a record delivered now (hcb_runtime_deliver, in the
 * computation's own thread), first waits for the taps its device queued
 * before it.
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
 * Reservations.  A producer that must not wait where its record is made
 * (the CUDA platform: its records are submitted by a thread that waits
 * for the stream's copies, ffi/landing.c) reserves the record's room in its
 * device's queue first, on XLA's thread, which waits there when the queue is
 * full (hcb__runtime_reserve: the same back-pressure as a submit), and submits
 * the record later without waiting (hcb__runtime_submit_reserved).  A stop
 * waits for the reserved records too (queue.c, "Reservations"), while they keep
 * coming: after HCB__RESERVED_WAIT_NS without one it goes on, and the warning
 * thread says how many it left (a stream that stopped: a CUDA error).
 *
 * Stalls.  A producer that has waited STALL_WARN_NS for room in its queue
 * calls hcb__channel_stalled (no lock held), which warns of what it waits
 * for: a backlog, if records were delivered while it waited (it names how
 * many taps and bytes are not yet delivered); else the likely cause,
 * naming the tap function running now (`delivering`): a tap function that
 * runs a computation on its own device while that device waits for room.
 * A call that has waited HCB_CALL_WAIT_WARN_NS for its device's earlier
 * taps (calls.c) says the same: a backlog (at most once a minute per
 * device, `call_noted_ns`) or, when none was delivered meanwhile, that
 * they may wait for each other.  At most once a minute per device; the
 * producer goes on waiting.  The warning is logged by the runtime's
 * warning thread ("hcb-warn", hcb__runtime_warn), never by the waiting
 * thread: that one is XLA's, which must not take the GIL for a log sink
 * written in Python.  A GPU's XLA thread that waits for room in its pinned
 * pool is warned about the same way (src/ffi/pinned.c), naming the pool
 * and `delivering`.  The thread starts at the first warning and stops with
 * the runtime.
 *
 * Interrupts.  Every wait of a device's thread can be stopped by the
 * runtime's interrupt check (hcb_runtime_set_interrupt, `interrupt`;
 * interrupt.h): a submit or a reservation waiting for room (queue.c, which
 * keeps a copy per queue), a call or a record delivered now waiting for
 * its device's earlier taps (calls.c), and a GPU device waiting for its
 * pinned pool (src/ffi/pinned.c).  Each takes the check as it begins to wait
 * (hcb__runtime_wait_begin, or the queue's copy under its mu), calls it
 * then and every poll interval with no lock held, and fails with
 * HCB_ECALLBACK when it says stop; the records queued before are delivered
 * as usual.  A barrier that must react while it waits
 * (hcb_runtime_barrier_poll) calls its caller's check the same way.
 */
#ifndef HCB_RUNTIME_H
#define HCB_RUNTIME_H

#include "runtime/queue.h"

/* Calls under jit over sharded operands run on one device, and every
 * device continues into the collectives that spread the result: a failure
 * raised on that one device alone would leave the others waiting forever.
 * Instead the failure is parked here, once for each of this process's
 * devices, and raised by every device, after the collective, by the
 * "hcb_sharded_check" handler (handlers.h); a flag spread with the results
 * makes the devices of other processes fail too. */
#define HCB__SHARDED_SLOTS 32

/* Shared calls under way at once (shared.c): one per call site and
 * launch, kept until the slot is needed again. */
#define MEETING_SLOTS 64

#define CHANNEL_SLOTS 4096 /* power of two; XLA allows 2048 CPU devices */
#define TARGET_CHUNK  256
#define TARGET_CHUNKS 4096
#define NAME_SIZE     (HCB_NAME_MAX + 1)
/* A producer that has waited this long for room in its queue warns (once a
 * minute per device at most): see hcb__channel_stalled. */
#define STALL_WARN_NS       ((uint64_t)2000000000u)
#define STALL_WARN_EVERY_NS ((uint64_t)60000000000u)
/* Warnings waiting for the warning thread, at most. */
#define WARN_SLOTS 8

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
    /* when a call last noted it waits behind a backlog; 0: never */
    _Atomic uint64_t call_noted_ns;
    /* Records delivered now, in the computation's thread
     * (hcb_runtime_deliver: they never enter the queue), and their bytes;
     * counted in the stats as records in and out. */
    _Atomic uint64_t now_records;
    _Atomic uint64_t now_bytes;
} channel;

/* A device's place in a meeting: the next meeting it goes to. */
typedef struct meeting_seat {
    hcb_device device;
    uint64_t next;
} meeting_seat;

/* One call site's shared calls in one launch (shared.c): the runner (or
 * the first to come) publishes the outcome of its meetings one after the
 * other, the other participants take each, the last of them closes it.
 * The key and the seats are under rt->meet_mu; the counters are atomics
 * (shared.c, "Meetings"); the outcome is written by the runner before it
 * publishes and read by the others after. */
typedef struct meeting {
    uint64_t id; /* the call's target; 0: a free slot */
    int64_t launch;
    hcb_device runner;
    int64_t participants;
    uint64_t used;       /* rt->meet_clock at its last call: oldest goes */
    meeting_seat *seats; /* one per participant, as each first comes */
    int64_t nseats;
    _Atomic int64_t inside;     /* calls in it now: not to be reused */
    _Atomic uint64_t claimed;   /* meetings whose runner is known */
    _Atomic uint64_t published; /* meetings whose outcome is there */
    _Atomic uint64_t closed;    /* meetings all participants took */
    _Atomic int64_t taken;      /* of the others, those that took the last */
    _Atomic int64_t sleepers;   /* threads asleep on rt->meet_cv for it */
    int rc;                     /* the runner's outcome */
    hcb_error err;
    unsigned char *bytes; /* the runner's results, `nbytes` of `cap` */
    size_t nbytes, cap;
} meeting;

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
    /* The interrupt check of every wait of a device's thread
     * (hcb_runtime_set_interrupt), copied to each channel's queue; under
     * mu. */
    hcb__check interrupt;

    /* The warning thread (hcb__runtime_warn) and the messages it has to
     * log, oldest at warn_head; all under warn_mu. */
    hcb__mutex warn_mu;
    hcb__cond warn_cv; /* messages came, or the thread stopped */
    pthread_t warn_thread;
    bool warn_running, warn_stopping, warn_joining;
    unsigned warn_head, warn_count;
    uint64_t warn_dropped; /* messages that found no free slot */
    char warn_msgs[WARN_SLOTS][HCB_ERROR_MESSAGE_SIZE];

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

    /* Shared calls (shared.c). */
    hcb__mutex meet_mu;
    hcb__cond meet_cv; /* an outcome published, or a meeting closed */
    uint64_t meet_clock;
    meeting meetings[MEETING_SLOTS];
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

/* A device's platform in messages ("cpu:0", "gpu:1"). */
static inline const char *
hcb__platform_name(hcb_device device)
{
    return HCB_DEVICE_PLATFORM(device) == HCB_PLATFORM_CPU ? "cpu" : "gpu";
}

/* The ordinal of the process's only CPU device, or -1 (see
 * hcb_runtime_set_only_cpu_device). */
static inline int32_t
hcb__runtime_only_cpu_ordinal(hcb_runtime *rt)
{
    return atomic_load_explicit(&rt->only_cpu_ordinal, memory_order_relaxed);
}

/* channels.c */
/* Finds or creates the channel of `device` (NULL with `err` set: no room,
 * no memory). */
channel *hcb__channel_get(hcb_runtime *rt, hcb_device device, hcb_error *err);
void hcb__channel_free(channel *ch);
/* Starts the channel's consumer unless it runs.  `recheck` skips the
 * lock-free fast path: the caller saw the queue without a consumer, which
 * can happen while a stop is joining the old one. */
int hcb__ensure_consumer(channel *ch, bool recheck, hcb_error *err);
/* queue.c's stall callback: see "Stalls" above. */
void hcb__channel_stalled(void *user, uint64_t waited_ns, uint64_t delivered);

/* Reserves room for a record of `bytes` in `device`'s queue, waiting for it
 * while the queue is full (back-pressure), and makes sure the device has a
 * consumer (see "Reservations" above).  HCB_OK, or an error in `err` (no
 * channel, no thread) with nothing reserved. */
int hcb__runtime_reserve(hcb_runtime *rt, hcb_device device, size_t bytes,
                         hcb_error *err);
/* Submits `rec` (ownership passes to the runtime) into the room reserved
 * for it (rec->size bytes, on rec->device): never waits, never fails; any
 * thread. */
void hcb__runtime_submit_reserved(hcb_runtime *rt, hcb_record *rec);
/* Gives back room reserved and not used. */
void hcb__runtime_unreserve(hcb_runtime *rt, hcb_device device, size_t bytes);

/* Settling.  A reserved record is submitted a little after its device has
 * made it (CUDA: once the lander saw its copies done).  What waits for a
 * device's records so far (a barrier, a call or a tap delivered now, for
 * the taps before it) first settles the device: the hook, set by the
 * layer that submits such records (ffi/landing.c), returns once every
 * record of `device` whose copies are done has been submitted.  Records
 * whose copies are not done are not waited for, as before a submit.  Set
 * once; NULL: nothing to settle. */
typedef void (*hcb__settle_fn)(hcb_device device);
void hcb__runtime_set_settle(hcb__settle_fn fn);
void hcb__channel_settle(channel *ch);

/* runtime.c */
/* Logs a warning through the runtime's sink (hcb_runtime_set_log), or to
 * stderr without one, on the calling thread. */
void hcb__runtime_log(hcb_runtime *rt, const char *fmt, ...) HCB_PRINTF(2, 3);
/* The same from the runtime's warning thread ("Stalls" above), for a
 * caller that must not run the sink itself: returns at once.  A message
 * that finds all WARN_SLOTS taken is dropped and counted (the next one
 * says so); one that cannot start the thread goes to stderr. */
void hcb__runtime_warn(hcb_runtime *rt, const char *fmt, ...) HCB_PRINTF(2, 3);
/* Stops the warning thread once it has logged what it holds (stop and
 * destroy; a later warning starts it again). */
void hcb__runtime_warn_stop(hcb_runtime *rt);
/* Begins a wait of `device` with the runtime's interrupt check as it is
 * now ("Interrupts" above).  Takes rt->mu: call it with no lock held. */
void hcb__runtime_wait_begin(hcb_runtime *rt, hcb_device device, hcb__wait *w);

/* shared.c */
/* Sets up and tears down the meetings of a new runtime (HCB_ESYSTEM). */
int hcb__meetings_init(hcb_runtime *rt);
void hcb__meetings_destroy(hcb_runtime *rt);
/* In the child of a fork: no meeting under way, the lock and condition
 * new. */
void hcb__meetings_reset_after_fork(hcb_runtime *rt);
/* What the one device that runs a shared call does: its call, delivery or
 * queueing. */
typedef int (*hcb__share_work)(void *ctx, hcb_error *err);
/* `device`'s part of a shared call of `id` whose work is `work`: as
 * hcb_runtime_call_shared, the one that runs it publishes its outcome and
 * the bytes of `results`, the others copy them into theirs.  A handler
 * whose work makes its own record (a tap with first_runs) uses it: the
 * devices that do not run it make none. */
int hcb__share(hcb_runtime *rt, const hcb_share *share, uint64_t id,
               hcb_device device, hcb__share_work work, void *ctx,
               const hcb_array *results, size_t nresults, hcb_error *err);

/* calls.c */
/* Parks `error` for call `id` until `ndevices` more devices have taken it
 * (added to what an earlier run of the call, still in flight, left: the
 * newest error is the one raised); HCB_ESTATE when every slot is busy. */
int hcb__sharded_fail(hcb_runtime *rt, uint64_t id, int64_t ndevices,
                      const hcb_error *error);
/* Takes (a copy of) the failure parked for `id`, if any. */
bool hcb__sharded_take(hcb_runtime *rt, uint64_t id, hcb_error *error);

#endif /* HCB_RUNTIME_H */
