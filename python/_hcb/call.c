/*
 * call.c - running a Python call function for XLA (host_callback.call).
 *
 * hcb_py_call is the call target of every Python call site.  It runs on the
 * XLA thread of the computation, which waits for it (hcb_runtime_call).
 * Steps: take the GIL; copy the operands once into a record and view them
 * as numpy arrays (the function may keep them); unflatten them with the
 * site's treedef; call func(value[, device=...]); then check the result
 * against result_shape and copy it into XLA's result buffers
 * (call_result.c).  Any failure fills `err` with a message that names the
 * function, what result_shape declares and what came back (or the
 * exception and its traceback), and goes to the Python error hook (log,
 * barrier_wait).  And the call site's fields, read once at registration.
 */
#include "hcbpy.h"

#include <stdbool.h>
#include <string.h>

/* How many call (or buffer_callback) functions this thread is inside of:
 * their computation cannot finish before they return, so barrier_wait must
 * not wait for it (host_callback/_probes.py). */
static _Thread_local int in_call;

void
hcb_py_enter_call(void)
{
    in_call++;
}

void
hcb_py_leave_call(void)
{
    in_call--;
}

int
hcb_py_in_call(void)
{
    return in_call > 0;
}

/* ---- the site ------------------------------------------------------------ */

/* An int field of `obj`, or -1 with an exception set. */
static long
int_attr(PyObject *obj, const char *name)
{
    PyObject *v = PyObject_GetAttrString(obj, name);
    long n = v != NULL ? PyLong_AsLong(v) : -1;

    Py_XDECREF(v);
    return n;
}

/* Copies the str `v`, of `min_len` characters or more and fewer than
 * `cap`, into `dst` (with its NUL); -1 with a TypeError naming the
 * CallSite's field `name`. */
static int
str_field(PyObject *v, const char *name, size_t min_len, char *dst, size_t cap)
{
    Py_ssize_t len = 0;
    const char *s =
        PyUnicode_Check(v) ? PyUnicode_AsUTF8AndSize(v, &len) : NULL;

    if (s == NULL || (size_t)len < min_len || (size_t)len >= cap) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "the CallSite's %s must be a str of %zu to %zu "
                     "characters",
                     name, min_len, cap - 1);
        return -1;
    }
    memcpy(dst, s, (size_t)len + 1);
    return 0;
}

int
hcb_py_call_site_read(hcb_py_call_target *t, PyObject *site)
{
    static const char *const names[] = {
        "func", "arg_treedef", "result_treedef", "with_device", "narrow_x64",
        "api",  "hint"};
    PyObject *f[7];
    long nodes, leaves;
    int with_device, narrow;

    if (hcb_py_fields(site, "CallSite", names, f, 7) < 0)
        return -1;
    if (str_field(f[5], "api", 1, t->api, sizeof t->api) < 0 ||
        str_field(f[6], "hint", 0, t->hint, sizeof t->hint) < 0)
        return -1;
    if (!PyCallable_Check(f[0])) {
        PyErr_SetString(PyExc_TypeError, "the CallSite's func is not callable");
        return -1;
    }
    nodes = int_attr(f[2], "num_nodes");
    leaves = int_attr(f[2], "num_leaves");
    with_device = PyObject_IsTrue(f[3]);
    narrow = PyObject_IsTrue(f[4]);
    if (nodes < 0 || leaves < 0 || with_device < 0 || narrow < 0)
        return -1;
    t->func = f[0];
    t->arg_treedef = f[1];
    t->result_treedef = f[2];
    t->result_is_leaf = nodes == 1 && leaves == 1;
    t->with_device = with_device;
    t->narrow_x64 = narrow;
    /* The drop-ins of JAX's callbacks report wrong results in JAX's words. */
    t->jax_words = strcmp(t->api, "host_callback.call") != 0;
    return 0;
}

/* ---- the call ------------------------------------------------------------ */

/* The function's argument: the operands copied once into a record, viewed
 * as numpy arrays, unflattened. */
static PyObject *
argument_of(hcb_py_call_target *t, hcb_device device, const hcb_array *args,
            size_t nargs)
{
    PyObject *arrays, *value;
    hcb_record *rec;
    hcb_error e;

    if (nargs == 0) {
        arrays = PyTuple_New(0);
    } else {
        if (hcb_record_create(0, device, args, nargs, &rec, &e) != HCB_OK)
            return hcb_py_raise(&e);
        arrays = hcb_py_arrays_of(t->base.state, rec);
        hcb_record_release(rec);
    }
    if (arrays == NULL)
        return NULL;
    value = PyObject_CallMethodOneArg(t->arg_treedef,
                                      t->base.state->str_unflatten, arrays);
    Py_DECREF(arrays);
    return value;
}

static PyObject *
call_function(hcb_py_call_target *t, hcb_device device, PyObject *value)
{
    PyObject *dev, *result, *argv[2] = {value, NULL};

    if (!t->with_device)
        return PyObject_Vectorcall(t->func, argv, 1, NULL);
    dev = hcb_py_device_of(t->base.state, device);
    if (dev == NULL)
        return NULL;
    argv[1] = dev;
    result = PyObject_Vectorcall(t->func, argv, 1, t->base.state->kw_device);
    Py_DECREF(dev);
    return result;
}

int
hcb_py_call(void *user, hcb_device device, const hcb_array *args, size_t nargs,
            const hcb_array *results, size_t nresults, hcb_error *err)
{
    hcb_py_call_target *t = user;
    PyGILState_STATE gil;
    PyObject *value, *result;
    char kind[48];
    int rc;

    if (hcb_py_gil_ensure(t->base.state, &gil) < 0)
        return hcb_error_set(err, HCB_ESTATE,
                             HCB_PY_CALL_PREFIX
                             "not called: the Python interpreter is "
                             "shutting down",
                             t->api, t->base.name);
    snprintf(kind, sizeof kind, "%s: callback", t->api);
    rc = hcb_py_target_enter(&t->base, kind, err);
    if (rc != HCB_OK) {
        hcb_py_gil_release(gil);
        return rc;
    }
    value = argument_of(t, device, args, nargs);
    hcb_py_enter_call();
    result = value != NULL ? call_function(t, device, value) : NULL;
    hcb_py_leave_call();
    Py_XDECREF(value);
    if (result == NULL) {
        rc = hcb_py_call_raised(t, err);
    } else {
        rc = hcb_py_call_result(t, result, results, nresults, err);
        Py_DECREF(result);
    }
    hcb_py_target_leave(&t->base);
    hcb_py_gil_release(gil);
    return rc;
}
