/*
 * test_print.c - hcb_format_array against numpy: element types, layout,
 * the snprintf contract, errors, out of memory and reentrancy
 * (print_check.h says where the expected texts come from).
 */
#include "print_check.h"

/* ---- element types ------------------------------------------------------- */

static void
test_bool(void **state)
{
    (void)state;
    /* np.array([True, False, True]) */
    CHECK_1D(uint8_t, HCB_BOOL, NULL, "[ True False  True]", 1, 0, 1);
    /* np.array(True), np.array(False): no room kept for " True" */
    CHECK_0D(uint8_t, HCB_BOOL, NULL, "True", 1);
    CHECK_0D(uint8_t, HCB_BOOL, NULL, "False", 0);
    /* numpy reads any non-zero byte as True */
    CHECK_0D(uint8_t, HCB_BOOL, NULL, "True", 0x80);
}

static void
test_integer_extremes(void **state)
{
    (void)state;
    /* np.array([-128, 0, 127], np.int8) */
    CHECK_1D(int8_t, HCB_S8, NULL, "[-128    0  127]", INT8_MIN, 0, INT8_MAX);
    /* np.array([-32768, 32767], np.int16) */
    CHECK_1D(int16_t, HCB_S16, NULL, "[-32768  32767]", INT16_MIN, INT16_MAX);
    /* np.array([-2147483648, 2147483647], np.int32) */
    CHECK_1D(int32_t, HCB_S32, NULL, "[-2147483648  2147483647]", INT32_MIN,
             INT32_MAX);
    /* np.array([-2**63, 0, 2**63 - 1], np.int64) */
    CHECK_1D(int64_t, HCB_S64, NULL,
             "[-9223372036854775808                    0  "
             "9223372036854775807]",
             INT64_MIN, 0, INT64_MAX);
    /* np.array([0, 255], np.uint8) */
    CHECK_1D(uint8_t, HCB_U8, NULL, "[  0 255]", 0, UINT8_MAX);
    /* np.array([0, 65535], np.uint16) */
    CHECK_1D(uint16_t, HCB_U16, NULL, "[    0 65535]", 0, UINT16_MAX);
    /* np.array([0, 2**32 - 1], np.uint32) */
    CHECK_1D(uint32_t, HCB_U32, NULL, "[         0 4294967295]", 0, UINT32_MAX);
    /* np.array([0, 7, 2**64 - 1], np.uint64) */
    CHECK_1D(uint64_t, HCB_U64, NULL,
             "[                   0                    7 "
             "18446744073709551615]",
             0, 7, UINT64_MAX);
    /* np.array([1, -2, 30]) */
    CHECK_1D(int64_t, HCB_S64, NULL, "[ 1 -2 30]", 1, -2, 30);
    /* np.array(5) */
    CHECK_0D(int32_t, HCB_S32, NULL, "5", 5);
    /* np.array(-2**63) */
    CHECK_0D(int64_t, HCB_S64, NULL, "-9223372036854775808", INT64_MIN);
}

static void
test_sign(void **state)
{
    hcb_print_options plus = defaults(), space = defaults();

    (void)state;
    plus.sign = '+';
    space.sign = ' ';
    /* np.array2string(np.array([1, 2, 30]), sign='+') */
    CHECK_1D(int64_t, HCB_S64, &plus, "[ +1  +2 +30]", 1, 2, 30);
    /* np.array2string(np.array([1, -2, 30]), sign='+') */
    CHECK_1D(int64_t, HCB_S64, &plus, "[ +1  -2 +30]", 1, -2, 30);
    /* np.array2string(np.array([1, 2, 30]), sign=' ') */
    CHECK_1D(int64_t, HCB_S64, &space, "[  1   2  30]", 1, 2, 30);
    /* np.array2string(np.array([1, -2, 30]), sign=' '): a minus already
     * holds the sign column */
    CHECK_1D(int64_t, HCB_S64, &space, "[ 1 -2 30]", 1, -2, 30);
    /* np.array2string(np.array([0, 2**64 - 1], np.uint64), sign='+') */
    CHECK_1D(uint64_t, HCB_U64, &plus,
             "[                   +0 +18446744073709551615]", 0, UINT64_MAX);
    /* np.array2string(np.array(5), sign='+') */
    CHECK_0D(int32_t, HCB_S32, &plus, "+5", 5);
    /* np.array2string(np.array([1.5, 2.]), sign='+') */
    CHECK_1D(double, HCB_F64, &plus, "[+1.5 +2. ]", 1.5, 2.0);
    /* np.array2string(np.array([1.5, 2.]), sign=' ') */
    CHECK_1D(double, HCB_F64, &space, "[ 1.5  2. ]", 1.5, 2.0);
    /* np.array2string(np.array([1.5, -2.]), sign=' ') */
    CHECK_1D(double, HCB_F64, &space, "[ 1.5 -2. ]", 1.5, -2.0);
}

static void
test_float64_notation(void **state)
{
    (void)state;
    /* np.array([1., 2.5]) */
    CHECK_1D(double, HCB_F64, NULL, "[1.  2.5]", 1.0, 2.5);
    /* np.array([1e8, 1.]): max >= 1e8 */
    CHECK_1D(double, HCB_F64, NULL, "[1.e+08 1.e+00]", 1e8, 1.0);
    /* np.array([99999999., 1.]): just below; the ratio decides */
    CHECK_1D(double, HCB_F64, NULL, "[9.9999999e+07 1.0000000e+00]", 99999999.0,
             1.0);
    /* np.array([5e-5, 2e-5]): min < 1e-4 */
    CHECK_1D(double, HCB_F64, NULL, "[5.e-05 2.e-05]", 5e-5, 2e-5);
    /* np.array([1e-4, 2e-4]): min == 1e-4 stays positional */
    CHECK_1D(double, HCB_F64, NULL, "[0.0001 0.0002]", 1e-4, 2e-4);
    /* np.array([1., 1000.]): ratio == 1000 stays positional */
    CHECK_1D(double, HCB_F64, NULL, "[   1. 1000.]", 1.0, 1000.0);
    /* np.array([1., 1000.5]): ratio > 1000 */
    CHECK_1D(double, HCB_F64, NULL, "[1.0000e+00 1.0005e+03]", 1.0, 1000.5);
    /* np.array([1e100, 1e8]): exponents padded to the widest */
    CHECK_1D(double, HCB_F64, NULL, "[1.e+100 1.e+008]", 1e100, 1e8);
    /* np.array([1e-300, 1.]) */
    CHECK_1D(double, HCB_F64, NULL, "[1.e-300 1.e+000]", 1e-300, 1.0);
    /* np.array([np.finfo(np.float64).max, -np.finfo(np.float64).max]) */
    CHECK_1D(double, HCB_F64, NULL, "[ 1.79769313e+308 -1.79769313e+308]",
             1.7976931348623157e308, -1.7976931348623157e308);
    /* np.array([2**-1074]), the least subnormal */
    CHECK_1D(double, HCB_F64, NULL, "[5.e-324]", 4.9406564584124654e-324);
    /* np.array(1.5) */
    CHECK_0D(double, HCB_F64, NULL, "1.5", 1.5);
}

static void
test_float32_and_float16(void **state)
{
    (void)state;
    /* np.array([0.1], np.float32): the shortest digits of the float32 */
    CHECK_1D(float, HCB_F32, NULL, "[0.1]", 0.1f);
    /* np.array(np.float32(0.1)) */
    CHECK_0D(float, HCB_F32, NULL, "0.1", 0.1f);
    /* np.array([1e6, 1.], np.float32): float32 switches at 1e6 */
    CHECK_1D(float, HCB_F32, NULL, "[1.e+06 1.e+00]", 1e6f, 1.0f);
    /* np.array([999999., 1.], np.float32) */
    CHECK_1D(float, HCB_F32, NULL, "[9.99999e+05 1.00000e+00]", 999999.0f,
             1.0f);
    /* np.array([60000, 1], np.float16): float16 switches at 1000 */
    CHECK_1D(uint16_t, HCB_F16, NULL, "[6.e+04 1.e+00]", 0x7b53, 0x3c00);
    /* np.array([999, 1], np.float16) */
    CHECK_1D(uint16_t, HCB_F16, NULL, "[999.   1.]", 0x63ce, 0x3c00);
    /* np.array([0.1, 1], np.float16) */
    CHECK_1D(uint16_t, HCB_F16, NULL, "[0.1 1. ]", 0x2e66, 0x3c00);
    /* np.array([1.0205, 0.00102], np.float16): the ratio is 1000.07 but
     * numpy divides in float16, where it rounds to 1000: positional */
    CHECK_1D(uint16_t, HCB_F16, NULL, "[1.0205  0.00102]", 0x3c15, 0x142e);
}

static void
test_bfloat16(void **state)
{
    (void)state;
    /* np.array([1.5, 10, -100, 0.1, 1e10], ml_dtypes.bfloat16): ml_dtypes
     * prints its scalars with %g and numpy joins them unpadded */
    CHECK_1D(uint16_t, HCB_BF16, NULL, "[1.5 10 -100 0.100098 9.99922e+09]",
             0x3fc0, 0x4120, 0xc2c8, 0x3dcd, 0x5015);
    /* np.array([1.5, np.nan, np.inf, -np.inf], ml_dtypes.bfloat16) */
    CHECK_1D(uint16_t, HCB_BF16, NULL, "[1.5 nan inf -inf]", 0x3fc0, 0x7fc0,
             0x7f80, 0xff80);
    /* np.array(1.5, ml_dtypes.bfloat16) */
    CHECK_0D(uint16_t, HCB_BF16, NULL, "1.5", 0x3fc0);
}

/* Sub-byte types come packed (XLA's layout, low bits first); ml_dtypes
 * prints their scalars as Python does and numpy joins them unpadded. */
static void
test_sub_byte(void **state)
{
    static const uint8_t nibbles[8] = {0x10, 0x32, 0x54, 0x76,
                                       0x98, 0xba, 0xdc, 0xfe};
    static const uint8_t crumbs[2] = {0xe4, 0x03}; /* 0 1 2 3 3 */
    static const uint8_t minus5 = 0x0b;
    const int64_t d2x8[2] = {2, 8}, d16[1] = {16}, d5[1] = {5};
    hcb_print_options o = defaults();
    uint8_t many[1000];
    const int64_t d2000[1] = {2000};
    size_t i;

    (void)state;
    /* np.arange(16, dtype=np.uint8).view(ml_dtypes.int4).reshape(2, 8) */
    check(HCB_S4, 2, d2x8, nibbles, NULL,
          "[[0 1 2 3 4 5 6 7]\n [-8 -7 -6 -5 -4 -3 -2 -1]]");
    /* ... .view(ml_dtypes.uint4) */
    check(HCB_U4, 1, d16, nibbles, NULL,
          "[0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15]");
    /* ... .view(ml_dtypes.float4_e2m1fn) */
    check(HCB_F4E2M1FN, 1, d16, nibbles, NULL,
          "[0 0.5 1 1.5 2 3 4 6 -0 -0.5 -1 -1.5 -2 -3 -4 -6]");
    /* np.array([0, 1, 2, 3, 3], np.uint8).view(ml_dtypes.uint2), int2 */
    check(HCB_U2, 1, d5, crumbs, NULL, "[0 1 2 3 3]");
    check(HCB_S2, 1, d5, crumbs, NULL, "[0 1 -2 -1 -1]");
    /* np.array(11, np.uint8).view(ml_dtypes.int4) */
    check(HCB_S4, 0, NULL, &minus5, NULL, "-5");
    /* (np.arange(2000) % 16).astype(np.uint8).view(ml_dtypes.int4), and
     * with sign="+" (which ml_dtypes' types ignore) */
    for (i = 0; i < sizeof many; i++)
        many[i] = nibbles[i % 8];
    check(HCB_S4, 1, d2000, many, NULL, "[0 1 2 ... -3 -2 -1]");
    o.sign = '+';
    check(HCB_S4, 1, d5, nibbles, &o, "[0 1 2 3 4]");
}

/* XLA's threads flush denormals to zero; the printer must not depend on
 * its caller's floating-point environment, and must give it back. */
static void
test_subnormals_under_flush_to_zero(void **state)
{
    const float tiny[2] = {1e-39f, 1.0f};
    const int64_t d2[1] = {2};

    (void)state;
#if defined(__x86_64__) || defined(__SSE2__)
    if (tu_under_valgrind())
        skip(); /* valgrind does not emulate MXCSR's FTZ and DAZ bits */
    {
        unsigned int csr;

        __asm__ volatile("stmxcsr %0" : "=m"(csr));
        csr |= 0x8040; /* FTZ | DAZ */
        __asm__ volatile("ldmxcsr %0" : : "m"(csr));
        /* np.array([1e-39, 1], np.float32) */
        check(HCB_F32, 1, d2, tiny, NULL, "[1.e-39 1.e+00]");
        CHECK_0D(float, HCB_F32, NULL, "1.e-39", 1e-39f);
        __asm__ volatile("stmxcsr %0" : "=m"(csr));
        assert_int_equal(csr & 0x8040, 0x8040);
        csr &= ~0x8040u;
        __asm__ volatile("ldmxcsr %0" : : "m"(csr));
    }
#endif
    check(HCB_F32, 1, d2, tiny, NULL, "[1.e-39 1.e+00]");
}

static void
test_complex(void **state)
{
    (void)state;
    /* np.array([1+2j, complex(np.nan, 1), complex(1, np.inf),
     *           -1.5-0.25j], np.complex64) */
    CHECK_1D_COMPLEX(float, HCB_C64, NULL,
                     "[ 1. +2.j    nan+1.j    1.  +infj -1.5-0.25j]", 1.0f,
                     2.0f, NAN, 1.0f, 1.0f, INFINITY, -1.5f, -0.25f);
    /* np.array([1+2j, 3-4.5j]) */
    CHECK_1D_COMPLEX(double, HCB_C128, NULL, "[1.+2.j  3.-4.5j]", 1.0, 2.0, 3.0,
                     -4.5);
    /* np.array([np.nan, 1.0+0j], np.complex64) */
    CHECK_1D_COMPLEX(float, HCB_C64, NULL, "[nan+0.j  1.+0.j]", NAN, 0.0f, 1.0f,
                     0.0f);
    {
        const double z[2] = {1.0, 2.0};

        /* np.array(1+2j) */
        check(HCB_C128, 0, NULL, z, NULL, "1.+2.j");
    }
}

static void
test_nonfinite_and_zero(void **state)
{
    hcb_print_options o = defaults();

    (void)state;
    /* np.array([1.5, np.nan, np.inf, -np.inf]) */
    CHECK_1D(double, HCB_F64, NULL, "[ 1.5  nan  inf -inf]", 1.5, NAN, INFINITY,
             -INFINITY);
    /* np.array([np.nan, np.inf]) */
    CHECK_1D(double, HCB_F64, NULL, "[nan inf]", NAN, INFINITY);
    /* np.array([np.nan, -np.inf]) */
    CHECK_1D(double, HCB_F64, NULL, "[ nan -inf]", NAN, -INFINITY);
    /* np.array([-0., 1.]) */
    CHECK_1D(double, HCB_F64, NULL, "[-0.  1.]", -0.0, 1.0);
    /* np.array([-0., 0.]) */
    CHECK_1D(double, HCB_F64, NULL, "[-0.  0.]", -0.0, 0.0);
    /* np.array(-0.) */
    CHECK_0D(double, HCB_F64, NULL, "-0.", -0.0);
    /* with np.printoptions(nanstr='NaN', infstr='Inf'):
     *     np.array([1.5, np.nan, -np.inf]) */
    strcpy(o.nanstr, "NaN");
    strcpy(o.infstr, "Inf");
    CHECK_1D(double, HCB_F64, &o, "[ 1.5  NaN -Inf]", 1.5, NAN, -INFINITY);
}

static void
test_precision_and_floatmode(void **state)
{
    hcb_print_options o = defaults();

    (void)state;
    /* np.array([0.001953125]): 8 digits end on a tie, which goes to even */
    CHECK_1D(double, HCB_F64, NULL, "[0.00195312]", 0.001953125);
    /* np.array([0.0009765625]) */
    CHECK_1D(double, HCB_F64, NULL, "[0.00097656]", 0.0009765625);
    /* np.array([0.125, 0.375]) */
    CHECK_1D(double, HCB_F64, NULL, "[0.125 0.375]", 0.125, 0.375);
    /* np.array2string(np.array([1., 0.5, 1/3]), floatmode='maxprec') */
    CHECK_1D(double, HCB_F64, NULL, "[1.         0.5        0.33333333]", 1.0,
             0.5, 1.0 / 3);

    o.floatmode = HCB_FLOATMODE_FIXED;
    /* np.array2string(np.array([1., 0.5, 1/3]), floatmode='fixed') */
    CHECK_1D(double, HCB_F64, &o, "[1.00000000 0.50000000 0.33333333]", 1.0,
             0.5, 1.0 / 3);
    /* np.array2string(np.array([1e20, 2.5e-3]), floatmode='fixed',
     *                 precision=2) */
    o.precision = 2;
    CHECK_1D(double, HCB_F64, &o, "[1.00e+20 2.50e-03]", 1e20, 2.5e-3);
    /* np.array2string(np.array([1., 0.5, 1/3]), floatmode='fixed',
     *                 precision=0) */
    o.precision = 0;
    CHECK_1D(double, HCB_F64, &o, "[1. 0. 0.]", 1.0, 0.5, 1.0 / 3);

    o.floatmode = HCB_FLOATMODE_UNIQUE;
    /* np.array2string(np.array([1., 0.5, 1/3]), floatmode='unique'):
     * precision (0 here) is ignored */
    CHECK_1D(double, HCB_F64, &o,
             "[1.                 0.5                0.3333333333333333]", 1.0,
             0.5, 1.0 / 3);
    /* np.array2string(np.array([1/3], np.float32), floatmode='unique') */
    CHECK_1D(float, HCB_F32, &o, "[0.33333334]", 1.0f / 3);

    o.floatmode = HCB_FLOATMODE_MAXPREC_EQUAL;
    o.precision = 8;
    /* np.array2string(np.array([1., 0.5, 0.25]), floatmode='maxprec_equal') */
    CHECK_1D(double, HCB_F64, &o, "[1.00 0.50 0.25]", 1.0, 0.5, 0.25);
    /* np.array2string(np.array([1e20, 2.5e-3]), floatmode='maxprec_equal') */
    CHECK_1D(double, HCB_F64, &o, "[1.0e+20 2.5e-03]", 1e20, 2.5e-3);
    /* np.array2string(np.array([1., 0.5, 1/3]), floatmode='maxprec_equal',
     *                 precision=3) */
    o.precision = 3;
    CHECK_1D(double, HCB_F64, &o, "[1.000 0.500 0.333]", 1.0, 0.5, 1.0 / 3);
}

static void
test_suppress(void **state)
{
    hcb_print_options o = defaults();

    (void)state;
    o.suppress = 1;
    /* np.array2string(np.array([1e-10, 1.]), suppress_small=True) */
    CHECK_1D(double, HCB_F64, &o, "[0. 1.]", 1e-10, 1.0);
    /* np.array2string(np.array([1e-10, 1.])) */
    CHECK_1D(double, HCB_F64, NULL, "[1.e-10 1.e+00]", 1e-10, 1.0);
    /* np.array2string(np.array([1e10, 1.]), suppress_small=True): large
     * values still switch */
    CHECK_1D(double, HCB_F64, &o, "[1.e+10 1.e+00]", 1e10, 1.0);
}

/* ---- layout -------------------------------------------------------------- */

static void
test_summarisation(void **state)
{
    static int64_t big[2000];
    int64_t small[60];
    double reals[10];
    const int64_t n2000[1] = {2000}, n10[1] = {10}, d46[2] = {4, 6},
                  d345[3] = {3, 4, 5};
    hcb_print_options o = defaults();
    int i;

    (void)state;
    for (i = 0; i < 2000; i++)
        big[i] = i;
    for (i = 0; i < 60; i++)
        small[i] = i;
    for (i = 0; i < 10; i++)
        reals[i] = i;
    /* np.arange(2000): more than threshold 1000 */
    check(HCB_S64, 1, n2000, big, NULL, "[   0    1    2 ... 1997 1998 1999]");

    o.threshold = 5;
    o.edgeitems = 2;
    /* np.array2string(np.arange(10), threshold=5, edgeitems=2) */
    check(HCB_S64, 1, n10, small, &o, "[0 1 ... 8 9]");
    /* np.array2string(np.arange(10), threshold=5, edgeitems=0): numpy
     * still shows a[-1] after the "..." */
    o.edgeitems = 0;
    check(HCB_S64, 1, n10, small, &o, "[... 9]");
    /* np.array2string(np.arange(10.), threshold=5, edgeitems=0): the
     * formatter still saw every element, hence "9." not "9" */
    check(HCB_F64, 1, n10, reals, &o, "[... 9.]");
    /* np.array2string(np.arange(10), threshold=5, edgeitems=5): nothing to
     * leave out */
    o.edgeitems = 5;
    check(HCB_S64, 1, n10, small, &o, "[0 1 2 3 4 5 6 7 8 9]");
    /* np.array2string(np.arange(24).reshape(4, 6), threshold=5,
     *                 edgeitems=1) */
    o.edgeitems = 1;
    check(HCB_S64, 2, d46, small, &o, "[[ 0 ...  5]\n ...\n [18 ... 23]]");
    /* np.array2string(np.arange(60).reshape(3, 4, 5), threshold=10,
     *                 edgeitems=1) */
    o.threshold = 10;
    check(HCB_S64, 3, d345, small, &o,
          "[[[ 0 ...  4]\n  ...\n  [15 ... 19]]\n\n ...\n\n"
          " [[40 ... 44]\n  ...\n  [55 ... 59]]]");
}

static void
test_wrapping_and_nesting(void **state)
{
    int64_t v[30], thousands[12];
    const int64_t n30[1] = {30}, d26[2] = {2, 6}, d234[3] = {2, 3, 4},
                  d2222[4] = {2, 2, 2, 2};
    hcb_print_options o = defaults();
    int i;

    (void)state;
    for (i = 0; i < 30; i++)
        v[i] = i;
    for (i = 0; i < 12; i++)
        thousands[i] = 1000 * i;
    /* np.arange(30): wraps before column 75 */
    check(HCB_S64, 1, n30, v, NULL,
          "[ 0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17 18 19 20 21 "
          "22 23\n 24 25 26 27 28 29]");
    /* np.array2string(np.arange(30), max_line_width=20) */
    o.linewidth = 20;
    check(HCB_S64, 1, n30, v, &o,
          "[ 0  1  2  3  4  5\n  6  7  8  9 10 11\n 12 13 14 15 16 17\n"
          " 18 19 20 21 22 23\n 24 25 26 27 28 29]");
    /* np.array2string(np.arange(12).reshape(2, 6) * 1000,
     *                 max_line_width=20) */
    check(HCB_S64, 2, d26, thousands, &o,
          "[[    0  1000\n   2000  3000\n   4000  5000]\n"
          " [ 6000  7000\n   8000  9000\n  10000 11000]]");
    /* np.arange(24).reshape(2, 3, 4): one blank line between blocks */
    check(HCB_S64, 3, d234, v, NULL,
          "[[[ 0  1  2  3]\n  [ 4  5  6  7]\n  [ 8  9 10 11]]\n\n"
          " [[12 13 14 15]\n  [16 17 18 19]\n  [20 21 22 23]]]");
    /* np.arange(16).reshape(2, 2, 2, 2): two between 3-d blocks */
    check(HCB_S64, 4, d2222, v, NULL,
          "[[[[ 0  1]\n   [ 2  3]]\n\n  [[ 4  5]\n   [ 6  7]]]\n\n\n"
          " [[[ 8  9]\n   [10 11]]\n\n  [[12 13]\n   [14 15]]]]");
}

/* An element printed as blanks (an empty infstr) ends the first line of a
 * row when it wraps right after it.  numpy then drops its newline together
 * with the indent: this once printed "[\n 1.5\n 2.5]". */
static void
test_wrap_after_blank_element(void **state)
{
    hcb_print_options o = defaults();

    (void)state;
    o.linewidth = 1;
    o.infstr[0] = '\0';
    /* with np.printoptions(infstr=''):
     *     np.array2string(np.array([np.inf, 1.5, 2.5]), max_line_width=1) */
    CHECK_1D(double, HCB_F64, &o, "[ 1.5\n 2.5]", INFINITY, 1.5, 2.5);
    /* with np.printoptions(infstr=''):
     *     np.array2string(np.array([[np.inf, -np.inf, 1.5],
     *                               [np.inf, 2.5, 1.0]], np.float16),
     *                     max_line_width=1) */
    {
        const uint16_t h[6] = {0x7c00, 0xfc00, 0x3e00, 0x7c00, 0x4100, 0x3c00};
        const int64_t d23[2] = {2, 3};

        check(HCB_F16, 2, d23, h, &o, "[[   -\n  1.5]\n [ 2.5\n  1. ]]");
    }
}

static void
test_empty_and_zero_d(void **state)
{
    const int64_t d20[2] = {2, 0}, d0[1] = {0}, d03[2] = {0, 3};

    (void)state;
    /* np.zeros((2, 0)) */
    check(HCB_F64, 2, d20, NULL, NULL, "[]");
    /* np.zeros(0) */
    check(HCB_F64, 1, d0, NULL, NULL, "[]");
    /* np.zeros((0, 3), np.int8) */
    check(HCB_S8, 2, d03, NULL, NULL, "[]");
    /* np.array(5) */
    CHECK_0D(int8_t, HCB_S8, NULL, "5", 5);
}

/* ---- the snprintf contract ----------------------------------------------- */

static void
test_snprintf_contract(void **state)
{
    const int64_t v[3] = {1, 2, 30};
    const int64_t d3[1] = {3};
    hcb_array a = view(HCB_S64, 1, d3, v);
    const char *full = "[ 1  2 30]"; /* np.array([1, 2, 30]) */
    size_t n = strlen(full), len = 0, cap;
    char buf[32];

    (void)state;
    /* cap 0 with no buffer measures */
    assert_int_equal(hcb_format_array(&a, NULL, NULL, 0, &len, NULL), HCB_OK);
    assert_int_equal(len, n);
    /* every smaller cap gives a NUL-terminated prefix, the full length, and
     * leaves the bytes past cap alone */
    for (cap = 1; cap <= n + 1; cap++) {
        memset(buf, '#', sizeof buf);
        len = 0;
        assert_int_equal(hcb_format_array(&a, NULL, buf, cap, &len, NULL),
                         HCB_OK);
        assert_int_equal(len, n);
        assert_int_equal(strlen(buf), cap - 1);
        assert_memory_equal(buf, full, cap - 1);
        assert_int_equal(buf[cap], '#');
    }
    /* len may be NULL */
    assert_int_equal(hcb_format_array(&a, NULL, buf, sizeof buf, NULL, NULL),
                     HCB_OK);
    assert_string_equal(buf, full);
}

/* ---- errors -------------------------------------------------------------- */

static void
test_option_errors(void **state)
{
    const int32_t v[2] = {1, 2};
    const int64_t d2[1] = {2};
    hcb_array a = view(HCB_S32, 1, d2, v);
    hcb_print_options o;
    hcb_error err;
    char buf[64] = "untouched";
    size_t len = 12345;

    (void)state;
    o = defaults();
    o.struct_size = sizeof o - 1;
    expect_error(hcb_format_array(&a, &o, buf, sizeof buf, &len, &err), &err,
                 HCB_EINVAL, "struct_size");
    /* an error writes no text and no length */
    assert_string_equal(buf, "untouched");
    assert_int_equal(len, 12345);

    o = defaults();
    o.precision = 401;
    expect_error(hcb_format_array(&a, &o, buf, sizeof buf, &len, &err), &err,
                 HCB_EINVAL, "precision is 401, expected 0..400");
    o.precision = -1;
    expect_error(hcb_format_array(&a, &o, buf, sizeof buf, &len, &err), &err,
                 HCB_EINVAL, "precision is -1");
    o = defaults();
    o.precision = 400; /* the largest allowed */
    assert_int_equal(hcb_format_array(&a, &o, buf, sizeof buf, &len, &err),
                     HCB_OK);

    o = defaults();
    o.sign = 'x';
    expect_error(hcb_format_array(&a, &o, buf, sizeof buf, &len, &err), &err,
                 HCB_EINVAL, "sign is 'x'");
    o = defaults();
    o.edgeitems = -1;
    expect_error(hcb_format_array(&a, &o, buf, sizeof buf, &len, &err), &err,
                 HCB_EINVAL, "edgeitems is -1");
    o = defaults();
    o.floatmode = (hcb_floatmode)7;
    expect_error(hcb_format_array(&a, &o, buf, sizeof buf, &len, &err), &err,
                 HCB_EINVAL, "floatmode is 7");
    o = defaults();
    memset(o.nanstr, 'n', sizeof o.nanstr); /* no NUL */
    expect_error(hcb_format_array(&a, &o, buf, sizeof buf, &len, &err), &err,
                 HCB_EINVAL, "NUL-terminated");
    /* a NULL err is allowed on the error path too */
    assert_int_equal(hcb_format_array(&a, &o, buf, sizeof buf, &len, NULL),
                     HCB_EINVAL);
}

static void
test_array_errors(void **state)
{
    const int32_t v[4] = {1, 2, 3, 4};
    const int64_t d4[1] = {4}, neg[1] = {-1};
    hcb_array a;
    hcb_error err;
    char buf[64];
    uint8_t f8[4] = {0};

    (void)state;
    /* hcb_print_supports is the printer's own answer, before any array */
    assert_true(hcb_print_supports(HCB_F32) && hcb_print_supports(HCB_BF16) &&
                hcb_print_supports(HCB_S4) && hcb_print_supports(HCB_BOOL));
    assert_false(
        hcb_print_supports(HCB_F8E5M2) || hcb_print_supports(HCB_F8E4M3FN) ||
        hcb_print_supports(HCB_TOKEN) || hcb_print_supports(HCB_INVALID));
    a = view(HCB_F8E5M2, 1, d4, f8);
    expect_error(hcb_format_array(&a, NULL, buf, sizeof buf, NULL, &err), &err,
                 HCB_EUNIMPL, "float8_e5m2");
    a = view(HCB_TOKEN, 0, NULL, NULL);
    expect_error(hcb_format_array(&a, NULL, buf, sizeof buf, NULL, &err), &err,
                 HCB_EUNIMPL, "cannot print dtype");
    a = view(HCB_S4, 1, d4, f8); /* 4 int4s are 2 packed bytes */
    a.nbytes = 4;
    expect_error(hcb_format_array(&a, NULL, buf, sizeof buf, NULL, &err), &err,
                 HCB_EINVAL,
                 "array of 4 int4 elements has 4 bytes, expected 2");

    a = view(HCB_S32, 1, d4, v);
    a.nbytes = 15;
    expect_error(hcb_format_array(&a, NULL, buf, sizeof buf, NULL, &err), &err,
                 HCB_EINVAL, "has 15 bytes, expected 16");
    a = view(HCB_S32, 1, d4, NULL);
    expect_error(hcb_format_array(&a, NULL, buf, sizeof buf, NULL, &err), &err,
                 HCB_EINVAL, "has no data");
    a = view(HCB_S32, 1, neg, v);
    a.nbytes = 0;
    expect_error(hcb_format_array(&a, NULL, buf, sizeof buf, NULL, &err), &err,
                 HCB_EINVAL, "negative dimension -1");
    a = view(HCB_S32, 1, d4, v);
    a.dims = NULL;
    expect_error(hcb_format_array(&a, NULL, buf, sizeof buf, NULL, &err), &err,
                 HCB_EINVAL, "no dims");
    a.rank = HCB_MAX_RANK + 1;
    expect_error(hcb_format_array(&a, NULL, buf, sizeof buf, NULL, &err), &err,
                 HCB_EINVAL, "rank 65");
    expect_error(hcb_format_array(NULL, NULL, buf, sizeof buf, NULL, &err),
                 &err, HCB_EINVAL, "NULL");
    a = view(HCB_S32, 1, d4, v);
    expect_error(hcb_format_array(&a, NULL, NULL, 8, NULL, &err), &err,
                 HCB_EINVAL, "buf is NULL");
}

/* ---- out of memory ------------------------------------------------------- */

/* Fails each allocation in turn: every call must fail cleanly (ENOMEM, no
 * leak) until there are enough allocations for it to succeed. */
static void
test_out_of_memory(void **state)
{
    static int64_t ints[40]; /* static: gcc sees `view` read it early */
    const int64_t d40[1] = {40};
    const hcb_array arrays[2] = {view(HCB_S64, 1, d40, ints),
                                 view(HCB_S64, 1, d40, ints)};
    const hcb_print_node nodes[3] = {NODE(TUPLE, 2, NULL, NULL),
                                     NODE(ARRAY, 0, NULL, NULL),
                                     NODE(ARRAY, 0, NULL, NULL)};
    char buf[OUT_CAP], want_value[OUT_CAP], want_array[OUT_CAP];
    hcb_error err;
    long k, before;
    int rc, which;

    (void)state;
    for (k = 0; k < 40; k++)
        ints[k] = k * 1000;
    assert_int_equal(hcb_format_array(&arrays[0], NULL, want_array,
                                      sizeof want_array, NULL, NULL),
                     HCB_OK);
    assert_int_equal(hcb_format_value(nodes, 3, arrays, 2, NULL, want_value,
                                      sizeof want_value, NULL, NULL),
                     HCB_OK);
    tu_install_allocator();
    for (which = 0; which < 2; which++) {
        for (k = 0;; k++) {
            assert_true(k < 100);
            before = atomic_load(&tu_live_allocs);
            tu_fail_alloc_after(k);
            if (which == 0)
                rc = hcb_format_array(&arrays[0], NULL, buf, sizeof buf, NULL,
                                      &err);
            else
                rc = hcb_format_value(nodes, 3, arrays, 2, NULL, buf,
                                      sizeof buf, NULL, &err);
            tu_fail_alloc_after(-1);
            assert_int_equal(atomic_load(&tu_live_allocs), before);
            if (rc == HCB_OK)
                break;
            expect_error(rc, &err, HCB_ENOMEM, "out of memory");
        }
        assert_string_equal(buf, which == 0 ? want_array : want_value);
    }
    hcb_set_allocator(NULL);
}

/* ---- reentrancy ---------------------------------------------------------- */

#define RE_THREADS 4
#define RE_ROUNDS  1000

typedef struct re_job {
    hcb_array a;
    char want[OUT_CAP];
    size_t want_len;
    int mismatches;
} re_job;

static void *
re_run(void *arg)
{
    re_job *job = arg;
    char buf[OUT_CAP];
    size_t len;
    int i;

    for (i = 0; i < RE_ROUNDS; i++) {
        len = 0;
        if (hcb_format_array(&job->a, NULL, buf, sizeof buf, &len, NULL) !=
                HCB_OK ||
            len != job->want_len || memcmp(buf, job->want, len + 1) != 0)
            job->mismatches++;
    }
    return NULL;
}

/* Four threads print four different arrays (integers, floats that need
 * Dragon4's big integers, complex with nan, bfloat16 that wraps) at once;
 * each text must be what one thread alone prints.  TSan checks the rest. */
static void
test_reentrant(void **state)
{
    static re_job jobs[RE_THREADS];
    static int64_t ints[60];
    static double reals[50];
    static float cplx[40];
    static uint16_t bf[40];
    static const int64_t d345[3] = {3, 4, 5}, d50[1] = {50}, d20[1] = {20},
                         d40[1] = {40};
    pthread_t threads[RE_THREADS];
    int i;

    (void)state;
    for (i = 0; i < 60; i++)
        ints[i] = (int64_t)i * i * i - 1000;
    for (i = 0; i < 50; i++)
        reals[i] = 1.0 / (i + 1) + (i % 7 == 0 ? 1e-9 : 0.0);
    for (i = 0; i < 40; i++)
        cplx[i] = i % 5 == 0 ? NAN : (float)i / 7.0f;
    for (i = 0; i < 40; i++)
        bf[i] = (uint16_t)(0x3f80 + 37 * i);
    jobs[0].a = view(HCB_S64, 3, d345, ints);
    jobs[1].a = view(HCB_F64, 1, d50, reals);
    jobs[2].a = view(HCB_C64, 1, d20, cplx);
    jobs[3].a = view(HCB_BF16, 1, d40, bf);
    for (i = 0; i < RE_THREADS; i++) {
        assert_int_equal(hcb_format_array(&jobs[i].a, NULL, jobs[i].want,
                                          sizeof jobs[i].want,
                                          &jobs[i].want_len, NULL),
                         HCB_OK);
        assert_true(jobs[i].want_len < sizeof jobs[i].want);
        jobs[i].mismatches = 0;
    }
    for (i = 0; i < RE_THREADS; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, re_run, &jobs[i]),
                         0);
    for (i = 0; i < RE_THREADS; i++)
        assert_int_equal(pthread_join(threads[i], NULL), 0);
    for (i = 0; i < RE_THREADS; i++)
        assert_int_equal(jobs[i].mismatches, 0);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bool),
        cmocka_unit_test(test_integer_extremes),
        cmocka_unit_test(test_sign),
        cmocka_unit_test(test_float64_notation),
        cmocka_unit_test(test_float32_and_float16),
        cmocka_unit_test(test_bfloat16),
        cmocka_unit_test(test_sub_byte),
        cmocka_unit_test(test_subnormals_under_flush_to_zero),
        cmocka_unit_test(test_complex),
        cmocka_unit_test(test_nonfinite_and_zero),
        cmocka_unit_test(test_precision_and_floatmode),
        cmocka_unit_test(test_suppress),
        cmocka_unit_test(test_summarisation),
        cmocka_unit_test(test_wrapping_and_nesting),
        cmocka_unit_test(test_wrap_after_blank_element),
        cmocka_unit_test(test_empty_and_zero_d),
        cmocka_unit_test(test_snprintf_contract),
        cmocka_unit_test(test_option_errors),
        cmocka_unit_test(test_array_errors),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_reentrant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
