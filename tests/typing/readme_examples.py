"""Every example of README.md and docs/api.md, as a user program, type-checked
strictly.

``make typecheck`` runs ``mypy --strict`` on this file against the installed
package: the public API must accept what README.md and docs/api.md (and the
docstrings and docs/c_api.md they point to) show users writing -- Python functions and C
functions from ``native_tap``/``native_call`` alike, every keyword of the
API table -- and give back types a strict program can use.

Importing it runs nothing.  ``python tests/typing/readme_examples.py``
runs the Python examples; with the path of a shared library that exports
``log_stats`` (an ``hcb_tap_fn``) and ``solve``/``fill`` (``hcb_call_fn``s)
it builds the native callbacks too.
"""

from __future__ import annotations

import ctypes
import io
import pathlib
import sys
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

import host_callback as hcb
from host_callback.__main__ import main as cli_main

# What a tap function receives as ``transforms``: (name, params) pairs.
Transforms = Sequence[tuple[str, dict[str, Any]]]


# ---- Migrating ---------------------------------------------------------------

def migrating() -> None:
  def log(arg: Any, transforms: Transforms) -> None:
    print("loss", arg)

  @jax.jit
  def step(x: jax.Array) -> jax.Array:
    loss = jnp.sum(x ** 2)
    hcb.id_tap(log, loss)          # runs on the host, asynchronously
    return x - 0.1 * x

  step(jnp.ones(3))
  hcb.barrier_wait()               # every tap delivered; raises if a tap raised

  # A synchronous call: the device waits for the host's (checked) result.
  eig = jax.jit(lambda m: hcb.call(np.linalg.eigvals, m,
                                   result_shape=jax.ShapeDtypeStruct(
                                       m.shape[:-1], m.dtype)))
  values: jax.Array = eig(jnp.diag(jnp.array([1., 2., 3.])))
  print(values)


# ---- What is here: the API table ---------------------------------------------

def log_with_device(arg: Any, transforms: Transforms, *,
                    device: jax.Device) -> None:
  print(device, transforms, arg)


def double(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
  return x * 2


def double_on(x: npt.NDArray[Any], *, device: jax.Device) -> npt.NDArray[Any]:
  del device
  return x * 2


def api_table() -> None:
  x = jnp.arange(3.)
  y: jax.Array = hcb.id_tap(log_with_device, x, result=x + 1,
                            tap_with_device=True, device_index=0,
                            callback_flavor=hcb.CallbackFlavor.IO_CALLBACK)
  z: jax.Array = hcb.call(double_on, x,
                          result_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          call_with_device=True, device_index=0,
                          callback_flavor=hcb.CallbackFlavor.PURE,
                          vmap_method=None)
  hcb.barrier_wait(logging_name="api_table")
  hcb.barrier_wait()
  try:
    hcb.barrier_wait("again")
  except hcb.CallbackException as e:
    print("a tap raised:", e, e.__cause__)
  try:
    hcb.barrier_wait()
  except hcb.TapFunctionException:  # the legacy name of CallbackException
    pass
  stats: dict[str, Any] = hcb.stats()
  print(stats["records_in"], stats["devices"], stats["max_queue_bytes"], y, z)
  hcb.stop_outfeed_receiver()
  flavors: list[hcb.CallbackFlavor] = [
      hcb.CallbackFlavor.IO_CALLBACK, hcb.CallbackFlavor.PURE,
      hcb.CallbackFlavor.DEBUG]
  print(flavors, hcb.__version__)


def under_transformations() -> None:
  """Taps under vmap (``transforms``), jvp/grad (primal only), remat; calls
  under vmap with a ``vmap_method``."""
  def log(arg: Any, transforms: Transforms) -> None:
    print(transforms, arg)

  xs = jnp.ones((4, 3))
  jax.vmap(lambda v: hcb.id_tap(log, v))(xs)
  jax.grad(lambda v: jnp.sum(hcb.id_tap(log, v) ** 2))(xs[0])
  jax.jvp(lambda v: hcb.id_tap(log, v), (xs[0],), (xs[0],))
  jax.grad(jax.checkpoint(lambda v: jnp.sum(hcb.id_tap(log, v))))(xs[0])
  for method in ("sequential", "sequential_unrolled", "expand_dims",
                 "broadcast_all"):
    jax.vmap(lambda v: hcb.call(double, v, result_shape=v,
                                vmap_method=method))(xs)
  hcb.barrier_wait()


# ---- call specifically -------------------------------------------------------

def call_results() -> None:
  x = jnp.arange(4, dtype=jnp.float32)
  # A numeric scalar, anything with .shape/.dtype, a pytree of those, or
  # None/() for no result.
  total: jax.Array = hcb.call(lambda v: np.float32(v.sum()), x,
                              result_shape=np.float32(0))
  pair: tuple[jax.Array, jax.Array] = hcb.call(
      lambda v: (v, v * 2), x,
      result_shape=(x, jax.ShapeDtypeStruct(x.shape, x.dtype)))
  hcb.call(print, x)
  hcb.call(lambda v: (), x, result_shape=())
  # DEBUG allows no result_shape.
  hcb.call(print, x, callback_flavor=hcb.CallbackFlavor.DEBUG)
  try:
    jax.grad(lambda v: hcb.call(lambda w: w, v, result_shape=v))(1.)
  except NotImplementedError as e:  # wrap the caller in jax.custom_jvp
    print(e)
  try:
    hcb.call(lambda v: v[:2], x, result_shape=x)
  except jax.errors.JaxRuntimeError as e:
    print(e)
  try:
    hcb.barrier_wait()
  except hcb.CallbackException as e:
    print(e)
  print(total, pair)


# ---- buffer_callback specifically --------------------------------------------

def scale(ctx: hcb.ExecutionContext, out: hcb.Buffer, x: hcb.Buffer, *,
          factor: hcb.Buffer) -> None:
  """``callback(ctx, out, *args, **kwargs)``: writes ``out`` in place."""
  assert ctx.stage is hcb.ExecutionStage.EXECUTE
  print(ctx.device, ctx, out.shape, out.dtype, x)
  try:
    print(ctx.stream)
  except RuntimeError:  # CPU devices have no stream
    pass
  inputs = np.asarray(x)               # a view of XLA's buffer, read-only
  same = np.from_dlpack(x)             # a view too
  raw = memoryview(x)                  # the buffer protocol
  np.asarray(out)[...] = inputs * np.asarray(factor) + same - same
  print(raw.nbytes)


def buffer_callbacks() -> None:
  x = jnp.arange(3, dtype=jnp.float32)
  shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
  f = hcb.buffer_callback(scale, shape, has_side_effect=False,
                          vmap_method="sequential", input_output_aliases=None,
                          command_buffer_compatible=False)
  y: jax.Array = jax.jit(f)(x, factor=jnp.float32(2))
  g = hcb.buffer_callback(scale, shape, has_side_effect=True,
                          input_output_aliases={0: 0})
  print(y, jax.vmap(lambda v: f(v, factor=jnp.float32(3)))(jnp.ones((2, 3))),
        g(x, factor=jnp.float32(1)))


def gpu_saxpy(cupy: Any) -> None:
  """docs/gpu.md: CuPy on XLA's stream (``cupy`` has no stubs: Any).
  Only type-checked here; tests/gpu runs it on a GPU."""

  def saxpy(ctx: hcb.ExecutionContext, out: hcb.Buffer, a: hcb.Buffer,
            x: hcb.Buffer, y: hcb.Buffer) -> None:
    stream: int = ctx.stream
    interface: dict[str, Any] = out.__cuda_array_interface__
    device: tuple[int, int] = out.__dlpack_device__()
    with cupy.cuda.ExternalStream(stream):
      r = cupy.asarray(out)
      cupy.multiply(cupy.asarray(a), cupy.asarray(x), out=r)
      r += cupy.asarray(y)
      print(interface["data"], device, cupy.from_dlpack(out))

  f = hcb.buffer_callback(saxpy, jax.ShapeDtypeStruct((4,), jnp.float32))
  print(f(jnp.float32(2), jnp.ones(4), jnp.ones(4)))


# ---- C users -----------------------------------------------------------------

def native_callbacks(library: str) -> None:
  """docs/api.md's C users example, docs/c_api.md's, and the docstrings'."""
  x = jnp.arange(3.)
  a = jnp.ones((3, 3))
  b = jnp.ones(3)
  lib = ctypes.CDLL(library)
  params = ctypes.c_double(0.5)   # what solve's ``void *user`` points at

  tap = hcb.native_tap("./libmine.so", "log_stats")     # an hcb_tap_fn
  tap = hcb.native_tap(library, "log_stats")
  tap = hcb.native_tap(pathlib.Path(library), "log_stats")
  tap = hcb.native_tap(lib.log_stats)                   # a ctypes function
  solve = hcb.native_call(lib.solve, user=ctypes.addressof(params))
  y = hcb.id_tap(tap, x)                                 # no GIL
  z = hcb.call(solve, (a, b), result_shape=b)            # XLA's buffers

  call = hcb.native_call(lib.solve, user=ctypes.addressof(params),
                         name="solve")
  step = jnp.int32(0)
  y = hcb.id_tap(tap, (x, step))
  z = hcb.call(call, (a, b),
               result_shape=jax.ShapeDtypeStruct(b.shape, b.dtype))

  # An address, a NULL or c_void_p user pointer.
  address = ctypes.cast(lib.solve, ctypes.c_void_p).value or 0
  by_address: hcb.NativeCallback = hcb.native_call(
      address, user=ctypes.c_void_p(ctypes.addressof(params)))
  tap_by_address: hcb.NativeTap = hcb.native_tap(
      ctypes.cast(lib.log_stats, ctypes.c_void_p).value or 0, user=None)

  # A native call as the callback of buffer_callback.
  fill = hcb.buffer_callback(
      hcb.native_call(lib.fill, user=ctypes.addressof(params)),
      jax.ShapeDtypeStruct((3,), jnp.float32))
  print(y, z, by_address, tap_by_address, fill)
  hcb.barrier_wait()


def build_flags() -> None:
  include: str = hcb.get_include()
  library: str = hcb.get_library()
  cmake_dir: str = hcb.get_cmake_dir()
  pkgconfig_dir: str = hcb.get_pkgconfig_dir()
  print(include, library, cmake_dir, pkgconfig_dir)
  # python -m host_callback --cflags --libs
  status: int = cli_main(["--cflags", "--libs"])
  print(status)


# ---- id_print ----------------------------------------------------------------

def power3(x: jax.Array) -> jax.Array:
  y = x * x
  hcb.id_print((x, y), what="x,x^2")   # printed on the host, asynchronously
  return y * x


def printing() -> None:
  jax.grad(power3)(3.)
  hcb.barrier_wait()
  # what: x,x^2
  # ( 3. 9. )

  x = jnp.arange(5.)
  stream = io.StringIO()
  y: jax.Array = hcb.id_print(x, result=x + 1, tap_with_device=True,
                              device_index=0, output_stream=stream,
                              threshold=3,
                              callback_flavor=hcb.CallbackFlavor.IO_CALLBACK,
                              what="x", step=1)
  hcb.id_print(x, output_stream=sys.stderr)
  hcb.id_print({"x": x, "y": [y, (y,)]})
  hcb.barrier_wait()
  print(stream.getvalue())


# ---- Progress bars -------------------------------------------------------------

def progress_bars() -> None:
  from host_callback.progress import PBar
  from host_callback.progress import scan_tqdm

  n = 10_000

  @scan_tqdm(n, desc="training")
  def step(carry: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    return carry + 1, carry + 1

  def run(i: jax.Array) -> jax.Array:
    final, _ = jax.lax.scan(step, PBar(id=i, carry=jnp.int32(0)),
                            jnp.arange(n))
    carry: jax.Array = final.carry
    return carry

  jax.vmap(run)(jnp.arange(4))
  hcb.barrier_wait()

  @hcb.progress.loop_tqdm(n)
  def body(i: jax.Array, val: jax.Array) -> jax.Array:
    return val + 1

  jax.lax.fori_loop(0, n, body, jnp.int32(0))
  solved: jax.Array = hcb.progress.while_loop(
      lambda v: v < 100, lambda v: v * 2, jnp.int32(1), total=None)
  print(solved)


if __name__ == "__main__":
  migrating()
  api_table()
  under_transformations()
  call_results()
  buffer_callbacks()
  build_flags()
  printing()
  progress_bars()
  if len(sys.argv) > 1:
    native_callbacks(sys.argv[1])

