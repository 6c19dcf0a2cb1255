/* test_ffi_tap.c - the hcb_tap handler fed hand-built call frames. */
#include "testutil.h"

#include "frame.h"
#include "ffi/handlers.h"

static hcb_runtime *rt;
static tu_sink *sink;
static uint64_t sink_id;

/* Records the last record's arrays for inspection. */
static float last_f32[8];
static int64_t last_dims[2];
static size_t last_nargs;

static int
capture(void *user, hcb_record *rec, hcb_error *err)
{
    const hcb_array *a = hcb_record_args(rec);

    last_nargs = hcb_record_nargs(rec);
    if (last_nargs > 0 && a[0].dtype == HCB_F32 && a[0].nbytes <= 32) {
        memcpy(last_f32, a[0].data, a[0].nbytes);
        last_dims[0] = a[0].rank > 0 ? a[0].dims[0] : -1;
    }
    return tu_sink_fn(user, rec, err);
}

static int
setup(void **state)
{
    hcb_tap_target t = HCB_TAP_TARGET_INIT;

    (void)state;
    assert_int_equal(hcb_runtime_create(NULL, &rt, NULL), HCB_OK);
    sink = tu_sink_new();
    t.fn = capture;
    t.user = sink;
    assert_int_equal(hcb_runtime_register_tap(rt, &t, &sink_id, NULL), HCB_OK);
    return 0;
}

static int
teardown(void **state)
{
    (void)state;
    hcb_runtime_destroy(rt);
    tu_sink_free(sink);
    return 0;
}

/* The CPU handler's body on this test's runtime. */
static int
run(test_frame *tf, char *msg)
{
    hcb__handler h = {&hcb__platform_cpu, rt};

    return tf_error_code(
        hcb__run_as_is(&tf->frame, "hcb_tap", hcb__tap_body, &h), msg,
        HCB_ERROR_MESSAGE_SIZE);
}

static void
test_answers_metadata_probe_with_0_3(void **state)
{
    (void)state;
    assert_int_equal(tf_probe(hcb_ffi_tap), TF_PROBE_MINOR);
}

static void
test_good_frame_taps_and_aliases(void **state)
{
    float x[3] = {1.5f, 2.5f, 3.5f};
    int32_t y[2] = {7, 8};
    int64_t dx[1] = {3}, dy[1] = {2};
    test_frame tf;
    char msg[HCB_ERROR_MESSAGE_SIZE];
    size_t before = tu_sink_count(sink);

    (void)state;
    tf_init(&tf);
    test_device_ordinal = 5;
    tf_add_buffer(&tf, XLA_FFI_DataType_F32, x, 1, dx, NULL);
    tf_add_buffer(&tf, XLA_FFI_DataType_S32, y, 1, dy, NULL);
    tf_add_u64(&tf, "callback_id", sink_id);
    tf_add_i64(&tf, "ntapped", 1); /* y passes through, is not sent */
    assert_int_equal(run(&tf, msg), 0);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(tu_sink_count(sink), before + 1);
    assert_int_equal(last_nargs, 1);
    assert_int_equal(last_dims[0], 3);
    assert_true(last_f32[2] == 3.5f);
    assert_int_equal(HCB_DEVICE_ORDINAL(sink->device[before]), 5);
    assert_int_equal(HCB_DEVICE_PLATFORM(sink->device[before]),
                     HCB_PLATFORM_CPU);
    test_device_ordinal = 0;
}

/* The lowering adds a token operand and a token result to order callbacks
 * (python/host_callback/_order.py): they are not tapped, not copied, and
 * do not count against ntapped. */
static void
test_order_tokens_are_skipped(void **state)
{
    float x[2] = {4.5f, 5.5f};
    int64_t dx[1] = {2};
    test_frame tf;
    char msg[HCB_ERROR_MESSAGE_SIZE];
    size_t before = tu_sink_count(sink);

    (void)state;
    tf_init(&tf);
    tf_add_buffer(&tf, XLA_FFI_DataType_F32, x, 1, dx, NULL);
    tf_add_buffer(&tf, XLA_FFI_DataType_TOKEN, NULL, 0, NULL, NULL);
    tf_add_u64(&tf, "callback_id", sink_id);
    tf_add_i64(&tf, "ntapped", 1);
    assert_int_equal(run(&tf, msg), 0);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(tu_sink_count(sink), before + 1);
    assert_int_equal(last_nargs, 1);
    assert_true(last_f32[1] == 5.5f);

    /* ntapped may not reach into the token */
    tf_init(&tf);
    tf_add_buffer(&tf, XLA_FFI_DataType_F32, x, 1, dx, NULL);
    tf_add_buffer(&tf, XLA_FFI_DataType_TOKEN, NULL, 0, NULL, NULL);
    tf_add_u64(&tf, "callback_id", sink_id);
    tf_add_i64(&tf, "ntapped", 2);
    assert_int_equal(run(&tf, msg), XLA_FFI_Error_Code_INVALID_ARGUMENT);
    assert_string_equal(msg, "hcb_tap: ntapped is 2, expected 0..1");
}

/* With the only CPU device known, the handler does not ask XLA: the record
 * goes to that device whatever DeviceOrdinal_Get would say. */
static void
test_only_cpu_device_is_used_without_asking_xla(void **state)
{
    float x[1] = {1.0f};
    int64_t dx[1] = {1};
    test_frame tf;
    char msg[HCB_ERROR_MESSAGE_SIZE];
    size_t before = tu_sink_count(sink);

    (void)state;
    hcb_runtime_set_only_cpu_device(rt, 2);
    tf_init(&tf);
    test_device_ordinal = 7;
    tf_add_buffer(&tf, XLA_FFI_DataType_F32, x, 1, dx, NULL);
    tf_add_u64(&tf, "callback_id", sink_id);
    tf_add_i64(&tf, "ntapped", 1);
    assert_int_equal(run(&tf, msg), 0);
    /* one consumer at a time: the sink's capture is not thread-safe */
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    hcb_runtime_set_only_cpu_device(rt, -1);
    tf_init(&tf);
    tf_add_buffer(&tf, XLA_FFI_DataType_F32, x, 1, dx, NULL);
    tf_add_u64(&tf, "callback_id", sink_id);
    tf_add_i64(&tf, "ntapped", 1);
    assert_int_equal(run(&tf, msg), 0);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(tu_sink_count(sink), before + 2);
    assert_int_equal(HCB_DEVICE_ORDINAL(sink->device[before]), 2);
    assert_int_equal(HCB_DEVICE_ORDINAL(sink->device[before + 1]), 7);
    test_device_ordinal = 0;
}

static void
test_unaliased_result_is_copied(void **state)
{
    float x[2] = {4, 5}, out[2] = {0, 0};
    int64_t d[1] = {2};
    test_frame tf;
    char msg[HCB_ERROR_MESSAGE_SIZE];

    (void)state;
    tf_init(&tf);
    tf_add_buffer(&tf, XLA_FFI_DataType_F32, x, 1, d, out);
    tf_add_u64(&tf, "callback_id", sink_id);
    tf_add_i64(&tf, "ntapped", 1);
    assert_int_equal(run(&tf, msg), 0);
    assert_true(out[0] == 4 && out[1] == 5);
    hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL);
}

static void
test_zero_operands(void **state)
{
    test_frame tf;
    char msg[HCB_ERROR_MESSAGE_SIZE];
    size_t before = tu_sink_count(sink);

    (void)state;
    tf_init(&tf);
    tf_add_u64(&tf, "callback_id", sink_id);
    tf_add_i64(&tf, "ntapped", 0);
    assert_int_equal(run(&tf, msg), 0);
    hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL);
    assert_int_equal(tu_sink_count(sink), before + 1);
    assert_int_equal(last_nargs, 0);
}

static void
test_malformed_frames_fail_cleanly(void **state)
{
    float x[1] = {1};
    int64_t d[1] = {1};
    test_frame tf;
    char msg[HCB_ERROR_MESSAGE_SIZE];

    (void)state;
    /* Wrong stage. */
    tf_init(&tf);
    tf.frame.stage = XLA_FFI_ExecutionStage_PREPARE;
    assert_int_equal(run(&tf, msg), XLA_FFI_Error_Code_INVALID_ARGUMENT);
    assert_string_equal(msg, "handler 'hcb_tap' called at stage 1, expected 3");

    /* Missing attribute. */
    tf_init(&tf);
    tf_add_i64(&tf, "ntapped", 0);
    assert_int_equal(run(&tf, msg), XLA_FFI_Error_Code_NOT_FOUND);
    assert_string_equal(msg, "hcb_tap: missing attribute 'callback_id'");

    /* Attribute of the wrong type. */
    tf_init(&tf);
    tf_add_i64(&tf, "callback_id", 1);
    tf_add_i64(&tf, "ntapped", 0);
    assert_int_equal(run(&tf, msg), XLA_FFI_Error_Code_INVALID_ARGUMENT);
    assert_string_equal(msg, "hcb_tap: attribute 'callback_id' is an int64 "
                             "scalar, expected a uint64 scalar");

    /* ntapped out of range. */
    tf_init(&tf);
    tf_add_buffer(&tf, XLA_FFI_DataType_F32, x, 1, d, NULL);
    tf_add_u64(&tf, "callback_id", sink_id);
    tf_add_i64(&tf, "ntapped", 2);
    assert_int_equal(run(&tf, msg), XLA_FFI_Error_Code_INVALID_ARGUMENT);
    assert_string_equal(msg, "hcb_tap: ntapped is 2, expected 0..1");

    /* Results that do not pair with operands. */
    tf_init(&tf);
    tf_add_buffer(&tf, XLA_FFI_DataType_F32, x, 1, d, NULL);
    tf.frame.rets.size = 0;
    tf_add_u64(&tf, "callback_id", sink_id);
    tf_add_i64(&tf, "ntapped", 1);
    assert_int_equal(run(&tf, msg), XLA_FFI_Error_Code_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "1 operands but 0 results"));

    /* A token operand cannot be tapped: a last one orders the tap, and
     * ntapped may not reach it; any other is no array. */
    tf_init(&tf);
    tf_add_buffer(&tf, XLA_FFI_DataType_TOKEN, NULL, 0, NULL, NULL);
    tf_add_u64(&tf, "callback_id", sink_id);
    tf_add_i64(&tf, "ntapped", 1);
    assert_int_equal(run(&tf, msg), XLA_FFI_Error_Code_INVALID_ARGUMENT);
    assert_string_equal(msg, "hcb_tap: ntapped is 1, expected 0..0");
    tf_init(&tf);
    tf_add_buffer(&tf, XLA_FFI_DataType_TOKEN, NULL, 0, NULL, NULL);
    tf_add_buffer(&tf, XLA_FFI_DataType_F32, x, 1, d, NULL);
    tf_add_u64(&tf, "callback_id", sink_id);
    tf_add_i64(&tf, "ntapped", 1);
    assert_int_equal(run(&tf, msg), XLA_FFI_Error_Code_UNIMPLEMENTED);
    assert_string_equal(
        msg, "hcb_tap: operand 0: unsupported buffer type token (XLA type 17)");
}

/* A tap whose one result is the order token (every ordered tap: the
 * program goes on with its operands, not with results of the tap): its
 * operands are tapped, nothing is forwarded.  Any other shape of results
 * is refused. */
static void
test_token_alone_as_the_result(void **state)
{
    float x[2] = {6.5f, 7.5f};
    int64_t dx[1] = {2};
    test_frame tf;
    char msg[HCB_ERROR_MESSAGE_SIZE];
    size_t before = tu_sink_count(sink);

    (void)state;
    tf_init(&tf);
    tf_add_arg(&tf, XLA_FFI_DataType_F32, x, 1, dx);
    tf_add_buffer(&tf, XLA_FFI_DataType_TOKEN, NULL, 0, NULL, NULL);
    tf_add_u64(&tf, "callback_id", sink_id);
    tf_add_i64(&tf, "ntapped", 1);
    assert_int_equal(run(&tf, msg), 0);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(tu_sink_count(sink), before + 1);
    assert_int_equal(last_nargs, 1);
    assert_true(last_f32[1] == 7.5f);

    /* two operands and a token in, one array and a token out */
    tf_init(&tf);
    tf_add_buffer(&tf, XLA_FFI_DataType_F32, x, 1, dx, NULL);
    tf_add_arg(&tf, XLA_FFI_DataType_F32, x, 1, dx);
    tf_add_buffer(&tf, XLA_FFI_DataType_TOKEN, NULL, 0, NULL, NULL);
    tf_add_u64(&tf, "callback_id", sink_id);
    tf_add_i64(&tf, "ntapped", 2);
    assert_int_equal(run(&tf, msg), XLA_FFI_Error_Code_INVALID_ARGUMENT);
    assert_string_equal(msg,
                        "hcb_tap: 3 operands but 2 results; the results must "
                        "alias the operands, or be the order token alone");
}

/* A tap with attribute deliver runs its function before the handler
 * returns, in the handler's own thread, after the taps queued before it:
 * no barrier needed after it. */
static pthread_t deliverer;
static atomic_int delivered_in_caller;

static int
note_thread(void *user, hcb_record *rec, hcb_error *err)
{
    atomic_store(&delivered_in_caller,
                 pthread_equal(pthread_self(), deliverer) ? 1 : 0);
    return tu_sink_fn(user, rec, err);
}

/* A frame tapping `n` int32 or float32 values for `id`, with attribute
 * deliver = `mode` (attributes in XLA's sorted order). */
static void
deliver_frame(test_frame *tf, XLA_FFI_DataType dtype, void *data, int64_t *dims,
              uint64_t id, int64_t mode)
{
    tf_init(tf);
    tf_add_buffer(tf, dtype, data, 1, dims, NULL);
    tf_add_u64(tf, "callback_id", id);
    tf_add_i64(tf, "deliver", mode);
    tf_add_i64(tf, "ntapped", 1);
}

static void
test_deliver_runs_the_tap_in_the_handlers_thread(void **state)
{
    hcb_tap_target t = HCB_TAP_TARGET_INIT;
    float x[1] = {2.0f};
    int64_t dx[1] = {1};
    test_frame tf;
    char msg[HCB_ERROR_MESSAGE_SIZE];
    size_t before = tu_sink_count(sink);
    uint64_t id = 0;
    int i;

    (void)state;
    t.fn = note_thread;
    t.user = sink;
    assert_int_equal(hcb_runtime_register_tap(rt, &t, &id, NULL), HCB_OK);
    sink->delay_us = 2000; /* a slow consumer: the delivery must wait */
    for (i = 0; i < 5; i++) {
        deliver_frame(&tf, XLA_FFI_DataType_F32, x, dx, sink_id, 0);
        assert_int_equal(run(&tf, msg), 0);
    }
    deliverer = pthread_self();
    deliver_frame(&tf, XLA_FFI_DataType_F32, x, dx, id, 1);
    assert_int_equal(run(&tf, msg), 0);
    /* the five queued ones first, then this one, here */
    assert_int_equal(tu_sink_count(sink), before + 6);
    assert_true(atomic_load(&delivered_in_caller));
    sink->delay_us = 0;
}

/* deliver=1: the tap function's failure fails the computation, with its
 * message; deliver=2: it is only recorded, and the computation goes on.
 * Both count it for hcb_runtime_take_error. */
static void
test_deliver_fails_or_keeps_the_tap_functions_error(void **state)
{
    int32_t v[1] = {13};
    int64_t dv[1] = {1};
    test_frame tf;
    char msg[HCB_ERROR_MESSAGE_SIZE];
    hcb_error last;

    (void)state;
    (void)hcb_runtime_take_error(rt, NULL);
    sink->fail_on = 13;
    deliver_frame(&tf, XLA_FFI_DataType_S32, v, dv, sink_id, 1);
    assert_int_not_equal(run(&tf, msg), 0);
    assert_string_equal(msg, "sink refused value 13");
    deliver_frame(&tf, XLA_FFI_DataType_S32, v, dv, sink_id, 2);
    assert_int_equal(run(&tf, msg), 0);
    assert_int_equal(hcb_runtime_take_error(rt, &last), 2);
    assert_string_equal(last.message, "sink refused value 13");
    sink->fail_on = -1;
    /* the runtime works on */
    deliver_frame(&tf, XLA_FFI_DataType_S32, v, dv, sink_id, 1);
    assert_int_equal(run(&tf, msg), 0);

    deliver_frame(&tf, XLA_FFI_DataType_S32, v, dv, sink_id, 3);
    assert_int_equal(run(&tf, msg), XLA_FFI_Error_Code_INVALID_ARGUMENT);
    assert_string_equal(msg, "hcb_tap: deliver is 3, expected 0, 1 or 2");
}

static void
test_out_of_memory_is_an_error(void **state)
{
    /* 16 KiB: a record the pools do not hold ready (record.c) */
    static float x[4096];
    int64_t d[1] = {4096};
    test_frame tf;
    char msg[HCB_ERROR_MESSAGE_SIZE];

    (void)state;
    tu_install_allocator();
    tf_init(&tf);
    tf_add_buffer(&tf, XLA_FFI_DataType_F32, x, 1, d, NULL);
    tf_add_u64(&tf, "callback_id", sink_id);
    tf_add_i64(&tf, "ntapped", 1);
    tu_fail_alloc_after(0);
    assert_int_equal(run(&tf, msg), XLA_FFI_Error_Code_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(msg, "hcb_tap: cannot allocate"));
    tu_fail_alloc_after(-1);
    assert_int_equal(run(&tf, msg), 0); /* and the next one works */
    hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL);
    hcb_set_allocator(NULL);
}

/* A queued tap with attributes runner and first_runs (jit over sharded
 * operands) is queued once, for the runner, by the first device to come
 * (on the CPU every device holds the whole operands:
 * hcb_share.first_runs); the others' handlers queue nothing.  One that cannot
 * be queued does not fail the computation on that device alone (the others
 * would wait for it in their next collective): its failure waits for the
 * barrier. */
static void
shared_frame(test_frame *tf, float *x, int64_t *dims, int runner)
{
    tf_init(tf);
    tf_add_buffer(tf, XLA_FFI_DataType_F32, x, 1, dims, NULL);
    tf_add_u64(tf, "callback_id", sink_id);
    tf_add_i64(tf, "ntapped", 1);
    tf_add_i64(tf, "participants", 4);
    tf_add_u64(tf, "runner", HCB_DEVICE(HCB_PLATFORM_CPU, runner));
    tf_add_i64(tf, "first_runs", 1);
}

/* The 4 devices' handlers of one shared tap, one after the other in this
 * thread, cpu:`first` first; each must succeed. */
static void
tap_on_every_device(test_frame *tf, int first)
{
    char msg[HCB_ERROR_MESSAGE_SIZE];
    int i;

    for (i = 0; i < 4; i++) {
        test_thread_ordinal = (first + i) % 4;
        assert_int_equal(run(tf, msg), 0);
    }
    test_thread_ordinal = 0;
}

static void
test_a_shared_queued_tap_is_queued_once_for_the_runner(void **state)
{
    static float x[4096]; /* 16 KiB: a record the pools do not hold ready */
    int64_t d[1] = {4096};
    test_frame tf;
    size_t before;
    hcb_error last;

    (void)state;
    hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL);
    (void)hcb_runtime_take_error(rt, NULL);
    before = tu_sink_count(sink);
    shared_frame(&tf, x, d, 2);
    test_thread_run_id = 41;
    tap_on_every_device(&tf, 1); /* cpu:1 comes first */
    tap_on_every_device(&tf, 3);
    hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL);
    assert_int_equal(tu_sink_count(sink), before + 2);
    assert_int_equal(sink->device[before], HCB_DEVICE(HCB_PLATFORM_CPU, 2));
    assert_int_equal(sink->device[before + 1], HCB_DEVICE(HCB_PLATFORM_CPU, 2));

    tu_install_allocator();
    tu_fail_alloc_after(0);
    tap_on_every_device(&tf, 0);
    tu_fail_alloc_after(-1);
    hcb_set_allocator(NULL);
    assert_int_equal(hcb_runtime_take_error(rt, &last), 1);
    assert_non_null(strstr(last.message, "a tap shared by 4 devices was not "
                                         "queued: cannot allocate"));
    tap_on_every_device(&tf, 2); /* and the next one is */
    hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL);
    assert_int_equal(tu_sink_count(sink), before + 3);
    test_thread_run_id = -1;
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_answers_metadata_probe_with_0_3),
        cmocka_unit_test(test_good_frame_taps_and_aliases),
        cmocka_unit_test(test_order_tokens_are_skipped),
        cmocka_unit_test(test_token_alone_as_the_result),
        cmocka_unit_test(test_deliver_runs_the_tap_in_the_handlers_thread),
        cmocka_unit_test(test_deliver_fails_or_keeps_the_tap_functions_error),
        cmocka_unit_test(test_only_cpu_device_is_used_without_asking_xla),
        cmocka_unit_test(test_unaliased_result_is_copied),
        cmocka_unit_test(test_zero_operands),
        cmocka_unit_test(test_malformed_frames_fail_cleanly),
        cmocka_unit_test(test_out_of_memory_is_an_error),
        cmocka_unit_test(
            test_a_shared_queued_tap_is_queued_once_for_the_runner),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
