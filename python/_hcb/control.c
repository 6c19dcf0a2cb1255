/*
 * control.c - the runtime seen from Python: waiting for it (barrier),
 * stopping it (stop, shutdown, abandon), its settings (the queue
 * bound, the only CPU device), what it has done (stats, the pinned pools'
 * stats, devices, take_error).  Module functions of host_callback._hcb,
 * added by module.c (hcb_py_control_methods).  Every call that may wait
 * releases the GIL.
 */
#include "hcbpy.h"

#include "hcb/cuda.h" /* the pinned pools' stats */

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
    hcb_state *st = hcb_py_state(module);
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

static PyObject *
hcb_stop(PyObject *module, PyObject *unused)
{
    hcb_state *st = hcb_py_state(module);
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
    atomic_store(&hcb_py_state(module)->shutting_down, 1);
    return hcb_stop(module, NULL);
}

static PyObject *
hcb_abandon(PyObject *module, PyObject *unused)
{
    (void)unused;
    atomic_store(&hcb_py_state(module)->shutting_down, 1);
    Py_RETURN_NONE;
}

static PyObject *
hcb_set_max_queue_bytes(PyObject *module, PyObject *arg)
{
    unsigned long long n = PyLong_AsUnsignedLongLong(arg);
    hcb_error err;

    if (n == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (hcb_runtime_set_max_queue_bytes(hcb_py_state(module)->rt, (size_t)n,
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
        hcb_py_state(module)->rt,
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
    if (hcb_runtime_stats(hcb_py_state(module)->rt, dev, &s, &err) != HCB_OK)
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
    hcb_runtime *rt = hcb_py_state(module)->rt;
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
    n = hcb_runtime_take_error(hcb_py_state(module)->rt, &last);
    return Py_BuildValue("(Ks)", (unsigned long long)n, last.message);
}

PyMethodDef hcb_py_control_methods[] = {
    {"barrier", (PyCFunction)(void (*)(void))hcb_barrier, METH_FASTCALL,
     "barrier(device_key=None): wait until submitted records are consumed."},
    {"stop", hcb_stop, METH_NOARGS,
     "stop(): drain the queues and join the consumer threads."},
    {"shutdown", hcb_shutdown, METH_NOARGS,
     "shutdown(): stop and never call Python taps again (interpreter exit)."},
    {"abandon", hcb_abandon, METH_NOARGS,
     "abandon(): never call Python taps again, without waiting for the "
     "consumer threads (exit after an interrupted at-exit barrier)."},
    {"set_max_queue_bytes", hcb_set_max_queue_bytes, METH_O,
     "set_max_queue_bytes(n): the per-device queue bound in bytes."},
    {"set_only_cpu_device", hcb_set_only_cpu_device, METH_O,
     "set_only_cpu_device(ordinal): the only CPU device's id, or -1."},
    {"stats", (PyCFunction)(void (*)(void))hcb_stats_py, METH_FASTCALL,
     "stats(device_key=None) -> dict of runtime counters."},
    {"cuda_pool_stats", hcb_cuda_pool_stats_fn, METH_O,
     "cuda_pool_stats(ordinal) -> dict of what the pinned pool of CUDA "
     "device `ordinal` has done, or None (it has none)."},
    {"devices", hcb_devices, METH_NOARGS,
     "devices() -> device keys that have a queue."},
    {"take_error", hcb_take_error, METH_NOARGS,
     "take_error() -> (count, last message) since the last call."},
    {NULL, NULL, 0, NULL},
};
