"""Native callbacks from Python: C functions given to id_tap (native_tap)
and call (native_call), as a ctypes function or a library path and symbol,
in jit, scan, vmap, shard_map; their errors; bad input."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import host_callback as hcb

SOURCE = r"""
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <string.h>
#include "hcb/hcb.h"

static atomic_long taps, tap_elements, devices_seen, last_batch;
static double total; /* under total_mu */
static pthread_mutex_t total_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_ulong tap_thread;
static atomic_uintptr_t last_arg;

/* Sums every float32 leaf of a record; notes its device and thread. */
int sum_tap(void *user, hcb_record *rec, hcb_error *err) {
  const hcb_array *a = hcb_record_args(rec);
  size_t i, j, n = hcb_record_nargs(rec);
  double s = 0;
  (void)user;
  for (i = 0; i < n; i++) {
    if (a[i].dtype != HCB_F32)
      return hcb_error_set(err, HCB_EINVAL,
                           "sum_tap: leaf %zu is %s, expected float32", i,
                           hcb_dtype_name(a[i].dtype));
    for (j = 0; j < a[i].nbytes / 4; j++)
      s += ((const float *)a[i].data)[j];
    atomic_fetch_add(&tap_elements, (long)(a[i].nbytes / 4));
  }
  if (n > 0)
    atomic_store(&last_batch, a[0].rank > 0 ? (long)a[0].dims[0] : -1);
  pthread_mutex_lock(&total_mu);
  total += s;
  pthread_mutex_unlock(&total_mu);
  atomic_fetch_or(&devices_seen,
                  1L << HCB_DEVICE_ORDINAL(hcb_record_device(rec)));
  atomic_store(&tap_thread, (unsigned long)pthread_self());
  atomic_fetch_add(&taps, 1);
  return HCB_OK;
}

int failing_tap(void *user, hcb_record *rec, hcb_error *err) {
  (void)user;
  return hcb_error_set(err, HCB_ECALLBACK, "failing_tap: saw %zu arrays",
                       hcb_record_nargs(rec));
}

/* results[0] = args[0] * 2 + args[1] * (user ? *(float *)user : 1);
 * float32, same sizes.  Notes its device and the operand's address. */
int affine_call(void *user, hcb_device device, const hcb_array *args,
                size_t nargs, const hcb_array *results, size_t nresults,
                hcb_error *err) {
  float w = user ? *(const float *)user : 1.0f;
  size_t i, n;
  if (nargs != 2 || nresults != 1 || args[0].dtype != HCB_F32 ||
      args[1].nbytes != args[0].nbytes || results[0].nbytes != args[0].nbytes)
    return hcb_error_set(err, HCB_EINVAL,
                         "affine_call: expected two float32 arrays of one "
                         "shape and a result like them, got %zu and %zu",
                         nargs, nresults);
  n = args[0].nbytes / 4;
  for (i = 0; i < n; i++)
    ((float *)results[0].data)[i] = ((const float *)args[0].data)[i] * 2 +
                                    ((const float *)args[1].data)[i] * w;
  atomic_store(&last_arg, (uintptr_t)args[0].data);
  atomic_fetch_or(&devices_seen, 1L << HCB_DEVICE_ORDINAL(device));
  return HCB_OK;
}

long native_taps(void) { return atomic_load(&taps); }
long native_tap_elements(void) { return atomic_load(&tap_elements); }
double native_total(void) {
  double t;
  pthread_mutex_lock(&total_mu);
  t = total;
  pthread_mutex_unlock(&total_mu);
  return t;
}
long native_devices_seen(void) { return atomic_load(&devices_seen); }
long native_last_batch(void) { return atomic_load(&last_batch); }
unsigned long native_tap_thread(void) { return atomic_load(&tap_thread); }
unsigned long native_this_thread(void) { return (unsigned long)pthread_self(); }
uintptr_t native_last_arg(void) { return atomic_load(&last_arg); }
/* Waits up to timeout_ms for `n` taps; 1 if they came. */
int wait_for_taps(long n, long timeout_ms) {
  struct timespec ms = {0, 1000000};
  long i;
  for (i = 0; i < timeout_ms; i++) {
    if (atomic_load(&taps) >= n)
      return 1;
    nanosleep(&ms, NULL);
  }
  return 0;
}
void native_reset(void) {
  taps = 0; tap_elements = 0; devices_seen = 0; last_batch = 0;
  pthread_mutex_lock(&total_mu);
  total = 0;
  pthread_mutex_unlock(&total_mu);
}
"""


@pytest.fixture(scope="module")
def lib_path(tmp_path_factory) -> str:
  d = tmp_path_factory.mktemp("native")
  (d / "native.c").write_text(SOURCE)
  flags = subprocess.run([sys.executable, "-m", "host_callback", "--cflags",
                          "--libs"], capture_output=True, text=True,
                         check=True).stdout.split()
  path = str(d / "libnative.so")
  subprocess.run(["cc", "-std=c11", "-shared", "-fPIC", "-O2", "-Wall",
                  "-Werror", str(d / "native.c"), *flags, "-lpthread", "-o",
                  path], check=True)
  return path


@pytest.fixture
def lib(lib_path):
  lib = ctypes.CDLL(lib_path)
  lib.native_total.restype = ctypes.c_double
  for name in ("native_taps", "native_tap_elements", "native_devices_seen",
               "native_last_batch"):
    getattr(lib, name).restype = ctypes.c_long
  for name in ("native_tap_thread", "native_this_thread"):
    getattr(lib, name).restype = ctypes.c_ulong
  lib.native_last_arg.restype = ctypes.c_size_t
  lib.native_reset()
  return lib


# ---- native taps -------------------------------------------------------------

def test_native_tap_in_jit_and_scan(lib):
  tap = hcb.native_tap(lib.sum_tap)

  def step(c, x):
    return hcb.id_tap(tap, (c, x))[0] + x, None

  xs = jnp.arange(100, dtype=jnp.float32)
  out, _ = jax.jit(lambda c: jax.lax.scan(step, c, xs))(jnp.float32(0))
  hcb.barrier_wait()
  assert float(out) == 4950
  assert lib.native_taps() == 100
  # sum over steps of (carry + x): the carries are the prefix sums.
  carries = np.concatenate([[0], np.cumsum(np.arange(99))])
  assert lib.native_total() == carries.sum() + np.arange(100).sum()
  # It ran on the runtime's consumer thread, not the thread of the program.
  assert lib.native_tap_thread() != lib.native_this_thread()


def test_native_tap_from_library_path_and_symbol(lib, lib_path):
  tap = hcb.native_tap(lib_path, "sum_tap", name="summer")
  assert repr(tap) == "NativeTap(summer)"
  y = jax.jit(lambda x: hcb.id_tap(tap, x) * 2)(jnp.ones(5))
  hcb.barrier_wait()
  np.testing.assert_array_equal(y, [2.0] * 5)
  assert (lib.native_taps(), lib.native_total()) == (1, 5.0)
  # The same function and user pointer are the same callback.
  assert tap == hcb.native_tap(lib.sum_tap)


def test_native_tap_under_vmap_gets_the_batch(lib):
  tap = hcb.native_tap(lib.sum_tap)
  xs = jnp.ones((7, 3), jnp.float32)
  jax.jit(jax.vmap(lambda x: hcb.id_tap(tap, x)))(xs)
  hcb.barrier_wait()
  assert (lib.native_taps(), lib.native_last_batch(),
          lib.native_tap_elements()) == (1, 7, 21)


def test_native_tap_runs_on_every_device_under_shard_map(lib):
  tap = hcb.native_tap(lib.sum_tap)
  mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
  f = jax.jit(jax.shard_map(lambda x: hcb.id_tap(tap, x), mesh=mesh,
                            in_specs=P("d"), out_specs=P("d")))
  f(jnp.arange(8, dtype=jnp.float32))
  hcb.barrier_wait()
  assert lib.native_taps() == 4
  assert lib.native_devices_seen() == sum(1 << d.id for d in jax.devices()[:4])
  assert lib.native_total() == 28.0


def test_failing_native_tap_is_raised_by_barrier_wait(lib):
  tap = hcb.native_tap(lib.failing_tap)
  jax.jit(lambda x: hcb.id_tap(tap, (x, x)))(jnp.ones(2))
  with pytest.raises(hcb.CallbackException,
                     match="failing_tap: saw 2 arrays"):
    hcb.barrier_wait()
  # A wrong dtype reported by the C function, and the runtime goes on.
  jax.jit(lambda x: hcb.id_tap(hcb.native_tap(lib.sum_tap), x))(
      jnp.ones(2, jnp.int32))
  with pytest.raises(hcb.CallbackException,
                     match="sum_tap: leaf 0 is int32, expected float32"):
    hcb.barrier_wait()
  jax.jit(lambda x: hcb.id_tap(hcb.native_tap(lib.sum_tap), x))(jnp.ones(2))
  hcb.barrier_wait()
  assert lib.native_total() == 2.0


def test_native_taps_run_while_python_holds_the_gil(lib, lib_path):
  """A native tap is delivered while this thread holds the GIL without a
  break (a PyDLL call keeps it); a Python tap would wait for it."""
  f = jax.jit(lambda x: hcb.id_tap(hcb.native_tap(lib.sum_tap), x))
  jax.block_until_ready(f(jnp.ones(4)))
  hcb.barrier_wait()
  lib.native_reset()
  jax.block_until_ready(f(jnp.ones(4)))  # the record is queued by now
  holding_gil = ctypes.PyDLL(lib_path)
  assert holding_gil.wait_for_taps(1, 10_000) == 1


# ---- native calls ------------------------------------------------------------

def test_native_call_in_jit_reads_xla_buffers_in_place(lib):
  w = ctypes.c_float(10.0)
  affine = hcb.native_call(lib.affine_call, user=ctypes.addressof(w))
  f = jax.jit(lambda x, y: hcb.call(affine, (x, y), result_shape=x))
  x = jnp.arange(4, dtype=jnp.float32)
  y = jnp.ones(4, jnp.float32)
  np.testing.assert_array_equal(f(x, y), [10, 12, 14, 16])
  # No copy: the C function saw the very buffer of the jax.Array.
  assert lib.native_last_arg() == x.unsafe_buffer_pointer()


def test_native_call_in_scan_with_vmap_and_device(lib, lib_path):
  affine = hcb.native_call(lib_path, "affine_call")

  def step(c, _):
    return hcb.call(affine, (c, c), result_shape=c), None

  out, _ = jax.jit(lambda c: jax.lax.scan(step, c, None, length=3))(
      jnp.ones(2))
  np.testing.assert_array_equal(out, [27.0, 27.0])  # c * 3, three times
  xs = jnp.arange(6, dtype=jnp.float32).reshape(3, 2)
  batched = jax.vmap(lambda x: hcb.call(affine, (x, x), result_shape=x,
                                        vmap_method="broadcast_all"))(xs)
  np.testing.assert_array_equal(batched, np.asarray(xs) * 3)
  dev = jax.devices()[2]
  lib.native_reset()
  jax.jit(lambda x: hcb.call(affine, (x, x), result_shape=x))(
      jax.device_put(jnp.ones(2), dev)).block_until_ready()
  assert lib.native_devices_seen() == 1 << dev.id


def test_failing_native_call_fails_the_computation(lib):
  affine = hcb.native_call(lib.affine_call)
  f = jax.jit(lambda x: hcb.call(affine, (x,), result_shape=x))
  with pytest.raises(jax.errors.JaxRuntimeError,
                     match="affine_call: expected two float32 arrays of one "
                           "shape and a result like them, got 1 and 1"):
    f(jnp.ones(3)).block_until_ready()
  with pytest.raises(hcb.CallbackException, match="affine_call: expected"):
    hcb.barrier_wait()


# ---- bad input ---------------------------------------------------------------

def test_bad_native_callbacks_are_refused_clearly(lib, lib_path, tmp_path):
  with pytest.raises(TypeError, match="needs the name of the C function"):
    hcb.native_tap(lib_path)
  with pytest.raises(ValueError, match="has no symbol 'nope'"):
    hcb.native_call(lib_path, "nope")
  with pytest.raises(ValueError, match="cannot load the library"):
    hcb.native_tap(str(tmp_path / "missing.so"), "f")
  with pytest.raises(TypeError, match="expected a ctypes function pointer"):
    hcb.native_tap(lambda x: x)
  with pytest.raises(ValueError, match="not a C function pointer"):
    hcb.native_call(0)
  with pytest.raises(TypeError, match="goes with a library path"):
    hcb.native_call(lib.affine_call, "affine_call")
  tap, call = hcb.native_tap(lib.sum_tap), hcb.native_call(lib.affine_call)
  x = jnp.ones(2)
  with pytest.raises(TypeError, match="is a native tap; a native call"):
    hcb.call(tap, x, result_shape=x)
  with pytest.raises(TypeError, match="is a native call function; a native "
                                      "tap is made with"):
    hcb.id_tap(call, x)
  with pytest.raises(TypeError, match="is a native tap"):
    hcb.buffer_callback(tap, jax.ShapeDtypeStruct((2,), np.float32))


@pytest.mark.parametrize("make", [hcb.native_tap, hcb.native_call])
def test_addresses_that_cannot_be_pointers_are_refused(lib, make):
  # A negative int, or one past the largest pointer, would wrap around to
  # another address (-1 tapped used to crash the process; address + 2**64
  # ran the function at address).  The parameter is named.
  address = ctypes.cast(lib.sum_tap, ctypes.c_void_p).value
  top = 2 ** (8 * ctypes.sizeof(ctypes.c_void_p))
  for bad in (-1, -address, address + top, top):
    with pytest.raises(ValueError, match=r"fn must be an address from 1 to "
                                         r"2\*\*(64|32)-1"):
      make(bad)
  for bad in (-1, address + top):
    with pytest.raises(ValueError, match="user must be an address from 0"):
      make(address, user=bad)
  with pytest.raises(TypeError, match="user must be an address"):
    make(address, user=2.5)
  with pytest.raises(TypeError, match="user must be an address"):
    make(address, user=True)
  # In range, the largest pointer included, they are taken as given.
  assert make(address, user=top - 1).user == top - 1
  assert make(address, user=ctypes.c_void_p(None)).user == 0
  assert make(address).address == address


def test_the_extension_refuses_an_address_out_of_range():
  # The same check where the address enters C (a caller of _hcb directly).
  from host_callback import _hcb
  top = 2 ** (8 * ctypes.sizeof(ctypes.c_void_p))
  for register in (_hcb.register_native_tap, _hcb.register_native_call):
    with pytest.raises(ValueError, match="an address must be from 0 to"):
      register(-1, 0, "f")
    with pytest.raises(ValueError, match="an address must be from 0 to"):
      register(1, top, "f")
    with pytest.raises(TypeError, match="an address must be an int"):
      register("1", 0, "f")
