/* test_interrupt.c - the runtime's interrupt check (hcb_runtime_set_interrupt)
 * stops every wait of a device's thread: a submit or a reservation waiting
 * for room, a call or a delivery waiting for its device's earlier taps; and a
 * polling barrier's own check (hcb_runtime_barrier_poll).  Each stopped
 * wait fails with HCB_ECALLBACK and the check's reason, what it waited for
 * is still delivered, and the runtime goes on.  (The GPU's waits, for room
 * in the queue and in its pinned pool: test_ffi_cuda.c.) */
#include "testutil.h"

#include "runtime/runtime.h" /* hcb__runtime_reserve, the CUDA platform's */

/* A check for one wait: it sees the wait's device and its own state (0 at
 * the first call, then what it left), and says stop at call `stop_at`
 * (never when 0), giving a reason when `say`. */
typedef struct stop_after {
    hcb_device device;
    int stop_at;
    bool say;
    atomic_int calls;
} stop_after;

static int
stop_after_fn(void *user, hcb_device device, uint64_t *wait_state,
              hcb_error *err)
{
    stop_after *s = user;
    int n = atomic_fetch_add(&s->calls, 1) + 1;

    assert_int_equal(device, s->device);
    assert_int_equal(*wait_state, (uint64_t)(n - 1));
    (*wait_state)++;
    if (s->stop_at == 0 || n < s->stop_at)
        return 0;
    if (s->say)
        hcb_error_set(err, HCB_EINVAL, "stopped by the test");
    return 1;
}

#define CPU0  HCB_DEVICE(HCB_PLATFORM_CPU, 0)
#define POLL  5000000u /* 5 ms */
#define SMALL 16       /* int32 elements of a record */

static void
test_a_check_needs_a_poll_interval(void **state)
{
    hcb_runtime *rt = tu_new_runtime(1 << 20);
    stop_after s = {CPU0, 1, false, 0};
    hcb_error err;

    (void)state;
    assert_int_equal(hcb_runtime_set_interrupt(rt, 0, stop_after_fn, &s, &err),
                     HCB_EINVAL);
    assert_non_null(strstr(err.message, "interval must be positive"));
    assert_int_equal(hcb_runtime_barrier_poll(rt, HCB_ALL_DEVICES, 0,
                                              stop_after_fn, &s, &err),
                     HCB_EINVAL);
    assert_non_null(strstr(err.message, "poll interval"));
    /* clearing needs none */
    assert_int_equal(hcb_runtime_set_interrupt(rt, 0, NULL, NULL, &err),
                     HCB_OK);
    hcb_runtime_destroy(rt);
}

/* A submit that waits for room calls the check as it starts to wait and
 * then every poll interval (one that does not wait never calls it); when
 * the check says stop, that submit fails with HCB_ECALLBACK (ending with
 * the check's reason, when it gives one), its record is not queued, the
 * queued records are still delivered, and the runtime goes on. */
static void
test_a_submit_waiting_for_room_is_stopped(void **state)
{
    hcb_record *probe = tu_record(1, 0, 0, SMALL);
    hcb_runtime *rt = tu_new_runtime(2 * hcb_record_size(probe));
    tu_gate *g = calloc(1, sizeof *g);
    uint64_t id = tu_register_gate(rt, g, 0);
    stop_after stop = {CPU0, 3, false, 0}, say = {CPU0, 2, true, 0};
    hcb_stats st = HCB_STATS_INIT;
    hcb_error err;

    (void)state;
    hcb_record_release(probe);
    assert_int_equal(
        hcb_runtime_set_interrupt(rt, POLL, stop_after_fn, &stop, &err),
        HCB_OK);
    /* 0 is held by its tap function, 1 fills the queue (a record counts
     * until its tap function returns); neither waits */
    assert_int_equal(hcb_runtime_submit(rt, tu_record(id, 0, 0, SMALL), NULL),
                     HCB_OK);
    tu_wait_holding(g);
    assert_int_equal(hcb_runtime_submit(rt, tu_record(id, 0, 1, SMALL), NULL),
                     HCB_OK);
    assert_int_equal(atomic_load(&stop.calls), 0);
    assert_int_equal(hcb_runtime_submit(rt, tu_record(id, 0, 2, SMALL), &err),
                     HCB_ECALLBACK);
    assert_non_null(strstr(err.message, "tap of "));
    assert_non_null(strstr(err.message, " bytes on cpu:0 interrupted while "
                                        "waiting for room in its queue"));
    assert_non_null(strstr(err.message, "; the records queued before it are "
                                        "still delivered"));
    assert_int_equal(atomic_load(&stop.calls), 3);
    /* the check's own reason; set on a channel that exists already */
    assert_int_equal(
        hcb_runtime_set_interrupt(rt, POLL, stop_after_fn, &say, NULL), HCB_OK);
    assert_int_equal(hcb_runtime_submit(rt, tu_record(id, 0, 3, SMALL), &err),
                     HCB_ECALLBACK);
    assert_non_null(strstr(err.message, "): stopped by the test; the records "
                                        "queued before it"));
    /* cleared: a submit waits as long as it takes */
    assert_int_equal(hcb_runtime_set_interrupt(rt, 0, NULL, NULL, NULL),
                     HCB_OK);
    atomic_store(&g->release, 1);
    assert_int_equal(hcb_runtime_submit(rt, tu_record(id, 0, 4, SMALL), NULL),
                     HCB_OK);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(atomic_load(&g->total), 3); /* 0, 1 and 4 */
    assert_int_equal(atomic_load(&g->seen[2]), 0);
    assert_int_equal(atomic_load(&g->seen[3]), 0);
    assert_int_equal(atomic_load(&g->seen[4]), 1);
    assert_int_equal(hcb_runtime_stats(rt, HCB_ALL_DEVICES, &st, NULL), HCB_OK);
    assert_int_equal(st.queued_bytes, 0);
    assert_int_equal(st.records_in, 3);
    assert_int_equal(hcb_runtime_take_error(rt, NULL), 0); /* no tap failed */
    hcb_runtime_destroy(rt);
    free(g);
}

/* A reservation (the GPU's way to take room on XLA's thread) waits as a
 * submit does, and is stopped the same way: nothing stays reserved. */
static void
test_a_reservation_waiting_for_room_is_stopped(void **state)
{
    hcb_record *probe = tu_record(1, 0, 0, SMALL);
    size_t size = hcb_record_size(probe);
    hcb_runtime *rt = tu_new_runtime(2 * size);
    tu_gate *g = calloc(1, sizeof *g);
    uint64_t id = tu_register_gate(rt, g, 0);
    stop_after stop = {CPU0, 2, true, 0};
    hcb_stats st = HCB_STATS_INIT;
    hcb_error err;

    (void)state;
    hcb_record_release(probe);
    assert_int_equal(hcb_runtime_submit(rt, tu_record(id, 0, 0, SMALL), NULL),
                     HCB_OK);
    tu_wait_holding(g);
    assert_int_equal(hcb__runtime_reserve(rt, CPU0, size, NULL), HCB_OK);
    assert_int_equal(
        hcb_runtime_set_interrupt(rt, POLL, stop_after_fn, &stop, NULL),
        HCB_OK);
    assert_int_equal(hcb__runtime_reserve(rt, CPU0, size, &err), HCB_ECALLBACK);
    assert_non_null(strstr(err.message, "interrupted while waiting for room "
                                        "in its queue"));
    assert_non_null(strstr(err.message, "stopped by the test"));
    assert_int_equal(atomic_load(&stop.calls), 2);
    assert_int_equal(hcb_runtime_stats(rt, HCB_ALL_DEVICES, &st, NULL), HCB_OK);
    assert_int_equal(st.reserved_records, 1); /* the first one, only */
    hcb__runtime_submit_reserved(rt, tu_record(id, 0, 1, SMALL));
    atomic_store(&g->release, 1);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(atomic_load(&g->total), 2);
    hcb_runtime_destroy(rt);
    free(g);
}

static atomic_int calls_run;

static int
count_call(void *user, hcb_device device, const hcb_array *args, size_t nargs,
           const hcb_array *results, size_t nresults, hcb_error *err)
{
    (void)user, (void)device, (void)args, (void)nargs, (void)results;
    (void)nresults, (void)err;
    atomic_fetch_add(&calls_run, 1);
    return 0;
}

/* A call that waits for the taps its device issued before it is stopped:
 * its function does not run, nothing is recorded as a failed callback,
 * and the taps are delivered; the next call runs. */
static void
test_a_call_waiting_for_earlier_taps_is_stopped(void **state)
{
    hcb_runtime *rt = tu_new_runtime(1 << 20);
    tu_gate *g = calloc(1, sizeof *g);
    uint64_t id = tu_register_gate(rt, g, 0), call = 0;
    hcb_call_target c = HCB_CALL_TARGET_INIT;
    stop_after stop = {CPU0, 3, true, 0};
    hcb_error err;

    (void)state;
    atomic_store(&calls_run, 0);
    c.fn = count_call;
    c.name = "after";
    c.name_len = 5;
    assert_int_equal(hcb_runtime_register_call(rt, &c, &call, NULL), HCB_OK);
    assert_int_equal(
        hcb_runtime_set_interrupt(rt, POLL, stop_after_fn, &stop, NULL),
        HCB_OK);
    /* nothing before it: the call does not wait, nor ask the check */
    assert_int_equal(hcb_runtime_call(rt, call, CPU0, NULL, 0, NULL, 0, NULL),
                     HCB_OK);
    assert_int_equal(atomic_load(&stop.calls), 0);
    assert_int_equal(hcb_runtime_submit(rt, tu_record(id, 0, 0, SMALL), NULL),
                     HCB_OK);
    tu_wait_holding(g);
    assert_int_equal(hcb_runtime_call(rt, call, CPU0, NULL, 0, NULL, 0, &err),
                     HCB_ECALLBACK);
    assert_string_equal(err.message,
                        "call 'after' on cpu:0 interrupted while waiting for "
                        "the 1 taps its device issued before it: stopped by "
                        "the test");
    assert_int_equal(atomic_load(&stop.calls), 3);
    assert_int_equal(atomic_load(&calls_run), 1); /* the first only */
    assert_int_equal(hcb_runtime_take_error(rt, NULL), 0);
    assert_int_equal(hcb_runtime_set_interrupt(rt, 0, NULL, NULL, NULL),
                     HCB_OK);
    atomic_store(&g->release, 1);
    assert_int_equal(hcb_runtime_call(rt, call, CPU0, NULL, 0, NULL, 0, NULL),
                     HCB_OK);
    assert_int_equal(atomic_load(&g->total), 1);
    assert_int_equal(atomic_load(&calls_run), 2);
    hcb_runtime_destroy(rt);
    free(g);
}

/* A tap delivered now (hcb_runtime_deliver: the drop-ins, which run in the
 * computation's thread) waits for its device's earlier taps; that wait is
 * stopped while a tap function holds it.  The delivered record's function
 * does not run, the held record is delivered all the same, and the next
 * delivery waits for it. */
static void
test_a_delivery_is_stopped(void **state)
{
    hcb_runtime *rt = tu_new_runtime(1 << 20);
    tu_gate *g = calloc(1, sizeof *g);
    uint64_t id = tu_register_gate(rt, g, 0);
    stop_after stop = {CPU0, 3, true, 0};
    hcb_error err;

    (void)state;
    assert_int_equal(
        hcb_runtime_set_interrupt(rt, POLL, stop_after_fn, &stop, NULL),
        HCB_OK);
    assert_int_equal(hcb_runtime_submit(rt, tu_record(id, 0, 0, SMALL), NULL),
                     HCB_OK);
    tu_wait_holding(g);
    assert_int_equal(hcb_runtime_deliver(rt, tu_record(id, 0, 5, SMALL),
                                         HCB_DELIVER_FAIL, &err),
                     HCB_ECALLBACK);
    assert_string_equal(err.message, "tap 'gate' on cpu:0 interrupted while "
                                     "waiting for the 1 taps its device "
                                     "issued before it: stopped by the test");
    assert_int_equal(atomic_load(&stop.calls), 3);
    assert_int_equal(hcb_runtime_set_interrupt(rt, 0, NULL, NULL, NULL),
                     HCB_OK);
    atomic_store(&g->release, 1);
    assert_int_equal(hcb_runtime_deliver(rt, tu_record(id, 0, 6, SMALL),
                                         HCB_DELIVER_FAIL, NULL),
                     HCB_OK);
    assert_int_equal(atomic_load(&g->seen[0]), 1);
    assert_int_equal(atomic_load(&g->seen[5]), 0); /* never ran */
    assert_int_equal(atomic_load(&g->seen[6]), 1);
    hcb_runtime_destroy(rt);
    free(g);
}

/* A wait keeps the check it began with: clearing the runtime's check does
 * not stop one that is waiting from asking its own. */
typedef struct deliverer {
    hcb_runtime *rt;
    uint64_t id;
    int rc;
    atomic_int done;
} deliverer;

static void *
deliver_main(void *arg)
{
    deliverer *d = arg;

    d->rc = hcb_runtime_deliver(d->rt, tu_record(d->id, 0, 1, SMALL),
                                HCB_DELIVER_FAIL, NULL);
    atomic_store(&d->done, 1);
    return NULL;
}

static void
test_a_wait_keeps_the_check_it_began_with(void **state)
{
    hcb_runtime *rt = tu_new_runtime(1 << 20);
    tu_gate *g = calloc(1, sizeof *g);
    uint64_t id = tu_register_gate(rt, g, 0);
    stop_after never = {CPU0, 0, false, 0};
    deliverer f = {rt, id, -1, 0};
    pthread_t t;
    int before;

    (void)state;
    assert_int_equal(
        hcb_runtime_set_interrupt(rt, POLL, stop_after_fn, &never, NULL),
        HCB_OK);
    assert_int_equal(hcb_runtime_submit(rt, tu_record(id, 0, 0, SMALL), NULL),
                     HCB_OK);
    tu_wait_holding(g);
    assert_int_equal(pthread_create(&t, NULL, deliver_main, &f), 0);
    tu_poll_at_least(&never.calls, 2, TU_PATIENCE_S);
    assert_int_equal(hcb_runtime_set_interrupt(rt, 0, NULL, NULL, NULL),
                     HCB_OK);
    before = atomic_load(&never.calls);
    tu_poll_at_least(&never.calls, before + 1, TU_PATIENCE_S);
    assert_true(atomic_load(&never.calls) > before);
    assert_false(atomic_load(&f.done));
    atomic_store(&g->release, 1);
    pthread_join(t, NULL);
    assert_int_equal(f.rc, HCB_OK);
    hcb_runtime_destroy(rt);
    free(g);
}

/* A polling barrier calls its own check (not the runtime's) while a tap
 * function runs, stops when the check says so, and the runtime goes on. */
static void
test_a_polling_barrier_is_stopped_by_its_check(void **state)
{
    hcb_runtime *rt = tu_new_runtime(1 << 20);
    tu_gate *g = calloc(1, sizeof *g);
    uint64_t id = tu_register_gate(rt, g, 0);
    stop_after stop = {CPU0, 3, false, 0};
    hcb_error err;

    (void)state;
    assert_int_equal(hcb_runtime_submit(rt, tu_record(id, 0, 0, 4), NULL),
                     HCB_OK);
    tu_wait_holding(g);
    assert_int_equal(hcb_runtime_barrier_poll(rt, HCB_ALL_DEVICES, 10000000u,
                                              stop_after_fn, &stop, &err),
                     HCB_ECALLBACK);
    assert_string_equal(err.message, "barrier on cpu:0 interrupted by its "
                                     "check; the records it waited for are "
                                     "still delivered");
    assert_int_equal(atomic_load(&stop.calls), 3);
    atomic_store(&g->release, 1);
    assert_int_equal(hcb_runtime_submit(rt, tu_record(id, 0, 1, 4), NULL),
                     HCB_OK);
    /* a plain barrier: the check, past 3, would stop this one too whenever
     * the two taps take longer than one poll (a loaded machine) */
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, &err), HCB_OK);
    assert_int_equal(atomic_load(&g->total), 2);
    hcb_runtime_destroy(rt);
    free(g);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_check_needs_a_poll_interval),
        cmocka_unit_test(test_a_submit_waiting_for_room_is_stopped),
        cmocka_unit_test(test_a_reservation_waiting_for_room_is_stopped),
        cmocka_unit_test(test_a_call_waiting_for_earlier_taps_is_stopped),
        cmocka_unit_test(test_a_delivery_is_stopped),
        cmocka_unit_test(test_a_wait_keeps_the_check_it_began_with),
        cmocka_unit_test(test_a_polling_barrier_is_stopped_by_its_check),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
