/*
 * print.h - what the files of the printer share.  The printer is
 * numpy.array2string in C, and id_print's layout of containers.
 *
 * The text is numpy's, character for character (numpy 2.x, default
 * `legacy`): the printer follows numpy's arrayprint module step by step.
 *
 *   1. Pick the elements that will be shown (all, or `edgeitems` at each
 *      end of every axis when the array has more than `threshold`):
 *      array.c.
 *   2. Build one element formatter from the shown elements only: for
 *      integers the widest text (element.c); for floats positional or
 *      scientific notation, then the widest integer and fraction parts of
 *      the shortest digits (dragon4.c), so that every element gets the same
 *      width (float.c).
 *   3. Lay the elements out: brackets per axis, rows wrapped before
 *      `linewidth`, blank lines between blocks of higher axes, "..." where
 *      elements were left out: array.c.
 *
 * hcb_format_value (value.c) puts such arrays in tuples, lists and dicts
 * the way JAX's pretty printer lays out id_print's value: a container goes
 * on one line when it fits, else one child per line, nested two columns
 * deeper.  Every text is built in a textbuf (textbuf.h).
 */
#ifndef HCB_PRINT_H
#define HCB_PRINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hcb/hcb.h"
#include "print/dragon4.h"
#include "print/textbuf.h"

/* ---- the shown elements (array.c) -----------------------------------------
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
void hcb__visit_shown(const shape *sh, int32_t axis, size_t offset, visit_fn fn,
                      void *ctx);

/* ---- float formats (float.c) ----------------------------------------------
 */

typedef struct float_format {
    hcb_dtype type; /* F16, F32 or F64 */
    const hcb_print_options *o;
    char sign;
    bool exp_format;
    hcb__d4_options d4; /* how each value is printed */
    int32_t pad_left, pad_right;
} float_format;

/* Fills `ff` for the float part at byte offset `part` of each shown
 * element of `sh` (complex: 0 real, else imaginary), of type `type`. */
void hcb__fill_float(float_format *ff, const shape *sh, size_t part,
                     hcb_dtype type, char sign, const hcb_print_options *o);
/* One float's text into `out` (HCB__D4_BUFSIZE bytes); returns its length. */
size_t hcb__format_float(const float_format *ff, const char *p, char *out);

/* ---- element formats (element.c) ------------------------------------------
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

/* One float of type t (F16, F32 or F64) taken apart, and its value. */
void hcb__load_float(hcb_dtype t, const void *p, hcb__fp *f, double *v);
/* Sub-byte types, one element per byte as numpy keeps them. */
bool hcb__is_small_dtype(hcb_dtype t);
/* The one format for every shown element of `sh`. */
void hcb__fill_elem(elem_format *ef, const shape *sh,
                    const hcb_print_options *o);
/* One element's text into `out` (ELEM_BUFSIZE bytes); returns its length. */
size_t hcb__format_elem(const elem_format *ef, const char *p, char *out);

/* numpy's str() of one float or complex scalar of type t into `out`
 * (ELEM_BUFSIZE bytes); returns its length, 0 for any other type. */
size_t hcb__format_scalar_str(hcb_dtype t, const char *p, char *out);
/* format(x, "") of one float, bfloat16, float4 or complex numpy scalar of
 * type t (the Python float or complex it converts to) into `out`
 * (ELEM_BUFSIZE bytes); returns its length, 0 for any other type. */
size_t hcb__format_scalar_field(hcb_dtype t, const char *p, char *out);

/* ---- arrays (array.c), for the values (value.c) ---------------------------
 */

/* numpy's defaults: what a NULL hcb_print_options means. */
extern const hcb_print_options hcb__default_print_options;

/* HCB_OK, or HCB_EINVAL with `err` filled when `o` is malformed. */
int hcb__check_print_options(const hcb_print_options *o, hcb_error *err);
/* Appends the text of `a` to `out`; checks the view first. */
int hcb__append_array(textbuf *out, const hcb_array *a,
                      const hcb_print_options *o, hcb_error *err);
/* Appends numpy's str() of `a` to `out` (`field`: format(a, ""), as a
 * "{}" of str.format prints it): its text for rank >= 1, for rank 0 the
 * scalar's str() (`field`: the str() of the Python scalar it converts
 * to), options ignored; checks the view first. */
int hcb__append_str(textbuf *out, const hcb_array *a,
                    const hcb_print_options *o, bool field, hcb_error *err);

#endif /* HCB_PRINT_H */
