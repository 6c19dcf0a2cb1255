"""A callback whose arguments are all constants still belongs to the
program being traced.

Inside ``jit`` (or ``scan``) a ``jax.Array`` closed over is no tracer, yet
a callback on it must run at every execution of the program, as JAX's do,
not once while it is traced.  Outside any trace (eagerly, under
``disable_jit``, under an eager ``vmap`` of constants) it runs now.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb
from host_callback import debug as hdebug

from conftest import run_python

DEBUGS = {"jax": jax.debug, "hcb": hdebug}


def _flush() -> None:
  jax.effects_barrier()
  hcb.barrier_wait()


def _scan_printing(debug, lr):
  @jax.jit
  def f(x):
    def body(c, _):
      debug.print("lr={}", lr)
      debug.callback(lambda v: print("callback", v), lr)
      return c + 1, None
    debug.print("numpy={}", np.int32(3))
    debug.print("none")
    return jax.lax.scan(body, x, None, length=3)[0]
  return f


@pytest.mark.parametrize("after_eager_print", [False, True],
                         ids=["first", "after_an_eager_print"])
def test_debug_callbacks_of_a_closed_over_array_run_per_execution(
    capsys, after_eager_print):
  lr = jnp.float32(0.5)
  out = {}
  for name, debug in DEBUGS.items():
    if after_eager_print:
      debug.print("eager {}", jnp.float32(1))
    f = _scan_printing(debug, lr)
    capsys.readouterr()
    f(0.0).block_until_ready()
    f(0.0).block_until_ready()
    _flush()
    out[name] = capsys.readouterr().out.splitlines()
  # JAX's unordered callbacks may run in any order; ours in program order.
  assert sorted(out["hcb"]) == sorted(out["jax"])
  assert out["hcb"] == (["numpy=3", "none"] +
                        ["lr=0.5", "callback 0.5"] * 3) * 2


def test_every_callback_of_constants_inside_jit_runs_per_execution():
  """Nothing at trace time, each once per execution (in a scan: per
  step)."""
  k = jnp.int32(7)
  seen: list[str] = []
  S = jax.ShapeDtypeStruct((), np.int32)

  def note(what):
    def fn(v):
      seen.append(what)
      return np.int32(v)
    return fn

  @jax.jit
  def f(x):
    hcb.id_tap(lambda v, t: seen.append("id_tap"), k)
    hcb.id_print(k, output_stream=_Sink(seen))
    hdebug.callback(note("debug.callback"), k)
    a = hcb.call(note("call"), k, result_shape=S)
    b = hcb.io_callback(note("io_callback"), S, k)
    c = hcb.pure_callback(note("pure_callback"), S, k)
    d = jax.lax.scan(lambda c, _: (c + hcb.io_callback(
        note("io_callback in scan"), S, k), None), 0, None, length=2)[0]
    return x + a + b + c + d

  every = sorted(["call", "debug.callback", "id_print", "id_tap",
                  "io_callback", "pure_callback"] +
                 ["io_callback in scan"] * 2)
  assert int(f(1)) == 36  # traced and run once: nothing at trace time
  hcb.barrier_wait()
  assert sorted(seen) == every
  assert int(f(2)) == 37
  hcb.barrier_wait()
  assert sorted(seen) == sorted(every * 2)


class _Sink:
  """An id_print output stream that notes each print."""

  def __init__(self, seen):
    self.seen = seen

  def write(self, _):
    self.seen.append("id_print")


def test_outside_any_trace_debug_callbacks_of_constants_run_now(capsys):
  """Eagerly, under disable_jit and under an eager vmap of constants, the
  callback runs at once, as JAX's."""
  lr = jnp.float32(0.25)
  out = {}
  for name, debug in DEBUGS.items():
    with jax.disable_jit():
      _scan_printing(debug, lr)(0.0)
    print("--")
    jax.vmap(lambda x, debug=debug: (debug.print("v {}", lr), x)[1])(
        jnp.arange(3))
    print("--")
    out[name] = capsys.readouterr().out  # no barrier: already printed
    _flush()
  assert out["hcb"] == out["jax"]
  assert out["jax"].splitlines() == (["numpy=3", "none"] +
                                     ["lr=0.25", "callback 0.25"] * 3 +
                                     ["--", "v 0.25", "--"])


def test_inline_callbacks_of_constants_inside_jit_run_per_execution():
  """HOST_CALLBACK_INLINE runs a callback in the calling thread outside a
  staging context only: inside jit, constants or not, per execution."""
  result = run_python("""
      import jax, jax.numpy as jnp, numpy as np
      import host_callback as hcb
      k = jnp.int32(4)
      @jax.jit
      def f(x):
        hcb.id_tap(lambda v, t: print("tap", v), k)
        return x + hcb.call(lambda v: print("call", v) or v, k,
                            result_shape=k)
      print("traced", int(f(1)))
      f(2).block_until_ready()
      hcb.barrier_wait()
      hcb.id_tap(lambda v, t: print("eager tap", v), k)
      print("after eager tap")
      """, env={"HOST_CALLBACK_INLINE": "1"})
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert lines[-2:] == ["eager tap 4", "after eager tap"]
  assert sorted(lines[:-2]) == sorted(["call 4", "tap 4", "traced 5",
                                       "call 4", "tap 4"])
