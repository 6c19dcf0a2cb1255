/*
 * pinned.c - the pool of pinned host memory that device-to-host copies
 * land in (cuda.h).
 *
 * A copy from the device runs at full speed, and asynchronously, only into
 * pinned memory, and pinning memory is slow (milliseconds per call, and it
 * may synchronise the device): so the pool pins one block once, at the
 * first tap or call that needs it, and carves it as a ring.  Takers come
 * from XLA's threads, one per device; givers are CUDA's host-function
 * thread, the consumers, or whoever drops a record's last reference.
 *
 *   slab: | block | block | ... free ... | block | ... |
 *            ^tail (oldest held)            ^head (next carved)
 *
 * Each block starts with a header; a block given back is marked free, and
 * the tail moves past free blocks only, so a block held long (a record the
 * user kept) holds the ring behind it until it goes.  When a block does
 * not fit between head and the end of the slab, the rest of the slab
 * becomes a padding block and carving goes on at the start.
 *
 * Waiting: a taker that finds no room waits while some block is still "on
 * its way" (its copy in flight, its record queued or being delivered): that
 * one will come back, so waiting is the device's back-pressure.  When all
 * the taken blocks are held by users instead, or the request is over half
 * the pool, waiting could last forever, and the taker gets NULL and uses
 * memory of its own (platform_cuda.c).
 */
#include <stdlib.h>
#include <string.h>

#include "ffi/cuda.h"
#include "hcb/ffi.h"

#define ALIGN 64

enum { FREE, TAKEN, PADDING };

typedef struct block {
    size_t size;     /* of the block, header included, a multiple of ALIGN */
    int state;       /* FREE, TAKEN, PADDING */
    bool on_the_way; /* taken and not yet delivered */
    _Alignas(ALIGN) char data[];
} block;

static struct {
    hcb__mutex mu;
    hcb__cond room;       /* broadcast when blocks come back or are delivered */
    const hcb__cuda *api; /* the one that allocated `slab` */
    char *slab;
    size_t capacity; /* 0 until the slab exists */
    size_t want;     /* the capacity to allocate (hcb__pinned_configure) */
    size_t head, tail, used, blocks, on_the_way;
    uint64_t waits, refusals;
} pool;

static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

static void
pool_init(void)
{
    if (hcb__mutex_init(&pool.mu) != HCB_OK ||
        hcb__cond_init(&pool.room) != HCB_OK)
        abort(); /* the process cannot make a mutex: nothing else works */
}

/* Carves `need` bytes at the head, or returns NULL.  Under pool.mu. */
static block *
carve(size_t need)
{
    block *b;

    if (pool.used == 0)
        pool.head = pool.tail = 0;
    if (pool.used > 0 && pool.head == pool.tail)
        return NULL; /* full */
    if (pool.head >= pool.tail) {
        if (pool.capacity - pool.head < need) {
            if (pool.tail < need)
                return NULL;
            if (pool.head < pool.capacity) {
                b = (block *)(pool.slab + pool.head);
                b->size = pool.capacity - pool.head;
                b->state = PADDING;
                b->on_the_way = false;
                pool.used += b->size;
            }
            pool.head = 0;
        }
    } else if (pool.tail - pool.head < need) {
        return NULL;
    }
    b = (block *)(pool.slab + pool.head);
    b->size = need;
    b->state = TAKEN;
    b->on_the_way = true;
    pool.head += need;
    pool.used += need;
    pool.blocks++;
    pool.on_the_way++;
    return b;
}

/* Moves the tail past blocks given back.  Under pool.mu. */
static void
reclaim(void)
{
    while (pool.used > 0) {
        block *b = (block *)(pool.slab + pool.tail);

        if (b->state == TAKEN)
            break;
        pool.used -= b->size;
        pool.tail += b->size;
        if (pool.tail == pool.capacity)
            pool.tail = 0;
    }
    if (pool.used == 0)
        pool.head = pool.tail = 0;
}

/* Pins the slab.  Under pool.mu. */
static int
pin(const hcb__cuda *api, hcb_error *err)
{
    size_t want = pool.want != 0 ? pool.want : HCB__PINNED_BYTES;
    void *slab = NULL;
    int status;

    want &= ~(size_t)(ALIGN - 1);
    if ((status =
             api->host_alloc(&slab, want, HCB__CUDA_HOST_ALLOC_PORTABLE)) != 0)
        return hcb__cuda_fail(api, status, "cannot pin host memory", err);
    if ((uintptr_t)slab % ALIGN != 0) { /* CUDA gives pages */
        api->free_host(slab);
        return hcb_error_set(err, HCB_EINTERNAL,
                             "pinned memory is not %d-byte aligned", ALIGN);
    }
    pool.api = api;
    pool.slab = slab;
    pool.capacity = want;
    pool.head = pool.tail = pool.used = 0;
    return HCB_OK;
}

void *
hcb__pinned_take(const hcb__cuda *api, size_t n, hcb_error *err)
{
    size_t need = (sizeof(block) + n + ALIGN - 1) & ~(size_t)(ALIGN - 1);
    block *b = NULL;
    bool waited = false;

    err->code = HCB_OK;
    if (need < n)
        return NULL;
    pthread_once(&pool_once, pool_init);
    hcb__mutex_lock(&pool.mu);
    if (pool.capacity == 0 && pin(api, err) != HCB_OK) {
        hcb__mutex_unlock(&pool.mu);
        return NULL;
    }
    if (need <= pool.capacity / 2) {
        while ((b = carve(need)) == NULL && pool.on_the_way > 0) {
            pool.waits += !waited;
            waited = true;
            hcb__cond_wait(&pool.room, &pool.mu);
        }
    }
    pool.refusals += b == NULL;
    hcb__mutex_unlock(&pool.mu);
    return b != NULL ? b->data : NULL;
}

size_t
hcb__pinned_capacity(void)
{
    size_t capacity;

    pthread_once(&pool_once, pool_init);
    hcb__mutex_lock(&pool.mu);
    capacity = pool.capacity;
    hcb__mutex_unlock(&pool.mu);
    return capacity;
}

static block *
block_of(void *p)
{
    return (block *)((char *)p - offsetof(block, data));
}

void
hcb__pinned_delivered(void *p)
{
    block *b = block_of(p);

    hcb__mutex_lock(&pool.mu);
    if (b->on_the_way) {
        b->on_the_way = false;
        pool.on_the_way--;
        hcb__cond_broadcast(&pool.room);
    }
    hcb__mutex_unlock(&pool.mu);
}

void
hcb__pinned_give(void *p)
{
    block *b = block_of(p);

    hcb__mutex_lock(&pool.mu);
    if (b->on_the_way) {
        b->on_the_way = false;
        pool.on_the_way--;
    }
    b->state = FREE;
    pool.blocks--;
    reclaim();
    hcb__cond_broadcast(&pool.room);
    hcb__mutex_unlock(&pool.mu);
}

int
hcb__pinned_configure(size_t bytes)
{
    int rc = HCB_OK;

    pthread_once(&pool_once, pool_init);
    hcb__mutex_lock(&pool.mu);
    if (pool.capacity != 0 && pool.used == 0) {
        pool.api->free_host(pool.slab);
        pool.slab = NULL;
        pool.capacity = 0;
    }
    if (pool.capacity == 0) {
        pool.want = bytes;
        pool.waits = pool.refusals = 0;
    } else {
        rc = HCB_ESTATE;
    }
    hcb__mutex_unlock(&pool.mu);
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

void
hcb__pinned_get_stats(hcb__pinned_stats *out)
{
    pthread_once(&pool_once, pool_init);
    hcb__mutex_lock(&pool.mu);
    out->capacity = pool.capacity;
    out->used = pool.used;
    out->blocks = pool.blocks;
    out->on_the_way = pool.on_the_way;
    out->waits = pool.waits;
    out->refusals = pool.refusals;
    hcb__mutex_unlock(&pool.mu);
}
