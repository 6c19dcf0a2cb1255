/*
 * dragon4.c - decimal digits of binary floats, exactly as numpy prints them.
 *
 * numpy prints floats with Dragon4 (Steele & White, "How to Print
 * Floating-Point Numbers Accurately", 1990; the free-format variant that
 * stops at the shortest digits that read back).  To print the same digits
 * in every case (ties, powers of two, subnormals, a precision cut-off that
 * lands before the shortest digits end), this file runs the same
 * algorithm: the value and its rounding margins as big integers scaled by
 * a power of ten, one digit per division.
 *
 * The big integers are small fixed arrays: the largest number involved is
 * about 2^1170 (a float64 subnormal times 10^324), so 40 blocks of 32 bits
 * hold every case with room to spare.
 */
#include <math.h>
#include <string.h>

#include "print/dragon4.h"

/* ---- big unsigned integers ------------------------------------------------
 */

#define BIG_BLOCKS 40

typedef struct big {
    uint32_t n; /* blocks in use; b[n - 1] != 0, or n == 0 for zero */
    uint32_t b[BIG_BLOCKS];
} big;

static void
big_set(big *x, uint64_t v)
{
    x->n = 0;
    while (v != 0) {
        x->b[x->n++] = (uint32_t)v;
        v >>= 32;
    }
}

static int
big_cmp(const big *x, const big *y)
{
    uint32_t i;

    if (x->n != y->n)
        return x->n < y->n ? -1 : 1;
    for (i = x->n; i-- > 0;)
        if (x->b[i] != y->b[i])
            return x->b[i] < y->b[i] ? -1 : 1;
    return 0;
}

static void
big_mul_small(big *x, uint32_t m)
{
    uint64_t carry = 0;
    uint32_t i;

    for (i = 0; i < x->n; i++) {
        uint64_t p = (uint64_t)x->b[i] * m + carry;

        x->b[i] = (uint32_t)p;
        carry = p >> 32;
    }
    if (carry != 0 && x->n < BIG_BLOCKS)
        x->b[x->n++] = (uint32_t)carry;
}

static void
big_mul_pow10(big *x, uint32_t e)
{
    static const uint32_t pow10[10] = {1,         10,        100,     1000,
                                       10000,     100000,    1000000, 10000000,
                                       100000000, 1000000000};

    for (; e >= 9; e -= 9)
        big_mul_small(x, pow10[9]);
    if (e > 0)
        big_mul_small(x, pow10[e]);
}

static void
big_shl(big *x, uint32_t shift)
{
    uint32_t words = shift / 32, bits = shift % 32, i;

    if (x->n == 0)
        return;
    if (x->n + words + 1 > BIG_BLOCKS) /* cannot happen for our formats */
        words = BIG_BLOCKS - x->n - 1;
    x->b[x->n + words] = 0;
    for (i = x->n; i-- > 0;) {
        if (bits != 0)
            x->b[i + words + 1] |= x->b[i] >> (32 - bits);
        x->b[i + words] = x->b[i] << bits;
    }
    for (i = 0; i < words; i++)
        x->b[i] = 0;
    x->n += words + 1;
    while (x->n > 0 && x->b[x->n - 1] == 0)
        x->n--;
}

static void
big_pow2(big *x, uint32_t e)
{
    big_set(x, 1);
    big_shl(x, e);
}

static void
big_add(big *r, const big *x, const big *y)
{
    const big *lo = x->n < y->n ? x : y, *hi = x->n < y->n ? y : x;
    uint64_t carry = 0;
    uint32_t i;

    for (i = 0; i < hi->n; i++) {
        uint64_t s = (uint64_t)hi->b[i] + (i < lo->n ? lo->b[i] : 0) + carry;

        r->b[i] = (uint32_t)s;
        carry = s >> 32;
    }
    r->n = hi->n;
    if (carry != 0 && r->n < BIG_BLOCKS)
        r->b[r->n++] = (uint32_t)carry;
}

/* x -= y, with x >= y. */
static void
big_sub(big *x, const big *y)
{
    int64_t borrow = 0;
    uint32_t i;

    for (i = 0; i < x->n; i++) {
        int64_t d = (int64_t)x->b[i] - (i < y->n ? y->b[i] : 0) - borrow;

        borrow = d < 0;
        x->b[i] = (uint32_t)(d + (borrow << 32));
    }
    while (x->n > 0 && x->b[x->n - 1] == 0)
        x->n--;
}

/* The next digit: value / scale (below 10 by construction), leaving the
 * remainder in value. */
static uint32_t
big_digit(big *value, const big *scale)
{
    uint32_t d = 0;

    while (big_cmp(value, scale) >= 0) {
        big_sub(value, scale);
        d++;
    }
    return d;
}

/* ---- taking values apart ---------------------------------------------------
 */

static uint32_t
log2_u64(uint64_t v)
{
    uint32_t r = 0;

    while (v >>= 1)
        r++;
    return r;
}

void
hcb__fp_from_bits(hcb__fp *f, uint64_t bits, int mbits, int ebits)
{
    uint64_t frac = bits & ((UINT64_C(1) << mbits) - 1);
    uint32_t emax = (UINT32_C(1) << ebits) - 1;
    uint32_t e = (uint32_t)(bits >> mbits) & emax;
    int32_t bias = (int32_t)(emax >> 1);

    memset(f, 0, sizeof *f);
    f->negative = (bits >> (mbits + ebits)) & 1;
    if (e == emax) {
        f->inf = frac == 0;
        f->nan = frac != 0;
    } else if (e != 0) {
        f->mantissa = (UINT64_C(1) << mbits) | frac;
        f->exponent = (int32_t)e - bias - mbits;
        f->mantissa_bit = (uint32_t)mbits;
        f->unequal_margins = e != 1 && frac == 0;
    } else {
        f->mantissa = frac;
        f->exponent = 1 - bias - mbits;
        f->mantissa_bit = frac != 0 ? log2_u64(frac) : 0;
    }
}

/* ---- the digits ------------------------------------------------------------
 */

#define MAX_DIGITS 1200

/* Digits of a finite value into `out`; *exp10 is the power of ten of the
 * first one.  `cutoff_max`/`cutoff_min` (-1: none) bound the digits: a
 * count of significant digits (`total`) or of digits after the point.
 * In unique mode digits stop once they identify the value (and at least
 * cutoff_min are out); else when the value is exhausted.  The last digit
 * is rounded: by the margins when only one side is reached, else to the
 * nearer, ties to even. */
static int
dragon4(const hcb__fp *f, bool unique, bool total, int32_t cutoff_max,
        int32_t cutoff_min, char *out, int32_t *exp10)
{
    big scale, value, mlow, mhigh_store, high_sum;
    big *mhigh = &mlow;
    bool even = (f->mantissa & 1) == 0, low = false, high = false, down;
    int32_t digit_exp, max_exp, min_exp;
    uint32_t digit = 0;
    int n = 0;

    if (f->mantissa == 0) {
        out[0] = '0';
        *exp10 = 0;
        return 1;
    }
    big_set(&value, f->mantissa);
    if (f->unequal_margins) {
        mhigh = &mhigh_store;
        if (f->exponent > 0) {
            big_shl(&value, (uint32_t)f->exponent + 2);
            big_set(&scale, 4);
            big_pow2(&mlow, (uint32_t)f->exponent);
            big_pow2(mhigh, (uint32_t)f->exponent + 1);
        } else {
            big_shl(&value, 2);
            big_pow2(&scale, (uint32_t)(-f->exponent + 2));
            big_set(&mlow, 1);
            big_set(mhigh, 2);
        }
    } else if (f->exponent > 0) {
        big_shl(&value, (uint32_t)f->exponent + 1);
        big_set(&scale, 2);
        big_pow2(&mlow, (uint32_t)f->exponent);
    } else {
        big_shl(&value, 1);
        big_pow2(&scale, (uint32_t)(-f->exponent + 1));
        big_set(&mlow, 1);
    }

    /* Estimate the power of ten of the first digit (at most one too low). */
    digit_exp = (int32_t)ceil((double)((int32_t)f->mantissa_bit + f->exponent) *
                                  0.30102999566398119521 -
                              0.69);
    if (cutoff_max >= 0 && !total && digit_exp <= -cutoff_max)
        digit_exp = -cutoff_max + 1;
    if (digit_exp > 0) {
        big_mul_pow10(&scale, (uint32_t)digit_exp);
    } else if (digit_exp < 0) {
        big_mul_pow10(&value, (uint32_t)-digit_exp);
        big_mul_pow10(&mlow, (uint32_t)-digit_exp);
    }
    if (mhigh != &mlow) {
        *mhigh = mlow;
        big_shl(mhigh, 1);
    }
    if (big_cmp(&value, &scale) >= 0) {
        digit_exp++;
    } else {
        big_mul_small(&value, 10);
        big_mul_small(&mlow, 10);
        if (mhigh != &mlow) {
            *mhigh = mlow;
            big_shl(mhigh, 1);
        }
    }

    max_exp = digit_exp - MAX_DIGITS;
    if (cutoff_max >= 0) {
        int32_t want = total ? digit_exp - cutoff_max : -cutoff_max;

        if (want > max_exp)
            max_exp = want;
    }
    min_exp = digit_exp;
    if (cutoff_min >= 0) {
        int32_t want = total ? digit_exp - cutoff_min : -cutoff_min;

        if (want < min_exp)
            min_exp = want;
    }
    *exp10 = digit_exp - 1;

    for (;;) {
        digit_exp--;
        digit = big_digit(&value, &scale);
        if (unique) {
            int c;

            big_add(&high_sum, &value, mhigh);
            c = big_cmp(&value, &mlow);
            low = even ? c <= 0 : c < 0;
            c = big_cmp(&high_sum, &scale);
            high = even ? c >= 0 : c > 0;
            if (((low || high) && digit_exp <= min_exp) || digit_exp == max_exp)
                break;
        } else if (value.n == 0 || digit_exp == max_exp) {
            break;
        }
        out[n++] = (char)('0' + digit);
        big_mul_small(&value, 10);
        if (unique) {
            big_mul_small(&mlow, 10);
            if (mhigh != &mlow) {
                *mhigh = mlow;
                big_shl(mhigh, 1);
            }
        }
    }

    down = low;
    if (low == high) {
        int c;

        big_shl(&value, 1);
        c = big_cmp(&value, &scale);
        down = c < 0 || (c == 0 && (digit & 1) == 0);
    }
    if (down || digit < 9) {
        out[n++] = (char)('0' + digit + (down ? 0 : 1));
        return n;
    }
    /* Round 9 up: carry into the first digit that is not a 9. */
    while (n > 0 && out[n - 1] == '9')
        n--;
    if (n == 0) {
        out[n++] = '1';
        *exp10 += 1;
    } else {
        out[n - 1]++;
    }
    return n;
}

/* ---- positional and scientific text ---------------------------------------
 */

/* After the digits: the point (unless trimmed away with it), then zeros up
 * to the digits asked for ('k') or a single zero ('0'). */
static size_t
finish_fraction(char *buf, size_t pos, int32_t *nfrac, const hcb__d4_options *o)
{
    int32_t want = o->unique ? o->min_digits : o->precision;

    if (o->trim != HCB__TRIM_POINT && *nfrac == 0)
        buf[pos++] = '.';
    if (o->trim == HCB__TRIM_ONE && *nfrac == 0) {
        buf[pos++] = '0';
        (*nfrac)++;
    } else if (o->trim == HCB__TRIM_KEEP) {
        for (; *nfrac < want; (*nfrac)++)
            buf[pos++] = '0';
    }
    return pos;
}

static size_t
trim_zeros(char *buf, size_t pos, int32_t *nfrac, hcb__trim trim)
{
    if (trim == HCB__TRIM_KEEP || *nfrac <= 0)
        return pos;
    while (buf[pos - 1] == '0') {
        pos--;
        (*nfrac)--;
    }
    if (buf[pos - 1] == '.') {
        if (trim == HCB__TRIM_ONE) {
            buf[pos++] = '0';
            (*nfrac)++;
        } else if (trim == HCB__TRIM_POINT) {
            pos--;
        }
    }
    return pos;
}

static size_t
positional(char *buf, const hcb__fp *f, const hcb__d4_options *o)
{
    char digits[MAX_DIGITS + 1];
    int32_t exp10, nwhole, nfrac = 0, i;
    int has_sign = f->negative || o->sign;
    int n = dragon4(f, o->unique, false, o->precision, o->min_digits, digits,
                    &exp10);
    size_t pos = 0;

    if (has_sign)
        buf[pos++] = f->negative ? '-' : '+';
    if (exp10 >= 0) {
        nwhole = exp10 + 1;
        for (i = 0; i < n && i < nwhole; i++)
            buf[pos++] = digits[i];
        for (; i < nwhole; i++)
            buf[pos++] = '0';
        if (n > nwhole) {
            buf[pos++] = '.';
            for (i = nwhole; i < n; i++)
                buf[pos++] = digits[i];
            nfrac = n - nwhole;
        }
    } else {
        nwhole = 1;
        buf[pos++] = '0';
        buf[pos++] = '.';
        for (i = 0; i < -(exp10 + 1); i++)
            buf[pos++] = '0';
        memcpy(buf + pos, digits, (size_t)n);
        pos += (size_t)n;
        nfrac = n - exp10 - 1;
    }
    pos = finish_fraction(buf, pos, &nfrac, o);
    pos = trim_zeros(buf, pos, &nfrac, o->trim);

    if (o->pad_right >= nfrac) {
        if (o->trim == HCB__TRIM_POINT && nfrac == 0)
            buf[pos++] = ' ';
        for (i = nfrac; i < o->pad_right; i++)
            buf[pos++] = ' ';
    }
    if (o->pad_left > nwhole + has_sign) {
        size_t shift = (size_t)(o->pad_left - nwhole - has_sign);

        memmove(buf + shift, buf, pos);
        memset(buf, ' ', shift);
        pos += shift;
    }
    buf[pos] = '\0';
    return pos;
}

static size_t
scientific(char *buf, const hcb__fp *f, const hcb__d4_options *o)
{
    char digits[MAX_DIGITS + 1], expbuf[8];
    int32_t exp10, nfrac, i, lead = 1 + (f->negative || o->sign);
    int32_t min_exp_digits = o->exp_digits < 0 ? 2 : o->exp_digits;
    int n;
    size_t pos = 0, ne = 0;
    uint32_t e;

    for (i = lead; i < o->pad_left; i++)
        buf[pos++] = ' ';
    if (f->negative || o->sign)
        buf[pos++] = f->negative ? '-' : '+';
    n = dragon4(f, o->unique, true, o->precision < 0 ? -1 : o->precision + 1,
                o->min_digits < 0 ? -1 : o->min_digits + 1, digits, &exp10);
    buf[pos++] = digits[0];
    nfrac = n - 1;
    if (nfrac > 0) {
        buf[pos++] = '.';
        memcpy(buf + pos, digits + 1, (size_t)nfrac);
        pos += (size_t)nfrac;
    }
    pos = finish_fraction(buf, pos, &nfrac, o);
    if (o->trim != HCB__TRIM_KEEP && nfrac > 0) {
        while (buf[pos - 1] == '0')
            pos--;
        if (o->trim == HCB__TRIM_ONE && buf[pos - 1] == '.')
            buf[pos++] = '0';
    }

    buf[pos++] = 'e';
    buf[pos++] = exp10 < 0 ? '-' : '+';
    e = (uint32_t)(exp10 < 0 ? -exp10 : exp10);
    if (min_exp_digits > 5)
        min_exp_digits = 5;
    do {
        expbuf[ne++] = (char)('0' + e % 10);
        e /= 10;
    } while (e != 0);
    while ((int32_t)ne < min_exp_digits)
        expbuf[ne++] = '0';
    while (ne > 0)
        buf[pos++] = expbuf[--ne];
    buf[pos] = '\0';
    return pos;
}

size_t
hcb__d4_format(char *buf, const hcb__fp *f, const hcb__d4_options *o)
{
    return o->scientific ? scientific(buf, f, o) : positional(buf, f, o);
}
