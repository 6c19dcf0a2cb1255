/*
 * sharded.c - taps and calls that reach the runtime from Python: under jit
 * over sharded operands, our custom calls cannot be pinned to one device,
 * so the lowering (host_callback/_lowering.py) goes through JAX's own
 * Python callback, pinned to device_index, whose function calls these:
 *
 *   submit_tap(callback_id, device_key, arrays): copies the arrays into a
 *     record and queues it on the device's channel (asynchronous, ordered
 *     with that device's other taps), as the hcb_tap handler would;
 *   run_call(callback_id, device_key, args, outs, ndevices): runs a call
 *     target on numpy arrays (outs preallocated with the declared shapes),
 *     as the hcb_call handler would.  Its failure is parked for all
 *     `ndevices` devices (hcb_runtime_call_shared) and its message returned;
 *     if it could not be parked it is raised.
 */
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL hcb_ARRAY_API
#define NPY_NO_DEPRECATED_API  NPY_2_0_API_VERSION
#define NPY_TARGET_VERSION     NPY_2_0_API_VERSION
#include "hcbpy.h"

#include <numpy/arrayobject.h>

_Static_assert(sizeof(npy_intp) == sizeof(int64_t),
               "numpy dims are viewed as int64_t");

#define MAX_ARRAYS 256

static PyObject *
raise_error(const hcb_error *err)
{
    PyErr_SetString(PyExc_RuntimeError, err->message);
    return NULL;
}

/* submit_tap(callback_id, device_key, arrays) */
PyObject *
hcb_py_submit_tap(hcb_state *st, PyObject *args)
{
    unsigned long long id;
    long long key;
    PyObject *arrays, *seq, *keep[MAX_ARRAYS] = {NULL};
    hcb_array views[MAX_ARRAYS];
    hcb_record *rec = NULL;
    Py_ssize_t n, i;
    hcb_error err;
    int rc = HCB_OK;

    if (!PyArg_ParseTuple(args, "KLO:submit_tap", &id, &key, &arrays))
        return NULL;
    seq = PySequence_Fast(arrays, "arrays must be a sequence");
    if (seq == NULL)
        return NULL;
    n = hcb_py_views_of(st, seq, views, keep, MAX_ARRAYS, 0);
    if (n >= 0)
        rc = hcb_record_create(id, (hcb_device)key, views, (size_t)n, &rec,
                               &err);
    for (i = 0; i < PySequence_Fast_GET_SIZE(seq) && i < MAX_ARRAYS; i++)
        Py_XDECREF(keep[i]);
    Py_DECREF(seq);
    if (n < 0)
        return NULL;
    if (rc != HCB_OK)
        return raise_error(&err);
    Py_BEGIN_ALLOW_THREADS rc = hcb_runtime_submit(st->rt, rec, &err);
    Py_END_ALLOW_THREADS if (rc != HCB_OK) return raise_error(&err);
    Py_RETURN_NONE;
}

/* run_call(callback_id, device_key, args, outs, ndevices) -> None or the
 * message of a parked failure */
PyObject *
hcb_py_run_call(hcb_state *st, PyObject *args)
{
    unsigned long long id;
    long long key, ndevices;
    PyObject *in, *out, *in_seq = NULL, *out_seq = NULL;
    PyObject *keep_in[MAX_ARRAYS] = {NULL}, *keep_out[MAX_ARRAYS] = {NULL};
    hcb_array in_views[MAX_ARRAYS], out_views[MAX_ARRAYS];
    Py_ssize_t nin = -1, nout = -1, i;
    PyObject *result = NULL;
    hcb_error err;
    int rc, parked = 0;

    if (!PyArg_ParseTuple(args, "KLOOL:run_call", &id, &key, &in, &out,
                          &ndevices))
        return NULL;
    in_seq = PySequence_Fast(in, "args must be a sequence");
    out_seq =
        in_seq != NULL ? PySequence_Fast(out, "outs must be a sequence") : NULL;
    if (out_seq != NULL)
        nin = hcb_py_views_of(st, in_seq, in_views, keep_in, MAX_ARRAYS, 0);
    if (nin >= 0)
        nout = hcb_py_views_of(st, out_seq, out_views, keep_out, MAX_ARRAYS, 1);
    if (nout >= 0) {
        Py_BEGIN_ALLOW_THREADS rc = hcb_runtime_call_shared(
            st->rt, id, (hcb_device)key, in_views, (size_t)nin, out_views,
            (size_t)nout, (int64_t)ndevices, &parked, &err);
        Py_END_ALLOW_THREADS hcb_py_views_done(out_views, keep_out, nout);
        if (rc == HCB_OK) {
            Py_INCREF(Py_None);
            result = Py_None;
        } else if (parked)
            result = PyUnicode_FromString(err.message);
        else
            raise_error(&err);
    }
    for (i = 0; i < MAX_ARRAYS; i++) {
        Py_XDECREF(keep_in[i]);
        Py_XDECREF(keep_out[i]);
    }
    Py_XDECREF(in_seq);
    Py_XDECREF(out_seq);
    return result;
}
