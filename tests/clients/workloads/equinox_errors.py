"""equinox 0.13.8: ``error_if`` (a ``jax.pure_callback`` that raises) under
``filter_jit`` and ``jax.jit``, ``filter_pure_callback``, and the progress
meters of ``equinox.internal`` (``io_callback`` and ``pure_callback``) in a
jitted loop."""

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import numpy as np

import _case
from _case import case


def _raised(fn, *args):
  """What a user reads of the error a call raises: its type and the line
  of its message that carries equinox's text (no stack)."""
  try:
    fn(*args)
  except Exception as e:  # noqa: BLE001 -- the error is the result
    lines = [line for line in str(e).splitlines()
             if "EquinoxRuntimeError" in line or "too large" in line]
    return type(e).__name__, lines[-1:] if lines else str(e)[:200]
  return "no error"


@eqx.filter_jit
def _checked_sqrt(x):
  x = eqx.error_if(x, x < 0, "x must not be negative")
  return jnp.sqrt(x)


@case
def error_if_passes():
  return _checked_sqrt(jnp.array([1.0, 4.0]))


@case
def error_if_raises_under_filter_jit():
  return _raised(_checked_sqrt, jnp.array([1.0, -4.0]))


@case
def error_if_raises_twice():
  # the same compiled function failing again: the message is the same
  return _raised(_checked_sqrt, jnp.array([-1.0, 4.0]))


@case
def error_if_raises_under_jax_jit():
  f = jax.jit(lambda x: eqx.error_if(x, x > 2, "too large") * 2)
  return _raised(f, jnp.arange(4.0))


@case
def branched_error_if_under_vmap():
  f = eqx.filter_jit(jax.vmap(lambda i, x: eqx.branched_error_if(
      x, x < 0, i, ["first", "second"])))
  return _raised(f, jnp.array([0, 1]), jnp.array([1.0, -1.0]))


@case
def filter_pure_callback():
  def host(x, scale):
    return np.asarray(x) * scale

  f = eqx.filter_jit(lambda x: eqx.filter_pure_callback(
      host, x, 3, result_shape_dtypes=x, vmap_method="sequential"))
  return f(jnp.arange(3.0)), jax.vmap(f)(jnp.ones((2, 3)))


def _loop(meter, n):
  @jax.jit
  def run(x):
    def body(i, carry):
      x, state = carry
      state = meter.step(state, (i + 1) / n)
      return x * 0.5 + 1.0, state

    x, state = jax.lax.fori_loop(0, n, body, (x, meter.init()))
    meter.close(state)
    return x

  return run(jnp.float32(0.0))


@case
def text_progress_meter():
  return _loop(eqxi.TextProgressMeter(minimum_increase=0.2), 50)


@case
def tqdm_progress_meter():
  return _loop(eqxi.TqdmProgressMeter(refresh_steps=5), 50)


def whose():
  import equinox.internal._progress_meter as meter
  return {"equinox.internal._progress_meter.io_callback":
          _case.module_of(meter.io_callback),
          "jax.pure_callback": _case.module_of(jax.pure_callback)}


if __name__ == "__main__":
  _case.main(whose)
