/*
 * platform.h - the seam between what a handler does and where the bytes
 * are.
 *
 * handlers.h decodes XLA's call frame, builds records, submits them and
 * runs calls the same way on every platform.  What differs by platform is
 * where the operands live and how their bytes reach the host: an
 * hcb__platform answers that.  platform_cpu.c is the CPU's (host memory:
 * a memcpy, or nothing at all) and defines the handlers libhcb exports for
 * platform "cpu"; platform_cuda.c is CUDA's (copies enqueued on XLA's
 * stream into pinned host memory, pinned.c) and defines those for "CUDA".
 */
#ifndef HCB_PLATFORM_H
#define HCB_PLATFORM_H

#include "hcb/ffi.h"

typedef struct hcb__platform {
    /* The device key of the device running `frame`. */
    int (*device)(hcb_runtime *rt, const XLA_FFI_CallFrame *frame,
                  hcb_device *out, hcb_error *err);
    /* Copies `nbytes` between two buffers of that device (a result XLA did
     * not alias to its operand). */
    int (*copy_on_device)(const XLA_FFI_CallFrame *frame, void *dst,
                          const void *src, size_t nbytes, hcb_error *err);
    /* Makes a record of the device arrays `src` for tap `id` and submits
     * it to `rt`.  The CPU copies and submits before it returns; CUDA
     * enqueues the copies on the stream and submits once they have
     * landed. */
    int (*send)(hcb_runtime *rt, const XLA_FFI_CallFrame *frame, uint64_t id,
                hcb_device device, const hcb_array *src, size_t n,
                hcb_error *err);
    /* Runs the call target `id` (hcb_runtime_call) over the device arrays
     * `args` and `results`: the target reads and writes host memory, so a
     * platform with device memory stages them, in order on its stream.
     * With `share` (jit over sharded operands) the call is made by every
     * device of the computation and run by one (hcb_runtime_call_shared):
     * the others need no operands, only the results. */
    int (*call)(hcb_runtime *rt, const XLA_FFI_CallFrame *frame, uint64_t id,
                hcb_device device, const hcb_share *share,
                const hcb_array *args, size_t nargs, const hcb_array *results,
                size_t nresults, hcb_error *err);
    /* Makes a record of the device arrays `src` for tap `id` in host
     * memory, whole when it returns (*out: owned by the caller), for a tap
     * delivered now (hcb_runtime_deliver): the CPU copies; CUDA copies on
     * the stream and waits for it here, on XLA's thread (never in a host
     * function). */
    int (*fetch)(hcb_runtime *rt, const XLA_FFI_CallFrame *frame, uint64_t id,
                 hcb_device device, const hcb_array *src, size_t n,
                 hcb_record **out, hcb_error *err);
    /* Whether, under jit over sharded operands, every device of the
     * computation holds the whole operands where the function reads them,
     * so the first device to reach a shared call may run it for the runner
     * (hcb_share.first_runs): the CPU's, in host memory.  CUDA's are on
     * each device, and only the runner copies them to the host. */
    bool first_runs;
} hcb__platform;

extern const hcb__platform hcb__platform_cpu;
extern const hcb__platform hcb__platform_cuda;
/* CUDA for "hcb_buffer_call": the call target works on the device buffers
 * themselves, on XLA's stream (hcb_call_stream). */
extern const hcb__platform hcb__platform_cuda_in_place;

/* The context of a handler (HCB_FFI_HANDLER_CTX): its platform, and the
 * runtime it submits to (NULL: hcb_runtime_default(); tests use their
 * own). */
typedef struct hcb__handler {
    const hcb__platform *platform;
    hcb_runtime *rt;
} hcb__handler;

#endif /* HCB_PLATFORM_H */
