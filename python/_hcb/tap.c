/*
 * tap.c - delivering one record to a Python tap function.
 *
 * Runs on the device's consumer thread (runtime.c), which holds no lock and
 * not the GIL.  Steps: take the GIL; wrap each array of the record in a
 * numpy array that points into the record (no copy) and keeps it alive
 * through a RecordOwner; unflatten them with the site's treedef; call
 * func(value, transforms[, device=...]); on an exception, hand it to the
 * Python error hook (logging, barrier_wait) and report it to the runtime.
 */
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL hcb_ARRAY_API
#define NPY_NO_DEPRECATED_API  NPY_2_0_API_VERSION
#include "hcbpy.h"

#include <numpy/arrayobject.h>

#if PY_VERSION_HEX >= 0x030D0000
#define HCB_PY_FINALIZING() Py_IsFinalizing()
#else
#define HCB_PY_FINALIZING() _Py_IsFinalizing()
#endif

/* Set while this thread is inside a tap function (barrier_wait uses it to
 * refuse waiting for itself). */
static _Thread_local int in_tap;

int
hcb_py_in_tap(void)
{
    return in_tap;
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

static PyObject *
array_over(hcb_state *st, const hcb_array *a, PyObject *owner)
{
    npy_intp dims[HCB_MAX_RANK];
    PyObject *descr, *arr;
    int32_t i;

    descr = (unsigned)a->dtype < HCB_PY_NDTYPES
                ? PyTuple_GET_ITEM(st->dtypes, a->dtype)
                : Py_None;
    if (descr == Py_None) {
        PyErr_Format(PyExc_TypeError, "no numpy dtype for %s (XLA type %d)",
                     hcb_dtype_name(a->dtype), (int)a->dtype);
        return NULL;
    }
    for (i = 0; i < a->rank; i++)
        dims[i] = (npy_intp)a->dims[i];
    Py_INCREF(descr); /* PyArray_NewFromDescr steals it */
    arr = PyArray_NewFromDescr(&PyArray_Type, (PyArray_Descr *)descr, a->rank,
                               dims, NULL, a->data, NPY_ARRAY_CARRAY, NULL);
    if (arr == NULL)
        return NULL;
    Py_INCREF(owner);
    if (PyArray_SetBaseObject((PyArrayObject *)arr, owner) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

static PyObject *
arrays_of(hcb_state *st, hcb_record *rec)
{
    size_t i, n = hcb_record_nargs(rec);
    const hcb_array *args = hcb_record_args(rec);
    PyObject *owner, *tuple;

    tuple = PyTuple_New((Py_ssize_t)n);
    if (tuple == NULL)
        return NULL;
    if (n == 0)
        return tuple;
    owner = owner_new(st, rec);
    if (owner == NULL) {
        Py_DECREF(tuple);
        return NULL;
    }
    for (i = 0; i < n; i++) {
        PyObject *arr = array_over(st, &args[i], owner);

        if (arr == NULL) {
            Py_DECREF(owner);
            Py_DECREF(tuple);
            return NULL;
        }
        PyTuple_SET_ITEM(tuple, (Py_ssize_t)i, arr);
    }
    Py_DECREF(owner);
    return tuple;
}

static PyObject *
device_of(hcb_state *st, hcb_device key)
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

/* ---- the call ------------------------------------------------------------ */

static PyObject *
call_site(hcb_state *st, PyObject *site, hcb_record *rec)
{
    PyObject *func = PyTuple_GET_ITEM(site, 0);
    PyObject *treedef = PyTuple_GET_ITEM(site, 1);
    PyObject *transforms = PyTuple_GET_ITEM(site, 2);
    int with_device = PyObject_IsTrue(PyTuple_GET_ITEM(site, 3));
    PyObject *arrays, *value, *result = NULL;

    if (with_device < 0)
        return NULL;
    arrays = arrays_of(st, rec);
    if (arrays == NULL)
        return NULL;
    value = PyObject_CallMethodOneArg(treedef, st->str_unflatten, arrays);
    Py_DECREF(arrays);
    if (value == NULL)
        return NULL;
    if (with_device) {
        PyObject *dev = device_of(st, hcb_record_device(rec));

        if (dev != NULL) {
            PyObject *argv[3] = {value, transforms, dev};
            PyObject *names = PyTuple_Pack(1, st->str_device);

            if (names != NULL)
                result = PyObject_Vectorcall(func, argv, 2, names);
            Py_XDECREF(names);
            Py_DECREF(dev);
        }
    } else {
        PyObject *argv[2] = {value, transforms};

        result = PyObject_Vectorcall(func, argv, 2, NULL);
    }
    Py_DECREF(value);
    return result;
}

static PyObject *
fetch_exception(void)
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

/* Describes the pending exception in `err`, hands it to the Python error
 * hook and clears it: no exception is left pending on this thread. */
static int
report_exception(hcb_py_target *t, hcb_error *err)
{
    PyObject *exc = fetch_exception();
    PyObject *text = exc != NULL ? PyObject_Str(exc) : NULL;
    const char *msg = text != NULL ? PyUnicode_AsUTF8(text) : NULL;
    PyObject *r;

    PyErr_Clear();
    hcb_error_set(err, HCB_ECALLBACK, "tap function '%s' raised %s: %s",
                  t->name, exc != NULL ? Py_TYPE(exc)->tp_name : "?",
                  msg != NULL ? msg : "<unprintable>");
    Py_XDECREF(text);
    if (exc != NULL) {
        r = PyObject_CallFunctionObjArgs(t->state->on_error, t->site, exc,
                                         NULL);
        if (r == NULL)
            PyErr_WriteUnraisable(t->state->on_error);
        Py_XDECREF(r);
        Py_DECREF(exc);
    }
    return HCB_ECALLBACK;
}

int
hcb_py_tap(void *user, hcb_record *rec, hcb_error *err)
{
    hcb_py_target *t = user;
    PyGILState_STATE gil;
    PyObject *result;
    int rc = HCB_OK;

    /* Taking the GIL during finalisation would hang or kill this thread. */
    if (atomic_load(&t->state->shutting_down) || HCB_PY_FINALIZING())
        return hcb_error_set(err, HCB_ESTATE,
                             "tap function '%s' not called: the Python "
                             "interpreter is shutting down",
                             t->name);
    gil = PyGILState_Ensure();
    in_tap = 1;
    result = call_site(t->state, t->site, rec);
    in_tap = 0;
    if (result == NULL)
        rc = report_exception(t, err);
    Py_XDECREF(result);
    PyGILState_Release(gil);
    return rc;
}
