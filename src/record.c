/*
 * record.c - creating tap records: one allocation, one copy per byte.
 */
#include <stdlib.h>
#include <string.h>

#include "record.h"

/* ---- record memory -----------------------------------------------------
 *
 * A record is allocated on XLA's thread and freed on the consumer's (or
 * wherever Python drops the last array over it).  With plain malloc and
 * free that costs twice: the allocating thread's cache never sees the
 * frees, so each small record takes malloc's slow path; and a large record
 * is fresh memory from the kernel, every page faulting during the copy.
 * Two caches keep freed record memory for the next record instead:
 *
 *   - small records (up to SMALL_BLOCK bytes: the usual tap of a few
 *     scalars) are blocks of one size on a lock-free stack.  A free pushes
 *     one block (CAS); an allocation pops from its thread's own list and
 *     refills that list by taking the whole stack at once (one exchange).
 *     Taking all, never one, is what keeps the stack free of ABA.
 *   - large records (LARGE_MIN bytes and up) keep a few blocks under a
 *     mutex, each reused for a record of between half and all its size.
 *
 * Both are bounded (SMALL_MAX blocks, LARGE_SLOTS blocks of at most
 * LARGE_MAX_BYTES in all) and used only with the default allocator: a hook
 * set with hcb_set_allocator sees every allocation.
 */

enum { POOL_NONE, POOL_SMALL, POOL_LARGE };

#define SMALL_BLOCK     512
#define SMALL_MAX       4096
#define LARGE_MIN       ((size_t)1 << 20)
#define LARGE_SLOTS     4
#define LARGE_MAX_BYTES ((size_t)256 << 20)

typedef struct block {
    struct block *next;
} block;

static _Atomic(block *) small_stack;
static atomic_size_t small_cached; /* blocks in the stack and thread lists */
static HCB__TLS block *small_local;
static HCB__TLS bool small_registered;
static pthread_key_t small_key;
static pthread_once_t small_once = PTHREAD_ONCE_INIT;
static bool small_key_ok;

static void
small_push(block *b)
{
    block *head = atomic_load_explicit(&small_stack, memory_order_relaxed);

    do
        b->next = head;
    while (!atomic_compare_exchange_weak_explicit(
        &small_stack, &head, b, memory_order_release, memory_order_relaxed));
}

/* At thread exit: the thread's list goes back to the stack. */
static void
small_thread_exit(void *unused)
{
    (void)unused;
    while (small_local != NULL) {
        block *b = small_local;

        small_local = b->next;
        small_push(b);
    }
}

static void
small_key_create(void)
{
    small_key_ok = pthread_key_create(&small_key, small_thread_exit) == 0;
}

static void *
small_take(void)
{
    block *b = small_local;

    if (b == NULL) {
        b = atomic_exchange_explicit(&small_stack, NULL, memory_order_acquire);
        if (b == NULL)
            return NULL;
        if (!small_registered) {
            /* once per thread: have its list handed back at exit */
            pthread_once(&small_once, small_key_create);
            small_registered =
                small_key_ok && pthread_setspecific(small_key, &small_key) == 0;
        }
        if (!small_registered) {
            /* no way to hand the list back at exit: keep one block */
            block *rest = b->next;

            while (rest != NULL) {
                block *next = rest->next;

                small_push(rest);
                rest = next;
            }
            atomic_fetch_sub_explicit(&small_cached, 1, memory_order_relaxed);
            return b;
        }
    }
    small_local = b->next;
    atomic_fetch_sub_explicit(&small_cached, 1, memory_order_relaxed);
    return b;
}

static struct {
    pthread_mutex_t mu;
    void *block[LARGE_SLOTS];
    size_t capacity[LARGE_SLOTS];
    size_t bytes;
    int victim; /* the slot to give up next when all are taken */
} large = {PTHREAD_MUTEX_INITIALIZER, {NULL}, {0}, 0, 0};

static void *
large_take(size_t size, size_t *capacity)
{
    void *p = NULL;
    int i, best = -1;

    pthread_mutex_lock(&large.mu);
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
    pthread_mutex_unlock(&large.mu);
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

    pthread_mutex_lock(&large.mu);
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
    pthread_mutex_unlock(&large.mu);
    free(evicted);
    return kept;
}

/* Memory for a record of `size` bytes, with its pool and capacity. */
static hcb_record *
record_alloc(size_t size)
{
    hcb_record *rec = NULL;
    size_t capacity = size;
    int pool = POOL_NONE;

    if (hcb__default_allocator()) {
        if (size <= SMALL_BLOCK) {
            pool = POOL_SMALL;
            capacity = SMALL_BLOCK;
            rec = small_take();
            if (rec == NULL)
                rec = malloc(SMALL_BLOCK);
        } else if (size >= LARGE_MIN) {
            pool = POOL_LARGE;
            rec = large_take(size, &capacity);
            if (rec == NULL)
                rec = malloc(size);
        }
    }
    if (pool == POOL_NONE)
        rec = hcb__malloc(size);
    if (rec != NULL) {
        rec->pool = pool;
        rec->capacity = capacity;
    }
    return rec;
}

static void
record_free(hcb_record *rec)
{
    bool pools = hcb__default_allocator();

    switch (rec->pool) {
    case POOL_SMALL:
        if (pools && atomic_fetch_add_explicit(
                         &small_cached, 1, memory_order_relaxed) < SMALL_MAX) {
            small_push((block *)rec);
            return;
        }
        if (pools)
            atomic_fetch_sub_explicit(&small_cached, 1, memory_order_relaxed);
        free(rec);
        return;
    case POOL_LARGE:
        if (!pools || !large_keep(rec, rec->capacity))
            free(rec);
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
    size_t item = hcb_dtype_size(a->dtype);
    size_t n = 1;
    int32_t d;

    if (item == 0)
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
    if (n > SIZE_MAX / item || n * item != a->nbytes)
        return hcb_error_set(err, HCB_EINVAL,
                             "argument %zu claims %zu bytes, its shape "
                             "holds %zu",
                             i, a->nbytes, n * item);
    if (a->nbytes > 0 && a->data == NULL)
        return hcb_error_set(err, HCB_EINVAL, "argument %zu has no data", i);
    return HCB_OK;
}

int
hcb_record_create(uint64_t callback_id, hcb_device device,
                  const hcb_array *args, size_t nargs, hcb_record **out,
                  hcb_error *err)
{
    size_t i, ndims = 0, size;
    hcb_record *rec;
    int64_t *dims;
    char *payload;
    int rc;

    *out = NULL;
    if (nargs > 0 && args == NULL)
        return hcb_error_set(err, HCB_EINVAL, "nargs is %zu but args is NULL",
                             nargs);
    if (nargs > ((size_t)1 << 20))
        return hcb_error_set(err, HCB_EINVAL, "too many arguments: %zu", nargs);
    for (i = 0; i < nargs; i++) {
        if ((rc = check_view(&args[i], i, err)) != HCB_OK)
            return rc;
        ndims += (size_t)args[i].rank;
    }
    size = align_up(sizeof *rec + nargs * sizeof(hcb_array) +
                    ndims * sizeof(int64_t));
    for (i = 0; i < nargs; i++) {
        size_t grown = size + align_up(args[i].nbytes);

        if (grown < size)
            return hcb_error_set(err, HCB_EINVAL, "record too large");
        size = grown;
    }
    rec = record_alloc(size);
    if (rec == NULL)
        return hcb_error_set(err, HCB_ENOMEM,
                             "cannot allocate a %zu-byte tap record", size);

    atomic_init(&rec->refs, 1);
    rec->next = NULL;
    rec->size = size;
    rec->callback_id = callback_id;
    rec->device = device;
    rec->nargs = nargs;
    rec->args = (hcb_array *)(rec + 1);
    dims = (int64_t *)(rec->args + nargs);
    payload = (char *)rec + align_up(sizeof *rec + nargs * sizeof(hcb_array) +
                                     ndims * sizeof(int64_t));
    for (i = 0; i < nargs; i++) {
        hcb_array *a = &rec->args[i];

        *a = args[i];
        if (a->rank > 0)
            memcpy(dims, args[i].dims, (size_t)a->rank * sizeof *dims);
        a->dims = a->rank > 0 ? dims : NULL;
        dims += a->rank;
        a->data = payload;
        if (a->nbytes > 0)
            memcpy(payload, args[i].data, a->nbytes);
        payload += align_up(a->nbytes);
    }
    *out = rec;
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
