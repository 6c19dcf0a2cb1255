/*
 * ffi_call.c - the "hcb_call" XLA FFI handler: where a synchronous call
 * enters libhcb.
 *
 * XLA calls it on the thread running the computation, which waits for it.
 * It views the operands and the result buffers as hcb_arrays (no copy) and
 * runs the call target in this thread (hcb_runtime_call, runtime.c); the
 * target fills the result buffers.  A failure becomes the XLA error the
 * computation fails with.
 */
#include "common.h"
#include "runtime.h"

#define STACK_ARRAYS 16

XLA_FFI_Error *
hcb__ffi_call_execute(hcb_runtime *rt, XLA_FFI_CallFrame *frame)
{
    hcb_array stack_views[STACK_ARRAYS], *views = stack_views;
    int64_t tokens = hcb__ffi_order_tokens(frame);
    int64_t nargs = frame->args.size - tokens, i;
    int64_t nrets = frame->rets.size - tokens;
    XLA_FFI_Error *xe;
    uint64_t id = 0;
    int32_t ordinal = 0;
    hcb_error err;

    if (hcb_ffi_answer_probe(frame, 0))
        return NULL;
    if ((xe = hcb_ffi_check_stage(frame, XLA_FFI_ExecutionStage_EXECUTE,
                                  "hcb_call")) != NULL)
        return xe;
    if (hcb_ffi_attr_u64(&frame->attrs, "callback_id", &id, &err) != HCB_OK ||
        hcb__ffi_ordinal(rt, frame, &ordinal, &err) != HCB_OK)
        return hcb_ffi_error(frame, err.code, "hcb_call: %s", err.message);

    if (nargs + nrets > STACK_ARRAYS) {
        views = hcb__calloc((size_t)(nargs + nrets), sizeof *views);
        if (views == NULL)
            return hcb_ffi_error(frame, HCB_ENOMEM,
                                 "hcb_call: cannot allocate %lld array views",
                                 (long long)(nargs + nrets));
    }
    xe = NULL;
    for (i = 0; i < nargs + nrets && xe == NULL; i++) {
        if ((i < nargs
                 ? hcb_ffi_arg(frame, i, HCB_ANY_DTYPE, HCB_ANY_RANK, &views[i],
                               &err)
                 : hcb_ffi_result(frame, i - nargs, HCB_ANY_DTYPE, HCB_ANY_RANK,
                                  &views[i], &err)) != HCB_OK)
            xe = hcb_ffi_error(frame, err.code, "hcb_call: %s", err.message);
    }
    if (xe == NULL &&
        hcb_runtime_call(rt, id, HCB_DEVICE(HCB_PLATFORM_CPU, ordinal), views,
                         (size_t)nargs, views + nargs, (size_t)nrets,
                         &err) != HCB_OK)
        xe = hcb_ffi_error_from(frame, &err);
    if (views != stack_views)
        hcb__free(views);
    return xe;
}

XLA_FFI_Error *
hcb_ffi_call(XLA_FFI_CallFrame *frame)
{
    return hcb__ffi_on_default_runtime(frame, "hcb_call",
                                       hcb__ffi_call_execute);
}
