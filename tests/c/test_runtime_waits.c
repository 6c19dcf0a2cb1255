/* test_runtime_waits.c - what waits in the runtime, and says so:
 * back-pressure per record, a stalled producer warned about from the
 * warning thread, a call behind a backlog or a stuck tap, a device waiting
 * for room, and taps delivered now that wait for their device. */
#define _GNU_SOURCE /* pthread_getname_np, pthread_setname_np */
#include "testutil.h"

#include <stdio.h>

typedef struct submitter {
    hcb_runtime *rt;
    uint64_t id;
    int32_t value;
    atomic_int done;
} submitter;

static void *
submit_one(void *arg)
{
    submitter *s = arg;

    hcb_runtime_submit(s->rt, tu_record(s->id, 0, s->value, 16), NULL);
    atomic_store(&s->done, 1);
    return NULL;
}

/* Back-pressure per record: with room for two records, tap 0 delivered and
 * tap 1 held by its tap function, a third submit goes through (0's room
 * is free) without waiting for 1. */
static void
test_backpressure_per_record(void **state)
{
    hcb_record *probe = tu_record(1, 0, 0, 16);
    hcb_runtime *rt = tu_new_runtime(2 * hcb_record_size(probe));
    tu_gate *g = calloc(1, sizeof *g);
    uint64_t id = tu_register_gate(rt, g, 1);
    submitter s = {rt, id, 2, 0};
    pthread_t t;
    int done;

    (void)state;
    hcb_record_release(probe);
    assert_int_equal(hcb_runtime_submit(rt, tu_record(id, 0, 0, 16), NULL),
                     HCB_OK);
    assert_int_equal(hcb_runtime_submit(rt, tu_record(id, 0, 1, 16), NULL),
                     HCB_OK);
    tu_wait_holding(g);
    assert_int_equal(pthread_create(&t, NULL, submit_one, &s), 0);
    /* the third submit returns while tap 1 is still held */
    done = tu_poll_at_least(&s.done, 1, TU_PATIENCE_S);
    assert_true(atomic_load(&g->holding)); /* 1 still in its tap function */
    atomic_store(&g->release, 1);
    pthread_join(t, NULL);
    assert_true(done); /* the third did not wait for tap 1 */
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(atomic_load(&g->total), 3);
    hcb_runtime_destroy(rt);
    free(g);
}

/* What the log sink saw: the thread that ran it and the message. */
typedef struct warned {
    atomic_int count;
    char thread[16];
    char message[HCB_ERROR_MESSAGE_SIZE];
} warned;

static void
note_warning(void *user, const char *message)
{
    warned *w = user;

    if (atomic_load(&w->count) == 0) {
        pthread_getname_np(pthread_self(), w->thread, sizeof w->thread);
        snprintf(w->message, sizeof w->message, "%s", message);
    }
    atomic_fetch_add(&w->count, 1);
}

/* A producer that waits long for room is warned about from the runtime's
 * warning thread, not on its own (XLA's) thread, which goes on waiting;
 * stop ends the warning thread. */
static void
test_a_stall_is_warned_from_the_warning_thread(void **state)
{
    hcb_record *probe = tu_record(1, 0, 0, 16);
    hcb_runtime *rt = tu_new_runtime(hcb_record_size(probe));
    tu_gate *g = calloc(1, sizeof *g);
    uint64_t id = tu_register_gate(rt, g, 0);
    submitter s = {rt, id, 1, 0};
    warned w = {0};
    pthread_t t;

    (void)state;
    hcb_record_release(probe);
    hcb_runtime_set_log(rt, note_warning, &w);
    assert_int_equal(hcb_runtime_submit(rt, tu_record(id, 0, 0, 16), NULL),
                     HCB_OK);
    tu_wait_holding(g);
    assert_int_equal(pthread_create(&t, NULL, submit_one, &s), 0);
    pthread_setname_np(t, "producer");
    tu_poll_at_least(&w.count, 1,
                     TU_PATIENCE_S); /* the warning comes after 2 s */
    assert_int_equal(atomic_load(&w.count), 1);
    assert_false(atomic_load(&s.done)); /* the producer still waits */
    assert_string_equal(w.thread, "hcb-warn");
    assert_non_null(strstr(w.message, "has waited"));
    assert_non_null(strstr(w.message, "tap function 'gate' is running"));
    atomic_store(&g->release, 1);
    pthread_join(t, NULL);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(atomic_load(&g->total), 2);
    assert_int_equal(hcb_runtime_stop(rt, NULL), HCB_OK);
    hcb_runtime_destroy(rt);
    free(g);
}

/* The runtime's warnings, kept for the test to read. */
typedef struct log_book {
    pthread_mutex_t mu;
    char text[8192];
    size_t len;
} log_book;

static void
book_log(void *user, const char *message)
{
    log_book *b = user;

    pthread_mutex_lock(&b->mu);
    b->len += (size_t)snprintf(b->text + b->len, sizeof b->text - b->len,
                               "%s\n", message);
    if (b->len >= sizeof b->text)
        b->len = sizeof b->text - 1;
    pthread_mutex_unlock(&b->mu);
}

static bool
book_has(log_book *b, const char *part)
{
    bool found;

    pthread_mutex_lock(&b->mu);
    found = strstr(b->text, part) != NULL;
    pthread_mutex_unlock(&b->mu);
    return found;
}

static int
nothing_call(void *user, hcb_device device, const hcb_array *args, size_t nargs,
             const hcb_array *results, size_t nresults, hcb_error *err)
{
    (void)user, (void)device, (void)args, (void)nargs, (void)results;
    (void)nresults, (void)err;
    return 0;
}

static uint64_t
register_nothing_call(hcb_runtime *rt)
{
    hcb_call_target c = HCB_CALL_TARGET_INIT;
    uint64_t id = 0;

    c.fn = nothing_call;
    c.name = "after";
    c.name_len = 5;
    assert_int_equal(hcb_runtime_register_call(rt, &c, &id, NULL), HCB_OK);
    return id;
}

typedef struct caller {
    hcb_runtime *rt;
    uint64_t id;
    atomic_int done;
} caller;

static void *
call_once(void *arg)
{
    caller *c = arg;

    assert_int_equal(hcb_runtime_call(c->rt, c->id, 0, NULL, 0, NULL, 0, NULL),
                     HCB_OK);
    atomic_store(&c->done, 1);
    return NULL;
}

/* A call behind a backlog that is being delivered (3,000 taps of 1 ms
 * each) says, after 2 s, how many taps are ahead of it, and does not say
 * that it may be waiting for itself. */
static void
test_a_call_behind_a_backlog_names_it(void **state)
{
    hcb_runtime *rt = tu_new_runtime(1 << 30);
    tu_sink *s = tu_sink_new();
    uint64_t id = tu_register_sink(rt, s), call = register_nothing_call(rt);
    log_book *book = calloc(1, sizeof *book);
    int32_t i;

    (void)state;
    pthread_mutex_init(&book->mu, NULL);
    hcb_runtime_set_log(rt, book_log, book);
    s->delay_us = 1000;
    for (i = 0; i < 3000; i++)
        assert_int_equal(hcb_runtime_submit(rt, tu_record(id, 0, i, 4), NULL),
                         HCB_OK);
    assert_int_equal(hcb_runtime_call(rt, call, 0, NULL, 0, NULL, 0, NULL),
                     HCB_OK);
    assert_int_equal(tu_sink_count(s), 3000);
    /* 3,000 taps of at least 1 ms: the call waited more than 2 s */
    assert_true(book_has(book, "call 'after' on cpu:0 has waited 2 s for "
                               "the taps its device issued before it: a "
                               "backlog of "));
    assert_true(book_has(book, " taps not yet delivered (the queue holds "));
    assert_true(book_has(book, " delivered meanwhile.  It goes on waiting"));
    assert_false(book_has(book, "wait for each other"));
    hcb_runtime_destroy(rt);
    tu_sink_free(s);
    pthread_mutex_destroy(&book->mu);
    free(book);
}

/* A call behind a tap function that does not return says, after 2 s, that
 * no tap was delivered and that they may wait for each other. */
static void
test_a_call_behind_a_stuck_tap_says_they_may_wait_for_each_other(void **state)
{
    hcb_runtime *rt = tu_new_runtime(1 << 20);
    tu_gate *g = calloc(1, sizeof *g);
    uint64_t id = tu_register_gate(rt, g, 0);
    log_book *book = calloc(1, sizeof *book);
    caller c = {rt, register_nothing_call(rt), 0};
    pthread_t t;
    double until;

    (void)state;
    pthread_mutex_init(&book->mu, NULL);
    hcb_runtime_set_log(rt, book_log, book);
    assert_int_equal(hcb_runtime_submit(rt, tu_record(id, 0, 0, 4), NULL),
                     HCB_OK);
    assert_int_equal(hcb_runtime_submit(rt, tu_record(id, 0, 1, 4), NULL),
                     HCB_OK);
    tu_wait_holding(g);
    assert_int_equal(pthread_create(&t, NULL, call_once, &c), 0);
    until = tu_now_s() + TU_PATIENCE_S;
    while (!book_has(book, "has waited") && tu_now_s() < until)
        tu_sleep_us(1000);
    assert_true(book_has(book, "call 'after' on cpu:0 has waited 2 s for the "
                               "taps its device issued before it (2 not yet "
                               "delivered), and none was delivered meanwhile "
                               "(the tap function now running: 'gate')"));
    assert_true(book_has(book, "they wait for each other"));
    assert_false(atomic_load(&c.done));
    atomic_store(&g->release, 1);
    pthread_join(t, NULL);
    assert_int_equal(atomic_load(&g->total), 2);
    hcb_runtime_destroy(rt);
    free(g);
    pthread_mutex_destroy(&book->mu);
    free(book);
}

/* A device waiting for room behind a backlog that is being delivered (a
 * record larger than the bound waits for an empty queue) says how much is
 * ahead of it, without the deadlock's explanation; one behind a tap
 * function that does not return gives it. */
static void
test_a_device_waiting_for_room_names_the_backlog(void **state)
{
    hcb_record *probe = tu_record(1, 0, 0, 4);
    size_t small = hcb_record_size(probe);
    hcb_runtime *rt = tu_new_runtime(3000 * small);
    tu_sink *s = tu_sink_new();
    uint64_t id = tu_register_sink(rt, s);
    log_book *book = calloc(1, sizeof *book);
    int32_t i;

    (void)state;
    hcb_record_release(probe);
    pthread_mutex_init(&book->mu, NULL);
    hcb_runtime_set_log(rt, book_log, book);
    s->delay_us = 1000;
    for (i = 0; i < 2900; i++)
        assert_int_equal(hcb_runtime_submit(rt, tu_record(id, 0, i, 4), NULL),
                         HCB_OK);
    /* larger than the bound: it waits for the queue to be empty */
    assert_int_equal(
        hcb_runtime_submit(rt, tu_record(id, 0, -1, 3000 * small), NULL),
        HCB_OK);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(tu_sink_count(s), 2901);
    /* 2,900 taps of at least 1 ms ahead: it waited more than 2 s */
    assert_true(book_has(book, "device cpu:0 has waited "));
    assert_true(book_has(book, " for room in its tap queue (bound "));
    assert_true(book_has(book, " behind a backlog: "));
    assert_true(book_has(book, " taps ("));
    assert_true(book_has(book, " not yet delivered, "));
    assert_false(book_has(book, "deadlocks"));
    hcb_runtime_destroy(rt);
    tu_sink_free(s);
    pthread_mutex_destroy(&book->mu);
    free(book);
}

typedef struct deliverer {
    hcb_runtime *rt;
    uint64_t id;
    hcb_device device;
    atomic_int done;
    int rc;
} deliverer;

static void *
deliver_thread(void *arg)
{
    deliverer *d = arg;

    d->rc = hcb_runtime_deliver(d->rt, tu_record(d->id, d->device, 3, 4),
                                HCB_DELIVER_FAIL, NULL);
    atomic_store(&d->done, 1);
    return NULL;
}

/* hcb_runtime_deliver runs the tap function at once in the calling thread
 * when nothing is queued before it, else once the records its device
 * queued before it are delivered; other devices' queues do not hold it
 * back (stopping its wait: test_interrupt.c). */
static void
test_deliver_waits_for_its_device(void **state)
{
    hcb_runtime *rt = tu_new_runtime(1 << 20);
    tu_gate *g = calloc(1, sizeof *g);
    uint64_t id = tu_register_gate(rt, g, 1);
    deliverer d = {rt, id, HCB_DEVICE(HCB_PLATFORM_CPU, 0), 0, -1};
    hcb_stats st = HCB_STATS_INIT;
    pthread_t t;
    int i;

    (void)state;
    /* nothing queued: delivered now, in this thread */
    assert_int_equal(hcb_runtime_deliver(rt, tu_record(id, d.device, 2, 4),
                                         HCB_DELIVER_FAIL, NULL),
                     HCB_OK);
    assert_int_equal(atomic_load(&g->seen[2]), 1);
    assert_int_equal(hcb_runtime_submit(rt, tu_record(id, 0, 0, 4), NULL),
                     HCB_OK);
    assert_int_equal(hcb_runtime_submit(rt, tu_record(id, 0, 1, 4), NULL),
                     HCB_OK);
    tu_wait_holding(g);
    /* device 1 has nothing queued: it does not wait for device 0 */
    assert_int_equal(hcb_runtime_deliver(
                         rt,
                         tu_record(id, HCB_DEVICE(HCB_PLATFORM_CPU, 1), 4, 4),
                         HCB_DELIVER_FAIL, NULL),
                     HCB_OK);
    assert_int_equal(atomic_load(&g->seen[4]), 1);
    assert_int_equal(pthread_create(&t, NULL, deliver_thread, &d), 0);
    for (i = 0; i < 50; i++)
        tu_sleep_us(1000);
    assert_false(atomic_load(&d.done)); /* record 1 is still held */
    assert_int_equal(atomic_load(&g->seen[3]), 0);
    atomic_store(&g->release, 1);
    pthread_join(t, NULL);
    assert_int_equal(d.rc, HCB_OK);
    assert_int_equal(atomic_load(&g->seen[3]), 1);
    assert_int_equal(atomic_load(&g->total), 5);
    /* deliveries count as records in and out, queued ones as before */
    assert_int_equal(hcb_runtime_stats(rt, HCB_ALL_DEVICES, &st, NULL), HCB_OK);
    assert_int_equal(st.records_in, 5);
    assert_int_equal(st.records_out, 5);
    assert_int_equal(st.bytes_in, st.bytes_out);

    hcb_runtime_destroy(rt);
    free(g);
}

/* A tap function on the consumer thread that delivers a record of its own
 * device now (a computation it runs in its own thread) does not wait for
 * its queue (it would wait for itself): the record runs at once, there. */
typedef struct self_deliver {
    hcb_runtime *rt;
    uint64_t inner;
    atomic_int rc;
} self_deliver;

static int
self_deliver_fn(void *user, hcb_record *rec, hcb_error *err)
{
    self_deliver *s = user;

    (void)err;
    assert_true(hcb_in_consumer_thread());
    atomic_store(&s->rc,
                 hcb_runtime_deliver(
                     s->rt, tu_record(s->inner, hcb_record_device(rec), 9, 4),
                     HCB_DELIVER_FAIL, NULL));
    return 0;
}

static void
test_deliver_from_its_own_consumer_runs_at_once(void **state)
{
    hcb_runtime *rt = tu_new_runtime(1 << 20);
    tu_sink *inner = tu_sink_new();
    self_deliver s = {rt, 0, -100};
    hcb_tap_target t = HCB_TAP_TARGET_INIT;
    uint64_t id = 0;

    (void)state;
    assert_false(hcb_in_consumer_thread());
    s.inner = tu_register_sink(rt, inner);
    t.fn = self_deliver_fn;
    t.user = &s;
    t.name = "self";
    t.name_len = 4;
    assert_int_equal(hcb_runtime_register_tap(rt, &t, &id, NULL), HCB_OK);
    assert_int_equal(hcb_runtime_submit(rt, tu_record(id, 0, 0, 4), NULL),
                     HCB_OK);
    assert_int_equal(hcb_runtime_barrier(rt, HCB_ALL_DEVICES, NULL), HCB_OK);
    assert_int_equal(atomic_load(&s.rc), HCB_OK);
    assert_int_equal(tu_sink_count(inner), 1);
    assert_int_equal(inner->first_value[0], 9);
    hcb_runtime_destroy(rt);
    tu_sink_free(inner);
}

/* What cannot be delivered is refused, the record released, nothing
 * recorded: a NULL record, an unknown id, a call target's id. */
static int
noop_call(void *user, hcb_device device, const hcb_array *args, size_t nargs,
          const hcb_array *results, size_t nresults, hcb_error *err)
{
    (void)user, (void)device, (void)args, (void)nargs, (void)results;
    (void)nresults, (void)err;
    return 0;
}

static void
test_deliver_refuses_what_is_no_tap(void **state)
{
    hcb_runtime *rt = tu_new_runtime(1 << 20);
    hcb_call_target c = HCB_CALL_TARGET_INIT;
    hcb_error err;
    uint64_t id = 0;

    (void)state;
    c.fn = noop_call;
    c.name = "c";
    c.name_len = 1;
    assert_int_equal(hcb_runtime_register_call(rt, &c, &id, NULL), HCB_OK);
    assert_int_equal(hcb_runtime_deliver(rt, NULL, HCB_DELIVER_FAIL, &err),
                     HCB_EINVAL);
    assert_string_equal(err.message, "record is NULL");
    assert_int_equal(hcb_runtime_deliver(rt, tu_record(id + 7, 0, 0, 4),
                                         HCB_DELIVER_FAIL, &err),
                     HCB_ENOTFOUND);
    assert_int_equal(
        hcb_runtime_deliver(rt, tu_record(id, 0, 0, 4), HCB_DELIVER_FAIL, &err),
        HCB_EINVAL);
    assert_string_equal(err.message,
                        "id 1 is the call target 'c', not a tap target");
    assert_int_equal(hcb_runtime_take_error(rt, NULL), 0);
    hcb_runtime_destroy(rt);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backpressure_per_record),
        cmocka_unit_test(test_a_stall_is_warned_from_the_warning_thread),
        cmocka_unit_test(test_a_call_behind_a_backlog_names_it),
        cmocka_unit_test(
            test_a_call_behind_a_stuck_tap_says_they_may_wait_for_each_other),
        cmocka_unit_test(test_a_device_waiting_for_room_names_the_backlog),
        cmocka_unit_test(test_deliver_waits_for_its_device),
        cmocka_unit_test(test_deliver_from_its_own_consumer_runs_at_once),
        cmocka_unit_test(test_deliver_refuses_what_is_no_tap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
