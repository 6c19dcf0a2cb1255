/* test_ffi_cuda_pool.c - the CUDA platform's pinned pool (src/ffi/pinned.c):
 * a full pool makes a device wait (and says so), never another device; a
 * record larger than the pool; memory that cannot be pinned; blocks reused
 * wherever they were given back; a size that changes only while unused
 * (the fixture: cuda_fixture.h). */
#include "cuda_fixture.h"

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
    assert_true(pool_made_a_thread_wait(3));
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
    assert_true(pool_made_a_thread_wait(3));
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
        cmocka_unit_test_setup_teardown(test_a_full_pool_makes_the_device_wait,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_held_device_never_holds_another,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_a_record_larger_than_the_pool_still_passes, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_a_long_wait_for_the_pool_is_warned_naming_what_holds_it, setup,
            teardown),
        cmocka_unit_test_setup_teardown(
            test_memory_that_cannot_be_pinned_falls_back_to_synchronised_copies,
            setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_pinned_pool_reuses_memory_given_back_anywhere, setup,
            teardown),
        cmocka_unit_test_setup_teardown(
            test_pinned_pool_size_changes_only_while_unused, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
