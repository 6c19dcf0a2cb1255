/*
 * float.c - numpy's FloatingFormat: from the shown values of an array (or
 * one part of a complex array), positional or scientific notation and the
 * widths that align every value, then each value's text through dragon4.c.
 */
#include <math.h>
#include <string.h>

#include "base/common.h"
#include "print/print.h"

_Static_assert(HCB_PRINT_MAX_PRECISION == HCB__D4_MAX_PRECISION,
               "the printer's precision bound is dragon4's");

/* What hcb__fill_float gathers in its passes over the shown values. */
typedef struct float_scan {
    float_format *ff;
    size_t part; /* byte offset of the part (complex: 0 real, else imag) */
    size_t count, finite;
    double max_abs, min_abs; /* over finite non-zero values */
    size_t nonzero;
    bool any_neg_finite, any_neg_inf;
    hcb__d4_options first; /* the sizing pass's options */
    int32_t int_len, frac_len, exp_len;
} float_scan;

static void
scan_range(void *ctx, const char *elem)
{
    float_scan *s = ctx;
    hcb__fp f;
    double v;

    hcb__load_float(s->ff->type, elem + s->part, &f, &v);
    s->count++;
    if (f.nan || f.inf) {
        if (f.inf && f.negative)
            s->any_neg_inf = true;
        return;
    }
    s->finite++;
    if (f.negative)
        s->any_neg_finite = true;
    if (v != 0) {
        double a = fabs(v);

        if (s->nonzero == 0 || a > s->max_abs)
            s->max_abs = a;
        if (s->nonzero == 0 || a < s->min_abs)
            s->min_abs = a;
        s->nonzero++;
    }
}

static void
scan_sizes(void *ctx, const char *elem)
{
    float_scan *s = ctx;
    char buf[HCB__D4_BUFSIZE];
    const char *dot, *e;
    hcb__fp f;
    double v;
    size_t n;

    hcb__load_float(s->ff->type, elem + s->part, &f, &v);
    if (f.nan || f.inf)
        return;
    n = hcb__d4_format(buf, &f, &s->first);
    e = s->ff->exp_format ? memchr(buf, 'e', n) : NULL;
    if (e != NULL) {
        int32_t exp_len = (int32_t)(buf + n - e) - 1;

        if (exp_len > s->exp_len)
            s->exp_len = exp_len;
        n = (size_t)(e - buf);
    }
    dot = memchr(buf, '.', n);
    if (dot != NULL) {
        int32_t il = (int32_t)(dot - buf), fl = (int32_t)(n - (size_t)il - 1);

        if (il > s->int_len)
            s->int_len = il;
        if (fl > s->frac_len)
            s->frac_len = fl;
    }
}

/* numpy's choice of scientific notation, with its comparisons done in the
 * array's own type. */
static bool
wants_exp(hcb_dtype t, double max, double min, bool suppress)
{
    if (t == HCB_F64)
        return max >= 1e8 || (!suppress && (min < 0.0001 || max / min > 1000.));
    if (t == HCB_F32) {
        float ratio = (float)max / (float)min;

        return max >= 1e6 ||
               (!suppress && ((float)min < 0.0001f || ratio > 1000.f));
    } else {
        /* float16: 1e-4 rounds to 1.0001659393310547e-4, and the quotient
         * is rounded to float16, where 1000.25 ties to 1000. */
        float ratio = (float)max / (float)min;

        return max >= 1000. ||
               (!suppress && (min < 1.0001659393310547e-4 || ratio > 1000.25f));
    }
}

void
hcb__fill_float(float_format *ff, const shape *sh, size_t part, hcb_dtype type,
                char sign, const hcb_print_options *o)
{
    float_scan s;
    hcb_floatmode mode = o->floatmode;
    int32_t precision = mode == HCB_FLOATMODE_UNIQUE ? -1 : o->precision;
    hcb__d4_options *d = &ff->d4;

    memset(ff, 0, sizeof *ff);
    memset(&s, 0, sizeof s);
    ff->type = type;
    ff->o = o;
    ff->sign = sign;
    s.ff = ff;
    s.part = part;
    hcb__visit_shown(sh, 0, 0, scan_range, &s);
    if (s.nonzero > 0)
        ff->exp_format =
            wants_exp(type, s.max_abs, s.min_abs, o->suppress != 0);

    d->scientific = ff->exp_format;
    d->sign = sign == '+';
    d->pad_left = d->pad_right = d->exp_digits = -1;
    d->min_digits = -1;
    if (s.finite == 0) {
        ff->pad_left = ff->pad_right = 0;
        d->trim = HCB__TRIM_ZEROS;
        d->unique = true;
        d->precision = precision;
    } else {
        bool fixed = mode == HCB_FLOATMODE_FIXED;

        s.first = *d;
        s.first.precision = precision;
        s.first.unique = !fixed;
        s.first.trim = fixed ? HCB__TRIM_KEEP : HCB__TRIM_ZEROS;
        s.exp_len = -1;
        hcb__visit_shown(sh, 0, 0, scan_sizes, &s);
        d->unique = s.first.unique;
        if (ff->exp_format) {
            d->trim = HCB__TRIM_KEEP;
            d->precision = d->min_digits = s.frac_len;
            d->exp_digits = s.exp_len - 1;
            ff->pad_left = s.int_len;
            ff->pad_right = d->exp_digits + 2 + d->precision;
        } else {
            ff->pad_left = s.int_len;
            ff->pad_right = s.frac_len;
            if (fixed || mode == HCB_FLOATMODE_MAXPREC_EQUAL) {
                d->precision = d->min_digits = ff->pad_right;
                d->trim = HCB__TRIM_KEEP;
            } else {
                d->precision = precision;
                d->trim = HCB__TRIM_ZEROS;
                d->min_digits = 0;
            }
        }
    }
    if (sign == ' ' && !s.any_neg_finite)
        ff->pad_left++;
    if (s.count != s.finite) {
        int32_t neginf = sign != '-' || s.any_neg_inf;
        int32_t offset = ff->pad_right + 1;
        int32_t nan_need = (int32_t)strlen(o->nanstr) - offset;
        int32_t inf_need = (int32_t)strlen(o->infstr) + neginf - offset;

        if (nan_need > ff->pad_left)
            ff->pad_left = nan_need;
        if (inf_need > ff->pad_left)
            ff->pad_left = inf_need;
    }
    d->pad_left = ff->pad_left;
    if (!ff->exp_format)
        d->pad_right = ff->pad_right;
}

size_t
hcb__format_float(const float_format *ff, const char *p, char *out)
{
    hcb__fp f;
    double v;

    hcb__load_float(ff->type, p, &f, &v);
    if (f.nan || f.inf) {
        const char *word = f.nan ? ff->o->nanstr : ff->o->infstr;
        char sign = 0;
        int32_t n, width = ff->pad_left + ff->pad_right + 1;
        size_t pos = 0, wl = strlen(word);

        if (f.inf && f.negative)
            sign = '-';
        else if (ff->sign == '+')
            sign = '+';
        n = (int32_t)wl + (sign != 0);
        for (; n < width; n++)
            out[pos++] = ' ';
        if (sign != 0)
            out[pos++] = sign;
        memcpy(out + pos, word, wl);
        return pos + wl;
    }
    return hcb__d4_format(out, &f, &ff->d4);
}
