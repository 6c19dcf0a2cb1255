/*
 * call_result.c - a Python call function's result, checked against its
 * call site's declaration and written into XLA's result buffers.
 *
 * The rules, in the order they are applied: the pytree structure of the
 * result against result_shape's, then each leaf's shape and dtype, after
 * JAX's 64- to 32-bit canonicalisation (a Python scalar where a scalar is
 * declared is taken if it fits); each leaf is copied once into its XLA
 * buffer.  A failure's message names the API the user called and the
 * function, what result_shape declares and what came back (a drop-in of
 * JAX's callbacks says it in JAX's words first), or, when the function
 * raised, the exception and its traceback.  One set of rules and messages
 * for compiled calls (hcb_py_call, call.c: the failure fills `err` and goes
 * to the Python error hook, for the log and barrier_wait) and inline mode
 * (HOST_CALLBACK_INLINE: the module function check_results, the failure
 * raised in the caller).
 */
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL hcb_ARRAY_API
#define NPY_NO_DEPRECATED_API  NPY_2_0_API_VERSION
#define NPY_TARGET_VERSION     NPY_2_0_API_VERSION
#include "hcbpy.h"

#include <numpy/arrayobject.h>
#include <stdbool.h>
#include <string.h>

#define PREFIX HCB_PY_CALL_PREFIX

/* ---- describing values for messages -------------------------------------- */

static bool is_python_scalar_leaf(PyObject *obj);

/* Appends to buf (NUL-terminated, capacity cap) at *len, truncating. */
static void append(char *buf, size_t cap, size_t *len, const char *fmt, ...)
    HCB_PRINTF(4, 5);

static void
append(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (*len + 1 >= cap)
        return;
    va_start(ap, fmt);
    n = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n > 0)
        *len = *len + (size_t)n < cap ? *len + (size_t)n : cap - 1;
}

static void
append_dims(char *buf, size_t cap, size_t *len, int rank, const int64_t *dims)
{
    int i;

    append(buf, cap, len, "[");
    for (i = 0; i < rank; i++)
        append(buf, cap, len, i > 0 ? ",%lld" : "%lld", (long long)dims[i]);
    append(buf, cap, len, "]");
}

/* A declared result, e.g. "float32[3,4]". */
static void
describe_declared(const hcb_array *a, char *buf, size_t cap)
{
    size_t len = 0;

    buf[0] = '\0';
    append(buf, cap, &len, "%s", hcb_dtype_name(a->dtype));
    append_dims(buf, cap, &len, a->rank, a->dims);
}

/* All declared results, e.g. "float32[3], int32[]". */
static void
describe_all_declared(const hcb_array *results, size_t n, char *buf, size_t cap)
{
    char one[128];
    size_t i, len = 0;

    buf[0] = '\0';
    for (i = 0; i < n; i++) {
        describe_declared(&results[i], one, sizeof one);
        append(buf, cap, &len, i > 0 ? ", %s" : "%s", one);
    }
}

/* What came back, e.g. "float64[2,2]", "a Python float", "None". */
static void
describe_value(PyObject *obj, char *buf, size_t cap)
{
    size_t len = 0;

    buf[0] = '\0';
    if (obj == Py_None) {
        append(buf, cap, &len, "None");
    } else if (PyArray_Check(obj)) {
        PyArrayObject *a = (PyArrayObject *)obj;
        PyObject *name = PyObject_Str((PyObject *)PyArray_DESCR(a));
        const char *s = name != NULL ? PyUnicode_AsUTF8(name) : NULL;
        int64_t dims[NPY_MAXDIMS];
        int i;

        for (i = 0; i < PyArray_NDIM(a); i++)
            dims[i] = (int64_t)PyArray_DIM(a, i);
        append(buf, cap, &len, "%s", s != NULL ? s : "?");
        append_dims(buf, cap, &len, PyArray_NDIM(a), dims);
        Py_XDECREF(name);
        PyErr_Clear();
    } else if (PyArray_IsScalar(obj, Generic)) {
        append(buf, cap, &len, "a numpy %s scalar", Py_TYPE(obj)->tp_name);
    } else if (PyBool_Check(obj) || PyLong_Check(obj) || PyFloat_Check(obj) ||
               PyComplex_Check(obj)) {
        append(buf, cap, &len, "a Python %s", Py_TYPE(obj)->tp_name);
    } else {
        append(buf, cap, &len, "an object of type %s", Py_TYPE(obj)->tp_name);
    }
}

/* The argument that declares the results, as the API names it. */
static const char *
declared_by(const hcb_py_call_target *t)
{
    return t->jax_words ? "result_shape_dtypes" : "result_shape";
}

/* A shape as Python prints a tuple: "()", "(3,)", "(2, 3)". */
static void
describe_tuple(char *buf, size_t cap, int rank, const int64_t *dims)
{
    size_t len = 0;
    int i;

    buf[0] = '\0';
    append(buf, cap, &len, "(");
    for (i = 0; i < rank; i++)
        append(buf, cap, &len, i > 0 ? ", %lld" : "%lld", (long long)dims[i]);
    append(buf, cap, &len, rank == 1 ? ",)" : ")");
}

/* The dtype JAX sees in a returned leaf: numpy's (as numpy.asarray makes
 * it), 64 bits narrowed to 32 without x64 (JAX's canonicalisation), e.g.
 * "float32"; "?" when numpy makes no array of it. */
static void
jax_dtype_name(PyObject *got, int narrow, char *buf, size_t cap)
{
    PyArrayObject *a =
        (PyArrayObject *)PyArray_FromAny(got, NULL, 0, 0, 0, NULL);
    PyArray_Descr *d;
    PyObject *name;
    const char *s = NULL;

    snprintf(buf, cap, "?");
    if (a == NULL) {
        PyErr_Clear();
        return;
    }
    d = PyArray_DESCR(a);
    if (narrow && PyDataType_ELSIZE(d) == 8 && strchr("fiu", d->kind) != NULL)
        s = d->kind == 'f' ? "float32" : d->kind == 'i' ? "int32" : "uint32";
    else if (narrow && PyDataType_ELSIZE(d) == 16 && d->kind == 'c')
        s = "complex64";
    if (s != NULL) {
        snprintf(buf, cap, "%s", s);
    } else if ((name = PyObject_Str((PyObject *)d)) != NULL) {
        const char *n = PyUnicode_AsUTF8(name);

        snprintf(buf, cap, "%s", n != NULL ? n : "?");
        Py_DECREF(name);
    }
    PyErr_Clear();
    Py_DECREF(a);
}

/* JAX's words for returned leaf `index` whose shape or dtype differs from
 * its declaration `res`, as jax.pure_callback reports it ("Incorrect
 * output shape for return value #0: Expected: (3,), Actual: (4,)"). */
static void
jax_phrase(const hcb_py_call_target *t, PyObject *got, const hcb_array *res,
           Py_ssize_t index, char *buf, size_t cap)
{
    char want[160], have[160];

    if (PyArray_Check(got) || is_python_scalar_leaf(got)) {
        int64_t dims[NPY_MAXDIMS];
        int i, rank = 0;

        if (PyArray_Check(got)) {
            rank = PyArray_NDIM((PyArrayObject *)got);
            for (i = 0; i < rank; i++)
                dims[i] = (int64_t)PyArray_DIM((PyArrayObject *)got, i);
        }
        if (rank != res->rank ||
            memcmp(dims, res->dims, (size_t)rank * sizeof *dims) != 0) {
            describe_tuple(want, sizeof want, res->rank, res->dims);
            describe_tuple(have, sizeof have, rank, dims);
            snprintf(buf, cap,
                     "Incorrect output shape for return value #%zd: "
                     "Expected: %s, Actual: %s",
                     index, want, have);
            return;
        }
    }
    jax_dtype_name(got, t->narrow_x64, have, sizeof have);
    snprintf(buf, cap,
             "Incorrect output dtype for return value #%zd: Expected: %s, "
             "Actual: %s",
             index, hcb_dtype_name(res->dtype), have);
}

/* Whether a drop-in refuses a result in the other byte order as JAX 0.10
 * on does ("Dtype >f4 is not a valid JAX array type ..."); JAX 0.9 reports
 * its dtype as any other that is not the one declared
 * (hcb_py_set_byte_order_refused, set once at import). */
static int byte_order_refused = 1;

PyObject *
hcb_py_set_byte_order_refused(PyObject *module, PyObject *flag)
{
    int on = PyObject_IsTrue(flag);

    (void)module;
    if (on < 0)
        return NULL;
    byte_order_refused = on;
    Py_RETURN_NONE;
}

/* ---- errors ---------------------------------------------------------------
 */

/* One check of a result against a call site's declaration: the site's
 * fields, and where a failure goes.  Compiled calls report it (fill `err`
 * and hand a Python exception to the error hook: log, barrier_wait);
 * inline mode (check_results) leaves it raised in the caller. */
typedef struct {
    hcb_py_call_target *t;
    bool report;
} result_check;

/* The result did not match result_shape: fills `err` and hands a Python
 * exception of type `type` with the same message to the hook, or raises
 * it. */
static int mismatch(const result_check *c, PyObject *type, hcb_error *err,
                    const char *fmt, ...) HCB_PRINTF(4, 5);

static int
mismatch(const result_check *c, PyObject *type, hcb_error *err, const char *fmt,
         ...)
{
    va_list ap;
    PyObject *exc;

    va_start(ap, fmt);
    hcb_error_setv(err, HCB_EINVAL, fmt, ap);
    va_end(ap);
    if (c->t->hint[0] != '\0') {
        size_t used = strlen(err->message);

        snprintf(err->message + used, sizeof err->message - used, "%s",
                 c->t->hint);
    }
    PyErr_Clear();
    if (!c->report) {
        PyErr_SetString(type, err->message);
        return HCB_EINVAL;
    }
    exc = PyObject_CallFunction(type, "s", err->message);
    Py_XDECREF(hcb_py_hand_to_hook(&c->t->base, exc, 0));
    return HCB_EINVAL;
}

/* The call function (or the tree_flatten of its result) raised: reported,
 * or left raised. */
static int
raised(const result_check *c, hcb_error *err)
{
    char what[128];

    if (!c->report)
        return HCB_ECALLBACK;
    snprintf(what, sizeof what, "%s: callback '%s'", c->t->api,
             c->t->base.name);
    return hcb_py_raised(&c->t->base, what, err);
}

/* ---- results --------------------------------------------------------------
 */

static bool
is_python_scalar(PyObject *obj)
{
    return PyBool_Check(obj) || PyLong_Check(obj) || PyFloat_Check(obj) ||
           PyComplex_Check(obj);
}

/* A Python (not numpy) scalar: the leaves the result check packs itself. */
static bool
is_python_scalar_leaf(PyObject *obj)
{
    return is_python_scalar(obj) && !PyArray_IsScalar(obj, Generic);
}

/* Whether a Python scalar may fill a 0-d result of `d`: bool only into
 * bool; int into any number; float into floats and complex; complex into
 * complex. */
static bool
python_scalar_fits(PyObject *obj, hcb_dtype d)
{
    bool is_int = (d >= HCB_S8 && d <= HCB_U64) || d == HCB_S2 || d == HCB_U2 ||
                  d == HCB_S4 || d == HCB_U4;
    bool is_complex = d == HCB_C64 || d == HCB_C128;
    bool is_float = d != HCB_BOOL && !is_int && !is_complex;

    if (PyBool_Check(obj))
        return d == HCB_BOOL;
    if (PyLong_Check(obj))
        return is_int || is_float || is_complex;
    if (PyFloat_Check(obj))
        return is_float || is_complex;
    return is_complex;
}

/* Without x64, JAX computes in 32 bits and so accepts a 64-bit result for
 * a declared 32-bit type (numpy's float64 default, for instance). */
static bool
narrows_to(const PyArray_Descr *got, hcb_dtype want)
{
    switch (want) {
    case HCB_F32:
        return got->kind == 'f' && PyDataType_ELSIZE(got) == 8;
    case HCB_S32:
        return got->kind == 'i' && PyDataType_ELSIZE(got) == 8;
    case HCB_U32:
        return got->kind == 'u' && PyDataType_ELSIZE(got) == 8;
    case HCB_C64:
        return got->kind == 'c' && PyDataType_ELSIZE(got) == 16;
    default:
        return false;
    }
}

static bool
same_shape(PyArrayObject *a, const hcb_array *res)
{
    int i;

    if (PyArray_NDIM(a) != res->rank)
        return false;
    for (i = 0; i < res->rank; i++)
        if ((int64_t)PyArray_DIM(a, i) != res->dims[i])
            return false;
    return true;
}

/* Leaf `got` does not match its declared result `res`: describes both (only
 * now, off the success path) and reports it with `type`.  `how` picks the
 * wording; `detail` completes LEAF_DOES_NOT_FIT. */
enum leaf_problem {
    LEAF_DIFFERS,
    LEAF_NOT_AN_ARRAY,
    LEAF_DOES_NOT_FIT,
    LEAF_CANNOT_COPY,
    LEAF_BYTE_SWAPPED /* a drop-in's, refused as JAX refuses it */
};

static int
leaf_mismatch(const result_check *c, PyObject *type, hcb_error *err,
              enum leaf_problem how, PyObject *got, const hcb_array *res,
              Py_ssize_t index, const char *where, const char *detail)
{
    hcb_py_call_target *t = c->t;
    char decl[160], desc[160], jax[400];
    const char *name = t->base.name, *api = t->api, *by = declared_by(t);

    describe_declared(res, decl, sizeof decl);
    describe_value(got, desc, sizeof desc);
    switch (how) {
    case LEAF_NOT_AN_ARRAY:
        return mismatch(c, type, err,
                        PREFIX "returned %s%s, which is not an array; "
                               "%s declares %s",
                        api, name, desc, where, by, decl);
    case LEAF_DOES_NOT_FIT:
        return mismatch(c, type, err,
                        PREFIX "returned %s%s that does not fit %s: %s", api,
                        name, desc, where, decl, detail != NULL ? detail : "?");
    case LEAF_CANNOT_COPY:
        return mismatch(c, type, err,
                        PREFIX "returned %s%s that cannot be copied into %s",
                        api, name, desc, where, decl);
    case LEAF_BYTE_SWAPPED:
        return mismatch(c, type, err,
                        "Dtype %s is not a valid JAX array type. Only arrays "
                        "of numeric types are supported by JAX. (" PREFIX
                        "returned %s%s in non-native byte order; %s declares "
                        "%s)",
                        detail, api, name, desc, where, by, decl);
    default:
        if (!t->jax_words)
            return mismatch(c, type, err,
                            PREFIX "returned %s%s; %s declares %s", api, name,
                            desc, where, by, decl);
        jax_phrase(t, got, res, index, jax, sizeof jax);
        return mismatch(c, type, err,
                        "%s (" PREFIX "returned %s%s; %s declares %s)", jax,
                        api, name, desc, where, by, decl);
    }
}

/* Checks one returned leaf against its declared result and copies it into
 * the result buffer.  `index` is the leaf's position; `where` is "" for a
 * single result, else that position for messages. */
static int
fill_result(const result_check *c, PyObject *leaf, const hcb_array *res,
            Py_ssize_t index, const char *where, hcb_error *err)
{
    hcb_py_call_target *t = c->t;
    PyArray_Descr *want =
        (PyArray_Descr *)hcb_py_descr(t->base.state, res->dtype);
    PyArrayObject *arr;
    bool exact;
    int rc = HCB_OK;

    if (want == NULL) {
        char decl[160];

        PyErr_Clear();
        describe_declared(res, decl, sizeof decl);
        return hcb_error_set(err, HCB_EUNIMPL,
                             PREFIX "declares %s%s, a type numpy lacks", t->api,
                             t->base.name, decl, where);
    }

    if (is_python_scalar(leaf) && !PyArray_IsScalar(leaf, Generic)) {
        _Alignas(16) char one[16]; /* one element, numpy's layout */

        if (res->rank != 0 || !python_scalar_fits(leaf, res->dtype))
            return leaf_mismatch(c, PyExc_TypeError, err, LEAF_DIFFERS, leaf,
                                 res, index, where, NULL);
        if (PyArray_Pack(want, one, leaf) >= 0) {
            hcb_py_store(res, one);
        } else {
            PyObject *exc = hcb_py_fetch_exception();
            PyObject *s = exc != NULL ? PyObject_Str(exc) : NULL;

            rc = leaf_mismatch(c, PyExc_ValueError, err, LEAF_DOES_NOT_FIT,
                               leaf, res, index, where,
                               s != NULL ? PyUnicode_AsUTF8(s) : NULL);
            Py_XDECREF(s);
            Py_XDECREF(exc);
        }
        return rc;
    }

    if (PyArray_Check(leaf)) {
        Py_INCREF(leaf);
        arr = (PyArrayObject *)leaf;
    } else {
        arr = (PyArrayObject *)PyArray_FromAny(leaf, NULL, 0, 0, 0, NULL);
        if (arr == NULL) {
            PyErr_Clear();
            return leaf_mismatch(c, PyExc_TypeError, err, LEAF_NOT_AN_ARRAY,
                                 leaf, res, index, where, NULL);
        }
    }
    exact = PyArray_EquivTypes(PyArray_DESCR(arr), want) ||
            PyArray_DESCR(arr)->type_num == want->type_num;
    if (t->jax_words && !PyArray_ISNBO(PyArray_DESCR(arr)->byteorder) &&
        !byte_order_refused) {
        /* JAX 0.9: a dtype that is not the one declared, in its words */
        rc = leaf_mismatch(c, PyExc_TypeError, err, LEAF_DIFFERS,
                           (PyObject *)arr, res, index, where, NULL);
    } else if (t->jax_words && !PyArray_ISNBO(PyArray_DESCR(arr)->byteorder)) {
        /* JAX takes no array in the other byte order (host_callback's own
         * call converts it) */
        PyObject *s = PyObject_Str((PyObject *)PyArray_DESCR(arr));
        const char *text = s != NULL ? PyUnicode_AsUTF8(s) : NULL;

        PyErr_Clear();
        rc = leaf_mismatch(c, PyExc_TypeError, err, LEAF_BYTE_SWAPPED,
                           (PyObject *)arr, res, index, where,
                           text != NULL ? text : "?");
        Py_XDECREF(s);
    } else if (!same_shape(arr, res)) { /* TypeError, as for a wrong dtype */
        rc = leaf_mismatch(c, PyExc_TypeError, err, LEAF_DIFFERS,
                           (PyObject *)arr, res, index, where, NULL);
    } else if (!exact &&
               !(t->narrow_x64 && narrows_to(PyArray_DESCR(arr), res->dtype))) {
        rc = leaf_mismatch(c, PyExc_TypeError, err, LEAF_DIFFERS,
                           (PyObject *)arr, res, index, where, NULL);
    } else if (exact && PyArray_ISCARRAY_RO(arr) && PyArray_ISNOTSWAPPED(arr)) {
        hcb_py_store(res, PyArray_DATA(arr));
    } else {
        /* numpy converts into the result buffer, or for a packed type into
         * an array of its own that is then packed into it */
        bool packed = hcb_py_packed(res->dtype);
        PyObject *dst =
            hcb_py_array_view((PyObject *)want, res->rank, res->dims,
                              packed ? NULL : res->data, 1, NULL);

        if (dst == NULL || PyArray_CopyInto((PyArrayObject *)dst, arr) < 0) {
            PyErr_Clear();
            rc = leaf_mismatch(c, PyExc_ValueError, err, LEAF_CANNOT_COPY,
                               (PyObject *)arr, res, index, where, NULL);
        } else if (packed) {
            hcb_py_store(res, PyArray_DATA((PyArrayObject *)dst));
        }
        Py_XDECREF(dst);
    }
    Py_DECREF(arr);
    return rc;
}

static bool
is_array_leaf(PyObject *obj)
{
    return PyArray_Check(obj) || PyArray_IsScalar(obj, Generic) ||
           is_python_scalar(obj);
}

/* JAX's words and an opening parenthesis, when a drop-in's function
 * returned `got` leaves where `want` are declared ("Mismatched number of
 * outputs from callback. Expected: 1, Actual: 2 ("); else "".  The message
 * closes it with close_phrase. */
static const char *
count_phrase(const hcb_py_call_target *t, size_t want, Py_ssize_t got,
             char *buf, size_t cap)
{
    if (!t->jax_words || (Py_ssize_t)want == got)
        return "";
    snprintf(buf, cap,
             "Mismatched number of outputs from callback. Expected: %zu, "
             "Actual: %zd (",
             want, got);
    return buf;
}

static const char *
close_phrase(const char *phrase)
{
    return phrase[0] != '\0' ? ")" : "";
}

/* Checks `result` against the declared results and fills them. */
static int
fill_results(const result_check *c, PyObject *result, const hcb_array *results,
             size_t nresults, hcb_error *err)
{
    hcb_py_call_target *t = c->t;
    char decl[512], got[160], where[64], jax[160];
    const char *phrase;
    PyObject *flat, *leaves, *treedef;
    Py_ssize_t i, n;
    int rc = HCB_OK, eq;

    if (nresults == 0 && result == Py_None)
        return HCB_OK;
    if (t->result_is_leaf && is_array_leaf(result))
        return fill_result(c, result, &results[0], 0, "", err);
    describe_all_declared(results, nresults, decl, sizeof decl);
    if (result == Py_None) {
        phrase = count_phrase(t, nresults, 0, jax, sizeof jax);
        return mismatch(c, PyExc_TypeError, err,
                        "%s" PREFIX "returned None; %s declares %s%s", phrase,
                        t->api, t->base.name, declared_by(t), decl,
                        close_phrase(phrase));
    }

    flat = PyObject_CallOneArg(t->base.state->tree_flatten, result);
    if (flat == NULL)
        return raised(c, err);
    if (!PyTuple_Check(flat) || PyTuple_GET_SIZE(flat) != 2 ||
        !PyList_Check(PyTuple_GET_ITEM(flat, 0))) {
        Py_DECREF(flat);
        return hcb_error_set(err, HCB_EINTERNAL,
                             "tree_flatten returned an unexpected value");
    }
    leaves = PyTuple_GET_ITEM(flat, 0);
    treedef = PyTuple_GET_ITEM(flat, 1);
    n = PyList_GET_SIZE(leaves);
    if (nresults == 0) {
        if (n > 0) {
            describe_value(PyList_GET_ITEM(leaves, 0), got, sizeof got);
            phrase = count_phrase(t, 0, n, jax, sizeof jax);
            rc = mismatch(c, PyExc_TypeError, err,
                          "%s" PREFIX "returned a result with %zd arrays (the "
                          "first is %s), but %s declares no "
                          "result%s%s",
                          phrase, t->api, t->base.name, n, got, declared_by(t),
                          close_phrase(phrase),
                          t->jax_words
                              ? ""
                              : "; to return it, declare it: result_shape="
                                "jax.ShapeDtypeStruct(shape, dtype), or an "
                                "array of its shape and dtype (a pytree of "
                                "them for several)");
        }
        Py_DECREF(flat);
        return rc;
    }
    eq = PyObject_RichCompareBool(treedef, t->result_treedef, Py_EQ);
    if (eq != 1 || (size_t)n != nresults) {
        PyObject *gs = PyObject_Str(treedef);
        PyObject *ws = PyObject_Str(t->result_treedef);
        const char *g = gs != NULL ? PyUnicode_AsUTF8(gs) : NULL;
        const char *w = ws != NULL ? PyUnicode_AsUTF8(ws) : NULL;

        phrase = count_phrase(t, nresults, n, jax, sizeof jax);
        rc = mismatch(c, PyExc_TypeError, err,
                      "%s" PREFIX "returned a result with pytree structure "
                      "%s; %s declares %s with leaves %s%s",
                      phrase, t->api, t->base.name, g != NULL ? g : "?",
                      declared_by(t), w != NULL ? w : "?", decl,
                      close_phrase(phrase));
        Py_XDECREF(gs);
        Py_XDECREF(ws);
        Py_DECREF(flat);
        return rc;
    }
    for (i = 0; i < n && rc == HCB_OK; i++) {
        if (nresults > 1)
            snprintf(where, sizeof where, " at result leaf %zd of %zd", i, n);
        else
            where[0] = '\0';
        rc = fill_result(c, PyList_GET_ITEM(leaves, i), &results[i], i, where,
                         err);
    }
    Py_DECREF(flat);
    return rc;
}

/* ---- inline mode ----------------------------------------------------------
 */

/* New arrays, one for each (shape, dtype) pair of `avals`: a list, or NULL
 * with an exception. */
static PyObject *
declared_arrays(PyObject *avals)
{
    PyObject *seq, *list;
    Py_ssize_t i, n;

    seq = PySequence_Fast(avals, "result_avals must be a sequence");
    if (seq == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    list = PyList_New(n);
    for (i = 0; list != NULL && i < n; i++) {
        PyObject *shape, *dtype, *arr = NULL;
        PyArray_Descr *descr = NULL;
        PyArray_Dims dims = {NULL, 0};

        if (PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i),
                             "OO;result_avals holds (shape, dtype) pairs",
                             &shape, &dtype) &&
            PyArray_IntpConverter(shape, &dims) &&
            PyArray_DescrConverter(dtype, &descr))
            arr = PyArray_Empty(dims.len, dims.ptr, descr, 0); /* steals */
        else
            Py_XDECREF(descr);
        PyDimMem_FREE(dims.ptr);
        if (arr == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, arr);
    }
    Py_DECREF(seq);
    return list;
}

PyObject *
hcb_py_check_results(PyObject *module, PyObject *args, PyObject *kwargs)
{
    /* Python before 3.13 takes char **: the cast keeps -Wwrite-strings. */
    static const char *kwlist[] = {"site", "name", "result", NULL};
    hcb_state *st = PyModule_GetState(module);
    hcb_py_call_target t;
    result_check check = {&t, false};
    PyObject *site, *result, *avals, *outs;
    const char *name;
    Py_ssize_t name_len, n, nviews = -1;
    hcb_array *views;
    PyObject **keep;
    hcb_error err;
    int rc = HCB_EINVAL;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$Os#O:check_results",
                                     (char **)kwlist, &site, &name, &name_len,
                                     &result))
        return NULL;
    /* A target of this check only: never registered, never called. */
    memset(&t, 0, sizeof t);
    t.base.state = st;
    t.base.site = site;
    t.base.kind = HCB_PY_CALL;
    snprintf(t.base.name, sizeof t.base.name, "%.*s", (int)name_len, name);
    if (hcb_py_call_site_read(&t, site) < 0)
        return NULL;
    avals = PyObject_GetAttrString(site, "result_avals");
    outs = avals != NULL ? declared_arrays(avals) : NULL;
    Py_XDECREF(avals);
    if (outs == NULL)
        return NULL;
    n = PyList_GET_SIZE(outs);
    views = PyMem_Calloc((size_t)n + 1, sizeof *views);
    keep = PyMem_Calloc((size_t)n + 1, sizeof *keep);
    if (views == NULL || keep == NULL)
        PyErr_NoMemory();
    else
        nviews = hcb_py_views_of(st, outs, views, keep, n, 1);
    if (nviews >= 0) {
        rc = fill_results(&check, result, views, (size_t)nviews, &err);
        hcb_py_views_done(views, keep, nviews);
    }
    for (Py_ssize_t i = 0; keep != NULL && i < n; i++)
        Py_XDECREF(keep[i]);
    PyMem_Free(views);
    PyMem_Free(keep);
    if (rc != HCB_OK) {
        Py_DECREF(outs);
        return nviews < 0 || PyErr_Occurred() ? NULL : hcb_py_raise(&err);
    }
    return outs;
}

/* ---- for the call (call.c) ----------------------------------------------- */

int
hcb_py_call_result(hcb_py_call_target *t, PyObject *result,
                   const hcb_array *results, size_t nresults, hcb_error *err)
{
    result_check check = {t, true};

    return fill_results(&check, result, results, nresults, err);
}

int
hcb_py_call_raised(hcb_py_call_target *t, hcb_error *err)
{
    result_check check = {t, true};

    return raised(&check, err);
}
