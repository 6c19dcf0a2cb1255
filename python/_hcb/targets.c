/*
 * targets.c - Python targets and their life: registering Python tap, call
 * and buffer_callback sites (and C functions given by address) as runtime
 * targets, the module's table of live Python targets, and release(), which
 * drops a target's Python references once no compiled program can reach it
 * (host_callback/_registry.py decides when; lifetime.c counts the holds).
 * id_print's target is registered by register_print (print.c) through the
 * same functions.
 */
#include "hcbpy.h"

static hcb_state *
state_of(PyObject *module)
{
    return (hcb_state *)PyModule_GetState(module);
}

/* A new Python target of `size` bytes (which starts with an hcb_py_target)
 * for `site`, or NULL with an exception set.  The caller reads the site's
 * fields (hcb_py_tap_site_read, ...). */
void *
hcb_py_target_new(PyObject *module, PyObject *site, hcb_py_kind kind,
                  const char *name, Py_ssize_t name_len, size_t size)
{
    hcb_state *st = state_of(module);
    hcb_py_target *t;

    if (st->dtypes == NULL || st->tree_flatten == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        return NULL;
    }
    t = PyMem_RawCalloc(1, size);
    if (t == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    Py_INCREF(module);
    t->module = module;
    t->state = st;
    Py_INCREF(site);
    t->site = site;
    t->kind = kind;
    snprintf(t->name, sizeof t->name, "%.*s", (int)name_len, name);
    return t;
}

/* Frees a target that never got registered. */
void
hcb_py_target_free(hcb_py_target *t)
{
    Py_DECREF(t->site);
    Py_DECREF(t->module);
    PyMem_RawFree(t);
}

/* The id of a registered target (kept in the module's table of targets,
 * for release()), or (after freeing it) the error. */
PyObject *
hcb_py_target_registered(hcb_py_target *t, int rc, uint64_t id,
                         const hcb_error *err)
{
    PyObject *key, *cap;

    if (rc != HCB_OK) {
        hcb_py_target_free(t);
        return hcb_py_raise(err);
    }
    /* Registered: the runtime holds its address from now on, so it is never
     * freed; if it cannot enter the tables it is merely never released. */
    if (hcb_py_lifetime_add(t, id) < 0)
        return PyErr_NoMemory();
    key = PyLong_FromUnsignedLongLong(id);
    cap = PyCapsule_New(t, "host_callback._hcb.target", NULL);
    if (key == NULL || cap == NULL ||
        PyDict_SetItem(t->state->targets, key, cap) < 0) {
        Py_XDECREF(key);
        Py_XDECREF(cap);
        return NULL;
    }
    Py_DECREF(cap);
    return key;
}

/* release(id) -> bool: drops the Python references of the Python target
 * `id` (now, or when its running deliveries return); False when `id` is no
 * live Python target.  Called by host_callback/_registry.py once no compiled
 * program embeds the id and every record queued for it was delivered. */
PyObject *
hcb_py_release(PyObject *module, PyObject *arg)
{
    hcb_state *st = state_of(module);
    PyObject *cap;
    hcb_py_target *t;

    cap = PyDict_GetItemWithError(st->targets, arg); /* borrowed */
    if (cap == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_FALSE;
    }
    t = PyCapsule_GetPointer(cap, "host_callback._hcb.target");
    if (t == NULL)
        return NULL;
    if (PyDict_DelItem(st->targets, arg) < 0)
        return NULL;
    hcb_py_target_release(t);
    Py_RETURN_TRUE;
}

/* Registers `t` (whose first member is its hcb_py_target) as a tap target
 * run by `fn`; the runtime's code, with the id in *id. */
int
hcb_py_register_tap_target(hcb_py_target *t, hcb_tap_fn fn, uint64_t *id,
                           hcb_error *err)
{
    hcb_tap_target target = HCB_TAP_TARGET_INIT;

    target.fn = fn;
    target.user = t;
    target.name = t->name;
    target.name_len = strlen(t->name);
    return hcb_runtime_register_tap(t->state->rt, &target, id, err);
}

/* Registers `t` (whose first member is its hcb_py_target) as a call target
 * run by `fn`; returns its id or (after freeing it) the error. */
static PyObject *
call_target_registered(hcb_py_target *t, hcb_call_fn fn)
{
    hcb_call_target target = HCB_CALL_TARGET_INIT;
    uint64_t id = 0;
    hcb_error err;
    int rc;

    target.fn = fn;
    target.user = t;
    target.name = t->name;
    target.name_len = strlen(t->name);
    rc = hcb_runtime_register_call(t->state->rt, &target, &id, &err);
    return hcb_py_target_registered(t, rc, id, &err);
}

/* Parses the keyword-only arguments (site, name) of a registration with
 * `format` ("$Os#:f"; Python's parser names a missing one). */
static int
parse_site_name(PyObject *args, PyObject *kwargs, const char *format,
                PyObject **site, const char **name, Py_ssize_t *name_len)
{
    /* Python before 3.13 takes char **: the cast keeps -Wwrite-strings. */
    static const char *kwlist[] = {"site", "name", NULL};

    return PyArg_ParseTupleAndKeywords(args, kwargs, format, (char **)kwlist,
                                       site, name, name_len);
}

/* register_tap(*, site, name) -> int.  `site` is a TapSite (its fields
 * func, treedef, transforms, with_device are read by name, now); it is kept
 * until release(id). */
PyObject *
hcb_py_register_tap(PyObject *module, PyObject *args, PyObject *kwargs)
{
    hcb_py_target *t;
    PyObject *site;
    const char *name;
    Py_ssize_t name_len;
    uint64_t id = 0;
    hcb_error err;
    int rc;

    if (!parse_site_name(args, kwargs, "$Os#:register_tap", &site, &name,
                         &name_len))
        return NULL;
    t = hcb_py_target_new(module, site, HCB_PY_TAP, name, name_len, sizeof *t);
    if (t == NULL)
        return NULL;
    if (hcb_py_tap_site_read(t, site) < 0) {
        hcb_py_target_free(t);
        return NULL;
    }
    rc = hcb_py_register_tap_target(t, hcb_py_tap, &id, &err);
    return hcb_py_target_registered(t, rc, id, &err);
}

/* register_call(*, site, name) -> int.  `site` is a CallSite, whose fields
 * are read by name now (hcb_py_call_site_read); it is kept until
 * release(id). */
PyObject *
hcb_py_register_call(PyObject *module, PyObject *args, PyObject *kwargs)
{
    hcb_py_call_target *t;
    PyObject *site;
    const char *name;
    Py_ssize_t name_len;

    if (!parse_site_name(args, kwargs, "$Os#:register_call", &site, &name,
                         &name_len))
        return NULL;
    t = hcb_py_target_new(module, site, HCB_PY_CALL, name, name_len, sizeof *t);
    if (t == NULL)
        return NULL;
    if (hcb_py_call_site_read(t, site) < 0) {
        hcb_py_target_free(&t->base);
        return NULL;
    }
    return call_target_registered(&t->base, hcb_py_call);
}

/* register_buffer_callback(*, site, name) -> int.  `site` is a BufferSite,
 * whose fields are read by name now (hcb_py_buffer_site_read); kept until
 * release(id). */
PyObject *
hcb_py_register_buffer_callback(PyObject *module, PyObject *args,
                                PyObject *kwargs)
{
    hcb_py_buffer_target *t;
    PyObject *site;
    const char *name;
    Py_ssize_t name_len;

    if (!parse_site_name(args, kwargs, "$Os#:register_buffer_callback", &site,
                         &name, &name_len))
        return NULL;
    t = hcb_py_target_new(module, site, HCB_PY_BUFFER, name, name_len,
                          sizeof *t);
    if (t == NULL)
        return NULL;
    if (hcb_py_buffer_site_read(t, site) < 0) {
        hcb_py_target_free(&t->base);
        return NULL;
    }
    return call_target_registered(&t->base, hcb_py_buffer_call);
}

/* An address: an int from 0 to UINTPTR_MAX, else ValueError (a negative
 * or larger int would wrap around to another address).  A PyArg "O&"
 * converter. */
static int
address_arg(PyObject *obj, void *out)
{
    unsigned long long v;

    if (!PyLong_Check(obj) || PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "an address must be an int, got %R", obj);
        return 0;
    }
    v = PyLong_AsUnsignedLongLong(obj);
    if ((v == (unsigned long long)-1 && PyErr_Occurred()) ||
        v > (unsigned long long)UINTPTR_MAX) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError,
                     "an address must be from 0 to %llu, got %R",
                     (unsigned long long)UINTPTR_MAX, obj);
        return 0;
    }
    *(uintptr_t *)out = (uintptr_t)v;
    return 1;
}

/* register_native_tap / register_native_call(fn_address, user_address,
 * name) -> int: a C hcb_tap_fn / hcb_call_fn, run with no Python at all. */
static PyObject *
register_native(PyObject *module, PyObject *args, bool is_call)
{
    uintptr_t fn, user;
    const char *name;
    Py_ssize_t name_len;
    uint64_t id = 0;
    hcb_error err;
    int rc;

    if (!PyArg_ParseTuple(args, "O&O&s#", address_arg, &fn, address_arg, &user,
                          &name, &name_len))
        return NULL;
    if (fn == 0) {
        PyErr_SetString(PyExc_ValueError, "the C function pointer is NULL");
        return NULL;
    }
    if (is_call) {
        hcb_call_target target = HCB_CALL_TARGET_INIT;

        target.fn = (hcb_call_fn)fn;
        target.user = (void *)user;
        target.name = name;
        target.name_len = (size_t)name_len;
        rc =
            hcb_runtime_register_call(state_of(module)->rt, &target, &id, &err);
    } else {
        hcb_tap_target target = HCB_TAP_TARGET_INIT;

        target.fn = (hcb_tap_fn)fn;
        target.user = (void *)user;
        target.name = name;
        target.name_len = (size_t)name_len;
        rc = hcb_runtime_register_tap(state_of(module)->rt, &target, &id, &err);
    }
    if (rc != HCB_OK)
        return hcb_py_raise(&err);
    return PyLong_FromUnsignedLongLong(id);
}

PyObject *
hcb_py_register_native_tap(PyObject *module, PyObject *args)
{
    return register_native(module, args, false);
}

PyObject *
hcb_py_register_native_call(PyObject *module, PyObject *args)
{
    return register_native(module, args, true);
}
