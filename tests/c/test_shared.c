/* test_shared.c - calls and taps delivered now that the devices of one
 * computation share (hcb_runtime_call_shared, hcb_runtime_deliver_shared):
 * one thread per device, as XLA runs a multi-device launch. */

#include "testutil.h"

#include <stddef.h>
#include <stdio.h>

#define NDEV   4
#define CPU(i) HCB_DEVICE(HCB_PLATFORM_CPU, (i))

static hcb_runtime *rt;
static tu_sink *sink;
static uint64_t echo_id, fail_id, sink_id;

/* Runs of echo_fn, and the device of the last. */
static atomic_long echo_runs;
static atomic_int echo_device;

/* results[0] (s64) = args[0] (s64) * 10 + the device's ordinal; fails for
 * args[0] == 13. */
static int
echo_fn(void *user, hcb_device device, const hcb_array *args, size_t nargs,
        const hcb_array *results, size_t nresults, hcb_error *err)
{
    int64_t v = *(const int64_t *)args[0].data;

    (void)user, (void)nargs, (void)nresults;
    atomic_fetch_add(&echo_runs, 1);
    atomic_store(&echo_device, (int)HCB_DEVICE_ORDINAL(device));
    if (v == 13)
        return hcb_error_set(err, HCB_ECALLBACK, "echo_fn refused 13");
    *(int64_t *)results[0].data = v * 10 + HCB_DEVICE_ORDINAL(device);
    return HCB_OK;
}

/* Runs until `slow_release`. */
static atomic_int slow_release;
static uint64_t slow_id;

static int
slow_fn(void *user, hcb_device device, const hcb_array *args, size_t nargs,
        const hcb_array *results, size_t nresults, hcb_error *err)
{
    (void)user, (void)device, (void)args, (void)nargs, (void)err;
    while (!atomic_load(&slow_release))
        tu_sleep_us(1000);
    if (nresults > 0)
        *(int64_t *)results[0].data = 42;
    return HCB_OK;
}

static int
setup(void **state)
{
    hcb_call_target c = HCB_CALL_TARGET_INIT;
    hcb_tap_target t = HCB_TAP_TARGET_INIT;

    (void)state;
    if (hcb_runtime_create(NULL, &rt, NULL) != HCB_OK)
        return -1;
    sink = tu_sink_new();
    c.fn = echo_fn;
    c.name = "echo_fn";
    if (hcb_runtime_register_call(rt, &c, &echo_id, NULL) != HCB_OK)
        return -1;
    c.fn = tu_fail_fn;
    c.name = "fail_fn";
    if (hcb_runtime_register_call(rt, &c, &fail_id, NULL) != HCB_OK)
        return -1;
    c.fn = slow_fn;
    c.name = "slow_fn";
    if (hcb_runtime_register_call(rt, &c, &slow_id, NULL) != HCB_OK)
        return -1;
    t.fn = tu_sink_fn;
    t.user = sink;
    return hcb_runtime_register_tap(rt, &t, &sink_id, NULL) == HCB_OK ? 0 : -1;
}

static int
teardown(void **state)
{
    (void)state;
    hcb_runtime_destroy(rt);
    tu_sink_free(sink);
    return 0;
}

static hcb_array
s64_array(int64_t *v)
{
    hcb_array a;

    memset(&a, 0, sizeof a);
    a.dtype = HCB_S64;
    a.data = v;
    a.nbytes = sizeof *v;
    return a;
}

/* One device's calls of a shared call target: `rounds` of them, the
 * runner passing its round number (13: a failure), the others -1 -- or,
 * with first_runs, every device its round number (the whole operands). */
typedef struct device_run {
    hcb_share share;
    uint64_t id;
    int ordinal;
    int rounds;
    int64_t got[64];
    int rc[64];
    char message[HCB_ERROR_MESSAGE_SIZE];
} device_run;

static void *
run_device(void *p)
{
    device_run *d = p;
    hcb_device device = CPU(d->ordinal);
    int r;

    for (r = 0; r < d->rounds; r++) {
        int64_t in = device == d->share.runner || d->share.first_runs ? r : -1;
        int64_t out = -7;
        hcb_array arg = s64_array(&in), res = s64_array(&out);
        hcb_error err;

        d->rc[r] = hcb_runtime_call_shared(rt, &d->share, d->id, device, &arg,
                                           1, &res, 1, &err);
        d->got[r] = out;
        if (d->rc[r] != HCB_OK)
            snprintf(d->message, sizeof d->message, "%s", err.message);
    }
    return NULL;
}

/* Sets up device `ordinal`'s `rounds` shared calls of `id`, run by
 * device `runner` (or, with `first_runs`, the first to come), in
 * `launch`. */
static void
device_setup(device_run *d, int ordinal, uint64_t id, int runner, int rounds,
             int64_t launch, int first_runs)
{
    memset(d, 0, sizeof *d);
    d->share = (hcb_share)HCB_SHARE_INIT;
    d->share.runner = CPU(runner);
    d->share.participants = NDEV;
    d->share.launch = launch;
    d->share.first_runs = first_runs;
    d->id = id;
    d->ordinal = ordinal;
    d->rounds = rounds;
}

/* Runs `rounds` shared calls of `id` on NDEV threads, as device_setup
 * says. */
static void
run_devices_first(device_run *d, uint64_t id, int runner, int rounds,
                  int64_t launch, int first_runs)
{
    pthread_t threads[NDEV];
    int i;

    for (i = 0; i < NDEV; i++) {
        device_setup(&d[i], i, id, runner, rounds, launch, first_runs);
        pthread_create(&threads[i], NULL, run_device, &d[i]);
    }
    for (i = 0; i < NDEV; i++)
        pthread_join(threads[i], NULL);
}

/* The same, device `runner` running them. */
static void
run_devices(device_run *d, uint64_t id, int runner, int rounds, int64_t launch)
{
    run_devices_first(d, id, runner, rounds, launch, 0);
}

/* The runner runs the function once per call, with its own operands; every
 * device gets its results, call by call. */
static void
test_the_runner_runs_each_call_once_for_every_device(void **state)
{
    device_run d[NDEV];
    int i, r;

    (void)state;
    atomic_store(&echo_runs, 0);
    run_devices(d, echo_id, 2, 12, 1);
    assert_int_equal(atomic_load(&echo_runs), 12);
    assert_int_equal(atomic_load(&echo_device), 2);
    for (i = 0; i < NDEV; i++)
        for (r = 0; r < 12; r++) {
            assert_int_equal(d[i].rc[r], HCB_OK);
            assert_int_equal(d[i].got[r], r * 10 + 2);
        }
}

/* The runner's failure is every device's, for that call alone: the
 * calls before and after it give their results. */
static void
test_the_runners_failure_fails_every_device(void **state)
{
    device_run d[NDEV];
    hcb_error last;
    int i;

    (void)state;
    (void)hcb_runtime_take_error(rt, NULL);
    run_devices(d, echo_id, 0, 15, 2);
    for (i = 0; i < NDEV; i++) {
        assert_int_equal(d[i].rc[12], HCB_OK);
        assert_int_equal(d[i].got[12], 120);
        assert_int_equal(d[i].rc[13], HCB_ECALLBACK);
        assert_string_equal(d[i].message, "echo_fn refused 13");
        assert_int_equal(d[i].rc[14], HCB_OK);
        assert_int_equal(d[i].got[14], 140);
    }
    /* recorded once, by the runner */
    assert_int_equal(hcb_runtime_take_error(rt, &last), 1);
    assert_string_equal(last.message, "echo_fn refused 13");

    run_devices(d, fail_id, 1, 1, 3);
    for (i = 0; i < NDEV; i++) {
        assert_int_equal(d[i].rc[0], HCB_ECALLBACK);
        assert_string_equal(d[i].message, "fail_fn said no");
    }
    (void)hcb_runtime_take_error(rt, NULL);
}

/* With first_runs, the first device to come runs the call, as the runner
 * (the function is given the runner's device), and the others take its
 * results, the runner too, which came last: once per call, its failure
 * every device's and recorded once. */
static void
test_with_first_runs_the_first_to_come_runs_it_as_the_runner(void **state)
{
    device_run d[NDEV];
    pthread_t thread;
    hcb_error last;
    int i, r;

    (void)state;
    atomic_store(&echo_runs, 0);
    atomic_store(&echo_device, -1);
    /* device 1 comes alone: it runs the call for cpu:3 and goes on */
    device_setup(&d[1], 1, echo_id, 3, 1, 31, 1);
    pthread_create(&thread, NULL, run_device, &d[1]);
    pthread_join(thread, NULL);
    assert_int_equal(atomic_load(&echo_runs), 1);
    assert_int_equal(atomic_load(&echo_device), 3);
    assert_int_equal(d[1].rc[0], HCB_OK);
    assert_int_equal(d[1].got[0], 3);
    /* the others, the runner last, take that outcome: no second run */
    for (i = 0; i < NDEV; i++) {
        if (i == 1)
            continue;
        device_setup(&d[i], i, echo_id, 3, 1, 31, 1);
        run_device(&d[i]);
        assert_int_equal(d[i].rc[0], HCB_OK);
        assert_int_equal(d[i].got[0], 3);
    }
    assert_int_equal(atomic_load(&echo_runs), 1);

    /* all at once, call after call */
    (void)hcb_runtime_take_error(rt, NULL);
    atomic_store(&echo_runs, 0);
    run_devices_first(d, echo_id, 2, 20, 32, 1);
    assert_int_equal(atomic_load(&echo_runs), 20);
    for (i = 0; i < NDEV; i++)
        for (r = 0; r < 20; r++) {
            if (r == 13) {
                assert_int_equal(d[i].rc[r], HCB_ECALLBACK);
                continue;
            }
            assert_int_equal(d[i].rc[r], HCB_OK);
            assert_int_equal(d[i].got[r], r * 10 + 2);
        }
    assert_string_equal(d[0].message, "echo_fn refused 13");
    assert_int_equal(hcb_runtime_take_error(rt, &last), 1);
    assert_string_equal(last.message, "echo_fn refused 13");
}

/* Launches are apart: two of them under way at once, each its devices'
 * own meetings; and more launches one after the other than the runtime
 * holds meeting slots. */
typedef struct launch_run {
    device_run d[NDEV];
    int64_t launch;
} launch_run;

static void *
run_launch(void *p)
{
    launch_run *l = p;

    run_devices(l->d, echo_id, (int)(l->launch % NDEV), 20, l->launch);
    return NULL;
}

static void
test_launches_meet_apart(void **state)
{
    launch_run a, b;
    pthread_t ta, tb;
    int i, r, n;

    (void)state;
    a.launch = 101;
    b.launch = 102;
    pthread_create(&ta, NULL, run_launch, &a);
    pthread_create(&tb, NULL, run_launch, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    for (i = 0; i < NDEV; i++)
        for (r = 0; r < 20; r++) {
            if (r == 13)
                continue; /* echo_fn's refusal */
            assert_int_equal(a.d[i].got[r], r * 10 + 1);
            assert_int_equal(b.d[i].got[r], r * 10 + 2);
        }
    for (n = 0; n < 100; n++) { /* 64 slots */
        a.launch = 1000 + n;
        run_launch(&a);
        assert_int_equal(a.d[3].got[5], 50 + n % NDEV);
    }
    (void)hcb_runtime_take_error(rt, NULL);
}

/* A tap delivered now and shared: the runner's tap function runs once;
 * the others return when it has, with its outcome (HCB_DELIVER_FAIL) or
 * none (HCB_DELIVER_KEEP_ERROR, the failure recorded once). */
typedef struct tap_run {
    hcb_share share;
    int ordinal;
    int32_t value;
    int flags;
    size_t seen_after; /* the sink's count when the call returned */
    int rc;
    char message[HCB_ERROR_MESSAGE_SIZE];
} tap_run;

static void *
tap_device(void *p)
{
    tap_run *t = p;
    hcb_device device = CPU(t->ordinal);
    hcb_record *rec = NULL;
    hcb_error err;

    /* the runner passes its record, or, with first_runs, every device one
     * made for the runner */
    if (device == t->share.runner || t->share.first_runs) {
        int64_t dims[1] = {1};
        hcb_array a;

        memset(&a, 0, sizeof a);
        a.dtype = HCB_S32;
        a.rank = 1;
        a.dims = dims;
        a.data = &t->value;
        a.nbytes = sizeof t->value;
        if (hcb_record_create(sink_id, t->share.runner, &a, 1, &rec, NULL) !=
            HCB_OK)
            return NULL;
    }
    t->rc = hcb_runtime_deliver_shared(rt, &t->share, sink_id, device, rec,
                                       t->flags, &err);
    t->seen_after = tu_sink_count(sink);
    if (t->rc != HCB_OK)
        snprintf(t->message, sizeof t->message, "%s", err.message);
    return NULL;
}

static void
deliver_on_devices_first(tap_run *t, int32_t value, int flags, int first_runs)
{
    pthread_t threads[NDEV];
    int i;

    for (i = 0; i < NDEV; i++) {
        memset(&t[i], 0, sizeof t[i]);
        t[i].share = (hcb_share)HCB_SHARE_INIT;
        t[i].share.runner = CPU(3);
        t[i].share.participants = NDEV;
        t[i].share.launch = 7 + first_runs;
        t[i].share.first_runs = first_runs;
        t[i].ordinal = i;
        t[i].value = value;
        t[i].flags = flags;
        pthread_create(&threads[i], NULL, tap_device, &t[i]);
    }
    for (i = 0; i < NDEV; i++)
        pthread_join(threads[i], NULL);
}

static void
deliver_on_devices(tap_run *t, int32_t value, int flags)
{
    deliver_on_devices_first(t, value, flags, 0);
}

static void
test_a_shared_tap_is_delivered_once_before_any_device_goes_on(void **state)
{
    tap_run t[NDEV];
    hcb_error last;
    size_t before = tu_sink_count(sink);
    int i, first;

    (void)state;
    sink->delay_us = 2000; /* a slow tap function: the others must wait */
    for (first = 0; first <= 1; first++) {
        deliver_on_devices_first(t, 5, HCB_DELIVER_FAIL, first);
        assert_int_equal(tu_sink_count(sink), before + 1);
        assert_int_equal(sink->device[before], CPU(3)); /* the runner's */
        for (i = 0; i < NDEV; i++) {
            assert_int_equal(t[i].rc, HCB_OK);
            assert_int_equal(t[i].seen_after, before + 1);
        }
        before++;
    }
    sink->delay_us = 0;

    (void)hcb_runtime_take_error(rt, NULL);
    sink->fail_on = 13;
    deliver_on_devices(t, 13, HCB_DELIVER_FAIL);
    for (i = 0; i < NDEV; i++) {
        assert_int_not_equal(t[i].rc, HCB_OK);
        assert_string_equal(t[i].message, "sink refused value 13");
    }
    deliver_on_devices(t, 13, HCB_DELIVER_KEEP_ERROR);
    for (i = 0; i < NDEV; i++)
        assert_int_equal(t[i].rc, HCB_OK);
    sink->fail_on = -1;
    assert_int_equal(hcb_runtime_take_error(rt, &last), 2);
    assert_string_equal(last.message, "sink refused value 13");
}

/* Shares that cannot be met are refused, saying why, and a record passed
 * with them is released. */
static void
test_bad_shares_are_refused(void **state)
{
    hcb_share share = HCB_SHARE_INIT;
    int64_t in = 1, out = 0, dims[1] = {1};
    hcb_array arg = s64_array(&in), res = s64_array(&out);
    hcb_record *rec;
    hcb_error err;
    int32_t v = 1;
    hcb_array a;
    device_run d[NDEV];
    pthread_t thread;
    char want[HCB_ERROR_MESSAGE_SIZE];

    (void)state;
    share.participants = 0;
    assert_int_equal(hcb_runtime_call_shared(rt, &share, echo_id, CPU(0), &arg,
                                             1, &res, 1, &err),
                     HCB_EINVAL);
    assert_string_equal(err.message, "a shared call needs a share with at "
                                     "least one participant");
    /* alone: the runner calls straight away; another device has no one */
    share.participants = 1;
    share.runner = CPU(1);
    assert_int_equal(hcb_runtime_call_shared(rt, &share, echo_id, CPU(1), &arg,
                                             1, &res, 1, &err),
                     HCB_OK);
    assert_int_equal(out, 11);
    assert_int_equal(hcb_runtime_call_shared(rt, &share, echo_id, CPU(0), &arg,
                                             1, &res, 1, &err),
                     HCB_EINVAL);
    assert_string_equal(err.message, "device cpu:0 shares a call with no "
                                     "one: its runner is cpu:1");

    /* a record from a device that does not run the tap */
    memset(&a, 0, sizeof a);
    a.dtype = HCB_S32;
    a.rank = 1;
    a.dims = dims;
    a.data = &v;
    a.nbytes = sizeof v;
    tu_install_allocator();
    assert_int_equal(hcb_record_create(sink_id, CPU(0), &a, 1, &rec, NULL),
                     HCB_OK);
    share.participants = 2;
    assert_int_equal(hcb_runtime_deliver_shared(rt, &share, sink_id, CPU(0),
                                                rec, HCB_DELIVER_FAIL, &err),
                     HCB_EINVAL);
    assert_non_null(strstr(err.message, "the runner, and it alone, passes a "
                                        "record"));
    /* with first_runs, every device passes one, made for the runner */
    share.first_runs = 1;
    assert_int_equal(hcb_runtime_deliver_shared(rt, &share, sink_id, CPU(1),
                                                NULL, HCB_DELIVER_FAIL, &err),
                     HCB_EINVAL);
    assert_non_null(strstr(err.message, "every participant passes a record "
                                        "made for the runner"));
    assert_int_equal(hcb_record_create(sink_id, CPU(0), &a, 1, &rec, NULL),
                     HCB_OK);
    assert_int_equal(hcb_runtime_deliver_shared(rt, &share, sink_id, CPU(1),
                                                rec, HCB_DELIVER_FAIL, &err),
                     HCB_EINVAL);
    /* a share as old as the field's absence: the runner alone runs it, so
     * another device's record is refused */
    share.struct_size = offsetof(hcb_share, first_runs);
    assert_int_equal(hcb_record_create(sink_id, CPU(1), &a, 1, &rec, NULL),
                     HCB_OK);
    assert_int_equal(hcb_runtime_deliver_shared(rt, &share, sink_id, CPU(0),
                                                rec, HCB_DELIVER_FAIL, &err),
                     HCB_EINVAL);
    assert_non_null(strstr(err.message, "the runner, and it alone, passes a "
                                        "record"));
    share.struct_size = sizeof share;
    share.first_runs = 0;
    hcb_set_allocator(NULL);

    /* results of another size than the runner's */
    memset(&d[0], 0, sizeof d[0]);
    d[0].share = share;
    d[0].share.launch = 55;
    d[0].id = echo_id;
    d[0].ordinal = 1;
    d[0].rounds = 1;
    pthread_create(&thread, NULL, run_device, &d[0]);
    res.nbytes = 4;
    assert_int_equal(hcb_runtime_call_shared(rt, &d[0].share, echo_id, CPU(0),
                                             &arg, 1, &res, 1, &err),
                     HCB_EINVAL);
    pthread_join(thread, NULL);
    snprintf(want, sizeof want,
             "shared call %llu: 4 bytes of results on cpu:0, 8 on its runner",
             (unsigned long long)echo_id);
    assert_string_equal(err.message, want);
    assert_int_equal(d[0].got[0], 1); /* the runner's own */

    /* one device more than the participants */
    assert_int_equal(hcb_runtime_call_shared(rt, &d[0].share, echo_id, CPU(2),
                                             &arg, 1, &res, 1, &err),
                     HCB_EINVAL);
    snprintf(want, sizeof want,
             "shared call %llu: device cpu:2 is one more than its 2 "
             "participants",
             (unsigned long long)echo_id);
    assert_string_equal(err.message, want);
}

/* A device that waits long for its runner is warned about, from the
 * runtime's warning thread, and goes on waiting until the runner is
 * done. */
static void
test_a_long_wait_for_the_runner_is_warned(void **state)
{
    device_run d[2];
    pthread_t threads[2];
    tu_warned w;
    char want[256];
    int i;

    (void)state;
    memset(&w, 0, sizeof w);
    atomic_store(&slow_release, 0);
    hcb_runtime_set_log(rt, tu_note_warning, &w);
    for (i = 0; i < 2; i++) {
        memset(&d[i], 0, sizeof d[i]);
        d[i].share = (hcb_share)HCB_SHARE_INIT;
        d[i].share.runner = CPU(1);
        d[i].share.participants = 2;
        d[i].share.launch = 77;
        d[i].id = slow_id;
        d[i].ordinal = i;
        d[i].rounds = 1;
        pthread_create(&threads[i], NULL, run_device, &d[i]);
    }
    tu_poll_at_least(&w.count, 1,
                     TU_PATIENCE_S); /* the warning comes after 2 s */
    assert_int_equal(atomic_load(&w.count), 1);
    snprintf(want, sizeof want,
             "device cpu:0 has waited 2.0 s for the outcome of shared call "
             "%llu (device cpu:1 runs its function).  It goes on waiting",
             (unsigned long long)slow_id);
    assert_non_null(strstr(w.message, want));
    atomic_store(&slow_release, 1);
    for (i = 0; i < 2; i++)
        pthread_join(threads[i], NULL);
    for (i = 0; i < 2; i++) {
        assert_int_equal(d[i].rc[0], HCB_OK);
        assert_int_equal(d[i].got[0], 42);
    }
    hcb_runtime_set_log(rt, NULL, NULL);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_runner_runs_each_call_once_for_every_device),
        cmocka_unit_test(test_the_runners_failure_fails_every_device),
        cmocka_unit_test(
            test_with_first_runs_the_first_to_come_runs_it_as_the_runner),
        cmocka_unit_test(test_launches_meet_apart),
        cmocka_unit_test(
            test_a_shared_tap_is_delivered_once_before_any_device_goes_on),
        cmocka_unit_test(test_bad_shares_are_refused),
        cmocka_unit_test(test_a_long_wait_for_the_runner_is_warned),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
