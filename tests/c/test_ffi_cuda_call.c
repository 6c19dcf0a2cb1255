/* test_ffi_cuda_call.c - the CUDA platform's call handlers
 * (src/ffi/platform_cuda.c): a call staged through host memory, shared by
 * the devices of a computation, after the taps before it, failing; a
 * buffer call in place; the ordinal on the stream; hcb_sharded_check's
 * flag read from the device (the fixture: cuda_fixture.h). */
#include "cuda_fixture.h"

/* hcb_sharded_check on a GPU reads the spread flag `failed` from device
 * memory, copied on the stream: set, with no failure parked in this
 * process, it raises attribute `elsewhere`; clear, the results pass (a
 * result that does not alias its operand copied on the device). */
static void
test_the_sharded_check_reads_the_failure_flag_from_the_device(void **state)
{
    static const char where[] = "it failed in process 1";
    static const char lost[] = "it failed, not kept";
    XLA_FFI_ByteSpan elsewhere = {where, sizeof where - 1};
    XLA_FFI_ByteSpan unkept = {lost, sizeof lost - 1};
    int32_t x[2] = {5, 6}, y[2], flag[1];
    int64_t dims[1] = {2};
    char msg[HCB_ERROR_MESSAGE_SIZE];
    long copies;
    test_frame tf;
    int i;

    (void)state;
    for (i = 0; i < 2; i++) {
        flag[0] = i == 0;
        y[0] = y[1] = 0;
        tf_init(&tf);
        tf_add_buffer(&tf, XLA_FFI_DataType_S32, x, 1, dims, y);
        tf_add_arg(&tf, XLA_FFI_DataType_S32, flag, 0, NULL);
        tf_add_u64(&tf, "callback_id", sink_id);
        tf_add_attr(&tf, "elsewhere", XLA_FFI_AttrType_STRING, &elsewhere);
        tf_add_attr(&tf, "unkept", XLA_FFI_AttrType_STRING, &unkept);
        copies = atomic_load(&fake_cuda_counts.copies);
        if (i == 0) {
            assert_int_not_equal(run_body(&tf, "hcb_sharded_check",
                                          hcb__sharded_check_body,
                                          &hcb__platform_cuda, msg),
                                 0);
            assert_string_equal(msg, where);
            /* the flag was read through a copy from the device */
            assert_true(atomic_load(&fake_cuda_counts.copies) > copies);
        } else {
            assert_int_equal(run_body(&tf, "hcb_sharded_check",
                                      hcb__sharded_check_body,
                                      &hcb__platform_cuda, msg),
                             0);
            fake_stream_drain(stream);
            assert_true(y[0] == 5 && y[1] == 6);
        }
    }
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

/* A call that the devices of a computation share (attributes runner and
 * participants): the runner copies its operands to the host and runs it;
 * the other device copies no operand, takes the runner's results and
 * copies them to its own memory, in its stream's order.  A call in place
 * on the device's buffers cannot be shared. */
typedef struct cuda_sharer {
    int32_t ordinal;
    fake_stream *stream;
    const hcb__platform *platform;
    float in[2], out[2];
    int rc;
    char msg[HCB_ERROR_MESSAGE_SIZE];
} cuda_sharer;

static void *
cuda_share_call(void *p)
{
    cuda_sharer *d = p;
    hcb__handler h = {d->platform, rt};
    int64_t dims[1] = {2};
    test_frame tf;

    test_thread_ordinal = d->ordinal;
    test_thread_stream = d->stream;
    tf_init(&tf);
    tf_add_arg(&tf, XLA_FFI_DataType_F32, d->in, 1, dims);
    tf_add_ret(&tf, XLA_FFI_DataType_F32, d->out, 1, dims);
    tf_add_u64(&tf, "callback_id", double_id);
    tf_add_i64(&tf, "participants", 2);
    tf_add_u64(&tf, "runner", HCB_DEVICE(HCB_PLATFORM_CUDA, 3));
    d->rc =
        tf_error_code(hcb__run_as_is(&tf.frame, "hcb_call", hcb__call_body, &h),
                      d->msg, HCB_ERROR_MESSAGE_SIZE);
    return NULL;
}

static void
test_a_shared_call_is_run_by_its_runner_alone(void **state)
{
    fake_stream *other = fake_stream_new_on(4);
    cuda_sharer d[2] = {
        {3, stream, &hcb__platform_cuda, {1.5f, 2.5f}, {0, 0}, -1, ""},
        {4, other, &hcb__platform_cuda, {9, 9}, {0, 0}, -1, ""}};
    pthread_t threads[2];
    int i;

    (void)state;
    for (i = 0; i < 2; i++)
        pthread_create(&threads[i], NULL, cuda_share_call, &d[i]);
    for (i = 0; i < 2; i++)
        pthread_join(threads[i], NULL);
    fake_stream_drain(stream);
    fake_stream_drain(other);
    for (i = 0; i < 2; i++) {
        assert_int_equal(d[i].rc, 0);
        assert_true(d[i].out[0] == 3.0f && d[i].out[1] == 5.0f);
    }
    /* one copy of the operands (the runner's), one of the results each */
    assert_int_equal(atomic_load(&fake_cuda_counts.copies), 3);

    d[0].platform = &hcb__platform_cuda_in_place;
    cuda_share_call(&d[0]);
    test_thread_ordinal = -1;
    test_thread_stream = NULL;
    assert_int_not_equal(d[0].rc, 0);
    assert_string_equal(d[0].msg, "hcb_buffer_call: a call in place on GPU "
                                  "buffers cannot be shared by the devices "
                                  "of a computation");
    hcb__cuda_landing_stop(); /* nothing waits on `other` any more */
    fake_stream_free(other);
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

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_call_stages_through_host_memory,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_a_shared_call_is_run_by_its_runner_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_call_runs_after_the_taps_before_it,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_failing_call_target_fails_with_its_message, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_buffer_call_works_in_place_on_the_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ordinal_is_written_on_the_stream,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_the_sharded_check_reads_the_failure_flag_from_the_device,
            setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
