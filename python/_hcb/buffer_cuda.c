/*
 * buffer_cuda.c - a GPU Buffer of buffer_callback (its device is a CUDA
 * one: HCB_DEVICE_PLATFORM is HCB_PLATFORM_CUDA): what it offers GPU
 * libraries (CuPy, PyTorch, Numba, ...) in place of host access, and the
 * ordering of their streams with XLA's.
 *
 * A GPU Buffer points at device memory, so every host access (the buffer
 * protocol, __array__) raises and says what to use instead.  The callback
 * runs while XLA's thread enqueues work, not after the stream reached this
 * point: its inputs may still be being computed, and its results are read
 * by kernels enqueued after it returns.  So work on a Buffer must be
 * ordered after XLA's stream at this point, and XLA's later work after it:
 *
 *   - work enqueued on XLA's stream itself (ExecutionContext.stream,
 *     `with cupy.cuda.ExternalStream(ctx.stream)`) is, and costs nothing;
 *   - __dlpack__(stream=s), by the DLPack rules: s is the consumer's stream
 *     (None or 1: CUDA's legacy default stream; 2: the per-thread default
 *     stream; above 2: a cudaStream_t; -1: the consumer orders it itself;
 *     0 is refused as ambiguous).  The consumer's stream is made to wait
 *     for XLA's with an event (hcb_cuda_stream_wait: no host wait).  When
 *     the callback returns, XLA's stream waits in the same way for the
 *     default streams (1, 2) it was exported to, so that results written
 *     there are complete before XLA reads them (hcb_py_call_streams_join).
 *     Not for a stream above 2: the standard leaves the stream the
 *     consumer's ("the ownership of the stream stays with the consumer"),
 *     for the producer to use during __dlpack__ only, and by the time the
 *     callback returns it may be gone (a `cupy.cuda.Stream()` local to the
 *     callback is destroyed with it; recording an event there would use a
 *     freed handle).  The default streams live as long as the device's
 *     context (the per-thread one, as long as its thread: the join runs
 *     on the callback's thread, so stream=2 from another thread is
 *     refused).  A callback that writes results on a stream of its own
 *     orders that work itself before it returns (synchronises the stream,
 *     or makes ctx.stream wait for it), as with JAX's Buffer, which orders
 *     no stream at all;
 *   - __cuda_array_interface__ (version 3) names XLA's stream in "stream",
 *     as the interface asks of a producer whose data is not yet ready: a
 *     consumer (CuPy, Numba) then synchronises with it (by default on the
 *     host, cudaStreamSynchronize) before it reads.  The interface cannot
 *     tell the producer the consumer's stream; CuPy and Numba work on
 *     CUDA's legacy default stream unless told otherwise, so once a
 *     Buffer's interface has been read, XLA's stream waits for that stream
 *     when the callback returns.  Results written through the interface on
 *     any other stream are not ordered before XLA's readers: write them on
 *     ctx.stream, or through __dlpack__.
 *
 * The default streams named 1 and 2 are those of the Buffer's device (the
 * device a DLPack consumer asks __dlpack_device__ for and passes a stream
 * of), whatever device the callback has made current: every event call is
 * made on the call's device (hcb_cuda_stream_wait switches to it and
 * back).
 *
 * Sub-byte types (int4, ...) are refused on GPU (buffer.c): their staging
 * unpacks on the host.  Outside a call (a Buffer made by _test_view)
 * there is no XLA stream: the arguments are checked, nothing is ordered.
 */
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL hcb_ARRAY_API
#define NPY_NO_DEPRECATED_API  NPY_2_0_API_VERSION
#define NPY_TARGET_VERSION     NPY_2_0_API_VERSION
#include "hcbpy.h"
#include "hcb/ffi.h"

#include <numpy/arrayobject.h>

#include "buffer.h"

/* The DLPack numbers of CUDA's default streams, which CUDA also takes as
 * stream handles (cudaStreamLegacy, cudaStreamPerThread). */
#define LEGACY_DEFAULT_STREAM     1
#define PER_THREAD_DEFAULT_STREAM 2

PyObject *
hcb_py_buffer_refuse_host(const hcb_py_buffer *b, PyObject *exc,
                          const char *what)
{
    PyErr_Format(exc,
                 "%s: this Buffer is in GPU memory (CUDA device %d), which "
                 "the host cannot read or write.  Use it on the GPU: "
                 "cupy.asarray(buf) (__cuda_array_interface__) or "
                 "cupy.from_dlpack(buf) inside `with "
                 "cupy.cuda.ExternalStream(ctx.stream):`, and enqueue the "
                 "work on ctx.stream (XLA's stream)",
                 what, (int)HCB_DEVICE_ORDINAL(b->device));
    return NULL;
}

/* Notes that XLA's stream waits for `consumer` when the callback returns,
 * if it is a default stream (the file's comment says why only those). */
static void
remember(hcb_py_call_streams *streams, void *consumer)
{
    if (consumer == (void *)(uintptr_t)LEGACY_DEFAULT_STREAM)
        streams->join_legacy = true;
    else if (consumer == (void *)(uintptr_t)PER_THREAD_DEFAULT_STREAM)
        streams->join_per_thread = true;
}

/* XLA's stream of the Buffer's call, or NULL (none: outside a call). */
static void *
xla_stream_of(const hcb_py_buffer *b)
{
    return b->streams != NULL ? b->streams->xla : NULL;
}

/* __cuda_array_interface__ (version 3) of a CUDA Buffer: shape, typestr,
 * data = (pointer, read-only), strides None (C order), and stream: XLA's
 * stream during the call, None outside one; during the call XLA's stream
 * will wait for the legacy default stream (the file's comment says why).
 * An AttributeError for a CPU Buffer, so that hasattr() tells a GPU buffer
 * from a host one. */
PyObject *
hcb_py_buffer_cuda_interface(PyObject *self, void *closure)
{
    hcb_py_buffer *b = (hcb_py_buffer *)self;
    PyObject *shape, *typestr, *stream, *r = NULL;
    void *xla = xla_stream_of(b);

    (void)closure;
    if (!hcb_py_buffer_on_cuda(b)) {
        PyErr_SetString(PyExc_AttributeError,
                        "__cuda_array_interface__: this Buffer is in host "
                        "(CPU) memory; use numpy.asarray or __dlpack__");
        return NULL;
    }
    if (hcb_py_buffer_check_valid(b) < 0)
        return NULL;
    if (xla != NULL)
        remember(b->streams, (void *)(uintptr_t)LEGACY_DEFAULT_STREAM);
    shape = hcb_py_buffer_shape(self, NULL);
    typestr = PyObject_GetAttrString((PyObject *)b->descr, "str");
    stream = xla != NULL ? PyLong_FromVoidPtr(xla) : Py_NewRef(Py_None);
    if (shape != NULL && typestr != NULL && stream != NULL)
        r = Py_BuildValue("{sOsOs(NO)sOsOsi}", "shape", shape, "typestr",
                          typestr, "data",
                          PyLong_FromVoidPtr(b->nbytes > 0 ? b->data : NULL),
                          b->readonly ? Py_True : Py_False, "strides", Py_None,
                          "stream", stream, "version", 3);
    Py_XDECREF(shape);
    Py_XDECREF(typestr);
    Py_XDECREF(stream);
    return r;
}

/* The consumer's stream named by a DLPack `stream` argument: 0 (and -1 in
 * *none) when the consumer asks for no ordering, else the handle.  -1 with
 * an exception for what the standard does not allow. */
static int
consumer_stream(PyObject *stream, void **out)
{
    long long s;

    *out = NULL;
    if (stream == Py_None) { /* the standard's default */
        *out = (void *)(uintptr_t)LEGACY_DEFAULT_STREAM;
        return 0;
    }
    if (!PyLong_Check(stream)) {
        PyErr_Format(PyExc_TypeError,
                     "__dlpack__: stream must be None or an int, got %R",
                     stream);
        return -1;
    }
    s = PyLong_AsLongLong(stream);
    if (s == -1 && PyErr_Occurred())
        return -1;
    if (s == -1)
        return 0; /* the consumer orders it itself */
    if (s == 0) {
        PyErr_SetString(PyExc_BufferError,
                        "__dlpack__(stream=0): 0 is not a CUDA stream under "
                        "DLPack (it could mean the legacy default stream, 1, "
                        "or the per-thread one, 2): pass 1, 2, a "
                        "cudaStream_t, or -1 for no ordering");
        return -1;
    }
    if (s < -1) {
        PyErr_Format(PyExc_BufferError,
                     "__dlpack__(stream=%lld): a CUDA stream is -1, 1, 2 or "
                     "a cudaStream_t",
                     s);
        return -1;
    }
    *out = (void *)(uintptr_t)s;
    return 0;
}

int
hcb_py_buffer_dl_stream(hcb_py_buffer *b, PyObject *stream)
{
    hcb_py_call_streams *streams = b->streams;
    void *consumer;
    hcb_error err;

    if (!hcb_py_buffer_on_cuda(b))
        return 0; /* a CPU Buffer has no stream; as JAX's, any is ignored */
    if (consumer_stream(stream, &consumer) < 0)
        return -1;
    if (consumer == NULL || streams == NULL || streams->xla == NULL ||
        consumer == streams->xla)
        return 0; /* nothing to order, or already in order */
    if (consumer == (void *)(uintptr_t)PER_THREAD_DEFAULT_STREAM &&
        PyThread_get_thread_ident() != streams->thread) {
        PyErr_SetString(PyExc_BufferError,
                        "__dlpack__(stream=2) from a thread other than the "
                        "buffer_callback's: XLA's stream cannot wait for "
                        "that thread's per-thread default stream when the "
                        "callback returns; call it on the callback's "
                        "thread, use ctx.stream, or pass a stream handle "
                        "and finish the work there before the callback "
                        "returns");
        return -1;
    }
    if (hcb_cuda_stream_wait(streams->ordinal, consumer, streams->xla, &err) !=
        HCB_OK) {
        PyErr_Format(PyExc_BufferError,
                     "__dlpack__(stream=%R): cannot order the consumer's "
                     "stream after XLA's: %s",
                     stream, err.message);
        return -1;
    }
    remember(streams, consumer);
    return 0;
}

int
hcb_py_call_streams_join(hcb_py_call_streams *s, hcb_error *err)
{
    int rc = HCB_OK;

    if (s->join_legacy)
        rc = hcb_cuda_stream_wait(
            s->ordinal, s->xla, (void *)(uintptr_t)LEGACY_DEFAULT_STREAM, err);
    if (rc == HCB_OK && s->join_per_thread)
        rc = hcb_cuda_stream_wait(s->ordinal, s->xla,
                                  (void *)(uintptr_t)PER_THREAD_DEFAULT_STREAM,
                                  err);
    return rc;
}
