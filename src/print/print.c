/*
 * print.c - numpy.array2string in C, and id_print's layout of containers.
 *
 * The text is numpy's, character for character (numpy 2.x, default
 * `legacy`): this file follows numpy's arrayprint module step by step.
 *
 *   1. Pick the elements that will be shown (all, or `edgeitems` at each
 *      end of every axis when the array has more than `threshold`).
 *   2. Build one element formatter from the shown elements only: for
 *      integers the widest text; for floats positional or scientific
 *      notation, then the widest integer and fraction parts of the shortest
 *      digits (dragon4.c), so that every element gets the same width.
 *   3. Lay the elements out: brackets per axis, rows wrapped before
 *      `linewidth`, blank lines between blocks of higher axes, "..." where
 *      elements were left out.
 *
 * hcb_format_value puts such arrays in tuples, lists and dicts the way
 * JAX's pretty printer lays out id_print's value: a container goes on one
 * line when it fits, else one child per line, nested two columns deeper.
 */
#include <fenv.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "print/dragon4.h"

_Static_assert(HCB_PRINT_MAX_PRECISION == HCB__D4_MAX_PRECISION,
               "the printer's precision bound is dragon4's");

/* ---- growing text buffers -------------------------------------------------
 */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

static void
sb_reserve(sbuf *s, size_t extra)
{
    size_t cap;
    char *p;

    if (s->oom || s->len + extra <= s->cap)
        return;
    cap = s->cap < 256 ? 256 : s->cap;
    while (cap < s->len + extra)
        cap *= 2;
    p = hcb__malloc(cap);
    if (p == NULL) {
        s->oom = true;
        return;
    }
    if (s->len > 0)
        memcpy(p, s->p, s->len);
    hcb__free(s->p);
    s->p = p;
    s->cap = cap;
}

/* Both return early for n == 0: s->p may still be NULL, and NULL + 0 is
 * undefined in C. */
static void
sb_put(sbuf *s, const char *t, size_t n)
{
    if (n == 0)
        return;
    sb_reserve(s, n);
    if (s->oom)
        return;
    memcpy(s->p + s->len, t, n);
    s->len += n;
}

static void
sb_putc(sbuf *s, char c)
{
    sb_put(s, &c, 1);
}

static void
sb_fill(sbuf *s, char c, size_t n)
{
    if (n == 0)
        return;
    sb_reserve(s, n);
    if (s->oom)
        return;
    memset(s->p + s->len, c, n);
    s->len += n;
}

/* Hands out the text with snprintf's contract. */
static int
sb_finish(sbuf *s, char *buf, size_t cap, size_t *len, hcb_error *err)
{
    if (s->oom) {
        hcb__free(s->p);
        return hcb_error_set(err, HCB_ENOMEM, "out of memory formatting");
    }
    if (cap > 0) {
        size_t n = s->len < cap - 1 ? s->len : cap - 1;

        if (n > 0)
            memcpy(buf, s->p, n);
        buf[n] = '\0';
    }
    if (len != NULL)
        *len = s->len;
    hcb__free(s->p);
    return HCB_OK;
}

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
static void
load_float(hcb_dtype t, const void *p, hcb__fp *f, double *v)
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
static bool
is_small(hcb_dtype t)
{
    return hcb_dtype_bits(t) > 0 && hcb_dtype_bits(t) < 8;
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
        /* 1 sign, 2 exponent (bias 1), 1 mantissa bit; no inf or nan */
        unsigned e = (v >> 1) & 3, m = v & 1;

        x = e == 0 ? m * 0.5 : (1 + m * 0.5) * (double)(1u << e) / 2;
        if (v & 8)
            x = -x;
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

/* ---- the shown elements ----------------------------------------------------
 */

/* What an array looks like to the layout: shape, strides in elements, and
 * whether (and how) it is summarised. */
typedef struct shape {
    const hcb_array *a;
    size_t item;
    int32_t rank;
    const int64_t *dims;
    size_t strides[HCB_MAX_RANK];
    bool summary;
    int64_t edge;
} shape;

typedef void (*visit_fn)(void *ctx, const char *elem);

/* Calls fn on every element that will be shown, in order. */
static void
visit(const shape *sh, int32_t axis, size_t offset, visit_fn fn, void *ctx)
{
    const char *base = sh->a->data;
    int64_t n, i, skip_from, skip_to;

    if (axis == sh->rank) {
        fn(ctx, base + offset * sh->item);
        return;
    }
    n = sh->dims[axis];
    /* numpy keeps a[:edge] and a[-edge:]; with edge 0 the second is all. */
    skip_from = skip_to = n;
    if (sh->summary && sh->edge > 0 && n > 2 * sh->edge) {
        skip_from = sh->edge;
        skip_to = n - sh->edge;
    }
    for (i = 0; i < n; i++) {
        if (i == skip_from)
            i = skip_to;
        visit(sh, axis + 1, offset + (size_t)i * sh->strides[axis], fn, ctx);
    }
}

/* ---- float formats (numpy's FloatingFormat) -------------------------------
 */

typedef struct float_format {
    hcb_dtype type; /* F16, F32 or F64 */
    const hcb_print_options *o;
    char sign;
    bool exp_format;
    hcb__d4_options d4; /* how each value is printed */
    int32_t pad_left, pad_right;
} float_format;

/* What fill_float gathers in its passes over the shown values. */
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

    load_float(s->ff->type, elem + s->part, &f, &v);
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

    load_float(s->ff->type, elem + s->part, &f, &v);
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

static void
fill_float(float_format *ff, const shape *sh, size_t part, hcb_dtype type,
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
    visit(sh, 0, 0, scan_range, &s);
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
        visit(sh, 0, 0, scan_sizes, &s);
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

static size_t
format_float(const float_format *ff, const char *p, char *out)
{
    hcb__fp f;
    double v;

    load_float(ff->type, p, &f, &v);
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

/* ---- element formats -------------------------------------------------------
 */

#define ELEM_BUFSIZE (2 * HCB__D4_BUFSIZE + 8)

typedef struct elem_format {
    hcb_dtype type;
    bool zero_d;
    /* integers */
    int32_t int_width;
    char int_sign;
    bool any_value;
    int64_t smax, smin;
    uint64_t umax;
    /* floats; complex: re and im */
    float_format re, im;
} elem_format;

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

    visit(sh, 0, 0, scan_int, ef);
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

static void
fill_elem(elem_format *ef, const shape *sh, const hcb_print_options *o)
{
    memset(ef, 0, sizeof *ef);
    ef->type = sh->a->dtype;
    ef->zero_d = sh->rank == 0;
    if (is_signed(ef->type) || is_unsigned(ef->type)) {
        fill_int(ef, sh, o->sign);
    } else if (is_float(ef->type)) {
        fill_float(&ef->re, sh, 0, ef->type, o->sign, o);
    } else if (is_complex(ef->type)) {
        hcb_dtype part = ef->type == HCB_C64 ? HCB_F32 : HCB_F64;

        fill_float(&ef->re, sh, 0, part, o->sign, o);
        fill_float(&ef->im, sh, sh->item / 2, part, '+', o);
    }
}

/* One element's text into `out` (ELEM_BUFSIZE bytes); returns its length. */
static size_t
format_elem(const elem_format *ef, const char *p, char *out)
{
    size_t n, m, end;

    if (is_small(ef->type))
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
        n = format_float(&ef->re, p, out);
        m = format_float(&ef->im, p + hcb_dtype_size(ef->type) / 2, out + n);
        /* the 'j' goes before the imaginary part's trailing padding */
        for (end = n + m; end > n && out[end - 1] == ' '; end--)
            ;
        memmove(out + end + 1, out + end, n + m - end);
        out[end] = 'j';
        return n + m + 1;
    default:
        if (is_float(ef->type))
            return format_float(&ef->re, p, out);
        return format_int(ef, p, out);
    }
}

/* ---- the layout (numpy's _formatArray) ------------------------------------
 */

typedef struct layout {
    const shape *sh;
    const elem_format *ef;
    sbuf *out;
    sbuf line; /* the row being filled */
    char word[ELEM_BUFSIZE];
} layout;

/* numpy builds a row with the hanging indent on its first line too, then
 * drops the first len(indent) characters of the whole row.  Those are the
 * indent, except when the first line is blank once right-stripped (an
 * element printed as spaces: an empty nanstr or infstr): then the drop eats
 * its newline and the next line's leading spaces.  `*skip` counts what is
 * still to drop. */
static void
put_row(sbuf *out, size_t *skip, const char *t, size_t n)
{
    /* t is NULL when the line buffer never got memory (then n is 0) */
    if (n <= *skip) {
        *skip -= n;
        return;
    }
    sb_put(out, t + *skip, n - *skip);
    *skip = 0;
}

/* numpy's _extendLine: wrap before `word` if the line would pass `width`,
 * unless the line holds only its indent. */
static void
extend_line(layout *l, size_t *skip, size_t indent, const char *word, size_t n,
            int64_t width)
{
    sbuf *line = &l->line;

    if ((int64_t)(line->len + n) > width && line->len > indent) {
        size_t end = line->len;

        while (end > 0 && line->p[end - 1] == ' ')
            end--;
        put_row(l->out, skip, line->p, end);
        put_row(l->out, skip, "\n", 1);
        line->len = 0;
        sb_fill(line, ' ', indent);
    }
    sb_put(line, word, n);
}

static void
layout_row(layout *l, size_t offset, size_t indent, int64_t width)
{
    const shape *sh = l->sh;
    int32_t axis = sh->rank - 1;
    int64_t n = sh->dims[axis], lead, i, elem_width = width - 1;
    bool summary = sh->summary && 2 * sh->edge < n;
    size_t skip = indent;
    size_t stride = sh->strides[axis];

    lead = summary ? sh->edge : 0;
    l->line.len = 0;
    sb_fill(&l->line, ' ', indent);
    for (i = 0; i < n; i++) {
        size_t wl;

        if (summary && i == lead) {
            extend_line(l, &skip, indent, "...", 3, elem_width);
            sb_putc(&l->line, ' ');
            i = n - sh->edge;
            if (i >= n - 1)
                i = n - 1;
        }
        wl = format_elem(l->ef,
                         (const char *)sh->a->data +
                             (offset + (size_t)i * stride) * sh->item,
                         l->word);
        extend_line(l, &skip, indent, l->word, wl, elem_width);
        if (i < n - 1)
            sb_putc(&l->line, ' ');
    }
    put_row(l->out, &skip, l->line.p, l->line.len);
}

static void
layout_axis(layout *l, int32_t axis, size_t offset, size_t indent,
            int64_t width)
{
    const shape *sh = l->sh;
    int64_t n = sh->dims[axis], i;
    bool summary = sh->summary && 2 * sh->edge < n;
    size_t lines = (size_t)(sh->rank - axis - 1);
    bool first = true;

    sb_putc(l->out, '[');
    if (axis == sh->rank - 1) {
        layout_row(l, offset, indent + 1, width);
        sb_putc(l->out, ']');
        return;
    }
    for (i = 0; i < n; i++) {
        if (summary && i == sh->edge) {
            if (!first)
                sb_fill(l->out, ' ', indent + 1);
            sb_put(l->out, "...", 3);
            sb_fill(l->out, '\n', lines);
            first = false;
            i = n - sh->edge;
            if (i >= n - 1)
                i = n - 1;
        }
        if (!first)
            sb_fill(l->out, ' ', indent + 1);
        first = false;
        layout_axis(l, axis + 1, offset + (size_t)i * sh->strides[axis],
                    indent + 1, width - 1);
        if (i < n - 1)
            sb_fill(l->out, '\n', lines);
    }
    sb_putc(l->out, ']');
}

/* ---- checks ----------------------------------------------------------------
 */

static int
check_options(const hcb_print_options *o, hcb_error *err)
{
    if (o->struct_size < sizeof *o)
        return hcb_error_set(err, HCB_EINVAL,
                             "print options have struct_size %zu, expected "
                             "%zu (use HCB_PRINT_OPTIONS_INIT)",
                             o->struct_size, sizeof *o);
    if (o->precision < 0 || o->precision > HCB_PRINT_MAX_PRECISION)
        return hcb_error_set(err, HCB_EINVAL,
                             "print option precision is %d, expected 0..%d",
                             (int)o->precision, HCB_PRINT_MAX_PRECISION);
    if (o->edgeitems < 0)
        return hcb_error_set(err, HCB_EINVAL,
                             "print option edgeitems is %d, expected >= 0",
                             (int)o->edgeitems);
    if (o->sign != '-' && o->sign != '+' && o->sign != ' ')
        return hcb_error_set(err, HCB_EINVAL,
                             "print option sign is '%c', expected '-', '+' "
                             "or ' '",
                             o->sign);
    if ((unsigned)o->floatmode > HCB_FLOATMODE_MAXPREC_EQUAL)
        return hcb_error_set(err, HCB_EINVAL,
                             "print option floatmode is %d, expected 0..3",
                             (int)o->floatmode);
    if (memchr(o->nanstr, '\0', sizeof o->nanstr) == NULL ||
        memchr(o->infstr, '\0', sizeof o->infstr) == NULL)
        return hcb_error_set(err, HCB_EINVAL,
                             "print options nanstr and infstr must be "
                             "NUL-terminated within %zu bytes",
                             sizeof o->nanstr);
    return HCB_OK;
}

static bool
printable(hcb_dtype t)
{
    return t == HCB_BOOL || is_signed(t) || is_unsigned(t) || is_float(t) ||
           is_complex(t) || t == HCB_BF16 || is_small(t);
}

/* Checks a view and fills `sh`; *nelems gets the element count.  The
 * layout reads sh->item bytes per element: for a sub-byte type, 1, from
 * the unpacked copy append_array makes. */
static int
make_shape(shape *sh, const hcb_array *a, const hcb_print_options *o,
           size_t *nelems, hcb_error *err)
{
    size_t n = 1;
    int32_t d;

    if (a == NULL)
        return hcb_error_set(err, HCB_EINVAL, "the array is NULL");
    if (!printable(a->dtype))
        return hcb_error_set(err, HCB_EUNIMPL,
                             "cannot print dtype %s (code %d)",
                             hcb_dtype_name(a->dtype), (int)a->dtype);
    if (a->rank < 0 || a->rank > HCB_MAX_RANK ||
        (a->rank > 0 && a->dims == NULL))
        return hcb_error_set(
            err, HCB_EINVAL, "array has rank %d%s, expected 0..%d with dims",
            (int)a->rank, a->dims == NULL ? " and no dims" : "", HCB_MAX_RANK);
    for (d = 0; d < a->rank; d++) {
        if (a->dims[d] < 0)
            return hcb_error_set(err, HCB_EINVAL,
                                 "array has negative dimension %lld",
                                 (long long)a->dims[d]);
        if (a->dims[d] != 0 && n > SIZE_MAX / 16 / (size_t)a->dims[d])
            return hcb_error_set(err, HCB_EINVAL, "array is too large");
        n *= (size_t)a->dims[d];
    }
    memset(sh, 0, offsetof(shape, strides));
    sh->a = a;
    sh->item = is_small(a->dtype) ? 1 : hcb_dtype_size(a->dtype);
    sh->rank = a->rank;
    sh->dims = a->dims;
    if (n > 0 && a->data == NULL)
        return hcb_error_set(err, HCB_EINVAL,
                             "array of %zu %s elements has no data (NULL)", n,
                             hcb_dtype_name(a->dtype));
    if (a->nbytes != hcb_dtype_nbytes(a->dtype, n))
        return hcb_error_set(err, HCB_EINVAL,
                             "array of %zu %s elements has %zu bytes, "
                             "expected %zu",
                             n, hcb_dtype_name(a->dtype), a->nbytes,
                             hcb_dtype_nbytes(a->dtype, n));
    if (a->rank > 0) {
        sh->strides[a->rank - 1] = 1;
        for (d = a->rank - 1; d > 0; d--)
            sh->strides[d - 1] = sh->strides[d] * (size_t)a->dims[d];
    }
    sh->summary = (int64_t)n > o->threshold && n > 0;
    sh->edge = o->edgeitems;
    *nelems = n;
    return HCB_OK;
}

/* ---- arrays ----------------------------------------------------------------
 */

static int
append_array(sbuf *out, const hcb_array *a, const hcb_print_options *o,
             hcb_error *err)
{
    shape sh;
    elem_format ef;
    hcb_array unpacked;
    size_t n = 0;
    int rc = make_shape(&sh, a, o, &n, err);

    if (rc != HCB_OK)
        return rc;
    if (n == 0) {
        sb_put(out, "[]", 2);
        return HCB_OK;
    }
    if (is_small(a->dtype)) { /* the layout reads one element per byte */
        unpacked = *a;
        unpacked.nbytes = n;
        unpacked.data = hcb__malloc(n);
        if (unpacked.data == NULL)
            return hcb_error_set(err, HCB_ENOMEM, "out of memory formatting");
        hcb_unpack_elements(a->dtype, a->data, n, unpacked.data);
        sh.a = a = &unpacked;
    }
    fill_elem(&ef, &sh, o);
    if (sh.rank == 0) {
        char word[ELEM_BUFSIZE];

        sb_put(out, word, format_elem(&ef, a->data, word));
    } else {
        layout l;

        memset(&l, 0, offsetof(layout, word));
        l.sh = &sh;
        l.ef = &ef;
        l.out = out;
        layout_axis(&l, 0, 0, 0, o->linewidth);
        hcb__free(l.line.p);
        if (l.line.oom)
            out->oom = true;
    }
    if (a == &unpacked)
        hcb__free(unpacked.data);
    return HCB_OK;
}

static const hcb_print_options default_options = HCB_PRINT_OPTIONS_INIT;

static int
format_array_in_default_env(const hcb_array *a, const hcb_print_options *opts,
                            char *buf, size_t cap, size_t *len, hcb_error *err)
{
    sbuf out = {0};
    int rc;

    if (opts == NULL)
        opts = &default_options;
    if (buf == NULL && cap > 0)
        return hcb_error_set(err, HCB_EINVAL, "buf is NULL but cap is %zu",
                             cap);
    rc = check_options(opts, err);
    if (rc == HCB_OK)
        rc = append_array(&out, a, opts, err);
    if (rc != HCB_OK) {
        hcb__free(out.p);
        return rc;
    }
    return sb_finish(&out, buf, cap, len, err);
}

/* The printer compares and scales values in double: under a caller's
 * flush-to-zero (XLA's threads set it) subnormals would print as 0, so it
 * runs in the default floating-point environment and restores the
 * caller's. */
HCB_API int
hcb_format_array(const hcb_array *a, const hcb_print_options *opts, char *buf,
                 size_t cap, size_t *len, hcb_error *err)
{
    fenv_t env;
    int rc;

    fegetenv(&env);
    fesetenv(FE_DFL_ENV);
    rc = format_array_in_default_env(a, opts, buf, cap, len, err);
    fesetenv(&env);
    return rc;
}

/* ---- values (JAX's pretty printer, as id_print uses it) -------------------
 */

typedef struct tree {
    const hcb_print_node *nodes;
    size_t nnodes;
    size_t *width; /* per node: its width on one line */
    size_t *start; /* per array node: where its text begins in `texts` */
    size_t *tlen;  /* per array node: its length */
    sbuf texts;
    const hcb_array *arrays;
    size_t narrays, next_array;
    const hcb_print_options *o;
    hcb_error *err;
    int rc;
} tree;

static const char *const opens[] = {"", "", "( ", "[ ", "{ "};
static const char *const closes[] = {"", "", " )", " ]", " }"};

/* Checks the subtree at `i`, formats its arrays, computes widths; returns
 * the index after it, or nnodes + 1 on error (t->rc says which). */
static size_t
measure(tree *t, size_t i, bool in_dict, int depth)
{
    const hcb_print_node *nd;
    size_t j, w;
    int32_t c;

    if (i >= t->nnodes || depth > 256) {
        t->rc =
            hcb_error_set(t->err, HCB_EINVAL,
                          i >= t->nnodes ? "print nodes end inside a container"
                                         : "print nodes nest too deep");
        return t->nnodes + 1;
    }
    nd = &t->nodes[i];
    if (in_dict && nd->key == NULL) {
        t->rc = hcb_error_set(t->err, HCB_EINVAL,
                              "print node %zu is in a dict but has no key", i);
        return t->nnodes + 1;
    }
    switch (nd->kind) {
    case HCB_PRINT_ARRAY:
        if (t->next_array >= t->narrays) {
            t->rc = hcb_error_set(t->err, HCB_EINVAL,
                                  "print nodes use more than the %zu arrays "
                                  "given",
                                  t->narrays);
            return t->nnodes + 1;
        }
        t->start[i] = t->texts.len;
        t->rc =
            append_array(&t->texts, &t->arrays[t->next_array], t->o, t->err);
        if (t->rc != HCB_OK)
            return t->nnodes + 1;
        t->next_array++;
        t->width[i] = t->tlen[i] = t->texts.len - t->start[i];
        return i + 1;
    case HCB_PRINT_TEXT:
        if (nd->text == NULL) {
            t->rc = hcb_error_set(t->err, HCB_EINVAL,
                                  "print node %zu is text but has none", i);
            return t->nnodes + 1;
        }
        t->width[i] = strlen(nd->text);
        return i + 1;
    case HCB_PRINT_TUPLE:
    case HCB_PRINT_LIST:
    case HCB_PRINT_DICT:
        if (nd->count < 0) {
            t->rc = hcb_error_set(t->err, HCB_EINVAL,
                                  "print node %zu has %d children", i,
                                  (int)nd->count);
            return t->nnodes + 1;
        }
        w = 4 + (nd->count > 0 ? (size_t)nd->count - 1 : 0);
        for (j = i + 1, c = 0; c < nd->count; c++) {
            size_t child = j;

            j = measure(t, j, nd->kind == HCB_PRINT_DICT, depth + 1);
            if (j > t->nnodes)
                return j;
            w += t->width[child];
            if (nd->kind == HCB_PRINT_DICT)
                w += strlen(t->nodes[child].key) + 1;
        }
        t->width[i] = w;
        return j;
    default:
        t->rc = hcb_error_set(t->err, HCB_EINVAL,
                              "print node %zu has kind %d, expected 0..4", i,
                              (int)nd->kind);
        return t->nnodes + 1;
    }
}

/* Lays out the subtree at `i` (measured) at column *col, children indented
 * to `indent` + 2; `flat` when an enclosing container is on one line. */
static size_t
render(tree *t, sbuf *out, size_t i, size_t indent, bool flat, size_t *col)
{
    const hcb_print_node *nd = &t->nodes[i];
    size_t j;
    int32_t c;

    if (nd->kind == HCB_PRINT_ARRAY) {
        sb_put(out, t->texts.p + t->start[i], t->tlen[i]);
        *col += t->tlen[i];
        return i + 1;
    }
    if (nd->kind == HCB_PRINT_TEXT) {
        sb_put(out, nd->text, t->width[i]);
        *col += t->width[i];
        return i + 1;
    }
    flat = flat ||
           *col + t->width[i] <= (size_t)(t->o->width < 0 ? 0 : t->o->width);
    sb_put(out, opens[nd->kind], 2);
    *col += 2;
    for (j = i + 1, c = 0; c < nd->count; c++) {
        if (c > 0 && flat) {
            sb_putc(out, ' ');
            *col += 1;
        } else if (c > 0) {
            sb_putc(out, '\n');
            sb_fill(out, ' ', indent + 2);
            *col = indent + 2;
        }
        if (nd->kind == HCB_PRINT_DICT) {
            size_t kl = strlen(t->nodes[j].key);

            sb_put(out, t->nodes[j].key, kl);
            sb_putc(out, '=');
            *col += kl + 1;
        }
        j = render(t, out, j, indent + 2, flat, col);
    }
    sb_put(out, closes[nd->kind], 2);
    *col += 2;
    return j;
}

static int
format_value_in_default_env(const hcb_print_node *nodes, size_t nnodes,
                            const hcb_array *arrays, size_t narrays,
                            const hcb_print_options *opts, char *buf,
                            size_t cap, size_t *len, hcb_error *err)
{
    tree t;
    sbuf out = {0};
    size_t end, col = 0;
    int rc;

    if (opts == NULL)
        opts = &default_options;
    if ((buf == NULL && cap > 0) || (nodes == NULL && nnodes > 0) ||
        (arrays == NULL && narrays > 0))
        return hcb_error_set(err, HCB_EINVAL,
                             "buf, nodes or arrays is NULL with a non-zero "
                             "count");
    rc = check_options(opts, err);
    if (rc != HCB_OK)
        return rc;
    if (nnodes == 0)
        return hcb_error_set(err, HCB_EINVAL, "no print nodes");
    memset(&t, 0, sizeof t);
    t.nodes = nodes;
    t.nnodes = nnodes;
    t.arrays = arrays;
    t.narrays = narrays;
    t.o = opts;
    t.err = err;
    t.width = hcb__calloc(nnodes, 3 * sizeof(size_t));
    if (t.width == NULL)
        return hcb_error_set(err, HCB_ENOMEM, "out of memory formatting");
    t.start = t.width + nnodes;
    t.tlen = t.start + nnodes;
    end = measure(&t, 0, false, 0);
    rc = t.rc;
    if (rc == HCB_OK && end != nnodes)
        rc = hcb_error_set(err, HCB_EINVAL,
                           "print nodes describe a tree of %zu nodes, but "
                           "%zu were given",
                           end, nnodes);
    if (rc == HCB_OK && t.next_array != narrays)
        rc = hcb_error_set(err, HCB_EINVAL,
                           "print nodes use %zu arrays, but %zu were given",
                           t.next_array, narrays);
    if (rc == HCB_OK && t.texts.oom)
        rc = hcb_error_set(err, HCB_ENOMEM, "out of memory formatting");
    if (rc == HCB_OK)
        render(&t, &out, 0, 0, false, &col);
    hcb__free(t.texts.p);
    hcb__free(t.width);
    if (rc != HCB_OK) {
        hcb__free(out.p);
        return rc;
    }
    return sb_finish(&out, buf, cap, len, err);
}

HCB_API int
hcb_format_value(const hcb_print_node *nodes, size_t nnodes,
                 const hcb_array *arrays, size_t narrays,
                 const hcb_print_options *opts, char *buf, size_t cap,
                 size_t *len, hcb_error *err)
{
    fenv_t env;
    int rc;

    fegetenv(&env);
    fesetenv(FE_DFL_ENV);
    rc = format_value_in_default_env(nodes, nnodes, arrays, narrays, opts, buf,
                                     cap, len, err);
    fesetenv(&env);
    return rc;
}
