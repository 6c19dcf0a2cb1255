"""examples/c_ffi: FFI handlers written in plain C with include/hcb/ffi.h,
built with CMake through the installed hcb package config, registered with
jax.ffi.register_ffi_target and called through jax.ffi.ffi_call."""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
sys.path.insert(0, os.path.join(REPO, "examples", "c_ffi"))
import example  # noqa: E402  (examples/c_ffi/example.py)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
  return example.load(example.build(str(tmp_path_factory.mktemp("c_ffi"))))


ATTRS = dict(flag=True, i8=np.int8(-8), i16=np.int16(-16), i32=np.int32(-32),
             i64=-64, u8=np.uint8(8), u16=np.uint16(16), u32=np.uint32(32),
             u64=np.uint64(2**40), f32=np.float32(0.5), f64=0.25,
             name="hello", weights=np.array([1.5, 2.5], np.float32),
             offsets=np.array([10, 20, 30], np.int64),
             config={"scale": 2.0, "label": "abc", "k": np.uint16(7)})


def test_attributes_of_every_kind(lib):
  values, text = jax.jit(lambda: example.attrs(**ATTRS))()
  np.testing.assert_array_equal(
      values, [1, -8, -16, -32, -64, 8, 16, 32, 2.0**40, 0.5, 0.25, 4.0, 2,
               60, 2.0, 7])
  assert bytes(np.asarray(text)).rstrip(b"\0") == b"hello|abc"


@pytest.mark.parametrize("change, message", [
    (dict(i32=5), "attribute 'i32' is an int64 scalar, expected an int32 "
                  "scalar"),
    (dict(name=1.0), "attribute 'name' is a float64 scalar, expected a "
                     "string"),
    (dict(weights=np.array([1, 2], np.int32)),
     "attribute 'weights' is an int32 array, expected a float32 array"),
    (dict(config={"scale": 2.0, "label": "abc"}),
     "missing attribute 'k'"),
])
def test_attribute_errors_say_what_came_and_what_was_expected(lib, change,
                                                              message):
  with pytest.raises(jax.errors.JaxRuntimeError,
                     match=f"hcb_example_attrs: {message}"):
    jax.block_until_ready(jax.jit(lambda: example.attrs(**{**ATTRS,
                                                           **change}))())


def test_several_results(lib):
  x = np.random.default_rng(0).normal(size=100).astype(np.float32)
  mean, lo, hi, arg = jax.jit(example.stats)(x)
  assert (mean.dtype, arg.dtype) == (np.float32, np.int32)
  np.testing.assert_allclose(mean, x.mean(), rtol=1e-5)
  assert (float(lo), float(hi), int(arg)) == (x.min(), x.max(), x.argmax())
  with pytest.raises(jax.errors.JaxRuntimeError,
                     match="operand 0 has dtype int32, expected float32"):
    jax.block_until_ready(jax.jit(example.stats)(np.arange(3, dtype=np.int32)))


def test_column_major_layouts(lib):
  x = jnp.arange(6, dtype=jnp.float32).reshape(2, 3)
  row_major = jax.jit(lambda v: example.raw_copy(v, (6,)))(x)
  np.testing.assert_array_equal(row_major, np.ravel(x))
  # The handler sees the memory of a column-major operand ...
  col_major = jax.jit(lambda v: example.raw_copy(
      v, (6,), input_layouts=[(1, 0)]))(x)
  np.testing.assert_array_equal(col_major, np.ravel(np.asarray(x).T))
  # ... and writes a column-major result, which JAX presents as usual.
  flat = jnp.arange(6, dtype=jnp.float32)
  out = jax.jit(lambda v: example.raw_copy(
      v, (2, 3), output_layouts=(1, 0)))(flat)
  np.testing.assert_array_equal(out, np.arange(6).reshape(3, 2).T)


def test_input_output_aliases_work_in_place(lib):
  before = lib.hcb_example_in_place_calls()
  x = jnp.arange(4, dtype=jnp.float32)
  out = jax.jit(lambda v: example.scale_in_place(v + 1, 3.0))(x)
  np.testing.assert_array_equal(out, [3, 6, 9, 12])
  assert lib.hcb_example_in_place_calls() == before + 1


@pytest.mark.parametrize("has_side_effect", [True, False])
def test_has_side_effect_keeps_a_call_whose_result_is_unused(
    lib, has_side_effect):
  before = lib.hcb_example_count_get()

  def f(x):
    example.count(x, has_side_effect=has_side_effect)  # result unused
    return x + 1

  jax.block_until_ready(jax.jit(f)(jnp.ones(3)))
  ran = lib.hcb_example_count_get() - before
  assert ran == (1 if has_side_effect else 0)


@pytest.mark.parametrize("method, calls, batches", [
    ("sequential", 5, 1 * 1000 + 1),    # once per element, unbatched
    ("expand_dims", 1, 5 * 1000 + 1),   # once; unbatched y gets a 1
    ("broadcast_all", 1, 5 * 1000 + 5),  # once; y broadcast to the batch
])
def test_vmap_methods(lib, method, calls, batches):
  xs = jnp.arange(15, dtype=jnp.float32).reshape(5, 3)
  y = jnp.array([100.0, 200.0, 300.0], jnp.float32)
  before = lib.hcb_example_add_calls()
  out = jax.jit(jax.vmap(lambda x: example.add(x, y, vmap_method=method)))(xs)
  np.testing.assert_array_equal(out, np.asarray(xs) + np.asarray(y))
  assert lib.hcb_example_add_calls() - before == calls
  lib.hcb_example_add_last_batches.restype = np.ctypeslib.ctypes.c_long
  assert lib.hcb_example_add_last_batches() == batches


def test_legacy_custom_call(lib):
  x = jnp.array([1.0, -2.0, 3.0, 0.5], jnp.float32)
  np.testing.assert_array_equal(
      jax.jit(lambda v: example.legacy_scale(v, 2.5))(x), np.asarray(x) * 2.5)


def test_handler_error_surfaces_in_python_and_nothing_breaks(lib):
  with pytest.raises(jax.errors.JaxRuntimeError,
                     match="INVALID_ARGUMENT: hcb_example_fail: refused: "
                           "the moon is full"):
    jax.block_until_ready(jax.jit(lambda: example.fail("the moon is full"))())
  mean, *_ = jax.jit(example.stats)(jnp.ones(4))
  assert float(mean) == 1.0
