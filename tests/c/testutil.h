/*
 * testutil.h - helpers shared by the C tests: a failing allocator, a
 * recording tap target and one that holds a record until released.
 */
#ifndef HCB_TESTUTIL_H
#define HCB_TESTUTIL_H

#ifndef _GNU_SOURCE
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#endif

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "hcb/hcb.h"

/* Under valgrind (make ctest-valgrind sets HCB_VALGRIND=1): a test whose
 * premise valgrind does not give skips itself, saying why. */
static inline int
tu_under_valgrind(void)
{
    const char *v = getenv("HCB_VALGRIND");

    return v != NULL && v[0] == '1';
}

/* ---- a failing allocator: the k-th allocation from now fails ----------- */

static atomic_long tu_alloc_countdown = -1; /* -1: never fail */
static atomic_long tu_live_allocs = 0;

static inline void *
tu_alloc(void *user, size_t size)
{
    long k;

    (void)user;
    k = atomic_fetch_sub(&tu_alloc_countdown, 1);
    if (k == 0)
        return NULL;
    if (k < 0)
        atomic_store(&tu_alloc_countdown, -1);
    atomic_fetch_add(&tu_live_allocs, 1);
    return malloc(size);
}

static inline void
tu_free(void *user, void *ptr)
{
    (void)user;
    atomic_fetch_sub(&tu_live_allocs, 1);
    free(ptr);
}

static inline void
tu_install_allocator(void)
{
    hcb_allocator a = {sizeof a, tu_alloc, tu_free, NULL};

    hcb_set_allocator(&a);
}

/* Fail the k-th allocation from now (0 = the next one). */
static inline void
tu_fail_alloc_after(long k)
{
    atomic_store(&tu_alloc_countdown, k);
}

static inline void
tu_sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};

    nanosleep(&ts, NULL);
}

/* Seconds on the monotonic clock. */
static inline double
tu_now_s(void)
{
    struct timespec now;

    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

/* How long a test waits for something that must happen before it fails:
 * bounded in wall time, not in polls (under valgrind on a busy machine a
 * waiter that spins with sched_yield before it sleeps can take seconds to
 * reach its timed wait, and each poll's sleep stretches). */
#define TU_PATIENCE_S 30.0

/* Polls every millisecond until `*count` is at least `want` or `seconds`
 * of wall time have passed; returns what it last read. */
static inline int
tu_poll_at_least(atomic_int *count, int want, double seconds)
{
    double until = tu_now_s() + seconds;
    int seen;

    while ((seen = atomic_load(count)) < want && tu_now_s() < until)
        tu_sleep_us(1000);
    return seen;
}

/* ---- a recording tap target -------------------------------------------- */

#define TU_MAX_SEEN 200000

typedef struct tu_sink {
    pthread_mutex_t mu;
    size_t n;
    int32_t first_value[TU_MAX_SEEN]; /* first int32 of arg 0, or -1 */
    hcb_device device[TU_MAX_SEEN];
    long delay_us; /* sleep per record: a slow consumer */
    int fail_on;   /* return an error for this value */
} tu_sink;

static inline int
tu_sink_fn(void *user, hcb_record *rec, hcb_error *err)
{
    tu_sink *s = user;
    int32_t v = -1;

    if (hcb_record_nargs(rec) > 0 && hcb_record_args(rec)[0].nbytes >= 4)
        memcpy(&v, hcb_record_args(rec)[0].data, sizeof v);
    if (s->delay_us > 0)
        tu_sleep_us(s->delay_us);
    pthread_mutex_lock(&s->mu);
    if (s->n < TU_MAX_SEEN) {
        s->first_value[s->n] = v;
        s->device[s->n] = hcb_record_device(rec);
    }
    s->n++;
    pthread_mutex_unlock(&s->mu);
    if (s->fail_on >= 0 && v == s->fail_on)
        return hcb_error_set(err, HCB_ECALLBACK, "sink refused value %d", v);
    return 0;
}

static inline tu_sink *
tu_sink_new(void)
{
    tu_sink *s = calloc(1, sizeof *s);

    pthread_mutex_init(&s->mu, NULL);
    s->fail_on = -1;
    return s;
}

static inline void
tu_sink_free(tu_sink *s)
{
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* Registers `s` with `rt` as tap target "sink"; returns its id. */
static inline uint64_t
tu_register_sink(hcb_runtime *rt, tu_sink *s)
{
    hcb_tap_target t = HCB_TAP_TARGET_INIT;
    uint64_t id = 0;

    t.fn = tu_sink_fn;
    t.user = s;
    t.name = "sink";
    t.name_len = 4;
    assert_int_equal(hcb_runtime_register_tap(rt, &t, &id, NULL), HCB_OK);
    assert_true(id != 0);
    return id;
}

static inline size_t
tu_sink_count(tu_sink *s)
{
    size_t n;

    pthread_mutex_lock(&s->mu);
    n = s->n;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* A record of one int32[count] array filled with `value`. */
static inline hcb_record *
tu_record(uint64_t id, hcb_device dev, int32_t value, size_t count)
{
    int32_t *data = malloc(count * sizeof *data);
    int64_t dims[1] = {(int64_t)count};
    hcb_array a = {HCB_S32, 1, dims, data, count * sizeof *data};
    hcb_record *rec = NULL;
    size_t i;

    for (i = 0; i < count; i++)
        data[i] = value;
    assert_int_equal(hcb_record_create(id, dev, &a, 1, &rec, NULL), HCB_OK);
    free(data);
    return rec;
}

/* A runtime whose queues hold `bound` bytes. */
static inline hcb_runtime *
tu_new_runtime(size_t bound)
{
    hcb_runtime_options o = HCB_RUNTIME_OPTIONS_INIT;
    hcb_runtime *rt = NULL;

    o.max_queue_bytes = bound;
    assert_int_equal(hcb_runtime_create(&o, &rt, NULL), HCB_OK);
    return rt;
}

/* ---- a tap target that holds the records of one value until released ---
 * It counts what it saw in atomics only (fork-safe: no lock). */

typedef struct tu_gate {
    int32_t hold;        /* the value to hold, -1: none */
    atomic_int holding;  /* a tap function holds `hold` now */
    atomic_int release;  /* let it go */
    atomic_int seen[16]; /* per value < 16: how often delivered */
    atomic_int total;
} tu_gate;

static inline int
tu_gate_fn(void *user, hcb_record *rec, hcb_error *err)
{
    tu_gate *g = user;
    int32_t v;

    (void)err;
    memcpy(&v, hcb_record_args(rec)[0].data, sizeof v);
    if (v == g->hold) {
        atomic_store(&g->holding, 1);
        while (!atomic_load(&g->release))
            tu_sleep_us(1000);
        atomic_store(&g->holding, 0);
    }
    if (v >= 0 && v < 16)
        atomic_fetch_add(&g->seen[v], 1);
    atomic_fetch_add(&g->total, 1);
    return 0;
}

/* Registers a gate (named "gate") that holds the records of value `hold`. */
static inline uint64_t
tu_register_gate(hcb_runtime *rt, tu_gate *g, int32_t hold)
{
    hcb_tap_target t = HCB_TAP_TARGET_INIT;
    uint64_t id = 0;

    memset(g, 0, sizeof *g);
    g->hold = hold;
    t.fn = tu_gate_fn;
    t.user = g;
    t.name = "gate";
    t.name_len = 4;
    assert_int_equal(hcb_runtime_register_tap(rt, &t, &id, NULL), HCB_OK);
    return id;
}

/* Waits (5 s at most) until the gate holds a record. */
static inline void
tu_wait_holding(tu_gate *g)
{
    int i;

    for (i = 0; i < 5000 && !atomic_load(&g->holding); i++)
        tu_sleep_us(1000);
    assert_true(atomic_load(&g->holding));
}

/* ---- a failing call target and a log sink ------------------------------ */

/* A call target that fails, saying "fail_fn said no". */
static inline int
tu_fail_fn(void *user, hcb_device device, const hcb_array *args, size_t nargs,
           const hcb_array *results, size_t nresults, hcb_error *err)
{
    (void)user, (void)device, (void)args, (void)nargs, (void)results;
    (void)nresults;
    return hcb_error_set(err, HCB_ECALLBACK, "fail_fn said no");
}

/* What a runtime's log sink (tu_note_warning) saw: how many warnings, and
 * the first. */
typedef struct tu_warned {
    atomic_int count;
    char message[HCB_ERROR_MESSAGE_SIZE];
} tu_warned;

static inline void
tu_note_warning(void *user, const char *message)
{
    tu_warned *w = user;

    if (atomic_load(&w->count) == 0)
        snprintf(w->message, sizeof w->message, "%s", message);
    atomic_fetch_add(&w->count, 1);
}

#endif
