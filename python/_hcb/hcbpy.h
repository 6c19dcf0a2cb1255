/*
 * hcbpy.h - state shared by the files of the CPython extension
 * host_callback._hcb, which are:
 *   module.c       the module: its state, initialisation, method table
 *   control.c      the runtime's controls: barrier, flush, stop, stats,
 *                  errors
 *   handlers.c     libhcb's FFI handlers as capsules, its CUDA functions
 *   targets.c      registering Python targets and releasing them
 *   entry.c        taps and calls entering the runtime from Python
 *   lifetime.c     holds of executables
 *   tap.c          delivering a record to a Python tap function
 *   call.c         running a Python call function for XLA
 *   call_result.c  checking its result and writing it into XLA's buffers
 *                  (inline mode too)
 *   buffer.c       in-place buffer callbacks and the Buffer type; with
 *                  dlpack.c, its DLPack export, and buffer_cuda.c, a GPU
 *                  Buffer's interop (buffer.h)
 *   print.c        id_print
 *   interrupt.c    Ctrl-C while a device's thread waits
 *   bridge.c       what they share: the GIL, numpy arrays over records,
 *                  devices, errors
 */
#ifndef HCB_PY_H
#define HCB_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "hcb/hcb.h"

/*
 * Locks.  Every lock of the extension, in the order they may be taken
 * (the runtime's own, numbered 0-6, are listed in src/runtime/runtime.h,
 * which points here):
 *
 *   A. print_mutex  (print.c, process-wide) keeps the lines of one id_print
 *                   record together when several devices print at once.
 *                   Taken before the GIL, never while holding it (print_write
 *                   releases the GIL to take it); the GIL is then taken under
 *                   it to write to the Python stream.  Not taken again by a
 *                   thread that holds it (a stream that prints).  Made new
 *                   in a forked child.
 *   B. the GIL      taken by consumer and XLA threads to run Python targets
 *                   (bridge.c, hcb_py_gil_ensure), released around every
 *                   blocking wait.  Python code that runs under it may take
 *                   host_callback's own threading lock (_state.py), which
 *                   come after it.
 *   C. table.mu     (lifetime.c, process-wide) the table of Python targets by
 *                   id and the generation counter of wait_unused.  A leaf:
 *                   taken with or without the GIL (the INSTANTIATE handler
 *                   and the state deleter run on XLA threads without it), and
 *                   nothing, the GIL included, is taken under it;
 *                   wait_unused waits on its condition with the GIL
 *                   released.  Made new in a forked child.
 *   D. hook_mu      (interrupt.c, process-wide) serialises putting the SIGINT
 *                   counter in front of SIGINT's handler.  A leaf, taken by
 *                   configure and by devices' threads as they start to wait
 *                   (inside libhcb's interrupt check, no runtime lock held),
 *                   never with anything taken under it.
 *
 * Against the runtime's locks: A and C are never held while the extension
 * calls into libhcb.  The GIL may be, for calls that hold a runtime lock
 * briefly and never wait (registration, stats, take_error, the queue
 * bound); every call that may wait (submit, barrier, stop, a sharded call)
 * releases the GIL first.  So the GIL orders before all of the runtime's
 * locks, and the runtime never takes it under one of them: it holds none
 * while it calls a target (the extension's entry points) or the log sink.
 * The extension has no other mutex: no PyMutex, no PyThread lock, no
 * static lock besides A, C and D.
 * Thread-locals (not locks): in_tap (tap.c), in_call (call.c),
 * keeps_thread_state (bridge.c), print_mutex_held (print.c).
 */

#define HCB_PY_NDTYPES 64 /* hcb_dtype values are below this */

/* Module state.  The objects are set once by host_callback's Python code
 * (configure) before the first tap is registered. */
typedef struct hcb_state {
    hcb_runtime *rt;           /* the default runtime, never destroyed */
    PyTypeObject *owner_type;  /* RecordOwner: keeps a record alive */
    PyTypeObject *buffer_type; /* Buffer: one XLA buffer (buffer.c) */
    PyObject *dtypes;          /* tuple: hcb_dtype -> numpy dtype or None */
    PyObject *device_lookup;   /* callable(device_key) -> jax.Device */
    PyObject *on_error;        /* callable(site, exception) -> traceback str */
    PyObject *tree_flatten;    /* jax.tree_util.tree_flatten */
    PyObject *warn;            /* callable(message): the runtime's warnings */
    PyObject *device_cache;    /* dict: device_key -> jax.Device */
    PyObject *targets;         /* dict: id -> capsule of a live Python target */
    PyObject *str_unflatten;   /* interned "unflatten" */
    PyObject *str_write;       /* interned "write" */
    PyObject *str_device;      /* interned "device" */
    PyObject *kw_device;       /* ("device",): vectorcall keyword names */
    atomic_int shutting_down;  /* set at exit: taps are no longer delivered */
} hcb_state;

/* What a Python target is (how to release it). */
typedef enum {
    HCB_PY_TAP = 1,
    HCB_PY_CALL,
    HCB_PY_BUFFER,
    HCB_PY_PRINT
} hcb_py_kind;

/* The fields of a tap site (host_callback._sites.TapSite), read by name
 * once, at registration, so that a delivery reads no Python attribute.
 * The objects are borrowed from the site (a NamedTuple, which holds them as
 * its items) and valid while the target keeps its site. */
typedef struct hcb_py_tap_fields {
    PyObject *func;       /* func(value, transforms[, device=]) */
    PyObject *treedef;    /* of the tapped value */
    PyObject *transforms; /* passed as is */
    int with_device;      /* pass device= */
    /* The drop-in the tap serves ("debug.callback"), naming it in the
     * error of a tap delivered now; "" for host_callback's own taps. */
    char api[32];
} hcb_py_tap_fields;

/* A Python tap target: what the runtime passes back as `user`.  The struct
 * itself lives for the rest of the process (the runtime's registry keeps
 * its address), but its Python references are dropped by
 * hcb_py_target_release once no compiled program embeds its id and no
 * record for it is queued (host_callback/_registry.py decides when): a
 * released target reports an error instead of calling anything.  `site`,
 * `busy` and `release_pending` are read and written with the GIL held. */
typedef struct hcb_py_target {
    PyObject *module; /* strong: keeps the state alive */
    hcb_state *state;
    /* strong: a TapSite, or the kind's own site; NULL once released */
    PyObject *site;
    hcb_py_kind kind;
    hcb_py_tap_fields tap;     /* HCB_PY_TAP and HCB_PY_PRINT: the site's */
    atomic_int_fast64_t holds; /* live executables embedding its id */
    int busy;                  /* deliveries running now (they hold `site`) */
    int release_pending;       /* released while busy: drop at the last leave */
    char name[64];
} hcb_py_target;

/* A Python call target (call.c), likewise kept for the process.  `base`
 * holds the module, state, site (a host_callback._sites.CallSite) and
 * name; the fields below are read from the site by name at registration
 * (hcb_py_call_site_read), the objects borrowed from it. */
typedef struct hcb_py_call_target {
    hcb_py_target base;
    PyObject *func;
    PyObject *arg_treedef;
    PyObject *result_treedef;
    int result_is_leaf; /* result_shape is one array: the fast path */
    int with_device;    /* pass device= */
    int narrow_x64;     /* accept 64-bit results for declared 32-bit types */
    /* The API the user called, first in every message: "host_callback.call",
     * or a drop-in of JAX's ("pure_callback", "io_callback"), whose messages
     * of a wrong result start with JAX's words (`jax_words`). */
    char api[32];
    int jax_words;
    /* What the site's result_shape probably meant, added to a wrong
     * result's message ("" for none; the site's `hint`). */
    char hint[256];
} hcb_py_call_target;

/* A Python buffer_callback target (buffer.c); `base.site` is a
 * host_callback._buffer.BufferSite, whose fields are read by name at
 * registration (hcb_py_buffer_site_read), the objects borrowed from it. */
typedef struct hcb_py_buffer_target {
    hcb_py_target base;
    PyObject *callback;
    PyObject *in_treedef; /* of (args, kwargs) */
    PyObject *out_treedef;
    PyObject *context_type; /* ExecutionContext(device) */
    /* The BufferSite's shortcuts (its positional_operands, one_result):
     * (args, kwargs) unflatten to (tuple of the `nflat` operand leaves in
     * order, {}), and the results to their one leaf itself, so that a
     * call need not unflatten. */
    Py_ssize_t nflat; /* -1: unflatten the operands */
    int out_is_leaf;
} hcb_py_buffer_target;

/* An id_print target (print.c), registered only when libhcb's printer
 * prints every dtype of the value: the site's func is the Printer.  The
 * strings all live in `strings`. */
typedef struct hcb_py_print_target {
    hcb_py_target base;
    hcb_print_options opts;
    hcb_print_node *nodes;
    size_t nnodes;
    const char *kv_before; /* the "k: v" line, up to the device's name */
    size_t kv_before_len;  /* (any bytes: strings are pointer and length) */
    const char *kv_after;  /* and after it */
    size_t kv_after_len;
    int with_device;      /* the line names the record's device */
    hcb_device *dev_keys; /* device keys and their names */
    const char **dev_names;
    size_t *dev_name_lens;
    size_t ndevices;
    PyObject *stream; /* strong; NULL: sys.stdout at each write */
    /* strong, or NULL: each record is one call log(text, device) instead of
     * writes (debug.log: the text without its newline, the jax.Device) */
    PyObject *log;
    int broken; /* a write failed: write no more (GIL) */
    char *strings;
} hcb_py_print_target;

/* bridge.c */
/* Reads the fields `names[i]` of `obj` (a NamedTuple: `what` names its
 * class for messages) into `out[i]`, borrowed from it; -1 with a TypeError
 * that names what was expected and what came. */
int hcb_py_fields(PyObject *obj, const char *what, const char *const *names,
                  PyObject **out, size_t n);
/* With the GIL: starts a delivery to `t`, which keeps its site until
 * hcb_py_target_leave.  An error code with `err` filled (no exception) when
 * `t` was released; `kind` ("tap function", ...) names it for the message,
 * with its name. */
int hcb_py_target_enter(hcb_py_target *t, const char *kind, hcb_error *err);
void hcb_py_target_leave(hcb_py_target *t);
/* With the GIL: drops the target's Python references now, or when its last
 * running delivery leaves. */
void hcb_py_target_release(hcb_py_target *t);
/* Takes the GIL from any thread; -1 (nothing taken) once the interpreter
 * is shutting down. */
int hcb_py_gil_ensure(hcb_state *st, PyGILState_STATE *gil);
void hcb_py_gil_release(PyGILState_STATE gil);
/* The numpy dtype of an hcb_dtype (borrowed), or NULL with a TypeError. */
PyObject *hcb_py_descr(hcb_state *st, hcb_dtype dtype);
/* A numpy array (no copy) over `data`: C order, `descr` (borrowed), `rank`
 * `dims`; `base` (may be NULL) is kept alive by it.  With `data` NULL, a new
 * writable array of its own (uninitialized). */
PyObject *hcb_py_array_view(PyObject *descr, int rank, const int64_t *dims,
                            void *data, int writable, PyObject *base);
/* A tuple of numpy arrays of the record's arrays: views that keep the
 * record alive, or copies for a small record (bridge.c, COPY_MAX). */
PyObject *hcb_py_arrays_of(hcb_state *st, hcb_record *rec);
/* The jax.Device of a device key (new reference). */
PyObject *hcb_py_device_of(hcb_state *st, hcb_device key);
/* Takes the pending exception (normalised, with its traceback). */
PyObject *hcb_py_fetch_exception(void);
/* Raises `err` as the extension's exception for its code -- the one mapping
 * from hcb error codes to Python: HCB_EINVAL ValueError, HCB_ENOMEM
 * MemoryError, HCB_EUNIMPL TypeError (a dtype or value the library does
 * not handle), any other RuntimeError -- and returns NULL. */
PyObject *hcb_py_raise(const hcb_error *err);
/* Hands `exc` (stolen; NULL is ignored) to the Python error hook, which logs
 * it, keeps it for barrier_wait and returns its formatted traceback (new
 * reference, or NULL).  `raised`: the function raised `exc` (else it is the
 * runtime's own report of a wrong result: JAX's drop-ins log only the
 * former).  No exception stays pending. */
PyObject *hcb_py_hand_to_hook(hcb_py_target *t, PyObject *exc, int raised);
/* Takes the pending exception, fills `err` with "<what> raised <Type>:
 * <text>" (HCB_ECALLBACK) and hands the exception to the hook; returns the
 * hook's formatted traceback as hcb_py_hand_to_hook does. */
PyObject *hcb_py_report_exception(hcb_py_target *t, const char *what,
                                  hcb_error *err);
/* Like hcb_py_report_exception, and appends as much of the traceback to
 * the message as fits (keeping its end, the raising frame); returns
 * HCB_ECALLBACK. */
int hcb_py_raised(hcb_py_target *t, const char *what, hcb_error *err);
PyType_Spec *hcb_py_owner_spec(void);
/* Views each array of the sequence `seq` (PySequence_Fast; at most `cap`)
 * as an hcb_array, made C-contiguous (references kept in `keep`, which the
 * caller releases, also on error); `writable` asks for arrays written in
 * place (then call hcb_py_views_done after the writes).  Sub-byte arrays
 * are viewed through a packed copy.  Returns the count, or -1 with an
 * exception set. */
Py_ssize_t hcb_py_views_of(hcb_state *st, PyObject *seq, hcb_array *views,
                           PyObject **keep, Py_ssize_t cap, int writable);
/* After a call that wrote into writable views of hcb_py_views_of: copies
 * what was written to packed (sub-byte) views back into their arrays. */
void hcb_py_views_done(const hcb_array *views, PyObject **keep, Py_ssize_t n);
/* Whether arrays of `dtype` are packed in hcb_arrays (sub-byte types) but
 * one element per byte in numpy. */
static inline bool
hcb_py_packed(hcb_dtype dtype)
{
    size_t bits = hcb_dtype_bits(dtype);

    return bits > 0 && bits < 8;
}
/* Writes a result: `data` (C order, numpy's layout, res->dtype) into
 * `res` (XLA's layout: packed for sub-byte types). */
void hcb_py_store(const hcb_array *res, const void *data);
/* The runtime's log sink (hcb_log_fn); `user` is the module state. */
void hcb_py_log(void *user, const char *message);

/* targets.c: Python targets and their life. */
/* A new Python target of `size` bytes (which starts with an hcb_py_target)
 * for `site` (a new reference is kept), or NULL with an exception set. */
void *hcb_py_target_new(PyObject *module, PyObject *site, hcb_py_kind kind,
                        const char *name, Py_ssize_t name_len, size_t size);
/* Frees a target that never got registered. */
void hcb_py_target_free(hcb_py_target *t);
/* Registers `t` as a tap target run by `fn`; the runtime's code, the id in
 * *id. */
int hcb_py_register_tap_target(hcb_py_target *t, hcb_tap_fn fn, uint64_t *id,
                               hcb_error *err);
/* After registering `t` with result `rc`: its id, entered in the module's
 * table of targets, or (after freeing it) the error raised. */
PyObject *hcb_py_target_registered(hcb_py_target *t, int rc, uint64_t id,
                                   const hcb_error *err);
/* The module functions (their contracts are beside them in targets.c). */
PyObject *hcb_py_release(PyObject *module, PyObject *arg);
PyObject *hcb_py_register_tap(PyObject *module, PyObject *args,
                              PyObject *kwargs);
PyObject *hcb_py_register_call(PyObject *module, PyObject *args,
                               PyObject *kwargs);
PyObject *hcb_py_register_buffer_callback(PyObject *module, PyObject *args,
                                          PyObject *kwargs);
PyObject *hcb_py_register_native_tap(PyObject *module, PyObject *args);
PyObject *hcb_py_register_native_call(PyObject *module, PyObject *args);

/* tap.c */
/* Fills t->tap from the TapSite `site` (with the GIL, at registration); -1
 * with an exception. */
int hcb_py_tap_site_read(hcb_py_target *t, PyObject *site);
int hcb_py_tap(void *user, hcb_record *rec, hcb_error *err);
/* True while this thread runs a Python tap function. */
int hcb_py_in_tap(void);

/* buffer.c */
int hcb_py_buffer_call(void *user, hcb_device device, const hcb_array *args,
                       size_t nargs, const hcb_array *results, size_t nresults,
                       hcb_error *err);
PyType_Spec *hcb_py_buffer_spec(void);
/* Fills the fields of `t` from the BufferSite `site`; -1 with an
 * exception. */
int hcb_py_buffer_site_read(hcb_py_buffer_target *t, PyObject *site);

/* entry.c: taps and calls entering the runtime from Python (jit over
 * sharded operands); `args` as the module functions receive them. */
PyObject *hcb_py_submit_tap(hcb_state *st, PyObject *args);
PyObject *hcb_py_run_call(hcb_state *st, PyObject *args);

/* print.c: id_print's target, which formats records without the GIL and
 * takes it only to write; and the functions behind host_callback._print. */
int hcb_py_print(void *user, hcb_record *rec, hcb_error *err);
/* Has every wait of a device's thread notice Ctrl-C (interrupt.c): sets
 * the runtime's interrupt check; configure calls it. */
void hcb_py_interrupt_install(hcb_state *st);
/* Clears the interrupt check (the module is being cleared). */
void hcb_py_interrupt_uninstall(hcb_state *st);

/* Makes the print lock new in the child of a fork (once per process). */
void hcb_py_print_install_fork_handler(void);
/* register_print(*, site, name, ...): id_print's target, or None (the
 * contract is beside it). */
PyObject *hcb_py_register_print(PyObject *module, PyObject *args,
                                PyObject *kwargs);
/* format_value(nodes, arrays, options[, text_of]) -> str */
PyObject *hcb_py_format_value(hcb_state *st, PyObject *args);
/* print_write(stream, texts): writes each text and a newline, under the
 * lock that keeps the records of several devices apart. */
PyObject *hcb_py_print_write(hcb_state *st, PyObject *args);

/* lifetime.c: holds of live executables on Python targets. */
/* Enters a registered target in the table by id; -1 when out of memory. */
int hcb_py_lifetime_add(hcb_py_target *t, uint64_t id);
/* The INSTANTIATE stage of hcb_tap, hcb_call and hcb_sharded_check. */
struct XLA_FFI_Error;
struct XLA_FFI_CallFrame;
struct XLA_FFI_Error *hcb_py_ffi_instantiate(struct XLA_FFI_CallFrame *frame);
/* {"type_id": capsule, "type_info": capsule} for jax.ffi.register_ffi_type */
PyObject *hcb_py_hold_type(void);
/* holds(id) -> int (-1 for no Python target) */
PyObject *hcb_py_holds(PyObject *arg);
/* wait_unused(timeout_s): returns when a hold count dropped to zero (or
 * notify_unused was called) since the previous call, or after timeout_s;
 * without the GIL.  One caller. */
PyObject *hcb_py_wait_unused(PyObject *arg);
PyObject *hcb_py_notify_unused(void);
/* Once per process: re-creates the table's lock in a forked child. */
void hcb_py_lifetime_init(void);

/* module.c's state of the module `module`. */
static inline hcb_state *
hcb_py_state(PyObject *module)
{
    return (hcb_state *)PyModule_GetState(module);
}

/* control.c, handlers.c: module functions by concern, which module.c adds
 * to the module (NULL-terminated). */
extern PyMethodDef hcb_py_control_methods[];
extern PyMethodDef hcb_py_handler_methods[];

/* call.c */
/* Every message of a call starts with the API the user called (the
 * target's `api`) and the function's name; a drop-in's messages of a wrong
 * result start with JAX's words before that (call_result.c). */
#define HCB_PY_CALL_PREFIX "%s: callback '%s' "
/* Marks this thread as running a call or buffer_callback function, inside
 * the computation that waits for it (nested calls count). */
void hcb_py_enter_call(void);
void hcb_py_leave_call(void);
/* True while this thread runs a Python call or buffer_callback function. */
int hcb_py_in_call(void);
/* Fills the fields of `t` from the CallSite `site`; -1 with an
 * exception. */
int hcb_py_call_site_read(hcb_py_call_target *t, PyObject *site);
/* The call target of every Python call site (hcb_call_fn): with the GIL,
 * calls the site's function and writes its checked result. */
int hcb_py_call(void *user, hcb_device device, const hcb_array *args,
                size_t nargs, const hcb_array *results, size_t nresults,
                hcb_error *err);

/* call_result.c */
/* Checks the call function's `result` against `t`'s declaration and
 * copies it into XLA's `results`; on failure fills `err` and hands the
 * error to the Python error hook (log, barrier_wait).  With the GIL. */
int hcb_py_call_result(hcb_py_call_target *t, PyObject *result,
                       const hcb_array *results, size_t nresults,
                       hcb_error *err);
/* The call function raised (the exception is set): fills `err` with it
 * and its traceback, and hands it to the hook.  With the GIL. */
int hcb_py_call_raised(hcb_py_call_target *t, hcb_error *err);
/* check_results(*, site, name, result) -> list of numpy arrays: checks a
 * call function's `result` against the CallSite's declaration with the
 * rules and messages of compiled calls (inline mode), raising the error. */
/* set_byte_order_refused(flag): whether the drop-ins refuse a result in
 * the other byte order in JAX 0.10's words (true, the default) or report
 * its dtype as JAX 0.9 does. */
PyObject *hcb_py_set_byte_order_refused(PyObject *module, PyObject *flag);
PyObject *hcb_py_check_results(PyObject *module, PyObject *args,
                               PyObject *kwargs);

#endif /* HCB_PY_H */
