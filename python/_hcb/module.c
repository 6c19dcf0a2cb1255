/*
 * module.c - host_callback._hcb, the CPython face of libhcb.
 *
 * The module: its definition, method table, state and initialisation; it
 * exposes the FFI handlers as capsules for jax.ffi.register_ffi_target and
 * wraps the runtime's barrier, stop, stats and errors.  Targets are
 * registered and released in targets.c, taps delivered in tap.c, calls run
 * in call.c, Python's own entry into the runtime is entry.c.  Every call that
 * may wait releases the GIL. Multi-phase initialisation; the state lives in
 * module state.
 */
#define PY_ARRAY_UNIQUE_SYMBOL hcb_ARRAY_API
#define NPY_NO_DEPRECATED_API  NPY_2_0_API_VERSION
#define NPY_TARGET_VERSION     NPY_2_0_API_VERSION
#include "hcbpy.h"

#include <numpy/arrayobject.h>

#include "hcb/ffi.h"

static hcb_state *
state_of(PyObject *module)
{
    return (hcb_state *)PyModule_GetState(module);
}

/* configure(dtypes, device_lookup, on_error, tree_flatten, warn) */
static PyObject *
hcb_configure(PyObject *module, PyObject *args)
{
    hcb_state *st = state_of(module);
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
    return hcb_py_format_value(state_of(module), args);
}

static PyObject *
hcb_print_write_fn(PyObject *module, PyObject *args)
{
    return hcb_py_print_write(state_of(module), args);
}

static PyObject *
hcb_submit_tap(PyObject *module, PyObject *args)
{
    return hcb_py_submit_tap(state_of(module), args);
}

static PyObject *
hcb_run_call(PyObject *module, PyObject *args)
{
    return hcb_py_run_call(state_of(module), args);
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
    {"hcb_flush", hcb_ffi_flush, 0},
    {"hcb_sharded_check", hcb_ffi_sharded_check, 1},
    {NULL, NULL, 0}};

/* The CUDA handlers count no holds: the hold's state type would have to be
 * registered with the CUDA plugin's own FFI type registry (through PJRT),
 * which is not known to take it.  A site of a GPU program is kept alive by
 * the lowering's keepalive instead (host_callback/_runtime.py). */
static const handler_entry cuda_handlers[] = {
    {"hcb_tap", hcb_ffi_tap_cuda, 0},
    {"hcb_call", hcb_ffi_call_cuda, 0},
    {"hcb_buffer_call", hcb_ffi_buffer_call_cuda, 0},
    {"hcb_device_ordinal", hcb_ffi_ordinal_handler_cuda, 0},
    {"hcb_flush", hcb_ffi_flush_cuda, 0},
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

static int
parse_device(PyObject *obj, hcb_device *out)
{
    long long v;

    if (obj == NULL || obj == Py_None) {
        *out = HCB_ALL_DEVICES;
        return 0;
    }
    v = PyLong_AsLongLong(obj);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = (hcb_device)v;
    return 0;
}

/* How often a barrier that waits wakes up to run Python's signal handlers
 * (Ctrl-C raises KeyboardInterrupt within this much of the signal). */
#define BARRIER_POLL_NS 50000000u

/* The barrier's check (hcb_check_fn): with the GIL taken back for a
 * moment, runs the signal handlers; nonzero (an exception set) stops the
 * wait.  Unlike the devices' waits (interrupt.c), barrier_wait runs in a
 * Python thread, which can raise whatever the handler raised. */
static int
barrier_check_signals(void *user, hcb_device device, uint64_t *wait_state,
                      hcb_error *err)
{
    PyThreadState **save = user;
    int rc;

    (void)device;
    (void)wait_state;
    (void)err;

    PyEval_RestoreThread(*save);
    rc = PyErr_CheckSignals();
    *save = PyEval_SaveThread();
    return rc < 0;
}

/* barrier(device_key=None): waits, without the GIL, for the records
 * submitted so far to be consumed; a signal handler that raises (Ctrl-C:
 * KeyboardInterrupt) ends the wait with its exception. */
static PyObject *
hcb_barrier(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    hcb_state *st = state_of(module);
    PyThreadState *save;
    hcb_device dev;
    hcb_error err;
    int rc;

    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "barrier takes at most 1 argument");
        return NULL;
    }
    if (parse_device(nargs > 0 ? args[0] : NULL, &dev) < 0)
        return NULL;
    save = PyEval_SaveThread();
    rc = hcb_runtime_barrier_poll(st->rt, dev, BARRIER_POLL_NS,
                                  barrier_check_signals, &save, &err);
    PyEval_RestoreThread(save);
    if (rc != HCB_OK)
        return PyErr_Occurred() ? NULL : hcb_py_raise(&err);
    Py_RETURN_NONE;
}

/* flush(device_key): waits, without the GIL, until the records the device
 * submitted so far are delivered, as the end of a computation of that
 * device does (hcb_runtime_flush): from JAX's Python callback, in a
 * computation of that device. */
static PyObject *
hcb_flush(PyObject *module, PyObject *arg)
{
    hcb_state *st = state_of(module);
    hcb_device dev;
    hcb_error err;
    int rc;

    if (parse_device(arg, &dev) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS rc = hcb_runtime_flush(st->rt, dev, &err);
    Py_END_ALLOW_THREADS if (rc != HCB_OK) return hcb_py_raise(&err);
    Py_RETURN_NONE;
}

static PyObject *
hcb_stop(PyObject *module, PyObject *unused)
{
    hcb_state *st = state_of(module);
    hcb_error err;
    int rc;

    (void)unused;
    Py_BEGIN_ALLOW_THREADS rc = hcb_runtime_stop(st->rt, &err);
    Py_END_ALLOW_THREADS if (rc != HCB_OK) return hcb_py_raise(&err);
    Py_RETURN_NONE;
}

static PyObject *
hcb_shutdown(PyObject *module, PyObject *unused)
{
    (void)unused;
    atomic_store(&state_of(module)->shutting_down, 1);
    return hcb_stop(module, NULL);
}

static PyObject *
hcb_abandon(PyObject *module, PyObject *unused)
{
    (void)unused;
    atomic_store(&state_of(module)->shutting_down, 1);
    Py_RETURN_NONE;
}

static PyObject *
hcb_set_max_queue_bytes(PyObject *module, PyObject *arg)
{
    unsigned long long n = PyLong_AsUnsignedLongLong(arg);
    hcb_error err;

    if (n == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (hcb_runtime_set_max_queue_bytes(state_of(module)->rt, (size_t)n,
                                        &err) != HCB_OK)
        return hcb_py_raise(&err);
    Py_RETURN_NONE;
}

static PyObject *
hcb_set_only_cpu_device(PyObject *module, PyObject *arg)
{
    long ordinal = PyLong_AsLong(arg);

    if (ordinal == -1 && PyErr_Occurred())
        return NULL;
    hcb_runtime_set_only_cpu_device(
        state_of(module)->rt,
        ordinal < 0 || ordinal > INT32_MAX ? -1 : (int32_t)ordinal);
    Py_RETURN_NONE;
}

static int
put_u64(PyObject *d, const char *key, uint64_t v)
{
    PyObject *o = PyLong_FromUnsignedLongLong(v);
    int rc;

    if (o == NULL)
        return -1;
    rc = PyDict_SetItemString(d, key, o);
    Py_DECREF(o);
    return rc;
}

/* A new dict of `n` counters, keys[i] -> values[i]. */
static PyObject *
dict_of_u64(const char *const *keys, const uint64_t *values, size_t n)
{
    PyObject *d = PyDict_New();
    size_t i;

    for (i = 0; d != NULL && i < n; i++)
        if (put_u64(d, keys[i], values[i]) < 0)
            Py_CLEAR(d);
    return d;
}

/* stats(device_key=None) -> dict of counters */
static PyObject *
hcb_stats_py(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    hcb_stats s = HCB_STATS_INIT;
    hcb_device dev;
    hcb_error err;

    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "stats takes at most 1 argument");
        return NULL;
    }
    if (parse_device(nargs > 0 ? args[0] : NULL, &dev) < 0)
        return NULL;
    if (hcb_runtime_stats(state_of(module)->rt, dev, &s, &err) != HCB_OK)
        return hcb_py_raise(&err);
    {
        static const char *const keys[] = {
            "records_in",       "bytes_in",         "records_out",
            "bytes_out",        "queued_records",   "queued_bytes",
            "reserved_records", "reserved_bytes",   "high_water_bytes",
            "producer_waits",   "producer_wait_ns", "errors"};
        const uint64_t values[] = {
            s.records_in,       s.bytes_in,         s.records_out,
            s.bytes_out,        s.queued_records,   s.queued_bytes,
            s.reserved_records, s.reserved_bytes,   s.high_water_bytes,
            s.producer_waits,   s.producer_wait_ns, s.errors};

        return dict_of_u64(keys, values, sizeof values / sizeof values[0]);
    }
}

/* cuda_pool_stats(ordinal) -> dict of the device's pinned pool, or None */
static PyObject *
hcb_cuda_pool_stats_fn(PyObject *module, PyObject *arg)
{
    hcb_cuda_pool_stats s = HCB_CUDA_POOL_STATS_INIT;
    long ordinal = PyLong_AsLong(arg);
    hcb_error err;
    int rc;

    (void)module;
    if (ordinal == -1 && PyErr_Occurred())
        return NULL;
    rc = hcb_cuda_get_pool_stats((int32_t)ordinal, &s, &err);
    if (rc == HCB_ENOTFOUND)
        Py_RETURN_NONE;
    if (rc != HCB_OK)
        return hcb_py_raise(&err);
    {
        static const char *const keys[] = {
            "capacity", "used_bytes", "in_flight_bytes", "kept_bytes",
            "waits",    "refusals",   "syncs",           "pin_failures"};
        const uint64_t values[] = {
            s.capacity, s.used_bytes, s.in_flight_bytes, s.kept_bytes,
            s.waits,    s.refusals,   s.syncs,           s.pin_failures};

        return dict_of_u64(keys, values, sizeof values / sizeof values[0]);
    }
}

static PyObject *
hcb_devices(PyObject *module, PyObject *unused)
{
    hcb_runtime *rt = state_of(module)->rt;
    hcb_device *keys;
    size_t n, i, cap;
    PyObject *list;

    (void)unused;
    cap = hcb_runtime_devices(rt, NULL, 0) + 1;
    keys = PyMem_Calloc(cap, sizeof *keys);
    if (keys == NULL)
        return PyErr_NoMemory();
    /* Channels are never removed, so the count can only have grown since:
     * list the ones that fit. */
    n = hcb_runtime_devices(rt, keys, cap);
    if (n > cap)
        n = cap;
    list = PyList_New(0);
    for (i = 0; list != NULL && i < n; i++) {
        PyObject *k = PyLong_FromLongLong((long long)keys[i]);

        if (k == NULL || PyList_Append(list, k) < 0)
            Py_CLEAR(list);
        Py_XDECREF(k);
    }
    PyMem_Free(keys);
    return list;
}

/* take_error() -> (count, last message) */
static PyObject *
hcb_take_error(PyObject *module, PyObject *unused)
{
    hcb_error last = {HCB_OK, ""};
    uint64_t n;

    (void)unused;
    n = hcb_runtime_take_error(state_of(module)->rt, &last);
    return Py_BuildValue("(Ks)", (unsigned long long)n, last.message);
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
     "submit_tap(callback_id, device_key, arrays): queue a tap record."},
    {"run_call", hcb_run_call, METH_VARARGS,
     "run_call(callback_id, device_key, args, outs): run a call target."},
    {"ffi_handlers", hcb_ffi_handlers, METH_VARARGS,
     "ffi_handlers(platform='cpu') -> {name: capsule or {stage: capsule}} "
     "of platform 'cpu' or 'cuda', for jax.ffi.register_ffi_target."},
    {"cuda_load", hcb_cuda_load_fn, METH_VARARGS,
     "cuda_load(path): load the CUDA runtime the CUDA handlers use (None: "
     "the one in the process, else libcudart by name)."},
    {"cuda_set_pinned_bytes", hcb_cuda_set_pinned_bytes_fn, METH_O,
     "cuda_set_pinned_bytes(n): the size of the pinned pool of GPU "
     "callbacks."},
    {"cuda_pool_stats", hcb_cuda_pool_stats_fn, METH_O,
     "cuda_pool_stats(ordinal) -> dict of what the pinned pool of CUDA "
     "device `ordinal` has done, or None (it has none)."},
    {"call_stream", hcb_call_stream_fn, METH_NOARGS,
     "call_stream() -> int: in a call target the CUDA handler "
     "hcb_buffer_call runs, XLA's cudaStream_t; 0 elsewhere."},
    {"hold_type", hcb_hold_type, METH_NOARGS,
     "hold_type() -> the FFI type of a hold, for jax.ffi.register_ffi_type."},
    {"holds", hcb_holds, METH_O,
     "holds(id) -> live executables embedding Python target id (-1: none)."},
    {"wait_unused", hcb_wait_unused, METH_O,
     "wait_unused(timeout_s): wait until a hold count drops to zero."},
    {"notify_unused", hcb_notify_unused, METH_NOARGS,
     "notify_unused(): wake wait_unused (a site was retired)."},
    {"barrier", (PyCFunction)(void (*)(void))hcb_barrier, METH_FASTCALL,
     "barrier(device_key=None): wait until submitted records are consumed."},
    {"flush", hcb_flush, METH_O,
     "flush(device_key): wait until the records the device submitted so "
     "far are delivered, as the end of a computation of it does."},
    {"stop", hcb_stop, METH_NOARGS,
     "stop(): drain the queues and join the consumer threads."},
    {"shutdown", hcb_shutdown, METH_NOARGS,
     "shutdown(): stop and never call Python taps again (interpreter exit)."},
    {"abandon", hcb_abandon, METH_NOARGS,
     "abandon(): never call Python taps again, without waiting for the "
     "consumer threads (exit after an interrupted flush)."},
    {"set_max_queue_bytes", hcb_set_max_queue_bytes, METH_O,
     "set_max_queue_bytes(n): the per-device queue bound in bytes."},
    {"set_only_cpu_device", hcb_set_only_cpu_device, METH_O,
     "set_only_cpu_device(ordinal): the only CPU device's id, or -1."},
    {"stats", (PyCFunction)(void (*)(void))hcb_stats_py, METH_FASTCALL,
     "stats(device_key=None) -> dict of runtime counters."},
    {"devices", hcb_devices, METH_NOARGS,
     "devices() -> device keys that have a queue."},
    {"dtype_name", hcb_dtype_name_of, METH_O,
     "dtype_name(code) -> numpy's name of an XLA element type, or None."},
    {"take_error", hcb_take_error, METH_NOARGS,
     "take_error() -> (count, last message) since the last call."},
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
    hcb_state *st = state_of(module);
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
    return 0;
}

static int
hcb_traverse(PyObject *module, visitproc visit, void *arg)
{
    hcb_state *st = state_of(module);

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
    hcb_state *st = state_of(module);

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
