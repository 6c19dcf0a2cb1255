/*
 * ffi_handlers.h - the XLA FFI handlers libhcb exports: the custom calls
 * host_callback lowers to ("hcb_tap", "hcb_call", "hcb_buffer_call", ...), for
 * platform "cpu" and for "CUDA".  Register them with
 * jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(fn), platform=...);
 * the Python package does (host_callback/_handlers.py).  Included by
 * hcb/ffi.h.
 *
 * Compiles as C11 and as C++.
 */
#ifndef HCB_FFI_HANDLERS_H
#define HCB_FFI_HANDLERS_H

#include "hcb/hcb.h"
#include "xla/ffi/api/c_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "hcb_tap": operands are the tapped arrays followed by pass-through arrays
 * and an optional order token; results alias the operands one-to-one
 * (input_output_aliases {i: i}), or are the order token alone.
 * Attributes: callback_id (u64, from hcb_runtime_register_tap on the
 * default runtime) and ntapped (s64, how many leading operands to send).
 * Copies the tapped operands into one record and submits it to the default
 * runtime; returns without waiting for the tap function.  With the optional
 * attribute deliver (s64) 1 or 2 it delivers the record now instead, in
 * the calling thread (hcb_runtime_deliver): the computation goes on once
 * the tap function has returned; with 1 its failure fails the computation
 * (HCB_DELIVER_FAIL), with 2 it is only recorded (HCB_DELIVER_KEEP_ERROR).
 * 0, or no such attribute: queued. */
HCB_API XLA_FFI_Error *hcb_ffi_tap(XLA_FFI_CallFrame *frame);

/* "hcb_call": operands are the arguments, results the declared outputs (no
 * aliasing).  Attribute: callback_id (u64, from hcb_runtime_register_call on
 * the default runtime).  Runs the call target in the calling thread after
 * the device's earlier taps were delivered; the target fills the results.
 * A failing target fails the computation with its message. */
HCB_API XLA_FFI_Error *hcb_ffi_call(XLA_FFI_CallFrame *frame);

/* "hcb_device_ordinal": no operands, one s32[] result that receives the
 * ordinal of the device running it (on CPU: jax.Device.id). */
HCB_API XLA_FFI_Error *hcb_ffi_ordinal_handler(XLA_FFI_CallFrame *frame);

/* "hcb_sharded_check": results alias the leading operands; attribute
 * callback_id (u64).  Raises the failure a call under jit over sharded
 * operands parked for every device of this process (see
 * src/runtime/runtime.h), else passes its operands through.  With one more
 * operand, the call's s32[] flag `failed` spread with its results (the
 * devices of several processes), it raises only when the flag is set: 1
 * (failed, parked in the runner's process): the parked failure, or, where
 * none is parked, string attribute `elsewhere`; 2 (failed, not parked):
 * string attribute `unkept`. */
HCB_API XLA_FFI_Error *hcb_ffi_sharded_check(XLA_FFI_CallFrame *frame);

/* "hcb_buffer_call": as "hcb_call", for call targets that work in place on
 * the device's own buffers (buffer_callback, native_call).  On CPU it is
 * the same handler as "hcb_call"; on CUDA the target gets device pointers
 * and, from hcb_call_stream(), XLA's stream, where "hcb_call" copies the
 * operands to the host and the results back. */
HCB_API XLA_FFI_Error *hcb_ffi_buffer_call(XLA_FFI_CallFrame *frame);

/* The same handlers for platform "CUDA": register them with
 * jax.ffi.register_ffi_target(name, ..., platform="CUDA").  They find the
 * CUDA runtime at their first call (hcb_cuda_load); a CPU-only process
 * never loads it.
 *
 * "hcb_tap" enqueues, on XLA's stream, the copy of the tapped operands into
 * pinned host memory and an event after it, for which a thread of libhcb's
 * waits before it submits the record, and returns without waiting for the
 * stream (which never waits for the host); one with
 * attribute deliver copies the operands to host memory, waits for that
 * copy on XLA's thread (a call's one synchronisation) and delivers the
 * record there.  "hcb_call"
 * copies the operands to pinned host memory, waits for that copy (the one
 * synchronisation of a call), runs the target on the host copies, and
 * enqueues the copy of the results back to the device.  "hcb_buffer_call"
 * runs the target on the device buffers, with hcb_call_stream() set. */
HCB_API XLA_FFI_Error *hcb_ffi_tap_cuda(XLA_FFI_CallFrame *frame);
HCB_API XLA_FFI_Error *hcb_ffi_call_cuda(XLA_FFI_CallFrame *frame);
HCB_API XLA_FFI_Error *hcb_ffi_buffer_call_cuda(XLA_FFI_CallFrame *frame);
HCB_API XLA_FFI_Error *hcb_ffi_ordinal_handler_cuda(XLA_FFI_CallFrame *frame);
HCB_API XLA_FFI_Error *hcb_ffi_sharded_check_cuda(XLA_FFI_CallFrame *frame);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HCB_FFI_HANDLERS_H */
