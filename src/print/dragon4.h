/*
 * dragon4.h - decimal text of binary floating-point values, digit for digit
 * as numpy prints them (numpy's format_float_positional and
 * format_float_scientific, which use Steele & White's Dragon4 with exact
 * big-integer arithmetic).  Internal to libhcb; the float formats (float.c) are
 * the user.
 */
#ifndef HCB_DRAGON4_H
#define HCB_DRAGON4_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A finite or special value taken apart: value = mantissa * 2^exponent. */
typedef struct hcb__fp {
    uint64_t mantissa;
    int32_t exponent;
    uint32_t mantissa_bit; /* index of the highest bit of the significand */
    bool unequal_margins;  /* the value is a power of two above the least
                              normal: the next lower value is closer */
    bool negative;         /* sign bit (negative zero and NaNs included) */
    bool inf, nan;
} hcb__fp;

/* Takes apart an IEEE-754-style binary value: `bits` holds `mbits` fraction
 * bits under `ebits` exponent bits under a sign bit. */
void hcb__fp_from_bits(hcb__fp *f, uint64_t bits, int mbits, int ebits);

/* How trailing zeros are trimmed (numpy's `trim`). */
typedef enum hcb__trim {
    HCB__TRIM_KEEP,  /* 'k': keep them, pad to the precision */
    HCB__TRIM_ZEROS, /* '.': drop them, keep the point: "1." */
    HCB__TRIM_ONE,   /* '0': keep one zero: "1.0" */
    HCB__TRIM_POINT  /* '-': drop zeros and the point: "1" */
} hcb__trim;

typedef struct hcb__d4_options {
    bool scientific;    /* d.ddde+XX, else positional ddd.ddd */
    bool unique;        /* shortest digits that read back (else exact) */
    int32_t precision;  /* digits after the point at most, -1: no limit */
    int32_t min_digits; /* digits after the point at least, -1: none */
    hcb__trim trim;
    bool sign;          /* print '+' for positive values */
    int32_t pad_left;   /* width left of the point, -1: none */
    int32_t pad_right;  /* width right of the point (positional), -1 */
    int32_t exp_digits; /* exponent digits at least (scientific), -1: 2 */
} hcb__d4_options;

/* The longest text hcb__d4_format writes, NUL included, when precision,
 * min_digits and the pads are at most HCB__D4_MAX_PRECISION. */
#define HCB__D4_MAX_PRECISION 400 /* = HCB_PRINT_MAX_PRECISION (hcb.h) */
#define HCB__D4_BUFSIZE       2048

/* Formats a finite `f` into `buf` (HCB__D4_BUFSIZE bytes) and returns the
 * length.  Special values are the caller's business. */
size_t hcb__d4_format(char *buf, const hcb__fp *f, const hcb__d4_options *o);

#endif /* HCB_DRAGON4_H */
