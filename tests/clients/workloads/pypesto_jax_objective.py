"""pyPESTO 0.3.3, written for the removed ``jax.experimental.host_callback``:
its ``JaxObjective`` evaluates a pyPESTO objective through ``hcb.call``
inside ``jax.custom_jvp`` rules, under ``jit``, ``grad`` and
``jax.hessian``.  On current JAX it imports only through host_callback's
legacy module (``HOST_CALLBACK_PATCH=legacy``).

Each case returns what pyPESTO computed and what it must be, from the
chain rule with numpy (the test checks that they agree)."""

import jax

jax.config.update("jax_enable_x64", True)  # pyPESTO's results are float64

import numpy as np  # noqa: E402
import scipy.optimize  # noqa: E402

import _case  # noqa: E402
from _case import case  # noqa: E402

X = np.array([0.5, -0.3, 1.2, 0.9])


def _inner(x):
  return x ** 2  # the jax function whose output the objective gets


def _expected(x):
  """f(g(x)) with f = Rosenbrock, g(x) = x**2: value, gradient, Hessian."""
  y = x ** 2
  dg = 2 * x
  grad_f = scipy.optimize.rosen_der(y)
  hess = dg[:, None] * scipy.optimize.rosen_hess(y) * dg[None, :]
  hess += np.diag(grad_f * 2)
  return scipy.optimize.rosen(y), grad_f * dg, hess


def _objective():
  import pypesto
  from pypesto.objective.jax import JaxObjective
  base = pypesto.Objective(fun=scipy.optimize.rosen,
                           grad=scipy.optimize.rosen_der,
                           hess=scipy.optimize.rosen_hess)
  return JaxObjective(base, _inner)


@case
def value_gradient_hessian():
  obj = _objective()
  fval, grad, hess = obj(X, sensi_orders=(0, 1, 2))
  return {"pypesto": [fval, np.asarray(grad), np.asarray(hess)],
          "expected": list(_expected(X))}


@case
def gradient_only_then_value():
  obj = _objective()
  grad = obj(X, sensi_orders=(1,))
  fval = obj(2 * X, sensi_orders=(0,))
  e_grad, e_fval = _expected(X)[1], _expected(2 * X)[0]
  return {"pypesto": [np.asarray(grad), fval], "expected": [e_grad, e_fval]}


@case
def deepcopy_and_optimize():
  import copy
  obj = copy.deepcopy(_objective())
  result = scipy.optimize.minimize(
      lambda x: obj(x, sensi_orders=(0,)), X,
      jac=lambda x: np.asarray(obj(x, sensi_orders=(1,))), method="BFGS")
  return {"converged": bool(result.success),
          "at_minimum": bool(np.allclose(np.abs(result.x), 1.0, atol=1e-4))}


def whose():
  try:
    import pypesto.objective.jax.base as base
    return {"pypesto hcb": base.hcb.__name__,
            "pypesto hcb.call": _case.module_of(base.hcb.call)}
  except ImportError as e:  # unpatched: the library does not import
    return {"import": f"{type(e).__name__}: {e}"}


if __name__ == "__main__":
  _case.main(whose)
