/*
 * fake_cuda.h - a stand-in for the CUDA runtime's function table (ffi/cuda.h)
 * for the CUDA platform's tests: a "stream" is a thread that runs what is
 * enqueued on it in order (copies are memcpy, asynchronously), "device
 * memory" is host memory, pinned memory is aligned malloc, and an event is
 * a point in a stream that another stream's thread, or a host thread
 * (event_synchronize), waits for.  Only the driver is replaced: the handlers,
 * the pinned pool and the runtime under test are the real ones.
 */
#ifndef HCB_TEST_FAKE_CUDA_H
#define HCB_TEST_FAKE_CUDA_H

#include <stdatomic.h>
#include <stdbool.h>

#include "ffi/cuda.h"

typedef struct fake_stream fake_stream;

/* A stream of device 0, or of device `device`. */
fake_stream *fake_stream_new(void);
fake_stream *fake_stream_new_on(int device);
/* Runs what is left, then stops the stream's thread. */
void fake_stream_free(fake_stream *s);
/* While held, the stream runs nothing (work queues up), as a GPU busy with
 * a long kernel. */
void fake_stream_hold(fake_stream *s, bool hold);
/* Waits until the stream has run everything enqueued (the test's own
 * wait: not counted as a synchronisation). */
void fake_stream_drain(fake_stream *s);

/* Whether the stream has run everything enqueued on it (nothing stuck)
 * within `ms` milliseconds: the test's own look, not a synchronisation. */
bool fake_stream_idle_within(fake_stream *s, long ms);

typedef struct fake_counts {
    atomic_long copies, memsets, syncs, host_allocs, free_hosts;
    atomic_long events, event_records, event_waits, set_devices;
} fake_counts;

extern const hcb__cuda fake_cuda;
extern fake_counts fake_cuda_counts;
/* The k-th memcpy_async / event_record from now fails with
 * cudaErrorLaunchFailure (719); -1: none fails. */
extern atomic_long fake_cuda_fail_copy_after, fake_cuda_fail_record_after;
/* While true, cudaHostAlloc refuses (cudaErrorMemoryAllocation), as under
 * a memory-lock limit. */
extern atomic_bool fake_cuda_refuse_host_alloc;

void fake_cuda_reset_counts(void);

#endif
