"""id_tap, id_print, call (Python and native), native_tap, barrier_wait and
stop_outfeed_receiver on a GPU, against real JAX with its CUDA plugin.
Where the answer is "the same as on the CPU", the test computes it on the
CPU device in the same process and compares."""

from __future__ import annotations

import ctypes
import io
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import host_callback as hcb

from gpu_support import DRY_RUN
from gpu_support import PLATFORM
from gpu_support import build_shared
from gpu_support import needs_real_gpu
from gpu_support import run_python

F32_3 = jax.ShapeDtypeStruct((3,), np.float32)


def on(device, fn, *args):
  """``fn`` jitted and run with its arguments committed to ``device``."""
  return jax.jit(fn)(*(jax.device_put(a, device) for a in args))


# ---- taps -----------------------------------------------------------------

def test_id_tap_in_a_scan_delivers_every_step_in_order(gpu, collect):
  def step(c, i):
    hcb.id_tap(collect, (i, c))
    return c * 2, None

  out = on(gpu, lambda x: lax.scan(step, x, jnp.arange(20))[0],
           jnp.ones(3, jnp.float32))
  hcb.barrier_wait()
  assert [int(i) for i, _ in collect.args] == list(range(20))
  for i, c in collect.args:
    assert isinstance(c, np.ndarray)  # on the host, as on the CPU
    np.testing.assert_array_equal(c, np.full(3, 2.0 ** int(i), np.float32))
  np.testing.assert_array_equal(out, np.full(3, 2.0 ** 20, np.float32))


def test_taps_in_cond_while_loop_and_eagerly(gpu):
  log = []

  def tap(name):
    return lambda x, transforms: log.append((name, np.asarray(x).tolist()))

  def fn(x):
    x = lax.cond(x[0] > 0, lambda v: hcb.id_tap(tap("pos"), v),
                 lambda v: hcb.id_tap(tap("neg"), v), x)
    return lax.while_loop(lambda c: c[0] < 3,
                          lambda c: hcb.id_tap(tap("loop"), c) + 1, x)

  out = on(gpu, fn, jnp.ones(2, jnp.int32))
  hcb.id_tap(tap("eager"), jax.device_put(jnp.int32(7), gpu))
  hcb.barrier_wait()
  assert log == [("pos", [1, 1]), ("loop", [1, 1]), ("loop", [2, 2]),
                 ("eager", 7)]
  np.testing.assert_array_equal(out, [3, 3])


@pytest.mark.parametrize("flavor", list(hcb.CallbackFlavor))
def test_callback_flavors(gpu, collect, flavor):
  out = on(gpu, lambda x: hcb.id_tap(collect, x * 2, callback_flavor=flavor),
           jnp.arange(3))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, [0, 2, 4])
  np.testing.assert_array_equal(collect.args[0], [0, 2, 4])
  if flavor is not hcb.CallbackFlavor.DEBUG:
    f = lambda x: hcb.call(lambda a: a + 1, x, result_shape=x,
                           callback_flavor=flavor)
    np.testing.assert_array_equal(on(gpu, f, jnp.arange(3)), [1, 2, 3])


def test_tap_with_device_gives_the_gpu(gpu, collect):
  on(gpu, lambda x: hcb.id_tap(collect, x, tap_with_device=True),
     jnp.arange(4))
  hcb.barrier_wait()
  (_, _, device), = collect.calls
  assert device == gpu and device.platform == PLATFORM


def test_id_tap_result_and_pytrees_as_on_cpu(gpu, cpu):
  def taps_on(device):
    c = []

    def fn(x):
      tree = {"a": x, "b": (x * 2, x.astype(jnp.int8))}
      return hcb.id_tap(lambda arg, tr: c.append(arg), tree, result=x + 1)

    out = on(device, fn, jnp.arange(5, dtype=jnp.float32))
    hcb.barrier_wait()
    np.testing.assert_array_equal(out, np.arange(5) + 1)
    return c

  (on_gpu,), (on_cpu,) = taps_on(gpu), taps_on(cpu)
  assert (jax.tree_util.tree_structure(on_gpu)
          == jax.tree_util.tree_structure(on_cpu))
  for a, b in zip(jax.tree_util.tree_leaves(on_gpu),
                  jax.tree_util.tree_leaves(on_cpu)):
    assert type(a) is type(b) is np.ndarray and a.dtype == b.dtype
    np.testing.assert_array_equal(a, b)


def test_id_print_prints_as_on_cpu(gpu, cpu):
  def printed(device):
    out = io.StringIO()
    on(device, lambda x: hcb.id_print(
        {"x": x, "y": x.astype(jnp.int32)}, what="a dict", output_stream=out),
       jnp.linspace(0, 1, 7, dtype=jnp.float32))
    hcb.barrier_wait()
    return out.getvalue()

  text = printed(gpu)
  assert text.startswith("what: a dict\n")
  assert text == printed(cpu)


def test_large_taps_above_the_pinned_pools_record_limit(gpu):
  # 160 MiB: over 128 MiB, the most one record takes from the default
  # 256 MiB pinned pool.
  n = 40 * (1 << 20)
  sums = []

  def tap(x, transforms):
    del transforms
    assert x.shape == (n,) and x.dtype == np.int32
    sums.append((int(x[0]), int(x[-1]), int(x[n // 2])))

  def fn(x):
    def step(c, _):
      return hcb.id_tap(tap, c) + 1, None
    return lax.scan(step, x, None, length=3)[0]

  out = on(gpu, fn, jnp.arange(n, dtype=jnp.int32))  # 160 MiB
  hcb.barrier_wait()
  assert sums == [(k, n - 1 + k, n // 2 + k) for k in (0, 1, 2)]
  assert int(out[0]) == 3


def test_backpressure_with_a_small_queue_loses_nothing():
  # A 16 MB queue (the smallest), 4 MiB taps and a slow tap function: the
  # device waits for room, every tap arrives, in order.
  done = run_python(f"""
      import time
      import jax, jax.numpy as jnp
      import host_callback as hcb
      assert jax.default_backend() == {PLATFORM!r}
      got = []
      def slow(x, tr):
        time.sleep(0.02)
        got.append(int(x[0]))
      def step(c, _):
        return hcb.id_tap(slow, c) + 1, None
      f = jax.jit(lambda x: jax.lax.scan(step, x, None, length=48)[0])
      f(jnp.zeros(1 << 20, jnp.int32)).block_until_ready()
      hcb.barrier_wait()
      assert got == list(range(48)), got
      print("ok")
      """, env={"HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE": "16000000"})
  assert done.returncode == 0, done.stdout + done.stderr
  assert done.stdout.startswith("ok")


def test_taps_larger_than_a_small_pinned_pool_pass_through_it_in_chunks():
  # A 4 MiB pinned pool (the smallest): 24 MiB taps go through it in
  # chunks, interleaved with small taps, every byte and the order kept.
  done = run_python(f"""
      import jax, jax.numpy as jnp, numpy as np
      import host_callback as hcb
      assert jax.default_backend() == {PLATFORM!r}
      got = []
      def tap(x, tr):
        got.append((x.size, int(x[0]), int(x[-1])))
      def step(c, _):
        hcb.id_tap(tap, c[:1])
        return hcb.id_tap(tap, c) + 1, None
      n = 6 << 20
      f = jax.jit(lambda x: jax.lax.scan(step, x, None, length=5)[0])
      f(jnp.arange(n, dtype=jnp.int32)).block_until_ready()
      hcb.barrier_wait()
      want = [t for k in range(5) for t in ((1, k, k), (n, k, n - 1 + k))]
      assert got == want, got
      print("ok")
      """, env={"HOST_CALLBACK_CUDA_PINNED_BYTE_SIZE": str(4 << 20)})
  assert done.returncode == 0, done.stdout + done.stderr
  assert done.stdout.startswith("ok")


def test_stats_report_the_gpu_s_pinned_pool(gpu):
  needs_real_gpu()  # a CPU device has no pinned pool

  def pool():
    return hcb.stats()["devices"].get(str(gpu), {}).get("pinned_pool")

  # The pool and its counters are the process's: what earlier tests left
  # (an array kept by a failed test's traceback, say) is not this test's.
  before = pool() or {"kept_bytes": 0, "syncs": 0}
  saved = []
  keep = jax.jit(lambda x: hcb.id_tap(lambda a, t: saved.append(a), x))
  keep(jax.device_put(jnp.ones(4096, jnp.float32), gpu)).block_until_ready()
  hcb.barrier_wait()
  after = pool()
  assert set(after) == {"capacity", "used_bytes", "in_flight_bytes",
                        "kept_bytes", "waits", "refusals", "syncs",
                        "pin_failures"}
  assert after["capacity"] > 0 and after["in_flight_bytes"] == 0
  # the array saved is a view into it
  assert after["kept_bytes"] - before["kept_bytes"] >= 16384
  assert after["syncs"] == before["syncs"]
  assert after["pin_failures"] == 0  # the pool was pinned
  saved.clear()
  assert pool()["kept_bytes"] == before["kept_bytes"]


def test_taps_from_a_failing_tap_function_are_recorded(gpu):
  def bad(x, transforms):
    raise ValueError("tap says no")

  on(gpu, lambda x: hcb.id_tap(bad, x), jnp.ones(2))
  with pytest.raises(hcb.CallbackException, match="tap says no"):
    hcb.barrier_wait()
  hcb.barrier_wait()  # reported once


def test_barrier_wait_waits_for_slow_taps_and_stop_restarts(gpu):
  got = []

  def slow(x, transforms):
    time.sleep(0.05)
    got.append(int(x))

  f = jax.jit(lambda x: lax.scan(
      lambda c, _: (hcb.id_tap(slow, c) + 1, None), x, None, length=5)[0])
  f(jax.device_put(jnp.int32(0), gpu)).block_until_ready()
  hcb.barrier_wait()
  assert got == [0, 1, 2, 3, 4]
  f(jax.device_put(jnp.int32(10), gpu)).block_until_ready()
  hcb.stop_outfeed_receiver()  # waits for the pending taps, then stops
  assert got[5:] == [10, 11, 12, 13, 14]
  f(jax.device_put(jnp.int32(20), gpu))  # starts the runtime again
  hcb.barrier_wait()
  assert got[10:] == [20, 21, 22, 23, 24]


# ---- program order --------------------------------------------------------

def test_taps_prints_and_calls_run_in_program_order(gpu):
  log = []
  lock = threading.Lock()

  def tap(name):
    def f(x, transforms):
      with lock:
        log.append((name, int(x)))
    return f

  def call_log(x):
    with lock:
      log.append(("call", int(x)))
    return x

  out = io.StringIO()

  def step(c, i):
    hcb.id_tap(tap("first"), i)
    c = c + hcb.call(call_log, i, result_shape=jax.ShapeDtypeStruct(
        (), jnp.int32))
    hcb.id_print(i, output_stream=out)
    hcb.id_tap(tap("last"), i)
    return c, None

  total = on(gpu, lambda x: lax.scan(step, x, jnp.arange(30))[0],
             jnp.int32(0))
  hcb.barrier_wait()
  assert int(total) == sum(range(30))
  assert log == [(name, i) for i in range(30)
                 for name in ("first", "call", "last")]
  assert out.getvalue().split() == [str(i) for i in range(30)]


# ---- transforms -----------------------------------------------------------

def _transform_taps(device):
  c = []

  def tap(arg, transforms):
    c.append((jax.tree_util.tree_map(np.asarray, arg), transforms))

  def f(x):
    return jnp.sum(hcb.id_tap(tap, x * 2) ** 2)

  x = jax.device_put(jnp.arange(6, dtype=jnp.float32).reshape(2, 3), device)
  batched = jax.jit(jax.vmap(lambda r: hcb.id_tap(tap, r * 3)))(x)
  grad = jax.jit(jax.grad(f))(x)
  hcb.barrier_wait()
  return c, np.asarray(batched), np.asarray(grad)


def test_vmap_and_grad_transforms_as_on_cpu(gpu, cpu):
  on_gpu, on_cpu = _transform_taps(gpu), _transform_taps(cpu)
  taps_gpu, taps_cpu = on_gpu[0], on_cpu[0]
  assert [t for _, t in taps_gpu] == [t for _, t in taps_cpu]
  assert taps_gpu[0][1] == (("batch", {"batch_dims": (0,)}),)
  for (a, _), (b, _) in zip(taps_gpu, taps_cpu):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(on_gpu[1], on_cpu[1])
  np.testing.assert_allclose(on_gpu[2], on_cpu[2])


# ---- call -----------------------------------------------------------------

def test_call_with_a_python_function_in_jit_and_scan(gpu):
  f = lambda x: hcb.call(lambda a: np.sin(a) * 2, x, result_shape=x)
  x = jnp.linspace(0, 3, 3, dtype=jnp.float32)
  np.testing.assert_allclose(on(gpu, f, x), np.sin(np.asarray(x)) * 2,
                             rtol=1e-6)
  step = lambda c, _: (hcb.call(lambda a: a + 1, c, result_shape=c) * 2, None)
  out = on(gpu, lambda c: lax.scan(step, c, None, length=4)[0],
           jnp.zeros(3, jnp.float32))
  np.testing.assert_array_equal(out, [30.0] * 3)  # ((((0+1)2+1)2+1)2+1)2


def test_call_with_device_gives_the_gpu(gpu):
  seen = []

  def host(x, *, device):
    seen.append(device)
    return x

  on(gpu, lambda x: hcb.call(host, x, result_shape=x, call_with_device=True),
     jnp.ones(2))
  assert seen == [gpu]


def _raises(x):
  raise ValueError("host says no")


ERRORS = {
    "exception": _raises,
    "shape": lambda x: np.zeros((2, 2), np.float32),
    "dtype": lambda x: x.astype(np.int32),
    "none": lambda x: None,
}


def _call_error(device, func):
  with pytest.raises(jax.errors.JaxRuntimeError) as info:
    on(device, lambda x: hcb.call(func, x, result_shape=F32_3),
       jnp.ones(3)).block_until_ready()
  with pytest.raises(hcb.CallbackException) as recorded:
    hcb.barrier_wait()
  return str(info.value), str(recorded.value)


@pytest.mark.parametrize("kind", list(ERRORS))
def test_call_errors_fail_the_computation_as_on_cpu(gpu, cpu, kind):
  message, recorded = _call_error(gpu, ERRORS[kind])
  cpu_message, cpu_recorded = _call_error(cpu, ERRORS[kind])
  # The first line names the callback, what was expected and what came back
  # (or the exception); XLA's status code before it ("UNKNOWN: " on the
  # CPU) and the traceback's frames may differ.
  assert cpu_message.split("\n")[0].split(": ", 1)[1] in message
  assert "host_callback.call: callback" in message
  assert recorded.split("\n")[0] == cpu_recorded.split("\n")[0]
  # The runtime stays usable.
  out = on(gpu, lambda x: hcb.call(lambda a: a * 3, x, result_shape=F32_3),
           jnp.ones(3))
  np.testing.assert_array_equal(out, [3.0] * 3)


NATIVE_SOURCE = r"""
#include <stdio.h>
#include <string.h>
#include "hcb/hcb.h"

static unsigned long long taps, tapped_elements;
static double tapped_sum;

/* A call on the host (a dry run on the CPU): results[0] = args[0] * 2 + 1
 * (float32). */
int twice_plus_one(void *user, hcb_device device, const hcb_array *args,
                   size_t nargs, const hcb_array *results, size_t nresults,
                   hcb_error *err) {
  const float *in;
  float *out;
  size_t i, n;

  (void)user;
  (void)device;
  if (nargs != 1 || nresults != 1 || args[0].dtype != HCB_F32 ||
      results[0].nbytes != args[0].nbytes) {
    err->code = HCB_EINVAL;
    snprintf(err->message, sizeof err->message,
             "twice_plus_one: expected one float32 array in and out");
    return HCB_EINVAL;
  }
  in = args[0].data;
  out = results[0].data;
  n = args[0].nbytes / sizeof(float);
  for (i = 0; i < n; i++)
    out[i] = in[i] * 2.0f + 1.0f;
  return HCB_OK;
}

/* A tap: counts records and sums their float32 elements. */
int sum_tap(void *user, hcb_record *rec, hcb_error *err) {
  const hcb_array *a = hcb_record_args(rec);
  size_t i, j;

  (void)user;
  (void)err;
  for (i = 0; i < hcb_record_nargs(rec); i++) {
    const float *f = a[i].data;
    if (a[i].dtype != HCB_F32)
      continue;
    for (j = 0; j < a[i].nbytes / sizeof(float); j++)
      tapped_sum += f[j];
    tapped_elements += a[i].nbytes / sizeof(float);
  }
  taps++;
  return HCB_OK;
}

unsigned long long native_taps(void) { return taps; }
unsigned long long native_elements(void) { return tapped_elements; }
double native_sum(void) { return tapped_sum; }
"""


@pytest.fixture(scope="module")
def native_lib(tmp_path_factory):
  lib = ctypes.CDLL(str(build_shared(tmp_path_factory.mktemp("native"),
                                     "gpu_native", NATIVE_SOURCE)))
  lib.native_taps.restype = ctypes.c_ulonglong
  lib.native_elements.restype = ctypes.c_ulonglong
  lib.native_sum.restype = ctypes.c_double
  return lib


NATIVE_CUDA_SOURCE = r"""
#include <stdio.h>
#include <cuda_runtime.h>
#include "hcb/hcb.h"
#include "hcb/ffi.h"

__global__ void twice_plus_one_kernel(const float *in, float *out, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n)
    out[i] = in[i] * 2.0f + 1.0f;
}

/* A call on a GPU: XLA's device buffers, worked on on XLA's stream
 * (include/hcb/hcb.h, hcb_call_fn).  results[0] = args[0] * 2 + 1. */
extern "C" int twice_plus_one(void *user, hcb_device device,
                              const hcb_array *args, size_t nargs,
                              const hcb_array *results, size_t nresults,
                              hcb_error *err) {
  cudaStream_t stream = (cudaStream_t)hcb_call_stream();
  size_t n;

  (void)user;
  if (nargs != 1 || nresults != 1 || args[0].dtype != HCB_F32 ||
      results[0].nbytes != args[0].nbytes) {
    err->code = HCB_EINVAL;
    snprintf(err->message, sizeof err->message,
             "twice_plus_one: expected one float32 array in and out");
    return HCB_EINVAL;
  }
  if (HCB_DEVICE_PLATFORM(device) != HCB_PLATFORM_CUDA || stream == NULL) {
    err->code = HCB_EINVAL;
    snprintf(err->message, sizeof err->message,
             "twice_plus_one: not on a CUDA device with a stream");
    return HCB_EINVAL;
  }
  n = args[0].nbytes / sizeof(float);
  if (n > 0)
    twice_plus_one_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(
        (const float *)args[0].data, (float *)results[0].data, n);
  return cudaGetLastError() == cudaSuccess ? HCB_OK : HCB_EINVAL;
}
"""


@pytest.fixture(scope="module")
def native_call_fn(tmp_path_factory, native_lib):
  """twice_plus_one: a CUDA kernel on XLA's stream, as a native call on a
  GPU gets device pointers; the host version in a dry run."""
  if DRY_RUN:
    return native_lib.twice_plus_one
  lib = ctypes.CDLL(str(build_shared(tmp_path_factory.mktemp("native_cuda"),
                                     "gpu_native_call", NATIVE_CUDA_SOURCE,
                                     cuda=True)))
  return lib.twice_plus_one


def test_call_with_a_native_function(gpu, native_call_fn):
  native = hcb.native_call(native_call_fn)
  f = lambda x: hcb.call(native, x, result_shape=x)
  np.testing.assert_array_equal(on(gpu, f, jnp.arange(4, dtype=jnp.float32)),
                                [1.0, 3.0, 5.0, 7.0])
  step = lambda c, _: (hcb.call(native, c, result_shape=c), None)
  out = on(gpu, lambda c: lax.scan(step, c, None, length=3)[0],
           jnp.zeros(2, jnp.float32))
  np.testing.assert_array_equal(out, [7.0, 7.0])
  with pytest.raises(jax.errors.JaxRuntimeError,
                     match="twice_plus_one: expected one float32 array"):
    on(gpu, lambda x: hcb.call(native, x, result_shape=x),
       jnp.arange(3)).block_until_ready()
  with pytest.raises(hcb.CallbackException):
    hcb.barrier_wait()


def test_native_tap(gpu, native_lib):
  tap = hcb.native_tap(native_lib.sum_tap)
  taps0, elements0 = native_lib.native_taps(), native_lib.native_elements()
  sum0 = native_lib.native_sum()
  step = lambda c, _: (hcb.id_tap(tap, c) + 1, None)
  on(gpu, lambda c: lax.scan(step, c, None, length=10)[0],
     jnp.zeros(1000, jnp.float32))
  hcb.barrier_wait()
  assert native_lib.native_taps() - taps0 == 10
  assert native_lib.native_elements() - elements0 == 10 * 1000
  assert native_lib.native_sum() - sum0 == 1000 * sum(range(10))


def test_taps_and_prints_name_the_gpu(gpu, collect):
  x = jax.device_put(jnp.arange(3, dtype=jnp.float32), gpu)
  out = io.StringIO()

  def f(x):
    y = hcb.id_tap(collect, x * 2, tap_with_device=True)
    return hcb.id_print(y + 1, tap_with_device=True, output_stream=out)

  np.testing.assert_array_equal(jax.jit(f)(x), [1, 3, 5])
  hcb.barrier_wait()
  (arg, transforms, device), = collect.calls
  np.testing.assert_array_equal(arg, [0, 2, 4])
  assert transforms == () and device == gpu
  assert out.getvalue() == f"device: {gpu}\n[1. 3. 5.]\n"


def test_barrier_waits_for_taps_of_a_computation_still_running(gpu, collect):
  def f(x):
    def step(c, _):
      c = jnp.sin(c @ c.T)
      return hcb.id_tap(collect, c[0, 0]) * 0 + c, None
    return jax.lax.scan(step, x, None, length=50)[0]

  x = jax.device_put(jnp.ones((512, 512), jnp.float32), gpu)
  jax.jit(f)(x)  # not waited for
  hcb.barrier_wait()
  assert len(collect.calls) == 50
