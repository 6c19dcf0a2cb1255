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
static uint64_t sink_id, keep_id, double_id, fail_id, in_place_id, gate_id;

/* A tap function that waits until the gate opens (a slow consumer). */
static atomic_bool gate_open;
static atomic_int gate_seen;

static int
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

static int
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

static int
run_body(test_frame *tf, const char *name, hcb_ffi_body_ctx body,
         const hcb__platform *p, char *msg)
{
    hcb__handler h = {p, rt};

    return tf_error_code(hcb__run_as_is(&tf->frame, name, body, &h), msg,
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

/* After taps of the values 0 .. n - 1 into the sink: once the stream has
 * run and the runtime delivered, the sink has each, in order, and nothing
 * waited for the stream. */
static void
expect_in_order_without_syncs(int n)
{
    int i;

    fake_stream_drain(stream);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(tu_sink_count(sink), (size_t)n);
    for (i = 0; i < n; i++)
        assert_int_equal(sink->first_value[i], i);
    assert_int_equal(atomic_load(&fake_cuda_counts.syncs), 0);
}

static void
test_cuda_handlers_answer_the_metadata_probe(void **state)
{
    (void)state;
    assert_int_equal(tf_probe(hcb_ffi_tap_cuda), TF_PROBE_MINOR);
    assert_int_equal(tf_probe(hcb_ffi_call_cuda), TF_PROBE_MINOR);
    assert_int_equal(tf_probe(hcb_ffi_buffer_call_cuda), TF_PROBE_MINOR);
    assert_int_equal(tf_probe(hcb_ffi_ordinal_handler_cuda), TF_PROBE_MINOR);
    assert_int_equal(tf_probe(hcb_ffi_sharded_check_cuda), TF_PROBE_MINOR);
}

/* The handler returns with the copy still queued on a busy stream, and
 * enqueues nothing the stream would wait for (an event, which the lander
 * waits for); the record arrives, with the device's values, once the
 * stream gets there, and a barrier after the stream finds it queued. */
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
    assert_int_equal(atomic_load(&fake_cuda_counts.event_records), 1);
    tu_sleep_us(20000);
    assert_int_equal(tu_sink_count(sink), 0);
    /* a barrier waits for the taps whose copies are done, not this one */
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(tu_sink_count(sink), 0);
    fake_stream_hold(stream, false);
    fake_stream_drain(stream);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(tu_sink_count(sink), 1);
    assert_int_equal(sink->first_value[0], 41);
    assert_true(sink->device[0] == DEVICE);
    assert_int_equal(atomic_load(&fake_cuda_counts.host_allocs), 1);
}

/* A tap delivered now (attribute deliver = `mode`) of one int32[n] array on
 * the stream. */
static int
tap_now(int32_t *device_data, int64_t n, uint64_t id, int64_t mode, char *msg)
{
    int64_t dims[1] = {n};
    test_frame tf;

    tf_init(&tf);
    tf_add_buffer(&tf, XLA_FFI_DataType_S32, device_data, 1, dims, NULL);
    tf_add_u64(&tf, "callback_id", id);
    tf_add_i64(&tf, "deliver", mode);
    tf_add_i64(&tf, "ntapped", 1);
    return run_body(&tf, "hcb_tap", hcb__tap_body, &hcb__platform_cuda, msg);
}

typedef struct now_job {
    int32_t *data;
    atomic_int done;
    int rc;
} now_job;

static void *
tap_now_on_stream(void *arg)
{
    now_job *j = arg;
    char msg[HCB_ERROR_MESSAGE_SIZE];

    j->rc = tap_now(j->data, 1, sink_id, 1, msg);
    atomic_store(&j->done, 1);
    return NULL;
}

/* A tap delivered now (the drop-ins) waits for its copy on XLA's thread,
 * the one synchronisation it costs, and then for the device's earlier taps,
 * and runs its function there: when the handler returns, it has run, after
 * the tap queued before it.  It enqueues no host function: nothing on the
 * stream waits for a tap function. */
static void
test_a_tap_delivered_now_waits_for_the_stream_on_xlas_thread(void **state)
{
    int32_t x[2] = {51, 52};
    char msg[HCB_ERROR_MESSAGE_SIZE];
    now_job j = {&x[1], 0, -1};
    pthread_t t;

    (void)state;
    sink->delay_us = 5000;
    fake_stream_hold(stream, true);
    assert_int_equal(tap(x, 1, sink_id, msg), 0);
    assert_int_equal(atomic_load(&fake_cuda_counts.syncs), 0);
    assert_int_equal(pthread_create(&t, NULL, tap_now_on_stream, &j), 0);
    tu_sleep_us(20000);
    assert_false(atomic_load(&j.done)); /* the copies have not landed */
    fake_stream_hold(stream, false);
    pthread_join(t, NULL);
    assert_int_equal(j.rc, 0);
    assert_int_equal(tu_sink_count(sink), 2); /* both delivered, no barrier */
    assert_int_equal(sink->first_value[0], 51);
    assert_int_equal(sink->first_value[1], 52);
    assert_int_equal(atomic_load(&fake_cuda_counts.syncs), 1);
    assert_int_equal(atomic_load(&fake_cuda_counts.event_records), 1);
    sink->delay_us = 0;
}

/* Its function's failure fails the computation (deliver=1), or is only
 * recorded (deliver=2); its pinned memory goes back either way. */
static void
test_a_tap_delivered_now_fails_its_computation(void **state)
{
    int32_t x[1] = {7};
    char msg[HCB_ERROR_MESSAGE_SIZE];
    hcb_error last;

    (void)state;
    (void)hcb_runtime_take_error(rt, NULL);
    sink->fail_on = 7;
    assert_int_not_equal(tap_now(x, 1, sink_id, 1, msg), 0);
    assert_string_equal(msg, "sink refused value 7");
    assert_int_equal(tap_now(x, 1, sink_id, 2, msg), 0);
    assert_int_equal(hcb_runtime_take_error(rt, &last), 2);
    sink->fail_on = -1;
    assert_int_equal(tap_now(x, 1, sink_id, 1, msg), 0);
    assert_int_equal(tu_sink_count(sink), 3);
    assert_int_equal(atomic_load(&fake_cuda_counts.event_records), 0);
}

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
    expect_in_order_without_syncs(1000);
    assert_int_equal(atomic_load(&fake_cuda_counts.host_allocs), 1);
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

static void *
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
 * within `ms` milliseconds (polled: under valgrind on a busy machine the
 * tapper can take much longer than usual to get there). */
static bool
pool_made_a_thread_wait(int32_t ordinal, int ms)
{
    hcb__pinned_stats ps;
    int i;

    for (i = 0; i < ms; i++) {
        if (hcb__pinned_get_stats(ordinal, &ps) && ps.waits >= 1)
            return true;
        tu_sleep_us(1000);
    }
    return false;
}

/* With the stream held, the pool fills: the device's thread waits for room
 * (back-pressure) and goes on when the stream runs; nothing is lost. */
static void
test_a_full_pool_makes_the_device_wait(void **state)
{
    static int32_t big[32768]; /* 128 KiB: 7 fit in the 1 MiB pool */
    tapper t = {big, 32768, 20, 0, 0, 0, NULL};
    pthread_t th;

    (void)state;
    big[0] = 5;
    fake_stream_hold(stream, true);
    pthread_create(&th, NULL, tapper_main, &t);
    assert_true(pool_made_a_thread_wait(3, 10000));
    assert_true(atomic_load(&t.done) < 20);
    assert_int_equal(tu_sink_count(sink), 0);
    fake_stream_hold(stream, false);
    pthread_join(th, NULL);
    fake_stream_drain(stream);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(atomic_load(&t.done), 20);
    assert_int_equal(tu_sink_count(sink), 20);
    assert_int_equal(sink->first_value[19], 5);
    assert_int_equal(atomic_load(&fake_cuda_counts.syncs), 0);
}

/* With the device's queue full, the waiting is XLA's thread's, before it
 * enqueues a tap, as on CPU: the stream never waits (its host functions
 * only hand records over), so everything enqueued on it runs. */
static void
test_a_full_queue_makes_xla_thread_wait_never_the_stream(void **state)
{
    static int32_t x[4096]; /* 16 KiB */
    tapper t = {x, 4096, 20, 0, 0, 0, NULL};
    hcb_stats st = HCB_STATS_INIT;
    hcb__pinned_stats ps;
    bool waiting, stream_idle;
    pthread_t th;

    (void)state;
    t.id = gate_id;
    atomic_store(&gate_open, false);
    assert_int_equal(hcb_runtime_set_max_queue_bytes(rt, 64 << 10, NULL),
                     HCB_OK);
    pthread_create(&th, NULL, tapper_main, &t);
    tu_sleep_us(200000);
    waiting = atomic_load(&t.done) < 20;                 /* XLA's thread ... */
    stream_idle = fake_stream_idle_within(stream, 2000); /* ... not CUDA's */
    atomic_store(&gate_open, true);
    pthread_join(th, NULL);
    assert_true(waiting);
    assert_true(stream_idle);
    fake_stream_drain(stream);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(atomic_load(&t.done), 20);
    assert_int_equal(atomic_load(&gate_seen), 20);
    assert_int_equal(hcb_runtime_stats(rt, DEVICE, &st, NULL), HCB_OK);
    assert_true(st.producer_waits >= 1);
    assert_true(st.high_water_bytes <= 64 << 10);
    assert_int_equal(atomic_load(&fake_cuda_counts.syncs), 0);
    assert_true(hcb__pinned_get_stats(3, &ps));
    assert_int_equal(ps.syncs, 0);
}

/* Taps from a thread of their own, keeping the message of the first that
 * fails. */
typedef struct failing_tapper {
    int32_t *data;
    int64_t n;
    uint64_t id;
    int count;
    atomic_int done, failed;
    char first_error[HCB_ERROR_MESSAGE_SIZE];
} failing_tapper;

static void *
failing_tapper_main(void *arg)
{
    failing_tapper *t = arg;
    char msg[HCB_ERROR_MESSAGE_SIZE];
    int i;

    for (i = 0; i < t->count; i++) {
        if (tap(t->data, t->n, t->id, msg) == 0) {
            atomic_fetch_add(&t->done, 1);
        } else if (atomic_fetch_add(&t->failed, 1) == 0) {
            memcpy(t->first_error, msg, sizeof msg);
        }
    }
    return NULL;
}

/* The runtime's interrupt check of the test: says stop once asked to. */
static atomic_bool stop_waits;
static atomic_int checks;

static int
stop_when_asked(void *user, hcb_device device, uint64_t *wait_state,
                hcb_error *err)
{
    (void)user, (void)wait_state;
    assert_int_equal(device, DEVICE);
    atomic_fetch_add(&checks, 1);
    if (!atomic_load(&stop_waits))
        return 0;
    hcb_error_set(err, HCB_ECALLBACK, "asked to stop");
    return 1;
}

/* Runs `t` until its taps wait (the check was asked), then has the check
 * say stop: every tap that waits then fails with the check's reason, the
 * others go through, and nothing is left reserved. */
static void
run_until_stopped(failing_tapper *t)
{
    pthread_t th;

    atomic_store(&stop_waits, false);
    atomic_store(&checks, 0);
    assert_int_equal(
        hcb_runtime_set_interrupt(rt, 5000000u, stop_when_asked, NULL, NULL),
        HCB_OK);
    pthread_create(&th, NULL, failing_tapper_main, t);
    tu_poll_at_least(&checks, 2, TU_PATIENCE_S);
    atomic_store(&stop_waits, true);
    pthread_join(th, NULL);
    assert_int_equal(hcb_runtime_set_interrupt(rt, 0, NULL, NULL, NULL),
                     HCB_OK);
    assert_true(atomic_load(&t->failed) >= 1);
    assert_int_equal(atomic_load(&t->done) + atomic_load(&t->failed), t->count);
    assert_non_null(strstr(t->first_error, ": asked to stop"));
}

/* Once the stream has run and the runtime delivered: nothing reserved. */
static void
expect_nothing_reserved(void)
{
    hcb_stats st = HCB_STATS_INIT;

    fake_stream_drain(stream);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(hcb_runtime_stats(rt, DEVICE, &st, NULL), HCB_OK);
    assert_int_equal(st.reserved_records, 0);
    assert_int_equal(st.queued_records, 0);
}

/* Every wait of the device's XLA thread can be stopped by the runtime's
 * interrupt check (Python's Ctrl-C): one for room in its pinned pool, one
 * for room in its queue.  The taps that waited fail and give back what
 * they took; those before them are delivered. */
static void
test_xla_thread_waits_stop_when_the_check_says_so(void **state)
{
    static int32_t big[32768]; /* 128 KiB: 7 fit in the 1 MiB pool */
    static int32_t x[4096];    /* 16 KiB */
    failing_tapper pool_wait = {big, 32768, 0, 20, 0, 0, ""};
    failing_tapper queue_wait = {x, 4096, 0, 20, 0, 0, ""};

    (void)state;
    pool_wait.id = sink_id;
    fake_stream_hold(stream, true);
    run_until_stopped(&pool_wait);
    assert_non_null(strstr(pool_wait.first_error,
                           "CUDA device 3 interrupted while waiting for room "
                           "in its pinned pool (1048576 bytes): asked to "
                           "stop"));
    fake_stream_hold(stream, false);
    expect_nothing_reserved();
    assert_int_equal(tu_sink_count(sink), (size_t)atomic_load(&pool_wait.done));

    queue_wait.id = gate_id;
    atomic_store(&gate_open, false);
    assert_int_equal(hcb_runtime_set_max_queue_bytes(rt, 64 << 10, NULL),
                     HCB_OK);
    run_until_stopped(&queue_wait);
    assert_non_null(strstr(queue_wait.first_error,
                           "bytes on gpu:3 interrupted while waiting for room "
                           "in its queue (bound 65536 bytes): asked to stop"));
    atomic_store(&gate_open, true);
    expect_nothing_reserved();
    assert_int_equal(atomic_load(&gate_seen), atomic_load(&queue_wait.done));
    assert_int_equal(atomic_load(&fake_cuda_counts.syncs), 0);
}

/* One record kept by its tap function holds its own bytes of the pool and
 * nothing else: 1,000 taps of 16 KiB through the 1 MiB pool after it never
 * wait for the stream. */
static void
test_a_kept_record_does_not_make_taps_synchronous(void **state)
{
    static int32_t small[4] = {7, 0, 0, 0};
    /* each tap's own "device memory": the copies land later */
    int32_t *x = malloc((size_t)1000 * 4096 * sizeof *x);
    char msg[HCB_ERROR_MESSAGE_SIZE];
    hcb_cuda_pool_stats cs = HCB_CUDA_POOL_STATS_INIT;
    hcb_error err;
    int i;

    (void)state;
    assert_int_equal(tap(small, 4, keep_id, msg), 0);
    fake_stream_drain(stream);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(atomic_load(&nkept), 1);
    for (i = 0; i < 1000; i++) {
        x[(size_t)i * 4096] = i;
        assert_int_equal(tap(&x[(size_t)i * 4096], 4096, sink_id, msg), 0);
    }
    expect_in_order_without_syncs(1000);
    assert_int_equal(hcb_cuda_get_pool_stats(3, &cs, &err), HCB_OK);
    assert_int_equal(cs.syncs, 0);
    assert_int_equal(cs.refusals, 0);
    assert_true(cs.kept_bytes > 0 && cs.kept_bytes <= 256); /* the kept one */
    assert_int_equal(cs.in_flight_bytes, 0);
    assert_int_equal(cs.capacity, 1 << 20);
    assert_int_equal(hcb_cuda_get_pool_stats(5, &cs, &err), HCB_ENOTFOUND);
    free(x);
}

/* Two devices, one of them held (its stream stopped, its pool full, its
 * XLA thread waiting): the other device's taps never wait for its pinned
 * memory, and reach their tap function. */
static void
test_a_held_device_never_holds_another(void **state)
{
    static int32_t big[32768]; /* 128 KiB: 7 fit in a 1 MiB pool */
    fake_stream *other = fake_stream_new_on(4);
    tapper held = {big, 32768, 20, 0, 0, 0, NULL};
    tapper free_one = {big, 32768, 20, 0, 0, 4, NULL};
    hcb__pinned_stats ps;
    pthread_t th_held, th_free;

    (void)state;
    free_one.stream = other;
    fake_stream_hold(stream, true);
    pthread_create(&th_held, NULL, tapper_main, &held);
    /* device 3 waits for its own blocks */
    assert_true(pool_made_a_thread_wait(3, 10000));
    pthread_create(&th_free, NULL, tapper_main, &free_one);
    tu_poll_at_least(&free_one.done, 20, TU_PATIENCE_S);
    assert_int_equal(atomic_load(&free_one.done), 20);
    pthread_join(th_free, NULL);
    fake_stream_drain(other);
    assert_int_equal(
        hcb_runtime_barrier(rt, HCB_DEVICE(HCB_PLATFORM_CUDA, 4), NULL),
        HCB_OK);
    assert_int_equal(tu_sink_count(sink), 20); /* device 4's, all */
    assert_true(atomic_load(&held.done) < 20); /* device 3 still held */
    fake_stream_hold(stream, false);
    pthread_join(th_held, NULL);
    fake_stream_drain(stream);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(tu_sink_count(sink), 40);
    assert_true(hcb__pinned_get_stats(4, &ps));
    assert_int_equal(ps.used, 0);
    hcb__cuda_landing_stop(); /* nothing waits on `other` any more */
    fake_stream_free(other);
}

/* hcb_cuda_stream_wait: work enqueued on a consumer's stream after it runs
 * after XLA's, though the host never waited for XLA's stream. */
static void
test_a_consumer_stream_waits_for_xla_stream(void **state)
{
    fake_stream *consumer = fake_stream_new_on(3);
    int32_t src = 5, on_device = 0, seen = 0;
    hcb_error err;

    (void)state;
    fake_stream_hold(stream, true);
    assert_int_equal(fake_cuda.memcpy_async(&on_device, &src, sizeof src,
                                            HCB__CUDA_D2D, stream),
                     0);
    assert_int_equal(hcb_cuda_stream_wait(3, consumer, stream, &err), HCB_OK);
    assert_int_equal(fake_cuda.memcpy_async(&seen, &on_device, sizeof seen,
                                            HCB__CUDA_D2D, consumer),
                     0);
    assert_false(fake_stream_idle_within(consumer, 100)); /* it waits */
    fake_stream_hold(stream, false);
    fake_stream_drain(stream);
    fake_stream_drain(consumer);
    assert_int_equal(seen, 5);
    assert_int_equal(atomic_load(&fake_cuda_counts.syncs), 0);
    assert_int_equal(atomic_load(&fake_cuda_counts.events), 1);
    assert_int_equal(atomic_load(&fake_cuda_counts.event_waits), 1);
    /* a stream is in order with itself: no event */
    assert_int_equal(hcb_cuda_stream_wait(3, stream, stream, &err), HCB_OK);
    assert_int_equal(atomic_load(&fake_cuda_counts.events), 1);
    fake_stream_free(consumer);
}

/* A thread whose current device is another one (a buffer callback that
 * switched device, on a machine with several GPUs) still orders the
 * streams of its call's device: the event is made on that device, and
 * the thread gets its own device back, also when CUDA refuses. */
static void
test_stream_wait_uses_the_streams_device_and_gives_the_thread_its_own(
    void **state)
{
    fake_stream *consumer = fake_stream_new_on(3);
    int device = -1;
    hcb_error err;

    (void)state;
    assert_int_equal(fake_cuda.set_device(5), 0); /* the callback's switch */
    assert_int_equal(hcb_cuda_stream_wait(3, consumer, stream, &err), HCB_OK);
    assert_int_equal(hcb_cuda_stream_wait(3, stream, consumer, &err), HCB_OK);
    assert_int_equal(fake_cuda.get_device(&device), 0);
    assert_int_equal(device, 5);
    assert_int_equal(atomic_load(&fake_cuda_counts.event_waits), 2);
    /* on the stream's device already: no switch */
    assert_int_equal(fake_cuda.set_device(3), 0);
    atomic_store(&fake_cuda_counts.set_devices, 0);
    assert_int_equal(hcb_cuda_stream_wait(3, consumer, stream, &err), HCB_OK);
    assert_int_equal(atomic_load(&fake_cuda_counts.set_devices), 0);
    /* a stream named with the wrong device: CUDA's error, and the thread
     * is back on its device */
    assert_int_equal(fake_cuda.set_device(5), 0);
    assert_int_equal(hcb_cuda_stream_wait(4, consumer, stream, &err),
                     HCB_ESYSTEM);
    assert_non_null(strstr(err.message, "making one CUDA stream wait for "
                                        "another: invalid resource handle"));
    assert_int_equal(fake_cuda.get_device(&device), 0);
    assert_int_equal(device, 5);
    assert_int_equal(hcb_cuda_stream_wait(99, consumer, stream, &err),
                     HCB_ESYSTEM);
    assert_non_null(strstr(err.message, "switching to CUDA device 99"));
    assert_int_equal(fake_cuda.set_device(0), 0);
    fake_stream_drain(stream);
    fake_stream_drain(consumer);
    fake_stream_free(consumer);
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
    if (tu_under_valgrind()) { /* it serialises the stand-in stream's thread */
        free(x);
        skip(); /* so the pool may be full: the no-wait premise fails */
    }
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
    assert_true(hcb__pinned_get_stats(3, &ps));
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
    assert_true(hcb__pinned_get_stats(3, &ps));
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
    atomic_store(&fake_cuda_fail_record_after, 0);
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

static int call(uint64_t id, float *in, float *out, int64_t n,
                const hcb__platform *platform, const char *name, char *msg);

/* A stream that never runs what a tap enqueued (the host functions of a
 * broken CUDA context never run) does not make the stop hang: it gives up
 * after its bound and says what it left.  The records, if they land after
 * all, are delivered by the next barrier. */
static void
test_stop_gives_up_on_taps_whose_stream_never_runs(void **state)
{
    int32_t x[2] = {11, 12};
    char msg[HCB_ERROR_MESSAGE_SIZE];
    tu_warned w = {0};

    (void)state;
    hcb_runtime_set_log(rt, tu_note_warning, &w);
    fake_stream_hold(stream, true);
    assert_int_equal(tap(&x[0], 1, sink_id, msg), 0);
    assert_int_equal(tap(&x[1], 1, sink_id, msg), 0);
    hcb__queue_set_reserved_wait(&hcb__channel_find(rt, DEVICE)->queue,
                                 200000000u); /* 0.2 s instead of 10 */
    assert_int_equal(hcb_runtime_stop(rt, NULL), HCB_OK);
    assert_int_equal(tu_sink_count(sink), 0);
    assert_int_equal(atomic_load(&w.count), 1);
    assert_non_null(strstr(w.message, "device gpu:3: the stop gave up "
                                      "waiting for 2 tap records"));
    assert_non_null(strstr(w.message, "did not land within 0.2 s"));
    fake_stream_hold(stream, false);
    fake_stream_drain(stream);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(tu_sink_count(sink), 2);
    assert_int_equal(sink->first_value[1], 12);
    assert_int_equal(hcb_runtime_stop(rt, NULL), HCB_OK);
    assert_int_equal(atomic_load(&w.count), 1); /* nothing left behind */
}

/* The device's XLA thread that has waited long for room in its pinned
 * pool is warned about, from the warning thread, naming the pool, what
 * holds it and the tap function running (one that ran a computation on
 * this device would never return); it goes on waiting. */
static void
test_a_long_wait_for_the_pool_is_warned_naming_what_holds_it(void **state)
{
    static int32_t big[32768]; /* 128 KiB: 7 fit in the 1 MiB pool */
    tapper t = {big, 32768, 20, 0, 0, 0, NULL};
    tu_warned w = {0};
    bool waiting;
    pthread_t th;
    int warnings;

    (void)state;
    hcb_runtime_set_log(rt, tu_note_warning, &w);
    t.id = gate_id;
    atomic_store(&gate_open, false);
    pthread_create(&th, NULL, tapper_main, &t);
    tu_poll_at_least(&w.count, 1,
                     TU_PATIENCE_S); /* the warning comes after 2 s */
    warnings = atomic_load(&w.count);
    waiting = atomic_load(&t.done) < 20;
    atomic_store(&gate_open, true);
    pthread_join(th, NULL);
    assert_int_equal(warnings, 1);
    assert_true(waiting); /* it went on waiting */
    fake_stream_drain(stream);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(atomic_load(&gate_seen), 20);
    assert_non_null(strstr(w.message, "CUDA device 3 has waited"));
    assert_non_null(strstr(w.message, "for room in its pinned pool "
                                      "(1048576 bytes: "));
    assert_non_null(strstr(w.message, "records and calls on their way"));
    assert_non_null(strstr(w.message, "tap function 'gate' is running"));
    assert_non_null(strstr(w.message, "HOST_CALLBACK_CUDA_PINNED_BYTE_SIZE"));
    assert_int_equal(atomic_load(&fake_cuda_counts.syncs), 0);
}

/* Pinned memory refused (a memory-lock limit): taps and calls still work,
 * through ordinary memory and a wait for the stream each, counted in the
 * pool's stats, with one warning; a new pool size pins again. */
static void
test_memory_that_cannot_be_pinned_falls_back_to_synchronised_copies(
    void **state)
{
    int32_t x[3] = {21, 22, 23};
    float in[2] = {1.5f, 2.5f}, out[2] = {0};
    char msg[HCB_ERROR_MESSAGE_SIZE];
    hcb_cuda_pool_stats cs = HCB_CUDA_POOL_STATS_INIT;
    hcb_error err;
    tu_warned w = {0};
    int i;

    (void)state;
    hcb_runtime_set_log(rt, tu_note_warning, &w);
    atomic_store(&fake_cuda_refuse_host_alloc, true);
    for (i = 0; i < 3; i++)
        assert_int_equal(tap(&x[i], 1, sink_id, msg), 0);
    assert_int_equal(
        call(double_id, in, out, 2, &hcb__platform_cuda, "hcb_call", msg), 0);
    fake_stream_drain(stream);
    assert_true(out[0] == 3.0f && out[1] == 5.0f);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(tu_sink_count(sink), 3);
    assert_int_equal(sink->first_value[2], 23);
    assert_int_equal(hcb_cuda_get_pool_stats(3, &cs, &err), HCB_OK);
    assert_int_equal(cs.pin_failures, 1); /* tried once, not per tap */
    assert_int_equal(cs.capacity, 0);
    assert_int_equal(cs.syncs, 4); /* 3 taps and the call's results */
    assert_int_equal(cs.refusals, 4);
    assert_int_equal(atomic_load(&fake_cuda_counts.host_allocs), 1);
    assert_int_equal(hcb_runtime_stop(rt, NULL), HCB_OK); /* logs it */
    assert_int_equal(atomic_load(&w.count), 1);
    assert_non_null(strstr(w.message, "cannot pin 1048576 bytes of host "
                                      "memory: out of memory (CUDA error 2), "
                                      "for the pool of CUDA device 3"));
    assert_non_null(strstr(w.message, "ulimit -l"));
    /* memory can be pinned again, and a new size tries again */
    atomic_store(&fake_cuda_refuse_host_alloc, false);
    assert_int_equal(hcb__pinned_configure(1 << 20), HCB_OK);
    atomic_store(&fake_cuda_counts.syncs, 0);
    assert_int_equal(tap(&x[0], 1, sink_id, msg), 0);
    assert_int_equal(atomic_load(&fake_cuda_counts.syncs), 0);
    assert_int_equal(hcb__pinned_capacity(3), 1 << 20);
    fake_stream_drain(stream);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(tu_sink_count(sink), 4);
}

/* The stats tell the taps on their way (room reserved, copies not landed)
 * from the queued ones: queued records and queued bytes count the same
 * records. */
static void
test_stats_tell_reserved_records_from_queued_ones(void **state)
{
    int32_t x[3][4] = {{1}, {2}, {3}};
    char msg[HCB_ERROR_MESSAGE_SIZE];
    hcb_stats st = HCB_STATS_INIT;
    int i;

    (void)state;
    fake_stream_hold(stream, true);
    for (i = 0; i < 3; i++)
        assert_int_equal(tap(x[i], 4, sink_id, msg), 0);
    assert_int_equal(hcb_runtime_stats(rt, DEVICE, &st, NULL), HCB_OK);
    assert_int_equal(st.reserved_records, 3);
    assert_true(st.reserved_bytes >= 3 * 16);
    assert_int_equal(st.queued_records, 0);
    assert_int_equal(st.queued_bytes, 0);
    assert_int_equal(st.records_in, 0);
    assert_int_equal(st.bytes_in, 0);
    assert_true(st.high_water_bytes >= st.reserved_bytes);
    fake_stream_hold(stream, false);
    fake_stream_drain(stream);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(hcb_runtime_stats(rt, DEVICE, &st, NULL), HCB_OK);
    assert_int_equal(st.reserved_records, 0);
    assert_int_equal(st.reserved_bytes, 0);
    assert_int_equal(st.queued_records, 0);
    assert_int_equal(st.queued_bytes, 0);
    assert_int_equal(st.records_in, 3);
    assert_int_equal(st.bytes_in, st.bytes_out);
    assert_true(st.bytes_in >= 3 * 16);
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

/* Memory given back is reused wherever it lies: a block freed between two
 * held ones takes the next request that fits, and neighbours given back
 * merge into one block. */
static void
test_pinned_pool_reuses_memory_given_back_anywhere(void **state)
{
    hcb_error err;
    hcb__pinned_stats ps;
    void *a, *b, *c, *d, *e;

    (void)state;
    a = hcb__pinned_take(&fake_cuda, NULL, 3, 300000, true, &err);
    b = hcb__pinned_take(&fake_cuda, NULL, 3, 300000, true, &err);
    c = hcb__pinned_take(&fake_cuda, NULL, 3, 300000, true, &err);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_int_equal((uintptr_t)a % 64, 0);
    hcb__pinned_give(b); /* between a and c, both held */
    hcb__pinned_delivered(a);
    hcb__pinned_delivered(c);
    d = hcb__pinned_take(&fake_cuda, NULL, 3, 300000, true, &err);
    assert_ptr_equal(d, b);
    hcb__pinned_delivered(d);
    /* nothing fits now, and nothing is on its way: refused, not waited */
    assert_null(hcb__pinned_take(&fake_cuda, NULL, 3, 300000, true, &err));
    assert_int_equal(err.code, HCB_OK);
    hcb__pinned_give(a);
    hcb__pinned_give(d); /* merges with a */
    e = hcb__pinned_take(&fake_cuda, NULL, 3, 500000, true, &err);
    assert_ptr_equal(e, a);
    hcb__pinned_give(c);
    hcb__pinned_give(e);
    assert_true(hcb__pinned_get_stats(3, &ps));
    assert_int_equal(ps.used, 0);
    assert_int_equal(ps.free_blocks, 1); /* whole again */
    assert_int_equal(ps.capacity, 1 << 20);
    assert_int_equal(ps.refusals, 1);
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
    p = hcb__pinned_take(&fake_cuda, NULL, 3, 100, true, &err);
    assert_non_null(p);
    assert_int_equal(hcb_cuda_set_pinned_bytes(8 << 20, &err), HCB_ESTATE);
    assert_non_null(strstr(err.message, "in use"));
    assert_int_equal(hcb__pinned_capacity(3), 1 << 20);
    hcb__pinned_give(p);
    assert_int_equal(hcb_cuda_set_pinned_bytes(8 << 20, &err), HCB_OK);
    p = hcb__pinned_take(&fake_cuda, NULL, 3, 100, true, &err);
    assert_int_equal(hcb__pinned_capacity(3), 8 << 20);
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
            test_a_tap_delivered_now_waits_for_the_stream_on_xlas_thread, setup,
            teardown),
        cmocka_unit_test_setup_teardown(
            test_a_tap_delivered_now_fails_its_computation, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_the_sharded_check_reads_the_failure_flag_from_the_device,
            setup, teardown),
        cmocka_unit_test_setup_teardown(test_taps_keep_program_order, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_a_full_pool_makes_the_device_wait,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_a_full_queue_makes_xla_thread_wait_never_the_stream, setup,
            teardown),
        cmocka_unit_test_setup_teardown(
            test_a_kept_record_does_not_make_taps_synchronous, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_held_device_never_holds_another,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_a_consumer_stream_waits_for_xla_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_stream_wait_uses_the_streams_device_and_gives_the_thread_its_own,
            setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_a_record_larger_than_the_pool_still_passes, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_records_kept_by_the_user_do_not_block_taps, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_cuda_errors_fail_the_tap_and_free_its_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_stop_delivers_the_taps_on_their_way, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_stop_gives_up_on_taps_whose_stream_never_runs, setup,
            teardown),
        cmocka_unit_test_setup_teardown(
            test_a_long_wait_for_the_pool_is_warned_naming_what_holds_it, setup,
            teardown),
        cmocka_unit_test_setup_teardown(
            test_xla_thread_waits_stop_when_the_check_says_so, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_memory_that_cannot_be_pinned_falls_back_to_synchronised_copies,
            setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_stats_tell_reserved_records_from_queued_ones, setup, teardown),
        cmocka_unit_test_setup_teardown(test_call_stages_through_host_memory,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_call_runs_after_the_taps_before_it,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_a_shared_call_is_run_by_its_runner_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_failing_call_target_fails_with_its_message, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_buffer_call_works_in_place_on_the_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ordinal_is_written_on_the_stream,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_pinned_pool_reuses_memory_given_back_anywhere, setup,
            teardown),
        cmocka_unit_test_setup_teardown(
            test_pinned_pool_size_changes_only_while_unused, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
