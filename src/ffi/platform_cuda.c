/*
 * platform_cuda.c - the CUDA platform: XLA's buffers are device memory and
 * every handler runs on the thread that enqueues the device's work on its
 * stream.  And the handlers libhcb exports for platform "CUDA", over the
 * bodies in handlers.h.
 *
 * A tap never waits for the stream, and the stream never waits for the
 * host.  On XLA's thread it reserves room for its record in the device's
 * queue (hcb__runtime_reserve: a full queue makes this thread wait, which
 * is the device's back-pressure, as on CPU), takes pinned host memory from
 * the device's pool (pinned.c: a full pool makes it wait too), lays the
 * record out there, and enqueues on XLA's stream the copies of the tapped
 * operands into it, then asks the device's lander (landing.c) to hand the
 * record to the queue (`landed`: hcb__runtime_submit_reserved, which never
 * waits, takes no lock held for long, no GIL) once the copies are done.
 * The lander waits for them in the order they were enqueued, so records
 * enter the queue in the order the program issued them.
 *
 *   XLA's thread:   reserve | take pinned | memcpyAsync D2H ... |
 *                   hcb__cuda_after(landed) -> return
 *   the stream:     ... kernels | copies | (event) | kernels ...
 *   the lander:                  landed: submit_reserved
 *   consumer:                                 deliver -> tap function
 *
 * A tap delivered now (the drop-ins, attribute deliver) waits for its
 * copy on XLA's thread and delivers the record there (cuda_fetch): the
 * computation goes on once its function has run, as a call's does.
 *
 * A call needs the values on the host before its function runs and its
 * results on the device before the program goes on: the operands are
 * copied into pinned memory, XLA's thread waits for that copy (the one
 * synchronisation a call costs), runs the target, and enqueues the copies
 * of the results back, the pinned memory given back by the lander after
 * them.  A buffer call ("hcb_buffer_call") runs its target on the
 * device buffers themselves, with the stream in hcb_call_stream().
 *
 * A record over half the pool goes to ordinary memory, its bytes staged
 * through the pool in chunks (send_staged), still without waiting.  Only
 * when the device's whole pool is held by records the user kept, the
 * taker is a consumer thread (which must not wait for records it may have
 * to deliver itself), or the pool could not be pinned (pinned.c), does
 * XLA's thread wait for a tap's copy, into ordinary memory (counted: the
 * pool's `syncs`, hcb_cuda_get_pool_stats).
 */
#include <string.h>

#include "ffi/cuda.h"
#include "ffi/handlers.h"
#include "runtime/record.h"
#include "runtime/runtime.h"

static HCB__TLS void *call_stream;

void *
hcb_call_stream(void)
{
    return call_stream;
}

/* The table and the stream of a call. */
static int
stream_of(const XLA_FFI_CallFrame *frame, const hcb__cuda **api, void **stream,
          hcb_error *err)
{
    int rc;

    if ((*api = hcb__cuda_get(err)) == NULL)
        return err->code;
    if ((rc = hcb_ffi_stream(frame, stream, err)) != HCB_OK)
        return rc;
    return HCB_OK;
}

static int
cuda_device(hcb_runtime *rt, const XLA_FFI_CallFrame *frame, hcb_device *out,
            hcb_error *err)
{
    int32_t ordinal = 0;
    int rc;

    (void)rt;
    if ((rc = hcb_ffi_device_ordinal(frame, &ordinal, err)) != HCB_OK)
        return rc;
    *out = HCB_DEVICE(HCB_PLATFORM_CUDA, ordinal);
    return HCB_OK;
}

static int
cuda_copy_on_device(const XLA_FFI_CallFrame *frame, void *dst, const void *src,
                    size_t nbytes, hcb_error *err)
{
    const hcb__cuda *api;
    void *stream = NULL;
    int rc, status;

    if (nbytes == 0)
        return HCB_OK;
    if ((rc = stream_of(frame, &api, &stream, err)) != HCB_OK)
        return rc;
    if ((status = api->memcpy_async(dst, src, nbytes, HCB__CUDA_D2D, stream)) !=
        0)
        return hcb__cuda_fail(api, status, "copying on the device", err);
    return HCB_OK;
}

/* Enqueues the copies of `n` arrays between `dst` and `src` (`kind`). */
static int
copy_arrays(const hcb__cuda *api, void *stream, const hcb_array *dst,
            const hcb_array *src, size_t n, int kind, hcb_error *err)
{
    size_t i;
    int status;

    for (i = 0; i < n; i++)
        if (src[i].nbytes > 0 &&
            (status = api->memcpy_async(dst[i].data, src[i].data, src[i].nbytes,
                                        kind, stream)) != 0)
            return hcb__cuda_fail(api, status,
                                  kind == HCB__CUDA_D2H
                                      ? "copying an operand to the host"
                                      : "copying a result to the device",
                                  err);
    return HCB_OK;
}

/* After a failure with copies possibly enqueued into memory about to be
 * given back: waits for them, so none writes there later. */
static void
settle(const hcb__cuda *api, void *stream)
{
    (void)api->stream_synchronize(stream);
}

/* ---- taps ----------------------------------------------------------------
 *
 * A pinned record: | pending | record laid out by hcb__record_place | */

typedef struct pending {
    hcb_runtime *rt;
    _Alignas(HCB__PAYLOAD_ALIGN) char record[];
} pending;

static void *
pinned_of(hcb_record *rec)
{
    return (char *)rec - offsetof(pending, record);
}

static void
pinned_record_free(hcb_record *rec)
{
    hcb__pinned_give(pinned_of(rec));
}

static void
pinned_record_delivered(hcb_record *rec)
{
    hcb__pinned_delivered(pinned_of(rec));
}

static const hcb__record_owner pinned_owner = {pinned_record_free,
                                               pinned_record_delivered};

/* On the lander, after a tap's copies: they have landed.  It only hands
 * the record over, into the room reserved for it. */
static void
landed(void *data)
{
    pending *p = data;

    hcb__runtime_submit_reserved(p->rt, (hcb_record *)p->record);
}

/* Whether this thread may wait for the pool: not a consumer thread (a tap
 * function that runs a GPU computation), whose wait could be for records
 * it has to deliver itself. */
static bool
may_wait(void)
{
    return hcb__consumer == NULL;
}

/* A record the pool cannot hold whole: it goes to ordinary memory, and its
 * bytes pass through the pool in chunks of a quarter of it, each copied on
 * from its pinned block by the lander (`unstage`), the last of which
 * submits the record (into the room reserved for it).  When the pool
 * cannot take a chunk either (what holds it is all kept by users, or this
 * thread may not wait), the rest is copied straight into the record while
 * XLA's thread waits. */
typedef struct chunk {
    hcb_runtime *rt;
    hcb_record *rec; /* on the last chunk: submit it after the copy */
    void *dst;
    size_t n;
    _Alignas(64) char data[];
} chunk;

static void
unstage(void *data)
{
    chunk *c = data;
    hcb_runtime *rt = c->rt;
    hcb_record *rec = c->rec;

    memcpy(c->dst, c->data, c->n);
    hcb__pinned_give(c);
    if (rec != NULL)
        hcb__runtime_submit_reserved(rt, rec);
}

/* The last chunk of `rec`'s arrays: (array, offset) of its start. */
static void
last_chunk(const hcb_record *rec, size_t size, size_t *arg, size_t *off)
{
    size_t i;

    *arg = *off = 0;
    for (i = 0; i < rec->nargs; i++)
        if (rec->args[i].nbytes > 0) {
            *arg = i;
            *off = (rec->args[i].nbytes - 1) / size * size;
        }
}

static int
send_staged(hcb_runtime *rt, const hcb__cuda *api, void *stream, uint64_t id,
            hcb_device device, const hcb_array *src, size_t n, hcb_error *err)
{
    int ordinal = HCB_DEVICE_ORDINAL(device);
    size_t size = hcb__pinned_capacity(ordinal) / 4, last_arg, last_off, i, off,
           len;
    bool waiting = size == 0; /* no chunk fits: XLA's thread waits */
    hcb_record *rec;
    int rc, status = 0;

    if ((rc = hcb__record_alloc(id, device, src, n, &rec, err)) != HCB_OK)
        return rc;
    last_chunk(rec, waiting ? 1 : size, &last_arg, &last_off);
    for (i = 0; i < n && rc == HCB_OK; i++) {
        for (off = 0; off < src[i].nbytes && rc == HCB_OK; off += len) {
            char *dst = (char *)rec->args[i].data + off;
            const char *from = (const char *)src[i].data + off;
            bool last = i == last_arg && off == last_off;
            chunk *c = NULL;

            len = src[i].nbytes - off;
            if (!waiting) {
                len = len < size ? len : size;
                c = hcb__pinned_take(api, rt, ordinal, sizeof *c + len,
                                     may_wait(), err);
                if (c == NULL && (rc = err->code) != HCB_OK)
                    break;
                if (c == NULL) { /* the pool is held by kept records */
                    waiting = true;
                    len = src[i].nbytes - off;
                }
            }
            if (c == NULL) {
                status =
                    api->memcpy_async(dst, from, len, HCB__CUDA_D2H, stream);
            } else {
                *c = (chunk){rt, last ? rec : NULL, dst, len};
                if ((status = api->memcpy_async(c->data, from, len,
                                                HCB__CUDA_D2H, stream)) == 0 &&
                    (rc = hcb__cuda_after(api, stream, ordinal, unstage, c,
                                          "enqueueing a tap", err)) == HCB_OK &&
                    last)
                    return HCB_OK; /* the last unstage submits `rec` */
                if (status != 0 || rc != HCB_OK) {
                    settle(api, stream);
                    hcb__pinned_give(c);
                }
            }
            if (status != 0)
                rc = hcb__cuda_fail(api, status,
                                    "copying an operand to the host", err);
        }
    }
    if (rc == HCB_OK) {
        hcb__pinned_note_sync(ordinal);
        if ((status = api->stream_synchronize(stream)) != 0)
            rc = hcb__cuda_fail(api, status, "waiting for a tap's copy", err);
    }
    if (rc != HCB_OK) {
        settle(api, stream);
        hcb_record_release(rec);
        return rc;
    }
    hcb__runtime_submit_reserved(rt, rec);
    return HCB_OK;
}

static int
cuda_send(hcb_runtime *rt, const XLA_FFI_CallFrame *frame, uint64_t id,
          hcb_device device, const hcb_array *src, size_t n, hcb_error *err)
{
    const hcb__cuda *api;
    hcb__record_size size;
    hcb_record *rec;
    pending *p;
    void *stream = NULL;
    int rc;

    if ((rc = stream_of(frame, &api, &stream, err)) != HCB_OK ||
        (rc = hcb__record_measure(src, n, &size, err)) != HCB_OK ||
        (rc = hcb__runtime_reserve(rt, device, size.bytes, err)) != HCB_OK)
        return rc;
    p = hcb__pinned_take(api, rt, HCB_DEVICE_ORDINAL(device),
                         sizeof *p + size.bytes, may_wait(), err);
    if (p == NULL) {
        if ((rc = err->code) == HCB_OK)
            rc = send_staged(rt, api, stream, id, device, src, n, err);
        if (rc != HCB_OK)
            hcb__runtime_unreserve(rt, device, size.bytes);
        return rc;
    }
    p->rt = rt;
    rec =
        hcb__record_place(p->record, &pinned_owner, &size, id, device, src, n);
    if ((rc = copy_arrays(api, stream, rec->args, src, n, HCB__CUDA_D2H,
                          err)) == HCB_OK)
        rc = hcb__cuda_after(api, stream, HCB_DEVICE_ORDINAL(device), landed, p,
                             "enqueueing a tap", err);
    if (rc != HCB_OK) {
        settle(api, stream);
        hcb_record_release(rec);
        hcb__runtime_unreserve(rt, device, size.bytes);
    }
    return rc;
}

/* The record of a tap delivered now (attribute deliver: the drop-ins of
 * JAX's callbacks, which run inside the computation), in pinned memory when
 * the pool has room at once (else in ordinary memory): the operands are
 * copied into it on XLA's stream, and XLA's thread waits for that copy,
 * the one synchronisation it costs (a call's), then delivers the record
 * itself (handlers.h).  Nothing is asked of the lander, and the stream
 * never waits for a tap function. */
static int
cuda_fetch(hcb_runtime *rt, const XLA_FFI_CallFrame *frame, uint64_t id,
           hcb_device device, const hcb_array *src, size_t n, hcb_record **out,
           hcb_error *err)
{
    const hcb__cuda *api;
    hcb__record_size size;
    hcb_record *rec;
    pending *p;
    void *stream = NULL;
    int rc, status;

    if ((rc = stream_of(frame, &api, &stream, err)) != HCB_OK ||
        (rc = hcb__record_measure(src, n, &size, err)) != HCB_OK)
        return rc;
    /* no wait for the pool: this thread waits for the stream anyway */
    p = hcb__pinned_take(api, rt, HCB_DEVICE_ORDINAL(device),
                         sizeof *p + size.bytes, false, err);
    if (p != NULL) {
        p->rt = rt;
        rec = hcb__record_place(p->record, &pinned_owner, &size, id, device,
                                src, n);
    } else if ((rc = err->code) != HCB_OK ||
               (rc = hcb__record_alloc(id, device, src, n, &rec, err)) !=
                   HCB_OK) {
        return rc;
    }
    if ((rc = copy_arrays(api, stream, rec->args, src, n, HCB__CUDA_D2H,
                          err)) == HCB_OK &&
        (status = api->stream_synchronize(stream)) != 0)
        rc = hcb__cuda_fail(api, status, "waiting for a tap's copy", err);
    if (rc != HCB_OK) {
        settle(api, stream);
        hcb_record_release(rec);
        return rc;
    }
    *out = rec;
    return HCB_OK;
}

/* ---- calls ------------------------------------------------------------- */

/* Host copies of a call's arrays, laid out in `mem` like the device ones. */
static size_t
staging_bytes(const hcb_array *a, size_t n)
{
    size_t i, bytes = 0;

    for (i = 0; i < n; i++)
        bytes += (a[i].nbytes + 63) & ~(size_t)63;
    return bytes;
}

static void
stage(char *mem, const hcb_array *device, hcb_array *host, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++) {
        host[i] = device[i];
        host[i].data = mem;
        mem += (device[i].nbytes + 63) & ~(size_t)63;
    }
}

static void
give_back(void *p)
{
    hcb__pinned_give(p);
}

static int
cuda_call(hcb_runtime *rt, const XLA_FFI_CallFrame *frame, uint64_t id,
          hcb_device device, const hcb_share *share, const hcb_array *args,
          size_t nargs, const hcb_array *results, size_t nresults,
          hcb_error *err)
{
    hcb_array stack[STACK_ARRAYS], *host = stack;
    size_t in = staging_bytes(args, nargs);
    size_t bytes = in + staging_bytes(results, nresults);
    const hcb__cuda *api;
    void *stream = NULL, *mem;
    bool pinned = true;
    int rc, status;

    if ((rc = stream_of(frame, &api, &stream, err)) != HCB_OK)
        return rc;
    if (nargs + nresults > STACK_ARRAYS &&
        (host = hcb__calloc(nargs + nresults, sizeof *host)) == NULL)
        return hcb_error_set(err, HCB_ENOMEM,
                             "hcb_call: cannot allocate %zu array views",
                             nargs + nresults);
    mem = hcb__pinned_take(api, rt, HCB_DEVICE_ORDINAL(device), bytes,
                           may_wait(), err);
    if (mem == NULL && err->code == HCB_OK) {
        pinned = false;
        if ((mem = hcb__malloc(bytes > 0 ? bytes : 1)) == NULL)
            hcb_error_set(err, HCB_ENOMEM,
                          "hcb_call: cannot allocate %zu bytes of host "
                          "memory",
                          bytes);
    }
    if (mem == NULL) {
        rc = err->code;
        goto out;
    }
    stage(mem, args, host, nargs);
    stage((char *)mem + in, results, host + nargs, nresults);
    /* a device that shares the call but does not run it needs no operands:
     * it takes the runner's results (shared.c) */
    if ((share == NULL || device == share->runner) &&
        (rc = copy_arrays(api, stream, host, args, nargs, HCB__CUDA_D2H,
                          err)) == HCB_OK &&
        (status = api->stream_synchronize(stream)) != 0)
        rc = hcb__cuda_fail(api, status, "hcb_call: waiting for the operands",
                            err);
    if (rc == HCB_OK && share != NULL)
        rc = hcb_runtime_call_shared(rt, share, id, device, host, nargs,
                                     host + nargs, nresults, err);
    else if (rc == HCB_OK)
        rc = hcb_runtime_call(rt, id, device, host, nargs, host + nargs,
                              nresults, err);
    if (rc == HCB_OK)
        rc = copy_arrays(api, stream, results, host + nargs, nresults,
                         HCB__CUDA_H2D, err);
    if (rc == HCB_OK && pinned)
        rc = hcb__cuda_after(api, stream, HCB_DEVICE_ORDINAL(device), give_back,
                             mem, "hcb_call: enqueueing a release", err);
    if (rc == HCB_OK && !pinned && nresults > 0) {
        hcb__pinned_note_sync(HCB_DEVICE_ORDINAL(device));
        if ((status = api->stream_synchronize(stream)) != 0)
            rc = hcb__cuda_fail(api, status,
                                "hcb_call: waiting for the results", err);
    }
    if (rc != HCB_OK) {
        settle(api, stream);
        if (pinned)
            hcb__pinned_give(mem);
    }
    if (!pinned)
        hcb__free(mem);
out:
    if (host != stack)
        hcb__free(host);
    return rc;
}

/* A buffer call: the target works on the device buffers, on the stream. */
static int
cuda_call_in_place(hcb_runtime *rt, const XLA_FFI_CallFrame *frame, uint64_t id,
                   hcb_device device, const hcb_share *share,
                   const hcb_array *args, size_t nargs,
                   const hcb_array *results, size_t nresults, hcb_error *err)
{
    void *stream = NULL, *outer = call_stream;
    int rc;

    if (share != NULL) /* results in device memory: no host copy to share */
        return hcb_error_set(err, HCB_EUNIMPL,
                             "hcb_buffer_call: a call in place on GPU "
                             "buffers cannot be shared by the devices of a "
                             "computation");
    if ((rc = hcb_ffi_stream(frame, &stream, err)) != HCB_OK)
        return rc;
    call_stream = stream;
    rc = hcb_runtime_call(rt, id, device, args, nargs, results, nresults, err);
    call_stream = outer;
    return rc;
}

const hcb__platform hcb__platform_cuda = {
    cuda_device, cuda_copy_on_device, cuda_send, cuda_call, cuda_fetch, false};

const hcb__platform hcb__platform_cuda_in_place = {
    cuda_device,        cuda_copy_on_device, cuda_send,
    cuda_call_in_place, cuda_fetch,          false};

/* ---- the ordinal ---------------------------------------------------------
 *
 * The s32 result is device memory: written by two memsets on the stream
 * (little-endian: the low byte holds the ordinal, the others 0), which
 * need no host memory that must outlive the call. */
HCB__BODY int
cuda_ordinal_body(XLA_FFI_CallFrame *frame, void *ctx, hcb_error *err)
{
    hcb_array out = {HCB_INVALID, 0, NULL, NULL, 0};
    const hcb__cuda *api;
    int32_t ordinal = 0;
    void *stream = NULL;
    int rc, status;

    (void)ctx;
    if ((rc = hcb_ffi_check_counts(frame, -1, 1, err)) != HCB_OK ||
        (rc = hcb_ffi_result(frame, 0, HCB_S32, 0, &out, err)) != HCB_OK ||
        (rc = hcb_ffi_device_ordinal(frame, &ordinal, err)) != HCB_OK ||
        (rc = stream_of(frame, &api, &stream, err)) != HCB_OK)
        return rc;
    if (ordinal < 0 || ordinal > 255)
        return hcb_error_set(err, HCB_EUNIMPL, "device ordinal %d is over 255",
                             (int)ordinal);
    if ((status = api->memset_async(out.data, 0, sizeof ordinal, stream)) !=
            0 ||
        (status = api->memset_async(out.data, ordinal, 1, stream)) != 0)
        return hcb__cuda_fail(api, status, "writing the device ordinal", err);
    return HCB_OK;
}

/* ---- the exported CUDA handlers ----------------------------------------- */

static const hcb__handler cuda = {&hcb__platform_cuda, NULL};
static const hcb__handler cuda_buffer = {&hcb__platform_cuda_in_place, NULL};

HCB_FFI_HANDLER_CTX(hcb_ffi_ordinal_handler_cuda, "hcb_device_ordinal",
                    cuda_ordinal_body, &cuda, 0)

XLA_FFI_Error *
hcb_ffi_tap_cuda(XLA_FFI_CallFrame *frame)
{
    return hcb__run_as_is(frame, "hcb_tap", hcb__tap_body, (void *)&cuda);
}

XLA_FFI_Error *
hcb_ffi_call_cuda(XLA_FFI_CallFrame *frame)
{
    return hcb__run_as_is(frame, "hcb_call", hcb__call_body, (void *)&cuda);
}

XLA_FFI_Error *
hcb_ffi_buffer_call_cuda(XLA_FFI_CallFrame *frame)
{
    return hcb__run_as_is(frame, "hcb_buffer_call", hcb__call_body,
                          (void *)&cuda_buffer);
}

XLA_FFI_Error *
hcb_ffi_sharded_check_cuda(XLA_FFI_CallFrame *frame)
{
    return hcb__run_as_is(frame, "hcb_sharded_check", hcb__sharded_check_body,
                          (void *)&cuda);
}
