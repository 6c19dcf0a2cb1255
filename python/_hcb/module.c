/*
 * module.c - host_callback._hcb, the CPython face of libhcb.
 *
 * The module: its definition, state and initialisation (configure, the
 * constants), and its method table, which lists the functions of the
 * other files by concern; two concerns keep tables of their own, added at
 * initialisation: the runtime's controls (control.c: barrier, flush, stop,
 * stats, errors) and libhcb's FFI handlers and CUDA functions
 * (handlers.c).  Targets are registered and released in targets.c, taps
 * delivered in tap.c, calls run in call.c, Python's own entry into the
 * runtime is entry.c.  Multi-phase initialisation; the state lives in
 * module state.
 */
#define PY_ARRAY_UNIQUE_SYMBOL hcb_ARRAY_API
#define NPY_NO_DEPRECATED_API  NPY_2_0_API_VERSION
#define NPY_TARGET_VERSION     NPY_2_0_API_VERSION
#include "hcbpy.h"

#include <numpy/arrayobject.h>

#include "hcb/ffi.h"

/* configure(dtypes, device_lookup, on_error, tree_flatten, warn) */
static PyObject *
hcb_configure(PyObject *module, PyObject *args)
{
    hcb_state *st = hcb_py_state(module);
    PyObject *dtypes, *lookup, *on_error, *flatten, *warn;

    if (!PyArg_ParseTuple(args, "O!OOOO:configure", &PyTuple_Type, &dtypes,
                          &lookup, &on_error, &flatten, &warn))
        return NULL;
    if (PyTuple_GET_SIZE(dtypes) != HCB_PY_NDTYPES) {
        PyErr_Format(PyExc_ValueError, "dtypes must have %d entries, got %zd",
                     HCB_PY_NDTYPES, PyTuple_GET_SIZE(dtypes));
        return NULL;
    }
    if (!PyCallable_Check(lookup) || !PyCallable_Check(on_error) ||
        !PyCallable_Check(flatten) || !PyCallable_Check(warn)) {
        PyErr_SetString(PyExc_TypeError,
                        "device_lookup, on_error, tree_flatten and warn must "
                        "be callable");
        return NULL;
    }
    Py_INCREF(dtypes);
    Py_XSETREF(st->dtypes, dtypes);
    Py_INCREF(lookup);
    Py_XSETREF(st->device_lookup, lookup);
    Py_INCREF(on_error);
    Py_XSETREF(st->on_error, on_error);
    Py_INCREF(flatten);
    Py_XSETREF(st->tree_flatten, flatten);
    Py_INCREF(warn);
    Py_XSETREF(st->warn, warn);
    hcb_runtime_set_log(st->rt, hcb_py_log, st);
    hcb_py_interrupt_install(st);
    Py_RETURN_NONE;
}

static PyObject *
hcb_format_value_fn(PyObject *module, PyObject *args)
{
    return hcb_py_format_value(hcb_py_state(module), args);
}

static PyObject *
hcb_print_write_fn(PyObject *module, PyObject *args)
{
    return hcb_py_print_write(hcb_py_state(module), args);
}

static PyObject *
hcb_submit_tap(PyObject *module, PyObject *args)
{
    return hcb_py_submit_tap(hcb_py_state(module), args);
}

static PyObject *
hcb_run_call(PyObject *module, PyObject *args)
{
    return hcb_py_run_call(hcb_py_state(module), args);
}

static PyObject *
hcb_hold_type(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return hcb_py_hold_type();
}

static PyObject *
hcb_holds(PyObject *module, PyObject *arg)
{
    (void)module;
    return hcb_py_holds(arg);
}

static PyObject *
hcb_wait_unused(PyObject *module, PyObject *arg)
{
    (void)module;
    return hcb_py_wait_unused(arg);
}

static PyObject *
hcb_notify_unused(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return hcb_py_notify_unused();
}

/* dtype_name(code) -> numpy's name of XLA element type `code`, or None
 * for a code that is no array element type (the token, unknown codes) */
static PyObject *
hcb_dtype_name_of(PyObject *module, PyObject *arg)
{
    long code = PyLong_AsLong(arg);

    (void)module;
    if (code == -1 && PyErr_Occurred())
        return NULL;
    if (code <= 0 || code > INT32_MAX || hcb_dtype_bits((hcb_dtype)code) == 0)
        Py_RETURN_NONE;
    return PyUnicode_FromString(hcb_dtype_name((hcb_dtype)code));
}

static PyObject *
hcb_in_tap(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyBool_FromLong(hcb_py_in_tap());
}

static PyObject *
hcb_in_call(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyBool_FromLong(hcb_py_in_call());
}

static PyMethodDef hcb_methods[] = {
    {"in_tap", hcb_in_tap, METH_NOARGS,
     "in_tap() -> whether this thread is running a tap function."},
    {"in_call", hcb_in_call, METH_NOARGS,
     "in_call() -> whether this thread is running a call or buffer_callback "
     "function."},
    {"configure", hcb_configure, METH_VARARGS,
     "configure(dtypes, device_lookup, on_error, tree_flatten, warn): set "
     "the Python hooks."},
    {"register_tap", (PyCFunction)(void (*)(void))hcb_py_register_tap,
     METH_VARARGS | METH_KEYWORDS,
     "register_tap(*, site, name) -> id: register a Python tap site (a "
     "TapSite, its fields read by name)."},
    {"register_call", (PyCFunction)(void (*)(void))hcb_py_register_call,
     METH_VARARGS | METH_KEYWORDS,
     "register_call(*, site, name) -> id: register a Python call site (a "
     "CallSite, its fields read by name)."},
    {"register_buffer_callback",
     (PyCFunction)(void (*)(void))hcb_py_register_buffer_callback,
     METH_VARARGS | METH_KEYWORDS,
     "register_buffer_callback(*, site, name) -> id: a Python buffer "
     "callback (a BufferSite, its fields read by name)."},
    {"check_results", (PyCFunction)(void (*)(void))hcb_py_check_results,
     METH_VARARGS | METH_KEYWORDS,
     "check_results(*, site, name, result) -> list of arrays: check a call "
     "function's result as compiled calls do (inline mode)."},
    {"set_byte_order_refused", hcb_py_set_byte_order_refused, METH_O,
     "set_byte_order_refused(flag): whether the drop-ins refuse a result in "
     "the other byte order in JAX 0.10's words (the default) or report its "
     "dtype, as JAX 0.9."},
    {"register_print", (PyCFunction)(void (*)(void))hcb_py_register_print,
     METH_VARARGS | METH_KEYWORDS,
     "register_print(*, site, name, nodes, kv_before, kv_after, with_device, "
     "devices, options, stream, dtypes, log) -> id, or None when the C "
     "printer does not print one of dtypes."},
    {"format_value", hcb_format_value_fn, METH_VARARGS,
     "format_value(nodes, arrays, options) -> str: the C printer."},
    {"print_write", hcb_print_write_fn, METH_VARARGS,
     "print_write(stream, texts): write under id_print's lock."},
    {"release", hcb_py_release, METH_O,
     "release(id) -> bool: drop the Python references of target id."},
    {"register_native_tap", hcb_py_register_native_tap, METH_VARARGS,
     "register_native_tap(fn, user, name) -> id: a C hcb_tap_fn."},
    {"register_native_call", hcb_py_register_native_call, METH_VARARGS,
     "register_native_call(fn, user, name) -> id: a C hcb_call_fn."},
    {"submit_tap", hcb_submit_tap, METH_VARARGS,
     "submit_tap(callback_id, device_key, arrays, deliver=0): queue a tap "
     "record, or deliver it now (1: a failure raises; 2: it is recorded)."},
    {"run_call", hcb_run_call, METH_VARARGS,
     "run_call(callback_id, device_key, args, outs): run a call target."},
    {"hold_type", hcb_hold_type, METH_NOARGS,
     "hold_type() -> the FFI type of a hold, for jax.ffi.register_ffi_type."},
    {"holds", hcb_holds, METH_O,
     "holds(id) -> live executables embedding Python target id (-1: none)."},
    {"wait_unused", hcb_wait_unused, METH_O,
     "wait_unused(timeout_s): wait until a hold count drops to zero."},
    {"notify_unused", hcb_notify_unused, METH_NOARGS,
     "notify_unused(): wake wait_unused (a site was retired)."},
    {"dtype_name", hcb_dtype_name_of, METH_O,
     "dtype_name(code) -> numpy's name of an XLA element type, or None."},
    {NULL, NULL, 0, NULL},
};

/* The C values the Python side needs, under these names in _hcb: the one
 * place they are written down (include/hcb/hcb.h, XLA's FFI). */
static const struct {
    const char *name;
    long value;
} int_constants[] = {
    {"ALL_DEVICES", (long)HCB_ALL_DEVICES},
    {"NAME_MAX", HCB_NAME_MAX},
    {"NDTYPES", HCB_PY_NDTYPES},
    {"PLATFORM_CPU", HCB_PLATFORM_CPU},
    {"PLATFORM_CUDA", HCB_PLATFORM_CUDA},
    {"PRINT_ARRAY", HCB_PRINT_ARRAY},
    {"PRINT_TEXT", HCB_PRINT_TEXT},
    {"PRINT_TUPLE", HCB_PRINT_TUPLE},
    {"PRINT_LIST", HCB_PRINT_LIST},
    {"PRINT_DICT", HCB_PRINT_DICT},
    {"PRINT_CONCAT", HCB_PRINT_CONCAT},
    {"PRINT_STR", HCB_PRINT_STR},
    {"PRINT_FIELD", HCB_PRINT_FIELD},
    {"FLOATMODE_MAXPREC", HCB_FLOATMODE_MAXPREC},
    {"FLOATMODE_FIXED", HCB_FLOATMODE_FIXED},
    {"FLOATMODE_UNIQUE", HCB_FLOATMODE_UNIQUE},
    {"FLOATMODE_MAXPREC_EQUAL", HCB_FLOATMODE_MAXPREC_EQUAL},
    {"PRINT_MAX_PRECISION", HCB_PRINT_MAX_PRECISION},
    {"STAGE_INSTANTIATE", XLA_FFI_ExecutionStage_INSTANTIATE},
    {"STAGE_PREPARE", XLA_FFI_ExecutionStage_PREPARE},
    {"STAGE_INITIALIZE", XLA_FFI_ExecutionStage_INITIALIZE},
    {"STAGE_EXECUTE", XLA_FFI_ExecutionStage_EXECUTE},
};

static int
hcb_exec(PyObject *module)
{
    hcb_state *st = hcb_py_state(module);
    size_t i;

    if (PyArray_ImportNumPyAPI() < 0)
        return -1;
    hcb_py_lifetime_init();
    st->rt = hcb_runtime_default();
    if (st->rt == NULL) {
        PyErr_SetString(PyExc_MemoryError,
                        "cannot create the host-callback runtime");
        return -1;
    }
    atomic_init(&st->shutting_down, 0);
    hcb_py_print_install_fork_handler();
    st->owner_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        module, hcb_py_owner_spec(), NULL);
    if (st->owner_type == NULL)
        return -1;
    st->buffer_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        module, hcb_py_buffer_spec(), NULL);
    if (st->buffer_type == NULL ||
        PyModule_AddObjectRef(module, "Buffer", (PyObject *)st->buffer_type) <
            0)
        return -1;
    st->device_cache = PyDict_New();
    st->targets = PyDict_New();
    if (st->targets == NULL)
        return -1;
    st->str_unflatten = PyUnicode_InternFromString("unflatten");
    st->str_write = PyUnicode_InternFromString("write");
    st->str_device = PyUnicode_InternFromString("device");
    if (st->device_cache == NULL || st->str_unflatten == NULL ||
        st->str_write == NULL || st->str_device == NULL)
        return -1;
    st->kw_device = PyTuple_Pack(1, st->str_device);
    if (st->kw_device == NULL)
        return -1;
    if (PyModule_AddStringConstant(module, "version", hcb_version_string()) < 0)
        return -1;
    for (i = 0; i < sizeof int_constants / sizeof *int_constants; i++)
        if (PyModule_AddIntConstant(module, int_constants[i].name,
                                    int_constants[i].value) < 0)
            return -1;
    if (PyModule_AddFunctions(module, hcb_py_control_methods) < 0 ||
        PyModule_AddFunctions(module, hcb_py_handler_methods) < 0)
        return -1;
    return 0;
}

static int
hcb_traverse(PyObject *module, visitproc visit, void *arg)
{
    hcb_state *st = hcb_py_state(module);

    Py_VISIT(st->owner_type);
    Py_VISIT(st->buffer_type);
    Py_VISIT(st->dtypes);
    Py_VISIT(st->device_lookup);
    Py_VISIT(st->on_error);
    Py_VISIT(st->tree_flatten);
    Py_VISIT(st->warn);
    Py_VISIT(st->device_cache);
    Py_VISIT(st->targets);
    return 0;
}

static int
hcb_clear(PyObject *module)
{
    hcb_state *st = hcb_py_state(module);

    if (st->rt != NULL) {
        hcb_runtime_set_log(st->rt, NULL, NULL);
        hcb_py_interrupt_uninstall(st);
    }
    Py_CLEAR(st->owner_type);
    Py_CLEAR(st->buffer_type);
    Py_CLEAR(st->dtypes);
    Py_CLEAR(st->device_lookup);
    Py_CLEAR(st->on_error);
    Py_CLEAR(st->tree_flatten);
    Py_CLEAR(st->warn);
    Py_CLEAR(st->device_cache);
    Py_CLEAR(st->targets);
    Py_CLEAR(st->str_unflatten);
    Py_CLEAR(st->str_write);
    Py_CLEAR(st->str_device);
    Py_CLEAR(st->kw_device);
    return 0;
}

static void
hcb_free(void *module)
{
    hcb_clear((PyObject *)module);
}

static PyModuleDef_Slot hcb_slots[] = {
    {Py_mod_exec, (void *)hcb_exec},
    {0, NULL},
};

static struct PyModuleDef hcb_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "host_callback._hcb",
    .m_doc = "The C runtime of host_callback (libhcb) seen from Python.",
    .m_size = sizeof(hcb_state),
    .m_methods = hcb_methods,
    .m_slots = hcb_slots,
    .m_traverse = hcb_traverse,
    .m_clear = hcb_clear,
    .m_free = hcb_free,
};

PyMODINIT_FUNC PyInit__hcb(void);

PyMODINIT_FUNC
PyInit__hcb(void)
{
    return PyModuleDef_Init(&hcb_module);
}
