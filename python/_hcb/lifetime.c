/*
 * lifetime.c - how many live compiled programs embed each Python target.
 *
 * DESIGN
 *
 * XLA runs a handler's INSTANTIATE stage once per custom call when it
 * builds (or loads) an executable, and keeps the state the handler sets
 * there until it destroys the executable.  Running computations keep their
 * executable alive, and so does JAX's C++ dispatch cache.  So "hcb_tap",
 * "hcb_call" and "hcb_sharded_check" get an instantiate handler here that
 * takes one hold on the Python target of their callback_id; the state's
 * deleter drops it.  A target with no hold is in no live executable and in
 * no running computation: host_callback/_registry.py releases it then, once
 * nothing in Python holds its site either and the records queued for it
 * have been delivered (hcb_py_target_release).
 *
 * Threads: the instantiate handler runs on the thread that compiles or
 * loads an executable, the deleter on the one that destroys it, with or
 * without the GIL: neither touches Python.  Holds are atomics in the target.
 * One mutex (a leaf: nothing else is taken under it) guards the table of
 * targets by id and the generation counter whose condition wakes
 * hcb_py_wait_unused; it is process-wide, as the runtime and XLA's handler
 * registry are.  Targets are never freed (the runtime keeps their address),
 * so the table never holds a dangling pointer.
 */
#include "hcbpy.h" /* first: Python.h sets the feature macros */

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "hcb/ffi.h"

/* ---- the table of Python targets ------------------------------------------
 */

static struct {
    pthread_mutex_t mu;
    pthread_cond_t unused; /* a hold count dropped to zero */
    uint64_t generation;   /* bumped at each such drop */
    hcb_py_target **by_id; /* index: id; NULL for native targets */
    size_t cap;
} table = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, NULL, 0};

int
hcb_py_lifetime_add(hcb_py_target *t, uint64_t id)
{
    int rc = 0;

    pthread_mutex_lock(&table.mu);
    if (id >= table.cap) {
        size_t cap = table.cap ? table.cap : 256;
        hcb_py_target **grown;

        while (cap <= id)
            cap *= 2;
        grown = realloc(table.by_id, cap * sizeof *grown);
        if (grown == NULL) {
            rc = -1;
        } else {
            memset(grown + table.cap, 0, (cap - table.cap) * sizeof *grown);
            table.by_id = grown;
            table.cap = cap;
        }
    }
    if (rc == 0)
        table.by_id[id] = t;
    pthread_mutex_unlock(&table.mu);
    return rc;
}

static hcb_py_target *
lookup(uint64_t id)
{
    hcb_py_target *t = NULL;

    pthread_mutex_lock(&table.mu);
    if (id < table.cap)
        t = table.by_id[id];
    pthread_mutex_unlock(&table.mu);
    return t;
}

/* ---- the FFI state: one hold -------------------------------------------- */

typedef struct {
    hcb_py_target *target;
} hold;

static void notify(void);

static void
hold_delete(void *object)
{
    hold *h = object;

    if (h == NULL)
        return;
    if (atomic_fetch_sub(&h->target->holds, 1) == 1)
        notify();
    free(h);
}

/* Filled by XLA when the type is registered (jax.ffi.register_ffi_type, or
 * register_ffi_type_id before JAX 0.8). */
static XLA_FFI_TypeId hold_type_id = {0};
static hcb_ffi_type_info hold_type_info = {sizeof(hcb_ffi_type_info), NULL,
                                           hold_delete};

static XLA_FFI_Error *
instantiate(XLA_FFI_CallFrame *frame)
{
    XLA_FFI_Error *xe;
    hcb_py_target *t;
    uint64_t id = 0;
    hold *h;

    if (hcb_ffi_answer_probe_stateful(frame, 0, &hold_type_id))
        return NULL;
    if ((xe = hcb_ffi_check_stage(frame, XLA_FFI_ExecutionStage_INSTANTIATE,
                                  "hcb_instantiate")) != NULL)
        return xe;
    if (hcb_ffi_attr_find(&frame->attrs, "callback_id", NULL) == NULL ||
        hcb_ffi_attr_u64(&frame->attrs, "callback_id", &id, NULL) != HCB_OK)
        return NULL;
    t = lookup(id);
    if (t == NULL) /* a native target: kept for the process */
        return NULL;
    h = malloc(sizeof *h);
    if (h == NULL)
        return hcb_ffi_error(frame, HCB_ENOMEM,
                             "hcb: out of memory for a callback's hold");
    h->target = t;
    atomic_fetch_add(&t->holds, 1);
    xe = hcb_ffi_state_set(frame, &hold_type_id, h, hold_delete);
    if (xe != NULL) /* XLA keeps no state: drop the hold ourselves */
        hold_delete(h);
    return xe;
}

XLA_FFI_Error *
hcb_py_ffi_instantiate(XLA_FFI_CallFrame *frame)
{
    return instantiate(frame);
}

/* ---- from Python ----------------------------------------------------------
 */

PyObject *
hcb_py_hold_type(void)
{
    PyObject *id = PyCapsule_New(&hold_type_id, NULL, NULL);
    PyObject *info =
        id != NULL ? PyCapsule_New(&hold_type_info, NULL, NULL) : NULL;
    PyObject *d = info != NULL ? PyDict_New() : NULL;

    if (d == NULL || PyDict_SetItemString(d, "type_id", id) < 0 ||
        PyDict_SetItemString(d, "type_info", info) < 0)
        Py_CLEAR(d);
    Py_XDECREF(id);
    Py_XDECREF(info);
    return d;
}

PyObject *
hcb_py_holds(PyObject *arg)
{
    unsigned long long id = PyLong_AsUnsignedLongLong(arg);
    hcb_py_target *t;

    if (id == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    t = lookup(id);
    return PyLong_FromLongLong(t == NULL ? -1
                                         : (long long)atomic_load(&t->holds));
}

static void
notify(void)
{
    pthread_mutex_lock(&table.mu);
    table.generation++;
    pthread_cond_broadcast(&table.unused);
    pthread_mutex_unlock(&table.mu);
}

PyObject *
hcb_py_notify_unused(void)
{
    notify();
    Py_RETURN_NONE;
}

/* In a forked child only this thread runs: the parent's other threads may
 * have held the mutex. */
static void
reinit_after_fork(void)
{
    pthread_mutex_init(&table.mu, NULL);
    pthread_cond_init(&table.unused, NULL);
}

static void
register_fork_handler(void)
{
    pthread_atfork(NULL, NULL, reinit_after_fork);
}

void
hcb_py_lifetime_init(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;

    pthread_once(&once, register_fork_handler);
}

PyObject *
hcb_py_wait_unused(PyObject *arg)
{
    /* The generation the (one) waiting thread has seen: a drop since its
     * last wait returns at once. */
    static uint64_t waited;
    double timeout = PyFloat_AsDouble(arg);
    struct timespec until;

    if (timeout == -1.0 && PyErr_Occurred())
        return NULL;
    Py_BEGIN_ALLOW_THREADS;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)timeout;
    until.tv_nsec += (long)((timeout - (double)(time_t)timeout) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&table.mu);
    while (table.generation == waited &&
           pthread_cond_timedwait(&table.unused, &table.mu, &until) == 0)
        ;
    waited = table.generation;
    pthread_mutex_unlock(&table.mu);
    Py_END_ALLOW_THREADS;
    Py_RETURN_NONE;
}
