"""Callbacks under jit over operands sharded across this process's devices
run on our own path: the program holds our custom calls, not JAX's Python
callback; every device runs the custom call and one of them, the
``device_index``-th, runs the function, once per call, on the whole
operands; every device gets its results, or fails with its exception; the
program's callbacks keep their order.  Under both of JAX's partitioners
(Shardy, GSPMD).

(The meetings of the devices in C: tests/c/test_shared.c, and over
hand-built call frames in tests/c/test_ffi_call.c, test_ffi_tap.c and
test_ffi_cuda_call.c.  Several processes: test_transforms.py.)
"""

from __future__ import annotations

import re
import textwrap
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import host_callback as hcb
from host_callback import debug as hdebug

from conftest import run_python

XS = np.arange(8, dtype=np.float32).reshape(4, 2)


@pytest.fixture(params=["shardy", "gspmd"])
def partitioner(request: Any) -> Iterator[str]:
  """Each test under Shardy and under GSPMD."""
  before = jax.config.jax_use_shardy_partitioner
  jax.config.update("jax_use_shardy_partitioner", request.param == "shardy")
  try:
    yield request.param
  finally:
    jax.config.update("jax_use_shardy_partitioner", before)


def _sharded(xs: np.ndarray = XS) -> jax.Array:
  mesh = Mesh(np.array(jax.devices()), ("d",))
  return jax.device_put(xs, NamedSharding(mesh, P("d")))


def _targets(f: Callable[..., Any], *args: Any) -> list[str]:
  """The custom-call targets of ``f``'s program as XLA compiled it for
  the devices (after partitioning)."""
  text = jax.jit(f).lower(*args).compile().as_text()
  return re.findall(r'custom_call_target="([^"]+)"', text)


def test_the_program_holds_our_custom_calls(partitioner):
  x = _sharded()
  programs = {
      "id_tap": lambda v: hcb.id_tap(lambda a, t: None, v),
      "call": lambda v: hcb.call(np.sin, v, result_shape=v),
      "id_print": lambda v: hcb.id_print(v),
      "debug.callback": lambda v: hdebug.callback(lambda a: None, v) or v,
      "debug.print": lambda v: hdebug.print("{}", v) or v,
      "pure_callback": lambda v: hcb.pure_callback(np.sin, v, v),
      "io_callback": lambda v: hcb.io_callback(np.sin, v, v, ordered=True),
  }
  # JAX 0.6's XLA under Shardy (opt-in there) refuses our region for a
  # callback without results: those take JAX's Python callback there.
  jaxs_path = ({"id_tap", "id_print", "debug.callback", "debug.print"}
               if jax.__version_info__ < (0, 7) and partitioner == "shardy"
               else set())
  for name, f in programs.items():
    targets = _targets(f, x)
    ours = [t for t in targets if t.startswith("hcb_")]
    if name in jaxs_path:
      assert "xla_ffi_python_cpu_callback" in targets and not (
          {"hcb_tap", "hcb_call"} & set(ours)), (name, targets)
      continue
    assert ours and all(t in ("hcb_tap", "hcb_call") for t in ours), \
        (name, targets)
    assert not any("callback" in t for t in targets), (name, targets)


def test_the_function_runs_once_on_the_chosen_device_with_the_whole_operands(
    partitioner):
  x = _sharded()
  for device_index in range(4):
    calls: list[tuple[Any, list[list[float]]]] = []

    def host(a: np.ndarray, *, device: Any) -> np.ndarray:
      calls.append((device, a.tolist()))
      return a * 10

    out = jax.jit(lambda v: hcb.call(host, v, result_shape=v,
                                     call_with_device=True,
                                     device_index=device_index) + 1)(x)
    out.block_until_ready()
    assert calls == [(jax.devices()[device_index], XS.tolist())]
    # every device holds its part of the whole result
    for shard in out.addressable_shards:
      np.testing.assert_array_equal(np.asarray(shard.data),
                                    (XS * 10 + 1)[shard.index])


def test_a_result_left_replicated_is_whole_on_every_device(partitioner):
  x = _sharded()
  out = jax.jit(lambda v: hcb.call(lambda a: a.sum().reshape(1), v,
                                   result_shape=jax.ShapeDtypeStruct(
                                       (1,), np.float32),
                                   device_index=3))(x)
  assert len(out.addressable_shards) == 4
  for shard in out.addressable_shards:
    assert np.asarray(shard.data).tolist() == [28.0]


def test_taps_and_calls_keep_program_order_in_a_sharded_scan(partitioner):
  x = _sharded()
  seen: list[tuple[str, float]] = []

  def step(c: jax.Array, _: Any) -> tuple[jax.Array, None]:
    s = c.sum()
    # on one device (the order is each device's, as with one device)
    hcb.id_tap(lambda a, t: seen.append(("tap", float(a))), s,
               device_index=2)
    s = hcb.call(lambda a: seen.append(("call", float(a))) or a + 1, s,
                 result_shape=s, device_index=2)
    hdebug.callback(lambda a: seen.append(("debug", float(a))), s)
    return c + s, None

  out, _ = jax.jit(lambda v: jax.lax.scan(step, v, None, length=6))(x)
  hcb.barrier_wait()
  want, c = [], XS.copy()
  for _ in range(6):
    s = float(c.sum())
    want += [("tap", s), ("call", s), ("debug", s + 1)]
    c = c + s + 1
  assert seen == want
  np.testing.assert_array_equal(out, c)


def test_a_failing_call_fails_the_computation_on_every_device(partitioner):
  x = _sharded()

  def host(a: np.ndarray) -> np.ndarray:
    if a.sum() > 100:
      raise ValueError(f"too big: {a.sum()}")
    return a

  def step(c: jax.Array, _: Any) -> tuple[jax.Array, None]:
    return hcb.call(host, c, result_shape=c) + 10, None

  f = jax.jit(lambda v: jax.lax.scan(step, v, None, length=5)[0])
  with pytest.raises(Exception, match="too big: 108.0"):
    f(x).block_until_ready()
  with pytest.raises(hcb.CallbackException):
    hcb.barrier_wait()
  # the devices went on: the next call works
  small = _sharded(np.zeros((4, 2), np.float32))
  out = jax.jit(lambda v: jax.lax.scan(step, v, None, length=1)[0])(small)
  np.testing.assert_array_equal(out, np.full((4, 2), 10, np.float32))


_FAILING_SCAN = """
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import host_callback as hcb
jax.config.update("jax_use_shardy_partitioner", True)
mesh = Mesh(np.array(jax.devices()), ("d",))
x = jax.device_put(np.arange(8, dtype=np.float32).reshape(4, 2),
                   NamedSharding(mesh, P("d")))

def check(a):
  if a.sum() > 100:
    raise ValueError("out of range")

def step(c, _):
  {debug}.callback(check, c)
  return c + 10, None

f = jax.jit(lambda v: jax.lax.scan(step, v, None, length=5)[0])
f(x).block_until_ready()
print("returned")
"""


def test_a_failing_debug_callback_fails_the_call_as_an_exception(partitioner):
  if jax.__version_info__ < (0, 7) and partitioner == "shardy":
    # There a callback without results takes JAX's Python callback (see
    # test_the_program_holds_our_custom_calls), and XLA ends the process
    # when it raises (the other devices wait for the failed one at the
    # next step's gather), ours as JAX's.
    for debug in ("jax.debug", "hcb.debug"):
      done = run_python(_FAILING_SCAN.format(debug=debug),
                        env={"JAX_NUM_CPU_DEVICES": "4"})
      assert done.returncode != 0 and "returned" not in done.stdout, debug
      assert "out of range" in done.stderr, (debug, done.stderr[-2000:])
    return
  x = _sharded()

  def check(a: np.ndarray) -> None:
    if a.sum() > 100:
      raise ValueError("out of range")

  def step(c: jax.Array, _: Any) -> tuple[jax.Array, None]:
    hdebug.callback(check, c)
    return c + 10, None

  f = jax.jit(lambda v: jax.lax.scan(step, v, None, length=5)[0])
  with pytest.raises(Exception, match="out of range"):
    f(x).block_until_ready()
  np.testing.assert_array_equal(
      jax.jit(lambda v: jax.lax.scan(step, v, None, length=1)[0])(x),
      XS + 10)


def test_a_sharded_program_is_compiled_once_for_each_device_index():
  # device_index is part of the program: each one picks its own runner
  x = _sharded()
  got: list[Any] = []
  for i in (1, 3, 1):
    jax.jit(lambda v, i=i: hcb.id_tap(lambda a, t, device: got.append(device),
                                      v, tap_with_device=True,
                                      device_index=i))(x)
  hcb.barrier_wait()
  assert got == [jax.devices()[i] for i in (1, 3, 1)]


def test_many_unwaited_calls_of_a_sharded_program_finish():
  # A loop that dispatches without waiting: XLA's CPU client gets stuck
  # (and aborts the process) when multi-device programs pile up; these are
  # paced and run synchronously, and finish, every tap delivered.
  done = run_python(textwrap.dedent("""
      import jax, numpy as np
      from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
      import host_callback as hcb
      mesh = Mesh(np.array(jax.devices()), ("d",))
      x = jax.device_put(np.arange(8, dtype=np.float32),
                         NamedSharding(mesh, P("d")))
      n = [0]
      def count(a, t):
        n[0] += 1
      f = jax.jit(lambda v: hcb.id_tap(count, v * 2) + 1)
      for _ in range(2000):
        x = f(x) * 0
      hcb.barrier_wait()
      print(n[0], np.asarray(x).tolist())
  """), timeout=180)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.split("\n")[0] == "2000 " + str([0.0] * 8)


def test_a_tap_on_every_shard_is_still_jaxs_partitioned_callback(partitioner):
  # jax.debug's partitioned callback: each device taps its own shard
  x = _sharded()
  got: list[list[float]] = []
  jax.jit(lambda v: hdebug.callback(lambda a: got.append(a.tolist()), v,
                                    partitioned=True))(x)
  jax.effects_barrier()
  assert sorted(got) == [[[0.0, 1.0]], [[2.0, 3.0]], [[4.0, 5.0]],
                         [[6.0, 7.0]]]


def test_a_sum_computed_from_the_callbacks_result(partitioner):
  # the callback's result feeds the sharded computation that follows
  x = _sharded()
  f = jax.jit(lambda v: (v * hcb.call(lambda a: np.float32(a.max()),
                                      v.sum(), result_shape=jnp.float32(0))))
  np.testing.assert_array_equal(f(x), XS * 28)
