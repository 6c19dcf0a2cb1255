"""The C pieces of the harness: bench/native/bench_native.c, built against
the installed host_callback into a temporary directory, its FFI handlers
registered with XLA, its native tap and call wrapped for host_callback."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from typing import Any

import jax
import numpy as np

import host_callback as hcb

from hcb_bench.harness import BENCH_DIR

NATIVE_SOURCE = os.path.join(BENCH_DIR, "native", "bench_native.c")


class Native:
  """bench_native.c, compiled against the installed package and loaded;
  its FFI handlers registered with XLA."""

  def __init__(self, build_dir: str):
    flags = subprocess.run(
        [sys.executable, "-m", "host_callback", "--cflags", "--libs"],
        capture_output=True, text=True, check=True).stdout.split()
    path = os.path.join(build_dir, "libhcb_bench.so")
    cmd = [os.environ.get("CC", "cc"), "-O2", "-std=c11", "-shared", "-fPIC",
           "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror",
           NATIVE_SOURCE, *flags, "-o", path]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
      raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout}"
                         f"{done.stderr}")
    self.lib = ctypes.CDLL(path)
    for name in ("hcb_bench_empty", "hcb_bench_copy", "hcb_bench_copy_attr",
                 "hcb_bench_copy_attr_ordinal"):
      jax.ffi.register_ffi_target(
          name, jax.ffi.pycapsule(getattr(self.lib, name)), platform="cpu")
    self.lib.hcb_bench_tap_count.restype = ctypes.c_ulonglong
    for name in ("hcb_bench_memcpy_seconds", "hcb_bench_fresh_memcpy_seconds"):
      getattr(self.lib, name).restype = ctypes.c_double
    self.lib.hcb_bench_memcpy_seconds.argtypes = (
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)
    self.lib.hcb_bench_fresh_memcpy_seconds.argtypes = (
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)
    self.tap = hcb.native_tap(self.lib.hcb_bench_noop_tap)
    self.call = hcb.native_call(self.lib.hcb_bench_copy_call)

  def taps_received(self) -> int:
    """Records the native tap has received since the library was loaded."""
    return int(self.lib.hcb_bench_tap_count())

  @staticmethod
  def empty(x: jax.Array) -> jax.Array:
    """The empty FFI handler, shaped like a tap: one operand, the result
    aliased to it, a side effect (so it is never removed)."""
    return jax.ffi.ffi_call(
        "hcb_bench_empty", jax.ShapeDtypeStruct(x.shape, x.dtype),
        has_side_effect=True, input_output_aliases={0: 0})(x)

  @staticmethod
  def copy(x: jax.Array, target: str = "hcb_bench_copy",
           **attributes: Any) -> jax.Array:
    """A copying FFI handler, shaped like a native call: one operand, one
    result of the same shape (not aliased), a side effect."""
    return jax.ffi.ffi_call(
        target, jax.ShapeDtypeStruct(x.shape, x.dtype),
        has_side_effect=True)(x, **attributes)

  @classmethod
  def copy_attr(cls, x: jax.Array) -> jax.Array:
    """The copying handler that also reads a u64 attribute by name."""
    return cls.copy(x, "hcb_bench_copy_attr", callback_id=np.uint64(1))

  @classmethod
  def copy_attr_ordinal(cls, x: jax.Array) -> jax.Array:
    """The copying handler that also reads the attribute and the device
    ordinal, as hcb_call does."""
    return cls.copy(x, "hcb_bench_copy_attr_ordinal",
                    callback_id=np.uint64(1))

