/*
 * buffer.h - the Buffer object of host_callback.buffer_callback, shared by
 * the three files that implement it: buffer.c (the type, host access and
 * the call that hands Buffers to the callback), dlpack.c (__dlpack__ on
 * every device) and buffer_cuda.c (a GPU Buffer's interop: the CUDA Array
 * Interface, the consumers' streams).
 *
 * A Buffer points at XLA's memory for the duration of one call; the call
 * invalidates it when the callback returns (`data` NULL), after which
 * every use raises.  Everything here runs with the GIL held.
 */
#ifndef HCB_PY_BUFFER_H
#define HCB_PY_BUFFER_H

#include "hcbpy.h"

/* The CUDA streams of one buffer call: XLA's, and which of CUDA's default
 * streams its Buffers were exported to (__dlpack__(stream=1 or 2), or the
 * CUDA Array Interface: the legacy one).  Every consumer's stream is made
 * to wait for XLA's at the export; XLA's waits for those default streams
 * when the callback returns (buffer_cuda.c): the consumer reads the inputs
 * after XLA wrote them, and XLA reads the results after the consumer wrote
 * them there.  Any other stream may be gone by then: the callback orders
 * its work there itself (buffer_cuda.c says why).  Lives on the C stack of
 * hcb_py_buffer_call; its Buffers point at it only while the call runs. */
typedef struct hcb_py_call_streams {
    void *xla;       /* XLA's stream; NULL: none (a CPU call, or no call) */
    int32_t ordinal; /* the call's CUDA device, whose stream `xla` is */
    unsigned long thread; /* the callback's (PyThread_get_thread_ident) */
    bool join_legacy, join_per_thread;
} hcb_py_call_streams;

typedef struct hcb_py_buffer {
    PyObject_HEAD void *data; /* NULL once invalidated */
    PyArray_Descr *descr;     /* strong */
    int ndim;
    int readonly;
    Py_ssize_t nbytes;
    hcb_device device;
    Py_ssize_t shape[HCB_MAX_RANK];
    Py_ssize_t strides[HCB_MAX_RANK];
    /* A sub-byte type is packed in XLA's buffer but one element per byte in
     * numpy: `data` is then `staging` (owned, PyMem_Raw), an unpacked copy
     * of `xla` (XLA's buffer, borrowed for the call), packed back into it
     * when the callback returns (buffer.c); else `staging` is NULL. */
    void *staging;
    hcb_array xla;
    /* Strong or NULL: the memory's owner of a Buffer made by _test_view. */
    PyObject *base;
    /* Borrowed: the streams of the call that made it; NULL outside one. */
    hcb_py_call_streams *streams;
} hcb_py_buffer;

/* buffer.c */
/* Whether the Buffer's memory is a CUDA device's. */
int hcb_py_buffer_on_cuda(const hcb_py_buffer *b);
/* 0, or -1 with RuntimeError once the Buffer's call has returned. */
int hcb_py_buffer_check_valid(const hcb_py_buffer *b);
/* The `shape` getter: a new tuple of ints. */
PyObject *hcb_py_buffer_shape(PyObject *self, void *closure);

/* dlpack.c: Buffer.__dlpack__ (METH_FASTCALL | METH_KEYWORDS) and
 * Buffer.__dlpack_device__. */
PyObject *hcb_py_buffer_dlpack(PyObject *self, PyObject *const *args,
                               Py_ssize_t nargs, PyObject *kwnames);
PyObject *hcb_py_buffer_dlpack_device(PyObject *self, PyObject *unused);

/* buffer_cuda.c */
/* Raises `exc` saying that a host access (`what`) of a GPU Buffer cannot
 * be, and what to use instead; returns NULL. */
PyObject *hcb_py_buffer_refuse_host(const hcb_py_buffer *b, PyObject *exc,
                                    const char *what);
/* The __cuda_array_interface__ getter. */
PyObject *hcb_py_buffer_cuda_interface(PyObject *self, void *closure);
/* The `stream` argument of __dlpack__ on a GPU Buffer, by the DLPack
 * rules: checks it, and during the call makes the consumer's stream wait
 * for XLA's (a default stream is remembered in b->streams for
 * hcb_py_call_streams_join).  0, or -1 with an exception set. */
int hcb_py_buffer_dl_stream(hcb_py_buffer *b, PyObject *stream);
/* When the callback has returned: XLA's stream waits for the default
 * streams the call's Buffers were exported to.  HCB_OK, or an error in
 * `err`. */
int hcb_py_call_streams_join(hcb_py_call_streams *s, hcb_error *err);

#endif /* HCB_PY_BUFFER_H */
