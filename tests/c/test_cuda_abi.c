/* test_cuda_abi.c - the CUDA runtime as src/ffi/cuda.h spells it, checked
 * against the CUDA toolkit's own header (built where a toolkit is found),
 * and the real libcudart loaded through hcb_cuda_load. */
#include "testutil.h"

#include <cuda_runtime_api.h>

#include "ffi/cuda.h"
#include "hcb/ffi.h"

/* cuda.h declares no CUDA type: each is an int or a pointer of the same
 * size, and the constants are CUDA's. */
_Static_assert(sizeof(cudaError_t) == sizeof(int), "cudaError_t is an int");
_Static_assert(sizeof(enum cudaMemcpyKind) == sizeof(int), "an int");
_Static_assert(sizeof(cudaStream_t) == sizeof(void *), "a pointer");
_Static_assert(cudaSuccess == 0, "0 is success");
_Static_assert((int)cudaMemcpyHostToDevice == HCB__CUDA_H2D, "H2D");
_Static_assert((int)cudaMemcpyDeviceToHost == HCB__CUDA_D2H, "D2H");
_Static_assert((int)cudaMemcpyDeviceToDevice == HCB__CUDA_D2D, "D2D");
_Static_assert(cudaHostAllocPortable == HCB__CUDA_HOST_ALLOC_PORTABLE,
               "portable");
_Static_assert(cudaEventDisableTiming == HCB__CUDA_EVENT_DISABLE_TIMING,
               "an event without timing");
_Static_assert(cudaEventBlockingSync == HCB__CUDA_EVENT_BLOCKING_SYNC,
               "an event its waiter sleeps on");
_Static_assert(sizeof(cudaEvent_t) == sizeof(void *), "a pointer");

/* The functions cuda.c binds have these prototypes in the toolkit (the
 * initialisations fail to compile if one differs). */
static cudaError_t (*const memcpy_async)(void *, const void *, size_t,
                                         enum cudaMemcpyKind,
                                         cudaStream_t) = cudaMemcpyAsync;
static cudaError_t (*const memset_async)(void *, int, size_t,
                                         cudaStream_t) = cudaMemsetAsync;
static cudaError_t (*const stream_synchronize)(cudaStream_t) =
    cudaStreamSynchronize;
static cudaError_t (*const host_alloc)(void **, size_t,
                                       unsigned) = cudaHostAlloc;
static cudaError_t (*const free_host)(void *) = cudaFreeHost;
static const char *(*const error_string)(cudaError_t) = cudaGetErrorString;
static cudaError_t (*const event_create)(cudaEvent_t *,
                                         unsigned) = cudaEventCreateWithFlags;
static cudaError_t (*const event_record)(cudaEvent_t,
                                         cudaStream_t) = cudaEventRecord;
static cudaError_t (*const stream_wait_event)(cudaStream_t, cudaEvent_t,
                                              unsigned) = cudaStreamWaitEvent;
static cudaError_t (*const event_destroy)(cudaEvent_t) = cudaEventDestroy;
static cudaError_t (*const event_synchronize)(cudaEvent_t) =
    cudaEventSynchronize;
static cudaError_t (*const event_query)(cudaEvent_t) = cudaEventQuery;
static cudaError_t (*const get_device)(int *) = cudaGetDevice;
static cudaError_t (*const set_device)(int) = cudaSetDevice;

static void
test_toolkit_prototypes_match(void **state)
{
    (void)state;
    assert_non_null(memcpy_async);
    assert_non_null(memset_async);
    assert_non_null(stream_synchronize);
    assert_non_null(host_alloc);
    assert_non_null(free_host);
    assert_non_null(error_string);
    assert_non_null(event_create);
    assert_non_null(event_record);
    assert_non_null(stream_wait_event);
    assert_non_null(event_destroy);
    assert_non_null(event_synchronize);
    assert_non_null(event_query);
    assert_int_equal(cudaErrorNotReady, 600);
    assert_non_null(get_device);
    assert_non_null(set_device);
    /* the DLPack stream numbers 1 and 2 are these handles, which
     * hcb_cuda_stream_wait passes to CUDA as they are */
    assert_int_equal((uintptr_t)cudaStreamLegacy, 1);
    assert_int_equal((uintptr_t)cudaStreamPerThread, 2);
}

/* hcb_cuda_load finds the real runtime, and its errors come back with
 * CUDA's own message (on a machine without a GPU, pinning fails). */
static void
test_the_real_runtime_loads(void **state)
{
    const hcb__cuda *api;
    hcb_error err;
    void *p = NULL;
    int status;

    (void)state;
    assert_int_equal(hcb_cuda_load(NULL, &err), HCB_OK);
    api = hcb__cuda_get(&err);
    assert_non_null(api);
    status = api->host_alloc(&p, 4096, HCB__CUDA_HOST_ALLOC_PORTABLE);
    if (status == 0) {
        assert_int_equal(api->free_host(p), 0);
        return;
    }
    assert_int_equal(hcb__cuda_fail(api, status, "pinning", &err), HCB_ESYSTEM);
    assert_non_null(strstr(err.message, cudaGetErrorString(status)));
    assert_non_null(strstr(err.message, "pinning: "));
    print_message("without a GPU: %s\n", err.message);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_toolkit_prototypes_match),
        cmocka_unit_test(test_the_real_runtime_loads),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
