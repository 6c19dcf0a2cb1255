"""optimistix 0.1.0: minimisations with ``verbose=True``, which prints each
step's state with ``jax.debug.print``: the same text, in the same place,
and the same solution."""

import contextlib
import io

import jax
import jax.numpy as jnp
import optimistix as optx

import _case
from _case import case


def _rosenbrock(y, args):
  return jnp.sum(args * (y[1:] - y[:-1] ** 2) ** 2 + (1.0 - y[:-1]) ** 2)


@case
def bfgs_verbose():
  solver = optx.BFGS(rtol=1e-6, atol=1e-6, verbose=True)
  sol = optx.minimise(_rosenbrock, solver, jnp.zeros(3), args=100.0,
                      max_steps=200)
  return sol.value, sol.stats["num_steps"]


@case
def bfgs_verbose_redirected():
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    solver = optx.BFGS(rtol=1e-6, atol=1e-6, verbose=True)
    sol = optx.minimise(_rosenbrock, solver, jnp.array([-1.0, 1.0, 0.5]),
                        args=10.0, max_steps=200)
    value = jax.device_get(sol.value)
  return out.getvalue(), value


@case
def levenberg_marquardt_verbose():
  def residuals(y, args):
    return jnp.array([y[0] - 1.0, args * (y[1] - y[0] ** 2)])

  solver = optx.LevenbergMarquardt(rtol=1e-6, atol=1e-6, verbose=True)
  sol = optx.least_squares(residuals, solver, jnp.array([-1.5, 2.0]),
                           args=10.0)
  return sol.value


if __name__ == "__main__":
  _case.main(lambda: {"jax.debug.print": _case.module_of(jax.debug.print)})
