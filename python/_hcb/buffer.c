/*
 * buffer.c - host_callback.buffer_callback: a Python callback that works in
 * place on XLA's buffers.  The Buffer type and its host side; its DLPack
 * export is dlpack.c's, its GPU interop buffer_cuda.c's (buffer.h).
 *
 * hcb_py_buffer_call is the call target of every Python buffer_callback
 * site; it runs on the XLA thread (hcb_runtime_call), like a call.  It wraps
 * each operand in a read-only Buffer and each result in a writable one (no
 * copy: a Buffer points at XLA's memory), unflattens them (but for the
 * common shapes that the BufferSite names: positional operands, one
 * result), calls callback(ctx, out, *args, **kwargs), and then
 * invalidates every Buffer: XLA's memory is only valid during the call, so
 * a Buffer kept longer raises instead of reading or writing freed memory.  On a
 * GPU it then orders XLA's stream after the streams the Buffers were exported
 * to (buffer_cuda.c).
 *
 * A Buffer has JAX's Buffer's attributes (shape, dtype, ndim, writeable)
 * and, on a CPU device, exposes the buffer protocol (numpy.asarray and
 * memoryview are zero-copy for the types with a PEP 3118 code), __array__
 * (every type, bfloat16 included; an input's array is read-only),
 * __dlpack__/__dlpack_device__ (numpy.from_dlpack).  A GPU Buffer refuses
 * host access and offers __cuda_array_interface__ and __dlpack__ instead
 * (buffer_cuda.c).
 */
#define NPY_TARGET_VERSION NPY_2_0_API_VERSION
#include "hcbpy.h"
#include "hcb/ffi.h"

#include <numpy/arrayobject.h>
#include <string.h>

#include "buffer.h"

_Static_assert(sizeof(Py_ssize_t) == sizeof(int64_t),
               "Buffer shapes are viewed as int64_t");

/* ---- Buffer ---------------------------------------------------------------
 */

int
hcb_py_buffer_on_cuda(const hcb_py_buffer *b)
{
    return HCB_DEVICE_PLATFORM(b->device) == HCB_PLATFORM_CUDA;
}

int
hcb_py_buffer_check_valid(const hcb_py_buffer *b)
{
    if (b->data != NULL || b->nbytes == 0)
        return 0;
    PyErr_SetString(PyExc_RuntimeError,
                    "this Buffer belongs to a buffer_callback that has "
                    "returned: XLA's memory behind it is no longer valid. "
                    "Copy the data inside the callback to keep it "
                    "(numpy.array(buf), or cupy.array(buf) for a GPU "
                    "buffer).");
    return -1;
}

static void
buffer_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);

    Py_XDECREF(((hcb_py_buffer *)self)->descr);
    Py_XDECREF(((hcb_py_buffer *)self)->base);
    PyMem_RawFree(((hcb_py_buffer *)self)->staging);
    tp->tp_free(self);
    Py_DECREF(tp);
}

PyObject *
hcb_py_buffer_shape(PyObject *self, void *closure)
{
    hcb_py_buffer *b = (hcb_py_buffer *)self;
    PyObject *t = PyTuple_New(b->ndim);
    int i;

    (void)closure;
    for (i = 0; t != NULL && i < b->ndim; i++) {
        PyObject *d = PyLong_FromSsize_t(b->shape[i]);

        if (d == NULL) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, d);
    }
    return t;
}

static PyObject *
buffer_dtype(PyObject *self, void *closure)
{
    (void)closure;
    Py_INCREF(((hcb_py_buffer *)self)->descr);
    return (PyObject *)((hcb_py_buffer *)self)->descr;
}

static PyObject *
buffer_ndim(PyObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromLong(((hcb_py_buffer *)self)->ndim);
}

/* Whether the callback may write it: a result (True), not an operand. */
static PyObject *
buffer_writeable(PyObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(!((hcb_py_buffer *)self)->readonly);
}

/* __array__(dtype=None, copy=None): a numpy view (no copy) of the buffer. */
static PyObject *
buffer_array(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char k_dtype[] = "dtype", k_copy[] = "copy";
    static char *kwlist[] = {k_dtype, k_copy, NULL};
    hcb_py_buffer *b = (hcb_py_buffer *)self;
    PyObject *dtype = Py_None, *copy = Py_None, *arr, *cast;
    int copying = 0;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO:__array__", kwlist,
                                     &dtype, &copy))
        return NULL;
    if (copy != Py_None && (copying = PyObject_IsTrue(copy)) < 0)
        return NULL;
    if (hcb_py_buffer_on_cuda(b))
        return hcb_py_buffer_refuse_host(b, PyExc_TypeError, "__array__");
    if (hcb_py_buffer_check_valid(b) < 0)
        return NULL;
    arr = hcb_py_array_view((PyObject *)b->descr, b->ndim,
                            (const int64_t *)b->shape, b->data, !b->readonly,
                            self);
    if (arr == NULL)
        return NULL;
    if (dtype != Py_None || copying) {
        PyArray_Descr *want = NULL;

        if (dtype != Py_None && !PyArray_DescrConverter(dtype, &want)) {
            Py_DECREF(arr);
            return NULL;
        }
        cast = PyArray_FromAny(arr, want, 0, 0,
                               NPY_ARRAY_ENSURECOPY | NPY_ARRAY_DEFAULT, NULL);
        Py_DECREF(arr);
        return cast;
    }
    return arr;
}

/* The PEP 3118 format of a numpy type, or NULL (bfloat16, float8, ...). */
static const char *
pep3118_format(const PyArray_Descr *d)
{
    switch (d->type_num) {
    case NPY_BOOL:
        return "?";
    case NPY_INT8:
        return "b";
    case NPY_UINT8:
        return "B";
    case NPY_INT16:
        return "h";
    case NPY_UINT16:
        return "H";
    case NPY_INT32:
        return "i";
    case NPY_UINT32:
        return "I";
    case NPY_LONG:
    case NPY_LONGLONG:
        return "q";
    case NPY_ULONG:
    case NPY_ULONGLONG:
        return "Q";
    case NPY_FLOAT16:
        return "e";
    case NPY_FLOAT32:
        return "f";
    case NPY_FLOAT64:
        return "d";
    case NPY_COMPLEX64:
        return "Zf";
    case NPY_COMPLEX128:
        return "Zd";
    default:
        return NULL;
    }
}

static int
buffer_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    hcb_py_buffer *b = (hcb_py_buffer *)self;
    const char *format = pep3118_format(b->descr);

    if (hcb_py_buffer_on_cuda(b)) {
        hcb_py_buffer_refuse_host(b, PyExc_BufferError, "the buffer protocol");
        return -1;
    }
    if (hcb_py_buffer_check_valid(b) < 0)
        return -1;
    if (format == NULL) {
        PyObject *name = PyObject_Str((PyObject *)b->descr);

        PyErr_Format(PyExc_BufferError,
                     "%s has no buffer-protocol format; use numpy.asarray "
                     "(through __array__) or __dlpack__",
                     name != NULL ? PyUnicode_AsUTF8(name) : "this type");
        Py_XDECREF(name);
        return -1;
    }
    if ((flags & PyBUF_WRITABLE) && b->readonly) {
        PyErr_SetString(PyExc_BufferError,
                        "this Buffer is an input of the buffer_callback: "
                        "read-only");
        return -1;
    }
    view->obj = self;
    Py_INCREF(self);
    view->buf = b->data;
    view->len = b->nbytes;
    view->readonly = b->readonly;
    view->itemsize = (Py_ssize_t)PyDataType_ELSIZE(b->descr);
    view->format = (flags & PyBUF_FORMAT) ? (char *)format : NULL;
    view->ndim = b->ndim;
    view->shape = (flags & PyBUF_ND) ? b->shape : NULL;
    view->strides = (flags & PyBUF_STRIDES) ? b->strides : NULL;
    view->suboffsets = NULL;
    view->internal = NULL;
    return 0;
}

static PyObject *
buffer_repr(PyObject *self)
{
    hcb_py_buffer *b = (hcb_py_buffer *)self;
    PyObject *shape = hcb_py_buffer_shape(self, NULL), *r;

    if (shape == NULL)
        return NULL;
    if (hcb_py_buffer_on_cuda(b))
        r = PyUnicode_FromFormat(
            "Buffer(shape=%R, dtype=%S, device=cuda:%d%s%s)", shape,
            (PyObject *)b->descr, (int)HCB_DEVICE_ORDINAL(b->device),
            b->readonly ? ", read-only" : "",
            b->data == NULL && b->nbytes > 0 ? ", released" : "");
    else
        r = PyUnicode_FromFormat(
            "Buffer(shape=%R, dtype=%S%s%s)", shape, (PyObject *)b->descr,
            b->readonly ? ", read-only" : "",
            b->data == NULL && b->nbytes > 0 ? ", released" : "");
    Py_DECREF(shape);
    return r;
}

static PyObject *buffer_new(hcb_state *st, const hcb_array *a,
                            hcb_device device, int readonly,
                            hcb_py_call_streams *streams);

/* Buffer._test_view(array, device_key, writable): see its docstring. */
static PyObject *
buffer_test_view(PyObject *cls, PyObject *args)
{
    hcb_state *st = PyType_GetModuleState((PyTypeObject *)cls);
    PyObject *array, *seq, *keep = NULL, *b = NULL;
    long long device;
    int writable;
    hcb_array view;

    if (st == NULL ||
        !PyArg_ParseTuple(args, "OLp:_test_view", &array, &device, &writable))
        return NULL;
    seq = PyTuple_Pack(1, array);
    if (seq != NULL &&
        hcb_py_views_of(st, seq, &view, &keep, 1, writable) == 1) {
        b = buffer_new(st, &view, (hcb_device)device, !writable, NULL);
        if (b != NULL) {
            ((hcb_py_buffer *)b)->base = keep;
            keep = NULL;
        }
    }
    Py_XDECREF(keep);
    Py_XDECREF(seq);
    return b;
}

static PyGetSetDef buffer_getset[] = {
    {"shape", hcb_py_buffer_shape, NULL, "The shape, a tuple of ints.", NULL},
    {"dtype", buffer_dtype, NULL, "The numpy dtype.", NULL},
    {"ndim", buffer_ndim, NULL, "The number of dimensions.", NULL},
    {"writeable", buffer_writeable, NULL,
     "True for a result (the callback writes it), False for an operand.", NULL},
    {"__cuda_array_interface__", hcb_py_buffer_cuda_interface, NULL,
     "The CUDA Array Interface (version 3, with XLA's stream) of a GPU "
     "buffer; AttributeError for a CPU one.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef buffer_methods[] = {
    {"__array__", (PyCFunction)(void (*)(void))buffer_array,
     METH_VARARGS | METH_KEYWORDS, "A numpy view of the buffer (no copy)."},
    {"__dlpack__", (PyCFunction)(void (*)(void))hcb_py_buffer_dlpack,
     METH_FASTCALL | METH_KEYWORDS,
     "A DLPack capsule viewing the buffer (DLPack 1.0 when max_version "
     "admits it: outputs writable, inputs read-only); on a GPU, `stream` "
     "(None, 1, 2, a cudaStream_t, or -1) is ordered after XLA's stream."},
    {"__dlpack_device__", hcb_py_buffer_dlpack_device, METH_NOARGS,
     "(device type, device id) of the buffer: (kDLCPU, 0) or (kDLCUDA, "
     "ordinal)."},
    {"_test_view", (PyCFunction)(void (*)(void))buffer_test_view,
     METH_VARARGS | METH_CLASS,
     "_test_view(array, device_key, writable) -> Buffer.  For tests only: "
     "a Buffer over a C-contiguous numpy array's memory that says it is on "
     "`device_key`, so that what a CUDA Buffer shows Python (which needs no "
     "CUDA call) is tested without a GPU.  Never invalidated."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot buffer_slots[] = {
    {Py_tp_dealloc, (void *)buffer_dealloc},
    {Py_tp_repr, (void *)buffer_repr},
    {Py_tp_getset, (void *)buffer_getset},
    {Py_tp_methods, (void *)buffer_methods},
    {Py_bf_getbuffer, (void *)buffer_getbuffer},
    {Py_tp_doc,
     (void *)"One XLA buffer seen by a buffer_callback: valid only while the "
             "callback runs."},
    {0, NULL},
};

static PyType_Spec buffer_spec = {
    .name = "host_callback.Buffer",
    .basicsize = sizeof(hcb_py_buffer),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = buffer_slots,
};

PyType_Spec *
hcb_py_buffer_spec(void)
{
    return &buffer_spec;
}

static PyObject *
buffer_new(hcb_state *st, const hcb_array *a, hcb_device device, int readonly,
           hcb_py_call_streams *streams)
{
    PyObject *descr = hcb_py_descr(st, a->dtype);
    hcb_py_buffer *b;
    Py_ssize_t stride;
    int i;

    if (descr == NULL)
        return NULL;
    if (HCB_DEVICE_PLATFORM(device) == HCB_PLATFORM_CUDA &&
        hcb_py_packed(a->dtype)) {
        /* Unpacking would read device memory on the host. */
        PyErr_Format(PyExc_TypeError,
                     "buffer_callback on GPU: %S arrays are packed (several "
                     "elements per byte) and cannot be unpacked on the host "
                     "from GPU memory; convert them to a whole-byte type "
                     "(e.g. int8) before the callback",
                     descr);
        return NULL;
    }
    b = PyObject_New(hcb_py_buffer, st->buffer_type);
    if (b == NULL)
        return NULL;
    Py_INCREF(descr);
    b->descr = (PyArray_Descr *)descr;
    b->data = a->data;
    b->ndim = a->rank;
    b->readonly = readonly;
    b->nbytes = (Py_ssize_t)a->nbytes;
    b->device = device;
    b->staging = NULL;
    b->xla = *a;
    b->base = NULL;
    b->streams = streams;
    stride = hcb_py_packed(a->dtype) ? 1 : (Py_ssize_t)hcb_dtype_size(a->dtype);
    for (i = a->rank - 1; i >= 0; i--) {
        b->shape[i] = (Py_ssize_t)a->dims[i];
        b->strides[i] = stride;
        stride *= b->shape[i];
    }
    if (hcb_py_packed(a->dtype)) { /* stride is now the element count */
        b->staging = PyMem_RawMalloc(stride > 0 ? (size_t)stride : 1);
        if (b->staging == NULL) {
            Py_DECREF(b);
            return PyErr_NoMemory();
        }
        hcb_unpack_elements(a->dtype, a->data, (size_t)stride, b->staging);
        b->data = b->staging;
        b->nbytes = stride;
    }
    return (PyObject *)b;
}

/* Ends a Buffer's use of XLA's memory when its callback returns: a packed
 * result gets what the callback wrote; then every use raises. */
static void
buffer_release(hcb_py_buffer *b)
{
    if (b->staging != NULL && !b->readonly)
        hcb_py_store(&b->xla, b->staging);
    b->data = NULL;
    b->streams = NULL;
}

/* ---- the call --------------------------------------------------------------
 */

/* Wraps `n` arrays in Buffers, items `at`.. of the tuple `buffers`. */
static int
set_buffers(hcb_state *st, PyObject *buffers, Py_ssize_t at,
            const hcb_array *arrays, size_t n, hcb_device device, int readonly,
            hcb_py_call_streams *streams)
{
    size_t i;

    for (i = 0; i < n; i++) {
        PyObject *b = buffer_new(st, &arrays[i], device, readonly, streams);

        if (b == NULL)
            return -1;
        PyTuple_SET_ITEM(buffers, at + (Py_ssize_t)i, b);
    }
    return 0;
}

/* `treedef`.unflatten(the items `from`..`to` of `buffers`). */
static PyObject *
unflatten(hcb_state *st, PyObject *treedef, PyObject *buffers, Py_ssize_t from,
          Py_ssize_t to)
{
    PyObject *leaves = PyTuple_GetSlice(buffers, from, to), *v;

    if (leaves == NULL)
        return NULL;
    v = PyObject_CallMethodOneArg(treedef, st->str_unflatten, leaves);
    Py_DECREF(leaves);
    return v;
}

/* callback(ctx, out, *args, **kwargs) with the Buffers `buffers` (the
 * operands', then the results'). */
static PyObject *
call_callback(hcb_py_buffer_target *t, hcb_device device, PyObject *buffers,
              size_t nargs)
{
    hcb_state *st = t->base.state;
    PyObject *in_value = NULL, *out_value = NULL, *pos = NULL, *kwargs = NULL;
    PyObject *dev = NULL, *ctx = NULL, *call_args = NULL, *result = NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(buffers), nin = (Py_ssize_t)nargs, i;
    Py_ssize_t npos = nin;

    /* The operands are the leaves of (args, kwargs). */
    if (t->nflat != nin) {
        in_value = unflatten(st, t->in_treedef, buffers, 0, nin);
        if (in_value == NULL)
            goto done;
        if (!PyTuple_Check(in_value) || PyTuple_GET_SIZE(in_value) != 2 ||
            !PyTuple_Check(PyTuple_GET_ITEM(in_value, 0)) ||
            !PyDict_Check(PyTuple_GET_ITEM(in_value, 1))) {
            PyErr_SetString(PyExc_TypeError,
                            "buffer_callback: the operands do not unflatten "
                            "to (args, kwargs)");
            goto done;
        }
        pos = PyTuple_GET_ITEM(in_value, 0);
        npos = PyTuple_GET_SIZE(pos);
        kwargs = PyTuple_GET_ITEM(in_value, 1);
    }
    out_value = t->out_is_leaf && n - nin == 1
                    ? Py_NewRef(PyTuple_GET_ITEM(buffers, nin))
                    : unflatten(st, t->out_treedef, buffers, nin, n);
    if (out_value == NULL)
        goto done;
    dev = hcb_py_device_of(st, device);
    ctx = dev != NULL ? PyObject_CallOneArg(t->context_type, dev) : NULL;
    if (ctx == NULL)
        goto done;
    call_args = PyTuple_New(npos + 2);
    if (call_args == NULL)
        goto done;
    PyTuple_SET_ITEM(call_args, 0, Py_NewRef(ctx));
    PyTuple_SET_ITEM(call_args, 1, Py_NewRef(out_value));
    for (i = 0; i < npos; i++)
        PyTuple_SET_ITEM(
            call_args, i + 2,
            Py_NewRef(PyTuple_GET_ITEM(pos != NULL ? pos : buffers, i)));
    result = PyObject_Call(t->callback, call_args, kwargs);
done:
    Py_XDECREF(in_value);
    Py_XDECREF(out_value);
    Py_XDECREF(dev);
    Py_XDECREF(ctx);
    Py_XDECREF(call_args);
    return result;
}

/* ---- the site ------------------------------------------------------------ */

int
hcb_py_buffer_site_read(hcb_py_buffer_target *t, PyObject *site)
{
    static const char *const names[] = {
        "callback",     "in_treedef",          "out_treedef",
        "context_type", "positional_operands", "one_result"};
    PyObject *f[6];
    Py_ssize_t npos;
    int one;

    if (hcb_py_fields(site, "BufferSite", names, f, 6) < 0)
        return -1;
    if (!PyCallable_Check(f[0]) || !PyCallable_Check(f[3])) {
        PyErr_SetString(PyExc_TypeError, "the BufferSite's callback and "
                                         "context_type must be callable");
        return -1;
    }
    npos = PyLong_AsSsize_t(f[4]);
    if ((npos == -1 && PyErr_Occurred()) || (one = PyObject_IsTrue(f[5])) < 0)
        return -1;
    t->callback = f[0];
    t->in_treedef = f[1];
    t->out_treedef = f[2];
    t->context_type = f[3];
    t->nflat = npos;
    t->out_is_leaf = one;
    return 0;
}

/* The subject of the call's error messages, in `buf`; formatted on the
 * error paths only, not at every call. */
static const char *
call_what(const hcb_py_buffer_target *t, char *buf, size_t cap)
{
    snprintf(buf, cap, "host_callback.buffer_callback: callback '%s'",
             t->base.name);
    return buf;
}

int
hcb_py_buffer_call(void *user, hcb_device device, const hcb_array *args,
                   size_t nargs, const hcb_array *results, size_t nresults,
                   hcb_error *err)
{
    hcb_py_buffer_target *t = user;
    hcb_py_call_streams streams = {hcb_call_stream(),
                                   HCB_DEVICE_ORDINAL(device),
                                   PyThread_get_thread_ident(), false, false};
    hcb_error join_err;
    int joined;
    PyGILState_STATE gil;
    PyObject *buffers, *result = NULL;
    char what[128];
    int rc = HCB_OK;
    Py_ssize_t i;

    if (hcb_py_gil_ensure(t->base.state, &gil) < 0)
        return hcb_error_set(err, HCB_ESTATE,
                             "%s not called: the Python interpreter is "
                             "shutting down",
                             call_what(t, what, sizeof what));
    rc = hcb_py_target_enter(&t->base,
                             "host_callback.buffer_callback: callback", err);
    if (rc != HCB_OK) {
        hcb_py_gil_release(gil);
        return rc;
    }
    buffers = PyTuple_New((Py_ssize_t)(nargs + nresults));
    if (buffers != NULL &&
        set_buffers(t->base.state, buffers, 0, args, nargs, device, 1,
                    &streams) == 0 &&
        set_buffers(t->base.state, buffers, (Py_ssize_t)nargs, results,
                    nresults, device, 0, &streams) == 0) {
        hcb_py_enter_call();
        result = call_callback(t, device, buffers, nargs);
        hcb_py_leave_call();
    }
    /* XLA's memory is valid only until we return.  (After a failure to
     * make them, the items not made are NULL.) */
    for (i = 0; buffers != NULL && i < PyTuple_GET_SIZE(buffers); i++)
        if (PyTuple_GET_ITEM(buffers, i) != NULL)
            buffer_release((hcb_py_buffer *)PyTuple_GET_ITEM(buffers, i));
    Py_XDECREF(buffers);
    /* XLA's later work (reading the results, or reusing the memory after a
     * failure) waits for what the consumers' streams do with it */
    joined = hcb_py_call_streams_join(&streams, &join_err);
    if (result == NULL) {
        rc = hcb_py_raised(&t->base, call_what(t, what, sizeof what), err);
    } else if (joined != HCB_OK) {
        rc = hcb_error_set(err, joined, "%s: %s",
                           call_what(t, what, sizeof what), join_err.message);
    } else if (result != Py_None) {
        PyObject *exc;

        /* JAX's words first: its users search for them. */
        hcb_error_set(err, HCB_EINVAL,
                      "buffer_callback callback must not return any values. "
                      "(%s returned a value)",
                      call_what(t, what, sizeof what));
        exc = PyObject_CallFunction(PyExc_ValueError, "s", err->message);
        Py_XDECREF(hcb_py_hand_to_hook(&t->base, exc, 0));
        rc = HCB_EINVAL;
    }
    Py_XDECREF(result);
    hcb_py_target_leave(&t->base);
    hcb_py_gil_release(gil);
    return rc;
}
