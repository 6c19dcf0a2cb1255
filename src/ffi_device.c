/*
 * ffi_device.c - the "hcb_device_ordinal" XLA FFI handler: writes the
 * ordinal of the device running it into its one s32 result.
 *
 * Used where a callback cannot be our own custom call (under jit over
 * sharded operands the callback goes through JAX's Python callback, which
 * does not say which device runs it): every device computes its own
 * ordinal, and the device that runs the callback hands its own to it.
 *
 * And the "hcb_sharded_check" handler: on every device, after the results
 * of such a call were spread, it raises the call's failure if one was
 * parked (runtime.h, hcb__sharded_fail), so that all devices fail together
 * instead of some waiting forever in a collective.  Its results alias its
 * operands.
 */

#include "runtime.h"

XLA_FFI_Error *
hcb_ffi_ordinal_handler(XLA_FFI_CallFrame *frame)
{
    hcb_array out = {HCB_INVALID, 0, NULL, NULL, 0};
    XLA_FFI_Error *xe;
    int32_t ordinal = 0;
    hcb_error err;

    if (hcb_ffi_answer_probe(frame, 0))
        return NULL;
    if ((xe = hcb_ffi_check_stage(frame, XLA_FFI_ExecutionStage_EXECUTE,
                                  "hcb_device_ordinal")) != NULL)
        return xe;
    if (hcb_ffi_check_counts(frame, -1, 1, &err) != HCB_OK ||
        hcb_ffi_result(frame, 0, HCB_S32, 0, &out, &err) != HCB_OK ||
        hcb_ffi_device_ordinal(frame, &ordinal, &err) != HCB_OK)
        return hcb_ffi_error(frame, err.code, "hcb_device_ordinal: %s",
                             err.message);
    *(int32_t *)out.data = ordinal;
    return NULL;
}

XLA_FFI_Error *
hcb_ffi_sharded_check(XLA_FFI_CallFrame *frame)
{
    hcb_runtime *rt;
    uint64_t id = 0;
    hcb_error err;

    if (hcb_ffi_answer_probe(frame, 0))
        return NULL;
    rt = hcb_runtime_default();
    if (rt == NULL)
        return hcb_ffi_error(frame, HCB_ENOMEM,
                             "hcb_sharded_check: no runtime");
    if (hcb_ffi_attr_u64(&frame->attrs, "callback_id", &id, &err) != HCB_OK)
        return hcb_ffi_error(frame, err.code, "hcb_sharded_check: %s",
                             err.message);
    if (hcb__sharded_take(rt, id, &err))
        return hcb_ffi_error_from(frame, &err);
    return hcb__ffi_forward_operands(frame, "hcb_sharded_check");
}
