/* test_record.c - one allocation, one copy, validation, refcounts, OOM. */
#include "testutil.h"

#include "runtime/record.h"

static void
test_copies_arrays_aligned(void **state)
{
    float a[3] = {1, 2, 3};
    uint8_t b[5] = {9, 8, 7, 6, 5};
    int64_t da[1] = {3}, db[2] = {1, 5};
    hcb_array in[2] = {{HCB_F32, 1, da, a, sizeof a},
                       {HCB_U8, 2, db, b, sizeof b}};
    hcb_record *rec = NULL;
    const hcb_array *out;

    (void)state;
    assert_int_equal(hcb_record_create(42, HCB_DEVICE(0, 3), in, 2, &rec, NULL),
                     HCB_OK);
    assert_int_equal(hcb_record_callback_id(rec), 42);
    assert_int_equal(HCB_DEVICE_ORDINAL(hcb_record_device(rec)), 3);
    assert_int_equal(hcb_record_nargs(rec), 2);
    out = hcb_record_args(rec);
    assert_ptr_not_equal(out[0].data, a); /* a copy */
    a[0] = 100;                           /* the producer's buffer moves on */
    assert_memory_equal(out[1].data, b, sizeof b);
    assert_true(((float *)out[0].data)[0] == 1.0f);
    assert_int_equal(out[1].dims[1], 5);
    assert_int_equal((uintptr_t)out[0].data % HCB__PAYLOAD_ALIGN, 0);
    assert_int_equal((uintptr_t)out[1].data % HCB__PAYLOAD_ALIGN, 0);
    assert_true(hcb_record_size(rec) >= sizeof a + sizeof b);
    hcb_record_release(rec);
}

/* Sub-byte types are packed in records as in XLA's buffers. */
static void
test_packed_sub_byte_arrays(void **state)
{
    uint8_t s4[3] = {0x21, 0x43, 0x05}; /* int4 [1 2 3 4 5] */
    uint8_t u2[1] = {0x1b};             /* uint2 [3 2 1] */
    float f = 2.5f;
    int64_t d5[1] = {5}, d3[1] = {3};
    hcb_array in[3] = {{HCB_S4, 1, d5, s4, 3},
                       {HCB_U2, 1, d3, u2, 1},
                       {HCB_F32, 0, NULL, &f, 4}};
    hcb_array bad = {HCB_S4, 1, d5, s4, 5};
    hcb_record *rec = NULL;
    const hcb_array *out;
    hcb_error err;

    (void)state;
    assert_int_equal(hcb_record_create(1, 0, in, 3, &rec, &err), HCB_OK);
    out = hcb_record_args(rec);
    assert_int_equal(out[0].nbytes, 3);
    assert_memory_equal(out[0].data, s4, 3);
    assert_int_equal(out[1].nbytes, 1);
    assert_memory_equal(out[1].data, u2, 1);
    assert_true(*(const float *)out[2].data == 2.5f);
    hcb_record_release(rec);
    /* one byte per element is not the layout */
    assert_int_equal(hcb_record_create(1, 0, &bad, 1, &rec, &err), HCB_EINVAL);
    assert_string_equal(err.message,
                        "argument 0 claims 5 bytes, its shape holds 3");
}

static void
test_zero_args_and_zero_size(void **state)
{
    int64_t dims[2] = {0, 4};
    hcb_array empty = {HCB_F32, 2, dims, NULL, 0};
    hcb_record *rec = NULL;

    (void)state;
    assert_int_equal(hcb_record_create(1, 0, NULL, 0, &rec, NULL), HCB_OK);
    assert_int_equal(hcb_record_nargs(rec), 0);
    hcb_record_release(rec);
    assert_int_equal(hcb_record_create(1, 0, &empty, 1, &rec, NULL), HCB_OK);
    assert_int_equal(hcb_record_args(rec)[0].nbytes, 0);
    assert_int_equal(hcb_record_args(rec)[0].dims[0], 0);
    hcb_record_release(rec);
}

static void
test_rejects_malformed_views(void **state)
{
    int32_t x[4] = {0};
    int64_t dims[1] = {4}, neg[1] = {-1};
    hcb_array bad_bytes = {HCB_S32, 1, dims, x, 15};
    hcb_array bad_type = {HCB_TOKEN, 0, NULL, x, 0};
    hcb_array bad_dim = {HCB_S32, 1, neg, x, 0};
    hcb_array no_data = {HCB_S32, 1, dims, NULL, 16};
    hcb_record *rec = (hcb_record *)1;
    hcb_error err;

    (void)state;
    assert_int_equal(hcb_record_create(1, 0, &bad_bytes, 1, &rec, &err),
                     HCB_EINVAL);
    assert_null(rec);
    assert_string_equal(err.message,
                        "argument 0 claims 15 bytes, its shape holds 16");
    assert_int_equal(hcb_record_create(1, 0, &bad_type, 1, &rec, &err),
                     HCB_EINVAL);
    assert_non_null(strstr(err.message, "unsupported type token"));
    assert_int_equal(hcb_record_create(1, 0, &bad_dim, 1, &rec, &err),
                     HCB_EINVAL);
    assert_int_equal(hcb_record_create(1, 0, &no_data, 1, &rec, &err),
                     HCB_EINVAL);
    assert_int_equal(hcb_record_create(1, 0, NULL, 2, &rec, &err), HCB_EINVAL);
}

static void
test_refcount(void **state)
{
    hcb_record *rec;
    long before;

    (void)state;
    tu_install_allocator();
    before = atomic_load(&tu_live_allocs);
    /* 16 KiB: too large for an arena, too small for the kept large
     * blocks, so the record's memory goes back to the hook at once */
    rec = tu_record(1, 0, 5, 4096);
    hcb_record_retain(rec);
    hcb_record_release(rec);
    assert_int_equal(atomic_load(&tu_live_allocs), before + 1);
    hcb_record_release(rec);
    assert_int_equal(atomic_load(&tu_live_allocs), before);
    hcb_record_release(NULL);
    hcb_set_allocator(NULL);
}

static void *
small_record_on_new_thread(void *arg)
{
    int32_t x[4] = {1, 2, 3, 4};
    int64_t dims[1] = {4};
    hcb_array a = {HCB_S32, 1, dims, x, sizeof x};
    hcb_record *rec = NULL;
    int *rc = arg;

    *rc = hcb_record_create(1, 0, &a, 1, &rec, NULL);
    if (*rc == HCB_OK && memcmp(hcb_record_args(rec)[0].data, x, sizeof x) != 0)
        *rc = HCB_EINTERNAL;
    hcb_record_release(rec);
    return NULL;
}

/* The record pools take their blocks from the hook too: every size fails
 * cleanly when the hook fails, and a thread whose first arena cannot be had
 * falls back to a record of its own. */
static void
test_out_of_memory(void **state)
{
    static char data[2 << 20];
    int64_t dims[1] = {0};
    hcb_array a = {HCB_U8, 1, dims, data, 0};
    size_t sizes[] = {16 << 10, 2 << 20}, i;
    hcb_record *rec = NULL;
    hcb_error err;
    pthread_t t;
    int rc = HCB_EINTERNAL;

    (void)state;
    tu_install_allocator(); /* gives the kept blocks back */
    for (i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        dims[0] = (int64_t)sizes[i];
        a.nbytes = sizes[i];
        tu_fail_alloc_after(0);
        assert_int_equal(hcb_record_create(1, 0, &a, 1, &rec, &err),
                         HCB_ENOMEM);
        assert_null(rec);
        assert_non_null(strstr(err.message, "cannot allocate"));
        assert_int_equal(hcb_record_create(1, 0, &a, 1, &rec, &err), HCB_OK);
        hcb_record_release(rec);
        rec = NULL;
    }
    tu_fail_alloc_after(0); /* the new thread's arena */
    assert_int_equal(pthread_create(&t, NULL, small_record_on_new_thread, &rc),
                     0);
    pthread_join(t, NULL);
    assert_int_equal(rc, HCB_OK);
    hcb_set_allocator(NULL);
}

/* A record made on one thread and freed on another: its memory must come
 * back for a later record (record.c's arenas and large-block cache).
 * Plain malloc would not give it back under ASan (quarantine). */
typedef struct handoff {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    hcb_record *rec; /* to release; NULL once released */
    bool stop;
} handoff;

static void *
releaser(void *arg)
{
    handoff *h = arg;

    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (h->rec == NULL && !h->stop)
            pthread_cond_wait(&h->cv, &h->mu);
        if (h->rec == NULL)
            break;
        hcb_record_release(h->rec);
        h->rec = NULL;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* Makes `count` records of `nbytes` each, each released by the other
 * thread before the next is made; true if a later one got (part of) the
 * first one's memory. */
static bool
reused_across_threads(size_t nbytes, int count)
{
    static char data[4 << 20];
    int64_t dims[1] = {(int64_t)nbytes};
    hcb_array a = {HCB_U8, 1, dims, data, nbytes};
    handoff h = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL,
                 false};
    uintptr_t first = 0;
    size_t first_size = 0;
    bool reused = false;
    pthread_t t;
    int i;

    assert_int_equal(pthread_create(&t, NULL, releaser, &h), 0);
    for (i = 0; i < count; i++) {
        hcb_record *rec;
        uintptr_t at;

        assert_int_equal(hcb_record_create(1, 0, &a, 1, &rec, NULL), HCB_OK);
        at = (uintptr_t)rec;
        if (first == 0) {
            first = at;
            first_size = hcb_record_size(rec);
        } else if (at < first + first_size && first < at + hcb_record_size(rec))
            reused = true; /* overlaps: first's memory came back */
        pthread_mutex_lock(&h.mu);
        h.rec = rec;
        pthread_cond_broadcast(&h.cv);
        while (h.rec != NULL)
            pthread_cond_wait(&h.cv, &h.mu);
        pthread_mutex_unlock(&h.mu);
    }
    pthread_mutex_lock(&h.mu);
    h.stop = true;
    pthread_cond_broadcast(&h.cv);
    pthread_mutex_unlock(&h.mu);
    pthread_join(t, NULL);
    return reused;
}

static void
test_memory_comes_back_across_threads(void **state)
{
    (void)state;
    /* small: carved from an arena, which comes back once all its records
     * are released (well within 4000 records of 16 bytes) */
    assert_true(reused_across_threads(16, 4000));
    /* large: the same cached block each time */
    assert_true(reused_across_threads(2 << 20, 3));
}

/* A small record that is kept keeps its memory while thousands of records
 * after it come and go (its arena must not be reused under it). */
static void
test_kept_record_survives(void **state)
{
    uint32_t v[4] = {0xdeadbeef, 1, 2, 3};
    int64_t dims[1] = {4};
    hcb_array a = {HCB_U32, 1, dims, v, sizeof v};
    hcb_record *kept = NULL;
    int i;

    (void)state;
    assert_int_equal(hcb_record_create(7, 0, &a, 1, &kept, NULL), HCB_OK);
    for (i = 0; i < 20000; i++) {
        hcb_record *rec;

        v[0] = (uint32_t)i;
        assert_int_equal(hcb_record_create(8, 0, &a, 1, &rec, NULL), HCB_OK);
        assert_int_equal(((uint32_t *)hcb_record_args(rec)[0].data)[0], i);
        hcb_record_release(rec);
    }
    assert_int_equal(hcb_record_callback_id(kept), 7);
    assert_int_equal(((uint32_t *)hcb_record_args(kept)[0].data)[0],
                     0xdeadbeef);
    assert_int_equal(((uint32_t *)hcb_record_args(kept)[0].data)[3], 3);
    hcb_record_release(kept);
}

/* Records outlive the thread that made them (an XLA thread may exit while
 * its taps are queued). */
static void *
make_records(void *arg)
{
    hcb_record **recs = arg;
    int64_t dims[1] = {1};
    int i;

    for (i = 0; i < 3; i++) {
        int32_t x = 100 + i;
        hcb_array a = {HCB_S32, 1, dims, &x, sizeof x};

        if (hcb_record_create(1, 0, &a, 1, &recs[i], NULL) != HCB_OK)
            recs[i] = NULL;
    }
    return NULL;
}

static void
test_records_outlive_their_thread(void **state)
{
    hcb_record *recs[3] = {NULL, NULL, NULL};
    pthread_t t;
    int i;

    (void)state;
    assert_int_equal(pthread_create(&t, NULL, make_records, recs), 0);
    pthread_join(t, NULL);
    for (i = 0; i < 3; i++) {
        assert_non_null(recs[i]);
        assert_int_equal(((int32_t *)hcb_record_args(recs[i])[0].data)[0],
                         100 + i);
        hcb_record_release(recs[i]);
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copies_arrays_aligned),
        cmocka_unit_test(test_packed_sub_byte_arrays),
        cmocka_unit_test(test_zero_args_and_zero_size),
        cmocka_unit_test(test_rejects_malformed_views),
        cmocka_unit_test(test_refcount),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_memory_comes_back_across_threads),
        cmocka_unit_test(test_kept_record_survives),
        cmocka_unit_test(test_records_outlive_their_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
