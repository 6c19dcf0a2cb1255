/*
 * array.c - numpy.array2string in C: which elements are shown (summarised
 * with "..." past `threshold`), numpy's _formatArray layout of them
 * (brackets per axis, rows wrapped before `linewidth`, blank lines between
 * blocks of higher axes), the checks of a view and of the options, and
 * hcb_format_array.
 */
#include <fenv.h>
#include <string.h>

#include "base/common.h"
#include "print/print.h"

/* ---- the shown elements ----------------------------------------------------
 */

/* Calls fn on every element that will be shown, in order. */
void
hcb__visit_shown(const shape *sh, int32_t axis, size_t offset, visit_fn fn,
                 void *ctx)
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
        hcb__visit_shown(sh, axis + 1, offset + (size_t)i * sh->strides[axis],
                         fn, ctx);
    }
}

/* ---- the layout (numpy's _formatArray) ------------------------------------
 */

typedef struct layout {
    const shape *sh;
    const elem_format *ef;
    textbuf *out;
    textbuf line; /* the row being filled */
    char word[ELEM_BUFSIZE];
} layout;

/* numpy builds a row with the hanging indent on its first line too, then
 * drops the first len(indent) characters of the whole row.  Those are the
 * indent, except when the first line is blank once right-stripped (an
 * element printed as spaces: an empty nanstr or infstr): then the drop eats
 * its newline and the next line's leading spaces.  `*skip` counts what is
 * still to drop. */
static void
put_row(textbuf *out, size_t *skip, const char *t, size_t n)
{
    /* t is NULL when the line buffer never got memory (then n is 0) */
    if (n <= *skip) {
        *skip -= n;
        return;
    }
    hcb__textbuf_put(out, t + *skip, n - *skip);
    *skip = 0;
}

/* numpy's _extendLine: wrap before `word` if the line would pass `width`,
 * unless the line holds only its indent. */
static void
extend_line(layout *l, size_t *skip, size_t indent, const char *word, size_t n,
            int64_t width)
{
    textbuf *line = &l->line;

    if ((int64_t)(line->len + n) > width && line->len > indent) {
        size_t end = line->len;

        while (end > 0 && line->p[end - 1] == ' ')
            end--;
        put_row(l->out, skip, line->p, end);
        put_row(l->out, skip, "\n", 1);
        line->len = 0;
        hcb__textbuf_fill(line, ' ', indent);
    }
    hcb__textbuf_put(line, word, n);
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
    hcb__textbuf_fill(&l->line, ' ', indent);
    for (i = 0; i < n; i++) {
        size_t wl;

        if (summary && i == lead) {
            extend_line(l, &skip, indent, "...", 3, elem_width);
            hcb__textbuf_putc(&l->line, ' ');
            i = n - sh->edge;
            if (i >= n - 1)
                i = n - 1;
        }
        wl = hcb__format_elem(l->ef,
                              (const char *)sh->a->data +
                                  (offset + (size_t)i * stride) * sh->item,
                              l->word);
        extend_line(l, &skip, indent, l->word, wl, elem_width);
        if (i < n - 1)
            hcb__textbuf_putc(&l->line, ' ');
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

    hcb__textbuf_putc(l->out, '[');
    if (axis == sh->rank - 1) {
        layout_row(l, offset, indent + 1, width);
        hcb__textbuf_putc(l->out, ']');
        return;
    }
    for (i = 0; i < n; i++) {
        if (summary && i == sh->edge) {
            if (!first)
                hcb__textbuf_fill(l->out, ' ', indent + 1);
            hcb__textbuf_put(l->out, "...", 3);
            hcb__textbuf_fill(l->out, '\n', lines);
            first = false;
            i = n - sh->edge;
            if (i >= n - 1)
                i = n - 1;
        }
        if (!first)
            hcb__textbuf_fill(l->out, ' ', indent + 1);
        first = false;
        layout_axis(l, axis + 1, offset + (size_t)i * sh->strides[axis],
                    indent + 1, width - 1);
        if (i < n - 1)
            hcb__textbuf_fill(l->out, '\n', lines);
    }
    hcb__textbuf_putc(l->out, ']');
}

/* ---- checks ----------------------------------------------------------------
 */

int
hcb__check_print_options(const hcb_print_options *o, hcb_error *err)
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

/* Checks a view and fills `sh`; *nelems gets the element count.  The
 * layout reads sh->item bytes per element: for a sub-byte type, 1, from
 * the unpacked copy hcb__append_array makes. */
static int
make_shape(shape *sh, const hcb_array *a, const hcb_print_options *o,
           size_t *nelems, hcb_error *err)
{
    size_t n = 1;
    int32_t d;

    if (a == NULL)
        return hcb_error_set(err, HCB_EINVAL, "the array is NULL");
    if (!hcb_print_supports(a->dtype))
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
    sh->item = hcb__is_small_dtype(a->dtype) ? 1 : hcb_dtype_size(a->dtype);
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

int
hcb__append_array(textbuf *out, const hcb_array *a, const hcb_print_options *o,
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
        hcb__textbuf_put(out, "[]", 2);
        return HCB_OK;
    }
    if (hcb__is_small_dtype(
            a->dtype)) { /* the layout reads one element per byte */
        unpacked = *a;
        unpacked.nbytes = n;
        unpacked.data = hcb__malloc(n);
        if (unpacked.data == NULL)
            return hcb_error_set(err, HCB_ENOMEM, "out of memory formatting");
        hcb_unpack_elements(a->dtype, a->data, n, unpacked.data);
        sh.a = a = &unpacked;
    }
    hcb__fill_elem(&ef, &sh, o);
    if (sh.rank == 0) {
        char word[ELEM_BUFSIZE];

        hcb__textbuf_put(out, word, hcb__format_elem(&ef, a->data, word));
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

const hcb_print_options hcb__default_print_options = HCB_PRINT_OPTIONS_INIT;

int
hcb__append_str(textbuf *out, const hcb_array *a, const hcb_print_options *o,
                bool field, hcb_error *err)
{
    char word[ELEM_BUFSIZE];
    shape sh;
    size_t n = 0;
    int rc;

    if (a == NULL || a->rank != 0)
        return hcb__append_array(out, a, o, err);
    /* A 0-d array prints as its scalar (numpy's _array_str_implementation):
     * floats and complex by their own rule, the other types as their 0-d
     * text with numpy's default options (no sign option). */
    rc = make_shape(&sh, a, &hcb__default_print_options, &n, err);
    if (rc != HCB_OK)
        return rc;
    n = field ? hcb__format_scalar_field(a->dtype, a->data, word)
              : hcb__format_scalar_str(a->dtype, a->data, word);
    if (n == 0)
        return hcb__append_array(out, a, &hcb__default_print_options, err);
    hcb__textbuf_put(out, word, n);
    return HCB_OK;
}

static int
format_array_in_default_env(const hcb_array *a, const hcb_print_options *opts,
                            char *buf, size_t cap, size_t *len, hcb_error *err)
{
    textbuf out = {0};
    int rc;

    if (opts == NULL)
        opts = &hcb__default_print_options;
    if (buf == NULL && cap > 0)
        return hcb_error_set(err, HCB_EINVAL, "buf is NULL but cap is %zu",
                             cap);
    rc = hcb__check_print_options(opts, err);
    if (rc == HCB_OK)
        rc = hcb__append_array(&out, a, opts, err);
    if (rc != HCB_OK) {
        hcb__free(out.p);
        return rc;
    }
    return hcb__textbuf_finish(&out, buf, cap, len, err);
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
