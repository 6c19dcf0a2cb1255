/*
 * ffi.h - a small SDK for writing typed XLA FFI handlers in plain C.
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
 * Everything here is `static inline` over this header, hcb.h and c_api.h
 * (`jax.ffi.include_dir()`); link libhcb for the few hcb_* functions they
 * call (hcb_error_set, hcb_dtype_name, hcb_dtype_bits, hcb_dtype_nbytes).
 * Errors go to an `hcb_error *err` that may be NULL, as everywhere in libhcb.
 *
 * The handlers report FFI API version 0.3 (HCB_FFI_API_MAJOR/MINOR), the
 * newest version every supported jaxlib accepts (JAX 0.10 ships FFI API 0.3,
 * 0.11 ships 0.4, 0.12 ships 0.5), whatever header they were compiled
 * against, and they use only the 0.3 layout of every structure: a handler
 * built against any of these headers registers and runs under all of them.
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

/* FFI API 0.4 renamed two things a handler touches, keeping their layout:
 * the extension at the head of every structure (XLA_FFI_Extension_Base ->
 * XLA_FFI_InternalExtension) and the function that reads an error's message
 * (XLA_FFI_Error_GetMessage -> XLA_FFI_Error_GetDetails, same slot in
 * XLA_FFI_Api, its arguments grew an `errc` after `message`).  These names
 * work with every header. */
#if XLA_FFI_API_MAJOR == 0 && XLA_FFI_API_MINOR < 4
typedef XLA_FFI_Extension_Base hcb_ffi_extension;
typedef XLA_FFI_Error_GetMessage_Args hcb_ffi_error_message_args;
#define HCB_FFI_API_ERROR_MESSAGE XLA_FFI_Error_GetMessage
#else
typedef XLA_FFI_InternalExtension hcb_ffi_extension;
typedef XLA_FFI_Error_GetDetails_Args hcb_ffi_error_message_args;
#define HCB_FFI_API_ERROR_MESSAGE XLA_FFI_Error_GetDetails
#endif
/* The size of those arguments in the header built against: a runtime as
 * new as that header checks the struct is whole (0.4 and later read and
 * write `errc`), and the newer runtimes accept it (the ABI grows by
 * struct_size). */
#if XLA_FFI_API_MAJOR == 0 && XLA_FFI_API_MINOR < 4
#define HCB_FFI_ERROR_MESSAGE_ARGS_SIZE                                        \
    XLA_FFI_Error_GetMessage_Args_STRUCT_SIZE
#else
#define HCB_FFI_ERROR_MESSAGE_ARGS_SIZE                                        \
    XLA_FFI_Error_GetDetails_Args_STRUCT_SIZE
#endif

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
    hcb_ffi_extension *ext = frame->extension_start;
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

/* ------------------------------------------------------------------------ */
/* Errors XLA hands back                                                    */

/* Turns an error an XLA API function returned into `err` (code `code`, the
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
/* Attributes                                                               */
/*
 * Every keyword argument of jax.ffi.ffi_call arrives as an attribute: a
 * scalar (Python int -> int64, float -> float64, bool -> bool, numpy
 * scalars keep their type), a string (str), an array (a 1-D or flattened
 * numpy array of int8..uint64, float32 or float64) or a dictionary (dict,
 * whose values are attributes again).  The functions below take the
 * attribute list -- `&frame->attrs`, or a dictionary from hcb_ffi_attr_dict
 * -- and return HCB_ENOTFOUND for a missing attribute (so a caller can fall
 * back to a default) and HCB_EINVAL, saying what came and what was
 * expected, for one of another type.  What they return points into XLA's
 * call frame and lives as long as the call.
 */

/* Finds attribute `name` (attributes arrive sorted by name, so this is a
 * binary search).  Returns its value pointer and sets `*type`, or NULL. */
static inline const void *
hcb_ffi_attr_find(const XLA_FFI_Attrs *attrs, const char *name,
                  XLA_FFI_AttrType *type)
{
    size_t len = strlen(name);
    int64_t lo = 0, hi = attrs->size - 1;

    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        const XLA_FFI_ByteSpan *key = attrs->names[mid];
        size_t n = key->len < len ? key->len : len;
        int c = memcmp(key->ptr, name, n);

        if (c == 0)
            c = key->len < len ? -1 : (key->len > len ? 1 : 0);
        if (c == 0) {
            if (type != NULL)
                *type = attrs->types[mid];
            return attrs->attrs[mid];
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

/* What an attribute is, for messages: "a string", "an int32 scalar", "an
 * array" (`dtype` is the element type, or HCB_ANY_DTYPE). */
static inline void
hcb_ffi__describe(XLA_FFI_AttrType type, hcb_dtype dtype, char *buf, size_t cap)
{
    const char *kind = type == XLA_FFI_AttrType_SCALAR ? "scalar" : "array";
    const char *name = hcb_dtype_name(dtype);

    switch (type) {
    case XLA_FFI_AttrType_SCALAR:
    case XLA_FFI_AttrType_ARRAY:
        if (dtype == HCB_ANY_DTYPE)
            snprintf(buf, cap, "%s %s", kind[0] == 'a' ? "an" : "a", kind);
        else
            snprintf(buf, cap, "%s %s %s",
                     strchr("aeio", name[0]) != NULL ? "an" : "a", name, kind);
        break;
    case XLA_FFI_AttrType_STRING:
        snprintf(buf, cap, "a string");
        break;
    case XLA_FFI_AttrType_DICTIONARY:
        snprintf(buf, cap, "a dictionary");
        break;
    default:
        snprintf(buf, cap, "of unknown kind %d", (int)type);
    }
}

/* The element type of a scalar or array attribute (else HCB_ANY_DTYPE). */
static inline hcb_dtype
hcb_ffi__attr_dtype(XLA_FFI_AttrType type, const void *value)
{
    if (type == XLA_FFI_AttrType_SCALAR)
        return (hcb_dtype)((const XLA_FFI_Scalar *)value)->dtype;
    if (type == XLA_FFI_AttrType_ARRAY)
        return (hcb_dtype)((const XLA_FFI_Array *)value)->dtype;
    return HCB_ANY_DTYPE;
}

/* Finds attribute `name` and checks its kind (and, for scalars and arrays,
 * its dtype unless `dtype` is HCB_ANY_DTYPE). */
static inline int
hcb_ffi__attr_get(const XLA_FFI_Attrs *attrs, const char *name,
                  XLA_FFI_AttrType want, hcb_dtype dtype, const void **out,
                  hcb_error *err)
{
    XLA_FFI_AttrType type = XLA_FFI_AttrType_STRING;
    const void *value = hcb_ffi_attr_find(attrs, name, &type);
    char got[64], expected[64];

    if (value == NULL)
        return hcb_error_set(err, HCB_ENOTFOUND, "missing attribute '%s'",
                             name);
    if (type != want ||
        (dtype != HCB_ANY_DTYPE && hcb_ffi__attr_dtype(type, value) != dtype)) {
        hcb_ffi__describe(type, hcb_ffi__attr_dtype(type, value), got,
                          sizeof got);
        hcb_ffi__describe(want, dtype, expected, sizeof expected);
        return hcb_error_set(err, HCB_EINVAL,
                             "attribute '%s' is %s, expected %s", name, got,
                             expected);
    }
    *out = value;
    return HCB_OK;
}

/* Reads scalar attribute `name` of type `dtype` into `out` (`size` bytes,
 * the C type's: bool is 1 byte). */
static inline int
hcb_ffi_attr_scalar(const XLA_FFI_Attrs *attrs, const char *name,
                    hcb_dtype dtype, void *out, size_t size, hcb_error *err)
{
    const void *v = NULL;
    int rc =
        hcb_ffi__attr_get(attrs, name, XLA_FFI_AttrType_SCALAR, dtype, &v, err);

    if (rc == HCB_OK)
        memcpy(out, ((const XLA_FFI_Scalar *)v)->value, size);
    return rc;
}

/* Typed scalar getters: hcb_ffi_attr_bool, _i8, _i16, _i32, _i64, _u8, _u16,
 * _u32, _u64, _f32, _f64.  The attribute must have exactly that type
 * (hcb_ffi_attr_int accepts any integer). */
#define HCB_FFI__SCALAR_GETTER(suffix, ctype, dtype)                           \
    static inline int hcb_ffi_attr_##suffix(const XLA_FFI_Attrs *attrs,        \
                                            const char *name, ctype *out,      \
                                            hcb_error *err)                    \
    {                                                                          \
        return hcb_ffi_attr_scalar(attrs, name, dtype, out, sizeof *out, err); \
    }
HCB_FFI__SCALAR_GETTER(bool, bool, HCB_BOOL)
HCB_FFI__SCALAR_GETTER(i8, int8_t, HCB_S8)
HCB_FFI__SCALAR_GETTER(i16, int16_t, HCB_S16)
HCB_FFI__SCALAR_GETTER(i32, int32_t, HCB_S32)
HCB_FFI__SCALAR_GETTER(i64, int64_t, HCB_S64)
HCB_FFI__SCALAR_GETTER(u8, uint8_t, HCB_U8)
HCB_FFI__SCALAR_GETTER(u16, uint16_t, HCB_U16)
HCB_FFI__SCALAR_GETTER(u32, uint32_t, HCB_U32)
HCB_FFI__SCALAR_GETTER(u64, uint64_t, HCB_U64)
HCB_FFI__SCALAR_GETTER(f32, float, HCB_F32)
HCB_FFI__SCALAR_GETTER(f64, double, HCB_F64)
#undef HCB_FFI__SCALAR_GETTER

/* Reads an integer scalar attribute of any width and signedness (a Python
 * int arrives as int64, np.uint32(...) as uint32) as int64; a uint64 above
 * INT64_MAX is an error. */
static inline int
hcb_ffi_attr_int(const XLA_FFI_Attrs *attrs, const char *name, int64_t *out,
                 hcb_error *err)
{
    const XLA_FFI_Scalar *s = NULL;
    int rc = hcb_ffi__attr_get(attrs, name, XLA_FFI_AttrType_SCALAR,
                               HCB_ANY_DTYPE, (const void **)&s, err);

    if (rc != HCB_OK)
        return rc;
    switch ((hcb_dtype)s->dtype) {
    case HCB_S8:
        *out = *(const int8_t *)s->value;
        return HCB_OK;
    case HCB_S16:
        *out = *(const int16_t *)s->value;
        return HCB_OK;
    case HCB_S32:
        *out = *(const int32_t *)s->value;
        return HCB_OK;
    case HCB_S64:
        *out = *(const int64_t *)s->value;
        return HCB_OK;
    case HCB_U8:
        *out = *(const uint8_t *)s->value;
        return HCB_OK;
    case HCB_U16:
        *out = *(const uint16_t *)s->value;
        return HCB_OK;
    case HCB_U32:
        *out = *(const uint32_t *)s->value;
        return HCB_OK;
    case HCB_U64:
        if (*(const uint64_t *)s->value > (uint64_t)INT64_MAX)
            return hcb_error_set(
                err, HCB_EINVAL,
                "attribute '%s' is %llu, which does not fit "
                "an int64",
                name, (unsigned long long)*(const uint64_t *)s->value);
        *out = (int64_t) * (const uint64_t *)s->value;
        return HCB_OK;
    default:
        return hcb_error_set(err, HCB_EINVAL,
                             "attribute '%s' is a %s scalar, expected an "
                             "integer",
                             name, hcb_dtype_name((hcb_dtype)s->dtype));
    }
}

/* A string attribute: `*ptr` is NOT NUL-terminated; `*len` bytes. */
static inline int
hcb_ffi_attr_string(const XLA_FFI_Attrs *attrs, const char *name,
                    const char **ptr, size_t *len, hcb_error *err)
{
    const XLA_FFI_ByteSpan *s = NULL;
    int rc = hcb_ffi__attr_get(attrs, name, XLA_FFI_AttrType_STRING,
                               HCB_ANY_DTYPE, (const void **)&s, err);

    if (rc == HCB_OK) {
        *ptr = s->ptr;
        *len = s->len;
    }
    return rc;
}

/* A string attribute copied NUL-terminated into `buf` (`cap` bytes); a
 * string that does not fit is an error. */
static inline int
hcb_ffi_attr_string_copy(const XLA_FFI_Attrs *attrs, const char *name,
                         char *buf, size_t cap, hcb_error *err)
{
    const char *p = NULL;
    size_t n = 0;
    int rc = hcb_ffi_attr_string(attrs, name, &p, &n, err);

    if (rc != HCB_OK)
        return rc;
    if (n >= cap)
        return hcb_error_set(err, HCB_EINVAL,
                             "attribute '%s' is a string of %zu bytes, "
                             "expected at most %zu",
                             name, n, cap == 0 ? 0 : cap - 1);
    memcpy(buf, p, n);
    buf[n] = '\0';
    return HCB_OK;
}

/* An array attribute of element type `dtype` (or HCB_ANY_DTYPE): `*data`
 * points at `*n` elements (a count, not bytes). */
static inline int
hcb_ffi_attr_array(const XLA_FFI_Attrs *attrs, const char *name,
                   hcb_dtype dtype, const void **data, size_t *n,
                   hcb_error *err)
{
    const XLA_FFI_Array *a = NULL;
    int rc = hcb_ffi__attr_get(attrs, name, XLA_FFI_AttrType_ARRAY, dtype,
                               (const void **)&a, err);

    if (rc == HCB_OK) {
        *data = a->data;
        *n = a->size;
    }
    return rc;
}

/* Typed array getters: hcb_ffi_attr_array_i8 ... _u64, _f32, _f64. */
#define HCB_FFI__ARRAY_GETTER(suffix, ctype, dtype)                            \
    static inline int hcb_ffi_attr_array_##suffix(                             \
        const XLA_FFI_Attrs *attrs, const char *name, const ctype **data,      \
        size_t *n, hcb_error *err)                                             \
    {                                                                          \
        const void *p = NULL;                                                  \
        int rc = hcb_ffi_attr_array(attrs, name, dtype, &p, n, err);           \
        if (rc == HCB_OK)                                                      \
            *data = (const ctype *)p;                                          \
        return rc;                                                             \
    }
HCB_FFI__ARRAY_GETTER(i8, int8_t, HCB_S8)
HCB_FFI__ARRAY_GETTER(i16, int16_t, HCB_S16)
HCB_FFI__ARRAY_GETTER(i32, int32_t, HCB_S32)
HCB_FFI__ARRAY_GETTER(i64, int64_t, HCB_S64)
HCB_FFI__ARRAY_GETTER(u8, uint8_t, HCB_U8)
HCB_FFI__ARRAY_GETTER(u16, uint16_t, HCB_U16)
HCB_FFI__ARRAY_GETTER(u32, uint32_t, HCB_U32)
HCB_FFI__ARRAY_GETTER(u64, uint64_t, HCB_U64)
HCB_FFI__ARRAY_GETTER(f32, float, HCB_F32)
HCB_FFI__ARRAY_GETTER(f64, double, HCB_F64)
#undef HCB_FFI__ARRAY_GETTER

/* A dictionary attribute: `*out` is its attribute list, for the functions
 * above. */
static inline int
hcb_ffi_attr_dict(const XLA_FFI_Attrs *attrs, const char *name,
                  const XLA_FFI_Attrs **out, hcb_error *err)
{
    const void *d = NULL;
    int rc = hcb_ffi__attr_get(attrs, name, XLA_FFI_AttrType_DICTIONARY,
                               HCB_ANY_DTYPE, &d, err);

    if (rc == HCB_OK)
        *out = (const XLA_FFI_Attrs *)d;
    return rc;
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

/* ------------------------------------------------------------------------ */
/* Writing a handler                                                        */

/* A handler body: does the work of one call and returns HCB_OK, or an
 * HCB_E* code after filling `err` (hcb_error_set). */
typedef int (*hcb_ffi_body)(XLA_FFI_CallFrame *frame, hcb_error *err);

/* A body that takes a context bound where the handler is defined
 * (HCB_FFI_HANDLER_CTX): one body then serves several handlers, e.g. one
 * per platform, or a test's own runtime. */
typedef int (*hcb_ffi_body_ctx)(XLA_FFI_CallFrame *frame, void *ctx,
                                hcb_error *err);

/* What every handler does before its body: answers the probe (with
 * `traits`) and checks that the stage is EXECUTE.  Returns true when the
 * call ends here, with *xe the result (NULL after the probe). */
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
/* The handlers libhcb exports.  Register them for platform "cpu" with
 * jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(fn), platform="cpu").
 */

/* "hcb_tap": operands are the tapped arrays followed by pass-through arrays
 * and an optional order token; results alias the operands one-to-one
 * (input_output_aliases {i: i}), or are the order token alone.
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
 * every device (see src/runtime/runtime.h), else passes its operands
 * through. */
HCB_API XLA_FFI_Error *hcb_ffi_sharded_check(XLA_FFI_CallFrame *frame);

/* "hcb_flush": one token operand, one token result.  Waits until the
 * default runtime has delivered every record the device running it
 * submitted before (hcb_runtime_flush); a computation ends with it when its
 * results must be ready only after its callbacks have run. */
HCB_API XLA_FFI_Error *hcb_ffi_flush(XLA_FFI_CallFrame *frame);

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
 * pinned host memory and a host function that submits the record once the
 * copy has landed, and returns without waiting for the stream.  "hcb_call"
 * copies the operands to pinned host memory, waits for that copy (the one
 * synchronisation of a call), runs the target on the host copies, and
 * enqueues the copy of the results back to the device.  "hcb_buffer_call"
 * runs the target on the device buffers, with hcb_call_stream() set. */
HCB_API XLA_FFI_Error *hcb_ffi_tap_cuda(XLA_FFI_CallFrame *frame);
HCB_API XLA_FFI_Error *hcb_ffi_call_cuda(XLA_FFI_CallFrame *frame);
HCB_API XLA_FFI_Error *hcb_ffi_buffer_call_cuda(XLA_FFI_CallFrame *frame);
HCB_API XLA_FFI_Error *hcb_ffi_ordinal_handler_cuda(XLA_FFI_CallFrame *frame);
/* "hcb_flush" on CUDA first waits for XLA's stream (the copies of the taps
 * it carries), on XLA's thread, then for the deliveries. */
HCB_API XLA_FFI_Error *hcb_ffi_flush_cuda(XLA_FFI_CallFrame *frame);
HCB_API XLA_FFI_Error *hcb_ffi_sharded_check_cuda(XLA_FFI_CallFrame *frame);

/* Loads the CUDA runtime (libcudart) the CUDA handlers use: from `path`
 * (a file dlopen understands), or with `path` NULL the one already loaded
 * in the process, else libcudart.so.13 or .so.12 by name.  Once loaded it
 * stays; a later call returns HCB_OK at once.  HCB_ENOTFOUND, naming what
 * was tried, when no CUDA runtime can be loaded. */
HCB_API int hcb_cuda_load(const char *path, hcb_error *err);

/* Sets the size of the pinned host memory pool that GPU taps and calls
 * copy into, per device (default 256 MiB), before the first GPU callback
 * takes it, or while none of any is in use.  HCB_EINVAL under 4 MiB,
 * HCB_ESTATE while a pool is in use. */
HCB_API int hcb_cuda_set_pinned_bytes(size_t bytes, hcb_error *err);

/* During a call target that the CUDA handler "hcb_buffer_call" runs: the
 * cudaStream_t XLA computes on (enqueue the work there).  NULL anywhere
 * else: on CPU, in a tap, outside a call. */
HCB_API void *hcb_call_stream(void);

/* Makes the work enqueued on CUDA stream `waiter` from now on wait for the
 * work enqueued on `stream` so far, without waiting on the host (an event
 * recorded on `stream`, waited for on `waiter`).  `stream` is a stream of
 * CUDA device `ordinal` (in a buffer call: the `device`'s ordinal the
 * target was given); `waiter` may be of any device.  Streams are
 * cudaStream_t values; (void *)1 and (void *)2 are CUDA's legacy and
 * per-thread default streams of device `ordinal`.  The calling thread's
 * current device is switched to `ordinal` for the call and back after, so
 * a caller that switched devices needs no care.  Nothing to do when the
 * streams are the same.  Any thread, but not a CUDA host function (which
 * must not call CUDA).  HCB_ENOTFOUND without a CUDA runtime; HCB_ESYSTEM,
 * with CUDA's message, when CUDA fails. */
HCB_API int hcb_cuda_stream_wait(int32_t ordinal, void *waiter, void *stream,
                                 hcb_error *err);

/* What the pinned pool of one CUDA device has done (each device has its
 * own, of hcb_cuda_set_pinned_bytes bytes, taken at its first GPU
 * callback).  Bytes "in flight" are those of records on their way (copies
 * not landed, records queued or being delivered) and of calls' staging;
 * "kept" ones are held by records a tap function kept (a numpy array it
 * saved), which the pool works around.  `waits` counts takes that waited
 * for room (the device's back-pressure), `refusals` takes that found none
 * and could not wait, and `syncs` taps and calls that waited for the
 * stream because of that.  `pin_failures` counts the times the pool could
 * not be pinned (cudaHostAlloc refused, as under a memory-lock limit):
 * then every take is refused, the device's taps and calls copy through
 * ordinary memory (each a sync), until the pool's size is set again. */
typedef struct hcb_cuda_pool_stats {
    size_t struct_size;
    uint64_t capacity; /* pinned bytes; 0 until pinned */
    uint64_t used_bytes;
    uint64_t in_flight_bytes;
    uint64_t kept_bytes;
    uint64_t waits;
    uint64_t refusals;
    uint64_t syncs;
    uint64_t pin_failures;
} hcb_cuda_pool_stats;

#define HCB_CUDA_POOL_STATS_INIT                                               \
    {                                                                          \
        sizeof(hcb_cuda_pool_stats), 0, 0, 0, 0, 0, 0, 0, 0                    \
    }

/* Fills `stats` (its struct_size set by the caller) for CUDA device
 * `ordinal`.  HCB_ENOTFOUND when the device has no pool (no GPU callback
 * has run there); HCB_EINVAL without struct_size.  Any thread. */
HCB_API int hcb_cuda_get_pool_stats(int32_t ordinal, hcb_cuda_pool_stats *stats,
                                    hcb_error *err);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HCB_FFI_H */
