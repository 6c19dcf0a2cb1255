/*
 * bench_native_gpu.cu - the native call of `make bench-gpu` (bench/hcb_bench/
 * gpu.py), built with nvcc against the installed package on a GPU machine.
 *
 *   hcb_bench_gpu_copy_call  an hcb_call_fn that copies args[0] into
 *                            results[0] on a GPU: XLA's device buffers,
 *                            copied on XLA's stream (hcb_call_stream()), as
 *                            a native call on a GPU must (include/hcb/hcb.h).
 *                            The GPU twin of bench_native.c's
 *                            hcb_bench_copy_call.
 */
#include <cuda_runtime.h>

#include "hcb/ffi.h"
#include "hcb/hcb.h"

extern "C" __attribute__((visibility("default"))) int
hcb_bench_gpu_copy_call(void *user, hcb_device device, const hcb_array *args,
                        size_t nargs, const hcb_array *results,
                        size_t nresults, hcb_error *err)
{
    cudaStream_t stream = (cudaStream_t)hcb_call_stream();
    cudaError_t e;

    (void)user;
    if (HCB_DEVICE_PLATFORM(device) != HCB_PLATFORM_CUDA || stream == NULL)
        return hcb_error_set(err, HCB_EINVAL,
                             "hcb_bench_gpu_copy_call: not on a CUDA device "
                             "with a stream");
    if (nargs != 1 || nresults != 1 || args[0].nbytes != results[0].nbytes)
        return hcb_error_set(err, HCB_EINVAL,
                             "hcb_bench_gpu_copy_call: expected one argument "
                             "and one result of the same size");
    if (args[0].nbytes == 0)
        return 0;
    e = cudaMemcpyAsync(results[0].data, args[0].data, args[0].nbytes,
                        cudaMemcpyDeviceToDevice, stream);
    if (e != cudaSuccess)
        return hcb_error_set(err, HCB_EINVAL,
                             "hcb_bench_gpu_copy_call: cudaMemcpyAsync: %s",
                             cudaGetErrorString(e));
    return 0;
}
