/* test_ffi_cuda.c - the CUDA platform's taps (src/ffi/platform_cuda.c)
 * and its pinned pool (src/ffi/pinned.c) over a stand-in CUDA runtime
 * (fake_cuda.c): hand-built call frames, a stream that runs on a thread of
 * its own, the real runtime behind (the fixture: cuda_fixture.h; the
 * calls: test_ffi_cuda_call.c). */
#include "cuda_fixture.h"

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
        cmocka_unit_test_setup_teardown(test_taps_keep_program_order, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            test_a_full_queue_makes_xla_thread_wait_never_the_stream, setup,
            teardown),
        cmocka_unit_test_setup_teardown(
            test_a_kept_record_does_not_make_taps_synchronous, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_a_consumer_stream_waits_for_xla_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_stream_wait_uses_the_streams_device_and_gives_the_thread_its_own,
            setup, teardown),
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
            test_xla_thread_waits_stop_when_the_check_says_so, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_stats_tell_reserved_records_from_queued_ones, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
