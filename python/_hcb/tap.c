/*
 * tap.c - delivering one record to a Python tap function.
 *
 * Runs on the device's consumer thread (src/runtime/channels.c), or, for a
 * tap delivered now, on the thread running the computation
 * (src/runtime/calls.c); either holds no lock and not the GIL.  Steps: take the
 * GIL; wrap each array of the record in a numpy array that points into the
 * record (no copy) and keeps it alive through a RecordOwner; unflatten them
 * with the site's treedef (the site's fields were read at registration,
 * hcb_py_tap_site_read); call func(value, transforms[, device=...]); on an
 * exception, hand it to the Python error hook (logging, barrier_wait) and
 * report it to the runtime.
 */
#include "hcbpy.h"

/* Set while this thread is inside a tap function that a consumer thread
 * delivers (barrier_wait uses it to refuse waiting for itself).  A tap
 * delivered now, in the computation's thread (the drop-ins), runs as a
 * call function does: hcb_py_enter_call marks it (call.c). */
static _Thread_local int in_tap;

int
hcb_py_in_tap(void)
{
    return in_tap;
}

/* ---- the site ------------------------------------------------------------ */

int
hcb_py_tap_site_read(hcb_py_target *t, PyObject *site)
{
    static const char *const names[] = {"func", "treedef", "transforms",
                                        "with_device", "api"};
    PyObject *f[5];
    Py_ssize_t api_len = 0;
    const char *api;
    int with_device;

    if (hcb_py_fields(site, "TapSite", names, f, 5) < 0)
        return -1;
    if (!PyCallable_Check(f[0])) {
        PyErr_SetString(PyExc_TypeError, "the TapSite's func is not callable");
        return -1;
    }
    with_device = PyObject_IsTrue(f[3]);
    if (with_device < 0)
        return -1;
    api =
        PyUnicode_Check(f[4]) ? PyUnicode_AsUTF8AndSize(f[4], &api_len) : NULL;
    if (api == NULL || (size_t)api_len >= sizeof t->tap.api) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "the TapSite's api must be a str of at most %zu bytes, "
                     "got %R",
                     sizeof t->tap.api - 1, f[4]);
        return -1;
    }
    memcpy(t->tap.api, api, (size_t)api_len + 1);
    t->tap.func = f[0];
    t->tap.treedef = f[1];
    t->tap.transforms = f[2];
    t->tap.with_device = with_device;
    return 0;
}

/* ---- the call ------------------------------------------------------------ */

static PyObject *
call_site(hcb_state *st, const hcb_py_tap_fields *site, hcb_record *rec)
{
    PyObject *arrays, *value, *result = NULL;

    arrays = hcb_py_arrays_of(st, rec);
    if (arrays == NULL)
        return NULL;
    value = PyObject_CallMethodOneArg(site->treedef, st->str_unflatten, arrays);
    Py_DECREF(arrays);
    if (value == NULL)
        return NULL;
    if (site->with_device) {
        PyObject *dev = hcb_py_device_of(st, hcb_record_device(rec));

        if (dev != NULL) {
            PyObject *argv[3] = {value, site->transforms, dev};

            result = PyObject_Vectorcall(site->func, argv, 2, st->kw_device);
            Py_DECREF(dev);
        }
    } else {
        PyObject *argv[2] = {value, site->transforms};

        result = PyObject_Vectorcall(site->func, argv, 2, NULL);
    }
    Py_DECREF(value);
    return result;
}

int
hcb_py_tap(void *user, hcb_record *rec, hcb_error *err)
{
    hcb_py_target *t = user;
    PyGILState_STATE gil;
    PyObject *result;
    int rc;

    if (hcb_py_gil_ensure(t->state, &gil) < 0)
        return hcb_error_set(err, HCB_ESTATE,
                             "tap function '%s' not called: the Python "
                             "interpreter is shutting down",
                             t->name);
    rc = hcb_py_target_enter(t, "tap function", err);
    if (rc != HCB_OK) {
        hcb_py_gil_release(gil);
        return rc;
    }
    if (hcb_in_consumer_thread()) {
        in_tap = 1;
        result = call_site(t->state, &t->tap, rec);
        in_tap = 0;
    } else {
        hcb_py_enter_call();
        result = call_site(t->state, &t->tap, rec);
        hcb_py_leave_call();
    }
    if (result == NULL) {
        char what[128];

        if (t->tap.api[0] != '\0')
            snprintf(what, sizeof what, "%s: callback '%s'", t->tap.api,
                     t->name);
        else
            snprintf(what, sizeof what, "tap function '%s'", t->name);
        if (hcb_in_consumer_thread()) {
            Py_XDECREF(hcb_py_report_exception(t, what, err));
            rc = HCB_ECALLBACK;
        } else {
            /* Delivered now: the error may fail the computation, and its
             * message carries the traceback, as a call's does. */
            rc = hcb_py_raised(t, what, err);
        }
    }
    Py_XDECREF(result);
    hcb_py_target_leave(t);
    hcb_py_gil_release(gil);
    return rc;
}
