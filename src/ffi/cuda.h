/*
 * cuda.h - what the CUDA platform (platform_cuda.c) needs from outside:
 * the few CUDA runtime functions it calls, as a table, and its pool of
 * pinned host memory.
 *
 * No CUDA header is needed to build: the table's types are the runtime's
 * own ABI spelled in plain C (cudaError_t and the enums are ints, a stream
 * is a pointer).  cuda.c fills the table from libcudart at run time
 * (hcb_cuda_load), so a process that never runs a CUDA computation never
 * loads it; tests install a stand-in (tests/c/fake_cuda.c) that copies on
 * a thread of its own, and everything above the table is the code that
 * runs on a GPU.
 */
#ifndef HCB_FFI_CUDA_H
#define HCB_FFI_CUDA_H

#include "base/common.h"

/* cudaMemcpyKind */
enum { HCB__CUDA_H2D = 1, HCB__CUDA_D2H = 2, HCB__CUDA_D2D = 3 };
/* cudaHostAllocPortable: pinned for every device's context */
#define HCB__CUDA_HOST_ALLOC_PORTABLE 1u
/* cudaEventBlockingSync: a thread waiting for the event sleeps */
#define HCB__CUDA_EVENT_BLOCKING_SYNC 1u
/* cudaEventDisableTiming: an event only for ordering, the cheap kind */
#define HCB__CUDA_EVENT_DISABLE_TIMING 2u

/* What runs once a stream has reached a point (hcb__cuda_after). */
typedef void (*hcb__cuda_host_fn)(void *data);

typedef struct hcb__cuda {
    int (*memcpy_async)(void *dst, const void *src, size_t n, int kind,
                        void *stream);
    int (*memset_async)(void *dst, int value, size_t n, void *stream);
    int (*stream_synchronize)(void *stream);
    int (*host_alloc)(void **ptr, size_t n, unsigned flags);
    int (*free_host)(void *ptr);
    const char *(*error_string)(int status);
    /* cudaEventCreateWithFlags, cudaEventRecord, cudaStreamWaitEvent,
     * cudaEventDestroy: one stream waits for another (hcb_cuda_stream_wait);
     * and cudaEventSynchronize, cudaEventQuery: the host learns that a
     * stream got there (landing.c) */
    int (*event_create)(void **event, unsigned flags);
    int (*event_record)(void *event, void *stream);
    int (*stream_wait_event)(void *stream, void *event, unsigned flags);
    int (*event_destroy)(void *event);
    int (*event_synchronize)(void *event);
    int (*event_query)(void *event); /* 0: done; 600: not yet */
    /* cudaGetDevice, cudaSetDevice: the calling thread's current device,
     * the one an event is made on and the default streams (1 and 2) are
     * of; hcb_cuda_stream_wait switches to the streams' device and back */
    int (*get_device)(int *device);
    int (*set_device)(int device);
} hcb__cuda;

/* The table in use: the stand-in a test installed, else libcudart's,
 * loaded at the first call (hcb_cuda_load with no path).  NULL, with
 * `err` naming what was tried, when there is no CUDA runtime. */
const hcb__cuda *hcb__cuda_get(hcb_error *err);

/* Tests: uses `api` instead of libcudart (NULL: back to libcudart).  Call
 * it while no CUDA handler runs. */
void hcb__cuda_install(const hcb__cuda *api);

/* Fills `err` with "<what>: <CUDA's message> (CUDA error <status>)" and
 * returns HCB_ESYSTEM. */
int hcb__cuda_fail(const hcb__cuda *api, int status, const char *what,
                   hcb_error *err);

/* Makes the calling thread's current device `ordinal` (when it is not),
 * saying in *previous which it was (-1: unchanged). */
int hcb__cuda_switch_device(const hcb__cuda *api, int ordinal, int *previous,
                            hcb_error *err);

/* ---- landing.c: host work after a stream's work, the stream not waiting
 *
 * Runs `fn(data)` on device `ordinal`'s lander thread once `stream` has
 * done everything enqueued on it before this call, without making the
 * stream wait; the functions asked for one device run one at a time, in
 * the order asked.  `fn` must not wait for a stream.  Called on the
 * thread that enqueues on `stream`.  On failure (`what` names the step in
 * the message) `fn` will not run. */
int hcb__cuda_after(const hcb__cuda *api, void *stream, int ordinal,
                    hcb__cuda_host_fn fn, void *data, const char *what,
                    hcb_error *err);

/* Tests, between stand-ins: runs what was asked, then ends the lander
 * threads (the next hcb__cuda_after starts its device's again).  Call it
 * while no CUDA handler runs. */
void hcb__cuda_landing_stop(void);

/* ---- pinned.c: the pools of pinned host memory -------------------------
 *
 * One per CUDA device (ordinals 0 to HCB__PINNED_DEVICES - 1), each one
 * slab of pinned memory (HCB__PINNED_BYTES), pinned at the device's first
 * use, from which records and call staging are carved.  A caller marks
 * what it took "delivered" once the consumer is done with it (a record
 * kept by the user longer still holds its bytes, and nothing else). */

#define HCB__PINNED_BYTES   ((size_t)256 << 20)
#define HCB__PINNED_DEVICES 256

/* `n` bytes of pinned memory of device `ordinal`'s pool, aligned to 64.
 * With `may_wait`, waits while the pool has no room and something taken
 * from it is still on its way (a copy in flight, a record not yet
 * delivered): that is the device's back-pressure; after STALL_WARN_NS of
 * it, `rt`'s warning thread says so (NULL `rt`: no warning).  NULL with
 * HCB_OK in `err->code` when waiting cannot help or is not allowed: `n` is
 * over half the pool, what holds the pool is all kept by users, the pool
 * could not be pinned (`rt` warns once), or `may_wait` is false; the
 * caller then stages through smaller blocks, or uses memory of its own.
 * NULL with an error when the pool cannot be made, or (HCB_ECALLBACK) when
 * `rt`'s interrupt check stopped the wait (hcb_runtime_set_interrupt). */
void *hcb__pinned_take(const hcb__cuda *api, hcb_runtime *rt, int ordinal,
                       size_t n, bool may_wait, hcb_error *err);

/* The pool's size, 0 before the device's first use. */
size_t hcb__pinned_capacity(int ordinal);

/* Gives back what hcb__pinned_take returned (any thread, no CUDA call). */
void hcb__pinned_give(void *p);

/* `p` (from hcb__pinned_take) is no longer on its way: waiting for the
 * pool no longer waits for it.  Once per block; hcb__pinned_give implies
 * it. */
void hcb__pinned_delivered(void *p);

/* Counts a tap of device `ordinal` that waited for its stream because its
 * pool was held (platform_cuda.c). */
void hcb__pinned_note_sync(int ordinal);

/* The pools' size from now on (0: the default): HCB_ESTATE, changing
 * nothing, while some of any is in use (hcb_cuda_set_pinned_bytes); the
 * counters start again.  And for tests and stats, what one holds (false:
 * the device has no pool). */
#define HCB__PINNED_MIN_BYTES ((size_t)4 << 20)
int hcb__pinned_configure(size_t bytes);
typedef struct hcb__pinned_stats {
    size_t capacity, used, blocks, on_the_way, on_the_way_bytes, free_blocks;
    uint64_t waits, refusals, syncs, pin_failures;
} hcb__pinned_stats;
bool hcb__pinned_get_stats(int ordinal, hcb__pinned_stats *out);

#endif /* HCB_FFI_CUDA_H */
