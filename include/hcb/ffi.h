/*
 * ffi.h - a small SDK for writing typed XLA FFI handlers in plain C.
 *
 * XLA's FFI has a stable C ABI (xla/ffi/api/c_api.h, shipped in jaxlib:
 * `jax.ffi.include_dir()`), but its only convenience layer is C++.  This
 * header is the C one: answering the registration-time metadata probe,
 * checking the stage, finding attributes by name with type checks, viewing
 * buffers as hcb_array, and turning hcb_error into XLA errors.  Everything
 * here is `static inline`: a handler written with it needs only this header,
 * hcb.h and c_api.h (libhcb is needed only for the hcb_* functions it calls).
 *
 * The handlers report FFI API version 0.3 (HCB_FFI_API_MAJOR/MINOR), the
 * newest version every supported jaxlib accepts, whatever header they were
 * compiled against.
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
#include "xla/ffi/api/c_api.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HCB_FFI_API_MAJOR 0
#define HCB_FFI_API_MINOR 3

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

static inline XLA_FFI_Error *hcb_ffi_error(const XLA_FFI_CallFrame *frame,
                                           int code, const char *fmt, ...)
    HCB_PRINTF(3, 4);

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

/* Answers XLA's registration-time metadata probe.  Call it first in every
 * handler: it returns true when `frame` was the probe (it has filled the
 * metadata; return NULL), false for a real call.  `traits` is a mask of
 * XLA_FFI_HANDLER_TRAITS_* (0 for a handler that must not be captured in a
 * command buffer). */
static inline bool
hcb_ffi_answer_probe(XLA_FFI_CallFrame *frame, XLA_FFI_Handler_Traits traits)
{
    XLA_FFI_Extension_Base *ext = frame->extension_start;
    XLA_FFI_Metadata *md;

    if (ext == NULL || ext->type != XLA_FFI_Extension_Metadata)
        return false;
    md = ((XLA_FFI_Metadata_Extension *)ext)->metadata;
    md->api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
    md->api_version.extension_start = NULL;
    md->api_version.major_version = HCB_FFI_API_MAJOR;
    md->api_version.minor_version = HCB_FFI_API_MINOR;
    md->traits = traits;
    /* state_type_id lies past XLA_FFI_Metadata_STRUCT_SIZE but XLA always
     * allocates the whole struct; zero means stateless. */
    md->state_type_id.type_id = 0;
    return true;
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

/* Finds attribute `name` (attributes arrive sorted by name, so this is a
 * binary search).  Returns its value pointer and sets `*type`, or NULL. */
static inline void *
hcb_ffi_attr_find(const XLA_FFI_CallFrame *frame, const char *name,
                  XLA_FFI_AttrType *type)
{
    const XLA_FFI_Attrs *a = &frame->attrs;
    size_t len = strlen(name);
    int64_t lo = 0, hi = a->size - 1;

    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        const XLA_FFI_ByteSpan *key = a->names[mid];
        size_t n = key->len < len ? key->len : len;
        int c = memcmp(key->ptr, name, n);

        if (c == 0)
            c = key->len < len ? -1 : (key->len > len ? 1 : 0);
        if (c == 0) {
            if (type != NULL)
                *type = a->types[mid];
            return a->attrs[mid];
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

/* Reads scalar attribute `name` of XLA type `want` into `out` (`size`
 * bytes).  Errors name the attribute and what was expected. */
static inline int
hcb_ffi_attr_scalar(const XLA_FFI_CallFrame *frame, const char *name,
                    XLA_FFI_DataType want, void *out, size_t size,
                    hcb_error *err)
{
    XLA_FFI_AttrType type;
    const XLA_FFI_Scalar *s =
        (const XLA_FFI_Scalar *)hcb_ffi_attr_find(frame, name, &type);

    if (s == NULL)
        return hcb_error_set(err, HCB_EINVAL, "missing attribute '%s'", name);
    if (type != XLA_FFI_AttrType_SCALAR || s->dtype != want)
        return hcb_error_set(err, HCB_EINVAL,
                             "attribute '%s' has the wrong type: expected a "
                             "%s scalar",
                             name, hcb_dtype_name((hcb_dtype)want));
    memcpy(out, s->value, size);
    return HCB_OK;
}

static inline int
hcb_ffi_attr_u64(const XLA_FFI_CallFrame *frame, const char *name,
                 uint64_t *out, hcb_error *err)
{
    return hcb_ffi_attr_scalar(frame, name, XLA_FFI_DataType_U64, out,
                               sizeof *out, err);
}

static inline int
hcb_ffi_attr_i64(const XLA_FFI_CallFrame *frame, const char *name, int64_t *out,
                 hcb_error *err)
{
    return hcb_ffi_attr_scalar(frame, name, XLA_FFI_DataType_S64, out,
                               sizeof *out, err);
}

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
    if (e != NULL) {
        XLA_FFI_Error_Destroy_Args d;

        memset(&d, 0, sizeof d);
        d.struct_size = XLA_FFI_Error_Destroy_Args_STRUCT_SIZE;
        d.error = e;
        api->XLA_FFI_Error_Destroy(&d);
        return hcb_error_set(err, HCB_EINTERNAL,
                             "failed to get the device ordinal");
    }
    *out = args.device_ordinal;
    return HCB_OK;
}

/* Views an FFI buffer as an hcb_array (no copy).  Fails for tokens and
 * types without byte-addressable elements. */
static inline int
hcb_ffi_buffer_view(const XLA_FFI_Buffer *buf, hcb_array *out, hcb_error *err)
{
    size_t item = hcb_dtype_size((hcb_dtype)buf->dtype);
    size_t n = 1;
    int64_t i;

    if (item == 0)
        return hcb_error_set(
            err, HCB_EUNIMPL, "unsupported buffer type %s (XLA type %d)",
            hcb_dtype_name((hcb_dtype)buf->dtype), (int)buf->dtype);
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
    out->dtype = (hcb_dtype)buf->dtype;
    out->rank = (int32_t)buf->rank;
    out->dims = buf->dims;
    out->data = buf->data;
    out->nbytes = n * item;
    return HCB_OK;
}

/* ------------------------------------------------------------------------ */
/* The handlers libhcb exports.  Register them for platform "cpu" with
 * jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(fn), platform="cpu").
 */

/* "hcb_tap": operands are the tapped arrays followed by pass-through arrays;
 * results alias the operands one-to-one (input_output_aliases {i: i}).
 * Attributes: callback_id (u64, from hcb_runtime_register_tap on the
 * default runtime) and ntapped (s64, how many leading operands to send).
 * Copies the tapped operands into one record and submits it to the default
 * runtime; returns without waiting for the tap function. */
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

/* "hcb_sharded_check": results alias operands; attribute callback_id (u64).
 * Raises the failure a call under jit over sharded operands parked for
 * every device (see src/runtime.h), else passes its operands through. */
HCB_API XLA_FFI_Error *hcb_ffi_sharded_check(XLA_FFI_CallFrame *frame);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HCB_FFI_H */
