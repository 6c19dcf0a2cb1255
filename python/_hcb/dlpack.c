/*
 * dlpack.c - Buffer.__dlpack__ and __dlpack_device__: a Buffer of
 * buffer_callback exported to DLPack consumers (numpy.from_dlpack,
 * cupy.from_dlpack, torch.from_dlpack, ...), on the CPU (kDLCPU) and on a
 * CUDA device (kDLCUDA), as JAX's own buffer_callback Buffer is.
 *
 * The capsule views the Buffer's own memory (no copy; a copy or another
 * device is refused) and holds a reference to the Buffer; like the Buffer,
 * what it views is valid only while the callback runs.  DLPack 1.0
 * ("dltensor_versioned", with the read-only flag on inputs) when the
 * consumer's max_version admits it, else the legacy "dltensor".  The
 * `stream` argument of a GPU Buffer is buffer_cuda.c's: the consumer's
 * stream is ordered after XLA's.
 */
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL hcb_ARRAY_API
#define NPY_NO_DEPRECATED_API  NPY_2_0_API_VERSION
#define NPY_TARGET_VERSION     NPY_2_0_API_VERSION
#include "hcbpy.h"

#include <limits.h>
#include <numpy/arrayobject.h>
#include <string.h>

#include "buffer.h"

/* ---- the ABI (DLPack's stable C ABI, spelled here) ---------------------- */

typedef struct {
    int32_t device_type; /* kDLCPU = 1, kDLCUDA = 2 */
    int32_t device_id;
} dl_device;

enum { DL_CPU = 1, DL_CUDA = 2 };

/* The DLPack device of a Buffer: (kDLCUDA, ordinal), or (kDLCPU, ordinal)
 * as JAX's Buffer gives it (the id of a CPU device is JAX's, all of them
 * host memory). */
static dl_device
dl_device_of(const hcb_py_buffer *b)
{
    dl_device d = {DL_CPU, HCB_DEVICE_ORDINAL(b->device)};

    if (hcb_py_buffer_on_cuda(b))
        d.device_type = DL_CUDA;
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

/* `o` (an int, or what has __index__) as a C int: 0, or -1 with an
 * exception set. */
static int
as_int(PyObject *o, int *out)
{
    long v = PyLong_AsLong(o);

    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < INT_MIN || v > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "out of the range of a C int");
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* Whether `dl_device` (None or a (type, id) tuple) is the Buffer's own
 * device (for a CPU Buffer, any kDLCPU id: it is all host memory): 0, or
 * -1 with BufferError (a Buffer cannot copy to another). */
static int
check_dl_device(const hcb_py_buffer *b, PyObject *want)
{
    dl_device d = dl_device_of(b);
    int type, id;

    if (want == Py_None)
        return 0;
    /* By hand, not PyArg_ParseTuple: a consumer passes it at every call. */
    if (!PyTuple_Check(want) || PyTuple_GET_SIZE(want) != 2 ||
        as_int(PyTuple_GET_ITEM(want, 0), &type) < 0 ||
        as_int(PyTuple_GET_ITEM(want, 1), &id) < 0) {
        PyErr_Format(PyExc_TypeError,
                     "__dlpack__: dl_device must be None or a (device type, "
                     "device id) tuple, got %R",
                     want);
        return -1;
    }
    if (type == d.device_type && (id == d.device_id || type == DL_CPU))
        return 0;
    PyErr_Format(PyExc_BufferError,
                 "__dlpack__: dl_device=(%d, %d) asks for a copy to another "
                 "device; this Buffer is on (%d, %d) and only exports its "
                 "own memory",
                 type, id, (int)d.device_type, (int)d.device_id);
    return -1;
}

/* The arguments of __dlpack__, in this order, by position or by name. */
static const char *const dlpack_names[] = {"stream", "max_version", "dl_device",
                                           "copy"};
#define DLPACK_NARGS 4

/* Fills `out` (left as it is for an argument not given) from a vectorcall's
 * arguments: 0, or -1 with TypeError.  By hand, as PyArg_Parse* would cost
 * a consumer (from_dlpack passes keywords at every call) more than the
 * export itself. */
static int
dlpack_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
            PyObject **out)
{
    Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0, i;
    int j;

    if (nargs > DLPACK_NARGS) {
        PyErr_Format(PyExc_TypeError,
                     "__dlpack__() takes at most %d arguments (%zd given)",
                     DLPACK_NARGS, nargs + nkw);
        return -1;
    }
    for (i = 0; i < nargs; i++)
        out[i] = args[i];
    for (i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);

        for (j = 0; j < DLPACK_NARGS; j++)
            if (PyUnicode_CompareWithASCIIString(name, dlpack_names[j]) == 0)
                break;
        if (j == DLPACK_NARGS) {
            PyErr_Format(PyExc_TypeError,
                         "'%U' is an invalid keyword argument for "
                         "__dlpack__()",
                         name);
            return -1;
        }
        if (j < nargs) {
            PyErr_Format(PyExc_TypeError,
                         "argument for __dlpack__() given by name ('%s') "
                         "and position (%d)",
                         dlpack_names[j], j + 1);
            return -1;
        }
        out[j] = args[nargs + i];
    }
    return 0;
}

/* __dlpack__(stream=None, max_version=None, dl_device=None, copy=None):
 * a "dltensor_versioned" capsule (DLPack 1.0, inputs flagged read-only) when
 * max_version admits it, else a legacy "dltensor" one, of the Buffer's own
 * memory on its own device (kDLCPU or kDLCUDA).  The standard makes the
 * arguments keyword-only; JAX's Buffer also takes them by position, and so
 * does this one.  `stream` is checked, and acted on, last: only a capsule
 * that is returned orders the consumer's stream. */
PyObject *
hcb_py_buffer_dlpack(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                     PyObject *kwnames)
{
    hcb_py_buffer *b = (hcb_py_buffer *)self;
    PyObject *a[DLPACK_NARGS] = {Py_None, Py_None, Py_None, Py_None};
    PyObject *stream, *max_version, *dev, *copy, *capsule;
    dl_holder *h;
    dl_tensor *t;
    int i, versioned, copying = 0;

    if (dlpack_args(args, nargs, kwnames, a) < 0)
        return NULL;
    stream = a[0];
    max_version = a[1];
    dev = a[2];
    copy = a[3];
    if (hcb_py_buffer_check_valid(b) < 0 || check_dl_device(b, dev) < 0)
        return NULL;
    if (copy != Py_None && (copying = PyObject_IsTrue(copy)) < 0)
        return NULL;
    if (copying) {
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
    if (hcb_py_buffer_dl_stream(b, stream) < 0) {
        dl_holder_free(h);
        return NULL;
    }
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

PyObject *
hcb_py_buffer_dlpack_device(PyObject *self, PyObject *unused)
{
    dl_device d = dl_device_of((hcb_py_buffer *)self);

    (void)unused;
    return Py_BuildValue("(ii)", (int)d.device_type, (int)d.device_id);
}
