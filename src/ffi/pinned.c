/*
 * pinned.c - the pools of pinned host memory that device-to-host copies
 * land in (cuda.h): one per CUDA device.
 *
 * A copy from the device runs at full speed, and asynchronously, only into
 * pinned memory, and pinning memory is slow (milliseconds per call, and it
 * may synchronise the device): so each device's pool pins one slab once,
 * at the first tap or call of that device that needs it, and carves it.
 * Takers are XLA's threads (the device's); givers are CUDA's host-function
 * thread, the consumers, or whoever drops a record's last reference.
 *
 * One pool per device: a device waits only for its own blocks, never for
 * another device's (a device one collective ahead of another may hold its
 * blocks until the other catches up, which it could not do if it waited
 * for them).
 *
 * The slab is a sequence of blocks, each with a header that gives its size
 * and its predecessor's (boundary tags), taken or free:
 *
 *   slab: | taken | free ......... | taken (kept) | free ... | taken |
 *
 * The free blocks are also on a list.  Taking is first fit on that list,
 * splitting the block found; giving back merges the block with free
 * neighbours at once.  So memory given back is reusable wherever it lies:
 * a block that stays taken long (a record the user kept) holds its own
 * bytes and nothing else, and the free list is never longer than the
 * number of taken blocks plus one.
 *
 * Waiting: a taker that finds no free block large enough waits while some
 * block of its pool is still "on its way" (its copy in flight, its record
 * queued or being delivered): that one will come back, so waiting is the
 * device's back-pressure.  When the taken blocks are all held by users
 * instead, or the request is over half the pool, or the taker must not
 * wait (a consumer thread: the blocks on their way may be its own to
 * deliver), it gets NULL and uses memory of its own (platform_cuda.c).
 *
 * A taker that has waited STALL_WARN_NS has the runtime's warning thread
 * warn (at most once a minute per pool), naming the pool, what holds it
 * and the tap function the device's consumer runs: one that runs a
 * computation on its own device deadlocks with a full pool, as with a
 * full queue (runtime.h, "Stalls").  A waiting taker calls the runtime's
 * interrupt check as it begins to wait and every poll interval, with no
 * lock held (runtime.h, "Interrupts"); when it says stop, the take fails
 * with HCB_ECALLBACK and the caller gives up the tap or call as it does
 * for any error (nothing of it was enqueued on the stream yet, or what
 * was is settled first: platform_cuda.c).
 *
 * Memory that cannot be pinned (cudaHostAlloc refused, as under a
 * memory-lock limit): the pool stays without a slab, counts the failure
 * (`pin_failures`), has the warning thread say so once, and refuses every
 * take, so that the device's taps and calls copy through ordinary memory,
 * each waiting for its stream (counted in `syncs`), instead of failing.
 * It tries again once its size is set anew (hcb__pinned_configure).
 *
 * Locks: pools.mu guards the table of pools (creation and configure) and
 * is taken before a pool's mu; a pool's mu guards the pool.  Both are
 * leaves against the runtime's locks (runtime.h): nothing else is taken
 * under them (a warning is sent after the pool's mu is released), and no
 * CUDA call but the slab's allocation and release.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "ffi/cuda.h"
#include "hcb/ffi.h"
#include "runtime/runtime.h"

#define ALIGN 64
/* The least a free remainder may be: a header and one line of data. */
#define MIN_SPLIT (2 * ALIGN)

enum { FREE, TAKEN };

typedef struct pool pool;

typedef struct block {
    size_t size;      /* of the block, header included, a multiple of ALIGN */
    size_t prev_size; /* of the block before it in the slab; 0: the first */
    pool *owner;
    struct block *next_free, *prev_free; /* on owner's free list, if FREE */
    int state;
    bool on_the_way; /* taken and not yet delivered */
    _Alignas(ALIGN) char data[];
} block;

_Static_assert(sizeof(block) == ALIGN, "a block header is one line");

struct pool {
    hcb__mutex mu;
    hcb__cond room; /* broadcast to `waiters` when blocks come back */
    int ordinal;
    const hcb__cuda *api; /* the one that pinned `slab` */
    char *slab;
    size_t capacity; /* 0 until the slab exists */
    block *free_list;
    size_t used, blocks, on_the_way, on_the_way_bytes;
    unsigned waiters;
    uint64_t waits, refusals, syncs, pin_failures;
    bool pin_failed;          /* no slab: every take is refused */
    uint64_t stall_warned_ns; /* when a wait was last warned of; 0: never */
};

static struct {
    hcb__mutex mu;
    /* The capacity of slabs pinned from now on (0: the default), written
     * under pools.mu and every pool's mu, read under one pool's. */
    atomic_size_t want;
    _Atomic(pool *) pools[HCB__PINNED_DEVICES];
} pools = {{PTHREAD_MUTEX_INITIALIZER}, 0, {NULL}};

/* ---- the free list and the blocks around a block (under pool->mu) ---- */

static void
list_push(pool *p, block *b)
{
    b->state = FREE;
    b->on_the_way = false;
    b->prev_free = NULL;
    b->next_free = p->free_list;
    if (p->free_list != NULL)
        p->free_list->prev_free = b;
    p->free_list = b;
}

static void
list_remove(pool *p, block *b)
{
    if (b->prev_free != NULL)
        b->prev_free->next_free = b->next_free;
    else
        p->free_list = b->next_free;
    if (b->next_free != NULL)
        b->next_free->prev_free = b->prev_free;
}

/* The block after `b` in the slab, or NULL at its end. */
static block *
next_of(pool *p, block *b)
{
    char *next = (char *)b + b->size;

    return next < p->slab + p->capacity ? (block *)next : NULL;
}

static block *
prev_of(block *b)
{
    return b->prev_size > 0 ? (block *)((char *)b - b->prev_size) : NULL;
}

/* First fit: a free block of `need` bytes (split off a larger one), taken
 * and on its way; or NULL. */
static block *
carve(pool *p, size_t need)
{
    block *b, *rest, *next;

    for (b = p->free_list; b != NULL && b->size < need; b = b->next_free)
        ;
    if (b == NULL)
        return NULL;
    list_remove(p, b);
    if (b->size - need >= MIN_SPLIT) {
        rest = (block *)((char *)b + need);
        rest->size = b->size - need;
        rest->prev_size = need;
        rest->owner = p;
        if ((next = next_of(p, rest)) != NULL)
            next->prev_size = rest->size;
        list_push(p, rest);
        b->size = need;
    }
    b->state = TAKEN;
    b->on_the_way = true;
    p->used += b->size;
    p->blocks++;
    p->on_the_way++;
    p->on_the_way_bytes += b->size;
    return b;
}

/* Frees `b`, merged with its free neighbours. */
static void
release(pool *p, block *b)
{
    block *next = next_of(p, b), *prev = prev_of(b);

    p->used -= b->size;
    p->blocks--;
    if (next != NULL && next->state == FREE) {
        list_remove(p, next);
        b->size += next->size;
    }
    if (prev != NULL && prev->state == FREE) {
        list_remove(p, prev);
        prev->size += b->size;
        b = prev;
    }
    if ((next = next_of(p, b)) != NULL)
        next->prev_size = b->size;
    list_push(p, b);
}

/* `b` is no longer on its way. */
static void
arrived(pool *p, block *b)
{
    if (b->on_the_way) {
        b->on_the_way = false;
        p->on_the_way--;
        p->on_the_way_bytes -= b->size;
    }
}

/* ---- the pools ------------------------------------------------------- */

/* The pool of device `ordinal`, made on first use; NULL with `err` set. */
static pool *
pool_get(int ordinal, bool create, hcb_error *err)
{
    pool *p;

    if (ordinal < 0 || ordinal >= HCB__PINNED_DEVICES) {
        if (err != NULL)
            hcb_error_set(err, HCB_EUNIMPL,
                          "CUDA device ordinal %d is outside 0..%d", ordinal,
                          HCB__PINNED_DEVICES - 1);
        return NULL;
    }
    p = atomic_load_explicit(&pools.pools[ordinal], memory_order_acquire);
    if (p != NULL || !create)
        return p;
    hcb__mutex_lock(&pools.mu);
    p = atomic_load_explicit(&pools.pools[ordinal], memory_order_relaxed);
    if (p == NULL && (p = hcb__calloc(1, sizeof *p)) != NULL) {
        if (hcb__mutex_init(&p->mu) != HCB_OK) {
            hcb__free(p);
            p = NULL;
        } else if (hcb__cond_init(&p->room) != HCB_OK) {
            hcb__mutex_destroy(&p->mu);
            hcb__free(p);
            p = NULL;
        } else {
            p->ordinal = ordinal;
            atomic_store_explicit(&pools.pools[ordinal], p,
                                  memory_order_release);
        }
    }
    hcb__mutex_unlock(&pools.mu);
    if (p == NULL)
        hcb_error_set(err, HCB_ENOMEM,
                      "cannot allocate the pinned pool of CUDA device %d",
                      ordinal);
    return p;
}

/* Pins the slab: one free block.  Under p->mu. */
static int
pin(pool *p, const hcb__cuda *api, hcb_error *err)
{
    char what[64];
    size_t want;
    void *slab = NULL;
    block *b;
    int status;

    want = atomic_load(&pools.want);
    want = (want != 0 ? want : HCB__PINNED_BYTES) & ~(size_t)(ALIGN - 1);
    if ((status = api->host_alloc(&slab, want,
                                  HCB__CUDA_HOST_ALLOC_PORTABLE)) != 0) {
        snprintf(what, sizeof what, "cannot pin %zu bytes of host memory",
                 want);
        return hcb__cuda_fail(api, status, what, err);
    }
    if ((uintptr_t)slab % ALIGN != 0) { /* CUDA gives pages */
        api->free_host(slab);
        return hcb_error_set(err, HCB_EINTERNAL,
                             "pinned memory is not %d-byte aligned", ALIGN);
    }
    p->api = api;
    p->slab = slab;
    p->capacity = want;
    p->free_list = NULL;
    b = (block *)slab;
    b->size = want;
    b->prev_size = 0;
    b->owner = p;
    list_push(p, b);
    return HCB_OK;
}

/* What holds pool `p` while a taker has waited `waited_ns`, for the
 * warning; under p->mu.  False when it warned less than a minute ago. */
static bool
describe_stall(pool *p, uint64_t waited_ns, char *msg, size_t cap)
{
    uint64_t now = hcb__now_ns();

    if (p->stall_warned_ns != 0 &&
        now - p->stall_warned_ns < STALL_WARN_EVERY_NS)
        return false;
    p->stall_warned_ns = now;
    snprintf(msg, cap,
             "CUDA device %d has waited %.1f s for room in its pinned pool "
             "(%zu bytes: %zu bytes in %zu records and calls on their way, "
             "%zu bytes kept by tap functions)",
             p->ordinal, (double)waited_ns / 1e9, p->capacity,
             p->on_the_way_bytes, p->on_the_way, p->used - p->on_the_way_bytes);
    return true;
}

/* Has the warning thread say that the pool of `ordinal` has held up its
 * device (`what`, from describe_stall), naming the tap function its
 * consumer runs now.  No lock held. */
static void
warn_stall(hcb_runtime *rt, int ordinal, const char *what)
{
    channel *ch = hcb__channel_find(rt, HCB_DEVICE(HCB_PLATFORM_CUDA, ordinal));
    const target *t =
        ch != NULL ? atomic_load_explicit(&ch->delivering, memory_order_relaxed)
                   : NULL;

    hcb__runtime_warn(
        rt,
        "%s while the tap function '%s' is running.  It goes on waiting.  "
        "A tap function that runs a computation (e.g. JAX) on the device "
        "that issued the tap deadlocks when that device's pinned pool is "
        "full: the device waits for the tap function, which waits for the "
        "device.  Raise the pool (HOST_CALLBACK_CUDA_PINNED_BYTE_SIZE), or "
        "move that work out of the tap function (after barrier_wait, or "
        "onto another device)",
        what, t != NULL ? t->name : "(none)");
}

void *
hcb__pinned_take(const hcb__cuda *api, hcb_runtime *rt, int ordinal, size_t n,
                 bool may_wait, hcb_error *err)
{
    size_t need = (sizeof(block) + n + ALIGN - 1) & ~(size_t)(ALIGN - 1);
    size_t capacity;
    char msg[HCB_ERROR_MESSAGE_SIZE];
    uint64_t t0 = 0;
    bool warned = false, pin_failed = false, stopped = false;
    block *b = NULL;
    pool *p;
    hcb_error why;
    hcb__wait wait;

    err->code = HCB_OK;
    if (need < n)
        return NULL;
    if ((p = pool_get(ordinal, true, err)) == NULL)
        return NULL;
    hcb__mutex_lock(&p->mu);
    if (p->capacity == 0 && !p->pin_failed && pin(p, api, &why) != HCB_OK) {
        /* not an error of the tap: it goes through ordinary memory */
        p->pin_failed = pin_failed = true;
        p->pin_failures++;
        snprintf(msg, sizeof msg, "%s", why.message);
    }
    if (p->capacity > 0 && need <= p->capacity / 2) {
        while ((b = carve(p, need)) == NULL && may_wait && p->on_the_way > 0) {
            uint64_t now = hcb__now_ns(), deadline;

            if (t0 == 0) {
                t0 = now;
                p->waits++;
                /* the runtime's interrupt check, taken with no lock held
                 * (runtime.h, "Interrupts") */
                hcb__mutex_unlock(&p->mu);
                if (rt != NULL)
                    hcb__runtime_wait_begin(
                        rt, HCB_DEVICE(HCB_PLATFORM_CUDA, ordinal), &wait);
                else
                    hcb__wait_begin(&wait, NULL, 0);
                hcb__mutex_lock(&p->mu);
                continue; /* blocks may have come back meanwhile */
            }
            if (hcb__wait_due(&wait, now)) {
                hcb__mutex_unlock(&p->mu);
                stopped = hcb__wait_stopped(&wait);
                hcb__mutex_lock(&p->mu);
                if (stopped)
                    break;
                continue;
            }
            if (!warned && rt != NULL && now - t0 >= STALL_WARN_NS) {
                warned = true;
                if (describe_stall(p, now - t0, msg, sizeof msg)) {
                    hcb__mutex_unlock(&p->mu);
                    warn_stall(rt, ordinal, msg);
                    hcb__mutex_lock(&p->mu);
                    continue; /* blocks may have come back meanwhile */
                }
            }
            deadline = hcb__wait_deadline(
                &wait, warned || rt == NULL ? 0 : t0 + STALL_WARN_NS);
            p->waiters++;
            if (deadline == 0)
                hcb__cond_wait(&p->room, &p->mu);
            else
                (void)hcb__cond_wait_until(&p->room, &p->mu, deadline);
            p->waiters--;
        }
    }
    p->refusals += b == NULL && !stopped;
    capacity = p->capacity;
    hcb__mutex_unlock(&p->mu);
    if (stopped) {
        hcb__wait_fail(&wait, err, "",
                       "CUDA device %d interrupted while waiting for room in "
                       "its pinned pool (%zu bytes)",
                       ordinal, capacity);
        return NULL;
    }
    if (pin_failed && rt != NULL)
        hcb__runtime_warn(
            rt,
            "%s, for the pool of CUDA device %d: its GPU taps and calls "
            "copy through ordinary memory instead, each waiting for the "
            "device's stream (the pool's pin_failures and syncs in "
            "hcb.stats()).  A smaller pool (HOST_CALLBACK_CUDA_PINNED_BYTE_"
            "SIZE, from 4 MiB) or a higher memory-lock limit (ulimit -l) "
            "avoids that",
            msg, ordinal);
    return b != NULL ? b->data : NULL;
}

size_t
hcb__pinned_capacity(int ordinal)
{
    pool *p = pool_get(ordinal, false, NULL);
    size_t capacity = 0;

    if (p != NULL) {
        hcb__mutex_lock(&p->mu);
        capacity = p->capacity;
        hcb__mutex_unlock(&p->mu);
    }
    return capacity;
}

static block *
block_of(void *mem)
{
    return (block *)((char *)mem - offsetof(block, data));
}

void
hcb__pinned_delivered(void *mem)
{
    block *b = block_of(mem);
    pool *p = b->owner;

    hcb__mutex_lock(&p->mu);
    arrived(p, b);
    if (p->waiters > 0) /* it no longer holds them back from refusing */
        hcb__cond_broadcast(&p->room);
    hcb__mutex_unlock(&p->mu);
}

void
hcb__pinned_give(void *mem)
{
    block *b = block_of(mem);
    pool *p = b->owner;

    hcb__mutex_lock(&p->mu);
    arrived(p, b);
    release(p, b);
    if (p->waiters > 0)
        hcb__cond_broadcast(&p->room);
    hcb__mutex_unlock(&p->mu);
}

void
hcb__pinned_note_sync(int ordinal)
{
    pool *p = pool_get(ordinal, false, NULL);

    if (p != NULL) {
        hcb__mutex_lock(&p->mu);
        p->syncs++;
        hcb__mutex_unlock(&p->mu);
    }
}

int
hcb__pinned_configure(size_t bytes)
{
    int rc = HCB_OK, i;

    /* every pool locked (in ordinal order, after pools.mu) while it checks
     * and then changes them all */
    hcb__mutex_lock(&pools.mu);
    for (i = 0; i < HCB__PINNED_DEVICES; i++) {
        pool *p = atomic_load_explicit(&pools.pools[i], memory_order_relaxed);

        if (p != NULL) {
            hcb__mutex_lock(&p->mu);
            if (p->used != 0)
                rc = HCB_ESTATE;
        }
    }
    if (rc == HCB_OK)
        atomic_store(&pools.want, bytes);
    for (i = 0; i < HCB__PINNED_DEVICES; i++) {
        pool *p = atomic_load_explicit(&pools.pools[i], memory_order_relaxed);

        if (p == NULL)
            continue;
        if (rc == HCB_OK) {
            if (p->capacity != 0)
                p->api->free_host(p->slab);
            p->slab = NULL;
            p->capacity = 0;
            p->free_list = NULL;
            p->waits = p->refusals = p->syncs = p->pin_failures = 0;
            p->pin_failed = false; /* pinning is tried again */
            p->stall_warned_ns = 0;
        }
        hcb__mutex_unlock(&p->mu);
    }
    hcb__mutex_unlock(&pools.mu);
    return rc;
}

int
hcb_cuda_set_pinned_bytes(size_t bytes, hcb_error *err)
{
    if (bytes < HCB__PINNED_MIN_BYTES)
        return hcb_error_set(err, HCB_EINVAL,
                             "the pinned pool must be at least %zu bytes, "
                             "got %zu",
                             HCB__PINNED_MIN_BYTES, bytes);
    if (hcb__pinned_configure(bytes) != HCB_OK)
        return hcb_error_set(err, HCB_ESTATE,
                             "the pinned pool is in use: its size can change "
                             "only while no GPU callback holds any of it");
    return HCB_OK;
}

bool
hcb__pinned_get_stats(int ordinal, hcb__pinned_stats *out)
{
    pool *p = pool_get(ordinal, false, NULL);
    block *b;

    memset(out, 0, sizeof *out);
    if (p == NULL)
        return false;
    hcb__mutex_lock(&p->mu);
    out->capacity = p->capacity;
    out->used = p->used;
    out->blocks = p->blocks;
    out->on_the_way = p->on_the_way;
    out->on_the_way_bytes = p->on_the_way_bytes;
    for (b = p->free_list; b != NULL; b = b->next_free)
        out->free_blocks++;
    out->waits = p->waits;
    out->refusals = p->refusals;
    out->syncs = p->syncs;
    out->pin_failures = p->pin_failures;
    hcb__mutex_unlock(&p->mu);
    return true;
}

int
hcb_cuda_get_pool_stats(int32_t ordinal, hcb_cuda_pool_stats *stats,
                        hcb_error *err)
{
    hcb_cuda_pool_stats s = HCB_CUDA_POOL_STATS_INIT;
    hcb__pinned_stats ps;
    size_t size;

    if (stats == NULL || stats->struct_size < sizeof(size_t))
        return hcb_error_set(err, HCB_EINVAL, "stats needs struct_size");
    if (!hcb__pinned_get_stats(ordinal, &ps))
        return hcb_error_set(err, HCB_ENOTFOUND,
                             "CUDA device %d has no pinned pool (no GPU "
                             "callback has run on it)",
                             (int)ordinal);
    s.capacity = ps.capacity;
    s.used_bytes = ps.used;
    s.in_flight_bytes = ps.on_the_way_bytes;
    s.kept_bytes = ps.used - ps.on_the_way_bytes;
    s.waits = ps.waits;
    s.refusals = ps.refusals;
    s.syncs = ps.syncs;
    s.pin_failures = ps.pin_failures;
    /* only the fields the caller's struct has */
    size = stats->struct_size < sizeof s ? stats->struct_size : sizeof s;
    s.struct_size = size;
    memcpy(stats, &s, size);
    return HCB_OK;
}
