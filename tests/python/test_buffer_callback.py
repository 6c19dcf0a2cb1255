"""buffer_callback against real JAX: in-place results, Buffer (buffer
protocol, __array__, DLPack), zero copy, use after the callback,
ExecutionContext, the validation and autodiff errors of
jax.experimental.buffer_callback, vmap, side effects, and native C callbacks
compiled here."""

from __future__ import annotations

import pathlib
import subprocess
import ctypes

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import host_callback as hcb
from host_callback import _hcb as hcb_c

from conftest import run_python

F32_3 = jax.ShapeDtypeStruct((3,), np.float32)
REPO = pathlib.Path(__file__).resolve().parents[2]


def test_jax_docs_add_one_example_eager_and_jit():
  def py_add_one_inplace(ctx, out, x):
    np.asarray(out)[...] = np.asarray(x) + 1

  x = jnp.array(41, dtype=jnp.int32)
  add_one = hcb.buffer_callback(py_add_one_inplace,
                                jax.ShapeDtypeStruct(x.shape, x.dtype))
  assert int(add_one(x)) == 42
  assert int(jax.jit(add_one)(x)) == 42


def test_pytrees_and_keyword_arguments():
  def cb(ctx, out, pair, *, scale):
    a, b = pair
    np.asarray(out["sum"])[...] = (np.asarray(a) + np.asarray(b)) * np.asarray(scale)
    np.asarray(out["n"])[...] = a.shape[0]

  shapes = {"sum": F32_3, "n": jax.ShapeDtypeStruct((), np.int32)}
  f = jax.jit(hcb.buffer_callback(cb, shapes))
  out = f((jnp.ones(3), jnp.arange(3.)), scale=jnp.float32(2))
  np.testing.assert_array_equal(out["sum"], [2., 4., 6.])
  assert int(out["n"]) == 3


def _structure(tree):
  """A pytree with each Buffer as ``B(shape)``: what the callback saw."""
  return jax.tree_util.tree_map(lambda b: f"B{b.shape}", tree)


@pytest.mark.parametrize("results", [
    "one", "list of one", "tuple of one", "none", "dict"])
@pytest.mark.parametrize("operands", [
    "positional", "none", "keyword", "nested", "one and keyword"])
def test_the_callback_gets_the_structures_jaxs_gets(operands, results):
  """Positional operands and one result reach the function without being
  unflattened (a shortcut); every other structure as JAX's buffer_callback
  passes it."""
  from jax.experimental import buffer_callback as jax_buffer_callback

  shapes = {"one": F32_3, "list of one": [F32_3], "tuple of one": (F32_3,),
            "none": (), "dict": {"b": F32_3, "a": F32_3}}[results]
  x, y = jnp.ones(3), jnp.arange(2.0)
  args, kwargs = {"positional": ((x, y), {}), "none": ((), {}),
                  "keyword": ((), {"y": y, "x": x}),
                  "nested": (((x, [y]),), {}),
                  "one and keyword": ((x,), {"y": y})}[operands]

  def run(buffer_callback):
    seen = []

    def cb(ctx, out, *a, **k):
      seen.append(_structure((out, a, k)))
      for leaf in jax.tree_util.tree_leaves(out):
        np.asarray(leaf)[...] = 1

    # (without results, only a side effect keeps a callback in the program)
    f = jax.jit(lambda a, k: buffer_callback(
        cb, shapes, has_side_effect=results == "none")(*a, **k))
    got = f(args, kwargs)
    return seen, jax.tree_util.tree_map(np.asarray, got)

  (seen_jax, got_jax), (seen, got) = (
      run(jax_buffer_callback.buffer_callback), run(hcb.buffer_callback))
  assert seen == seen_jax and len(seen) == 1
  assert jax.tree_util.tree_structure(got) == (
      jax.tree_util.tree_structure(got_jax))
  for a, b in zip(jax.tree_util.tree_leaves(got),
                  jax.tree_util.tree_leaves(got_jax)):
    np.testing.assert_array_equal(a, b)


def test_buffer_objects():
  seen = {}

  def cb(ctx, out, x, h):
    seen["types"] = (type(out), type(x))
    seen["meta"] = (out.shape, out.dtype, x.shape, x.dtype)
    view = memoryview(x)
    seen["memoryview"] = (view.format, view.shape, view.readonly)
    with pytest.raises(ValueError):  # inputs are read-only
      np.asarray(x)[...] = 0
    seen["dlpack_device"] = out.__dlpack_device__()
    with pytest.raises(AttributeError, match="host"):
      out.__cuda_array_interface__
    seen["half"] = np.asarray(h).tolist()  # bfloat16 through __array__
    np.asarray(out)[...] = np.from_dlpack(x) * 2

  f = jax.jit(hcb.buffer_callback(cb, jax.ShapeDtypeStruct((2, 3), np.float32)))
  x = jnp.arange(6, dtype=jnp.float32).reshape(2, 3)
  out = f(x, jnp.array([1.5, -2], jnp.bfloat16))
  np.testing.assert_array_equal(out, np.asarray(x) * 2)
  assert seen["types"] == (hcb.Buffer, hcb.Buffer)
  assert seen["meta"] == ((2, 3), np.float32, (2, 3), np.float32)
  assert seen["memoryview"] == ("f", (2, 3), True)
  assert seen["dlpack_device"] == (1, 0)
  assert seen["half"] == [1.5, -2.0]


def test_zero_copy_views_and_in_place_aliasing():
  addresses = {}

  def cb(ctx, out, x):
    o, i = np.asarray(out), np.asarray(x)
    addresses["out"] = o.ctypes.data
    addresses["out_dlpack"] = np.from_dlpack(out).ctypes.data
    addresses["out_again"] = np.asarray(out).ctypes.data
    addresses["in"] = i.ctypes.data
    o *= 10  # in place: the aliased input's memory is the output's

  f = jax.jit(hcb.buffer_callback(cb, F32_3, input_output_aliases={0: 0}),
              donate_argnums=0)
  out = f(jnp.arange(3, dtype=jnp.float32))
  np.testing.assert_array_equal(out, [0., 10., 20.])
  assert addresses["out"] == addresses["out_dlpack"] == addresses["out_again"]
  assert addresses["out"] == addresses["in"]  # one buffer, no copy


def _dlpack_views(buffer_callback):
  seen = {}

  def cb(ctx, out, x):
    o, i = np.from_dlpack(out), np.from_dlpack(x)
    seen["writable"] = (o.flags.writeable, i.flags.writeable)
    seen["capsule"] = type(out).__name__, (
        "dltensor_versioned" in repr(out.__dlpack__(max_version=(1, 0))))
    o[...] = i * 3  # code written for JAX's buffer_callback

  out = jax.jit(buffer_callback(cb, F32_3))(jnp.ones(3))
  np.testing.assert_array_equal(out, [3., 3., 3.])
  return seen


def test_from_dlpack_of_an_output_is_writable_as_with_jax():
  from jax.experimental import buffer_callback as jax_buffer_callback
  jax_seen = _dlpack_views(jax_buffer_callback.buffer_callback)
  seen = _dlpack_views(hcb.buffer_callback)
  assert seen["writable"] == jax_seen["writable"] == (True, False)
  assert seen["capsule"] == ("Buffer", True)


def test_a_256MB_output_costs_no_copy():
  proc = run_python("""
      import resource, jax, jax.numpy as jnp, numpy as np
      import host_callback as hcb
      n = 64 * 1024 * 1024  # float32: 256 MB
      def fill(ctx, out):
        np.asarray(out).fill(1.0)
      f = jax.jit(hcb.buffer_callback(fill, jax.ShapeDtypeStruct((n,), np.float32)))
      f.lower().compile()
      before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
      out = f()
      out.block_until_ready()
      after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
      assert float(out[-1]) == 1.0
      print((after - before) // 1024)  # MB
  """)
  assert proc.returncode == 0, proc.stderr
  grown_mb = int(proc.stdout.strip())
  assert grown_mb < 400, grown_mb  # one 256 MB buffer, not two


def test_a_buffer_kept_after_the_callback_raises_on_use():
  kept = []

  def cb(ctx, out, x):
    kept.extend([out, x])
    np.asarray(out)[...] = 1

  jax.jit(hcb.buffer_callback(cb, F32_3))(jnp.ones(3))
  out, x = kept
  for use in (np.asarray, memoryview, lambda b: b.__dlpack__(),
              np.from_dlpack):
    with pytest.raises(RuntimeError, match="buffer_callback that has returned"):
      use(out)
  assert out.shape == (3,) and "released" in repr(x)


def test_execution_context():
  seen = []

  def cb(ctx, out, x):
    seen.append((ctx.stage, ctx.device))
    np.asarray(out)[...] = np.asarray(x)

  f = jax.jit(hcb.buffer_callback(cb, F32_3))
  f(jax.device_put(jnp.ones(3), jax.devices()[2]))
  assert seen == [(hcb.ExecutionStage.EXECUTE, jax.devices()[2])]


def _stream_error(buffer_callback):
  errors = []

  def cb(ctx, out, x):
    try:
      ctx.stream
    except BaseException as e:  # pylint: disable=broad-except
      errors.append(e)

  jax.jit(buffer_callback(cb, F32_3))(jnp.ones(3))
  return errors[0]


def test_stream_on_cpu_raises_as_jax_does():
  from jax.experimental import buffer_callback as jax_buffer_callback
  jax_error = _stream_error(jax_buffer_callback.buffer_callback)
  error = _stream_error(hcb.buffer_callback)
  assert type(error) is type(jax_error) is jax.errors.JaxRuntimeError
  assert str(jax_error) == "UNIMPLEMENTED: XLA FFI GPU context is not available"
  assert str(error).startswith(str(jax_error))


# What a GPU Buffer shows Python needs no CUDA call: Buffer._test_view
# labels host memory with a CUDA device key so that it is checked here.
CUDA_1 = (hcb_c.PLATFORM_CUDA << 32) | 1


def test_gpu_buffer_cuda_array_interface():
  a = np.arange(6, dtype=np.float32).reshape(2, 3)
  out = hcb_c.Buffer._test_view(a, CUDA_1, True)
  x = hcb_c.Buffer._test_view(a, CUDA_1, False)
  # Outside a GPU call no XLA stream is computing the data: "stream" None
  # (inside one it is XLA's stream, which a consumer synchronises with).
  assert out.__cuda_array_interface__ == {
      "shape": (2, 3), "typestr": "<f4", "data": (a.ctypes.data, False),
      "strides": None, "stream": None, "version": 3}
  assert x.__cuda_array_interface__["data"] == (a.ctypes.data, True)
  empty = hcb_c.Buffer._test_view(np.zeros((0, 2), ml_dtypes.bfloat16),
                                  CUDA_1, True)
  assert empty.__cuda_array_interface__["data"] == (0, False)
  assert empty.__cuda_array_interface__["typestr"] == "<V2"
  assert repr(x) == "Buffer(shape=(2, 3), dtype=float32, device=cuda:1, read-only)"


def test_gpu_buffer_dlpack_is_kdlcuda_on_its_ordinal():
  out = hcb_c.Buffer._test_view(np.ones(3, np.float32), CUDA_1, True)
  assert out.__dlpack_device__() == (2, 1)
  assert type(out.__dlpack__(max_version=(1, 0))).__name__ == "PyCapsule"
  with pytest.raises(BufferError, match=r"dl_device=\(1, 0\).*on \(2, 1\)"):
    out.__dlpack__(dl_device=(1, 0))


@pytest.mark.parametrize("stream", [None, 1, 2, 0x7F00_1234, -1])
def test_gpu_buffer_dlpack_takes_every_consumer_stream_of_the_standard(stream):
  # A consumer names its stream: None (the standard's default) or 1 for
  # CUDA's legacy default stream, 2 for the per-thread one, a cudaStream_t,
  # or -1 for "I order it myself".  CuPy and torch pass 1 for their
  # default stream.  Each is accepted (during a GPU call it is made to wait
  # for XLA's stream; outside one there is nothing to wait for).
  out = hcb_c.Buffer._test_view(np.ones(3, np.float32), CUDA_1, True)
  assert type(out.__dlpack__(stream=stream)).__name__ == "PyCapsule"


@pytest.mark.parametrize("stream, error, message", [
    (0, BufferError, r"stream=0\): 0 is not a CUDA stream under DLPack"),
    (-2, BufferError, r"stream=-2\): a CUDA stream is -1, 1, 2 or"),
    ("s", TypeError, "stream must be None or an int, got 's'"),
])
def test_gpu_buffer_dlpack_refuses_what_the_standard_does_not_allow(
    stream, error, message):
  out = hcb_c.Buffer._test_view(np.ones(3, np.float32), CUDA_1, True)
  with pytest.raises(error, match=message):
    out.__dlpack__(stream=stream)


def test_dlpack_arguments_also_by_position_as_jax_takes_them():
  for device in (0, CUDA_1):
    out = hcb_c.Buffer._test_view(np.ones(3, np.float32), device, True)
    capsule = out.__dlpack__(None, (1, 0))
    assert "dltensor_versioned" in repr(capsule)


def test_dlpack_refuses_arguments_it_does_not_take_as_python_does():
  out = hcb_c.Buffer._test_view(np.ones(3, np.float32), 0, True)
  # every argument by name, and in its place
  assert "dltensor_versioned" in repr(out.__dlpack__(
      stream=None, max_version=(1, 0), dl_device=(1, 0), copy=False))
  assert "dltensor_versioned" in repr(out.__dlpack__(None, (1, 0), (1, 0),
                                                     False))
  with pytest.raises(TypeError, match="'max_versions' is an invalid keyword"):
    out.__dlpack__(max_versions=(1, 0))
  with pytest.raises(TypeError, match=r"given by name \('stream'\) and "
                     r"position \(1\)"):
    out.__dlpack__(None, stream=None)
  with pytest.raises(TypeError, match="takes at most 4 arguments"):
    out.__dlpack__(None, None, None, None, None)
  for device in ((1,), (1, "0"), [1, 0], (1, 2**40)):
    with pytest.raises(TypeError, match="dl_device must be None or a"):
      out.__dlpack__(dl_device=device)


def test_a_copy_argument_without_a_truth_value_raises_its_own_error():
  # copy= is read as a bool; one whose bool() raises gives that error, not
  # a SystemError about an exception left set.
  class NoTruth:
    def __bool__(self):
      raise ValueError("no truth value here")

  for device in (0, CUDA_1):
    out = hcb_c.Buffer._test_view(np.ones(3, np.float32), device, True)
    with pytest.raises(ValueError, match="no truth value here"):
      out.__dlpack__(copy=NoTruth())
  out = hcb_c.Buffer._test_view(np.ones(3, np.float32), 0, True)
  with pytest.raises(ValueError, match="no truth value here"):
    out.__array__(copy=NoTruth())


def _jax_and_our_buffers(program):
  """What ``program(buffer_callback)`` saw of its Buffers and context, with
  JAX's buffer_callback and with ours: {name: (shape, dtype, ndim,
  writeable, DLPack device)} and the context's stage name."""
  from jax.experimental import buffer_callback as jax_buffer_callback

  def run(buffer_callback):
    seen = {}

    def cb(ctx, out, x, y):
      for name, b in (("out", out), ("x", x), ("y", y)):
        seen[name] = (b.shape, np.dtype(b.dtype), b.ndim, b.writeable,
                      b.__dlpack_device__())
      seen["stage"] = ctx.stage.name
      np.asarray(out)[...] = np.asarray(x).sum()

    program(buffer_callback, cb)
    return seen

  return run(jax_buffer_callback.buffer_callback), run(hcb.buffer_callback)


def test_buffers_and_context_show_what_jax_s_show():
  def program(buffer_callback, cb):
    f = buffer_callback(cb, jax.ShapeDtypeStruct((2, 3), np.float32))
    device = jax.devices()[1]  # its id shows in the DLPack device
    jax.jit(f)(jax.device_put(jnp.ones((4, 5, 6), jnp.int16), device),
               jax.device_put(jnp.float32(1.5), device))

  theirs, ours = _jax_and_our_buffers(program)
  assert ours == theirs
  assert ours["out"] == ((2, 3), np.dtype(np.float32), 2, True, (1, 1))
  assert ours["x"] == ((4, 5, 6), np.dtype(np.int16), 3, False, (1, 1))
  assert ours["y"] == ((), np.dtype(np.float32), 0, False, (1, 1))


def test_every_attribute_of_jax_s_buffer_and_context_is_here():
  from jax.experimental import buffer_callback as jax_buffer_callback

  def public(cls):
    protocol = {"__array__", "__cuda_array_interface__", "__dlpack__",
                "__dlpack_device__"}
    return {a for a in dir(cls) if not a.startswith("_") or a in protocol}

  for theirs, ours in ((jax_buffer_callback.Buffer, hcb.Buffer),
                       (jax_buffer_callback.ExecutionContext,
                        hcb.ExecutionContext)):
    assert public(theirs) <= public(ours), public(theirs) - public(ours)
  assert ({s.name for s in jax_buffer_callback.ExecutionStage}
          == {s.name for s in hcb.ExecutionStage})
  # and they read and compare alike
  for theirs in jax_buffer_callback.ExecutionStage:
    ours = hcb.ExecutionStage[theirs.name]
    assert (str(ours), repr(ours), ours.value) == (
        str(theirs), repr(theirs), theirs.value)
    assert (ours == theirs.value) == (theirs == theirs.value)


def test_gpu_buffer_refuses_host_access_and_says_what_to_use():
  out = hcb_c.Buffer._test_view(np.ones(3, np.float32), CUDA_1, True)
  for use, error in ((np.asarray, TypeError), (memoryview, BufferError),
                     (lambda b: b.__array__(), TypeError)):
    with pytest.raises(error, match=r"in GPU memory \(CUDA device 1\).*"
                                    r"cupy\.asarray.*ctx\.stream"):
      use(out)


def test_gpu_buffer_refuses_sub_byte_types():
  with pytest.raises(TypeError, match="int4 arrays are packed .* GPU memory"):
    hcb_c.Buffer._test_view(np.zeros(4, ml_dtypes.int4), CUDA_1, True)


def test_cpu_buffer_is_kdlcpu_and_has_no_cuda_array_interface():
  out = hcb_c.Buffer._test_view(np.ones(3, np.float32), 0, True)
  assert out.__dlpack_device__() == (1, 0)
  assert not hasattr(out, "__cuda_array_interface__")
  assert type(out.__dlpack__(dl_device=(1, 0))).__name__ == "PyCapsule"
  with pytest.raises(BufferError, match="another device"):
    out.__dlpack__(dl_device=(2, 0))


@pytest.mark.parametrize("aliases, message", [
    ({2: 0}, "input_output_aliases contains the mapping '2:0' with input "
             "index 2 outside the range [0, 1)."),
    ({0: 1}, "input_output_aliases contains the mapping '0:1' with output "
             "index 1 outside the range [0, 1)."),
    ({0: 0}, "input_output_aliases contains the mapping '0:0' referring to "
             "an input with abstract value int32[3] and an output with a "
             "different abstract value float32[3]."),
])
def test_validation_errors_match_jax(aliases, message):
  f = hcb.buffer_callback(lambda ctx, out, x: None, F32_3,
                          input_output_aliases=aliases)
  with pytest.raises(ValueError) as info:
    f(jnp.ones(3, jnp.int32))
  assert str(info.value) == message


def test_autodiff_errors_match_jax():
  f = hcb.buffer_callback(lambda ctx, out, x: None, F32_3)
  with pytest.raises(ValueError, match="Buffer callbacks do not support JVP. "
                                       "Please use `jax.custom_jvp`"):
    jax.grad(lambda x: f(x).sum())(jnp.ones(3))
  with pytest.raises(ValueError, match="Buffer callbacks do not support "
                                       "transpose. Please use `jax.custom_vjp`"):
    jax.linear_transpose(f, jnp.ones(3))(jnp.ones(3))


@pytest.mark.parametrize("method", [None, "sequential", "expand_dims",
                                    "broadcast_all"])
def test_vmap(method):
  shapes = []

  def cb(ctx, out, x, y):
    shapes.append((x.shape, y.shape))
    np.asarray(out)[...] = np.asarray(x) + np.asarray(y)

  f = hcb.buffer_callback(cb, jax.ShapeDtypeStruct((2,), np.float32),
                          vmap_method=method)
  xs = jnp.arange(6, dtype=jnp.float32).reshape(3, 2)
  y = jnp.ones(2)
  g = jax.jit(jax.vmap(f, in_axes=(0, None)))
  if method is None:
    with pytest.raises(NotImplementedError, match="vmap_method"):
      g(xs, y)
    return
  np.testing.assert_array_equal(g(xs, y), np.asarray(xs) + 1)
  assert shapes == {"sequential": [((2,), (2,))] * 3,
                    "expand_dims": [((3, 2), (1, 2))],
                    "broadcast_all": [((3, 2), (3, 2))]}[method]


def test_side_effects_keep_unused_calls():
  calls = []

  def cb(ctx, out, x):
    calls.append(1)
    np.asarray(out)[...] = 0

  for effect in (False, True):
    f = hcb.buffer_callback(cb, F32_3, has_side_effect=effect)
    jax.jit(lambda x: (f(x), x + 1)[1])(jnp.ones(3))
  assert calls == [1]  # only the call with a side effect ran


def test_errors_fail_the_computation():
  bad = hcb.buffer_callback(lambda ctx, out, x: 3, F32_3)
  with pytest.raises(jax.errors.JaxRuntimeError,
                     match="buffer_callback callback must not return any "
                           "values"):
    jax.jit(bad)(jnp.ones(3)).block_until_ready()

  def raises(ctx, out, x):
    raise KeyError("missing")

  with pytest.raises(jax.errors.JaxRuntimeError,
                     match="callback 'test_errors_fail_the_computation."
                           "<locals>.raises' raised KeyError"):
    jax.jit(hcb.buffer_callback(raises, F32_3))(jnp.ones(3)).block_until_ready()
  hcb.barrier_wait()  # the computation raised it, as JAX's: not again


# ---- native callbacks -------------------------------------------------------

NATIVE_SOURCE = r"""
#include <stdio.h>
#include <string.h>
#include "hcb/hcb.h"

/* results[0] = args[0] * 2 + *(float *)user, float32 only. */
int twice_plus(void *user, hcb_device device, const hcb_array *args,
               size_t nargs, const hcb_array *results, size_t nresults,
               hcb_error *err) {
  const float *in;
  float *out, add = user ? *(const float *)user : 0.0f;
  size_t i, n;

  (void)device;
  if (nargs != 1 || nresults != 1 || args[0].dtype != HCB_F32 ||
      results[0].nbytes != args[0].nbytes) {
    err->code = HCB_EINVAL;
    snprintf(err->message, sizeof err->message,
             "twice_plus: expected one float32 array in and out");
    return HCB_EINVAL;
  }
  in = args[0].data;
  out = results[0].data;
  n = args[0].nbytes / sizeof(float);
  for (i = 0; i < n; i++)
    out[i] = in[i] * 2.0f + add;
  return HCB_OK;
}
"""


@pytest.fixture(scope="module")
def native_lib(tmp_path_factory):
  d = tmp_path_factory.mktemp("native")
  (d / "native.c").write_text(NATIVE_SOURCE)
  subprocess.run(["cc", "-std=c11", "-shared", "-fPIC", "-O2",
                  f"-I{REPO / 'include'}", "-o", str(d / "libnative.so"),
                  str(d / "native.c")], check=True)
  return ctypes.CDLL(str(d / "libnative.so"))


def test_native_callback_writes_in_place(native_lib):
  offset = ctypes.c_float(0.5)
  native = hcb.NativeCallback(native_lib.twice_plus,
                              user=ctypes.addressof(offset), name="twice_plus")
  f = jax.jit(hcb.buffer_callback(native, F32_3))
  np.testing.assert_array_equal(f(jnp.arange(3, dtype=jnp.float32)),
                                [0.5, 2.5, 4.5])
  step = lambda c, _: (hcb.buffer_callback(native, F32_3)(c), None)
  out, _ = jax.jit(lambda c: jax.lax.scan(step, c, None, length=3))(jnp.ones(3))
  np.testing.assert_array_equal(out, [11.5] * 3)  # ((1*2+.5)*2+.5)*2+.5


def test_native_callback_errors(native_lib):
  native = hcb.NativeCallback(native_lib.twice_plus, name="twice_plus")
  f = jax.jit(hcb.buffer_callback(native, jax.ShapeDtypeStruct((3,), np.int32)))
  with pytest.raises(jax.errors.JaxRuntimeError,
                     match="twice_plus: expected one float32 array"):
    f(jnp.ones(3, jnp.int32)).block_until_ready()
  with pytest.raises(hcb.CallbackException, match="twice_plus"):
    hcb.barrier_wait()
  with pytest.raises(ValueError, match="not a C function pointer"):
    hcb.NativeCallback(0)


def test_operands_on_two_meshes_of_one_device_are_accepted():
  # A program whose operands carry NamedShardings of two different meshes
  # (each of one device) compiles and runs, as with JAX's buffer_callback:
  # the callback does not ask JAX for the program's devices, which would
  # make JAX require a single mesh.
  seen = []

  def record(ctx, out, x):
    seen.append(np.asarray(x).copy())
    np.asarray(out)[...] = np.asarray(x) + 1

  devices = np.array(jax.devices()[:1]).reshape(1, 1)
  mesh_ab = jax.sharding.Mesh(devices, ("a", "b"))
  mesh_xy = jax.sharding.Mesh(devices, ("x", "y"))
  x = jax.device_put(jnp.full((4, 4), 2.0),
                     jax.NamedSharding(mesh_ab, P("a", "b")))
  y = jax.device_put(jnp.full((4, 4), 3.0),
                     jax.NamedSharding(mesh_xy, P("x", "y")))
  f = jax.jit(lambda x, y: hcb.buffer_callback(
      record, jax.ShapeDtypeStruct((4, 4), jnp.float32))(x * y))
  np.testing.assert_array_equal(f(x, y), np.full((4, 4), 7.0))
  np.testing.assert_array_equal(seen[0], np.full((4, 4), 6.0))


def test_a_buffer_callback_under_jit_over_sharded_operands_sees_them_whole():
  mesh = jax.make_mesh((2,), ("d",), devices=jax.devices()[:2])
  x = jax.device_put(jnp.arange(8.0, dtype=jnp.float32),
                     jax.NamedSharding(mesh, P("d")))

  def double(ctx, out, v):
    np.asarray(out)[...] = np.asarray(v) * 2

  f = jax.jit(lambda x: hcb.buffer_callback(
      double, jax.ShapeDtypeStruct(x.shape, x.dtype))(x) + 1)
  np.testing.assert_array_equal(f(x), np.arange(8.0) * 2 + 1)
