"""id_tap against real JAX: values, pytrees, dtypes, control flow, result,
device, flavors, errors of use."""

from __future__ import annotations

import functools
import io
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import host_callback as hcb

from conftest import DTYPES, run_python


def test_eager_identity_and_delivery(collect):
  x = jnp.arange(4.0)
  y = hcb.id_tap(collect, x)
  np.testing.assert_array_equal(y, x)
  hcb.barrier_wait()
  (arg,) = collect.args
  assert isinstance(arg, np.ndarray)
  np.testing.assert_array_equal(arg, np.arange(4.0, dtype=np.float32))
  assert collect.calls[0][1] == ()


def test_jit_taps_every_call_with_runtime_values(collect):
  f = jax.jit(lambda x: hcb.id_tap(collect, x * 2) + 1)
  for i in range(3):
    np.testing.assert_allclose(f(jnp.float32(i)), 2 * i + 1)
  hcb.barrier_wait()
  assert [float(a) for a in collect.args] == [0.0, 2.0, 4.0]


def test_tap_runs_on_a_consumer_thread_not_the_caller(collect):
  import threading
  jax.jit(lambda x: hcb.id_tap(collect, x))(1.0)
  hcb.barrier_wait()
  assert collect.threads and threading.get_ident() not in collect.threads


@pytest.mark.parametrize("arg", [
    (1.0, 2),
    [jnp.ones(2), (3, {"k": jnp.zeros(1)})],
    {"b": 1.0, "a": [2.0, 3.0]},
    (),
    [],
    {},
    ((), [jnp.int32(4)], {}),
], ids=["tuple", "nested", "dict", "empty_tuple", "empty_list", "empty_dict",
        "mixed_empty"])
def test_pytrees_keep_their_structure(collect, arg):
  out = jax.jit(lambda a: hcb.id_tap(collect, a))(arg)
  assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(arg)
  hcb.barrier_wait()
  (got,) = collect.args
  assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(arg)
  for g, a in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(arg)):
    assert isinstance(g, np.ndarray)
    np.testing.assert_array_equal(g, np.asarray(a))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_round_trips(collect, dtype):
  x = (np.arange(6) % 3).reshape(2, 3).astype(dtype)
  out = jax.jit(lambda a: hcb.id_tap(collect, a))(x)
  np.testing.assert_array_equal(np.asarray(out), x)
  hcb.barrier_wait()
  (got,) = collect.args
  assert got.dtype == np.dtype(dtype)
  assert got.shape == (2, 3)
  np.testing.assert_array_equal(got, x)


def test_64_bit_dtypes_with_x64():
  proc = run_python("""
      import jax
      jax.config.update("jax_enable_x64", True)
      import numpy as np, host_callback as hcb
      got = []
      for dt in (np.int64, np.uint64, np.float64, np.complex128):
        x = np.array([1, 2**40 if dt != np.complex128 else 3], dtype=dt)
        jax.jit(lambda a: hcb.id_tap(lambda v, t: got.append(v), a))(x)
      hcb.barrier_wait()
      print([(str(g.dtype), g.tolist()) for g in got])
  """)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip() == (
      "[('int64', [1, 1099511627776]), ('uint64', [1, 1099511627776]), "
      "('float64', [1.0, 1099511627776.0]), "
      "('complex128', [(1+0j), (3+0j)])]")


def test_zero_size_arrays(collect):
  arg = (jnp.zeros((0,)), jnp.ones((2, 0, 3), jnp.int32))
  out = jax.jit(lambda a: hcb.id_tap(collect, a))(arg)
  assert out[1].shape == (2, 0, 3)
  hcb.barrier_wait()
  (got,) = collect.args
  assert got[0].shape == (0,) and got[1].shape == (2, 0, 3)
  assert got[1].dtype == np.int32


def test_prng_key_taps_key_data(collect):
  key = jax.random.key(42)
  out = jax.jit(lambda k: hcb.id_tap(collect, k))(key)
  assert jax.dtypes.issubdtype(out.dtype, jax.dtypes.prng_key)
  np.testing.assert_array_equal(jax.random.key_data(out),
                                jax.random.key_data(key))
  hcb.barrier_wait()
  (got,) = collect.args
  assert got.dtype == np.uint32
  np.testing.assert_array_equal(got, np.asarray(jax.random.key_data(key)))


def test_result_is_returned_and_not_sent(collect):
  def f(x):
    r = hcb.id_tap(collect, x, result=(x * 10, x * 20))
    return r[0] + r[1]
  np.testing.assert_allclose(jax.jit(f)(1.0), 30.0)
  hcb.barrier_wait()
  assert [float(a) for a in collect.args] == [1.0]


def test_tap_with_device_passes_the_jax_device(collect):
  jax.jit(lambda x: hcb.id_tap(collect, x, tap_with_device=True))(1.0)
  hcb.barrier_wait()
  (_, transforms, device) = collect.calls[0]
  assert transforms == ()
  assert isinstance(device, jax.Device)
  assert device == jax.devices()[0]


def test_kwargs_are_rejected_with_the_old_message():
  with pytest.raises(TypeError, match=r"Support for \*\*kwargs in ``id_tap`` "
                     r"has been removed.*functools.partial\(tap_func"):
    hcb.id_tap(lambda a, t: None, 1.0, what="x")


def test_partial_pre_applies_keywords(collect):
  def tap(arg, transforms, *, what):
    collect((what, arg), transforms)
  jax.jit(lambda x: hcb.id_tap(functools.partial(tap, what="act"), x))(2.0)
  hcb.barrier_wait()
  assert collect.args[0][0] == "act"


def test_bad_arguments_get_clear_errors():
  with pytest.raises(TypeError, match="tap_func must be callable"):
    hcb.id_tap(3, 1.0)
  with pytest.raises(TypeError, match="callback_flavor must be a CallbackFlavor"):
    hcb.id_tap(lambda a, t: None, 1.0, callback_flavor="pure")
  with pytest.raises(TypeError):
    hcb.id_tap(lambda a, t: None, "not an array")


# ---- control flow ------------------------------------------------------------

def test_nested_jit(collect):
  inner = jax.jit(lambda x: hcb.id_tap(collect, x + 1))
  outer = jax.jit(lambda x: inner(x) * 2)
  np.testing.assert_allclose(outer(1.0), 4.0)
  hcb.barrier_wait()
  assert [float(a) for a in collect.args] == [2.0]


def test_cond_taps_only_the_taken_branch(collect):
  def g(p, x):
    return lax.cond(p, lambda v: hcb.id_tap(collect, {"yes": v})["yes"],
                    lambda v: hcb.id_tap(collect, {"no": -v})["no"], x)
  jg = jax.jit(g)
  jg(True, 1.0)
  jg(False, 2.0)
  hcb.barrier_wait()
  assert [{k: float(v) for k, v in a.items()} for a in collect.args] == [
      {"yes": 1.0}, {"no": -2.0}]


def test_while_loop_body_and_predicate(collect):
  def cond_fun(c):
    i = hcb.id_tap(collect, {"cond": c})["cond"]
    return i < 3
  def body_fun(c):
    return hcb.id_tap(collect, {"body": c})["body"] + 1
  out = jax.jit(lambda x: lax.while_loop(cond_fun, body_fun, x))(0)
  assert int(out) == 3
  hcb.barrier_wait()
  seen = [(k, int(v)) for a in collect.args for k, v in a.items()]
  assert seen == [("cond", 0), ("body", 0), ("cond", 1), ("body", 1),
                  ("cond", 2), ("body", 2), ("cond", 3)]


def test_predicate_taps_run_when_xla_knows_the_trip_count(collect):
  # XLA runs `while i < 3` from a constant without its condition; the
  # predicate's taps (result unused) run all the same, in order.
  def cond_fun(i):
    hcb.id_tap(collect, {"cond": i})
    return i < 3
  def body_fun(i):
    hcb.id_tap(collect, {"body": i})
    return i + 1
  assert int(jax.jit(lambda: lax.while_loop(cond_fun, body_fun, 0))()) == 3
  hcb.barrier_wait()
  seen = [(k, int(v)) for a in collect.args for k, v in a.items()]
  assert seen == [("cond", 0), ("body", 0), ("cond", 1), ("body", 1),
                  ("cond", 2), ("body", 2), ("cond", 3)]


def test_scan_taps_each_step_in_order(collect):
  def step(c, x):
    c = hcb.id_tap(collect, c + x)
    return c, c
  _, ys = jax.jit(lambda xs: lax.scan(step, 0.0, xs))(jnp.arange(5.0))
  hcb.barrier_wait()
  assert [float(a) for a in collect.args] == [0.0, 1.0, 3.0, 6.0, 10.0]
  np.testing.assert_allclose(ys, [0.0, 1.0, 3.0, 6.0, 10.0])


def test_kept_arrays_stay_intact_across_many_taps(collect):
  # Small records are copied out for Python and large ones are viewed in
  # place: either way an array a tap function keeps must not change while
  # thousands of records after it come and go (their memory is reused).
  def step(c, _):
    small = hcb.id_tap(collect, c)
    big = hcb.id_tap(collect, jnp.full((2048,), c))  # 8 KiB: not copied
    return small + big[0] * 0 + 1, None
  jax.jit(lambda c: lax.scan(step, c, None, length=3000))(jnp.float32(0))
  hcb.barrier_wait()
  assert len(collect.args) == 6000
  # the two taps of a step do not depend on each other: either may go first
  small = [a for a in collect.args if a.shape == ()]
  big = [a for a in collect.args if a.shape == (2048,)]
  np.testing.assert_array_equal([float(a) for a in small], np.arange(3000))
  for i in (0, 1, 1500, 2999):
    np.testing.assert_array_equal(big[i], np.full((2048,), i, np.float32))
  assert all(a.flags.writeable for a in small[:5] + big[:5])


def test_fori_loop(collect):
  f = jax.jit(lambda n: lax.fori_loop(
      0, n, lambda i, c: hcb.id_tap(collect, (i, c))[1] + i, 0))
  assert int(f(4)) == 6
  hcb.barrier_wait()
  assert [(int(i), int(c)) for i, c in collect.args] == [
      (0, 0), (1, 0), (2, 1), (3, 3)]


# ---- taps whose result is unused still run -----------------------------------

def test_unused_tap_runs_at_top_level(collect):
  def f(x):
    hcb.id_tap(collect, x)  # result dropped
    return x + 1
  jax.jit(f)(5.0)
  hcb.barrier_wait()
  assert [float(a) for a in collect.args] == [5.0]


def test_unused_tap_runs_inside_scan_with_unused_outputs(collect):
  def f(x):
    lax.scan(lambda c, _: (hcb.id_tap(collect, c) + 1, None), x, None,
             length=3)
    return x
  jax.jit(f)(0.0)
  hcb.barrier_wait()
  assert [float(a) for a in collect.args] == [0.0, 1.0, 2.0]


def test_unused_tap_runs_inside_nested_jit_cond_and_while(collect):
  def f(x):
    jax.jit(lambda v: hcb.id_tap(collect, {"jit": v}))(x)
    lax.cond(x > 0, lambda v: hcb.id_tap(collect, {"cond": v})["cond"],
             lambda v: v, x)
    lax.while_loop(lambda v: v < 2,
                   lambda v: hcb.id_tap(collect, {"while": v})["while"] + 1, x)
    return x * 2
  jax.jit(f)(1.0)
  hcb.barrier_wait()
  assert [(k, float(v)) for a in collect.args for k, v in a.items()] == [
      ("jit", 1.0), ("cond", 1.0), ("while", 1.0)]


def test_pure_flavor_runs_when_used_and_may_be_removed_when_not(collect):
  f = jax.jit(lambda x: hcb.id_tap(collect, x,
                                   callback_flavor=hcb.CallbackFlavor.PURE) + 1)
  f(1.0)
  hcb.barrier_wait()
  assert [float(a) for a in collect.args] == [1.0]
  hlo = jax.jit(lambda x: (hcb.id_tap(collect, x,
                                      callback_flavor=hcb.CallbackFlavor.PURE),
                           x + 1)[1]).lower(1.0).as_text()
  assert "hcb_tap" not in hlo  # dead pure taps are removed
  hlo_io = jax.jit(lambda x: (hcb.id_tap(collect, x), x + 1)[1]).lower(
      1.0).as_text()
  assert "hcb_tap" in hlo_io and "has_side_effect = true" in hlo_io


def test_debug_flavor_taps(collect):
  jax.jit(lambda x: hcb.id_tap(collect, x,
                               callback_flavor=hcb.CallbackFlavor.DEBUG))(3.0)
  hcb.barrier_wait()
  assert [float(a) for a in collect.args] == [3.0]


def test_the_program_goes_on_with_the_tapped_values_not_the_taps_results():
  """The tap takes the tapped arrays and returns its order token alone: the
  program computes with its own values (the same fusions and numbers as
  without the tap), and nothing is aliased (which cost compile time
  quadratic in the leaves).  A PURE tap, which XLA keeps only where its
  results are used, still returns its operands."""
  def f(x):
    return hcb.id_tap(lambda a, t: None, (x, x + 1))
  hlo = jax.jit(f).lower(jnp.ones(3)).as_text()
  assert "output_operand_aliases" not in hlo
  assert "callback_id" in hlo and "ntapped" in hlo
  assert re.search(r"stablehlo.custom_call @hcb_tap\(.*\) -> "
                   r"!stablehlo.token\n", hlo), hlo
  pure = jax.jit(lambda x: hcb.id_tap(
      lambda a, t: None, x, callback_flavor=hcb.CallbackFlavor.PURE) + 1)
  assert "output_operand_aliases" in pure.lower(jnp.ones(3)).as_text()


def test_unused_tap_runs_inside_scan_with_no_outputs_at_all(collect):
  # JAX forwards the constant carry out of the scan, leaving it without
  # outputs; the scan must still run for its taps.
  def step(c, i):
    hcb.id_tap(collect, i)
    return c, None
  jax.jit(lambda: lax.scan(step, 0, jnp.arange(3))[0])()
  hcb.barrier_wait()
  assert [int(a) for a in collect.args] == [0, 1, 2]


# ---- device_index ---------------------------------------------------------------

OUT_OF_RANGE = ("device_index=4 is out of range: JAX has 4 devices, so "
                "device_index must be from 0 to 3")


def _bind_each(device_index):
  tap = lambda x, t: None
  yield "id_tap", lambda x: hcb.id_tap(tap, x, device_index=device_index)
  yield "id_print", lambda x: hcb.id_print(x, device_index=device_index,
                                            output_stream=io.StringIO())
  yield "host_callback.call", lambda x: hcb.call(
      lambda v: v, x, result_shape=x, device_index=device_index)


@pytest.mark.parametrize("where", ["eager", "jit", "pmap", "shard_map"])
def test_device_index_out_of_range_is_a_clear_error(where):
  from jax.sharding import Mesh, PartitionSpec as P
  x = jnp.ones((4, 3))
  for what, bind in _bind_each(4):
    if where == "eager":
      run = lambda: bind(x)
    elif where == "jit":
      run = lambda: jax.jit(bind)(x)
    elif where == "pmap":
      run = lambda: jax.pmap(bind)(x)
    else:
      mesh = Mesh(np.array(jax.devices()), ("d",))
      run = lambda: jax.jit(jax.shard_map(bind, mesh=mesh, in_specs=P("d"),
                                          out_specs=P("d")))(x)
    with pytest.raises(ValueError, match=f"^{what}: {OUT_OF_RANGE}"):
      run()


def test_device_index_must_be_an_int_and_in_range_is_accepted():
  with pytest.raises(TypeError, match="id_tap: device_index must be an int, "
                                      "got '0'"):
    hcb.id_tap(lambda x, t: None, 1., device_index="0")
  with pytest.raises(ValueError, match="device_index=-1 is out of range"):
    hcb.call(lambda v: v, 1., result_shape=1., device_index=-1)
  assert float(jax.jit(lambda x: hcb.call(
      lambda v: v + 1, x, result_shape=x, device_index=np.int64(3)))(1.)) == 2.


def test_device_index_out_of_range_on_one_device():
  proc = run_python("""
      import jax, host_callback as hcb
      for bind in (lambda x: hcb.id_tap(lambda *a: None, x, device_index=5),
                   lambda x: hcb.call(lambda v: v, x, result_shape=x,
                                      device_index=5)):
        try:
          jax.jit(bind)(1.)
        except ValueError as e:
          print(str(e).splitlines()[0].split(": ", 1)[1])
  """, env={"JAX_NUM_CPU_DEVICES": "1"})
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.splitlines() == [
      "device_index=5 is out of range: JAX has 1 device, so device_index "
      "must be from 0 to 0"] * 2
