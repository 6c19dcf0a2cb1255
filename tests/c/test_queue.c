/* test_queue.c - the bounded FIFO: order, back-pressure, oversized records,
 * wait_done, close. */
#include "testutil.h"

#include "runtime/queue.h"

typedef struct consumer_ctx {
    hcb__queue *q;
    long delay_us;
    int32_t seen[4096];
    size_t n;
    atomic_int exited; /* its pop returned NULL */
} consumer_ctx;

static void *
consume(void *arg)
{
    consumer_ctx *c = arg;
    hcb_record *rec, *next;

    while ((rec = hcb__queue_pop(c->q, 0, 0)) != NULL) {
        for (; rec != NULL; rec = next) {
            size_t size = rec->size;

            next = atomic_load_explicit(&rec->next, memory_order_relaxed);
            memcpy(&c->seen[c->n++], rec->args[0].data, sizeof(int32_t));
            if (c->delay_us > 0)
                tu_sleep_us(c->delay_us);
            hcb_record_release(rec);
            hcb__queue_done(c->q, 1, size); /* one at a time here */
        }
    }
    atomic_store(&c->exited, 1);
    return NULL;
}

static void
start(consumer_ctx *c, pthread_t *t)
{
    hcb__queue_set_consumer_active(c->q, true);
    assert_int_equal(pthread_create(t, NULL, consume, c), 0);
}

static void
finish(consumer_ctx *c, pthread_t t)
{
    hcb__queue_close(c->q);
    pthread_join(t, NULL);
}

typedef struct pusher {
    hcb__queue *q;
    hcb_record *rec;
    atomic_int done;
} pusher;

static void *
push_one(void *arg)
{
    pusher *p = arg;

    hcb__queue_push(p->q, p->rec, false, NULL);
    atomic_store(&p->done, 1);
    return NULL;
}

/* Whether `p` has pushed within `ms` milliseconds. */
static bool
pushed_within(pusher *p, int ms)
{
    int i;

    for (i = 0; i < ms && !atomic_load(&p->done); i++)
        tu_sleep_us(1000);
    return atomic_load(&p->done);
}

/* A producer waiting on a full queue resumes once one record is finished,
 * while the consumer still holds the rest of its batch: whether the record
 * finishes while the producer waits (`finish_first` false) or just before
 * it starts to (true). */
static void
check_resumes_after_one_record(bool finish_first)
{
    hcb__queue q;
    hcb_record *probe = tu_record(1, 0, 0, 16), *r0, *r1, *chain;
    size_t rsize = probe->size;
    pusher p = {.q = &q};
    pthread_t t;
    bool resumed;

    hcb_record_release(probe);
    assert_int_equal(hcb__queue_init(&q, 2 * rsize), HCB_OK); /* two fit */
    hcb__queue_push(&q, tu_record(1, 0, 0, 16), false, NULL);
    hcb__queue_push(&q, tu_record(1, 0, 1, 16), false, NULL);
    hcb__queue_set_consumer_active(&q, true);
    chain = hcb__queue_pop(&q, 0, 0); /* the consumer takes both */
    r0 = chain;
    r1 = atomic_load(&r0->next);
    assert_non_null(r1);
    p.rec = tu_record(1, 0, 2, 16);
    if (finish_first) {
        hcb__queue_finished(&q, r0->size);
        hcb_record_release(r0);
    }
    assert_int_equal(pthread_create(&t, NULL, push_one, &p), 0);
    if (!finish_first) {
        assert_false(pushed_within(&p, 50)); /* full: it waits */
        hcb__queue_finished(&q, r0->size);
        hcb_record_release(r0);
    }
    /* r1 is still held by the consumer */
    resumed = pushed_within(&p, 2000);
    hcb__queue_finished(&q, r1->size); /* releases the producer anyway */
    hcb_record_release(r1);
    pthread_join(t, NULL);
    assert_true(resumed);
    chain = hcb__queue_pop(&q, 0, 0);
    assert_non_null(chain);
    assert_null(atomic_load(&chain->next));
    hcb__queue_finished(&q, chain->size);
    hcb_record_release(chain);
    hcb__queue_close(&q);
    assert_null(hcb__queue_pop(&q, 0, 0));
    assert_int_equal(q.done, 3);
    assert_int_equal(q.bytes, 0);
    hcb__queue_destroy(&q);
}

static void
test_producer_resumes_after_one_record(void **state)
{
    (void)state;
    check_resumes_after_one_record(false);
    check_resumes_after_one_record(true);
}

/* A reservation takes the room, waiting like a push; the record pushed
 * into it later never waits, even with the queue full; room not used goes
 * back. */
static void
test_reserved_room_is_pushed_without_waiting(void **state)
{
    hcb__queue q;
    hcb_record *probe = tu_record(1, 0, 0, 16), *chain, *next;
    size_t rsize = probe->size;
    int n = 0;

    (void)state;
    hcb_record_release(probe);
    assert_int_equal(hcb__queue_init(&q, 2 * rsize), HCB_OK); /* two fit */
    hcb__queue_set_consumer_active(&q, true);
    assert_int_equal(hcb__queue_reserve(&q, rsize, false, NULL),
                     HCB__PUSH_QUEUED);
    assert_int_equal(hcb__queue_reserve(&q, rsize, false, NULL),
                     HCB__PUSH_QUEUED);
    assert_int_equal(q.bytes, 2 * rsize); /* full, nothing pushed yet */
    hcb__queue_push_reserved(&q, tu_record(1, 0, 0, 16));
    hcb__queue_push_reserved(&q, tu_record(1, 0, 1, 16));
    assert_int_equal(q.bytes, 2 * rsize);
    assert_int_equal(q.reserved, 0);
    assert_int_equal(hcb__queue_reserve(&q, rsize, true, NULL),
                     HCB__PUSH_QUEUED); /* its consumer: no wait */
    hcb__queue_unreserve(&q, rsize);
    assert_int_equal(q.bytes, 2 * rsize);
    for (chain = hcb__queue_pop(&q, 0, 0); chain != NULL; chain = next, n++) {
        int32_t v;

        next = atomic_load(&chain->next);
        memcpy(&v, chain->args[0].data, sizeof v);
        assert_int_equal(v, n);
        hcb__queue_finished(&q, chain->size);
        hcb_record_release(chain);
    }
    assert_int_equal(n, 2);
    hcb__queue_close(&q);
    assert_null(hcb__queue_pop(&q, 0, 0));
    assert_int_equal(q.bytes, 0);
    hcb__queue_destroy(&q);
}

/* Closing does not end a consumer while a reserved record is on its way:
 * it waits for it, delivers it, then exits; one given back lets it exit. */
static void
test_a_closing_consumer_waits_for_reserved_records(void **state)
{
    hcb__queue q;
    consumer_ctx *c = calloc(1, sizeof *c);
    hcb_record *probe = tu_record(1, 0, 0, 16);
    size_t rsize = probe->size;
    pthread_t t;
    int i;

    (void)state;
    hcb_record_release(probe);
    assert_int_equal(hcb__queue_init(&q, 1 << 20), HCB_OK);
    c->q = &q;
    start(c, &t);
    assert_int_equal(hcb__queue_reserve(&q, rsize, false, NULL),
                     HCB__PUSH_QUEUED);
    hcb__queue_close(&q);
    tu_sleep_us(50000);
    assert_true(atomic_load(&q.consumer_active)); /* still there */
    hcb__queue_push_reserved(&q, tu_record(1, 0, 42, 16));
    pthread_join(t, NULL);
    assert_int_equal(c->n, 1);
    assert_int_equal(c->seen[0], 42);
    assert_false(atomic_load(&q.consumer_active));
    /* the same, the room given back instead */
    hcb__queue_reopen(&q);
    start(c, &t);
    assert_int_equal(hcb__queue_reserve(&q, 256, false, NULL),
                     HCB__PUSH_QUEUED);
    hcb__queue_close(&q);
    for (i = 0; i < 20; i++)
        tu_sleep_us(1000);
    assert_true(atomic_load(&q.consumer_active));
    hcb__queue_unreserve(&q, 256);
    pthread_join(t, NULL);
    assert_int_equal(c->n, 1);
    assert_int_equal(q.bytes, 0);
    hcb__queue_destroy(&q);
    free(c);
}

/* A reservation that finds no consumer active takes nothing.  Here the
 * consumer has been closed while a record is reserved, and has cleared
 * consumer_active as it does on its way out, just when the next
 * reservation reads it; it saw the first reservation counted and stays.
 * The stop that closed the queue waits to join it, and the second
 * reserver (channels.c) waits for that stop before it starts another: so
 * the consumer must not wait for the second record too.  It exits once the
 * first is pushed. */
static void
test_a_refused_reservation_takes_nothing(void **state)
{
    hcb__queue q;
    consumer_ctx *c = calloc(1, sizeof *c);
    hcb_record *probe = tu_record(1, 0, 0, 16);
    size_t rsize = probe->size;
    pthread_t t;
    int exited;

    (void)state;
    hcb_record_release(probe);
    assert_int_equal(hcb__queue_init(&q, 1 << 20), HCB_OK);
    c->q = &q;
    start(c, &t);
    assert_int_equal(hcb__queue_reserve(&q, rsize, false, NULL),
                     HCB__PUSH_QUEUED);
    hcb__queue_close(&q);
    hcb__queue_set_consumer_active(&q, false); /* the moment of the race */
    assert_int_equal(hcb__queue_reserve(&q, rsize, false, NULL),
                     HCB__PUSH_NO_CONSUMER);
    assert_int_equal(atomic_load(&q.reserved), 1); /* the first only */
    assert_int_equal(atomic_load(&q.bytes), rsize);
    hcb__queue_push_reserved(&q, tu_record(1, 0, 7, 16));
    tu_poll_at_least(&c->exited, 1, TU_PATIENCE_S);
    exited = atomic_load(&c->exited);
    if (!exited)
        hcb__queue_unreserve(&q, rsize); /* let it go; the test fails */
    pthread_join(t, NULL);
    assert_true(exited);
    assert_int_equal(c->n, 1);
    assert_int_equal(c->seen[0], 7);
    assert_int_equal(q.bytes, 0);
    hcb__queue_destroy(&q);
    free(c);
}

typedef struct stall_log {
    atomic_int calls;
    _Atomic uint64_t waited_ns;
} stall_log;

static void
on_stall(void *user, uint64_t waited_ns, uint64_t delivered)
{
    stall_log *s = user;

    assert_int_equal(delivered, 0); /* the consumer holds the only record */
    atomic_store(&s->waited_ns, waited_ns);
    atomic_fetch_add(&s->calls, 1);
}

/* A producer that waits longer than the stall time calls the stall
 * function once, and goes on waiting. */
static void
test_stall_callback_once_per_wait(void **state)
{
    hcb__queue q;
    hcb_record *probe = tu_record(1, 0, 0, 16), *chain;
    stall_log log = {0};
    pusher p = {.q = &q};
    pthread_t t;

    (void)state;
    assert_int_equal(hcb__queue_init(&q, probe->size), HCB_OK);
    hcb_record_release(probe);
    hcb__queue_set_stall(&q, on_stall, &log, 20000000u); /* 20 ms */
    hcb__queue_push(&q, tu_record(1, 0, 0, 16), false, NULL);
    hcb__queue_set_consumer_active(&q, true);
    chain = hcb__queue_pop(&q, 0, 0);
    p.rec = tu_record(1, 0, 1, 16);
    assert_int_equal(pthread_create(&t, NULL, push_one, &p), 0);
    tu_poll_at_least(&log.calls, 1, TU_PATIENCE_S);
    tu_sleep_us(50000);
    assert_int_equal(atomic_load(&log.calls), 1);
    assert_true(atomic_load(&log.waited_ns) >= 20000000u);
    assert_false(atomic_load(&p.done)); /* still waiting */
    hcb__queue_finished(&q, chain->size);
    hcb_record_release(chain);
    pthread_join(t, NULL);
    chain = hcb__queue_pop(&q, 0, 0);
    hcb__queue_finished(&q, chain->size);
    hcb_record_release(chain);
    hcb__queue_close(&q);
    assert_null(hcb__queue_pop(&q, 0, 0));
    hcb__queue_destroy(&q);
}

static void
test_fifo_order(void **state)
{
    hcb__queue q;
    consumer_ctx *c = calloc(1, sizeof *c);
    pthread_t t;
    int32_t i;

    (void)state;
    assert_int_equal(hcb__queue_init(&q, 1 << 20), HCB_OK);
    c->q = &q;
    for (i = 0; i < 100; i++)
        assert_int_equal(
            hcb__queue_push(&q, tu_record(1, 0, i, 1), false, NULL),
            HCB__PUSH_NO_CONSUMER);
    start(c, &t);
    finish(c, t);
    assert_int_equal(c->n, 100);
    for (i = 0; i < 100; i++)
        assert_int_equal(c->seen[i], i);
    assert_int_equal(q.bytes, 0);
    hcb__queue_destroy(&q);
    free(c);
}

static void
test_backpressure_tiny_bound_slow_consumer(void **state)
{
    hcb__queue q;
    consumer_ctx *c = calloc(1, sizeof *c);
    hcb_record *probe = tu_record(1, 0, 0, 16);
    size_t rsize = probe->size;
    pthread_t t;
    int32_t i;

    (void)state;
    hcb_record_release(probe);
    /* Room for two records: the producer must wait for the consumer. */
    assert_int_equal(hcb__queue_init(&q, 2 * rsize), HCB_OK);
    c->q = &q;
    c->delay_us = 200;
    start(c, &t);
    for (i = 0; i < 300; i++) {
        hcb__queue_push(&q, tu_record(1, 0, i, 16), false, NULL);
        assert_true(q.high_water <= 2 * rsize);
    }
    finish(c, t);
    assert_int_equal(c->n, 300); /* nothing lost */
    for (i = 0; i < 300; i++)
        assert_int_equal(c->seen[i], i);
    assert_true(q.waits > 0);
    assert_true(q.wait_ns > 0);
    assert_int_equal(q.pushed, 300);
    assert_int_equal(q.done, 300);
    hcb__queue_destroy(&q);
    free(c);
}

static void
test_oversized_record_passes_alone(void **state)
{
    hcb__queue q;
    consumer_ctx *c = calloc(1, sizeof *c);
    pthread_t t;

    (void)state;
    assert_int_equal(hcb__queue_init(&q, 16), HCB_OK); /* < any record */
    c->q = &q;
    c->delay_us = 1000;
    start(c, &t);
    hcb__queue_push(&q, tu_record(1, 0, 1, 1000), false, NULL);
    hcb__queue_push(&q, tu_record(1, 0, 2, 1000), false, NULL); /* waits */
    hcb__queue_push(&q, tu_record(1, 0, 3, 1000), false, NULL);
    /* Never two at once: the high-water mark is one record. */
    assert_true(q.high_water < 2 * 4000);
    finish(c, t);
    assert_int_equal(c->n, 3);
    assert_int_equal(c->seen[2], 3);
    hcb__queue_destroy(&q);
    free(c);
}

static void
test_wait_done_waits_for_consumption(void **state)
{
    hcb__queue q;
    consumer_ctx *c = calloc(1, sizeof *c);
    pthread_t t;
    int32_t i;

    (void)state;
    assert_int_equal(hcb__queue_init(&q, 1 << 20), HCB_OK);
    c->q = &q;
    c->delay_us = 500;
    start(c, &t);
    for (i = 0; i < 20; i++)
        hcb__queue_push(&q, tu_record(1, 0, i, 1), false, NULL);
    hcb__queue_wait_done(&q);
    assert_int_equal(c->n, 20); /* read by this thread after the barrier */
    finish(c, t);
    hcb__queue_destroy(&q);
    free(c);
}

static void
test_close_reports_inactive_consumer(void **state)
{
    hcb__queue q;
    consumer_ctx *c = calloc(1, sizeof *c);
    pthread_t t;

    (void)state;
    assert_int_equal(hcb__queue_init(&q, 1 << 20), HCB_OK);
    c->q = &q;
    start(c, &t);
    assert_int_equal(hcb__queue_push(&q, tu_record(1, 0, 7, 1), false, NULL),
                     HCB__PUSH_QUEUED);
    finish(c, t);
    hcb__queue_reopen(&q);
    /* No consumer now: a push says so, and the record waits (stranded). */
    assert_int_equal(hcb__queue_push(&q, tu_record(1, 0, 8, 1), false, NULL),
                     HCB__PUSH_NO_CONSUMER);
    assert_true(hcb__queue_stranded(&q));
    start(c, &t);
    finish(c, t);
    assert_int_equal(c->n, 2);
    assert_int_equal(c->seen[1], 8);
    hcb__queue_destroy(&q);
    free(c);
}

/* Producers pushing concurrently (the lock-free push) under a bound small
 * enough that they wait: each producer's records arrive whole and in its
 * order, and a barrier after a push returns only once that record is done. */
#define PRODUCERS    4
#define PER_PRODUCER 5000

typedef struct stress {
    hcb__queue *q;
    _Atomic int32_t last[PRODUCERS]; /* last value consumed per producer */
    bool in_order;
    int producer;
    bool barrier_ok[PRODUCERS];
} stress;

static void *
stress_consume(void *arg)
{
    stress *s = arg;
    hcb_record *rec, *next;
    uint64_t records = 0;
    size_t bytes = 0;

    while ((rec = hcb__queue_pop(s->q, records, bytes)) != NULL) {
        records = 0;
        bytes = 0;
        for (; rec != NULL; rec = next) {
            int32_t v;

            next = atomic_load_explicit(&rec->next, memory_order_relaxed);
            memcpy(&v, rec->args[0].data, sizeof v);
            if (v % PER_PRODUCER != atomic_load(&s->last[v / PER_PRODUCER]) + 1)
                s->in_order = false;
            atomic_store(&s->last[v / PER_PRODUCER], v % PER_PRODUCER);
            records++;
            bytes += rec->size;
            hcb_record_release(rec);
        }
    }
    return NULL;
}

typedef struct producer_arg {
    stress *s;
    int id;
} producer_arg;

static void *
stress_produce(void *arg)
{
    producer_arg *p = arg;
    int32_t i;

    p->s->barrier_ok[p->id] = true;
    for (i = 0; i < PER_PRODUCER; i++) {
        hcb__queue_push(p->s->q,
                        tu_record(1, 0, p->id * PER_PRODUCER + i, 1 + i % 40),
                        false, NULL);
        if (i % 500 == 499) {
            hcb__queue_wait_done(p->s->q);
            if (atomic_load(&p->s->last[p->id]) < i)
                p->s->barrier_ok[p->id] = false;
        }
    }
    return NULL;
}

static void
test_concurrent_producers(void **state)
{
    hcb__queue q;
    stress *s = calloc(1, sizeof *s);
    hcb_record *probe = tu_record(1, 0, 0, 40);
    size_t bound = 8 * probe->size; /* 8 of the largest records */
    producer_arg args[PRODUCERS];
    pthread_t consumer, producers[PRODUCERS];
    int i;

    (void)state;
    hcb_record_release(probe);
    assert_int_equal(hcb__queue_init(&q, bound), HCB_OK);
    s->q = &q;
    s->in_order = true;
    for (i = 0; i < PRODUCERS; i++)
        atomic_init(&s->last[i], -1);
    hcb__queue_set_consumer_active(&q, true);
    assert_int_equal(pthread_create(&consumer, NULL, stress_consume, s), 0);
    for (i = 0; i < PRODUCERS; i++) {
        args[i] = (producer_arg){s, i};
        assert_int_equal(
            pthread_create(&producers[i], NULL, stress_produce, &args[i]), 0);
    }
    for (i = 0; i < PRODUCERS; i++)
        pthread_join(producers[i], NULL);
    hcb__queue_wait_done(&q);
    for (i = 0; i < PRODUCERS; i++) {
        assert_int_equal(atomic_load(&s->last[i]), PER_PRODUCER - 1);
        assert_true(s->barrier_ok[i]);
    }
    assert_true(s->in_order);
    assert_int_equal(q.pushed, PRODUCERS * PER_PRODUCER);
    assert_int_equal(q.done, PRODUCERS * PER_PRODUCER);
    assert_int_equal(q.bytes, 0);
    assert_true(q.high_water <= bound);
    assert_true(q.waits > 0); /* producers did wait for space */
    hcb__queue_close(&q);
    pthread_join(consumer, NULL);
    hcb__queue_destroy(&q);
    free(s);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifo_order),
        cmocka_unit_test(test_backpressure_tiny_bound_slow_consumer),
        cmocka_unit_test(test_oversized_record_passes_alone),
        cmocka_unit_test(test_wait_done_waits_for_consumption),
        cmocka_unit_test(test_close_reports_inactive_consumer),
        cmocka_unit_test(test_concurrent_producers),
        cmocka_unit_test(test_producer_resumes_after_one_record),
        cmocka_unit_test(test_stall_callback_once_per_wait),
        cmocka_unit_test(test_reserved_room_is_pushed_without_waiting),
        cmocka_unit_test(test_a_closing_consumer_waits_for_reserved_records),
        cmocka_unit_test(test_a_refused_reservation_takes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
