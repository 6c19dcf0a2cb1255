/*
 * record.c - creating tap records: one allocation, one copy per byte.
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/record.h"

/* ---- record memory -----------------------------------------------------
 *
 * A record is allocated on XLA's thread and freed on the consumer's (or
 * wherever Python drops the last array over it).  Plain malloc and free
 * cost twice there: the allocating thread's cache never sees the frees, so
 * each small record takes malloc's slow path; and a large record in fresh
 * memory page-faults on every page of its copy.  Reusing a freed block at
 * once is no better for small records: the consumer wrote it last, so each
 * of its cache lines crosses between cores again.  So:
 *
 *   - small records (up to ARENA_RECORD_MAX bytes: the usual tap of a few
 *     scalars) are carved one after the other out of the allocating
 *     thread's arena, a block of ARENA_BYTES.  The writes walk forward
 *     through memory, which the hardware prefetches, and the thread shares
 *     nothing with the consumer but the records themselves.  An arena
 *     counts its live records (see arena_release); the last release of a
 *     full arena puts it on a short free list for the next one.
 *   - large records (LARGE_MIN bytes and up) keep a few blocks under a
 *     mutex, each reused for a record of between half and all its size.
 *
 * Both are bounded (ARENA_KEEP free arenas, LARGE_SLOTS blocks of at most
 * LARGE_MAX_BYTES in all) and take their blocks from the allocation hook
 * (hcb__malloc), like every other allocation; hcb_set_allocator gives the
 * kept blocks back to the old hook before it changes (hcb__record_drain).
 * A small record that
 * is kept (hcb_record_retain) keeps its whole arena; Python copies small
 * records' arrays out for that reason (python/_hcb/bridge.c).
 *
 * Fork: both pool locks are taken before a fork and released after it in
 * parent and child (hcb__record_fork_*), so that a child never finds one
 * held by a thread it does not have.  Arenas that hold records of the
 * parent's (queued at the fork) are never recycled in the child.
 */

enum { POOL_NONE, POOL_ARENA, POOL_LARGE, POOL_OWNER };

#define ARENA_BYTES      ((size_t)64 << 10)
#define ARENA_RECORD_MAX HCB_RECORD_SHARED_MAX /* bridge.c copies those */
#define ARENA_KEEP       64
#define ARENA_OPEN       (SIZE_MAX / 2) /* see arena_release */
#define LARGE_MIN        ((size_t)1 << 20)
#define LARGE_SLOTS      4
#define LARGE_MAX_BYTES  ((size_t)256 << 20)

typedef struct arena {
    /* ARENA_OPEN minus the records released while the arena is the
     * current one of its thread; after that, the records still live. */
    atomic_size_t live;
    struct arena *next; /* on the free list */
    void *block;        /* what hcb__malloc returned: the arena is in it */
    _Alignas(64) char data[];
} arena;

/* The allocating thread's arena, and what it has carved out of it. */
static HCB__TLS arena *arena_current;
static HCB__TLS size_t arena_used, arena_records;
static HCB__TLS bool arena_registered;
static pthread_key_t arena_key;
static pthread_once_t arena_once = PTHREAD_ONCE_INIT;
static bool arena_key_ok;

static struct {
    hcb__mutex mu;
    arena *head;
    size_t count;
} arena_free = {{PTHREAD_MUTEX_INITIALIZER}, NULL, 0};

static void
arena_recycle(arena *a)
{
    hcb__mutex_lock(&arena_free.mu);
    if (arena_free.count < ARENA_KEEP) {
        a->next = arena_free.head;
        arena_free.head = a;
        arena_free.count++;
        a = NULL;
    }
    hcb__mutex_unlock(&arena_free.mu);
    if (a != NULL)
        hcb__free(a->block);
}

/* Drops `n` from the arena's count; the one that reaches 0 recycles it.
 * While the arena is its thread's current one the count stays above
 * ARENA_OPEN - (records carved) > 0, so releases cannot reach 0 and the
 * allocating thread never touches the count per record.  Closing the
 * arena drops ARENA_OPEN - (records carved): what is left is the number
 * of records still live. */
static void
arena_release(arena *a, size_t n)
{
    if (atomic_fetch_sub_explicit(&a->live, n, memory_order_acq_rel) == n)
        arena_recycle(a);
}

static void
arena_close(void)
{
    arena *a = arena_current;

    arena_current = NULL;
    if (a != NULL)
        arena_release(a, ARENA_OPEN - arena_records);
}

static void
arena_thread_exit(void *unused)
{
    (void)unused;
    arena_close();
}

static void
arena_key_create(void)
{
    arena_key_ok = pthread_key_create(&arena_key, arena_thread_exit) == 0;
}

/* Opens a new arena for this thread: false if the thread cannot have one
 * (no memory, or no way to close it at thread exit). */
static bool
arena_open(void)
{
    arena *a;

    if (!arena_registered) {
        pthread_once(&arena_once, arena_key_create);
        arena_registered =
            arena_key_ok && pthread_setspecific(arena_key, &arena_key) == 0;
        if (!arena_registered)
            return false;
    }
    arena_close();
    hcb__mutex_lock(&arena_free.mu);
    a = arena_free.head;
    if (a != NULL) {
        arena_free.head = a->next;
        arena_free.count--;
    }
    hcb__mutex_unlock(&arena_free.mu);
    if (a == NULL) {
        void *block = hcb__malloc(sizeof *a + ARENA_BYTES + _Alignof(arena));

        if (block == NULL)
            return false;
        a = (arena *)(((uintptr_t)block + _Alignof(arena) - 1) &
                      ~(uintptr_t)(_Alignof(arena) - 1));
        a->block = block;
    }
    atomic_init(&a->live, ARENA_OPEN);
    arena_current = a;
    arena_used = 0;
    arena_records = 0;
    return true;
}

static void *
arena_take(size_t size)
{
    void *p;

    size = (size + 63) & ~(size_t)63; /* records do not share cache lines */
    if ((arena_current == NULL || ARENA_BYTES - arena_used < size) &&
        !arena_open())
        return NULL;
    p = arena_current->data + arena_used;
    arena_used += size;
    arena_records++;
    return p;
}

static struct {
    hcb__mutex mu;
    void *block[LARGE_SLOTS];
    size_t capacity[LARGE_SLOTS];
    size_t bytes;
    int victim; /* the slot to give up next when all are taken */
} large = {{PTHREAD_MUTEX_INITIALIZER}, {NULL}, {0}, 0, 0};

static void *
large_take(size_t size, size_t *capacity)
{
    void *p = NULL;
    int i, best = -1;

    hcb__mutex_lock(&large.mu);
    for (i = 0; i < LARGE_SLOTS; i++)
        if (large.block[i] != NULL && large.capacity[i] >= size &&
            large.capacity[i] / 2 <= size &&
            (best < 0 || large.capacity[i] < large.capacity[best]))
            best = i;
    if (best >= 0) {
        p = large.block[best];
        *capacity = large.capacity[best];
        large.block[best] = NULL;
        large.bytes -= *capacity;
    }
    hcb__mutex_unlock(&large.mu);
    return p;
}

/* Keeps a freed block, in a free slot or in place of the oldest kept one
 * (the sizes in use change: 4 MiB taps, then 64 MiB ones). */
static bool
large_keep(void *p, size_t capacity)
{
    void *evicted = NULL;
    bool kept = false;
    int i, slot = -1;

    hcb__mutex_lock(&large.mu);
    for (i = 0; i < LARGE_SLOTS && slot < 0; i++)
        if (large.block[i] == NULL)
            slot = i;
    if (slot < 0) {
        slot = large.victim;
        large.victim = (slot + 1) % LARGE_SLOTS;
        evicted = large.block[slot];
        large.bytes -= large.capacity[slot];
        large.block[slot] = NULL;
    }
    if (large.bytes + capacity <= LARGE_MAX_BYTES) {
        large.block[slot] = p;
        large.capacity[slot] = capacity;
        large.bytes += capacity;
        kept = true;
    }
    hcb__mutex_unlock(&large.mu);
    hcb__free(evicted);
    return kept;
}

void
hcb__record_drain(void)
{
    arena *a, *next;
    int i;

    hcb__mutex_lock(&arena_free.mu);
    a = arena_free.head;
    arena_free.head = NULL;
    arena_free.count = 0;
    hcb__mutex_unlock(&arena_free.mu);
    for (; a != NULL; a = next) {
        next = a->next;
        hcb__free(a->block);
    }
    hcb__mutex_lock(&large.mu);
    for (i = 0; i < LARGE_SLOTS; i++) {
        hcb__free(large.block[i]);
        large.block[i] = NULL;
    }
    large.bytes = 0;
    hcb__mutex_unlock(&large.mu);
}

void
hcb__record_fork_prepare(void)
{
    hcb__mutex_lock(&arena_free.mu);
    hcb__mutex_lock(&large.mu);
}

void
hcb__record_fork_parent(void)
{
    hcb__mutex_unlock(&large.mu);
    hcb__mutex_unlock(&arena_free.mu);
}

void
hcb__record_fork_child(void)
{
    hcb__mutex_unlock(&large.mu);
    hcb__mutex_unlock(&arena_free.mu);
}

/* Memory for a record of `size` bytes, with its pool and capacity. */
static hcb_record *
record_alloc(size_t size)
{
    hcb_record *rec = NULL;
    size_t capacity = size;
    int pool = POOL_NONE;

    if (size <= ARENA_RECORD_MAX) {
        pool = POOL_ARENA;
        rec = arena_take(size);
        if (rec != NULL)
            rec->arena = arena_current;
        else
            pool = POOL_NONE; /* from hcb__malloc below */
    } else if (size >= LARGE_MIN) {
        pool = POOL_LARGE;
        rec = large_take(size, &capacity);
        if (rec == NULL)
            rec = hcb__malloc(size);
    }
    if (pool == POOL_NONE)
        rec = hcb__malloc(size);
    if (rec != NULL) {
        rec->pool = pool;
        rec->capacity = capacity;
        rec->owner = NULL;
    }
    return rec;
}

static void
record_free(hcb_record *rec)
{
    switch (rec->pool) {
    case POOL_ARENA:
        arena_release(rec->arena, 1);
        return;
    case POOL_LARGE:
        if (!large_keep(rec, rec->capacity))
            hcb__free(rec);
        return;
    case POOL_OWNER:
        rec->owner->free(rec);
        return;
    default:
        hcb__free(rec);
    }
}

static size_t
align_up(size_t n)
{
    return (n + HCB__PAYLOAD_ALIGN - 1) & ~(size_t)(HCB__PAYLOAD_ALIGN - 1);
}

/* Checks that a view describes what it claims, so the copy below reads
 * exactly the bytes the producer owns. */
static int
check_view(const hcb_array *a, size_t i, hcb_error *err)
{
    size_t n = 1, want;
    int32_t d;

    if (hcb_dtype_bits(a->dtype) == 0)
        return hcb_error_set(err, HCB_EINVAL,
                             "argument %zu has unsupported type %s (code %d)",
                             i, hcb_dtype_name(a->dtype), (int)a->dtype);
    if (a->rank < 0 || a->rank > HCB_MAX_RANK)
        return hcb_error_set(err, HCB_EINVAL,
                             "argument %zu has rank %d, expected 0..%d", i,
                             (int)a->rank, HCB_MAX_RANK);
    if (a->rank > 0 && a->dims == NULL)
        return hcb_error_set(err, HCB_EINVAL,
                             "argument %zu has rank %d but no dims", i,
                             (int)a->rank);
    for (d = 0; d < a->rank; d++) {
        if (a->dims[d] < 0)
            return hcb_error_set(err, HCB_EINVAL,
                                 "argument %zu has negative dimension %lld", i,
                                 (long long)a->dims[d]);
        if (a->dims[d] != 0 && n > SIZE_MAX / (size_t)a->dims[d])
            return hcb_error_set(err, HCB_EINVAL, "argument %zu is too large",
                                 i);
        n *= (size_t)a->dims[d];
    }
    want = hcb_dtype_nbytes(a->dtype, n);
    if (want == SIZE_MAX)
        return hcb_error_set(err, HCB_EINVAL, "argument %zu is too large", i);
    if (want != a->nbytes)
        return hcb_error_set(err, HCB_EINVAL,
                             "argument %zu claims %zu bytes, its shape "
                             "holds %zu",
                             i, a->nbytes, want);
    if (a->nbytes > 0 && a->data == NULL)
        return hcb_error_set(err, HCB_EINVAL, "argument %zu has no data", i);
    return HCB_OK;
}

int
hcb__record_measure(const hcb_array *args, size_t nargs, hcb__record_size *out,
                    hcb_error *err)
{
    size_t i;
    int rc;

    out->ndims = 0;
    if (nargs > 0 && args == NULL)
        return hcb_error_set(err, HCB_EINVAL, "nargs is %zu but args is NULL",
                             nargs);
    if (nargs > ((size_t)1 << 20))
        return hcb_error_set(err, HCB_EINVAL, "too many arguments: %zu", nargs);
    for (i = 0; i < nargs; i++) {
        if ((rc = check_view(&args[i], i, err)) != HCB_OK)
            return rc;
        out->ndims += (size_t)args[i].rank;
    }
    out->bytes = align_up(sizeof(hcb_record) + nargs * sizeof(hcb_array) +
                          out->ndims * sizeof(int64_t));
    for (i = 0; i < nargs; i++) {
        size_t grown = out->bytes + align_up(args[i].nbytes);

        if (grown < out->bytes)
            return hcb_error_set(err, HCB_EINVAL, "record too large");
        out->bytes = grown;
    }
    return HCB_OK;
}

/* Lays the record out in `rec` (its memory fields already set). */
static void
lay_out(hcb_record *rec, const hcb__record_size *size, uint64_t callback_id,
        hcb_device device, const hcb_array *args, size_t nargs)
{
    int64_t *dims;
    char *payload;
    size_t i;

    atomic_init(&rec->refs, 1);
    atomic_init(&rec->next, NULL);
    rec->size = size->bytes;
    rec->callback_id = callback_id;
    rec->device = device;
    rec->nargs = nargs;
    rec->args = (hcb_array *)(rec + 1);
    dims = (int64_t *)(rec->args + nargs);
    payload = (char *)rec + align_up(sizeof *rec + nargs * sizeof(hcb_array) +
                                     size->ndims * sizeof(int64_t));
    for (i = 0; i < nargs; i++) {
        hcb_array *a = &rec->args[i];

        *a = args[i];
        if (a->rank > 0)
            memcpy(dims, args[i].dims, (size_t)a->rank * sizeof *dims);
        a->dims = a->rank > 0 ? dims : NULL;
        dims += a->rank;
        a->data = payload;
        payload += align_up(a->nbytes);
    }
}

int
hcb__record_alloc(uint64_t callback_id, hcb_device device,
                  const hcb_array *args, size_t nargs, hcb_record **out,
                  hcb_error *err)
{
    hcb__record_size size;
    hcb_record *rec;
    int rc;

    *out = NULL;
    if ((rc = hcb__record_measure(args, nargs, &size, err)) != HCB_OK)
        return rc;
    rec = record_alloc(size.bytes);
    if (rec == NULL)
        return hcb_error_set(err, HCB_ENOMEM,
                             "cannot allocate a %zu-byte tap record",
                             size.bytes);
    lay_out(rec, &size, callback_id, device, args, nargs);
    *out = rec;
    return HCB_OK;
}

hcb_record *
hcb__record_place(void *mem, const hcb__record_owner *owner,
                  const hcb__record_size *size, uint64_t callback_id,
                  hcb_device device, const hcb_array *args, size_t nargs)
{
    hcb_record *rec = mem;

    rec->pool = POOL_OWNER;
    rec->capacity = size->bytes;
    rec->arena = NULL;
    rec->owner = owner;
    lay_out(rec, size, callback_id, device, args, nargs);
    return rec;
}

int
hcb_record_create(uint64_t callback_id, hcb_device device,
                  const hcb_array *args, size_t nargs, hcb_record **out,
                  hcb_error *err)
{
    size_t i;
    int rc;

    if ((rc = hcb__record_alloc(callback_id, device, args, nargs, out, err)) !=
        HCB_OK)
        return rc;
    for (i = 0; i < nargs; i++)
        if (args[i].nbytes > 0)
            memcpy((*out)->args[i].data, args[i].data, args[i].nbytes);
    return HCB_OK;
}

void
hcb_record_retain(hcb_record *rec)
{
    atomic_fetch_add_explicit(&rec->refs, 1, memory_order_relaxed);
}

void
hcb_record_release(hcb_record *rec)
{
    if (rec == NULL)
        return;
    if (atomic_fetch_sub_explicit(&rec->refs, 1, memory_order_acq_rel) == 1)
        record_free(rec);
}

uint64_t
hcb_record_callback_id(const hcb_record *rec)
{
    return rec->callback_id;
}

hcb_device
hcb_record_device(const hcb_record *rec)
{
    return rec->device;
}

size_t
hcb_record_nargs(const hcb_record *rec)
{
    return rec->nargs;
}

const hcb_array *
hcb_record_args(const hcb_record *rec)
{
    return rec->args;
}

size_t
hcb_record_size(const hcb_record *rec)
{
    return rec->size;
}
