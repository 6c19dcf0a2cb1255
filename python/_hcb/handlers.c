/*
 * handlers.c - libhcb's XLA FFI handlers as capsules, for
 * jax.ffi.register_ffi_target (ffi_handlers), and libhcb's CUDA functions
 * (cuda_load, cuda_set_pinned_bytes, call_stream).  Module functions of
 * host_callback._hcb, added by module.c (hcb_py_handler_methods).
 */
#include "hcbpy.h"

#include "hcb/ffi.h"

/* A handler with an INSTANTIATE stage too (lifetime.c): {"instantiate":
 * capsule, "execute": capsule}. */
static PyObject *
with_instantiate(PyObject *execute)
{
    PyObject *d = PyDict_New(), *inst;

    if (d == NULL)
        return NULL;
    inst = PyCapsule_New((void *)hcb_py_ffi_instantiate, NULL, NULL);
    if (inst == NULL || PyDict_SetItemString(d, "instantiate", inst) < 0 ||
        PyDict_SetItemString(d, "execute", execute) < 0)
        Py_CLEAR(d);
    Py_XDECREF(inst);
    return d;
}

/* The handlers of each platform XLA runs them on: the same names, and the
 * same operands and attributes, on each. */
typedef struct {
    const char *name;
    XLA_FFI_Handler *fn;
    int holds; /* has a callback_id: count the executables */
} handler_entry;

static const handler_entry cpu_handlers[] = {
    {"hcb_tap", hcb_ffi_tap, 1},
    {"hcb_call", hcb_ffi_call, 1},
    {"hcb_buffer_call", hcb_ffi_buffer_call, 1},
    {"hcb_device_ordinal", hcb_ffi_ordinal_handler, 0},
    {"hcb_sharded_check", hcb_ffi_sharded_check, 1},
    {NULL, NULL, 0}};

/* The CUDA handlers count no holds: the hold's state type would have to be
 * registered with the CUDA plugin's own FFI type registry (through PJRT),
 * which is not known to take it.  A site of a GPU program is kept alive by
 * the lowering's keepalive instead (host_callback/_registry.py). */
static const handler_entry cuda_handlers[] = {
    {"hcb_tap", hcb_ffi_tap_cuda, 0},
    {"hcb_call", hcb_ffi_call_cuda, 0},
    {"hcb_buffer_call", hcb_ffi_buffer_call_cuda, 0},
    {"hcb_device_ordinal", hcb_ffi_ordinal_handler_cuda, 0},
    {"hcb_sharded_check", hcb_ffi_sharded_check_cuda, 0},
    {NULL, NULL, 0}};

static PyObject *
hcb_ffi_handlers(PyObject *module, PyObject *args)
{
    const char *platform = "cpu";
    const handler_entry *h;
    PyObject *d, *cap;

    (void)module;
    if (!PyArg_ParseTuple(args, "|s:ffi_handlers", &platform))
        return NULL;
    if (strcmp(platform, "cpu") == 0) {
        h = cpu_handlers;
    } else if (strcmp(platform, "cuda") == 0) {
        h = cuda_handlers;
    } else {
        PyErr_Format(PyExc_ValueError,
                     "ffi_handlers: expected platform 'cpu' or 'cuda', got "
                     "'%s'",
                     platform);
        return NULL;
    }
    if ((d = PyDict_New()) == NULL)
        return NULL;
    for (; h->name != NULL; h++) {
        cap = PyCapsule_New((void *)h->fn, NULL, NULL);
        if (cap != NULL && h->holds)
            Py_SETREF(cap, with_instantiate(cap));
        if (cap == NULL || PyDict_SetItemString(d, h->name, cap) < 0) {
            Py_XDECREF(cap);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(cap);
    }
    return d;
}

static PyObject *
hcb_cuda_load_fn(PyObject *module, PyObject *args)
{
    const char *path = NULL;
    hcb_error err;

    (void)module;
    if (!PyArg_ParseTuple(args, "z:cuda_load", &path))
        return NULL;
    if (hcb_cuda_load(path, &err) != HCB_OK)
        return hcb_py_raise(&err);
    Py_RETURN_NONE;
}

static PyObject *
hcb_cuda_set_pinned_bytes_fn(PyObject *module, PyObject *arg)
{
    size_t bytes = PyLong_AsSize_t(arg);
    hcb_error err;

    (void)module;
    if (bytes == (size_t)-1 && PyErr_Occurred())
        return NULL;
    if (hcb_cuda_set_pinned_bytes(bytes, &err) != HCB_OK)
        return hcb_py_raise(&err);
    Py_RETURN_NONE;
}

static PyObject *
hcb_call_stream_fn(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromVoidPtr(hcb_call_stream());
}

PyMethodDef hcb_py_handler_methods[] = {
    {"ffi_handlers", hcb_ffi_handlers, METH_VARARGS,
     "ffi_handlers(platform='cpu') -> {name: capsule or {stage: capsule}} "
     "of platform 'cpu' or 'cuda', for jax.ffi.register_ffi_target."},
    {"cuda_load", hcb_cuda_load_fn, METH_VARARGS,
     "cuda_load(path): load the CUDA runtime the CUDA handlers use (None: "
     "the one in the process, else libcudart by name)."},
    {"cuda_set_pinned_bytes", hcb_cuda_set_pinned_bytes_fn, METH_O,
     "cuda_set_pinned_bytes(n): the size of the pinned pool of GPU "
     "callbacks."},
    {"call_stream", hcb_call_stream_fn, METH_NOARGS,
     "call_stream() -> int: in a call target the CUDA handler "
     "hcb_buffer_call runs, XLA's cudaStream_t; 0 elsewhere."},
    {NULL, NULL, 0, NULL},
};
