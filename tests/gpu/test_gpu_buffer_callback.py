"""buffer_callback on a GPU: Buffers over XLA's device memory
(__cuda_array_interface__, DLPack with kDLCUDA), XLA's stream in the
context, CuPy writing results in place on it, the refusals of host access,
errors as on the CPU, a native CUDA callback, and the CuPy example.  Where
JAX's own buffer_callback answers the same question, the test asks both."""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.experimental import buffer_callback as jax_buffer_callback

import host_callback as hcb

from gpu_support import PLATFORM
from gpu_support import REPO
from gpu_support import build_shared
from gpu_support import needs_real_gpu

F32_4 = jax.ShapeDtypeStruct((4,), np.float32)


@pytest.fixture
def cupy():
  needs_real_gpu()
  return pytest.importorskip("cupy")


def saxpy_callback(cupy):
  """out = a * x + y, by CuPy, on XLA's stream."""

  def saxpy(ctx, out, a, x, y):
    with cupy.cuda.ExternalStream(ctx.stream):
      result = cupy.asarray(out)
      cupy.multiply(cupy.asarray(a), cupy.asarray(x), out=result)
      result += cupy.asarray(y)

  return saxpy


def test_cupy_writes_in_place_on_xla_stream_as_with_jax(gpu, cupy):
  def program(buffer_callback):
    call = buffer_callback(saxpy_callback(cupy),
                           jax.ShapeDtypeStruct((1 << 16,), jnp.float32))
    # XLA computes the operands and consumes the result on its stream.
    return jax.jit(lambda a, x, y: jnp.sqrt(call(a, 2 * x, y)))

  x = jax.device_put(jnp.arange(1 << 16, dtype=jnp.float32), gpu)
  y = jnp.ones_like(x)
  want = np.sqrt(4 * np.arange(1 << 16) + 1)
  ours = program(hcb.buffer_callback)(jnp.float32(2), x, y)
  theirs = program(jax_buffer_callback.buffer_callback)(jnp.float32(2), x, y)
  np.testing.assert_allclose(ours, want, rtol=1e-6)
  np.testing.assert_array_equal(ours, theirs)


def test_a_scan_of_cupy_callbacks_is_ordered_on_the_stream(gpu, cupy):
  def add_one(ctx, out, c):
    with cupy.cuda.ExternalStream(ctx.stream):
      cupy.add(cupy.asarray(c), 1, out=cupy.asarray(out))

  step = lambda c, _: (hcb.buffer_callback(add_one, F32_4)(c * 2), None)
  out = jax.jit(lambda c: lax.scan(step, c, None, length=10)[0])(
      jax.device_put(jnp.zeros(4, jnp.float32), gpu))
  np.testing.assert_array_equal(out, [1023.0] * 4)  # c -> 2c + 1, 10 times


def test_buffers_and_context_on_the_gpu(gpu, cupy):
  seen = {}

  def cb(ctx, out, x):
    seen["stream"] = ctx.stream
    seen["device"], seen["stage"] = ctx.device, ctx.stage
    seen["cai"] = (out.__cuda_array_interface__, x.__cuda_array_interface__)
    seen["dlpack_device"] = out.__dlpack_device__()
    seen["repr"] = repr(x)
    for host_use, error in ((np.asarray, TypeError),
                            (memoryview, BufferError)):
      with pytest.raises(error, match="in GPU memory"):
        host_use(out)
    with pytest.raises(BufferError, match="0 is not a CUDA stream"):
      out.__dlpack__(stream=0)  # ambiguous under DLPack
    with cupy.cuda.ExternalStream(ctx.stream):
      result = cupy.from_dlpack(out)  # passes XLA's stream: accepted
      seen["views"] = (result.data.ptr, cupy.asarray(x).data.ptr)
      result[...] = cupy.asarray(x) * 3

  # The result aliases the operand: one buffer, written in place.
  f = jax.jit(hcb.buffer_callback(cb, F32_4, input_output_aliases={0: 0}))
  out = f(jax.device_put(jnp.arange(4, dtype=jnp.float32), gpu))
  np.testing.assert_array_equal(out, [0.0, 3.0, 6.0, 9.0])
  assert isinstance(seen["stream"], int) and seen["stream"] != 0
  assert seen["device"] == gpu
  assert seen["stage"] == hcb.ExecutionStage.EXECUTE
  out_cai, x_cai = seen["cai"]
  assert out_cai["version"] == 3 and out_cai["typestr"] == "<f4"
  assert out_cai["shape"] == (4,) and out_cai["strides"] is None
  assert out_cai["data"][1] is False and x_cai["data"][1] is True
  assert out_cai["stream"] == seen["stream"]  # XLA's, for the consumer
  assert out_cai["data"][0] == x_cai["data"][0]  # aliased: one buffer
  assert seen["views"] == (out_cai["data"][0],) * 2  # no copies
  assert seen["dlpack_device"] == (2, gpu.local_hardware_id)
  assert f"device=cuda:{gpu.local_hardware_id}" in seen["repr"]


def test_buffers_and_context_have_what_jax_s_have_on_the_device(gpu):
  # Every attribute of JAX's Buffer and ExecutionContext, read in the same
  # program on the device under test, gives what JAX's gives (the CUDA
  # Array Interface: JAX's keys, ours adding "strides" and "stream").
  def run(buffer_callback):
    seen = {}

    def cb(ctx, out, x):
      for name, b in (("out", out), ("x", x)):
        seen[name] = (b.shape, np.dtype(b.dtype), b.ndim, b.writeable,
                      b.__dlpack_device__())
        if PLATFORM == "gpu":
          cai = b.__cuda_array_interface__
          seen[name + " cai"] = (set(cai), cai["shape"], cai["typestr"],
                                 cai["data"][1])
      seen["stage"] = ctx.stage.name
      seen["stream"] = isinstance(ctx.stream, int) if PLATFORM == "gpu" else 0

    f = buffer_callback(cb, jax.ShapeDtypeStruct((2, 3), np.float32),
                        input_output_aliases={0: 0})
    jax.jit(f)(jax.device_put(jnp.ones((2, 3), jnp.float32), gpu))
    return seen

  theirs, ours = run(jax_buffer_callback.buffer_callback), run(
      hcb.buffer_callback)
  for key in theirs:
    if key.endswith(" cai"):
      assert theirs[key][0] <= ours[key][0], key
      assert theirs[key][1:] == ours[key][1:], key
    else:
      assert ours[key] == theirs[key], key
  assert ours["x"][3] is False and ours["out"][3] is True


CONSUMERS = ["cupy-dlpack", "cupy-cai", "torch-dlpack", "numba-cai"]


def _library(kind):
  """The library a consumer test uses, or a skip where it is missing."""
  needs_real_gpu()
  if kind.startswith("cupy"):
    return pytest.importorskip("cupy")
  if kind.startswith("torch"):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
      pytest.skip("torch has no CUDA here")
    return torch
  return pytest.importorskip("numba.cuda")


@pytest.mark.parametrize("kind", CONSUMERS)
def test_libraries_on_their_own_default_stream_see_no_race(gpu, kind):
  # The callback uses the library's default stream, not XLA's: its inputs
  # are computed on XLA's stream just before the call (after a busy loop),
  # and XLA reads the result right after it.  The DLPack consumers' stream
  # is ordered after XLA's by __dlpack__(stream=...), and XLA's after
  # theirs when the callback returns; CAI consumers synchronise with the
  # interface's "stream", and XLA's stream waits for the legacy default
  # stream they write on.  Each run has new values: a race shows as last
  # run's numbers.
  lib = _library(kind)
  n = 1 << 22

  def cb(ctx, out, x):
    if kind == "cupy-dlpack":
      lib.add(lib.from_dlpack(x), 1, out=lib.from_dlpack(out))
    elif kind == "cupy-cai":
      lib.add(lib.asarray(x), 1, out=lib.asarray(out))
    elif kind == "torch-dlpack":
      lib.add(lib.from_dlpack(x), 1, out=lib.from_dlpack(out))
    else:  # numba: a copy on its default stream; +1 is done by XLA below
      lib.as_cuda_array(out).copy_to_device(lib.as_cuda_array(x))

  call = hcb.buffer_callback(cb, jax.ShapeDtypeStruct((n,), jnp.float32))
  plus = 0 if kind == "numba-cai" else 1

  @jax.jit
  def f(a, k):
    busy = lax.fori_loop(0, 30, lambda i, c: c @ a, a)  # a is the identity
    x = jnp.arange(n, dtype=jnp.float32) + k + busy[0, 0]
    return (call(x) + (1 - plus)) * 2

  a = jax.device_put(jnp.eye(2048, dtype=jnp.float32), gpu)
  for k in range(5):
    out = f(a, jax.device_put(jnp.float32(100 * k), gpu))
    np.testing.assert_array_equal(
        out, (np.arange(n, dtype=np.float32) + 100 * k + 2) * 2,
        err_msg=f"{kind}, run {k}")


def test_a_stream_the_callback_makes_and_drops_is_never_used_after(gpu,
                                                                   cupy):
  # DLPack leaves the consumer's stream the consumer's: one the callback
  # makes is ordered after XLA's when the callback exports to it, and the
  # callback finishes its work there; CuPy destroys it when the callback
  # drops it, before the callback returns, so XLA's stream must not record
  # an event on it then (a freed handle: CUDA's error, or worse).
  n = 1 << 20

  def cb(ctx, out, x):
    s = cupy.cuda.Stream(non_blocking=True)
    with s:  # from_dlpack passes s.ptr to __dlpack__
      cupy.add(cupy.from_dlpack(x), 1, out=cupy.from_dlpack(out))
    s.synchronize()  # the rule for a stream of the callback's own
    del s  # cudaStreamDestroy

  call = hcb.buffer_callback(cb, jax.ShapeDtypeStruct((n,), jnp.float32))
  f = jax.jit(lambda x: call(x * 2) * 3)
  for k in range(5):
    x = jax.device_put(jnp.full((n,), k, jnp.float32), gpu)
    np.testing.assert_array_equal(f(x), np.full(n, (2 * k + 1) * 3),
                                  err_msg=f"run {k}")


def test_per_thread_stream_from_another_thread_is_refused(gpu):
  # XLA's stream waits for a per-thread default stream (2) on the
  # callback's thread when it returns: another thread's cannot be reached
  # from there, so exporting to it is refused rather than left unordered.
  needs_real_gpu()
  seen = []

  def cb(ctx, out, x):
    def export():
      try:
        out.__dlpack__(stream=2)
        seen.append("exported")
      except BufferError as e:
        seen.append(str(e))

    t = threading.Thread(target=export)
    t.start()
    t.join()
    out.__dlpack__(stream=2)  # on the callback's own thread: ordered

  f = jax.jit(hcb.buffer_callback(cb, F32_4))
  f(jax.device_put(jnp.ones(4), gpu)).block_until_ready()
  assert len(seen) == 1, seen
  assert "from a thread other than the buffer_callback's" in seen[0]


def test_jax_buffers_answer_the_same_protocols(gpu, cupy):
  seen = {}

  def cb(ctx, out, x):
    seen["jax_cai_keys"] = set(out.__cuda_array_interface__)
    seen["stream"] = ctx.stream
    with cupy.cuda.ExternalStream(ctx.stream):
      cupy.asarray(out)[...] = cupy.asarray(x)

  jax.jit(jax_buffer_callback.buffer_callback(cb, F32_4))(
      jax.device_put(jnp.ones(4), gpu))
  assert isinstance(seen["stream"], int) and seen["stream"] != 0
  # JAX's Buffer has no "stream" key either.
  assert "stream" not in seen["jax_cai_keys"]


def test_a_buffer_kept_after_the_callback_raises(gpu, cupy):
  kept = []

  def cb(ctx, out, x):
    kept.append(out)
    with cupy.cuda.ExternalStream(ctx.stream):
      cupy.asarray(out)[...] = 1

  jax.jit(hcb.buffer_callback(cb, F32_4))(jax.device_put(jnp.ones(4), gpu))
  with pytest.raises(RuntimeError, match="buffer_callback that has returned"):
    kept[0].__cuda_array_interface__
  with pytest.raises(RuntimeError, match="buffer_callback that has returned"):
    kept[0].__dlpack__()


def test_sub_byte_types_are_refused_on_gpu(gpu):
  needs_real_gpu()  # the CPU unpacks them
  f = jax.jit(hcb.buffer_callback(lambda ctx, out, x: None, F32_4))
  with pytest.raises(jax.errors.JaxRuntimeError,
                     match="int4 arrays are packed"):
    f(jax.device_put(jnp.zeros(4, ml_dtypes.int4), gpu)).block_until_ready()
  hcb.barrier_wait()  # as every buffer_callback error: the computation's only


def _raises(ctx, out, x):
  raise ValueError("buffer says no")


@pytest.mark.parametrize("callback, message", [
    (_raises, "raised ValueError: buffer says no"),
    (lambda ctx, out, x: 1, "must not return any values"),
])
def test_errors_fail_the_computation_as_on_cpu(gpu, cpu, callback, message):
  # As JAX's buffer_callback: the computation fails, with the same message
  # on both platforms, and that is all (barrier_wait raises nothing).
  def error_on(device):
    f = jax.jit(hcb.buffer_callback(callback, F32_4))
    with pytest.raises(jax.errors.JaxRuntimeError, match=message) as info:
      f(jax.device_put(jnp.ones(4), device)).block_until_ready()
    hcb.barrier_wait()
    return str(info.value)

  def first_line(message):
    # XLA's GPU runtime names the executable after the message; the CPU's
    # does not: that is XLA's, not ours.
    return re.sub(r" \[executable_name='[^']*'\]$", "",
                  message.split("\n")[0])

  message_gpu, message_cpu = error_on(gpu), error_on(cpu)
  assert "buffer_callback: callback" in message_gpu
  assert first_line(message_gpu) == first_line(message_cpu)


def test_vmap_sequential(gpu, cupy):
  def add_one(ctx, out, c):
    with cupy.cuda.ExternalStream(ctx.stream):
      cupy.add(cupy.asarray(c), 1, out=cupy.asarray(out))

  f = jax.vmap(hcb.buffer_callback(add_one, F32_4, vmap_method="sequential"))
  out = jax.jit(f)(jax.device_put(jnp.zeros((3, 4), jnp.float32), gpu))
  np.testing.assert_array_equal(out, np.ones((3, 4)))


NATIVE_CUDA_SOURCE = r"""
#include <stdio.h>
#include <cuda_runtime.h>
#include "hcb/hcb.h"
#include "hcb/ffi.h"

__global__ void twice_kernel(const float *in, float *out, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n)
    out[i] = 2.0f * in[i];
}

/* A native buffer callback: results[0] = 2 * args[0] (float32), a kernel
 * on XLA's stream over XLA's device buffers. */
extern "C" int twice_on_stream(void *user, hcb_device device,
                               const hcb_array *args, size_t nargs,
                               const hcb_array *results, size_t nresults,
                               hcb_error *err) {
  cudaStream_t stream = (cudaStream_t)hcb_call_stream();
  size_t n;
  cudaError_t e;

  (void)user;
  if (HCB_DEVICE_PLATFORM(device) != HCB_PLATFORM_CUDA || stream == NULL ||
      nargs != 1 || nresults != 1 || args[0].dtype != HCB_F32 ||
      results[0].nbytes != args[0].nbytes) {
    err->code = HCB_EINVAL;
    snprintf(err->message, sizeof err->message,
             "twice_on_stream: expected one float32 array in and out on a "
             "CUDA device with a stream (platform %d, stream %p)",
             (int)HCB_DEVICE_PLATFORM(device), (void *)stream);
    return HCB_EINVAL;
  }
  n = args[0].nbytes / sizeof(float);
  twice_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(
      (const float *)args[0].data, (float *)results[0].data, n);
  e = cudaGetLastError();
  if (e != cudaSuccess) {
    err->code = HCB_EINVAL;
    snprintf(err->message, sizeof err->message,
             "twice_on_stream: launch failed: %s", cudaGetErrorString(e));
    return HCB_EINVAL;
  }
  return HCB_OK;
}
"""


def test_native_buffer_callback_runs_a_kernel_on_xla_stream(gpu,
                                                            tmp_path):
  needs_real_gpu()
  lib = ctypes.CDLL(str(build_shared(tmp_path, "twice_cuda",
                                     NATIVE_CUDA_SOURCE, cuda=True)))
  native = hcb.native_call(lib.twice_on_stream)
  n = 1 << 20
  call = hcb.buffer_callback(native, jax.ShapeDtypeStruct((n,), jnp.float32))
  f = jax.jit(lambda x: call(x + 1) + 1)
  out = f(jax.device_put(jnp.arange(n, dtype=jnp.float32), gpu))
  np.testing.assert_array_equal(out, 2 * (np.arange(n) + 1) + 1)
  step = lambda c, _: (call(c), None)
  out = jax.jit(lambda c: lax.scan(step, c, None, length=5)[0])(
      jax.device_put(jnp.ones(n, jnp.float32), gpu))
  np.testing.assert_array_equal(out[:3], [32.0] * 3)


def test_the_cupy_example_runs(gpu, cupy):
  done = subprocess.run(
      [sys.executable, str(REPO / "examples" / "cupy_buffer_callback.py")],
      capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stdout + done.stderr
  assert "on XLA's stream" in done.stdout
