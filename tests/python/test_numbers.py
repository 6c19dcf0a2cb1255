"""A callback never changes the numbers a program computes: the same bits
with and without a tap, a print, a call or a progress bar (DESIGN.md
section 3, "Do no harm"), in straight-line code and in loops -- with one
exception that is XLA's, not the callback's: on the CPU, XLA compiles a
small ``while`` loop (under ``xla_cpu_small_while_loop_byte_threshold``,
1 KiB, of data) whose body holds no custom call into one function, and one
that holds any custom call (every callback, JAX's too) step by step; the
two may contract a multiply-add differently (docs/api.md, "Same numbers").
With that threshold at 0 XLA steps every loop, and the bits agree there
too.

Two ways it used to: a tap returned its operands (aliased) and the program
went on with those, so XLA could no longer fuse the tapped value's
producer into its consumers (a multiply and an add fused into one
contraction give other bits than the two rounded apart); and a barrier
that ordered ``pmap``/``shard_map``'s body after the callbacks before it
hid a constant operand from the compiler, which then computed with it at
run time instead of folding it (XLA's run-time ``exp`` and its folded one
differ in the last bit).
"""

from __future__ import annotations

import io
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb
from host_callback import debug
from host_callback import progress

_NULL = open(os.devnull, "w")  # noqa: SIM115  (for the whole session)


def _callbacks() -> dict[str, Callable[[Any], None]]:
  """One callback of each kind on a value (its results unused)."""
  return {
      "none": lambda v: None,
      "id_tap": lambda v: hcb.id_tap(lambda a, t: None, v),
      "id_tap result=": lambda v: hcb.id_tap(lambda a, t: None, v, result=v),
      "id_print": lambda v: hcb.id_print(v, output_stream=_NULL),
      "call": lambda v: hcb.call(lambda a: None, v),
      "io_callback": lambda v: hcb.io_callback(lambda a: None, None, v),
      "debug.print": lambda v: debug.print("{}", v),
      "debug.callback": lambda v: debug.callback(lambda a: None, v),
  }


def _bits(x: Any) -> np.ndarray:
  return np.asarray(x).view(np.uint32)


def _fusion_sensitive(tap: Callable[[Any], Any]) -> Callable[[Any], Any]:
  """A multiply whose product an add consumes (fused, they are one
  contraction), then reductions; ``tap`` sees the product.  A tap whose
  result the program uses returns it."""
  def f(x):
    y = x * jnp.float32(1.1)
    out = tap(y)
    if out is not None:
      y = out
    z = (y + jnp.float32(0.3)) * x - jnp.float32(0.7)
    return z, jnp.sum(z * z) * x[0] + jnp.sum(y)
  return f


@pytest.mark.parametrize("kind", list(_callbacks()))
def test_same_bits_under_jit(kind: str) -> None:
  x = jnp.linspace(0, 1, 1000, dtype=jnp.float32)
  want = jax.jit(_fusion_sensitive(lambda v: None))(x)
  tap = _callbacks()[kind]
  # id_tap with result= returns its value: the program goes on with it.
  uses = kind == "id_tap result="
  got = jax.jit(_fusion_sensitive(tap if uses else lambda v: tap(v)))(x)
  for w, g in zip(want, got):
    np.testing.assert_array_equal(_bits(g), _bits(w))
  hcb.barrier_wait()


def test_same_bits_with_a_progress_bar_under_jit() -> None:
  x = jnp.linspace(0, 1, 100, dtype=jnp.float32)

  def loop(bar: bool):
    def step(v, i):
      return v * jnp.float32(1.1) + jnp.float32(0.3) * jnp.sin(v), None
    if bar:
      step = progress.scan_tqdm(50, file=io.StringIO())(step)
    return jax.jit(lambda x: jax.lax.scan(step, x, jnp.arange(50))[0])

  np.testing.assert_array_equal(_bits(loop(True)(x)), _bits(loop(False)(x)))


def _pmap_loop(tap: Callable[[Any], None], bar: bool = False):
  """A pmap'd loop over constants that XLA folds at compile time (exp,
  tanh, log1p of a constant array): the numbers of the folded constants
  are not those computed at run time."""
  c = jnp.linspace(0.1, 2.0, 8, dtype=jnp.float32)

  def body(v, i):
    tap(i)
    v = (v * jnp.exp(c * 0.37) + jnp.tanh(c + 0.3) * jnp.log1p(c) +
         jnp.sum(jnp.exp(-c * v)) * 1e-3)
    return v, None
  if bar:
    body = progress.scan_tqdm(20, file=io.StringIO())(body)
  return jax.pmap(lambda v: jax.lax.scan(body, v * c, jnp.arange(20))[0])


@pytest.mark.parametrize("kind", [*_callbacks(), "progress bar"])
def test_same_bits_under_pmap(kind: str) -> None:
  x = jnp.linspace(-1, 1, 32, dtype=jnp.float32).reshape(4, 8)
  want = _pmap_loop(lambda i: None)(x)
  if kind == "progress bar":
    got = _pmap_loop(lambda i: None, bar=True)(x)
  else:
    tap = _callbacks()[kind]
    got = _pmap_loop(lambda i: (tap(i), None)[1])(x)
  np.testing.assert_array_equal(_bits(got), _bits(want))
  hcb.barrier_wait()


# ---- loops -------------------------------------------------------------------

_LOOPS = ("scan", "fori_loop", "while_loop")


def _random_loop(seed: int, loop: str, tap: Callable[[Any], None]):
  """A jitted loop of 5 steps whose body is drawn from ``seed``: an
  elementwise function of ``carry * a + i * b`` (the loop's index, as a
  float: the operand XLA may contract differently), scaled and added back,
  with ``tap`` of the carry first."""
  rng = np.random.default_rng(seed)
  a, b, c, d = (jnp.float32(v) for v in rng.uniform(-2, 2, 4))
  fn = (jnp.sin, jnp.tanh, jnp.cos, lambda v: jnp.exp(-v * v))[seed % 4]

  def step(i, carry):
    tap(carry)
    return fn(carry * a + i * b) * c + carry * d

  if loop == "scan":
    return jax.jit(lambda x: jax.lax.scan(
        lambda v, i: (step(i, v), None), x, jnp.arange(5))[0])
  if loop == "fori_loop":
    return jax.jit(lambda x: jax.lax.fori_loop(0, 5, step, x))
  return jax.jit(lambda x: jax.lax.while_loop(
      lambda s: s[0] < 5, lambda s: (s[0] + 1, step(s[0], s[1])),
      (0, x))[1])


@pytest.mark.parametrize("loop", _LOOPS)
@pytest.mark.parametrize("kind", list(_callbacks())[1:])
def test_same_bits_in_random_loops(kind: str, loop: str) -> None:
  # Loops over 512 float32 (2 KiB): XLA steps them with or without a
  # callback.
  tap = _callbacks()[kind]
  uses = kind == "id_tap result="
  x = np.random.default_rng(7).standard_normal(512).astype(np.float32)
  for seed in range(4):
    want = _random_loop(seed, loop, lambda v: None)(x)
    got = _random_loop(seed, loop, (lambda v: tap(v)) if not uses else tap)(x)
    np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=str(seed))
  hcb.barrier_wait()


def test_same_bits_in_small_loops_when_xla_steps_every_loop() -> None:
  """Scalar loops, which XLA compiles into one function without a custom
  call (its small-loop hoisting): with its threshold at 0 (XLA_FLAGS), the
  bits agree with every kind of callback, on 200 random inputs each."""
  from conftest import run_python
  proc = run_python("""
      import inspect, sys
      import numpy as np, jax, jax.numpy as jnp
      import host_callback as hcb
      sys.path.insert(0, %r)
      import test_numbers as t
      xs = np.random.default_rng(3).standard_normal(200).astype(np.float32)
      differ = {}
      for kind, tap in list(t._callbacks().items())[1:]:
        uses = kind == "id_tap result="
        for loop in t._LOOPS:
          for seed in range(2):
            plain = t._random_loop(seed, loop, lambda v: None)
            tapped = t._random_loop(seed, loop,
                                    tap if uses else (lambda v: tap(v)))
            n = sum(int(t._bits(plain(jnp.float32(x))) !=
                        t._bits(tapped(jnp.float32(x)))) for x in xs)
            differ[(kind, loop, seed)] = n
      hcb.barrier_wait()
      print("differ", sum(differ.values()), len(differ))
      """ % os.path.dirname(os.path.abspath(__file__)),
      env={"XLA_FLAGS":
           "--xla_backend_extra_options="
           "xla_cpu_small_while_loop_byte_threshold=0",
           "JAX_NUM_CPU_DEVICES": "1"}, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  last = proc.stdout.splitlines()[-1].split()  # after debug.print's lines
  differ, programs = int(last[1]), int(last[2])
  assert (differ, programs) == (0, 7 * 3 * 2)
