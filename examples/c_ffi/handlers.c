/*
 * handlers.c - XLA FFI handlers written in plain C with the hcb SDK
 * (include/hcb/ffi.h), called from JAX through jax.ffi.ffi_call.  See
 * example.py for the Python side and docs/api.md ("C users") for how to build.
 *
 * Each handler is a body `int body(XLA_FFI_CallFrame *, hcb_error *)` that
 * returns HCB_OK or an error code after hcb_error_set; HCB_FFI_HANDLER
 * wraps it into an exported handler that answers XLA's metadata probe,
 * checks the stage and turns the error into the one the computation fails
 * with.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "hcb/ffi.h"

#define CHECK(expr)                                                            \
    do {                                                                       \
        int rc_ = (expr);                                                      \
        if (rc_ != HCB_OK)                                                     \
            return rc_;                                                        \
    } while (0)

/* ---- attributes of every kind ------------------------------------------- */

/* No operands.  Results: f32[16] with the value of every attribute, in the
 * order below, and u8[32] with the string `name`, '|', and config.label.
 * Attributes: flag (bool), i8, i16, i32, i64, u8, u16, u32, u64 (integers
 * of each width), f32, f64, name (string), weights (float32 array), offsets
 * (int64 array), config (dictionary: scale f64, label string, k any
 * integer). */
static int
attrs_body(XLA_FFI_CallFrame *frame, hcb_error *err)
{
    const XLA_FFI_Attrs *attrs = &frame->attrs, *config = NULL;
    hcb_array values, text;
    float *v;
    bool flag = false;
    int8_t i8 = 0;
    int16_t i16 = 0;
    int32_t i32 = 0;
    int64_t i64 = 0, k = 0;
    uint8_t u8 = 0;
    uint16_t u16 = 0;
    uint32_t u32 = 0;
    uint64_t u64 = 0;
    float f32 = 0;
    double f64 = 0, scale = 0, wsum = 0, osum = 0;
    const float *weights = NULL;
    const int64_t *offsets = NULL;
    size_t nweights = 0, noffsets = 0, i, name_len = 0, label_len = 0;
    const char *name = NULL, *label = NULL;
    char *out;

    CHECK(hcb_ffi_check_counts(frame, 0, 2, err));
    CHECK(hcb_ffi_result(frame, 0, HCB_F32, 1, &values, err));
    CHECK(hcb_ffi_result(frame, 1, HCB_U8, 1, &text, err));
    if (values.dims[0] != 16 || text.dims[0] != 32)
        return hcb_error_set(err, HCB_EINVAL,
                             "expected results f32[16] and u8[32]");
    CHECK(hcb_ffi_attr_bool(attrs, "flag", &flag, err));
    CHECK(hcb_ffi_attr_i8(attrs, "i8", &i8, err));
    CHECK(hcb_ffi_attr_i16(attrs, "i16", &i16, err));
    CHECK(hcb_ffi_attr_i32(attrs, "i32", &i32, err));
    CHECK(hcb_ffi_attr_i64(attrs, "i64", &i64, err));
    CHECK(hcb_ffi_attr_u8(attrs, "u8", &u8, err));
    CHECK(hcb_ffi_attr_u16(attrs, "u16", &u16, err));
    CHECK(hcb_ffi_attr_u32(attrs, "u32", &u32, err));
    CHECK(hcb_ffi_attr_u64(attrs, "u64", &u64, err));
    CHECK(hcb_ffi_attr_f32(attrs, "f32", &f32, err));
    CHECK(hcb_ffi_attr_f64(attrs, "f64", &f64, err));
    CHECK(hcb_ffi_attr_string(attrs, "name", &name, &name_len, err));
    CHECK(hcb_ffi_attr_array_f32(attrs, "weights", &weights, &nweights, err));
    CHECK(hcb_ffi_attr_array_i64(attrs, "offsets", &offsets, &noffsets, err));
    CHECK(hcb_ffi_attr_dict(attrs, "config", &config, err));
    CHECK(hcb_ffi_attr_f64(config, "scale", &scale, err));
    CHECK(hcb_ffi_attr_string(config, "label", &label, &label_len, err));
    CHECK(hcb_ffi_attr_int(config, "k", &k, err));

    for (i = 0; i < nweights; i++)
        wsum += weights[i];
    for (i = 0; i < noffsets; i++)
        osum += (double)offsets[i];
    v = (float *)values.data;
    v[0] = (float)flag;
    v[1] = (float)i8;
    v[2] = (float)i16;
    v[3] = (float)i32;
    v[4] = (float)i64;
    v[5] = (float)u8;
    v[6] = (float)u16;
    v[7] = (float)u32;
    v[8] = (float)u64;
    v[9] = (float)f32;
    v[10] = (float)f64;
    v[11] = (float)wsum;
    v[12] = (float)nweights;
    v[13] = (float)osum;
    v[14] = (float)scale;
    v[15] = (float)k;

    if (name_len + 1 + label_len > 32)
        return hcb_error_set(err, HCB_EINVAL,
                             "name and config.label do not fit 32 bytes");
    out = (char *)text.data;
    memset(out, 0, 32);
    memcpy(out, name, name_len);
    out[name_len] = '|';
    memcpy(out + name_len + 1, label, label_len);
    return HCB_OK;
}
HCB_FFI_HANDLER(hcb_example_attrs, attrs_body, 0)

/* ---- several results ---------------------------------------------------- */

/* x: f32[n], n > 0 -> mean f32[], min f32[], max f32[], argmax s32[]. */
static int
stats_body(XLA_FFI_CallFrame *frame, hcb_error *err)
{
    hcb_array x, mean, lo, hi, arg;
    const float *in;
    double sum = 0;
    int64_t i, n, best = 0;

    CHECK(hcb_ffi_check_counts(frame, 1, 4, err));
    CHECK(hcb_ffi_arg(frame, 0, HCB_F32, 1, &x, err));
    CHECK(hcb_ffi_result(frame, 0, HCB_F32, 0, &mean, err));
    CHECK(hcb_ffi_result(frame, 1, HCB_F32, 0, &lo, err));
    CHECK(hcb_ffi_result(frame, 2, HCB_F32, 0, &hi, err));
    CHECK(hcb_ffi_result(frame, 3, HCB_S32, 0, &arg, err));
    n = x.dims[0];
    if (n == 0)
        return hcb_error_set(err, HCB_EINVAL,
                             "the statistics of an empty "
                             "array are undefined");
    in = (const float *)x.data;
    *(float *)lo.data = *(float *)hi.data = in[0];
    for (i = 0; i < n; i++) {
        sum += in[i];
        if (in[i] < *(float *)lo.data)
            *(float *)lo.data = in[i];
        if (in[i] > in[best])
            best = i;
    }
    *(float *)hi.data = in[best];
    *(float *)mean.data = (float)(sum / (double)n);
    *(int32_t *)arg.data = (int32_t)best;
    return HCB_OK;
}
HCB_FFI_HANDLER(hcb_example_stats, stats_body, 0)

/* ---- layouts ------------------------------------------------------------ */

/* Copies the operand's memory, byte for byte, into the result (same number
 * of bytes, any shapes): with input_layouts/output_layouts this shows the
 * memory order XLA hands the handler. */
static int
raw_copy_body(XLA_FFI_CallFrame *frame, hcb_error *err)
{
    hcb_array x, out;

    CHECK(hcb_ffi_check_counts(frame, 1, 1, err));
    CHECK(hcb_ffi_arg(frame, 0, HCB_ANY_DTYPE, HCB_ANY_RANK, &x, err));
    CHECK(hcb_ffi_result(frame, 0, x.dtype, HCB_ANY_RANK, &out, err));
    if (x.nbytes != out.nbytes)
        return hcb_error_set(err, HCB_EINVAL,
                             "operand has %zu bytes, result %zu: expected "
                             "the same",
                             x.nbytes, out.nbytes);
    if (x.nbytes > 0)
        memcpy(out.data, x.data, x.nbytes);
    return HCB_OK;
}
HCB_FFI_HANDLER(hcb_example_raw_copy, raw_copy_body, 0)

/* ---- input_output_aliases ----------------------------------------------- */

static atomic_int in_place_calls;

/* x: f32[...] aliased to the result: x *= factor (f32 attribute), in
 * place when XLA gives the same buffer (it does with {0: 0}). */
static int
scale_in_place_body(XLA_FFI_CallFrame *frame, hcb_error *err)
{
    hcb_array x, out;
    float factor = 1, *y;
    size_t i, n;

    CHECK(hcb_ffi_check_counts(frame, 1, 1, err));
    CHECK(hcb_ffi_arg(frame, 0, HCB_F32, HCB_ANY_RANK, &x, err));
    CHECK(hcb_ffi_result(frame, 0, HCB_F32, x.rank, &out, err));
    CHECK(hcb_ffi_attr_f32(&frame->attrs, "factor", &factor, err));
    if (out.data == x.data)
        atomic_fetch_add(&in_place_calls, 1);
    else
        memcpy(out.data, x.data, x.nbytes);
    y = (float *)out.data;
    n = out.nbytes / sizeof *y;
    for (i = 0; i < n; i++)
        y[i] *= factor;
    return HCB_OK;
}
HCB_FFI_HANDLER(hcb_example_scale_in_place, scale_in_place_body, 0)

/* How many calls of hcb_example_scale_in_place found their result aliased
 * to their operand. */
HCB_API int hcb_example_in_place_calls(void);
HCB_API int
hcb_example_in_place_calls(void)
{
    return atomic_load(&in_place_calls);
}

/* ---- side effects ------------------------------------------------------- */

static atomic_int counter;

/* Any operands; one s32[] result: how many times it has run. */
static int
count_body(XLA_FFI_CallFrame *frame, hcb_error *err)
{
    hcb_array out;

    CHECK(hcb_ffi_check_counts(frame, -1, 1, err));
    CHECK(hcb_ffi_result(frame, 0, HCB_S32, 0, &out, err));
    *(int32_t *)out.data = atomic_fetch_add(&counter, 1) + 1;
    return HCB_OK;
}
HCB_FFI_HANDLER(hcb_example_count, count_body, 0)

HCB_API int hcb_example_count_get(void);
HCB_API int
hcb_example_count_get(void)
{
    return atomic_load(&counter);
}

/* ---- vmap -----------------------------------------------------------------
 */

static atomic_int add_calls;
static atomic_long add_last_shape; /* batch of x * 1000 + batch of y */

/* Leading dimensions as one batch size (1 for rank 1). */
static int64_t
batch_of(const hcb_array *a)
{
    return a->rank == 2 ? a->dims[0] : 1;
}

/* x: f32[n] or f32[b, n], y likewise -> x + y, broadcasting a batch of 1:
 * what vmap hands it with "sequential" (one element per call),
 * "expand_dims" (unbatched operands get a leading 1) and "broadcast_all"
 * (every operand has the batch). */
static int
add_body(XLA_FFI_CallFrame *frame, hcb_error *err)
{
    hcb_array x, y, out;
    const float *px, *py;
    float *po;
    int64_t b, n, i, j, bx, by;

    CHECK(hcb_ffi_check_counts(frame, 2, 1, err));
    CHECK(hcb_ffi_arg(frame, 0, HCB_F32, HCB_ANY_RANK, &x, err));
    CHECK(hcb_ffi_arg(frame, 1, HCB_F32, x.rank, &y, err));
    CHECK(hcb_ffi_result(frame, 0, HCB_F32, x.rank, &out, err));
    if (x.rank < 1 || x.rank > 2)
        return hcb_error_set(err, HCB_EINVAL,
                             "expected operands of rank 1 or 2, got %d",
                             (int)x.rank);
    n = x.dims[x.rank - 1];
    bx = batch_of(&x), by = batch_of(&y), b = batch_of(&out);
    if (y.dims[y.rank - 1] != n || out.dims[out.rank - 1] != n ||
        (bx != b && bx != 1) || (by != b && by != 1))
        return hcb_error_set(err, HCB_EINVAL,
                             "operand shapes do not "
                             "broadcast to the result");
    px = (const float *)x.data, py = (const float *)y.data;
    po = (float *)out.data;
    for (i = 0; i < b; i++)
        for (j = 0; j < n; j++)
            po[i * n + j] =
                px[(bx == 1 ? 0 : i) * n + j] + py[(by == 1 ? 0 : i) * n + j];
    atomic_fetch_add(&add_calls, 1);
    atomic_store(&add_last_shape, (long)(bx * 1000 + by));
    return HCB_OK;
}
HCB_FFI_HANDLER(hcb_example_add, add_body, 0)

/* Calls of hcb_example_add so far, and the batch sizes of x and y in the
 * last one (bx * 1000 + by). */
HCB_API int hcb_example_add_calls(void);
HCB_API int
hcb_example_add_calls(void)
{
    return atomic_load(&add_calls);
}

HCB_API long hcb_example_add_last_batches(void);
HCB_API long
hcb_example_add_last_batches(void)
{
    return atomic_load(&add_last_shape);
}

/* ---- errors ---------------------------------------------------------------
 */

/* Always fails, with a message that names the `reason` attribute. */
static int
fail_body(XLA_FFI_CallFrame *frame, hcb_error *err)
{
    const char *reason = "";
    size_t len = 0;

    CHECK(hcb_ffi_attr_string(&frame->attrs, "reason", &reason, &len, err));
    return hcb_error_set(err, HCB_EINVAL, "refused: %.*s", (int)len, reason);
}
HCB_FFI_HANDLER(hcb_example_fail, fail_body, 0)

/* ---- a legacy custom call -------------------------------------------------
 */

/* The untyped API that predates the FFI (custom_call_api_version 3,
 * "status returning unified"): flat pointers and the opaque
 * legacy_backend_config string, here a scale factor such as "2.5".  Such
 * a function cannot fail visibly from outside jaxlib (XLA's
 * XlaCustomCallStatusSetFailure is not exported), one reason to prefer the
 * typed handlers above.  x: f32[4] -> f32[4]. */
HCB_API void hcb_example_legacy_scale(void *out, const void **in,
                                      const char *opaque, size_t opaque_len,
                                      void *status);
HCB_API void
hcb_example_legacy_scale(void *out, const void **in, const char *opaque,
                         size_t opaque_len, void *status)
{
    const float *x = (const float *)in[0];
    float *y = (float *)out, scale = 0;
    char buf[32];
    size_t n = opaque_len < sizeof buf - 1 ? opaque_len : sizeof buf - 1;
    int i;

    (void)status;
    memcpy(buf, opaque, n);
    buf[n] = '\0';
    scale = strtof(buf, NULL);
    for (i = 0; i < 4; i++)
        y[i] = x[i] * scale;
}

/* ---- the cheapest handler ---------------------------------------------------
 */

/* Result aliases the operand; does nothing (the floor a benchmark compares
 * callbacks with). */
static int
empty_body(XLA_FFI_CallFrame *frame, hcb_error *err)
{
    (void)frame, (void)err;
    return HCB_OK;
}
HCB_FFI_HANDLER(hcb_example_empty, empty_body, 0)
