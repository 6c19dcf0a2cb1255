/*
 * ffi.h - a small SDK for writing typed XLA FFI handlers in plain C: the
 * header to include.
 *
 * XLA's FFI has a stable C ABI (xla/ffi/api/c_api.h, shipped in jaxlib:
 * `jax.ffi.include_dir()`), but its only convenience layer is C++.  This
 * header is the C one: answering the registration-time metadata probe,
 * checking the stage, typed access to operands and results (dtype and rank
 * checked), attributes of every kind by name with type checks, the device
 * ordinal and stream, and turning hcb_error into XLA errors.  A handler is a
 * body that returns an HCB_E* code, wrapped by HCB_FFI_HANDLER; see
 * examples/c_ffi/ for handlers of every kind.
 *
 * What is where, in the order a handler author needs it:
 *   hcb/ffi.h           writing a handler (HCB_FFI_HANDLER around a body),
 *                       operands and results, errors, device and stream;
 *   hcb/ffi_attrs.h     attributes: the keyword arguments of ffi_call;
 *   hcb/ffi_version.h   the FFI API version the handlers report (any
 *                       supported jaxlib's header will do), the probe;
 *   hcb/ffi_handlers.h  the handlers libhcb exports ("hcb_tap", ...);
 *   hcb/cuda.h          libhcb on GPUs: hcb_call_stream, the pinned pools,
 *                       hcb_cuda_stream_wait.
 * This header includes all of them: `#include "hcb/ffi.h"` is enough.
 *
 * Everything here is `static inline` over these headers, hcb.h and
 * c_api.h; link libhcb for the few hcb_* functions they call
 * (hcb_error_set, hcb_dtype_name, hcb_dtype_bits, hcb_dtype_nbytes).
 * Errors go to an `hcb_error *err` that may be NULL, as everywhere in libhcb.
 *
 * Compiles as C11 and as C++.
 */
#ifndef HCB_FFI_H
#define HCB_FFI_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "hcb/hcb.h"
#include "hcb/ffi_version.h"
#include "xla/ffi/api/c_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Writing a handler                                                        */

/* Defined under "Errors" below. */
static inline XLA_FFI_Error *hcb_ffi_error(const XLA_FFI_CallFrame *frame,
                                           int code, const char *fmt, ...)
    HCB_PRINTF(3, 4);
static inline XLA_FFI_Error *hcb_ffi_check_stage(const XLA_FFI_CallFrame *frame,
                                                 XLA_FFI_ExecutionStage stage,
                                                 const char *handler);

/* A handler body: does the work of one call and returns HCB_OK, or an
 * HCB_E* code after filling `err` (hcb_error_set). */
typedef int (*hcb_ffi_body)(XLA_FFI_CallFrame *frame, hcb_error *err);

/* A body that takes a context bound where the handler is defined
 * (HCB_FFI_HANDLER_CTX): one body then serves several handlers, e.g. one
 * per platform, or a test's own runtime. */
typedef int (*hcb_ffi_body_ctx)(XLA_FFI_CallFrame *frame, void *ctx,
                                hcb_error *err);

/* What every handler does before its body: answers the probe (with
 * `traits`: hcb_ffi_answer_probe, ffi_version.h) and checks that the stage
 * is EXECUTE.  Returns true when the call ends here, with *xe the result
 * (NULL after the probe). */
static inline bool
hcb_ffi_begin(XLA_FFI_CallFrame *frame, const char *name,
              XLA_FFI_Handler_Traits traits, XLA_FFI_Error **xe)
{
    *xe = NULL;
    if (hcb_ffi_answer_probe(frame, traits))
        return true;
    *xe = hcb_ffi_check_stage(frame, XLA_FFI_ExecutionStage_EXECUTE, name);
    return *xe != NULL;
}

/* ... and after it: the body's result `rc` (with `err`) as the XLA error
 * "<name>: <message>" the computation fails with, or NULL. */
static inline XLA_FFI_Error *
hcb_ffi_end(const XLA_FFI_CallFrame *frame, const char *name, int rc,
            const hcb_error *err)
{
    if (rc == HCB_OK)
        return NULL;
    if (err->code == HCB_OK)
        return hcb_ffi_error(frame, rc < 0 ? rc : HCB_ECALLBACK,
                             "%s: failed with code %d", name, rc);
    return hcb_ffi_error(frame, err->code, "%s: %s", name, err->message);
}

/* Everything around a body: hcb_ffi_begin, `body`, hcb_ffi_end. */
static inline XLA_FFI_Error *
hcb_ffi_run(XLA_FFI_CallFrame *frame, const char *name,
            XLA_FFI_Handler_Traits traits, hcb_ffi_body body)
{
    XLA_FFI_Error *xe;
    hcb_error err;

    if (hcb_ffi_begin(frame, name, traits, &xe))
        return xe;
    err.code = HCB_OK; /* (not the whole message: this is every call) */
    err.message[0] = '\0';
    return hcb_ffi_end(frame, name, body(frame, &err), &err);
}

/* The same for a body with a context. */
static inline XLA_FFI_Error *
hcb_ffi_run_ctx(XLA_FFI_CallFrame *frame, const char *name,
                XLA_FFI_Handler_Traits traits, hcb_ffi_body_ctx body, void *ctx)
{
    XLA_FFI_Error *xe;
    hcb_error err;

    if (hcb_ffi_begin(frame, name, traits, &xe))
        return xe;
    err.code = HCB_OK; /* (not the whole message: this is every call) */
    err.message[0] = '\0';
    return hcb_ffi_end(frame, name, body(frame, ctx, &err), &err);
}

/* Defines an exported handler `symbol` that runs `body` through hcb_ffi_run:
 *
 *     static int scale_body(XLA_FFI_CallFrame *frame, hcb_error *err) {...}
 *     HCB_FFI_HANDLER(my_scale, scale_body, 0)
 *
 * then from Python: jax.ffi.register_ffi_target("my_scale",
 * jax.ffi.pycapsule(lib.my_scale), platform="cpu"). */
#ifdef __cplusplus
#define HCB_FFI__LINKAGE extern "C" HCB_API
#else
#define HCB_FFI__LINKAGE HCB_API
#endif
#define HCB_FFI_HANDLER(symbol, body, traits)                                  \
    HCB_FFI__LINKAGE XLA_FFI_Error *symbol(XLA_FFI_CallFrame *frame);          \
    HCB_FFI__LINKAGE XLA_FFI_Error *symbol(XLA_FFI_CallFrame *frame)           \
    {                                                                          \
        return hcb_ffi_run(frame, #symbol, (traits), (body));                  \
    }

/* Defines an exported handler `symbol` that runs `body` with `ctx` through
 * hcb_ffi_run_ctx; its errors start with `name` (say, the target name the
 * handler is registered under, where that differs from the symbol):
 *
 *     static const my_config f32 = {...}, f64 = {...};
 *     HCB_FFI_HANDLER_CTX(my_scale_f32, "my_scale", scale_body, &f32, 0)
 *     HCB_FFI_HANDLER_CTX(my_scale_f64, "my_scale", scale_body, &f64, 0)
 *
 * `ctx` is passed as `void *`: a pointer to const data is cast, and the
 * body must not write through it. */
#define HCB_FFI_HANDLER_CTX(symbol, name, body, ctx, traits)                   \
    HCB_FFI__LINKAGE XLA_FFI_Error *symbol(XLA_FFI_CallFrame *frame);          \
    HCB_FFI__LINKAGE XLA_FFI_Error *symbol(XLA_FFI_CallFrame *frame)           \
    {                                                                          \
        return hcb_ffi_run_ctx(frame, (name), (traits), (body),                \
                               (void *)(ctx));                                 \
    }

/* ------------------------------------------------------------------------ */
/* Operands and results                                                     */

/* "Any dtype" and "any rank" for hcb_ffi_arg / hcb_ffi_result. */
#define HCB_ANY_DTYPE HCB_INVALID
#define HCB_ANY_RANK  (-1)

/* Views an FFI buffer as an hcb_array (no copy).  Fails for tokens and
 * types without a size (S1, U1).  Sub-byte types (S2, U2, S4, U4,
 * F4E2M1FN) are packed in XLA's buffers: `nbytes` counts the packed bytes
 * (hcb_dtype_nbytes), and hcb_unpack_elements / hcb_pack_elements convert
 * to and from one element per byte. */
static inline int
hcb_ffi_buffer_view(const XLA_FFI_Buffer *buf, hcb_array *out, hcb_error *err)
{
    hcb_dtype dtype = (hcb_dtype)buf->dtype;
    size_t n = 1;
    int64_t i;

    if (hcb_dtype_bits(dtype) == 0)
        return hcb_error_set(err, HCB_EUNIMPL,
                             "unsupported buffer type %s (XLA type %d)",
                             hcb_dtype_name(dtype), (int)buf->dtype);
    if (buf->rank < 0 || buf->rank > HCB_MAX_RANK)
        return hcb_error_set(err, HCB_EINVAL, "buffer rank %lld out of range",
                             (long long)buf->rank);
    for (i = 0; i < buf->rank; i++) {
        if (buf->dims[i] < 0)
            return hcb_error_set(err, HCB_EINVAL,
                                 "buffer dimension %lld is negative",
                                 (long long)i);
        n *= (size_t)buf->dims[i];
    }
    out->dtype = dtype;
    out->rank = (int32_t)buf->rank;
    out->dims = buf->dims;
    out->data = buf->data;
    out->nbytes = hcb_dtype_nbytes(dtype, n);
    return HCB_OK;
}

/* Shared by hcb_ffi_arg and hcb_ffi_result. */
static inline int
hcb_ffi__typed_buffer(const char *what, int64_t count, void *const *buffers,
                      bool is_buffer, int64_t i, hcb_dtype dtype, int32_t rank,
                      hcb_array *out, hcb_error *err)
{
    const XLA_FFI_Buffer *buf;
    hcb_error inner;

    if (i < 0 || i >= count)
        return hcb_error_set(err, HCB_EINVAL,
                             "%s %lld does not exist: the call has %lld %ss",
                             what, (long long)i, (long long)count, what);
    if (!is_buffer)
        return hcb_error_set(err, HCB_EINVAL, "%s %lld is not a buffer", what,
                             (long long)i);
    buf = (const XLA_FFI_Buffer *)buffers[i];
    if (dtype != HCB_ANY_DTYPE && (hcb_dtype)buf->dtype != dtype)
        return hcb_error_set(
            err, HCB_EINVAL, "%s %lld has dtype %s, expected %s", what,
            (long long)i, hcb_dtype_name((hcb_dtype)buf->dtype),
            hcb_dtype_name(dtype));
    if (rank != HCB_ANY_RANK && buf->rank != rank)
        return hcb_error_set(err, HCB_EINVAL,
                             "%s %lld has rank %lld, expected %d", what,
                             (long long)i, (long long)buf->rank, rank);
    if (hcb_ffi_buffer_view(buf, out, &inner) != HCB_OK)
        return hcb_error_set(err, inner.code, "%s %lld: %s", what, (long long)i,
                             inner.message);
    return HCB_OK;
}

/* Operand `i` as an hcb_array over XLA's memory (no copy), checked to have
 * `dtype` (or HCB_ANY_DTYPE) and `rank` (or HCB_ANY_RANK).  Errors say what
 * was expected and what came: "operand 1 has dtype int32, expected
 * float32".  On GPU, `out->data` is device memory. */
static inline int
hcb_ffi_arg(const XLA_FFI_CallFrame *frame, int64_t i, hcb_dtype dtype,
            int32_t rank, hcb_array *out, hcb_error *err)
{
    bool is_buffer = i >= 0 && i < frame->args.size &&
                     frame->args.types[i] == XLA_FFI_ArgType_BUFFER;

    return hcb_ffi__typed_buffer("operand", frame->args.size, frame->args.args,
                                 is_buffer, i, dtype, rank, out, err);
}

/* Result `i`, as hcb_ffi_arg: the handler writes `out->nbytes` bytes to
 * `out->data`. */
static inline int
hcb_ffi_result(const XLA_FFI_CallFrame *frame, int64_t i, hcb_dtype dtype,
               int32_t rank, hcb_array *out, hcb_error *err)
{
    bool is_buffer = i >= 0 && i < frame->rets.size &&
                     frame->rets.types[i] == XLA_FFI_RetType_BUFFER;

    return hcb_ffi__typed_buffer("result", frame->rets.size, frame->rets.rets,
                                 is_buffer, i, dtype, rank, out, err);
}

/* Checks the number of operands and results (-1: any). */
static inline int
hcb_ffi_check_counts(const XLA_FFI_CallFrame *frame, int64_t nargs,
                     int64_t nresults, hcb_error *err)
{
    if (nargs >= 0 && frame->args.size != nargs)
        return hcb_error_set(err, HCB_EINVAL,
                             "expected %lld operands, got %lld",
                             (long long)nargs, (long long)frame->args.size);
    if (nresults >= 0 && frame->rets.size != nresults)
        return hcb_error_set(err, HCB_EINVAL, "expected %lld results, got %lld",
                             (long long)nresults, (long long)frame->rets.size);
    return HCB_OK;
}

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */

/* The FFI error code for an HCB_E* code (one-to-one). */
static inline XLA_FFI_Error_Code
hcb_ffi_error_code(int code)
{
    switch (code) {
    case HCB_EINVAL:
        return XLA_FFI_Error_Code_INVALID_ARGUMENT;
    case HCB_ENOMEM:
        return XLA_FFI_Error_Code_RESOURCE_EXHAUSTED;
    case HCB_ENOTFOUND:
        return XLA_FFI_Error_Code_NOT_FOUND;
    case HCB_ESTATE:
        return XLA_FFI_Error_Code_FAILED_PRECONDITION;
    case HCB_EDEADLK:
        return XLA_FFI_Error_Code_ABORTED;
    case HCB_ECALLBACK:
        return XLA_FFI_Error_Code_UNKNOWN;
    case HCB_EUNIMPL:
        return XLA_FFI_Error_Code_UNIMPLEMENTED;
    case HCB_ESYSTEM:
        return XLA_FFI_Error_Code_UNAVAILABLE;
    default:
        return XLA_FFI_Error_Code_INTERNAL;
    }
}

/* Makes an XLA error with a formatted message.  The message is formatted on
 * the stack (XLA copies it).  Returns NULL if `frame->api` is unusable,
 * which XLA would read as success, so handlers never pass such frames. */
static inline XLA_FFI_Error *
hcb_ffi_errorv(const XLA_FFI_CallFrame *frame, int code, const char *fmt,
               va_list ap)
{
    char msg[HCB_ERROR_MESSAGE_SIZE];
    XLA_FFI_Error_Create_Args args;

    vsnprintf(msg, sizeof msg, fmt, ap);
    memset(&args, 0, sizeof args);
    args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
    args.message = msg;
    args.errc = hcb_ffi_error_code(code == HCB_OK ? HCB_EINTERNAL : code);
    return frame->api->XLA_FFI_Error_Create(&args);
}

/* hcb_ffi_errorv with the format's arguments. */
static inline XLA_FFI_Error *
hcb_ffi_error(const XLA_FFI_CallFrame *frame, int code, const char *fmt, ...)
{
    XLA_FFI_Error *e;
    va_list ap;

    va_start(ap, fmt);
    e = hcb_ffi_errorv(frame, code, fmt, ap);
    va_end(ap);
    return e;
}

/* The XLA error for a filled hcb_error. */
static inline XLA_FFI_Error *
hcb_ffi_error_from(const XLA_FFI_CallFrame *frame, const hcb_error *err)
{
    return hcb_ffi_error(frame, err->code, "%s", err->message);
}

/* Fails unless `frame` is at `stage`. */
static inline XLA_FFI_Error *
hcb_ffi_check_stage(const XLA_FFI_CallFrame *frame,
                    XLA_FFI_ExecutionStage stage, const char *handler)
{
    if (frame->stage == stage)
        return NULL;
    return hcb_ffi_error(frame, HCB_EINVAL,
                         "handler '%s' called at stage %d, expected %d",
                         handler, (int)frame->stage, (int)stage);
}

/* Errors XLA hands back.  Turns an error an XLA API function returned into
 * `err` (code `code`, the
 * XLA message after `what`) and frees it.  Returns `code`. */
static inline int
hcb_ffi_take_error(const XLA_FFI_Api *api, XLA_FFI_Error *e, int code,
                   const char *what, hcb_error *err)
{
    hcb_ffi_error_message_args msg;
    XLA_FFI_Error_Destroy_Args d;

    memset(&msg, 0, sizeof msg);
    msg.struct_size = HCB_FFI_ERROR_MESSAGE_ARGS_SIZE;
    msg.error = e;
    api->HCB_FFI_API_ERROR_MESSAGE(&msg);
    hcb_error_set(err, code, "%s: %s", what,
                  msg.message != NULL ? msg.message : "(no message)");
    memset(&d, 0, sizeof d);
    d.struct_size = XLA_FFI_Error_Destroy_Args_STRUCT_SIZE;
    d.error = e;
    api->XLA_FFI_Error_Destroy(&d);
    return code;
}

/* ------------------------------------------------------------------------ */
/* Context: device and stream                                               */

/* The device ordinal XLA runs this call on (CPU: jax.Device.id). */
static inline int
hcb_ffi_device_ordinal(const XLA_FFI_CallFrame *frame, int32_t *out,
                       hcb_error *err)
{
    const XLA_FFI_Api *api = frame->api;
    XLA_FFI_DeviceOrdinal_Get_Args args;
    XLA_FFI_Error *e;

    if (api->struct_size <= offsetof(XLA_FFI_Api, XLA_FFI_DeviceOrdinal_Get))
        return hcb_error_set(err, HCB_EUNIMPL,
                             "this XLA runtime cannot report device ordinals");
    memset(&args, 0, sizeof args);
    args.struct_size = XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE;
    args.ctx = frame->ctx;
    e = api->XLA_FFI_DeviceOrdinal_Get(&args);
    if (e != NULL)
        return hcb_ffi_take_error(api, e, HCB_EINTERNAL,
                                  "failed to get the device ordinal", err);
    *out = args.device_ordinal;
    return HCB_OK;
}

/* XLA's id of the launch this call belongs to: every device of one SPMD
 * execution sees the same one, so that (run id, device) names one device's
 * part of it.  HCB_EUNIMPL where the XLA runtime has no RunId_Get. */
static inline int
hcb_ffi_run_id(const XLA_FFI_CallFrame *frame, int64_t *out, hcb_error *err)
{
    const XLA_FFI_Api *api = frame->api;
    XLA_FFI_RunId_Get_Args args;
    XLA_FFI_Error *e;

    if (api->struct_size <= offsetof(XLA_FFI_Api, XLA_FFI_RunId_Get) ||
        api->XLA_FFI_RunId_Get == NULL)
        return hcb_error_set(err, HCB_EUNIMPL,
                             "this XLA runtime cannot report run ids");
    memset(&args, 0, sizeof args);
    args.struct_size = XLA_FFI_RunId_Get_Args_STRUCT_SIZE;
    args.ctx = frame->ctx;
    e = api->XLA_FFI_RunId_Get(&args);
    if (e != NULL)
        return hcb_ffi_take_error(api, e, HCB_EINTERNAL,
                                  "failed to get the run id", err);
    *out = args.run_id;
    return HCB_OK;
}

/* The platform stream the call runs on (CUDA: the cudaStream_t XLA
 * computes on; enqueue work on it, do not synchronise it in a handler that
 * may be captured in a command buffer).  CPU computations have no stream:
 * HCB_EUNIMPL. */
static inline int
hcb_ffi_stream(const XLA_FFI_CallFrame *frame, void **stream, hcb_error *err)
{
    XLA_FFI_Stream_Get_Args args;
    XLA_FFI_Error *e;

    memset(&args, 0, sizeof args);
    args.struct_size = XLA_FFI_Stream_Get_Args_STRUCT_SIZE;
    args.ctx = frame->ctx;
    e = frame->api->XLA_FFI_Stream_Get(&args);
    if (e != NULL)
        return hcb_ffi_take_error(frame->api, e, HCB_EUNIMPL,
                                  "no stream for this call", err);
    *stream = args.stream;
    return HCB_OK;
}

#ifdef __cplusplus
} /* extern "C" */
#endif

/* The rest of the SDK, and libhcb's own handlers and CUDA functions. */
#include "hcb/ffi_attrs.h"
#include "hcb/ffi_handlers.h"
#include "hcb/cuda.h"

#endif /* HCB_FFI_H */
