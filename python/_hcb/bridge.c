/*
 * bridge.c - what taps (tap.c) and calls (call.c) share on their way into
 * Python: taking the GIL from a runtime thread, numpy arrays over a record's
 * memory, the jax.Device of a device key, exceptions and the error hook,
 * and the runtime's warnings.
 */
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL hcb_ARRAY_API
#define NPY_NO_DEPRECATED_API  NPY_2_0_API_VERSION
#define NPY_TARGET_VERSION     NPY_2_0_API_VERSION
#include "hcbpy.h"

#include <numpy/arrayobject.h>
#include <string.h>

#if PY_VERSION_HEX >= 0x030D0000
#define HCB_PY_FINALIZING() Py_IsFinalizing()
#else
#define HCB_PY_FINALIZING() _Py_IsFinalizing()
#endif

/* ---- the GIL ------------------------------------------------------------ */

/* Whether this thread keeps a Python thread state between callbacks. */
static _Thread_local int keeps_thread_state;

int
hcb_py_gil_ensure(hcb_state *st, PyGILState_STATE *gil)
{
    /* Taking the GIL during finalisation would hang or kill this thread. */
    if (atomic_load(&st->shutting_down) || HCB_PY_FINALIZING())
        return -1;
    if (!keeps_thread_state && !PyGILState_Check()) {
        /* An XLA or consumer thread calls Python many times.  Without a
         * thread state of its own, every PyGILState_Ensure would create one
         * and every Release destroy it.  One Ensure that is never released
         * keeps it: later Ensure/Release pairs only take and drop the GIL.
         * Python frees it at finalisation with the other thread states.
         * (A thread that already holds the GIL is left as it is.) */
        PyGILState_Ensure();
        keeps_thread_state = 1;
        PyEval_SaveThread();
    }
    *gil = PyGILState_Ensure();
    return 0;
}

void
hcb_py_gil_release(PyGILState_STATE gil)
{
    PyGILState_Release(gil);
}

/* ---- RecordOwner: the base object of the numpy arrays of one record ---- */

typedef struct {
    PyObject_HEAD hcb_record *rec; /* one reference, released on dealloc */
} record_owner;

static void
owner_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);

    hcb_record_release(((record_owner *)self)->rec);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyType_Slot owner_slots[] = {
    {Py_tp_dealloc, (void *)owner_dealloc},
    {Py_tp_doc, (void *)"Keeps the memory of one tap record alive."},
    {0, NULL},
};

static PyType_Spec owner_spec = {
    .name = "host_callback._hcb.RecordOwner",
    .basicsize = sizeof(record_owner),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = owner_slots,
};

PyType_Spec *
hcb_py_owner_spec(void)
{
    return &owner_spec;
}

static PyObject *
owner_new(hcb_state *st, hcb_record *rec)
{
    record_owner *o = PyObject_New(record_owner, st->owner_type);

    if (o == NULL)
        return NULL;
    hcb_record_retain(rec);
    o->rec = rec;
    return (PyObject *)o;
}

/* ---- arrays ------------------------------------------------------------ */

PyObject *
hcb_py_descr(hcb_state *st, hcb_dtype dtype)
{
    PyObject *descr = (unsigned)dtype < HCB_PY_NDTYPES
                          ? PyTuple_GET_ITEM(st->dtypes, dtype)
                          : Py_None;

    if (descr != Py_None)
        return descr;
    PyErr_Format(PyExc_TypeError, "no numpy dtype for %s (XLA type %d)",
                 hcb_dtype_name(dtype), (int)dtype);
    return NULL;
}

PyObject *
hcb_py_array_view(PyObject *descr, int rank, const int64_t *dims, void *data,
                  int writable, PyObject *base)
{
    npy_intp shape[HCB_MAX_RANK];
    /* with no data, numpy allocates; flags would then ask for F order */
    int flags = data == NULL ? 0
                             : NPY_ARRAY_CARRAY_RO |
                                   (writable ? NPY_ARRAY_WRITEABLE : 0);
    PyObject *arr;
    int i;

    for (i = 0; i < rank; i++)
        shape[i] = (npy_intp)dims[i];
    Py_INCREF(descr); /* PyArray_NewFromDescr steals it */
    arr = PyArray_NewFromDescr(&PyArray_Type, (PyArray_Descr *)descr, rank,
                               shape, NULL, data, flags, NULL);
    if (arr == NULL || base == NULL)
        return arr;
    Py_INCREF(base);
    if (PyArray_SetBaseObject((PyArrayObject *)arr, base) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

/* An array of `a`'s data: over it, kept alive by `owner`, or a copy when
 * `owner` is NULL or the type is packed (sub-byte types: numpy keeps one
 * element per byte). */
static PyObject *
array_of(hcb_state *st, const hcb_array *a, PyObject *owner)
{
    PyObject *descr = hcb_py_descr(st, a->dtype), *arr;
    bool packed = hcb_py_packed(a->dtype);

    if (descr == NULL)
        return NULL;
    if (owner != NULL && !packed)
        return hcb_py_array_view(descr, a->rank, a->dims, a->data, 1, owner);
    arr = hcb_py_array_view(descr, a->rank, a->dims, NULL, 0, NULL);
    if (arr != NULL && a->nbytes > 0)
        hcb_unpack_elements(a->dtype, a->data,
                            (size_t)PyArray_SIZE((PyArrayObject *)arr),
                            PyArray_DATA((PyArrayObject *)arr));
    return arr;
}

void
hcb_py_store(const hcb_array *res, const void *data)
{
    size_t n = 1;
    int32_t i;

    if (res->nbytes == 0)
        return;
    for (i = 0; i < res->rank; i++)
        n *= (size_t)res->dims[i];
    hcb_pack_elements(res->dtype, data, n, res->data);
}

PyObject *
hcb_py_arrays_of(hcb_state *st, hcb_record *rec)
{
    size_t i, n = hcb_record_nargs(rec);
    const hcb_array *args = hcb_record_args(rec);
    PyObject *owner = NULL, *tuple;

    tuple = PyTuple_New((Py_ssize_t)n);
    if (tuple == NULL)
        return NULL;
    if (n == 0)
        return tuple;
    /* A record of up to HCB_RECORD_SHARED_MAX bytes keeps a whole shared
     * block alive (hcb.h): its arrays are copied, so a kept array holds
     * only its own bytes.  A larger record is not copied: the arrays point
     * into it, and it lives as long as they do. */
    if (hcb_record_size(rec) > HCB_RECORD_SHARED_MAX &&
        (owner = owner_new(st, rec)) == NULL) {
        Py_DECREF(tuple);
        return NULL;
    }
    for (i = 0; i < n; i++) {
        PyObject *arr = array_of(st, &args[i], owner);

        if (arr == NULL) {
            Py_XDECREF(owner);
            Py_DECREF(tuple);
            return NULL;
        }
        PyTuple_SET_ITEM(tuple, (Py_ssize_t)i, arr);
    }
    Py_XDECREF(owner);
    return tuple;
}

PyObject *
hcb_py_device_of(hcb_state *st, hcb_device key)
{
    PyObject *k, *dev;

    k = PyLong_FromLongLong((long long)key);
    if (k == NULL)
        return NULL;
    dev = PyDict_GetItemWithError(st->device_cache, k); /* borrowed */
    if (dev != NULL) {
        Py_INCREF(dev);
    } else if (!PyErr_Occurred()) {
        dev = PyObject_CallOneArg(st->device_lookup, k);
        if (dev != NULL && PyDict_SetItem(st->device_cache, k, dev) < 0)
            Py_CLEAR(dev);
    }
    Py_DECREF(k);
    return dev;
}

PyObject *
hcb_py_raise(const hcb_error *err)
{
    PyObject *type;

    switch (err->code) {
    case HCB_EINVAL:
        type = PyExc_ValueError;
        break;
    case HCB_ENOMEM:
        type = PyExc_MemoryError;
        break;
    case HCB_EUNIMPL:
        type = PyExc_TypeError;
        break;
    default:
        type = PyExc_RuntimeError;
        break;
    }
    PyErr_SetString(type, err->message);
    return NULL;
}

PyObject *
hcb_py_fetch_exception(void)
{
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;

    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
#endif
}

/* ---- the life of a target ----------------------------------------------- */

int
hcb_py_target_enter(hcb_py_target *t, const char *kind, hcb_error *err)
{
    if (t->site == NULL)
        return hcb_error_set(err, HCB_ESTATE,
                             "%s '%s' not called: it was released (no "
                             "compiled program refers to it any more)",
                             kind, t->name);
    t->busy++;
    return HCB_OK;
}

static void
target_clear(hcb_py_target *t)
{
    t->release_pending = 0;
    if (t->kind == HCB_PY_PRINT) {
        Py_CLEAR(((hcb_py_print_target *)t)->stream);
        Py_CLEAR(((hcb_py_print_target *)t)->log);
    }
    /* The borrowed pointers into the site (t->tap, and the fields of calls
     * and buffer callbacks) are read only by deliveries, which check `site`
     * first. */
    Py_CLEAR(t->site);
}

void
hcb_py_target_leave(hcb_py_target *t)
{
    if (--t->busy == 0 && t->release_pending)
        target_clear(t);
}

void
hcb_py_target_release(hcb_py_target *t)
{
    if (t->busy > 0)
        t->release_pending = 1;
    else
        target_clear(t);
}

/* ---- named fields ------------------------------------------------------- */

int
hcb_py_fields(PyObject *obj, const char *what, const char *const *names,
              PyObject **out, size_t n)
{
    Py_ssize_t j;
    size_t i;

    if (!PyTuple_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "expected a %s, got %.100s", what,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    for (i = 0; i < n; i++) {
        PyObject *v = PyObject_GetAttrString(obj, names[i]);

        if (v == NULL) {
            PyErr_Format(PyExc_TypeError,
                         "expected a %s, got a %.100s without field '%s'", what,
                         Py_TYPE(obj)->tp_name, names[i]);
            return -1;
        }
        /* Borrowed: only an item of the tuple is sure to live as long. */
        for (j = 0; j < PyTuple_GET_SIZE(obj); j++)
            if (PyTuple_GET_ITEM(obj, j) == v)
                break;
        Py_DECREF(v);
        if (j == PyTuple_GET_SIZE(obj)) {
            PyErr_Format(PyExc_TypeError,
                         "expected a %s, got a %.100s whose field '%s' is "
                         "not one of its items",
                         what, Py_TYPE(obj)->tp_name, names[i]);
            return -1;
        }
        out[i] = v;
    }
    return 0;
}

/* ---- errors ------------------------------------------------------------- */

PyObject *
hcb_py_hand_to_hook(hcb_py_target *t, PyObject *exc, int raised)
{
    PyObject *text = NULL;

    if (exc != NULL) {
        text = PyObject_CallFunctionObjArgs(t->state->on_error, t->site, exc,
                                            raised ? Py_True : Py_False, NULL);
        if (text == NULL)
            PyErr_WriteUnraisable(t->state->on_error);
        Py_DECREF(exc);
    }
    PyErr_Clear();
    return text;
}

PyObject *
hcb_py_report_exception(hcb_py_target *t, const char *what, hcb_error *err)
{
    PyObject *exc = hcb_py_fetch_exception();
    PyObject *str = exc != NULL ? PyObject_Str(exc) : NULL;
    const char *msg = str != NULL ? PyUnicode_AsUTF8(str) : NULL;

    PyErr_Clear();
    hcb_error_set(err, HCB_ECALLBACK, "%s raised %s: %s", what,
                  exc != NULL ? Py_TYPE(exc)->tp_name : "?",
                  msg != NULL ? msg : "<unprintable>");
    Py_XDECREF(str);
    return hcb_py_hand_to_hook(t, exc, 1);
}

int
hcb_py_raised(hcb_py_target *t, const char *what, hcb_error *err)
{
    PyObject *tb;
    const char *tbs;
    size_t len, room, n;

    tb = hcb_py_report_exception(t, what, err);
    tbs = tb != NULL && PyUnicode_Check(tb) ? PyUnicode_AsUTF8(tb) : NULL;
    PyErr_Clear();
    len = strlen(err->message);
    if (tbs != NULL && len + 8 < sizeof err->message) {
        n = strlen(tbs);
        room = sizeof err->message - len - 2;
        if (n <= room) {
            snprintf(err->message + len, sizeof err->message - len, "\n%s",
                     tbs);
        } else {
            const char *tail = tbs + n - (room - 5);
            const char *nl = strchr(tail, '\n');

            if (nl != NULL && nl[1] != '\0')
                tail = nl + 1;
            snprintf(err->message + len, sizeof err->message - len, "\n...\n%s",
                     tail);
        }
        /* The traceback ends with a newline; the message does not. */
        len = strlen(err->message);
        while (len > 0 && err->message[len - 1] == '\n')
            err->message[--len] = '\0';
    }
    Py_XDECREF(tb);
    return HCB_ECALLBACK;
}

/* ---- warnings -------------------------------------------------------------
 */

void
hcb_py_log(void *user, const char *message)
{
    hcb_state *st = user;
    PyGILState_STATE gil;
    PyObject *r;

    if (hcb_py_gil_ensure(st, &gil) < 0) {
        fprintf(stderr, "hcb: warning: %s\n", message);
        return;
    }
    if (st->warn != NULL) {
        r = PyObject_CallFunction(st->warn, "s", message);
        if (r == NULL)
            PyErr_WriteUnraisable(st->warn);
        Py_XDECREF(r);
    } else {
        fprintf(stderr, "hcb: warning: %s\n", message);
    }
    hcb_py_gil_release(gil);
}

/* ---- numpy arrays as views -------------------------------------------------
 */

/* The hcb_dtype of a numpy dtype (the table of configure()). */
static int
dtype_code(hcb_state *st, PyArray_Descr *d, hcb_dtype *out)
{
    int i;

    for (i = 0; i < HCB_PY_NDTYPES; i++) {
        PyObject *e = PyTuple_GET_ITEM(st->dtypes, i);

        if (e != Py_None && PyArray_EquivTypes((PyArray_Descr *)e, d)) {
            *out = (hcb_dtype)i;
            return 0;
        }
    }
    PyErr_Format(PyExc_TypeError, "no XLA type for numpy dtype %R",
                 (PyObject *)d);
    return -1;
}

/* A sub-byte array is packed into a bytearray (the layout of hcb_arrays,
 * hcb_dtype_nbytes) that `view` then points to; `*keep` becomes the pair
 * (array, bytearray), which hcb_py_views_done unpacks back. */
static int
pack_view(hcb_array *view, PyObject **keep)
{
    PyArrayObject *arr = (PyArrayObject *)*keep;
    size_t n = (size_t)PyArray_SIZE(arr);
    PyObject *packed, *pair;

    packed = PyByteArray_FromStringAndSize(
        NULL, (Py_ssize_t)hcb_dtype_nbytes(view->dtype, n));
    if (packed == NULL)
        return -1;
    hcb_pack_elements(view->dtype, PyArray_DATA(arr), n,
                      PyByteArray_AS_STRING(packed));
    pair = PyTuple_Pack(2, (PyObject *)arr, packed);
    Py_DECREF(packed);
    if (pair == NULL)
        return -1;
    Py_SETREF(*keep, pair);
    view->data = PyByteArray_AS_STRING(PyTuple_GET_ITEM(pair, 1));
    view->nbytes = hcb_dtype_nbytes(view->dtype, n);
    return 0;
}

Py_ssize_t
hcb_py_views_of(hcb_state *st, PyObject *seq, hcb_array *views, PyObject **keep,
                Py_ssize_t cap, int writable)
{
    Py_ssize_t i, n = PySequence_Fast_GET_SIZE(seq);

    if (n > cap) {
        PyErr_Format(PyExc_ValueError, "at most %zd arrays, got %zd", cap, n);
        return -1;
    }
    for (i = 0; i < n; i++) {
        int flags = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED |
                    (writable ? NPY_ARRAY_WRITEABLE : 0);
        PyObject *a = PyArray_FROM_OF(PySequence_Fast_GET_ITEM(seq, i), flags);
        PyArrayObject *arr = (PyArrayObject *)a;

        keep[i] = a;
        if (a == NULL || dtype_code(st, PyArray_DESCR(arr), &views[i].dtype))
            return -1;
        if (writable && a != PySequence_Fast_GET_ITEM(seq, i)) {
            PyErr_SetString(PyExc_ValueError,
                            "results must be C-contiguous writable arrays");
            return -1;
        }
        views[i].rank = PyArray_NDIM(arr);
        views[i].dims = (const int64_t *)PyArray_DIMS(arr);
        views[i].data = PyArray_DATA(arr);
        views[i].nbytes = (size_t)PyArray_NBYTES(arr);
        if (hcb_py_packed(views[i].dtype) && pack_view(&views[i], &keep[i]))
            return -1;
    }
    return n;
}

void
hcb_py_views_done(const hcb_array *views, PyObject **keep, Py_ssize_t n)
{
    Py_ssize_t i;

    for (i = 0; i < n; i++) {
        PyObject *k = keep[i];

        if (k != NULL && PyTuple_Check(k)) { /* (array, packed bytearray) */
            PyArrayObject *arr = (PyArrayObject *)PyTuple_GET_ITEM(k, 0);

            hcb_unpack_elements(views[i].dtype,
                                PyByteArray_AS_STRING(PyTuple_GET_ITEM(k, 1)),
                                (size_t)PyArray_SIZE(arr), PyArray_DATA(arr));
        }
    }
}
