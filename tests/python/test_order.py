"""Program order: on one device, taps, prints and calls run in the order the
program issues them, whether or not their results are used, in straight-line
code and inside every control-flow primitive (DESIGN.md section 3).

Without the token chain (python/host_callback/_order.py) XLA reorders
independent side-effecting custom calls: the straight-line and fori_loop
cases below then fail on every run.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import host_callback as hcb


class Log:
  """Records ``(label, value)`` for each callback, in the order they run."""

  def __init__(self) -> None:
    self.lock = threading.Lock()
    self.events: list[tuple[str, Any]] = []

  def tap(self, label: str) -> Callable[..., None]:
    def tap_func(arg: Any, transforms: Any) -> None:
      del transforms
      with self.lock:
        self.events.append((label, _plain(arg)))
    tap_func.__qualname__ = f"tap_{label}"
    return tap_func

  def call(self, label: str) -> Callable[[Any], Any]:
    def call_func(arg: Any) -> Any:
      with self.lock:
        self.events.append((label, _plain(arg)))
      return arg
    call_func.__qualname__ = f"call_{label}"
    return call_func

  def labels(self) -> list[str]:
    return [label for label, _ in self.events]


def _plain(arg: Any) -> Any:
  if isinstance(arg, np.ndarray):
    return arg.tolist()
  return arg


@pytest.fixture
def log() -> Log:
  return Log()


def run(f: Callable[..., Any], *args: Any) -> Any:
  out = jax.jit(f)(*args)
  jax.block_until_ready(out)
  hcb.barrier_wait()
  return out


def test_straight_line_with_unused_results(log: Log) -> None:
  def f(x):
    hcb.id_tap(log.tap("t1"), x)
    hcb.call(log.call("call"), x, result_shape=x)
    hcb.id_tap(log.tap("t2"), x)
    hcb.id_tap(log.tap("t3"), x)
    return x
  for _ in range(3):
    log.events.clear()
    run(f, 1.0)
    assert log.labels() == ["t1", "call", "t2", "t3"]


def test_fori_loop_body_with_independent_taps(log: Log) -> None:
  def body(i, carry):
    hcb.id_tap(log.tap("a"), i)
    hcb.id_tap(log.tap("b"), i)
    return carry + 1.0
  run(lambda x: jax.lax.fori_loop(0, 4, body, x), 0.0)
  assert log.events == [(k, i) for i in range(4) for k in ("a", "b")]


def test_progress_bar_pattern() -> None:
  """The structure of jax-tqdm 0.1.x's loop_tqdm, which users run with the
  old module: inside the loop body, one cond creates the bar on the first
  iteration, two update it, and one closes it on the last, each a tap whose
  result is unused.  Creating must come first and closing last."""
  n, rate = 23, 5
  remainder = n % rate
  state: dict[str, Any] = {}
  errors: list[str] = []

  def define(arg, transforms):
    state["bar"] = 0

  def update(arg, transforms):
    if "bar" not in state or "closed" in state:
      errors.append(f"update by {int(arg)} with bar {state}")
    else:
      state["bar"] += int(arg)

  def close(arg, transforms):
    state["closed"] = state.get("bar")

  def progress(i):
    jax.lax.cond(i == 0,
                 lambda _: hcb.id_tap(define, None, result=i),
                 lambda _: i, operand=None)
    jax.lax.cond((i % rate == 0) & (i != n - remainder),
                 lambda _: hcb.id_tap(update, rate, result=i),
                 lambda _: i, operand=None)
    jax.lax.cond(i == n - remainder,
                 lambda _: hcb.id_tap(update, remainder, result=i),
                 lambda _: i, operand=None)

  def body(i, carry):
    progress(i)
    result = carry + 1.0
    return jax.lax.cond(i == n - 1,
                        lambda _: hcb.id_tap(close, None, result=result),
                        lambda _: result, operand=None)

  for _ in range(5):
    state.clear()
    run(lambda x: jax.lax.fori_loop(0, n, body, x), 0.0)
    assert not errors
    assert state == {"bar": n, "closed": n}


def test_around_and_inside_loops_and_conds(log: Log) -> None:
  def f(x):
    hcb.id_tap(log.tap("before"), x)
    def body(i, c):
      hcb.id_tap(log.tap("body"), i)
      return c
    jax.lax.fori_loop(0, 2, body, x)
    jax.lax.cond(x > 0, lambda: hcb.id_tap(log.tap("then"), x),
                 lambda: hcb.id_tap(log.tap("else"), x))
    hcb.id_tap(log.tap("after"), x)
    return x
  run(f, 1.0)
  assert log.labels() == ["before", "body", "body", "then", "after"]


def test_while_predicate_then_body(log: Log) -> None:
  def cond(c):
    hcb.id_tap(log.tap("pred"), c)
    return c < 3
  def body(c):
    hcb.id_tap(log.tap("body"), c)
    return c + 1
  run(lambda x: jax.lax.while_loop(cond, body, x), 0)
  assert log.events == [("pred", 0), ("body", 0), ("pred", 1), ("body", 1),
                        ("pred", 2), ("body", 2), ("pred", 3)]


def test_nested_jit(log: Log) -> None:
  @jax.jit
  def inner(x):
    hcb.id_tap(log.tap("inner"), x)
    return x * 2

  def f(x):
    hcb.id_tap(log.tap("outer1"), x)
    y = inner(x + 1)  # no data from outer1's result
    hcb.id_tap(log.tap("outer2"), x)
    return y
  for _ in range(3):
    log.events.clear()
    run(f, 1.0)
    assert log.labels() == ["outer1", "inner", "outer2"]


def test_scan_with_prints_and_taps() -> None:
  events: list[str] = []

  class Stream:
    def write(self, s: str) -> None:
      events.append("print:" + s.strip())

  def step(c, x):
    hcb.id_print(x, what="x", output_stream=Stream())
    hcb.id_tap(lambda a, t: events.append(f"tap:{int(a)}"), x)
    return c, None
  run(lambda xs: jax.lax.scan(step, 0, xs), jnp.arange(3))
  assert events == [e for i in range(3)
                    for e in ("print:what: x", f"print:{i}", f"tap:{i}")]


def test_checkpoint_and_grad_keep_forward_order(log: Log) -> None:
  def f(x):
    x = hcb.id_tap(log.tap("a"), x)
    y = jnp.sin(x)
    hcb.id_tap(log.tap("b"), x)
    return y
  jax.grad(jax.checkpoint(f))(1.0)
  hcb.barrier_wait()
  assert log.labels()[:2] == ["a", "b"]


def test_shard_map_order_per_device() -> None:
  mesh = Mesh(np.array(jax.devices()[:4]), ("i",))
  per_device: dict[int, list[str]] = {}
  lock = threading.Lock()

  def tap(label):
    def tap_func(arg, transforms, *, device):
      del arg, transforms
      with lock:
        per_device.setdefault(device.id, []).append(label)
    return tap_func

  @functools.partial(jax.shard_map, mesh=mesh, in_specs=P("i"),
                     out_specs=P("i"))
  def f(x):
    hcb.id_tap(tap("first"), x, tap_with_device=True)
    hcb.id_tap(tap("second"), x, tap_with_device=True)
    return x
  run(f, jnp.arange(4.0))
  assert per_device == {d.id: ["first", "second"] for d in jax.devices()[:4]}


def test_order_costs_no_fast_dispatch() -> None:
  """The chain is in the HLO only: the jitted function keeps JAX's C++ fast
  path (no JAX effect) and its signature."""
  f = jax.jit(lambda x: hcb.id_tap(lambda a, t: None, x) + 1)
  text = f.lower(1.0).as_text()
  assert "stablehlo.token" in text and "@main(%arg0: tensor<f32>)" in text
  assert not f.trace(1.0).jaxpr.effects


def test_sharded_jit_order_on_the_tapping_device() -> None:
  """Under jit over sharded operands the taps go through JAX's Python
  callback, pinned to device_index: they too run in program order."""
  mesh = Mesh(np.array(jax.devices()[:4]), ("i",))
  x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("i")))
  events: list[str] = []

  def f(x):
    for label in "abc":
      hcb.id_tap(lambda a, t, label=label: events.append(label), x)
    return x
  for _ in range(5):
    events.clear()
    run(f, x)
    deadline = time.monotonic() + 10
    while len(events) < 3 and time.monotonic() < deadline:
      time.sleep(0.01)
    assert events == ["a", "b", "c"]


def test_nested_jit_in_conds_in_loops_and_zero_output_cond(log: Log) -> None:
  """A jitted function called from two places (one private function, two
  call sites), from a cond inside a loop, and a cond with no outputs."""
  @jax.jit
  def inner(x):
    hcb.id_tap(log.tap("inner"), x)
    return x

  def f(x):
    hcb.id_tap(log.tap("start"), x)
    jax.lax.cond(x > 0, lambda: (hcb.id_tap(log.tap("cond"), x), None)[1],
                 lambda: None)
    inner(x)
    inner(x + 1)
    def body(i, c):
      jax.lax.cond(i % 2 == 0, lambda: inner(i), lambda: i)
      hcb.id_tap(log.tap("body"), i)
      return c
    jax.lax.fori_loop(0, 3, body, 0)
    hcb.call(log.call("call"), x, result_shape=x)
    hcb.id_tap(log.tap("end"), x)
    return x
  run(f, 1)
  assert log.events == [
      ("start", 1), ("cond", 1), ("inner", 1), ("inner", 2), ("inner", 0),
      ("body", 0), ("body", 1), ("inner", 2), ("body", 2), ("call", 1),
      ("end", 1)]


def test_custom_vjp_rules_under_grad(log: Log) -> None:
  @jax.custom_vjp
  def h(x):
    return jnp.sin(x)
  def h_fwd(x):
    hcb.id_tap(log.tap("fwd"), x)
    return jnp.sin(x), x
  def h_bwd(r, g):
    hcb.id_tap(log.tap("bwd_g"), g)
    hcb.id_tap(log.tap("bwd_r"), r)
    return (g * jnp.cos(r),)
  h.defvjp(h_fwd, h_bwd)

  def k(x):
    hcb.id_tap(log.tap("pre"), x)
    return h(x)
  jax.jit(jax.grad(k))(1.0)
  hcb.barrier_wait()
  assert log.labels() == ["pre", "fwd", "bwd_g", "bwd_r"]


# ---- a callback of every arity, then each kind of callback -------------------

S32 = jax.ShapeDtypeStruct((), np.int32)
F32 = jax.ShapeDtypeStruct((), np.float32)


def _first(log: Log, arity: str, ordered: bool, x: Any) -> None:
  """An io_callback of ``arity``: with or without operands, with or without
  a result (the token of the callback after it follows its own operands
  and results)."""
  def fn(*args: Any) -> Any:
    with log.lock:
      log.events.append(("first", len(args)))
    return np.int32(7) if "result" in arity else None
  operands = (x,) if arity.startswith("operands") else ()
  result = S32 if "result" in arity else None
  hcb.io_callback(fn, result, *operands, ordered=ordered)


class _Stream:
  def __init__(self, log: Log) -> None:
    self.log = log

  def write(self, text: str) -> None:
    del text
    with self.log.lock:
      self.log.events.append(("id_print", 1))


def _next(log: Log, kind: str, x: Any) -> Any:
  """One callback of ``kind`` on ``x``; returns what the program must use
  (a pure callback's result), else None."""
  def note(*args: Any) -> None:
    with log.lock:
      log.events.append((kind, len(args)))

  if kind == "id_tap":
    hcb.id_tap(lambda a, t: note(a), x)
  elif kind == "id_print":
    hcb.id_print(x, output_stream=_Stream(log))
  elif kind == "call":
    hcb.call(note, x)
  elif kind == "io_callback":
    hcb.io_callback(note, None, x)
  elif kind == "pure_callback":
    return hcb.pure_callback(lambda a: (note(a), a)[1], F32, x)
  elif kind == "debug.callback":
    hcb.debug.callback(note, x)
  elif kind == "buffer_callback":
    def fill(ctx: Any, out: Any, a: Any) -> None:
      del ctx
      note(a)
      np.asarray(out)[...] = np.asarray(a)
    hcb.buffer_callback(fill, F32, has_side_effect=True)(x)
  else:
    raise ValueError(kind)
  return None


NEXT_KINDS = ("id_tap", "id_print", "call", "io_callback", "pure_callback",
              "debug.callback", "buffer_callback")
ARITIES = ("no operands, a result", "operands, no result",
           "no operands, no result", "operands and a result")


@pytest.mark.parametrize("context", ["straight", "scan", "while", "cond"])
@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("arity", ARITIES)
def test_every_arity_then_every_kind_of_callback(log: Log, arity: str,
                                                 ordered: bool,
                                                 context: str) -> None:
  """A callback with no operands (or no result) followed by another used to
  hand the next one its first result where its token goes ("hcb_call:
  result 0: unsupported buffer type token"): each kind of callback, right
  after one of each arity, runs, in program order."""
  def sequence(x: Any) -> Any:
    used = jnp.float32(0)
    for kind in NEXT_KINDS:
      _first(log, arity, ordered, x)
      out = _next(log, kind, x)
      if out is not None:
        used = used + out
    return used

  def f(x: Any) -> Any:
    if context == "straight":
      return sequence(x)
    if context == "scan":
      return jax.lax.scan(lambda c, _: (c + sequence(x), None), 0.0,
                          None, length=2)[0]
    if context == "while":
      return jax.lax.while_loop(lambda c: c[0] < 2,
                                lambda c: (c[0] + 1, c[1] + sequence(x)),
                                (0, jnp.float32(0)))[1]
    return jax.lax.cond(x > 0, sequence, lambda x: jnp.float32(0), x)

  out = run(f, jnp.float32(1.5))
  times = 2 if context in ("scan", "while") else 1
  assert float(out) == 1.5 * times
  nfirst = 1 if arity.startswith("operands") else 0
  # A pure callback is not ordered (XLA may move or merge it: hoisted out
  # of a loop, it runs once): it ran, and the others ran in program order
  # around it.
  want = []
  for kind in NEXT_KINDS:
    want.append(("first", nfirst))
    if kind != "pure_callback":
      want.append((kind, 1))
  events = [e for e in log.events if e[0] != "pure_callback"]
  assert events == want * times
  assert 1 <= log.labels().count("pure_callback") <= times
