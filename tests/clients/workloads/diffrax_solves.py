"""diffrax 0.7.2: ``diffeqsolve`` with its progress meters (text and tqdm)
and with a clipping step-size controller that reports each step's
acceptance to a host function (``ClipStepSizeController``'s
``_callback_on_reject``, diffrax's own testing hook: the one
``jax.pure_callback`` of its step-size controllers)."""

import diffrax
import jax
import jax.numpy as jnp

import _case
from _case import case


def _solve(**kwargs):
  term = diffrax.ODETerm(lambda t, y, args: -y + jnp.sin(10 * t))
  return diffrax.diffeqsolve(term, diffrax.Tsit5(), t0=0.0, t1=5.0, dt0=0.01,
                             y0=jnp.array([1.0, 2.0]), **kwargs)


@case
def text_progress_meter():
  sol = _solve(saveat=diffrax.SaveAt(t1=True),
               progress_meter=diffrax.TextProgressMeter(minimum_increase=0.1))
  return sol.ys, sol.stats["num_steps"]


@case
def tqdm_progress_meter():
  sol = _solve(saveat=diffrax.SaveAt(t1=True),
               progress_meter=diffrax.TqdmProgressMeter(refresh_steps=5))
  return sol.ys, sol.stats["num_steps"]


@case
def tqdm_progress_meter_jit_vmap():
  @jax.jit
  @jax.vmap
  def solve(y0):
    term = diffrax.ODETerm(lambda t, y, args: -y * args)
    return diffrax.diffeqsolve(
        term, diffrax.Dopri5(), t0=0.0, t1=2.0, dt0=0.05, y0=y0, args=2.0,
        stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-6),
        progress_meter=diffrax.TqdmProgressMeter(refresh_steps=3)).ys
  return solve(jnp.arange(1.0, 4.0))


@case
def clip_controller_rejections():
  steps = []
  controller = diffrax.ClipStepSizeController(
      diffrax.PIDController(rtol=1e-5, atol=1e-5),
      step_ts=jnp.linspace(0.0, 5.0, 11),
      _callback_on_reject=lambda keep, t1: steps.append(
          (bool(keep), float(t1))))
  sol = _solve(stepsize_controller=controller,
               saveat=diffrax.SaveAt(ts=jnp.linspace(0.0, 5.0, 6)))
  return (sol.ys, sol.stats["num_accepted_steps"],
          sol.stats["num_rejected_steps"], steps)


def whose():
  import diffrax._progress_meter as meter
  return {"diffrax._progress_meter.io_callback":
          _case.module_of(meter.io_callback),
          "jax.pure_callback": _case.module_of(jax.pure_callback)}


if __name__ == "__main__":
  _case.main(whose)
