/*
 * record.h - the layout of a tap record, shared by the queue, the runtime
 * and the FFI handler.  Not installed: users see hcb_record as opaque.
 *
 * One allocation:
 *
 *   struct hcb_record | hcb_array args[nargs] | int64_t dims[sum of ranks]
 *   | pad | payload 0 | pad | payload 1 | ...
 *
 * Each payload starts on an HCB__PAYLOAD_ALIGN boundary: the alignment the
 * allocator guarantees (malloc: max_align_t, 16 bytes on x86-64), which is
 * enough for numpy to see every element type aligned.
 */
#ifndef HCB_RECORD_H
#define HCB_RECORD_H

#include <stdatomic.h>
#include <stddef.h>

#include "base/common.h"

#define HCB__PAYLOAD_ALIGN _Alignof(max_align_t)

/* Memory a record was laid out in by its creator (hcb__record_place): a
 * platform's pinned host memory, say.  `free` takes the memory back when
 * the last reference goes; `delivered` hears that the consumer has
 * delivered the record (the memory may stay held longer, by whoever kept
 * the record). */
typedef struct hcb__record_owner {
    void (*free)(struct hcb_record *rec);
    void (*delivered)(struct hcb_record *rec);
} hcb__record_owner;

struct hcb_record {
    atomic_size_t refs;
    /* queue link: owned by the queue holding it (atomic: see queue.c) */
    _Atomic(struct hcb_record *) next;
    size_t size;         /* bytes the record needs (its queue charge) */
    size_t capacity;     /* bytes of its allocation (>= size) */
    int pool;            /* where its memory goes back to (record.c) */
    struct arena *arena; /* the arena it was carved from, if any */
    const hcb__record_owner *owner; /* placed records only, else NULL */
    uint64_t callback_id;
    hcb_device device;
    size_t nargs;
    hcb_array *args; /* points into this allocation */
};

/* hcb_record_create without the copy: lays out a record for arrays shaped
 * like `args` (their data pointers are only checked) and leaves the bytes
 * to the caller (a platform's send, platform.h). */
int hcb__record_alloc(uint64_t callback_id, hcb_device device,
                      const hcb_array *args, size_t nargs, hcb_record **out,
                      hcb_error *err);

/* What a record for `args` takes: its bytes, and the dims it holds. */
typedef struct hcb__record_size {
    size_t bytes, ndims;
} hcb__record_size;

/* Checks each view as hcb__record_alloc does and measures the record, for
 * a creator that brings its own memory (hcb__record_place). */
int hcb__record_measure(const hcb_array *args, size_t nargs,
                        hcb__record_size *out, hcb_error *err);

/* hcb__record_alloc in `mem` (size->bytes, aligned to HCB__PAYLOAD_ALIGN),
 * with `size` from hcb__record_measure of the same `args`; `owner` takes
 * the memory back when the last reference goes. */
hcb_record *hcb__record_place(void *mem, const hcb__record_owner *owner,
                              const hcb__record_size *size,
                              uint64_t callback_id, hcb_device device,
                              const hcb_array *args, size_t nargs);

/* Tells a placed record's owner that the consumer has delivered it. */
static inline void
hcb__record_delivered(hcb_record *rec)
{
    if (rec->owner != NULL && rec->owner->delivered != NULL)
        rec->owner->delivered(rec);
}

/* The fork handlers of the record pools (runtime.c installs them with its
 * own): the pools' locks are held across fork, so the child finds them
 * whole and unlocked.  Their critical sections are a few instructions. */
void hcb__record_fork_prepare(void);
void hcb__record_fork_parent(void);
void hcb__record_fork_child(void);

#endif /* HCB_RECORD_H */
