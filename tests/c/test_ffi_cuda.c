/* test_ffi_cuda.c - the CUDA platform's handlers (src/ffi/platform_cuda.c)
 * and its pinned pool (src/ffi/pinned.c) over a stand-in CUDA runtime
 * (fake_cuda.c): hand-built call frames, a stream that runs on a thread of
 * its own, the real runtime behind. */
#include "testutil.h"

#include "fake_cuda.h"
#include "frame.h"
#include "ffi/handlers.h"

#define DEVICE HCB_DEVICE(HCB_PLATFORM_CUDA, 3)

static hcb_runtime *rt;
static tu_sink *sink;
static fake_stream *stream;
static uint64_t sink_id, keep_id, double_id, fail_id, in_place_id;

/* Records a keeping tap kept (hcb_record_retain), to give back later. */
static hcb_record *kept[64];
static atomic_size_t nkept;
static size_t sink_count_at_keep; /* the sink's count at the last keep */

static int
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

static void
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
static int
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

static int
fail_fn(void *user, hcb_device device, const hcb_array *args, size_t nargs,
        const hcb_array *results, size_t nresults, hcb_error *err)
{
    (void)user, (void)device, (void)args, (void)nargs, (void)results;
    (void)nresults;
    return hcb_error_set(err, HCB_ECALLBACK, "fail_fn said no");
}

static int
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
    c.fn = double_fn;
    assert_int_equal(hcb_runtime_register_call(rt, &c, &double_id, NULL),
                     HCB_OK);
    in_place_id = double_id;
    c.fn = fail_fn;
    assert_int_equal(hcb_runtime_register_call(rt, &c, &fail_id, NULL), HCB_OK);
    stream = fake_stream_new();
    test_stream = stream;
    test_device_ordinal = 3;
    return 0;
}

static int
teardown(void **state)
{
    hcb__pinned_stats ps;

    (void)state;
    fake_stream_free(stream);
    hcb_runtime_destroy(rt);
    tu_sink_free(sink);
    give_kept();
    /* every test gives all the pinned memory back */
    hcb__pinned_get_stats(&ps);
    assert_int_equal(ps.used, 0);
    assert_int_equal(ps.blocks, 0);
    assert_int_equal(ps.on_the_way, 0);
    test_stream = NULL;
    test_device_ordinal = 0;
    return 0;
}

static int
run_body(test_frame *tf, const char *name, hcb_ffi_body_ctx body,
         const hcb__platform *p, char *msg)
{
    hcb__handler h = {p, rt};

    return tf_error_code(hcb_ffi_run_ctx(&tf->frame, name, 0, body, &h), msg,
                         HCB_ERROR_MESSAGE_SIZE);
}

/* A tap of one int32[n] array on the stream. */
static int
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

static void
test_cuda_handlers_answer_the_metadata_probe(void **state)
{
    (void)state;
    assert_int_equal(tf_probe(hcb_ffi_tap_cuda), 3);
    assert_int_equal(tf_probe(hcb_ffi_call_cuda), 3);
    assert_int_equal(tf_probe(hcb_ffi_buffer_call_cuda), 3);
    assert_int_equal(tf_probe(hcb_ffi_ordinal_handler_cuda), 3);
    assert_int_equal(tf_probe(hcb_ffi_sharded_check_cuda), 3);
    assert_int_equal(tf_probe(hcb_ffi_flush_cuda), 3);
}

/* The handler returns with the copy still queued on a busy stream; the
 * record arrives, with the device's values, once the stream gets there. */
static void
test_tap_returns_without_waiting_for_the_stream(void **state)
{
    int32_t x[4] = {41, 42, 43, 44};
    char msg[HCB_ERROR_MESSAGE_SIZE];

    (void)state;
    fake_stream_hold(stream, true);
    assert_int_equal(tap(x, 4, sink_id, msg), 0);
    assert_int_equal(atomic_load(&fake_cuda_counts.syncs), 0);
    assert_int_equal(atomic_load(&fake_cuda_counts.copies), 1);
    assert_int_equal(atomic_load(&fake_cuda_counts.host_funcs), 1);
    tu_sleep_us(20000);
    assert_int_equal(tu_sink_count(sink), 0);
    fake_stream_hold(stream, false);
    fake_stream_drain(stream);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(tu_sink_count(sink), 1);
    assert_int_equal(sink->first_value[0], 41);
    assert_true(sink->device[0] == DEVICE);
    assert_int_equal(atomic_load(&fake_cuda_counts.host_allocs), 1);
}

typedef struct flush_job {
    atomic_int done;
    int rc;
} flush_job;

static void *
flush_on_stream(void *arg)
{
    flush_job *j = arg;
    char msg[HCB_ERROR_MESSAGE_SIZE];
    test_frame tf;

    tf_init(&tf);
    tf_add_buffer(&tf, XLA_FFI_DataType_TOKEN, NULL, 0, NULL, NULL);
    j->rc =
        run_body(&tf, "hcb_flush", hcb__flush_body, &hcb__platform_cuda, msg);
    atomic_store(&j->done, 1);
    return NULL;
}

/* hcb_flush waits for the stream (once), so that the taps on it have
 * landed and been submitted, and then for their delivery: when it
 * returns, the tap function has run.  The tap itself never waited. */
static void
test_flush_waits_for_the_stream_then_the_deliveries(void **state)
{
    int32_t x[2] = {51, 52};
    char msg[HCB_ERROR_MESSAGE_SIZE];
    flush_job j = {0, -1};
    pthread_t t;

    (void)state;
    sink->delay_us = 5000;
    fake_stream_hold(stream, true);
    assert_int_equal(tap(x, 2, sink_id, msg), 0);
    assert_int_equal(atomic_load(&fake_cuda_counts.syncs), 0);
    assert_int_equal(pthread_create(&t, NULL, flush_on_stream, &j), 0);
    tu_sleep_us(20000);
    assert_false(atomic_load(&j.done)); /* the copy has not landed */
    fake_stream_hold(stream, false);
    pthread_join(t, NULL);
    assert_int_equal(j.rc, 0);
    assert_int_equal(tu_sink_count(sink), 1); /* delivered, no barrier */
    assert_int_equal(sink->first_value[0], 51);
    assert_int_equal(atomic_load(&fake_cuda_counts.syncs), 1);
    sink->delay_us = 0;
}

/* Records reach the tap function in the order the device issued them, the
 * pool reused (one pinned allocation for all). */
static void
test_taps_keep_program_order(void **state)
{
    int32_t x[1000];
    char msg[HCB_ERROR_MESSAGE_SIZE];
    int i;

    (void)state;
    for (i = 0; i < 1000; i++) {
        x[i] = i;
        assert_int_equal(tap(&x[i], 1, sink_id, msg), 0);
    }
    fake_stream_drain(stream);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(tu_sink_count(sink), 1000);
    for (i = 0; i < 1000; i++)
        assert_int_equal(sink->first_value[i], i);
    assert_int_equal(atomic_load(&fake_cuda_counts.syncs), 0);
    assert_int_equal(atomic_load(&fake_cuda_counts.host_allocs), 1);
}

typedef struct {
    int32_t *data;
    int64_t n;
    int count, done;
} tapper;

static void *
tapper_main(void *arg)
{
    tapper *t = arg;
    char msg[HCB_ERROR_MESSAGE_SIZE];
    int i;

    for (i = 0; i < t->count; i++)
        if (tap(t->data, t->n, sink_id, msg) == 0)
            t->done++;
    return NULL;
}

/* With the stream held, the pool fills: the device's thread waits for room
 * (back-pressure) and goes on when the stream runs; nothing is lost. */
static void
test_a_full_pool_makes_the_device_wait(void **state)
{
    static int32_t big[32768]; /* 128 KiB: 7 fit in the 1 MiB pool */
    tapper t = {big, 32768, 20, 0};
    hcb__pinned_stats ps;
    pthread_t th;

    (void)state;
    big[0] = 5;
    fake_stream_hold(stream, true);
    pthread_create(&th, NULL, tapper_main, &t);
    tu_sleep_us(100000);
    hcb__pinned_get_stats(&ps);
    assert_true(ps.waits >= 1);
    assert_true(t.done < 20);
    assert_int_equal(tu_sink_count(sink), 0);
    fake_stream_hold(stream, false);
    pthread_join(th, NULL);
    fake_stream_drain(stream);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(t.done, 20);
    assert_int_equal(tu_sink_count(sink), 20);
    assert_int_equal(sink->first_value[19], 5);
    assert_int_equal(atomic_load(&fake_cuda_counts.syncs), 0);
}

/* A record larger than the pool passes, its bytes staged through the pool
 * in chunks, without XLA's thread waiting for the stream; in order with
 * the taps around it. */
static void
test_a_record_larger_than_the_pool_still_passes(void **state)
{
    int64_t n = (2 << 20) / 4 + 1000; /* over 2 MiB: the pool is 1 MiB */
    int32_t *x = malloc((size_t)n * sizeof *x), small[2] = {1, 2};
    char msg[HCB_ERROR_MESSAGE_SIZE];
    hcb__pinned_stats ps;
    int64_t i;

    (void)state;
    for (i = 0; i < n; i++)
        x[i] = (int32_t)i + 77;
    assert_int_equal(tap(&small[0], 1, sink_id, msg), 0);
    assert_int_equal(tap(x, n, keep_id, msg), 0);
    assert_int_equal(tap(&small[1], 1, sink_id, msg), 0);
    assert_int_equal(atomic_load(&fake_cuda_counts.syncs), 0);
    fake_stream_drain(stream);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(tu_sink_count(sink), 2);
    assert_int_equal(atomic_load(&nkept), 1);
    assert_int_equal(sink_count_at_keep, 1); /* between the two */
    {
        const hcb_array *a = hcb_record_args(kept[0]);
        const int32_t *got = a[0].data;

        assert_int_equal(a[0].nbytes, (size_t)n * sizeof *x);
        for (i = 0; i < n; i++)
            if (got[i] != (int32_t)i + 77)
                fail_msg("element %lld is %d", (long long)i, got[i]);
    }
    hcb__pinned_get_stats(&ps);
    assert_int_equal(ps.refusals, 1); /* whole, then in 9 chunks */
    assert_true(atomic_load(&fake_cuda_counts.copies) >= 2 + 9);
    free(x);
}

/* Records the user keeps hold the pool; the next taps do not wait for
 * them forever but pass through ordinary memory, and the pool is used
 * again once they are given back. */
static void
test_records_kept_by_the_user_do_not_block_taps(void **state)
{
    static int32_t big[65536]; /* 256 KiB */
    char msg[HCB_ERROR_MESSAGE_SIZE];
    hcb__pinned_stats ps;
    long syncs;
    int i;

    (void)state;
    for (i = 0; i < 3; i++)
        assert_int_equal(tap(big, 65536, keep_id, msg), 0);
    fake_stream_drain(stream);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(atomic_load(&nkept), 3);
    big[0] = 9;
    for (i = 0; i < 4; i++) /* the pool has room for none of them */
        assert_int_equal(tap(big, 65536, sink_id, msg), 0);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(tu_sink_count(sink), 4);
    assert_int_equal(sink->first_value[3], 9);
    hcb__pinned_get_stats(&ps);
    assert_true(ps.refusals >= 1);
    give_kept();
    syncs = atomic_load(&fake_cuda_counts.syncs);
    assert_int_equal(tap(big, 65536, sink_id, msg), 0);
    assert_int_equal(atomic_load(&fake_cuda_counts.syncs), syncs);
    fake_stream_drain(stream);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(tu_sink_count(sink), 5);
}

/* A failing copy or host-function launch fails the computation with
 * CUDA's message; the pinned memory comes back. */
static void
test_cuda_errors_fail_the_tap_and_free_its_memory(void **state)
{
    int32_t x[2] = {1, 2};
    char msg[HCB_ERROR_MESSAGE_SIZE];

    (void)state;
    atomic_store(&fake_cuda_fail_copy_after, 0);
    assert_int_equal(tap(x, 2, sink_id, msg), XLA_FFI_Error_Code_UNAVAILABLE);
    assert_non_null(strstr(msg, "hcb_tap: copying an operand to the host: "
                                "unspecified launch failure (CUDA error "
                                "719)"));
    atomic_store(&fake_cuda_fail_launch_after, 0);
    assert_int_equal(tap(x, 2, sink_id, msg), XLA_FFI_Error_Code_UNAVAILABLE);
    assert_non_null(strstr(msg, "enqueueing a tap"));
    assert_int_equal(tap(x, 2, sink_id, msg), 0); /* and it goes on */
    fake_stream_drain(stream);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(tu_sink_count(sink), 1);
}

/* Stopping the runtime (stop_outfeed_receiver) after the stream has run
 * delivers every tap that was on its way. */
static void
test_stop_delivers_the_taps_on_their_way(void **state)
{
    int32_t x[50];
    char msg[HCB_ERROR_MESSAGE_SIZE];
    int i;

    (void)state;
    fake_stream_hold(stream, true);
    for (i = 0; i < 50; i++) {
        x[i] = i;
        assert_int_equal(tap(&x[i], 1, sink_id, msg), 0);
    }
    fake_stream_hold(stream, false);
    fake_stream_drain(stream);
    assert_int_equal(hcb_runtime_stop(rt, NULL), HCB_OK);
    assert_int_equal(tu_sink_count(sink), 50);
    assert_int_equal(sink->first_value[49], 49);
}

static int
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

/* A call runs its target on host copies, with one synchronisation, and
 * the results reach the device in stream order. */
static void
test_call_stages_through_host_memory(void **state)
{
    float in[3] = {1.5f, 2.5f, 3.5f}, out[3] = {0};
    char msg[HCB_ERROR_MESSAGE_SIZE];

    (void)state;
    assert_int_equal(
        call(double_id, in, out, 3, &hcb__platform_cuda, "hcb_call", msg), 0);
    assert_int_equal(atomic_load(&fake_cuda_counts.syncs), 1);
    assert_true(seen_arg != in && seen_result != out);
    assert_null(seen_stream);
    assert_true(seen_value == 1.5f);
    fake_stream_drain(stream);
    assert_true(out[0] == 3.0f && out[2] == 7.0f);
}

/* The device's taps issued before a call reach their function before the
 * call runs, as on CPU. */
static void
test_call_runs_after_the_taps_before_it(void **state)
{
    int32_t x[20];
    float in[1] = {1.0f}, out[1];
    char msg[HCB_ERROR_MESSAGE_SIZE];
    int i;

    (void)state;
    sink->delay_us = 1000;
    fake_stream_hold(stream, true);
    for (i = 0; i < 20; i++) {
        x[i] = i;
        assert_int_equal(tap(&x[i], 1, sink_id, msg), 0);
    }
    fake_stream_hold(stream, false);
    assert_int_equal(
        call(double_id, in, out, 1, &hcb__platform_cuda, "hcb_call", msg), 0);
    assert_int_equal(tu_sink_count(sink), 20);
    fake_stream_drain(stream);
}

static void
test_failing_call_target_fails_with_its_message(void **state)
{
    float in[2] = {1, 2}, out[2];
    char msg[HCB_ERROR_MESSAGE_SIZE];

    (void)state;
    assert_int_equal(
        call(fail_id, in, out, 2, &hcb__platform_cuda, "hcb_call", msg),
        XLA_FFI_Error_Code_UNKNOWN);
    assert_string_equal(msg, "fail_fn said no");
}

/* hcb_buffer_call: the target gets the device buffers and the stream, and
 * nothing waits for the stream. */
static void
test_buffer_call_works_in_place_on_the_stream(void **state)
{
    float in[2] = {4, 5}, out[2] = {0};
    char msg[HCB_ERROR_MESSAGE_SIZE];

    (void)state;
    assert_int_equal(call(in_place_id, in, out, 2, &hcb__platform_cuda_in_place,
                          "hcb_buffer_call", msg),
                     0);
    assert_ptr_equal(seen_arg, in);
    assert_ptr_equal(seen_result, out);
    assert_ptr_equal(seen_stream, stream);
    assert_null(hcb_call_stream()); /* only during the call */
    assert_true(out[0] == 8.0f && out[1] == 10.0f);
    assert_int_equal(atomic_load(&fake_cuda_counts.syncs), 0);
    assert_int_equal(atomic_load(&fake_cuda_counts.copies), 0);
}

static void
test_ordinal_is_written_on_the_stream(void **state)
{
    int32_t out = -1;
    test_frame tf;
    char msg[HCB_ERROR_MESSAGE_SIZE];

    (void)state;
    tf_init(&tf);
    tf_add_ret(&tf, XLA_FFI_DataType_S32, &out, 0, NULL);
    assert_int_equal(
        tf_error_code(hcb_ffi_ordinal_handler_cuda(&tf.frame), msg, sizeof msg),
        0);
    fake_stream_drain(stream);
    assert_int_equal(out, 3);
    test_device_ordinal = 300;
    assert_int_equal(
        tf_error_code(hcb_ffi_ordinal_handler_cuda(&tf.frame), msg, sizeof msg),
        XLA_FFI_Error_Code_UNIMPLEMENTED);
    assert_non_null(strstr(msg, "device ordinal 300 is over 255"));
}

/* The ring: blocks given back out of order, wrapping with padding. */
static void
test_pinned_ring_reuses_memory_given_back_out_of_order(void **state)
{
    hcb_error err;
    hcb__pinned_stats ps;
    void *a, *b, *c, *d;

    (void)state;
    a = hcb__pinned_take(&fake_cuda, 300000, &err);
    b = hcb__pinned_take(&fake_cuda, 300000, &err);
    c = hcb__pinned_take(&fake_cuda, 300000, &err);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_int_equal((uintptr_t)a % 64, 0);
    hcb__pinned_give(b); /* behind a: the ring cannot reuse it yet */
    hcb__pinned_delivered(a);
    hcb__pinned_delivered(c);
    assert_null(hcb__pinned_take(&fake_cuda, 300000, &err)); /* held */
    assert_int_equal(err.code, HCB_OK);
    hcb__pinned_give(a); /* a and b free: d wraps to the start */
    d = hcb__pinned_take(&fake_cuda, 400000, &err);
    assert_true(d != NULL && (char *)d < (char *)c);
    hcb__pinned_give(c);
    hcb__pinned_give(d);
    hcb__pinned_get_stats(&ps);
    assert_int_equal(ps.used, 0);
    assert_int_equal(ps.capacity, 1 << 20);
}

/* The pool's size is set before it is used, or while it is unused. */
static void
test_pinned_pool_size_changes_only_while_unused(void **state)
{
    hcb_error err;
    void *p;

    (void)state;
    assert_int_equal(hcb_cuda_set_pinned_bytes(1 << 20, &err), HCB_EINVAL);
    assert_non_null(strstr(err.message, "at least 4194304 bytes, got "
                                        "1048576"));
    p = hcb__pinned_take(&fake_cuda, 100, &err);
    assert_non_null(p);
    assert_int_equal(hcb_cuda_set_pinned_bytes(8 << 20, &err), HCB_ESTATE);
    assert_non_null(strstr(err.message, "in use"));
    assert_int_equal(hcb__pinned_capacity(), 1 << 20);
    hcb__pinned_give(p);
    assert_int_equal(hcb_cuda_set_pinned_bytes(8 << 20, &err), HCB_OK);
    p = hcb__pinned_take(&fake_cuda, 100, &err);
    assert_int_equal(hcb__pinned_capacity(), 8 << 20);
    hcb__pinned_give(p);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_handlers_answer_the_metadata_probe),
        cmocka_unit_test_setup_teardown(
            test_tap_returns_without_waiting_for_the_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_flush_waits_for_the_stream_then_the_deliveries, setup,
            teardown),
        cmocka_unit_test_setup_teardown(test_taps_keep_program_order, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_a_full_pool_makes_the_device_wait,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_a_record_larger_than_the_pool_still_passes, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_records_kept_by_the_user_do_not_block_taps, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_cuda_errors_fail_the_tap_and_free_its_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_stop_delivers_the_taps_on_their_way, setup, teardown),
        cmocka_unit_test_setup_teardown(test_call_stages_through_host_memory,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_call_runs_after_the_taps_before_it,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_failing_call_target_fails_with_its_message, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_buffer_call_works_in_place_on_the_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ordinal_is_written_on_the_stream,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_pinned_ring_reuses_memory_given_back_out_of_order, setup,
            teardown),
        cmocka_unit_test_setup_teardown(
            test_pinned_pool_size_changes_only_while_unused, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
