/*
 * ffi_attrs.h - the attributes of an XLA FFI call, by name and checked
 * type: the keyword arguments of jax.ffi.ffi_call, read in a handler's
 * body.  Part of the SDK of hcb/ffi.h, which includes it (and which it
 * includes: either is enough).
 *
 * Compiles as C11 and as C++.
 */
#ifndef HCB_FFI_ATTRS_H
#define HCB_FFI_ATTRS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "hcb/ffi.h" /* HCB_ANY_DTYPE, hcb.h, XLA's c_api.h */

#ifdef __cplusplus
extern "C" {
#endif

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

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HCB_FFI_ATTRS_H */
