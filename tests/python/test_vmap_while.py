"""vmap of while_loop whose predicate holds a tap: the predicate's taps run
once per iteration of the batched loop (as many times as without vmap:
iterations + 1), with the batch of predicates, in program order (predicate
before body), as under the removed module (python/host_callback/
_containers.py, 3.)."""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import host_callback as hcb

BATCH = ("batch", {"batch_dims": (0,)})


class Log:
  """Taps of the predicate and the body, in arrival order."""

  def __init__(self) -> None:
    self.items: list[tuple[str, list, tuple]] = []

  def tap(self, what: str):
    def tap_func(v, transforms):
      self.items.append((what, np.asarray(v).tolist(), tuple(transforms)))
    return tap_func

  def of(self, what: str) -> list[list]:
    return [v for w, v, _ in self.items if w == what]


def counting_loop(log: Log):
  def f(n):
    def cond(c):
      i, _ = c
      return hcb.id_tap(log.tap("pred"), i < n)

    def body(c):
      i, s = c
      i = hcb.id_tap(log.tap("body"), i)
      return i + 1, s + i

    return lax.while_loop(cond, body, (0, 0))
  return f


@pytest.mark.parametrize("jit", [False, True])
def test_predicate_taps_once_per_iteration_with_the_batch(jit):
  log = Log()
  f = jax.vmap(counting_loop(log))
  if jit:
    f = jax.jit(f)
  ns = jnp.array([1, 3, 2])
  i, s = f(ns)
  hcb.barrier_wait()
  np.testing.assert_array_equal(i, [1, 3, 2])
  np.testing.assert_array_equal(s, [0, 3, 1])
  # 3 iterations of the batched loop: 4 predicates, the last all false
  assert log.of("pred") == [[True, True, True], [False, True, True],
                            [False, True, False], [False, False, False]]
  assert log.of("body") == [[0, 0, 0], [1, 1, 1], [1, 2, 2]]
  assert [w for w, _, _ in log.items] == ["pred", "body"] * 3 + ["pred"]
  assert all(t == (BATCH,) for _, _, t in log.items)


def test_as_many_predicate_taps_as_without_vmap():
  log = Log()
  jax.jit(counting_loop(log))(3)
  hcb.barrier_wait()
  unbatched = len(log.of("pred"))
  log.items.clear()
  jax.jit(jax.vmap(counting_loop(log)))(jnp.array([3, 0, 1]))
  hcb.barrier_wait()
  assert len(log.of("pred")) == unbatched == 4


def test_nested_vmap_and_batched_constants():
  """Two vmaps (two batch transforms), the bound closed over (a batched
  constant of the predicate), an unbatched initial carry."""
  log = Log()

  def f(n, k):
    def cond(i):
      return hcb.id_tap(log.tap("pred"), i * k < n)
    return lax.while_loop(cond, lambda i: i + 1, 0)

  ns = jnp.array([[1, 4], [2, 0]])
  out = jax.jit(jax.vmap(jax.vmap(f, in_axes=(0, None)),
                         in_axes=(0, None)))(ns, 2)
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, [[1, 2], [1, 0]])
  preds = log.of("pred")
  assert len(preds) == 3  # 2 iterations + 1
  assert preds[0] == [[True, True], [True, False]]
  assert preds[-1] == [[False, False], [False, False]]
  assert all(t == (BATCH, BATCH) for _, _, t in log.items)


def test_unbatched_predicate_is_unchanged():
  """Only the body is batched: the predicate runs as without vmap."""
  log = Log()

  def f(x):
    def cond(c):
      return hcb.id_tap(log.tap("pred"), c[0] < 2)
    return lax.while_loop(cond, lambda c: (c[0] + 1, c[1] * 2), (0, x))

  _, y = jax.jit(jax.vmap(f))(jnp.array([1., 3.]))
  hcb.barrier_wait()
  np.testing.assert_array_equal(y, [4., 12.])
  assert log.of("pred") == [True, True, False]


def test_id_print_in_predicate_and_named_axis():
  s = io.StringIO()

  def f(n):
    def cond(i):
      return hcb.id_print(i < n, output_stream=s)

    def body(i):  # a collective over the vmap's named axis
      return i + lax.psum(1, "b") // 3
    return lax.while_loop(cond, body, 0)

  out = jax.jit(jax.vmap(f, axis_name="b"))(jnp.array([2, 0, 1]))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, [2, 0, 1])
  lines = s.getvalue().splitlines()
  assert lines == ["transforms: [('batch', {'batch_dims': (0,)})]",
                   "[ True False  True]"] + [
                       "transforms: [('batch', {'batch_dims': (0,)})]",
                       "[ True False False]",
                       "transforms: [('batch', {'batch_dims': (0,)})]",
                       "[False False False]"]


# ---- io callbacks in a loop with a batched predicate -------------------------
# vmap runs the body for every element while any element's predicate holds:
# an io callback there would run for elements already finished.  JAX refuses
# its io_callback; ours (io_callback, and call of the default flavor) too,
# with JAX's words.  Debug and pure callbacks run for every element, as
# JAX's do; taps get the batch.

I32 = jax.ShapeDtypeStruct((), np.int32)
JAX_REFUSAL = "Unordered IO effects not supported in while_loop with batched"


def _loop(callback_in_body=None, callback_in_cond=None):
  def f(n):
    def cond(i):
      if callback_in_cond is not None:
        callback_in_cond(i)
      return i < n

    def body(i):
      if callback_in_body is not None:
        i = callback_in_body(i)
      return i + 1
    return lax.while_loop(cond, body, jnp.int32(0))
  return f


def _io(io):
  return lambda i: io(lambda v: np.int32(v), I32, i)


@pytest.mark.parametrize("where", ["body", "cond"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_io_callback_in_a_loop_with_a_batched_predicate_is_refused_like_jaxs(
    where, jit):
  from jax.experimental import io_callback as jax_io_callback
  errors = {}
  for name, io in {"jax": jax_io_callback, "hcb": hcb.io_callback}.items():
    f = jax.vmap(_loop(**{f"callback_in_{where}": _io(io)}))
    if jit:
      f = jax.jit(f)
    with pytest.raises(Exception) as info:
      f(jnp.array([1, 3]))
    errors[name] = str(info.value)
  assert errors["jax"].startswith(JAX_REFUSAL)
  assert errors["hcb"].startswith(JAX_REFUSAL)
  assert "would run for elements whose loop has already finished" in (
      errors["hcb"])


def test_call_in_a_loop_with_a_batched_predicate_is_refused():
  def body(i):
    return hcb.call(lambda v: v, i, result_shape=I32,
                    vmap_method="sequential")
  with pytest.raises(NotImplementedError, match=JAX_REFUSAL):
    jax.jit(jax.vmap(_loop(callback_in_body=body)))(jnp.array([1, 3]))
  # Nested in a scan in the body, too.
  def nested(i):
    return lax.scan(lambda c, _: (body(c), None), i, None, length=1)[0]
  with pytest.raises(NotImplementedError, match=JAX_REFUSAL):
    jax.jit(jax.vmap(_loop(callback_in_body=nested)))(jnp.array([1, 3]))


def test_io_callback_in_a_loop_with_an_unbatched_predicate_runs_like_jaxs():
  from jax.experimental import io_callback as jax_io_callback
  seen = {}
  for name, io in {"jax": jax_io_callback, "hcb": hcb.io_callback}.items():
    got = seen.setdefault(name, [])

    def f(x, io=io, got=got):
      def body(c):
        y = io(lambda v: got.append(int(v)) or np.int32(v), I32, c[1])
        return c[0] + 1, y + 1
      return lax.while_loop(lambda c: c[0] < 2, body, (0, x))[1]

    np.testing.assert_array_equal(
        jax.jit(jax.vmap(f))(jnp.array([10, 20], np.int32)), [12, 22])
  assert seen["hcb"] == seen["jax"] == [10, 20, 11, 21]


def test_other_callbacks_in_a_loop_with_a_batched_predicate_run_like_jaxs():
  """pure_callback and debug.callback run for every element at every
  iteration, finished or not, as JAX's do; a call of the PURE or DEBUG
  flavor runs too; id_tap taps the batch once per iteration."""
  from host_callback import debug as hdebug
  ns = jnp.array([1, 3])
  seen = {}

  def note(key):
    def fn(v):
      seen.setdefault(key, []).append(int(v))
      return np.int32(v)
    return fn

  for name, pure, debug in [("jax", jax.pure_callback, jax.debug),
                            ("hcb", hcb.pure_callback, hdebug)]:
    jax.jit(jax.vmap(_loop(lambda i, pure=pure, name=name: pure(
        note(f"pure {name}"), I32, i, vmap_method="sequential"))))(ns)
    jax.jit(jax.vmap(_loop(lambda i, debug=debug, name=name: (
        debug.callback(note(f"debug {name}"), i), i)[1])))(ns)
  jax.jit(jax.vmap(_loop(lambda i: hcb.call(
      note("pure call"), i, result_shape=I32, vmap_method="sequential",
      callback_flavor=hcb.CallbackFlavor.PURE))))(ns)
  log = Log()
  jax.jit(jax.vmap(_loop(lambda i: hcb.id_tap(log.tap("body"), i))))(ns)
  jax.effects_barrier()
  hcb.barrier_wait()
  every = [0, 0, 1, 1, 1, 2]  # element 0 finished after one iteration
  assert seen == {"pure jax": every, "pure hcb": every, "debug jax": every,
                  "debug hcb": every, "pure call": every}
  assert log.of("body") == [[0, 0], [1, 1], [1, 2]]
