/*
 * print.c - id_print: each record formatted by libhcb's printer (src/print/)
 * on the device's consumer thread, without the GIL; the GIL is taken only
 * to write the finished text to the Python stream.
 *
 * The registration (register_print, below) gives the target what stays
 * fixed for a tap site: the layout of the value as hcb_print_nodes (built
 * from the treedef by host_callback/_print.py), the "k: v" line (kwargs,
 * transforms) split around the device's name, the names of the devices,
 * numpy's print options taken when the function was traced, and the stream.
 * Whether the C printer prints the value is decided there, once, by libhcb
 * (hcb_print_supports on each leaf's dtype): when it does not (the float8
 * types), register_print registers nothing and host_callback/_print.py
 * registers the site as a Python tap, whose Printer formats with numpy.  A
 * record of this target is therefore always one the C printer prints.
 *
 * A target registered with `log` (debug.log) writes nothing: each record is
 * one call log(text, device), the text without its newline, the device the
 * record's jax.Device; it makes and handles the logging record.
 *
 * A stream whose write fails (a closed pipe, a closed file) is broken for
 * good: the first failure is reported like a failed tap (logged once,
 * raised by barrier_wait) and that id_print writes nothing more, rather
 * than logging one error per record.  The Printer's `broken` attribute
 * tells its Python path (host_callback/_print.py) the same.
 *
 * One process-wide lock keeps the lines of one record together when
 * several devices print at once.  It is always taken before the GIL, never
 * while holding it, so the two cannot deadlock.
 */
#include <pthread.h>
#include <string.h>

#include "hcbpy.h"

/* ---- the print lock --------------------------------------------------------
 */

static pthread_mutex_t print_mutex = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int print_mutex_held; /* a stream that prints */

static int
print_lock(void)
{
    if (print_mutex_held)
        return 0;
    pthread_mutex_lock(&print_mutex);
    print_mutex_held = 1;
    return 1;
}

/* In the child of a fork the print lock is made new: a parent thread that
 * held it is not in the child.  It is not taken before the fork: its
 * holder may wait for the GIL, which the forking thread holds. */
static void
print_after_fork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;

    print_mutex = fresh;
    print_mutex_held = 0;
}

static pthread_once_t print_fork_once = PTHREAD_ONCE_INIT;

static void
print_fork_install(void)
{
    (void)pthread_atfork(NULL, NULL, print_after_fork_child);
}

void
hcb_py_print_install_fork_handler(void)
{
    pthread_once(&print_fork_once, print_fork_install);
}

static void
print_unlock(int taken)
{
    if (!taken)
        return;
    print_mutex_held = 0;
    pthread_mutex_unlock(&print_mutex);
}

/* With the GIL: stream.write(text), stream NULL meaning sys.stdout (where
 * print() writes, so that pytest's capsys and notebooks see it). */
static int
write_text(hcb_state *st, PyObject *stream, PyObject *text)
{
    PyObject *r;

    if (stream == NULL) {
        stream = PySys_GetObject("stdout"); /* borrowed */
        if (stream == NULL || stream == Py_None)
            return 0; /* print() writes nothing either */
    }
    r = PyObject_CallMethodOneArg(stream, st->str_write, text);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* ---- arguments from Python -------------------------------------------------
 */

/* `s` (a str) as UTF-8 bytes, lone surrogates passed through as their
 * three bytes ("surrogatepass", undone when the text is decoded back): a
 * new reference, or NULL with a TypeError naming `what`.  Any str goes
 * through whole, NUL characters included. */
static PyObject *
utf8_of(PyObject *s, const char *what)
{
    PyObject *b;

    if (!PyUnicode_Check(s)) {
        PyErr_Format(PyExc_TypeError, "%s must be a str, got %R", what, s);
        return NULL;
    }
    b = PyUnicode_AsEncodedString(s, "utf-8", "surrogatepass");
    if (b == NULL && PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s is not encodable text: %R", what, s);
    }
    return b;
}

/* Copies `s` (a str, as utf8_of) to *pos and advances it; *out and *len
 * get the copy (followed by a NUL, not counted). */
static int
copy_str(PyObject *s, const char *what, char **pos, const char **out,
         size_t *len)
{
    PyObject *b = utf8_of(s, what);
    Py_ssize_t n;

    if (b == NULL)
        return -1;
    n = PyBytes_GET_SIZE(b);
    memcpy(*pos, PyBytes_AS_STRING(b), (size_t)n + 1);
    Py_DECREF(b);
    *out = *pos;
    *len = (size_t)n;
    *pos += n + 1;
    return 0;
}

/* The bytes copy_str needs for `s` (None: none), or -1 with an exception. */
static Py_ssize_t
str_size(PyObject *s, const char *what)
{
    PyObject *b;
    Py_ssize_t n;

    if (s == Py_None)
        return 0;
    b = utf8_of(s, what);
    if (b == NULL)
        return -1;
    n = PyBytes_GET_SIZE(b);
    Py_DECREF(b);
    return n + 1;
}

/* With the GIL: UTF-8 text as a str, surrogates as utf8_of passed them. */
static PyObject *
str_of(const char *text, size_t len)
{
    return PyUnicode_DecodeUTF8(text, (Py_ssize_t)len, "surrogatepass");
}

/* The fields of a host_callback._print.PrintNode. */
enum { NODE_KIND, NODE_CHILDREN, NODE_KEY, NODE_TEXT, NODE_FIELDS };
static const char *const node_fields[NODE_FIELDS] = {"kind", "children", "key",
                                                     "text"};

/* Nodes from a sequence of PrintNodes: the array holds `extra` more bytes
 * of strings after the nodes, and *pos points past the nodes' own
 * strings.  The fields are read once, then sized, then copied. */
static hcb_print_node *
parse_nodes(PyObject *seq, size_t *nnodes, Py_ssize_t extra, char **pos)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), i, bytes = extra;
    PyObject *(*f)[NODE_FIELDS];
    hcb_print_node *nodes = NULL;

    f = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof *f);
    if (f == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (i = 0; i < n; i++) {
        Py_ssize_t k, t;

        if (hcb_py_fields(PySequence_Fast_GET_ITEM(seq, i), "PrintNode",
                          node_fields, f[i], NODE_FIELDS) < 0 ||
            (k = str_size(f[i][NODE_KEY], "a print node's key")) < 0 ||
            (t = str_size(f[i][NODE_TEXT], "a print node's text")) < 0)
            goto fail;
        bytes += k + t;
    }
    nodes = PyMem_RawCalloc(1, (size_t)n * sizeof *nodes + (size_t)bytes + 1);
    if (nodes == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    *pos = (char *)(nodes + n);
    for (i = 0; i < n; i++) {
        PyObject *key = f[i][NODE_KEY], *text = f[i][NODE_TEXT];
        long kind = PyLong_AsLong(f[i][NODE_KIND]);
        long count = PyLong_AsLong(f[i][NODE_CHILDREN]);

        if ((kind == -1 || count == -1) && PyErr_Occurred())
            goto fail;
        nodes[i].kind = (hcb_print_kind)kind;
        nodes[i].count = (int32_t)count;
        if ((key != Py_None &&
             copy_str(key, "a print node's key", pos, &nodes[i].key,
                      &nodes[i].key_len) < 0) ||
            (text != Py_None &&
             copy_str(text, "a print node's text", pos, &nodes[i].text,
                      &nodes[i].text_len) < 0))
            goto fail;
    }
    PyMem_Free(f);
    *nnodes = (size_t)n;
    return nodes;
fail:
    PyMem_Free(f);
    PyMem_RawFree(nodes);
    return NULL;
}

/* numpy's print options as host_callback/_print.py passes them: a
 * PrintOptions, its fields read by name and converted in this order. */
static int
parse_options(PyObject *options, hcb_print_options *o)
{
    static const hcb_print_options init = HCB_PRINT_OPTIONS_INIT;
    static const char *const names[] = {"threshold", "edgeitems", "linewidth",
                                        "precision", "floatmode", "sign",
                                        "suppress",  "nanstr",    "infstr"};
    enum { N = sizeof names / sizeof names[0] };
    PyObject *f[N], *t;
    long long threshold;
    int edge, width, precision, mode, suppress, ok;
    const char *sign, *nan, *inf;
    Py_ssize_t sign_len, nan_len, inf_len;

    if (hcb_py_fields(options, "PrintOptions", names, f, N) < 0 ||
        (t = PyTuple_Pack(N, f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7],
                          f[8])) == NULL)
        return -1;
    ok = PyArg_ParseTuple(t, "Liiiis#ps#s#:print options", &threshold, &edge,
                          &width, &precision, &mode, &sign, &sign_len,
                          &suppress, &nan, &nan_len, &inf, &inf_len);
    Py_DECREF(t);
    if (!ok)
        return -1;
    if (sign_len != 1 || nan_len >= (Py_ssize_t)sizeof o->nanstr ||
        inf_len >= (Py_ssize_t)sizeof o->infstr) {
        PyErr_SetString(PyExc_ValueError,
                        "print options: sign is one character, nanstr and "
                        "infstr at most 15 bytes");
        return -1;
    }
    *o = init;
    o->threshold = threshold;
    o->edgeitems = edge;
    o->linewidth = width;
    o->precision = precision;
    o->floatmode = (hcb_floatmode)mode;
    o->sign = sign[0];
    o->suppress = suppress;
    memcpy(o->nanstr, nan, (size_t)nan_len + 1);
    memcpy(o->infstr, inf, (size_t)inf_len + 1);
    return 0;
}

/* register_print's keyword arguments but the site and its name, all
 * borrowed for the call (register_print parses them, print_setup reads them).
 */
typedef struct hcb_py_print_args {
    PyObject *nodes;     /* sequence of PrintNode */
    PyObject *kv_before; /* str */
    PyObject *kv_after;  /* str */
    int with_device;
    PyObject *devices; /* dict: device key -> name */
    PyObject *options; /* a PrintOptions */
    PyObject *stream;  /* None: sys.stdout */
    PyObject *dtypes;  /* sequence of the value's leaf dtype codes */
    PyObject *log;     /* None, or log(text, device) instead of writes */
} hcb_py_print_args;

/* 1 when libhcb's printer prints every dtype code of `dtypes`, 0 when not
 * (the site is then a Python tap: register_print registers nothing), -1
 * with an exception. */
static int
print_supports_all(PyObject *dtypes)
{
    PyObject *seq = PySequence_Fast(dtypes, "dtypes must be a sequence");
    Py_ssize_t i;
    int all = 1;

    if (seq == NULL)
        return -1;
    for (i = 0; all && i < PySequence_Fast_GET_SIZE(seq); i++) {
        long code = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));

        if (code == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        all = code > 0 && code < HCB_PY_NDTYPES &&
              hcb_print_supports((hcb_dtype)code);
    }
    Py_DECREF(seq);
    return all;
}

/* Fills the print fields of `t` from register_print's arguments; -1 with
 * an exception. */
static int
print_setup(hcb_py_print_target *t, const hcb_py_print_args *a)
{
    PyObject *nodes = a->nodes, *before = a->kv_before, *after = a->kv_after;
    PyObject *devices = a->devices, *stream = a->stream, *seq, *key, *name;
    Py_ssize_t extra, n, i, nd, at;
    char *pos;

    if (parse_options(a->options, &t->opts) < 0)
        return -1;
    nd = PyDict_GET_SIZE(devices);
    if ((extra = str_size(before, "kv_before")) < 0 ||
        (n = str_size(after, "kv_after")) < 0)
        return -1;
    extra += n;
    for (at = 0; PyDict_Next(devices, &at, &key, &name);) {
        if (!PyLong_Check(key) || !PyUnicode_Check(name) ||
            (n = str_size(name, "a device name")) < 0) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError,
                            "register_print: devices maps device keys (int) "
                            "to names (str)");
            return -1;
        }
        extra += n;
    }
    seq = PySequence_Fast(nodes, "print nodes must be a sequence");
    if (seq == NULL)
        return -1;
    t->nodes = parse_nodes(seq, &t->nnodes, extra, &pos);
    Py_DECREF(seq);
    if (t->nodes == NULL)
        return -1;
    t->strings = (char *)t->nodes;
    t->dev_keys = PyMem_RawCalloc((size_t)nd + 1, sizeof *t->dev_keys);
    t->dev_names = PyMem_RawCalloc((size_t)nd + 1, sizeof *t->dev_names);
    t->dev_name_lens =
        PyMem_RawCalloc((size_t)nd + 1, sizeof *t->dev_name_lens);
    if (t->dev_keys == NULL || t->dev_names == NULL ||
        t->dev_name_lens == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (copy_str(before, "kv_before", &pos, &t->kv_before, &t->kv_before_len) <
            0 ||
        copy_str(after, "kv_after", &pos, &t->kv_after, &t->kv_after_len) < 0)
        return -1;
    for (i = 0, at = 0; i < nd && PyDict_Next(devices, &at, &key, &name); i++) {
        long long k = PyLong_AsLongLong(key);

        if (k == -1 && PyErr_Occurred())
            return -1;
        t->dev_keys[i] = (hcb_device)k;
        if (copy_str(name, "a device name", &pos, &t->dev_names[i],
                     &t->dev_name_lens[i]) < 0)
            return -1;
    }
    t->ndevices = (size_t)nd;
    t->with_device = a->with_device;
    if (stream != Py_None) {
        Py_INCREF(stream);
        t->stream = stream;
    }
    if (a->log != Py_None) {
        if (!PyCallable_Check(a->log)) {
            PyErr_SetString(PyExc_TypeError,
                            "register_print: log must be None or callable");
            return -1;
        }
        Py_INCREF(a->log);
        t->log = a->log;
    }
    return 0;
}

static void
print_clear(hcb_py_print_target *t)
{
    PyMem_RawFree(t->nodes);
    PyMem_RawFree(t->dev_keys);
    PyMem_RawFree(t->dev_names);
    PyMem_RawFree(t->dev_name_lens);
    Py_CLEAR(t->stream);
    Py_CLEAR(t->log);
    t->nodes = NULL;
    t->dev_keys = NULL;
    t->dev_names = NULL;
    t->dev_name_lens = NULL;
}

/* register_print(*, site, name, nodes, kv_before, kv_after, with_device,
 * devices, options, stream, dtypes, log) -> int | None: id_print's target
 * for a TapSite whose func is a host_callback._print.Printer (see print.c),
 * or debug.print's and debug.log's (`log`), or None, with nothing
 * registered, when libhcb's printer does not print one of `dtypes` (the
 * codes of the value's leaves). */
PyObject *
hcb_py_register_print(PyObject *module, PyObject *args, PyObject *kwargs)
{
    /* Python before 3.13 takes char **: the cast keeps -Wwrite-strings. */
    static const char *keywords[] = {
        "site",    "name",    "nodes",  "kv_before", "kv_after", "with_device",
        "devices", "options", "stream", "dtypes",    "log",      NULL};
    hcb_py_print_target *t;
    hcb_py_print_args a;
    PyObject *site;
    const char *name;
    Py_ssize_t name_len;
    uint64_t id = 0;
    hcb_error err;
    int rc;

    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "$O!s#OUUpO!OOOO:register_print", (char **)keywords,
            &PyTuple_Type, &site, &name, &name_len, &a.nodes, &a.kv_before,
            &a.kv_after, &a.with_device, &PyDict_Type, &a.devices, &a.options,
            &a.stream, &a.dtypes, &a.log))
        return NULL;
    rc = print_supports_all(a.dtypes);
    if (rc < 0)
        return NULL;
    if (rc == 0)
        Py_RETURN_NONE;
    t = hcb_py_target_new(module, site, HCB_PY_PRINT, name, name_len,
                          sizeof *t);
    if (t == NULL)
        return NULL;
    if (hcb_py_tap_site_read(&t->base, site) < 0 || print_setup(t, &a) < 0) {
        print_clear(t);
        hcb_py_target_free(&t->base);
        return NULL;
    }
    rc = hcb_py_register_tap_target(&t->base, hcb_py_print, &id, &err);
    if (rc != HCB_OK)
        print_clear(t);
    return hcb_py_target_registered(&t->base, rc, id, &err);
}

/* ---- the tap ----------------------------------------------------------------
 */

/* With the exception of a failed write pending: marks the Printer
 * `printer` broken (for its Python path too) and replaces the exception by
 * one that says so, caused by it. */
static void
mark_printer_broken(PyObject *printer)
{
    PyObject *cause = hcb_py_fetch_exception(), *type, *value, *tb;

    if (PyObject_SetAttrString(printer, "broken", Py_True) < 0)
        PyErr_Clear();
    PyErr_Format(PyExc_RuntimeError,
                 "id_print's write failed: its stream is broken, this "
                 "id_print writes nothing more (%s: %S)",
                 cause != NULL ? Py_TYPE(cause)->tp_name : "?",
                 cause != NULL ? cause : Py_None);
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value != NULL && cause != NULL)
        PyException_SetCause(value, cause); /* steals cause */
    else
        Py_XDECREF(cause);
    PyErr_Restore(type, value, tb);
}

#define STACK_TEXT 8192

/* The text of a value, in `stack` (STACK_TEXT bytes) or, when longer, in a
 * new allocation (*heap, freed by the caller); either has room for one more
 * byte after the text. */
static int
format_text(const hcb_print_node *nodes, size_t nnodes, const hcb_array *arrays,
            size_t narrays, const hcb_print_options *opts, char *stack,
            char **heap, char **text, size_t *len, hcb_error *err)
{
    int rc = hcb_format_value(nodes, nnodes, arrays, narrays, opts, stack,
                              STACK_TEXT - 1, len, err);

    *text = stack;
    if (rc == HCB_OK && *len >= STACK_TEXT - 1) {
        *heap = malloc(*len + 2);
        if (*heap == NULL)
            return hcb_error_set(err, HCB_ENOMEM,
                                 "id_print: out of memory for %zu bytes",
                                 *len + 2);
        rc = hcb_format_value(nodes, nnodes, arrays, narrays, opts, *heap,
                              *len + 1, len, err);
        *text = *heap;
    }
    return rc;
}

/* With the GIL: the "k: v" line of a record, with its newline; NULL with
 * no exception when there is none.  Its parts are any text (NUL included):
 * joined as bytes, then decoded. */
static PyObject *
kv_line(const hcb_py_print_target *t, hcb_device device)
{
    const char *name = "?";
    size_t name_len = 1, i, n;
    char stack[512], *buf = stack;
    PyObject *line;

    if (!t->with_device && t->kv_before_len == 0)
        return NULL;
    if (t->with_device) {
        for (i = 0; i < t->ndevices; i++)
            if (t->dev_keys[i] == device) {
                name = t->dev_names[i];
                name_len = t->dev_name_lens[i];
            }
    } else {
        name_len = 0;
    }
    n = t->kv_before_len + name_len + (t->with_device ? t->kv_after_len : 0) +
        1;
    if (n > sizeof stack && (buf = PyMem_Malloc(n)) == NULL)
        return PyErr_NoMemory();
    memcpy(buf, t->kv_before, t->kv_before_len);
    if (t->with_device) {
        memcpy(buf + t->kv_before_len, name, name_len);
        memcpy(buf + t->kv_before_len + name_len, t->kv_after, t->kv_after_len);
    }
    buf[n - 1] = '\n';
    line = str_of(buf, n);
    if (buf != stack)
        PyMem_Free(buf);
    return line;
}

/* With the GIL: one record of a `log` target, log(text, device). */
static int
log_text(hcb_py_print_target *t, hcb_record *rec, const char *text, size_t len,
         hcb_error *err)
{
    PyObject *s, *device, *r = NULL;

    s = PyUnicode_DecodeUTF8(text, (Py_ssize_t)len, "replace");
    device = s != NULL ? hcb_py_device_of(t->base.state, hcb_record_device(rec))
                       : NULL;
    if (device != NULL)
        r = PyObject_CallFunctionObjArgs(t->log, s, device, NULL);
    Py_XDECREF(device);
    Py_XDECREF(s);
    if (r == NULL) {
        Py_XDECREF(hcb_py_report_exception(&t->base, "debug.log", err));
        return HCB_ECALLBACK;
    }
    Py_DECREF(r);
    return HCB_OK;
}

int
hcb_py_print(void *user, hcb_record *rec, hcb_error *err)
{
    hcb_py_print_target *t = user;
    char stack[STACK_TEXT], *heap = NULL, *text = NULL;
    size_t len = 0;
    PyObject *s1 = NULL, *s2 = NULL;
    PyGILState_STATE gil;
    int rc, locked;

    rc = format_text(t->nodes, t->nnodes, hcb_record_args(rec),
                     hcb_record_nargs(rec), &t->opts, stack, &heap, &text, &len,
                     err);
    if (rc != HCB_OK) {
        free(heap);
        return rc;
    }
    text[len++] = '\n';

    locked = print_lock();
    if (hcb_py_gil_ensure(t->base.state, &gil) < 0) {
        print_unlock(locked);
        free(heap);
        return hcb_error_set(err, HCB_ESTATE,
                             "id_print output lost: the Python interpreter is "
                             "shutting down");
    }
    if (hcb_py_target_enter(&t->base, "tap function", err) != HCB_OK) {
        hcb_py_gil_release(gil);
        print_unlock(locked);
        free(heap);
        return err->code;
    }
    if (t->broken) {
        hcb_py_target_leave(&t->base);
        hcb_py_gil_release(gil);
        print_unlock(locked);
        free(heap);
        return HCB_OK;
    }
    if (t->log != NULL) {
        rc = log_text(t, rec, text, len - 1, err);
        hcb_py_target_leave(&t->base);
        hcb_py_gil_release(gil);
        print_unlock(locked);
        free(heap);
        return rc;
    }
    s1 = kv_line(t, hcb_record_device(rec));
    s2 = str_of(text, len);
    if (PyErr_Occurred() || s2 == NULL) {
        Py_XDECREF(hcb_py_report_exception(&t->base, "id_print", err));
        rc = HCB_ECALLBACK;
    } else if ((s1 != NULL && write_text(t->base.state, t->stream, s1) < 0) ||
               write_text(t->base.state, t->stream, s2) < 0) {
        t->broken = 1;
        mark_printer_broken(t->base.tap.func);
        Py_XDECREF(hcb_py_report_exception(&t->base, "id_print", err));
        rc = HCB_ECALLBACK;
    }
    Py_XDECREF(s1);
    Py_XDECREF(s2);
    hcb_py_target_leave(&t->base);
    hcb_py_gil_release(gil);
    print_unlock(locked);
    free(heap);
    return rc;
}

/* ---- module functions ------------------------------------------------------
 */

/* With text_of given: each array node whose array libhcb's printer does not
 * print (hcb_print_supports) becomes a text node with text_of(array), and
 * its view leaves `views`; returns the count of views left, or -1 with an
 * exception.  The texts are kept alive in `texts`. */
static Py_ssize_t
texts_for_unprinted(hcb_print_node *nodes, size_t nnodes, PyObject *aseq,
                    hcb_array *views, Py_ssize_t n, PyObject *text_of,
                    PyObject *texts)
{
    Py_ssize_t k = 0, kept = 0;
    size_t i;

    for (i = 0; i < nnodes && k < n; i++) {
        PyObject *text, *bytes;

        if (nodes[i].kind != HCB_PRINT_ARRAY &&
            nodes[i].kind != HCB_PRINT_STR && nodes[i].kind != HCB_PRINT_FIELD)
            continue;
        if (hcb_print_supports(views[k].dtype)) {
            views[kept++] = views[k++];
            continue;
        }
        text = PyObject_CallOneArg(text_of, PySequence_Fast_GET_ITEM(aseq, k));
        bytes = text != NULL ? utf8_of(text, "numpy's text of an array") : NULL;
        Py_XDECREF(text);
        if (bytes == NULL || PyList_Append(texts, bytes) < 0) {
            Py_XDECREF(bytes);
            return -1;
        }
        Py_DECREF(bytes); /* alive in texts */
        nodes[i].kind = HCB_PRINT_TEXT;
        nodes[i].text = PyBytes_AS_STRING(bytes);
        nodes[i].text_len = (size_t)PyBytes_GET_SIZE(bytes);
        k++;
    }
    while (k < n) /* more arrays than nodes: hcb_format_value says so */
        views[kept++] = views[k++];
    return kept;
}

PyObject *
hcb_py_format_value(hcb_state *st, PyObject *args)
{
    PyObject *nodes_obj, *arrays_obj, *options, *nseq = NULL, *aseq = NULL;
    PyObject **keep = NULL, *result = NULL, *text_of = Py_None, *texts = NULL;
    hcb_print_node *nodes = NULL;
    hcb_array *views = NULL;
    hcb_print_options opts;
    size_t nnodes = 0, len = 0;
    Py_ssize_t n = 0, nviews, i;
    char stack[STACK_TEXT], *pos, *heap = NULL, *text = NULL;
    hcb_error err;
    int rc;

    if (!PyArg_ParseTuple(args, "OOO|O:format_value", &nodes_obj, &arrays_obj,
                          &options, &text_of) ||
        parse_options(options, &opts) < 0)
        return NULL;
    nseq = PySequence_Fast(nodes_obj, "print nodes must be a sequence");
    aseq = PySequence_Fast(arrays_obj, "arrays must be a sequence");
    if (nseq == NULL || aseq == NULL)
        goto done;
    nodes = parse_nodes(nseq, &nnodes, 0, &pos);
    n = PySequence_Fast_GET_SIZE(aseq);
    views = PyMem_Calloc((size_t)n + 1, sizeof *views);
    keep = PyMem_Calloc((size_t)n + 1, sizeof *keep);
    if (nodes == NULL || views == NULL || keep == NULL) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto done;
    }
    if (hcb_py_views_of(st, aseq, views, keep, n, 0) < 0)
        goto done;
    nviews = n;
    if (text_of != Py_None) {
        texts = PyList_New(0);
        if (texts == NULL)
            goto done;
        nviews =
            texts_for_unprinted(nodes, nnodes, aseq, views, n, text_of, texts);
        if (nviews < 0)
            goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    rc = format_text(nodes, nnodes, views, (size_t)nviews, &opts, stack, &heap,
                     &text, &len, &err);
    Py_END_ALLOW_THREADS;
    if (rc != HCB_OK)
        hcb_py_raise(&err);
    else
        result = str_of(text, len);
done:
    for (i = 0; keep != NULL && i < n; i++)
        Py_XDECREF(keep[i]);
    free(heap);
    PyMem_Free(keep);
    PyMem_Free(views);
    PyMem_RawFree(nodes);
    Py_XDECREF(texts);
    Py_XDECREF(nseq);
    Py_XDECREF(aseq);
    return result;
}

PyObject *
hcb_py_print_write(hcb_state *st, PyObject *args)
{
    PyObject *stream, *texts;
    Py_ssize_t i;
    int locked, ok = 1;

    if (!PyArg_ParseTuple(args, "OO!:print_write", &stream, &PyTuple_Type,
                          &texts))
        return NULL;
    Py_BEGIN_ALLOW_THREADS;
    locked = print_lock();
    Py_END_ALLOW_THREADS;
    for (i = 0; ok && i < PyTuple_GET_SIZE(texts); i++)
        ok = write_text(st, stream == Py_None ? NULL : stream,
                        PyTuple_GET_ITEM(texts, i)) == 0;
    print_unlock(locked);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}
