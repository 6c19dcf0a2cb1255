/*
 * histogram.c - libhcb from a C program, with no Python and no JAX.
 *
 * Two "devices" (producer threads standing in for accelerators) stream
 * samples to the host through the runtime: each sample batch is copied into
 * a record and queued for its device, and a native tap function builds a
 * histogram per device on that device's consumer thread.  The queues are
 * bounded at 64 KiB, so the producers wait when the host falls behind
 * (back-pressure) and nothing is dropped.  Then a native call function
 * reads the histogram synchronously, and a bad batch shows how a failing
 * tap is reported.
 *
 * Build with pkg-config (from the installed Python package):
 *
 *   export PKG_CONFIG_PATH="$(python -m host_callback --pkgconfigdir)"
 *   cc -std=c11 -O2 histogram.c $(pkg-config --cflags --libs hcb) -lpthread
 *   ./a.out
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "hcb/hcb.h"

#define DEVICES 2
#define BATCHES 400
#define BATCH   256
#define BINS    8

/* The host-side state, one histogram per device: each device's taps run
 * on that device's consumer thread only, so no lock is needed. */
typedef struct histograms {
    uint64_t counts[DEVICES][BINS];
} histograms;

/* The native tap: bins the int32 samples of one record. */
static int
bin_samples(void *user, hcb_record *rec, hcb_error *err)
{
    histograms *h = user;
    const hcb_array *a = hcb_record_args(rec);
    int32_t dev = HCB_DEVICE_ORDINAL(hcb_record_device(rec));
    const int32_t *x;
    size_t i, n;

    if (hcb_record_nargs(rec) != 1 || a[0].dtype != HCB_S32)
        return hcb_error_set(err, HCB_EINVAL,
                             "bin_samples: expected one int32 array, got %zu "
                             "array(s) of %s",
                             hcb_record_nargs(rec),
                             hcb_dtype_name(hcb_record_nargs(rec) > 0
                                                ? a[0].dtype
                                                : HCB_INVALID));
    x = a[0].data;
    n = a[0].nbytes / sizeof *x;
    for (i = 0; i < n; i++)
        h->counts[dev][(uint32_t)x[i] % BINS]++;
    return HCB_OK;
}

/* The native call: results[0] (uint64[BINS]) = the device's histogram. */
static int
read_histogram(void *user, hcb_device device, const hcb_array *args,
               size_t nargs, const hcb_array *results, size_t nresults,
               hcb_error *err)
{
    histograms *h = user;

    (void)args;
    if (nargs != 0 || nresults != 1 || results[0].dtype != HCB_U64 ||
        results[0].nbytes != sizeof h->counts[0])
        return hcb_error_set(err, HCB_EINVAL,
                             "read_histogram: expected one uint64[%d] result",
                             BINS);
    memcpy(results[0].data, h->counts[HCB_DEVICE_ORDINAL(device)],
           sizeof h->counts[0]);
    return HCB_OK;
}

typedef struct producer {
    hcb_runtime *rt;
    uint64_t tap_id;
    int32_t ordinal;
    int failed;
} producer;

/* A device: BATCHES batches of BATCH samples 0, 1, 2, ... */
static void *
produce(void *arg)
{
    producer *p = arg;
    int32_t samples[BATCH];
    int64_t dims[1] = {BATCH};
    hcb_array a = {HCB_S32, 1, dims, samples, sizeof samples};
    hcb_record *rec;
    hcb_error err;
    int b, i;

    for (b = 0; b < BATCHES; b++) {
        for (i = 0; i < BATCH; i++)
            samples[i] = b * BATCH + i;
        if (hcb_record_create(p->tap_id,
                              HCB_DEVICE(HCB_PLATFORM_CPU, p->ordinal), &a, 1,
                              &rec, &err) != HCB_OK ||
            hcb_runtime_submit(p->rt, rec, &err) != HCB_OK) {
            fprintf(stderr, "device %d: %s\n", (int)p->ordinal, err.message);
            p->failed = 1;
            return NULL;
        }
    }
    return NULL;
}

static int
fail(const hcb_error *err)
{
    fprintf(stderr, "error: %s (%s)\n", err->message, hcb_strerror(err->code));
    return 1;
}

int
main(void)
{
    static histograms hist;
    hcb_runtime_options options = HCB_RUNTIME_OPTIONS_INIT;
    hcb_tap_target tap = HCB_TAP_TARGET_INIT;
    hcb_call_target call = HCB_CALL_TARGET_INIT;
    hcb_stats stats = HCB_STATS_INIT;
    producer devices[DEVICES];
    pthread_t threads[DEVICES];
    hcb_runtime *rt;
    hcb_record *bad;
    hcb_error err;
    uint64_t tap_id, call_id, counts[BINS], total = 0;
    int64_t bins_dims[1] = {BINS};
    hcb_array result = {HCB_U64, 1, bins_dims, counts, sizeof counts};
    float not_ints[2] = {1.0f, 2.0f};
    int64_t two[1] = {2};
    hcb_array wrong = {HCB_F32, 1, two, not_ints, sizeof not_ints};
    int d, b;

    printf("libhcb %s\n", hcb_version_string());
    if (hcb_version() != HCB_VERSION_NUMBER) {
        fprintf(stderr, "header %d, library %d\n", HCB_VERSION_NUMBER,
                hcb_version());
        return 1;
    }
    options.max_queue_bytes = 64 * 1024;
    if (hcb_runtime_create(&options, &rt, &err) != HCB_OK)
        return fail(&err);
    tap.fn = bin_samples;
    tap.user = &hist;
    tap.name = "bin_samples";
    tap.name_len = strlen(tap.name);
    call.fn = read_histogram;
    call.user = &hist;
    call.name = "read_histogram";
    call.name_len = strlen(call.name);
    if (hcb_runtime_register_tap(rt, &tap, &tap_id, &err) != HCB_OK ||
        hcb_runtime_register_call(rt, &call, &call_id, &err) != HCB_OK)
        return fail(&err);

    for (d = 0; d < DEVICES; d++) {
        devices[d] = (producer){rt, tap_id, d, 0};
        if (pthread_create(&threads[d], NULL, produce, &devices[d]) != 0) {
            fprintf(stderr, "cannot start a producer thread\n");
            return 1;
        }
    }
    for (d = 0; d < DEVICES; d++) {
        pthread_join(threads[d], NULL);
        if (devices[d].failed)
            return 1;
    }
    if (hcb_runtime_barrier(rt, HCB_ALL_DEVICES, &err) != HCB_OK)
        return fail(&err);

    for (d = 0; d < DEVICES; d++) {
        /* A synchronous call, as XLA's thread would make it. */
        if (hcb_runtime_call(rt, call_id, HCB_DEVICE(HCB_PLATFORM_CPU, d), NULL,
                             0, &result, 1, &err) != HCB_OK)
            return fail(&err);
        printf("device %d:", d);
        for (b = 0; b < BINS; b++) {
            printf(" %llu", (unsigned long long)counts[b]);
            total += counts[b];
        }
        printf("\n");
    }
    if (hcb_runtime_stats(rt, HCB_ALL_DEVICES, &stats, &err) != HCB_OK)
        return fail(&err);
    printf("records %llu in, %llu out; %llu samples binned; queue high "
           "water %llu bytes (bound %zu); producers waited %llu times\n",
           (unsigned long long)stats.records_in,
           (unsigned long long)stats.records_out, (unsigned long long)total,
           (unsigned long long)stats.high_water_bytes, options.max_queue_bytes,
           (unsigned long long)stats.producer_waits);

    /* A bad batch: the tap fails, the runtime records it and goes on. */
    if (hcb_record_create(tap_id, HCB_DEVICE(HCB_PLATFORM_CPU, 0), &wrong, 1,
                          &bad, &err) != HCB_OK ||
        hcb_runtime_submit(rt, bad, &err) != HCB_OK ||
        hcb_runtime_barrier(rt, HCB_ALL_DEVICES, &err) != HCB_OK)
        return fail(&err);
    if (hcb_runtime_take_error(rt, &err) == 1)
        printf("recorded error: %s\n", err.message);

    hcb_runtime_destroy(rt);
    return total == (uint64_t)DEVICES * BATCHES * BATCH ? 0 : 1;
}
