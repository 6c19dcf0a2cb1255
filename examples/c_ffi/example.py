"""XLA FFI handlers written in plain C with the hcb SDK, called from JAX.

Run ``python examples/c_ffi/example.py``: it builds handlers.c with CMake
(through the hcb package config installed with host_callback), registers
the handlers with XLA, and calls each through ``jax.ffi.ffi_call``.  The
tests (tests/python/test_c_ffi.py) use the same functions.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import tempfile
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import host_callback

HERE = os.path.dirname(os.path.abspath(__file__))

TYPED_TARGETS = ("attrs", "stats", "raw_copy", "scale_in_place", "count",
                 "add", "fail", "empty")


def build(build_dir: str) -> str:
  """Configures and builds the example library; returns its path."""
  for cmd in (["cmake", "-S", HERE, "-B", build_dir, "-G", "Ninja",
               f"-Dhcb_DIR={host_callback.get_cmake_dir()}",
               "-DCMAKE_BUILD_TYPE=Release"],
              ["cmake", "--build", build_dir]):
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
      raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout}"
                         f"{done.stderr}")
  return os.path.join(build_dir, "libhcb_example.so")


_loaded: ctypes.CDLL | None = None


def load(path: str) -> ctypes.CDLL:
  """Loads the library and registers its handlers for the CPU platform
  (once per process): the typed ones as ``hcb_example_<name>``, the legacy
  one with ``api_version=0``."""
  global _loaded
  if _loaded is not None:
    return _loaded
  lib = ctypes.CDLL(path)
  for name in TYPED_TARGETS:
    symbol = f"hcb_example_{name}"
    jax.ffi.register_ffi_target(symbol, jax.ffi.pycapsule(getattr(lib, symbol)),
                                platform="cpu")
  jax.ffi.register_ffi_target(
      "hcb_example_legacy_scale",
      jax.ffi.pycapsule(lib.hcb_example_legacy_scale), platform="cpu",
      api_version=0)
  _loaded = lib
  return lib


# ---- one wrapper per handler --------------------------------------------------

def attrs(**attributes: Any) -> tuple[jax.Array, jax.Array]:
  """Every kind of attribute in, their values out (f32[16], u8[32])."""
  return jax.ffi.ffi_call(
      "hcb_example_attrs",
      (jax.ShapeDtypeStruct((16,), np.float32),
       jax.ShapeDtypeStruct((32,), np.uint8)))(**attributes)


def stats(x: jax.Array) -> tuple[jax.Array, ...]:
  """Several results of several dtypes: mean, min, max, argmax."""
  f32 = jax.ShapeDtypeStruct((), np.float32)
  return jax.ffi.ffi_call(
      "hcb_example_stats",
      (f32, f32, f32, jax.ShapeDtypeStruct((), np.int32)))(x)


def raw_copy(x: jax.Array, shape: Sequence[int], *,
             input_layouts: Any = None, output_layouts: Any = None
             ) -> jax.Array:
  """The operand's memory as XLA hands it, into a result of ``shape``."""
  return jax.ffi.ffi_call(
      "hcb_example_raw_copy", jax.ShapeDtypeStruct(tuple(shape), x.dtype),
      input_layouts=input_layouts, output_layouts=output_layouts)(x)


def scale_in_place(x: jax.Array, factor: float) -> jax.Array:
  """``x * factor`` written into the operand's own buffer."""
  return jax.ffi.ffi_call(
      "hcb_example_scale_in_place", jax.ShapeDtypeStruct(x.shape, x.dtype),
      input_output_aliases={0: 0})(x, factor=np.float32(factor))


def count(x: jax.Array, *, has_side_effect: bool) -> jax.Array:
  """How many times the handler has run (a side effect)."""
  return jax.ffi.ffi_call(
      "hcb_example_count", jax.ShapeDtypeStruct((), np.int32),
      has_side_effect=has_side_effect)(x)


def add(x: jax.Array, y: jax.Array, *, vmap_method: str) -> jax.Array:
  """``x + y``, vectorised under vmap as ``vmap_method`` says."""
  return jax.ffi.ffi_call(
      "hcb_example_add", jax.ShapeDtypeStruct(x.shape, x.dtype),
      vmap_method=vmap_method)(x, y)


def fail(reason: str) -> jax.Array:
  """Always fails, with a message naming ``reason``."""
  return jax.ffi.ffi_call("hcb_example_fail",
                          jax.ShapeDtypeStruct((), np.int32))(reason=reason)


def empty(x: jax.Array) -> jax.Array:
  """Does nothing (its result aliases ``x``)."""
  return jax.ffi.ffi_call("hcb_example_empty",
                          jax.ShapeDtypeStruct(x.shape, x.dtype),
                          input_output_aliases={0: 0})(x)


def legacy_scale(x: jax.Array, factor: float) -> jax.Array:
  """A custom call of the untyped API (version 3), configured by the opaque
  ``legacy_backend_config`` string."""
  return jax.ffi.ffi_call(
      "hcb_example_legacy_scale", jax.ShapeDtypeStruct((4,), np.float32),
      custom_call_api_version=3, legacy_backend_config=repr(float(factor)))(x)


def main() -> None:
  with tempfile.TemporaryDirectory() as tmp:
    load(build(os.path.join(tmp, "build")))
  x = jnp.array([3.0, -1.0, 4.0, 1.5], jnp.float32)
  print("stats", [float(v) for v in jax.jit(stats)(x)])
  print("scale_in_place", jax.jit(lambda v: scale_in_place(v, 2.0))(x))
  print("legacy_scale", jax.jit(lambda v: legacy_scale(v, 0.5))(x))
  print("vmap add", jax.vmap(lambda a: add(a, x, vmap_method="expand_dims"))(
      jnp.stack([x, x])))
  values, text = attrs(flag=True, i8=np.int8(-8), i16=np.int16(-16),
                       i32=np.int32(-32), i64=-64, u8=np.uint8(8),
                       u16=np.uint16(16), u32=np.uint32(32),
                       u64=np.uint64(64), f32=np.float32(0.5), f64=0.25,
                       name="hello",
                       weights=np.array([1, 2], np.float32),
                       offsets=np.array([10, 20, 30], np.int64),
                       config={"scale": 2.0, "label": "abc", "k": 7})
  print("attrs", np.asarray(values).tolist(),
        bytes(np.asarray(text)).rstrip(b"\0").decode())
  try:
    jax.jit(lambda: fail("no reason"))().block_until_ready()
  except jax.errors.JaxRuntimeError as e:
    print("fail ->", str(e).splitlines()[0])


if __name__ == "__main__":
  sys.exit(main())
