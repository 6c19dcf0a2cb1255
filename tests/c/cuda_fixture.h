/* cuda_fixture.h - what the tests of the CUDA platform share: a runtime
 * over a stand-in CUDA runtime (fake_cuda.c) with a stream on a thread of
 * its own, the tap and call targets they register, setup and teardown,
 * and the handler bodies run on hand-built call frames.  Included by one
 * test file per executable. */
#ifndef HCB_CUDA_FIXTURE_H
#define HCB_CUDA_FIXTURE_H

#include "testutil.h"

#include "fake_cuda.h"
#include "frame.h"
#include "ffi/handlers.h"

#define DEVICE HCB_DEVICE(HCB_PLATFORM_CUDA, 3)

static hcb_runtime *rt;
static tu_sink *sink;
static fake_stream *stream;
static uint64_t sink_id, keep_id, double_id, fail_id, in_place_id, gate_id;

/* A tap function that waits until the gate opens (a slow consumer). */
static atomic_bool gate_open;
static atomic_int gate_seen;

static inline int
gate_fn(void *user, hcb_record *rec, hcb_error *err)
{
    (void)user, (void)rec, (void)err;
    while (!atomic_load(&gate_open))
        tu_sleep_us(1000);
    atomic_fetch_add(&gate_seen, 1);
    return 0;
}

/* Records a keeping tap kept (hcb_record_retain), to give back later. */
static hcb_record *kept[64];
static atomic_size_t nkept;
static size_t sink_count_at_keep; /* the sink's count at the last keep */

static inline int
keep_fn(void *user, hcb_record *rec, hcb_error *err)
{
    size_t i = atomic_fetch_add(&nkept, 1);

    (void)user, (void)err;
    sink_count_at_keep = tu_sink_count(sink);
    if (i < 64) {
        hcb_record_retain(rec);
        kept[i] = rec;
    }
    return 0;
}

static inline void
give_kept(void)
{
    size_t i, n = atomic_load(&nkept);

    for (i = 0; i < n && i < 64; i++)
        hcb_record_release(kept[i]);
    atomic_store(&nkept, 0);
}

/* What the last call saw. */
static const void *seen_arg, *seen_result;
static void *seen_stream;
static float seen_value;

/* results[0] = 2 * args[0] (f32[n]). */
static inline int
double_fn(void *user, hcb_device device, const hcb_array *args, size_t nargs,
          const hcb_array *results, size_t nresults, hcb_error *err)
{
    const float *in = args[0].data;
    float *out = results[0].data;
    size_t i;

    (void)user;
    if (nargs != 1 || nresults != 1 || device != DEVICE)
        return hcb_error_set(err, HCB_EINVAL, "double_fn: unexpected call");
    seen_arg = args[0].data;
    seen_result = results[0].data;
    seen_stream = hcb_call_stream();
    seen_value = in[0];
    for (i = 0; i < args[0].nbytes / sizeof(float); i++)
        out[i] = 2.0f * in[i];
    return HCB_OK;
}

static inline int
setup(void **state)
{
    hcb_tap_target t = HCB_TAP_TARGET_INIT;
    hcb_call_target c = HCB_CALL_TARGET_INIT;

    (void)state;
    fake_cuda_reset_counts();
    hcb__cuda_install(&fake_cuda);
    assert_int_equal(hcb__pinned_configure(1 << 20), HCB_OK);
    assert_int_equal(hcb_runtime_create(NULL, &rt, NULL), HCB_OK);
    sink = tu_sink_new();
    t.fn = tu_sink_fn;
    t.user = sink;
    assert_int_equal(hcb_runtime_register_tap(rt, &t, &sink_id, NULL), HCB_OK);
    t.fn = keep_fn;
    assert_int_equal(hcb_runtime_register_tap(rt, &t, &keep_id, NULL), HCB_OK);
    t.fn = gate_fn;
    t.name = "gate";
    t.name_len = 4;
    assert_int_equal(hcb_runtime_register_tap(rt, &t, &gate_id, NULL), HCB_OK);
    atomic_store(&gate_open, true);
    atomic_store(&gate_seen, 0);
    c.fn = double_fn;
    assert_int_equal(hcb_runtime_register_call(rt, &c, &double_id, NULL),
                     HCB_OK);
    in_place_id = double_id;
    c.fn = tu_fail_fn;
    assert_int_equal(hcb_runtime_register_call(rt, &c, &fail_id, NULL), HCB_OK);
    stream = fake_stream_new_on(3);
    test_stream = stream;
    test_device_ordinal = 3;
    return 0;
}

static inline int
teardown(void **state)
{
    hcb__pinned_stats ps;

    (void)state;
    /* the landers have run all that was asked (the stream runs on) before
     * the stream and the runtime go */
    fake_stream_hold(stream, false);
    hcb__cuda_landing_stop();
    fake_stream_free(stream);
    hcb_runtime_destroy(rt);
    tu_sink_free(sink);
    give_kept();
    /* every test gives all the pinned memory back */
    assert_true(hcb__pinned_get_stats(3, &ps));
    assert_int_equal(ps.used, 0);
    assert_int_equal(ps.blocks, 0);
    assert_int_equal(ps.on_the_way, 0);
    test_stream = NULL;
    test_device_ordinal = 0;
    return 0;
}

static inline int
run_body(test_frame *tf, const char *name, hcb_ffi_body_ctx body,
         const hcb__platform *p, char *msg)
{
    hcb__handler h = {p, rt};

    return tf_error_code(hcb__run_as_is(&tf->frame, name, body, &h), msg,
                         HCB_ERROR_MESSAGE_SIZE);
}

/* A tap of one int32[n] array on the stream. */
static inline int
tap(int32_t *device_data, int64_t n, uint64_t id, char *msg)
{
    int64_t dims[1] = {n};
    test_frame tf;

    tf_init(&tf);
    tf_add_buffer(&tf, XLA_FFI_DataType_S32, device_data, 1, dims, NULL);
    tf_add_u64(&tf, "callback_id", id);
    tf_add_i64(&tf, "ntapped", 1);
    return run_body(&tf, "hcb_tap", hcb__tap_body, &hcb__platform_cuda, msg);
}

/* A call of target `id` on f32[n] `in` into `out`, through the handler
 * body `name` of `platform`. */
static inline int
call(uint64_t id, float *in, float *out, int64_t n,
     const hcb__platform *platform, const char *name, char *msg)
{
    hcb__handler h = {platform, rt};
    int64_t dims[1] = {n};
    test_frame tf;

    tf_init(&tf);
    tf_add_arg(&tf, XLA_FFI_DataType_F32, in, 1, dims);
    tf_add_ret(&tf, XLA_FFI_DataType_F32, out, 1, dims);
    tf_add_u64(&tf, "callback_id", id);
    return tf_error_code(hcb__run_as_is(&tf.frame, name, hcb__call_body, &h),
                         msg, HCB_ERROR_MESSAGE_SIZE);
}

/* A thread that taps `count` times (XLA's thread of a device: with
 * `stream` set, of device `ordinal` on that stream, else the test's). */
typedef struct {
    int32_t *data;
    int64_t n;
    int count;
    atomic_int done;
    uint64_t id; /* 0: sink_id */
    int32_t ordinal;
    fake_stream *stream;
} tapper;

static inline void *
tapper_main(void *arg)
{
    tapper *t = arg;
    char msg[HCB_ERROR_MESSAGE_SIZE];
    int i;

    if (t->stream != NULL) {
        test_thread_ordinal = t->ordinal;
        test_thread_stream = t->stream;
    }
    for (i = 0; i < t->count; i++)
        if (tap(t->data, t->n, t->id != 0 ? t->id : sink_id, msg) == 0)
            atomic_fetch_add(&t->done, 1);
    return NULL;
}

/* Whether device `ordinal`'s pinned pool makes a thread wait for room
 * within TU_PATIENCE_S (polled: under valgrind on a busy machine the
 * tapper can take much longer than usual to get there). */
static inline bool
pool_made_a_thread_wait(int32_t ordinal)
{
    double until = tu_now_s() + TU_PATIENCE_S;
    hcb__pinned_stats ps;

    do {
        if (hcb__pinned_get_stats(ordinal, &ps) && ps.waits >= 1)
            return true;
        tu_sleep_us(1000);
    } while (tu_now_s() < until);
    return false;
}

#endif /* HCB_CUDA_FIXTURE_H */
