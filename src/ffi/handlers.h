/*
 * handlers.h - what the XLA FFI handlers do, on any platform: decode the
 * call frame, then build and send a record (a tap), run a call target (a
 * call), or answer with the device (the ordinal).  Where the bytes live and
 * how they move is the platform's (platform.h).
 *
 * The bodies are defined here, inline, and compiled into each platform's
 * file (platform_cpu.c), which defines the exported handlers over them:
 * with the platform's operations and the handler's context known there,
 * the compiler makes one straight function of each handler, as fast as a
 * handler written for that platform alone.  Run them through
 * hcb_ffi_run_ctx (or hcb__run_as_is) with an hcb__handler as `ctx`, under
 * the target names "hcb_tap", "hcb_call", "hcb_buffer_call",
 * "hcb_device_ordinal" and "hcb_sharded_check".
 *
 * XLA calls a handler on the thread running the computation.  A tap
 * returns as soon as its record is queued (channels.c delivers it on the
 * device's consumer thread), or, with attribute deliver, once it has been
 * delivered in this thread (calls.c, hcb_runtime_deliver: the drop-ins of
 * JAX's callbacks run inside the computation, as JAX's do); a call returns
 * when its target has filled the results.  Errors come back through `err` and
 * fail the computation with
 * "<target>: <message>" (hcb_ffi_run_ctx).
 */
#ifndef HCB_HANDLERS_H
#define HCB_HANDLERS_H

#include "ffi/platform.h"
#include "runtime/record.h"
#include "runtime/runtime.h"

/* A handler body (or hcb__run_as_is, around one): inlined into the
 * platform's handler. */
#define HCB__BODY static inline __attribute__((always_inline))

#define STACK_ARRAYS 16

static inline hcb_runtime *
handler_runtime(const hcb__handler *h, hcb_error *err)
{
    hcb_runtime *rt = h->rt != NULL ? h->rt : hcb_runtime_default();

    if (rt == NULL)
        hcb_error_set(err, HCB_ENOMEM,
                      "cannot create the host-callback "
                      "runtime");
    return rt;
}

/* Whether the frame's last operand and last result are tokens.  The
 * lowering gives every ordered callback (taps, prints, calls) a token
 * operand and a token result: a chain of them keeps XLA from reordering
 * the callbacks of one program (python/host_callback/_order.py).  They
 * carry no data; handlers skip them. */
static inline int64_t
order_tokens(const XLA_FFI_CallFrame *frame)
{
    int64_t na = frame->args.size, nr = frame->rets.size;

    return na > 0 && nr > 0 &&
           frame->args.types[na - 1] == XLA_FFI_ArgType_BUFFER &&
           frame->rets.types[nr - 1] == XLA_FFI_RetType_BUFFER &&
           ((const XLA_FFI_Buffer *)frame->args.args[na - 1])->dtype ==
               XLA_FFI_DataType_TOKEN &&
           ((const XLA_FFI_Buffer *)frame->rets.rets[nr - 1])->dtype ==
               XLA_FFI_DataType_TOKEN;
}

/* Makes sure each result holds its operand, for handlers whose results
 * alias their operands (the first min(args, rets), order tokens aside).  XLA
 * honours the aliasing the lowering requests, so this is normally a pointer
 * comparison; a copy is made only if a runtime ever hands us distinct
 * buffers. */
static inline int
forward_operands(const hcb__platform *p, XLA_FFI_CallFrame *frame,
                 hcb_error *err)
{
    int64_t n = frame->args.size < frame->rets.size ? frame->args.size
                                                    : frame->rets.size;
    int64_t i;

    n -= order_tokens(frame);
    for (i = 0; i < n; i++) {
        const XLA_FFI_Buffer *in = (const XLA_FFI_Buffer *)frame->args.args[i];
        XLA_FFI_Buffer *out = (XLA_FFI_Buffer *)frame->rets.rets[i];
        hcb_array view = {HCB_INVALID, 0, NULL, NULL, 0};
        hcb_error inner;
        int rc;

        if (in->data == out->data)
            continue;
        if ((rc = hcb_ffi_buffer_view(in, &view, &inner)) != HCB_OK ||
            (rc = p->copy_on_device(frame, out->data, in->data, view.nbytes,
                                    &inner)) != HCB_OK)
            return hcb_error_set(err, rc, "operand %lld: %s", (long long)i,
                                 inner.message);
    }
    return HCB_OK;
}

/* ---- hcb_tap ------------------------------------------------------------ */

/* A tap's results are its operands, aliased (a PURE tap, which XLA keeps
 * only where its results are used), or the order token alone (every other
 * tap: the program goes on with its operands as without the tap). */
static int
check_tap_frame(const XLA_FFI_CallFrame *frame, int64_t ntapped, hcb_error *err)
{
    int64_t tokens = order_tokens(frame);
    int64_t i, n = frame->args.size - tokens;

    if (frame->args.size != frame->rets.size &&
        !(tokens == 1 && frame->rets.size == 1))
        return hcb_error_set(err, HCB_EINVAL,
                             "%lld operands but %lld results; the results "
                             "must alias the operands, or be the order token "
                             "alone",
                             (long long)frame->args.size,
                             (long long)frame->rets.size);
    if (ntapped < 0 || ntapped > n)
        return hcb_error_set(err, HCB_EINVAL,
                             "ntapped is %lld, expected 0..%lld",
                             (long long)ntapped, (long long)n);
    for (i = 0; i < frame->args.size; i++) {
        if (frame->args.types[i] != XLA_FFI_ArgType_BUFFER ||
            (i < frame->rets.size &&
             frame->rets.types[i] != XLA_FFI_RetType_BUFFER))
            return hcb_error_set(err, HCB_EINVAL,
                                 "operand %lld is not a buffer", (long long)i);
    }
    return HCB_OK;
}

/* The optional attribute deliver of a tap: 0 (or none), queued for the
 * device's consumer; 1, delivered now, its failure the computation's
 * (HCB_DELIVER_FAIL); 2, delivered now, its failure only recorded
 * (HCB_DELIVER_KEEP_ERROR). */
enum { TAP_QUEUED = 0, TAP_NOW = 1, TAP_NOW_KEEP_ERROR = 2 };

static inline int
tap_deliver_mode(const XLA_FFI_CallFrame *frame, int *mode, hcb_error *err)
{
    int64_t v = TAP_QUEUED;
    int rc;

    if (hcb_ffi_attr_find(&frame->attrs, "deliver", NULL) != NULL &&
        (rc = hcb_ffi_attr_i64(&frame->attrs, "deliver", &v, err)) != HCB_OK)
        return rc;
    if (v < TAP_QUEUED || v > TAP_NOW_KEEP_ERROR)
        return hcb_error_set(err, HCB_EINVAL,
                             "deliver is %lld, expected 0, 1 or 2",
                             (long long)v);
    *mode = (int)v;
    return HCB_OK;
}

/* The optional attributes of a call or tap that the devices of a
 * computation share (jit over sharded operands: every device runs it, one
 * runs the function; shared.c): runner (u64, the device key of that one),
 * participants (s64, the devices of this process that make it) and
 * first_runs (s64, optional: nonzero when the program lets the first
 * device to come run it, which `platform` must allow too).  `*shared`
 * false when there are none. */
static inline int
share_of(const XLA_FFI_CallFrame *frame, const hcb__platform *platform,
         hcb_share *share, bool *shared, hcb_error *err)
{
    uint64_t runner = 0;
    int64_t participants = 0, launch = 0, first = 0;
    hcb_error ignored;
    int rc;

    *shared = false;
    if (hcb_ffi_attr_find(&frame->attrs, "runner", NULL) == NULL)
        return HCB_OK;
    if ((rc = hcb_ffi_attr_u64(&frame->attrs, "runner", &runner, err)) !=
            HCB_OK ||
        (rc = hcb_ffi_attr_i64(&frame->attrs, "participants", &participants,
                               err)) != HCB_OK ||
        (hcb_ffi_attr_find(&frame->attrs, "first_runs", NULL) != NULL &&
         (rc = hcb_ffi_attr_i64(&frame->attrs, "first_runs", &first, err)) !=
             HCB_OK))
        return rc;
    /* without run ids (older XLA) every launch is one: the devices still
     * meet call by call */
    if (hcb_ffi_run_id(frame, &launch, &ignored) != HCB_OK)
        launch = 0;
    share->struct_size = sizeof *share;
    share->runner = (hcb_device)runner;
    share->participants = participants;
    share->launch = launch;
    share->first_runs = platform->first_runs && first != 0;
    *shared = true;
    return HCB_OK;
}

/* Queues a tap that the devices of a computation share, made for its
 * runner by the one that queues it: a failure to queue it waits for
 * barrier_wait, since the other devices went on -- failing this one alone
 * would leave them waiting in the computation's next collective. */
static inline int
send_shared_tap(const hcb__handler *h, hcb_runtime *rt,
                const XLA_FFI_CallFrame *frame, uint64_t id,
                const hcb_share *share, const hcb_array *views, size_t n,
                hcb_error *err)
{
    hcb_error kept;
    int rc;

    if ((rc = h->platform->send(rt, frame, id, share->runner, views, n, err)) ==
        HCB_OK)
        return HCB_OK;
    hcb_error_set(&kept, rc, "a tap shared by %lld devices was not queued: %s",
                  (long long)share->participants, err->message);
    hcb_runtime_record_error(rt, share->runner, &kept);
    err->code = HCB_OK;
    err->message[0] = '\0';
    return HCB_OK;
}

/* A shared tap that the first device to come runs (hcb_share.first_runs):
 * it makes the runner's record of its own operands (every device holds
 * them whole) and queues it, or delivers it now; the others make none. */
typedef struct shared_tap {
    const hcb__handler *h;
    hcb_runtime *rt;
    const XLA_FFI_CallFrame *frame;
    uint64_t id;
    const hcb_share *share;
    const hcb_array *views;
    size_t n;
    int mode, flags;
} shared_tap;

static inline int
run_shared_tap(void *ctx, hcb_error *err)
{
    shared_tap *t = ctx;
    hcb_record *rec;
    int rc;

    if (t->mode == TAP_QUEUED)
        return send_shared_tap(t->h, t->rt, t->frame, t->id, t->share, t->views,
                               t->n, err);
    if ((rc = t->h->platform->fetch(t->rt, t->frame, t->id, t->share->runner,
                                    t->views, t->n, &rec, err)) != HCB_OK)
        return rc;
    return hcb_runtime_deliver(t->rt, rec, t->flags, err);
}

/* The work of a tap; its errors are its own, but with `*delivered` set
 * those of a tap function delivered now. */
static inline int
tap_work(XLA_FFI_CallFrame *frame, const hcb__handler *h, hcb_error *err,
         bool *delivered)
{
    hcb_array stack_views[STACK_ARRAYS], *views = stack_views;
    hcb_record *rec = NULL;
    hcb_runtime *rt;
    hcb_device device;
    hcb_share share;
    uint64_t id = 0;
    int64_t ntapped = 0, i;
    int rc, flags, mode = TAP_QUEUED;
    bool shared;

    if ((rt = handler_runtime(h, err)) == NULL)
        return err->code;
    if ((rc = hcb_ffi_attr_u64(&frame->attrs, "callback_id", &id, err)) !=
            HCB_OK ||
        (rc = hcb_ffi_attr_i64(&frame->attrs, "ntapped", &ntapped, err)) !=
            HCB_OK ||
        (rc = tap_deliver_mode(frame, &mode, err)) != HCB_OK ||
        (rc = share_of(frame, h->platform, &share, &shared, err)) != HCB_OK ||
        (rc = h->platform->device(rt, frame, &device, err)) != HCB_OK ||
        (rc = check_tap_frame(frame, ntapped, err)) != HCB_OK ||
        (rc = forward_operands(h->platform, frame, err)) != HCB_OK)
        return rc;
    flags = mode == TAP_NOW ? HCB_DELIVER_FAIL : HCB_DELIVER_KEEP_ERROR;
    if (shared && !share.first_runs && device != share.runner) {
        /* another device taps: a queued tap is the runner's alone; a tap
         * delivered now, the others wait for, to fail with it */
        if (mode == TAP_QUEUED)
            return HCB_OK;
        *delivered = true;
        return hcb_runtime_deliver_shared(rt, &share, id, device, NULL, flags,
                                          err);
    }

    if (ntapped > STACK_ARRAYS &&
        (views = hcb__calloc((size_t)ntapped, sizeof *views)) == NULL)
        return hcb_error_set(err, HCB_ENOMEM,
                             "cannot allocate %lld array views",
                             (long long)ntapped);
    for (i = 0; i < ntapped; i++) {
        hcb_error inner;

        if ((rc = hcb_ffi_buffer_view(
                 (const XLA_FFI_Buffer *)frame->args.args[i], &views[i],
                 &inner)) != HCB_OK) {
            hcb_error_set(err, rc, "operand %lld: %s", (long long)i,
                          inner.message);
            goto out;
        }
    }
    if (shared && share.first_runs) {
        /* the first device to come queues it or delivers it, for the
         * runner; the others wait until it has -- a queued one too, so that
         * a later call run by one of them comes after it in the runner's
         * order */
        shared_tap t = {h,    rt,   frame, id, &share, views, (size_t)ntapped,
                        mode, flags};

        *delivered = mode == TAP_NOW;
        rc = hcb__share(rt, &share, id, device, run_shared_tap, &t, NULL, 0,
                        err);
    } else if (mode == TAP_QUEUED && shared) {
        rc = send_shared_tap(h, rt, frame, id, &share, views, (size_t)ntapped,
                             err);
    } else if (mode == TAP_QUEUED) {
        rc = h->platform->send(rt, frame, id, device, views, (size_t)ntapped,
                               err);
    } else if ((rc = h->platform->fetch(rt, frame, id, device, views,
                                        (size_t)ntapped, &rec, err)) ==
               HCB_OK) {
        *delivered = true;
        rc = shared ? hcb_runtime_deliver_shared(rt, &share, id, device, rec,
                                                 flags, err)
                    : hcb_runtime_deliver(rt, rec, flags, err);
    }
out:
    if (views != stack_views)
        hcb__free(views);
    return rc;
}

/* Operands: the tapped arrays, pass-through arrays, [order token]; results:
 * the operands, aliased, or the order token alone.  Attributes:
 * callback_id, ntapped, [deliver], [runner, participants].  Run it as it
 * is (hcb__run_as_is): its own errors say "hcb_tap: ...", and the failure
 * of a tap function it delivered reaches the user as the target wrote it,
 * as a call's. */
HCB__BODY int
hcb__tap_body(XLA_FFI_CallFrame *frame, void *ctx, hcb_error *err)
{
    hcb_error inner;
    bool delivered = false;
    int rc;

    inner.code = HCB_OK;
    inner.message[0] = '\0';
    if ((rc = tap_work(frame, ctx, &inner, &delivered)) == HCB_OK)
        return HCB_OK;
    if (delivered) {
        *err = inner;
        return rc;
    }
    return hcb_error_set(err, rc, "hcb_tap: %s", inner.message);
}

/* ---- hcb_call ----------------------------------------------------------- */

/* A call ends with the failure of the user's call target, which reaches the
 * user as the target wrote it: the body names the handler in its own errors
 * only, and its handler adds nothing (hcb__run_as_is).  So does
 * hcb_sharded_check, which raises such a failure. */
HCB__BODY XLA_FFI_Error *
hcb__run_as_is(XLA_FFI_CallFrame *frame, const char *name,
               hcb_ffi_body_ctx body, void *ctx)
{
    XLA_FFI_Error *xe;
    hcb_error err;

    if (hcb_ffi_begin(frame, name, 0, &xe))
        return xe;
    err.code = HCB_OK;
    err.message[0] = '\0';
    if (body(frame, ctx, &err) == HCB_OK)
        return NULL;
    return hcb_ffi_error_from(frame, &err);
}

/* Operands: the arguments, [order token]; results: the declared outputs,
 * [order token].  Attributes: callback_id, [runner, participants]. */
HCB__BODY int
hcb__call_body(XLA_FFI_CallFrame *frame, void *ctx, hcb_error *err)
{
    const hcb__handler *h = ctx;
    hcb_array stack_views[STACK_ARRAYS], *views = stack_views;
    int64_t tokens = order_tokens(frame);
    int64_t nargs = frame->args.size - tokens, i;
    int64_t nrets = frame->rets.size - tokens;
    hcb_runtime *rt;
    hcb_device device;
    hcb_share share;
    hcb_error inner;
    uint64_t id = 0;
    bool shared;
    int rc;

    if ((rt = handler_runtime(h, &inner)) == NULL ||
        (rc = hcb_ffi_attr_u64(&frame->attrs, "callback_id", &id, &inner)) !=
            HCB_OK ||
        (rc = share_of(frame, h->platform, &share, &shared, &inner)) !=
            HCB_OK ||
        (rc = h->platform->device(rt, frame, &device, &inner)) != HCB_OK)
        return hcb_error_set(err, inner.code, "hcb_call: %s", inner.message);
    if (nargs + nrets > STACK_ARRAYS &&
        (views = hcb__calloc((size_t)(nargs + nrets), sizeof *views)) == NULL)
        return hcb_error_set(err, HCB_ENOMEM,
                             "hcb_call: cannot allocate %lld array views",
                             (long long)(nargs + nrets));
    for (i = 0, rc = HCB_OK; i < nargs + nrets && rc == HCB_OK; i++)
        rc = i < nargs ? hcb_ffi_arg(frame, i, HCB_ANY_DTYPE, HCB_ANY_RANK,
                                     &views[i], &inner)
                       : hcb_ffi_result(frame, i - nargs, HCB_ANY_DTYPE,
                                        HCB_ANY_RANK, &views[i], &inner);
    if (rc != HCB_OK)
        hcb_error_set(err, rc, "hcb_call: %s", inner.message);
    else
        rc = h->platform->call(rt, frame, id, device, shared ? &share : NULL,
                               views, (size_t)nargs, views + nargs,
                               (size_t)nrets, err);
    if (views != stack_views)
        hcb__free(views);
    return rc;
}

/* ---- hcb_device_ordinal and hcb_sharded_check --------------------------- */

/* Used where a callback cannot be our own custom call (under jit over
 * sharded operands the callback goes through JAX's Python callback, which
 * does not say which device runs it): every device computes its own
 * ordinal into its one s32[] result, and the device that runs the callback
 * hands its own to it. */
HCB__BODY int
hcb__ordinal_body(XLA_FFI_CallFrame *frame, void *ctx, hcb_error *err)
{
    hcb_array out = {HCB_INVALID, 0, NULL, NULL, 0};
    int32_t ordinal = 0;
    int rc;

    (void)ctx;
    if ((rc = hcb_ffi_check_counts(frame, -1, 1, err)) != HCB_OK ||
        (rc = hcb_ffi_result(frame, 0, HCB_S32, 0, &out, err)) != HCB_OK ||
        (rc = hcb_ffi_device_ordinal(frame, &ordinal, err)) != HCB_OK)
        return rc;
    *(int32_t *)out.data = ordinal;
    return HCB_OK;
}

/* The s32[] flag `failed` of a call whose results were spread (operand
 * `i`), read into *failed (CUDA: copied from the device, waiting for the
 * stream). */
static inline int
read_failed_flag(const hcb__handler *h, hcb_runtime *rt,
                 XLA_FFI_CallFrame *frame, uint64_t id, int64_t i,
                 int32_t *failed, hcb_error *err)
{
    hcb_array flag = {HCB_INVALID, 0, NULL, NULL, 0};
    hcb_record *rec;
    hcb_device device;
    int rc;

    if ((rc = hcb_ffi_arg(frame, i, HCB_S32, 0, &flag, err)) != HCB_OK ||
        (rc = h->platform->device(rt, frame, &device, err)) != HCB_OK ||
        (rc = h->platform->fetch(rt, frame, id, device, &flag, 1, &rec, err)) !=
            HCB_OK)
        return rc;
    memcpy(failed, hcb_record_args(rec)[0].data, sizeof *failed);
    hcb_record_release(rec);
    return HCB_OK;
}

/* On every device, after the results of such a call were spread: raises
 * the call's failure if one was parked (runtime.h, hcb__sharded_fail), so
 * that all devices fail together instead of some waiting forever in a
 * collective.  Operands: the results, then, where the devices are several
 * processes', the call's s32[] flag `failed` spread with them (0: ran; 1:
 * failed, parked in the runner's process; 2: failed, not parked); results
 * alias the leading operands.  Attributes: callback_id, and with the flag
 * `elsewhere` and `unkept`, what a device raises when its process holds no
 * parked failure (ffi_handlers.h). */
HCB__BODY int
hcb__sharded_check_body(XLA_FFI_CallFrame *frame, void *ctx, hcb_error *err)
{
    const hcb__handler *h = ctx;
    bool flagged = frame->args.size == frame->rets.size + 1;
    const char *says;
    hcb_runtime *rt;
    hcb_error inner;
    uint64_t id = 0;
    int32_t failed = 1;
    size_t n;

    if ((rt = handler_runtime(h, &inner)) == NULL ||
        hcb_ffi_attr_u64(&frame->attrs, "callback_id", &id, &inner) != HCB_OK ||
        (flagged && read_failed_flag(h, rt, frame, id, frame->rets.size,
                                     &failed, &inner) != HCB_OK))
        return hcb_error_set(err, inner.code, "hcb_sharded_check: %s",
                             inner.message);
    if (failed == 1 && hcb__sharded_take(rt, id, err)) /* as it is */
        return err->code;
    if (flagged && failed != 0) {
        if (hcb_ffi_attr_string(&frame->attrs,
                                failed == 1 ? "elsewhere" : "unkept", &says, &n,
                                &inner) != HCB_OK)
            return hcb_error_set(err, inner.code, "hcb_sharded_check: %s",
                                 inner.message);
        return hcb_error_set(err, HCB_ECALLBACK, "%.*s", (int)n, says);
    }
    if (forward_operands(h->platform, frame, &inner) != HCB_OK)
        return hcb_error_set(err, inner.code, "hcb_sharded_check: %s",
                             inner.message);
    return HCB_OK;
}

#endif /* HCB_HANDLERS_H */
