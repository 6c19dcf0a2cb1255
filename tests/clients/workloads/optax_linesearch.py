"""optax 0.2.8: the zoom line search with ``verbose=True``, which reports a
failed search with ``jax.debug.print``; its text captured with
``contextlib.redirect_stdout`` around the search (the result read inside),
as optax's users and tests read it.  Also L-BFGS with the same line
search, where it succeeds and prints nothing."""

import contextlib
import io

import jax
import jax.numpy as jnp
import optax

import _case
from _case import case


def _search(fn, w, u, **options):
  """One step of the zoom line search from ``w`` along ``u``: the text it
  printed, and the step size it chose."""
  opt = optax.scale_by_zoom_linesearch(verbose=True, **options)
  state = opt.init(w)
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    value, grad = jax.value_and_grad(fn)(w)
    _, state = opt.update(u, state, w, value=value, grad=grad, value_fn=fn)
    stepsize = float(optax.tree.get(state, "learning_rate"))
  return out.getvalue(), stepsize


def _square(w):
  return jnp.dot(w, w)


@case
def not_a_descent_direction():
  return _search(_square, 60 * jnp.array([1.0, 0.0]), jnp.array([1.0, 0.0]),
                 max_linesearch_steps=18, curv_rtol=0.5)


@case
def max_learning_rate_too_small():
  return _search(_square, -60 * jnp.array([1.0, 0.0]), jnp.array([1.0, 0.0]),
                 max_linesearch_steps=10, curv_rtol=0.5,
                 max_learning_rate=10.0)


@case
def jitted_search_twice():
  search = jax.jit(lambda w, u: optax.scale_by_zoom_linesearch(
      max_linesearch_steps=10, curv_rtol=0.5, verbose=True,
      max_learning_rate=10.0).update(
          u, optax.scale_by_zoom_linesearch(
              max_linesearch_steps=10).init(w), w, value=_square(w),
          grad=jax.grad(_square)(w), value_fn=_square)[1])
  out = io.StringIO()
  w, u = -60 * jnp.array([1.0, 0.0]), jnp.array([1.0, 0.0])
  with contextlib.redirect_stdout(out):
    first = float(optax.tree.get(search(w, u), "learning_rate"))
    second = float(optax.tree.get(search(w, 2 * u), "learning_rate"))
  return out.getvalue(), first, second


@case
def lbfgs_rosenbrock():
  def rosenbrock(x):
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)

  opt = optax.lbfgs(linesearch=optax.scale_by_zoom_linesearch(
      max_linesearch_steps=20, verbose=True))
  value_and_grad = optax.value_and_grad_from_state(rosenbrock)

  @jax.jit
  def step(carry, _):
    x, state = carry
    value, grad = value_and_grad(x, state=state)
    updates, state = opt.update(grad, state, x, value=value, grad=grad,
                                value_fn=rosenbrock)
    return (optax.apply_updates(x, updates), state), value

  x = jnp.zeros(4)
  (x, _), values = jax.lax.scan(step, (x, opt.init(x)), length=40)
  return x, values


if __name__ == "__main__":
  _case.main(lambda: {"jax.debug.print": _case.module_of(jax.debug.print)})
