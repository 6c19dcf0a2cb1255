/*
 * buffer.c - host_callback.buffer_callback: a Python callback that works in
 * place on XLA's buffers.
 *
 * hcb_py_buffer_call is the call target of every Python buffer_callback
 * site; it runs on the XLA thread (hcb_runtime_call), like a call.  It wraps
 * each operand in a read-only Buffer and each result in a writable one (no
 * copy: a Buffer points at XLA's memory), unflattens them, calls
 * callback(ctx, out, *args, **kwargs), and then invalidates every Buffer:
 * XLA's memory is only valid during the call, so a Buffer kept longer
 * raises instead of reading or writing freed memory.
 *
 * A Buffer of a CPU device exposes the buffer protocol (numpy.asarray and
 * memoryview are zero-copy for the types with a PEP 3118 code), __array__
 * (every type, bfloat16 included), __dlpack__/__dlpack_device__
 * (numpy.from_dlpack) and shape/dtype.
 *
 * A Buffer of a CUDA device (HCB_DEVICE_PLATFORM(device) is
 * HCB_PLATFORM_CUDA) points at device memory, so every host access (the
 * buffer protocol, __array__) raises and says what to use instead; it
 * exposes __cuda_array_interface__ (version 3) and __dlpack__ with kDLCUDA,
 * as JAX's own buffer_callback Buffer does.  The callback runs while XLA's
 * thread enqueues work, not after the stream reached this point: inputs may
 * still be being computed, and results are read by kernels enqueued after
 * the callback returns.  Work on the Buffers therefore goes on XLA's stream
 * (ExecutionContext.stream, hcb_call_stream()), and nothing here
 * synchronises the stream or copies device memory:
 *   - __cuda_array_interface__ has no "stream" key.  CAI v3 says a consumer
 *     must synchronise on a given stream; CuPy and Numba do so with
 *     cudaStreamSynchronize, a host wait on XLA's stream at every
 *     conversion, and it would still not order the consumer's writes
 *     before XLA's next kernels.  JAX's Buffer gives no stream either.
 *   - __dlpack__(stream=s) with s an integer other than XLA's stream (and
 *     not -1, "no synchronisation") raises BufferError: the protocol asks
 *     the producer to make the data safe on s, which would take an event
 *     and a cross-stream wait through CUDA, which this extension does not
 *     load.  cupy.from_dlpack inside `with
 *     cupy.cuda.ExternalStream(ctx.stream):` passes XLA's stream.
 *   - sub-byte types (int4, ...) are refused: their staging unpacks on the
 *     host, which device memory does not allow.
 */
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL hcb_ARRAY_API
#define NPY_NO_DEPRECATED_API  NPY_2_0_API_VERSION
#define NPY_TARGET_VERSION     NPY_2_0_API_VERSION
#include "hcbpy.h"
#include "hcb/ffi.h"

#include <numpy/arrayobject.h>
#include <string.h>

_Static_assert(sizeof(Py_ssize_t) == sizeof(int64_t),
               "Buffer shapes are viewed as int64_t");

/* ---- Buffer ---------------------------------------------------------------
 */

typedef struct {
    PyObject_HEAD void *data; /* NULL once invalidated */
    PyArray_Descr *descr;     /* strong */
    int ndim;
    int readonly;
    Py_ssize_t nbytes;
    hcb_device device;
    Py_ssize_t shape[HCB_MAX_RANK];
    Py_ssize_t strides[HCB_MAX_RANK];
    /* A sub-byte type is packed in XLA's buffer but one element per byte in
     * numpy: `data` is then `staging` (owned, PyMem_Raw), an unpacked copy
     * of `xla` (XLA's buffer, borrowed for the call), packed back into it
     * when the callback returns (buffer_release); else `staging` is NULL. */
    void *staging;
    hcb_array xla;
    /* Strong or NULL: the memory's owner of a Buffer made by _test_view. */
    PyObject *base;
} buffer_object;

/* Whether the Buffer's memory is a CUDA device's. */
static int
on_cuda(const buffer_object *b)
{
    return HCB_DEVICE_PLATFORM(b->device) == HCB_PLATFORM_CUDA;
}

/* Raises `exc` saying that a host access (`what`) of a GPU Buffer cannot
 * be, and what to use instead; returns NULL. */
static PyObject *
refuse_host_access(const buffer_object *b, PyObject *exc, const char *what)
{
    PyErr_Format(exc,
                 "%s: this Buffer is in GPU memory (CUDA device %d), which "
                 "the host cannot read or write.  Use it on the GPU: "
                 "cupy.asarray(buf) (__cuda_array_interface__) or "
                 "cupy.from_dlpack(buf) inside `with "
                 "cupy.cuda.ExternalStream(ctx.stream):`, and enqueue the "
                 "work on ctx.stream (XLA's stream)",
                 what, (int)HCB_DEVICE_ORDINAL(b->device));
    return NULL;
}

static int
check_valid(buffer_object *b)
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

    Py_XDECREF(((buffer_object *)self)->descr);
    Py_XDECREF(((buffer_object *)self)->base);
    PyMem_RawFree(((buffer_object *)self)->staging);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyObject *
buffer_shape(PyObject *self, void *closure)
{
    buffer_object *b = (buffer_object *)self;
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
    Py_INCREF(((buffer_object *)self)->descr);
    return (PyObject *)((buffer_object *)self)->descr;
}

/* __cuda_array_interface__ (version 3) of a CUDA Buffer: shape, typestr,
 * data = (pointer, read-only), strides None (C order); no "stream" key (the
 * file's comment says why).  An AttributeError for a CPU Buffer, so that
 * hasattr() tells a GPU buffer from a host one. */
static PyObject *
buffer_cuda_interface(PyObject *self, void *closure)
{
    buffer_object *b = (buffer_object *)self;
    PyObject *shape, *typestr, *r;

    (void)closure;
    if (!on_cuda(b)) {
        PyErr_SetString(PyExc_AttributeError,
                        "__cuda_array_interface__: this Buffer is in host "
                        "(CPU) memory; use numpy.asarray or __dlpack__");
        return NULL;
    }
    if (check_valid(b) < 0)
        return NULL;
    shape = buffer_shape(self, NULL);
    typestr = PyObject_GetAttrString((PyObject *)b->descr, "str");
    r = shape != NULL && typestr != NULL
            ? Py_BuildValue("{sOsOs(NO)sOsi}", "shape", shape, "typestr",
                            typestr, "data",
                            PyLong_FromVoidPtr(b->nbytes > 0 ? b->data : NULL),
                            b->readonly ? Py_True : Py_False, "strides",
                            Py_None, "version", 3)
            : NULL;
    Py_XDECREF(shape);
    Py_XDECREF(typestr);
    return r;
}

/* __array__(dtype=None, copy=None): a numpy view (no copy) of the buffer. */
static PyObject *
buffer_array(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char k_dtype[] = "dtype", k_copy[] = "copy";
    static char *kwlist[] = {k_dtype, k_copy, NULL};
    buffer_object *b = (buffer_object *)self;
    PyObject *dtype = Py_None, *copy = Py_None, *arr, *cast;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO:__array__", kwlist,
                                     &dtype, &copy))
        return NULL;
    if (on_cuda(b))
        return refuse_host_access(b, PyExc_TypeError, "__array__");
    if (check_valid(b) < 0)
        return NULL;
    arr = hcb_py_array_view((PyObject *)b->descr, b->ndim,
                            (const int64_t *)b->shape, b->data, !b->readonly,
                            self);
    if (arr == NULL)
        return NULL;
    if (dtype != Py_None || (copy != Py_None && PyObject_IsTrue(copy) == 1)) {
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
    buffer_object *b = (buffer_object *)self;
    const char *format = pep3118_format(b->descr);

    if (on_cuda(b)) {
        refuse_host_access(b, PyExc_BufferError, "the buffer protocol");
        return -1;
    }
    if (check_valid(b) < 0)
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

/* ---- DLPack (the stable ABI, defined here) ------------------------------- */

typedef struct {
    int32_t device_type; /* kDLCPU = 1, kDLCUDA = 2 */
    int32_t device_id;
} dl_device;

enum { DL_CPU = 1, DL_CUDA = 2 };

/* The DLPack device of a Buffer: (kDLCUDA, ordinal) or (kDLCPU, 0). */
static dl_device
dl_device_of(const buffer_object *b)
{
    dl_device d = {DL_CPU, 0};

    if (on_cuda(b)) {
        d.device_type = DL_CUDA;
        d.device_id = HCB_DEVICE_ORDINAL(b->device);
    }
    return d;
}

typedef struct {
    uint8_t code; /* 0 int, 1 uint, 2 float, 4 bfloat, 5 complex, 6 bool */
    uint8_t bits;
    uint16_t lanes;
} dl_data_type;

typedef struct {
    void *data;
    dl_device device;
    int32_t ndim;
    dl_data_type dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} dl_tensor;

typedef struct dl_managed_tensor {
    dl_tensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct dl_managed_tensor *self);
} dl_managed_tensor;

/* DLPack 1.0: a version and flags; a consumer that asks for it (numpy's
 * from_dlpack passes max_version=(1, 0)) learns from the flags whether it
 * may write, as it does from JAX's own buffers. */
typedef struct {
    uint32_t major;
    uint32_t minor;
} dl_version;

typedef struct dl_managed_tensor_versioned {
    dl_version version;
    void *manager_ctx;
    void (*deleter)(struct dl_managed_tensor_versioned *self);
    uint64_t flags;
    dl_tensor dl_tensor;
} dl_managed_tensor_versioned;

#define DL_FLAG_READ_ONLY ((uint64_t)1)

/* What a capsule owns: the tensor (first, so that a pointer to it is one to
 * the holder), its shape, and the Buffer it views. */
typedef struct {
    union {
        dl_managed_tensor legacy;
        dl_managed_tensor_versioned versioned;
    } m;
    int64_t shape[HCB_MAX_RANK];
    PyObject *owner;
} dl_holder;

static void
dl_holder_free(dl_holder *h)
{
    PyGILState_STATE gil = PyGILState_Ensure();

    Py_XDECREF(h->owner);
    PyGILState_Release(gil);
    PyMem_RawFree(h);
}

static void
dl_deleter(dl_managed_tensor *m)
{
    dl_holder_free((dl_holder *)m);
}

static void
dl_deleter_versioned(dl_managed_tensor_versioned *m)
{
    dl_holder_free((dl_holder *)m);
}

static void
dl_capsule_destructor(PyObject *capsule)
{
    /* A consumer renames a used capsule "used_dltensor[_versioned]" and
     * owns it. */
    if (PyCapsule_IsValid(capsule, "dltensor")) {
        dl_managed_tensor *m = PyCapsule_GetPointer(capsule, "dltensor");

        if (m != NULL && m->deleter != NULL)
            m->deleter(m);
    } else if (PyCapsule_IsValid(capsule, "dltensor_versioned")) {
        dl_managed_tensor_versioned *m =
            PyCapsule_GetPointer(capsule, "dltensor_versioned");

        if (m != NULL && m->deleter != NULL)
            m->deleter(m);
    }
}

/* Whether `max_version` (None or a (major, minor) tuple) admits DLPack
 * 1.0; -1 with an exception set. */
static int
wants_versioned(PyObject *max_version)
{
    long major;

    if (max_version == Py_None)
        return 0;
    if (!PyTuple_Check(max_version) || PyTuple_GET_SIZE(max_version) != 2) {
        PyErr_Format(PyExc_TypeError,
                     "__dlpack__: max_version must be None or a (major, "
                     "minor) tuple, got %R",
                     max_version);
        return -1;
    }
    major = PyLong_AsLong(PyTuple_GET_ITEM(max_version, 0));
    if (major == -1 && PyErr_Occurred())
        return -1;
    return major >= 1;
}

static int
dl_type_of(const PyArray_Descr *d, dl_data_type *out)
{
    char kind = d->kind;

    out->bits = (uint8_t)(PyDataType_ELSIZE(d) * 8);
    out->lanes = 1;
    if (d->type_num == NPY_BOOL)
        out->code = 6;
    else if (kind == 'i')
        out->code = 0;
    else if (kind == 'u')
        out->code = 1;
    else if (kind == 'f')
        out->code = 2;
    else if (kind == 'c')
        out->code = 5;
    else if (strcmp(d->typeobj->tp_name, "bfloat16") == 0)
        out->code = 4;
    else
        return -1;
    return 0;
}

/* Whether `dl_device` (None or a (type, id) tuple) is the Buffer's own
 * device: 0, or -1 with BufferError (a Buffer cannot copy to another). */
static int
check_dl_device(const buffer_object *b, PyObject *want)
{
    dl_device d = dl_device_of(b);
    int type, id;

    if (want == Py_None)
        return 0;
    if (!PyTuple_Check(want) ||
        !PyArg_ParseTuple(want, "ii;dl_device must be (type, id)", &type,
                          &id)) {
        PyErr_Format(PyExc_TypeError,
                     "__dlpack__: dl_device must be None or a (device type, "
                     "device id) tuple, got %R",
                     want);
        return -1;
    }
    if (type == d.device_type && id == d.device_id)
        return 0;
    PyErr_Format(PyExc_BufferError,
                 "__dlpack__: dl_device=(%d, %d) asks for a copy to another "
                 "device; this Buffer is on (%d, %d) and only exports its "
                 "own memory",
                 type, id, (int)d.device_type, (int)d.device_id);
    return -1;
}

/* The DLPack `stream` rule for a CUDA Buffer: the consumer names the stream
 * it will use, and the producer must make the data safe there.  The data
 * is safe on XLA's stream alone (the file's comment says why), so XLA's
 * stream and -1 (the consumer asks for no synchronisation) pass, and so
 * does None: the protocol reads it as the legacy default stream, but
 * consumers that predate the argument call __dlpack__() without one, as
 * they use a CAI without a "stream" key.  Another stream raises.  Outside
 * a CUDA call target hcb_call_stream() is NULL and nothing is checked. */
static int
check_dl_stream(const buffer_object *b, PyObject *stream)
{
    uintptr_t xla = (uintptr_t)hcb_call_stream();
    long long s;

    if (!on_cuda(b) || stream == Py_None)
        return 0;
    s = PyLong_AsLongLong(stream);
    if (s == -1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError,
                     "__dlpack__: stream must be None or an int, got %R",
                     stream);
        return -1;
    }
    if (s == -1 || xla == 0 || (uintptr_t)s == xla)
        return 0;
    PyErr_Format(PyExc_BufferError,
                 "__dlpack__(stream=%lld): this Buffer's data is ready on "
                 "XLA's stream (0x%llx, ctx.stream) only, and it does not "
                 "synchronise other streams.  Import it on XLA's stream, "
                 "e.g. `with cupy.cuda.ExternalStream(ctx.stream): "
                 "x = cupy.from_dlpack(buf)`, or pass stream=-1 if you "
                 "synchronise yourself",
                 s, (unsigned long long)xla);
    return -1;
}

/* __dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None):
 * a "dltensor_versioned" capsule (DLPack 1.0, inputs flagged read-only) when
 * max_version admits it, else a legacy "dltensor" one, of the Buffer's own
 * memory on its own device (kDLCPU or kDLCUDA). */
static PyObject *
buffer_dlpack(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char k_stream[] = "stream", k_max[] = "max_version",
                k_dev[] = "dl_device", k_copy[] = "copy";
    static char *kwlist[] = {k_stream, k_max, k_dev, k_copy, NULL};
    buffer_object *b = (buffer_object *)self;
    PyObject *stream = Py_None, *max_version = Py_None, *dev = Py_None;
    PyObject *copy = Py_None, *capsule;
    dl_holder *h;
    dl_tensor *t;
    int i, versioned;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOO:__dlpack__", kwlist,
                                     &stream, &max_version, &dev, &copy))
        return NULL;
    if (check_valid(b) < 0 || check_dl_device(b, dev) < 0 ||
        check_dl_stream(b, stream) < 0)
        return NULL;
    if (copy != Py_None && PyObject_IsTrue(copy) == 1) {
        PyErr_SetString(PyExc_BufferError,
                        "__dlpack__(copy=True): a Buffer only exports its "
                        "own memory");
        return NULL;
    }
    versioned = wants_versioned(max_version);
    if (versioned < 0)
        return NULL;
    h = PyMem_RawCalloc(1, sizeof *h);
    if (h == NULL)
        return PyErr_NoMemory();
    t = versioned ? &h->m.versioned.dl_tensor : &h->m.legacy.dl_tensor;
    if (dl_type_of(b->descr, &t->dtype) < 0) {
        PyMem_RawFree(h);
        PyErr_SetString(PyExc_BufferError,
                        "__dlpack__: this dtype has no DLPack type code");
        return NULL;
    }
    for (i = 0; i < b->ndim; i++)
        h->shape[i] = (int64_t)b->shape[i];
    t->data = b->data;
    t->device = dl_device_of(b);
    t->ndim = b->ndim;
    t->shape = h->shape;
    t->strides = NULL; /* row-major */
    Py_INCREF(self);
    h->owner = self;
    if (versioned) {
        h->m.versioned.version.major = 1;
        h->m.versioned.version.minor = 0;
        h->m.versioned.manager_ctx = h;
        h->m.versioned.deleter = dl_deleter_versioned;
        h->m.versioned.flags = b->readonly ? DL_FLAG_READ_ONLY : 0;
        capsule = PyCapsule_New(&h->m.versioned, "dltensor_versioned",
                                dl_capsule_destructor);
    } else {
        h->m.legacy.manager_ctx = h;
        h->m.legacy.deleter = dl_deleter;
        capsule =
            PyCapsule_New(&h->m.legacy, "dltensor", dl_capsule_destructor);
    }
    if (capsule == NULL)
        dl_holder_free(h);
    return capsule;
}

static PyObject *
buffer_dlpack_device(PyObject *self, PyObject *unused)
{
    dl_device d = dl_device_of((buffer_object *)self);

    (void)unused;
    return Py_BuildValue("(ii)", (int)d.device_type, (int)d.device_id);
}

static PyObject *
buffer_repr(PyObject *self)
{
    buffer_object *b = (buffer_object *)self;
    PyObject *shape = buffer_shape(self, NULL), *r;

    if (shape == NULL)
        return NULL;
    if (on_cuda(b))
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
                            hcb_device device, int readonly);

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
        b = buffer_new(st, &view, (hcb_device)device, !writable);
        if (b != NULL) {
            ((buffer_object *)b)->base = keep;
            keep = NULL;
        }
    }
    Py_XDECREF(keep);
    Py_XDECREF(seq);
    return b;
}

static PyGetSetDef buffer_getset[] = {
    {"shape", buffer_shape, NULL, "The shape, a tuple of ints.", NULL},
    {"dtype", buffer_dtype, NULL, "The numpy dtype.", NULL},
    {"__cuda_array_interface__", buffer_cuda_interface, NULL,
     "The CUDA Array Interface (version 3) of a GPU buffer; AttributeError "
     "for a CPU one.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef buffer_methods[] = {
    {"__array__", (PyCFunction)(void (*)(void))buffer_array,
     METH_VARARGS | METH_KEYWORDS, "A numpy view of the buffer (no copy)."},
    {"__dlpack__", (PyCFunction)(void (*)(void))buffer_dlpack,
     METH_VARARGS | METH_KEYWORDS,
     "A DLPack capsule viewing the buffer (DLPack 1.0 when max_version "
     "admits it: outputs writable, inputs read-only)."},
    {"__dlpack_device__", buffer_dlpack_device, METH_NOARGS,
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
    .basicsize = sizeof(buffer_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = buffer_slots,
};

PyType_Spec *
hcb_py_buffer_spec(void)
{
    return &buffer_spec;
}

static PyObject *
buffer_new(hcb_state *st, const hcb_array *a, hcb_device device, int readonly)
{
    PyObject *descr = hcb_py_descr(st, a->dtype);
    buffer_object *b;
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
    b = PyObject_New(buffer_object, st->buffer_type);
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
buffer_release(buffer_object *b)
{
    if (b->staging != NULL && !b->readonly)
        hcb_py_store(&b->xla, b->staging);
    b->data = NULL;
}

/* ---- the call --------------------------------------------------------------
 */

/* Wraps `n` arrays in Buffers, appended to `list`. */
static int
append_buffers(hcb_state *st, PyObject *list, const hcb_array *arrays, size_t n,
               hcb_device device, int readonly)
{
    size_t i;

    for (i = 0; i < n; i++) {
        PyObject *b = buffer_new(st, &arrays[i], device, readonly);

        if (b == NULL || PyList_Append(list, b) < 0) {
            Py_XDECREF(b);
            return -1;
        }
        Py_DECREF(b);
    }
    return 0;
}

static PyObject *
call_callback(hcb_py_buffer_target *t, hcb_device device, PyObject *buffers,
              size_t nargs)
{
    hcb_state *st = t->base.state;
    PyObject *ins = NULL, *outs = NULL, *in_value = NULL, *out_value = NULL;
    PyObject *dev = NULL, *ctx = NULL, *call_args = NULL, *result = NULL;
    Py_ssize_t n = PyList_GET_SIZE(buffers), i, npos;

    ins = PyList_GetSlice(buffers, 0, (Py_ssize_t)nargs);
    outs = PyList_GetSlice(buffers, (Py_ssize_t)nargs, n);
    if (ins == NULL || outs == NULL)
        goto done;
    /* The operands are the leaves of (args, kwargs). */
    in_value = PyObject_CallMethodOneArg(t->in_treedef, st->str_unflatten, ins);
    out_value =
        PyObject_CallMethodOneArg(t->out_treedef, st->str_unflatten, outs);
    if (in_value == NULL || out_value == NULL)
        goto done;
    if (!PyTuple_Check(in_value) || PyTuple_GET_SIZE(in_value) != 2 ||
        !PyTuple_Check(PyTuple_GET_ITEM(in_value, 0)) ||
        !PyDict_Check(PyTuple_GET_ITEM(in_value, 1))) {
        PyErr_SetString(PyExc_TypeError,
                        "buffer_callback: the operands do not unflatten to "
                        "(args, kwargs)");
        goto done;
    }
    dev = hcb_py_device_of(st, device);
    ctx = dev != NULL ? PyObject_CallOneArg(t->context_type, dev) : NULL;
    if (ctx == NULL)
        goto done;
    npos = PyTuple_GET_SIZE(PyTuple_GET_ITEM(in_value, 0));
    call_args = PyTuple_New(npos + 2);
    if (call_args == NULL)
        goto done;
    Py_INCREF(ctx);
    PyTuple_SET_ITEM(call_args, 0, ctx);
    Py_INCREF(out_value);
    PyTuple_SET_ITEM(call_args, 1, out_value);
    for (i = 0; i < npos; i++) {
        PyObject *a = PyTuple_GET_ITEM(PyTuple_GET_ITEM(in_value, 0), i);

        Py_INCREF(a);
        PyTuple_SET_ITEM(call_args, i + 2, a);
    }
    result =
        PyObject_Call(t->callback, call_args, PyTuple_GET_ITEM(in_value, 1));
done:
    Py_XDECREF(ins);
    Py_XDECREF(outs);
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
    static const char *const names[] = {"callback", "in_treedef", "out_treedef",
                                        "context_type"};
    PyObject *f[4];

    if (hcb_py_fields(site, "BufferSite", names, f, 4) < 0)
        return -1;
    if (!PyCallable_Check(f[0]) || !PyCallable_Check(f[3])) {
        PyErr_SetString(PyExc_TypeError, "the BufferSite's callback and "
                                         "context_type must be callable");
        return -1;
    }
    t->callback = f[0];
    t->in_treedef = f[1];
    t->out_treedef = f[2];
    t->context_type = f[3];
    return 0;
}

int
hcb_py_buffer_call(void *user, hcb_device device, const hcb_array *args,
                   size_t nargs, const hcb_array *results, size_t nresults,
                   hcb_error *err)
{
    hcb_py_buffer_target *t = user;
    PyGILState_STATE gil;
    PyObject *buffers, *result = NULL;
    char what[128];
    int rc = HCB_OK;
    Py_ssize_t i;

    snprintf(what, sizeof what, "host_callback.buffer_callback: callback '%s'",
             t->base.name);
    if (hcb_py_gil_ensure(t->base.state, &gil) < 0)
        return hcb_error_set(err, HCB_ESTATE,
                             "%s not called: the Python interpreter is "
                             "shutting down",
                             what);
    rc = hcb_py_target_enter(&t->base,
                             "host_callback.buffer_callback: callback", err);
    if (rc != HCB_OK) {
        hcb_py_gil_release(gil);
        return rc;
    }
    buffers = PyList_New(0);
    if (buffers != NULL &&
        append_buffers(t->base.state, buffers, args, nargs, device, 1) == 0 &&
        append_buffers(t->base.state, buffers, results, nresults, device, 0) ==
            0) {
        hcb_py_enter_call();
        result = call_callback(t, device, buffers, nargs);
        hcb_py_leave_call();
    }
    /* XLA's memory is valid only until we return. */
    for (i = 0; buffers != NULL && i < PyList_GET_SIZE(buffers); i++)
        buffer_release((buffer_object *)PyList_GET_ITEM(buffers, i));
    Py_XDECREF(buffers);
    if (result == NULL) {
        rc = hcb_py_raised(&t->base, what, err);
    } else if (result != Py_None) {
        PyObject *exc;

        /* JAX's words first: its users search for them. */
        hcb_error_set(err, HCB_EINVAL,
                      "buffer_callback callback must not return any values. "
                      "(%s returned a value)",
                      what);
        exc = PyObject_CallFunction(PyExc_ValueError, "s", err->message);
        Py_XDECREF(hcb_py_hand_to_hook(&t->base, exc, 0));
        rc = HCB_EINVAL;
    }
    Py_XDECREF(result);
    hcb_py_target_leave(&t->base);
    hcb_py_gil_release(gil);
    return rc;
}
