/*
 * element.c - one element's text: reading elements of every dtype the
 * printer knows, and numpy's formats for integers (IntegerFormat), bools,
 * complex numbers (two float formats, float.c), bfloat16 and the sub-byte
 * types (as ml_dtypes prints them).  Also which dtypes the printer prints.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "print/print.h"

/* ---- reading elements -----------------------------------------------------
 */

static bool
is_float(hcb_dtype t)
{
    return t == HCB_F16 || t == HCB_F32 || t == HCB_F64;
}

static bool
is_complex(hcb_dtype t)
{
    return t == HCB_C64 || t == HCB_C128;
}

static bool
is_signed(hcb_dtype t)
{
    return t == HCB_S8 || t == HCB_S16 || t == HCB_S32 || t == HCB_S64;
}

static bool
is_unsigned(hcb_dtype t)
{
    return t == HCB_U8 || t == HCB_U16 || t == HCB_U32 || t == HCB_U64;
}

static int64_t
load_signed(hcb_dtype t, const void *p)
{
    switch (t) {
    case HCB_S8:
        return *(const int8_t *)p;
    case HCB_S16:
        return *(const int16_t *)p;
    case HCB_S32:
        return *(const int32_t *)p;
    default:
        return *(const int64_t *)p;
    }
}

static uint64_t
load_unsigned(hcb_dtype t, const void *p)
{
    switch (t) {
    case HCB_U8:
        return *(const uint8_t *)p;
    case HCB_U16:
        return *(const uint16_t *)p;
    case HCB_U32:
        return *(const uint32_t *)p;
    default:
        return *(const uint64_t *)p;
    }
}

/* One float of type t (F16, F32 or F64) taken apart, and its value. */
void
hcb__load_float(hcb_dtype t, const void *p, hcb__fp *f, double *v)
{
    if (t == HCB_F64) {
        uint64_t bits;

        memcpy(&bits, p, 8);
        memcpy(v, p, 8);
        hcb__fp_from_bits(f, bits, 52, 11);
    } else if (t == HCB_F32) {
        uint32_t bits;
        float x;

        memcpy(&bits, p, 4);
        memcpy(&x, p, 4);
        *v = x;
        hcb__fp_from_bits(f, bits, 23, 8);
    } else {
        uint16_t bits;

        memcpy(&bits, p, 2);
        hcb__fp_from_bits(f, bits, 10, 5);
        if (f->nan)
            *v = NAN;
        else if (f->inf)
            *v = f->negative ? -INFINITY : INFINITY;
        else
            *v = ldexp((double)f->mantissa, f->exponent) *
                 (f->negative ? -1 : 1);
    }
}

/* Sub-byte types, one element per byte as numpy keeps them (make_shape
 * unpacks them): ml_dtypes prints each element as its Python scalar does
 * and numpy joins those texts unpadded, like bfloat16's. */
bool
hcb__is_small_dtype(hcb_dtype t)
{
    return hcb_dtype_bits(t) > 0 && hcb_dtype_bits(t) < 8;
}

/* The value of a float4 (f4e2m1fn) element. */
static double
f4e2m1fn_value(unsigned v)
{
    /* 1 sign, 2 exponent (bias 1), 1 mantissa bit; no inf or nan */
    unsigned e = (v >> 1) & 3, m = v & 1;
    double x = e == 0 ? m * 0.5 : (1 + m * 0.5) * (double)(1u << e) / 2;

    return v & 8 ? -x : x;
}

/* One unpacked sub-byte element as text: a decimal integer, or float4's
 * value as ml_dtypes prints it (%g: "0.5", "-0", "6"). */
static size_t
format_small(hcb_dtype t, const void *p, char *out)
{
    unsigned v = *(const uint8_t *)p, bits = (unsigned)hcb_dtype_bits(t);
    double x;
    int len;

    v &= (1u << bits) - 1;
    if (t == HCB_F4E2M1FN) {
        x = f4e2m1fn_value(v);
        len = snprintf(out, 32, "%g", x);
    } else if (t == HCB_S2 || t == HCB_S4) {
        int sv = (v & (1u << (bits - 1))) ? (int)v - (1 << bits) : (int)v;

        len = snprintf(out, 32, "%d", sv);
    } else {
        len = snprintf(out, 32, "%u", v);
    }
    return len < 0 ? 0 : (size_t)len;
}

static float
bf16_value(const void *p)
{
    uint16_t h;
    uint32_t bits;
    float x;

    memcpy(&h, p, 2);
    bits = (uint32_t)h << 16;
    memcpy(&x, &bits, 4);
    return x;
}

/* ---- element formats -------------------------------------------------------
 */

static void
scan_int(void *ctx, const char *elem)
{
    elem_format *ef = ctx;

    if (is_unsigned(ef->type)) {
        uint64_t v = load_unsigned(ef->type, elem);

        if (!ef->any_value || v > ef->umax)
            ef->umax = v;
    } else {
        int64_t v = load_signed(ef->type, elem);

        if (!ef->any_value || v > ef->smax)
            ef->smax = v;
        if (!ef->any_value || v < ef->smin)
            ef->smin = v;
    }
    ef->any_value = true;
}

static int32_t
decimal_len_u(uint64_t v)
{
    int32_t n = 1;

    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

static int32_t
decimal_len_s(int64_t v)
{
    return v < 0 ? 1 + decimal_len_u(0 - (uint64_t)v)
                 : decimal_len_u((uint64_t)v);
}

/* numpy's IntegerFormat: the width of the longest of max and min. */
static void
fill_int(elem_format *ef, const shape *sh, char sign)
{
    int32_t max_len, min_len;
    bool max_nonneg;

    hcb__visit_shown(sh, 0, 0, scan_int, ef);
    if (is_unsigned(ef->type)) {
        max_len = decimal_len_u(ef->umax);
        min_len = 1;
        max_nonneg = true;
    } else {
        max_len = decimal_len_s(ef->smax);
        min_len = decimal_len_s(ef->smin);
        max_nonneg = ef->smax >= 0;
    }
    if (sign == ' ' && ef->smin < 0)
        sign = '-';
    if (max_nonneg && sign != '-')
        max_len++;
    ef->int_sign = sign;
    ef->int_width = max_len > min_len ? max_len : min_len;
}

static size_t
format_int(const elem_format *ef, const char *p, char *out)
{
    char digits[24];
    size_t n = 0, pos = 0;
    uint64_t mag;
    char sign = 0;
    int32_t width;

    if (is_unsigned(ef->type)) {
        mag = load_unsigned(ef->type, p);
    } else {
        int64_t v = load_signed(ef->type, p);

        mag = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
        if (v < 0)
            sign = '-';
    }
    if (sign == 0 && ef->int_sign != '-')
        sign = ef->int_sign;
    do {
        digits[n++] = (char)('0' + mag % 10);
        mag /= 10;
    } while (mag != 0);
    for (width = (int32_t)(n + (sign != 0)); width < ef->int_width; width++)
        out[pos++] = ' ';
    if (sign != 0)
        out[pos++] = sign;
    while (n > 0)
        out[pos++] = digits[--n];
    return pos;
}

void
hcb__fill_elem(elem_format *ef, const shape *sh, const hcb_print_options *o)
{
    memset(ef, 0, sizeof *ef);
    ef->type = sh->a->dtype;
    ef->zero_d = sh->rank == 0;
    if (is_signed(ef->type) || is_unsigned(ef->type)) {
        fill_int(ef, sh, o->sign);
    } else if (is_float(ef->type)) {
        hcb__fill_float(&ef->re, sh, 0, ef->type, o->sign, o);
    } else if (is_complex(ef->type)) {
        hcb_dtype part = ef->type == HCB_C64 ? HCB_F32 : HCB_F64;

        hcb__fill_float(&ef->re, sh, 0, part, o->sign, o);
        hcb__fill_float(&ef->im, sh, sh->item / 2, part, '+', o);
    }
}

/* One element's text into `out` (ELEM_BUFSIZE bytes); returns its length. */
size_t
hcb__format_elem(const elem_format *ef, const char *p, char *out)
{
    size_t n, m, end;

    if (hcb__is_small_dtype(ef->type))
        return format_small(ef->type, p, out);
    switch (ef->type) {
    case HCB_BOOL:
        if (*(const uint8_t *)p != 0) {
            n = ef->zero_d ? 4 : 5;
            memcpy(out, ef->zero_d ? "True" : " True", n);
            return n;
        }
        memcpy(out, "False", 5);
        return 5;
    case HCB_BF16: {
        /* ml_dtypes prints its scalars as C++ streams print floats (%g),
         * NaN without a sign; numpy joins those texts unpadded. */
        float x = bf16_value(p);
        int len = snprintf(out, 32, "%g", isnan(x) ? (double)NAN : (double)x);

        return len < 0 ? 0 : (size_t)len;
    }
    case HCB_C64:
    case HCB_C128:
        n = hcb__format_float(&ef->re, p, out);
        m = hcb__format_float(&ef->im, p + hcb_dtype_size(ef->type) / 2,
                              out + n);
        /* the 'j' goes before the imaginary part's trailing padding */
        for (end = n + m; end > n && out[end - 1] == ' '; end--)
            ;
        memmove(out + end + 1, out + end, n + m - end);
        out[end] = 'j';
        return n + m + 1;
    default:
        if (is_float(ef->type))
            return hcb__format_float(&ef->re, p, out);
        return format_int(ef, p, out);
    }
}

/* ---- numpy's str() of scalars ---------------------------------------------
 */

/* numpy's str() of one float scalar (scalartypes.c, genfloattype_str):
 * the shortest round-trip digits, positional for 1e-4 <= |x| < 1e16 (1e6
 * for float32, 1e3 for float16, as numpy 2 has it) and for zero, else
 * scientific; `trim` for positional, "1e+16" for
 * scientific; NaN never signed. */
static size_t
scalar_float_str(hcb_dtype t, const void *p, hcb__trim trim, bool sign,
                 char *out)
{
    hcb__d4_options d = {false, true, -1, -1, HCB__TRIM_POINT,
                         false, -1,   -1, -1};
    hcb__fp f;
    double v, a;

    hcb__load_float(t, p, &f, &v);
    if (f.nan) {
        memcpy(out, "nan", 3);
        return 3;
    }
    if (f.inf) {
        memcpy(out, f.negative ? "-inf" : sign ? "+inf" : "inf", 3 + 1);
        return f.negative || sign ? 4 : 3;
    }
    a = fabs(v);
    d.scientific = !(v == 0 || (a < (t == HCB_F16   ? 1e3
                                     : t == HCB_F32 ? 1e6
                                                    : 1e16) &&
                                a >= 1e-4));
    d.trim = d.scientific ? HCB__TRIM_POINT : trim;
    d.sign = sign;
    return hcb__d4_format(out, &f, &d);
}

/* numpy's str() of one complex scalar whose parts are of type `part`. */
static size_t
complex_str(hcb_dtype part, const char *p, char *out)
{
    const char *im = p + hcb_dtype_size(part);
    hcb__fp re;
    double v;
    size_t n = 0;

    /* numpy follows Python: "2j" for a real part of +0, else "(a+bj)",
     * both parts without trailing zeros, and non-finite parts spelled out */
    hcb__load_float(part, p, &re, &v);
    if (v == 0 && !re.negative) {
        n = scalar_float_str(part, im, HCB__TRIM_POINT, false, out);
        out[n++] = 'j';
        return n;
    }
    out[n++] = '(';
    n += scalar_float_str(part, p, HCB__TRIM_POINT, false, out + n);
    hcb__load_float(part, im, &re, &v);
    if (re.nan) /* numpy signs a NaN imaginary part, whatever its sign bit */
        out[n++] = '+';
    n += scalar_float_str(part, im, HCB__TRIM_POINT, true, out + n);
    memcpy(out + n, "j)", 2);
    return n + 2;
}

size_t
hcb__format_scalar_str(hcb_dtype t, const char *p, char *out)
{
    if (is_float(t))
        return scalar_float_str(t, p, HCB__TRIM_ONE, false, out);
    if (is_complex(t))
        return complex_str(t == HCB_C64 ? HCB_F32 : HCB_F64, p, out);
    return 0;
}

size_t
hcb__format_scalar_field(hcb_dtype t, const char *p, char *out)
{
    double v, c[2];
    float c64[2];
    hcb__fp f;

    /* format(x, "") of a numpy scalar formats the Python bool, int, float
     * or complex it converts to: a float is then a double, whose str is
     * numpy's float64 str (both are the shortest round-trip digits,
     * positional for 1e-4 <= |x| < 1e16). */
    if (is_float(t))
        hcb__load_float(t, p, &f, &v);
    else if (t == HCB_BF16)
        v = bf16_value(p);
    else if (t == HCB_F4E2M1FN)
        v = f4e2m1fn_value(*(const uint8_t *)p);
    else if (t == HCB_C64 || t == HCB_C128) {
        if (t == HCB_C64) {
            memcpy(c64, p, sizeof c64);
            c[0] = c64[0];
            c[1] = c64[1];
        } else {
            memcpy(c, p, sizeof c);
        }
        return complex_str(HCB_F64, (const char *)c, out);
    } else
        return 0;
    return scalar_float_str(HCB_F64, &v, HCB__TRIM_ONE, false, out);
}

/* ---- which dtypes the printer prints ---------------------------------------
 */

HCB_API bool
hcb_print_supports(hcb_dtype t)
{
    return t == HCB_BOOL || is_signed(t) || is_unsigned(t) || is_float(t) ||
           is_complex(t) || t == HCB_BF16 || hcb__is_small_dtype(t);
}
