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

#endif /* HCB_RUNTIME_H */
