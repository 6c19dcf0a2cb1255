/*
 * hcbpy.h - state shared by the two files of the CPython extension
 * host_callback._hcb: module.c (the module and its functions) and tap.c
 * (delivering a record to a Python tap function).
 */
#ifndef HCB_PY_H
#define HCB_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdatomic.h>

#include "hcb/hcb.h"

#define HCB_PY_NDTYPES 64 /* hcb_dtype values are below this */

/* Module state.  The objects are set once by host_callback's Python code
 * (configure) before the first tap is registered. */
typedef struct hcb_state {
    hcb_runtime *rt;          /* the default runtime, never destroyed */
    PyTypeObject *owner_type; /* RecordOwner: keeps a record alive */
    PyObject *dtypes;         /* tuple: hcb_dtype -> numpy dtype or None */
    PyObject *device_lookup;  /* callable(device_key) -> jax.Device */
    PyObject *on_error;       /* callable(site, exception) -> None */
    PyObject *device_cache;   /* dict: device_key -> jax.Device */
    PyObject *str_unflatten;  /* interned "unflatten" */
    PyObject *str_device;     /* interned "device" */
    atomic_int shutting_down; /* set at exit: taps are no longer delivered */
} hcb_state;

/* A Python tap target: what the runtime passes back as `user`.  Lives (with
 * its references) for the rest of the process, like the compiled programs
 * that embed its id. */
typedef struct hcb_py_target {
    PyObject *module; /* strong: keeps the state alive */
    hcb_state *state;
    PyObject *site; /* strong: (func, treedef, transforms, with_device) */
    char name[64];
} hcb_py_target;

/* tap.c */
int hcb_py_tap(void *user, hcb_record *rec, hcb_error *err);
/* True while this thread runs a Python tap function. */
int hcb_py_in_tap(void);
PyType_Spec *hcb_py_owner_spec(void);

#endif /* HCB_PY_H */
