"""Every JAX dtype through taps, calls, id_print and buffer_callback, values
compared bit for bit: the ml_dtypes types (bfloat16, every float8, and the
sub-byte int2, uint2, int4, uint4 and float4_e2m1fn, which XLA packs two or
four to a byte and numpy keeps one per byte), in the shapes where packing
shows (odd counts, 0-d, empty, several arrays in one record, a record large
enough to be viewed in place rather than copied)."""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import host_callback as hcb

# ml_dtypes' types that JAX runs on CPU (int1, uint1 and the float6 types
# exist in ml_dtypes but XLA:CPU rejects them, with or without callbacks).
ML_NAMES = ["bfloat16", "int2", "uint2", "int4", "uint4", "float4_e2m1fn",
            "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn",
            "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
            "float8_e8m0fnu"]
ML_DTYPES = [np.dtype(getattr(ml_dtypes, n)) for n in ML_NAMES
             if hasattr(ml_dtypes, n) and hasattr(jnp, n)]
SUB_BYTE = {"int2": 2, "uint2": 2, "int4": 4, "uint4": 4, "float4_e2m1fn": 4}


def bits(dtype: np.dtype) -> int:
  return SUB_BYTE.get(dtype.name, 8 * dtype.itemsize)


def every_value(dtype: np.dtype, extra: int = 1) -> np.ndarray:
  """Every bit pattern of the type (for 16-bit types a spread of them),
  plus `extra` more so that a sub-byte count is odd."""
  b = bits(dtype)
  if b <= 8:
    raw = np.arange(1 << b, dtype=np.uint8)
    raw = np.concatenate([raw, raw[1:1 + extra]])
    return raw.view(dtype)
  raw = np.arange(0, 1 << 16, 257, dtype=np.uint16)
  return raw[:len(raw) - 1 + extra].view(dtype)


def same_bits(got: np.ndarray, want: np.ndarray) -> None:
  assert got.dtype == want.dtype, (got.dtype, want.dtype)
  assert got.shape == want.shape, (got.shape, want.shape)
  g = np.ascontiguousarray(got).view(np.uint8)
  w = np.ascontiguousarray(want).view(np.uint8)
  np.testing.assert_array_equal(g, w)


def shapes_of(dtype: np.dtype) -> list[np.ndarray]:
  v = every_value(dtype)
  big = np.resize(every_value(dtype, 0), 3 * 4096 + 3)  # > COPY_MAX packed
  return [v, v[:1].reshape(()), v[:0], np.resize(v, (3, 5)),
          np.resize(v, (2, 3, 3)), big]


def ids(d: np.dtype) -> str:
  return d.name


@pytest.mark.parametrize("dtype", ML_DTYPES, ids=ids)
def test_tap_carries_every_value(collect, dtype):
  arrays = shapes_of(dtype)
  f = jax.jit(lambda a: hcb.id_tap(collect, a))
  for x in arrays:
    out = f(x)
    same_bits(np.asarray(out), x)  # the tap is the identity
  # several dtypes in one record: the arrays after a packed one stay apart
  mixed = (arrays[0], np.float32(1.5), arrays[3], np.arange(3, dtype=np.int8))
  f(mixed)
  hcb.barrier_wait()
  got = collect.args
  assert len(got) == len(arrays) + 1
  for g, x in zip(got, arrays):
    same_bits(g, x)
  for g, x in zip(got[-1], mixed):
    same_bits(g, np.asarray(x))


@pytest.mark.parametrize("dtype", ML_DTYPES, ids=ids)
def test_call_takes_and_returns_every_value(dtype):
  for x in shapes_of(dtype):
    seen = []

    def host(a):
      seen.append(a)
      return a[::-1] if a.ndim else a  # not contiguous: copied by numpy

    out = jax.jit(lambda a: hcb.call(host, a, result_shape=a))(x)
    same_bits(seen[0], x)
    same_bits(np.asarray(out), x[::-1] if x.ndim else x)
    # a contiguous result, and two results of different types
    out2 = jax.jit(lambda a: hcb.call(
        lambda v: (np.array(v, order="C"), np.int8(3)), a,
        result_shape=(a, jax.ShapeDtypeStruct((), np.int8))))(x)
    same_bits(np.asarray(out2[0]), x)
    assert int(out2[1]) == 3


@pytest.mark.parametrize("name", ["int2", "uint2", "int4", "uint4",
                                  "float4_e2m1fn"])
def test_call_python_scalar_result_of_sub_byte_type(name):
  dtype = np.dtype(getattr(ml_dtypes, name))
  value = 1.5 if name.startswith("float") else 1
  out = jax.jit(lambda: hcb.call(lambda _: value, 0,
                                 result_shape=jax.ShapeDtypeStruct((), dtype)))()
  same_bits(np.asarray(out), np.array(value, dtype))
  if not name.startswith("float"):  # a float does not fit an integer type
    with pytest.raises(Exception, match="returned"):
      jax.jit(lambda: hcb.call(
          lambda _: 1.5, 0,
          result_shape=jax.ShapeDtypeStruct((), dtype)))().block_until_ready()
    with pytest.raises(hcb.CallbackException):
      hcb.barrier_wait()


@pytest.mark.parametrize("dtype", ML_DTYPES, ids=ids)
def test_id_print_prints_as_numpy(dtype):
  arrays = shapes_of(dtype)
  for threshold in (None, 5):
    s = io.StringIO()
    f = jax.jit(lambda a: hcb.id_print(a, output_stream=s,
                                       threshold=threshold))
    for x in arrays:
      f(x)
    f({"a": arrays[0], "b": arrays[3]})
    hcb.barrier_wait()
    want = [np.array2string(x, threshold=threshold) for x in arrays]
    text = s.getvalue()
    for w in want:
      assert w + "\n" in text
    assert text.startswith("".join(w + "\n" for w in want))


@pytest.mark.parametrize("dtype", ML_DTYPES, ids=ids)
def test_buffer_callback_reads_and_writes_every_value(dtype):
  for x in shapes_of(dtype):
    def fill(ctx, out, a):
      v = np.asarray(a)
      same_bits(v, x)
      o = np.asarray(out)
      o[...] = v[::-1] if v.ndim else v

    out = jax.jit(hcb.buffer_callback(
        fill, jax.ShapeDtypeStruct(x.shape, x.dtype)))(x)
    same_bits(np.asarray(out), x[::-1] if x.ndim else x)


@pytest.mark.parametrize("name", ["int4", "uint4", "float4_e2m1fn"])
def test_sharded_jit_taps_and_calls_sub_byte_types(collect, name):
  """Under jit over sharded operands the arrays reach the runtime from
  numpy (python/_hcb/entry.c): packed on the way in, unpacked on the way
  out.  (XLA:CPU gathers the operand for device_index with an all-reduce,
  which does not support 2-bit types, "AllReduce for datatype 'u2' is not
  supported", and turns -0 into 0, with or without a callback.)"""
  dtype = np.dtype(getattr(ml_dtypes, name))
  mesh = Mesh(np.array(jax.devices()), ("d",))
  x_np = np.resize(every_value(dtype), (4, 5))
  if name == "float4_e2m1fn":  # XLA gathers with a sum: -0 becomes 0
    x_np[x_np.view(np.uint8) == 8] = 0
  x = jax.device_put(x_np, NamedSharding(mesh, P("d")))
  jax.jit(lambda v: hcb.id_tap(collect, v))(x)
  hcb.barrier_wait()
  same_bits(collect.args[0], x_np)
  out = jax.jit(lambda v: hcb.call(lambda a: a[::-1], v, result_shape=v))(x)
  same_bits(np.asarray(out), x_np[::-1])


@pytest.mark.parametrize("name", ["float16", "float32", "bfloat16",
                                  "float8_e8m0fnu"])
def test_id_print_prints_subnormals_as_numpy(name):
  """XLA's threads flush denormals to zero; the consumer thread they start
  must not inherit that, nor may the C printer depend on its caller's."""
  dtype = np.dtype(getattr(ml_dtypes, name, None) or name)
  if name == "float8_e8m0fnu":  # 2**-127 is a float32 subnormal
    tiny = np.array([0, 1, 127], np.uint8).view(dtype)
  elif name == "float16":
    tiny = np.array([6e-8, -1e-7, 1], dtype)
  else:
    tiny = np.array([1e-39, 1], dtype)
  s = io.StringIO()
  jax.jit(lambda a: hcb.id_print(a, output_stream=s))(tiny)
  hcb.barrier_wait()
  assert s.getvalue() == np.array2string(tiny) + "\n"


def test_tap_function_computes_with_subnormals(collect):
  def tap(x, transforms):
    collect(np.float32(1e-39) * np.float32(1), transforms)

  jax.jit(lambda a: hcb.id_tap(tap, a))(1.)
  hcb.barrier_wait()
  assert collect.args == [np.float32(1e-39)]
