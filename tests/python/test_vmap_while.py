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
