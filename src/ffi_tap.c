/*
 * ffi_tap.c - the "hcb_tap" XLA FFI handler: where a tap enters libhcb.
 *
 * XLA calls it on the thread running the computation.  It copies the tapped
 * operands into one record (the only copy of the data), submits the record
 * to the device's queue (runtime.c) and returns; the tap function runs later
 * on the device's consumer thread.  The results alias the operands, so the
 * computation continues with the same buffers and nothing else is copied.
 */
#include <string.h>

#include "record.h"
#include "runtime.h"

#define STACK_ARGS 16

XLA_FFI_Error *
hcb__ffi_forward_operands(XLA_FFI_CallFrame *frame, const char *handler)
{
    int64_t n = frame->args.size < frame->rets.size ? frame->args.size
                                                    : frame->rets.size;
    int64_t i;

    n -= hcb__ffi_order_tokens(frame);
    for (i = 0; i < n; i++) {
        const XLA_FFI_Buffer *in = (const XLA_FFI_Buffer *)frame->args.args[i];
        XLA_FFI_Buffer *out = (XLA_FFI_Buffer *)frame->rets.rets[i];
        hcb_array view = {HCB_INVALID, 0, NULL, NULL, 0};
        hcb_error err;

        if (in->data == out->data)
            continue;
        if (hcb_ffi_buffer_view(in, &view, &err) != HCB_OK)
            return hcb_ffi_error(frame, err.code, "%s: operand %lld: %s",
                                 handler, (long long)i, err.message);
        if (view.nbytes > 0)
            memcpy(out->data, in->data, view.nbytes);
    }
    return NULL;
}

static XLA_FFI_Error *
check_frame(XLA_FFI_CallFrame *frame, int64_t ntapped)
{
    int64_t i, n = frame->args.size - hcb__ffi_order_tokens(frame);

    if (frame->args.size != frame->rets.size)
        return hcb_ffi_error(frame, HCB_EINVAL,
                             "hcb_tap: %lld operands but %lld results; each "
                             "result must alias its operand",
                             (long long)frame->args.size,
                             (long long)frame->rets.size);
    if (ntapped < 0 || ntapped > n)
        return hcb_ffi_error(frame, HCB_EINVAL,
                             "hcb_tap: ntapped is %lld, expected 0..%lld",
                             (long long)ntapped, (long long)n);
    for (i = 0; i < frame->args.size; i++) {
        if (frame->args.types[i] != XLA_FFI_ArgType_BUFFER ||
            frame->rets.types[i] != XLA_FFI_RetType_BUFFER)
            return hcb_ffi_error(frame, HCB_EINVAL,
                                 "hcb_tap: operand %lld is not a buffer",
                                 (long long)i);
    }
    return NULL;
}

XLA_FFI_Error *
hcb__ffi_tap_execute(hcb_runtime *rt, XLA_FFI_CallFrame *frame)
{
    hcb_array stack_views[STACK_ARGS], *views = stack_views;
    XLA_FFI_Error *xe;
    hcb_record *rec;
    uint64_t id = 0;
    int64_t ntapped = 0, i;
    int32_t ordinal = 0;
    hcb_error err;

    if (hcb_ffi_answer_probe(frame, 0))
        return NULL;
    if ((xe = hcb_ffi_check_stage(frame, XLA_FFI_ExecutionStage_EXECUTE,
                                  "hcb_tap")) != NULL)
        return xe;
    if (hcb_ffi_attr_u64(&frame->attrs, "callback_id", &id, &err) != HCB_OK ||
        hcb_ffi_attr_i64(&frame->attrs, "ntapped", &ntapped, &err) != HCB_OK ||
        hcb__ffi_ordinal(rt, frame, &ordinal, &err) != HCB_OK)
        return hcb_ffi_error(frame, err.code, "hcb_tap: %s", err.message);
    if ((xe = check_frame(frame, ntapped)) != NULL)
        return xe;
    if ((xe = hcb__ffi_forward_operands(frame, "hcb_tap")) != NULL)
        return xe;

    if (ntapped > STACK_ARGS) {
        views = hcb__calloc((size_t)ntapped, sizeof *views);
        if (views == NULL)
            return hcb_ffi_error(frame, HCB_ENOMEM,
                                 "hcb_tap: cannot allocate %lld array views",
                                 (long long)ntapped);
    }
    for (i = 0; i < ntapped; i++) {
        if (hcb_ffi_buffer_view((const XLA_FFI_Buffer *)frame->args.args[i],
                                &views[i], &err) != HCB_OK) {
            if (views != stack_views)
                hcb__free(views);
            return hcb_ffi_error(frame, err.code, "hcb_tap: operand %lld: %s",
                                 (long long)i, err.message);
        }
    }
    if (hcb_record_create(id, HCB_DEVICE(HCB_PLATFORM_CPU, ordinal), views,
                          (size_t)ntapped, &rec, &err) != HCB_OK) {
        if (views != stack_views)
            hcb__free(views);
        return hcb_ffi_error(frame, err.code, "hcb_tap: %s", err.message);
    }
    if (views != stack_views)
        hcb__free(views);
    if (hcb_runtime_submit(rt, rec, &err) != HCB_OK)
        return hcb_ffi_error(frame, err.code, "hcb_tap: %s", err.message);
    return NULL;
}

XLA_FFI_Error *
hcb_ffi_tap(XLA_FFI_CallFrame *frame)
{
    return hcb__ffi_on_default_runtime(frame, "hcb_tap", hcb__ffi_tap_execute);
}
