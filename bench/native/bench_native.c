/*
 * bench_native.c - the C pieces of the benchmark harness (bench/run.py).
 *
 * Built by the harness (bench/hcb_bench/native.py) against the installed
 * host_callback package (`python -m host_callback --cflags --libs`) into a
 * temporary directory.
 *
 *   hcb_bench_empty      XLA FFI handler that does nothing: the floor.  Used
 *                        like a tap: one operand, the result aliased to it
 *                        (input_output_aliases {0: 0}), has_side_effect.
 *   hcb_bench_copy       XLA FFI handler that copies its operand into its
 *                        result (not aliased): the shape of a native call.
 *   hcb_bench_copy_attr, hcb_bench_copy_attr_ordinal
 *                        the same, also reading a u64 attribute by name
 *                        (callback_id), and the device ordinal: what the
 *                        hcb_tap and hcb_call handlers ask XLA on every call.
 *   hcb_bench_noop_tap   an hcb_tap_fn that counts the records it receives.
 *   hcb_bench_copy_call  an hcb_call_fn that copies args[0] into results[0].
 *   hcb_bench_memcpy_seconds, hcb_bench_fresh_memcpy_seconds
 *                        the reference bandwidths: memcpy into a warm buffer,
 *                        and malloc + memcpy + free (what a tap does).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hcb/ffi.h"
#include "hcb/hcb.h"

#if defined(__GNUC__) || defined(__clang__)
#define BENCH_API __attribute__((visibility("default")))
/* Makes the compiler assume `p`'s memory is read, so copies are kept. */
#define BENCH_ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")
#else
#define BENCH_API
#define BENCH_ESCAPE(p) ((void)(p))
#endif

/* ---- FFI handlers ------------------------------------------------------- */

static int
empty_body(XLA_FFI_CallFrame *frame, hcb_error *err)
{
    (void)frame, (void)err;
    return HCB_OK;
}
HCB_FFI_HANDLER(hcb_bench_empty, empty_body, 0)

static int
copy_body(XLA_FFI_CallFrame *frame, hcb_error *err)
{
    hcb_array in, out;
    int rc;

    if ((rc = hcb_ffi_arg(frame, 0, HCB_ANY_DTYPE, HCB_ANY_RANK, &in, err)) !=
            HCB_OK ||
        (rc = hcb_ffi_result(frame, 0, in.dtype, HCB_ANY_RANK, &out, err)) !=
            HCB_OK)
        return rc;
    if (in.nbytes != out.nbytes)
        return hcb_error_set(err, HCB_EINVAL,
                             "operand has %zu bytes, result %zu", in.nbytes,
                             out.nbytes);
    if (in.nbytes > 0)
        memcpy(out.data, in.data, in.nbytes);
    return HCB_OK;
}
HCB_FFI_HANDLER(hcb_bench_copy, copy_body, 0)

static int
copy_attr_body(XLA_FFI_CallFrame *frame, hcb_error *err)
{
    uint64_t id;
    int rc;

    if ((rc = hcb_ffi_attr_u64(&frame->attrs, "callback_id", &id, err)) !=
        HCB_OK)
        return rc;
    return copy_body(frame, err);
}
HCB_FFI_HANDLER(hcb_bench_copy_attr, copy_attr_body, 0)

static int
copy_attr_ordinal_body(XLA_FFI_CallFrame *frame, hcb_error *err)
{
    int32_t ordinal;
    int rc;

    if ((rc = hcb_ffi_device_ordinal(frame, &ordinal, err)) != HCB_OK)
        return rc;
    return copy_attr_body(frame, err);
}
HCB_FFI_HANDLER(hcb_bench_copy_attr_ordinal, copy_attr_ordinal_body, 0)

/* ---- native callbacks --------------------------------------------------- */

static atomic_ullong taps_received;

BENCH_API int
hcb_bench_noop_tap(void *user, hcb_record *rec, hcb_error *err)
{
    (void)user, (void)rec, (void)err;
    atomic_fetch_add_explicit(&taps_received, 1, memory_order_relaxed);
    return 0;
}

/* How many records hcb_bench_noop_tap has received so far. */
BENCH_API unsigned long long
hcb_bench_tap_count(void)
{
    return atomic_load(&taps_received);
}

BENCH_API int
hcb_bench_copy_call(void *user, hcb_device device, const hcb_array *args,
                    size_t nargs, const hcb_array *results, size_t nresults,
                    hcb_error *err)
{
    (void)user, (void)device;
    if (nargs != 1 || nresults != 1 || args[0].nbytes != results[0].nbytes)
        return hcb_error_set(err, HCB_EINVAL,
                             "hcb_bench_copy_call: expected one argument and "
                             "one result of the same size");
    if (args[0].nbytes > 0)
        memcpy(results[0].data, args[0].data, args[0].nbytes);
    return 0;
}

/* ---- memcpy references -------------------------------------------------- */

static double
now_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds for `iters` memcpy of `n` bytes from `src` into `dst` (buffers the
 * caller allocated and touched). */
BENCH_API double
hcb_bench_memcpy_seconds(void *dst, const void *src, size_t n, size_t iters)
{
    double start = now_seconds();
    size_t i;

    for (i = 0; i < iters; i++) {
        memcpy(dst, src, n);
        BENCH_ESCAPE(dst);
    }
    return now_seconds() - start;
}

/* Seconds for `iters` rounds of malloc(n), memcpy from `src`, free: one
 * copy into fresh memory, what a tap does with its payload.  Negative if
 * malloc fails. */
BENCH_API double
hcb_bench_fresh_memcpy_seconds(const void *src, size_t n, size_t iters)
{
    double start = now_seconds();
    size_t i;

    for (i = 0; i < iters; i++) {
        void *dst = malloc(n > 0 ? n : 1);

        if (dst == NULL)
            return -1.0;
        memcpy(dst, src, n);
        BENCH_ESCAPE(dst);
        free(dst);
    }
    return now_seconds() - start;
}
