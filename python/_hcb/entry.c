/*
 * entry.c - taps and calls that reach the runtime from Python: under jit
 * over sharded operands, our custom calls cannot be pinned to one device,
 * so the lowering (host_callback/_lowering.py) goes through JAX's own
 * Python callback, pinned to device_index, whose function calls these:
 *
 *   submit_tap(callback_id, device_key, arrays, deliver): copies the
 *     arrays into a record and queues it on the device's channel
 *     (asynchronous, ordered with that device's other taps), or with
 *     deliver 1 or 2 delivers it now, in this thread, as the hcb_tap
 *     handler would with that attribute (1: a failure raises, 2: it is
 *     only recorded);
 *   run_call(callback_id, device_key, args, outs, ndevices): runs a call
 *     target on numpy arrays (outs preallocated with the declared shapes),
 *     as the hcb_call handler would.  Its failure is parked for the
 *     `ndevices` devices of this process that check it
 *     (hcb_runtime_call_parked) and its message returned;
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

#define STACK_ARRAYS 16

/* The views of a sequence's arrays and the objects that keep them alive:
 * on the stack for up to STACK_ARRAYS arrays, else on the heap (a tap or a
 * call takes as many arrays as the program gives it, as the FFI handlers
 * do).  room_close is safe after room_init and after a failed room_open. */
typedef struct {
    hcb_array *views;
    PyObject **keep;
    Py_ssize_t n;
    hcb_array stack_views[STACK_ARRAYS];
    PyObject *stack_keep[STACK_ARRAYS];
} arrays_room;

static void
room_init(arrays_room *r)
{
    r->views = r->stack_views;
    r->keep = r->stack_keep;
    r->n = 0;
}

static int
room_open(arrays_room *r, PyObject *seq)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);

    room_init(r);
    memset(r->stack_keep, 0, sizeof r->stack_keep);
    if (n > STACK_ARRAYS) {
        r->views = PyMem_Calloc((size_t)n, sizeof *r->views);
        r->keep = PyMem_Calloc((size_t)n, sizeof *r->keep);
        if (r->views == NULL || r->keep == NULL) {
            PyMem_Free(r->views);
            PyMem_Free(r->keep);
            room_init(r);
            PyErr_NoMemory();
            return -1;
        }
    }
    r->n = n;
    return 0;
}

static void
room_close(arrays_room *r)
{
    Py_ssize_t i;

    for (i = 0; i < r->n; i++)
        Py_XDECREF(r->keep[i]);
    if (r->views != r->stack_views) {
        PyMem_Free(r->views);
        PyMem_Free(r->keep);
    }
    room_init(r);
}

/* submit_tap(callback_id, device_key, arrays, deliver=0) */
PyObject *
hcb_py_submit_tap(hcb_state *st, PyObject *args)
{
    unsigned long long id;
    long long key;
    PyObject *arrays, *seq;
    arrays_room room;
    hcb_record *rec = NULL;
    Py_ssize_t n = -1;
    hcb_error err;
    int rc = HCB_OK, deliver = 0;

    if (!PyArg_ParseTuple(args, "KLO|i:submit_tap", &id, &key, &arrays,
                          &deliver))
        return NULL;
    if (deliver < 0 || deliver > 2) {
        PyErr_Format(PyExc_ValueError, "deliver must be 0, 1 or 2, got %d",
                     deliver);
        return NULL;
    }
    seq = PySequence_Fast(arrays, "arrays must be a sequence");
    if (seq == NULL)
        return NULL;
    if (room_open(&room, seq) == 0)
        n = hcb_py_views_of(st, seq, room.views, room.keep, room.n, 0);
    if (n >= 0) /* the record copies the arrays */
        rc = hcb_record_create(id, (hcb_device)key, room.views, (size_t)n, &rec,
                               &err);
    room_close(&room);
    Py_DECREF(seq);
    if (n < 0)
        return NULL;
    if (rc != HCB_OK)
        return hcb_py_raise(&err);
    Py_BEGIN_ALLOW_THREADS if (deliver == 0) rc =
        hcb_runtime_submit(st->rt, rec, &err);
    else rc = hcb_runtime_deliver(
        st->rt, rec, deliver == 1 ? HCB_DELIVER_FAIL : HCB_DELIVER_KEEP_ERROR,
        &err);
    Py_END_ALLOW_THREADS if (rc != HCB_OK) return hcb_py_raise(&err);
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
    arrays_room ins, outs;
    Py_ssize_t nin = -1, nout = -1;
    PyObject *result = NULL;
    hcb_error err;
    int rc, parked = 0;

    if (!PyArg_ParseTuple(args, "KLOOL:run_call", &id, &key, &in, &out,
                          &ndevices))
        return NULL;
    room_init(&ins);
    room_init(&outs);
    in_seq = PySequence_Fast(in, "args must be a sequence");
    out_seq =
        in_seq != NULL ? PySequence_Fast(out, "outs must be a sequence") : NULL;
    if (out_seq != NULL && room_open(&ins, in_seq) == 0 &&
        room_open(&outs, out_seq) == 0)
        nin = hcb_py_views_of(st, in_seq, ins.views, ins.keep, ins.n, 0);
    if (nin >= 0)
        nout = hcb_py_views_of(st, out_seq, outs.views, outs.keep, outs.n, 1);
    if (nout >= 0) {
        Py_BEGIN_ALLOW_THREADS rc = hcb_runtime_call_parked(
            st->rt, id, (hcb_device)key, ins.views, (size_t)nin, outs.views,
            (size_t)nout, (int64_t)ndevices, &parked, &err);
        Py_END_ALLOW_THREADS hcb_py_views_done(outs.views, outs.keep, nout);
        if (rc == HCB_OK) {
            Py_INCREF(Py_None);
            result = Py_None;
        } else if (parked)
            result = PyUnicode_FromString(err.message);
        else
            hcb_py_raise(&err);
    }
    room_close(&ins);
    room_close(&outs);
    Py_XDECREF(in_seq);
    Py_XDECREF(out_seq);
    return result;
}
