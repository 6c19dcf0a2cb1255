/*
 * runtime.h - internal interface between the runtime and the FFI handlers.
 */
#ifndef HCB_RUNTIME_H
#define HCB_RUNTIME_H

#include "hcb/ffi.h"

/* The body of hcb_ffi_tap, on an explicit runtime (tests use their own). */
XLA_FFI_Error *hcb__ffi_tap_execute(hcb_runtime *rt, XLA_FFI_CallFrame *frame);
/* The body of hcb_ffi_call, likewise. */
XLA_FFI_Error *hcb__ffi_call_execute(hcb_runtime *rt, XLA_FFI_CallFrame *frame);

/* The device ordinal of the call: the only CPU device's when the runtime
 * knows there is one (hcb_runtime_set_only_cpu_device), else XLA's. */
int hcb__ffi_ordinal(hcb_runtime *rt, const XLA_FFI_CallFrame *frame,
                     int32_t *ordinal, hcb_error *err);

/* Whether the frame's last operand and last result are tokens.  The
 * lowering gives every ordered callback (taps, prints, calls) a token
 * operand and a token result: a chain of them keeps XLA from reordering
 * the callbacks of one program (python/host_callback/_order.py).  They
 * carry no data; handlers skip them. */
static inline int64_t
hcb__ffi_order_tokens(const XLA_FFI_CallFrame *frame)
{
    int64_t na = frame->args.size, nr = frame->rets.size;

    return na > 0 && nr > 0 &&
           frame->args.types[na - 1] == XLA_FFI_ArgType_BUFFER &&
           frame->rets.types[nr - 1] == XLA_FFI_RetType_BUFFER &&
           ((const XLA_FFI_Buffer *)frame->args.args[na - 1])->dtype ==
               XLA_FFI_DataType_TOKEN &&
           ((const XLA_FFI_Buffer *)frame->rets.rets[nr - 1])->dtype ==
               XLA_FFI_DataType_TOKEN;
}

/* Makes sure each result holds its operand, for handlers whose results
 * alias their operands (the first min(args, rets), order tokens aside).  XLA
 * honours the aliasing the lowering requests, so this is normally a pointer
 * comparison; a copy is made only if a runtime ever hands us distinct
 * buffers. */
XLA_FFI_Error *hcb__ffi_forward_operands(XLA_FFI_CallFrame *frame,
                                         const char *handler);

/* Calls under jit over sharded operands run on one device, and every
 * device continues into the collectives that spread the result: a failure
 * raised on that one device alone would leave the others waiting forever.
 * Instead the failure is parked here and raised by every device, after the
 * collective, by the "hcb_sharded_check" handler (ffi_device.c). */
#define HCB__SHARDED_SLOTS 32
/* Parks `error` for call `id` until `ndevices` devices have taken it;
 * HCB_ESTATE when every slot is busy. */
int hcb__sharded_fail(hcb_runtime *rt, uint64_t id, int64_t ndevices,
                      const hcb_error *error);
/* Takes (a copy of) the failure parked for `id`, if any. */
bool hcb__sharded_take(hcb_runtime *rt, uint64_t id, hcb_error *error);

/* Runs a handler body on the default runtime (the exported handlers). */
static inline XLA_FFI_Error *
hcb__ffi_on_default_runtime(XLA_FFI_CallFrame *frame, const char *handler,
                            XLA_FFI_Error *(*body)(hcb_runtime *,
                                                   XLA_FFI_CallFrame *))
{
    hcb_runtime *rt;

    if (hcb_ffi_answer_probe(frame, 0))
        return NULL;
    rt = hcb_runtime_default();
    if (rt == NULL)
        return hcb_ffi_error(frame, HCB_ENOMEM,
                             "%s: cannot create the host-callback runtime",
                             handler);
    return body(rt, frame);
}

#endif /* HCB_RUNTIME_H */
