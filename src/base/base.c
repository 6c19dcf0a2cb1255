/*
 * base.c - version, errors, the allocation hook and element types.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"

#define HCB__STR2(x) #x
#define HCB__STR(x)  HCB__STR2(x)

int
hcb_version(void)
{
    return HCB_VERSION_NUMBER;
}

const char *
hcb_version_string(void)
{
    return HCB__STR(HCB_VERSION_MAJOR) "." HCB__STR(
        HCB_VERSION_MINOR) "." HCB__STR(HCB_VERSION_PATCH);
}

/* ---- errors ------------------------------------------------------------ */

int
hcb_error_setv(hcb_error *err, int code, const char *fmt, va_list ap)
{
    if (err != NULL) {
        err->code = code;
        vsnprintf(err->message, sizeof err->message, fmt, ap);
    }
    return code;
}

int
hcb_error_set(hcb_error *err, int code, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    hcb_error_setv(err, code, fmt, ap);
    va_end(ap);
    return code;
}

const char *
hcb_strerror(int code)
{
    switch (code) {
    case HCB_OK:
        return "success";
    case HCB_EINVAL:
        return "invalid argument";
    case HCB_ENOMEM:
        return "out of memory";
    case HCB_ENOTFOUND:
        return "not found";
    case HCB_ESTATE:
        return "operation not allowed in this state";
    case HCB_EDEADLK:
        return "operation would deadlock";
    case HCB_ECALLBACK:
        return "callback failed";
    case HCB_EUNIMPL:
        return "not implemented";
    case HCB_EINTERNAL:
        return "internal error";
    case HCB_ESYSTEM:
        return "system resource unavailable";
    default:
        return "unknown error code";
    }
}

/* ---- allocation --------------------------------------------------------- */

static void *
default_alloc(void *user, size_t size)
{
    (void)user;
    return malloc(size);
}

static void
default_free(void *user, void *ptr)
{
    (void)user;
    free(ptr);
}

/* Process-wide (see the list in runtime.h): the hook must be reachable from
 * every allocation site without a context. */
static hcb_allocator allocator = {sizeof(hcb_allocator), default_alloc,
                                  default_free, NULL};

void
hcb_set_allocator(const hcb_allocator *a)
{
    hcb__record_drain(); /* blocks go back to the hook they came from */
    if (a == NULL || a->alloc == NULL || a->free == NULL) {
        allocator.alloc = default_alloc;
        allocator.free = default_free;
        allocator.user = NULL;
        return;
    }
    allocator.alloc = a->alloc;
    allocator.free = a->free;
    allocator.user = a->user;
}

void *
hcb__malloc(size_t size)
{
    return allocator.alloc(allocator.user, size == 0 ? 1 : size);
}

void *
hcb__calloc(size_t n, size_t size)
{
    void *p;

    if (size != 0 && n > SIZE_MAX / size)
        return NULL;
    p = hcb__malloc(n * size);
    if (p != NULL)
        memset(p, 0, n * size);
    return p;
}

void
hcb__free(void *ptr)
{
    if (ptr != NULL)
        allocator.free(allocator.user, ptr);
}

/* ---- element types ------------------------------------------------------ */

size_t
hcb_dtype_size(hcb_dtype dtype)
{
    switch (dtype) {
    case HCB_BOOL:
    case HCB_S8:
    case HCB_U8:
    case HCB_F8E5M2:
    case HCB_F8E4M3FN:
    case HCB_F8E4M3B11FNUZ:
    case HCB_F8E5M2FNUZ:
    case HCB_F8E4M3FNUZ:
    case HCB_F8E4M3:
    case HCB_F8E3M4:
    case HCB_F8E8M0FNU:
        return 1;
    case HCB_S16:
    case HCB_U16:
    case HCB_F16:
    case HCB_BF16:
        return 2;
    case HCB_S32:
    case HCB_U32:
    case HCB_F32:
        return 4;
    case HCB_S64:
    case HCB_U64:
    case HCB_F64:
    case HCB_C64:
        return 8;
    case HCB_C128:
        return 16;
    default:
        return 0;
    }
}

size_t
hcb_dtype_bits(hcb_dtype dtype)
{
    switch (dtype) {
    case HCB_S2:
    case HCB_U2:
        return 2;
    case HCB_S4:
    case HCB_U4:
    case HCB_F4E2M1FN:
        return 4;
    default:
        return 8 * hcb_dtype_size(dtype);
    }
}

size_t
hcb_dtype_nbytes(hcb_dtype dtype, size_t count)
{
    size_t bits = hcb_dtype_bits(dtype);

    if (bits == 0)
        return SIZE_MAX;
    if (bits < 8) /* count / per_byte, rounded up, without overflow */
        return count / (8 / bits) + (count % (8 / bits) != 0);
    if (count > SIZE_MAX / (bits / 8))
        return SIZE_MAX;
    return count * (bits / 8);
}

void
hcb_unpack_elements(hcb_dtype dtype, const void *packed, size_t count,
                    void *bytes)
{
    const uint8_t *in = packed;
    uint8_t *out = bytes;
    size_t bits = hcb_dtype_bits(dtype), i;
    unsigned mask;

    if (bits == 0 || bits >= 8) {
        if (bits != 0 && count > 0)
            memcpy(bytes, packed, hcb_dtype_nbytes(dtype, count));
        return;
    }
    mask = (1u << bits) - 1;
    for (i = 0; i < count; i++)
        out[i] = (uint8_t)((in[i * bits / 8] >> (i * bits % 8)) & mask);
}

void
hcb_pack_elements(hcb_dtype dtype, const void *bytes, size_t count,
                  void *packed)
{
    const uint8_t *in = bytes;
    uint8_t *out = packed;
    size_t bits = hcb_dtype_bits(dtype), i;
    unsigned mask;

    if (bits == 0 || bits >= 8) {
        if (bits != 0 && count > 0)
            memcpy(packed, bytes, hcb_dtype_nbytes(dtype, count));
        return;
    }
    if (count == 0)
        return;
    mask = (1u << bits) - 1;
    memset(out, 0, hcb_dtype_nbytes(dtype, count));
    for (i = 0; i < count; i++)
        out[i * bits / 8] |= (uint8_t)((in[i] & mask) << (i * bits % 8));
}

const char *
hcb_dtype_name(hcb_dtype dtype)
{
    switch (dtype) {
    case HCB_BOOL:
        return "bool";
    case HCB_S8:
        return "int8";
    case HCB_S16:
        return "int16";
    case HCB_S32:
        return "int32";
    case HCB_S64:
        return "int64";
    case HCB_U8:
        return "uint8";
    case HCB_U16:
        return "uint16";
    case HCB_U32:
        return "uint32";
    case HCB_U64:
        return "uint64";
    case HCB_F16:
        return "float16";
    case HCB_F32:
        return "float32";
    case HCB_F64:
        return "float64";
    case HCB_C64:
        return "complex64";
    case HCB_C128:
        return "complex128";
    case HCB_BF16:
        return "bfloat16";
    case HCB_TOKEN:
        return "token";
    case HCB_F8E5M2:
        return "float8_e5m2";
    case HCB_F8E4M3FN:
        return "float8_e4m3fn";
    case HCB_S2:
        return "int2";
    case HCB_U2:
        return "uint2";
    case HCB_S4:
        return "int4";
    case HCB_U4:
        return "uint4";
    case HCB_F4E2M1FN:
        return "float4_e2m1fn";
    case HCB_F8E4M3B11FNUZ:
        return "float8_e4m3b11fnuz";
    case HCB_F8E5M2FNUZ:
        return "float8_e5m2fnuz";
    case HCB_F8E4M3FNUZ:
        return "float8_e4m3fnuz";
    case HCB_F8E4M3:
        return "float8_e4m3";
    case HCB_F8E3M4:
        return "float8_e3m4";
    case HCB_F8E8M0FNU:
        return "float8_e8m0fnu";
    default:
        return "invalid";
    }
}
