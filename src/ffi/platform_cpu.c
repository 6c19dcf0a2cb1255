/*
 * platform_cpu.c - the CPU platform: XLA's CPU buffers are host memory, so
 * a record is filled with memcpy and submitted (or delivered) at once, and
 * a call target reads and writes XLA's buffers themselves.  And the
 * handlers libhcb exports for platform "cpu" (include/hcb/ffi_handlers.h),
 * over the bodies in handlers.h, compiled here.
 */
#include <string.h>

#include "ffi/handlers.h"
#include "runtime/record.h"
#include "runtime/runtime.h"

/* The only CPU device's ordinal when the runtime knows there is one
 * (hcb_runtime_set_only_cpu_device: it saves asking XLA), else XLA's. */
static inline int
cpu_device(hcb_runtime *rt, const XLA_FFI_CallFrame *frame, hcb_device *out,
           hcb_error *err)
{
    int32_t ordinal = hcb__runtime_only_cpu_ordinal(rt);
    int rc;

    if (ordinal < 0 &&
        (rc = hcb_ffi_device_ordinal(frame, &ordinal, err)) != HCB_OK)
        return rc;
    *out = HCB_DEVICE(HCB_PLATFORM_CPU, ordinal);
    return HCB_OK;
}

static int
cpu_copy_on_device(const XLA_FFI_CallFrame *frame, void *dst, const void *src,
                   size_t nbytes, hcb_error *err)
{
    (void)frame;
    (void)err;
    if (nbytes > 0)
        memcpy(dst, src, nbytes);
    return HCB_OK;
}

/* A record of the host arrays `src` for tap `id` (the one copy of a tap's
 * bytes). */
static inline int
cpu_fetch(hcb_runtime *rt, const XLA_FFI_CallFrame *frame, uint64_t id,
          hcb_device device, const hcb_array *src, size_t n, hcb_record **out,
          hcb_error *err)
{
    size_t i;
    int rc;

    (void)rt;
    (void)frame;
    if ((rc = hcb__record_alloc(id, device, src, n, out, err)) != HCB_OK)
        return rc;
    for (i = 0; i < n; i++)
        if (src[i].nbytes > 0)
            memcpy((*out)->args[i].data, src[i].data, src[i].nbytes);
    return HCB_OK;
}

static inline int
cpu_send(hcb_runtime *rt, const XLA_FFI_CallFrame *frame, uint64_t id,
         hcb_device device, const hcb_array *src, size_t n, hcb_error *err)
{
    hcb_record *rec;
    int rc;

    if ((rc = cpu_fetch(rt, frame, id, device, src, n, &rec, err)) != HCB_OK)
        return rc;
    return hcb_runtime_submit(rt, rec, err);
}

static inline int
cpu_call(hcb_runtime *rt, const XLA_FFI_CallFrame *frame, uint64_t id,
         hcb_device device, const hcb_share *share, const hcb_array *args,
         size_t nargs, const hcb_array *results, size_t nresults,
         hcb_error *err)
{
    (void)frame;
    if (share != NULL)
        return hcb_runtime_call_shared(rt, share, id, device, args, nargs,
                                       results, nresults, err);
    return hcb_runtime_call(rt, id, device, args, nargs, results, nresults,
                            err);
}

const hcb__platform hcb__platform_cpu = {
    cpu_device, cpu_copy_on_device, cpu_send, cpu_call, cpu_fetch, true};

/* ---- the exported CPU handlers ------------------------------------------ */

static const hcb__handler cpu = {&hcb__platform_cpu, NULL};

HCB_FFI_HANDLER_CTX(hcb_ffi_ordinal_handler, "hcb_device_ordinal",
                    hcb__ordinal_body, &cpu, 0)

XLA_FFI_Error *
hcb_ffi_tap(XLA_FFI_CallFrame *frame)
{
    return hcb__run_as_is(frame, "hcb_tap", hcb__tap_body, (void *)&cpu);
}

XLA_FFI_Error *
hcb_ffi_call(XLA_FFI_CallFrame *frame)
{
    return hcb__run_as_is(frame, "hcb_call", hcb__call_body, (void *)&cpu);
}

XLA_FFI_Error *
hcb_ffi_buffer_call(XLA_FFI_CallFrame *frame)
{
    return hcb__run_as_is(frame, "hcb_buffer_call", hcb__call_body,
                          (void *)&cpu);
}

XLA_FFI_Error *
hcb_ffi_sharded_check(XLA_FFI_CallFrame *frame)
{
    return hcb__run_as_is(frame, "hcb_sharded_check", hcb__sharded_check_body,
                          (void *)&cpu);
}
