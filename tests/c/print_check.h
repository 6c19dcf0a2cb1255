/*
 * print_check.h - what the printer's tests share: views of test data, and
 * checks of hcb_format_array's and hcb_format_value's texts.
 *
 * Every expected string in those tests was printed by numpy 2.4.6
 * (ml_dtypes for bfloat16) or by jax._src.pretty_printer in the project's
 * .venv; the Python that produced it is in the comment beside it, with
 * `np.array2string(x)` shortened to `x` where x is an array built with the
 * default options.  For the value layout, in those comments:
 *
 *   A = lambda a: pp.text(np.array2string(a))
 *   C = lambda o, c, ch: pp.group(pp.concat(
 *           [pp.text(o), pp.nest(2, pp.join(pp.brk(), ch)), pp.text(c)]))
 *   T = lambda *ch: C("( ", " )", list(ch))            # tuples
 *   L = lambda *ch: C("[ ", " ]", list(ch))            # lists
 *   D = lambda **kw: C("{ ", " }", [pp.concat([pp.text(f"{k}="), v])
 *                                   for k, v in kw.items()])
 *
 * and the text is doc.format(80, use_color=False), i.e. str(doc).
 */
#ifndef HCB_PRINT_CHECK_H
#define HCB_PRINT_CHECK_H

#include "testutil.h"

#include <math.h>
#include <stdio.h>

/* Large enough for every expected text here (the longest is ~140). */
#define OUT_CAP 4096

/* A node's string as hcb_print_node takes it: (pointer, length). */
static inline size_t
str_len(const char *s)
{
    return s != NULL ? strlen(s) : 0;
}
#define S(s) (s), str_len(s)

/* ---- helpers ------------------------------------------------------------- */

static inline hcb_print_options
defaults(void)
{
    hcb_print_options o = HCB_PRINT_OPTIONS_INIT;

    return o;
}

/* A view of `data` (borrowed; the tests keep it alive) with the byte count
 * its shape implies. */
static inline hcb_array
view(hcb_dtype t, int32_t rank, const int64_t *dims, const void *data)
{
    size_t n = 1;
    int32_t d;
    hcb_array a;

    for (d = 0; d < rank; d++)
        n *= (size_t)dims[d];
    a.dtype = t;
    a.rank = rank;
    a.dims = dims;
    a.data = (void *)data;
    a.nbytes = hcb_dtype_bits(t) != 0 ? hcb_dtype_nbytes(t, n) : 0;
    return a;
}

/* Formats `a` and checks the whole text and the reported length. */
static inline void
check_text(const hcb_array *a, const hcb_print_options *o, const char *want)
{
    char buf[OUT_CAP];
    size_t len = 0;
    hcb_error err = {0};
    int rc = hcb_format_array(a, o, buf, sizeof buf, &len, &err);

    if (rc != HCB_OK)
        fail_msg("hcb_format_array failed (%d): %s", rc, err.message);
    assert_string_equal(buf, want);
    assert_int_equal(len, strlen(want));
}

static inline void
check(hcb_dtype t, int32_t rank, const int64_t *dims, const void *data,
      const hcb_print_options *o, const char *want)
{
    hcb_array a = view(t, rank, dims, data);

    check_text(&a, o, want);
}

/* A 1-d array of the listed values of C type `type`. */
#define CHECK_1D(type, dtype, opts, want, ...)                                 \
    do {                                                                       \
        const type v_[] = {__VA_ARGS__};                                       \
        const int64_t d_[1] = {(int64_t)(sizeof v_ / sizeof v_[0])};           \
        check(dtype, 1, d_, v_, opts, want);                                   \
    } while (0)

/* A 1-d complex array: the listed values are (real, imaginary) pairs. */
#define CHECK_1D_COMPLEX(type, dtype, opts, want, ...)                         \
    do {                                                                       \
        const type v_[] = {__VA_ARGS__};                                       \
        const int64_t d_[1] = {(int64_t)(sizeof v_ / sizeof v_[0] / 2)};       \
        check(dtype, 1, d_, v_, opts, want);                                   \
    } while (0)

/* A 0-d array of one value. */
#define CHECK_0D(type, dtype, opts, want, value)                               \
    do {                                                                       \
        const type v_ = value;                                                 \
        check(dtype, 0, NULL, &v_, opts, want);                                \
    } while (0)

/* Expects `rc` to be `code`, reported in err with `part` in the message. */
static inline void
expect_error(int rc, const hcb_error *err, int code, const char *part)
{
    assert_int_equal(rc, code);
    assert_int_equal(err->code, code);
    if (strstr(err->message, part) == NULL)
        fail_msg("message '%s' lacks '%s'", err->message, part);
}

static inline void
check_value(const hcb_print_node *nodes, size_t nnodes, const hcb_array *arrays,
            size_t narrays, const hcb_print_options *o, const char *want)
{
    char buf[OUT_CAP];
    size_t len = 0;
    hcb_error err = {0};
    int rc = hcb_format_value(nodes, nnodes, arrays, narrays, o, buf,
                              sizeof buf, &len, &err);

    if (rc != HCB_OK)
        fail_msg("hcb_format_value failed (%d): %s", rc, err.message);
    assert_string_equal(buf, want);
    assert_int_equal(len, strlen(want));
}

/* One node of a value's tree: HCB_PRINT_`kind` with `count` children. */
#define NODE(kind, count, key, text)                                           \
    {                                                                          \
        HCB_PRINT_##kind, count, S(key), S(text)                               \
    }

#endif /* HCB_PRINT_CHECK_H */
