/* test_ffi_call.c - the hcb_call handler and hcb_runtime_call fed
 * hand-built call frames. */
#include "testutil.h"

#include "frame.h"
#include "ffi/handlers.h"

static hcb_runtime *rt;
static tu_sink *sink;
static uint64_t tap_id, double_id, fail_id, count_id;

/* What the last call saw. */
static hcb_device seen_device;
static size_t seen_nargs, seen_nresults;
static size_t taps_seen_at_call; /* sink->n when the call ran */

/* results[0] = 2 * args[0] (f32), results[1] = number of elements (s32). */
static int
double_fn(void *user, hcb_device device, const hcb_array *args, size_t nargs,
          const hcb_array *results, size_t nresults, hcb_error *err)
{
    const float *in = args[0].data;
    float *out = results[0].data;
    size_t i, n = args[0].nbytes / sizeof(float);

    (void)user;
    seen_device = device;
    seen_nargs = nargs;
    seen_nresults = nresults;
    if (nargs != 1 || nresults != 2 || args[0].dtype != HCB_F32 ||
        results[0].nbytes != args[0].nbytes || results[1].dtype != HCB_S32)
        return hcb_error_set(err, HCB_EINVAL, "double_fn: unexpected frame");
    for (i = 0; i < n; i++)
        out[i] = 2.0f * in[i];
    *(int32_t *)results[1].data = (int32_t)n;
    return HCB_OK;
}

/* Counts its operands into results[0] (s64) and notes how many taps the
 * sink had delivered when it ran. */
static int
count_fn(void *user, hcb_device device, const hcb_array *args, size_t nargs,
         const hcb_array *results, size_t nresults, hcb_error *err)
{
    (void)user, (void)device, (void)args, (void)err;
    pthread_mutex_lock(&sink->mu);
    taps_seen_at_call = sink->n;
    pthread_mutex_unlock(&sink->mu);
    if (nresults > 0)
        *(int64_t *)results[0].data = (int64_t)nargs;
    return HCB_OK;
}

static uint64_t
add_call(hcb_call_fn fn, const char *name)
{
    hcb_call_target t = HCB_CALL_TARGET_INIT;
    uint64_t id = 0;

    t.fn = fn;
    t.name = name;
    t.name_len = strlen(name);
    assert_int_equal(hcb_runtime_register_call(rt, &t, &id, NULL), HCB_OK);
    return id;
}

static int
setup(void **state)
{
    hcb_tap_target t = HCB_TAP_TARGET_INIT;

    (void)state;
    assert_int_equal(hcb_runtime_create(NULL, &rt, NULL), HCB_OK);
    sink = tu_sink_new();
    t.fn = tu_sink_fn;
    t.user = sink;
    assert_int_equal(hcb_runtime_register_tap(rt, &t, &tap_id, NULL), HCB_OK);
    double_id = add_call(double_fn, "double_fn");
    fail_id = add_call(tu_fail_fn, "fail_fn");
    count_id = add_call(count_fn, "count_fn");
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
        hcb__run_as_is(&tf->frame, "hcb_call", hcb__call_body, &h), msg,
        HCB_ERROR_MESSAGE_SIZE);
}

static void
test_answers_metadata_probe_with_0_3(void **state)
{
    (void)state;
    assert_int_equal(tf_probe(hcb_ffi_call), TF_PROBE_MINOR);
}

static void
test_call_fills_the_results(void **state)
{
    float x[3] = {1.5f, -2.0f, 4.0f}, y[3] = {0, 0, 0};
    int32_t n = 0;
    int64_t dx[1] = {3};
    char msg[HCB_ERROR_MESSAGE_SIZE];
    test_frame tf;

    (void)state;
    tf_init(&tf);
    tf_add_arg(&tf, XLA_FFI_DataType_F32, x, 1, dx);
    tf_add_ret(&tf, XLA_FFI_DataType_F32, y, 1, dx);
    tf_add_ret(&tf, XLA_FFI_DataType_S32, &n, 0, NULL);
    tf_add_u64(&tf, "callback_id", double_id);
    test_device_ordinal = 3;
    assert_int_equal(run(&tf, msg), 0);
    test_device_ordinal = 0;
    assert_true(y[0] == 3.0f && y[1] == -4.0f && y[2] == 8.0f);
    assert_int_equal(n, 3);
    assert_int_equal(seen_device, HCB_DEVICE(HCB_PLATFORM_CPU, 3));
    assert_int_equal(seen_nargs, 1);
    assert_int_equal(seen_nresults, 2);
    assert_int_equal(hcb_runtime_take_error(rt, NULL), 0);
}

/* The lowering adds a token operand and a token result to order callbacks
 * (python/host_callback/_order.py): the call target never sees them. */
static void
test_order_tokens_are_not_passed_to_the_target(void **state)
{
    float x[3] = {1.0f, 2.0f, 3.0f}, y[3] = {0, 0, 0};
    int32_t n = 0;
    int64_t dx[1] = {3};
    char msg[HCB_ERROR_MESSAGE_SIZE];
    test_frame tf;

    (void)state;
    tf_init(&tf);
    tf_add_arg(&tf, XLA_FFI_DataType_F32, x, 1, dx);
    tf_add_arg(&tf, XLA_FFI_DataType_TOKEN, NULL, 0, NULL);
    tf_add_ret(&tf, XLA_FFI_DataType_F32, y, 1, dx);
    tf_add_ret(&tf, XLA_FFI_DataType_S32, &n, 0, NULL);
    tf_add_ret(&tf, XLA_FFI_DataType_TOKEN, NULL, 0, NULL);
    tf_add_u64(&tf, "callback_id", double_id);
    assert_int_equal(run(&tf, msg), 0);
    assert_int_equal(seen_nargs, 1);
    assert_int_equal(seen_nresults, 2);
    assert_true(y[2] == 6.0f);
    assert_int_equal(n, 3);
}

static void
test_failing_target_fails_the_call_and_is_recorded(void **state)
{
    char msg[HCB_ERROR_MESSAGE_SIZE];
    hcb_error last;
    test_frame tf;

    (void)state;
    tf_init(&tf);
    tf_add_u64(&tf, "callback_id", fail_id);
    assert_int_equal(run(&tf, msg), XLA_FFI_Error_Code_UNKNOWN);
    assert_string_equal(msg, "fail_fn said no");
    assert_int_equal(hcb_runtime_take_error(rt, &last), 1);
    assert_string_equal(last.message, "fail_fn said no");
    /* The runtime goes on: the next call works. */
    tf_init(&tf);
    tf_add_u64(&tf, "callback_id", count_id);
    assert_int_equal(run(&tf, msg), 0);
}

static void
test_unknown_ids_and_tap_ids_are_refused(void **state)
{
    char msg[HCB_ERROR_MESSAGE_SIZE];
    test_frame tf;

    (void)state;
    tf_init(&tf);
    tf_add_u64(&tf, "callback_id", 999999);
    assert_int_equal(run(&tf, msg), XLA_FFI_Error_Code_NOT_FOUND);
    assert_non_null(strstr(msg, "unknown call id 999999"));
    tf_init(&tf);
    tf_add_u64(&tf, "callback_id", tap_id);
    assert_int_equal(run(&tf, msg), XLA_FFI_Error_Code_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "not a call target"));
    /* ... and a call id is no tap: a record for it is dropped, recorded. */
    {
        hcb_record *rec;

        assert_int_equal(
            hcb_record_create(count_id, HCB_DEVICE(0, 0), NULL, 0, &rec, NULL),
            HCB_OK);
        assert_int_equal(hcb_runtime_submit(rt, rec, NULL), HCB_OK);
        assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL),
                         HCB_OK);
        assert_int_equal(hcb_runtime_take_error(rt, NULL), 1);
    }
}

static void
test_malformed_frames_fail_cleanly(void **state)
{
    char msg[HCB_ERROR_MESSAGE_SIZE];
    int64_t neg[1] = {-1};
    float x = 0;
    test_frame tf;

    (void)state;
    tf_init(&tf); /* no callback_id */
    assert_int_equal(run(&tf, msg), XLA_FFI_Error_Code_NOT_FOUND);
    assert_non_null(strstr(msg, "missing attribute 'callback_id'"));

    tf_init(&tf);
    tf_add_i64(&tf, "callback_id", 1); /* wrong attribute type */
    assert_int_equal(run(&tf, msg), XLA_FFI_Error_Code_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "is an int64 scalar, expected a uint64"));

    tf_init(&tf);
    tf_add_ret(&tf, XLA_FFI_DataType_F32, &x, 1, neg);
    tf_add_u64(&tf, "callback_id", count_id);
    assert_int_equal(run(&tf, msg), XLA_FFI_Error_Code_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "hcb_call: result 0: buffer dimension 0"));

    tf_init(&tf);
    tf_add_arg(&tf, XLA_FFI_DataType_F32, &x, 0, NULL);
    tf.arg_types[0] = XLA_FFI_ArgType_BUFFER + 1;
    tf_add_u64(&tf, "callback_id", count_id);
    assert_int_equal(run(&tf, msg), XLA_FFI_Error_Code_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "operand 0 is not a buffer"));

    tf_init(&tf);
    tf_add_u64(&tf, "callback_id", count_id);
    tf.frame.stage = XLA_FFI_ExecutionStage_PREPARE;
    assert_int_equal(run(&tf, msg), XLA_FFI_Error_Code_INVALID_ARGUMENT);
    assert_int_equal(hcb_runtime_take_error(rt, NULL), 0);
}

static void
test_many_operands_use_the_heap_and_survive_oom(void **state)
{
    int32_t v[20];
    int64_t count = 0;
    char msg[HCB_ERROR_MESSAGE_SIZE];
    test_frame tf;
    int i;

    (void)state;
    tf_init(&tf);
    for (i = 0; i < 20; i++) {
        v[i] = i;
        tf_add_arg(&tf, XLA_FFI_DataType_S32, &v[i], 0, NULL);
    }
    tf_add_ret(&tf, XLA_FFI_DataType_S64, &count, 0, NULL);
    tf_add_u64(&tf, "callback_id", count_id);
    tu_install_allocator();
    tu_fail_alloc_after(0);
    assert_int_equal(run(&tf, msg), XLA_FFI_Error_Code_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(msg, "cannot allocate 21 array views"));
    tu_fail_alloc_after(-1);
    assert_int_equal(run(&tf, msg), 0);
    assert_int_equal(count, 20);
    assert_int_equal(atomic_load(&tu_live_allocs), 0);
    hcb_set_allocator(NULL);
}

/* A call runs after the taps its device issued before it. */
static void
test_call_waits_for_the_devices_earlier_taps(void **state)
{
    int32_t v = 5;
    hcb_array a = {HCB_S32, 0, NULL, &v, sizeof v};
    char msg[HCB_ERROR_MESSAGE_SIZE];
    size_t before;
    test_frame tf;
    int i;

    (void)state;
    pthread_mutex_lock(&sink->mu);
    before = sink->n;
    pthread_mutex_unlock(&sink->mu);
    sink->delay_us = 20000;
    for (i = 0; i < 5; i++) {
        hcb_record *rec;

        assert_int_equal(
            hcb_record_create(tap_id, HCB_DEVICE(0, 2), &a, 1, &rec, NULL),
            HCB_OK);
        assert_int_equal(hcb_runtime_submit(rt, rec, NULL), HCB_OK);
    }
    tf_init(&tf);
    tf_add_u64(&tf, "callback_id", count_id);
    test_device_ordinal = 2;
    assert_int_equal(run(&tf, msg), 0);
    test_device_ordinal = 0;
    assert_int_equal(taps_seen_at_call, before + 5);
    sink->delay_us = 0;
}

static void
test_device_ordinal_handler(void **state)
{
    int32_t out = -1;
    char msg[HCB_ERROR_MESSAGE_SIZE];
    test_frame tf;

    (void)state;
    assert_int_equal(tf_probe(hcb_ffi_ordinal_handler), TF_PROBE_MINOR);
    tf_init(&tf);
    tf_add_ret(&tf, XLA_FFI_DataType_S32, &out, 0, NULL);
    test_device_ordinal = 7;
    assert_int_equal(
        tf_error_code(hcb_ffi_ordinal_handler(&tf.frame), msg, sizeof msg), 0);
    test_device_ordinal = 0;
    assert_int_equal(out, 7);
    tf_init(&tf); /* no result */
    assert_int_equal(
        tf_error_code(hcb_ffi_ordinal_handler(&tf.frame), msg, sizeof msg),
        XLA_FFI_Error_Code_INVALID_ARGUMENT);
}

/* Registers fail_fn with the default runtime and runs it as a call that
 * one device makes for `ndevices` (hcb_runtime_call_parked): its failure is
 * parked for them.  Returns its id. */
static uint64_t
park_a_failure(int64_t ndevices)
{
    hcb_call_target t = HCB_CALL_TARGET_INIT;
    uint64_t id;
    hcb_error err;
    int parked = -1;

    t.fn = tu_fail_fn;
    t.name = "fail_fn";
    t.name_len = 7;
    assert_int_equal(
        hcb_runtime_register_call(hcb_runtime_default(), &t, &id, NULL),
        HCB_OK);
    assert_int_equal(hcb_runtime_call_parked(hcb_runtime_default(), id,
                                             HCB_DEVICE(0, 1), NULL, 0, NULL, 0,
                                             ndevices, &parked, &err),
                     HCB_ECALLBACK);
    assert_int_equal(parked, 1);
    return id;
}

/* A parked call's failure is raised once by each device; a second run
 * that fails before the first's devices took it adds its own devices. */
static void
test_parked_call_failure_is_raised_by_every_device(void **state)
{
    hcb_runtime *def = hcb_runtime_default();
    float x[2] = {1, 2}, y[2] = {0, 0};
    int64_t d[1] = {2};
    char msg[HCB_ERROR_MESSAGE_SIZE];
    uint64_t id;
    hcb_error err;
    int parked = -1, i;
    test_frame tf;

    (void)state;
    id = park_a_failure(3);
    assert_int_equal(hcb_runtime_call_parked(def, id, HCB_DEVICE(0, 1), NULL, 0,
                                             NULL, 0, 2, &parked, &err),
                     HCB_ECALLBACK);
    assert_int_equal(parked, 1);
    for (i = 0; i < 6; i++) {
        tf_init(&tf);
        tf_add_buffer(&tf, XLA_FFI_DataType_F32, x, 1, d, y);
        tf_add_u64(&tf, "callback_id", id);
        if (i < 5) { /* each of the 3 + 2 devices raises it */
            assert_int_equal(tf_error_code(hcb_ffi_sharded_check(&tf.frame),
                                           msg, sizeof msg),
                             XLA_FFI_Error_Code_UNKNOWN);
            assert_string_equal(msg, "fail_fn said no");
        } else { /* then it is gone: operands pass through */
            assert_int_equal(tf_error_code(hcb_ffi_sharded_check(&tf.frame),
                                           msg, sizeof msg),
                             0);
            assert_true(y[0] == 1.0f && y[1] == 2.0f);
        }
    }
    hcb_runtime_take_error(def, NULL);
}

/* Where the call's flag `failed` was spread with its results (the devices
 * of several processes), a device raises the failure parked for it, or,
 * when its process holds none, the message of attribute `elsewhere` (flag
 * 1: parked in the runner's process) or `unkept` (flag 2: not parked); a
 * flag of 0 passes the results through. */
static void
test_a_spread_failure_flag_fails_the_devices_of_every_process(void **state)
{
    static const char where[] = "it failed in process 1";
    static const char lost[] = "it failed, not kept";
    static const struct {
        int32_t flag;
        bool attrs;
        const char *want; /* NULL: passes */
    } cases[] = {
        {1, true, "fail_fn said no"}, /* this process's 2 devices */
        {1, true, "fail_fn said no"},
        {1, true, where}, /* none left here */
        {2, true, lost},
        {0, true, NULL},
        {0, false, NULL},
    };
    hcb_runtime *def = hcb_runtime_default();
    XLA_FFI_ByteSpan elsewhere = {where, sizeof where - 1};
    XLA_FFI_ByteSpan unkept = {lost, sizeof lost - 1};
    float x[2] = {1, 2}, y[2];
    int64_t d[1] = {2};
    int32_t flag;
    char msg[HCB_ERROR_MESSAGE_SIZE];
    uint64_t id;
    size_t i;
    test_frame tf;

    (void)state;
    id = park_a_failure(2);
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        flag = cases[i].flag;
        y[0] = y[1] = 0;
        tf_init(&tf);
        tf_add_buffer(&tf, XLA_FFI_DataType_F32, x, 1, d, y);
        tf_add_arg(&tf, XLA_FFI_DataType_S32, &flag, 0, NULL);
        tf_add_u64(&tf, "callback_id", id);
        if (cases[i].attrs) {
            tf_add_attr(&tf, "elsewhere", XLA_FFI_AttrType_STRING, &elsewhere);
            tf_add_attr(&tf, "unkept", XLA_FFI_AttrType_STRING, &unkept);
        }
        if (cases[i].want != NULL) {
            assert_int_equal(tf_error_code(hcb_ffi_sharded_check(&tf.frame),
                                           msg, sizeof msg),
                             XLA_FFI_Error_Code_UNKNOWN);
            assert_string_equal(msg, cases[i].want);
        } else {
            assert_int_equal(tf_error_code(hcb_ffi_sharded_check(&tf.frame),
                                           msg, sizeof msg),
                             0);
            assert_true(y[0] == 1.0f && y[1] == 2.0f);
        }
    }
    flag = 1; /* a failure without the attribute to say where */
    tf_init(&tf);
    tf_add_buffer(&tf, XLA_FFI_DataType_F32, x, 1, d, y);
    tf_add_arg(&tf, XLA_FFI_DataType_S32, &flag, 0, NULL);
    tf_add_u64(&tf, "callback_id", id);
    assert_int_not_equal(
        tf_error_code(hcb_ffi_sharded_check(&tf.frame), msg, sizeof msg), 0);
    assert_non_null(strstr(msg, "hcb_sharded_check: "));
    assert_non_null(strstr(msg, "elsewhere"));
    hcb_runtime_take_error(def, NULL);
}

/* Attributes runner and participants (jit over sharded operands): each
 * device's handler makes the call on the whole operands, one of them runs
 * it for the runner -- with attribute first_runs, on the CPU, the first to
 * come (hcb_share.first_runs); without, the runner itself, on its own
 * operands -- and the other devices' results are a copy of its. */
typedef struct sharing_device {
    int32_t ordinal;
    float x[2], y[2];
    int32_t n;
    int rc;
    int64_t first_runs;
} sharing_device;

static void *
share_call(void *p)
{
    sharing_device *d = p;
    int64_t dx[1] = {2};
    char msg[HCB_ERROR_MESSAGE_SIZE];
    test_frame tf;

    test_thread_ordinal = d->ordinal;
    test_thread_run_id = 10 + d->first_runs; /* a launch per mode */
    tf_init(&tf);
    tf_add_arg(&tf, XLA_FFI_DataType_F32, d->x, 1, dx);
    tf_add_ret(&tf, XLA_FFI_DataType_F32, d->y, 1, dx);
    tf_add_ret(&tf, XLA_FFI_DataType_S32, &d->n, 0, NULL);
    tf_add_u64(&tf, "callback_id", double_id);
    tf_add_i64(&tf, "participants", 2);
    tf_add_u64(&tf, "runner", HCB_DEVICE(HCB_PLATFORM_CPU, 1));
    if (d->first_runs >= 0)
        tf_add_i64(&tf, "first_runs", d->first_runs);
    d->rc = run(&tf, msg);
    return NULL;
}

static void
test_a_call_with_a_runner_is_shared_by_its_devices(void **state)
{
    /* the whole operands on each, with first_runs; without it (0 or no
     * attribute), device 0's differ and the runner's are the ones used */
    const int64_t modes[3] = {1, 0, -1};
    sharing_device d[2];
    pthread_t threads[2];
    int i, m;

    (void)state;
    for (m = 0; m < 3; m++) {
        sharing_device init[2] = {{0, {1.5f, -2}, {0, 0}, 0, -1, modes[m]},
                                  {1, {1.5f, -2}, {0, 0}, 0, -1, modes[m]}};

        memcpy(d, init, sizeof d);
        if (modes[m] != 1)
            d[0].x[0] = d[0].x[1] = 5;
        for (i = 0; i < 2; i++)
            pthread_create(&threads[i], NULL, share_call, &d[i]);
        for (i = 0; i < 2; i++)
            pthread_join(threads[i], NULL);
        for (i = 0; i < 2; i++) {
            assert_int_equal(d[i].rc, 0);
            assert_true(d[i].y[0] == 3.0f && d[i].y[1] == -4.0f);
            assert_int_equal(d[i].n, 2);
        }
        assert_int_equal(seen_device, HCB_DEVICE(HCB_PLATFORM_CPU, 1));
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_answers_metadata_probe_with_0_3),
        cmocka_unit_test(test_call_fills_the_results),
        cmocka_unit_test(test_order_tokens_are_not_passed_to_the_target),
        cmocka_unit_test(test_failing_target_fails_the_call_and_is_recorded),
        cmocka_unit_test(test_unknown_ids_and_tap_ids_are_refused),
        cmocka_unit_test(test_malformed_frames_fail_cleanly),
        cmocka_unit_test(test_many_operands_use_the_heap_and_survive_oom),
        cmocka_unit_test(test_call_waits_for_the_devices_earlier_taps),
        cmocka_unit_test(test_device_ordinal_handler),
        cmocka_unit_test(test_parked_call_failure_is_raised_by_every_device),
        cmocka_unit_test(
            test_a_spread_failure_flag_fails_the_devices_of_every_process),
        cmocka_unit_test(test_a_call_with_a_runner_is_shared_by_its_devices),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
