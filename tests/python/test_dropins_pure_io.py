"""host_callback.pure_callback and io_callback against jax.pure_callback and
jax.experimental.io_callback, in the same process: results, the arguments
the callback sees, result conversion, vmap methods, errors, shardings,
shard_map, x64, and program order of ordered io_callbacks."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import io_callback as jax_io_callback
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import host_callback as hcb

from conftest import devices_mesh, flush, run_python

PURES = {"jax": jax.pure_callback, "hcb": hcb.pure_callback}
IOS = {"jax": jax_io_callback, "hcb": hcb.io_callback}
# The two families of each API: JAX's and ours.
NAMES = ("jax", "hcb")


# ---- pure_callback ---------------------------------------------------------

def _pure_run(pc, x, **kw):
  shapes = (jax.ShapeDtypeStruct(x.shape, x.dtype),
            {"n": jax.ShapeDtypeStruct((), jnp.int32)})
  return pc(lambda a, *, scale: (np.sin(a) * scale, {"n": a.size}), shapes,
            x, scale=np.float32(2.), **kw)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_pure_callback_results_equal_jaxs(jit):
  x = jnp.arange(6.).reshape(2, 3)
  outs = {k: (jax.jit(partial(_pure_run, pc)) if jit else
              partial(_pure_run, pc))(x) for k, pc in PURES.items()}
  jax.tree_util.tree_map(np.testing.assert_array_equal, outs["hcb"],
                         outs["jax"])
  assert (jax.tree_util.tree_structure(outs["hcb"]) ==
          jax.tree_util.tree_structure(outs["jax"]))
  assert outs["hcb"][1]["n"].dtype == jnp.int32


def test_pure_callback_result_conversion_is_jaxs():
  # A Python float fills float32[], a list of leaves fills a tuple: JAX
  # counts leaves and converts each with np.asarray.
  shapes = (jax.ShapeDtypeStruct((), jnp.float32),
            jax.ShapeDtypeStruct((2,), jnp.int32))
  for pc in PURES.values():
    out = jax.jit(lambda x: pc(lambda a: [1.5, np.array([1, 2])], shapes,
                               x))(1.)
    assert float(out[0]) == 1.5 and out[1].tolist() == [1, 2]
    assert out[0].dtype == jnp.float32 and out[1].dtype == jnp.int32
    # One declared leaf: a result wrapped in a tuple is its one leaf.
    one = jax.jit(lambda x: pc(lambda a: (a * 2,), shapes[0], x))(1.)
    assert float(one) == 2. and one.dtype == jnp.float32
    two = jax.jit(lambda x: pc(lambda a: (a, a), shapes[0], x))
    with pytest.raises(jax.errors.JaxRuntimeError):
      two(1.).block_until_ready()
  hcb.barrier_wait()  # the computation raised it, as JAX's: not again


@pytest.mark.parametrize("vmap_method", ["sequential", "sequential_unrolled",
                                         "expand_dims", "broadcast_all",
                                         "legacy_vectorized"])
def test_pure_callback_under_vmap_by_method_is_jaxs(vmap_method):
  x = jnp.arange(8.).reshape(4, 2)
  y = jnp.ones(2, jnp.float32)
  seen = {}
  outs = {}
  for name, pc in PURES.items():
    shapes = []

    def host(a, b):
      shapes.append((np.shape(a), np.shape(b)))
      return np.asarray(a + b, np.float32)

    def f(a, b):
      return pc(host, jax.ShapeDtypeStruct(a.shape, a.dtype), a, b,
                vmap_method=vmap_method)

    outs[name] = jax.jit(jax.vmap(f, in_axes=(0, None)))(x, y)
    seen[name] = shapes
  np.testing.assert_array_equal(outs["hcb"], outs["jax"])
  assert seen["hcb"] == seen["jax"]


def test_pure_callback_errors_are_jaxs():
  s = jax.ShapeDtypeStruct((), jnp.float32)
  cases = [
      lambda pc: jax.grad(lambda x: pc(np.sin, s, x))(1.),
      lambda pc: jax.jvp(lambda x: pc(np.sin, s, x), (1.,), (1.,)),
      lambda pc: jax.vmap(lambda x: pc(np.sin, s, x))(jnp.ones(2)),
      lambda pc: pc(np.sin, s, 1., vmap_method="loop"),
      lambda pc: pc(np.sin, jax.ShapeDtypeStruct((), jnp.float64), 1.),
  ]
  for case in cases:
    with pytest.raises(Exception) as theirs:
      case(jax.pure_callback)
    with pytest.raises(type(theirs.value)) as ours:
      case(hcb.pure_callback)
    if not isinstance(theirs.value, NotImplementedError):
      assert str(ours.value) == str(theirs.value)


def test_pure_callback_wrong_result_fails_the_computation_like_jaxs():
  s = jax.ShapeDtypeStruct((2,), jnp.float32)
  for name, pc in PURES.items():
    f = jax.jit(lambda x: pc(lambda a: a, s, x))
    with pytest.raises(jax.errors.JaxRuntimeError):
      f(1.).block_until_ready()
    if name == "hcb":  # the computation raised it, as JAX's: not again
      hcb.barrier_wait()


def test_pure_callback_with_unused_result_may_be_removed():
  for pc in PURES.values():
    calls = []

    def host(a):
      calls.append(a)
      return a

    jax.jit(lambda x: (pc(host, jax.ShapeDtypeStruct((), jnp.float32), x),
                       x + 1)[1])(1.)
    flush()
    assert calls == []


def test_pure_callback_sharding_picks_the_calling_device():
  n = len(jax.devices())
  x = jax.device_put(jnp.arange(2. * n), NamedSharding(devices_mesh(), P("d")))
  dev = jax.devices()[1]
  calls = []
  out = jax.jit(lambda v: hcb.pure_callback(
      lambda a: (calls.append(1), a * 2)[1],
      jax.ShapeDtypeStruct(v.shape, v.dtype), v,
      sharding=jax.sharding.SingleDeviceSharding(dev)))(x)
  # (JAX 0.10.2's own returns zeros here.)
  np.testing.assert_array_equal(out, np.arange(2. * n) * 2)
  assert calls == [1]
  with pytest.raises(NotImplementedError, match="SingleDeviceSharding"):
    jax.jit(lambda v: hcb.pure_callback(
        lambda a: a, jax.ShapeDtypeStruct(v.shape, v.dtype), v,
        sharding=NamedSharding(devices_mesh(), P("d"))))(x)


@pytest.mark.parametrize("api", ["pure", "io"])
def test_callbacks_under_shard_map_run_per_shard_like_jaxs(api):
  n = len(jax.devices())
  x = jax.device_put(jnp.arange(2. * n), NamedSharding(devices_mesh(), P("d")))
  outs = {}
  for name in NAMES:
    fn = (PURES if api == "pure" else IOS)[name]
    f = jax.jit(jax.shard_map(
        lambda v: fn(lambda a: a * 10 + len(a),
                     jax.ShapeDtypeStruct(v.shape, v.dtype), v),
        mesh=devices_mesh(), in_specs=P("d"), out_specs=P("d")))
    outs[name] = np.asarray(f(x))
  np.testing.assert_array_equal(outs["hcb"], outs["jax"])
  np.testing.assert_array_equal(outs["hcb"], np.arange(2. * n) * 10 + 2)


def test_pure_callback_64_bit_results_with_x64():
  proc = run_python("""
      import jax, jax.numpy as jnp, numpy as np
      import host_callback as hcb
      s = jax.ShapeDtypeStruct((2,), jnp.float64)
      for pc in (jax.pure_callback, hcb.pure_callback):
        out = jax.jit(lambda x: pc(lambda a: a * 2, s, x))(
            np.array([1.5, 2.5]))
        print(out.dtype, out.tolist())
  """, env={"JAX_ENABLE_X64": "1", "JAX_NUM_CPU_DEVICES": "1"})
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.splitlines() == ["float64 [3.0, 5.0]"] * 2


# ---- io_callback -------------------------------------------------------------

def test_io_callback_results_order_and_vmap_are_jaxs():
  got = {}
  for name, io in IOS.items():
    calls = []

    def host(a, b):
      calls.append((float(a), float(b)))
      return np.float32(a * b)

    def body(c, x):
      return c + io(host, jax.ShapeDtypeStruct((), jnp.float32), x, c), None

    @jax.jit
    def f(xs):
      total, _ = lax.scan(body, 1., xs)
      batched = jax.vmap(lambda v: io(host, jax.ShapeDtypeStruct(
          (), jnp.float32), v, 2.))(xs)
      io(host, jax.ShapeDtypeStruct((), jnp.float32), total, 0.)  # unused
      return total, batched

    out = f(jnp.arange(1., 4.))
    flush()
    got[name] = (jax.tree_util.tree_map(np.asarray, out), calls)
  np.testing.assert_array_equal(got["hcb"][0][0], got["jax"][0][0])
  np.testing.assert_array_equal(got["hcb"][0][1], got["jax"][0][1])
  assert got["hcb"][1] == got["jax"][1]
  assert len(got["jax"][1]) == 7


def test_io_callback_errors_are_jaxs():
  s = jax.ShapeDtypeStruct((), jnp.float32)
  cases = [
      lambda io: jax.grad(lambda x: io(np.sin, s, x))(1.),
      lambda io: jax.vmap(lambda x: io(np.sin, s, x, ordered=True))(
          jnp.ones(2)),
  ]
  for case in cases:
    with pytest.raises(Exception) as theirs:
      case(jax_io_callback)
    with pytest.raises(type(theirs.value)) as ours:
      case(hcb.io_callback)
    assert str(ours.value) == str(theirs.value)


def test_ordered_io_callbacks_run_in_program_order():
  calls = []

  def host(tag, x):
    calls.append((str(tag), float(x)))
    return x

  s = jax.ShapeDtypeStruct((), jnp.float32)

  @jax.jit
  def f(x):
    for i in range(5):
      x = hcb.io_callback(partial(host, f"c{i}"), s, x + 1, ordered=True)
    return x

  assert float(f(0.)) == 5.
  assert [c[0] for c in calls] == [f"c{i}" for i in range(5)]
