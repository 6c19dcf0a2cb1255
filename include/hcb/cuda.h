/*
 * cuda.h - libhcb on NVIDIA GPUs, for C code that works with the CUDA
 * handlers (ffi_handlers.h): the CUDA runtime they load, the pinned host
 * memory GPU taps and calls copy into, the stream a buffer call runs on,
 * and ordering another stream after XLA's.  Needs no CUDA header: streams
 * are cudaStream_t values passed as `void *`.  Included by hcb/ffi.h.
 *
 * Compiles as C11 and as C++.
 */
#ifndef HCB_CUDA_H
#define HCB_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "hcb/hcb.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Loads the CUDA runtime (libcudart) the CUDA handlers use: from `path`
 * (a file dlopen understands), or with `path` NULL the one already loaded
 * in the process, else libcudart.so.13 or .so.12 by name.  Once loaded it
 * stays; a later call returns HCB_OK at once.  HCB_ENOTFOUND, naming what
 * was tried, when no CUDA runtime can be loaded. */
HCB_API int hcb_cuda_load(const char *path, hcb_error *err);

/* Sets the size of the pinned host memory pool that GPU taps and calls
 * copy into, per device (default 256 MiB), before the first GPU callback
 * takes it, or while none of any is in use.  HCB_EINVAL under 4 MiB,
 * HCB_ESTATE while a pool is in use. */
HCB_API int hcb_cuda_set_pinned_bytes(size_t bytes, hcb_error *err);

/* During a call target that the CUDA handler "hcb_buffer_call" runs: the
 * cudaStream_t XLA computes on (enqueue the work there).  NULL anywhere
 * else: on CPU, in a tap, outside a call. */
HCB_API void *hcb_call_stream(void);

/* Makes the work enqueued on CUDA stream `waiter` from now on wait for the
 * work enqueued on `stream` so far, without waiting on the host (an event
 * recorded on `stream`, waited for on `waiter`).  `stream` is a stream of
 * CUDA device `ordinal` (in a buffer call: the `device`'s ordinal the
 * target was given); `waiter` may be of any device.  Streams are
 * cudaStream_t values; (void *)1 and (void *)2 are CUDA's legacy and
 * per-thread default streams of device `ordinal`.  The calling thread's
 * current device is switched to `ordinal` for the call and back after, so
 * a caller that switched devices needs no care.  Nothing to do when the
 * streams are the same.  Any thread, but not a CUDA host function (which
 * must not call CUDA).  HCB_ENOTFOUND without a CUDA runtime; HCB_ESYSTEM,
 * with CUDA's message, when CUDA fails. */
HCB_API int hcb_cuda_stream_wait(int32_t ordinal, void *waiter, void *stream,
                                 hcb_error *err);

/* What the pinned pool of one CUDA device has done (each device has its
 * own, of hcb_cuda_set_pinned_bytes bytes, taken at its first GPU
 * callback).  Bytes "in flight" are those of records on their way (copies
 * not landed, records queued or being delivered) and of calls' staging;
 * "kept" ones are held by records a tap function kept (a numpy array it
 * saved), which the pool works around.  `waits` counts takes that waited
 * for room (the device's back-pressure), `refusals` takes that found none
 * and could not wait, and `syncs` taps and calls that waited for the
 * stream because of that.  `pin_failures` counts the times the pool could
 * not be pinned (cudaHostAlloc refused, as under a memory-lock limit):
 * then every take is refused, the device's taps and calls copy through
 * ordinary memory (each a sync), until the pool's size is set again. */
typedef struct hcb_cuda_pool_stats {
    size_t struct_size;
    uint64_t capacity; /* pinned bytes; 0 until pinned */
    uint64_t used_bytes;
    uint64_t in_flight_bytes;
    uint64_t kept_bytes;
    uint64_t waits;
    uint64_t refusals;
    uint64_t syncs;
    uint64_t pin_failures;
} hcb_cuda_pool_stats;

#define HCB_CUDA_POOL_STATS_INIT                                               \
    {                                                                          \
        sizeof(hcb_cuda_pool_stats), 0, 0, 0, 0, 0, 0, 0, 0                    \
    }

/* Fills `stats` (its struct_size set by the caller) for CUDA device
 * `ordinal`.  HCB_ENOTFOUND when the device has no pool (no GPU callback
 * has run there); HCB_EINVAL without struct_size.  Any thread. */
HCB_API int hcb_cuda_get_pool_stats(int32_t ordinal, hcb_cuda_pool_stats *stats,
                                    hcb_error *err);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HCB_CUDA_H */
